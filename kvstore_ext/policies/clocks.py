"""Per-worker push clocks with O(1) amortised min, max, slowest and fastest.

Clocks only ever grow by one, and a worker can leave or join: the minimum moves up on a
tick or a removal (down only when a worker joins below it), the maximum down only on a
removal, so both are maintained by walking a step at a time instead of scanning all workers.
"""
from __future__ import annotations

from typing import Iterable


class ClockTable:
    """The clock ``t[i]`` (pushes accepted) of every live worker."""

    def __init__(self, workers: Iterable[int]):
        self.clock: dict[int, int] = {w: 0 for w in workers}
        if not self.clock:
            raise ValueError("a clock table needs at least one worker")
        self._at: dict[int, set[int]] = {0: set(self.clock)}
        self.min = 0
        self.max = 0

    def __contains__(self, worker: int) -> bool:
        return worker in self.clock

    def __len__(self) -> int:
        return len(self.clock)

    def tick(self, worker: int) -> int:
        """Count one push of ``worker``; return its new clock."""
        old = self.clock[worker]
        new = old + 1
        self._move(worker, old, new)
        self.clock[worker] = new
        if new > self.max:
            self.max = new
        self._raise_min()
        return new

    def add(self, worker: int, at: int | None = None) -> int:
        """A worker joins the running job at the minimum clock (it holds nobody back and is
        not ahead of anyone), or at clock ``at``; returns the clock it starts at."""
        if worker in self.clock:
            raise ValueError(f"worker {worker} is already a member")
        start = at if at is not None else self.min if self.clock else 0
        self.clock[worker] = start
        self._at.setdefault(start, set()).add(worker)
        if len(self.clock) == 1:
            self.min = self.max = start
        else:
            self.min, self.max = min(self.min, start), max(self.max, start)
        return start

    def remove(self, worker: int) -> None:
        """Forget a worker that left the job (its clock no longer holds others back)."""
        old = self.clock.pop(worker)
        bucket = self._at[old]
        bucket.discard(worker)
        if not bucket:
            del self._at[old]
        if not self.clock:
            return
        self._raise_min()
        while self.max not in self._at:
            self.max -= 1

    def lead(self, worker: int) -> int:
        return self.clock[worker] - self.min

    def slowest(self) -> int:
        """A worker whose clock is the minimum."""
        return next(iter(self._at[self.min]))

    def fastest(self) -> int:
        """A worker whose clock is the maximum."""
        return next(iter(self._at[self.max]))

    def _move(self, worker: int, old: int, new: int) -> None:
        bucket = self._at[old]
        bucket.discard(worker)
        if not bucket:
            del self._at[old]
        self._at.setdefault(new, set()).add(worker)

    def _raise_min(self) -> None:
        while self.min not in self._at:
            self.min += 1
