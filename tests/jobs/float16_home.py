"""float16 keys under SGD, for one store: the bits of the weights every worker pulls.

    launch.py -n N -s 2 python float16_home.py STORE OUT [--multi-precision]

Run on MXNet's ``dist_sync`` or ``dist_async`` (``--backend mxnet``) and on a kvstore_ext
store; the test compares the two reports.  MXNet's servers sum and update float16 keys in
float32 and send them back rounded to float16, so (1) every worker's gradient of 40,000 on a
key sums to 40,000·N there, which float16 cannot hold, and (2) an update smaller than half a
float16 step still moves the weights.  Keys small and split over the servers (``BIG`` is over
the bound that splits a key when the job is given ``MXNET_KVSTORE_BIGARRAY_BOUND`` of
20,000, as the test gives it; kvstore_ext's stores take it as MXNet's do).  Worker ``r`` writes ``OUT.r.json``.
"""
import hashlib
import json
import sys

import mxnet as mx
import numpy as np

import kvstore_ext  # noqa: F401

store, out = sys.argv[1], sys.argv[2]
MULTI_PRECISION = "--multi-precision" in sys.argv[3:]
kv = mx.kv.create(store)
rank, n = kv.rank, kv.num_workers
SMALL, BIG = (7, 3), (150, 151)
STEPS = 6
LR, MOMENTUM, WD = 0.05, 0.9, 1e-4
report = {"store": store, "num_workers": n, "multi_precision": MULTI_PRECISION}


def bits(array):
    """The float16 bit patterns of a small array; a digest of a big one, and its count of
    values that are not finite."""
    x = array.asnumpy()
    if x.size <= 64:
        return x.view(np.uint16).ravel().tolist()
    return [hashlib.sha256(x.tobytes()).hexdigest(), int((~np.isfinite(x)).sum())]


def pulled(key, shape):
    value = mx.nd.zeros(shape, dtype="float16")
    kv.pull(key, out=value)
    return value


rng = np.random.RandomState(0)       # the same initial weights on every worker (worker 0's win)
initial = {key: rng.uniform(-1, 1, shape).astype(np.float16)
           for key, shape in [(20, SMALL), (21, BIG)]}
kv.init([10, 11, 20, 21], [mx.nd.zeros(SMALL, dtype="float16"), mx.nd.zeros(BIG, dtype="float16"),
                           mx.nd.array(initial[20], dtype="float16"),
                           mx.nd.array(initial[21], dtype="float16")])
# without --multi-precision, the Trainer's default (MXNet's own server then reads an
# uninitialised flag: docs/mxnet_tests.md)
kv.set_optimizer(mx.optimizer.create("sgd", learning_rate=LR, momentum=MOMENTUM, wd=WD,
                                     rescale_grad=1.0 / n, multi_precision=MULTI_PRECISION))

# (1) gradients of 40,000 from every worker: two of them sum past float16's largest value
for key, shape in [(10, SMALL), (11, BIG)]:
    kv.push(key, mx.nd.ones(shape, dtype="float16") * 40000)
report["overflow"] = [bits(pulled(key, shape)) for key, shape in [(10, SMALL), (11, BIG)]]
report["overflow_value"] = float(pulled(10, SMALL).asnumpy()[0, 0])

# (2) ordinary gradients, SGD with momentum, several steps; many updates are below half a
#     float16 step of the weights (about 1e-3 near 1), so float16 weights would not move
grads = np.random.RandomState(100 + rank)
steps = []
for _ in range(STEPS):
    for key, shape in [(20, SMALL), (21, BIG)]:
        kv.push(key, mx.nd.array(grads.uniform(-0.05, 0.05, shape), dtype="float16"))
    steps.append([bits(pulled(key, shape)) for key, shape in [(20, SMALL), (21, BIG)]])
report["sgd_momentum"] = steps
report["moved"] = int((pulled(20, SMALL).asnumpy() != initial[20]).sum())
kv._barrier()
with open(f"{out}.{rank}.json", "w") as f:
    json.dump(report, f)
print(f"worker {rank} done", flush=True)
