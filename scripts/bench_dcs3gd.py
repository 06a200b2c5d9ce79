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
the forward pass, no CPU), which keeps the figures readable on a busy machine.  The jobs are
``kvstore_ext.plan.dcs3gd_jobs``'s, which ``python -m kvstore_ext.plan validate`` also runs.
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

from kvstore_ext.metrics import write_json  # noqa: E402
from kvstore_ext.plan.dcs3gd_jobs import LOADED, NEGLIGIBLE, Setting, measure  # noqa: E402


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


def print_regime(regime: str, summary: dict) -> None:
    """A regime's figures against the targets, as soon as it is measured."""
    if regime == NEGLIGIBLE:
        quiet = summary[NEGLIGIBLE]
        print(f"  negligible communication: SSGD {quiet['dist_ssgd']['step_time_s'] * 1e3:.1f} ms, "
              f"DC-S3GD {quiet['dist_dcs3gd']['step_time_s'] * 1e3:.1f} ms per step -> DC-S3GD "
              f"{summary['dcs3gd_slower_when_comm_negligible'] * 100:+.1f}% (target <= +5%)",
              flush=True)
        return
    loaded = summary[LOADED]
    print(f"  communication ~ computation ({summary['injected_comm_s'] * 1e3:.1f} ms injected per "
          f"step, measured allreduce {loaded['dist_dcs3gd']['allreduce_time_s'] * 1e3:.1f} ms): "
          f"SSGD {loaded['dist_ssgd']['step_time_s'] * 1e3:.1f} ms, DC-S3GD "
          f"{loaded['dist_dcs3gd']['step_time_s'] * 1e3:.1f} ms -> SSGD/DC-S3GD "
          f"{summary['ssgd_over_dcs3gd_when_comm_equals_compute']:.2f} (target >= 1.5, ideal 2); "
          f"overlap {loaded['dist_dcs3gd']['overlap']:.2f}", flush=True)
    print(f"  command (DC-S3GD, injected): {loaded['dist_dcs3gd']['command']}", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    print(f"bench_dcs3gd: 2 workers, LeNet batch {args.batch_size}, {args.trials} interleaved "
          f"trials, device {args.device_s * 1e3:.0f} ms/step", flush=True)
    summary = measure(Setting(args.trials, args.steps, args.warmup, args.batch_size,
                              args.device_s), on_regime=print_regime)
    summary["args"] = vars(args)
    if args.out:
        print(f"  wrote {write_json(args.out, 'dcs3gd.json', summary)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
