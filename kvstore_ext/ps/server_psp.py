"""The server's side of ``dist_psp``: stamped pushes, versioned pulls, replies in parts.

Each block's rounds are decided by :class:`~kvstore_ext.policies.psp.PartialPushPolicy`; this
module moves the arrays.  A push item carries its stamp (the version of the block its gradient
was computed from); a pull item asks for the block at a version >= t.  A request is answered in parts: the blocks that are ready
go out together, the rest as their rounds close (or as the fault plan lets them go), so that a
worker can go on with a fraction b of them.  Every part lists the item indices it carries and
the blocks' versions; the worker knows how many it asked for.
"""
from __future__ import annotations

import operator
import time

from ..policies.psp import PartialPushPolicy, resolve_min_pushes
from .protocol import STAMP, WANTED, Op

STAMP_OF = operator.itemgetter(STAMP)


class WaitingPull:
    """A request whose items wait for their blocks to reach a version: a pull's are sent in
    parts as they do; a plain push (``with_values`` False) is answered once, when all have."""

    __slots__ = ("ident", "seq", "worker", "route", "min_versions", "unsent", "with_values")

    def __init__(self, ident, seq, worker, route, min_versions, with_values=True):
        self.ident, self.seq, self.worker = ident, seq, worker
        self.route, self.min_versions = route, min_versions
        self.unsent = set(range(len(route.slots)))
        self.with_values = with_values


class PartialSyncHandler:
    """Push, pull and timers of one server under ``dist_psp`` (the registry row's
    ``server_handler``: the server hands it push, pull and pushpull requests).  Blocks move
    in the server's groups: one policy per group, told once per push of the whole group."""

    metrics_name = "psp"

    def __init__(self, server):
        self.server = server
        self.waiting: list[WaitingPull] = []
        self.dropped_by_worker: dict[int, int] = {}
        try:
            self.min_pushes = resolve_min_pushes(server.store_params.get("min_pushes"),
                                                 server.num_workers)
        except ValueError as exc:   # the workers say so too; refuse every request
            self.min_pushes = server.num_workers
            server.fail(str(exc))

    def make_policy(self) -> PartialPushPolicy:
        """The policy of a new group, with c resolved against the job's workers."""
        return PartialPushPolicy.for_job(self.server.members, self.min_pushes,
                                         self.server.store_params)

    # -- requests ----------------------------------------------------------------------------
    def op_push(self, ident, header, buffers) -> None:
        """Sum (or drop) every pushed block; a pushpull then waits as a pull for version t+1.
        The blocks of a group told together carry one stamp (groups are split otherwise)."""
        server = self.server
        worker, items = header["worker"], header["items"]
        stamps = list(map(STAMP_OF, items))
        route, parts = server.check_push_items(
            worker, items, buffers, stamps if stamps.count(stamps[0]) < len(stamps) else None)
        now = time.monotonic()
        server.metrics.pushes_received += len(route.slots)
        outcomes = []
        for group, pick, first in parts:
            blocks, stamp = len(group.slots), int(stamps[first])
            group.fresh = False
            outcome = group.policy.on_push(worker, stamp, now)
            if outcome.dropped:   # late; it may still be the response that closes the round
                server.metrics.pushes_dropped += blocks
                self.dropped_by_worker[worker] = self.dropped_by_worker.get(worker, 0) + blocks
            else:
                group.gather(buffers if pick is None else pick(buffers))
                server.metrics.record_staleness(worker, group.version - stamp, blocks)
            outcomes.append((group, outcome))
        closed = self._closed(outcomes)
        # a pushpull waits as a pull; a plain push for the round it went into to close (at
        # once if it was dropped), so that the worker's next push of the block belongs to the
        # next round, as under BSP (see policies.psp.HeldVersions.pushed)
        self._wait(ident, header, worker, route, with_values=header["op"] == Op.PUSHPULL)
        self._apply(closed)

    def op_pull(self, ident, header, buffers) -> None:
        self._wait(ident, header, header["worker"], self.server.route(header["items"], "pulled"))

    def _wait(self, ident, header, worker, route, with_values=True) -> None:
        p = WaitingPull(ident, header["seq"], worker, route,
                        [int(i[WANTED]) for i in header["items"]], with_values)
        self.waiting.append(p)
        self._answer([p])

    # -- rounds ------------------------------------------------------------------------------
    def on_timer(self) -> None:
        now = time.monotonic()
        self._apply(self._closed((g, g.policy.on_timer(now)) for g in self.server.groups))

    def remove_worker(self, rank: int) -> None:
        now = time.monotonic()
        self.waiting = [p for p in self.waiting if p.worker != rank]
        for group in self.server.groups:
            group.fresh = False
        self._apply(self._closed((g, g.policy.remove_worker(rank, now))
                                 for g in self.server.groups))

    def _closed(self, outcomes) -> list:
        """The groups whose rounds closed; a timer for each round that now has a deadline."""
        closed = []
        for group, outcome in outcomes:
            if outcome.apply:
                closed.append(group)
            elif outcome.deadline is not None:
                self.server.at(outcome.deadline, self.on_timer)
        return closed

    def _apply(self, closed) -> None:
        """One optimizer call for the closed rounds, then every pull they complete."""
        if not closed:
            return
        self.server.apply(closed)
        self._answer(self.waiting)

    def _answer(self, pulls) -> None:
        """Send each waiting pull the blocks that have reached their versions."""
        still = []
        for p in pulls:
            slots = p.route.slots
            ready = [i for i in sorted(p.unsent) if slots[i].version >= p.min_versions[i]]
            if not p.with_values:
                if len(ready) == len(p.unsent):
                    p.unsent.clear()
                    self.server.reply(p.ident, p.seq, worker=p.worker)
                else:
                    still.append(p)
                continue
            if ready:
                p.unsent.difference_update(ready)
                self.server.send_part(p, ready)
            if p.unsent:
                still.append(p)
        if pulls is self.waiting:
            self.waiting = still
        else:
            done = {id(p) for p in pulls if not p.unsent}
            self.waiting = [p for p in self.waiting if id(p) not in done]

    def fail(self, message: str) -> None:
        for p in self.waiting:
            self.server.reply_error(p.ident, p.seq, message, p.worker)
        self.waiting = []

    def to_dict(self) -> dict:
        return {"dropped_by_worker": {str(w): n for w, n in sorted(self.dropped_by_worker.items())},
                "min_pushes": self.min_pushes,
                "versions": sorted({g.version for g in self.server.groups})[-1:]}

