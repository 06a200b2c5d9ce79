"""The worker side of the parameter-server stores, as MXNet ``KVStoreBase`` classes.

``gluon.Trainer(..., kvstore='dist_ssp')`` finds these through MXNet's
registry.  A call turns its keys into one message per server (all keys of a
list call travel together; per-key calls are gathered, see ``batching``) and
returns once they are sent.  The pulled values are written into the output
arrays by an operation in MXNet's engine (see ``engine``), so that, as with
MXNet's own stores, whatever reads them waits for them and nothing else does.

A round costs MXNet little: each gradient is copied once, by MXNet, straight
into the message to its server (``Staging``, one per server); arrays already
checked are not asked about again (``CheckedArrays``), and a call that repeats the
last one of its kind with the very same keys and arrays is not checked or looked
up again at all, its output arrays' memory located once (``SameCall``,
``OutArray.place``); the replies of all the calls of a round are written in one
pass when they come (``WriteBack``), into the store's own copy of each key
(``ReplySlots``), which MXNet copies into each call's weights.
"""
from __future__ import annotations

import collections
import functools
import logging
import math
import os
import pickle
import threading
import time
import weakref

import mxnet as mx
import numpy as np
from mxnet.kvstore import KVStoreBase

from .. import registry
from .. import engine
from .batching import (CHUNK_BYTES, MIN_CHUNK_BYTES, CheckedArrays, Coalescer, SameCall,
                       StagedCall, Staging, WriteBack, staged_bytes)
from .link import Connection, unseen, when_answered
from ..errors import KVStoreError
from ..jobenv import NotInAJob
from ..keys import MXNetCalls, as_list as _as_list, check_key as _check_key, pairs as _pairs
from ..keys import grouped_pairs, refuse_second_array, refuse_sparse
from ..metrics import WorkerMetrics, write_json
from .partition import Partitioner
from ..policies.psp import HeldVersions, PartialPull, resolve_min_pushes
from .protocol import BLOCK, KEY, STAMP, Op, valid_lr

log = logging.getLogger("kvstore_ext")

_connection: Connection | None = None


def _shared_connection(store: registry.StoreConfig) -> Connection:
    """One job link per process, as MXNet has one ps-lite node per process."""
    global _connection
    if _connection is None or _connection.closed:
        try:
            _connection = Connection(store)
        except NotInAJob as e:
            raise KVStoreError(f"kvstore {store.type!r}: {e}") from None
    elif _connection.store != store:
        raise KVStoreError(f"this process already joined the job with {_connection.store.describe()}; "
                           f"it cannot also use {store.describe()}")
    return _connection


class OutArray:
    """What an output array is, learned once while the caller keeps passing it, and where
    its values were last written (kept while its memory stays there: :meth:`place`)."""

    __slots__ = ("shape", "dtype", "on_cpu", "destination")

    def __init__(self, shape: tuple, dtype: np.dtype, on_cpu: bool):
        self.shape, self.dtype = shape, dtype
        self.on_cpu = on_cpu     # MXNet's engine hands us its memory; otherwise it is copied in
        self.destination: engine.Destination | None = None

    def place(self, array) -> engine.Destination:
        """Where a call writes ``array`` (this array, a CPU one): the last call's destination
        while MXNet says its memory is still there, else located anew."""
        d = self.destination
        if d is None or d.array is not array or not d.in_place():
            d = self.destination = engine.Destination(array, self.shape, self.dtype)
        return d


class Outputs:
    """A call's output arrays, checked: ``targets``, ``(key, array)`` in writing order;
    ``kinds``, what each array is (``handle -> OutArray``); whether MXNet's engine hands us
    all of them (``in_engine``: on CPU); each array once (``distinct``), with their handles
    for the engine's operations gathered once, as a training loop passes the same arrays at
    every step."""

    __slots__ = ("targets", "kinds", "distinct", "in_engine", "_order", "_arrays")

    def __init__(self, targets, kinds):
        self.targets, self.kinds = targets, kinds
        by_handle = {o.handle.value: o for _, o in targets}
        self.distinct = list(by_handle.values())
        self.in_engine = bool(by_handle) and all(kinds[h].on_cpu for h in by_handle)
        index = {h: i for i, h in enumerate(by_handle)}
        self._order = [(k, index[o.handle.value]) for k, o in targets]
        self._arrays: engine.Arrays | None = None

    def placed(self) -> list:
        """``(key, Destination)`` in writing order: where this call writes each array."""
        kinds = self.kinds
        places = [kinds[o.handle.value].place(o) for o in self.distinct]
        return [(k, places[i]) for k, i in self._order]

    @property
    def engine_arrays(self) -> engine.Arrays:
        """:attr:`distinct`, as an engine operation that writes them is given them."""
        if self._arrays is None:
            self._arrays = engine.Arrays(self.distinct)
        return self._arrays


_NO_OUTPUTS = Outputs([], {})


class ParameterServerStore(MXNetCalls, KVStoreBase):
    """Worker side shared by the parameter-server stores (``dist_bsp``, ``dist_ssp``, ...)."""

    store_type = ""
    #: per-key calls take their replies from :class:`ReplySlots` (one engine operation per
    #: round that runs Python); off where a reply may bring only some of a key's blocks and
    #: late ones are written into the weights afterwards (``dist_psp``)
    reply_slots = True
    #: the thread that receives a call's last reply writes its values (no engine thread waits
    #: for them); off where a call may go on with part of its replies (``dist_psp``)
    written_on_arrival = True

    def __init__(self, **params):
        self._config = registry.job_config(self.store_type, params)
        self._type = registry.lookup(self._config.type).type_name()
        self._conn = _shared_connection(self._config)
        self._part = Partitioner(self._conn.num_servers, self._conn.env.bigarray_bound)
        self._meta: dict = {}          # key -> (shape, dtype)
        self._key_type = None          # int or str: MXNet does not mix them in one store
        self._updater = None           # gluon.Trainer.load_states reads _updater.optimizer
        self._pending_optimizer = None  # set_optimizer's, held while another store owns keys
        #: names this store to the servers: its optimizer sent again starts anew there, while
        #: the same optimizer from another store (or worker) is taken as the one in use
        self._store_id = os.urandom(6).hex()
        #: the optimizer whose ``lr`` the servers follow (the one gluon.Trainer holds), and the
        #: rate they were last given: MXNet's own stores never see a later change (apache/mxnet
        #: issue 15919); these send it before the next push
        self._lr_source, self._servers_lr = None, None
        self._metrics = WorkerMetrics()
        self._deferred_error: Exception | None = None
        #: a worker pool's last word to this worker (``dist_pool``): ``batch_size`` of its
        #: next step (0: stop), the pool's size, the learning rate the servers apply
        self.pool_assignment: dict | None = None
        coalesce = os.environ.get("KVX_COALESCE", "1") != "0"
        self._coalescer = Coalescer(self._conn.send, self._batch_write_back) if coalesce else None
        self._slots = ReplySlots() if self.reply_slots and coalesce else None
        #: key -> :class:`RepeatedCall`: per-key calls that go the batched way with their
        #: values copied out of the key's reply slot, kept while the same arrays come back
        self._repeated: dict = {}
        self._staged_call = None       # the kept plan :meth:`_plan` used last, if it used one
        #: key -> the array(s) its latest ``pushpull`` writes, which a pull of the key waits
        #: for on a synchronous store (:meth:`_wait_for_rounds`)
        self._round_outputs: dict = {}

    @functools.cached_property
    def _staging(self) -> dict[int, Staging]:
        """Where the pushed values are copied to: one buffer per server, each made on first
        use (as is :attr:`_checked`), the whole's least size shared among the servers."""
        chunk = max(CHUNK_BYTES // self._part.num_servers, MIN_CHUNK_BYTES)
        return collections.defaultdict(lambda: Staging(chunk))

    @functools.cached_property
    def _frame_limit(self) -> int:
        """The servers' limit on a frame's bytes, by which a message is cut into frames."""
        return self._conn.codec.max_frame_bytes

    @functools.cached_property
    def _checked(self) -> CheckedArrays:
        """The arrays of each key (values, outputs) that passed their checks last time."""
        return CheckedArrays()

    @functools.cached_property
    def _same(self) -> SameCall:
        """The last call of each kind, checked and planned, kept while calls repeat it."""
        return SameCall()

    # -- properties MXNet asks for ----------------------------------------------------------
    @property
    def type(self) -> str:
        """The store's name, which MXNet's own checks read as ``dist_sync``'s or
        ``dist_async``'s (:class:`kvstore_ext.registry.TypeName`)."""
        return self._type

    @property
    def params(self) -> dict:
        """The store's parameters (for example ``{'staleness': 3}``)."""
        return dict(self._config.params)

    @property
    def rank(self) -> int:
        return self._conn.rank

    @property
    def num_workers(self) -> int:
        return self._conn.num_workers

    @property
    def num_servers(self) -> int:
        return self._conn.num_servers

    @staticmethod
    def is_capable(capability):
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return True
        raise ValueError(f"Unknown capability: {capability}")

    # -- data plane ---------------------------------------------------------------------------
    def init(self, key, value):
        """Create keys on the servers; worker 0's values win, as in MXNet.

        Calls still in flight are not waited for (a new key does not depend on them, and the
        servers see this worker's messages in order): ``gluon.Trainer``'s per-key
        init-and-pull then costs one round trip in all, not one per key.

        As in MXNet, a store's keys are all ints or all strs ("Mixed key types are not
        allowed"). Initialising a key again from the same array keeps the value it has
        (worker 0's first one); from another array, or with another shape or dtype, it is an
        error (:func:`refuse_second_array`).
        """
        self._flush()
        self._raise_deferred()
        items: dict[int, tuple[list, list]] = {}
        send_values = self.rank == 0
        if send_values:
            # the values once everything before this call has run in MXNet's engine: an
            # array's own wait did not cover BatchNorm's running statistics written by a
            # forward pass hybridized with static_alloc on 2 devices (read stale in 3 of 5
            # jobs, and trained from their initial values; docs/mxnet_tests.md)
            mx.nd.waitall()
        named = set()
        for k, v in _pairs(key, value):
            k = _check_key(k)
            if k in named:   # MXNet's stores refuse it too
                raise KVStoreError(f"{self.type}: key {k!r} is named twice in one init call")
            named.add(k)
            refuse_sparse(self.type, k, v)
            kind = str if isinstance(k, str) else int
            if self._key_type is None:
                self._key_type = kind
            elif kind is not self._key_type:
                raise KVStoreError(f"Mixed key types are not allowed: key {k!r} is a "
                                   f"{kind.__name__}, but this store's keys are "
                                   f"{self._key_type.__name__}s")
            v = _as_list(v)[0]
            shape, dtype = tuple(v.shape), np.dtype(v.dtype)
            known = self._meta.get(k)
            if known is not None and known != (shape, dtype):
                raise KVStoreError(f"key {k!r} is already initialised with shape {known[0]} "
                                   f"{known[1].name}; cannot initialise it again with shape "
                                   f"{shape} {dtype.name}")
            self._check_owner(k, v)
            flat = v.asnumpy().reshape(-1) if send_values else None
            for b in self._part.blocks(k, int(np.prod(shape)) if shape else 1):
                entry = items.setdefault(b.server, ([], []))
                entry[0].append([k, b.index, dtype.str, list(shape), b.size])
                if send_values:
                    entry[1].append(np.ascontiguousarray(flat[b.start:b.stop]))
        replies = self._conn.request({s: ({"op": Op.INIT, "items": its, "has_value": send_values},
                                          bufs) for s, (its, bufs) in items.items()})
        self._initialised(items, replies)
        owners = self._conn.key_owners
        for k, v in _pairs(key, value):
            v = _as_list(v)[0]
            self._meta[_check_key(k)] = (tuple(v.shape), np.dtype(v.dtype))
            owners[_check_key(k)] = (weakref.ref(self), v.handle.value)
        if self._pending_optimizer is not None:
            self._send_optimizer(self._pending_optimizer)

    def _initialised(self, items, replies) -> None:
        """The servers answered an init (``items``: server -> (its items, buffers))."""

    def _check_owner(self, key, value) -> None:
        """Refuse a key that this store, or another live store of this process, initialised
        from another array.

        The stores of one process share one link, so the servers' keys and their optimizer:
        two ``gluon.Trainer``s (a GAN's generator and discriminator) would each init key 0,
        the second's values would be dropped (or refused, for another shape), and it would
        train the first one's weights with its own optimizer, in silence.  A store made again
        for the same parameters (a new Trainer over the same arrays) is not refused."""
        owner = self._conn.key_owners.get(key)
        if owner is None:
            return
        store, handle = owner[0](), owner[1]
        if store is self:
            refuse_second_array(self.type, key, handle, value)
            return
        if store is None or handle == value.handle.value:
            return
        raise KVStoreError(
            f"{self.type}: key {key!r} was initialised by another {store.type} store of this "
            f"process, from another array (two gluon.Trainers, or two mx.kv.create calls, "
            f"each make a store). The stores of one process share the servers' keys and "
            f"optimizer, so this one would train the other's weights: give all parameters "
            f"to one Trainer, or keep one store alive at a time")

    def broadcast(self, key, value, out, priority=0):
        self.init(key, value)
        self.pull(key, out=out, priority=priority)

    def push(self, key, value, priority=0):
        """Push gradients; returns once the servers give OK (the store's synchronisation)."""
        self._exchange(Op.PUSH, grouped_pairs(key, value), None)

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        """Pull weights into ``out``; like MXNet, the arrays are filled through the engine."""
        if out is None:
            raise ValueError("pull needs out=")
        if not ignore_sparse:   # MXNet's dist stores: CHECK(ignore_sparse) in PullImpl
            raise KVStoreError(f"{self.type}: pull doesn't support ignore_sparse=False (as "
                               f"MXNet's dist stores): its keys are dense")
        outs = grouped_pairs(key, out, "out")
        self._exchange(Op.PULL, [(k, None) for k, _ in outs], outs)

    def pushpull(self, key, value, out=None, priority=0):
        """Push gradients and pull the weights back, one message per server.

        It returns once the gradients are sent; the output arrays are written
        when the servers answer, and MXNet's engine makes every reader of them
        wait for that, as with MXNet's own stores.
        """
        if key.__class__ is int or key.__class__ is str:
            repeated = self._repeated.get(key)
            if repeated is not None and self._deferred_error is None and \
                    repeated.matches(value, value if out is None else out):
                self._repeat(repeated)
                return
        pairs = grouped_pairs(key, value)
        outs = grouped_pairs(key, out, "out") if out is not None else pairs
        self._exchange(Op.PUSHPULL, pairs, outs)

    def _repeat(self, call: "RepeatedCall") -> None:
        """A per-key pushpull made again with the arrays of the last one (``gluon.Trainer``
        makes one a key each step): what :meth:`_exchange` would do for it, with nothing
        looked up or checked again: ResNet-20's per-key calls took 17.9 µs against 24.9
        (docs/performance.md)."""
        if self._lr_source is not None and self._lr_source.lr != self._servers_lr:
            self._send_learning_rate()
        conn = self._conn
        conn.engine_wait = (time.monotonic(), Op.PUSHPULL, call.pairs)
        try:
            plan = {call.server: call.message.stage()}
        finally:
            conn.engine_wait = None
        metrics = self._metrics
        metrics.begin_call()
        metrics.count_pushes(call.keys)
        try:
            self._slots.copy_kept(self._coalescer.add(Op.PUSHPULL, call.key, plan), call.key)
        finally:
            metrics.end_call()

    def _exchange(self, op: str, pairs, outs) -> None:
        """Send one call; write the values it brings back into the ``outs`` arrays.

        An array may be listed several times (``pull([k1, k2], out=[a, a])``, or
        ``pull(k, out=[a, a])``): it is given to MXNet's engine once (an operation that
        lists an array twice as written deadlocks the engine) and written in
        :meth:`_targets` order, so that, as in MXNet's own stores, it ends up with the
        value of the last key in that order.
        """
        self._raise_deferred()
        if op != Op.PULL and getattr(self, "asynchronous", False) and self._updater is None:
            # the servers would keep the summed gradients as the weights, and every worker
            # would pull a different mixture: MXNet's async server aborts here instead
            raise KVStoreError(f"{self.type} is asynchronous: the servers update the weights, so "
                               f"call set_optimizer before push or pushpull (gluon.Trainer does, "
                               f"with update_on_kvstore=True)")
        if op != Op.PULL and self._lr_source is not None and \
                self._lr_source.lr != self._servers_lr:
            self._send_learning_rate()
        if not getattr(self, "asynchronous", False):
            if op == Op.PULL:
                if self._round_outputs:
                    self._wait_for_rounds([k for k, _ in pairs])
            elif op == Op.PUSHPULL and outs:
                self._round_outputs.update(outs)   # key -> an array, or one per device
        # _plan reads the gradients, which waits for MXNet's engine to finish computing them:
        # that time is compute, so the clock for waiting on the store starts after it
        conn = self._conn
        conn.engine_wait = (time.monotonic(), op, pairs)   # watched: see link.EngineWaits
        try:
            plan = self._plan(op, pairs)
            out = self._targets(outs) if outs is not None else _NO_OUTPUTS
        finally:
            conn.engine_wait = None
        targets, in_engine = out.targets, out.in_engine
        self._metrics.begin_call()
        if op != Op.PULL:
            self._metrics.count_pushes([k for k, _ in pairs])
        coalesced = (in_engine and op == Op.PUSHPULL and len(pairs) == 1
                     and self._coalescer is not None)
        key = _check_key(pairs[0][0]) if coalesced else None
        batch, copied = None, False
        if coalesced and self._slots is not None:
            staged, self._staged_call = self._staged_call, None
            batch = self._coalescer.add(op, key, plan)
            copied = self._slots.copy_out(batch, key, [o for _, o in targets], self._meta[key])
            if copied and staged is not None and len(staged.messages) == 1 \
                    and len(targets) == 1:
                self._repeated[key] = RepeatedCall(key, pairs[0][1], targets[0][1],
                                                   *next(iter(staged.messages.items())))
            else:
                self._repeated.pop(key, None)
        elif pairs and op == Op.PUSHPULL and len(pairs) == 1:
            self._repeated.pop(pairs[0][0], None)
        if in_engine and not copied:
            targets = out.placed()
            self._writing_to(targets)
        if coalesced:
            if batch is None:
                batch = self._coalescer.add(op, key, plan)
            write_back = batch.write_back
        else:
            self._flush()
            tickets = self._conn.send({s: ({"op": op, "items": its}, bufs)
                                       for s, (its, bufs, _) in plan.items()})
            fetch = functools.partial(self._call_values, op, plan, tickets)
            write_back = self._write_back(fetch, functools.partial(
                when_answered, list(tickets.values()))) if in_engine else None
        try:
            if copied:        # MXNet copies the key's slot into them once the round is in
                pass
            elif in_engine:   # the weights are written when the replies come; readers wait
                engine.push_async(functools.partial(write_back.start, targets),
                                  out.engine_arrays)
            else:             # arrays MXNet's engine cannot hand us (GPU): copied in now
                self._copy_in(targets, fetch())
        finally:
            self._metrics.end_call()

    def _wait_for_rounds(self, keys) -> None:
        """Before a pull on a synchronous store: wait until this worker's latest ``pushpull``
        of each key is answered.  Its round closes only when every worker has pushed, and the
        servers answer a pull at once, with the round before; MXNet's ``dist_sync`` orders a
        pull after the worker's push of the key, so it reads the round the push went into.
        (A plain ``push`` returns once its round has closed.)"""
        self._wait_for_writes(keys, [a for k in keys
                                     for a in _as_list(self._round_outputs.get(k, ()))])

    def _wait_for_writes(self, keys, arrays) -> None:
        """Wait until MXNet's engine has written ``arrays``, which calls of ``keys`` write."""
        if not arrays:
            return
        coalescer = self._coalescer
        if coalescer is not None and any(coalescer.holds(k) for k in keys):
            self._flush()        # the batch those writes wait for has not been sent yet
        for a in arrays:
            a.wait_to_read()

    def _writing_to(self, targets) -> None:
        """Hook: the ``(key, Destination)`` pairs the call being made writes its values to."""

    @staticmethod
    def _copy_in(targets, values) -> None:
        for k, o in targets:
            parts = values.get(k, ())
            if len(parts) == 1 and parts[0][1] - parts[0][0] == o.size:
                o._sync_copyfrom(parts[0][2].reshape(o.shape))
            elif parts:         # some blocks (a partial pull keeps the others)
                flat = o.asnumpy().reshape(-1)
                for start, stop, value in parts:
                    flat[start:stop] = value
                o._sync_copyfrom(flat.reshape(o.shape))

    def _await(self, op: str, tickets, plan) -> dict:
        """The replies of one call, per server (``dist_psp`` goes on with some of them)."""
        return self._conn.wait(tickets)

    def _call_values(self, op: str, plan, tickets) -> dict:
        """The values the replies to ``plan`` bring, per key (see :meth:`_values`)."""
        return dict(self._values(plan, self._await(op, tickets, plan)))

    def _batch_values(self, batch) -> dict:
        """The values of every call that travelled in a batch."""
        self._coalescer.wait_sent(batch)
        if batch.error is not None:
            raise batch.error
        return self._call_values(batch.op, batch.plan, batch.tickets)

    def _batch_write_back(self, batch) -> WriteBack:
        """A batch of per-key calls keeps an engine thread waiting for its replies: written by
        the link thread instead, LeNet's per-key rounds were 8-34% slower in eight of nine
        alternated pairs of jobs (list calls 2-18% faster), for a reason not found yet."""
        return self._write_back(functools.partial(self._batch_values, batch), None)

    def _write_back(self, fetch, arm) -> WriteBack:
        """What writes a round's values in the engine: ``fetch`` gives them, ``arm`` (see
        :class:`WriteBack`) has the thread that brings the last reply write them (the time
        until then is spent waiting on the store); an error waits for the next call.  Where
        a call may go on with part of its replies (:attr:`written_on_arrival` False), or for
        ``arm`` None, an engine thread waits for them in ``fetch``."""
        write_back = None

        def timed_fetch():
            try:
                with unseen():       # on an engine or the link thread: its errors are deferred
                    return fetch()
            finally:
                self._metrics.add_wait(time.perf_counter() - write_back.since)
        write_back = WriteBack(timed_fetch, self._defer,
                               arm if self.written_on_arrival else None)
        return write_back

    def _defer(self, exc: Exception) -> None:
        """An error met in the engine: the next call raises it (or, if none comes, the
        process exits with it)."""
        self._deferred_error = self._conn.unreported = exc
        log.error("kvstore_ext: %s", exc)

    def _flush(self) -> None:
        """Send calls still held for batching: whatever comes next must not overtake them."""
        if self._coalescer is not None:
            self._coalescer.flush()

    def _raise_deferred(self) -> None:
        """Raise an error that an engine operation met since the last call."""
        exc, self._deferred_error = self._deferred_error, None
        if exc is not None:
            self._conn.unreported = None
            raise self._conn.raised(exc)

    def _settle(self) -> None:
        """Before a call that is not a pushpull: no held call, no unanswered request
        (so that, say, saved optimizer states include every update sent so far), no
        hidden error."""
        self._flush()
        self._conn.drain()
        self._raise_deferred()

    def _targets(self, outs) -> Outputs:
        """``(key, array)`` for every output array, shapes checked before anything is sent,
        and what each array is (``handle -> OutArray``), as :class:`Outputs`.

        When an array is listed more than once, they come in the order MXNet's own stores
        write them: ascending keys (string keys in the order they were first initialised,
        as MXNet numbers them), each key's arrays in the order given; the last one wins.
        """
        kept = self._same.get("out", outs)
        if kept is not None:
            return kept
        targets, kinds = [], {}
        for k, out in outs:
            k = _check_key(k)
            arrays = _as_list(out)
            learned = self._checked.get((k, "out"), arrays)
            if learned is None:
                refuse_sparse(self.type, k, arrays, "out array")
                shape = self._meta[k][0] if k in self._meta else None
                for o in arrays:
                    if shape is not None and tuple(o.shape) != shape:
                        raise KVStoreError(f"key {k!r}: out has shape {tuple(o.shape)}, but "
                                           f"the key has shape {shape}")
                learned = [OutArray(tuple(o.shape), np.dtype(o.dtype),
                                    o.context.device_type == "cpu") for o in arrays]
                if shape is not None:
                    self._checked.put((k, "out"), arrays, learned)
            for o, kind in zip(arrays, learned):
                targets.append((k, o))
                kinds[o.handle.value] = kind
        if len(kinds) < len(targets):
            first_init = {k: i for i, k in enumerate(self._meta)}
            targets.sort(key=lambda t: (1, first_init.get(t[0], 0)) if isinstance(t[0], str)
                         else (0, t[0]))
        found = Outputs(targets, kinds)
        if all(k in self._meta for k, _ in targets):
            self._same.put("out", outs, found)
        return found

    def _plan(self, op: str, pairs):
        """Per server: the items, the gradient buffers, and which (key, block) each item is.

        Every key and value is checked before any gradient is read, so a call that fails
        sends nothing; the gradients are then copied into each server's staging buffer
        (:meth:`_stage`), one segment per block.  A call that repeats the last one of its
        kind skips the checks; from its second time on, its gradients are copied and its
        messages cut as worked out then (:class:`~kvstore_ext.ps.batching.StagedCall`).
        """
        kept = self._same.get(op, pairs)
        self._staged_call = None
        if kept is not None:     # the call made last time: its own way, once worked out
            messages = kept.messages
            if messages is None:
                messages = kept.work_out(self._staging.__getitem__, self._frame_limit)
            if messages:
                self._staged_call = kept
                return {server: m.stage() for server, m in messages.items()}
            keys = kept.keys     # (key, dtype, blocks, the pushed arrays or None)
        else:
            keys = []
            for k, v in pairs:
                k = _check_key(k)
                meta = self._meta.get(k)
                if meta is None:
                    raise KVStoreError(f"key {k!r} has not been initialised on this kvstore "
                                       f"(call kv.init({k!r}, value) or kv.broadcast first)")
                shape, dtype = meta
                keys.append((k, dtype, self._part.blocks(k, math.prod(shape)),
                             None if v is None else self._checked_value(k, v, shape, dtype)))
            self._same.put(op, pairs, StagedCall(keys))
        plan: dict[int, tuple[list, list, list]] = {}
        for (k, dtype, blocks, _), staged in zip(keys, self._stage(keys)):
            for i, b in enumerate(blocks):
                its, bufs, where = plan.setdefault(b.server, ([], [], []))
                its.append([k, b.index, dtype.str, b.size])
                where.append(b)
                if staged is not None:
                    bufs.append(staged[i])
        return plan

    def _checked_value(self, key, value, shape, dtype) -> list:
        """The arrays pushed for ``key`` (one per device), each of the key's shape and dtype."""
        arrays = _as_list(value)
        if self._checked.get((key, "value"), arrays) is None:
            refuse_sparse(self.type, key, arrays, "pushed value")
            for a in arrays:
                if tuple(a.shape) != shape:
                    raise KVStoreError(f"key {key!r}: pushed shape {tuple(a.shape)}, but the "
                                       f"key was initialised with shape {shape}")
                if np.dtype(a.dtype) != dtype:
                    raise KVStoreError(f"key {key!r}: pushed dtype {np.dtype(a.dtype).name}, "
                                       f"but the key was initialised as {dtype.name}")
            self._checked.put((key, "value"), arrays, True)
        return arrays

    def _stage(self, keys) -> list:
        """Each pushed key's blocks, flat and summed over its devices (None for a key that is
        only pulled), copied by MXNet into a staging buffer per server: one copy per array,
        no engine operation, the values as they are when the call is made.

        A key is staged whole in the buffer of its first block's server (its only one, but
        for a key of ``bigarray_bound`` elements or more, cut across servers), so a server's
        keys of a call, and of the calls after it, lie side by side and its message's
        gradients travel as one frame (``transport.pack``) even where the keys alternate
        between servers; a cut key's other blocks travel in frames of their own."""
        sizes: dict[int, list[int]] = {}
        for _, dtype, blocks, arrays in keys:
            if arrays is not None:
                sizes.setdefault(blocks[0].server, []).append(staged_bytes(dtype, blocks))
        segments = {server: zip(*self._staging[server].take_placed(n))
                    for server, n in sizes.items()}
        staged = []
        for _, dtype, blocks, arrays in keys:
            if arrays is None:
                staged.append(None)
                continue
            segment, address = next(segments[blocks[0].server])
            flat = segment.view(dtype)
            engine.copy_to_host(arrays[0], flat, address)
            # the other devices' values, added in MXNet's order (comm.h, ReduceSumCPU: the
            # first += the sum of the next up to four, left to right), so that sums of 3 or
            # more devices round as on MXNet's stores
            rest = arrays[1:]
            for at in range(0, len(rest), 4):
                group = np.empty(flat.size, dtype)
                engine.copy_to_host(rest[at], group)
                for a in rest[at + 1:at + 4]:
                    extra = np.empty(flat.size, dtype)
                    engine.copy_to_host(a, extra)
                    group += extra
                flat += group
            staged.append([flat[b.start:b.stop] for b in blocks])
        return staged

    def _values(self, plan, replies):
        """``(key, parts)`` for every key of a reply: ``(start, stop, flat values)`` of each of
        its blocks that arrived (a block missing from a partial pull keeps its value)."""
        parts: dict = {}
        for server, (_, _, where) in plan.items():
            if server not in replies:
                continue
            header, buffers = replies[server]
            if header and "batch_size" in header:   # a worker pool's assignment (dist_pool)
                self.pool_assignment = {k: header.get(k) for k in ("batch_size", "pool", "lr",
                                                                   "updates")}
            for b, buf in zip(where, buffers):
                if buf is not None:
                    dtype = self._meta[b.key][1]
                    parts.setdefault(b.key, []).append((b.start, b.stop,
                                                        np.frombuffer(buf, dtype=dtype)))
        yield from parts.items()

    # -- optimizer ----------------------------------------------------------------------------
    def set_optimizer(self, optimizer):
        """Send MXNet's optimizer (pickled, authenticated) to every server."""
        from ..optimizers import delay_refusal
        problem = delay_refusal(optimizer, self.type, getattr(self, "asynchronous", False))
        if problem:
            raise KVStoreError(problem)
        if self._another_store_owns_keys():
            # sent by this store's first init that passes _check_owner: a second Trainer's
            # store refused there must not have replaced the first one's optimizer on the
            # servers (gluon.Trainer sets the optimizer before it initialises the keys)
            self._pending_optimizer = optimizer
        else:
            self._send_optimizer(optimizer)
        self._updater = mx.optimizer.get_updater(optimizer)
        self._follow_learning_rate(optimizer)

    def _send_optimizer(self, optimizer) -> None:
        self._settle()
        blob = pickle.dumps(optimizer)
        self._conn.request({s: ({"op": Op.SET_OPTIMIZER, "store": self._store_id}, [blob])
                            for s in range(self.num_servers)})
        self._pending_optimizer = None

    def _another_store_owns_keys(self) -> bool:
        return any(owner[0]() not in (None, self) for owner in self._conn.key_owners.values())

    def _follow_learning_rate(self, optimizer) -> None:
        """The servers run a copy of ``optimizer``: from now on a change of its ``lr`` (what
        ``trainer.set_learning_rate`` does) reaches them before the next push."""
        self._lr_source, self._servers_lr = optimizer, optimizer.lr

    def _send_learning_rate(self) -> None:
        """Give the servers the optimizer's new rate once this worker's earlier pushes are
        answered, so that it applies to this push and later ones, never to earlier ones."""
        opt = self._lr_source
        lr = opt.lr
        if opt.lr_scheduler is not None or self._pending_optimizer is not None:
            # the scheduler, on the servers, sets the rate; or the optimizer, not sent yet, has it
            self._servers_lr = lr
            return
        try:
            rate = float(lr)
        except (TypeError, ValueError):
            rate = math.nan
        if not valid_lr(rate):
            raise KVStoreError(f"{self.type}: the optimizer's learning rate must be a finite "
                               f"number >= 0, got {lr!r}")
        self._settle()
        self._conn.request({s: ({"op": Op.SET_LR, "lr": rate}, [])
                            for s in range(self.num_servers)})
        self._servers_lr = lr

    def save_optimizer_states(self, fname, dump_optimizer=False):
        """Gather the servers' optimizer states into MXNet's Updater file format."""
        self._settle()
        replies = self._conn.request({s: ({"op": Op.GET_STATES}, [])
                                      for s in range(self.num_servers)})
        per_key: dict = {}
        num_update, counts = 0, {}
        for server, (header, buffers) in replies.items():
            states = pickle.loads(bytes(buffers[0]))   # authenticated reply
            for key, block in header["blocks"]:
                if key in states:
                    per_key.setdefault(key, {})[block] = states[key]
            server_num_update, server_counts = pickle.loads(bytes(buffers[1]))
            num_update = max(num_update, server_num_update)
            for key, count in server_counts.items():   # a split key: each block counts
                counts[key] = max(counts.get(key, 0), count)
        merged = {}
        for key, blocks in per_key.items():
            shape = self._meta[key][0] if key in self._meta else None
            merged[key] = _merge_state([blocks[i] for i in sorted(blocks)], shape)
        optimizer = None
        if dump_optimizer and self._updater is not None:
            optimizer = _with_counts(self._updater.optimizer, num_update, counts)
        with open(fname, "wb") as f:
            f.write(pickle.dumps((merged, optimizer) if dump_optimizer else merged))

    def load_optimizer_states(self, fname):
        """Load a file of :meth:`save_optimizer_states` into the servers, worker 0's, as with
        ``init`` (every worker calls it, as ``trainer.load_states`` does; the others only take
        the file's optimizer): were each to send its own, on an asynchronous store a later
        one would roll back the counts and moments of the updates applied since the first."""
        self._settle()
        with open(fname, "rb") as f:
            loaded = pickle.loads(f.read())
        if isinstance(loaded, tuple) and len(loaded) == 2 and isinstance(loaded[1], mx.optimizer.Optimizer):
            states, optimizer = loaded
        else:
            states, optimizer = loaded, None
        if self.rank == 0:
            per_server: dict[int, dict] = {s: {} for s in range(self.num_servers)}
            for key, state in states.items():
                shape = self._meta[key][0] if key in self._meta else None
                size = int(np.prod(shape)) if shape else _state_size(state)
                for b in self._part.blocks(key, size):
                    per_server[b.server][key] = _slice_state(state, b.start, b.stop)
            self._conn.request({s: ({"op": Op.SET_STATES}, [pickle.dumps((st, optimizer))])
                                for s, st in per_server.items()})
        if optimizer is not None:   # the servers now run the file's optimizer
            self._updater = mx.optimizer.get_updater(optimizer)
            self._follow_learning_rate(optimizer)
        elif self._updater is None:
            self._updater = mx.optimizer.get_updater(mx.optimizer.SGD())
        self._updater.states = states

    # -- job ----------------------------------------------------------------------------------
    #: the servers keep workers outside a pool waiting (``dist_pool``)
    pooled = False
    #: the servers may hold a worker until another pushes (``dist_pool``, ``dist_ssp``,
    #: ``dist_dssp``): see :meth:`barrier`
    told_of_barriers = False

    def barrier(self):
        """Wait until every live worker of the job reaches this point.

        Where the servers may hold a worker until another pushes, they are told first that
        this worker waits here, and then that it is through: otherwise a worker kept outside
        a pool, or one a bound on its lead holds for this one's next push, waited for a push
        that cannot come, and this one waited here for it."""
        self._settle()
        if self.told_of_barriers:
            self._tell_servers_away(True)
        self._conn.scheduler_call({"op": Op.BARRIER})
        if self.told_of_barriers:
            self._tell_servers_away(False)

    def _tell_servers_away(self, away: bool) -> None:
        self._conn.request({s: ({"op": Op.AWAY, "away": away}, [])
                            for s in range(self.num_servers)})

    def stats(self) -> dict:
        """This worker's metrics and every server's, read live."""
        self._settle()
        replies = self._conn.request({s: ({"op": Op.STATS}, []) for s in range(self.num_servers)})
        # the link is the process's: its byte counts cover every store instance of the process
        self._metrics.bytes_sent = self._conn.bytes_sent
        self._metrics.bytes_received = self._conn.bytes_received
        worker = {**self._metrics.to_dict(), "window_mb": self._conn.env.window_bytes / 2 ** 20,
                  "rejected": dict(self._conn.codec.rejected),
                  "lanes": dict(self._conn.codec.lane_messages)}
        return {"type": self.type, "params": self.params, "rank": self.rank,
                "num_workers": self.num_workers, "worker": worker,
                "servers": [replies[s][0]["stats"] for s in sorted(replies)]}

    def save_metrics(self, path: str | None = None) -> str | None:
        """Write :meth:`stats` as JSON (default: ``$KVX_METRICS_DIR/worker-<rank>.json``)."""
        data = self.stats()
        if path is None:
            if not self._conn.env.metrics_dir:
                return None
            return write_json(self._conn.env.metrics_dir, f"worker-{self.rank}.json", data)
        return write_json(os.path.dirname(os.path.abspath(path)), os.path.basename(path), data)

    def close(self):
        """Leave the job (also done at interpreter exit); raises an error still unreported."""
        self._flush()
        try:
            self._conn.drain()
            mx.nd.waitall()
            self._raise_deferred()
        finally:
            self._conn.close()


def _with_counts(optimizer, num_update: int, counts: dict):
    """A copy of the workers' ``optimizer`` (the settings they gave) that is where the
    servers' optimizer is: its ``num_update`` and per-key update counts.  The workers' own
    copy never updates, so without them a file loaded back would restart Adam's bias
    correction and every schedule from step 0."""
    copy = pickle.loads(pickle.dumps(optimizer))
    copy.num_update = num_update
    copy._all_index_update_counts = {0: dict(counts)}
    copy._index_update_count = copy._all_index_update_counts[0]
    return copy


def _merge_state(blocks, shape):
    """Join one key's per-block optimizer states (NDArrays, tuples of them, or None)."""
    first = blocks[0]
    if first is None:
        return None
    if isinstance(first, (tuple, list)):
        return type(first)(_merge_state([b[i] for b in blocks], shape) for i in range(len(first)))
    if isinstance(first, mx.nd.NDArray):
        flat = first if len(blocks) == 1 else mx.nd.concat(*[b.reshape(-1) for b in blocks], dim=0)
        return flat.reshape(shape) if shape is not None and flat.size == int(np.prod(shape)) else flat
    if hasattr(first, "join"):   # a delay-aware optimizer's state (kvstore_ext.optimizers)
        return type(first).join(blocks, lambda arrays: _merge_state(arrays, shape))
    return first


def _slice_state(state, start, stop):
    if state is None:
        return None
    if isinstance(state, (tuple, list)):
        return type(state)(_slice_state(s, start, stop) for s in state)
    if isinstance(state, mx.nd.NDArray):
        return state.reshape(-1)[start:stop].copy()
    if hasattr(state, "cut"):   # a delay-aware optimizer's state (kvstore_ext.optimizers)
        return state.cut(lambda a: _slice_state(a, start, stop))
    return state


def _state_size(state) -> int:
    if isinstance(state, (tuple, list)):
        return next((_state_size(s) for s in state if s is not None), 0)
    if hasattr(state, "arrays"):
        return _state_size(list(state.arrays.values()))
    return state.size if isinstance(state, mx.nd.NDArray) else 0


_classes: dict[str, type] = {}


def store_class(row) -> type:
    """The ``KVStoreBase`` class of a registry row that names no class of its own: a
    :class:`ParameterServerStore` for that type (made once)."""
    cls = _classes.get(row.name)
    if cls is None:
        cls = type(f"Store_{row.name}", (ParameterServerStore,),
                   {"store_type": row.name, "__doc__": row.summary, "__module__": __name__,
                    "asynchronous": row.asynchronous, "pooled": row.pooled,
                    "told_of_barriers": row.told_of_barriers})
        _classes[row.name] = cls
    return cls


class RepeatedCall:
    """A per-key pushpull as it went last time (its key, gradient and output arrays, the
    server and the message its gradient is staged in), kept so that the same call next
    time skips every check and look-up (:meth:`ParameterServerStore._repeat`).  Kept only
    for a call served from its key's reply slot, and dropped by any other call of the key;
    it holds its arrays, so their handles cannot be reused meanwhile."""

    __slots__ = ("key", "keys", "pairs", "value", "out", "handles", "server", "message")

    def __init__(self, key, value, out, server, message):
        self.key, self.keys = key, [key]
        self.value = value[0] if isinstance(value, (list, tuple)) else value
        self.pairs = ((key, self.value),)
        self.out = out
        self.handles = (self.value.handle.value, out.handle.value)
        self.server, self.message = server, message

    def matches(self, value, out) -> bool:
        """Whether ``value`` and ``out`` (arrays, or lists of one) are this call's arrays."""
        if value.__class__ is list or value.__class__ is tuple:
            if len(value) != 1:
                return False
            value = value[0]
        if out.__class__ is list or out.__class__ is tuple:
            if len(out) != 1:
                return False
            out = out[0]
        return value is self.value and out is self.out and \
            (value.handle.value, out.handle.value) == self.handles


class ReplySlots:
    """The store's own copy of each key, which a round's replies are written into.

    Stock ``gluon.Trainer`` makes one ``pushpull`` per key.  Each call must mark its
    weights in MXNet's engine as written before it returns; an operation whose body is
    Python costs a hand-off per call (the engine thread that starts it takes the GIL from
    the caller).  Here one such operation per round (pushed by the round's first call)
    writes the replies of every key into the key's slot, and each call copies its slot into
    its weights with MXNet's own copy: an operation that needs no Python.  The engine
    orders every copy after the round's write of its slot, and each slot's next write after
    its copies have read it.

    A key is served from its slot from the round after its first call (the first round's
    operation has already been pushed without it); a call whose arrays are not of the key's
    shape and dtype is written as before, by an operation of its own.  A slot starts as a
    copy of the key's arrays, and a round that fails leaves it as it was, so a failed
    round copies back what the last round wrote into them (the weights' own values, with
    ``gluon.Trainer``; the next call raises the error).
    """

    def __init__(self):
        self._slots: dict = {}       # key -> engine.Destination of its slot (an NDArray)
        self._refused: set = set()   # keys whose calls' arrays do not fit a slot
        self._copies: dict = {}      # key -> engine.Copy of its slot into its last call's arrays

    def copy_out(self, batch, key, arrays, meta) -> bool:
        """After ``key`` joined ``batch``: push the batch's slot-writing operation if this
        is its first call, then MXNet's copies of the key's slot into ``arrays`` (the call's
        outputs, in writing order).  False if this call must write its arrays itself."""
        if batch.slots is None:
            self._open_round(batch)
        if key in batch.slots:
            copy = self._copies.get(key)
            if copy is None or not copy.copies_to(arrays):
                if not _fits(arrays, meta):     # written by an operation of its own
                    return False
                copy = self._copies[key] = engine.Copy(self._slots[key].array, arrays)
            copy()
            return True
        if key not in self._slots and key not in self._refused:
            self._make(key, arrays, meta)
        return False

    def copy_kept(self, batch, key) -> None:
        """:meth:`copy_out` of a call whose key was served from its slot last time, into
        the same arrays: its copy is the one made then (a key, once it has a slot, is in
        every later round's :attr:`Batch.slots`)."""
        if batch.slots is None:
            self._open_round(batch)
        self._copies[key]()

    def _open_round(self, batch) -> None:
        """The batch's first call: push its one operation that writes the slots."""
        batch.slots = frozenset(self._slots)
        if self._slots:
            engine.push_async(functools.partial(batch.write_back.start,
                                                list(self._slots.items())),
                              [d.array for d in self._slots.values()], b"kvx_round")

    def _make(self, key, arrays, meta) -> None:
        if not _fits(arrays, meta):
            self._refused.add(key)
            return
        shape, dtype = meta
        slot = mx.nd.empty(shape, dtype=dtype)
        arrays[0].copyto(slot)       # before this call's operation writes the weights
        self._slots[key] = engine.Destination(slot, shape, dtype)


def _fits(arrays, meta) -> bool:
    """Whether the arrays are all of the key's ``(shape, dtype)``: what a slot can be copied to."""
    shape, dtype = meta
    return bool(arrays) and all(tuple(a.shape) == shape and np.dtype(a.dtype) == dtype
                                for a in arrays)


class DistPSP(ParameterServerStore):
    """Partial push and partial pull (PSP-SGD): see :mod:`kvstore_ext.policies.psp`.

    Every pushed block is stamped with the version of the block its gradient was computed
    from (this worker's iteration for it, as long as every pull brought the block back), and
    the pull that follows asks for the next version.  That version is the newest one a reply
    brought (:class:`~kvstore_ext.policies.psp.HeldVersions`): a reply that completes late,
    after a later call's reply for the same block, does not move it back.  The worker goes on
    with a fraction ``min_pull_fraction`` of the blocks (then ``pull_timeout`` more seconds);
    the others keep their values and their versions, so their next gradients carry the old
    stamp and the servers drop them if the block has moved on.  A stamp is never ahead of the
    server's version, so a worker never waits for a round that its own, already summed,
    gradients were meant to fill.

    A block that comes after the worker went on is not thrown away: if it is newer than the
    one held, it is written into the arrays the key's latest call writes (the weights), through
    MXNet's engine like any other write, and its version is recorded.  The thread that
    receives it only queues it; the store's next call pushes the write (see
    :mod:`kvstore_ext.engine`: pushed from the receiving thread, a write of a layer's weight
    and bias and the forward pass that reads both could wait for each other, and the job
    hung, about one job in 15 under load).  Without that, a server that is always late (a
    slow server, b < 1) would never get a block to any worker: every gradient for its blocks
    would carry the first version, and it would drop them all, so its blocks stopped
    training.  Now they train one delay behind.
    """

    store_type = "dist_psp"
    reply_slots = False     # a pull may go on without some blocks; late ones are written later
    written_on_arrival = False
    asynchronous = False    # every push round is summed: update_on_kvstore=False works

    def __init__(self, **params):
        super().__init__(**params)
        p = self._config.params
        resolve_min_pushes(p["min_pushes"], self.num_workers)   # c > n: an error here, at once
        self._fraction, self._linger = p["min_pull_fraction"], p["pull_timeout"]
        self._held = HeldVersions()   # (key, block) -> version of the block this worker holds
        self._held_lock = threading.Lock()   # engine threads and the link thread record versions
        self._want: dict = {}     # (key, block) -> version a plain pull waits for after a push
        self._weights: dict = {}  # key -> the Destinations its latest call writes
        self._late = collections.deque()   # late blocks received, for the next call to write
        self.partial_pulls = 0    # pulls that went on without every block
        self.blocks_kept = 0      # blocks that kept their previous value
        self.late_blocks_applied = 0   # blocks written when they came after the pull went on
        self.late_blocks_stale = 0     # ... not written: the worker held a newer version

    def _plan(self, op: str, pairs):
        plan = super()._plan(op, pairs)   # (waits for the gradients: their pulls have landed)
        if op != Op.PULL:
            self._wait_for_earlier_calls(pairs)
        for items, _, _ in plan.values():
            for i, item in enumerate(items):   # new items: a repeated call's are kept for it
                block = (item[KEY], item[BLOCK])
                if op == Op.PULL:
                    items[i] = [*item, -1, self._want.pop(block, 0)]      # STAMP, WANTED
                else:
                    with self._held_lock:
                        stamp = self._held.stamp(block)
                    items[i] = [*item, stamp, stamp + 1]      # stamp, version wanted
                    if op == Op.PUSH:
                        self._want[block] = stamp + 1
        return plan

    def _wait_for_earlier_calls(self, pairs) -> None:
        """Before stamping a push: let the replies of this worker's earlier calls of these keys
        be written.  A gradient computed from the weights waits for them anyway (MXNet's engine
        orders it after their write); one that does not read them (raw ``kv.pushpull`` calls
        back to back) would otherwise be stamped with the version before the last call's, and
        the servers, a round on, would drop it: with c = n, three rounds out of four were lost
        where ``dist_bsp`` applies them all."""
        self._wait_for_writes([k for k, _ in pairs],
                              [d.array for k, _ in pairs for d in self._weights.get(k, ())])

    def _await(self, op: str, tickets, plan) -> dict:
        if op == Op.PUSH:   # answered once the round each block went into has closed
            replies = self._conn.wait(tickets)
            with self._held_lock:
                for server in replies:
                    for item in plan[server][0]:
                        self._held.pushed((item[KEY], item[BLOCK]), item[STAMP])
            return replies
        counts = {s: len(plan[s][0]) for s in tickets}
        pull = PartialPull(sum(counts.values()), self._fraction, self._linger)
        replies = self._conn.wait_parts(
            tickets, counts, pull,
            late=lambda server, taken: functools.partial(self._late_parts, plan[server][2], taken))
        missing = 0
        with self._held_lock:
            for server, (header, buffers) in replies.items():
                for b, buf, version in zip(plan[server][2], buffers, header["versions"]):
                    if buf is None:
                        missing += 1
                    else:   # a late reply to an earlier call may bring an older version
                        self._held.arrived((b.key, b.index), version)
        if missing:
            self.partial_pulls += 1
            self.blocks_kept += missing
        return replies

    def _initialised(self, items, replies) -> None:
        """Hold each block at the version the servers have: a store made while the job runs
        (``gluon.Trainer`` made again over the same parameters) would otherwise stamp its
        first gradients 0 before its broadcast's pull is answered, and the servers would drop
        them as stale (its first step lost on some keys)."""
        with self._held_lock:
            for server, (header, _) in replies.items():
                versions = header.get("versions") or []
                for item, version in zip(items[server][0], versions):
                    if type(version) is int:
                        self._held.arrived((item[KEY], item[BLOCK]), version)

    def _writing_to(self, targets) -> None:
        by_key: dict = {}
        for k, destination in targets:
            by_key.setdefault(k, []).append(destination)
        self._weights.update(by_key)

    def _exchange(self, op: str, pairs, outs) -> None:
        self._push_late()
        super()._exchange(op, pairs, outs)

    def _late_parts(self, blocks, taken, items, versions, buffers) -> None:
        """On the link thread: blocks of a pull that went on without them have come (one part
        of a reply); queued for :meth:`_push_late`."""
        late, arrays = [], {}
        for i, version, buf in zip(items, versions, buffers):
            if i in taken or not 0 <= i < len(blocks):
                continue
            b = blocks[i]
            destinations = self._weights.get(b.key)
            if not destinations:   # written by copy (not a CPU array): nothing to write into
                continue
            late.append((b, version, np.frombuffer(buf, dtype=self._meta[b.key][1]),
                         destinations))
            for d in destinations:   # each array once: listed twice, it deadlocks the engine
                arrays[d.array.handle.value] = d.array
        if late:
            self._late.append((late, list(arrays.values())))

    def _push_late(self) -> None:
        """On the caller's thread: one engine operation per late part received since the last
        call, ordered with every other write of the weights by when it is pushed."""
        while self._late:
            late, arrays = self._late.popleft()
            engine.push(functools.partial(self._write_late, late), arrays)

    def _write_late(self, late) -> None:
        """In the engine, in call order with every other write of the weights: the late blocks,
        each unless a newer one has been received meanwhile."""
        for block, version, value, destinations in late:
            with self._held_lock:
                held = self._held.held((block.key, block.index))
                newer = version > (0 if held is None else held)
                if newer:
                    self._held.arrived((block.key, block.index), version)
            if not newer:
                self.late_blocks_stale += 1
                continue
            try:
                for destination in destinations:
                    destination.write([(block.start, block.stop, value)])
            except Exception as exc:   # a reply that does not fit: the next call reports it
                self._defer(KVStoreError(f"key {block.key!r}: a late block from server "
                                         f"{block.server} does not fit: {exc}"))
                return
            self.late_blocks_applied += 1

    def stats(self) -> dict:
        out = super().stats()
        out["worker"].update(partial_pulls=self.partial_pulls, blocks_kept=self.blocks_kept,
                             late_blocks_applied=self.late_blocks_applied,
                             late_blocks_stale=self.late_blocks_stale,
                             older_versions_ignored=self._held.ignored)
        return out


