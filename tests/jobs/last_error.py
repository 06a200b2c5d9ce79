"""The server fails the last update; the script never calls the store again and saves its
weights: the failure must still reach the user (at the latest, a non-zero exit)."""
import sys

import mxnet as mx

import kvstore_ext  # noqa: F401
from failing_optimizer import FailingSGD

rounds = int(sys.argv[1])
kv = mx.kv.create("dist_asp")
kv.set_optimizer(FailingSGD(fail_at=rounds * kv.num_workers, learning_rate=0.1))
w = mx.nd.zeros((3,))
kv.init(0, w)
kv.barrier()
for i in range(rounds):
    kv.pushpull(0, mx.nd.ones((3,)), out=w)
    if i < rounds - 1:
        w.wait_to_read()
print(f"worker {kv.rank} saved weights {w.asnumpy().tolist()}", flush=True)
