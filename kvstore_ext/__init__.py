"""kvstore_ext: synchronisation models for MXNet Gluon beyond dist_sync and dist_async.

``import kvstore_ext`` registers the stores with MXNet, so that
``gluon.Trainer(params, 'sgd', ..., kvstore='dist_ssp')`` just works inside a
job started by ``scripts/launch.py``.  ``kvstore_ext.create(name, **params)``
gives a store with explicit parameters (for example ``staleness=2``).
"""
from __future__ import annotations

from .errors import (JobAbortedError, KVStoreError, NodeLostError, SchedulerLostError,
                     ServerLostError, WorkerLostError)
from .config import STORE_TYPES, StoreConfig
from .horovod_params import HOROVOD_STORE_TYPES
from .policies import dssp_extra_iterations, make_policy

__version__ = "0.1.0"

__all__ = ["create", "KVStoreError", "NodeLostError", "WorkerLostError", "ServerLostError",
           "SchedulerLostError", "JobAbortedError", "STORE_TYPES", "StoreConfig",
           "make_policy", "dssp_extra_iterations", "DistBSP", "DistASP", "DistSSP", "DistDSSP", "DistPSP",
           "DistDCS3GD", "DistSSGD", "HOROVOD_STORE_TYPES"]


def create(name: str, **params):
    """Create a kvstore by name with parameters, e.g. ``create('dist_ssp', staleness=2)``.

    The result is an ``mxnet.kvstore.KVStoreBase`` that ``gluon.Trainer`` accepts as ``kvstore=``.
    """
    if str(name).lower() in HOROVOD_STORE_TYPES:   # decentralised, on Horovod
        from .horovod_store import create_store
        return create_store(name, **params)
    from .store import STORE_CLASSES
    config = StoreConfig.build(name, params)   # names the bad type or parameter
    return STORE_CLASSES[config.type](**config.params)


def __getattr__(name):
    # The store classes need mxnet; the scheduler and the policies do not.
    if name in ("DistBSP", "DistASP", "DistSSP", "DistDSSP", "DistPSP", "ParameterServerStore"):
        from . import store
        return getattr(store, name)
    if name in ("DistDCS3GD", "DistSSGD", "delay_compensated"):
        from . import horovod_store
        return getattr(horovod_store, name)
    raise AttributeError(name)


def _register_with_mxnet() -> None:
    import os
    import sys
    if os.environ.get("KVX_ROLE") in ("server", "scheduler"):
        return   # those processes choose MXNet's engine before they import it
    if "mxnet" in sys.modules or _mxnet_importable():
        from . import store  # noqa: F401  (registers the dist_* stores)
        from . import gluon_compat  # noqa: F401  (gluon.Trainer's async rule for our stores)
        if _horovod_importable():
            from . import horovod_store  # noqa: F401  (dist_dcs3gd, dist_ssgd; horovod loads on use)
        if os.environ.get("KVX_ROLE") == "worker" or "HOROVOD_RANK" in os.environ:
            # A worker of a job that crashes in native code shows every thread's Python stack
            # before MXNet's own "Segmentation fault" message (its handler, installed when mxnet
            # was imported, still runs after this one).
            import faulthandler
            faulthandler.enable(all_threads=True)


def _horovod_importable() -> bool:
    import importlib.util
    return importlib.util.find_spec("horovod") is not None


def _mxnet_importable() -> bool:
    import importlib.util
    return importlib.util.find_spec("mxnet") is not None


_register_with_mxnet()
