#!/usr/bin/env python3
"""Train a small CNN on the shipped MNIST digits with any kvstore; run it under launch.py.

    python scripts/launch.py -n 2 -s 1 python scripts/train_mnist.py --kvstore dist_ssp
    python scripts/launch.py -n 2 -s 1 --worker-speed 1.0,0.43 \
        python scripts/train_mnist.py --kvstore dist_dssp --model alexnet_small --eval-interval 20

Each worker trains on its share of the 8,000 training digits and writes a JSON
result (test accuracy, samples/s, the store's metrics, and with --eval-interval
worker 0's test accuracy against training time) to ``--out``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402
from tqdm import tqdm  # noqa: E402

import kvstore_ext  # noqa: E402,F401  (registers the kvstore_ext stores)
import gluon_trainers  # noqa: E402
from gluon_trainers.data import load_mnist, shard  # noqa: E402
from gluon_trainers.models import MODELS  # noqa: E402
from gluon_trainers.evaluation import evaluate, finish_run  # noqa: E402
from gluon_trainers import straggler as emulation  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kvstore", default="dist_bsp",
                   help="kvstore type: dist_bsp, dist_asp, dist_ssp, dist_dssp, dist_psp (kvstore_ext) or "
                        "MXNet's dist_sync, dist_async (launch with --backend mxnet), or local")
    p.add_argument("--model", choices=sorted(MODELS), default="lenet",
                   help="lenet, or alexnet_small: the DSSP paper's downsized AlexNet "
                        "(3 convolutions, 2 dense layers) at 28x28 (default lenet)")
    p.add_argument("--trainer", choices=["gluon", "batched"], default="gluon",
                   help="gluon: stock gluon.Trainer (one pushpull per key); batched: "
                        "gluon_trainers.Trainer (one call per step) (default: gluon)")
    p.add_argument("--epochs", type=float, default=3, help="passes over each worker's share (default 3)")
    p.add_argument("--batch-size", type=int, default=64, help="per-worker batch size (default 64)")
    p.add_argument("--lr", type=float, default=0.02, help="learning rate (default 0.02)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--wd", type=float, default=1e-4, help="weight decay (default 1e-4)")
    p.add_argument("--seed", type=int, default=42, help="random seed for weights and shuffling")
    p.add_argument("--train-size", type=int, default=8000, help="training digits in all (default 8000)")
    p.add_argument("--test-size", type=int, default=2000, help="test digits (default 2000)")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    p.add_argument("--max-time", type=float, default=0,
                   help="stop after this many seconds of training, whatever the epoch: every "
                        "paradigm then gets the same time (0: no limit)")
    p.add_argument("--warmup-steps", type=int, default=5,
                   help="steps not counted in samples/s (default 5)")
    p.add_argument("--no-shuffle", action="store_true", help="keep the data order fixed")
    p.add_argument("--eval-interval", type=int, default=0,
                   help="worker 0 keeps a copy of the weights every this many of its steps and, "
                        "after training, logs their test accuracy against training time; 0: only "
                        "the final accuracy")
    p.add_argument("--data", default=None, help="MNIST .npz (default: $KVX_MNIST or data/mnist10k.npz)")
    p.add_argument("--out", default=None,
                   help="write this worker's result as JSON here ({rank} is replaced by the rank)")
    p.add_argument("--save-params", default=None,
                   help="save the final weights here ({rank} is replaced by the rank)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    mx.random.seed(args.seed)
    np.random.seed(args.seed)
    kv, rank, num_workers = gluon_trainers.make_kvstore(args.kvstore)
    x_train, y_train, x_test, y_test = load_mnist(args.data, args.train_size, args.test_size)
    x_train, y_train = shard(x_train, y_train, rank, num_workers)

    net = MODELS[args.model]()
    net.initialize(mx.init.Xavier(magnitude=2.24))
    net(mx.nd.zeros((1, 1, 28, 28)))
    trainer_cls = gluon_trainers.Trainer if args.trainer == "batched" else gluon.Trainer
    trainer = trainer_cls(net.collect_params(), "sgd",
                          {"learning_rate": args.lr, "momentum": args.momentum, "wd": args.wd},
                          kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(args.seed + rank)
    steps_per_epoch = len(x_train) // args.batch_size
    total_steps = int(round(args.epochs * steps_per_epoch))
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)
    straggler = emulation.from_env(rank, num_workers, args.batch_size)
    gluon_trainers.start_together(kv)
    step, t_start, t_counted = 0, time.perf_counter(), None
    losses = []

    params = list(net.collect_params().values())
    snapshots = []

    def snapshot():
        """Keep worker 0's weights now; they are evaluated after training, off the clock."""
        mx.nd.waitall()   # the step's weights have arrived
        snapshots.append((time.perf_counter() - t_start, time.time(), step,
                          [p.data().asnumpy() for p in params]))

    bar = tqdm(total=total_steps, desc=f"worker {rank} {args.kvstore}", disable=None, leave=False)
    out_of_time = False
    while step < total_steps and not out_of_time:
        order = np.arange(len(x_train)) if args.no_shuffle else rng.permutation(len(x_train))
        for b in range(steps_per_epoch):
            if step >= total_steps:
                break
            if args.max_time and time.perf_counter() - t_start >= args.max_time:
                out_of_time = True
                break
            if step == args.warmup_steps:
                t_counted = time.perf_counter()
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]
            data, label = mx.nd.array(x_train[idx]), mx.nd.array(y_train[idx])
            if straggler.active:
                straggler.begin()
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            if straggler.active:
                straggler.end()
            trainer.step(args.batch_size)
            step += 1
            if step % 20 == 0 or step == total_steps:
                losses.append(float(loss.mean().asscalar()))
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if rank == 0 and args.eval_interval and step % args.eval_interval == 0:
                snapshot()
            bar.update(1)
    mx.nd.waitall()
    t_end = time.perf_counter()
    bar.close()
    straggler.write_log()
    if rank == 0 and args.eval_interval and (not snapshots or snapshots[-1][2] != step):
        snapshot()
    curve = []
    if snapshots:   # a separate copy of the model: the trained one stays tied to its kvstore
        eval_net = MODELS[args.model]()
        eval_net.initialize()
        eval_net(mx.nd.zeros((1, 1, 28, 28)))
        eval_params = list(eval_net.collect_params().values())
    for train_time, wall, at_step, values in snapshots:
        for p, v in zip(eval_params, values):
            p.set_data(mx.nd.array(v, dtype=v.dtype))
        curve.append({"time_s": train_time, "wall_time": wall, "step": at_step,
                      "epoch": at_step / steps_per_epoch,
                      "test_accuracy": evaluate(eval_net, x_test, y_test)})
    counted = step - min(step, args.warmup_steps)
    samples_per_s = counted * args.batch_size / (t_end - t_counted) if t_counted and counted else 0.0
    accuracy = curve[-1]["test_accuracy"] if curve else evaluate(net, x_test, y_test)
    result = {"rank": rank, "num_workers": num_workers, "kvstore": args.kvstore,
              "trainer": args.trainer, "steps": step, "test_accuracy": accuracy,
              "samples_per_s": samples_per_s, "wall_time_s": t_end - t_start,
              "model": args.model,
              "final_loss": losses[-1] if losses else None, "accuracy_curve": curve,
              "straggler": straggler.to_dict(),
              "train_start_wall": time.time() - (time.perf_counter() - t_start)}
    finish_run(result, kv, args.out, args.save_params, net)
    print(f"worker {rank}: {args.kvstore} test accuracy {accuracy:.4f}, "
          f"{samples_per_s:.0f} samples/s, {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
