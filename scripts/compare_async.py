#!/usr/bin/env python3
"""dist_asp (and any other store) against MXNet's own dist_async on a plain Gluon script.

For every worker count, learning rate and seed it runs ``scripts/plain_gluon_mnist.py``
once per store, the stores interleaved run by run (so machine drift hits them alike),
and writes ``runs.json``, ``table.csv`` and ``table.md`` to ``--out``: per store and
setting, the median test accuracy, how many runs diverged (accuracy < 0.5), and the
staleness of the pushes as the workers saw it (mean, 99th percentile, max).

    python scripts/compare_async.py --workers 2 --lrs 0.01,0.05 --seeds 1,2,3
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys

import numpy as np
from tqdm import tqdm

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SCRIPT = os.path.join(ROOT, "scripts", "plain_gluon_mnist.py")
LAUNCH = os.path.join(ROOT, "scripts", "launch.py")
NATIVE = {"dist_async", "dist_sync", "dist_device_sync"}
DIVERGED = 0.5


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--stores", default="dist_async,dist_asp",
                   help="comma-separated stores; MXNet's own run with --backend mxnet "
                        "(default dist_async,dist_asp)")
    p.add_argument("--workers", default="2", help="worker counts, e.g. 2,4 (default 2)")
    p.add_argument("--lrs", default="0.05", help="learning rates, e.g. 0.01,0.05,0.1 (default 0.05)")
    p.add_argument("--seeds", default="1,2,3", help="seeds, one run each (default 1,2,3)")
    p.add_argument("--optimizers", default="sgd",
                   help="comma-separated optimizers, each run with every store (default sgd; "
                        "e.g. adagrad,adadelay,adaptiverevision,dcasgda); staleness is read "
                        "with sgd only")
    p.add_argument("--epochs", type=int, default=2, help="epochs per run (default 2)")
    p.add_argument("--kv-param", action="append", default=[],
                   help="STORE:NAME=VALUE, a parameter of one store (e.g. dist_ssp:staleness=3)")
    p.add_argument("--out", default="results/compare_async", help="output folder")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run (default 900)")
    return p.parse_args(argv)


def run_one(store: str, workers: int, lr: float, seed: int, args, optimizer: str = "sgd") -> dict:
    options = ["--backend", "mxnet"] if store in NATIVE else []
    for spec in args.kv_param:
        name, _, param = spec.partition(":")
        if name == store:
            options += ["--kv-param", param]
    argv = [sys.executable, LAUNCH, "-n", str(workers), "-s", "1", "--launcher", "local",
            "--timeout", str(args.timeout), *options, sys.executable, SCRIPT, "--kvstore", store,
            "--lr", str(lr), "--seed", str(seed), "--epochs", str(args.epochs),
            "--optimizer", optimizer] + (["--staleness-probe"] if optimizer == "sgd" else [])
    proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    results = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
               if line.startswith("RESULT ")]
    label = store if optimizer == "sgd" else f"{store} {optimizer}"
    run = {"store": label, "workers": workers, "lr": lr, "seed": seed, "exit": proc.returncode}
    if len(results) != workers:
        run["error"] = proc.stdout[-2000:]
        return run
    run["accuracy"] = float(np.mean([r["accuracy"] for r in results]))
    if optimizer == "sgd":
        staleness = np.concatenate([r["staleness"] for r in results])
        run.update(staleness_mean=float(staleness.mean()),
                   staleness_p99=float(np.percentile(staleness, 99)),
                   staleness_max=int(staleness.max()))
    return run


def _staleness(runs: list[dict]) -> dict:
    if any("staleness_mean" not in r for r in runs):
        return {"staleness_mean": "", "staleness_p99": "", "staleness_max": ""}
    return {"staleness_mean": round(float(np.mean([r["staleness_mean"] for r in runs])), 2),
            "staleness_p99": f"{max(r['staleness_p99'] for r in runs):.0f}",
            "staleness_max": max(r["staleness_max"] for r in runs)}


def summarise(runs: list[dict]) -> list[dict]:
    rows = []
    keys = sorted({(r["workers"], r["lr"], r["store"]) for r in runs},
                  key=lambda k: (k[0], k[1], k[2] not in NATIVE, k[2]))
    for workers, lr, store in keys:
        mine = [r for r in runs if (r["workers"], r["lr"], r["store"]) == (workers, lr, store)
                and "accuracy" in r]
        if not mine:
            continue
        acc = [r["accuracy"] for r in mine]
        rows.append({"workers": workers, "lr": lr, "store": store, "runs": len(mine),
                     "median_accuracy": round(float(np.median(acc)), 4),
                     "diverged": sum(a < DIVERGED for a in acc),
                     "accuracies": " ".join(f"{a:.4f}" for a in acc),
                     **_staleness(mine)})
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    stores = args.stores.split(",")
    plan = [(w, lr, seed, store, opt) for w in map(int, args.workers.split(","))
            for lr in map(float, args.lrs.split(",")) for seed in map(int, args.seeds.split(","))
            for opt in args.optimizers.split(",") for store in stores]
    os.makedirs(args.out, exist_ok=True)
    runs = []
    for workers, lr, seed, store, opt in tqdm(plan, desc="runs"):
        runs.append(run_one(store, workers, lr, seed, args, opt))
        with open(os.path.join(args.out, "runs.json"), "w") as f:
            json.dump(runs, f, indent=1)
    rows = summarise(runs)
    with open(os.path.join(args.out, "table.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["store"])
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| workers | lr | store | runs | median accuracy | diverged | accuracies | "
             "staleness mean | p99 | max |", "| ---: | ---: | --- | ---: | ---: | ---: | --- | "
             "---: | ---: | ---: |"]
    lines += [f"| {r['workers']} | {r['lr']} | {r['store']} | {r['runs']} | "
              f"{r['median_accuracy']:.4f} | {r['diverged']} | {r['accuracies']} | "
              f"{r['staleness_mean']} | {r['staleness_p99']} | {r['staleness_max']} |"
              for r in rows]
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table)
    print(table)
    failed = [r for r in runs if "error" in r]
    for r in failed:
        print(f"run failed: {r['store']} n={r['workers']} lr={r['lr']} seed={r['seed']}:\n"
              f"{r['error'][-800:]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
