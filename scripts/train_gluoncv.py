#!/usr/bin/env python3
"""Train a GluonCV model zoo network on CIFAR-10/100, ImageNet, MNIST or synthetic images with any kvstore.

    python scripts/train_gluoncv.py --dataset synthetic --model cifar_resnet20_v1 --epochs 2
    python scripts/launch.py -n 4 -s 1 python scripts/train_gluoncv.py --kvstore dist_dssp \\
        --dataset cifar100 --model cifar_resnet110_v1 --lr 0.05 --lr-decay-epoch 200,250 \\
        --epochs 300 --save-dir ckpt --log-dir logs --out results/worker-{rank}.json
    python scripts/launch.py -n 2 --launcher horovod python scripts/train_gluoncv.py \\
        --kvstore dist_dcs3gd --dataset imagenet --model resnet50_v1 --lr-mode warmup-linear ...

The papers' runs (configs/dssp_cifar*.yaml, psp_*.yaml, dcs3gd_imagenet_*.yaml) go through
scripts/reproduce.py. Each worker trains on its share of the training set (by kv.rank), tests
the whole test set after every epoch, prints one line per epoch, appends it to a CSV log and
writes its result as JSON (worker 0's accuracy per epoch is what reproduce.py plots). With
--save-dir it checkpoints every epoch; --resume continues from the last checkpoint exactly as
if the run had not stopped (batch order and augmentation depend only on seed, epoch and rank).

The learning-rate schedule lives in the optimizer, so it runs where the optimizer runs: on the
servers under a parameter-server store. It counts optimizer updates, and an epoch is
(iterations per epoch) updates, times the number of workers for the stores whose servers apply
each worker's push on its own (dist_asp, dist_ssp, dist_dssp, MXNet's dist_async).
"""
from __future__ import annotations

import argparse
import csv
import difflib
import glob
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402
from tqdm import tqdm  # noqa: E402

import gluon_trainers  # noqa: E402
import kvstore_ext  # noqa: E402,F401  (registers the kvstore_ext stores)
from gluon_trainers import imagedata  # noqa: E402
from gluon_trainers.imagedata import DataError  # noqa: E402
from gluon_trainers.models import MODELS  # noqa: E402
from gluon_trainers.evaluation import finish_run  # noqa: E402
from gluon_trainers.schedules import (  # noqa: E402
    WD_FACTOR,
    WarmupLinearDecay,
    no_weight_decay_on_bn_and_bias,
)
from gluon_trainers import straggler as emulation  # noqa: E402
from kvstore_ext.registry import STORE_TYPES, is_horovod  # noqa: E402

DATASETS = ("cifar10", "cifar100", "imagenet", "mnist", "synthetic")
DEFAULT_CLASSES = {"cifar10": 10, "cifar100": 100, "imagenet": 1000, "mnist": 10, "synthetic": 10}
#: stores whose servers apply every worker's push on its own: one optimizer update per worker
#: iteration, so an epoch of the job is num_workers times as many updates as under BSP
PER_PUSH_STORES = {"dist_asp", "dist_ssp", "dist_dssp", "dist_async", "dist_async_device"}
#: a checkpoint must come from a run with the same values of these options
RESUME_MUST_MATCH = ("model", "dataset", "classes", "batch_size", "seed", "train_size",
                     "image_size", "num_workers")
CSV_FIELDS = ("epoch", "iteration", "train_loss", "test_accuracy", "samples_per_s", "time_s",
              "wall_time")


class UsageError(Exception):
    """A bad option value; the message names it."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    g = p.add_argument_group("model and data")
    g.add_argument("--model", default="cifar_resnet20_v1",
                   help="a GluonCV model zoo name (cifar_resnet20_v1, cifar_resnet56_v1, "
                        "cifar_resnet110_v1, resnet50_v1, resnet101_v1, resnet152_v1, vgg16, ...; "
                        "see gluoncv.model_zoo.get_model_list()) or one of this project's: "
                        f"{', '.join(sorted(MODELS))} (alexnet_small: the DSSP paper's downsized "
                        "AlexNet; cifar_resnet50_v1: its ResNet-50 for CIFAR) (default "
                        "cifar_resnet20_v1)")
    g.add_argument("--dataset", choices=DATASETS, default="cifar10",
                   help="cifar10 / cifar100: Gluon's binary files in --data-dir; imagenet: record "
                        "files; mnist: the project's .npz (1x28x28); synthetic: generated images "
                        "of --image-size, deterministic by --seed (default cifar10)")
    g.add_argument("--data-dir", default=None,
                   help="CIFAR: the folder of the binary files (or of the official archive's "
                        "cifar-10-batches-bin / cifar-100-binary folder); ImageNet: the folder of "
                        "train.rec, train.idx, val.rec, val.idx (default $MXNET_HOME/datasets/"
                        "<dataset>, i.e. ~/.mxnet/datasets/<dataset>)")
    g.add_argument("--download", action="store_true",
                   help="CIFAR: let Gluon download the files it does not find (needs internet); "
                        "without it, missing files are an error that names them")
    g.add_argument("--data", default=None,
                   help="mnist: the .npz file (default $KVX_MNIST, else data/mnist10k.npz)")
    for name, default in (("train", "train.rec"), ("train-idx", "train.idx"),
                          ("val", "val.rec"), ("val-idx", "val.idx")):
        g.add_argument(f"--rec-{name}", default=None,
                       help=f"imagenet: the {default} file (default: in --data-dir)")
    g.add_argument("--classes", type=int, default=None,
                   help="output classes (default: 10 for cifar10, mnist and synthetic, 100 for "
                        "cifar100, 1000 for imagenet)")
    g.add_argument("--image-size", type=int, default=None,
                   help="synthetic: image side (default 32); imagenet: training crop and test "
                        "centre crop (default 224); CIFAR and MNIST have fixed sizes")
    g.add_argument("--train-size", type=int, default=None,
                   help="use only the first N training images (default: all; mnist 8000, "
                        "synthetic 2048)")
    g.add_argument("--test-size", type=int, default=None,
                   help="use only the first N test images (default: all; mnist 2000, "
                        "synthetic 512)")
    g.add_argument("--data-threads", type=int, default=2,
                   help="imagenet: decoding threads of each record iterator (default 2)")

    g = p.add_argument_group("distributed training")
    g.add_argument("--kvstore", default="device",
                   help="device or local when run alone (default device); under scripts/launch.py "
                        "dist_bsp, dist_asp, dist_ssp, dist_dssp, dist_psp (kvstore_ext), dist_dcs3gd or "
                        "dist_ssgd (--launcher horovod), or MXNet's dist_sync / dist_async "
                        "(--backend mxnet); store parameters come from launch.py --kv-param")
    g.add_argument("--trainer", choices=["gluon", "batched"], default="gluon",
                   help="gluon: stock gluon.Trainer (one pushpull per parameter); batched: "
                        "gluon_trainers.Trainer (one call per step) (default gluon)")

    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int, default=3, help="passes over each worker's share (default 3)")
    g.add_argument("--num-iterations", type=int, default=0,
                   help="stop after this many iterations in all, whatever the epoch (smoke tests; "
                        "default 0: no limit)")
    g.add_argument("--batch-size", type=int, default=128, help="per-worker batch size (default 128)")
    g.add_argument("--lr", type=float, default=0.1,
                   help="learning rate (default 0.1); with --lr-mode warmup-linear the single-node "
                        "rate: the schedule peaks at num_workers x lr (the DC-S3GD recipe)")
    g.add_argument("--lr-mode", choices=["step", "warmup-linear"], default="step",
                   help="step: lr x --lr-decay at each of --lr-decay-epoch, after an optional "
                        "linear warm-up of --warmup-epochs (GluonCV's names); warmup-linear: the "
                        "DC-S3GD paper's linear warm-up to num_workers x lr and linear decay to 0 "
                        "at the last iteration, weight decay on the same curve x --wd-factor "
                        "(default step)")
    g.add_argument("--lr-decay", type=float, default=0.1,
                   help="step: factor applied at each decay epoch (default 0.1)")
    g.add_argument("--lr-decay-epoch", default="",
                   help="step: comma-separated epochs at which lr is multiplied by --lr-decay, "
                        "e.g. 200,250 (default: none, a constant rate)")
    g.add_argument("--warmup-epochs", type=float, default=0.0,
                   help="epochs of linear warm-up from 0 (default 0)")
    g.add_argument("--ramp-epochs", type=float, default=None,
                   help="warmup-linear: the warm-up's planned length; it stops early at "
                        "--warmup-epochs, at the rate reached (DC-S3GD: 45 planned, stopped at 15) "
                        "(default: --warmup-epochs)")
    g.add_argument("--wd-factor", type=float, default=WD_FACTOR,
                   help=f"warmup-linear: weight decay factor k (default {WD_FACTOR})")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    g.add_argument("--wd", type=float, default=1e-4, help="weight decay (default 1e-4)")
    g.add_argument("--no-wd-bn-bias", action="store_true",
                   help="no weight decay on batch-norm parameters and biases")
    g.add_argument("--seed", type=int, default=42,
                   help="seed of the weights, the synthetic data, and each epoch's batch order and "
                        "augmentation (with the epoch and the rank) (default 42)")

    g = p.add_argument_group("logs, results and checkpoints")
    g.add_argument("--out", default=None,
                   help="write this worker's result as JSON here at the end ({rank} is replaced "
                        "by the rank): per-epoch curve, final accuracy, iterations, store metrics")
    g.add_argument("--log-dir", default=None,
                   help="after every epoch, append the epoch's line to <dir>/rank<r>.csv and "
                        "rewrite the result so far in <dir>/rank<r>.json (default: the CSV next "
                        "to --out, if given)")
    g.add_argument("--log-interval", type=int, default=20,
                   help="read the loss (a synchronisation) and update the progress bar every this "
                        "many iterations; these losses form the result's loss_curve (default 20)")
    g.add_argument("--stats-interval", type=int, default=100,
                   help="ask a kvstore_ext store for its metrics (a network call) every this many "
                        "iterations, to show lead and wait share in the progress bar; 0: never "
                        "(default 100)")
    g.add_argument("--save-dir", default=None,
                   help="checkpoint every epoch here: rank<r>-epoch<E>.params (weights), .states "
                        "(optimizer, with its schedule) and .json (epoch, iteration, logs)")
    g.add_argument("--keep-checkpoints", type=int, default=2,
                   help="keep this many most recent checkpoints of each rank (0: all; default 2)")
    g.add_argument("--resume", default=None, metavar="PATH_OR_DIR",
                   help="continue from a checkpoint: its .json (or .params) file, or a --save-dir "
                        "folder (its last checkpoint of this rank); {rank} is replaced")
    g.add_argument("--save-params", default=None,
                   help="save the final weights here ({rank} is replaced by the rank)")
    return p.parse_args(argv)


# -- setting up --------------------------------------------------------------------------------
def open_dataset(args):
    """The data set named by the options, whole (sharded once the rank is known)."""
    if args.image_size is not None and args.dataset not in ("synthetic", "imagenet"):
        raise UsageError(f"--image-size applies to synthetic and imagenet, not {args.dataset}")
    if args.dataset in imagedata.CIFAR:
        data = imagedata.load_cifar(args.dataset, args.data_dir, args.download)
    elif args.dataset == "imagenet":
        paths = imagedata.imagenet_paths(args.data_dir, args.rec_train, args.rec_train_idx,
                                         args.rec_val, args.rec_val_idx)
        data = imagedata.RecordImages(paths, args.image_size or 224, args.classes or 1000,
                                      args.data_threads)
    elif args.dataset == "mnist":
        data = imagedata.load_mnist_images(args.data, args.train_size, args.test_size)
    else:
        data = imagedata.synthetic(args.train_size or 2048, args.test_size or 512,
                                   args.image_size or 32, args.classes or 10, args.seed)
    return data.subset(args.train_size, args.test_size)


def build_model(name: str, classes: int):
    """A project model by name, else GluonCV's ``get_model(name, classes=...)``."""
    if name in MODELS:
        return MODELS[name](classes=classes)
    from gluoncv.model_zoo import get_model, get_model_list
    known = list(get_model_list())
    if name.lower() not in known:
        close = difflib.get_close_matches(name.lower(), known + list(MODELS), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UsageError(f"unknown model {name!r}{hint}: give a GluonCV model zoo name (see "
                         f"gluoncv.model_zoo.get_model_list(), e.g. cifar_resnet56_v1, "
                         f"resnet50_v1, vgg16) or one of {', '.join(sorted(MODELS))}")
    return get_model(name, classes=classes)


def updates_per_iteration(kvstore: str, num_workers: int) -> int:
    """Optimizer updates that one worker iteration stands for, wherever the optimizer runs."""
    return num_workers if kvstore in PER_PUSH_STORES else 1


def parse_epochs(text: str) -> list[float]:
    try:
        epochs = [float(e) for e in text.split(",") if e.strip()]
    except ValueError:
        raise UsageError(f"--lr-decay-epoch must be comma-separated epochs, got {text!r}") from None
    if any(e <= 0 for e in epochs) or epochs != sorted(set(epochs)):
        raise UsageError(f"--lr-decay-epoch must be increasing positive epochs, got {text!r}")
    return epochs


def make_optimizer(args, updates_per_epoch: int, num_workers: int, begin_update: int):
    """Momentum SGD with the schedule in it, so that it runs wherever the optimizer runs
    (the servers, under update-on-kvstore), counted in optimizer updates."""
    optimizer = mx.optimizer.SGD(learning_rate=args.lr, momentum=args.momentum, wd=args.wd,
                                 begin_num_update=begin_update)
    if args.lr_mode == "warmup-linear":
        try:
            schedule = WarmupLinearDecay.from_epochs(
                args.lr, num_workers, updates_per_epoch, args.epochs, args.warmup_epochs,
                ramp_epochs=args.ramp_epochs, wd=args.wd, wd_factor=args.wd_factor)
        except ValueError as exc:
            raise UsageError(f"--lr-mode warmup-linear: {exc}") from None
        optimizer.set_learning_rate(schedule.base_lr)
        schedule.attach(optimizer)
        return optimizer
    decay_at = [round(e * updates_per_epoch) for e in parse_epochs(args.lr_decay_epoch)]
    warmup = round(args.warmup_epochs * updates_per_epoch)
    if decay_at and decay_at[0] <= warmup:
        raise UsageError(f"--lr-decay-epoch {args.lr_decay_epoch}: the first decay must come after "
                         f"the --warmup-epochs {args.warmup_epochs:g}")
    common = {"base_lr": args.lr, "warmup_steps": warmup, "warmup_begin_lr": 0.0,
              "warmup_mode": "linear"}
    if decay_at:
        optimizer.lr_scheduler = mx.lr_scheduler.MultiFactorScheduler(
            step=decay_at, factor=args.lr_decay, **common)
    elif warmup:   # a warm-up, then a constant rate
        optimizer.lr_scheduler = mx.lr_scheduler.FactorScheduler(step=2**31 - 1, factor=1.0,
                                                                 **common)
    return optimizer


# -- checkpoints ---------------------------------------------------------------------------------
def set_update_count(optimizer, updates: int) -> None:
    """Make the worker's copy of a server-side optimizer count ``updates`` (its own count stays
    at 0: the servers do the updates), so that the copy saved with the states, and sent back to
    the servers on resume, continues the schedule where it was."""
    optimizer.begin_num_update = optimizer.num_update = updates
    optimizer._index_update_count.clear()   # keys count on from begin_num_update


def checkpoint_stem(save_dir: str, rank: int, epoch: int) -> str:
    return os.path.join(save_dir, f"rank{rank}-epoch{epoch:04d}")


def find_checkpoint(path: str, rank: int) -> str:
    """The checkpoint JSON that ``--resume`` names (a folder: this rank's latest one)."""
    path = os.path.expanduser(path.replace("{rank}", str(rank)))
    if os.path.isdir(path):
        found = glob.glob(os.path.join(path, f"rank{rank}-epoch*.json"))
        if not found:
            raise UsageError(f"--resume {path}: no checkpoint of rank {rank} there "
                             f"(rank{rank}-epoch*.json)")
        return max(found, key=lambda f: int(re.search(r"epoch(\d+)\.json$", f).group(1)))
    stem, ext = os.path.splitext(path)
    if ext in (".params", ".states"):
        path = stem + ".json"
    if not os.path.isfile(path):
        raise UsageError(f"--resume: no checkpoint file {path}")
    return path


def load_checkpoint(path: str, fingerprint: dict) -> dict:
    with open(path) as f:
        ckpt = json.load(f)
    for key in RESUME_MUST_MATCH:
        if ckpt["fingerprint"].get(key) != fingerprint[key]:
            raise UsageError(f"--resume {path}: the checkpoint has {key}="
                             f"{ckpt['fingerprint'].get(key)!r}, this run {fingerprint[key]!r}")
    folder = os.path.dirname(os.path.abspath(path))
    for name in ("params", "states"):
        if ckpt.get(name):
            ckpt[name] = os.path.join(folder, ckpt[name])
    return ckpt


def save_checkpoint(save_dir, rank, epoch, net, trainer, state: dict, keep: int,
                    states_saveable: bool) -> None:
    """Weights, optimizer states and the JSON; the JSON last, so that it names complete files."""
    os.makedirs(save_dir, exist_ok=True)
    stem = checkpoint_stem(save_dir, rank, epoch)
    net.save_parameters(stem + ".params")
    if states_saveable:
        trainer.save_states(stem + ".states")
    state = dict(state, params=os.path.basename(stem + ".params"),
                 states=os.path.basename(stem + ".states") if states_saveable else None)
    with open(stem + ".json.tmp", "w") as f:
        json.dump(state, f)
    os.replace(stem + ".json.tmp", stem + ".json")
    if keep > 0:
        for old in glob.glob(os.path.join(save_dir, f"rank{rank}-epoch*.json")):
            old_epoch = int(re.search(r"epoch(\d+)\.json$", old).group(1))
            if old_epoch <= epoch - keep:
                for ext in (".json", ".params", ".states"):
                    old_file = checkpoint_stem(save_dir, rank, old_epoch) + ext
                    if os.path.exists(old_file):
                        os.remove(old_file)


# -- logs ----------------------------------------------------------------------------------------
def log_paths(args, rank: int):
    """(CSV, JSON) paths of the per-epoch log; either may be None."""
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
        base = os.path.join(args.log_dir, f"rank{rank}")
        return base + ".csv", base + ".json"
    if args.out:
        return os.path.splitext(args.out.replace("{rank}", str(rank)))[0] + ".csv", None
    return None, None


def write_csv(path: str, rows: list[dict], append: bool) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a" if append else "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        if not append:
            writer.writeheader()
        writer.writerows(rows)


def store_progress(stats: dict, rank: int, previous: dict) -> dict:
    """Wait share and this worker's mean lead at OK since the last query, from ``kv.stats()``."""
    shown = {}
    worker = stats.get("worker", {})
    if "wait_share" in worker:
        shown["wait"] = f"{worker['wait_share']:.0%}"
    counts: dict[int, int] = {}
    for server in stats.get("servers", []):
        for lead, n in server.get("lead_at_ok", {}).get(str(rank), {}).items():
            counts[int(lead)] = counts.get(int(lead), 0) + n
    new = {lead: n - previous.get(lead, 0) for lead, n in counts.items()}
    total = sum(new.values())
    if total > 0:
        shown["lead"] = f"{sum(lead * n for lead, n in new.items()) / total:.1f}"
    previous.clear()
    previous.update(counts)
    return shown


# -- training --------------------------------------------------------------------------------------
def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return train(args)
    except (UsageError, DataError) as exc:
        print(f"train_gluoncv.py: {exc}", file=sys.stderr, flush=True)
        return 2


def train(args) -> int:
    for name in ("epochs", "batch_size", "log_interval"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    classes = args.classes or DEFAULT_CLASSES[args.dataset]
    net = build_model(args.model, classes)          # both before joining the job: fail fast
    data = open_dataset(args)
    kv, rank, num_workers = gluon_trainers.make_kvstore(args.kvstore)
    data.shard(rank, num_workers)
    steps_per_epoch = data.steps_per_epoch(args.batch_size)
    if steps_per_epoch < 1:
        raise UsageError(f"worker {rank} has {data.num_train // num_workers} training images, "
                         f"fewer than --batch-size {args.batch_size}")
    fingerprint = {"model": args.model, "dataset": args.dataset, "classes": classes,
                   "batch_size": args.batch_size, "seed": args.seed,
                   "train_size": args.train_size, "image_size": args.image_size,
                   "num_workers": num_workers}
    ckpt = load_checkpoint(find_checkpoint(args.resume, rank), fingerprint) if args.resume else None

    mx.random.seed(args.seed)
    net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2))
    net(mx.nd.zeros((1, *data.input_shape)))
    if ckpt:
        net.load_parameters(ckpt["params"])
    if args.no_wd_bn_bias:
        no_weight_decay_on_bn_and_bias(net)
    net.hybridize(static_alloc=True, static_shape=True)

    per_iteration = updates_per_iteration(args.kvstore, num_workers)
    step = ckpt["iteration"] if ckpt else 0
    optimizer = make_optimizer(args, steps_per_epoch * per_iteration, num_workers, step * per_iteration)
    trainer_cls = gluon_trainers.Trainer if args.trainer == "batched" else gluon.Trainer
    trainer = trainer_cls(net.collect_params(), optimizer, kvstore=kv or args.kvstore)
    # the servers' optimizer states can be saved from our stores and Horovod's, not MXNet's dist_*
    states_saveable = kv is None or kv.type in STORE_TYPES
    if args.save_dir and not states_saveable and rank == 0:
        print(f"train_gluoncv.py: MXNet's {kv.type} cannot hand out its servers' optimizer states: "
              f"checkpoints hold the weights and the schedule's position, not the momentum",
              file=sys.stderr, flush=True)
    optimizer_on_servers = kv is not None and not is_horovod(kv.type)
    if ckpt and ckpt["states"]:
        trainer.load_states(ckpt["states"])
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    straggler = emulation.from_env(rank, num_workers, args.batch_size)

    total_steps = args.epochs * steps_per_epoch
    if args.num_iterations:
        total_steps = min(total_steps, args.num_iterations)
    curve = ckpt["curve"] if ckpt else []
    loss_curve = ckpt["loss_curve"] if ckpt else []
    train_time = ckpt["train_time_s"] if ckpt else 0.0
    start_epoch = ckpt["epoch"] if ckpt else 0
    csv_path, json_log = log_paths(args, rank)
    if csv_path:   # a resumed log restarts from the checkpoint: no epoch twice
        write_csv(csv_path, curve, append=False)

    def result_so_far() -> dict:
        final = curve[-1]["test_accuracy"] if curve else None
        return {"rank": rank, "num_workers": num_workers, "kvstore": args.kvstore,
                "model": args.model, "dataset": args.dataset, "trainer": args.trainer,
                "batch_size": args.batch_size, "steps": step, "iterations": step,
                "epochs": step / steps_per_epoch, "test_accuracy": final, "final_accuracy": final,
                "samples_per_s": step * args.batch_size / train_time if train_time else 0.0,
                "wall_time_s": train_time, "final_loss": loss_curve[-1][1] if loss_curve else None,
                "accuracy_curve": curve, "loss_curve": loss_curve,
                "straggler": straggler.to_dict(), "resumed_from": ckpt and args.resume,
                "train_start_wall": t_wall_start}

    bar = tqdm(total=total_steps, initial=step, desc=f"worker {rank} {args.model} {args.kvstore}",
               disable=None, leave=False, unit="it")
    shown: dict = {}
    lead_counts: dict = {}
    stats_every = args.stats_interval if kv is not None and hasattr(kv, "stats") else 0
    gluon_trainers.start_together(kv)
    t_wall_start = time.time() - train_time
    epoch = start_epoch
    while step < total_steps:
        mx.random.seed(int(imagedata.epoch_rng(args.seed, epoch, rank).randint(2**31)))  # dropout
        t_epoch, first_step, loss_sum = time.perf_counter(), step, mx.nd.zeros(1)
        for data_batch, label in data.train_batches(epoch, args.batch_size, args.seed, rank):
            if step >= total_steps:
                break
            if straggler.active:
                straggler.begin()
            with autograd.record():
                loss = loss_fn(net(data_batch), label)
            loss.backward()
            if straggler.active:
                straggler.end()
            trainer.step(args.batch_size)
            loss_sum += loss.mean()
            step += 1
            if step % args.log_interval == 0 or step == total_steps:
                loss_curve.append([step, float(loss.mean().asscalar())])
                rate = (step - first_step) * args.batch_size / (time.perf_counter() - t_epoch)
                shown.update(ep=epoch + 1, loss=f"{loss_curve[-1][1]:.3f}", sps=f"{rate:.0f}")
            if stats_every and step % stats_every == 0:
                shown.update(store_progress(kv.stats(), rank, lead_counts))
            if step % args.log_interval == 0 or (stats_every and step % stats_every == 0):
                bar.set_postfix(shown, refresh=False)
            bar.update(1)
        mx.nd.waitall()
        seconds = time.perf_counter() - t_epoch
        train_time += seconds
        steps_done = step - first_step
        finished = step >= total_steps
        if finished and hasattr(kv, "sync_weights"):
            kv.sync_weights()    # DC-S3GD: every worker moves to the average weights
        point = {"epoch": round(epoch + steps_done / steps_per_epoch, 6), "iteration": step,
                 "step": step, "time_s": train_time, "wall_time": time.time(),
                 "train_loss": float(loss_sum.asscalar()) / max(steps_done, 1),
                 "test_accuracy": data.test_accuracy(net, args.batch_size),
                 "samples_per_s": steps_done * args.batch_size / max(seconds, 1e-9)}
        curve.append(point)
        tqdm.write(f"worker {rank} epoch {point['epoch']:g}/{args.epochs}: train loss "
                   f"{point['train_loss']:.4f}, test accuracy {point['test_accuracy']:.4f}, "
                   f"{point['samples_per_s']:.1f} samples/s, {train_time:.1f} s elapsed")
        if csv_path:
            write_csv(csv_path, [point], append=True)
        if json_log:
            with open(json_log, "w") as f:
                json.dump(result_so_far(), f, indent=1)
        epoch_complete = steps_done == steps_per_epoch
        if epoch_complete and args.save_dir:
            if optimizer_on_servers:   # the pickled copy tells the servers where the schedule is
                set_update_count(trainer.optimizer, step * per_iteration)
            save_checkpoint(args.save_dir, rank, epoch + 1, net, trainer,
                            {"epoch": epoch + 1, "iteration": step, "train_time_s": train_time,
                             "curve": curve, "loss_curve": loss_curve, "fingerprint": fingerprint,
                             "args": vars(args)},
                            args.keep_checkpoints, states_saveable)
        epoch += 1
    bar.close()
    straggler.write_log()
    result = finish_run(result_so_far(), kv, args.out, args.save_params, net)
    final = result["test_accuracy"]
    print(f"worker {rank}: {args.model} on {args.dataset} with {args.kvstore}: test accuracy "
          f"{final if final is None else f'{final:.4f}'}, {result['samples_per_s']:.1f} samples/s, "
          f"{step} iterations", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
