#!/usr/bin/env python3
"""Run MXNet's own distributed KVStore tests against kvstore_ext's stores, beside MXNet's.

MXNet's nightly tests (``tests/nightly/dist_sync_kvstore.py``, ``dist_async_kvstore.py``,
``dist_device_sync_kvstore.py`` of an apache/mxnet checkout, 1.9.x) are run as MXNet's CI runs
them (``launch.py -n 7 --launcher local``, 7 workers and 7 servers), once on MXNet's own store
and once on kvstore_ext's with the store's name changed, nothing else: launch.py's workers
register the stores when the test imports mxnet (its autoload; no ``import kvstore_ext``) (``dist_device_sync_kvstore.py`` also has its ``mx.gpu(i)`` contexts made
``mx.cpu(i)`` on a machine without GPUs, for both runs).  Nothing of MXNet's is shipped here:
the tests are read from the checkout given.

    git clone -b v1.9.x https://github.com/apache/mxnet /tmp/mxnet
    python scripts/mxnet_kvstore_tests.py --mxnet-src /tmp/mxnet --out results/mxnet_tests

Prints and writes (``--out``) a table: each test, its result on MXNet's store and on ours, and
for a failure the last line it printed.  docs/mxnet_tests.md explains each row.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
LAUNCH = os.path.join(ROOT, "scripts", "launch.py")

# (test file, its arguments, MXNet's store, ours): the rows of MXNet's CI
# (ci/docker/runtime_functions.sh: integrationtest_ubuntu_cpu_dist_kvstore), then the
# async and device tests and the init test's CPU part, which its CI runs on GPU machines
CASES = [
    ("dist_sync_kvstore.py", ["--type=gluon_step_cpu"], "dist_sync", "dist_bsp"),
    ("dist_sync_kvstore.py", ["--type=gluon_sparse_step_cpu"], "dist_sync", "dist_bsp"),
    ("dist_sync_kvstore.py", ["--type=invalid_cpu"], "dist_sync", "dist_bsp"),
    ("dist_sync_kvstore.py", ["--type=gluon_type_cpu"], "dist_sync", "dist_bsp"),
    ("dist_sync_kvstore.py", [], "dist_sync", "dist_bsp"),
    ("dist_sync_kvstore.py", ["--no-multiprecision"], "dist_sync", "dist_bsp"),
    ("dist_sync_kvstore.py", ["--type=compressed_cpu"], "dist_sync", "dist_bsp"),
    ("dist_sync_kvstore.py", ["--type=compressed_cpu", "--no-multiprecision"], "dist_sync",
     "dist_bsp"),
    ("dist_sync_kvstore.py", ["--type=init_gpu", "--no-gpu"], "dist_sync", "dist_bsp"),
    ("dist_async_kvstore.py", [], "dist_async", "dist_asp"),
    ("dist_device_sync_kvstore.py", [], "dist_device_sync", "dist_bsp"),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[1:]))
    p.add_argument("--mxnet-src", required=True,
                   help="an apache/mxnet checkout (1.9.x): its tests/nightly/ is read")
    p.add_argument("-n", "--num-workers", type=int, default=7,
                   help="workers, and servers, per job (default 7, as MXNet's CI)")
    p.add_argument("--only", action="append", default=[],
                   help="run only the cases whose name contains this text; repeatable")
    p.add_argument("--ours-only", action="store_true",
                   help="skip the runs on MXNet's own stores")
    p.add_argument("--sync-store", default="dist_bsp",
                   help="our store in the rows of MXNet's dist_sync and dist_device_sync "
                        "(default dist_bsp; dist_psp, whose default c = n, b = 1 is dist_bsp, "
                        "is the other that must pass them)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per job (default 600)")
    p.add_argument("--out", default=None, help="write mxnet_tests.json and .md into this folder")
    return p.parse_args(argv)


def case_name(file: str, args: list[str]) -> str:
    return " ".join([file] + args)


def adapted(source: str, native: str, ours: str | None, cpu_only: bool) -> str:
    """MXNet's test with the store's name changed (when ``ours``) and nothing else."""
    if ours:
        source = source.replace(f"mx.kv.create('{native}')", f"mx.kv.create('{ours}')")
    if cpu_only:
        source = re.sub(r"mx\.gpu\(", "mx.cpu(", source)
    return source


def run_case(src_dir: str, file: str, args: list[str], native: str, ours: str | None,
             workers: int, timeout: float) -> dict:
    """One job of MXNet's test under launch.py; its outcome and the last lines it printed."""
    with tempfile.TemporaryDirectory(prefix="mxnet-tests-") as tmp:
        for name in os.listdir(src_dir):
            if name.endswith(".py"):
                text = open(os.path.join(src_dir, name)).read()
                with open(os.path.join(tmp, name), "w") as f:
                    f.write(adapted(text, native, ours if name == file else None,
                                    cpu_only=name == "dist_device_sync_kvstore.py"))
        argv = [sys.executable, LAUNCH, "-n", str(workers), "-s", str(workers), "--launcher",
                "local", "--timeout", str(int(timeout))]
        if ours is None:
            argv += ["--backend", "mxnet"]
        argv += [sys.executable, file, *args]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            OMP_NUM_THREADS="1")
        start = time.perf_counter()
        # launch.py stops the job at --timeout; this bound is for launch.py itself
        try:
            proc = subprocess.run(argv, cwd=tmp, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, timeout=timeout + 60)
            code, output = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired as e:
            code, output = None, e.stdout or b""
    output = output.decode(errors="replace")
    lines = output.strip().splitlines()
    errors = [line for line in lines if re.search(r"(Error|error:|Exception|assert)", line)]
    error = "" if code == 0 else (errors[-1] if errors else (lines[-1] if lines else ""))
    return {"passed": code == 0, "exit_code": code, "seconds": round(time.perf_counter() - start, 1),
            "error": error.strip()[:300], "tail": lines[-60:], "command": shlex.join(argv)}


def main(argv=None) -> int:
    args = parse_args(argv)
    src_dir = os.path.join(args.mxnet_src, "tests", "nightly")
    if not os.path.isfile(os.path.join(src_dir, "dist_sync_kvstore.py")):
        sys.exit(f"--mxnet-src {args.mxnet_src}: no tests/nightly/dist_sync_kvstore.py there "
                 f"(an apache/mxnet checkout of the 1.9.x branch is needed)")
    rows = []
    for file, targs, native, ours in CASES:
        if ours == "dist_bsp":
            ours = args.sync_store
        name = case_name(file, targs)
        if args.only and not any(o in name for o in args.only):
            continue
        row = {"test": name, "mxnet_store": native, "store": ours}
        if not args.ours_only:
            row["mxnet"] = run_case(src_dir, file, targs, native, None, args.num_workers,
                                    args.timeout)
        row["ours"] = run_case(src_dir, file, targs, native, ours, args.num_workers, args.timeout)
        rows.append(row)
        mx_result = "-" if args.ours_only else ("pass" if row["mxnet"]["passed"] else "FAIL")
        ours_result = "pass" if row["ours"]["passed"] else "FAIL"
        print(f"{name:60s} {native:>16s} {mx_result:>4s}   {ours:>8s} {ours_result:>4s}  "
              f"{row['ours']['error']}", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "mxnet_tests.json"), "w") as f:
            json.dump(rows, f, indent=1)
        with open(os.path.join(args.out, "mxnet_tests.md"), "w") as f:
            f.write("| MXNet's test | MXNet's store | kvstore_ext | what ours printed |\n")
            f.write("| --- | --- | --- | --- |\n")
            for r in rows:
                mxr = "-" if "mxnet" not in r else ("pass" if r["mxnet"]["passed"] else "fail")
                f.write(f"| `{r['test']}` | {r['mxnet_store']}: {mxr} | {r['store']}: "
                        f"{'pass' if r['ours']['passed'] else 'fail'} | "
                        f"{r['ours']['error'].replace('|', '/')} |\n")
        print(f"wrote {args.out}/mxnet_tests.json and mxnet_tests.md")
    return 0 if all(r["ours"]["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
