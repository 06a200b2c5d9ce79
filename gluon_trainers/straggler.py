"""Straggler emulation: make a worker behave as if it ran on a given, or a slower, device.

Two rules, chosen by launch.py's options (:func:`from_env` picks the one a job asked for):

- :class:`EmulatedDevice` (``--device``): each iteration lasts ``max(host time, device
  time)``, the device time from :class:`kvstore_ext.devices.DeviceClock` (a profile or a
  time in ms, and its straggler patterns).  Host contention is absorbed while the device is
  the slower, so many emulated GPUs share two cores honestly; the host's share is measured.
- :class:`Straggler` (``--worker-speed``): a worker of speed ``v`` sleeps ``(1/v - 1)`` times its measured compute time
after each iteration's backward pass, so its iteration takes ``1/v`` times as
long; with jitter, each stretch varies by a uniform factor, seeded per worker.
  Its time depends on the host's load, so it is for clusters where each worker has its
  own uncontended device and one of them should look slower than it is.

Both wrap the training loop, not the store, so it works the same with every
store (kvstore_ext's, MXNet's own, Horovod): a GTX 1080 Ti + GTX 1060 pair
is ``--worker-speed 1.0,0.43`` in ``launch.py``.

    straggler = from_env(kv.rank, kv.num_workers, batch_size)
    for data, label in batches:
        straggler.begin()            # waits for the weights: that time is not compute
        with autograd.record():
            loss = net(data)
        loss.backward()
        straggler.end()              # waits for the gradients, then sleeps the stretch
        trainer.step(batch_size)
"""
from __future__ import annotations

import csv
import os
import random
import statistics
import sys
import time

from kvstore_ext import devices, jobenv, stragglers


class _LoopTimer:
    """What both emulations do around the compute: wait for MXNet's pending work (the pulled
    weights at ``begin``, the gradients at ``end``) and time what lies between."""

    def __init__(self, sleep=time.sleep, wait_all=None, now=time.perf_counter):
        self._sleep, self._wait_all, self._now = sleep, wait_all, now
        self._started: float | None = None

    def _sync(self) -> None:
        if self._wait_all is None:
            import mxnet as mx
            self._wait_all = mx.nd.waitall
        self._wait_all()

    def _begin(self) -> float:
        """Wait for the weights, start the clock; return the seconds waited."""
        t = self._now()
        self._sync()
        self._started = self._now()
        return self._started - t

    def _end(self) -> tuple[float, float]:
        """Wait for the gradients; return (when the compute started, its seconds)."""
        if self._started is None:
            raise RuntimeError(f"{type(self).__name__}.end() without begin()")
        self._sync()
        started, self._started = self._started, None
        return started, self._now() - started

    def write_log(self) -> str | None:
        """Write the per-iteration log to the job's metrics folder (none here)."""
        return None


class Straggler(_LoopTimer):
    """Stretches each iteration of one worker to ``1/speed`` of its measured length."""

    def __init__(self, speed: float = 1.0, jitter: float = 0.0, seed: int = 0,
                 sleep=time.sleep, wait_all=None):
        super().__init__(sleep, wait_all)
        self.speed = stragglers.parse_speeds(str(speed))[0]
        if not 0 <= jitter < 1:
            raise ValueError(f"speed jitter must be in [0, 1), got {jitter}")
        self.jitter = jitter
        self.rng = random.Random(seed)
        self.iterations = 0
        self.compute_time = 0.0   # measured between begin() and end()
        self.wait_time = 0.0      # spent in begin() waiting for the weights
        self.slept = 0.0

    @classmethod
    def from_env(cls, rank: int, num_workers: int | None = None) -> "Straggler":
        """The speed of worker ``rank`` from ``KVX_WORKER_SPEED`` (set by launch.py --worker-speed)."""
        raw = os.environ.get(jobenv.WORKER_SPEED, "").strip()
        if not raw:
            return cls(1.0)
        speeds = stragglers.parse_speeds(raw, num_workers)
        if rank >= len(speeds) and len(speeds) != 1:
            raise ValueError(f"{jobenv.WORKER_SPEED}={raw!r} has no speed for worker {rank}")
        speed = speeds[0] if len(speeds) == 1 else speeds[rank]
        jitter = float(os.environ.get(jobenv.SPEED_JITTER, "0") or 0)
        seed = int(os.environ.get(jobenv.SPEED_SEED, "0") or 0)
        return cls(speed, jitter, seed * 1000 + rank)

    @property
    def active(self) -> bool:
        return self.speed < 1.0

    def begin(self) -> None:
        """Start of an iteration: wait for pending work (the pulled weights), then start the clock."""
        self.wait_time += self._begin()

    def end(self) -> float:
        """After backward: wait for the gradients, sleep the stretch; return the seconds slept."""
        _, compute = self._end()
        self.iterations += 1
        self.compute_time += compute
        return self.stretch(compute)

    def stretch(self, compute: float) -> float:
        """Sleep so that an iteration of ``compute`` seconds takes ``compute / speed``."""
        draw = self.rng.uniform(-self.jitter, self.jitter) if self.jitter else 0.0
        extra = stragglers.stretched_time(compute, self.speed, draw) - compute
        if extra > 0:
            self._sleep(extra)
            self.slept += extra
        return extra

    def to_dict(self) -> dict:
        return {"speed": self.speed, "jitter": self.jitter, "iterations": self.iterations,
                "compute_time_s": self.compute_time, "wait_time_s": self.wait_time,
                "slept_s": self.slept}


class EmulatedDevice(_LoopTimer):
    """Makes each iteration of one worker last ``max(host time, device time)``.

    ``begin()`` waits for the pulled weights (not device time) and starts the clock;
    ``end()`` waits for the gradients (the host's real compute), then sleeps what is left of
    the iteration's device time.  Every iteration is recorded: its start, host and device
    seconds, the patterns' factor, the sleep and the wait for weights.
    """

    #: host work above this share of the device time makes the emulation contention-bound
    HOST_SHARE_WARNING = 0.5
    #: iterations per check of the host's share (the median of the latest ones)
    CHECK_EVERY = 20

    def __init__(self, clock: devices.DeviceClock, rank: int = 0, sleep=time.sleep,
                 wait_all=None, now=time.perf_counter):
        super().__init__(sleep, wait_all, now)
        self.clock = clock
        self.rank = rank
        self._t0: float | None = None
        self._waited = 0.0
        self.rows: list[dict] = []
        self.warned = False
        self.log_path: str | None = None

    active = True

    @classmethod
    def from_env(cls, rank: int, num_workers: int, batch_size: int) -> "EmulatedDevice":
        """The device of worker ``rank`` from launch.py's ``--device`` and pattern options."""
        env = os.environ
        patterns = [p for p in env.get(jobenv.STRAGGLER_PATTERNS, "").split(";") if p.strip()]
        batch = int(env.get(jobenv.DEVICE_BATCH) or batch_size)
        clock = devices.DeviceClock.from_specs(
            env[jobenv.DEVICE], patterns, rank, num_workers, env.get(jobenv.DEVICE_MODEL) or None,
            batch, int(env.get(jobenv.SPEED_SEED, "0") or 0))
        return cls(clock, rank)

    def begin(self) -> None:
        """Start of an iteration: wait for the weights, then start the device's clock."""
        self._waited = self._begin()
        if self._t0 is None:
            self._t0 = self._started

    def end(self, scale: float = 1.0) -> float:
        """After backward: wait for the gradients, then sleep the rest of the device time
        (times ``scale``: a batch ``scale`` times the profile's, as a worker pool sets)."""
        started, host = self._end()
        start = started - self._t0
        device = self.clock.next_time(start) * scale
        extra = max(0.0, device - host)
        if extra > 0:
            self._sleep(extra)
        # host_clock_s: the host's monotonic clock, which every process of one host shares
        # (the workers' logs side by side: exchange_slowdown)
        self.rows.append({"iteration": len(self.rows), "start_s": start, "host_s": host,
                          "device_s": device, "factor": self.clock.last_factor,
                          "slept_s": extra, "wait_s": self._waited, "host_clock_s": started})
        if not self.warned and len(self.rows) % self.CHECK_EVERY == 0:
            recent = self.host_share(self.rows[-self.CHECK_EVERY:])
            if recent > self.HOST_SHARE_WARNING:
                self.warned = True
                print(f"worker {self.rank}: host work takes {recent:.0%} of the emulated device "
                      f"time: iterations now depend on the host's load. Use fewer workers, a "
                      f"smaller model or longer device times", file=sys.stderr, flush=True)
        return extra

    def host_share(self, rows: list[dict] | None = None) -> float:
        """Median host time over device time, per iteration (1 or more: the host is the bound)."""
        rows = self.rows if rows is None else rows
        if not rows:
            return 0.0
        return statistics.median(r["host_s"] / r["device_s"] for r in rows)

    def to_dict(self) -> dict:
        rows = self.rows
        out = {"device_s": self.clock.base, "iterations": len(rows),
               "host_share": self.host_share(),
               "device_time_s": sum(r["device_s"] for r in rows),
               "compute_time_s": sum(r["host_s"] for r in rows),
               "slept_s": sum(r["slept_s"] for r in rows),
               "wait_time_s": sum(r["wait_s"] for r in rows),
               "slowed_iterations": sum(1 for r in rows if r["factor"] > 1)}
        if self.log_path:
            out["per_iteration_csv"] = self.log_path
        return out

    def write_log(self) -> str | None:
        """Write ``device-worker{rank}.csv`` (one row per iteration) to the job's metrics
        folder (``launch.py --metrics-dir``), once, at the end of training."""
        metrics = os.environ.get(jobenv.METRICS_DIR)
        if not metrics or not self.rows:
            return None
        self.log_path = os.path.join(metrics, f"device-worker{self.rank}.csv")
        os.makedirs(metrics, exist_ok=True)
        with open(self.log_path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(self.rows[0]))
            writer.writeheader()
            writer.writerows(self.rows)
        return self.log_path


def from_env(rank: int, num_workers: int | None = None, batch_size: int = 128):
    """The emulation a job asked for: an :class:`EmulatedDevice` with ``--device``, else a
    :class:`Straggler` (inactive at speed 1)."""
    if os.environ.get(jobenv.DEVICE, "").strip():
        return EmulatedDevice.from_env(rank, num_workers or 1, batch_size)
    return Straggler.from_env(rank, num_workers)


# -- reading the per-iteration logs back (experiments, tests) ------------------------------------
def read_device_logs(metrics_dir: str, workers: int) -> list[list[dict]] | None:
    """Every worker's ``device-worker{rank}.csv`` rows as numbers; None if one is missing."""
    logs = []
    for rank in range(workers):
        path = os.path.join(metrics_dir, f"device-worker{rank}.csv")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            logs.append([{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)])
    return logs


def round_overhead(logs: list[list[dict]]) -> float | None:
    """What a synchronous round costs beyond its slowest device time, median over the rounds
    (the first, MXNet's warm-up, left out): pushes, the update, the replies, the pulls."""
    rounds = min(len(log) for log in logs)
    gaps = [logs[0][i + 1]["start_s"] - logs[0][i]["start_s"]
            - max(log[i]["device_s"] for log in logs) for i in range(1, rounds - 1)]
    return statistics.median(gaps) if gaps else None


def _exchanges(log: list[dict], clock: str = "start_s"):
    """``(when it began, seconds)`` of each exchange of one worker's log, on ``clock``: from
    the end of an iteration's device time (or of its host work, if longer) to the next
    iteration's start; the first iteration (MXNet's warm-up) left out."""
    for a, b in zip(log[1:], log[2:]):
        begin = a[clock] + max(a["device_s"], a["host_s"] + a["slept_s"])
        yield begin, b[clock] - begin


def iteration_overhead(logs: list[list[dict]]) -> float | None:
    """What an iteration costs beyond its device time on an asynchronous store, where no
    policy holds a worker back: its push, the update and its pull, median over every worker's
    exchanges (:func:`_exchanges`)."""
    gaps = [seconds for log in logs for _, seconds in _exchanges(log)]
    return statistics.median(gaps) if gaps else None


def exchange_slowdown(logs: list[list[dict]]) -> dict | None:
    """How much longer a worker's exchange takes when it begins while other workers on the
    same host are in their host compute (the start of their iterations), from every worker's
    log of an asynchronous run (no policy holds a worker back, so an exchange is its push,
    the update and its pull; :func:`_exchanges`): each exchange is put with the number k of
    other workers computing when it began.  Returns, per k seen, the exchanges counted and
    their median seconds, and ``extra_s``: the median at k = 1 less the median at k = 0 (what
    one other process's compute adds; ``None`` if either was not seen).  What a virtual
    cluster's ``shared_host`` is checked against (docs/virtual_training.md).  None for logs
    without the host's clock (``host_clock_s``, written since 2026-12-02)."""
    import bisect
    if not logs or any(log and "host_clock_s" not in log[0] for log in logs):
        return None
    windows = [sorted((r["host_clock_s"], r["host_clock_s"] + r["host_s"]) for r in log)
               for log in logs]
    starts = [[w[0] for w in ws] for ws in windows]
    by_count: dict[int, list[float]] = {}
    for me, log in enumerate(logs):
        for begin, seconds in _exchanges(log, "host_clock_s"):
            computing = 0
            for other, ws in enumerate(windows):
                if other == me:
                    continue
                i = bisect.bisect_right(starts[other], begin) - 1
                computing += i >= 0 and begin < ws[i][1]
            by_count.setdefault(computing, []).append(seconds)
    if not by_count:
        return None
    medians = {k: statistics.median(by_count[k]) for k in sorted(by_count)}
    extra = medians[1] - medians[0] if 0 in medians and 1 in medians else None
    return {"exchanges": {k: len(v) for k, v in sorted(by_count.items())},
            "median_s": medians, "extra_s": extra}


def overhead_model(round_cost: float, lone_cost: float | None,
                   workers: int) -> tuple[float, float]:
    """The simulator's ``(latency, release_latency)``: k workers let go together start
    ``a + k*b`` after their OK, fitted to a synchronous round (``a + workers*b``, the
    :func:`round_overhead`) and, when measured, a worker let go alone (``a + b``, the
    :func:`iteration_overhead`).  Without the latter, all of the round is shared out per
    worker (a = 0): a worker let go alone then costs 1/workers of a round, too little on a
    busy host, where one push and pull is most of a round."""
    if lone_cost is None or workers < 2:
        return 0.0, round_cost / workers
    lone = min(max(lone_cost, round_cost / workers), round_cost)
    per_worker = (round_cost - lone) / (workers - 1)
    return lone - per_worker, per_worker


def warm_up(logs: list[list[dict]]) -> float:
    """How much longer than its device time the first iteration took (median over workers):
    MXNet's first forward and backward."""
    firsts = [log[1]["start_s"] - log[0]["device_s"] for log in logs if len(log) > 1]
    return statistics.median(firsts) if firsts else 0.0
