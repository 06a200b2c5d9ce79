"""The wire schema: every message's ``op`` (:class:`Op`), the fields of a request's items
(:data:`KEY` ...), and the check a server runs before it acts on a request.

A request header is ``{"op", "seq", "worker", "reply_to", "items"?}``; each item
names one block of one key.  Its fields by op:

=============  ==========================================================
``init``       ``[key, block, dtype, shape, size]`` (one buffer each when
               ``has_value``)
``push``,      ``[key, block, dtype, size]``, then for ``dist_psp``
``pushpull``   ``stamp, wanted version`` (one buffer each)
``pull``       ``[key, block, dtype, size]``, then for ``dist_psp``
               ``-1, wanted version``
``set_lr``     ``lr``: the learning rate the workers' optimizer now has
               (``gluon.Trainer.set_learning_rate``), no items
``away``       ``away``: true when the worker starts waiting at a barrier,
               false when it is through (a worker pool lets others compute
               meanwhile), no items
others         no items (``set_optimizer``, ``set_states``: one buffer)
=============  ==========================================================

Replies are ``{"op": "reply", "seq", "ok", ...}`` with the values as buffers; a
``dist_pool`` server adds ``batch_size`` (the worker's next, 0: stop), ``pool`` (its size),
``lr`` (the rate it applies) and ``updates`` (pushes applied) to every reply that lets a worker
go.  A reply to ``init`` carries ``versions`` (each item's block's updates so far, in item
order: a ``dist_psp`` store made while the job runs stamps its first gradients with them), and a
``dist_psp`` pull's parts carry ``part`` (the item indices) and their ``versions``.  Between
nodes and the scheduler: ``register``, ``heartbeat``, ``barrier``, ``finalize``, ``failed`` (a
worker about to stop says why: it lost a server) one way; ``ack``, ``ok``, ``topology``,
``abort``, ``node_dead``, ``node_left``, ``shutdown`` the other.  A worker's ``heartbeat``
carries ``idle`` (seconds since its last kvstore call, null while a call waits), and the
scheduler's ``ack`` to it ``quiet``: the other workers idle a second or more, ``[[rank,
seconds], ...]``, which a stall report names.

Authentication says who sent a message, not that it is well formed: a header
that does not fit is refused with a :class:`ProtocolError` that names the
field, and the server goes on.
"""
from __future__ import annotations

import math

import numpy as np


#: arrays that lie back to back and hold at least this many bytes together, or one array
#: this large, travel in a ZeroMQ frame of their own, sent without a copy (pyzmq's own
#: threshold for that); the others are copied together into frame 0.  Each such frame costs
#: the server CPU of its own, which the planner counts (:func:`frames_of`)
OWN_FRAME_BYTES = 1 << 16
#: offsets of the arrays a worker stages for a message, and of those copied into frame 0, are
#: multiples of this many bytes: aligned for any dtype, and no more, so that a worker's
#: arrays of one dtype lie back to back (but after an odd-length float32 one)
ALIGN = 8


def own_frame(nbytes: int) -> bool:
    """Whether an array of ``nbytes`` bytes, on its own, travels in a frame of its own
    (``transport.pack`` spells the same test inline: it runs once per array of every
    message)."""
    return nbytes >= OWN_FRAME_BYTES


def layout(sizes) -> tuple[list[int], int]:
    """Offsets of arrays of ``sizes`` bytes laid end to end, each at a multiple of
    :data:`ALIGN` (a worker's staging buffer), and the bytes they take in all."""
    offsets, end = [], 0
    for n in sizes:
        offsets.append(end)
        end += -(-n // ALIGN) * ALIGN
    return offsets, end


def pack_runs(places, limit: int | None = None):
    """How ``transport.pack`` cuts a message into frames: for ``places``, ``(address, nbytes,
    itemsize)`` of each array in order (address -1: unknown), ``(first, stop, together)``:
    ``together`` when ``places[first:stop]`` (two or more) lie back to back in memory, each at
    an offset from the first that is a multiple of its item size, with
    :data:`OWN_FRAME_BYTES` or more in all and ``limit`` at most (the receivers' frame
    limit): one frame.  Otherwise ``stop`` is ``first + 1``, and the array goes alone
    (:func:`own_frame`) or into frame 0."""
    first, count = 0, len(places)
    while first < count:
        start, nbytes, _ = places[first]
        end, stop = start + nbytes, first + 1
        if start >= 0 and nbytes:
            while stop < count:
                address, n, itemsize = places[stop]
                if not n or address != end or (end - start) % itemsize or \
                        (limit is not None and end + n - start > limit):
                    break
                end += n
                stop += 1
        if stop > first + 1 and end - start >= OWN_FRAME_BYTES:
            yield first, stop, True
        else:
            stop = first + 1
            yield first, stop, False
        first = stop


def frames_of(places, limit: int | None = None) -> int:
    """The frames besides frame 0 that a message of arrays at ``places`` (as
    :func:`pack_runs` takes them) travels in."""
    return sum(1 for first, _, together in pack_runs(places, limit)
               if together or own_frame(places[first][1]))


class Op:
    """Every message's ``op``, in one place."""

    # worker -> server, each answered by a REPLY
    INIT = "init"
    PUSH = "push"
    PUSHPULL = "pushpull"
    PULL = "pull"
    SET_OPTIMIZER = "set_optimizer"
    SET_LR = "set_lr"
    GET_STATES = "get_states"
    SET_STATES = "set_states"
    STATS = "stats"
    HELLO = "hello"
    AWAY = "away"                 # a worker waits at a barrier (or is through it)
    REPLY = "reply"
    # node -> scheduler
    REGISTER = "register"
    HEARTBEAT = "heartbeat"
    BARRIER = "barrier"
    FINALIZE = "finalize"
    FAILED = "failed"             # a worker is about to stop: why (it lost a server)
    # scheduler -> node
    ACK = "ack"
    OK = "ok"
    TOPOLOGY = "topology"
    ABORT = "abort"
    NODE_DEAD = "node_dead"
    NODE_LEFT = "node_left"
    NODE_JOINED = "node_joined"   # a worker joined the running job (asynchronous stores)
    SHUTDOWN = "shutdown"


ITEM_OPS = (Op.INIT, Op.PUSH, Op.PUSHPULL, Op.PULL)
OTHER_OPS = (Op.SET_OPTIMIZER, Op.SET_LR, Op.GET_STATES, Op.SET_STATES, Op.STATS, Op.HELLO,
             Op.AWAY)
SCHEDULER_OPS = (Op.REGISTER, Op.HEARTBEAT, Op.BARRIER, Op.FINALIZE, Op.FAILED)

#: the fields of an item (a list, so that a header stays small JSON)
KEY, BLOCK, DTYPE = 0, 1, 2
SIZE = 3                    # push, pushpull, pull: the block's number of elements
SHAPE, INIT_SIZE = 3, 4     # init: the key's shape, then the block's number of elements
STAMP, WANTED = 4, 5        # dist_psp: the version a pushed gradient was computed from (-1 in
                            # a pull), and the version the reply must bring at least
MAX_DIMS = 32
_NUMERIC_DTYPES: set = set()   # dtype strings already found numeric


class ProtocolError(ValueError):
    """A request header that does not fit the schema."""


def _int(value, name: str, low: int = 0, high: int | None = None) -> int:
    if type(value) is not int or value < low or (high is not None and value > high):
        bound = f" in [{low}, {high}]" if high is not None else f" >= {low}"
        raise ProtocolError(f"{name} must be an integer{bound}, got {value!r:.80}")
    return value


def valid_lr(lr) -> bool:
    """Whether ``lr`` is a learning rate a server takes (``set_lr``): a finite number >= 0."""
    return type(lr) in (int, float) and math.isfinite(lr) and lr >= 0


def check_request(header: dict, num_workers: int, valid_items: dict | None = None) -> None:
    """Raise :class:`ProtocolError` unless ``header`` is a well-formed request.

    ``valid_items``: the items of each worker's last well-formed request of each op, kept
    here.  A worker's step sends the same items every round (keys, blocks, dtypes, sizes), so
    from the second round on its items cost one comparison of lists, not a check of every
    field of every item (65 items a ResNet-20 push).  Python's comparison: an item equal to a
    valid one (``4.0`` for ``4``) passes as that one, and is served as that one, since the server
    resolves items by value (``Server.route``) and checks each buffer's bytes."""
    op = header.get("op")
    if op not in ITEM_OPS and op not in OTHER_OPS:
        raise ProtocolError(f"unknown operation {op!r:.80}")
    _int(header.get("seq"), "seq")
    _int(header.get("worker"), "worker", 0, num_workers - 1)
    if not isinstance(header.get("reply_to"), str) or len(header["reply_to"]) > 200:
        raise ProtocolError("reply_to must be a string")
    if op == Op.SET_LR:
        lr = header.get("lr")
        if not valid_lr(lr):
            raise ProtocolError(f"set_lr: lr must be a finite number >= 0, got {lr!r:.80}")
    if op == Op.SET_OPTIMIZER and not (isinstance(header.get("store", ""), str)
                                       and len(header.get("store", "")) <= 64):
        raise ProtocolError(f"set_optimizer: store must be a string of at most 64 characters, "
                            f"got {header.get('store')!r:.80}")
    if op == Op.AWAY and type(header.get("away")) is not bool:
        raise ProtocolError(f"away: away must be true or false, got {header.get('away')!r:.80}")
    if op not in ITEM_OPS:
        return
    items = header.get("items")
    if not isinstance(items, list) or not items:
        raise ProtocolError(f"{op}: items must be a non-empty list")
    slot = (header["worker"], op)
    if valid_items is not None and valid_items.get(slot) == items:
        return
    seen = set()
    for item in items:
        where = check_item(op, item)
        if where in seen:
            raise ProtocolError(f"{op}: key {where[0]!r} block {where[1]} named twice in "
                                f"one request")
        seen.add(where)
    if valid_items is not None:   # one list per worker and op: bounded by the header limit
        valid_items[slot] = items


def check_item(op: str, item) -> tuple:
    """The ``(key, block)`` of a well-formed item of ``op``."""
    if not isinstance(item, list) or len(item) < 4:
        raise ProtocolError(f"{op}: an item must be a list of at least 4 fields, got {item!r:.80}")
    key = item[KEY]
    if isinstance(key, bool) or not isinstance(key, (int, str)) or \
            (isinstance(key, str) and len(key) > 1000):
        raise ProtocolError(f"{op}: a key must be an int or a str, got {key!r:.80}")
    _int(item[BLOCK], "block")
    dtype = item[DTYPE]
    if not isinstance(dtype, str) or dtype not in _NUMERIC_DTYPES:   # one set look-up per key
        try:
            if not isinstance(dtype, str) or np.dtype(dtype).kind not in "biuf":
                raise TypeError
        except TypeError:
            raise ProtocolError(f"{op}: key {key!r}: unsupported dtype {dtype!r:.40}") from None
        if len(_NUMERIC_DTYPES) < 64:
            _NUMERIC_DTYPES.add(dtype)
    if op == Op.INIT:
        if len(item) != 5 or not isinstance(item[SHAPE], list) or len(item[SHAPE]) > MAX_DIMS:
            raise ProtocolError(f"init: key {key!r}: an item is [key, block, dtype, shape, size]")
        shape = [_int(d, "a shape dimension") for d in item[SHAPE]]
        size = _int(item[INIT_SIZE], "size")
        if size > math.prod(shape):
            raise ProtocolError(f"init: key {key!r}: a block of {size} elements does not fit "
                                f"shape {tuple(shape)}")
    else:
        _int(item[SIZE], "size")
        if len(item) not in (4, 6):
            raise ProtocolError(f"{op}: key {key!r}: an item has 4 fields (6 for dist_psp)")
        for value in item[STAMP:]:
            _int(value, "a version", -1)
    return key, item[BLOCK]
