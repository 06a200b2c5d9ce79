"""Timing on a shared machine: calls interleaved pass after pass, summarised by a trimmed
mean (``plan calibrate`` and the planner's measuring jobs use it alike)."""
from __future__ import annotations

import math
import time

import numpy as np


def trimmed_mean(times, cut: float = 0.1, drop: int | None = None) -> float:
    """The mean of ``times`` without the lowest and highest ``cut`` of them (or ``drop`` at
    each end, for a handful of jobs): robust to the stray slow call a shared machine adds,
    and, unlike the median, steady when the times fall into two modes (a Horovod cycle caught
    or missed, a wake-up on the other core, a job's processes placed one way or the other).
    All of them when too few are left."""
    t = np.sort(np.asarray(times, dtype=float))
    k = int(len(t) * cut) if drop is None else drop
    return float(t[k:len(t) - k].mean()) if len(t) > 2 * k else float(t.mean())


def sample(fns: dict, passes: int = 3, reps: int = 5, warmup: int = 2,
           min_seconds: float = 0.0, max_reps: int = 100) -> dict:
    """Seconds of every call of each function in ``fns`` (label -> callable): ``reps`` calls
    in a row, the functions taken in turn, ``passes`` times over, after ``warmup`` untimed
    calls each (MXNet allocates its memory pools in the first ones).  Interleaving spreads
    the machine's drift over every point alike instead of bending a fitted line.

    ``min_seconds``: a cheap function gets more calls in a row, enough for them to last that
    long (at most ``max_reps``), judged from its last warm-up call.  With a fixed handful of
    calls a 100 µs layer's mean was one stray slow call away from a wrong point: the trimmed
    mean of six calls trims none."""
    counts = dict.fromkeys(fns, reps)
    for label, fn in fns.items():
        last = 0.0
        for _ in range(max(warmup, 1) if min_seconds > 0 else warmup):
            t0 = time.perf_counter()
            fn()
            last = time.perf_counter() - t0
        if min_seconds > 0:
            counts[label] = max(reps, min(max_reps, math.ceil(min_seconds / max(last, 1e-9))))
    times = {label: [] for label in fns}
    for _ in range(passes):
        for label, fn in fns.items():
            for _ in range(counts[label]):
                t0 = time.perf_counter()
                fn()
                times[label].append(time.perf_counter() - t0)
    return times


def timed(fns: dict, passes: int = 3, reps: int = 5, warmup: int = 2,
          min_seconds: float = 0.0) -> dict:
    """The trimmed mean seconds of each function of ``fns``, sampled by :func:`sample`."""
    return {label: trimmed_mean(t)
            for label, t in sample(fns, passes, reps, warmup, min_seconds).items()}
