"""An in-process parameter server (no sockets, no scheduler) for differential tests: two
servers driven with the same random requests, one whose blocks initialised together share a
policy (groups), one with a group per block (what per-key policies decide), must agree on
every reply, weight and metric.  :func:`install` points the server module at a virtual clock
(use it through pytest's ``monkeypatch``)."""
import itertools
import random
import time
import types

import mxnet as mx
import numpy as np

import kvstore_ext  # noqa: F401  (registers the stores)
from kvstore_ext import registry
from kvstore_ext.metrics import ServerMetrics
from kvstore_ext.ps import server as S
from kvstore_ext.ps.transport import Codec


class Clock:
    """The servers' time: it moves only when a test moves it."""

    def __init__(self):
        self.t = 1000.0

    def monotonic(self):
        return self.t


CLOCK = Clock()


def install(monkeypatch) -> Clock:
    """The server module on the virtual clock (and on MXNet, which its ``main`` imports)."""
    CLOCK.t = 1000.0
    monkeypatch.setattr(S, "mx", mx, raising=False)
    monkeypatch.setattr(S, "time", types.SimpleNamespace(monotonic=CLOCK.monotonic,
                                                        time=lambda: 0.0,
                                                        thread_time=time.thread_time))
    return CLOCK


class NoFaults:
    active = False


def make_server(store, params, workers, grouped, sizes, dtypes, optimizer=None):
    """A server of ``store`` holding one block per key of ``sizes``/``dtypes``, all in one
    group (``grouped``) or a group each; its replies are kept in ``.sent`` by sequence number."""
    s = S.Server.__new__(S.Server)
    s.slots, s.homes, s.groups, s.group_epoch, s.routes = {}, {}, [], 0, {}
    s.last_values = (None, None)
    s.codec = Codec(b"harness-secret-0123456789")
    s.init_waiting, s.init_seen, s.init_declared = [], {}, {}
    s.held_of = {}
    s.env = types.SimpleNamespace(window_bytes=64 << 20, start_timeout=600.0)
    s.optimizer, s.pooled, s.joined, s.handler = None, False, set(), None
    s.failure, s.failure_kind = None, "error"
    s.timers, s.value_replies, s.value_replies_since = [], [], 0.0
    s._timer_ids = itertools.count()
    s.metrics = ServerMetrics(0)
    s.faults = NoFaults()
    s.row = registry.lookup(store)
    s.pooled = s.row.name == "dist_pool"
    s.store_type, s.store_params = store, params
    s.num_workers, s.members = workers, set(range(workers))
    s.rank = 0
    s.sent = {}

    def send_to(ident, worker, header, buffers=()):
        assert header["seq"] not in s.sent, ("replied twice", header["seq"])
        s.sent[header["seq"]] = (worker, header.get("ok"), header.get("error"),
                                 [np.array(b, copy=True) for b in buffers],
                                 {k: v for k, v in header.items()
                                  if k in ("batch_size", "pool", "lr", "updates")})
    s.send_to = send_to
    rng = np.random.default_rng(0)
    for k, (n, dt) in enumerate(zip(sizes, dtypes)):
        value = rng.standard_normal(n).astype(dt)
        s.slots[(k, 0)] = s.new_slot(k, 0, (n,), value)
        if not grouped:
            s.groups[-1].fresh = False      # the next block starts a group of its own
    if optimizer is not None:
        s._use_updater(optimizer())
    return s


def items_of(s, keys):
    return [[k, 0, s.slots[(k, 0)].dtype.str, s.slots[(k, 0)].size] for k in keys]


def buffers_of(arrays):
    packed = b"".join(a.tobytes() for a in arrays)
    out, at = [], 0
    view = memoryview(packed)
    for a in arrays:
        out.append(view[at:at + a.nbytes])
        at += a.nbytes
    return out


def weights(s):
    return {k: slot.weight.asnumpy().copy() for (k, _), slot in s.slots.items()}


def metrics(s):
    d = s.metrics.to_dict()
    out = {k: d[k] for k in d if k not in ServerMetrics.MEASURED}
    if "dssp" in out:   # wall-clock times depend on when the metrics object was made
        out["dssp"] = {k: ([{f: v for f, v in e.items() if f != "time"} for e in val]
                           if isinstance(val, list) else val) for k, val in out["dssp"].items()}
    return out


def run(store, params, seed, steps=400, workers=3, optimizer=None, pulls=True, leave=True,
        partial=0.5, join=False):
    """Servers ``(grouped, per block)`` after the same ``steps`` random requests: pushes and
    pulls of the whole model or (``partial`` of the time) of some keys, a worker leaving
    half way (``leave``) or joining a third of the way (``join``)."""
    rng = random.Random(seed)
    sizes = [rng.choice([1, 3, 7, 50, 20000]) for _ in range(7)]
    dtypes = [rng.choice([np.float32, np.float32, np.float64]) for _ in sizes]
    a = make_server(store, params, workers, True, sizes, dtypes, optimizer)
    b = make_server(store, params, workers, False, sizes, dtypes, optimizer)
    assert len(a.groups) == 1 and len(b.groups) == len(sizes)
    grng = np.random.default_rng(seed)
    seq = itertools.count(1)
    members = set(range(workers))
    for step in range(steps):
        CLOCK.t += rng.random()
        if join and step == steps // 3:
            for s in (a, b):
                s.add_worker(workers)
                s.send_value_replies()
            members.add(workers)
            continue
        if leave and step == steps // 2 and workers > 2:
            gone = max(members)
            members.discard(gone)
            for s in (a, b):
                s.remove_worker(gone)
                s.send_value_replies()
            continue
        worker = rng.choice(sorted(members))
        op = rng.choice(["pushpull", "pushpull", "push"] + (["pull"] if pulls else []))
        if rng.random() >= partial:
            keys = list(range(len(sizes)))           # a whole-model push, usually
        else:
            keys = rng.sample(range(len(sizes)), rng.randint(1, len(sizes)))
        q = next(seq)
        grads = [grng.standard_normal(sizes[k]).astype(dtypes[k]) for k in keys]
        for s in (a, b):
            header = {"op": op, "seq": q, "worker": worker, "items": items_of(s, keys)}
            try:
                if op == "pull":
                    s.op_pull(b"x", header, [])
                else:
                    s.op_push(b"x", header, buffers_of(grads))
            except S.RequestError as exc:
                s.sent[q] = (worker, False, str(exc), [], {})
            s.send_value_replies()
    return a, b


def compare(a, b):
    problems = []
    wa, wb = weights(a), weights(b)
    for k in wa:
        if not np.array_equal(wa[k], wb[k]):
            problems.append(f"weight of key {k} differs: max {np.abs(wa[k] - wb[k]).max()}")
    if set(a.sent) != set(b.sent):
        problems.append(f"replies differ: only grouped {sorted(set(a.sent) - set(b.sent))[:10]},"
                        f" only per-block {sorted(set(b.sent) - set(a.sent))[:10]}")
    for q in sorted(set(a.sent) & set(b.sent)):
        ra, rb = a.sent[q], b.sent[q]
        if ra[:3] != rb[:3] or len(ra[3]) != len(rb[3]) or \
                any(not np.array_equal(x, y) for x, y in zip(ra[3], rb[3])) or ra[4] != rb[4]:
            problems.append(f"reply {q} differs: {ra[:3]} {ra[4]} vs {rb[:3]} {rb[4]}")
            break
    ma, mb = metrics(a), metrics(b)
    for k in ma:
        if ma[k] != mb.get(k):
            problems.append(f"metric {k} differs: {ma[k]} vs {mb.get(k)}")
    va = {k: s.version for (k, _), s in a.slots.items()}
    vb = {k: s.version for (k, _), s in b.slots.items()}
    if va != vb:
        problems.append(f"versions differ {va} {vb}")
    return problems
