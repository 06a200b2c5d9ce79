"""Dynamic stale synchronous parallel (DSSP): SSP whose bound adapts per worker in [s_L, s_U].

The fastest worker, once its lead passes ``s_L``, asks a controller how many
extra iterations ``r*`` to run before it waits: the one whose predicted push
time lands closest to a predicted push of the slowest worker, so that the
wait, when it comes, is short.  The extension is a lead bound
``e[p] = s_L + r*`` capped at ``s_U`` and dropped once the worker is back within
``s_L``, so no worker ever gets OK at a lead above ``s_U``.

``rule="published"`` runs Algorithm 1 as the paper writes it instead: r* is a count of
extra OKs (``r_p``), spent one per push whatever the lead, and a fastest worker that has
spent them asks the controller again, so its lead can pass ``s_U`` (by up to r_max + 1
per controller call).  The largest lead at an OK is reported either way.
"""
from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass

from .base import Decision
from .ssp import BoundedLeadPolicy, check_staleness


def dssp_extra_iterations(p_latest, p_previous, slow_latest, slow_previous, r_max) -> int:
    """The synchronisation controller (Algorithm 2): extra iterations r* in 0..r_max.

    Worker p's next pushes are predicted at ``p_latest + r*I_p`` (r = 0..r_max),
    the slowest worker's at ``slow_latest + (k+1)*I_s`` (k = 0..r_max), where
    ``I`` is each one's latest push interval.  r* is the r whose prediction is
    nearest to any of the slow worker's (ties: the smallest r).  With an
    unknown interval (fewer than two pushes, given as None) the answer is 0.
    """
    r_max = check_staleness("r_max", r_max)
    if None in (p_latest, p_previous, slow_latest, slow_previous) or r_max == 0:
        return 0
    interval_p = p_latest - p_previous
    interval_s = slow_latest - slow_previous
    slow_times = sorted(slow_latest + (k + 1) * interval_s for k in range(r_max + 1))
    best_r, best_gap = 0, None
    for r in range(r_max + 1):
        t = p_latest + r * interval_p
        i = bisect.bisect_left(slow_times, t)
        gap = min(abs(slow_times[j] - t) for j in (i - 1, i) if 0 <= j < len(slow_times))
        if best_gap is None or gap < best_gap:
            best_r, best_gap = r, gap
    return best_r


@dataclass(frozen=True)
class ControllerCall:
    """One decision of the controller, kept for the metrics."""

    time: float
    worker: int
    lead: int
    extra: int   # r*
    bound: int   # the lead bound it set, s_L + r*
    ok: bool     # whether the push got OK at once


class DSSPPolicy(BoundedLeadPolicy):
    """Apply every push on arrival; OK while the lead is within the worker's current bound.

    The bound is ``s_L`` or, for a worker holding an extension, ``e[p]``.  Finding
    the slowest and fastest workers is O(1) (:class:`ClockTable`); releases and
    extension drops are heap operations, O(log n) per push.
    """

    name = "dist_dssp"

    RULES = ("bounded", "published")

    def __init__(self, workers, staleness_lower: int, staleness_upper: int,
                 record: bool = False, rule: str = "bounded"):
        super().__init__(workers)
        if rule not in self.RULES:
            raise ValueError(f"DSSP rule must be one of {', '.join(self.RULES)}, got {rule!r}")
        self.rule = rule
        self.extra_oks: dict[int, int] = {}   # published rule: r_p, extra OKs left
        self.max_lead_at_ok = 0
        self.lower = check_staleness("staleness_lower", staleness_lower)
        self.upper = check_staleness("staleness_upper", staleness_upper)
        if self.upper < self.lower:
            raise ValueError(f"staleness_upper ({self.upper}) must be >= staleness_lower "
                             f"({self.lower})")
        self.push_times: dict[int, tuple[float | None, float | None]] = {
            w: (None, None) for w in self.clocks.clock}
        self.extension: dict[int, int] = {}   # worker -> lead bound e[p]
        self._expiry: list[tuple[int, int]] = []   # (min clock that ends it, worker)
        #: with ``record``: every controller decision, and every change of a worker's bound
        #: as (time, worker, bound); a server records them for one key only
        self.record = record
        self.calls: list[ControllerCall] = []
        self.bound_changes: list[tuple[float, int, int]] = []
        self.controller_calls = 0

    def bound(self, worker: int) -> int:
        """The lead up to which ``worker`` gets OK now."""
        return max(self.lower, self.extension.get(worker, self.lower))

    def on_push(self, worker: int, now: float) -> Decision:
        self._check_member(worker)
        clock = self.clocks.tick(worker)
        self.push_times[worker] = (now, self.push_times[worker][0])
        decision = Decision(apply=True)
        lead = self.clocks.lead(worker)
        if self.rule == "published":
            self._published_rule(worker, clock, lead, now, decision)
        else:
            self._on_min_raised(now)
            if lead > self.bound(worker) and clock == self.clocks.max:
                self._call_controller(worker, lead, now)
            if lead <= self.bound(worker):
                decision.released.append((worker, lead))
            else:
                self.room.add(worker, clock - self.bound(worker))
        self._release_ready(decision)
        for _, at in decision.released:
            self.max_lead_at_ok = max(self.max_lead_at_ok, at)
        return decision

    def _published_rule(self, worker: int, clock: int, lead: int, now: float,
                        decision: Decision) -> None:
        """Algorithm 1's server part, lines 3-17: spend an extra OK, or OK within s_L, or (the
        fastest only) ask the controller for r_p extra OKs; else wait until within s_L."""
        if self.extra_oks.get(worker, 0) > 0:
            self.extra_oks[worker] -= 1
            decision.released.append((worker, lead))
            return
        if lead <= self.lower:
            decision.released.append((worker, lead))
            return
        if clock == self.clocks.max:
            slow = self.clocks.slowest()
            extra = dssp_extra_iterations(*self.push_times[worker], *self.push_times[slow],
                                          self.upper - self.lower)
            self.extra_oks[worker] = extra
            self.controller_calls += 1
            if self.record:
                self.calls.append(ControllerCall(now, worker, lead, extra, lead + extra,
                                                 extra > 0))
            if extra > 0:
                decision.released.append((worker, lead))
                return
        self.room.add(worker, clock - self.lower)

    def _call_controller(self, worker: int, lead: int, now: float) -> None:
        slow = self.clocks.slowest()
        p_latest, p_previous = self.push_times[worker]
        s_latest, s_previous = self.push_times[slow]
        extra = dssp_extra_iterations(p_latest, p_previous, s_latest, s_previous,
                                      self.upper - self.lower)
        bound = self.lower + extra
        if extra > 0:
            if worker not in self.extension:
                # one expiry entry per extended worker: the min clock that brings it within s_L
                heapq.heappush(self._expiry, (self.clocks.clock[worker] - self.lower, worker))
            self.extension[worker] = bound
        else:
            self.extension.pop(worker, None)
        self.controller_calls += 1
        if self.record:
            self.calls.append(ControllerCall(now, worker, lead, extra, bound, lead <= bound))
            self.bound_changes.append((now, worker, bound))

    def _on_min_raised(self, now: float) -> None:
        """Drop the extension of every worker whose lead is back within s_L (heap order)."""
        while self._expiry and self._expiry[0][0] <= self.clocks.min:
            _, worker = heapq.heappop(self._expiry)
            if worker not in self.extension:
                continue
            lead = self.clocks.lead(worker)
            if lead <= self.lower:
                del self.extension[worker]
                if self.record:
                    self.bound_changes.append((now, worker, self.lower))
            else:   # it pushed on since: check again when the minimum catches up
                heapq.heappush(self._expiry, (self.clocks.clock[worker] - self.lower, worker))

    def add_worker(self, worker: int, now: float) -> Decision:
        decision = super().add_worker(worker, now)
        self.push_times[worker] = (None, None)
        return decision

    def _park(self, worker: int) -> None:
        """At a barrier: it comes back with no lead, so no extension either."""
        self.extension.pop(worker, None)
        self.extra_oks.pop(worker, None)

    def _forget(self, worker: int) -> None:
        self.extension.pop(worker, None)
        self.extra_oks.pop(worker, None)
        self.push_times.pop(worker, None)

    def report(self, wall_offset: float = 0.0) -> dict:
        """The controller's decisions and the bound changes (recorded ones, with ``record``)."""
        return {"dssp": {
            "staleness_lower": self.lower, "staleness_upper": self.upper, "rule": self.rule,
            "controller_calls": self.controller_calls, "max_lead_at_ok": self.max_lead_at_ok,
            "calls": [{"time": c.time + wall_offset, "worker": c.worker, "lead": c.lead,
                       "extra": c.extra, "bound": c.bound, "ok": c.ok} for c in self.calls],
            "bound_changes": [{"time": t + wall_offset, "worker": w, "bound": b}
                              for t, w, b in self.bound_changes],
        }}
