"""Asynchronous parallel: MXNet's ``dist_async``."""
from __future__ import annotations

from .base import Decision, SyncPolicy


class ASPPolicy(SyncPolicy):
    """Apply every push at once and OK it at once; leads are tracked only for metrics."""

    name = "dist_asp"
    joinable = True

    def on_push(self, worker: int, now: float) -> Decision:
        self._check_member(worker)
        self.clocks.tick(worker)
        return Decision(apply=True, released=[(worker, self.clocks.lead(worker))])

    def remove_worker(self, worker: int, now: float) -> Decision:
        if worker in self.clocks:
            self.clocks.remove(worker)
        return Decision()
