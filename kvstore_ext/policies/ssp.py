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
        self.parked: dict[int, int] = {}   # worker at a barrier -> its clock
        self.through_at: int | None = None  # the clock workers come back at from a barrier

    def accepts_now(self, worker: int) -> bool:
        """A worker still waiting for OK is pushing ahead of its OK: hold that push back."""
        return worker not in self.room

    def check_push(self, worker: int) -> str | None:
        if worker in self.parked:
            return f"worker {worker} pushed while it waits at a barrier"
        return super().check_push(worker)

    def set_away(self, worker: int, away: bool, now: float) -> Decision:
        """A worker at a barrier pushes nothing until every worker is there, so a bound on
        the others' lead over it would hold a faster one for a push that cannot come (with
        uneven iteration counts, the job hung): its clock leaves the minimum meanwhile.
        Through the barrier, every worker has pushed all it will before it, so each comes
        back at the highest clock any had at the barrier, behind nobody; a worker back
        sooner and pushing on meanwhile is bounded again from that clock."""
        decision = Decision()
        if away:
            if worker in self.clocks and worker not in self.room:
                self.parked[worker] = self.clocks.clock[worker]
                self._park(worker)
                self._leave_minimum(worker, now, decision)
        elif worker in self.parked:
            clock = self.parked.pop(worker)
            if self.through_at is None:   # the first back: every worker was at the barrier
                self.through_at = max(clock, self.clocks.max if len(self.clocks) else clock,
                                      *self.parked.values())
            self.clocks.add(worker, at=max(clock, self.through_at))
            if not self.parked:
                self.through_at = None
        return decision

    def remove_worker(self, worker: int, now: float) -> Decision:
        decision = Decision()
        if self.parked.pop(worker, None) is not None:
            self._forget(worker)
        elif worker in self.clocks:
            self._forget(worker)
            self._leave_minimum(worker, now, decision)
        return decision

    def _leave_minimum(self, worker: int, now: float, decision: Decision) -> None:
        """Take ``worker``'s clock out of the table and let go whoever that lets go."""
        self.clocks.remove(worker)
        self.room.discard(worker)
        if len(self.clocks):
            self._on_min_raised(now)
            self._release_ready(decision)

    def _forget(self, worker: int) -> None:
        """Drop a departed worker's own state (none here)."""

    def _park(self, worker: int) -> None:
        """Drop what a worker at a barrier will not need when it comes back (nothing here)."""

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
