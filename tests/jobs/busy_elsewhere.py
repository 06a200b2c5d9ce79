"""Stock gluon.Trainer on the store named in argv[1]; worker 1 stays away argv[2] seconds
(default 8) before step 1, and with --barrier again before a barrier: worker 0's step 1
(a synchronous round: a pushpull, or an allreduce), then its barrier, wait for it.

With --engine-hold, worker 1 does not stay away: worker 0's step 1 finds the first
parameter's gradient held in MXNet's engine for that time instead, by an operation that
writes it and ends late, as one that never ends would hold it for ever."""
import sys
import threading
import time

import mxnet as mx
from mxnet import autograd, gluon

import kvstore_ext

away = float(sys.argv[2]) if len(sys.argv) > 2 and not sys.argv[2].startswith("-") else 8.0
kv = kvstore_ext.create(sys.argv[1])
net = gluon.nn.Dense(4, in_units=3)
net.initialize(mx.init.Constant(0.1))
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)
hold = "--engine-hold" in sys.argv
for step in range(3):
    if kv.rank == 1 and step == 1 and not hold:
        time.sleep(away)   # busy elsewhere
    with autograd.record():
        loss = net(mx.nd.ones((2, 3))).sum()
    loss.backward()
    if hold and kv.rank == 0 and step == 1:
        from kvstore_ext import engine
        engine.push_async(lambda done: threading.Timer(away, done).start(),
                          [net.weight.grad()], b"held_for_the_test")
    trainer.step(2)
    print(f"worker {kv.rank} step {step} loss {loss.asscalar():.4f}", flush=True)
if hold:
    time.sleep(1.5)    # the stall check looks every 0.5 s here: it sees the wait has ended
if "--barrier" in sys.argv:
    if kv.rank == 1:
        time.sleep(away)
    kv._barrier()
    print(f"worker {kv.rank} passed the barrier", flush=True)
