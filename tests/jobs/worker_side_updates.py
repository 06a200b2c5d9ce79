"""``gluon.Trainer(..., update_on_kvstore=False)``: the store sums the gradients in place and
every worker runs the optimizer itself.  Each worker also replays the whole job in its own
process (every worker's batches, their gradients summed, a local trainer with the same scale)
and writes both results: the store's weights must equal that replay bit for bit on every worker.

MXNet's own ``dist_sync`` does not always pass: in 1 of 12 runs here its two workers ended
with different weights (docs/reliability.md).

    worker_side_updates.py KVSTORE OPTIMIZER OUT     (OUT gets .<rank>.json)
"""
import json
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import kvstore_ext  # noqa: F401  (registers the stores)

STEPS, BATCH = 12, 16


def settings(name):
    """Realistic settings: momentum, weight decay, a schedule, clipping (a schedule keeps
    state: each trainer gets its own)."""
    if name == "sgd":
        return {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4}
    return {"learning_rate": 0.01, "clip_gradient": 0.05,
            "lr_scheduler": mx.lr_scheduler.FactorScheduler(step=4, factor=0.5, base_lr=0.01)}


def network():
    mx.random.seed(7)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(64, activation="relu", in_units=100), gluon.nn.Dense(10, in_units=64))
    net.initialize(mx.init.Xavier())
    return net


def batches(rank):
    rng = np.random.RandomState(100 + rank)
    return [(mx.nd.array(rng.randn(BATCH, 100)), mx.nd.array(rng.randint(0, 10, BATCH)))
            for _ in range(STEPS)]


def gradients(net, x, y, loss):
    with autograd.record():
        out = loss(net(x), y)
    out.backward()


def main():
    kvstore, name, out = sys.argv[1:4]
    kv = mx.kv.create(kvstore)
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    net = network()
    trainer = gluon.Trainer(net.collect_params(), name, settings(name), kvstore=kv,
                            update_on_kvstore=False)
    for x, y in batches(kv.rank):
        gradients(net, x, y, loss)
        trainer.step(BATCH)
    weights = [p.data().asnumpy() for p in net.collect_params().values()]

    # the replay: every worker's batch, the gradients summed, the optimizer run here
    ref = network()
    ref_trainer = gluon.Trainer(ref.collect_params(), name, settings(name), kvstore=None)
    ref_trainer._scale = trainer._scale   # what the Trainer made of the job's store
    params = list(ref.collect_params().values())
    every = [batches(r) for r in range(kv.num_workers)]
    for step in range(STEPS):
        total = None
        for r in range(kv.num_workers):
            gradients(ref, *every[r][step], loss)
            grads = [p.grad().copy() for p in params]
            total = grads if total is None else [t + g for t, g in zip(total, grads)]
        for p, g in zip(params, total):
            p.grad()[:] = g
        ref_trainer.step(BATCH)
    replay = [p.data().asnumpy() for p in params]
    with open(f"{out}.{kv.rank}.json", "w") as f:
        json.dump({"rank": kv.rank, "update_on_kvstore": trainer._update_on_kvstore,
                   "max_diff": max(float(np.abs(a - b).max()) for a, b in zip(weights, replay)),
                   "first": [float(w.ravel()[0]) for w in weights],
                   "moved": max(float(np.abs(a - b).max()) for a, b in zip(
                       weights, [p.data().asnumpy() for p in network().collect_params().values()]))},
                  f)


if __name__ == "__main__":
    main()
