"""Adaptable Asynchrony: how many workers train at once, and the batch size and learning rate
that go with that number.

The dissertation behind it (``adaptable-asynchrony-delay-tolerant-adaptive-sgd``, section 2.5
and chapter 4.3) trains asynchronously with a pool of ``w`` active workers that changes during
training: *progressive* (start with ``w0 = 2``, double every ``E`` epochs up to the maximum),
*dynamic* (every ``K`` updates, ``U{1..8}`` workers join or leave, within ``[min, max]``) or
*scripted* (given sizes at given points).  With every change, ``d = w - w0`` tunes

- ``l``:  the learning rate, ``lr = lr0 * exp(-k d)``;
- ``b``:  the batch size, ``B = floor(B0 * exp(k d))``;
- ``aa``: both (Adaptable Asynchrony proper);
- ``m``:  the explicit momentum, so that explicit + implicit (``1 - 1/w``) stays as it started.

Progress is counted in samples applied (each push brings the batch its worker was told to
use), so a run's budget is ``epochs * epoch_samples`` however the batch size moves.

:class:`WorkerPool` is pure: the pool size is a function of the pushes applied, the schedule
and the seed, never of the clock, so two runs (and every server of one run) follow the same
trajectory.  :class:`PoolPolicy` is the synchronisation model a server runs for a key with it:
every push is applied on arrival (as ``dist_asp``); a worker is let go only while it is one of
the ``w`` lowest live ranks (first-come admission could let different servers admit different
workers and deadlock), so at most ``w`` workers compute at any time.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from .base import Decision, SyncPolicy

MODES = ("fixed", "progressive", "dynamic", "scripted")
TUNINGS = ("none", "l", "b", "aa", "m")


def implicit_momentum(workers: int) -> float:
    """The momentum asynchrony itself adds with ``workers`` workers (Mitliagkas et al.)."""
    return 1.0 - 1.0 / workers


def _number(params: dict, name: str, default, kind=float, low=None):
    value = params.get(name, default)
    try:
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        value = kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be {'an integer' if kind is int else 'a number'}, "
                         f"got {params.get(name)!r}") from None
    if low is not None and not value >= low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


def parse_schedule(text) -> tuple[tuple[float, int], ...]:
    """``"0:2,1.5:4,3:8"`` (epoch:workers, epochs increasing) -> ((0.0, 2), (1.5, 4), (3.0, 8))."""
    if isinstance(text, (list, tuple)):
        pairs = [tuple(p) for p in text]
    else:
        pairs = []
        for part in str(text).split(","):
            if part.strip():
                head, sep, tail = part.partition(":")
                if not sep:
                    raise ValueError(f"pool_schedule: {part.strip()!r} is not EPOCH:WORKERS")
                pairs.append((head, tail))
    out = []
    for epoch, workers in pairs:
        try:
            epoch, workers = float(epoch), int(workers)
        except ValueError:
            raise ValueError(f"pool_schedule: {epoch}:{workers} is not EPOCH:WORKERS with "
                             f"numbers") from None
        if epoch < 0 or workers < 1:
            raise ValueError(f"pool_schedule: {epoch}:{workers} needs an epoch >= 0 and at "
                             f"least 1 worker")
        if out and epoch <= out[-1][0]:
            raise ValueError(f"pool_schedule: epochs must increase, got {out[-1][0]} then {epoch}")
        out.append((epoch, workers))
    if not out:
        raise ValueError("pool_schedule: a scripted pool needs at least one EPOCH:WORKERS")
    return tuple(out)


@dataclass(frozen=True)
class PoolConfig:
    """A pool's schedule and tuning, checked; every error names the parameter and its value.

    ``every``: epochs between doublings (progressive) or updates between changes (dynamic).
    ``max_workers`` 0 means every worker of the job.
    """

    mode: str = "progressive"
    start: int = 2
    min_workers: int = 2
    max_workers: int = 0
    every: float = 1.0
    schedule: tuple = ()
    seed: int = 0
    tune: str = "none"
    k: float = 0.075
    batch_size: int = 128
    epoch_samples: int = 6400
    epochs: float = 0.0        # budget; 0: no end

    PARAMS = ("pool", "pool_start", "pool_min", "pool_max", "pool_every", "pool_schedule",
              "pool_seed", "tune", "tune_k", "batch_size", "epoch_samples", "epochs")

    @classmethod
    def from_params(cls, params: dict) -> "PoolConfig":
        mode = params.get("pool", "progressive")
        if mode not in MODES:
            raise ValueError(f"pool must be one of {', '.join(MODES)}, got {mode!r}")
        tune = params.get("tune", "none")
        if tune not in TUNINGS:
            raise ValueError(f"tune must be one of {', '.join(TUNINGS)} (l: learning rate, b: "
                             f"batch size, aa: both, m: momentum), got {tune!r}")
        start = _number(params, "pool_start", 2, int, 1)
        low = _number(params, "pool_min", min(2, start), int, 1)
        high = _number(params, "pool_max", 0, int, 0)
        if high and high < low:
            raise ValueError(f"pool_max must be >= pool_min, got pool_min={low}, pool_max={high}")
        if not low <= start <= (high or start):
            raise ValueError(f"pool_start must be within [pool_min, pool_max], got "
                             f"pool_start={start} (pool_min={low}, pool_max={high or 'all'})")
        every = _number(params, "pool_every", 1.0 if mode == "progressive" else 100, float, 0)
        if mode in ("progressive", "dynamic") and every <= 0:
            raise ValueError(f"pool_every must be > 0 for a {mode} pool, got {every}")
        schedule = parse_schedule(params["pool_schedule"]) if mode == "scripted" else ()
        if mode == "scripted" and schedule[0][0] != 0:
            schedule = ((0.0, start), *schedule)
        return cls(mode=mode, start=start, min_workers=low, max_workers=high, every=every,
                   schedule=schedule, seed=_number(params, "pool_seed", 0, int),
                   tune=tune, k=_number(params, "tune_k", 0.075, float, 0),
                   batch_size=_number(params, "batch_size", 128, int, 1),
                   epoch_samples=_number(params, "epoch_samples", 6400, int, 1),
                   epochs=_number(params, "epochs", 0.0, float, 0))

    def to_params(self) -> dict:
        out = {"pool": self.mode, "pool_start": self.start, "pool_min": self.min_workers,
               "pool_max": self.max_workers, "pool_every": self.every, "pool_seed": self.seed,
               "tune": self.tune, "tune_k": self.k, "batch_size": self.batch_size,
               "epoch_samples": self.epoch_samples, "epochs": self.epochs}
        if self.schedule:
            out["pool_schedule"] = ",".join(f"{e:g}:{w}" for e, w in self.schedule)
        return out


@dataclass
class PoolChange:
    """One point of the trajectory: after ``updates`` pushes and ``samples`` samples applied,
    the pool asked for ``wanted`` workers and got ``workers`` (less when the growth was sent
    back: the budget had less than one round of the bigger pool left)."""

    updates: int
    samples: int
    wanted: int
    workers: int
    batch_size: int
    lr_scale: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class WorkerPool:
    """How many workers train now, as a pure function of the pushes applied, schedule, seed."""

    config: PoolConfig
    job_workers: int
    size: int = 0
    updates: int = 0
    samples: int = 0
    history: list[PoolChange] = field(default_factory=list)

    def __post_init__(self):
        if self.job_workers < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {self.job_workers}")
        self.max = min(self.config.max_workers or self.job_workers, self.job_workers)
        self.min = min(self.config.min_workers, self.max)
        self.size = max(self.min, min(self.config.start, self.max))
        self._rng = random.Random(self.config.seed)
        self._next_change = 1   # index of the next change point
        self.history.append(PoolChange(0, 0, self.size, self.size, self.batch_size(),
                                       self.lr_scale()))

    # -- what the pool's size means for the hyper-parameters -------------------------------
    @property
    def difference(self) -> int:
        return self.size - self.config.start

    def batch_size(self, size: int | None = None) -> int:
        d = (self.size if size is None else size) - self.config.start
        if self.config.tune in ("b", "aa"):
            return max(1, math.floor(self.config.batch_size * math.exp(self.config.k * d)))
        return self.config.batch_size

    def lr_scale(self) -> float:
        if self.config.tune in ("l", "aa"):
            return math.exp(-self.config.k * self.difference)
        return 1.0

    def momentum(self, momentum0: float) -> float:
        """The explicit momentum that keeps explicit + implicit at its starting total."""
        if self.config.tune != "m":
            return momentum0
        return momentum0 + implicit_momentum(self.config.start) - implicit_momentum(self.size)

    @property
    def budget(self) -> int | None:
        return round(self.config.epochs * self.config.epoch_samples) if self.config.epochs \
            else None

    @property
    def done(self) -> bool:
        return self.budget is not None and self.samples >= self.budget

    def add_worker(self) -> None:
        """One more worker in the job: the pool's maximum follows, unless ``pool_max`` is set."""
        self.job_workers += 1
        if not self.config.max_workers:
            self.max = self.job_workers

    def active(self, live) -> list[int]:
        """The workers that may compute now: the ``size`` lowest live ranks."""
        return sorted(live)[:self.size]

    # -- progress ----------------------------------------------------------------------------
    def advance(self, samples: int) -> bool:
        """One push of ``samples`` samples was applied; True when the pool size changed."""
        self.updates += 1
        self.samples += samples
        changed = False
        while self._due():
            wanted = self._wanted()
            self._next_change += 1
            got = wanted
            if wanted > self.size and self.budget is not None and \
                    self.budget - self.samples < wanted * self.batch_size(wanted):
                got = self.size   # sent back: not one round of the bigger pool is left
            if got != self.size:
                changed = True
            self.size = got
            self.history.append(PoolChange(self.updates, self.samples, wanted, got,
                                           self.batch_size(), self.lr_scale()))
        return changed

    def _due(self) -> bool:
        c, j = self.config, self._next_change
        if c.mode == "progressive":
            return self.samples >= j * c.every * c.epoch_samples
        if c.mode == "dynamic":
            return self.updates >= j * c.every
        if c.mode == "scripted":
            return j < len(c.schedule) and \
                self.samples >= c.schedule[j][0] * c.epoch_samples
        return False

    def _wanted(self) -> int:
        c = self.config
        if c.mode == "progressive":
            return min(self.max, self.size * 2)
        if c.mode == "scripted":
            return max(self.min, min(self.max, c.schedule[self._next_change][1]))
        join = self._rng.randint(0, 1)          # dynamic: a coin, then U{1..8} workers
        count = self._rng.randint(1, 8)
        return max(self.min, min(self.max, self.size + count if join else self.size - count))

    def trajectory(self) -> list[tuple[int, int]]:
        """``(updates, workers)`` at every change point so far."""
        return [(h.updates, h.workers) for h in self.history]


class PoolPolicy(SyncPolicy):
    """Apply every push on arrival; OK a worker only while it is in the pool's active set.

    The batch size a worker was told with its OK is what its next push brings, so the pool's
    progress is counted in samples without the push carrying it.  A worker outside the active
    set waits (its push is applied); it is let go when the pool grows to include it, when a
    lower rank leaves, or when the budget is spent (its batch size is then 0: stop).
    """

    name = "dist_pool"

    def __init__(self, workers, config: PoolConfig):
        super().__init__(workers)
        self.pool = WorkerPool(config, len(self.clocks))
        self.assigned = {w: config.batch_size for w in self.clocks.clock}
        # workers outside the first pool wait for their first OK (a server holds their first
        # pull until then), so no more than w compute from the start
        self.parked: set[int] = set(self.clocks.clock) - set(self.pool.active(self.clocks.clock))
        #: workers waiting at a barrier: they compute nothing, so they leave their place in
        #: the pool to the next ranks until they are through (see :meth:`set_away`)
        self.away: set[int] = set()

    def _candidates(self) -> list[int]:
        return [w for w in self.clocks.clock if w not in self.away]

    def is_active(self, worker: int) -> bool:
        return worker in self.pool.active(self._candidates())

    def next_batch(self, worker: int) -> int:
        """The batch size ``worker`` is told with its OK (0 once the budget is spent)."""
        return 0 if self.pool.done else self.assigned.get(worker, self.pool.batch_size())

    def on_push(self, worker: int, now: float) -> Decision:
        self._check_member(worker)
        self.clocks.tick(worker)
        self.pool.advance(self.assigned[worker])
        decision = Decision(apply=True)
        self.parked.add(worker)
        self._release(decision)
        return decision

    joinable = True
    #: a worker taken into the pool computes: every request it made while it waited is
    #: answered (raw ``pushpull`` calls made back to back, each one's push applied while it
    #: waited, left all but the oldest waiting for ever)
    ok_answers_every_wait = True

    def add_worker(self, worker: int, now: float) -> Decision:
        """A worker joins: it waits at its first pull until it is one of the pool's lowest
        ranks (a pool without ``pool_max`` may now grow to it)."""
        decision = super().add_worker(worker, now)
        self.pool.add_worker()
        self.assigned[worker] = self.pool.batch_size()
        self.parked.add(worker)
        self._release(decision)
        return decision

    def set_away(self, worker: int, away: bool, now: float) -> Decision:
        """A worker at a barrier computes nothing: the next ranks take its place in the pool
        meanwhile, so that a worker kept outside can reach the barrier too (otherwise the
        pool's workers waited there for it, and it waited for them to push, for ever).  Back
        through it, the worker is one of the pool's ranks again; a worker let in meanwhile
        finishes its batch, as when the pool shrinks."""
        decision = Decision()
        if worker not in self.clocks:
            return decision
        if away:
            self.away.add(worker)
            self._release(decision)
        else:
            self.away.discard(worker)
        return decision

    def remove_worker(self, worker: int, now: float) -> Decision:
        decision = Decision()
        if worker in self.clocks:
            self.clocks.remove(worker)
            self.parked.discard(worker)
            self.away.discard(worker)
            self.assigned.pop(worker, None)
            if len(self.clocks):
                self._release(decision)
        return decision

    def _release(self, decision: Decision) -> None:
        go = self.parked if self.pool.done else \
            self.parked & set(self.pool.active(self._candidates()))
        for w in sorted(go):
            self.parked.discard(w)
            self.assigned[w] = self.pool.batch_size()
            decision.released.append((w, self.clocks.lead(w)))

    def report(self, wall_offset: float = 0.0) -> dict:
        return {"pool": {"config": self.pool.config.to_params(), "workers": self.pool.size,
                         "updates": self.pool.updates, "samples": self.pool.samples,
                         "history": [h.to_dict() for h in self.pool.history]}}
