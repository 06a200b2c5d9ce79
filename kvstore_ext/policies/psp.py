"""Partial push and partial pull (PSP-SGD): the server's rounds per block, the worker's wait.

Server side (:class:`PartialPushPolicy`, one per block): the block is at version t.  A
gradient stamped t' < t (the version it was computed from) is late and dropped; any other is
summed.  The round closes (the sum of the d gradients goes through the optimizer once, which is the linear scaling
rule: d·η·mean = η·sum) when the gradients of c workers have arrived ("the first c of n
workers") and τ1 has passed since the c-th, or when every live worker has pushed (the paper's
"all workers have responded": when workers go on with part of the blocks, b < 1, a dropped
gradient is a response too; if fewer than c of the responses were fresh (fewer than the live
workers, for c = n), the round first waits as long again as it has lasted for fresh ones).  Each round waits for one
push of each worker, never for one it has already made: a worker's second push in a round is
summed (if its stamp allows) and answers the next round (see
:meth:`PartialPushPolicy.on_push`).  With c = n this is exactly a BSP round.

Worker side (:class:`PartialPull`): of the blocks it asked for at version >= t, it goes on once a
fraction b has arrived and τ2 has passed since then, or when all have; the others keep their
previous values.  With b = 1 it waits for all, as BSP does.  :class:`HeldVersions` keeps the
version of each block the worker holds, which its next gradient for that block is stamped with.

Both are pure: the server, the worker, the tests and the simulator drive the same objects.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable


def resolve_min_pushes(value, num_workers: int) -> int:
    """c as a count: an integer 1..n, or a fraction of n in (0, 1] (rounded up); None means n.

    ``7`` is seven workers, ``0.875`` (and ``1.0``) a fraction of them.
    """
    if value is None:
        return num_workers
    check_psp_params({"min_pushes": value})
    if isinstance(value, float) and value <= 1:
        return max(1, math.ceil(value * num_workers - 1e-9))
    if not int(value) <= num_workers:
        raise ValueError(f"min_pushes={value!r} must be between 1 and the number of workers "
                         f"({num_workers})")
    return int(value)


def check_psp_params(params: dict) -> dict:
    """Validate what can be checked without the number of workers; c is resolved per job."""
    c = params.get("min_pushes")
    if c is not None:
        if isinstance(c, bool) or not isinstance(c, (int, float)):
            raise ValueError(f"min_pushes must be a count of workers (>= 1) or a fraction of them "
                             f"in (0, 1], got {c!r}")
        if isinstance(c, int) and c < 1:
            raise ValueError(f"min_pushes={c!r} must be >= 1 (or a fraction of the workers in (0, 1])")
        if isinstance(c, float) and (c <= 0 or (c > 1 and not c.is_integer())):
            raise ValueError(f"min_pushes={c!r}: give a count of workers (an integer >= 1) or a "
                             f"fraction of them in (0, 1]")
    b = params.get("min_pull_fraction", 1.0)
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 < b <= 1:
        raise ValueError(f"min_pull_fraction must be in (0, 1], got {b!r}")
    out = {"min_pushes": c, "min_pull_fraction": float(b)}
    for name in ("push_timeout", "pull_timeout"):
        t = params.get(name, 0.0)
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0 or math.isinf(t):
            raise ValueError(f"{name} must be a number of seconds >= 0, got {t!r}")
        out[name] = float(t)
    return out


@dataclass
class PushOutcome:
    """What the server does with one pushed block.

    ``dropped``: the stamp was older than the block's version; nothing summed.
    ``apply``: the round is over: apply the sum of ``summed`` gradients now (the version has moved on).
    ``deadline``: the round closes then at the latest: τ1 after the c-th push, or the grace for
    fresh gradients of a round answered in part late (b < 1; :meth:`PartialPushPolicy.on_push`).
    """

    dropped: bool = False
    apply: bool = False
    summed: int = 0
    deadline: float | None = None


class PartialPushPolicy:
    """One block's rounds: version t, stale stamps dropped, closed after c pushes and τ1."""

    name = "dist_psp"

    def __init__(self, workers: Iterable[int], min_pushes: int, push_timeout: float = 0.0,
                 late_answers: bool = True):
        self.members = set(workers)
        if not 1 <= min_pushes <= max(1, len(self.members)):
            raise ValueError(f"min_pushes={min_pushes} must be between 1 and the number of "
                             f"workers ({len(self.members)})")
        self.min_pushes = min_pushes
        self.push_timeout = push_timeout
        #: whether a late (dropped) gradient answers the round: the workers go on with part
        #: of the blocks (b < 1); see :meth:`on_push`
        self.late_answers = late_answers
        self.version = 0
        self.summed = 0                  # d: gradients summed in this round
        self.summers: set[int] = set()   # the workers they came from (c counts these)
        self.owed: dict[int, int] = {}   # worker -> its pushes no round has counted yet
        self.deadline: float | None = None
        self.opened: float | None = None  # when this round began (the last one closed)
        self.dropped = 0
        self.dropped_by_worker: dict[int, int] = {}

    @classmethod
    def for_job(cls, workers: Iterable[int], min_pushes: int, params: dict) -> "PartialPushPolicy":
        """One block's policy for a job's checked parameters (:func:`check_psp_params`), c
        already resolved: what the servers and the simulator both build."""
        return cls(workers, min_pushes, params["push_timeout"],
                   late_answers=params["min_pull_fraction"] < 1)

    def check_push(self, worker: int) -> str | None:
        if worker not in self.members:
            return f"worker {worker} is not a live member of this job (members: {sorted(self.members)})"
        return None

    def on_push(self, worker: int, stamp: int, now: float) -> PushOutcome:
        """Sum the gradient (or drop it, if late) and close the round if it is due.

        Every push is one response, late or not; a round counts one per worker, and c counts
        workers, not gradients.  All three matter when workers go on with part of the blocks
        (b < 1), and so push some blocks late or twice into one round.  A round of c = n that
        waited for a worker whose gradient had been dropped, or for one that had pushed twice
        into it, waited for that worker's next push of the block, which could wait for the
        other worker's next push of another block: the job hung (4 runs in 16 with a slow
        server at b = 0.5).  A round whose c gradients came from fewer workers closed without
        a slow one, and later rounds of the block waited for a push the fast one could not
        make yet (``tests/unit/test_psp_liveness.py``).  Counted this way, with c = n, round r
        closes once every live worker has pushed the block r + 1 times (as BSP's rounds do),
        so the worker that has pushed least is never kept waiting.

        With b = 1 (``late_answers`` False) a late gradient answers nothing: its worker missed
        the round it is stamped with (c < n closed it first), the drop's reply brings it this
        version, and its next gradient is fresh.  Counted as an answer, the late one closed
        rounds before the fresh ones came, whose workers were late in turn: push:7 of 8
        dropped 4.8 gradients a round where 1 is due, and trained to 6.4% error against 3.1%.

        With b < 1 the same happened, and late answers cannot go (the job hangs without them):
        the worker left out of a round answers the next one late and then again with its fresh
        gradient, so later rounds had its answer before its gradient.  So at b < 1 a round that
        every live worker has answered, but with fewer fresh gradients than c (or than the
        workers, for c = n), waits for them as long again as it has lasted (its ``deadline``),
        and closes at the c-th fresh gradient or then.  The fresh gradient of a worker that
        answered late is about an iteration away, about what a round lasts (push:7 of 8 at
        b = 0.9 dropped 1,165 gradients in 31 iterations where 434 are due; now 434)."""
        if self.opened is None:
            self.opened = now
        if stamp < self.version:
            self.dropped += 1
            self.dropped_by_worker[worker] = self.dropped_by_worker.get(worker, 0) + 1
            if self.late_answers:
                self.owed[worker] = self.owed.get(worker, 0) + 1
            outcome = self._close_if_due(now)
            outcome.dropped = True
            return outcome
        self.owed[worker] = self.owed.get(worker, 0) + 1
        self.summed += 1
        started_wait = worker not in self.summers and len(self.summers) + 1 == self.min_pushes
        self.summers.add(worker)
        if started_wait:
            self.deadline = now + self.push_timeout
        outcome = self._close_if_due(now)
        if started_wait and not outcome.apply:
            outcome.deadline = self.deadline
        return outcome

    def on_timer(self, now: float) -> PushOutcome:
        """The server's clock reached :attr:`deadline` (or any time: nothing happens early)."""
        return self._close_if_due(now)

    def remove_worker(self, worker: int, now: float) -> PushOutcome:
        """A departed worker no longer counts among those every round may wait for."""
        self.members.discard(worker)
        self.owed.pop(worker, None)
        return self._close_if_due(now)

    def report(self, wall_offset: float = 0.0) -> dict:
        """Nothing beyond the server's own counts (dropped pushes are there)."""
        return {}

    def _close_if_due(self, now: float) -> PushOutcome:
        """Close the round if c workers' pushes were summed τ1 ago, or if every live worker has
        responded and something was summed (after the grace, at b < 1, if fewer were fresh).

        When every response was late, nobody waits for the round (a late push's reply wants a
        version the block has), and it waits for fresh gradients: the grace starts at the
        first.  It used to start again, waiting for one more push of each worker; an answer
        consumed without a round could leave the round waiting for a push its worker would
        make only after another block's round, which waited for the first worker (the
        liveness search found it once a worker had left: 3 workers, c = 2, b = 0.34).
        Closing it on the first fresh push instead dropped the other workers' gradients of that
        version (87% of pushes dropped in place of 50%, a block's replies 1.5 iterations late)."""
        everyone = self.members <= self.owed.keys()   # owed holds counts > 0 only
        if everyone and self.summed == 0:
            return PushOutcome()
        timed_out = self.deadline is not None and now >= self.deadline
        if not (everyone or timed_out):
            return PushOutcome()
        if (self.late_answers and not timed_out
                and len(self.summers) < min(self.min_pushes, len(self.members))):
            if self.deadline is None:   # some answers were late: grace for fresh ones
                self.deadline = now + (now - self.opened)
                return PushOutcome(deadline=self.deadline)
            return PushOutcome()
        summed = self.summed
        self.version += 1
        self.summed, self.summers, self.deadline, self.opened = 0, set(), None, now
        self._count_one_push_each()
        return PushOutcome(apply=True, summed=summed)

    def _count_one_push_each(self) -> None:
        """The round that ends has counted one push of each worker that had one."""
        self.owed = {w: n - 1 for w, n in self.owed.items() if n > 1}


class PartialPull:
    """A worker's wait for the blocks of one pull: fraction b, then τ2 more, or all of them."""

    def __init__(self, total: int, fraction: float = 1.0, linger: float = 0.0):
        self.total = total
        self.needed = min(total, max(1, math.ceil(fraction * total - 1e-9))) if total else 0
        self.linger = linger
        self.reached_at: float | None = None

    def done(self, arrived: int, now: float) -> bool:
        if arrived >= self.total:
            return True
        if arrived >= self.needed:
            if self.reached_at is None:
                self.reached_at = now
            return now >= self.reached_at + self.linger
        return False

    def wake_at(self) -> float | None:
        """When to look again without news: τ2 after the fraction was reached."""
        return None if self.reached_at is None else self.reached_at + self.linger


class HeldVersions:
    """A worker's stamps: the version of each block whose value it holds, never going back.

    A pushed block is stamped with the version of the block its gradient was computed from.  A
    worker learns a block's version from the replies that bring the block, and those replies can
    complete in a different order than the calls were made: stock ``gluon.Trainer``'s first step
    broadcasts each key (a pull that wants version >= 0) and then pushpulls the gradient it has
    already computed (wants version >= 1).  If a part of the pull is late, the pull completes
    after the pushpull, with version 0.  The weights still end up at version 1 (MXNet's engine
    writes an array in call order), and the server is at version 1 too.  Recording the late 0 would
    stamp the next gradient 0, and the server would drop it as stale: with c = n and b = 1 that
    breaks the equality with BSP (and the worker falls a round behind on that block).  So a
    version older than the one held is ignored.  Every version recorded came from a server, so a
    stamp is never ahead of the server's version either.

    A plain push (``kv.push``, no pull after it) is answered once the round it went into has
    closed: the worker's next gradient of the block belongs to the next round, as under BSP,
    though no weights came back (``dist_bsp`` puts each of a worker's pushes made without a pull
    between them in a round of its own).  :meth:`pushed` records that round, and the stamp is
    the later of the two.
    """

    def __init__(self):
        self._held: dict = {}     # block -> newest version received
        self._pushed: dict = {}   # block -> the round after the one its last plain push closed
        self.ignored = 0          # versions that arrived older than the one held

    def stamp(self, block) -> int:
        """The version to stamp the block's next gradient with (0 before any reply)."""
        held = self._held.get(block, 0)
        pushed = self._pushed.get(block)
        return held if pushed is None or pushed < held else pushed

    def held(self, block) -> int | None:
        """The newest version of the block's value received (None: none yet)."""
        return self._held.get(block)

    def pushed(self, block, stamp: int) -> None:
        """A plain push of ``block`` stamped ``stamp`` was answered: the round it went into (or
        a later one, if it was dropped) has closed."""
        if self._pushed.get(block, -1) < stamp + 1:
            self._pushed[block] = stamp + 1

    def arrived(self, block, version: int) -> bool:
        """A reply brought ``block`` at ``version``; False (and ignored) if older than held."""
        held = self._held.get(block)
        if held is not None and version < held:
            self.ignored += 1
            return False
        self._held[block] = version
        return True
