#!/usr/bin/env python3
"""Cost of one DSSP decision as the number of workers grows (n = 2, 64, 1024 by default).

    python scripts/bench_dssp_policy.py [--workers 2,64,1024] [--pushes 200000]

Virtual workers with spread-out speeds push through the very policy a server
runs (kvstore_ext.simulate); the time per push covers the policy's whole
decision (clock update, slowest/fastest lookup, controller call when due,
extension expiry and releases) plus the simulator's own event heap.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kvstore_ext.simulate import simulate  # noqa: E402


def measure(n: int, pushes: int, trials: int) -> dict:
    speeds = [0.3 + 0.7 * ((i * 7919) % n) / max(1, n - 1) for i in range(n)]   # 0.3 .. 1.0
    horizon = pushes / sum(speeds)     # at most `pushes` pushes in all (fewer when workers wait)
    best = None
    for _ in range(trials):
        t0 = time.perf_counter()
        r = simulate("dist_dssp", {"staleness_lower": 3, "staleness_upper": 15}, speeds, horizon,
                     jitter=0.2, seed=n)
        per = (time.perf_counter() - t0) / r.decisions
        best = per if best is None else min(best, per)
    return {"workers": n, "pushes": r.decisions, "us_per_push": best * 1e6,
            "max_lead_at_ok": r.max_lead_at_ok}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="2,64,1024", help="comma-separated worker counts")
    p.add_argument("--pushes", type=int, default=200000, help="pushes per measurement")
    p.add_argument("--trials", type=int, default=3, help="best of this many (default 3)")
    args = p.parse_args(argv)
    print("| workers | pushes | us per push (best of %d) | max lead at OK |" % args.trials)
    print("| ---: | ---: | ---: | ---: |")
    for n in (int(x) for x in args.workers.split(",")):
        r = measure(n, args.pushes, args.trials)
        print(f"| {r['workers']} | {r['pushes']} | {r['us_per_push']:.2f} | {r['max_lead_at_ok']} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
