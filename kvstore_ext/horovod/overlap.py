"""How much of the allreduce hides behind computation, from engine-side timestamps.

Round r is the allreduce started at step r; it is needed by the gradients of
step r + ``lag`` (1 for DC-S3GD: the next step; 0 for SSGD: the same step).
Its exposed wait is how long after the last of those gradients it finished; its
length runs from the last update handed to it to the last sum back.
Overlap = 1 − wait / length, over the rounds measured.

Timestamps come from engine probes, which cost a Python callback each, so only
every ``every``-th round is measured; totals are estimated from the mean.  Medians
are reported beside the means: on a host whose cores the allreduce shares with the
computation, a few stalled rounds can lift the means well above a typical round.
"""
from __future__ import annotations

import statistics
import threading
from collections import deque

#: the measured rounds whose times are kept for the medians (a bound on memory)
KEPT_ROUNDS = 10_000


class OverlapMeter:
    def __init__(self, lag: int, every: int = 10):
        self.lag = lag
        self.every = max(1, int(every))
        self.lock = threading.Lock()
        self.rounds: dict[int, dict] = {}
        self.keys_per_step: dict[int, int] = {}
        self.wait_s = 0.0
        self.length_s = 0.0
        self.measured = 0
        self.first = None     # (step, time) of the first measured gradients
        self.last = None
        self.closed: deque = deque(maxlen=KEPT_ROUNDS)   # (round, start, length, wait)

    def measures_round(self, r: int) -> bool:
        return r >= 0 and r % self.every == 0

    def measures_grad(self, step: int) -> bool:
        return self.measures_round(step - self.lag)

    def _round(self, r):
        return self.rounds.setdefault(r, {"start": None, "done": None, "grad": None,
                                          "n_start": 0, "n_done": 0, "n_grad": 0})

    def pushed(self, step: int) -> None:
        if self.measures_round(step):
            with self.lock:
                self.keys_per_step[step] = self.keys_per_step.get(step, 0) + 1

    def _mark(self, r: int, what: str, t: float) -> None:
        rec = self._round(r)
        rec[what] = t if rec[what] is None else max(rec[what], t)
        rec["n_" + what] += 1
        self._close(r)

    def started(self, r: int, t: float) -> None:
        with self.lock:
            self._mark(r, "start", t)

    def done(self, r: int, t: float) -> None:
        with self.lock:
            self._mark(r, "done", t)

    def grad_ready(self, step: int, t: float) -> None:
        with self.lock:
            if self.first is None or step < self.first[0]:
                self.first = (step, t)
            if self.last is None or step > self.last[0] or (step == self.last[0] and t > self.last[1]):
                self.last = (step, t)
            self._mark(step - self.lag, "grad", t)

    def _close(self, r: int) -> None:
        rec = self.rounds[r]
        n = self.keys_per_step.get(r)   # the same keys are pushed every step
        if not n or min(rec["n_start"], rec["n_done"], rec["n_grad"]) < n:
            return
        wait, length = max(0.0, rec["done"] - rec["grad"]), max(0.0, rec["done"] - rec["start"])
        self.wait_s += wait
        self.length_s += length
        self.closed.append((r, rec["start"], length, wait))
        self.measured += 1
        del self.rounds[r]
        self.keys_per_step.pop(r, None)

    def to_dict(self, iterations: int) -> dict:
        with self.lock:
            period = None
            if self.first and self.last and self.last[0] > self.first[0]:
                period = (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])
            mean_wait = self.wait_s / self.measured if self.measured else 0.0
            mean_len = self.length_s / self.measured if self.measured else 0.0
            overlap = 1.0 - self.wait_s / self.length_s if self.length_s > 0 else None
            rounds = sorted(self.closed)
            # a round's start to the next one's, where both were measured (every round, with
            # measure_every 1): the iteration as the allreduce sees it
            intervals = [b[1] - a[1] for a, b in zip(rounds, rounds[1:]) if b[0] == a[0] + 1]
            wait_total = mean_wait * iterations
            compute_total = max(0.0, (period or 0.0) * iterations - wait_total)
            return {"measured_rounds": self.measured, "measure_every": self.every,
                    "iteration_time_s": period,
                    "allreduce_time_s": mean_len, "allreduce_wait_s": mean_wait,
                    "allreduce_time_median_s": _median([x[2] for x in rounds]),
                    "allreduce_wait_median_s": _median([x[3] for x in rounds]),
                    "iteration_time_median_s": _median(intervals),
                    "overlap": None if overlap is None else min(1.0, max(0.0, overlap)),
                    "wait_time_s": wait_total, "compute_time_s": compute_total,
                    "wait_share": wait_total / (wait_total + compute_total)
                    if wait_total + compute_total > 0 else 0.0}


def _median(values):
    return statistics.median(values) if values else None
