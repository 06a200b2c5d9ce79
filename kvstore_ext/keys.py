"""The KVStore call forms every store accepts (one key or a list of keys, with values), and the
calls of MXNet's own stores that every kvstore_ext store answers alike (:class:`MXNetCalls`)."""
from __future__ import annotations

import numpy as np
from mxnet.ndarray import NDArray


def as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


class NotAnNDArray(TypeError, AssertionError):
    """A value or out that is not an NDArray: a TypeError that names it, and the
    AssertionError MXNet's stores raise for it (``_ctype_key_value``)."""


def pairs(key, value, what: str = "value") -> list:
    """``[(key, value)]`` for a single key or the list form; every value an NDArray (or a
    list of them, one per device), checked here, before anything is sent: a numpy array
    given to ``init`` failed on worker 0 only, and the others waited for its values."""
    if isinstance(key, (list, tuple)):
        values = as_list(value)
        if len(values) != len(key):
            raise ValueError(f"{len(key)} keys but {len(values)} {what}s")
        found = list(zip(key, values))
    else:
        found = [(key, value)]
    for k, v in found:
        for a in (v if isinstance(v, (list, tuple)) else (v,)):
            if not isinstance(a, NDArray):
                raise NotAnNDArray(f"key {k!r}: the {what} must be an mxnet NDArray (or a "
                                   f"list of them, one per device), got {type(a).__name__}")
    return found


def grouped_pairs(key, value, what: str = "value") -> list:
    """:func:`pairs`, a key named more than once in a call merged into one pair that lists
    all the arrays given for it, in order: as MXNet's stores group a call's pairs
    (``GroupKVPairs``), a repeated key's pushes are summed and its outputs all filled."""
    found = pairs(key, value, what)
    try:
        if len(found) < 2 or len({k for k, _ in found}) == len(found):
            return found
    except TypeError:   # an unhashable key: check_key names it where the call checks its keys
        return found
    merged: dict = {}
    for k, v in found:
        merged.setdefault(k, []).extend(as_list(v))
    return list(merged.items())


def check_key(key):
    """An int or str key (numpy integers become int); anything else is named in a TypeError."""
    if isinstance(key, (bool, np.bool_)) or not isinstance(key, (int, np.integer, str)):
        raise TypeError(f"kvstore keys are int or str, got {key!r} ({type(key).__name__})")
    return int(key) if isinstance(key, np.integer) else key


def refuse_sparse(store_type: str, key, arrays, what: str = "value") -> None:
    """Refuse an array of sparse storage (row_sparse, csr) at once, naming key and store.

    The stores keep and move dense arrays; a row_sparse array read densely would train
    differently from MXNet's sparse path (its lazy updates touch only the rows present), so
    it is an error, never a silent conversion."""
    for a in as_list(arrays):
        stype = getattr(a, "stype", "default")
        if stype != "default":
            from .errors import KVStoreError
            raise KVStoreError(
                f"{store_type}: key {key!r}: the {what} has {stype} storage; {store_type} "
                f"supports dense (default storage) arrays only, not {stype} weights or "
                f"gradients (use a dense parameter, or MXNet's dist_sync for sparse ones)")


def refuse_second_array(store_type: str, key, first_handle, value) -> None:
    """Refuse initialising ``key`` again, in the same store, from another array than the first.

    One store object given to two ``gluon.Trainer``s (``kvstore=kv``) initialises every key
    twice, from two models' arrays; keeping the first value (what a repeated init does) would
    train the second model on the first one's weights, in silence.  MXNet's ``local`` store
    refuses every repeated init ("duplicate init of key"), and its ``dist_sync`` hangs.  The
    same array again (a Trainer made anew over the same parameters) is kept."""
    if first_handle is None or first_handle == value.handle.value:
        return
    from .errors import KVStoreError
    raise KVStoreError(
        f"{store_type}: duplicate init of key {key!r}: this store initialised it from another "
        f"array, and keeps that array's values (is one store object given to two "
        f"gluon.Trainers, or kv.init called twice for the key?). Give each model's "
        f"parameters to one Trainer, each Trainer its own store, or initialise each key once")


class MXNetCalls:
    """Calls of MXNet's own KVStore that are not in ``KVStoreBase``, for every kvstore_ext store:
    ``_barrier`` (MXNet's name for ``barrier``, used in MXNet's scripts and tests), and what
    the stores refuse by design.  Without these, MXNet code calling them would fail deep
    inside Gluon with an AttributeError; here a refusal names the feature and the store."""

    def _barrier(self):
        return self.barrier()

    def row_sparse_pull(self, key, out=None, priority=0, row_ids=None):
        from .errors import KVStoreError
        raise KVStoreError(f"{self.type}: row_sparse_pull (key {key!r}) is not supported: "
                           f"{self.type} keeps dense arrays only (row_sparse weights are "
                           f"supported by MXNet's dist_sync and dist_async)")

    def set_gradient_compression(self, compression_params):
        from .errors import KVStoreError
        raise KVStoreError(f"{self.type}: gradient compression ({compression_params!r}) is not "
                           f"supported; {self.type} sends gradients uncompressed (MXNet's "
                           f"dist_sync supports 2-bit compression)")
