"""MXNet's own dense push/pull check (tests/nightly/dist_sync_kvstore.py), repeated: every
round each worker pushes two keys (one small, one split over the servers) and pulls them
into freshly made zero arrays, which must then hold the summed value."""
import sys

import mxnet as mx
import numpy as np

import kvstore_ext  # noqa: F401

SHAPE, BIG = (2, 3), (1200, 1200)
kv = mx.kv.create(sys.argv[1] if len(sys.argv) > 1 else "dist_bsp")
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 20
rank, n = kv.rank, kv.num_workers
kv.init("3", mx.nd.zeros(SHAPE))
kv.init("99", mx.nd.zeros(BIG))
bad = 0
for i in range(rounds):
    kv.push("3", mx.nd.ones(SHAPE) * (rank + 1))
    kv.push("99", mx.nd.ones(BIG) * (rank + 1))
    expected = (n + 1) * n / 2
    val = mx.nd.zeros(SHAPE)
    kv.pull("3", out=val)
    val2 = mx.nd.zeros(BIG)
    kv.pull("99", out=val2)
    for v in (val.asnumpy(), val2.asnumpy()):
        if not np.all(v == expected):
            bad += 1
            print(f"worker {rank} round {i}: pulled min {v.min()} max {v.max()}, expected {expected}",
                  flush=True)
print(f"PULLCHECK worker {rank} bad {bad} of {2 * rounds}", flush=True)
kv.barrier()
sys.exit(1 if bad else 0)
