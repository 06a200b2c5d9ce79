"""Stock gluon.Trainer on the store named in argv[1]; worker 1 stays away argv[2] seconds
(default 8) before step 1, and with --barrier again before a barrier: worker 0's step 1
(a synchronous round: a pushpull, or an allreduce), then its barrier, wait for it."""
import sys
import time

import mxnet as mx
from mxnet import autograd, gluon

import kvstore_ext

away = float(sys.argv[2]) if len(sys.argv) > 2 and not sys.argv[2].startswith("-") else 8.0
kv = kvstore_ext.create(sys.argv[1])
net = gluon.nn.Dense(4, in_units=3)
net.initialize(mx.init.Constant(0.1))
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)
for step in range(3):
    if kv.rank == 1 and step == 1:
        time.sleep(away)   # busy elsewhere
    with autograd.record():
        loss = net(mx.nd.ones((2, 3))).sum()
    loss.backward()
    trainer.step(2)
    print(f"worker {kv.rank} step {step} loss {loss.asscalar():.4f}", flush=True)
if "--barrier" in sys.argv:
    if kv.rank == 1:
        time.sleep(away)
    kv._barrier()
    print(f"worker {kv.rank} passed the barrier", flush=True)
