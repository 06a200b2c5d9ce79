#!/usr/bin/env python3
"""Where a server's and a worker's CPU goes in `bench_kvstore.py`'s rounds: py-spy samples of
the server and of one worker of a running job, each sample put in one category by the
frames of its stack, as a table of shares.

    python scripts/profile_round.py --model cifar_resnet20_v1 --cluster 2x1 --mode list
    python scripts/profile_round.py --kvstore dist_asp --mode per-key --model lenet

It starts a real job (launch.py: scheduler, servers, workers on this machine) of the
benchmark's workers pushing and pulling the model's shapes with server-side momentum SGD,
waits ``--warmup`` seconds, records ``--duration`` seconds of both processes at once with
``py-spy record --nonblocking`` (the processes are not paused), then stops the job. py-spy
does not know that a thread blocked inside a C call (ZeroMQ's ``poll``, pyzmq's zero-copy
garbage thread, MXNet's ``waitall``) is idle: those rows are mostly waiting, not work.
Writes ``profile.md`` and ``profile.json`` and each process's raw stacks into ``--out``.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, ROOT)

#: (category, substrings of a frame's "function (file:line)"): a sample goes to the first
#: category any frame of its stack names, so an optimizer's MXNet call counts as the
#: optimizer and an authenticator's JSON as authentication
CATEGORIES = [
    ("authentication (message tags)", ("Codec._tag", "clear_vector_upper_state")),
    ("optimizer (the servers' SGD)", ("ServerOptimizer", "optimizers.py", "sgd_mom_update",
                                         "multi_sgd", "sgd_update")),
    ("pyzmq's zero-copy garbage thread (mostly blocked)", ("zmq/utils/garbage",)),
    ("JSON headers", ("json/",)),
    ("ZeroMQ send and receive", ("Socket.send", "Socket.recv", "recv_message")),
    ("waiting in poll", ("Poller.poll", "zmq_poll")),
    ("waiting for the round (waitall, conditions)", ("waitall", "Condition.wait",
                                                     "Event.wait")),
    ("copies and sums (numpy, MXNet copies)", ("copy_to_host", "copyto", "_sync_copyfrom",
                                               "add_into", "snapshot", "frombuffer",
                                               "pack (transport")),
    ("MXNet engine operations (ctypes)", ("engine.py", "_imperative_invoke", "push_async")),
]
OTHER = "other Python (checks, routing, policies)"


def category(stack: list[str]) -> str:
    """The first category of :data:`CATEGORIES` that a frame of ``stack`` names."""
    for name, needles in CATEGORIES:
        if any(n in frame for frame in stack for n in needles):
            return name
    return OTHER


def shares(raw_path: str) -> dict:
    """Each category's share of the samples in a py-spy ``--format raw`` file (lines of
    ``frame;frame;... count``, outermost first)."""
    counts, total = collections.Counter(), 0
    with open(raw_path) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not stack or not n.isdigit():
                continue
            counts[category(stack.split(";"))] += int(n)
            total += int(n)
    return {"samples": total,
            "shares": {name: counts[name] / total if total else 0.0
                       for name in [c for c, _ in CATEGORIES] + [OTHER]}}


def find_processes(launcher_pid: int, timeout: float = 60.0) -> tuple[int, int]:
    """The first server's and the first worker's pid among the launcher's descendants."""
    import psutil
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server = worker = None
        for p in psutil.Process(launcher_pid).children(recursive=True):
            try:
                cmd = " ".join(p.cmdline())
            except psutil.Error:
                continue
            if "kvstore_ext.ps.server" in cmd and server is None:
                server = p.pid
            elif "bench_kvstore.py" in cmd and "--worker" in cmd and worker is None:
                worker = p.pid
        if server and worker:
            return server, worker
        time.sleep(0.5)
    raise RuntimeError("the job's server and worker processes did not appear within "
                       f"{timeout:.0f} s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--model", default="cifar_resnet20_v1",
                   help="model whose trainable shapes are pushed (default %(default)s)")
    p.add_argument("--cluster", default="2x1", help="WORKERSxSERVERS (default %(default)s)")
    p.add_argument("--kvstore", default="dist_bsp",
                   help="kvstore_ext store to profile (default %(default)s)")
    p.add_argument("--mode", choices=("list", "per-key"), default="list",
                   help="one list call per round, or one call per key (default %(default)s)")
    p.add_argument("--warmup", type=float, default=8.0,
                   help="seconds of rounds before recording (default %(default)s)")
    p.add_argument("--duration", type=int, default=8,
                   help="seconds recorded (default %(default)s)")
    p.add_argument("--rate", type=int, default=200,
                   help="py-spy samples per second (default %(default)s)")
    p.add_argument("--out", default="results/profile", help="folder (default %(default)s)")
    args = p.parse_args(argv)
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        print("profile_round.py: py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return 2
    workers, servers = (int(x) for x in args.cluster.lower().split("x"))
    from kvstore_ext.launch.cli import launcher_env, local_job_argv
    from kvstore_ext.plan.jobs import model_shapes
    shapes = [list(s) for s in model_shapes(args.model)]
    os.makedirs(args.out, exist_ok=True)
    result = os.path.join(args.out, "rounds-{rank}.json")
    # far more rounds than the recording needs: the job is stopped once it is recorded
    job = subprocess.Popen(
        local_job_argv(workers, servers, [
            sys.executable, os.path.join(HERE, "bench_kvstore.py"), "--worker", "--kvstore",
            args.kvstore, "--mode", args.mode, "--shapes", json.dumps(shapes), "--rounds",
            "1000000", "--warmup", "5", "--result", result], timeout=3600),
        env=launcher_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    out = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"),
           "model": args.model, "cluster": args.cluster, "kvstore": args.kvstore,
           "mode": args.mode, "processes": {}}
    try:
        server, worker = find_processes(job.pid)
        time.sleep(args.warmup)
        spies = {}
        for name, pid in (("server", server), ("worker", worker)):
            raw = os.path.join(args.out, f"{name}.raw")
            spies[name] = (raw, subprocess.Popen(
                [spy, "record", "--nonblocking", "--rate", str(args.rate), "--duration",
                 str(max(1, round(args.duration))), "--format", "raw", "--output", raw, "--pid", str(pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        for name, (raw, proc) in spies.items():
            _, err = proc.communicate(timeout=args.duration + 60)
            if proc.returncode != 0 or not os.path.exists(raw):
                raise RuntimeError(f"py-spy on the {name} failed: {err.strip()[-500:]}")
            out["processes"][name] = shares(raw)
        if job.poll() is not None:
            raise RuntimeError(f"the job ended while it was recorded: {job.stderr.read()[-2000:]}")
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGTERM)
            try:
                job.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
    lines = [f"{args.model} shapes, {args.kvstore}, {args.mode}, {args.cluster} "
             f"(`{out['command']}`, {out['date']})", "",
             "| category | server | worker |", "| --- | ---: | ---: |"]
    for name in [c for c, _ in CATEGORIES] + [OTHER]:
        lines.append(f"| {name} | " + " | ".join(
            f"{out['processes'][k]['shares'][name]:.0%}" for k in ("server", "worker")) + " |")
    lines.append("| samples | " + " | ".join(
        str(out["processes"][k]["samples"]) for k in ("server", "worker")) + " |")
    with open(os.path.join(args.out, "profile.json"), "w") as f:
        json.dump(out, f, indent=1)
    with open(os.path.join(args.out, "profile.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
