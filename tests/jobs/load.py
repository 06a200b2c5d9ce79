"""Push as fast as the store lets us: many asynchronous pushpulls of one large key.

Every worker calls ``pushpull`` ``--rounds`` times without reading the result
in between (each call returns at once), with gradients that are powers of two
so every update is exact in float32.  Worker 0 checks that no update was lost
and prints the peak memory of every process of the job.
"""
import argparse
import json
import sys
import time

import mxnet as mx

import kvstore_ext  # noqa: F401

LR = 2.0 ** -10


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kvstore", default="dist_asp")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--shape", default="3000,700")
    p.add_argument("--hold-gil", type=float, default=0.0,
                   help="worker 1 spends this many seconds in one call that holds the GIL")
    args = p.parse_args()
    shape = tuple(int(d) for d in args.shape.split(","))
    kv = mx.kv.create(args.kvstore)
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=LR, momentum=0.0, wd=0.0, rescale_grad=1.0))
    w = mx.nd.zeros(shape)
    kv.init(0, w)
    grad = mx.nd.ones(shape)
    t0 = time.monotonic()
    for i in range(args.rounds):
        kv.pushpull(0, grad, out=w)
        if args.hold_gil and kv.rank == 1 and i == args.rounds // 2:
            hold_gil(args.hold_gil)
    w.wait_to_read()
    elapsed = time.monotonic() - t0
    kv.barrier()
    kv.pull(0, out=w)
    value = w.asnumpy()
    expected = -LR * args.rounds * kv.num_workers
    stats = kv.stats()
    if kv.rank == 0:
        print("LOAD " + json.dumps({
            "elapsed_s": elapsed, "value_min": float(value.min()), "value_max": float(value.max()),
            "expected": expected,
            "worker_peak_rss_mb": stats["worker"]["peak_rss_mb"],
            "server_peak_rss_mb": [s["peak_rss_mb"] for s in stats["servers"]],
            "server_malloc": [s["malloc"] for s in stats["servers"]],
            "pushes_applied": [s["pushes_applied"] for s in stats["servers"]]}), flush=True)
    else:
        print("LOADWORKER " + json.dumps({"rank": kv.rank,
                                          "peak_rss_mb": stats["worker"]["peak_rss_mb"]}),
              flush=True)
    kv.barrier()
    return 0


def hold_gil(seconds: float) -> None:
    """One call of about ``seconds`` that never releases the GIL: a regular expression
    with exponential backtracking (``re`` holds the GIL throughout one match)."""
    import math
    import re
    pattern = re.compile(r"(a+)+$")
    t = time.perf_counter()
    pattern.match("a" * 21 + "b")
    t21 = max(time.perf_counter() - t, 1e-6)
    n = 21 + max(0, math.ceil(math.log2(seconds / t21)))   # about 1 to 2 times seconds
    while True:   # the machine's speed varies: a call that came out short is made again, longer
        t = time.perf_counter()
        pattern.match("a" * n + "b")
        held = time.perf_counter() - t
        if held >= seconds:
            break
        n += 1
    print(f"held the GIL for {held:.1f} s in one call", flush=True)


if __name__ == "__main__":
    sys.exit(main())
