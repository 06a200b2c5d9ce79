#!/usr/bin/env python3
"""Push+pull rounds per second of kvstore_ext's stores against MXNet's own, in one run.

For each case it starts a real job through launch.py (scheduler, servers,
workers on this machine), pushes gradients of a model's trainable shapes and
pulls the weights back, with server-side momentum SGD, and times the rounds.
Cases are interleaved trial by trial so that drift on a shared machine hits
every store alike; the table reports medians over trials and ratios to the
native store of the same mode.

    python scripts/bench_kvstore.py --trials 3 --out results/bench
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, ROOT)

# (label, kvstore, backend, mode); the first of each family is the baseline of its ratios
CASES = {
    "sync": [("native dist_sync per-key", "dist_sync", "mxnet", "per-key"),
             ("native dist_sync list", "dist_sync", "mxnet", "list"),
             ("dist_bsp per-key", "dist_bsp", "kvstore_ext", "per-key"),
             ("dist_bsp list", "dist_bsp", "kvstore_ext", "list")],
    "async": [("native dist_async per-key", "dist_async", "mxnet", "per-key"),
              ("native dist_async list", "dist_async", "mxnet", "list"),
              ("dist_asp per-key", "dist_asp", "kvstore_ext", "per-key"),
              ("dist_asp list", "dist_asp", "kvstore_ext", "list")],
}


def worker(args) -> int:
    """One worker of a benchmark job: time --rounds push+pull rounds."""
    import mxnet as mx
    import numpy as np
    import kvstore_ext  # noqa: F401
    kv = mx.kv.create(args.kvstore)
    shapes = [tuple(s) for s in json.loads(args.shapes)]
    keys = list(range(len(shapes)))
    rng = np.random.RandomState(kv.rank)
    weights = [mx.nd.array(rng.uniform(-0.1, 0.1, s)) for s in shapes]
    grads = [mx.nd.array(rng.uniform(-1, 1, s)) for s in shapes]
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.01, momentum=0.9, wd=1e-4,
                                      rescale_grad=1.0 / 64))
    for k, w in zip(keys, weights):
        kv.init(k, w)
    mx.nd.waitall()

    def one_round():
        if args.mode == "list":
            kv.pushpull(keys, grads, out=weights)
        else:
            for k, g, w in zip(keys, grads, weights):
                kv.pushpull(k, g, out=w)
        mx.nd.waitall()

    for _ in range(args.warmup):
        one_round()
    t0 = time.perf_counter()
    for _ in range(args.rounds):
        one_round()
    dt = time.perf_counter() - t0
    with open(args.result.replace("{rank}", str(kv.rank)), "w") as f:
        json.dump({"rank": kv.rank, "rounds": args.rounds, "seconds": dt}, f)
    return 0


def run_case(kvstore, backend, mode, shapes, workers, servers, rounds, warmup, tmp) -> float:
    from kvstore_ext.launch import run_local_job
    result = os.path.join(tmp, "r-{rank}.json")
    run_local_job(workers, servers,
                  [sys.executable, os.path.abspath(__file__), "--worker", "--kvstore", kvstore,
                   "--mode", mode, "--shapes", json.dumps(shapes), "--rounds", str(rounds),
                   "--warmup", str(warmup), "--result", result],
                  options=["--backend", backend], timeout=600)
    seconds = []
    for r in range(workers):
        with open(result.replace("{rank}", str(r))) as f:
            seconds.append(json.load(f)["seconds"])
        os.remove(result.replace("{rank}", str(r)))
    return rounds / max(seconds)   # the job's pace is its slowest worker's


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--kvstore", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--shapes", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--models", default="cifar_resnet20_v1,lenet",
                   help="models whose trainable shapes are pushed (default cifar_resnet20_v1,lenet)")
    p.add_argument("--clusters", default="2x1,4x2",
                   help="WORKERSxSERVERS list (default 2x1,4x2)")
    p.add_argument("--families", default="sync,async",
                   help="comma-separated: sync (dist_bsp against dist_sync), async "
                        "(dist_asp against dist_async), or both (default sync,async)")
    p.add_argument("--trials", type=int, default=3, help="trials per case; medians are reported (default 3)")
    p.add_argument("--rounds", type=int, default=60, help="timed rounds per trial (default 60)")
    p.add_argument("--warmup", type=int, default=5, help="untimed rounds first (default 5)")
    p.add_argument("--out", default="results/bench", help="folder for bench.json, bench.csv, bench.md")
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    families = ["sync", "async"] if args.families == "both" else args.families.split(",")
    unknown = [f for f in families if f not in CASES]
    if unknown:
        p.error(f"--families: unknown {', '.join(map(repr, unknown))}; "
                f"use sync, async or both")

    from tqdm import tqdm
    from kvstore_ext.plan.jobs import model_shapes
    os.makedirs(args.out, exist_ok=True)
    rows = []
    jobs = []
    for model in args.models.split(","):
        shapes = [list(s) for s in model_shapes(model)]   # as gluon.Trainer pushes them
        for cluster in args.clusters.split(","):
            w, s = (int(x) for x in cluster.split("x"))
            for fam in families:
                jobs.append((model, shapes, w, s, fam))
    samples = {}
    total = len(jobs) * args.trials * 4
    with tempfile.TemporaryDirectory() as tmp, tqdm(total=total, desc="bench", disable=None) as bar:
        for trial in range(args.trials):
            for model, shapes, w, s, fam in jobs:
                for label, kvstore, backend, mode in CASES[fam]:
                    rate = run_case(kvstore, backend, mode, shapes, w, s, args.rounds, args.warmup, tmp)
                    samples.setdefault((model, w, s, fam, label), []).append(rate)
                    bar.update(1)
    for model, shapes, w, s, fam in jobs:
        base = statistics.median(samples[(model, w, s, fam, CASES[fam][0][0])])
        for label, kvstore, backend, mode in CASES[fam]:
            vals = samples[(model, w, s, fam, label)]
            med = statistics.median(vals)
            rows.append({"model": model, "workers": w, "servers": s, "store": label,
                         "kvstore": kvstore, "mode": mode, "rounds_per_s": round(med, 2),
                         "trials": [round(v, 2) for v in vals],
                         "vs_native_per_key": round(med / base, 2)})
    write_tables(rows, args)
    return 0


def write_tables(rows, args) -> None:
    from kvstore_ext.reports import write_results
    print(write_results(args.out, "bench", rows, [
        ("model", "model", "{}"), ("workers", "workers", "{}"), ("servers", "servers", "{}"),
        ("store", "store", "{}"), ("rounds/s (median)", "rounds_per_s", "{:.1f}"),
        ("× native per-key", "vs_native_per_key", "{:.2f}")]))


if __name__ == "__main__":
    sys.exit(main())
