"""The KVStore call forms every store accepts: one key or a list of keys, with values."""
from __future__ import annotations

import numpy as np


def as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def pairs(key, value, what: str = "value") -> list:
    """``[(key, value)]`` for a single key or the list form."""
    if isinstance(key, (list, tuple)):
        values = as_list(value)
        if len(values) != len(key):
            raise ValueError(f"{len(key)} keys but {len(values)} {what}s")
        return list(zip(key, values))
    return [(key, value)]


def check_key(key):
    """An int or str key (numpy integers become int); anything else is named in a TypeError."""
    if isinstance(key, (bool, np.bool_)) or not isinstance(key, (int, np.integer, str)):
        raise TypeError(f"kvstore keys are int or str, got {key!r} ({type(key).__name__})")
    return int(key) if isinstance(key, np.integer) else key
