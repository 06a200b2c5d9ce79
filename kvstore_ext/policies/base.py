"""What every synchronisation model answers, and the shared waiting-room logic.

A policy is a small pure object: it is told about events for one key (a push
from worker ``p`` at time ``now``, a worker leaving) and answers with a
:class:`Decision`: whether the server applies the gradients it has gathered,
and which workers get OK now.  It does no I/O and holds no arrays, so the
server, the unit tests and a simulator all drive the very same code.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterable

from .clocks import ClockTable


#: longest a server holds an asynchronous store's reply with weights (seconds) for the pushes
#: already queued behind the request: those are in the weights the worker reads.  The server's
#: event loop and the simulator both hold replies this long at most
MAX_REPLY_HOLD_S = 0.02


class PolicyError(ValueError):
    """A push the model cannot accept (for example twice in one BSP round)."""


@dataclass
class Decision:
    """The answer to one event.

    ``apply``: run the optimizer on the gradients gathered since the last apply.
    ``released``: ``(worker, lead)`` pairs: these workers get OK now, at that lead.
    """

    apply: bool = False
    released: list[tuple[int, int]] = field(default_factory=list)


class SyncPolicy:
    """Base class: keeps the clocks; subclasses decide apply and OK."""

    name = "base"

    def __init__(self, workers: Iterable[int]):
        self.clocks = ClockTable(workers)

    @property
    def workers(self) -> list[int]:
        return sorted(self.clocks.clock)

    def check_push(self, worker: int) -> str | None:
        """Why a push from ``worker`` cannot be taken now, or None; changes nothing.

        The server asks this for every key of a message before it applies any,
        so that a bad message changes no key at all.
        """
        if worker not in self.clocks:
            return (f"worker {worker} is not a live member of this job "
                    f"(members: {self.workers})")
        return None

    def accepts_now(self, worker: int) -> bool:
        """False when this push belongs to a later round: the server holds it back until then."""
        return True

    def on_push(self, worker: int, now: float) -> Decision:
        raise NotImplementedError

    def set_away(self, worker: int, away: bool, now: float) -> Decision:
        """``worker`` waits at a barrier (``away``), or is through it.  It pushes nothing
        meanwhile; the models that bound staleness keep counting it (its clock stays)."""
        return Decision()

    #: whether an OK lets every request of the worker that waits for one go (a pool's, which
    #: says the worker may compute now), not only the oldest (a bound's, which says it may
    #: take one more step)
    ok_answers_every_wait = False

    def remove_worker(self, worker: int, now: float) -> Decision:
        """A worker left the job: it must no longer hold the others back."""
        raise NotImplementedError

    #: whether a worker may join the running job (:meth:`add_worker`)
    joinable = False

    def add_worker(self, worker: int, now: float) -> Decision:
        """A worker joined the running job: it starts at the minimum clock (no lead)."""
        if not self.joinable:
            raise PolicyError(f"{self.name} does not take workers into a running job")
        self.clocks.add(worker)
        return Decision()

    def report(self, wall_offset: float = 0.0) -> dict:
        """What the model has to say in the server's metrics, by section name (none here).

        ``wall_offset`` turns the policy's times (the server's ``now``) into wall-clock times.
        """
        return {}

    def _check_member(self, worker: int) -> None:
        problem = self.check_push(worker)
        if problem:
            raise PolicyError(problem)


class WaitingRoom:
    """Workers waiting for OK, released once ``min clock >= threshold``.

    A heap keyed by threshold makes each release O(log n), whatever the
    number of workers; a stale entry (worker already released or gone) is
    skipped when it reaches the top.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, int]] = []
        self._ticket = 0
        self.waiting: dict[int, int] = {}  # worker -> how many pushes wait for OK

    def add(self, worker: int, threshold: int) -> None:
        self._ticket += 1
        heapq.heappush(self._heap, (threshold, self._ticket, worker))
        self.waiting[worker] = self.waiting.get(worker, 0) + 1

    def __contains__(self, worker: int) -> bool:
        return worker in self.waiting

    def pop_ready(self, min_clock: int) -> list[int]:
        """Workers whose threshold the minimum clock has reached, one per waiting push."""
        out = []
        while self._heap and self._heap[0][0] <= min_clock:
            _, _, worker = heapq.heappop(self._heap)
            if self._take(worker):
                out.append(worker)
        return out

    def discard(self, worker: int) -> None:
        self.waiting.pop(worker, None)

    def take_all(self) -> list[int]:
        """Everyone still waiting (for example when the job stops)."""
        out = []
        while self._heap:
            _, _, worker = heapq.heappop(self._heap)
            if self._take(worker):
                out.append(worker)
        return out

    def _take(self, worker: int) -> bool:
        n = self.waiting.get(worker, 0)
        if n == 0:
            return False
        if n == 1:
            del self.waiting[worker]
        else:
            self.waiting[worker] = n - 1
        return True
