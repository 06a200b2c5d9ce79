#!/usr/bin/env python3
"""Iteration time of dist_dcs3gd against dist_ssgd, 2 Horovod workers on this machine.

Two regimes, trials interleaved store by store, medians reported:
- communication negligible: Horovod's own allreduce over loopback (LeNet, 1.7 MB);
  target: DC-S3GD at most 5% slower than SSGD (its correction costs a few passes over
  the weights per step);
- communication about as long as computation: each step's allreduce is made slower by
  injected wire time (``KVX_SIM_COMM_S``, a serial link that takes no CPU) equal to the
  measured compute time; target: SSGD / DC-S3GD ≥ 1.5 (ideal 2).

    python scripts/bench_dcs3gd.py --trials 3 --out results/bench

``--device-s`` adds simulated accelerator time per step (held in MXNet's engine after
the forward pass, no CPU), which keeps the figures readable on a busy machine.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

from kvstore_ext.metrics import write_json  # noqa: E402

LAUNCH = os.path.join(ROOT, "scripts", "launch.py")
TRAIN = os.path.join(ROOT, "scripts", "train_dcs3gd.py")
STORES = ("dist_ssgd", "dist_dcs3gd")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=3, help="interleaved trials per point (default 3)")
    p.add_argument("--steps", type=int, default=40, help="steps per run (default 40)")
    p.add_argument("--warmup", type=int, default=10, help="steps before timing (default 10)")
    p.add_argument("--batch-size", type=int, default=64, help="per-worker batch (default 64)")
    p.add_argument("--device-s", type=float, default=0.0,
                   help="simulated accelerator seconds per step (default 0: CPU compute only)")
    p.add_argument("--out", default=None, help="write dcs3gd.json into this folder")
    return p.parse_args(argv)


def run(store: str, args, inject_s: float) -> dict:
    """One 2-worker job; its step time (the slower worker's) and worker 0's store metrics."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r-{rank}.json")
        argv = [sys.executable, LAUNCH, "-n", "2", "--launcher", "horovod", "--timeout", "600",
                "--env", f"KVX_SIM_COMM_S:{inject_s}", sys.executable, TRAIN, "--kvstore", store,
                "--max-steps", str(args.steps), "--time-from", str(args.warmup),
                "--batch-size", str(args.batch_size), "--sim-compute-s", str(args.device_s),
                "--out", out]
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env, cwd=ROOT)
        if proc.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
        results = [json.load(open(out.replace("{rank}", str(r)))) for r in range(2)]
    worker = results[0]["kvstore_stats"]["worker"]
    return {"step_time_s": max(r["step_time_s"] for r in results),
            "allreduce_time_s": worker["allreduce_time_s"], "overlap": worker["overlap"],
            "command": shlex.join(argv)}


def interleaved(args, inject_s: float) -> dict:
    runs = {s: [] for s in STORES}
    for _ in range(args.trials):
        for store in STORES:
            runs[store].append(run(store, args, inject_s))
    return {s: {"step_time_s": statistics.median(r["step_time_s"] for r in rs),
                "allreduce_time_s": statistics.median(r["allreduce_time_s"] for r in rs),
                "overlap": statistics.median(r["overlap"] for r in rs),
                "trials_s": [r["step_time_s"] for r in rs], "command": rs[0]["command"]}
            for s, rs in runs.items()}


def main(argv=None) -> int:
    args = parse_args(argv)
    print(f"bench_dcs3gd: 2 workers, LeNet batch {args.batch_size}, {args.trials} interleaved "
          f"trials, device {args.device_s * 1e3:.0f} ms/step", flush=True)
    quiet = interleaved(args, 0.0)
    compute = quiet["dist_dcs3gd"]["step_time_s"]
    slower = quiet["dist_dcs3gd"]["step_time_s"] / quiet["dist_ssgd"]["step_time_s"] - 1
    print(f"  negligible communication: SSGD {quiet['dist_ssgd']['step_time_s'] * 1e3:.1f} ms, "
          f"DC-S3GD {compute * 1e3:.1f} ms per step -> DC-S3GD {slower * 100:+.1f}% "
          f"(target <= +5%)", flush=True)
    loaded = interleaved(args, compute)
    ratio = loaded["dist_ssgd"]["step_time_s"] / loaded["dist_dcs3gd"]["step_time_s"]
    print(f"  communication ~ computation ({compute * 1e3:.1f} ms injected per step, measured "
          f"allreduce {loaded['dist_dcs3gd']['allreduce_time_s'] * 1e3:.1f} ms): SSGD "
          f"{loaded['dist_ssgd']['step_time_s'] * 1e3:.1f} ms, DC-S3GD "
          f"{loaded['dist_dcs3gd']['step_time_s'] * 1e3:.1f} ms -> SSGD/DC-S3GD {ratio:.2f} "
          f"(target >= 1.5, ideal 2); overlap {loaded['dist_dcs3gd']['overlap']:.2f}", flush=True)
    print(f"  command (DC-S3GD, injected): {loaded['dist_dcs3gd']['command']}", flush=True)
    summary = {"negligible_comm": quiet, "comm_equals_compute": loaded,
               "dcs3gd_slower_when_comm_negligible": slower, "ssgd_over_dcs3gd_when_comm_equals_compute": ratio,
               "injected_comm_s": compute, "args": vars(args)}
    if args.out:
        print(f"  wrote {write_json(args.out, 'dcs3gd.json', summary)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
