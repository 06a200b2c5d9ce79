#!/usr/bin/env python3
"""The speed figures the stores are held to, against MXNet's own stores, from one bench run.

Reads what ``bench_kvstore.py`` and ``bench_train.py`` wrote (``bench.json``, ``train.json``)
and prints each figure beside its target: the ratio of this project's store to MXNet's of the
same family, with the same call pattern, medians of the run's interleaved trials.

    python scripts/bench_targets.py --bench results/bench       (the last step of make bench)
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from kvstore_ext.reports import write_results  # noqa: E402

#: (figure, source, selection of the store's row, selection of MXNet's row, target)
ROUNDS = "bench.json"
TRAINING = "train.json"
TARGETS = [
    ("ResNet-20 shapes, 2 workers x 1 server, one list call per round, dist_bsp / dist_sync",
     ROUNDS, {"model": "cifar_resnet20_v1", "workers": 2, "servers": 1, "store": "dist_bsp list"},
     {"store": "native dist_sync list"}, 4.0),
    ("ResNet-20 shapes, 2 workers x 1 server, stock per-key calls, dist_bsp / dist_sync",
     ROUNDS, {"model": "cifar_resnet20_v1", "workers": 2, "servers": 1,
              "store": "dist_bsp per-key"}, {"store": "native dist_sync per-key"}, 2.0),
    ("ResNet-20 shapes, 4 workers x 2 servers, per-key calls, dist_bsp / dist_sync",
     ROUNDS, {"model": "cifar_resnet20_v1", "workers": 4, "servers": 2,
              "store": "dist_bsp per-key"}, {"store": "native dist_sync per-key"}, 1.5),
    ("LeNet shapes, 2 workers x 1 server, per-key calls, dist_bsp / dist_sync",
     ROUNDS, {"model": "lenet", "workers": 2, "servers": 1, "store": "dist_bsp per-key"},
     {"store": "native dist_sync per-key"}, 1.2),
    ("LeNet shapes, 2 workers x 1 server, per-key calls, dist_asp / dist_async",
     ROUNDS, {"model": "lenet", "workers": 2, "servers": 1, "store": "dist_asp per-key"},
     {"store": "native dist_async per-key"}, 1.2),
    ("LeNet training on MNIST, samples/s, stock gluon.Trainer, dist_bsp / dist_sync",
     TRAINING, {"case": "dist_bsp (gluon.Trainer)"}, {"case": "native dist_sync"}, 1.05),
    ("LeNet training on MNIST, samples/s, stock gluon.Trainer, dist_asp / dist_async",
     TRAINING, {"case": "dist_asp (gluon.Trainer)"}, {"case": "native dist_async"}, 1.05),
]


def find(rows: list[dict], where: dict) -> dict | None:
    """The row whose fields include every item of ``where``."""
    return next((r for r in rows if all(r.get(k) == v for k, v in where.items())), None)


def ratio_of(result: dict, store: dict, native: dict) -> float | None:
    """The store's median rate over MXNet's (rounds/s, or samples/s per worker); MXNet's row is
    the one of the same cluster and model as the store's."""
    rows = result["rows"]
    mine = find(rows, store)
    if mine is None:
        return None
    cluster = {k: mine[k] for k in ("model", "workers", "servers") if k in mine}
    theirs = find(rows, {**cluster, **native})
    if theirs is None:
        return None
    key = "rounds_per_s" if "rounds_per_s" in mine else "samples_per_s_per_worker"
    return mine[key] / theirs[key]


def summary(bench_dir: str) -> list[dict]:
    """One row per figure: the measured ratio (None when the run has no such case), the
    target and whether it is met."""
    loaded = {}
    for name in (ROUNDS, TRAINING):
        path = os.path.join(bench_dir, name)
        if os.path.exists(path):
            with open(path) as f:
                loaded[name] = json.load(f)
    rows = []
    for figure, source, store, native, target in TARGETS:
        ratio = ratio_of(loaded[source], store, native) if source in loaded else None
        rows.append({"figure": figure, "ratio": ratio, "target": target,
                     "met": None if ratio is None else ("met" if ratio >= target else "missed"),
                     "run": loaded.get(source, {}).get("date")})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", default="results/bench",
                   help="the folder bench_kvstore.py and bench_train.py wrote into "
                        "(default results/bench)")
    p.add_argument("--out", default=None,
                   help="folder for targets.{json,csv,md} (default: the --bench folder)")
    args = p.parse_args(argv)
    rows = summary(args.bench)
    if all(r["ratio"] is None for r in rows):
        raise SystemExit(f"no bench.json or train.json in {args.bench}: run "
                         f"scripts/bench_kvstore.py and scripts/bench_train.py first")
    print(write_results(args.out or args.bench, "targets", rows, [
        ("figure", "figure", "{}"), ("ratio (median of trials)", "ratio", "{:.2f}x"),
        ("target", "target", ">= {:.2f}x"), ("", "met", "{}"), ("run", "run", "{}")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
