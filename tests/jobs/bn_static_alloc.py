"""gluon.Trainer's first step initialises each parameter from worker 0's arrays: with a net
hybridized with ``static_alloc`` on 2 devices, BatchNorm's running statistics, written by the
forward pass, must reach the servers as that pass left them.

Ten times, a fresh net (so that the keys are new) runs one forward and backward pass on each
device, then does what ``Trainer``'s first step does: ``kv.set_optimizer``, then per
parameter ``kv.init(key, arrays[0])`` and ``kv.pull(key, out=arrays)``.  (Without the
``set_optimizer`` the stale read came in 1 of 3 jobs, with it in 3 of 3.)  The running mean starts at 0 and the variance at 1; after a
training-mode pass on data of mean 3 neither may be left at its initial value.  Each worker
prints ``BNCHECK <rank> <trials whose statistics were lost> of 10``.
"""
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import kvstore_ext  # noqa: F401

kv = mx.kv.create(sys.argv[1])
ctxs = [mx.cpu(0), mx.cpu(1)]
TRIALS = 10
lost = 0
for trial in range(TRIALS):
    net = gluon.nn.HybridSequential(prefix=f"t{trial}_")
    with net.name_scope():
        net.add(gluon.nn.Dense(64, activation="relu"), gluon.nn.BatchNorm(), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    net.hybridize(static_alloc=True, static_shape=True)
    x = gluon.utils.split_and_load(mx.nd.array(np.random.RandomState(trial).randn(16, 50) + 3),
                                   ctxs)
    with autograd.record():
        losses = [net(a).sum() for a in x]
    for loss in losses:
        loss.backward()
    params = list(net.collect_params().values())
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1))   # as Trainer does first
    for i, p in enumerate(params):
        key = 100 * trial + i
        kv.init(key, p.list_data()[0])
        kv.pull(key, out=p.list_data())
    mean = [a.asnumpy() for p in params if p.name.endswith("running_mean")
            for a in p.list_data()]
    var = [a.asnumpy() for p in params if p.name.endswith("running_var") for a in p.list_data()]
    assert len(mean) == len(var) == 2
    if any(np.all(m == 0) for m in mean) or any(np.all(v == 1) for v in var):
        lost += 1
print(f"BNCHECK {kv.rank} {lost} of {TRIALS}", flush=True)
kv.barrier()
