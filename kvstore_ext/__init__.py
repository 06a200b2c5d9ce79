"""kvstore_ext: synchronisation models for MXNet Gluon beyond dist_sync and dist_async.

``import kvstore_ext`` registers the stores with MXNet, so that
``gluon.Trainer(params, 'sgd', ..., kvstore='dist_ssp')`` just works inside a
job started by ``scripts/launch.py``.  ``kvstore_ext.create(name, **params)``
gives a store with explicit parameters (for example ``staleness=2``).
"""
from __future__ import annotations

from .client import KVStoreError, WorkerLostError
from .config import STORE_TYPES, StoreConfig
from .policies import make_policy

__version__ = "0.1.0"

__all__ = ["create", "KVStoreError", "WorkerLostError", "STORE_TYPES", "StoreConfig",
           "make_policy", "DistBSP", "DistASP", "DistSSP"]


def create(name: str, **params):
    """Create a kvstore by name with parameters, e.g. ``create('dist_ssp', staleness=2)``.

    The result is an ``mxnet.kvstore.KVStoreBase`` that ``gluon.Trainer`` accepts as ``kvstore=``.
    """
    from .store import STORE_CLASSES
    config = StoreConfig.build(name, params)   # names the bad type or parameter
    return STORE_CLASSES[config.type](**config.params)


def __getattr__(name):
    # The store classes need mxnet; the scheduler and the policies do not.
    if name in ("DistBSP", "DistASP", "DistSSP", "ParameterServerStore"):
        from . import store
        return getattr(store, name)
    raise AttributeError(name)


def _register_with_mxnet() -> None:
    import os
    import sys
    if os.environ.get("KVX_ROLE") in ("server", "scheduler"):
        return   # those processes choose MXNet's engine before they import it
    if "mxnet" in sys.modules or _mxnet_importable():
        from . import store  # noqa: F401  (registers dist_bsp, dist_asp, dist_ssp)


def _mxnet_importable() -> bool:
    import importlib.util
    return importlib.util.find_spec("mxnet") is not None


_register_with_mxnet()
