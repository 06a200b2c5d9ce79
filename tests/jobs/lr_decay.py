"""LeNet on MNIST with a step decay set by ``trainer.set_learning_rate``, as GluonCV's and
many users' scripts decay it: the rate times 0.1 after step 10, times 0.01 after step 20.

    python scripts/launch.py -n 2 -s 2 python tests/jobs/lr_decay.py dist_bsp OUT
    python tests/jobs/lr_decay.py local OUT --local-workers 2

``local`` is the reference: one process, MXNet's own local store, a device per worker (each
given that worker's batch), the trainer's optimizer updating, so the sum and the steps are
those of a synchronous job.  (MXNet's ``dist_sync`` with ``update_on_kvstore=False`` would be
one too, but its pulls race with its pushes: two such runs here ended up to 39% apart.)

Each worker saves its weights to ``OUT.<rank>.params`` and the rates it set to ``OUT.<rank>.json``.
"""
import argparse
import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import kvstore_ext  # noqa: E402,F401
from gluon_trainers.data import load_mnist, shard  # noqa: E402
from plain_gluon_mnist import lenet  # noqa: E402

DECAY_AT = {10: 0.1, 20: 0.01}   # step -> factor of the first rate


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kvstore")
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--local-workers", type=int, default=1,
                   help="with the local store: the workers one process stands for")
    args = p.parse_args()
    mx.random.seed(1)
    np.random.seed(1)
    local = args.kvstore == "local"
    kv = mx.kv.create(args.kvstore)
    rank, workers = (0, args.local_workers) if local else (kv.rank, kv.num_workers)
    devices = [mx.cpu(i) for i in range(workers)] if local else [mx.cpu()]
    net = lenet()
    net.initialize(mx.init.Xavier(), ctx=devices)
    net(mx.nd.zeros((1, 1, 28, 28), ctx=devices[0]))
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": args.lr, "momentum": 0.9, "wd": 1e-4},
                            kvstore=kv, update_on_kvstore=False if local else None)
    x, y, _, _ = load_mnist()
    shards = [shard(x, y, r, workers) for r in (range(workers) if local else [rank])]
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rates, batch = [], 32
    for step in range(args.steps):
        if step in DECAY_AT:
            trainer.set_learning_rate(args.lr * DECAY_AT[step])
        rates.append(trainer.learning_rate)
        with autograd.record():
            losses = [loss_fn(net(mx.nd.array(sx[step * batch:(step + 1) * batch], ctx=d)),
                              mx.nd.array(sy[step * batch:(step + 1) * batch], ctx=d))
                      for (sx, sy), d in zip(shards, devices)]
        autograd.backward(losses)
        trainer.step(batch)
    mx.nd.waitall()
    net.save_parameters(f"{args.out}.{rank}.params")
    with open(f"{args.out}.{rank}.json", "w") as f:
        json.dump({"rates": rates, "update_on_kvstore": trainer._update_on_kvstore}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
