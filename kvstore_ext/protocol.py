"""The worker-to-server request schema, checked before a server acts on a message.

A request header is ``{"op", "seq", "worker", "reply_to", "items"?}``; each item
names one block of one key.  Its fields by op:

=============  ==========================================================
``init``       ``[key, block, dtype, shape, size]`` (one buffer each when
               ``has_value``)
``push``,      ``[key, block, dtype, size]``, then for ``dist_psp``
``pushpull``   ``stamp, wanted version`` (one buffer each)
``pull``       ``[key, block, dtype, size]``, then for ``dist_psp``
               ``-1, wanted version``
others         no items (``set_optimizer``, ``set_states``: one buffer)
=============  ==========================================================

Authentication says who sent a message, not that it is well formed: a header
that does not fit is refused with a :class:`ProtocolError` that names the
field, and the server goes on.
"""
from __future__ import annotations

import math

import numpy as np

ITEM_OPS = ("init", "push", "pushpull", "pull")
OTHER_OPS = ("set_optimizer", "get_states", "set_states", "stats", "hello")
MAX_DIMS = 32
_NUMERIC_DTYPES: set = set()   # dtype strings already found numeric


class ProtocolError(ValueError):
    """A request header that does not fit the schema."""


def _int(value, name: str, low: int = 0, high: int | None = None) -> int:
    if type(value) is not int or value < low or (high is not None and value > high):
        bound = f" in [{low}, {high}]" if high is not None else f" >= {low}"
        raise ProtocolError(f"{name} must be an integer{bound}, got {value!r:.80}")
    return value


def check_request(header: dict, num_workers: int) -> None:
    """Raise :class:`ProtocolError` unless ``header`` is a well-formed request."""
    op = header.get("op")
    if op not in ITEM_OPS and op not in OTHER_OPS:
        raise ProtocolError(f"unknown operation {op!r:.80}")
    _int(header.get("seq"), "seq")
    _int(header.get("worker"), "worker", 0, num_workers - 1)
    if not isinstance(header.get("reply_to"), str) or len(header["reply_to"]) > 200:
        raise ProtocolError("reply_to must be a string")
    if op not in ITEM_OPS:
        return
    items = header.get("items")
    if not isinstance(items, list) or not items:
        raise ProtocolError(f"{op}: items must be a non-empty list")
    seen = set()
    for item in items:
        where = check_item(op, item)
        if where in seen:
            raise ProtocolError(f"{op}: key {where[0]!r} block {where[1]} named twice in "
                                f"one request")
        seen.add(where)


def check_item(op: str, item) -> tuple:
    """The ``(key, block)`` of a well-formed item of ``op``."""
    if not isinstance(item, list) or len(item) < 4:
        raise ProtocolError(f"{op}: an item must be a list of at least 4 fields, got {item!r:.80}")
    key = item[0]
    if isinstance(key, bool) or not isinstance(key, (int, str)) or \
            (isinstance(key, str) and len(key) > 1000):
        raise ProtocolError(f"{op}: a key must be an int or a str, got {key!r:.80}")
    _int(item[1], "block")
    dtype = item[2]
    if not isinstance(dtype, str) or dtype not in _NUMERIC_DTYPES:   # one set look-up per key
        try:
            if not isinstance(dtype, str) or np.dtype(dtype).kind not in "biuf":
                raise TypeError
        except TypeError:
            raise ProtocolError(f"{op}: key {key!r}: unsupported dtype {dtype!r:.40}") from None
        if len(_NUMERIC_DTYPES) < 64:
            _NUMERIC_DTYPES.add(dtype)
    if op == "init":
        if len(item) != 5 or not isinstance(item[3], list) or len(item[3]) > MAX_DIMS:
            raise ProtocolError(f"init: key {key!r}: an item is [key, block, dtype, shape, size]")
        shape = [_int(d, "a shape dimension") for d in item[3]]
        size = _int(item[4], "size")
        if size > math.prod(shape):
            raise ProtocolError(f"init: key {key!r}: a block of {size} elements does not fit "
                                f"shape {tuple(shape)}")
    else:
        _int(item[3], "size")
        if len(item) not in (4, 6):
            raise ProtocolError(f"{op}: key {key!r}: an item has 4 fields (6 for dist_psp)")
        for value in item[4:]:
            _int(value, "a version", -1)
    return key, item[1]
