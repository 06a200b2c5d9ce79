#!/usr/bin/env python3
"""End-to-end training speed: LeNet on MNIST through gluon.Trainer, kvstore_ext vs MXNet's stores.

Each trial runs every case once (interleaved), 2 workers and 1 server on this
machine; the table gives median samples/s per worker and the ratio to MXNet's
own store of the same family.

    python scripts/bench_train.py --trials 3 --out results/bench
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from kvstore_ext.launch import run_local_job  # noqa: E402
from kvstore_ext.reports import write_results  # noqa: E402

# (label, kvstore, backend, trainer, baseline label)
CASES = [
    ("native dist_sync", "dist_sync", "mxnet", "gluon", None),
    ("dist_bsp (gluon.Trainer)", "dist_bsp", "kvstore_ext", "gluon", "native dist_sync"),
    ("dist_bsp (gluon_trainers.Trainer)", "dist_bsp", "kvstore_ext", "batched", "native dist_sync"),
    ("native dist_async", "dist_async", "mxnet", "gluon", None),
    ("dist_asp (gluon.Trainer)", "dist_asp", "kvstore_ext", "gluon", "native dist_async"),
    ("dist_asp (gluon_trainers.Trainer)", "dist_asp", "kvstore_ext", "batched", "native dist_async"),
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=3, help="trials per case (default 3)")
    p.add_argument("--epochs", type=float, default=1, help="epochs per run (default 1)")
    p.add_argument("--workers", type=int, default=2, help="workers (default 2)")
    p.add_argument("--servers", type=int, default=1, help="servers (default 1)")
    p.add_argument("--out", default="results/bench", help="folder for train.json and train.md")
    args = p.parse_args(argv)
    from tqdm import tqdm
    samples: dict[str, list[float]] = {}
    accuracy: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, \
            tqdm(total=args.trials * len(CASES), desc="bench_train", disable=None) as bar:
        for _ in range(args.trials):
            for label, kvstore, backend, trainer, _ in CASES:
                out = os.path.join(tmp, "r-{rank}.json")
                run_local_job(args.workers, args.servers,
                              [sys.executable, os.path.join(HERE, "train_mnist.py"), "--kvstore",
                               kvstore, "--trainer", trainer, "--epochs", str(args.epochs),
                               "--lr", "0.02", "--out", out],
                              options=["--backend", backend])
                results = []
                for r in range(args.workers):
                    with open(out.replace("{rank}", str(r))) as f:
                        results.append(json.load(f))
                samples.setdefault(label, []).append(statistics.mean(x["samples_per_s"] for x in results))
                accuracy.setdefault(label, []).append(results[0]["test_accuracy"])
                bar.update(1)
    rows = []
    for label, kvstore, backend, trainer, base in CASES:
        med = statistics.median(samples[label])
        ratio = med / statistics.median(samples[base]) if base else 1.0
        rows.append({"case": label, "kvstore": kvstore, "trainer": trainer,
                     "samples_per_s_per_worker": round(med, 1), "trials": samples[label],
                     "vs_native": round(ratio, 2),
                     "test_accuracy_median": statistics.median(accuracy[label])})
    print(write_results(args.out, "train", rows, [
        ("case", "case", "{}"), ("samples/s per worker (median)", "samples_per_s_per_worker", "{:.0f}"),
        ("× native", "vs_native", "{:.2f}"), ("test accuracy", "test_accuracy_median", "{:.3f}")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
