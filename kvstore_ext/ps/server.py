"""A parameter server: holds blocks of keys, runs MXNet's optimizer, answers pushes and pulls.

One thread, one event loop: requests are handled in arrival order, so no
locks are needed.  What a push means (apply now or at the end of a round,
who gets OK and when) is decided by the key's synchronisation policy
(:mod:`kvstore_ext.policies`); this module only moves arrays and replies.
Run as ``python -m kvstore_ext.ps.server`` inside a job (launch.py does it).
"""
from __future__ import annotations

import copy
import heapq
import itertools
import logging
import operator
import os
import pickle
import sys
import time
from collections import deque

import numpy as np
import zmq

from .. import jobenv, registry
from ..errors import KVStoreError
from .faults import FaultPlan
from .heap import keep_freed_buffers
from ..metrics import ServerMetrics, write_json
from ..policies.base import MAX_REPLY_HOLD_S

from . import rendezvous, shm
from .protocol import BLOCK, DTYPE, INIT_SIZE, KEY, SHAPE, SIZE, Op, check_request
from .transport import (HANDSHAKE_FAILED, AuthError, Codec, HandshakeGuard, Limits, Packed,
                        array_from_buffer, bind_random, configure, destroy, disconnected,
                        monitor_events, new_context, recv_message)

log = logging.getLogger("kvstore_ext.server")

mx = None  # imported in main(), after the engine is chosen
SYNCHRONOUS_ENGINE = False


#: a group's run of adjacent blocks smaller than this on average (bytes) is summed from one
#: joined copy of its pushed arrays: one addition instead of one per block
JOIN_BELOW_BYTES = 1 << 16
#: distinct item lists a server remembers the resolution of (:class:`Route`)
MAX_ROUTES = 4096
#: what identifies a request item's block and its checks (a pushed block's stamp is not part)
ITEM_BLOCK = operator.itemgetter(KEY, BLOCK, DTYPE, SIZE)
NBYTES = operator.attrgetter("nbytes")


class RequestError(Exception):
    """A request this server refuses; the message goes back to the worker that sent it."""


#: stores of one worker a server remembers as having sent the optimizer (a bound on memory)
MAX_STORES_PER_WORKER = 64
#: pushes of one worker a server holds for later rounds; their bytes are bounded by twice the
#: job's window (``KVX_WINDOW_MB``): an honest worker's own window keeps it below both, so
#: only a peer that ignores it is refused, before it fills the server's memory
MAX_HELD_PUSHES = 65_536
#: blocks that workers other than worker 0 may declare before its values make them (each
#: costs the server a few hundred bytes while it waits)
MAX_DECLARED_BLOCKS = 100_000


def nbytes(arrays) -> int:
    return sum(memoryview(a).nbytes for a in arrays)


class RoundFailed(Exception):
    """An update failed part-way (a bad optimizer, or one of MXNet's that fails on its own
    states): the weights it touched are in no known state, so the server has stopped the
    job (:meth:`Server.fail`) and told every waiting worker; nothing more to answer."""


class Slot:
    """One block of one key: where its weights and gradient live (views into the flat storage
    of its dtype, :class:`~kvstore_ext.optimizers.FlatArrays` of
    :func:`~kvstore_ext.optimizers.home_dtype`), and its
    :class:`Group`.  ``dtype`` is the key's: what is pushed and pulled."""

    __slots__ = ("key", "block", "shape", "dtype", "size", "home", "offset", "place", "weight",
                 "grad", "acc", "group")

    def __init__(self, key, block, shape, dtype, size: int, home, offset: int, place: int):
        self.key, self.block, self.shape, self.dtype = key, block, tuple(shape), np.dtype(dtype)
        self.size, self.home, self.offset = size, home, offset
        self.place = (place, offset)   # storage order: the home's rank, then the offset
        self.group: Group | None = None
        self.bind()

    def bind(self) -> None:
        """Take the views of the block's arrays (again, once its storage has moved)."""
        end = self.offset + self.size
        self.weight = self.home.view("weight", self.offset, end)
        self.grad = self.home.view("grad", self.offset, end)
        self.acc = self.home.numpy("grad")[self.offset:end]   # gradients are summed here

    @property
    def version(self) -> int:
        return self.group.version

    def report(self, wall_offset: float = 0.0) -> dict:
        """What the policy deciding for this block reports (the metrics' decision log)."""
        return self.group.policy.report(wall_offset)


def storage_runs(slots) -> list[list[Slot]]:
    """``slots``, in their order, cut wherever a block does not follow the one before it in
    storage: each part is one slice of one flat array."""
    runs: list[list[Slot]] = []
    for slot in slots:
        last = runs[-1][-1] if runs else None
        if last is not None and last.home is slot.home and last.offset + last.size == slot.offset:
            runs[-1].append(slot)
        else:
            runs.append([slot])
    return runs


def add_into(acc: np.ndarray, grad: np.ndarray, first: bool) -> None:
    """Sum ``grad`` into ``acc``; the first gradient of a round is copied."""
    if first:
        np.copyto(acc, grad)
    else:
        np.add(acc, grad, out=acc)


class Group:
    """Blocks that have seen the same events, so that one policy object decides for all of
    them.  A push of a whole group is one policy call, one sum per run of adjacent blocks and
    one optimizer call, whatever the number of keys.

    The blocks a worker initialises together start in one group (the policies of per-key
    models would see the same pushes in the same order).  When a request names only some of a
    group's blocks, :meth:`Server.split` parts it: the named blocks get a copy of everything
    (policy, waiting requests, held pushes, counts), so each part goes on exactly as the
    per-block policies would.
    """

    __slots__ = ("policy", "slots", "runs", "waiting", "held", "gathered", "version", "pulled",
                 "fresh")

    def __init__(self, policy):
        self.policy = policy
        self.slots: list[Slot] = []
        self.runs: list = []   # (optimizers.Run, its slots, summed from one joined copy?)
        self.waiting: dict[int, deque] = {}   # worker -> its pushes waiting for OK
        self.held: deque = deque()   # pushes for a later round: (worker, arrays, pending)
        self.gathered = 0            # pushes summed since the last update
        self.version = 0             # updates applied
        self.pulled: dict[int, int] = {}   # worker -> the version it was last sent
        self.fresh = True            # no event has reached the policy yet

    def open_to_new_blocks(self) -> bool:
        """Whether a block initialised now starts exactly where this group stands."""
        return self.fresh and not self.waiting and not self.held

    def hold(self, slots) -> None:
        """Make ``slots`` this group's blocks, in storage order."""
        from ..optimizers import Run
        self.slots = sorted(slots, key=operator.attrgetter("place"))
        self.runs = []
        for run in storage_runs(self.slots):
            bounds = [s.offset for s in run] + [run[-1].offset + run[-1].size]
            joined = len(run) > 1 and \
                (bounds[-1] - bounds[0]) * run[0].dtype.itemsize < JOIN_BELOW_BYTES * len(run)
            self.runs.append((Run(run[0].home, [s.key for s in run], bounds), run, joined))
        for slot in self.slots:
            slot.group = self

    def holds_push_of(self, worker: int) -> bool:
        return any(h[0] == worker for h in self.held)

    def gather(self, arrays) -> None:
        """Sum one push of the group's blocks (``arrays``: their buffers, in the group's order)
        into their gradients."""
        first, i = self.gathered == 0, 0
        for run, slots, joined in self.runs:
            n = len(slots)
            if joined:
                home = run.home
                add_into(home.numpy("grad")[run.bounds[0]:run.bounds[-1]],
                         np.frombuffer(b"".join(arrays[i:i + n]), dtype=slots[0].dtype), first)
            else:
                for slot, buf in zip(slots, arrays[i:i + n]):
                    add_into(slot.acc, np.frombuffer(buf, dtype=slot.dtype), first)
            i += n
        self.gathered += 1


class Route:
    """What one list of request items resolves to, kept per distinct list so that a request
    like an earlier one costs no look-up per item: its slots (checked against the items), the
    bytes each item must bring, its runs of adjacent blocks for the replies, and, while no
    group changes, the groups that cover it (:meth:`Server.route_parts`)."""

    __slots__ = ("slots", "nbytes", "replies", "parts", "epoch")

    def __init__(self, slots):
        self.slots = slots
        self.nbytes = [s.size * s.dtype.itemsize for s in slots]
        self.replies = reply_runs(slots)
        self.parts: list = []
        self.epoch = -1


def reply_runs(slots) -> list[tuple]:
    """How to copy the weights of ``slots`` for a reply: per run of adjacent blocks, its
    storage, where it begins and ends, each block's place in the copy, and the keys' dtype
    (one per storage, :attr:`Server.homes`)."""
    out = []
    for run in storage_runs(slots):
        start = run[0].offset
        out.append((run[0].home, start, run[-1].offset + run[-1].size,
                    [(s.offset - start, s.offset - start + s.size) for s in run], run[0].dtype))
    return out


def snapshot(runs) -> list[np.ndarray]:
    """Copies of the weights ``runs`` (from :func:`reply_runs`) describe, in the keys' dtype
    (rounded to nearest, as MXNet's cast rounds), one copy per run: a reply may leave after
    the weights have changed again."""
    values = []
    for home, start, stop, cuts, dtype in runs:
        taken = home.numpy("weight")[start:stop].astype(dtype)
        values.extend(taken[a:b] for a, b in cuts)
    return values


def picker(positions: list[int], count: int):
    """What takes the arrays at ``positions`` out of a request's ``count`` arrays: None when
    that is all of them in order."""
    if positions == list(range(count)):
        return None
    if len(positions) == 1:
        (i,) = positions
        return lambda arrays: (arrays[i],)
    return operator.itemgetter(*positions)


class Pending:
    """A request that waits for OK from some of its groups."""

    __slots__ = ("ident", "seq", "worker", "route", "outstanding", "with_values", "extra")

    def __init__(self, ident, seq, worker, route: Route, with_values, outstanding: int = 0):
        self.ident, self.seq, self.worker = ident, seq, worker
        self.route, self.outstanding, self.with_values = route, outstanding, with_values
        self.extra = None   # what the reply tells the worker besides OK (a pool's batch size)


class InitWait:
    """An init request waiting for the other workers (or for worker 0's values)."""

    __slots__ = ("ident", "seq", "worker", "blocks", "deadline", "order")

    def __init__(self, ident, seq, worker, blocks, deadline, order=()):
        self.ident, self.seq, self.worker = ident, seq, worker
        self.blocks, self.deadline = blocks, deadline
        self.order = order     # the request's blocks, in item order: the reply's versions


class Server:
    def __init__(self, env: jobenv.JobEnv, start_timeout: float = 600.0):
        self.env = env
        self.limits = Limits.for_job(env)
        self.node = f"node:{os.urandom(6).hex()}"
        self.codec = Codec(env.secret, names={self.node},
                           max_frame_bytes=self.limits.max_frame_bytes)
        self.router_out, self.router_in = self.codec.outbox(), self.codec.inbox()
        self.sched_out, self.sched_in = self.codec.outbox(), self.codec.inbox()
        self.malformed = 0
        #: who shares this host's memory has the same token (None: no shared-memory lanes)
        self.host_token = shm.host_token()
        self.ctx = new_context()
        self.guard = HandshakeGuard(self.ctx, self.limits)
        self.router = configure(self.ctx.socket(zmq.ROUTER), self.limits)
        self.router_monitor = self.router.get_monitor_socket(HANDSHAKE_FAILED)
        self.port = bind_random(self.router, env.node_host)
        self.sched = configure(self.ctx.socket(zmq.DEALER), self.limits)
        # the scheduler's connection closing means it is gone: ZeroMQ tells at once (and at
        # the start, that it refused this server)
        self.sched_monitor = self.sched.get_monitor_socket(rendezvous.EVENTS)
        self.sched.connect(env.scheduler_address)
        self.slots: dict[tuple, Slot] = {}
        self.homes: dict = {}   # key dtype -> FlatArrays holding its blocks (of home_dtype)
        self.groups: list[Group] = []
        self.group_epoch = 0             # rises whenever groups change (routes re-check)
        self.routes: dict[tuple, Route] = {}
        self.last_values: tuple = (None, None)   # ((route, epoch, versions), weights copied)
        self.valid_items: dict = {}   # (worker, op) -> items of its last well-formed request
        self.init_waiting: list[InitWait] = []
        self.held_of: dict[int, list] = {}   # worker -> [count, bytes] of its held pushes
        self.init_seen: dict[tuple, set] = {}   # (key, block) -> workers that initialised it
        #: (key, block) -> (shape, dtype, worker) of its first init; worker None when that
        #: init brought the values (worker 0's), else the worker whose declaration binds
        self.init_declared: dict[tuple, tuple] = {}
        self.optimizer = None   # the ServerOptimizer the workers set
        self.pooled = False   # dist_pool: a worker pool decides who computes (set at start)
        self.joined: set[int] = set()   # workers that joined the running job
        self.optimizer_blob: bytes | None = None
        #: worker -> the stores of it that sent the optimizer in use (:meth:`op_set_optimizer`)
        self.optimizer_senders: dict[int, set] = {}
        self.failure: str | None = None
        self.failure_kind = "error"
        self.running = True
        self.ops = {Op.INIT: self.op_init, Op.PUSH: self.op_push, Op.PUSHPULL: self.op_push,
                    Op.PULL: self.op_pull, Op.SET_OPTIMIZER: self.op_set_optimizer,
                    Op.SET_LR: self.op_set_lr,
                    Op.GET_STATES: self.op_get_states, Op.SET_STATES: self.op_set_states,
                    Op.STATS: self.op_stats, Op.HELLO: self.op_hello, Op.AWAY: self.op_away}
        self.timers: list = []            # (due, n, callback): round deadlines, late replies
        self.value_replies: list = []     # Pending requests answered at the end of the pass
        self.value_replies_since = 0.0
        self._timer_ids = itertools.count()
        self._register()
        self.metrics = ServerMetrics(self.rank)
        self.faults = FaultPlan.from_env(self.rank)
        # a store type whose rounds are not a per-key SyncPolicy brings its own request
        # handler (dist_psp: stamped pushes, versioned pulls, replies in parts)
        self.row = registry.lookup(self.store_type)
        self.pooled = self.row.pooled
        self.handler = None
        if self.row.server_handler:
            self.handler = registry.load(self.row.server_handler)(self)
            self.ops.update({Op.PUSH: self.handler.op_push, Op.PUSHPULL: self.handler.op_push,
                             Op.PULL: self.handler.op_pull})

    # -- rendezvous --------------------------------------------------------------------------
    def _register(self) -> None:
        registration = self.codec.seal(
            {"op": Op.REGISTER, "role": "server", "host": self.env.node_host, "port": self.port,
             "node": self.node, "shm": self.host_token}, to="scheduler", outbox=self.sched_out)
        try:
            header = rendezvous.join(self.sched, self.sched_in, registration,
                                     self.sched_monitor, self.env, "server")
        except KVStoreError:
            self.guard.stop()   # its thread uses the context's sockets
            destroy(self.ctx)
            raise
        self.rank = header["rank"]
        self.codec.names.add(f"server:{self.rank}")
        self.num_workers = header["num_workers"]
        self.members = set(range(self.num_workers))
        store = header["store"]
        self.store_type, self.store_params = store["type"], store["params"]
        self.on_worker_death = header["on_worker_death"]
        self.last_ack = time.monotonic()
        log.info("server %d serving %s on %s:%d", self.rank, self.store_type,
                 self.env.node_host, self.port)

    # -- replies -----------------------------------------------------------------------------
    def send_to(self, ident, worker: int, header: dict, buffers=()) -> None:
        """Seal and send now (sealing at the moment of sending keeps each session's counters
        in order, also for replies the fault plan holds back)."""
        frames = self.codec.seal(header, buffers, to=f"worker:{worker}", outbox=self.router_out)
        self.router.send_multipart([ident, *frames], copy=False)

    def reply(self, ident, seq, extra=None, buffers=(), *, worker: int) -> None:
        header = {"op": Op.REPLY, "seq": seq, "ok": True}
        if extra:
            header.update(extra)
        self.send_to(ident, worker, header, buffers)

    def reply_error(self, ident, seq, message: str, worker: int) -> None:
        self.metrics.errors += 1
        kind = self.failure_kind if self.failure is not None and message == self.failure \
            else "error"
        self.send_to(ident, worker, {"op": Op.REPLY, "seq": seq, "ok": False, "error": message,
                                     "kind": kind})

    def reply_values(self, p: Pending) -> None:
        """Answer with weights once the messages already queued are handled (at the end of
        this pass of the event loop): a push that arrived meanwhile is then in the reply.
        MXNet's workers get the same from a pull sent after the push; replying at once
        gave every asynchronous gradient about one more update of staleness.  Synchronous
        stores answer at once: nothing can change their weights before the next round."""
        if not self.row.asynchronous:   # a synchronous round's weights stay as they are
            self._send_values(p)
            return
        if not self.value_replies:
            self.value_replies_since = time.monotonic()
        self.value_replies.append(p)

    def send_value_replies(self) -> None:
        replies, self.value_replies = self.value_replies, []
        for p in replies:
            self._send_values(p)

    def _send_values(self, p: Pending) -> None:
        values = self.values(p.route)
        self.sent_weights(self.route_parts(p.route), p.worker)
        # one reply carries every block: it is as late as its latest block
        late = max(self._lateness(len(values)), default=0.0)
        self._send_later(p, {"op": Op.REPLY, "seq": p.seq, "ok": True, **(p.extra or {})},
                         values, late)

    def values(self, route: Route) -> Packed:
        """The weights of a route's blocks as they are now, copied one run of adjacent blocks
        at a time and cut into frames.  The last copy serves the replies that follow it (the
        replies of one round come one after another) until one of its groups changes; only
        one is kept, so the copies held are bounded by what is in flight."""
        parts = self.route_parts(route)
        at = (route, self.group_epoch, [group.version for group, _, _ in parts])
        if self.last_values[0] != at:
            self.last_values = (at, self.codec.packed(snapshot(route.replies)))
        return self.last_values[1]

    def send_part(self, p, indices) -> None:
        """Some blocks of a partial pull (``dist_psp``), with their versions; a block the fault
        plan delays goes in a later part of its own.  The worker counts the blocks it has."""
        by_lateness: dict[float, list[int]] = {}
        for i, late in zip(indices, self._lateness(len(indices))):
            by_lateness.setdefault(late, []).append(i)
        for late, chosen in by_lateness.items():
            if len(chosen) == len(p.route.slots):   # all of it: the route's copies serve
                values, parts = self.values(p.route), self.route_parts(p.route)
            else:
                slots = [p.route.slots[i] for i in chosen]
                values, parts = snapshot(reply_runs(slots)), self.parts(slots)
            self.sent_weights(parts, p.worker)
            header = {"op": Op.REPLY, "seq": p.seq, "ok": True, "part": chosen,
                      "versions": [p.route.slots[i].version for i in chosen]}
            self._send_later(p, header, values, late)

    def _lateness(self, blocks: int) -> list[float]:
        """Seconds the fault plan holds back each of ``blocks`` block replies (0: on time)."""
        if not self.faults.active:
            return [0.0] * blocks
        return [self.faults.delay() for _ in range(blocks)]

    def _send_later(self, p, header, values, late: float) -> None:
        if late > 0:   # the loop serves others meanwhile (a cached value is replaced, not changed)
            self.at(time.monotonic() + late,
                    lambda: self.send_to(p.ident, p.worker, header, values))
        else:
            self.send_to(p.ident, p.worker, header, values)

    def at(self, due: float, callback) -> None:
        """Run ``callback`` from the event loop once the monotonic clock reaches ``due``."""
        heapq.heappush(self.timers, (due, next(self._timer_ids), callback))

    def _run_timers(self) -> float:
        """Run the due timers; return seconds until the next one (or a long time)."""
        while self.timers and self.timers[0][0] <= time.monotonic():
            _, _, callback = heapq.heappop(self.timers)
            try:
                callback()
            except RoundFailed:
                pass              # told to every waiting worker; later requests get it too
        return self.timers[0][0] - time.monotonic() if self.timers else 3600.0

    # -- main loop ---------------------------------------------------------------------------
    def run(self) -> int:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.sched, zmq.POLLIN)
        poller.register(self.sched_monitor, zmq.POLLIN)
        poller.register(self.router_monitor, zmq.POLLIN)
        scheduler_lost_at = None
        while self.running:
            until_timer = self._run_timers()
            events = dict(poller.poll(max(0, min(500, int(until_timer * 1000) + 1))))
            if self.router in events:
                for _ in range(256):
                    if self.value_replies and \
                            time.monotonic() - self.value_replies_since > MAX_REPLY_HOLD_S:
                        break
                    try:
                        frames = recv_message(self.router, self.limits.max_frames)
                    except zmq.Again:
                        break
                    except AuthError as exc:
                        self.codec.rejected[exc.reason] += 1
                        if exc.reason == "unauthenticated":
                            self.metrics.rejected_unauthenticated += 1
                        if self.codec.worth_logging(exc):
                            log.warning("server %d rejected a message: %s", self.rank, exc)
                        continue
                    self.handle(frames)
            if self.sched in events:
                while self.running:
                    try:
                        frames = self.sched.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self.handle_scheduler(frames)
            self.send_value_replies()
            if self.router_monitor in events:
                self.count_refused_handshakes()
            if self.running and scheduler_lost_at is None and self.sched_monitor in events \
                    and disconnected(self.sched_monitor):
                log.error("server %d: the scheduler at %s closed its connection; stopping",
                          self.rank, self.env.scheduler_address)
                self.fail(kind="scheduler_lost", message=f"the scheduler at "
                          f"{self.env.scheduler_address} is gone (its "
                          f"connection closed); the job stops")
                scheduler_lost_at = time.monotonic()
            # the workers' own connections to a frozen scheduler time out about when this
            # one did, some a little later: until theirs have, every request is answered
            # with the scheduler's loss, so that no worker blames this server's exit
            if scheduler_lost_at is not None and \
                    time.monotonic() - scheduler_lost_at > self.env.heartbeat_timeout:
                self.finish()
                return 1
        self.finish()
        return 0

    def count_refused_handshakes(self) -> None:
        for event in monitor_events(self.router_monitor):
            self.guard.note(event)

    def finish(self) -> None:
        if self.env.metrics_dir:
            write_json(self.env.metrics_dir, f"server-{self.rank}.json", self.stats())
        self.guard.stop()
        destroy(self.ctx)
        self.codec.close()

    def handle(self, frames) -> None:
        """One request: authenticated, checked against the schema, then served.  Nothing
        a message holds can stop the loop: a bad one is refused, counted and answered."""
        ident, rest = frames[0].bytes, frames[1:]
        try:
            header, buffers = self.codec.open(rest, self.router_in)
        except AuthError as exc:
            if exc.reason == "unauthenticated":
                self.metrics.rejected_unauthenticated += 1
            if self.codec.worth_logging(exc):
                log.warning("server %d rejected a message: %s (%d so far)", self.rank, exc,
                            self.codec.rejected[exc.reason])
            return
        try:
            check_request(header, self.num_workers, self.valid_items)
        except Exception as exc:
            self.malformed += 1
            if self.malformed <= 5 or self.malformed % 1000 == 0:
                log.warning("server %d refused a malformed request (%d so far): %s", self.rank,
                            self.malformed, exc)
            seq, worker, reply_to = header.get("seq"), header.get("worker"), header.get("reply_to")
            if type(seq) is int and type(worker) is int and 0 <= worker < self.num_workers \
                    and isinstance(reply_to, str):   # a worker's request that it can be told of
                self.reply_error(reply_to.encode(), seq,
                                 f"server {self.rank}: malformed request: {exc}", worker)
            return
        seq, worker = header["seq"], header["worker"]
        self.metrics.messages += 1
        # workers send on one socket and receive on another (their receiver thread's)
        ident = header["reply_to"].encode()
        try:
            if self.failure:
                self.reply_error(ident, seq, self.failure, worker)
                return
            self.ops[header["op"]](ident, header, buffers)
        except RequestError as exc:
            self.reply_error(ident, seq, str(exc), worker)
        except RoundFailed:
            pass                  # every waiting worker, this one included, has been told
        except Exception as exc:  # a bug: tell the worker, keep serving
            log.exception("server %d failed on %s", self.rank, header.get("op"))
            self.reply_error(ident, seq, f"server {self.rank}: {type(exc).__name__}: {exc}",
                             worker)

    def handle_scheduler(self, frames) -> None:
        try:
            header, _ = self.sched_in.open(frames)
        except AuthError:
            return
        try:
            self.scheduler_notice(header)
        except RoundFailed:
            pass
        except Exception as exc:
            self.malformed += 1
            log.warning("server %d: malformed notice from the scheduler: %s", self.rank, exc)

    def scheduler_notice(self, header: dict) -> None:
        op = header.get("op")
        if op == Op.NODE_DEAD and header["role"] == "worker":
            rank, reason = header["rank"], header["reason"]
            if self.on_worker_death == "fail":
                self.fail(kind="worker_lost", message=f"worker {rank} died ({reason}); the job stops "
                          f"(on-worker-death=fail)")
            else:
                log.warning("server %d: worker %d died (%s); continuing without it",
                            self.rank, rank, reason)
                self.remove_worker(rank)
        elif op == Op.NODE_LEFT and header["role"] == "worker":
            self.remove_worker(header["rank"])
        elif op == Op.NODE_JOINED and header["role"] == "worker":
            self.add_worker(header["rank"])
        elif op == Op.ABORT:
            self.fail(str(header["error"]), kind="aborted")
        elif op == Op.SHUTDOWN:
            self.running = False

    def fail(self, message: str, kind: str = "error") -> None:
        """Answer every waiting request with the failure, and every later one too.

        ``kind`` tells the workers which exception to raise (see ``link.ERROR_KINDS``)."""
        self.failure, self.failure_kind = message, kind
        for group in self.groups:
            pending = [p for queue in group.waiting.values() for p in queue]
            pending += [p for _, _, p in group.held]
            for p in pending:
                if p.outstanding > 0:
                    p.outstanding = 0
                    self.reply_error(p.ident, p.seq, message, p.worker)
            group.waiting.clear()
            group.held.clear()
        self.held_of.clear()
        for w in self.init_waiting:
            self.reply_error(w.ident, w.seq, message, w.worker)
        self.init_waiting = []
        if self.handler is not None:
            self.handler.fail(message)

    def add_worker(self, rank: int) -> None:
        """A worker joined the running job (the scheduler allows it for the stores whose
        policies take one): it gets a fresh rank and starts at the minimum clock; its init
        of keys that exist returns at once, and its first pull brings the current weights."""
        if type(rank) is not int or rank < self.num_workers or rank in self.members:
            raise ValueError(f"worker {rank!r} cannot join: ranks below {self.num_workers} "
                             f"are taken")
        self.num_workers = rank + 1
        self.members.add(rank)
        self.joined.add(rank)
        now = time.monotonic()
        decisions = []
        for group in self.groups:
            group.fresh = False
            decisions.append((group, group.policy.add_worker(rank, now)))
        log.info("server %d: worker %d joined the job", self.rank, rank)
        self.carry_out(decisions)

    def remove_worker(self, rank: int) -> None:
        if rank not in self.members:
            return
        self.members.discard(rank)
        self.release_inits()
        if self.handler is not None:
            self.handler.remove_worker(rank)
            return
        now = time.monotonic()
        decisions = []
        for group in self.groups:
            group.waiting.pop(rank, None)
            group.held = deque(h for h in group.held if h[0] != rank)
        self.held_of.pop(rank, None)
        for group in self.groups:
            group.fresh = False
            decisions.append((group, group.policy.remove_worker(rank, now)))
        if self.optimizer is not None:   # what the optimizer kept for the worker goes with it
            self.optimizer.forget(rank)
        self.carry_out(decisions)

    # -- operations --------------------------------------------------------------------------
    def _slot(self, item) -> Slot:
        key, block = item[KEY], item[BLOCK]
        slot = self.slots.get((key, block))
        if slot is None:
            raise RequestError(f"key {key!r} has not been initialised on the kvstore "
                               f"(call kv.init or kv.broadcast for it first)")
        return slot

    def _check_block(self, slot: Slot, dtype: str, size: int, what: str) -> None:
        if size == slot.size and dtype == slot.dtype.str:
            return
        if np.dtype(dtype) != slot.dtype:
            raise RequestError(f"{what} key {slot.key!r} as {np.dtype(dtype).name}, but it holds "
                               f"{slot.dtype.name} (shape {slot.shape})")
        if size != slot.size:
            raise RequestError(f"{what} {size} elements for key {slot.key!r} block {slot.block}, "
                               f"but it holds {slot.size} (key shape {slot.shape})")

    def op_init(self, ident, header, buffers) -> None:
        """Create keys from worker 0's values.  As in MXNet (whose init ends in a barrier),
        an init returns once every live worker has initialised its keys: no worker trains
        while another is still starting, which would make its first gradients many updates
        stale."""
        items = header["items"]
        worker = header["worker"]
        has_value = header.get("has_value", False) is True
        if has_value and len(buffers) != len(items):
            raise RequestError("init: one buffer per key expected")
        declared = []
        for item in items:
            key, block, shape = item[KEY], item[BLOCK], tuple(item[SHAPE])
            dtype = np.dtype(item[DTYPE])       # a numeric dtype (protocol.check_item)
            # every block is declared here before its slot is made; a worker without the values
            # (not worker 0) may come first, and what it declared binds the others as a value
            known = self.init_declared.get((key, block))
            if known is not None and (known[0] != shape or known[1] != dtype):
                by = "" if known[2] is None or known[2] == worker else f" by worker {known[2]}"
                raise RequestError(
                    f"key {key!r} is already initialised{by} with shape {known[0]} "
                    f"{known[1].name}; cannot initialise it again with shape {shape} "
                    f"{dtype.name}")
            declared.append(((key, block), (shape, dtype, None if has_value else worker)))
        self.check_init_load(worker, has_value, declared)
        for block, what in declared:
            self.init_declared.setdefault(block, what)
        if has_value:
            for item, buf in zip(items, buffers):
                key, block, dtype = item[KEY], item[BLOCK], item[DTYPE]
                shape, size = tuple(item[SHAPE]), item[INIT_SIZE]
                if (key, block) not in self.slots:
                    try:
                        value = array_from_buffer(buf, dtype, (size,))
                    except ValueError as exc:
                        raise RequestError(f"init: key {key!r}: {exc}") from None
                    self.slots[(key, block)] = self.new_slot(key, block, shape, value)
        blocks = {(i[KEY], i[BLOCK]) for i in items}
        for block in blocks:
            self.init_seen.setdefault(block, set()).add(worker)
        waiter = InitWait(ident, header["seq"], worker, blocks,
                          time.monotonic() + self.env.start_timeout,
                          [(i[KEY], i[BLOCK]) for i in items])
        self.init_waiting.append(waiter)
        self.at(waiter.deadline, lambda: self.expire_init(waiter))
        self.release_inits()

    def check_init_load(self, worker: int, has_value: bool, declared) -> None:
        """Refuse an init that would keep more waiting than honest workers can: one init per
        store of a worker (a store's init waits for its reply), and at most
        :data:`MAX_DECLARED_BLOCKS` blocks declared without their values."""
        waiting = sum(1 for w in self.init_waiting if w.worker == worker)
        if waiting >= MAX_STORES_PER_WORKER:
            raise RequestError(f"init: worker {worker} has {waiting} inits waiting on this "
                               f"server, the most it may have (one per store)")
        if has_value:
            return
        new = sum(1 for block, _ in declared if block not in self.init_declared)
        without_values = len(self.init_declared) - len(self.slots)
        if new and without_values + new > MAX_DECLARED_BLOCKS:
            raise RequestError(f"init: worker {worker} declares {new} more blocks, but "
                               f"{without_values} already wait for worker 0's values (at most "
                               f"{MAX_DECLARED_BLOCKS})")

    def new_slot(self, key, block, shape, value: np.ndarray) -> Slot:
        """A block holding ``value``, placed after the others of its dtype in their flat
        storage.  It joins the group of the blocks initialised before it while nothing has
        happened to that group (a new policy would start exactly where it stands), else it
        starts a group with a new policy."""
        from ..optimizers import FlatArrays, home_dtype
        home = self.homes.get(value.dtype)
        if home is None:
            home = self.homes[value.dtype] = FlatArrays(home_dtype(value.dtype))
        moves = home.generation
        offset = home.add(value.size)
        if home.generation != moves:   # the storage moved: its blocks take new views
            for other in self.slots.values():
                if other.home is home:
                    other.bind()
        slot = Slot(key, block, shape, value.dtype, value.size, home, offset,
                    list(self.homes).index(value.dtype))
        home.numpy("weight")[offset:offset + value.size] = value
        group = self.groups[-1] if self.groups and self.groups[-1].open_to_new_blocks() \
            else None
        if group is None:
            # all keys move together: the first group's policy logs the decisions
            record = self.metrics.decision_log is None
            group = Group(self.handler.make_policy() if self.handler is not None else
                          self.row.make_policy(self.members, self.store_params, record))
            self.groups.append(group)
        group.hold(group.slots + [slot])
        self.group_epoch += 1
        if self.metrics.decision_log is None:
            self.metrics.decision_log = (key, block, slot)
        return slot

    def release_inits(self) -> None:
        """Answer the inits whose keys exist and every live worker has initialised; refuse
        those whose values can no longer come (worker 0 is gone)."""
        still = []
        for w in self.init_waiting:
            blocks = [b for b in w.blocks if b not in self.slots or
                      not self.members <= self.init_seen.get(b, set())]
            if not blocks:
                # each block's version: a store made later in a running job (a Trainer made
                # again) stamps its first dist_psp gradients with it, not with 0
                self.reply(w.ident, w.seq, {"versions": [self.slots[b].version for b in w.order]},
                           worker=w.worker)
            elif 0 not in self.members and any(b not in self.slots for b in blocks):
                key = next(b for b in blocks if b not in self.slots)[0]
                self.reply_error(w.ident, w.seq, f"worker 0, which gives the initial values, "
                                 f"left the job before initialising key {key!r}", w.worker)
            else:
                w.blocks = set(blocks)
                still.append(w)
        self.init_waiting = still

    def expire_init(self, waiter: "InitWait") -> None:
        if waiter not in self.init_waiting:
            return
        self.init_waiting.remove(waiter)
        key, block = sorted(waiter.blocks, key=repr)[0]
        missing = sorted(self.members - self.init_seen.get((key, block), set()))
        self.reply_error(waiter.ident, waiter.seq,
                         f"init of key {key!r} did not complete within {self.env.start_timeout:g}"
                         f" s (launch.py --start-timeout): worker(s) {missing} have not "
                         f"initialised it", waiter.worker)

    def op_pull(self, ident, header, buffers) -> None:
        worker = header["worker"]
        route = self.route(header["items"], "pulled")
        pending = Pending(ident, header["seq"], worker, route, True)
        if self.pooled:
            # a worker outside a pool's active set waits at its pull until the pool takes it in
            waiting = [g for g, _, _ in self.route_parts(route) if worker in g.policy.parked]
            for group in waiting:
                group.waiting.setdefault(worker, deque()).append(pending)
            pending.outstanding = len(waiting)
            if waiting:
                return
            pending.extra = self.pool_assignment(worker)
        self.reply_values(pending)

    def op_push(self, ident, header, buffers) -> None:
        worker = header["worker"]
        route, parts = self.check_push_items(worker, header["items"], buffers)
        now = time.monotonic()
        pending = Pending(ident, header["seq"], worker, route, header["op"] == Op.PUSHPULL,
                          outstanding=len(parts))
        decisions = []
        self.metrics.pushes_received += len(route.slots)
        picked = [(group, buffers if pick is None else pick(buffers),
                   not group.policy.accepts_now(worker) or group.holds_push_of(worker))
                  for group, pick, _ in parts]
        if any(later for _, _, later in picked):
            self.check_held(worker, [arrays for _, arrays, later in picked if later])
        for group, arrays, later in picked:
            if later:   # a push for a later round
                group.held.append((worker, arrays, pending))
                held = self.held_of.setdefault(worker, [0, 0])
                held[0] += 1
                held[1] += nbytes(arrays)
            else:
                decisions.append((group, self.take_push(group, worker, arrays, pending, now)))
        self.carry_out(decisions)

    def check_held(self, worker: int, arrays) -> None:
        """Refuse a push that would hold more of ``worker``'s pushes for later rounds than
        :data:`MAX_HELD_PUSHES` or twice the window allow (one push always fits)."""
        count, held = self.held_of.get(worker, (0, 0))
        more = sum(map(nbytes, arrays))
        window = self.env.window_bytes
        if count + len(arrays) > MAX_HELD_PUSHES or (count and held + more > 2 * window):
            raise RequestError(
                f"worker {worker} pushed ahead of the round more than the server holds for "
                f"it: {count} pushes of {held} bytes held, {more} more (at most "
                f"{MAX_HELD_PUSHES} pushes and twice KVX_WINDOW_MB, {2 * window} bytes, "
                f"which its own window stays under)")

    def check_push_items(self, worker, items, buffers, stamps=None):
        """The route of a push and the groups it covers, every item checked before any is used.
        ``stamps`` (one per item, ``dist_psp``): groups are split so that each one's blocks
        carry one stamp."""
        if len(buffers) != len(items):
            raise RequestError(f"push: {len(items)} keys but {len(buffers)} buffers")
        route = self.route(items, "pushed")
        if list(map(NBYTES, buffers)) != route.nbytes:
            for slot, buf, nbytes in zip(route.slots, buffers, route.nbytes):
                if buf.nbytes != nbytes:
                    raise RequestError(f"key {slot.key!r}: {buf.nbytes} bytes sent for "
                                       f"{slot.size} {slot.dtype.name} elements")
        parts = self.route_parts(route) if stamps is None else self.parts(route.slots, stamps)
        for group, _, first in parts:
            problem = group.policy.check_push(worker)
            if problem:
                raise RequestError(f"key {route.slots[first].key!r}: {problem}")
        return route, parts

    def route(self, items, what: str) -> Route:
        """The slots ``items`` name, checked (``what``: "pushed" or "pulled", for the errors);
        resolved once per distinct list of items."""
        signature = tuple(map(ITEM_BLOCK, items))
        route = self.routes.get(signature)
        if route is None:
            slots = []
            for item in items:
                slot = self._slot(item)
                self._check_block(slot, item[DTYPE], item[SIZE], what)
                slots.append(slot)
            if len(self.routes) >= MAX_ROUTES:
                self.routes.clear()
            route = self.routes[signature] = Route(slots)
        return route

    def route_parts(self, route: Route) -> list:
        """:meth:`parts` of a route's slots, kept until a group changes."""
        if route.epoch != self.group_epoch:
            route.parts = self.parts(route.slots)
            route.epoch = self.group_epoch
        return route.parts

    def parts(self, slots, labels=None) -> list:
        """The groups of ``slots``, once every group they cover only in part has been split
        (and, with ``labels``, one per slot, every group whose slots carry different labels):
        ``(group, picker of its arrays from a request's, position of its first slot)`` in
        the order of ``slots``."""
        named: dict = {}
        for i, slot in enumerate(slots):
            named.setdefault((slot.group, None if labels is None else labels[i]),
                             []).append(slot)
        for (group, _), members in named.items():
            if len(members) < len(group.slots):
                self.split(group, members)
        position = {slot: i for i, slot in enumerate(slots)}
        out, seen = [], set()
        for slot in slots:
            if slot.group not in seen:
                seen.add(slot.group)
                at = [position[s] for s in slot.group.slots]
                out.append((slot.group, picker(at, len(slots)), min(at)))
        return out

    def split(self, group: Group, members) -> Group:
        """Move ``members`` (some of ``group``'s slots) to a group of their own that starts as
        a copy of ``group``: the policy's state, the counts, the requests waiting for OK (each
        now waits for both groups) and the held pushes (their arrays of those slots)."""
        members = set(members)
        moved = [i for i, s in enumerate(group.slots) if s in members]
        kept = [i for i, s in enumerate(group.slots) if s not in members]
        part = Group(copy.deepcopy(group.policy))
        part.gathered, part.version, part.fresh = group.gathered, group.version, group.fresh
        part.pulled = dict(group.pulled)
        part.waiting = {w: deque(queue) for w, queue in group.waiting.items()}
        part.held = deque((w, tuple(arrays[i] for i in moved), p) for w, arrays, p in group.held)
        group.held = deque((w, tuple(arrays[i] for i in kept), p) for w, arrays, p in group.held)
        for queue in group.waiting.values():
            for p in queue:
                p.outstanding += 1
        for w, _, p in group.held:
            p.outstanding += 1
            self.held_of.setdefault(w, [0, 0])[0] += 1   # one entry more, the same bytes
        slots = group.slots
        part.hold([slots[i] for i in moved])
        group.hold([slots[i] for i in kept])
        self.groups.append(part)
        self.group_epoch += 1
        return part

    def take_push(self, group: Group, worker: int, arrays, pending: Pending, now: float):
        group.gather(arrays)
        delay = group.version - group.pulled.get(worker, 0)
        self.metrics.record_staleness(worker, delay, len(group.slots))
        queue = group.waiting.get(worker)
        if queue is None:
            queue = group.waiting[worker] = deque()
        queue.append(pending)
        group.fresh = False
        decision = group.policy.on_push(worker, now)
        if decision.apply and self.optimizer is not None and self.optimizer.delay_aware:
            # applied on its own, with who pushed it and its delay (never summed with another)
            self.apply([group], pusher=(worker, delay))
        return decision

    def carry_out(self, decisions) -> None:
        """Apply what the policies said to apply (in one optimizer call), then send OKs;
        then take the held-back pushes that a new round accepts, and so on."""
        while decisions:
            self._apply_and_release(decisions)
            now = time.monotonic()
            touched = list({id(group): group for group, _ in decisions if group.held}.values())
            decisions = []
            for group in touched:
                # each worker's earliest held push, in arrival order, if the new round takes it
                still, seen = deque(), set()
                for worker, arrays, pending in group.held:
                    if worker in seen or worker not in self.members \
                            or not group.policy.accepts_now(worker):
                        if worker in self.members:
                            still.append((worker, arrays, pending))
                        seen.add(worker)
                        continue
                    seen.add(worker)
                    held = self.held_of[worker]
                    held[0] -= 1
                    held[1] -= nbytes(arrays)
                    decisions.append((group, self.take_push(group, worker, arrays, pending,
                                                            now)))
                group.held = still

    def _apply_and_release(self, decisions) -> None:
        to_apply = list({id(group): group for group, d in decisions
                         if d.apply and group.gathered}.values())
        if to_apply:
            self.apply(to_apply)
        for group, d in decisions:
            for worker, lead in d.released:
                self.metrics.record_ok(worker, lead, len(group.slots))
                queue = group.waiting.get(worker)
                if not queue:
                    continue
                answered = len(queue) if group.policy.ok_answers_every_wait else 1
                for _ in range(answered):
                    self._answer_waiting(queue.popleft(), group)

    def _answer_waiting(self, p: "Pending", group: Group) -> None:
        """One of the OKs ``p`` waits for (one from each group it covers) has come."""
        p.outstanding -= 1
        if p.outstanding == 0:
            if self.pooled:
                p.extra = self.pool_assignment(p.worker, group.policy)
            if p.with_values:
                self.reply_values(p)
            else:
                self.reply(p.ident, p.seq, p.extra, worker=p.worker)

    def apply(self, groups, pusher=None) -> None:
        """One optimizer call for what ``groups`` gathered; ``pusher``: the (worker, delay) of
        the one push they hold, for an optimizer that needs it (:mod:`kvstore_ext.optimizers`)."""
        blocks = 0
        for group in groups:
            blocks += len(group.slots)
            self.metrics.pushes_applied += group.gathered * len(group.slots)
            group.gathered = 0
        if self.pooled and self.optimizer is not None:
            # the pool of the blocks being updated: blocks never pushed (a frozen parameter)
            # or pushed apart from the others have a pool of their own, which these never saw
            pool = groups[0].policy.pool
            self.optimizer.tune(pool.lr_scale(), pool.momentum)
        runs = [run for group in groups for run, _, _ in group.runs]
        cpu0 = time.thread_time()
        try:
            if self.optimizer is None:   # the store holds the summed value, as MXNet's do
                for run in runs:
                    weight, grad = run.home.numpy("weight"), run.home.numpy("grad")
                    weight[run.bounds[0]:run.bounds[-1]] = grad[run.bounds[0]:run.bounds[-1]]
            else:
                self.optimizer.apply_runs(runs, pusher)
            if not SYNCHRONOUS_ENGINE:   # sums and replies read and write the memory directly
                mx.nd.waitall()
        except Exception as exc:
            self._round_failed(groups, exc)
        self.metrics.optimizer_cpu_s += time.thread_time() - cpu0
        for group in groups:
            group.version += 1
        self.metrics.updates += blocks

    def _round_failed(self, groups, exc: Exception) -> None:
        """Stop the job on an update that failed: answering only the worker whose push set it
        off left the others of the round waiting for ever (MXNet's own server swallows the
        error and serves weights that never change).  Every worker is told which keys and
        why; raises :class:`RoundFailed`."""
        keys = sorted({slot.key for group in groups for slot in group.slots}, key=repr)
        shown = ", ".join(map(repr, keys[:8])) + (f" and {len(keys) - 8} more" if len(keys) > 8
                                                   else "")
        what = (f"the {type(self.optimizer.optimizer).__name__} optimizer"
                if self.optimizer is not None else "summing the pushes")
        log.error("server %d: %s failed on key(s) %s", self.rank, what, shown,
                  exc_info=(type(exc), exc, exc.__traceback__))
        message = (f"server {self.rank}: {what} failed updating key(s) {shown}: "
                   f"{type(exc).__name__}: {exc} (the server's log has the traceback); "
                   f"those weights may be partly updated, so the job stops")
        self.fail(message)
        raise RoundFailed(message) from exc

    # -- a worker pool (dist_pool): the server owns the learning rate and the batch sizes ----
    @property
    def pool_policy(self):
        """The worker pool that speaks for the server: the one that has applied the most
        pushes.  Groups pushed together see the same pushes and agree; a group of blocks that
        are never pushed (``grad_req='null'``, a frozen layer) keeps a pool that never moves,
        and must not answer for the others."""
        return max(self.groups, key=lambda g: g.policy.pool.updates).policy

    def pool_assignment(self, worker: int, policy=None) -> dict:
        """What a worker is told with its OK (by ``policy``, the pool of the group that let
        it go): its next batch size (0: the budget is spent, stop), the pool's size and the
        learning rate the server now applies."""
        policy = policy or self.pool_policy
        lr = self.optimizer.base_hyper.get("lr") if self.optimizer is not None else None
        return {"batch_size": policy.next_batch(worker), "pool": policy.pool.size,
                "lr": None if lr is None else lr * policy.pool.lr_scale(),
                "updates": policy.pool.updates}

    def sent_weights(self, parts, worker: int) -> None:
        """``worker`` is being sent the weights of the groups of ``parts`` (whole groups, as
        :meth:`parts` gives them) at their current versions."""
        for group, _, _ in parts:
            group.pulled[worker] = group.version
            if self.optimizer is not None and self.optimizer.delay_aware:
                for slot in group.slots:
                    self.optimizer.pulled(slot.key, slot.weight, worker)

    def _use_updater(self, optimizer) -> None:
        """Run ``optimizer`` from now on, if this store type can (refused with the reason)."""
        from ..optimizers import ServerOptimizer
        try:
            self.optimizer = ServerOptimizer(optimizer, self.row.name, self.row.asynchronous)
        except ValueError as exc:
            raise RequestError(str(exc)) from None

    def op_set_optimizer(self, ident, header, buffers) -> None:
        """Every worker's store sends its optimizer: the first copy installs it, another
        worker's (or another store's) copy of the same one changes nothing, and a store that
        sets it again starts it anew, states and update counts (MXNet's servers install a
        fresh updater on every ``set_optimizer``)."""
        blob = bytes(buffers[0])
        worker, store = header["worker"], header.get("store", "")
        if self.optimizer_blob is not None and worker in self.joined:
            pass   # a worker that joined runs with the job's optimizer and its states
        elif blob != self.optimizer_blob or store in self.optimizer_senders.get(worker, ()):
            try:
                optimizer = pickle.loads(blob)   # authenticated by the job secret (transport)
            except (AttributeError, ImportError) as exc:
                raise RequestError(
                    f"the optimizer cannot be loaded on the servers ({type(exc).__name__}: "
                    f"{exc}): a class defined in the training script itself is not there. "
                    f"Define it in a module the servers can import and name that module with "
                    f"launch.py --plugin MODULE (every process of the job imports it)") from None
            self._use_updater(optimizer)
            self.optimizer_blob = blob
            self.optimizer_senders = {}
        senders = self.optimizer_senders.setdefault(worker, set())
        if len(senders) < MAX_STORES_PER_WORKER:
            senders.add(store)
        self.reply(ident, header["seq"], worker=header["worker"])

    def op_set_lr(self, ident, header, buffers) -> None:
        """A worker's optimizer has a new learning rate: the updates applied from now on use it
        (a worker sends it after every earlier push of its own has been answered)."""
        if self.optimizer is None:
            raise RequestError("set an optimizer before setting its learning rate")
        try:
            self.optimizer.set_learning_rate(header["lr"])
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        self.reply(ident, header["seq"], worker=header["worker"])

    def op_get_states(self, ident, header, buffers) -> None:
        if self.optimizer is None:
            raise RequestError("no optimizer has been set on the kvstore, so it has no states")
        blocks = [[s.key, s.block] for s in self.slots.values()]
        self.reply(ident, header["seq"], {"blocks": blocks},
                   buffers=[self.optimizer.get_states(),
                            pickle.dumps(self.optimizer.update_counts())],
                   worker=header["worker"])

    def op_set_states(self, ident, header, buffers) -> None:
        states, optimizer = pickle.loads(bytes(buffers[0]))  # authenticated
        if optimizer is not None:
            self._use_updater(optimizer)
            self.optimizer_blob, self.optimizer_senders = None, {}
        if self.optimizer is None:
            raise RequestError("set an optimizer before loading optimizer states")
        self.optimizer.set_states(states)
        self.reply(ident, header["seq"], worker=header["worker"])

    def op_away(self, ident, header, buffers) -> None:
        """The worker waits at a barrier, or is through it (see ``SyncPolicy.set_away``)."""
        worker, now = header["worker"], time.monotonic()
        if self.handler is None and worker in self.members:
            self.carry_out([(group, group.policy.set_away(worker, header["away"], now))
                            for group in self.groups])
        self.reply(ident, header["seq"], worker=worker)

    def op_hello(self, ident, header, buffers) -> None:
        peer = f"worker:{header['worker']}"
        # a worker says hello when it starts: one that joins under a rank that was another's
        # maps a ring of its own
        self.router_out.lanes.forget(peer)
        if self.host_token is not None and header.get("shm") == self.host_token:
            self.codec.local_peers.add(peer)
        else:
            self.codec.local_peers.discard(peer)
        self.reply(ident, header["seq"], worker=header["worker"])

    def op_stats(self, ident, header, buffers) -> None:
        self.reply(ident, header["seq"], {"stats": self.stats()}, worker=header["worker"])

    def stats(self) -> dict:
        self.count_refused_handshakes()
        out = self.metrics.to_dict()
        out["blocks"] = len(self.slots)   # blocks of keys this server holds
        # the sets of blocks one policy decides for: a push naming only some of a set splits
        # it for good, and each set costs its own policy call, sums and kernel calls a push
        out["groups"] = len(self.groups)
        # messages that came and went through shared memory (workers on this host)
        out["lanes"] = dict(self.codec.lane_messages)
        # messages refused before they were served, by reason (unauthenticated, replayed,
        # misaddressed, oversized), and authenticated ones that did not fit the schema;
        # connections refused at the handshake
        out["rejected"] = {**self.codec.rejected, "malformed": self.malformed,
                           **({"handshake": self.guard.refused} if self.guard.refused else {})}
        if self.faults.active:
            out["faults"] = self.faults.to_dict()
        if self.handler is not None:
            out[self.handler.metrics_name] = self.handler.to_dict()
        if self.optimizer is not None and self.optimizer.delay_aware:
            out["delay_optimizer"] = self.delay_optimizer_stats()
        return out

    def delay_optimizer_stats(self) -> dict:
        """The delays a delay-aware optimizer was given (per key: compare with the staleness
        histogram) and the memory it keeps per worker."""
        opt = self.optimizer.optimizer
        states = self.optimizer.updater.states
        per_worker = sum(getattr(state, "per_worker_bytes", lambda: 0)()
                         for state in states.values())
        workers = max(1, len(self.members))
        return {"optimizer": type(opt).__name__.lower(),
                "delays": {str(d): n for d, n in sorted(opt.delays.items())},
                "per_worker_bytes": per_worker // workers, "keys": len(states)}


def main(argv=None) -> int:
    global mx, SYNCHRONOUS_ENGINE
    logging.basicConfig(level=logging.INFO, format="[kvstore_ext server] %(message)s")
    fixed_malloc = keep_freed_buffers()
    for var, value in jobenv.SERVER_COMPUTE_DEFAULTS.items():
        os.environ.setdefault(var, value)
    for var in ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT"):
        os.environ.pop(var, None)   # never become an MXNet ps-lite node by accident
    import mxnet
    mx = mxnet
    SYNCHRONOUS_ENGINE = os.environ.get("MXNET_ENGINE_TYPE") == "NaiveEngine"
    try:
        env = jobenv.JobEnv.from_environ("server")
        server = Server(env)
    except RuntimeError as exc:
        print(f"kvstore_ext server: {exc}", file=sys.stderr)
        return 1
    server.metrics.malloc = "fixed" if fixed_malloc else "default"
    profile_to = os.environ.get("KVX_PROFILE_SERVER")
    if profile_to:   # developer aid: cProfile the event loop, one file per server
        import cProfile
        prof = cProfile.Profile()
        code = prof.runcall(server.run)
        prof.dump_stats(f"{profile_to}.{server.rank}")
        return code
    return server.run()


if __name__ == "__main__":
    sys.exit(main())
