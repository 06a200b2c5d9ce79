"""A plain Gluon script whose optimizer fails on the servers: MXNet's own DCASGD with momentum
(its update tests ``if mom:`` on a momentum array, a ValueError in MXNet 1.9.1).

Every worker must get the error, naming the optimizer and its cause, in bounded time, and then
be able to stop; none may wait for ever for a round that will not come.  Each prints
``FAILED {...}`` with the error and its type, and exits 0.

    broken_dcasgd.py KVSTORE
"""
import json
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import kvstore_ext  # noqa: F401  (registers the stores)

kv = mx.kv.create(sys.argv[1])
net = gluon.nn.Dense(4, in_units=6)
net.initialize(mx.init.Constant(0.1))
trainer = gluon.Trainer(net.collect_params(), "dcasgd",
                        {"learning_rate": 0.1, "momentum": 0.9}, kvstore=kv)
rng = np.random.RandomState(kv.rank)
loss = gluon.loss.L2Loss()
start = time.monotonic()
record = {"rank": kv.rank, "steps": 0}
try:
    for step in range(20):
        x, y = mx.nd.array(rng.randn(8, 6)), mx.nd.array(rng.randn(8, 4))
        with autograd.record():
            out = loss(net(x), y)
        out.backward()
        trainer.step(8)
        net.weight.data().asnumpy()      # the step's reply, or its error
        record["steps"] += 1
except Exception as exc:  # noqa: BLE001 (the test checks which)
    record.update(type=type(exc).__name__, error=str(exc),
                  is_kvstore_error=isinstance(exc, kvstore_ext.KVStoreError))
record["seconds"] = round(time.monotonic() - start, 2)
print("FAILED " + json.dumps(record), flush=True)
