#!/usr/bin/env python3
"""Train with DC-S3GD (or its SSGD baseline) on Horovod, with the paper's schedules.

    python scripts/launch.py -n 2 --launcher horovod python scripts/train_dcs3gd.py \\
        --config configs/recipes/dcs3gd_lenet_mnist_cpu.yaml
    horovodrun -np 2 -H localhost:2 --gloo python scripts/train_dcs3gd.py --kvstore dist_ssgd

Stock ``gluon.Trainer`` with ``kvstore='dist_dcs3gd'``.  ``--kvstore local`` runs one
process without Horovod (the single-process reference).  The MNIST recipes run
here; the ImageNet recipes of the paper's Table I need ``train.rec`` and
``val.rec`` under ``--data-dir`` and say which file is missing.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

import gluon_trainers  # noqa: E402
import kvstore_ext  # noqa: E402,F401  (registers dist_dcs3gd, dist_ssgd)
from kvstore_ext.engine import SimulatedLink  # noqa: E402
from gluon_trainers.data import load_mnist, shard  # noqa: E402
from gluon_trainers.models import lenet  # noqa: E402
from gluon_trainers.evaluation import evaluate, finish_run  # noqa: E402
from gluon_trainers.schedules import WD_FACTOR, WarmupLinearDecay, no_weight_decay_on_bn_and_bias  # noqa: E402

IMAGENET_FILES = ("train.rec", "val.rec")


def dense_net(hidden: int = 2048, classes: int = 10) -> gluon.nn.HybridSequential:
    """An MLP whose large dense layers make communication about as long as computation."""
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Flatten(), gluon.nn.Dense(hidden, activation="relu"),
                gluon.nn.Dense(hidden, activation="relu"), gluon.nn.Dense(classes))
    return net


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", help="a configs/recipes/dcs3gd_*.yaml recipe; options given here win")
    p.add_argument("--kvstore", default="dist_dcs3gd",
                   help="dist_dcs3gd (default), dist_ssgd, or local (one process, no Horovod)")
    p.add_argument("--lambda0", type=float, default=None,
                   help="DC-S3GD delay compensation strength (default 0.2)")
    p.add_argument("--model", default="lenet", help="lenet, or dense (MLP, --hidden wide)")
    p.add_argument("--hidden", type=int, default=2048, help="width of the dense model")
    p.add_argument("--dataset", default="mnist", help="mnist (here) or imagenet (record files)")
    p.add_argument("--data", default=None, help="MNIST .npz (default: $KVX_MNIST or data/)")
    p.add_argument("--data-dir", default=None, help="ImageNet: the folder of train.rec and val.rec")
    p.add_argument("--epochs", type=float, default=3, help="passes over each worker's share")
    p.add_argument("--batch-size", type=int, default=64, help="per-worker batch size")
    p.add_argument("--lr", type=float, default=0.02,
                   help="single-worker learning rate η_single (the schedule peaks at N·η_single)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--wd", type=float, default=1e-4, help="weight decay (before the factor k)")
    p.add_argument("--schedule", choices=["paper", "constant"], default="constant",
                   help="paper: warm-up to N·lr, linear decay to 0, wd on the same curve × k, no wd "
                        "on BN/biases; constant: lr and wd as given")
    p.add_argument("--warmup-epochs", type=float, default=0.5)
    p.add_argument("--ramp-epochs", type=float, default=None,
                   help="the warm-up's planned length (default: --warmup-epochs)")
    p.add_argument("--wd-factor", type=float, default=WD_FACTOR)
    p.add_argument("--same-data", action="store_true",
                   help="every worker trains on the same batches (then DC-S3GD equals one process)")
    p.add_argument("--no-shuffle", action="store_true")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--train-size", type=int, default=8000)
    p.add_argument("--test-size", type=int, default=2000)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--time-from", type=int, default=5,
                   help="steps before the timed window (step_time_s), default 5")
    p.add_argument("--sim-compute-s", type=float, default=0.0,
                   help="add this many seconds of simulated device time per step, in MXNet's "
                        "engine between the forward pass and the loss (a slow accelerator; it "
                        "takes no CPU), for overlap tests on a busy machine")
    p.add_argument("--out", default=None, help="JSON result ({rank} is replaced)")
    p.add_argument("--save-params", default=None, help="final weights ({rank} is replaced)")
    args = p.parse_args(argv)
    if args.config:
        apply_config(p, args, argv)
    return args


def apply_config(parser, args, argv) -> None:
    """Recipe values become defaults; options on the command line still win."""
    with open(args.config) as f:
        recipe = yaml.safe_load(f) or {}
    known = {a.dest for a in parser._actions}
    unknown = sorted(k for k in recipe if k.replace("-", "_") not in known and k not in IGNORED_KEYS)
    if unknown:
        raise SystemExit(f"{args.config}: unknown key {unknown[0]!r}")
    given = {a.dest for a in parser._actions
             for s in (argv if argv is not None else sys.argv[1:]) if s.split("=")[0] in a.option_strings}
    for key, value in recipe.items():
        dest = key.replace("-", "_")
        if dest in known and dest not in given:
            setattr(args, dest, value)


#: recipe keys that describe the run (node count, the paper's figures) rather than set options
IGNORED_KEYS = {"num_workers", "batch_size_global", "paper", "launch"}


def check_imagenet(data_dir: str | None) -> None:
    """No download is possible: name exactly what is missing."""
    where = os.path.expanduser(data_dir or "~/.mxnet/datasets/imagenet")
    missing = [os.path.join(where, f) for f in IMAGENET_FILES if not os.path.exists(os.path.join(where, f))]
    if missing:
        raise SystemExit(f"ImageNet record files not found: {', '.join(missing)}. Make them with "
                         f"MXNet's tools/im2rec.py (or GluonCV's imagenet prepare script) and pass "
                         f"--data-dir; nothing is downloaded.")
    raise SystemExit(f"ImageNet record files found in {where}, but this script trains the MNIST "
                     f"recipes only; train the ImageNet recipes with scripts/train_gluoncv.py and "
                     f"the same configs/recipes/dcs3gd_*.yaml values")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dataset == "imagenet":
        check_imagenet(args.data_dir)
    if args.dataset != "mnist":
        raise SystemExit(f"unknown dataset {args.dataset!r} (mnist or imagenet)")
    mx.random.seed(args.seed)
    np.random.seed(args.seed)
    params = {"lambda0": args.lambda0} \
        if args.lambda0 is not None and args.kvstore == "dist_dcs3gd" else {}
    kv, rank, num_workers = gluon_trainers.make_kvstore(args.kvstore, **params)
    x_train, y_train, x_test, y_test = load_mnist(args.data, args.train_size, args.test_size)
    if not args.same_data:
        x_train, y_train = shard(x_train, y_train, rank, num_workers)
    net = lenet() if args.model == "lenet" else dense_net(args.hidden)
    net.initialize(mx.init.Xavier(magnitude=2.24))
    net(mx.nd.zeros((1, 1, 28, 28)))
    net.hybridize(static_alloc=True, static_shape=True)

    steps_per_epoch = len(x_train) // args.batch_size
    total_steps = int(round(args.epochs * steps_per_epoch))
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)
    optimizer = mx.optimizer.SGD(learning_rate=args.lr, momentum=args.momentum, wd=args.wd)
    schedule = None
    if args.schedule == "paper":
        no_weight_decay_on_bn_and_bias(net)
        schedule = WarmupLinearDecay.from_epochs(
            args.lr, num_workers, steps_per_epoch, args.epochs, args.warmup_epochs,
            ramp_epochs=args.ramp_epochs, wd=args.wd, wd_factor=args.wd_factor)
        schedule.max_update = max(total_steps, schedule.warmup_updates + 1)
        schedule.attach(optimizer)
    trainer = gluon.Trainer(net.collect_params(), optimizer, kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    device = SimulatedLink() if args.sim_compute_s > 0 else None
    rng = np.random.RandomState(args.seed + (0 if args.same_data else rank))

    step, losses, t_start, t_timed = 0, [], time.perf_counter(), None
    while step < total_steps:
        order = np.arange(len(x_train)) if args.no_shuffle else rng.permutation(len(x_train))
        for b in range(steps_per_epoch):
            if step >= total_steps:
                break
            if step == args.time_from:
                mx.nd.waitall()
                t_timed = time.perf_counter()
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]
            data, label = mx.nd.array(x_train[idx]), mx.nd.array(y_train[idx])
            with autograd.record():
                out = net(data)
                if device is not None:   # the loss, the backward pass and the update wait
                    device.hold(out, args.sim_compute_s)
                loss = loss_fn(out, label)
            loss.backward()
            trainer.step(args.batch_size)
            step += 1
            if step % 50 == 0 or step == total_steps:
                losses.append(float(loss.mean().asscalar()))
    mx.nd.waitall()
    t_end = time.perf_counter()
    timed = step - args.time_from
    step_time = (t_end - t_timed) / timed if t_timed is not None and timed > 0 else None
    if kv is not None:
        kv.sync_weights()           # DC-S3GD: every worker moves to the average weights
    accuracy = evaluate(net, x_test, y_test)
    result = {"rank": rank, "num_workers": num_workers, "kvstore": args.kvstore, "steps": step,
              "test_accuracy": accuracy, "step_time_s": step_time,
              "wall_time_s": t_end - t_start, "final_loss": losses[-1] if losses else None,
              "lr_last": optimizer.learning_rate, "wd_last": optimizer.wd}
    finish_run(result, kv, args.out, args.save_params, net)
    print(f"worker {rank}: {args.kvstore} test accuracy {accuracy:.4f}, "
          f"{(step_time or 0) * 1e3:.1f} ms/step, {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
