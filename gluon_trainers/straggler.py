"""Straggler emulation: make a worker behave as if it ran on a slower device.

A worker of speed ``v`` sleeps ``(1/v - 1)`` times its measured compute time
after each iteration's backward pass, so its iteration takes ``1/v`` times as
long; with jitter, each stretch varies by a uniform factor, seeded per worker.
It wraps the training loop, not the store, so it works the same with every
store (kvstore_ext's, MXNet's own, Horovod): a GTX 1080 Ti + GTX 1060 pair
is ``--worker-speed 1.0,0.43`` in ``launch.py``.

    straggler = Straggler.from_env(kv.rank)
    for data, label in batches:
        straggler.begin()            # waits for the weights: that time is not compute
        with autograd.record():
            loss = net(data)
        loss.backward()
        straggler.end()              # waits for the gradients, then sleeps the stretch
        trainer.step(batch_size)
"""
from __future__ import annotations

import os
import random
import time

from kvstore_ext import jobenv, stragglers


class Straggler:
    """Stretches each iteration of one worker to ``1/speed`` of its measured length."""

    def __init__(self, speed: float = 1.0, jitter: float = 0.0, seed: int = 0,
                 sleep=time.sleep, wait_all=None):
        self.speed = stragglers.parse_speeds(str(speed))[0]
        if not 0 <= jitter < 1:
            raise ValueError(f"speed jitter must be in [0, 1), got {jitter}")
        self.jitter = jitter
        self.rng = random.Random(seed)
        self._sleep = sleep
        self._wait_all = wait_all
        self._started: float | None = None
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

    def _sync(self) -> None:
        if self._wait_all is None:
            import mxnet as mx
            self._wait_all = mx.nd.waitall
        self._wait_all()

    def begin(self) -> None:
        """Start of an iteration: wait for pending work (the pulled weights), then start the clock."""
        t = time.perf_counter()
        self._sync()
        self._started = time.perf_counter()
        self.wait_time += self._started - t

    def end(self) -> float:
        """After backward: wait for the gradients, sleep the stretch; return the seconds slept."""
        if self._started is None:
            raise RuntimeError("Straggler.end() without begin()")
        self._sync()
        compute = time.perf_counter() - self._started
        self._started = None
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
