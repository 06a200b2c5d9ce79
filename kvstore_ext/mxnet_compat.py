"""What makes kvstore_ext's stores behave as MXNet's own inside stock MXNet code.

``gluon.Trainer`` treats the asynchronous stores as MXNet's dist_async (:func:`install`),
and ``mx.kv.create`` refuses an unknown ``dist_*`` name in a job with a clear error
(:func:`guard_native_create`).

``Trainer._init_kvstore`` refuses ``update_on_kvstore=False`` on an asynchronous
store, and otherwise forces the update onto the servers, but it recognises such
a store only by ``'async' in kvstore.type``.  ``dist_asp``, ``dist_ssp`` and
``dist_dssp`` do not let workers wait for each other's pushes, so with updates on
the workers each one would pull back a different gradient sum and the copies of
the model would silently drift apart.  Their classes say ``asynchronous = True``;
the wrapper installed here gives them MXNet's async rule: the same ValueError
for ``update_on_kvstore=False``, update on the kvstore otherwise (even with
``MXNET_UPDATE_ON_KVSTORE=0``).  The Horovod stores (``dist_ssgd``, ``dist_dcs3gd``)
run the optimizer inside the store and get the same rule, with an error that names
them.  Other stores are left to MXNet.
"""
from __future__ import annotations

import functools
import os

from mxnet import gluon
from mxnet.kvstore import KVStoreBase

from . import jobenv, registry


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
        _refuse_delay_optimizer(self._optimizer, config["kvstore"])
        _refuse_sparse_params(self._params, config["kvstore"])
        # the Horovod stores run the optimizer inside the store, on every worker
        name = _store_name(config["kvstore"])
        decentralised = registry.is_horovod(name)
        if not is_asynchronous(config["kvstore"]) and not decentralised:
            return native(self)
        if config["update_on_kvstore"] is False:
            if decentralised:
                raise ValueError(f"{name} runs the optimizer inside the store on every worker: "
                                 f"update_on_kvstore=False is not supported; leave it None or "
                                 f"set it to True")
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


def _store_name(kvstore) -> str:
    """The type name of ``kvstore`` as gluon.Trainer takes it: a name, a store, or None."""
    name = kvstore if isinstance(kvstore, str) else getattr(kvstore, "type", "")
    return name if isinstance(name, str) else ""


def _refuse_sparse_params(params, kvstore) -> None:
    """kvstore_ext's stores keep dense arrays only: a parameter with row_sparse weights or
    gradients is refused here, naming it, before any key is made (MXNet would otherwise
    call ``row_sparse_pull`` or push sparse gradients, which the stores refuse one by one)."""
    name = _store_name(kvstore)
    if name.lower() not in registry.names():
        return
    for p in params:
        for what, stype in (("weight", p._stype), ("gradient", p._grad_stype)):
            if stype != "default":
                raise ValueError(
                    f"{name}: parameter {p.name!r} has {stype} {what} storage; {name} supports "
                    f"dense parameters only (stype='default', grad_stype='default'); use "
                    f"MXNet's dist_sync or dist_async for sparse ones")


def _refuse_delay_optimizer(optimizer, kvstore) -> None:
    """A delay-aware optimizer (``kvstore_ext.optimizers``) needs servers that apply each push
    with its delay: kvstore_ext's asynchronous stores.  Anywhere else in a distributed job it
    would run without the delay (MXNet's dist_async, or updates on the workers) or on summed
    gradients, so it is refused before any store is made.  Single-process stores keep it
    (delay 0, which is exact there)."""
    if not getattr(optimizer, "needs_delay", False) or kvstore is None:
        return
    name = _store_name(kvstore)
    if "dist" not in name.lower() or is_asynchronous(kvstore):
        return
    from .optimizers import delay_refusal
    raise ValueError(delay_refusal(optimizer, name, asynchronous=False))


def guard_native_create() -> None:
    """Inside a kvstore_ext job, an unknown ``dist_*`` name gets a clear error.

    MXNet hands every unregistered name to its native stores; a ``dist`` one
    starts ps-lite, which in a kvstore_ext job (no ``DMLC_*`` variables) dies with
    an unrelated check failure.  Every other name ('local', 'device', 'nccl', ...,
    which a multi-device ``gluon.Trainer`` creates by default) reaches MXNet
    unchanged, as does everything outside such a job.
    """
    import mxnet.kvstore as kvs
    native_create = kvs.create
    if getattr(native_create, "_kvstore_ext_guard", False):
        return

    def create(name="local"):
        lowered = name.lower() if isinstance(name, str) else ""
        # MXNet's KVStore::Create starts ps-lite for any name that contains "dist"
        if "dist" in lowered and lowered not in KVStoreBase.kv_registry \
                and os.environ.get(jobenv.ROLE) == "worker":
            raise ValueError(f"unknown kvstore type {name!r} in a kvstore_ext job; kvstore_ext "
                             f"provides {', '.join(registry.names())} (MXNet's own "
                             f"dist_sync/dist_async need launch.py --backend mxnet)")
        return native_create(name)

    create._kvstore_ext_guard = True
    create.__doc__ = native_create.__doc__
    kvs.create = create


install()
guard_native_create()
