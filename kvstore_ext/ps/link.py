"""A worker's link to its job: registration, requests to servers, heartbeats.

The worker sends on one socket per server from its own thread and receives
on another, owned by a background link thread.  That thread also hears the
scheduler's notices and ZeroMQ's socket-monitor events, so a reply can arrive
(and a dead peer be noticed) while the training thread is busy computing: this
is what lets a pushpull return at once and complete inside MXNet's engine.

What a worker has in flight is bounded: a request waits to be sent while the
bytes of unanswered requests would pass the job's window (``--window-mb``).
"""
from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import math
import os
import sys
import threading
import time

import zmq

from .. import engine
from ..jobenv import JobEnv
from ..stalls import (POOL_WAIT, PEER_HUNG, SHUTDOWN_ENV, after_seconds, look_period, report,
                      shutdown_seconds)
from ..registry import StoreConfig, lookup as lookup_store
from ..errors import (JobAbortedError, KVStoreError, NodeLostError, SchedulerLostError,  # noqa: F401
                     ServerLostError, StalledError, WorkerLostError)
from .transport import (AuthError, Codec, Limits, Packed, configure, destroy, disconnected,
                        message_size_problem, new_context, queue)
from . import rendezvous, shm
from .protocol import Op
from .rendezvous import connection_lost

log = logging.getLogger("kvstore_ext")


#: the errors that stop the whole job (every later call fails with one of them too)
JOB_STOPS = (NodeLostError, JobAbortedError)
_UNSEEN = threading.local()   # depth of unseen() on this thread


@contextlib.contextmanager
def unseen():
    """Errors raised inside go to an engine operation or a held batch, not to the caller
    (they reach the caller later, deferred, or the process exits 1 with them)."""
    _UNSEEN.depth = getattr(_UNSEEN, "depth", 0) + 1
    try:
        yield
    finally:
        _UNSEEN.depth -= 1


#: the ``kind`` of a server's error reply -> the exception the worker raises
ERROR_KINDS = {"error": KVStoreError, "worker_lost": WorkerLostError,
               "server_lost": ServerLostError, "scheduler_lost": SchedulerLostError,
               "aborted": JobAbortedError}


class Ticket:
    """One awaited reply, or the parts of one (``dist_psp`` answers block by block)."""

    __slots__ = ("event", "header", "buffers", "error", "error_type", "parts", "versions",
                 "expected", "abandoned", "late", "nbytes", "since", "server", "request",
                 "_then")

    def __init__(self, nbytes: int = 0, since: float = 0.0, server: int | None = None,
                 request: dict | None = None):
        self.event = threading.Event()
        self.since = since                    # when it was sent (monotonic)
        self.server = server                  # whom it was sent to (None: the scheduler)
        self.request = request                # its header: what a stall report names
        self.header = None
        self.buffers = None
        self.error: str | None = None
        self.error_type: type = KVStoreError
        self.nbytes = nbytes                  # request bytes it holds in the window
        self.parts: dict[int, object] = {}   # item index -> buffer, as parts arrive
        self.versions: dict[int, int] = {}   # item index -> the block's version in its part
        self.expected = 0                     # how many items the request holds
        self.abandoned = False   # a partial pull went on without the rest: nobody waits for it
        #: what to do with a part that comes after the pull went on: ``late(items, versions,
        #: buffers)``, called on the link thread; None drops it
        self.late = None
        self._then = None        # callbacks waiting for the answer (see then())

    def then(self, callback) -> None:
        """Call ``callback()`` once this ticket is answered (or failed): at once, on this
        thread, if it is; else on the thread that answers it (the link thread, mostly),
        which must then not wait for anything the caller holds."""
        with _THEN_LOCK:
            if not self.event.is_set():
                self._then = [*(self._then or ()), callback]
                return
        callback()

    def _answered(self) -> None:
        """The event is set: run the callbacks registered with :meth:`then`, once."""
        with _THEN_LOCK:
            callbacks, self._then = self._then, None
        for callback in callbacks or ():
            try:
                callback()
            except Exception:   # a callback's error is its own: the link thread goes on
                log.exception("kvstore_ext: a callback on a reply failed")

    def fulfil(self, header, buffers) -> None:
        if "part" in header:   # parts may come in any order (a late block comes last)
            self.versions.update(zip(header["part"], header["versions"]))
            self.parts.update(zip(header["part"], buffers))
            if len(self.parts) < self.expected:
                return
        self.header, self.buffers = header, buffers
        if not header.get("ok"):
            self.error = str(header.get("error", "the server refused the request"))
            self.error_type = ERROR_KINDS.get(header.get("kind"), KVStoreError)
        self.event.set()
        self._answered()

    def fail(self, message: str, error_type: type = KVStoreError) -> None:
        if not self.event.is_set():
            self.error, self.error_type = message, error_type
            self.event.set()
            self._answered()


_THEN_LOCK = threading.Lock()   # a ticket's callbacks against its answer (they are rare)


def when_answered(tickets, callback) -> bool:
    """Call ``callback()`` once, when every one of ``tickets`` is answered or failed: on the
    thread that answers the last of them (this one, if all are already).  True: it will."""
    left = [len(tickets)]
    lock = threading.Lock()

    def one() -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            callback()

    if not tickets:
        callback()
    for ticket in tickets:
        ticket.then(one)
    return True


class UnansweredRequests:
    """Which awaited reply to report as stalled (:mod:`kvstore_ext.stalls`).

    The oldest request still awaited is reported once it has waited ``after_s``; then no
    other until ``after_s`` more has passed, so one hang gives one report, not one per
    request in flight.  A partial pull that went on without the rest is not awaited.  Pure
    logic on the tickets and a time, for :class:`StallWatcher` and the tests."""

    def __init__(self, after_s: float):
        self.after_s = float(after_s)
        self.reported: Ticket | None = None
        self.last_report = -math.inf

    @staticmethod
    def awaited(tickets) -> list:
        return [t for t in tickets if not t.abandoned and not t.event.is_set()]

    def due(self, tickets, now: float) -> "Ticket | None":
        """The ticket to report now, if any."""
        if self.after_s <= 0 or now - self.last_report < self.after_s:
            return None
        waiting = self.awaited(tickets)
        if not waiting:
            return None
        oldest = min(waiting, key=lambda t: t.since)
        if oldest is self.reported or now - oldest.since < self.after_s:
            return None
        self.reported, self.last_report = oldest, now
        return oldest

    def answered(self) -> "Ticket | None":
        """The reported ticket once its reply has come (once): the wait was only long."""
        ticket = self.reported
        if ticket is not None and ticket.event.is_set():
            self.reported = None
            return ticket
        return None


def overdue(tickets, now: float, bound_s: float, pooled: bool) -> "Ticket | None":
    """The oldest awaited request that has waited ``bound_s`` (``KVX_STALL_SHUTDOWN_S``; 0:
    none ever is), but a data request a worker pool may rightly hold (:func:`what_else`)."""
    if bound_s <= 0:
        return None
    late = [t for t in UnansweredRequests.awaited(tickets)
            if now - t.since >= bound_s and what_else(t, pooled) is not POOL_WAIT]
    return min(late, key=lambda t: t.since, default=None)


#: workers a scheduler's answer names at most as quiet (:func:`quiet_workers`)
MAX_QUIET = 8


def quiet_workers(value) -> list:
    """The scheduler's list of quiet workers, ``[[rank, seconds], ...]``, as pairs; anything
    else gives none (a report must not fail on it)."""
    if not isinstance(value, list):
        return []
    pairs = []
    for item in value[:MAX_QUIET]:
        if isinstance(item, list) and len(item) == 2 and type(item[0]) is int \
                and type(item[1]) in (int, float) and math.isfinite(item[1]):
            pairs.append((item[0], float(item[1])))
    return pairs


def describe_quiet(quiet: tuple, rank: int, now: float, waited: float) -> str:
    """The sentence a stall report adds on the other workers that have made no kvstore call
    for at least half as long as this wait: a round waits for their pushes, a barrier for
    them, and what holds them is their own code (or their host).  ``quiet``: (when heard,
    pairs) as :meth:`Connection.notice` keeps it."""
    heard, pairs = quiet
    aged = [(r, s + now - heard) for r, s in pairs if r != rank]   # idle until now
    named = [(r, s) for r, s in aged if s >= waited / 2]
    if not named:
        return ""
    listed = ", ".join(f"worker {r} for {s:.0f} s" for r, s in named)
    return (f" Workers that have made no kvstore call for a while, as the scheduler last heard: "
            f"{listed} (their own code runs, or their host is stopped; a push or barrier this "
            f"waits for may be theirs).")


def describe_request(ticket: Ticket) -> str:
    """"a pushpull of keys 0, 1 sent to server 1 (request 812)": what a stall report names."""
    request = ticket.request or {}
    what = describe_call(request.get("op", "request"),
                         [item[0] for item in request.get("items", ())
                          if isinstance(item, (list, tuple)) and item])
    to = "the scheduler" if ticket.server is None else f"server {ticket.server}"
    seq = request.get("seq")
    return f"{what} sent to {to}" + ("" if seq is None else f" (request {seq})")


def what_else(ticket: Ticket, pooled: bool) -> str:
    """What a request without a reply may be besides a hung peer: on a pooled store, a data
    request to a server may be held by the pool, for as long as the pool keeps the worker out
    (a fixed pool smaller than the job: until a lower rank leaves)."""
    op = (ticket.request or {}).get("op")
    if pooled and ticket.server is not None and op in (Op.PULL, Op.PUSH, Op.PUSHPULL):
        return POOL_WAIT
    return PEER_HUNG


def describe_call(op: str, keys) -> str:
    """"a pushpull of keys 0, 1": a call or request and its keys, each once, in order."""
    keys = set(keys)
    try:
        keys = sorted(keys)
    except TypeError:      # ints and names mixed
        keys = sorted(keys, key=str)
    what = f"a {op}"
    if keys:
        shown = ", ".join(map(str, keys[:8])) + (", ..." if len(keys) > 8 else "")
        what += f" of key{'s' if len(keys) > 1 else ''} {shown}"
    return what


#: what else a wait for MXNet's engine inside a store call may be
ENGINE_HUNG = ("Unless what the program computed before this call takes that long, an engine "
               "operation it waits for never ends (an engine deadlock)")


class EngineWaits:
    """Which wait for MXNet's engine inside a store call to report as stalled.

    A call first reads its gradients and locates its output arrays, which waits until the
    engine has written them (the backward pass, the last round's weights).  The store marks
    that wait in ``Connection.engine_wait`` as ``(since, op, (key, value) pairs)``.  No
    request is outstanding then, so without this an engine operation that never ends would
    leave the job silent for ever.  A wait is reported once past the bound, and said to
    have ended if it does.  Pure logic, as :class:`UnansweredRequests`."""

    def __init__(self, after_s: float):
        self.after_s = float(after_s)
        self.reported: tuple | None = None

    def due(self, wait, now: float) -> bool:
        if self.after_s <= 0 or wait is None or wait is self.reported or \
                now - wait[0] < self.after_s:
            return False
        self.reported = wait
        return True

    def ended(self, wait) -> "tuple | None":
        """The reported wait once it is over (once)."""
        reported = self.reported
        if reported is not None and wait is not reported:
            self.reported = None
            return reported
        return None


class StallWatcher(threading.Thread):
    """Looks every few seconds for a request that has waited past ``KVX_STALL_REPORT_S``,
    and for a call that has waited that long for MXNet's engine (:class:`EngineWaits`).

    A thread of its own, not the link thread's loop: a link thread that is itself stuck (in
    a send, in an engine call) leaves replies undrained, and the report's stacks show it."""

    def __init__(self, conn: "Connection"):
        super().__init__(name="kvstore_ext-stall-watch", daemon=True)
        self.conn = conn
        self.watch = UnansweredRequests(conn.stall_after)
        self.engine = EngineWaits(conn.stall_after)
        self.pooled = lookup_store(conn.store.type).pooled
        self.stopping = threading.Event()

    def run(self) -> None:
        engine.never_push_here()
        period = look_period(min(b for b in (self.conn.stall_after, self.conn.stall_shutdown)
                                 if b > 0))
        while not self.stopping.wait(period):
            try:
                self.look(time.monotonic())
            except Exception:     # a report must never be what stops a worker
                pass

    def look(self, now: float) -> None:
        """Report a request, or a call's wait for the engine, that has lasted past the bound,
        with every thread's stack; say when one reported ends after all."""
        conn, watch = self.conn, self.watch
        if conn.failure:      # the job stops: its error says why
            return
        who = f"kvstore_ext {conn.store.type} worker {conn.rank}"
        wait = conn.engine_wait
        over = self.engine.ended(wait)
        if over is not None:
            print(f"{who}: the arrays of {describe_call(over[1], (k for k, _ in over[2]))} "
                  f"were ready after about {now - over[0]:.0f} s; the job goes on.",
                  file=sys.stderr, flush=True)
        done = watch.answered()
        if done is not None:
            print(f"{who}: the reply to {describe_request(done)} came after about "
                  f"{now - done.since:.0f} s; the job goes on.", file=sys.stderr, flush=True)
        tickets = list(conn.tickets.values())    # one C-level copy: safe while others change it
        barrier = conn.scheduler_wait
        if barrier is not None:
            tickets.append(barrier)
        # while replies are awaited, the engine may be waiting for them: they are reported
        if not watch.awaited(tickets) and self.engine.due(wait, now):
            report(f"{who}: {describe_call(wait[1], (k for k, _ in wait[2]))} has waited "
                   f"{now - wait[0]:.0f} s for MXNet's engine to write its arrays (the "
                   f"gradients it sends, the arrays it writes).", unless=ENGINE_HUNG)
        ticket = watch.due(tickets, now)
        if ticket is not None:
            more = len(watch.awaited(tickets)) - 1
            report(f"{who}: {describe_request(ticket)} has had no reply after "
                   f"{now - ticket.since:.0f} s" + (f" ({more} more requests are waiting)."
                                                    if more else ".")
                   + describe_quiet(conn.quiet, conn.rank, now, now - ticket.since),
                   unless=what_else(ticket, self.pooled))
        late = overdue(tickets, now, conn.stall_shutdown, self.pooled)
        if late is not None:   # the waiting call raises this; the job stops with it
            waited = now - late.since
            conn.set_failure(f"{who}: {describe_request(late)} has had no reply after "
                             f"{waited:.0f} s, past {SHUTDOWN_ENV}={conn.stall_shutdown:g}: "
                             f"the call stops rather than wait for ever."
                             + describe_quiet(conn.quiet, conn.rank, now, waited),
                             StalledError)


#: the exception the main thread's script ended with, if it did (see :func:`note_uncaught`)
_uncaught: list = []


def note_uncaught() -> None:
    """Have the process's uncaught exception recorded before Python prints it: a worker whose
    script raised must not leave the job as one that finished (the scheduler would tell the
    other workers nothing, and they would go on alone).  Installed once, in front of the
    hook in place."""
    previous = sys.excepthook
    if getattr(previous, "kvstore_ext", False):
        return

    def hook(exc_type, exc, tb):
        _uncaught.append(exc)
        previous(exc_type, exc, tb)
    hook.kvstore_ext = True
    sys.excepthook = hook


def stalled_then_lost(who: str, seconds: float, heartbeat_timeout: float) -> str:
    """What a lost connection means right after this process did not run for ``seconds``."""
    return (f"{who} closed its connection after this process did not run for {seconds:.0f} s "
            f"(stopped, or starved of CPU), longer than the {heartbeat_timeout:g} s heartbeat "
            f"timeout: its peers took it for dead, and the job most likely went on without "
            f"it or stopped")


class LinkThread(threading.Thread):
    """Receives replies and scheduler notices, watches the connections, sends heartbeats."""

    def __init__(self, conn: "Connection", hb_sock, rx_socks, monitors):
        super().__init__(name="kvstore_ext-link", daemon=True)
        self.conn, self.hb, self.rx = conn, hb_sock, rx_socks
        self.hb_in = conn.codec.inbox()
        self.rx_in = [conn.codec.inbox() for _ in rx_socks]
        self.monitors = monitors       # monitor socket -> (exception class, who it watches)
        self.stopping = threading.Event()

    def run(self) -> None:
        engine.never_push_here()    # what it receives is written by the caller's pushes
        conn = self.conn
        hb_out = conn.codec.outbox()
        poller = zmq.Poller()
        for sock in (self.hb, *self.rx, *self.monitors):
            poller.register(sock, zmq.POLLIN)
        interval = conn.env.heartbeat_interval
        next_beat = 0.0
        last = time.monotonic()   # when the last poll returned
        stalled = (0.0, 0.0)   # (seconds, when) of the last stretch this thread did not run
        try:
            while not self.stopping.is_set():
                now = time.monotonic()
                if now >= next_beat:   # tells the scheduler where to send notices
                    idle = conn.idle_seconds(now)
                    queue(self.hb, conn.codec.seal(   # dropped if the queue is full
                        {"op": Op.HEARTBEAT, "role": "worker", "rank": conn.rank,
                         "idle": None if idle is None else round(idle, 1)},
                        to="scheduler", outbox=hb_out))
                    next_beat = now + interval
                events = dict(poller.poll(int(min(interval, 0.2) * 1000)))
                woke = time.monotonic()   # a process stopped anywhere in the loop: seen here
                if woke - last > conn.env.heartbeat_timeout:
                    stalled = (woke - last, woke)
                last = woke
                for sock, inbox in zip(self.rx, self.rx_in):
                    if sock in events:
                        self._drain_replies(sock, inbox)
                if self.hb in events:
                    self._drain_notices()
                for monitor, (error_type, who) in self.monitors.items():
                    if monitor in events and disconnected(monitor) and not conn.failure:
                        cause = connection_lost(who, conn.env.heartbeat_timeout)
                        if woke - stalled[1] < 2 * conn.env.heartbeat_timeout + 1:
                            cause = stalled_then_lost(who, stalled[0], conn.env.heartbeat_timeout)
                        conn.set_failure(f"{cause}; the job stops", error_type)
                        if error_type is ServerLostError:
                            self._tell_scheduler(cause, hb_out)
        except zmq.ZMQError:
            pass
        finally:
            for sock in (self.hb, *self.rx, *self.monitors):
                sock.close(0)

    def _tell_scheduler(self, failure: str, outbox) -> None:
        """Say why this worker stops before its exit is seen: the scheduler gives this cause
        with the worker's death, so that the other workers name the lost server, not only this
        worker (best effort: the job stops either way)."""
        try:
            self.hb.send_multipart(self.conn.codec.seal(
                {"op": Op.FAILED, "role": "worker", "rank": self.conn.rank, "error": failure},
                to="scheduler", outbox=outbox), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def _messages(self, sock, inbox):
        """The authenticated messages waiting on ``sock`` (others are dropped and counted)."""
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                yield inbox.open(frames)
            except AuthError:
                continue

    def _drain_replies(self, sock, inbox) -> None:
        conn = self.conn
        for header, buffers in self._messages(sock, inbox):
            seq = header.get("seq")
            ticket = conn.tickets.get(seq) if type(seq) is int else None
            if ticket is None:
                continue
            conn.bytes_received += sum(memoryview(b).nbytes for b in buffers)
            try:
                ticket.fulfil(header, buffers)
            except Exception as exc:   # a reply that does not fit its request
                ticket.fail(f"malformed reply from a server: {exc}")
            with conn.progress:     # one lock and one wake-up per reply
                if ticket.event.is_set():
                    conn._release(seq)
                conn.progress.notify_all()
                late = ticket.late if ticket.abandoned and "part" in header else None
            if late is not None:
                try:
                    late(header["part"], header["versions"], buffers)
                except Exception as exc:   # the next call reports it
                    conn.unreported = conn.unreported or exc
                    log.error("kvstore_ext: a late part of a pull could not be used: %s", exc)

    def _drain_notices(self) -> None:
        for header, _ in self._messages(self.hb, self.hb_in):
            try:
                self.conn.notice(header)
            except Exception:
                pass


class Connection:
    """Everything a worker process shares between its kvstore calls."""

    def __init__(self, store: StoreConfig, env: JobEnv | None = None):
        self.env = env or JobEnv.from_environ("worker")
        self.stall_after = after_seconds()   # a bad value is an error before the job starts
        self.stall_shutdown = shutdown_seconds()
        self.scheduler_wait: Ticket | None = None   # a barrier under way: reported as stalled too
        #: (since, op, (key, value) pairs) while a call waits for MXNet's engine to write
        #: its gradients or its output arrays (:class:`EngineWaits`)
        self.engine_wait: tuple | None = None
        self.limits = Limits.for_job(self.env)
        self.node = f"node:{os.urandom(6).hex()}"
        self.codec = Codec(self.env.secret, names={self.node},
                           max_frame_bytes=self.limits.max_frame_bytes)
        self.sched_out, self.sched_in = self.codec.outbox(), self.codec.inbox()
        self.ctx = new_context()
        self.sched = configure(self.ctx.socket(zmq.DEALER), self.limits)
        sched_monitor = self.sched.get_monitor_socket(rendezvous.EVENTS)
        monitors = {sched_monitor:
                    (SchedulerLostError, f"the scheduler at {self.env.scheduler_address}")}
        self.sched.connect(self.env.scheduler_address)
        self.seq = itertools.count(1)
        self.tickets: dict[int, Ticket] = {}
        self.progress = threading.Condition()   # notified when a part of a reply arrives
        self.send_lock = threading.Lock()
        self.closed = False
        #: key -> (weak reference to the store of this process that initialised it, the handle
        #: of the array it was initialised from): :meth:`ParameterServerStore.init`'s check
        self.key_owners: dict = {}
        self.failure: str | None = None
        self.failure_type: type = KVStoreError
        self.unreported: Exception | None = None   # an engine operation's error not raised yet
        self.stop_raised = False   # the caller has been told the job stopped (see raised())
        self.inflight = 0                           # bytes of requests not yet answered
        self.bytes_sent = self.bytes_received = 0   # array bytes of requests and replies
        self.last_call = time.monotonic()   # when this worker last sent a request
        #: (when heard, [(rank, seconds)]): the other workers the scheduler last said made no
        #: kvstore call for a while (:meth:`notice`), for the stall reports
        self.quiet: tuple = (0.0, [])
        self.store = store
        self.host_token = shm.host_token()
        self._register(store, sched_monitor)
        self.codec.names.add(f"worker:{self.rank}")
        for j, token in enumerate(self.topology.get("server_hosts") or ()):
            if self.host_token is not None and token == self.host_token:
                self.codec.local_peers.add(f"server:{j}")
        self.tx, rx = [], []
        self.tx_out = []
        self.rx_names = []
        for j, addr in enumerate(self.topology["servers"]):
            sock = configure(self.ctx.socket(zmq.DEALER), self.limits)
            monitors[sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)] = \
                (ServerLostError, f"server {j} at {addr}")
            sock.connect(addr)
            self.tx.append(sock)
            self.tx_out.append(self.codec.outbox())
            name = f"rx-{self.rank}-{os.getpid()}-{len(rx)}-{os.urandom(4).hex()}"
            sock = configure(self.ctx.socket(zmq.DEALER), self.limits)
            sock.setsockopt(zmq.ROUTING_ID, name.encode())
            sock.connect(addr)
            rx.append(sock)
            self.rx_names.append(name)
        try:
            self._hello(rx, self.env.start_timeout, monitors)
        except KVStoreError:
            destroy(self.ctx)
            self.closed = True
            raise
        hb = configure(self.ctx.socket(zmq.DEALER), self.limits)
        hb.connect(self.env.scheduler_address)
        self.link = LinkThread(self, hb, rx, monitors)
        self.link.start()
        self.stall_watch = StallWatcher(self)
        if self.stall_after > 0 or self.stall_shutdown > 0:
            self.stall_watch.start()
        note_uncaught()
        atexit.register(self.close)

    def _register(self, store: StoreConfig, monitor) -> None:
        registration = self.codec.seal(
            {"op": Op.REGISTER, "role": "worker", "rank_hint": self.env.worker_rank,
             "store": store.to_wire(), "node": self.node, "joining": self.env.joining},
            to="scheduler", outbox=self.sched_out)
        try:
            header = rendezvous.join(self.sched, self.sched_in, registration, monitor, self.env,
                                     "worker")
        except KVStoreError:
            destroy(self.ctx)
            self.closed = True
            raise
        self.topology = header
        self.rank = header["rank"]
        self.num_workers = header["num_workers"]
        self.num_servers = header["num_servers"]
        self.on_worker_death = header["on_worker_death"]

    def _hello(self, rx, timeout: float, monitors) -> None:
        """Make sure every server can route replies to our receiving sockets.  Meanwhile the
        scheduler's notices and the connections' monitors are read: a server that froze
        after it registered stops answering ZeroMQ's heartbeats, and no answer to a hello
        would ever say so."""
        deadline = time.monotonic() + timeout
        for server, sock in enumerate(rx):
            # until the receiving socket's connection is up, the server drops replies to it:
            # say hello again until one comes back
            while True:
                try:   # a server that reads nothing fills the queue: a hello is waiting there
                    self.tx[server].send_multipart(self.codec.seal(
                        {"op": Op.HELLO, "seq": 0, "worker": self.rank,
                         "reply_to": self.rx_names[server], "shm": self.host_token},
                        to=f"server:{server}", outbox=self.tx_out[server]), flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass
                if sock.poll(100):
                    break
                self._read_start_notices()
                for monitor, (error_type, who) in monitors.items():
                    if disconnected(monitor):
                        raise error_type(f"{connection_lost(who, self.env.heartbeat_timeout)}"
                                         f"; the job stops")
                if time.monotonic() > deadline:
                    raise ServerLostError(f"server {server} at "
                                          f"{self.topology['servers'][server]} did not answer "
                                          f"within {timeout:g} s")
            while sock.poll(50):       # extra answers to repeated hellos (dropped later if late)
                sock.recv_multipart()

    def _read_start_notices(self) -> None:
        """The scheduler's notices that came while the link thread does not run yet: a job
        stopped, or a node dead, raise as they would on a call."""
        while self.sched.poll(0):
            try:
                header, _ = self.sched_in.open(self.sched.recv_multipart())
            except AuthError:
                continue
            self.notice(header)
            if self.failure is not None:
                raise self.failure_type(self.failure)

    # -- notices ------------------------------------------------------------------------------
    def notice(self, header: dict) -> None:
        """A message from the scheduler (called from the link thread)."""
        op = header.get("op")
        if op == Op.ACK:
            self.quiet = (time.monotonic(), quiet_workers(header.get("quiet")))
            return
        if op == Op.ABORT:
            self.set_failure(str(header["error"]), JobAbortedError)
        elif op == Op.NODE_DEAD:
            role = header["role"]
            who = f"{role} {header['rank']}"
            if role == "server" or self.on_worker_death == "fail":
                self.set_failure(f"{who} died ({header['reason']}); the job stops",
                                 ServerLostError if role == "server" else WorkerLostError)

    def set_failure(self, message: str, error_type: type = KVStoreError) -> None:
        if self.failure is None:
            self.failure, self.failure_type = message, error_type
        for seq in list(self.tickets):
            ticket = self.tickets.pop(seq, None)
            if ticket is not None:
                ticket.fail(self.failure, self.failure_type)
        with self.progress:
            self.inflight = 0
            self.progress.notify_all()

    def finished(self, seq: int) -> None:
        """A request was answered (or will never be): its bytes leave the window."""
        with self.progress:
            self._release(seq)
            self.progress.notify_all()

    def _release(self, seq: int) -> None:
        """:meth:`finished` for a caller that holds ``progress`` already."""
        ticket = self.tickets.pop(seq, None)
        if ticket is not None:
            self.inflight -= ticket.nbytes

    def raise_failure(self):
        raise self.raised(self.failure_type(self.failure))

    def raised(self, exc: Exception) -> Exception:
        """``exc`` is about to reach the caller.  Once the job's stop has, the engine
        operations still waiting fail with that same stop: none of them is an error
        nobody saw (see :meth:`close`)."""
        if isinstance(exc, JOB_STOPS) and not getattr(_UNSEEN, "depth", 0):
            self.stop_raised = True
        return exc

    # -- requests -----------------------------------------------------------------------------
    def idle_seconds(self, now: float) -> float | None:
        """How long this worker has made no kvstore call: its own code runs.  None while a
        call waits (for a reply, a barrier, or MXNet's engine)."""
        if self.scheduler_wait is not None or self.engine_wait is not None \
                or any(not t.abandoned for t in list(self.tickets.values())):
            return None
        return max(0.0, now - self.last_call)

    def send(self, messages: dict[int, tuple[dict, list]]) -> dict[int, Ticket]:
        """Send one message per server; return the tickets of their replies."""
        if self.failure:   # first: after a job's stop, a call made while closing meets the stop
            self.raise_failure()
        if self.closed:
            raise KVStoreError("this kvstore has been closed")
        sizes = {}   # each buffer's bytes, read once: for the limits and for the window
        for server, (header, buffers) in messages.items():
            sizes[server] = buffers.sizes if isinstance(buffers, Packed) else \
                [memoryview(b).nbytes for b in buffers]
            problem = message_size_problem(sizes[server], self.limits)
            if problem:
                raise KVStoreError(f"{header.get('op')}: {problem}")
        tickets = {}
        with self.send_lock:   # the training thread and MXNet's engine threads both send
            self._send_locked(messages, sizes, tickets)
        return tickets

    def _wait_for_window(self, nbytes: int) -> None:
        """Block while ``nbytes`` more would overfill the window (one request always fits)."""
        with self.progress:
            while self.inflight and self.inflight + nbytes > self.env.window_bytes:
                if self.failure:
                    self.raise_failure()
                self.progress.wait(0.5)
            self.inflight += nbytes

    def _send_locked(self, messages, sizes, tickets) -> None:
        for server, (header, buffers) in messages.items():
            nbytes = sum(sizes[server])
            self._wait_for_window(nbytes)
            seq = next(self.seq)
            self.last_call = time.monotonic()
            header["seq"] = seq
            header["worker"] = self.rank
            header["reply_to"] = self.rx_names[server]
            ticket = Ticket(nbytes, time.monotonic(), server, header)
            ticket.expected = len(header.get("items", ()))
            self.tickets[seq] = ticket
            if self.failure:   # set while we waited: the ticket would never be answered
                self.finished(seq)
                self.raise_failure()
            frames = self.codec.seal(header, buffers, to=f"server:{server}",
                                     outbox=self.tx_out[server])
            while not queue(self.tx[server], frames, copy=False):   # the server's queue is full
                self.tx[server].poll(100, zmq.POLLOUT)
                if self.failure:   # it died with its queue full: the queue never empties
                    self.finished(seq)
                    self.raise_failure()
            self.bytes_sent += nbytes
            tickets[server] = ticket

    def wait(self, tickets: dict[int, Ticket]) -> dict[int, tuple[dict, list]]:
        """Wait for every ticket; raise the first error (after all have answered)."""
        for ticket in tickets.values():
            while not ticket.event.wait(0.5):
                if self.failure:
                    ticket.fail(self.failure, self.failure_type)
        failed = [t for t in tickets.values() if t.error]
        if failed:
            raise self.raised(failed[0].error_type(failed[0].error))
        return {s: (t.header, t.buffers) for s, t in tickets.items()}

    def wait_parts(self, tickets: dict[int, Ticket], counts: dict[int, int], pull,
                   late=None) -> dict:
        """Wait until ``pull.done(arrived, now)`` says enough blocks have come, or all have.

        ``counts``: how many items each server's request holds.  Returns, per server, a header
        with the blocks' ``versions`` and one buffer per item, None where that block has not
        arrived.  ``pull.wake_at()`` tells when to look again unprompted.  A block that comes
        later is dropped, unless ``late(server, taken)`` gives a function for it (see
        :attr:`Ticket.late`; ``taken``: the items returned here, which it must skip).
        """
        total = sum(counts.values())
        with self.progress:
            while True:
                errors = [t.error for t in tickets.values() if t.error]
                if errors or self.failure:
                    self.wait(tickets)   # raises the error as a full wait would
                arrived = sum(len(t.parts) for t in tickets.values())
                now = time.monotonic()
                if arrived >= total or pull.done(arrived, now):
                    break
                wake = pull.wake_at()
                self.progress.wait(0.5 if wake is None else max(0.0, min(0.5, wake - now)))
            taken = {}
            for server, ticket in tickets.items():
                # under the lock the link thread takes before it looks at ``late``: a part
                # is either in this copy or handed to ``late``, never lost (maybe both)
                parts, versions = dict(ticket.parts), dict(ticket.versions)
                taken[server] = (parts, versions)
                ticket.abandoned = not ticket.event.is_set()
                if ticket.abandoned and late is not None:
                    ticket.late = late(server, frozenset(parts))
        out = {}
        for server, ticket in tickets.items():
            parts, versions = taken[server]
            items = range(counts[server])
            out[server] = ({"versions": [versions.get(i) for i in items]},
                           [parts.get(i) for i in items])
        return out

    def drain(self) -> None:
        """Wait until every request this worker sent has been answered (except the rest of
        partial pulls that went on without it: that is dropped when it comes)."""
        while True:
            if self.failure:
                self.raise_failure()
            # one C-level copy: safe while the link thread pops
            waiting = [t for t in list(self.tickets.values()) if not t.abandoned]
            if not waiting:
                return
            waiting[0].event.wait(0.5)

    def request(self, messages: dict[int, tuple[dict, list]]) -> dict[int, tuple[dict, list]]:
        return self.wait(self.send(messages))

    def scheduler_call(self, header: dict, timeout: float | None = None) -> dict:
        """A request to the scheduler (barrier, finalize), answered with ``ok``."""
        header = {**header, "role": "worker", "rank": self.rank}
        self.last_call = time.monotonic()
        self.sched.send_multipart(self.codec.seal(header, to="scheduler", outbox=self.sched_out))
        deadline = None if timeout is None else time.monotonic() + timeout
        if deadline is None:   # a barrier waits for every worker: a hung one is reported
            self.scheduler_wait = Ticket(0, time.monotonic(), None, header)
        try:
            return self._scheduler_reply(header, timeout, deadline)
        finally:
            if self.scheduler_wait is not None:
                self.scheduler_wait.event.set()
                self.scheduler_wait = None

    def _scheduler_reply(self, header, timeout, deadline) -> dict:
        while True:
            if self.sched.poll(200):
                try:
                    reply, _ = self.sched_in.open(self.sched.recv_multipart())
                except AuthError:
                    continue
                if reply.get("op") == "ok":
                    return reply
                self.notice(reply)
            if self.failure:
                self.raise_failure()
            if deadline is not None and time.monotonic() > deadline:
                raise KVStoreError(f"the scheduler did not answer {header['op']} "
                                   f"within {timeout:g} s")

    def close(self) -> None:
        """Leave the job: the servers stop counting on this worker."""
        if self.closed:
            return
        self.closed = True
        end = time.monotonic() + 30
        while any(not t.abandoned for t in list(self.tickets.values())) and not self.failure \
                and time.monotonic() < end:
            time.sleep(0.01)      # replies still owed to engine operations
        try:
            if self.failure:
                pass           # the job stopped: nothing to finish
            elif _uncaught:    # not finished: the others must hear why this worker stops
                exc = _uncaught[-1]
                self.sched.send_multipart(self.codec.seal(
                    {"op": Op.FAILED, "role": "worker", "rank": self.rank,
                     "error": f"its script raised {type(exc).__name__}: {exc}"[:400]},
                    to="scheduler", outbox=self.sched_out), zmq.NOBLOCK)
            else:
                self.scheduler_call({"op": Op.FINALIZE}, timeout=5.0)
        except (KVStoreError, zmq.ZMQError):
            pass
        finally:
            self.set_failure("the kvstore was closed")
            try:   # engine operations still waiting now fail; let them finish before exit
                import mxnet
                mxnet.nd.waitall()
            except Exception:
                pass
            if self.unreported is not None and not (self.stop_raised and
                                                    isinstance(self.unreported, JOB_STOPS)):
                # an asynchronous error nobody has seen: exit 1
                import sys
                sys.stdout.flush()
                print(f"kvstore_ext: an asynchronous kvstore operation failed and no later call "
                      f"reported it: {self.unreported}", file=sys.stderr, flush=True)
                os._exit(1)
            self.stall_watch.stopping.set()
            self.link.stopping.set()
            self.link.join(timeout=2)
            destroy(self.ctx)
            self.codec.close()
