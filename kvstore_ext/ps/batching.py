"""A round of the worker's store: its gradients staged, its calls gathered, its replies written.

Stock ``gluon.Trainer`` calls ``pushpull`` once per parameter.  Each call
returns at once (its result arrives through MXNet's engine), so calls can be
held for a moment and sent together: a step of ResNet-20 becomes one message
per server instead of 65.  A batch is sent when the step's key sequence
comes round to its last key (learned from the first step: the key before the
first key came again), when a key would appear twice, when any other call
needs the store, or, as a backstop, when an engine operation waits for a
batch that nobody sent, no call has joined it for ``QUIET`` seconds and the
thread making the calls has stopped (:class:`CallerProbe`).  A batch cut short
is not only a message more: every server splits the groups of keys the cut
parts, for good, and pays per group at every later push (ResNet-20's shapes at
4 x 2 and 8 x 2, callers preempted mid-step: 1.4-1.5 times the servers' CPU,
docs/performance.md), so a caller only waiting for a core keeps its batch open.

The gradients of a round are copied into a :class:`Staging` buffer per server, checked
only when their arrays change (:class:`CheckedArrays`), and the replies are
written into the weights of all the round's calls by one :class:`WriteBack`.
Everything here is plain logic: the store gives it MXNet's arrays and engine.
"""
from __future__ import annotations

import sys
import threading
import time

import numpy as np

from ..engine import HostCopies
from .link import unseen
from .protocol import layout
from .transport import RegionLayout

QUIET = 0.001
#: the longest wait between two looks at a caller that is at work (preempted, or busy)
PATIENCE = 0.016
#: a batch nobody sends goes after this long without a call, at work or not: a caller that
#: spins on something that needs the batch cannot hold it for ever
HOLD_AT_MOST = 0.25
#: the least a worker's staging buffers hold, shared among its servers (one buffer each): a
#: server's gradients of several per-key calls, a step's of a model of up to this size, share one
CHUNK_BYTES = 4 << 20
#: ... and the least one server's buffer holds, however many servers
MIN_CHUNK_BYTES = 1 << 18


class Staging:
    """Host memory that the values pushed to one server are copied into, in one piece per call.

    Bytes are never handed out twice: ZeroMQ sends large frames without copying
    them, so a message's buffers may still be in use when the next call comes.
    Each call takes fresh bytes from the current buffer (a new one when it is full),
    so the calls of one step mostly share a buffer, and a buffer is freed with the
    last message that holds a slice of it.
    """

    def __init__(self, chunk_bytes: int = CHUNK_BYTES):
        self._chunk_bytes = chunk_bytes
        self._buffer = np.empty(0, np.uint8)
        self._address = self._buffer.ctypes.data
        self._used = 0

    def take(self, sizes) -> list[np.ndarray]:
        """Segments of ``sizes`` bytes (uint8, aligned), side by side in one buffer."""
        return self.take_placed(sizes)[0]

    def take_placed(self, sizes) -> tuple[list[np.ndarray], list[int]]:
        """:meth:`take`'s segments, and the address of each (what MXNet's copy is given:
        asking numpy for it costs about a microsecond a segment, 65 a ResNet-20 step)."""
        offsets, total = layout(sizes)
        region, at = self.take_region(total)
        return [region[o:o + n] for o, n in zip(offsets, sizes)], [at + o for o in offsets]

    def take_region(self, total: int) -> tuple[np.ndarray, int]:
        """``total`` fresh bytes (a multiple of ``ALIGN``) in one piece, and their address."""
        if self._used + total > self._buffer.size:
            self._buffer = np.empty(max(total, self._chunk_bytes), np.uint8)
            self._address = self._buffer.ctypes.data
            self._used = 0
        base, self._used = self._used, self._used + total
        return self._buffer[base:base + total], self._address + base


def staged_bytes(dtype, blocks) -> int:
    """A pushed key's bytes in a staging buffer: the whole key, up to its last block's end (a
    key cut across servers is staged whole in its first block's server's buffer)."""
    return blocks[-1].stop * dtype.itemsize


class StagedCall:
    """A checked call's keys (``(key, dtype, blocks, the pushed arrays or None)``, as
    :class:`SameCall` keeps them) and, once the call has come a second time, how its
    gradients reach each server: ``messages``, server -> :class:`StagedMessage`, or empty
    when the call has something the plain way must handle (a pull-only key, a key pushed
    from several devices or cut across servers, small arrays ``pack`` would copy)."""

    __slots__ = ("keys", "messages")

    def __init__(self, keys):
        self.keys = keys
        self.messages: dict | None = None     # not worked out yet

    def work_out(self, staging_of, limit: int) -> dict:
        """:attr:`messages`, worked out now (``staging_of(server)`` is its staging buffer)."""
        by_server: dict = {}
        for key, dtype, blocks, arrays in self.keys:
            if arrays is None or len(arrays) != 1 or len(blocks) != 1:
                self.messages = {}
                return self.messages
            by_server.setdefault(blocks[0].server, []).append((key, dtype, blocks[0], arrays[0]))
        self.messages = {}
        for server, entries in by_server.items():
            message = StagedMessage(entries, staging_of(server), limit)
            if message.layout is not None and not message.layout.usable:
                self.messages = {}
                break
            self.messages[server] = message
        return self.messages


class StagedMessage:
    """One server's part of a repeated call, worked out once: its items, its blocks, MXNet's
    copies of the gradients into one region of the server's staging buffer (at the offsets
    a fresh call would stage them at) and how that region is cut into frames.  A call then
    costs one C call per gradient and no other work per key.  A message of one array (a
    per-key call, which a batch may join to others) carries it as a plain buffer."""

    __slots__ = ("items", "where", "total", "copies", "layout", "staging", "_single")

    def __init__(self, entries, staging: Staging, limit: int):
        self.items = [[key, block.index, dtype.str, block.size] for key, dtype, block, _ in entries]
        self.where = [block for _, _, block, _ in entries]
        sizes = [staged_bytes(dtype, [block]) for _, dtype, block, _ in entries]
        offsets, self.total = layout(sizes)
        self.copies = HostCopies([array for *_, array in entries], offsets)
        dtypes = [dtype for _, dtype, _, _ in entries]
        self._single = (sizes[0], dtypes[0]) if len(entries) == 1 else None
        self.layout = None if self._single else RegionLayout(offsets, sizes, dtypes, self.total,
                                                             limit)
        self.staging = staging

    def stage(self):
        """``(items, buffers, blocks)`` of this call's message: the gradients copied now (a new
        list of the items worked out, which the caller may replace but not change)."""
        region, address = self.staging.take_region(self.total)
        self.copies(address)
        if self._single is not None:
            nbytes, dtype = self._single
            buffers = [region[:nbytes].view(dtype)]
        else:
            buffers = self.layout.packed(region)
        return list(self.items), buffers, self.where


class CheckedArrays:
    """What a key's arrays were found to be when they passed their checks, kept while the
    caller passes the very same arrays (``gluon.Trainer`` passes the same gradients and
    weights every step), so that a step asks MXNet nothing it already said.

    The same array is the same object with the same handle; an entry holds its arrays, so
    a handle cannot be reused meanwhile.  Other arrays (a ``Trainer`` or a parameter made
    anew, new arrays at every call) are checked again and replace the entry: one entry per
    key and role, never more.
    """

    def __init__(self):
        self._entries: dict = {}

    def get(self, slot, arrays):
        """What was learned (never None) when these very ``arrays`` passed for ``slot``, or None."""
        entry = self._entries.get(slot)
        if entry is None or not _same_arrays(arrays, entry[0]):
            return None
        return entry[1]

    def put(self, slot, arrays, learned) -> None:
        self._entries[slot] = (_known(arrays), learned)


def _known(arrays) -> tuple:
    """``arrays`` as :func:`_same_arrays` recognises them: each with its handle."""
    return tuple((a, a.handle.value) for a in arrays)


def _same_arrays(arrays, known) -> bool:
    """Whether ``arrays`` are the very arrays ``known`` (from :func:`_known`) holds, in order:
    the same objects with the same handles."""
    if len(arrays) != len(known):
        return False
    for a, (b, h) in zip(arrays, known):
        if a is not b or a.handle.value != h:
            return False
    return True


class SameCall:
    """What a call was found to be once its checks passed, kept while the next call of its
    kind passes the very same keys and arrays, in the same order (a list call in a training
    loop: ``kv.pushpull(keys, grads, out=weights)``), so that such a call skips every
    per-key check and lookup: for ResNet-20's 65 keys they cost more than copying the bytes.

    ``kind`` names a kind of call (an op, or what is kept of it); one entry per kind and first
    key (so stock ``gluon.Trainer``'s per-key calls are kept too: one entry per key, as in
    :class:`CheckedArrays`), replaced by any call that differs.  A key is the same if it is
    equal and of the same type; an array, if it is the same object with the same handle (an
    entry holds its arrays, so a handle cannot be reused meanwhile).
    """

    def __init__(self):
        self._entries: dict = {}

    @staticmethod
    def _slot(kind, pairs):
        return (kind, pairs[0][0].__class__, pairs[0][0]) if pairs else (kind,)

    def get(self, kind, pairs):
        """What was kept for a call of ``kind`` with these very ``(key, arrays)`` pairs, or None."""
        try:
            entry = self._entries.get(self._slot(kind, pairs))
        except TypeError:    # an unhashable key: the caller's checks will name it
            return None
        if entry is None or len(entry[0]) != len(pairs):
            return None
        known, kept = entry
        for (k, v), (k0, arrays) in zip(pairs, known):
            if k.__class__ is not k0.__class__ or k != k0:
                return None
            if v is None or arrays is None:
                if v is not arrays:
                    return None
            elif v.__class__ is list or v.__class__ is tuple:
                if not _same_arrays(v, arrays):
                    return None
            elif len(arrays) != 1 or arrays[0][0] is not v or arrays[0][1] != v.handle.value:
                return None     # _same_arrays((v,), arrays), inline: one array is the usual case
        return kept

    def put(self, kind, pairs, kept) -> None:
        known = [(k, None if v is None else _known(v if isinstance(v, (list, tuple)) else (v,)))
                 for k, v in pairs]
        self._entries[self._slot(kind, pairs)] = (known, kept)


class WriteBack:
    """The values one round brings back, written into the arrays of all its calls at once.

    Each call of the round still gives MXNet's engine an operation of its own, listing the
    call's arrays as written (:func:`kvstore_ext.engine.push_async`): the engine fixes an
    operation's arrays when it is pushed, and a call must have marked its arrays before it
    returns, while the next call of the round has not been made yet.  What the engine does
    not need is a thread per call: an operation that MXNet starts (its arrays are free) only
    registers here and returns.  The first of them waits for the values (the one thread that
    waits), then writes every call registered by then and ends their operations; a call
    that starts later writes its own at once.  Each array is written by its own call's
    operation, so readers wait for it and nothing else does, and an array of two calls is
    written in call order (the engine starts the second only when the first has ended).

    A failure (no values, or a value that does not fit) goes to ``fail`` once and ends the
    operations without writing, as a partial pull leaves a block it did not bring.

    Given ``arm``, the first operation does not wait: ``arm(callback)`` arranges for
    ``callback`` to run once ``fetch`` would not block (on the thread that receives the
    round's last reply) and says whether it could; that thread then writes the values and
    ends the operations, and no engine thread waits, nor wakes to write (a hand-off of
    about 0.15 ms a round on a busy host).  ``arm`` runs on the engine thread.

    From a key's second round on, the store's :class:`~kvstore_ext.ps.store.ReplySlots`
    push one operation per round that writes every key's slot through this, and the calls
    copy their slots with MXNet's own operations instead.
    """

    def __init__(self, fetch, fail, arm=None):
        self._fetch = fetch          # () -> {key: [(start, stop, values), ...]}; blocks
        self._fail = fail            # (exception) -> None: the next call raises it
        self._arm = arm              # (callback) -> bool: callback() once fetch won't block
        #: when the first operation started (``time.perf_counter``): the round's wait begins
        self.since: float | None = None
        self._lock = threading.Lock()
        self._ready: list = []       # (targets, done) of operations started, not written yet
        self._waiting = False
        self._settled = False
        self._values: dict = {}
        self._error: Exception | None = None

    def start(self, targets, done) -> None:
        """An operation of the round has started: ``targets`` are its ``(key, destination)``
        pairs in writing order, ``done()`` ends it."""
        with self._lock:
            if self._settled:
                entries = [(targets, done)]
            else:
                self._ready.append((targets, done))
                if self._waiting:
                    return
                self._waiting = True
                self.since = time.perf_counter()
                entries = None
        if entries is None and self._armed():
            return
        self._write(entries if entries is not None else self._settle())

    def _armed(self) -> bool:
        """Whether the thread that brings the replies will write them (see ``arm``)."""
        if self._arm is None:
            return False
        try:
            return bool(self._arm(self._answered))
        except Exception:   # fetch, waiting here, will meet the error again and report it
            return False

    def _answered(self) -> None:
        self._write(self._settle())

    def _settle(self) -> list:
        try:
            values, error = self._fetch(), None
        except Exception as exc:
            values, error = {}, exc
            self._fail(exc)
        with self._lock:
            self._values, self._error, self._settled = values, error, True
            self._fetch = None       # it holds the round: no cycle through it
            entries, self._ready = self._ready, []
        return entries

    def _write(self, entries) -> None:
        for targets, done in entries:
            try:
                if self._error is None:
                    for key, destination in targets:
                        destination.write(self._values.get(key, ()))   # none: a partial pull
            except Exception as exc:
                self._fail(exc)
            finally:
                done()


class Batch:
    """Requests of several calls, per server: items, gradient buffers, blocks."""

    def __init__(self, op: str):
        self.op = op
        self.plan: dict[int, tuple[list, list, list]] = {}
        self.keys: set = set()
        self.first_key = None
        self.last_key = None
        self.sent = threading.Event()
        self.tickets = None
        self.error: Exception | None = None
        self.write_back = None       # what writes the replies of the batch's calls
        self.slots = None            # the keys whose reply slots the batch writes, once decided

    def add(self, plan, key) -> None:
        for server, (items, bufs, where) in plan.items():
            mine = self.plan.setdefault(server, ([], [], []))
            mine[0].extend(items)
            mine[1].extend(bufs)
            mine[2].extend(where)
        if not self.keys:
            self.first_key = key
        self.keys.add(key)
        self.last_key = key


class CallerProbe:
    """Whether the thread that made the last call is still at work (Linux's ``/proc``): on a
    core or waiting for one, or it ran less than ``stopped_after`` seconds ago.  A thread
    that is neither is blocked, most likely on the values of the batch it filled; one that
    cannot be read (gone, or no ``/proc``) counts as blocked, which sends the batch as
    before.  A thread waiting for the GIL looks blocked too, for up to Python's switch
    interval: ``stopped_after`` is twice that, so that such a wait does not count."""

    def __init__(self, stopped_after=None, clock=time.monotonic):
        self.thread = None           # native id of the thread that made the last call
        self.stopped_after = 2 * sys.getswitchinterval() if stopped_after is None \
            else stopped_after
        self._clock = clock
        self._seen = (None, None, 0.0)   # (thread, its CPU nanoseconds, when they changed)

    def called(self) -> None:
        self.thread = threading.get_native_id()

    def at_work(self) -> bool:
        thread = self.thread
        if thread is None or thread == threading.get_native_id():
            return False             # the waiting thread made the calls: it has stopped
        try:
            with open(f"/proc/self/task/{thread}/stat", "rb") as f:
                state = f.read().rpartition(b")")[2].split()[0]
            with open(f"/proc/self/task/{thread}/schedstat", "rb") as f:
                ran = int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            return False
        now = self._clock()
        seen_thread, seen_ran, changed = self._seen
        if seen_thread != thread or seen_ran != ran:   # it ran since the last look (a first
            changed = now                              # look counts as just now)
        self._seen = (thread, ran, changed)
        return state == b"R" or now - changed < self.stopped_after


class Coalescer:
    """Holds the open batch and decides when it goes out."""

    def __init__(self, send, write_back=None, clock=time.monotonic, caller=None):
        self._send = send            # plan messages -> tickets
        self._write_back = write_back   # batch -> its Batch.write_back, made as it opens
        self._clock = clock          # what "quiet for QUIET seconds" is measured with
        self._caller = caller if caller is not None else CallerProbe()
        self._lock = threading.Lock()
        self._open: Batch | None = None
        self.cycle_end = None
        self.last_add = 0.0
        self._previous = (None, None)   # first and last key of the batch sent last

    def add(self, op: str, key, plan) -> Batch:
        with self._lock:
            batch = self._open
            if batch is not None and (key in batch.keys or batch.op != op):
                self.cycle_end = batch.last_key
                self._send_locked()
                batch = None
            if batch is None:
                batch = self._open = Batch(op)
                if self._write_back is not None:
                    batch.write_back = self._write_back(batch)
                if self.cycle_end is None and key == self._previous[0]:
                    self.cycle_end = self._previous[1]   # the last batch was one whole step
            batch.add(plan, key)
            self.last_add = self._clock()
            self._caller.called()
            if key == self.cycle_end:
                self._send_locked()
            return batch

    def holds(self, key) -> bool:
        """Whether the open batch, not sent yet, holds a call of ``key``."""
        with self._lock:
            return self._open is not None and key in self._open.keys

    def flush(self, batch: Batch | None = None) -> None:
        """Send the open batch (only if it is ``batch``, when one is named)."""
        with self._lock:
            if self._open is not None and (batch is None or self._open is batch):
                self._send_locked()

    def wait_sent(self, batch: Batch) -> None:
        """Wait until ``batch`` is sent; send it if the calls feeding it have stopped: none
        for ``QUIET`` seconds, and their thread is not at work (a thread preempted in the
        middle of a step will make the step's other calls), or none for ``HOLD_AT_MOST``."""
        wait = QUIET
        while not batch.sent.wait(wait):
            quiet = self._clock() - self.last_add
            if quiet < QUIET:
                wait = QUIET
            elif quiet < HOLD_AT_MOST and self._caller.at_work():
                wait = min(2 * wait, PATIENCE)   # each look costs the GIL twice: fewer of them
            else:
                self.flush(batch)

    def _send_locked(self) -> None:
        batch, self._open = self._open, None
        self._previous = (batch.first_key, batch.last_key)
        try:
            with unseen():       # an error is the batch's: its write-back defers it
                batch.tickets = self._send({s: ({"op": batch.op, "items": its}, bufs)
                                            for s, (its, bufs, _) in batch.plan.items()})
        except Exception as exc:
            batch.error = exc
        finally:
            batch.sent.set()
