#!/usr/bin/env python3
"""A plain Gluon MNIST script, as a user writes it: only the kvstore name changes.

LeNet (conv 20x5x5 relu, max-pool 2, conv 50x5x5 relu, max-pool 2, dense 500 relu,
dense 10), Xavier initialisation, stock ``gluon.Trainer`` with momentum SGD; each
worker trains on its share of 8,000 training digits and tests on 2,000 held-out
ones.  Run it under launch.py with any store, MXNet's own included:

    python scripts/launch.py -n 2 -s 1 python scripts/plain_gluon_mnist.py --kvstore dist_asp
    python scripts/launch.py -n 2 -s 1 --backend mxnet \\
        python scripts/plain_gluon_mnist.py --kvstore dist_async

Prints one ``RESULT {json}`` line per worker.  ``--staleness-probe`` adds a one-element
parameter whose gradient is always 1: the value each pull brings back tells how many
updates the server has applied, so the staleness of every push can be read off on the
worker, the same way for every store (``scripts/compare_async.py`` uses it).
"""
import argparse
import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvstore_ext  # noqa: E402,F401  (registers dist_asp, ...; harmless for MXNet's own stores)
from gluon_trainers.data import load_mnist, shard  # noqa: E402


MOMENTUM_OPTIMIZERS = {"sgd", "nag", "signum", "dcasgd", "adagradmomentum"}


def lenet():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(20, 5, activation="relu"), gluon.nn.MaxPool2D(2),
            gluon.nn.Conv2D(50, 5, activation="relu"), gluon.nn.MaxPool2D(2),
            gluon.nn.Dense(500, activation="relu"), gluon.nn.Dense(10))
    return net


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kvstore", required=True,
                   help="any store: dist_asp, dist_ssp, ... or MXNet's dist_async (--backend mxnet)")
    p.add_argument("--optimizer", default="sgd",
                   help="any MXNet optimizer name, e.g. adagrad, or kvstore_ext's adadelay, "
                        "adaptiverevision, dcasgda, adagradmomentum (default sgd)")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate (default 0.05)")
    p.add_argument("--momentum", type=float, default=0.9,
                   help="momentum, for the optimizers that have one (default 0.9)")
    p.add_argument("--batch-size", type=int, default=32, help="per-worker batch (default 32)")
    p.add_argument("--epochs", type=int, default=2, help="passes over each share (default 2)")
    p.add_argument("--seed", type=int, default=1, help="seed of weights and shuffling (default 1)")
    p.add_argument("--data", default=None, help="MNIST .npz (default: $KVX_MNIST or data/)")
    p.add_argument("--staleness-probe", action="store_true",
                   help="report the staleness of every push, read off a probe parameter")
    return p.parse_args(argv)


def probe_counts(values, lr: float, momentum: float) -> list[int]:
    """How many updates each probe value stands for (gradient 1, momentum SGD, float32)."""
    w = mom = np.float32(0)
    table = [w]
    while len(table) < 4 * len(values) + 10 or w > min(values, default=0):
        mom = np.float32(momentum) * mom - np.float32(lr)
        w = w + mom
        table.append(w)
    table = np.array(table, dtype=np.float64)
    return [int(np.argmin(np.abs(table - v))) for v in values]


def main(argv=None):
    args = parse_args(argv)
    if args.staleness_probe and args.optimizer != "sgd":
        sys.exit("--staleness-probe reads the probe's value as momentum SGD moves it: "
                 f"use it with --optimizer sgd, not {args.optimizer}")
    mx.random.seed(args.seed)
    np.random.seed(args.seed)
    kv = mx.kv.create(args.kvstore)
    x_train, y_train, x_test, y_test = load_mnist(args.data, 8000, 2000)
    train = gluon.data.DataLoader(gluon.data.ArrayDataset(*shard(x_train, y_train, kv.rank,
                                                                 kv.num_workers)),
                                  batch_size=args.batch_size, shuffle=True, last_batch="discard")
    net = lenet()
    net.initialize(mx.init.Xavier())
    params = net.collect_params()
    probe = None
    if args.staleness_probe:
        probe = gluon.Parameter("staleness_probe", shape=(1,), init=mx.init.Zero())
        probe.initialize()
        params._params[probe.name] = probe
    options = {"learning_rate": args.lr}
    if args.optimizer in MOMENTUM_OPTIMIZERS:
        options["momentum"] = args.momentum
    trainer = gluon.Trainer(params, args.optimizer, options, kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    seen = []
    for _ in range(args.epochs):
        for data, label in train:
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            if probe is not None:
                probe.grad()[:] = args.batch_size   # 1 after the optimizer's rescale_grad
                probe.data()._fresh_grad = True
            trainer.step(args.batch_size)
            if probe is not None:
                seen.append(float(probe.data().asscalar()))
    correct = 0
    for i in range(0, len(x_test), 500):
        out = net(mx.nd.array(x_test[i:i + 500])).argmax(axis=1).asnumpy()
        correct += int((out == y_test[i:i + 500]).sum())
    result = {"rank": kv.rank, "num_workers": kv.num_workers, "kvstore": args.kvstore,
              "optimizer": args.optimizer, "lr": args.lr, "seed": args.seed, "accuracy": correct / len(x_test)}
    if probe is not None:
        counts = probe_counts(seen, args.lr, args.momentum)
        # updates by others between this worker's previous reply and its push being applied
        result["staleness"] = [counts[0] - 1] + [b - 1 - a for a, b in zip(counts, counts[1:])]
        # how far the job was when this worker stopped: the weights it tests had this many
        # updates applied, of steps x workers in the whole job
        result["updates_seen"] = counts[-1] if counts else 0
        result["steps"] = len(counts)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
