"""The worker of the planner's real jobs (``calibrate``'s runtime costs, ``validate``'s grid).

Each iteration is what stock ``gluon.Trainer`` does with a distributed store: the host
computes the gradients (a real forward and backward pass on MNIST for ``lenet``; none for a
model given by its shapes only), an emulated device makes the iteration last its device time
(``launch.py --device``), then one ``pushpull`` per trainable array.  The worker times the
iterations after a warm-up, and its CPU seconds; worker 0 also reads every server's CPU
seconds and messages before and after, through the store's ``stats()``.

    python -m kvstore_ext.launch -n 2 -s 1 --device 100ms python -m kvstore_ext.plan.jobs \
        --kvstore dist_bsp --model lenet --compute --rounds 30 --result /tmp/r-{rank}.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

from ..metrics import RUSAGE_COUNTS

#: the variables that set how MXNet computes on a CPU, reported beside a compute measurement
ENV_SHOWN = ("OMP_NUM_THREADS", "MXNET_MKLDNN_ENABLED", "MXNET_ENGINE_TYPE")
#: a layer's calls in a row last at least this long in each pass of ``--layer-times``: LeNet's
#: pooling layers take ~0.1 ms, and six calls of them (the fixed count before) made lines with
#: R^2 0.91-0.95 where a whole network's fit 0.99
LAYER_SECONDS_PER_PASS = 0.03

#: what a job reports of each server: the change of these over its timed rounds
SERVER_COUNTS = ("cpu_s", "optimizer_cpu_s", "messages", "updates", *RUSAGE_COUNTS)


def model_shapes(model: str) -> list[tuple[int, ...]]:
    """The trainable arrays' shapes of a Gluon model, in push order, or of ``KxN``: K arrays
    of N elements (the synthetic sets that vary keys and bytes apart in calibration)."""
    match = re.fullmatch(r"(\d+)x(\d+)", model)
    if match:       # K arrays of N elements
        return [(int(match.group(2)),)] * int(match.group(1))
    net, x = build(model)
    net.initialize()
    net(x)
    return [p.shape for p in net.collect_params().values() if p.grad_req != "null"]


def build(model: str):
    """``(net, one input)`` for a model of gluon_trainers.models or GluonCV's zoo."""
    import mxnet as mx
    from gluon_trainers.models import MODELS
    if model in MODELS:
        return MODELS[model](), mx.nd.zeros((1, 1, 28, 28))
    from gluoncv.model_zoo import get_model
    return get_model(model, classes=10), mx.nd.zeros((1, 3, 32, 32))


def layers_of(net) -> list:
    """The layers a network runs in order: a GluonCV CIFAR network's ``features`` then
    ``output``, a Sequential's children, else the network whole."""
    if hasattr(net, "features") and hasattr(net, "output"):
        return list(net.features._children.values()) + [net.output]
    children = list(getattr(net, "_children", {}).values())
    return children or [net]


def training_step(model: str, batch_size: int):
    """``(net, x, step)``: the model built and initialised, a batch of random inputs, and one
    forward + backward pass over it with a softmax loss, waited for (what calibrate times)."""
    import mxnet as mx
    import numpy as np
    from mxnet import autograd, gluon
    net, x1 = build(model)
    net.initialize(mx.init.Xavier())
    net(x1)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x = mx.nd.random.uniform(shape=(batch_size,) + x1.shape[1:])
    y = mx.nd.array(np.random.randint(0, 10, batch_size))

    def step():
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        mx.nd.waitall()
    return net, x, step


def layer_times(args) -> int:
    """Forward + backward seconds of the whole network and of each layer at one batch size,
    in this process alone (``calibrate``'s compute: a process that has run other batch sizes
    runs LeNet's batch of 128 15-25% slower than one that runs only 128, as a job does)."""
    import mxnet as mx
    from mxnet import autograd
    from .timing import timed
    b = args.batch_size
    net, x, whole = training_step(args.model, b)
    steps, names, activations, h = {"whole": whole}, [], 0.0, x
    for i, layer in enumerate(layers_of(net)):
        inp = h.copy()
        inp.attach_grad()

        def one(layer=layer, inp=inp):
            with autograd.record():
                out = layer(inp)
            out.backward(mx.nd.ones_like(out))
            mx.nd.waitall()
        steps[i] = one
        names.append(f"{i}:{type(layer).__name__}")
        h = layer(h)
        activations += h.size / b
    seconds = timed(steps, passes=args.rounds, reps=3, warmup=args.warmup,
                    min_seconds=LAYER_SECONDS_PER_PASS)
    with open(args.result, "w") as f:
        json.dump({"model": args.model, "batch_size": b, "whole": seconds.pop("whole"),
                   "layers": [seconds[i] for i in range(len(names))], "names": names,
                   "activation_elements_per_sample": activations,
                   # as this process saw them: what the timing ran under, not what was asked
                   "environment": {k: os.environ[k] for k in ENV_SHOWN if k in os.environ}}, f)
    return 0


def run_layer_times(model: str, batch_size: int, passes: int, env=None,
                    timeout: float = 900) -> dict:
    """:func:`layer_times` in a new process with environment ``env`` (this one's if None)."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory(prefix="kvx-plan-") as tmp:
        result = os.path.join(tmp, "layers.json")
        argv = [sys.executable, "-m", "kvstore_ext.plan.jobs", "--layer-times", "--model", model,
                "--batch-size", str(batch_size), "--rounds", str(passes), "--warmup", "2",
                "--result", result]
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"timing {model} at batch {batch_size} failed "
                               f"({proc.returncode}):\n{proc.stdout[-3000:]}")
        with open(result) as f:
            return json.load(f)


def worker(args) -> int:
    import mxnet as mx
    import numpy as np
    from mxnet import autograd, gluon
    import kvstore_ext  # noqa: F401
    from gluon_trainers import straggler as emulation

    kv = mx.kv.create(args.kvstore)
    rank, n = kv.rank, kv.num_workers
    rng = np.random.RandomState(rank)
    mx.random.seed(rank)
    if args.compute:
        from gluon_trainers.data import load_mnist, shard
        net, x = build(args.model)
        net.initialize(mx.init.Xavier())
        net(x)
        params = [p for p in net.collect_params().values() if p.grad_req != "null"]
        weights, grads = [p.data() for p in params], [p.grad() for p in params]
        xs, ys, _, _ = load_mnist(None, 4000, 10)
        xs, ys = shard(xs, ys, rank, n)
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    else:
        shapes = model_shapes(args.model)
        weights = [mx.nd.array(rng.uniform(-0.1, 0.1, s)) for s in shapes]
        grads = [mx.nd.array(rng.uniform(-1, 1, s)) for s in shapes]
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.01, momentum=0.9, wd=1e-4,
                                      rescale_grad=1.0 / args.batch_size))
    for k, w in enumerate(weights):
        kv.init(k, w)
    mx.nd.waitall()
    device = emulation.from_env(rank, n, args.batch_size)
    kv.barrier()

    def iteration(i: int) -> tuple[float, float]:
        if device.active:
            device.begin()
        if args.compute:
            lo = (i * args.batch_size) % max(1, len(xs) - args.batch_size)
            data = mx.nd.array(xs[lo:lo + args.batch_size])
            label = mx.nd.array(ys[lo:lo + args.batch_size])
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
        if device.active:
            device.end()
        c0, t0 = time.process_time(), time.perf_counter()
        for k in range(len(weights)):           # what gluon.Trainer does with a dist store
            kv.pushpull(k, grads[k], out=weights[k], priority=-k)
        mx.nd.waitall()
        return time.process_time() - c0, time.perf_counter() - t0

    for i in range(args.warmup):
        iteration(i)
    before = kv.stats()["servers"] if rank == 0 else None
    cpu0, t0 = time.process_time(), time.perf_counter()
    comm_cpu = comm_wall = 0.0
    for i in range(args.rounds):
        c, w = iteration(args.warmup + i)
        comm_cpu += c
        comm_wall += w
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    result = {"rank": rank, "workers": n, "kvstore": args.kvstore, "model": args.model,
              "rounds": args.rounds, "seconds": seconds, "cpu_s": cpu,
              "comm_cpu_s": comm_cpu, "comm_wall_s": comm_wall,
              "keys": len(weights), "elements": int(sum(w.size for w in weights))}
    if rank == 0:
        after = kv.stats()["servers"]
        result["servers"] = [{name: a[name] - b[name] for name in SERVER_COUNTS}
                             for a, b in zip(after, before)]
        for server, a in zip(result["servers"], after):
            server["groups"] = a["groups"]   # at the end (a level, not a change)
    kv.barrier()   # every worker's rounds are done before any reads the servers' clocks again
    with open(args.result.replace("{rank}", str(rank)), "w") as f:
        json.dump(result, f)
    return 0


#: element counts of the allreduce calibration (64 KB to 8 MB of float32): below, Gloo's
#: small-message path is slower than the ring's latency (4 KB took 2-3 ms, 64 KB 1.5-2); above,
#: the buffers leave the L3 cache (32 MB took 5.1x the time of 8 MB)
ALLREDUCE_SIZES = (1 << 14, 1 << 16, 1 << 18, 1 << 19, 1 << 20, 1 << 21)
CPU_PASSES = 4   # passes over the sizes in which an allreduce's CPU is counted


def allreduce_worker(args) -> int:
    """One Horovod worker timing Gloo allreduces of each size, the sizes interleaved over
    passes (``--rounds`` allreduces of each per pass), each size's trimmed mean."""
    import mxnet as mx
    import horovod.mxnet as hvd
    from .timing import timed
    hvd.init()
    tensors = {size: mx.nd.ones((size,)) for size in ALLREDUCE_SIZES}

    def allreduce(size):
        def run():
            hvd.allreduce(tensors[size], average=False,
                          name=f"calibrate.{size}").wait_to_read()
        return run
    seconds = timed({size: allreduce(size) for size in ALLREDUCE_SIZES}, passes=3,
                    reps=args.rounds, warmup=args.warmup)
    # the CPU the process spends per allreduce (Horovod's thread and Gloo's included): what it
    # takes from a host's cores, which DC-S3GD cannot hide behind a compute that needs them;
    # the sizes interleaved over passes as for the time (one block of 30 per size left the
    # fitted CPU per allreduce 0.56 ms in one calibration, 0.87 in the next, 2026-11-28)
    cpu = dict.fromkeys(ALLREDUCE_SIZES, 0.0)
    for _ in range(CPU_PASSES):
        for size in ALLREDUCE_SIZES:
            run = allreduce(size)
            c0 = time.process_time()
            for _ in range(args.rounds):
                run()
            cpu[size] += (time.process_time() - c0) / (args.rounds * CPU_PASSES)
    with open(args.result.replace("{rank}", str(hvd.rank())), "w") as f:
        json.dump({"rank": hvd.rank(), "workers": hvd.size(),
                   "seconds": {str(k): v for k, v in seconds.items()},
                   "cpu_s": {str(k): v for k, v in cpu.items()}}, f)
    return 0


def run_allreduce_job(workers: int = 2, rounds: int = 30, timeout: float = 300) -> dict:
    """Seconds per allreduce of each size in a real Horovod (Gloo) job on this machine, the
    slower worker's, by element count (``"seconds"``), and the CPU seconds a worker's process
    spends per allreduce, the workers' mean (``"cpu_s"``)."""
    import subprocess
    import tempfile
    from ..launch.cli import launcher_env
    with tempfile.TemporaryDirectory(prefix="kvx-plan-") as tmp:
        result = os.path.join(tmp, "a-{rank}.json")
        argv = [sys.executable, "-m", "kvstore_ext.launch", "-n", str(workers), "--launcher",
                "horovod", "--timeout", str(int(timeout)), sys.executable, "-m",
                "kvstore_ext.plan.jobs", "--allreduce", "--rounds", str(rounds), "--result", result]
        proc = subprocess.run(argv, env=launcher_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"the allreduce calibration job failed ({proc.returncode}):\n"
                               f"{proc.stdout[-3000:]}")
        runs = []
        for r in range(workers):
            with open(result.replace("{rank}", str(r))) as f:
                runs.append(json.load(f))
    return {"seconds": {int(k): max(run["seconds"][k] for run in runs) for k in runs[0]["seconds"]},
            "cpu_s": {int(k): sum(run["cpu_s"][k] for run in runs) / len(runs)
                      for k in runs[0]["cpu_s"]}}


def run_job(kvstore: str, model: str, workers: int, servers: int, *, compute: bool,
            device: str = "", rounds: int = 30, warmup: int = 5, batch_size: int = 64,
            timeout: float = 900) -> list[dict]:
    """Run one job of ``workers`` x ``servers`` on this machine; every worker's result."""
    import tempfile
    from ..launch import run_local_job
    with tempfile.TemporaryDirectory(prefix="kvx-plan-") as tmp:
        result = os.path.join(tmp, "r-{rank}.json")
        cmd = [sys.executable, "-m", "kvstore_ext.plan.jobs", "--kvstore", kvstore, "--model",
               model, "--rounds", str(rounds), "--warmup", str(warmup), "--batch-size",
               str(batch_size), "--result", result] + (["--compute"] if compute else [])
        options = ["--device", device, "--device-batch", str(batch_size)] if device else []
        # the model is of a cluster, whose nodes talk over sockets: no shared-memory lanes,
        # which only nodes of one host have (they make such a job faster than predicted)
        options.append("--no-shm")
        run_local_job(workers, servers, cmd, options=options, timeout=timeout)
        out = []
        for r in range(workers):
            with open(result.replace("{rank}", str(r))) as f:
                out.append(json.load(f))
        return out


def per_round(results: list[dict], of) -> float:
    """``of(result) / rounds`` over several jobs' results, the mean without the highest and
    lowest job (what ``calibrate`` and the host probe summarise a set of jobs by)."""
    from .timing import trimmed_mean
    return trimmed_mean([of(r) / r["rounds"] for r in results], drop=1)


def round_cpu(results: list[dict]) -> dict:
    """A worker's and the (first) server's CPU seconds per round over several 1 x 1 jobs
    (:func:`per_round`)."""
    return {"worker_cpu_s": per_round(results, lambda r: r["comm_cpu_s"]),
            "server_cpu_s": per_round(results, lambda r: r["servers"][0]["cpu_s"])}


def seconds_per_iteration(results: list[dict], kvstore: str) -> float:
    """The job's mean time per iteration of one worker: the slowest worker's under a
    synchronous store (all keep its pace), else n over the sum of the workers' rates."""
    times = [r["seconds"] / r["rounds"] for r in results]
    if kvstore in ("dist_bsp", "dist_sync", "dist_psp"):
        return max(times)
    return len(times) / sum(1.0 / t for t in times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="One worker of a planner job (run by launch.py).")
    p.add_argument("--allreduce", action="store_true",
                   help="time Horovod (Gloo) allreduces of growing sizes instead (launch.py "
                        "--launcher horovod)")
    p.add_argument("--layer-times", action="store_true",
                   help="time the forward and backward pass of --model and of each of its layers "
                        "at --batch-size, --rounds passes (calibrate's compute), in this process")
    p.add_argument("--kvstore", help="store type")
    p.add_argument("--model",
                   help="a gluon_trainers or GluonCV model, or KxN: K arrays of N elements")
    p.add_argument("--compute", action="store_true",
                   help="compute real gradients on MNIST each iteration (else the arrays only)")
    p.add_argument("--rounds", type=int, default=30, help="timed iterations (default 30)")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations first (default 5)")
    p.add_argument("--batch-size", type=int, default=64, help="batch per worker (default 64)")
    p.add_argument("--result", required=True, help="JSON path ({rank} replaced by the rank)")
    args = p.parse_args(argv)
    if args.allreduce:
        return allreduce_worker(args)
    if args.layer_times:
        if not args.model:
            p.error("--layer-times needs --model")
        return layer_times(args)
    if not (args.kvstore and args.model):
        p.error("--kvstore and --model are needed (or --allreduce)")
    return worker(args)


if __name__ == "__main__":
    sys.exit(main())
