"""Finishing a kvstore call inside MXNet's dependency engine, as MXNet's own stores do.

``pushpull`` sends its gradients at once and returns; an operation pushed to
MXNet's engine, which lists the output arrays as written by it, waits for the
servers' replies on one of the engine's prioritised CPU threads and copies the
weights in.  Anything that reads those arrays (the next forward pass) waits
for it through the engine's ordinary dependency tracking, while the Python
thread goes on: per-key round trips overlap instead of adding up.
"""
from __future__ import annotations

import ctypes
import itertools
import logging
import threading

import numpy as np
from mxnet.base import _LIB, check_call

log = logging.getLogger("kvstore_ext.engine")


class _Context(ctypes.Structure):
    """mxnet::Context: the device type (1 = CPU) and id."""

    _fields_ = [("dev_type", ctypes.c_int), ("dev_id", ctypes.c_int)]


_SYNC_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_CPU = _Context(1, 0)
_CPU_PRIORITIZED = ctypes.c_int(3)          # mxnet::FnProperty::kCPUPrioritized
_jobs: dict[int, tuple] = {}
_ids = itertools.count(1)
_lock = threading.Lock()


def _run(_run_ctx, param) -> None:
    job = _jobs.get(param)
    if job is None:
        return
    fn = job[0]
    try:
        fn()
    except Exception:   # never let an exception cross into the engine's C++ thread
        log.exception("kvstore_ext: an engine operation failed")


def _delete(param) -> None:
    with _lock:
        _jobs.pop(param, None)


_RUN = _SYNC_FN(_run)
_DELETE = _DELETER(_delete)


def on_cpu(arrays) -> bool:
    return all(a.context.device_type == "cpu" for a in arrays)


def push(fn, mutable, name: bytes = b"kvstore_ext") -> None:
    """Run ``fn()`` in the engine once nothing else uses ``mutable``; readers of them wait for it.

    The arrays are kept alive until the engine is done with the operation.
    """
    job_id = next(_ids)
    with _lock:
        _jobs[job_id] = (fn, list(mutable))
    handles = (ctypes.c_void_p * len(mutable))(*[a.handle for a in mutable])
    check_call(_LIB.MXEnginePushSyncND(_RUN, ctypes.c_void_p(job_id), _DELETE, ctypes.byref(_CPU),
                                       None, 0, handles, len(mutable),
                                       ctypes.byref(_CPU_PRIORITIZED), 0, ctypes.c_char_p(name)))


def write(array, value: np.ndarray) -> None:
    """Copy ``value`` into a CPU NDArray's memory; only inside an engine op that writes ``array``."""
    ptr = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(array.handle, ctypes.byref(ptr)))
    src = np.ascontiguousarray(value, dtype=array.dtype)
    if src.size != array.size:
        raise ValueError(f"{src.size} values for an array of {array.size}")
    ctypes.memmove(ptr, src.ctypes.data, src.nbytes)
