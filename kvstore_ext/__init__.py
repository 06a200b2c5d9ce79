"""kvstore_ext: synchronisation models for MXNet Gluon beyond dist_sync and dist_async.

``import kvstore_ext`` registers the stores with MXNet, so that
``gluon.Trainer(params, 'sgd', ..., kvstore='dist_ssp')`` just works inside a
job started by ``scripts/launch.py``.  ``kvstore_ext.create(name, **params)``
gives a store with explicit parameters (for example ``staleness=2``).

Layout (docs/architecture.md): ``registry`` (one row per store type), ``policies``
(the synchronisation models, pure), ``ps`` (the parameter-server runtime on ZeroMQ),
``horovod`` (the decentralised stores), ``launch`` (starting jobs), ``simulate`` and
``experiments`` (tooling).
"""
from __future__ import annotations

from . import registry
from .errors import (JobAbortedError, KVStoreError, NodeLostError, SchedulerLostError,
                     ServerLostError, StalledError, WorkerLostError)
from .policies import dssp_extra_iterations
from .registry import STORE_TYPES, StoreConfig, StoreType, make_policy, register

__version__ = "0.1.0"

#: the store classes by their public names (importing one loads mxnet, or horovod's binding)
_CLASSES = {"DistBSP": "dist_bsp", "DistASP": "dist_asp", "DistSSP": "dist_ssp",
            "DistDSSP": "dist_dssp", "DistPSP": "dist_psp", "DistDCS3GD": "dist_dcs3gd",
            "DistSSGD": "dist_ssgd"}

__all__ = ["create", "register", "StoreType", "KVStoreError", "NodeLostError",
           "WorkerLostError", "ServerLostError", "SchedulerLostError", "JobAbortedError",
           "StalledError",
           "STORE_TYPES", "StoreConfig", "make_policy", "dssp_extra_iterations",
           "HOROVOD_STORE_TYPES", *_CLASSES]


def create(name: str, **params):
    """Create a kvstore by name with parameters, e.g. ``create('dist_ssp', staleness=2)``.

    The result is an ``mxnet.kvstore.KVStoreBase`` that ``gluon.Trainer`` accepts as ``kvstore=``.
    """
    config = StoreConfig.build(name, params)   # names the bad type or parameter
    return registry.class_of(registry.lookup(config.type))(**config.params)


def __getattr__(name):
    # The store classes need mxnet (and horovod); the scheduler and the policies do not.
    if name in _CLASSES:
        return registry.class_of(registry.lookup(_CLASSES[name]))
    if name == "ParameterServerStore":
        from .ps.store import ParameterServerStore
        return ParameterServerStore
    if name == "delay_compensated":
        from .horovod.store import delay_compensated
        return delay_compensated
    if name == "HOROVOD_STORE_TYPES":
        return {n: STORE_TYPES[n] for n in registry.names(registry.HOROVOD)}
    raise AttributeError(name)


def _register_with_mxnet() -> None:
    import os
    import sys
    from .jobenv import ROLE, WITHOUT_MXNET
    if os.environ.get(ROLE) in WITHOUT_MXNET:
        return   # a server chooses MXNet's engine before it imports it; the others never do
    if "mxnet" in sys.modules or _importable("mxnet"):
        from . import mxnet_compat  # noqa: F401  (Trainer's async rule, create()'s guard)
        from . import optimizers  # noqa: F401  ('adadelay', 'adaptiverevision', 'dcasgda', ...)
        runtimes = {registry.PS: _importable("zmq"), registry.HOROVOD: _importable("horovod")}
        registry.on_register(lambda row: _file_with_mxnet(row, runtimes[row.backend]))
        if os.environ.get(ROLE) == "worker" or "HOROVOD_RANK" in os.environ:
            # A worker of a job that crashes in native code shows every thread's Python stack,
            # then dies of the signal, so that its launcher can name it.  MXNet's own handler,
            # installed when mxnet was imported, would end it with exit(-1) instead: status
            # 255, which says nothing of a crash (and leaves no core to look at).
            import faulthandler
            import signal
            try:
                signal.signal(signal.SIGSEGV, signal.SIG_DFL)
            except ValueError:     # imported outside the main thread: MXNet's handler stays
                pass
            faulthandler.enable(all_threads=True)


def _file_with_mxnet(row: StoreType, runtime_present: bool) -> None:
    """Put a row's class in MXNet's registry, so ``mx.kv.create(row.name)`` builds it."""
    if not runtime_present:
        return    # no pyzmq or no horovod: the type stays known, its class cannot load
    from mxnet.kvstore import KVStoreBase
    KVStoreBase.kv_registry[row.name] = registry.class_of(row)


def _importable(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


registry.load_plugins()
_register_with_mxnet()
