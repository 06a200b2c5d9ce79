#!/usr/bin/env python3
"""Train LeNet on the MNIST digits with a worker pool (Adaptable Asynchrony, ``dist_pool``).

Run it through launch.py; the pool is set with the store's parameters:

    python scripts/launch.py -n 8 -s 1 --kv-param pool=progressive --kv-param pool_every=1 \\
        --kv-param tune=aa --kv-param tune_k=0.075 --kv-param batch_size=128 \\
        --kv-param epoch_samples=6400 --kv-param epochs=6 \\
        python scripts/train_pool.py --optimizer adagrad --lr 0.004 --out results/pool-{rank}.json

The servers decide how many workers compute at once, each worker's batch size and the
learning rate; the job ends when ``epochs * epoch_samples`` samples are applied.  Each worker
writes its steps (start, end, batch size, pool size, learning rate, loss) and its final test
accuracy to --out.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--optimizer", default="adagrad",
                   help="any mx.optimizer name: adagrad (AsyncAdagrad), adadelay, "
                        "adaptiverevision, dcasgda, adagradmomentum, sgd (default adagrad)")
    p.add_argument("--lr", type=float, default=0.004,
                   help="the learning rate at the pool's starting size (default 0.004)")
    p.add_argument("--momentum", type=float, default=None,
                   help="momentum, for optimizers that take one (the pool's 'm' tuning moves it)")
    p.add_argument("--train-size", type=int, default=6400, help="training digits (default 6400)")
    p.add_argument("--test-size", type=int, default=2000, help="test digits (default 2000)")
    p.add_argument("--seed", type=int, default=42, help="seed of the weights and batch orders")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: none)")
    p.add_argument("--data", default=None, help="MNIST .npz (default: $KVX_MNIST or data/)")
    p.add_argument("--out", default=None, help="JSON per worker ({rank} is replaced)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import mxnet as mx
    from mxnet import gluon

    import kvstore_ext  # noqa: F401  (registers dist_pool and the delay-aware optimizers)
    from gluon_trainers.data import load_mnist
    from gluon_trainers.evaluation import evaluate
    from gluon_trainers.models import lenet
    from gluon_trainers.pool import PoolBatches, train_in_pool
    from gluon_trainers.trainer import Trainer

    mx.random.seed(args.seed)
    x, y, x_test, y_test = load_mnist(args.data, args.train_size, args.test_size)
    kv = mx.kv.create("dist_pool")
    net = lenet()
    net.initialize(mx.init.Xavier())
    net(mx.nd.array(x[:2]))
    opt_params = {"learning_rate": args.lr}
    if args.momentum is not None:
        opt_params["momentum"] = args.momentum
    trainer = Trainer(net.collect_params(), args.optimizer, opt_params, kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    log = train_in_pool(net, trainer, kv, PoolBatches(x, y, seed=args.seed + kv.rank), loss_fn,
                        max_steps=args.max_steps)
    result = {"rank": kv.rank, "steps": log, "test_accuracy": evaluate(net, x_test, y_test),
              "samples": sum(s["batch_size"] for s in log)}
    print(f"worker {kv.rank}: {len(log)} steps, {result['samples']} samples, "
          f"test accuracy {result['test_accuracy']:.4f}", flush=True)
    if args.out:
        with open(args.out.replace("{rank}", str(kv.rank)), "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
