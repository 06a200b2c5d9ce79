#!/usr/bin/env python3
"""The quick start: a 2-worker job per store on the shipped MNIST digits, and a result table.

    make demo            # or: python scripts/demo.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from kvstore_ext.launcher import run_local_job  # noqa: E402

RUNS = [("dist_bsp", []), ("dist_ssp", ["--kv-param", "staleness=3"]), ("dist_asp", [])]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one epoch instead of three (for CI)")
    p.add_argument("--out", default="results/demo", help="where results.json goes")
    args = p.parse_args(argv)
    epochs = "1" if args.quick else "3"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kvstore, params in RUNS:
            out = os.path.join(tmp, f"{kvstore}-{{rank}}.json")
            print(f"training LeNet on MNIST with {kvstore}, 2 workers, 1 server ...", flush=True)
            t0 = time.perf_counter()
            run_local_job(2, 1, [sys.executable, os.path.join(HERE, "train_mnist.py"),
                                 "--kvstore", kvstore, "--epochs", epochs, "--out", out],
                          options=params)
            wall = time.perf_counter() - t0
            res = [json.load(open(out.replace("{rank}", str(r)))) for r in range(2)]
            waits = [x["kvstore_stats"]["worker"]["wait_share"] for x in res]
            rows.append({"kvstore": kvstore, "params": " ".join(params[1:]) or "-",
                         "test_accuracy": res[0]["test_accuracy"],
                         "samples_per_s": sum(x["samples_per_s"] for x in res),
                         "wait_share": sum(waits) / len(waits), "job_seconds": wall})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print()
    print("| store | parameters | test accuracy | samples/s (both workers) | time waiting | job time (s) |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['kvstore']} | {r['params']} | {r['test_accuracy']:.4f} | {r['samples_per_s']:.0f} | "
              f"{100 * r['wait_share']:.0f}% | {r['job_seconds']:.1f} |")
    print(f"\nresults: {os.path.abspath(os.path.join(args.out, 'results.json'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
