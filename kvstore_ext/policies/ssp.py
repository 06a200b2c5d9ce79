"""Stale synchronous parallel with a fixed bound ``s``."""
from __future__ import annotations

from .base import Decision, SyncPolicy, WaitingRoom


def check_staleness(name: str, value) -> int:
    """Validate a staleness parameter: a non-negative integer (named in the error)."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        elif isinstance(value, str) and value.strip().lstrip("+").isdigit():
            value = int(value)
        else:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value}")
    return value


class BoundedLeadPolicy(SyncPolicy):
    """What SSP and DSSP share: pushes apply on arrival, a worker over its bound waits in a room.

    Subclasses decide the bound in ``on_push``; a waiting worker is released when
    slower workers' pushes raise the minimum clock to its threshold.
    """

    joinable = True

    def __init__(self, workers):
        super().__init__(workers)
        self.room = WaitingRoom()

    def accepts_now(self, worker: int) -> bool:
        """A worker still waiting for OK is pushing ahead of its OK: hold that push back."""
        return worker not in self.room

    def remove_worker(self, worker: int, now: float) -> Decision:
        decision = Decision()
        if worker not in self.clocks:
            return decision
        self.clocks.remove(worker)
        self.room.discard(worker)
        self._forget(worker)
        if len(self.clocks):
            self._on_min_raised(now)
            self._release_ready(decision)
        return decision

    def _forget(self, worker: int) -> None:
        """Drop a departed worker's own state (none here)."""

    def _on_min_raised(self, now: float) -> None:
        """The minimum clock may have moved up (nothing to do here)."""

    def _release_ready(self, decision: Decision) -> None:
        for w in self.room.pop_ready(self.clocks.min):
            decision.released.append((w, self.clocks.lead(w)))


class SSPPolicy(BoundedLeadPolicy):
    """Apply every push on arrival; OK only while the pusher's lead is at most ``s``.

    A worker whose lead is above ``s`` waits until slower workers' pushes raise
    the minimum clock to ``t[p] - s``.  ``s = 0`` is not BSP: updates are still
    applied one push at a time.
    """

    name = "dist_ssp"

    def __init__(self, workers, staleness: int):
        super().__init__(workers)
        self.staleness = check_staleness("staleness", staleness)

    def on_push(self, worker: int, now: float) -> Decision:
        self._check_member(worker)
        clock = self.clocks.tick(worker)
        decision = Decision(apply=True)
        if self.clocks.lead(worker) <= self.staleness:
            decision.released.append((worker, self.clocks.lead(worker)))
        else:
            self.room.add(worker, clock - self.staleness)
        self._release_ready(decision)
        return decision
