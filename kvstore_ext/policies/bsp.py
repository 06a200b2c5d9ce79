"""Bulk synchronous parallel: MXNet's ``dist_sync``."""
from __future__ import annotations

from .base import Decision, PolicyError, SyncPolicy


class BSPPolicy(SyncPolicy):
    """Gather one push of the key from every live worker, apply once, release all."""

    name = "dist_bsp"

    def __init__(self, workers):
        super().__init__(workers)
        self.pushed: list[int] = []   # live workers that pushed in the current round
        self.gathered = 0             # pushes in the current round, a departed worker's included

    def accepts_now(self, worker: int) -> bool:
        """A worker that already pushed in this round is pushing for the next one."""
        return worker not in self.pushed

    def on_push(self, worker: int, now: float) -> Decision:
        self._check_member(worker)
        if worker in self.pushed:
            raise PolicyError(f"worker {worker} pushed twice in one synchronous round "
                              f"(round {self.clocks.clock[worker]}); hold the push back until "
                              f"the round is over")
        self.clocks.tick(worker)
        self.pushed.append(worker)
        self.gathered += 1
        return self._close_round_if_complete()

    def remove_worker(self, worker: int, now: float) -> Decision:
        """A departed worker's gathered gradient stays in the round's sum."""
        if worker not in self.clocks:
            return Decision()
        self.clocks.remove(worker)
        if worker in self.pushed:
            self.pushed.remove(worker)
        return self._close_round_if_complete()

    def _close_round_if_complete(self) -> Decision:
        if self.gathered == 0 or len(self.pushed) < len(self.clocks):
            return Decision()
        released = [(w, 0) for w in self.pushed]
        self.pushed = []
        self.gathered = 0
        return Decision(apply=True, released=released)
