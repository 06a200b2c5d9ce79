"""A parameter server: holds blocks of keys, runs MXNet's optimizer, answers pushes and pulls.

One thread, one event loop: requests are handled in arrival order, so no
locks are needed.  What a push means (apply now or at the end of a round,
who gets OK and when) is decided by the key's synchronisation policy
(:mod:`kvstore_ext.policies`); this module only moves arrays and replies.
Run as ``python -m kvstore_ext.server`` inside a job (launch.py does it).
"""
from __future__ import annotations

import heapq
import itertools
import logging
import os
import pickle
import sys
import time
from collections import deque

import numpy as np
import zmq

from . import config as cfg
from .faults import FaultPlan
from .metrics import ServerMetrics, write_json
from .policies import make_policy
from .policies.psp import resolve_min_pushes
from .psp_server import PartialSyncHandler, make_psp_policy
from .transport import AuthError, Codec, array_from_buffer, bind_random, new_context

log = logging.getLogger("kvstore_ext.server")

mx = None  # imported in main(), after the engine is chosen
SYNCHRONOUS_ENGINE = False
AGGREGATE_KEYS = 32


def memory_view(array) -> np.ndarray:
    """A numpy view of a CPU NDArray's memory (valid while the NDArray lives)."""
    import ctypes
    from mxnet.base import _LIB, check_call
    ptr = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(array.handle, ctypes.byref(ptr)))
    dtype = np.dtype(array.dtype)
    raw = (ctypes.c_char * (array.size * dtype.itemsize)).from_address(ptr.value)
    return np.frombuffer(raw, dtype=dtype)


class RequestError(Exception):
    """A request this server refuses; the message goes back to the worker that sent it."""


class Slot:
    """One block of one key: its weights, gathered gradient, version and policy."""

    __slots__ = ("key", "block", "shape", "dtype", "size", "weight", "grad", "acc", "gathered",
                 "version", "policy", "waiting", "pulled", "cache", "cache_version", "held")

    def __init__(self, key, block, shape, dtype, value: np.ndarray, policy):
        self.key, self.block, self.shape, self.dtype = key, block, tuple(shape), np.dtype(dtype)
        self.size = value.size
        self.weight = mx.nd.array(value, dtype=self.dtype)
        self.grad = mx.nd.zeros(self.size, dtype=self.dtype)
        # with the synchronous engine, gradients are summed straight into the NDArray's memory
        self.acc = memory_view(self.grad) if SYNCHRONOUS_ENGINE else np.zeros(self.size, self.dtype)
        self.gathered = 0
        self.version = 0
        self.policy = policy
        self.waiting: dict[int, deque] = {}
        self.pulled: dict[int, int] = {}
        self.cache = None
        self.cache_version = -1
        self.held: deque = deque()   # pushes for a later round: (worker, grad, pending)

    def name(self) -> str:
        return f"key {self.key!r}" + (f" block {self.block}" if self.block else "")

    def gather(self, grad: np.ndarray) -> None:
        if self.gathered:
            np.add(self.acc, grad, out=self.acc)
        else:
            np.copyto(self.acc, grad)
        self.gathered += 1

    def value(self) -> np.ndarray:
        if self.cache_version != self.version:
            self.cache = self.weight.asnumpy()
            self.cache_version = self.version
        return self.cache


class Pending:
    """A request that waits for OK on some of its slots."""

    __slots__ = ("ident", "seq", "worker", "slots", "outstanding", "with_values")

    def __init__(self, ident, seq, worker, slots, with_values):
        self.ident, self.seq, self.worker = ident, seq, worker
        self.slots, self.outstanding, self.with_values = slots, len(slots), with_values


class Server:
    def __init__(self, env: cfg.JobEnv, start_timeout: float = 600.0):
        self.env = env
        self.codec = Codec(env.secret)
        self.ctx = new_context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.port = bind_random(self.router, env.node_host)
        self.sched = self.ctx.socket(zmq.DEALER)
        self.sched.connect(env.scheduler_address)
        self.slots: dict[tuple, Slot] = {}
        self.init_waiting: list[tuple] = []
        self.updater = None
        self.optimizer_blob: bytes | None = None
        self.failure: str | None = None
        self.running = True
        self.ops = {"init": self.op_init, "push": self.op_push, "pushpull": self.op_push,
                    "pull": self.op_pull, "set_optimizer": self.op_set_optimizer,
                    "get_states": self.op_get_states, "set_states": self.op_set_states,
                    "stats": self.op_stats, "hello": self.op_hello}
        self.timers: list = []            # (due, n, callback): round deadlines, late replies
        self._timer_ids = itertools.count()
        self._register(start_timeout)
        self.metrics = ServerMetrics(self.rank)
        self.faults = FaultPlan.from_env(self.rank)
        self.psp = None
        if self.store_type == "dist_psp":
            # partial push / pull: stamped pushes, versioned pulls, replies in parts
            self.psp = PartialSyncHandler(self)
            try:
                self.psp_min_pushes = resolve_min_pushes(self.store_params.get("min_pushes"),
                                                         self.num_workers)
            except ValueError as exc:   # the workers say so too; refuse every request
                self.psp_min_pushes = self.num_workers
                self.fail(str(exc))
            self.ops.update({"push": self.psp.op_push, "pushpull": self.psp.op_push,
                             "pull": self.psp.op_pull})

    # -- rendezvous --------------------------------------------------------------------------
    def _register(self, start_timeout: float) -> None:
        self.sched.send_multipart(self.codec.seal(
            {"op": "register", "role": "server", "host": self.env.node_host, "port": self.port}))
        if not self.sched.poll(int(start_timeout * 1000)):
            raise RuntimeError(f"the scheduler at {self.env.scheduler_address} did not answer "
                               f"within {start_timeout:.0f} s")
        header, _ = self.codec.open(self.sched.recv_multipart())
        if header["op"] == "abort":
            raise RuntimeError(header["error"])
        self.rank = header["rank"]
        self.num_workers = header["num_workers"]
        self.members = set(range(self.num_workers))
        store = header["store"]
        self.store_type, self.store_params = store["type"], store["params"]
        self.on_worker_death = header["on_worker_death"]
        self.last_ack = time.monotonic()
        log.info("server %d serving %s on %s:%d", self.rank, self.store_type,
                 self.env.node_host, self.port)

    # -- replies -----------------------------------------------------------------------------
    def reply(self, ident, seq, extra=None, buffers=()) -> None:
        header = {"op": "reply", "seq": seq, "ok": True}
        if extra:
            header.update(extra)
        self.router.send_multipart([ident, *self.codec.seal(header, buffers)], copy=False)

    def reply_error(self, ident, seq, message: str) -> None:
        self.metrics.errors += 1
        self.router.send_multipart([ident, *self.codec.seal(
            {"op": "reply", "seq": seq, "ok": False, "error": message})])

    def reply_values(self, p: Pending) -> None:
        values = []
        for slot in p.slots:
            values.append(slot.value())
            slot.pulled[p.worker] = slot.version
        # one reply carries every block: it is as late as its latest block
        late = max(self._lateness(len(values)), default=0.0)
        self._send_later(p.ident, {"op": "reply", "seq": p.seq, "ok": True}, values, late)

    def send_part(self, p, indices) -> None:
        """Some blocks of a partial pull (``dist_psp``), with their versions; a block the fault
        plan delays goes in a later part of its own.  The worker counts the blocks it has."""
        groups: dict[float, list[int]] = {}
        for i, late in zip(indices, self._lateness(len(indices))):
            groups.setdefault(late, []).append(i)
        for late, group in groups.items():
            slots = [p.slots[i] for i in group]
            for slot in slots:
                slot.pulled[p.worker] = slot.version
            header = {"op": "reply", "seq": p.seq, "ok": True, "part": group,
                      "versions": [s.version for s in slots]}
            self._send_later(p.ident, header, [s.value() for s in slots], late)

    def _lateness(self, blocks: int) -> list[float]:
        """Seconds the fault plan holds back each of ``blocks`` block replies (0: on time)."""
        if not self.faults.active:
            return [0.0] * blocks
        return [self.faults.delay() for _ in range(blocks)]

    def _send_later(self, ident, header, values, late: float) -> None:
        frames = [ident, *self.codec.seal(header, values)]
        if late > 0:   # the loop serves others meanwhile (a cached value is replaced, not changed)
            self.at(time.monotonic() + late, lambda: self.router.send_multipart(frames, copy=False))
        else:
            self.router.send_multipart(frames, copy=False)

    def at(self, due: float, callback) -> None:
        """Run ``callback`` from the event loop once the monotonic clock reaches ``due``."""
        heapq.heappush(self.timers, (due, next(self._timer_ids), callback))

    def _run_timers(self) -> float:
        """Run the due timers; return seconds until the next one (or a long time)."""
        while self.timers and self.timers[0][0] <= time.monotonic():
            _, _, callback = heapq.heappop(self.timers)
            callback()
        return self.timers[0][0] - time.monotonic() if self.timers else 3600.0

    # -- main loop ---------------------------------------------------------------------------
    def run(self) -> int:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.sched, zmq.POLLIN)
        interval = self.env.heartbeat_interval
        next_beat = 0.0
        while self.running:
            until_timer = self._run_timers()
            events = dict(poller.poll(max(0, min(int(interval * 500), int(until_timer * 1000) + 1))))
            if self.router in events:
                for _ in range(256):
                    try:
                        frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self.handle(frames)
            if self.sched in events:
                while self.running:
                    try:
                        frames = self.sched.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self.handle_scheduler(frames)
            now = time.monotonic()
            if now >= next_beat:
                self.sched.send_multipart(self.codec.seal(
                    {"op": "heartbeat", "role": "server", "rank": self.rank}))
                next_beat = now + interval
            if now - self.last_ack > self.env.heartbeat_timeout:
                log.error("server %d: the scheduler has not answered for %.0f s; stopping",
                          self.rank, now - self.last_ack)
                self.fail("the scheduler is unreachable")
                self.finish()
                return 1
        self.finish()
        return 0

    def finish(self) -> None:
        if self.env.metrics_dir:
            write_json(self.env.metrics_dir, f"server-{self.rank}.json", self.stats())
        self.ctx.destroy(0)

    def handle(self, frames) -> None:
        ident, rest = frames[0].bytes, frames[1:]
        try:
            header, buffers = self.codec.open(rest)
        except AuthError as exc:
            self.metrics.rejected_unauthenticated += 1
            log.warning("server %d rejected a message: %s", self.rank, exc)
            return
        seq = header.get("seq")
        if isinstance(header.get("reply_to"), str):
            # workers send on one socket and receive on another (their receiver thread's)
            ident = header["reply_to"].encode()
        if self.failure:
            self.reply_error(ident, seq, self.failure)
            return
        op = self.ops.get(header.get("op"))
        try:
            if op is None:
                raise RequestError(f"unknown operation {header.get('op')!r}")
            op(ident, header, buffers)
        except RequestError as exc:
            self.reply_error(ident, seq, str(exc))
        except Exception as exc:  # a bug or a bad optimizer: tell the worker, keep serving
            log.exception("server %d failed on %s", self.rank, header.get("op"))
            self.reply_error(ident, seq, f"server {self.rank}: {type(exc).__name__}: {exc}")

    def handle_scheduler(self, frames) -> None:
        try:
            header, _ = self.codec.open(frames)
        except AuthError:
            return
        op = header.get("op")
        self.last_ack = time.monotonic()
        if op == "node_dead" and header["role"] == "worker":
            rank, reason = header["rank"], header["reason"]
            if self.on_worker_death == "fail":
                self.fail(f"worker {rank} died ({reason}); the job stops "
                          f"(on-worker-death=fail)")
            else:
                log.warning("server %d: worker %d died (%s); continuing without it",
                            self.rank, rank, reason)
                self.remove_worker(rank)
        elif op == "node_left" and header["role"] == "worker":
            self.remove_worker(header["rank"])
        elif op == "abort":
            self.fail(header["error"])
        elif op == "shutdown":
            self.running = False

    def fail(self, message: str) -> None:
        """Answer every waiting request with the failure, and every later one too."""
        self.failure = message
        for slot in self.slots.values():
            for queue in slot.waiting.values():
                for p in queue:
                    if p.outstanding > 0:
                        p.outstanding = 0
                        self.reply_error(p.ident, p.seq, message)
            slot.waiting.clear()
            for _, _, p in slot.held:
                if p.outstanding > 0:
                    p.outstanding = 0
                    self.reply_error(p.ident, p.seq, message)
            slot.held.clear()
        for ident, seq, *_ in self.init_waiting:
            self.reply_error(ident, seq, message)
        self.init_waiting = []
        if self.psp is not None:
            self.psp.fail(message)

    def remove_worker(self, rank: int) -> None:
        if rank not in self.members:
            return
        self.members.discard(rank)
        if self.psp is not None:
            self.psp.remove_worker(rank)
            return
        now = time.monotonic()
        decisions = []
        for slot in self.slots.values():
            slot.waiting.pop(rank, None)
            slot.held = deque(h for h in slot.held if h[0] != rank)
            decisions.append((slot, slot.policy.remove_worker(rank, now)))
        self.carry_out(decisions)

    # -- operations --------------------------------------------------------------------------
    def _slot(self, item) -> Slot:
        key, block = item[0], item[1]
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
        items = header["items"]
        has_value = header.get("has_value", False)
        if has_value and len(buffers) != len(items):
            raise RequestError("init: one buffer per key expected")
        for item in items:
            key, block, dtype, shape = item[0], item[1], item[2], tuple(item[3])
            slot = self.slots.get((key, block))
            if slot is not None and (slot.shape != shape or slot.dtype != np.dtype(dtype)):
                raise RequestError(
                    f"key {key!r} is already initialised with shape {slot.shape} "
                    f"{slot.dtype.name}; cannot initialise it again with shape {shape} "
                    f"{np.dtype(dtype).name}")
        if has_value:
            for item, buf in zip(items, buffers):
                key, block, dtype, shape, size = item[0], item[1], item[2], tuple(item[3]), item[4]
                if (key, block) not in self.slots:
                    value = array_from_buffer(buf, dtype, (size,))
                    # all keys move together: the first key's policy logs the decisions
                    policy = (make_psp_policy(self) if self.psp is not None else
                              make_policy(self.store_type, self.members, self.store_params,
                                          record=self.metrics.decision_log is None))
                    if self.metrics.decision_log is None:
                        self.metrics.decision_log = (key, block, policy)
                    self.slots[(key, block)] = Slot(key, block, shape, dtype, value, policy)
        missing = {(i[0], i[1]) for i in items if (i[0], i[1]) not in self.slots}
        if missing:
            self.init_waiting.append((ident, header["seq"], missing))
        else:
            self.reply(ident, header["seq"])
        if has_value and self.init_waiting:
            still = []
            for ident2, seq2, miss in self.init_waiting:
                miss = {m for m in miss if m not in self.slots}
                if miss:
                    still.append((ident2, seq2, miss))
                else:
                    self.reply(ident2, seq2)
            self.init_waiting = still

    def op_pull(self, ident, header, buffers) -> None:
        worker = header["worker"]
        slots = []
        for item in header["items"]:
            slot = self._slot(item)
            self._check_block(slot, item[2], item[3], "pulled")
            slots.append(slot)
        self.reply_values(Pending(ident, header["seq"], worker, slots, True))

    def op_push(self, ident, header, buffers) -> None:
        worker = header["worker"]
        slots, grads = self.check_push_items(worker, header["items"], buffers)
        now = time.monotonic()
        pending = Pending(ident, header["seq"], worker, slots, header["op"] == "pushpull")
        decisions = []
        self.metrics.pushes_received += len(slots)
        for slot, grad in zip(slots, grads):
            if not slot.policy.accepts_now(worker) or (slot.held and
                                                       any(h[0] == worker for h in slot.held)):
                slot.held.append((worker, grad, pending))   # a push for a later round
            else:
                decisions.append((slot, self.take_push(slot, worker, grad, pending, now)))
        self.carry_out(decisions)

    def check_push_items(self, worker, items, buffers):
        """The slots and gradients of a push, every item checked before any is used."""
        if len(buffers) != len(items):
            raise RequestError(f"push: {len(items)} keys but {len(buffers)} buffers")
        slots, grads = [], []
        for item, buf in zip(items, buffers):
            slot = self._slot(item)
            self._check_block(slot, item[2], item[3], "pushed")
            problem = slot.policy.check_push(worker)
            if problem:
                raise RequestError(f"key {slot.key!r}: {problem}")
            slots.append(slot)
            if buf.nbytes != slot.size * slot.dtype.itemsize:
                raise RequestError(f"key {slot.key!r}: {buf.nbytes} bytes sent for {slot.size} "
                                   f"{slot.dtype.name} elements")
            grads.append(np.frombuffer(buf, dtype=slot.dtype))
        return slots, grads

    def take_push(self, slot: Slot, worker: int, grad, pending: Pending, now: float):
        slot.gather(grad)
        self.metrics.record_staleness(worker, slot.version - slot.pulled.get(worker, 0))
        queue = slot.waiting.get(worker)
        if queue is None:
            queue = slot.waiting[worker] = deque()
        queue.append(pending)
        return slot.policy.on_push(worker, now)

    def carry_out(self, decisions) -> None:
        """Apply what the policies said to apply (in one optimizer call), then send OKs;
        then take the held-back pushes that a new round accepts, and so on."""
        while decisions:
            self._apply_and_release(decisions)
            now = time.monotonic()
            touched = list({id(slot): slot for slot, _ in decisions if slot.held}.values())
            decisions = []
            for slot in touched:
                # each worker's earliest held push, in arrival order, if the new round takes it
                still, seen = deque(), set()
                for worker, grad, pending in slot.held:
                    if worker in seen or worker not in self.members \
                            or not slot.policy.accepts_now(worker):
                        if worker in self.members:
                            still.append((worker, grad, pending))
                        seen.add(worker)
                        continue
                    seen.add(worker)
                    decisions.append((slot, self.take_push(slot, worker, grad, pending, now)))
                slot.held = still

    def _apply_and_release(self, decisions) -> None:
        to_apply = list({id(slot): slot for slot, d in decisions
                         if d.apply and slot.gathered}.values())
        if to_apply:
            self.apply(to_apply)
        for slot, d in decisions:
            for worker, lead in d.released:
                self.metrics.record_ok(worker, lead)
                queue = slot.waiting.get(worker)
                if not queue:
                    continue
                p = queue.popleft()
                p.outstanding -= 1
                if p.outstanding == 0:
                    if p.with_values:
                        self.reply_values(p)
                    else:
                        self.reply(p.ident, p.seq)

    def apply(self, slots) -> None:
        for slot in slots:
            if not SYNCHRONOUS_ENGINE:
                slot.grad._sync_copyfrom(slot.acc)
            self.metrics.pushes_applied += slot.gathered
            slot.gathered = 0
        if self.updater is not None:
            self.updater([s.key for s in slots], [s.grad for s in slots], [s.weight for s in slots])
        else:  # no optimizer: the store holds the summed value, as MXNet's servers do
            for slot in slots:
                slot.grad.copyto(slot.weight)
        for slot in slots:
            slot.version += 1
        self.metrics.updates += len(slots)

    def op_set_optimizer(self, ident, header, buffers) -> None:
        blob = bytes(buffers[0])
        if blob != self.optimizer_blob:
            optimizer = pickle.loads(blob)   # authenticated by the job secret (see transport)
            if getattr(optimizer, "aggregate_num", 0) > 0:
                # a server updates many keys at once: fuse more of them per kernel call
                # (the same arithmetic per element, fewer calls)
                optimizer.aggregate_num = max(optimizer.aggregate_num, AGGREGATE_KEYS)
            self.updater = mx.optimizer.get_updater(optimizer)
            self.optimizer_blob = blob
        self.reply(ident, header["seq"])

    def op_get_states(self, ident, header, buffers) -> None:
        if self.updater is None:
            raise RequestError("no optimizer has been set on the kvstore, so it has no states")
        blocks = [[s.key, s.block] for s in self.slots.values()]
        self.reply(ident, header["seq"], {"blocks": blocks},
                   buffers=[self.updater.get_states(dump_optimizer=False)])

    def op_set_states(self, ident, header, buffers) -> None:
        states, optimizer = pickle.loads(bytes(buffers[0]))  # authenticated
        if optimizer is not None:
            self.updater = mx.optimizer.get_updater(optimizer)
            self.optimizer_blob = None
        if self.updater is None:
            raise RequestError("set an optimizer before loading optimizer states")
        self.updater.states = states
        self.updater.states_synced = dict.fromkeys(states, False)
        self.reply(ident, header["seq"])

    def op_hello(self, ident, header, buffers) -> None:
        self.reply(ident, header["seq"])

    def op_stats(self, ident, header, buffers) -> None:
        self.reply(ident, header["seq"], {"stats": self.stats()})

    def stats(self) -> dict:
        out = self.metrics.to_dict()
        if self.faults.active:
            out["faults"] = self.faults.to_dict()
        if self.psp is not None:
            out["psp"] = self.psp.to_dict()
        return out


def main(argv=None) -> int:
    global mx, SYNCHRONOUS_ENGINE
    logging.basicConfig(level=logging.INFO, format="[kvstore_ext server] %(message)s")
    # Updates run inline on small arrays: the threaded engine only adds latency here.
    os.environ.setdefault("MXNET_ENGINE_TYPE", "NaiveEngine")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for var in ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT"):
        os.environ.pop(var, None)   # never become an MXNet ps-lite node by accident
    import mxnet
    mx = mxnet
    SYNCHRONOUS_ENGINE = os.environ.get("MXNET_ENGINE_TYPE") == "NaiveEngine"
    try:
        env = cfg.JobEnv.from_environ("server")
        server = Server(env)
    except RuntimeError as exc:
        print(f"kvstore_ext server: {exc}", file=sys.stderr)
        return 1
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
