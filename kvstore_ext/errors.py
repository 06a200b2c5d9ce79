"""The exceptions a worker sees: one class per cause.

They derive from MXNet's ``MXNetError`` (as MXNet's own stores raise it), except
in a server, scheduler or launcher process (``jobenv.WITHOUT_MXNET``): those do not
import mxnet with the package, and never raise these to a user.
"""
from __future__ import annotations

import os

from .jobenv import ROLE, WITHOUT_MXNET


def _base() -> type:
    if os.environ.get(ROLE) in WITHOUT_MXNET:
        return RuntimeError
    try:
        from mxnet.base import MXNetError
    except ImportError:
        return RuntimeError
    return MXNetError


class KVStoreError(_base()):
    """An error reported by the kvstore (a server, the scheduler, or the worker's own checks)."""


class NodeLostError(KVStoreError):
    """A node of the job is gone, and the job stops (the subclass says which kind)."""


class WorkerLostError(NodeLostError):
    """A worker of the job died (and ``--on-worker-death fail`` stops the job)."""


class ServerLostError(NodeLostError):
    """A server of the job died or cannot be reached."""


class SchedulerLostError(NodeLostError):
    """The job's scheduler died or cannot be reached."""


class JobAbortedError(KVStoreError):
    """The scheduler stopped the job (the message says why)."""


class StalledError(KVStoreError):
    """A reply this worker waited for did not come within ``KVX_STALL_SHUTDOWN_S`` seconds
    (as Horovod's ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``): the call raises rather than wait
    for ever (the message names the request and the workers the scheduler heard nothing from)."""
