"""A worker's link to its job: registration, requests to servers, heartbeats.

The worker sends on one socket per server from its own thread and receives
on another, owned by a background link thread.  That thread also sends the
heartbeats and hears the scheduler's notices, so a reply can arrive (and a
dead peer be noticed) while the training thread is busy computing: this is
what lets a pushpull return at once and complete inside MXNet's engine.
"""
from __future__ import annotations

import atexit
import itertools
import os
import threading
import time

import zmq

from .config import JobEnv, StoreConfig
from .transport import AuthError, Codec, new_context


class KVStoreError(RuntimeError):
    """An error reported by the kvstore (a server, the scheduler, or the worker's own checks)."""


class WorkerLostError(KVStoreError):
    """A worker or server of the job died, or the scheduler is gone, and the job stops."""


class Ticket:
    """One awaited reply, or the parts of one (``dist_psp`` answers block by block)."""

    __slots__ = ("event", "header", "buffers", "error", "parts", "versions", "expected",
                 "abandoned")

    def __init__(self):
        self.event = threading.Event()
        self.header = None
        self.buffers = None
        self.error: str | None = None
        self.parts: dict[int, object] = {}   # item index -> buffer, as parts arrive
        self.versions: dict[int, int] = {}   # item index -> the block's version in its part
        self.expected = 0                     # how many items the request holds
        self.abandoned = False   # a partial pull went on without the rest: nobody waits for it

    def fulfil(self, header, buffers) -> None:
        if "part" in header:   # parts may come in any order (a late block comes last)
            self.versions.update(zip(header["part"], header["versions"]))
            self.parts.update(zip(header["part"], buffers))
            if len(self.parts) < self.expected:
                return
        self.header, self.buffers = header, buffers
        if not header.get("ok"):
            self.error = header.get("error", "the server refused the request")
        self.event.set()

    def fail(self, message: str) -> None:
        if not self.event.is_set():
            self.error = message
            self.event.set()


class LinkThread(threading.Thread):
    """Receives replies and scheduler notices, sends heartbeats."""

    def __init__(self, conn: "Connection", hb_sock, rx_socks):
        super().__init__(name="kvstore_ext-link", daemon=True)
        self.conn, self.hb, self.rx = conn, hb_sock, rx_socks
        self.last_ack = time.monotonic()
        self.stopping = threading.Event()

    def run(self) -> None:
        conn = self.conn
        codec = conn.codec
        beat = codec.seal({"op": "heartbeat", "role": "worker", "rank": conn.rank})
        poller = zmq.Poller()
        poller.register(self.hb, zmq.POLLIN)
        for sock in self.rx:
            poller.register(sock, zmq.POLLIN)
        interval = conn.env.heartbeat_interval
        next_beat = 0.0
        try:
            while not self.stopping.is_set():
                now = time.monotonic()
                if now >= next_beat:
                    self.hb.send_multipart(beat)
                    next_beat = now + interval
                events = dict(poller.poll(int(min(interval, 0.2) * 1000)))
                for sock in self.rx:
                    if sock in events:
                        self._drain_replies(sock)
                if self.hb in events:
                    self._drain_notices()
                silent = time.monotonic() - self.last_ack
                if silent > conn.env.heartbeat_timeout and not conn.failure:
                    conn.set_failure(f"the scheduler at {conn.env.scheduler_address} has not "
                                     f"answered for {silent:.0f} s")
        except zmq.ZMQError:
            pass
        finally:
            self.hb.close(0)
            for sock in self.rx:
                sock.close(0)

    def _messages(self, sock):
        """The authenticated messages waiting on ``sock`` (others are dropped)."""
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                yield self.conn.codec.open(frames)
            except AuthError:
                continue

    def _drain_replies(self, sock) -> None:
        tickets = self.conn.tickets
        for header, buffers in self._messages(sock):
            seq = header.get("seq")
            ticket = tickets.get(seq)
            if ticket is not None:
                ticket.fulfil(header, buffers)
                if ticket.event.is_set():
                    tickets.pop(seq, None)
                with self.conn.progress:
                    self.conn.progress.notify_all()

    def _drain_notices(self) -> None:
        for header, _ in self._messages(self.hb):
            self.last_ack = time.monotonic()
            self.conn.notice(header)


class Connection:
    """Everything a worker process shares between its kvstore calls."""

    def __init__(self, store: StoreConfig, env: JobEnv | None = None, start_timeout: float = 600.0):
        self.env = env or JobEnv.from_environ("worker")
        self.codec = Codec(self.env.secret)
        self.ctx = new_context()
        self.sched = self.ctx.socket(zmq.DEALER)
        self.sched.connect(self.env.scheduler_address)
        self.seq = itertools.count(1)
        self.tickets: dict[int, Ticket] = {}
        self.progress = threading.Condition()   # notified when a part of a reply arrives
        self.send_lock = threading.Lock()
        self.closed = False
        self.failure: str | None = None
        self.store = store
        self._register(store, start_timeout)
        self.tx, rx = [], []
        self.rx_names = []
        for addr in self.topology["servers"]:
            sock = self.ctx.socket(zmq.DEALER)
            sock.connect(addr)
            self.tx.append(sock)
            name = f"rx-{self.rank}-{os.getpid()}-{len(rx)}-{os.urandom(4).hex()}"
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.ROUTING_ID, name.encode())
            sock.connect(addr)
            rx.append(sock)
            self.rx_names.append(name)
        self._hello(rx, start_timeout)
        hb = self.ctx.socket(zmq.DEALER)
        hb.connect(self.env.scheduler_address)
        self.link = LinkThread(self, hb, rx)
        self.link.start()
        atexit.register(self.close)

    def _register(self, store: StoreConfig, start_timeout: float) -> None:
        self.sched.send_multipart(self.codec.seal(
            {"op": "register", "role": "worker", "rank_hint": self.env.worker_rank,
             "store": store.to_wire()}))
        if not self.sched.poll(int(start_timeout * 1000)):
            raise KVStoreError(f"the scheduler at {self.env.scheduler_address} did not start the "
                               f"job within {start_timeout:.0f} s (are all "
                               f"{self.env.num_workers} workers and {self.env.num_servers} "
                               f"servers running?)")
        header, _ = self.codec.open(self.sched.recv_multipart())
        if header["op"] == "abort":
            self.ctx.destroy(0)
            self.closed = True
            raise KVStoreError(header["error"])
        self.topology = header
        self.rank = header["rank"]
        self.num_workers = header["num_workers"]
        self.num_servers = header["num_servers"]
        self.on_worker_death = header["on_worker_death"]

    def _hello(self, rx, timeout: float) -> None:
        """Make sure every server can route replies to our receiving sockets."""
        deadline = time.monotonic() + timeout
        for server, sock in enumerate(rx):
            # until the receiving socket's connection is up, the server drops replies to it:
            # say hello again until one comes back
            msg = self.codec.seal({"op": "hello", "seq": 0, "worker": self.rank,
                                   "reply_to": self.rx_names[server]})
            while True:
                self.tx[server].send_multipart(msg)
                if sock.poll(100):
                    break
                if time.monotonic() > deadline:
                    raise KVStoreError(f"server {server} at {self.topology['servers'][server]} "
                                       f"did not answer within {timeout:.0f} s")
            while sock.poll(50):       # extra answers to repeated hellos
                self.codec.open(sock.recv_multipart())

    # -- notices ------------------------------------------------------------------------------
    def notice(self, header: dict) -> None:
        """A message from the scheduler (called from the link thread)."""
        op = header.get("op")
        if op == "ack":
            return
        if op == "abort":
            self.set_failure(header["error"])
        elif op == "node_dead":
            who = f"{header['role']} {header['rank']}"
            if header["role"] == "server" or self.on_worker_death == "fail":
                self.set_failure(f"{who} died ({header['reason']}); the job stops")

    def set_failure(self, message: str) -> None:
        self.failure = message
        for seq in list(self.tickets):
            ticket = self.tickets.pop(seq, None)
            if ticket is not None:
                ticket.fail(message)
        with self.progress:
            self.progress.notify_all()

    # -- requests -----------------------------------------------------------------------------
    def send(self, messages: dict[int, tuple[dict, list]]) -> dict[int, Ticket]:
        """Send one message per server; return the tickets of their replies."""
        if self.closed:
            raise KVStoreError("this kvstore has been closed")
        if self.failure:
            raise WorkerLostError(self.failure)
        tickets = {}
        with self.send_lock:   # the training thread and MXNet's engine threads both send
            self._send_locked(messages, tickets)
        return tickets

    def _send_locked(self, messages, tickets) -> None:
        for server, (header, buffers) in messages.items():
            seq = next(self.seq)
            header["seq"] = seq
            header["worker"] = self.rank
            header["reply_to"] = self.rx_names[server]
            ticket = Ticket()
            ticket.expected = len(header.get("items", ()))
            self.tickets[seq] = ticket
            self.tx[server].send_multipart(self.codec.seal(header, buffers), copy=False)
            tickets[server] = ticket

    def wait(self, tickets: dict[int, Ticket]) -> dict[int, tuple[dict, list]]:
        """Wait for every ticket; raise the first error (after all have answered)."""
        for ticket in tickets.values():
            while not ticket.event.wait(0.5):
                if self.failure:
                    ticket.fail(self.failure)
        errors = [t.error for t in tickets.values() if t.error]
        if errors:
            lost = self.failure is not None and errors[0] == self.failure
            raise (WorkerLostError if lost or "died" in errors[0] else KVStoreError)(errors[0])
        return {s: (t.header, t.buffers) for s, t in tickets.items()}

    def wait_parts(self, tickets: dict[int, Ticket], counts: dict[int, int], pull) -> dict:
        """Wait until ``pull.done(arrived, now)`` says enough blocks have come, or all have.

        ``counts``: how many items each server's request holds.  Returns, per server, a header
        with the blocks' ``versions`` and one buffer per item, None where that block has not
        arrived (it may come later; it is then dropped).  ``pull.wake_at()`` tells when to look again unprompted.
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
        out = {}
        for server, ticket in tickets.items():
            ticket.abandoned = not ticket.event.is_set()   # its late parts will be dropped
            parts = dict(ticket.parts)   # a copy: more may arrive from the link thread
            versions = dict(ticket.versions)
            items = range(counts[server])
            out[server] = ({"versions": [versions.get(i) for i in items]},
                           [parts.get(i) for i in items])
        return out

    def drain(self) -> None:
        """Wait until every request this worker sent has been answered (except the rest of
        partial pulls that went on without it: that is dropped when it comes)."""
        while True:
            if self.failure:
                raise WorkerLostError(self.failure)
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
        self.sched.send_multipart(self.codec.seal(header))
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.sched.poll(200):
                reply, _ = self.codec.open(self.sched.recv_multipart())
                if reply.get("op") == "ok":
                    return reply
                self.notice(reply)
            if self.failure:
                raise WorkerLostError(self.failure)
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
            if not self.failure:
                self.scheduler_call({"op": "finalize"}, timeout=5.0)
        except KVStoreError:
            pass
        finally:
            self.set_failure("the kvstore was closed")
            try:   # engine operations still waiting now fail; let them finish before exit
                import mxnet
                mxnet.nd.waitall()
            except Exception:
                pass
            self.link.stopping.set()
            self.link.join(timeout=2)
            self.ctx.destroy(0)
