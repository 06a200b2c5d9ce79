"""Measure the performance model's coefficients on this machine (``plan calibrate``).

Every coefficient comes from a least-squares fit over measurements that vary what it
multiplies, and every fit reports its R^2:

- **compute**: each layer's forward + backward time against the batch size, for each model
  (a real Gluon or GluonCV network), and the whole network's, each batch size in a process of
  its own; FLOP/s achieved, from the model's multiply-accumulates, as a cross-check (it is not
  one constant across models);
- **interference** (the paper's C_interf): the slow-down of one process's compute when k
  processes compute at once on this host;
- both again in the environment Horovod workers compute in (MKL-DNN off, one thread:
  :func:`.dcs3gd_jobs.worker_env`), for the Horovod stores;
- **wire**: latency and bandwidth of a ZeroMQ round trip over TCP on 127.0.0.1, by size;
- **optimizer**: MXNet's momentum SGD updater, as the servers call it, per key and per element;
- **runtime**: real one-worker, one-server ``dist_bsp`` jobs over shape sets that vary keys and
  bytes apart: the worker's CPU per round fitted to per message + per key + per byte, and the
  server's CPU per push (minus the optimizer) to those and per frame of its own (an array of
  ``protocol.OWN_FRAME_BYTES`` or more); beside them, the optimizer's CPU as each
  server timed its own calls, fitted and reported (not used: :func:`fit_runtime`);
- **idle rounds**: the same jobs' CPU per round when the processes idle between rounds (an
  emulated device's sleep), over back to back: what a training job's rounds cost beside the
  runtime jobs' (:func:`measure_idle_rounds`);
- **allreduce**: Gloo's ring in real 2-worker Horovod jobs, its wall time and its CPU.

The JSON it writes is what ``predict``, ``search`` and ``validate`` read.
"""
from __future__ import annotations

import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

from .dcs3gd_jobs import worker_env as horovod_worker_env
from .jobs import ENV_SHOWN
from .model import BYTES_PER_PARAM
from .timing import timed, trimmed_mean


def fit(columns: dict, y, nonnegative: bool = False, relative: bool = False) -> dict:
    """Least squares ``y ~ sum(coef * column)``; the coefficients by column name and R^2
    (an intercept is a column of ones, named).  ``nonnegative``: every coefficient >= 0
    (costs), by scipy's NNLS, rather than a negative one clipped afterwards.  ``relative``:
    minimise relative rather than absolute residuals (each point weighted by 1/y), for times
    spanning orders of magnitude whose noise grows with them: otherwise the largest points'
    few percent of noise decide the small costs (a message's, a key's) and two calibrations
    disagree on them.  R^2 is of the unweighted fit to ``y`` either way."""
    names = list(columns)
    a = np.column_stack([np.asarray(columns[k], dtype=float) for k in names])
    y = np.asarray(y, dtype=float)
    w = 1.0 / np.maximum(np.abs(y), 1e-12) if relative else np.ones_like(y)
    aw, yw = a * w[:, None], y * w
    if nonnegative:
        from scipy.optimize import nnls
        scale = np.abs(aw).max(axis=0)
        scale[scale == 0] = 1.0
        coef, _ = nnls(aw / scale, yw)
        coef = coef / scale
    else:
        coef, *_ = np.linalg.lstsq(aw, yw, rcond=None)
    resid = y - a @ coef
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid ** 2).sum()) / total if total > 0 else 1.0
    return {**{k: float(c) for k, c in zip(names, coef)}, "r2": r2, "points": len(y)}


def measure_compute(model: str, batch_sizes=(8, 16, 32, 64, 128), passes: int = 5,
                    reps: int = 2, env: dict | None = None):
    """Per-layer and whole-network forward + backward seconds against the batch size (a
    generator of measurement units, one per process: :func:`measured`).

    Each batch size is timed in a process of its own, as a training job runs one (a process
    that has run other batch sizes first ran LeNet's 128 at 27-29 ms, one that ran only 128 at
    22-24 ms: a 5-point line through the first kind bent to R^2 0.95).  ``passes`` processes
    per batch size, the sizes taken in turn so that drift spreads over all of them, each
    process's ``reps`` interleaved passes summarised by their trimmed mean, and the processes'
    without the highest and lowest (of three, LeNet's first convolution's line had R^2 0.9475
    in one of two calibrations, 2026-11-28).  ``env``: the processes'
    environment (this one's if None); ``"environment"`` in the result is the part of it that
    sets how MXNet computes, as the timing processes saw it."""
    from .jobs import run_layer_times
    from ..devices import MODELS as MACS
    runs = {b: [] for b in batch_sizes}
    for _ in range(passes):
        for b in batch_sizes:
            runs[b].append(run_layer_times(model, b, reps, env))
            yield
    def middle(values):
        return trimmed_mean(values, drop=1)

    whole = [middle([r["whole"] for r in runs[b]]) for b in batch_sizes]
    names = runs[batch_sizes[0]][0]["names"]
    per_layer = [[middle([r["layers"][i] for r in runs[b]]) for b in batch_sizes]
                 for i in range(len(names))]
    bs = np.asarray(batch_sizes, dtype=float)
    # a free intercept: a small negative one is what a straight line through these points
    # has, and forcing it to zero would tilt the slope (ModelProfile.host_time floors at 0)
    total = fit({"fixed": np.ones_like(bs), "per_sample": bs}, whole)
    layer_sum = np.sum(per_layer, axis=0)
    out_layers = []
    for name, seconds in zip(names, per_layer):
        f = fit({"fixed": np.ones_like(bs), "per_sample": bs}, seconds)
        share = float(np.mean(np.asarray(seconds) / layer_sum))
        out_layers.append({"layer": name, "share": share, "seconds": seconds, **f})
    macs = MACS.get(model, (None,))[0]
    flops = [6 * macs * b / t for b, t in zip(batch_sizes, whole)] if macs else None
    return {"model": model, "batch_sizes": list(batch_sizes), "seconds": whole,
            "fit": total, "layers": out_layers, "layer_sum_seconds": layer_sum.tolist(),
            "macs_per_sample": macs, "achieved_flops": flops,
            "activation_elements_per_sample":
                runs[batch_sizes[0]][0]["activation_elements_per_sample"],
            "environment": runs[batch_sizes[0]][0]["environment"]}


_PROBE = r"""
import sys, time
sys.path.insert(0, {root!r})
from kvstore_ext.plan.timing import trimmed_mean
from kvstore_ext.plan.jobs import training_step
step = training_step({model!r}, {batch})[2]
for _ in range(3): step()
print("ready", flush=True)
for line in sys.stdin:                  # "go SECONDS": time steps for that long
    word, _, window = line.partition(" ")
    if word != "go":
        break
    times = []
    end = time.perf_counter() + float(window)
    while time.perf_counter() < end:
        t0 = time.perf_counter(); step(); times.append(time.perf_counter() - t0)
    mean = sum(times) / len(times)
    spread = (sum((t - mean) ** 2 for t in times) / max(len(times) - 1, 1)) ** 0.5
    print(trimmed_mean(times), spread / mean, flush=True)   # the step's time, its jitter
"""


def measure_interference(model: str = "lenet", batch: int = 64, counts=(1, 2, 4, 8),
                         seconds: float = 2.0, rounds: int = 5, jitter_rounds: int = 15,
                         env: dict | None = None):
    """The slow-down of one process's compute when k processes compute at once (a generator
    of measurement units, one per round: :func:`measured`): k probe
    processes are started once, then, ``rounds`` times, each computes alone in turn (for
    ``seconds``) and all k together (for ``seconds`` x k / 2, so that each takes about as many
    steps as alone); a round's factor is the mean of their times together
    over the mean of their times alone, and the factor is the median over rounds, so drift
    between rounds cancels.  Every probe has its own baseline because processes started alike
    compute at different speeds and keep them (LeNet at batch 64 here: 10.5 to 14.5 ms a step
    alone, the same probe within 5% from round to round), so one probe's baseline made the
    factor a draw of which process it was (C_interf(8) 4.27 in one calibration, 5.56 in the
    next).  ``env``: the probes' environment (by default this one's: the threads a
    parameter-server job's workers get, launch.py leaves them as they are).

    ``step_cv[k]``: the jitter of one step among k computing together, its standard deviation
    over its mean, which the model's expected maximum of a compute and a communication that
    overlap needs (:func:`.model.expected_max`), at k > 1 only: one process has no ring to
    overlap, and its jitter alone did not repeat (docs/planner.md).  A window's jitter moves
    by up to six times from one round to the next on a shared host, so it is taken over
    ``jitter_rounds``: the ``rounds`` above, then further ones that time the probes together
    only.  It is the mean over the probes and over the rounds, not the rounds' median:
    windows are either quiet or hold a disturbance, a job's steps meet both, and the median
    falls on either side of that gap (``step_cv_rounds`` keeps every round's; the
    measurements: docs/planner.md)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = _PROBE.format(root=root, model=model, batch=batch)
    env = dict(os.environ) if env is None else env

    def run(procs, window: float) -> tuple[list[float], list[float]]:
        """Each probe's step time over ``window`` and its steps' jitter."""
        for p in procs:          # all start together
            p.stdin.write(f"go {window}\n")
            p.stdin.flush()
        lines = [p.stdout.readline().split() for p in procs]
        return [float(seconds) for seconds, _ in lines], [float(cv) for _, cv in lines]

    together, alone, factor, per_probe, step_cv, cv_rounds = {}, {}, {}, {}, {}, {}
    for k in counts:
        procs = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env) for _ in range(k)]
        try:
            for p in procs:
                if p.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"an interference probe of {model} failed to start")
            rows, cvs = [], []
            together_window = seconds * k / 2
            for r in range(max(rounds, jitter_rounds) if k > 1 else rounds):
                jitter = None
                if r < rounds:
                    alone_each = [run([p], seconds)[0][0] for p in procs]
                    side_by_side = alone_each
                    if k > 1:
                        side_by_side, jitter = run(procs, together_window)
                    rows.append((alone_each, side_by_side))
                else:                   # the jitter only
                    jitter = run(procs, together_window)[1]
                if jitter is not None:
                    cvs.append(statistics.mean(jitter))   # of the steps run together
                yield
        finally:
            for p in procs:
                p.kill()
                p.wait()
        alone[k] = statistics.median(statistics.mean(a) for a, _ in rows)
        together[k] = statistics.median(statistics.mean(t) for _, t in rows)
        factor[k] = statistics.median(statistics.mean(t) / statistics.mean(a) for a, t in rows)
        per_probe[k] = [{"alone": a, "together": t} for a, t in rows]
        if cvs:
            step_cv[k] = statistics.mean(cvs)
            cv_rounds[k] = cvs
    return {"model": model, "batch": batch, "seconds": together, "alone_seconds": alone,
            "factor": factor, "step_cv": step_cv, "step_cv_rounds": cv_rounds,
            "per_probe_seconds": per_probe,
            "environment": {k: v for k, v in env.items() if k in ENV_SHOWN}}


_ECHO = r"""
import sys, zmq
ctx = zmq.Context(); s = ctx.socket(zmq.PAIR); port = s.bind_to_random_port("tcp://127.0.0.1")
print(port, flush=True)
while True:
    m = s.recv(copy=False)
    if len(m) == 0: break
    s.send(m, copy=False)
"""


def measure_wire(sizes=(1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22, 1 << 23),
                 passes: int = 5, reps: int = 8, latency_block: int = 25,
                 echoes: int = 3):
    """One-way latency (64-byte round trips, halved) and bandwidth (the slope of the one-way
    time against the size, 1 KB to 8 MB) to an echo process on 127.0.0.1 over ZeroMQ; sizes
    interleaved pass after pass, each the trimmed mean of its round trips, then the median
    over ``echoes`` echo processes one after the other (how two processes share the two cores
    is set when they start: one echo's latency was 50 us, the next one's 68).  Larger messages
    leave the L3 cache and cross loopback several times slower per byte here (32 MB: 1.8
    against 4.8 GB/s): the bandwidth is that of messages of up to a few MB.  A generator of
    measurement units, one per echo process (:func:`measured`)."""
    runs = []
    for _ in range(echoes):
        runs.append(_echo_seconds(sizes, passes, reps, latency_block))
        yield
    seconds = {label: statistics.median(run[label] for run in runs) for label in runs[0]}
    latency = seconds[0] / latency_block / 2
    one_way = [seconds[size] / 2 for size in sizes]
    f = fit({"latency": np.ones(len(sizes)), "per_byte": np.asarray(sizes, dtype=float)}, one_way,
            nonnegative=True, relative=True)
    return {"sizes": list(sizes), "one_way_s": one_way, "fit": f, "latency": latency,
            "bandwidth": 1.0 / max(f["per_byte"], 1e-12)}


def _echo_seconds(sizes, passes: int, reps: int, latency_block: int) -> dict:
    """Seconds per round trip of each size to one new echo process (label 0: a block of
    ``latency_block`` 64-byte round trips)."""
    import zmq
    echo = subprocess.Popen([sys.executable, "-c", _ECHO], stdout=subprocess.PIPE, text=True)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    try:
        sock.connect(f"tcp://127.0.0.1:{int(echo.stdout.readline())}")

        def round_trips(buf, count: int = 1):
            def rt():
                for _ in range(count):
                    sock.send(buf, copy=False)
                    sock.recv(copy=False)
            return rt
        fns = {0: round_trips(b"x" * 64, latency_block)}
        fns.update({size: round_trips(np.ones(size, dtype=np.uint8)) for size in sizes})
        seconds = timed(fns, passes, reps)
        sock.send(b"")
        echo.wait(10)
    finally:
        sock.close(0)
        ctx.term()
        if echo.poll() is None:
            echo.kill()
            echo.wait()
    return seconds


#: the longest run the optimizer's calibration times: the servers' numpy SGD reads and writes
#: 16 bytes an element (weights, gradients, momentum and a temporary), 34 MB here, about the
#: 32 MB L3 cache.  Out of it (4.1 M elements) an element cost 1.38 ns against 0.8 in it, and
#: with that one point the linear fit's R^2 was 0.85, 0.999 without it (docs/planner.md)
OPTIMIZER_CACHED_ELEMENTS = 2_100_000


def measure_optimizer(keys=(1, 8, 64, 256, 1024), sizes=(100, 1_000, 16_000, 100_000),
                      passes: int = 2, reps: int = 10, processes: int = 8):
    """The servers' optimizer as they call it, in a loop (its arrays stay in the caches; the
    servers' own timing of it in place is reported beside, :func:`fit_runtime`):
    :meth:`ServerOptimizer.apply_runs
    <kvstore_ext.optimizers.ServerOptimizer.apply_runs>` with MXNet's momentum SGD over k
    blocks of m elements held back to back in one :class:`~kvstore_ext.optimizers.FlatArrays`
    (a group's blocks, one kernel array), up to :data:`OPTIMIZER_CACHED_ELEMENTS` (beyond, the
    update's arrays leave the L3 cache, and an element costs 1.7 times as much).
    Timing separate arrays instead would charge a kernel array per key (6 us here) that the
    servers do not pay, and leave the servers' own per-key cost to absorb the difference.

    Each of ``processes`` new processes times every point (``passes`` x ``reps`` calls), and
    a point is the mean over the processes: a call's fixed cost is set when a process starts
    and kept (one key of 100 elements: 128-142 us in one process, 165-187 in three others,
    each within 10% over three measurements), so the points are means over enough processes
    to average that draw out (four left two calibrations 22.6% apart on the per-key cost;
    docs/planner.md).  A generator of measurement units, one per process (:func:`measured`)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = _OPTIMIZER_POINTS.format(root=root, keys=tuple(keys), sizes=tuple(sizes),
                                    passes=passes, reps=reps)
    runs = []
    for _ in range(processes):
        runs.append(json.loads(subprocess.run([sys.executable, "-c", code], check=True,
                                              text=True, stdout=subprocess.PIPE).stdout))
        yield
    rows = [(k, p, float(np.mean([run[i][2] for run in runs])))
            for i, (k, p, _) in enumerate(runs[0])]
    return {"points": [list(r) for r in rows], "processes": processes,
            "fit": fit_optimizer(rows)}


_OPTIMIZER_POINTS = r"""
import json, sys
sys.path.insert(0, {root!r})
from kvstore_ext.plan.calibrate import optimizer_points
print(json.dumps(optimizer_points({keys!r}, {sizes!r}, {passes}, {reps})))
"""


def optimizer_points(keys, sizes, passes: int, reps: int) -> list:
    """``[keys, params, seconds]`` of one call of the servers' optimizer, in this process
    (:func:`measure_optimizer` runs it in new ones)."""
    import mxnet as mx
    from ..optimizers import FlatArrays, Run, ServerOptimizer
    applies = {}
    for k in keys:
        for size in sizes:
            if k * size > OPTIMIZER_CACHED_ELEMENTS:
                continue
            opt = ServerOptimizer(mx.optimizer.SGD(learning_rate=0.01, momentum=0.9, wd=1e-4),
                                  "dist_bsp", asynchronous=False)
            home = FlatArrays(np.float32)
            offsets = [home.add(size) for _ in range(k)]
            home.numpy("weight")[:] = 1.0
            home.numpy("grad")[:] = 1.0
            run = Run(home, range(k), offsets + [offsets[-1] + size])

            def apply(opt=opt, run=run):
                opt.apply_runs([run])
                mx.nd.waitall()
            applies[(k, k * size)] = apply
    return [[k, p, t] for (k, p), t in timed(applies, passes, reps).items()]


def fit_optimizer(points) -> dict:
    """The optimizer's cost per call, per key and per parameter from ``(keys, params,
    seconds)`` points (the fused kernels cost little per key, but a call has its own cost)."""
    k, p, t = (np.array(c, dtype=float) for c in zip(*points))
    return fit({"per_call": np.ones_like(k), "per_key": k, "per_param": p}, t, nonnegative=True,
               relative=True)


def optimizer_seconds(optimizer_fit: dict, keys, params):
    """What ``fit_optimizer``'s coefficients give for one application (a calibration made
    before the per-call term has none)."""
    return (optimizer_fit.get("per_call", 0.0) + optimizer_fit["per_key"] * keys
            + optimizer_fit["per_param"] * params)


#: the runtime jobs' shape sets: real models and synthetic sets that vary keys and bytes apart
#: (one where each coefficient weighs most: 1x100 the message, 512x16 the key, 1x800000 the
#: byte, 64x16384 the frame: its 4 MB in 64 frames of their own against 16x65536's 16), pushes
#: of at most 4 MB: the server then holds a push with its weights, gradients and momentum in
#: the 32 MB L3 cache (an 8 MB set's server CPU differed by a quarter between two
#: calibrations)
RUNTIME_SETS = ("lenet", "cifar_resnet20_v1", "256x1024", "64x4096", "64x16384", "32x16384",
                "16x65536", "8x65536", "1x800000", "8x100", "1x100", "512x16")


def measure_runtime(optimizer_fit: dict, sets=RUNTIME_SETS, rounds: int = 30,
                    repeats: int = 7):
    """Worker CPU per round and server CPU per push in real 1 x 1 ``dist_bsp`` jobs, over
    ``repeats`` jobs per set, interleaved: the mean without the highest and lowest.  Not the
    median: a job's CPU falls in one of two modes set when its processes start (two jobs of
    64x4096 in a row: 2.6 and 1.8 ms of server CPU per round; the server's was its malloc's,
    fixed by :mod:`kvstore_ext.ps.heap`), and a median of a few jobs jumps between the modes
    where a mean moves by the share of jobs in each.  A generator of measurement units, one
    per job (:func:`measured`)."""
    from .jobs import per_round, round_cpu, run_job
    runs = {name: [] for name in sets}
    for _ in range(repeats):
        for name in sets:
            runs[name].append(run_job("dist_bsp", name, 1, 1, compute=False, rounds=rounds)[0])
            yield
    rows = []
    for name in sets:
        rs = runs[name]
        keys, elements = rs[0]["keys"], rs[0]["elements"]
        rows.append({"set": name, "keys": keys, "bytes": BYTES_PER_PARAM * elements,
                     "frames": set_frames(name),
                     "round_s": per_round(rs, lambda r: r["seconds"]), **round_cpu(rs),
                     "server_optimizer_cpu_s": per_round(
                         rs, lambda r: r["servers"][0]["optimizer_cpu_s"])})
    return {"jobs": rows, **fit_runtime(rows, optimizer_fit)}


#: the device time that idles a runtime job between its rounds in :func:`measure_idle_rounds`
IDLE_DEVICE = "60ms"


def measure_idle_rounds(sets=("lenet", "cifar_resnet20_v1"), rounds: int = 30,
                        repeats: int = 5, device: str = IDLE_DEVICE):
    """How much more a round's CPU costs when the processes idle between rounds, as in
    training, than back to back, as in :func:`measure_runtime`'s jobs: 1 x 1 ``dist_bsp``
    jobs of each shape set, with no device and with a ``device`` that sleeps between rounds,
    interleaved, ``repeats`` of each; the worker's and the server's CPU per round (each the
    mean without the highest and lowest job), and ``factor``: their sum idle over their sum
    back to back, over every set.  A round after 20-150 ms of sleep took 1.23-1.40 times the CPU
    of one back to back here (caches and the core's state gone cold; 5 ms: 1.04-1.12), so
    coefficients fitted on back-to-back rounds predicted every training job's exchange short.
    A generator of measurement units, one per job (:func:`measured`)."""
    from .jobs import round_cpu, run_job
    runs = {(name, dev): [] for name in sets for dev in ("", device)}
    for _ in range(repeats):
        for name in sets:
            for dev in ("", device):
                runs[name, dev].append(run_job("dist_bsp", name, 1, 1, compute=False,
                                               device=dev, rounds=rounds)[0])
                yield
    rows, warm, cold = [], 0.0, 0.0
    for name in sets:
        row = {"set": name}
        for dev, label in (("", "back_to_back"), (device, "idle")):
            row[label] = round_cpu(runs[name, dev])
        row["factor"] = (sum(row["idle"].values()) / sum(row["back_to_back"].values()))
        warm += sum(row["back_to_back"].values())
        cold += sum(row["idle"].values())
        rows.append(row)
    return {"device": device, "rows": rows, "factor": cold / warm}


def set_frames(name: str) -> int:
    """The frames (besides frame 0) a push of a runtime job's shape set travels in (one
    server: every key whole; :func:`kvstore_ext.plan.model.staged_frames`)."""
    from .jobs import model_shapes
    from .model import ModelProfile
    return ModelProfile(name, [int(np.prod(s)) for s in model_shapes(name)]).placement(1)[0][2]


def fit_runtime(rows: list[dict], optimizer_fit: dict) -> dict:
    """The worker's CPU per message, key and byte and the server's per message, key, byte and
    own frame (``frames``: the arrays of ``protocol.OWN_FRAME_BYTES`` or more) from the runtime
    jobs; a server's CPU per push is its CPU per round less the optimizer's
    (``optimizer_fit``, the warm loop's), set in each row as ``server_push_cpu_s``.

    The frame term is what sets apart, at equal bytes and keys, a push of 32 arrays of 64 KB
    from one of 8 of 256 KB (4.4 against 3.1 ms of server CPU): without it the fit's R^2 was
    0.90-0.92 (docs/planner.md).

    Where the servers timed their own optimizer calls (``server_optimizer_cpu_s``), that cost
    in place is fitted too (``optimizer_in_place_fit``), reported and not used: an element
    cost 1.7-4.8 ns there against the loop's 1.4-1.6 here, changing by set and by hour, and
    predictions with it scored no better against the same real jobs (docs/planner.md)."""
    for r in rows:
        r["server_push_cpu_s"] = r["server_cpu_s"] - optimizer_seconds(
            optimizer_fit, r["keys"], r["bytes"] / BYTES_PER_PARAM)
    ones = np.ones(len(rows))
    keys = np.array([r["keys"] for r in rows], dtype=float)
    nbytes = np.array([r["bytes"] for r in rows], dtype=float)
    frames = np.array([r.get("frames", 0) for r in rows], dtype=float)
    columns = {"msg": ones, "per_key": keys, "per_byte": nbytes}
    out = {"worker_fit": fit(columns, [r["worker_cpu_s"] for r in rows], nonnegative=True,
                             relative=True),
           "server_fit": fit({**columns, "per_frame": frames},
                             [r["server_push_cpu_s"] for r in rows], nonnegative=True,
                             relative=True)}
    if all("server_optimizer_cpu_s" in r for r in rows):
        out["optimizer_in_place_fit"] = fit_optimizer(
            [(r["keys"], r["bytes"] / BYTES_PER_PARAM, r["server_optimizer_cpu_s"]) for r in rows])
    return out


#: ``calibrate --quick``: fewer, shorter measurements, to check the pipeline (not for figures)
QUICK = {"compute": {"batch_sizes": (16, 64), "passes": 1, "reps": 2},
         "interference": {"counts": (1, 2), "seconds": 1.0, "rounds": 1, "jitter_rounds": 1},
         "wire": {"passes": 2, "reps": 3, "echoes": 1},
         "optimizer": {"keys": (1, 64), "sizes": (1_000, 100_000), "passes": 1, "reps": 2,
                       "processes": 1},
         "runtime": {"sets": ("lenet", "256x1024", "16x65536", "8x100"), "repeats": 1,
                     "rounds": 15},
         "idle": {"sets": ("lenet",), "repeats": 1, "rounds": 15}}


def measure_allreduce(workers: int = 2, jobs: int = 5):
    """Gloo's ring allreduce in real 2-worker Horovod jobs: ``2(n-1)`` steps of latency and
    ``2(n-1)/n`` of the bytes, fitted over 64 KB to 8 MB (``jobs.ALLREDUCE_SIZES``) on relative
    residuals (the small sizes then decide the latency, the large ones the bandwidth); each
    size's mean over ``jobs`` jobs without the highest and lowest (where a job's workers fall
    in Horovod's background cycle is set when it starts: one job's small allreduces took 1.9
    ms, the next one's 1.2).  The CPU a worker's process spends per allreduce is fitted the
    same way (``cpu_fit``).  Each job's points are kept (``jobs``).  None without Horovod.
    A generator of measurement units, one per job (:func:`measured`)."""
    try:
        import horovod.mxnet  # noqa: F401
    except ImportError:
        return None
    from .jobs import run_allreduce_job
    runs = []
    for _ in range(jobs):
        runs.append(run_allreduce_job(workers))
        yield
    sizes = sorted(runs[0]["seconds"])
    nbytes = np.array([BYTES_PER_PARAM * k for k in sizes], dtype=float)
    steps = 2 * (workers - 1)
    columns = {"latency": np.full(len(sizes), float(steps)), "per_byte": nbytes * steps / workers}
    seconds, cpu = ([trimmed_mean([run[kind][k] for run in runs], drop=1) for k in sizes]
                    for kind in ("seconds", "cpu_s"))
    f = fit(columns, seconds, nonnegative=True, relative=True)
    c = fit(columns, cpu, nonnegative=True, relative=True)
    return {"workers": workers, "bytes": nbytes.tolist(), "seconds": seconds, "cpu_s": cpu,
            "fit": f, "latency": f["latency"], "bandwidth": 1.0 / max(f["per_byte"], 1e-12),
            "cpu_fit": c, "jobs": [{kind: [run[kind][k] for k in sizes]
                                    for kind in ("seconds", "cpu_s")} for run in runs]}


def calibration_steps(models=("lenet", "cifar_resnet20_v1"), interference_counts=(1, 2, 4, 8),
                      quick: bool = False) -> list:
    """The calibration's measurements in order, as ``(name, measure)``: ``measure(out)``, a
    generator of measurement units, adds its part to the calibration ``out`` (the runtime's
    fit needs the optimizer's)."""
    q = QUICK if quick else {}
    interference = {"counts": interference_counts, **q.get("interference", {})}
    # the Horovod stores' workers compute in another environment (MXNet's own kernels)
    env = dict(horovod_worker_env(), MXNET_STORAGE_FALLBACK_LOG_VERBOSE="0")   # its notices

    def compute(out, key="compute", environment=None):
        out[key] = {}
        for m in models:
            out[key][m] = yield from measure_compute(m, env=environment, **q.get("compute", {}))

    def horovod(out):
        yield from compute(out, "compute_horovod", env)
        out["interference_horovod"] = yield from measure_interference(env=env, **interference)

    def runtime(out):        # its fit takes the optimizer's
        out["runtime"] = yield from measure_runtime(out["optimizer"]["fit"],
                                                    **q.get("runtime", {}))

    def into(key, measure, **kwargs):
        def step(out):
            out[key] = yield from measure(**kwargs)
        return step
    steps = [
        ("compute", compute),
        ("interference", into("interference", measure_interference, **interference)),
        ("compute of Horovod workers", horovod),
        ("wire", into("wire", measure_wire, **q.get("wire", {}))),
        ("optimizer", into("optimizer", measure_optimizer, **q.get("optimizer", {}))),
        ("runtime", runtime),
        ("idle rounds", into("idle", measure_idle_rounds, **q.get("idle", {})))]
    if not quick:
        steps.append(("allreduce", into("allreduce", measure_allreduce)))
    return steps


def calibrate(models=("lenet", "cifar_resnet20_v1"), interference_counts=(1, 2, 4, 8),
              progress=None, quick: bool = False, runs: int = 1):
    """Every measurement, the fits and the model's coefficients, as one JSON-ready dict.

    ``runs`` > 1: that many independent calibrations (a list), made step by step, each step
    unit by unit (a process, a round, a job: :func:`interleave`), the order reversed at every
    unit (A B, B A, A B, ...), so that the machine's drift falls on all of them alike.  Their
    differences are then the method's, which two calibrations made one after the other cannot
    tell apart from the machine's (docs/planner.md: every per-byte cost 12-28% slower 14
    minutes on; taken a whole step at a time, a minute apart, one calibration's optimizer
    points were all 0.54-0.78 times the other's, 2026-11-28)."""
    say = progress or (lambda name: None)
    outs = [{"machine": {"host": platform.node(), "cores": os.cpu_count(),
                         "python": platform.python_version(),
                         "when": time.strftime("%Y-%m-%d %H:%M:%S")}, "quick": quick}
            for _ in range(runs)]
    unit = 0
    for name, measure in calibration_steps(models, interference_counts, quick):
        say(name)
        unit = interleave([_lazily(measure, out) for out in outs], unit)[1]
    if runs > 1:
        for run, out in enumerate(outs):
            out["interleaved"] = {"run": run + 1, "of": runs}
    done = [with_coefficients(out) for out in outs]
    return done if runs > 1 else done[0]


def interleaved_order(runs: int, step: int) -> list[int]:
    """The order in which ``runs`` calibrations take their ``step``-th measurement: forward
    at even steps, backward at odd ones (no run always measures first)."""
    order = list(range(runs))
    return order if step % 2 == 0 else order[::-1]


def interleave(units: list, first: int = 0) -> tuple[list, int]:
    """Run generators of measurement units side by side: one unit (``next``) of each in turn,
    in :func:`interleaved_order` from the ``first``-th unit on, until all have returned; their
    return values, and the number of the unit after the last."""
    results, live, unit = [None] * len(units), list(range(len(units))), first
    while live:
        for i in [live[j] for j in interleaved_order(len(live), unit)]:
            try:
                next(units[i])
            except StopIteration as done:
                results[i] = done.value
                live.remove(i)
        unit += 1
    return results, unit


def measured(units):
    """What a generator of measurement units (``measure_compute(...)``, ...) returns, run
    alone."""
    return interleave([units])[0][0]


def _lazily(measure, out):
    """``measure(out)`` as a generator that starts at its first unit (a plain function's
    whole work is then one unit)."""
    result = measure(out)
    if inspect.isgenerator(result):
        return (yield from result)
    return result


def refit(data: dict) -> dict:
    """``data`` (a calibration) with its fits and coefficients made again from its measured
    points by this version's fitting: two calibrations compare on the same method."""
    out = json.loads(json.dumps(data))
    for row in out["runtime"]["jobs"]:      # made before the rows counted their own frames
        row.setdefault("frames", set_frames(row["set"]))
    out["optimizer"]["fit"] = fit_optimizer(out["optimizer"]["points"])
    out["runtime"].update(fit_runtime(out["runtime"]["jobs"], out["optimizer"]["fit"]))
    return with_coefficients(out)


def with_coefficients(out: dict) -> dict:
    """The model's coefficients from the measurements and fits of ``out`` (in place)."""
    w, s, o = out["runtime"]["worker_fit"], out["runtime"]["server_fit"], out["optimizer"]["fit"]
    out["coefficients"] = {
        "worker_msg": w["msg"], "worker_key": w["per_key"], "worker_byte": w["per_byte"],
        "server_msg": s["msg"], "server_key": s["per_key"], "server_byte": s["per_byte"],
        "server_frame": s.get("per_frame", 0.0),
        "opt_call": o.get("per_call", 0.0), "opt_key": o["per_key"], "opt_param": o["per_param"],
        "latency": out["wire"]["latency"], "bandwidth": out["wire"]["bandwidth"],
        "interference": {str(k): v for k, v in out["interference"]["factor"].items()},
        "cores": out["machine"].get("cores") or os.cpu_count() or 1}
    if out.get("idle"):                       # calibrations made before it measured none
        out["coefficients"]["idle_factor"] = out["idle"]["factor"]
    if "step_cv" in out["interference"]:     # calibrations made before it measured none
        out["coefficients"]["compute_cv"] = {
            str(k): v for k, v in out["interference"]["step_cv"].items()}
    if out.get("interference_horovod"):
        out["coefficients"]["horovod_interference"] = {
            str(k): v for k, v in out["interference_horovod"]["factor"].items()}
        if "step_cv" in out["interference_horovod"]:
            out["coefficients"]["horovod_compute_cv"] = {
                str(k): v for k, v in out["interference_horovod"]["step_cv"].items()}
    if out.get("allreduce"):
        out["coefficients"]["allreduce_latency"] = out["allreduce"]["latency"]
        out["coefficients"]["allreduce_bandwidth"] = out["allreduce"]["bandwidth"]
        if "cpu_fit" in out["allreduce"]:
            out["coefficients"]["allreduce_cpu_latency"] = out["allreduce"]["cpu_fit"]["latency"]
            out["coefficients"]["allreduce_cpu_byte"] = out["allreduce"]["cpu_fit"]["per_byte"]
    out["profiles"] = {m: profile_entry(m, c, out.get("compute_horovod", {}).get(m))
                       for m, c in out["compute"].items()}
    out["fits"] = fit_table(out)
    return out


def profile_entry(model: str, compute: dict, horovod: dict | None = None) -> dict:
    """What :class:`.model.ModelProfile` reads of a model: its arrays, its compute line and,
    if measured, its compute line in the Horovod workers' environment."""
    from .jobs import model_shapes
    sizes = [int(np.prod(s)) for s in model_shapes(model)]
    entry = {"key_sizes": sizes, "compute_fixed": compute["fit"]["fixed"],
             "compute_per_sample": compute["fit"]["per_sample"],
             "activation_elements_per_sample": compute["activation_elements_per_sample"]}
    if horovod:
        entry.update(horovod_compute_fixed=horovod["fit"]["fixed"],
                     horovod_compute_per_sample=horovod["fit"]["per_sample"])
    return entry


def fit_table(out: dict) -> list[dict]:
    """Every fit by name with its R^2 (layers under 5% of their model's time are marked minor:
    their fits are reported, not relied on)."""
    rows = []
    for key, suffix in (("compute", ""), ("compute_horovod", " (Horovod workers)")):
        for m, c in out.get(key, {}).items():
            rows.append({"fit": f"compute {m}{suffix}", "r2": c["fit"]["r2"], "minor": False})
            for layer in c["layers"]:
                rows.append({"fit": f"compute {m}{suffix} layer {layer['layer']}",
                             "r2": layer["r2"], "minor": layer["share"] < 0.05})
    rows.append({"fit": "wire", "r2": out["wire"]["fit"]["r2"], "minor": False})
    rows.append({"fit": "optimizer", "r2": out["optimizer"]["fit"]["r2"], "minor": False})
    if "optimizer_in_place_fit" in out["runtime"]:   # reported, not in the model
        rows.append({"fit": "optimizer in place (servers' own timing, not in the model)",
                     "r2": out["runtime"]["optimizer_in_place_fit"]["r2"], "minor": True})
    rows.append({"fit": "worker runtime", "r2": out["runtime"]["worker_fit"]["r2"], "minor": False})
    rows.append({"fit": "server runtime", "r2": out["runtime"]["server_fit"]["r2"], "minor": False})
    if out.get("allreduce"):
        rows.append({"fit": "allreduce", "r2": out["allreduce"]["fit"]["r2"], "minor": False})
        if "cpu_fit" in out["allreduce"]:
            rows.append({"fit": "allreduce CPU", "r2": out["allreduce"]["cpu_fit"]["r2"],
                         "minor": False})
    return rows


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def repeatability(a: dict, b: dict) -> list[dict]:
    """Each coefficient (interference per process count) of two calibrations and their
    relative difference, ``|a - b| / max(|a|, |b|)``."""
    def flat(data):
        c = data["coefficients"]
        out = {}
        for k, v in c.items():
            if isinstance(v, dict):         # interference factors by process count
                out.update({f"{k}@{n}": float(f) for n, f in v.items()})
            elif k != "cores" and v is not None:    # None: not measured
                out[k] = float(v)
        for model, prof in data.get("profiles", {}).items():
            out[f"{model} compute/sample"] = float(prof["compute_per_sample"])
            if "horovod_compute_per_sample" in prof:
                out[f"{model} compute/sample (Horovod workers)"] = \
                    float(prof["horovod_compute_per_sample"])
        return out
    fa, fb = flat(a), flat(b)
    rows = []
    for k in fa:
        if k in fb:
            top = max(abs(fa[k]), abs(fb[k]))
            rows.append({"coefficient": k, "first": fa[k], "second": fb[k],
                         "difference": abs(fa[k] - fb[k]) / top if top else 0.0})
    return rows
