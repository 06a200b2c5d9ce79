"""The scheduler: rendezvous, membership, barriers and heartbeats (one per job).

It holds no parameters.  Nodes register with it; once all ``n`` workers and
``s`` servers are in, it hands out ranks and the addresses of the servers.
Afterwards it watches heartbeats: a worker that goes silent for longer than the
heartbeat timeout is declared dead and every node is told, so that nobody
waits for it forever.  Run as ``python -m kvstore_ext.scheduler``; it prints
``KVX_SCHEDULER_PORT=<port>`` once bound.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import zmq

from . import config as cfg
from .transport import AuthError, Codec, new_context

log = logging.getLogger("kvstore_ext.scheduler")


class Scheduler:
    def __init__(self, host: str, port: int, num_workers: int, num_servers: int, secret: bytes,
                 on_worker_death: str = "fail", heartbeat_timeout: float = 10.0,
                 start_timeout: float = 600.0):
        self.num_workers = num_workers
        self.num_servers = num_servers
        self.codec = Codec(secret)
        self.on_worker_death = on_worker_death
        self.heartbeat_timeout = heartbeat_timeout
        self.start_timeout = start_timeout
        self.ctx = new_context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        if port:
            self.sock.bind(f"tcp://{host}:{port}")
            self.port = port
        else:
            self.port = self.sock.bind_to_random_port(f"tcp://{host}")
        self.host = host
        self.pending: list[tuple[bytes, dict]] = []
        self.nodes: dict[tuple[str, int], dict] = {}   # (role, rank) -> {ident, state, last_seen}
        self.store: dict | None = None
        self.store_from: int | None = None
        self.barrier_waiting: list[tuple[bytes, int]] = []
        self.failure: str | None = None
        self.started = False
        self.exit_code = 0

    # -- messaging -------------------------------------------------------------------------
    def send(self, ident: bytes, header: dict) -> None:
        try:
            self.sock.send_multipart([ident, *self.codec.seal(header)])
        except zmq.ZMQError:
            pass

    def broadcast(self, header: dict, roles=("worker", "server")) -> None:
        for (role, _), node in self.nodes.items():
            if role in roles and node["state"] == "live":
                # a worker listens for notices on the socket it sends heartbeats from
                self.send(node.get("notify", node["ident"]), header)

    # -- main loop -------------------------------------------------------------------------
    def run(self) -> int:
        t0 = time.monotonic()
        shutdown_at = None
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while True:
            if dict(poller.poll(200)):
                while True:
                    try:
                        frames = self.sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self.handle(frames)
            now = time.monotonic()
            if not self.started:
                if now - t0 > self.start_timeout:
                    have = sum(1 for _, h in self.pending if h.get("role") == "worker")
                    self.abort(f"only {have} of {self.num_workers} workers registered with the "
                               f"scheduler within {self.start_timeout:.0f} s")
                    return 1
                continue
            self.check_heartbeats(now)
            workers_active = [k for k, n in self.nodes.items()
                              if k[0] == "worker" and n["state"] == "live"]
            if not workers_active and shutdown_at is None:
                self.broadcast({"op": "shutdown"}, roles=("server",))
                shutdown_at = now
            if shutdown_at is not None and now - shutdown_at > 0.5:
                break
        self.ctx.destroy(0)
        return self.exit_code

    def handle(self, frames) -> None:
        ident, rest = frames[0], frames[1:]
        try:
            header, _ = self.codec.open(rest)
        except AuthError as exc:
            log.warning("dropped a message that failed authentication: %s", exc)
            return
        op = header.get("op")
        key = (header.get("role"), header.get("rank"))
        if key in self.nodes:
            self.nodes[key]["last_seen"] = time.monotonic()
        if op == "register":
            self.register(ident, header)
        elif op == "heartbeat":
            if key in self.nodes:
                self.nodes[key]["notify"] = ident
            self.send(ident, {"op": "ack", "failure": self.failure})
        elif op == "barrier":
            self.barrier_waiting.append((ident, header["rank"]))
            self.maybe_release_barrier()
        elif op == "finalize":
            self.leave(("worker", header["rank"]), "finished")
            self.send(ident, {"op": "ok"})
        else:
            log.warning("unknown scheduler op %r", op)

    # -- rendezvous ------------------------------------------------------------------------
    def register(self, ident: bytes, header: dict) -> None:
        if self.started:
            self.send(ident, {"op": "abort", "error": "the job has already started; "
                              "late nodes cannot join"})
            return
        if header.get("role") == "worker":
            store = header.get("store")
            who = header.get("rank_hint")
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
        common = {"op": "topology", "num_workers": self.num_workers,
                  "num_servers": self.num_servers, "servers": server_addrs,
                  "store": self.store, "on_worker_death": self.on_worker_death}
        for j, (ident, _) in enumerate(servers):
            self.nodes[("server", j)] = {"ident": ident, "state": "live", "last_seen": now}
            self.send(ident, {**common, "rank": j})
        for rank, (ident, _) in zip(ranks, workers):
            self.nodes[("worker", rank)] = {"ident": ident, "state": "live", "last_seen": now}
            self.send(ident, {**common, "rank": rank})
        self.pending = []
        self.started = True
        log.info("job started: %d workers, %d servers, %s", self.num_workers, self.num_servers,
                 describe(self.store))

    def abort(self, message: str) -> None:
        log.error("%s", message)
        for ident, _ in self.pending:
            self.send(ident, {"op": "abort", "error": message})
        self.broadcast({"op": "abort", "error": message})
        self.failure = message
        self.exit_code = 1
        if not self.started:
            self.started = True   # fall through to shutdown handling
            for node in self.nodes.values():
                node["state"] = "left"

    # -- membership ------------------------------------------------------------------------
    def check_heartbeats(self, now: float) -> None:
        for (role, rank), node in list(self.nodes.items()):
            if node["state"] != "live" or now - node["last_seen"] <= self.heartbeat_timeout:
                continue
            reason = f"no heartbeat for {self.heartbeat_timeout:g} s"
            node["state"] = "dead"
            log.error("%s %d is dead (%s)", role, rank, reason)
            notice = {"op": "node_dead", "role": role, "rank": rank, "reason": reason}
            if role == "server" or self.on_worker_death == "fail":
                self.failure = f"{role} {rank} died ({reason})"
                self.exit_code = 1
            self.broadcast(notice)
            if role == "server":
                self.abort(f"server {rank} died ({reason}); the job stops")
            self.maybe_release_barrier()

    def leave(self, key, why: str) -> None:
        node = self.nodes.get(key)
        if node is None or node["state"] != "live":
            return
        node["state"] = "left"
        self.broadcast({"op": "node_left", "role": key[0], "rank": key[1]}, roles=("server",))
        self.maybe_release_barrier()

    def maybe_release_barrier(self) -> None:
        live = {r for (role, r), n in self.nodes.items() if role == "worker" and n["state"] == "live"}
        arrived = {r for _, r in self.barrier_waiting}
        if self.barrier_waiting and live <= arrived:
            for ident, _ in self.barrier_waiting:
                self.send(ident, {"op": "ok"})
            self.barrier_waiting = []


def describe(store: dict | None) -> str:
    if not store:
        return "?"
    inner = ", ".join(f"{k}={v}" for k, v in sorted(store.get("params", {}).items()))
    return f"{store.get('type')}({inner})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="kvstore_ext scheduler (started by launch.py)")
    parser.add_argument("--host", default=os.environ.get(cfg.SCHEDULER_HOST, "127.0.0.1"),
                        help="address to bind (default: $KVX_SCHEDULER_HOST or 127.0.0.1)")
    parser.add_argument("--port", type=int, default=int(os.environ.get(cfg.SCHEDULER_PORT, "0")),
                        help="port to bind; 0 picks a free one (default: $KVX_SCHEDULER_PORT or 0)")
    parser.add_argument("--start-timeout", type=float, default=600.0,
                        help="seconds to wait for every node to register (default 600)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[kvstore_ext scheduler] %(message)s")
    env = os.environ
    try:
        secret = bytes.fromhex(env[cfg.SECRET])
        num_workers = int(env[cfg.NUM_WORKER])
        num_servers = int(env[cfg.NUM_SERVER])
    except (KeyError, ValueError) as exc:
        print(f"kvstore_ext scheduler: {cfg.SECRET}, {cfg.NUM_WORKER} and {cfg.NUM_SERVER} must "
              f"be set ({exc})", file=sys.stderr)
        return 2
    interval = float(env.get(cfg.HEARTBEAT_INTERVAL) or 1.0)
    sched = Scheduler(args.host, args.port, num_workers, num_servers, secret,
                      on_worker_death=env.get(cfg.ON_WORKER_DEATH, "fail"),
                      heartbeat_timeout=float(env.get(cfg.HEARTBEAT_TIMEOUT) or max(10.0, 5 * interval)),
                      start_timeout=args.start_timeout)
    print(f"{cfg.SCHEDULER_PORT}={sched.port}", flush=True)
    return sched.run()


if __name__ == "__main__":
    sys.exit(main())
