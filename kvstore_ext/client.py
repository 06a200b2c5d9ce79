"""A worker's link to its job: registration, requests to servers, heartbeats.

Requests go out as one message per server and the replies are awaited
together.  While it waits, a worker also listens to the scheduler, so that a
dead peer or a lost scheduler ends the wait with an error that names it
instead of a hang.
"""
from __future__ import annotations

import atexit
import itertools
import threading
import time

import zmq

from .config import JobEnv, StoreConfig
from .transport import AuthError, Codec, new_context


class KVStoreError(RuntimeError):
    """An error reported by the kvstore (a server, the scheduler, or the worker's own checks)."""


class WorkerLostError(KVStoreError):
    """A worker or server of the job died, and the job is configured to stop."""


class Heartbeat(threading.Thread):
    """Tells the scheduler every interval that this worker is alive; notes its answers."""

    def __init__(self, ctx, codec, address, rank, interval):
        super().__init__(name="kvstore_ext-heartbeat", daemon=True)
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.connect(address)
        self.codec, self.rank, self.interval = codec, rank, interval
        self.last_ack = time.monotonic()
        self.stopping = threading.Event()

    def run(self) -> None:
        msg = self.codec.seal({"op": "heartbeat", "role": "worker", "rank": self.rank})
        try:
            while not self.stopping.is_set():
                self.sock.send_multipart(msg)
                deadline = time.monotonic() + self.interval
                while (left := deadline - time.monotonic()) > 0 and not self.stopping.is_set():
                    if self.sock.poll(int(left * 1000) + 1):
                        try:
                            self.codec.open(self.sock.recv_multipart())
                            self.last_ack = time.monotonic()
                        except AuthError:
                            pass
        except zmq.ZMQError:
            pass
        finally:
            self.sock.close(0)


class Connection:
    """Everything a worker process shares between its kvstore calls."""

    def __init__(self, store: StoreConfig, env: JobEnv | None = None, start_timeout: float = 600.0):
        self.env = env or JobEnv.from_environ("worker")
        self.codec = Codec(self.env.secret)
        self.ctx = new_context()
        self.sched = self.ctx.socket(zmq.DEALER)
        self.sched.connect(self.env.scheduler_address)
        self.seq = itertools.count(1)
        self.closed = False
        self.notices: list[dict] = []
        self.failure: str | None = None
        self._register(store, start_timeout)
        self.servers = []
        for addr in self.topology["servers"]:
            sock = self.ctx.socket(zmq.DEALER)
            sock.connect(addr)
            self.servers.append(sock)
        self.heartbeat = Heartbeat(self.ctx, self.codec, self.env.scheduler_address, self.rank,
                                   self.env.heartbeat_interval)
        self.heartbeat.start()
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

    # -- requests ---------------------------------------------------------------------------
    def request(self, messages: dict[int, tuple[dict, list]]) -> dict[int, tuple[dict, list]]:
        """Send one message per server, wait for every reply; raise on any error reply."""
        if self.closed:
            raise KVStoreError("this kvstore has been closed")
        if self.failure:
            raise WorkerLostError(self.failure)
        expected = {}
        for server, (header, buffers) in messages.items():
            seq = next(self.seq)
            header["seq"] = seq
            header["worker"] = self.rank
            self.servers[server].send_multipart(self.codec.seal(header, buffers), copy=False)
            expected[server] = seq
        replies = {}
        poller = zmq.Poller()
        for server in expected:
            poller.register(self.servers[server], zmq.POLLIN)
        poller.register(self.sched, zmq.POLLIN)
        while len(replies) < len(expected):
            events = dict(poller.poll(500))
            for server, seq in expected.items():
                sock = self.servers[server]
                if server in replies or sock not in events:
                    continue
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    header, buffers = self.codec.open(frames)
                    if header.get("seq") == seq:
                        replies[server] = (header, buffers)
                        break
            if self.sched in events:
                self._read_notices()
            self._check_alive()
        errors = [h["error"] for h, _ in replies.values() if not h.get("ok")]
        if errors:
            cls = WorkerLostError if self.failure or "died" in errors[0] else KVStoreError
            raise cls(errors[0])
        return replies

    def _read_notices(self) -> None:
        while True:
            try:
                frames = self.sched.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                header, _ = self.codec.open(frames)
            except AuthError:
                continue
            self.notices.append(header)
            op = header.get("op")
            if op == "abort":
                self.failure = header["error"]
            elif op == "node_dead":
                who = f"{header['role']} {header['rank']}"
                if header["role"] == "server" or self.on_worker_death == "fail":
                    self.failure = f"{who} died ({header['reason']}); the job stops"

    def _check_alive(self) -> None:
        if self.failure:
            raise WorkerLostError(self.failure)
        silent = time.monotonic() - self.heartbeat.last_ack
        if silent > self.env.heartbeat_timeout:
            raise WorkerLostError(f"the scheduler at {self.env.scheduler_address} has not "
                                  f"answered for {silent:.0f} s")

    def scheduler_call(self, header: dict, timeout: float | None = None) -> dict:
        """A request to the scheduler (barrier, finalize), answered with ``ok``."""
        header = {**header, "role": "worker", "rank": self.rank}
        self.sched.send_multipart(self.codec.seal(header))
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.sched.poll(500):
                frames = self.sched.recv_multipart()
                reply, _ = self.codec.open(frames)
                if reply.get("op") == "ok":
                    return reply
                self.notices.append(reply)
                if reply.get("op") in ("abort", "node_dead"):
                    self._read_notices_from(reply)
            self._check_alive()
            if deadline is not None and time.monotonic() > deadline:
                raise KVStoreError(f"the scheduler did not answer {header['op']} "
                                   f"within {timeout:g} s")

    def _read_notices_from(self, header: dict) -> None:
        if header["op"] == "abort":
            self.failure = header["error"]
        elif header["role"] == "server" or self.on_worker_death == "fail":
            self.failure = f"{header['role']} {header['rank']} died ({header['reason']}); the job stops"

    def close(self) -> None:
        """Leave the job: the servers stop counting on this worker."""
        if self.closed:
            return
        self.closed = True
        try:
            if not self.failure:
                self.scheduler_call({"op": "finalize"}, timeout=5.0)
        except KVStoreError:
            pass
        finally:
            self.heartbeat.stopping.set()
            self.heartbeat.join(timeout=2 * self.env.heartbeat_interval + 1)
            self.ctx.destroy(0)
