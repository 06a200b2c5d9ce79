"""Makes stock ``gluon.Trainer`` treat kvstore_ext's asynchronous stores as MXNet's dist_async.

``Trainer._init_kvstore`` refuses ``update_on_kvstore=False`` on an asynchronous
store, and otherwise forces the update onto the servers, but it recognises such
a store only by ``'async' in kvstore.type``.  ``dist_asp``, ``dist_ssp`` and
``dist_dssp`` do not let workers wait for each other's pushes, so with updates on
the workers each one would pull back a different gradient sum and the copies of
the model would silently drift apart.  Their classes say ``asynchronous = True``;
the wrapper installed here gives them MXNet's async rule: the same ValueError
for ``update_on_kvstore=False``, update on the kvstore otherwise (even with
``MXNET_UPDATE_ON_KVSTORE=0``).  Other stores are left to MXNet.
"""
from __future__ import annotations

import functools

from mxnet import gluon
from mxnet.kvstore import KVStoreBase


def is_asynchronous(kvstore) -> bool:
    """Whether ``kvstore`` (a store, or a name as ``gluon.Trainer`` takes it) is asynchronous."""
    if isinstance(kvstore, str):
        kvstore = KVStoreBase.kv_registry.get(kvstore.lower())
    return bool(getattr(kvstore, "asynchronous", False))


def install() -> None:
    """Wrap ``gluon.Trainer._init_kvstore`` (once; subclasses inherit it)."""
    native = gluon.Trainer._init_kvstore
    if getattr(native, "_kvstore_ext", False):
        return

    @functools.wraps(native)
    def _init_kvstore(self):
        config = self._kvstore_params
        if not is_asynchronous(config["kvstore"]):
            return native(self)
        if config["update_on_kvstore"] is False:
            raise ValueError("Please set update_on_kvstore=True when training in async mode.")
        # MXNet's own answer for an async store; asked as the user's choice, it also makes
        # Trainer send the optimizer to the servers, whatever MXNET_UPDATE_ON_KVSTORE says
        chosen, config["update_on_kvstore"] = config["update_on_kvstore"], True
        try:
            return native(self)
        finally:
            config["update_on_kvstore"] = chosen

    _init_kvstore._kvstore_ext = True
    gluon.Trainer._init_kvstore = _init_kvstore


install()
