"""The scheduler: rendezvous, membership, barriers and heartbeats (one per job).

It holds no parameters.  Nodes register with it; once all ``n`` workers and
``s`` servers are in, it hands out ranks and the addresses of the servers.
Afterwards it watches the nodes' connections: ZeroMQ's socket monitor reports
a connection that closes (a process that exits or is killed: at once) or that
stops answering ZMTP heartbeats for the heartbeat timeout (a hung host); the
node is declared dead and every node is told, so that nobody waits for it
forever.  A node inside a long computation is not silent: ZeroMQ's I/O thread
answers the heartbeats without Python.  Run as ``python -m kvstore_ext.ps.scheduler``; it prints
``KVX_SCHEDULER_PORT=<port>`` once bound.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import zmq

from .. import jobenv
from zmq.utils.monitor import recv_monitor_message

from .transport import (HANDSHAKE_FAILED, AuthError, Codec, HandshakeGuard, Limits, configure,
                        destroy, handshake_password, new_context, recv_message)
from .protocol import SCHEDULER_OPS, Op

ROLES = ("worker", "server")
#: the most worker ranks a job hands out, joiners included (each costs every node some state)
MAX_WORKERS = 1024
#: workers started to join a job (launch.py --join) that may wait for it to start
MAX_EARLY_JOINERS = 64
OPS = SCHEDULER_OPS
MAX_REASON = 1000   # characters of a worker's reason kept (it is repeated to every node)
#: a worker is named to the others as quiet after this many seconds without a kvstore call
QUIET_AFTER_S = 1.0
#: quiet workers named in one answer, and how often (seconds) the list is made again
MAX_QUIET, QUIET_REFRESH_S = 8, 1.0

log = logging.getLogger("kvstore_ext.scheduler")


class Scheduler:
    def __init__(self, host: str, port: int, num_workers: int, num_servers: int, secret: bytes,
                 on_worker_death: str = "fail", heartbeat_timeout: float = 10.0,
                 start_timeout: float = 600.0, limits: Limits | None = None):
        self.num_workers = num_workers
        self.num_servers = num_servers
        self.codec = Codec(secret, names={"scheduler"})
        self.outbox, self.inbox = self.codec.outbox(), self.codec.inbox()
        self.on_worker_death = on_worker_death
        self.heartbeat_timeout = heartbeat_timeout
        self.start_timeout = start_timeout
        self.limits = limits or Limits(heartbeat_timeout=heartbeat_timeout,
                                       handshake_password=handshake_password(secret))
        self.ctx = new_context()
        self.guard = HandshakeGuard(self.ctx, self.limits)
        self.sock = configure(self.ctx.socket(zmq.ROUTER), self.limits)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED)
        self.fds: dict[int, tuple[str, int]] = {}   # connection -> the node it belongs to
        self.closed_before_start: dict[int, float] = {}   # connection -> when it closed
        self.malformed = 0
        self.quiet: tuple = (float("-inf"), [])   # (when made, :meth:`quiet_workers`' list)
        if port:
            self.sock.bind(f"tcp://{host}:{port}")
            self.port = port
        else:
            self.port = self.sock.bind_to_random_port(f"tcp://{host}")
        self.host = host
        self.pending: list[tuple[bytes, dict]] = []
        #: workers started to join (launch.py --join) that came before the job started: they
        #: join it once it has, and never take one of its own ranks
        self.early_joiners: list[tuple[bytes, dict]] = []
        self.nodes: dict[tuple[str, int], dict] = {}   # (role, rank) -> {ident, state, last_seen}
        self.store: dict | None = None
        self.store_from: int | None = None
        self.barrier_waiting: list[tuple[bytes, int]] = []
        self.failure: str | None = None
        self.started = False
        self.exit_code = 0

    # -- messaging -------------------------------------------------------------------------
    def send(self, ident: bytes, header: dict, to: str) -> None:
        try:
            self.sock.send_multipart([ident, *self.codec.seal(header, to=to,
                                                                outbox=self.outbox)])
        except zmq.ZMQError:
            pass

    def broadcast(self, header: dict, roles=("worker", "server")) -> None:
        for (role, rank), node in self.nodes.items():
            if role in roles and node["state"] == "live":
                # a worker listens for notices on the socket it sends heartbeats from
                self.send(node.get("notify", node["ident"]), header, f"{role}:{rank}")

    # -- main loop -------------------------------------------------------------------------
    def run(self) -> int:
        t0 = time.monotonic()
        shutdown_at = None
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        while True:
            events = dict(poller.poll(200))
            if self.sock in events:
                for _ in range(1024):
                    try:
                        frames = recv_message(self.sock, self.limits.max_frames)
                    except zmq.Again:
                        break
                    except AuthError as exc:
                        self.codec.rejected[exc.reason] += 1
                        if self.codec.worth_logging(exc):
                            log.warning("dropped a message: %s", exc)
                        continue
                    self.handle(frames)
            if self.monitor in events:
                self.check_connections()
            now = time.monotonic()
            if not self.started:
                if now - t0 > self.start_timeout:
                    self.abort(self.missing_at_start())
                    return 1
                continue
            workers_active = [k for k, n in self.nodes.items()
                              if k[0] == "worker" and n["state"] == "live"]
            if not workers_active and shutdown_at is None:
                self.broadcast({"op": Op.SHUTDOWN}, roles=("server",))
                for (role, _), node in self.nodes.items():
                    if role == "server" and node["state"] == "live":
                        node["state"] = "left"   # their connections now close as they should
                shutdown_at = now
            if shutdown_at is not None and now - shutdown_at > 0.5:
                break
        refused = {**self.codec.rejected, **({"malformed": self.malformed} if self.malformed else {}),
                   **({"handshake": self.guard.refused} if self.guard.refused else {})}
        if refused:
            log.warning("messages refused during the job: %s", json.dumps(refused, sort_keys=True))
        self.guard.stop()
        destroy(self.ctx)
        return self.exit_code

    def missing_at_start(self) -> str:
        workers = sum(1 for _, h in self.pending if h.get("role") == "worker")
        servers = sum(1 for _, h in self.pending if h.get("role") == "server")
        return (f"only {workers} of {self.num_workers} workers and {servers} of "
                f"{self.num_servers} servers registered with the scheduler within "
                f"{self.start_timeout:g} s (launch.py --start-timeout)")

    def handle(self, frames) -> None:
        """One message; a bad one is dropped and counted, never fatal."""
        ident, rest = frames[0].bytes, frames[1:]
        try:
            header, _ = self.codec.open(rest, self.inbox)
        except AuthError as exc:
            if self.codec.worth_logging(exc):
                log.warning("dropped a message: %s (%d so far)", exc,
                            self.codec.rejected[exc.reason])
            return
        try:
            self.dispatch(ident, header, frames[0].get(zmq.SRCFD))
        except Exception as exc:   # a malformed header from a holder of the secret
            self.malformed += 1
            if self.malformed <= 5 or self.malformed % 1000 == 0:
                log.warning("dropped a malformed %r message (%d so far): %s: %s",
                            str(header.get("op"))[:40], self.malformed, type(exc).__name__, exc)

    def dispatch(self, ident: bytes, header: dict, fd: int) -> None:
        op, role, rank = header.get("op"), header.get("role"), header.get("rank")
        if op not in OPS or role not in ROLES:
            raise ValueError(f"unknown op {op!r} or role {role!r}")
        if op == Op.REGISTER:
            self.register(ident, header, fd)
            return
        count = self.num_workers if role == "worker" else self.num_servers
        if type(rank) is not int or not 0 <= rank < count:
            raise ValueError(f"rank {rank!r} is not a {role} rank of this job")
        key = (role, rank)
        node = self.nodes.get(key)
        if node is None:
            raise ValueError(f"{role} {rank} has not registered")
        node["last_seen"] = time.monotonic()
        if fd is not None and fd >= 0 and node["state"] == "live":
            self.fds[fd] = key
        to = f"{role}:{rank}"
        if op == Op.HEARTBEAT:
            node["notify"] = ident
            answer = {"op": Op.ACK, "failure": self.failure}
            if role == "worker":
                idle = header.get("idle")
                node["idle"] = (float(idle), node["last_seen"]) \
                    if type(idle) in (int, float) and 0 <= idle < 1e9 else None
                answer["quiet"] = self.quiet_workers(rank, node["last_seen"])
            self.send(ident, answer, to)
        elif op == Op.BARRIER and role == "worker":
            self.barrier_waiting.append((ident, rank))
            self.maybe_release_barrier()
        elif op == Op.FINALIZE and role == "worker":
            self.leave(key, "finished")
            self.send(ident, {"op": Op.OK}, to)
        elif op == Op.FAILED and role == "worker":
            # why the worker is about to stop (it lost a server): said when its exit is seen,
            # so that the others name the lost server, not only the worker that went with it
            node["cause"] = str(header.get("error"))[:MAX_REASON]

    def quiet_workers(self, asking: int, now: float) -> list:
        """``[[rank, seconds], ...]``: the live workers, ``asking`` aside, that have made no
        kvstore call for :data:`QUIET_AFTER_S` s or more, as their heartbeats last said, the
        longest first (at most :data:`MAX_QUIET`).  A worker whose round or barrier waits
        names them in its stall report: a worker stuck in its own code is alive to every
        heartbeat, and only this says who it is.  Made again once a second at most: every
        worker asks with each heartbeat."""
        made, found = self.quiet
        if now - made >= QUIET_REFRESH_S:
            found = []
            for (role, rank), node in self.nodes.items():
                if role == "worker" and node["state"] == "live" and node.get("idle"):
                    seconds, at = node["idle"]
                    if seconds + now - at >= QUIET_AFTER_S:
                        found.append([rank, round(seconds + now - at, 1)])
            found = sorted(found, key=lambda pair: -pair[1])[:MAX_QUIET + 1]
            self.quiet = (now, found)
        return [pair for pair in found if pair[0] != asking][:MAX_QUIET]

    def check_connections(self) -> None:
        """Connections that closed or timed out (ZeroMQ's socket monitor): their node is dead,
        unless it has left the job properly."""
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if self.guard.note(event["event"]) or event["event"] != zmq.EVENT_DISCONNECTED:
                continue
            key = self.fds.pop(event["value"], None)
            if key is None and not self.started:   # a registered node's, perhaps: see start
                self.closed_before_start[event["value"]] = time.monotonic()
            node = self.nodes.get(key)
            if node is None or node["state"] != "live":
                continue
            self.declare_dead(key, "its connection to the scheduler closed: the process "
                                   "exited or was killed, or its host stopped answering for "
                                   f"{self.heartbeat_timeout:g} s")

    # -- rendezvous ------------------------------------------------------------------------
    def register(self, ident: bytes, header: dict, fd) -> None:
        node = header.get("node")
        if not isinstance(node, str) or len(node) > 80:
            raise ValueError("register without a node name")
        header["_fd"], header["_at"] = fd, time.monotonic()
        if self.started:
            self.join(ident, header, node)
            return
        if header.get("joining") is True:
            if len(self.early_joiners) >= MAX_EARLY_JOINERS:
                self.send(ident, {"op": Op.ABORT, "error": f"{MAX_EARLY_JOINERS} workers already "
                                  f"wait to join this job, which has not started"}, node)
                return
            self.early_joiners.append((ident, header))
            return
        role = header.get("role")
        # a node registering again (the same process) replaces its first registration; a node
        # more than the job has is refused by name, and the job's own still start it
        self.pending = [p for p in self.pending if p[1].get("node") != node]
        expected = self.num_workers if role == "worker" else self.num_servers
        if sum(1 for _, h in self.pending if h.get("role") == role) >= expected:
            self.send(ident, {"op": Op.ABORT, "error": (
                f"the job has {expected} {role}s and all have registered; another {role} "
                f"cannot take part (a worker joining a running job is started with launch.py "
                f"--join, after the job has started)")}, node)
            return
        if header.get("role") == "worker":
            store = header.get("store")
            who = header.get("rank_hint")
            if who is not None and type(who) is not int:
                raise ValueError(f"rank_hint {who!r} is not an integer")
            if not isinstance(store, dict):
                raise ValueError("register without a store")
            who = f"worker {who}" if who is not None else "a worker"
            if self.store is None:
                self.store, self.store_from = store, who
            elif store != self.store:
                self.pending.append((ident, header))
                self.abort(f"workers disagree on the kvstore: {self.store_from} uses "
                           f"{describe(self.store)} but {who} uses {describe(store)}")
                return
        self.pending.append((ident, header))
        workers = [p for p in self.pending if p[1]["role"] == "worker"]
        servers = [p for p in self.pending if p[1]["role"] == "server"]
        if len(workers) == self.num_workers and len(servers) == self.num_servers:
            self.start(workers, servers)

    def start(self, workers, servers) -> None:
        if any(not isinstance(h.get("host"), str) or type(h.get("port")) is not int
               for _, h in servers):
            self.abort("a server registered without a host and port")
            return
        hints = [h.get("rank_hint") for _, h in workers]
        given = [r for r in hints if r is not None]
        bad = [r for r in given if not 0 <= r < self.num_workers]
        if bad:
            self.abort(f"worker rank {bad[0]} is out of range 0..{self.num_workers - 1}")
            return
        if len(set(given)) != len(given):
            dup = next(r for r in given if given.count(r) > 1)
            self.abort(f"two workers asked for rank {dup}")
            return
        free = iter(r for r in range(self.num_workers) if r not in given)
        ranks = [h if h is not None else next(free) for h in hints]
        server_addrs = [f"tcp://{h['host']}:{h['port']}" for _, h in servers]
        now = time.monotonic()
        self.server_addrs = server_addrs
        # each server's host token (shm.host_token): workers on its host send it
        # their large messages through shared memory
        hosts = [h.get("shm") if isinstance(h.get("shm"), str) and len(h["shm"]) <= 64 else None
                 for _, h in servers]
        common = {"op": Op.TOPOLOGY, "num_workers": self.num_workers,
                  "num_servers": self.num_servers, "servers": server_addrs,
                  "server_hosts": hosts,
                  "store": self.store, "on_worker_death": self.on_worker_death}
        for j, (ident, h) in enumerate(servers):
            self.nodes[("server", j)] = {"ident": ident, "state": "live", "last_seen": now}
            self._watch(h["_fd"], ("server", j))
            self.send(ident, {**common, "rank": j}, h["node"])
        for rank, (ident, h) in zip(ranks, workers):
            self.nodes[("worker", rank)] = {"ident": ident, "state": "live", "last_seen": now}
            self._watch(h["_fd"], ("worker", rank))
            self.send(ident, {**common, "rank": rank}, h["node"])
        self.pending = []
        self.started = True
        for ident, h in self.early_joiners:
            self.join(ident, h, h["node"])
        self.early_joiners = []
        log.info("job started: %d workers, %d servers, %s", self.num_workers, self.num_servers,
                 describe(self.store))
        # a node whose connection closed after it registered, before the others came (a
        # server frozen at start-up, timed out by the heartbeats): dead, said now
        for key, (_, h) in [*((("server", j), p) for j, p in enumerate(servers)),
                            *((("worker", r), p) for r, p in zip(ranks, workers))]:
            closed = self.closed_before_start.get(h["_fd"])
            if closed is not None and closed > h["_at"] and self.nodes[key]["state"] == "live":
                self.fds.pop(h["_fd"], None)
                self.declare_dead(key, "its connection to the scheduler closed before the job "
                                       "started: the process exited or was killed, or its "
                                       f"host stopped answering for {self.heartbeat_timeout:g} s")
        self.closed_before_start.clear()

    def join(self, ident: bytes, header: dict, node: str) -> None:
        """A worker registering after the start joins the running job, if its store is one
        whose servers take a new worker (the asynchronous ones: each key's policy starts it at
        the minimum clock); it gets the next free rank.  Anything else is refused by name."""
        problem = None
        store = header.get("store")
        if header.get("role") != "worker" or self.failure:
            problem = ("the job has already started; a server cannot join it" if
                       header.get("role") == "server" else f"the job failed: {self.failure}")
        elif store != self.store:
            problem = (f"the job runs {describe(self.store)}; a worker with {describe(store)} "
                       f"cannot join it")
        elif not joinable(self.store):
            problem = (f"{describe(self.store)} does not take workers into a running job "
                       f"(only asynchronous stores do: dist_asp, dist_ssp, dist_dssp, dist_pool)")
        elif header.get("rank_hint") is not None:
            problem = f"a joining worker gets a fresh rank; it asked for {header['rank_hint']!r}"
        elif self.num_workers >= MAX_WORKERS:
            problem = f"the job has handed out {MAX_WORKERS} worker ranks, the most it takes"
        if problem:
            self.send(ident, {"op": Op.ABORT, "error": problem}, node)
            return
        rank = self.num_workers
        self.num_workers += 1
        self.nodes[("worker", rank)] = {"ident": ident, "state": "live",
                                        "last_seen": time.monotonic()}
        self._watch(header["_fd"], ("worker", rank))
        # the servers first, so that they know the rank when its first request comes
        self.broadcast({"op": Op.NODE_JOINED, "role": "worker", "rank": rank}, roles=("server",))
        self.send(ident, {"op": Op.TOPOLOGY, "num_workers": self.num_workers,
                          "num_servers": self.num_servers, "servers": self.server_addrs,
                          "store": self.store, "on_worker_death": self.on_worker_death,
                          "rank": rank, "joined": True}, node)
        log.info("worker %d joined the job", rank)

    def _watch(self, fd, key) -> None:
        if fd is not None and fd >= 0:
            self.fds[fd] = key

    def abort(self, message: str) -> None:
        log.error("%s", message)
        for ident, h in self.pending + self.early_joiners:
            self.send(ident, {"op": Op.ABORT, "error": message}, h["node"])
        self.broadcast({"op": Op.ABORT, "error": message})
        self.fail(message)
        if not self.started:
            self.started = True   # fall through to shutdown handling
            for node in self.nodes.values():
                node["state"] = "left"

    def fail(self, message: str) -> None:
        """The job fails for ``message``.  The first reason is also printed on standard
        output (``jobenv.FAILURE_LINE``) for launch.py, whose last word would otherwise name the
        first process to exit, not the node the job lost (a frozen one never exits)."""
        if self.failure is None:
            print(f"{jobenv.FAILURE_LINE}{json.dumps(message)}", flush=True)
        self.failure = message
        self.exit_code = 1

    # -- membership ------------------------------------------------------------------------
    def declare_dead(self, key, reason: str) -> None:
        role, rank = key
        self.nodes[key]["state"] = "dead"
        cause = self.nodes[key].get("cause")
        if cause:
            reason = f"it stopped because {cause}"   # its exit follows from that
        log.error("%s %d is dead (%s)", role, rank, reason)
        notice = {"op": Op.NODE_DEAD, "role": role, "rank": rank, "reason": reason}
        if role == "server" or self.on_worker_death == "fail":
            self.fail(f"{role} {rank} died ({reason})")
        self.broadcast(notice)
        if role == "server":
            self.abort(f"server {rank} died ({reason}); the job stops")
        self.maybe_release_barrier(notice)

    def leave(self, key, why: str) -> None:
        node = self.nodes.get(key)
        if node is None or node["state"] != "live":
            return
        node["state"] = "left"
        self.broadcast({"op": Op.NODE_LEFT, "role": key[0], "rank": key[1]}, roles=("server",))
        self.maybe_release_barrier()

    def maybe_release_barrier(self, notice: dict | None = None) -> None:
        """Let the workers at a barrier go once every live worker is there; once the job
        stops (a server died, or a worker under ``fail``), tell them why instead (``notice``,
        the death that stopped it): an OK let a barrier return as if nothing had happened."""
        if self.barrier_waiting and self.failure:
            answer = notice or {"op": Op.ABORT, "error": f"{self.failure}; the job stops"}
            for ident, rank in self.barrier_waiting:
                self.send(ident, answer, f"worker:{rank}")
            self.barrier_waiting = []
            return
        live = {r for (role, r), n in self.nodes.items() if role == "worker" and n["state"] == "live"}
        arrived = {r for _, r in self.barrier_waiting}
        if self.barrier_waiting and live <= arrived:
            for ident, rank in self.barrier_waiting:
                self.send(ident, {"op": Op.OK}, f"worker:{rank}")
            self.barrier_waiting = []


def joinable(store: dict | None) -> bool:
    """Whether the servers of ``store`` take a worker into a running job."""
    from ..registry import STORES
    row = STORES.get((store or {}).get("type"))
    if row is None or row.policy is None:
        return False
    return bool(getattr(row.make_policy([0], row.check(store.get("params") or {})),
                        "joinable", False))


def describe(store: dict | None) -> str:
    if not store:
        return "?"
    inner = ", ".join(f"{k}={v}" for k, v in sorted(store.get("params", {}).items()))
    return f"{store.get('type')}({inner})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="kvstore_ext scheduler (started by launch.py)")
    parser.add_argument("--host", default=os.environ.get(jobenv.SCHEDULER_HOST, "127.0.0.1"),
                        help="address to bind (default: $KVX_SCHEDULER_HOST or 127.0.0.1)")
    parser.add_argument("--port", type=int, default=int(os.environ.get(jobenv.SCHEDULER_PORT, "0")),
                        help="port to bind; 0 picks a free one (default: $KVX_SCHEDULER_PORT or 0)")
    parser.add_argument("--start-timeout", type=float,
                        default=float(os.environ.get(jobenv.START_TIMEOUT) or 600.0),
                        help="seconds to wait for every node to register (default: "
                             "$KVX_START_TIMEOUT or 600)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[kvstore_ext scheduler] %(message)s")
    env = os.environ
    try:
        secret = jobenv.parse_secret(env[jobenv.SECRET])
        num_workers = int(env[jobenv.NUM_WORKER])
        num_servers = int(env[jobenv.NUM_SERVER])
    except (KeyError, ValueError) as exc:
        print(f"kvstore_ext scheduler: {jobenv.SECRET}, {jobenv.NUM_WORKER} and {jobenv.NUM_SERVER} must "
              f"be set ({exc})", file=sys.stderr)
        return 2
    interval = float(env.get(jobenv.HEARTBEAT_INTERVAL) or 1.0)
    timeout = float(env.get(jobenv.HEARTBEAT_TIMEOUT) or max(10.0, 5 * interval))
    sched = Scheduler(args.host, args.port, num_workers, num_servers, secret,
                      on_worker_death=env.get(jobenv.ON_WORKER_DEATH, "fail"),
                      heartbeat_timeout=timeout, start_timeout=args.start_timeout,
                      limits=Limits.from_environ(interval, timeout, secret))
    print(f"{jobenv.SCHEDULER_PORT}={sched.port}", flush=True)
    return sched.run()


if __name__ == "__main__":
    sys.exit(main())
