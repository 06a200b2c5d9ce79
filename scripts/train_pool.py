#!/usr/bin/env python3
"""Train LeNet (or --model) on the MNIST digits with a worker pool (Adaptable Asynchrony, ``dist_pool``).

Run it through launch.py; the pool is set with the store's parameters:

    python scripts/launch.py -n 8 -s 1 --kv-param pool=progressive --kv-param pool_every=1 \\
        --kv-param tune=aa --kv-param tune_k=0.075 --kv-param batch_size=128 \\
        --kv-param epoch_samples=6400 --kv-param epochs=6 \\
        python scripts/train_pool.py --optimizer adagrad --lr 0.004 --out results/pool-{rank}.json

The servers decide how many workers compute at once, each worker's batch size and the
learning rate; the job ends when ``epochs * epoch_samples`` samples are applied.  Each worker
writes its steps (start, end, batch size, pool size, learning rate, loss) and its final test
accuracy to --out.  With --val-size, the digits after the training ones are a validation set:
worker 0 measures its loss every --eval-every of its steps (the curve in --out), keeps the
weights of the lowest, and reports their test accuracy too (early stopping on validation loss,
applied to the curve: the run itself goes on to the budget).  launch.py's --device emulates a
device per worker; its time per step follows the batch size the pool sets.
"""
import argparse
import json
import os
import sys
import time

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
    p.add_argument("--model", default="lenet",
                   help="lenet, alexnet_small, small_vgg (the dissertation's network), "
                        "cifar_resnet50_v1 (default lenet)")
    p.add_argument("--train-size", type=int, default=6400, help="training digits (default 6400)")
    p.add_argument("--val-size", type=int, default=0,
                   help="validation digits, after the training ones (default 0: none)")
    p.add_argument("--eval-every", type=int, default=10,
                   help="worker 0's steps between validation measurements (default 10)")
    p.add_argument("--test-size", type=int, default=2000, help="test digits (default 2000)")
    p.add_argument("--seed", type=int, default=42, help="seed of the weights and batch orders")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: none)")
    p.add_argument("--data", default=None, help="MNIST .npz (default: $KVX_MNIST or data/)")
    p.add_argument("--out", default=None, help="JSON per worker ({rank} is replaced)")
    return p.parse_args(argv)


def validation(net, loss_fn, x, y, batch_size: int = 800):
    """Mean loss and top-1 accuracy of ``net`` on a held-out set."""
    import mxnet as mx
    total, correct = 0.0, 0
    for i in range(0, len(x), batch_size):
        data, label = mx.nd.array(x[i:i + batch_size]), mx.nd.array(y[i:i + batch_size])
        out = net(data)
        total += float(loss_fn(out, label).sum().asscalar())
        correct += int((out.argmax(axis=1) == label).sum().asscalar())
    return total / len(x), correct / len(x)


def main(argv=None) -> int:
    args = parse_args(argv)
    import mxnet as mx
    from mxnet import gluon

    import kvstore_ext  # noqa: F401  (registers dist_pool and the delay-aware optimizers)
    from gluon_trainers import straggler as emulation
    from kvstore_ext import jobenv
    from gluon_trainers.data import load_mnist
    from gluon_trainers.evaluation import evaluate
    from gluon_trainers.models import MODELS
    from gluon_trainers.pool import PoolBatches, train_in_pool
    from gluon_trainers.trainer import Trainer

    mx.random.seed(args.seed)
    x, y, x_test, y_test = load_mnist(args.data, args.train_size + args.val_size, args.test_size)
    x, y, x_val, y_val = x[:args.train_size], y[:args.train_size], x[args.train_size:], \
        y[args.train_size:]
    kv = mx.kv.create("dist_pool")
    if not kv.params["epochs"] and not args.max_steps:
        print("train_pool.py: the pool has no sample budget, so it would never say stop: give "
              "launch.py --kv-param epochs=N (with epoch_samples) or --max-steps",
              file=sys.stderr)
        return 2
    if args.model not in MODELS:
        print(f"train_pool.py: unknown --model {args.model!r} (known: {', '.join(MODELS)})",
              file=sys.stderr)
        return 2
    net = MODELS[args.model]()
    net.initialize(mx.init.Xavier())
    net(mx.nd.array(x[:2]))
    opt_params = {"learning_rate": args.lr}
    if args.momentum is not None:
        opt_params["momentum"] = args.momentum
    trainer = Trainer(net.collect_params(), args.optimizer, opt_params, kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    curve, best, steps = [], {}, [0]
    t0 = time.time()

    def validate(record):
        steps[0] += 1
        if kv.rank != 0 or not args.val_size or steps[0] % args.eval_every:
            return
        loss, accuracy = validation(net, loss_fn, x_val, y_val)
        point = {"time_s": record["end"] - t0, "updates": record["updates"], "step": steps[0],
                 "val_loss": loss, "val_accuracy": accuracy, "pool": record["pool"],
                 "batch_size": record["batch_size"], "lr": record["lr"]}
        curve.append(point)
        if not best or loss < best["point"]["val_loss"]:
            best.update(point=point, params={k: v.data().copy()
                                             for k, v in net.collect_params().items()})

    device = emulation.from_env(kv.rank, kv.num_workers, kv.params["batch_size"])
    log = train_in_pool(net, trainer, kv, PoolBatches(x, y, seed=args.seed + kv.rank), loss_fn,
                        on_step=validate, max_steps=args.max_steps,
                        device=device if isinstance(device, emulation.EmulatedDevice) else None,
                        # the batch the device's profile is for: launch.py --device-batch,
                        # else the pool's starting batch size
                        device_batch=int(os.environ.get(jobenv.DEVICE_BATCH) or
                                         kv.params["batch_size"]))
    result = {"rank": kv.rank, "steps": log, "test_accuracy": evaluate(net, x_test, y_test),
              "samples": sum(s["batch_size"] for s in log), "curve": curve,
              "wall_time_s": time.time() - t0}
    if isinstance(device, emulation.EmulatedDevice):
        device.write_log()
        result["device"] = device.to_dict()
    if best:
        for k, v in net.collect_params().items():   # in place: the Trainer's store stays
            v.data()[:] = best["params"][k]
        result["best"] = {**best["point"], "test_accuracy": evaluate(net, x_test, y_test)}
    print(f"worker {kv.rank}: {len(log)} steps, {result['samples']} samples, "
          f"test accuracy {result['test_accuracy']:.4f}", flush=True)
    if args.out:
        with open(args.out.replace("{rank}", str(kv.rank)), "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
