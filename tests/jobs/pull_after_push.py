"""MXNet's own dense push/pull check (tests/nightly/dist_sync_kvstore.py), repeated: every
round each worker pushes two keys (one small, one split over the servers) and pulls them
into freshly made zero arrays, which must then hold the summed value.

``pushpull`` (third argument) pushes with ``kv.pushpull`` instead, in place for one key and
into ``out=`` for the other, and checks both the pushpull's result and a pull made right
after it: with ``dist_sync`` a pull waits for the worker's earlier push of its key, so it
reads the round that push went into.  Worker r starts each round 0.02 r s late, so that the
others' pushes come after the first worker's pull is sent."""
import sys
import time

import mxnet as mx
import numpy as np

import kvstore_ext  # noqa: F401

SHAPE, BIG = (2, 3), (1200, 1200)
kv = mx.kv.create(sys.argv[1] if len(sys.argv) > 1 else "dist_bsp")
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 20
mode = sys.argv[3] if len(sys.argv) > 3 else "push"
rank, n = kv.rank, kv.num_workers
kv.init("3", mx.nd.zeros(SHAPE))
kv.init("99", mx.nd.zeros(BIG))
bad = 0
for i in range(rounds):
    if mode == "push":
        kv.push("3", mx.nd.ones(SHAPE) * (rank + 1))
        kv.push("99", mx.nd.ones(BIG) * (rank + 1))
        expected = (n + 1) * n / 2
        got = []
    else:
        time.sleep(0.02 * rank)
        small = mx.nd.ones(SHAPE) * (rank + 1) * (i + 1)
        kv.pushpull("3", small)                       # in place
        big = mx.nd.zeros(BIG)
        kv.pushpull("99", mx.nd.ones(BIG) * (rank + 1) * (i + 1), out=big)
        expected = (n + 1) * n / 2 * (i + 1)
        got = [("pushpull", small), ("pushpull out=", big)]
    val = mx.nd.zeros(SHAPE)
    kv.pull("3", out=val)
    val2 = mx.nd.zeros(BIG)
    kv.pull("99", out=val2)
    for what, v in got + [("pull", val), ("pull", val2)]:
        v = v.asnumpy()
        if not np.all(v == expected):
            bad += 1
            print(f"worker {rank} round {i}: {what} min {v.min()} max {v.max()}, "
                  f"expected {expected}", flush=True)
checks = 2 * rounds if mode == "push" else 4 * rounds
print(f"PULLCHECK worker {rank} bad {bad} of {checks}", flush=True)
kv.barrier()
sys.exit(1 if bad else 0)
