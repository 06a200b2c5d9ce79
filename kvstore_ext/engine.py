"""Finishing a kvstore call inside MXNet's dependency engine, as MXNet's own stores do.

``pushpull`` sends its gradients at once and returns; an operation pushed to
MXNet's engine, which lists the output arrays as written by it, waits for the
servers' replies on one of the engine's prioritised CPU threads and copies the
weights in.  Anything that reads those arrays (the next forward pass) waits
for it through the engine's ordinary dependency tracking, while the Python
thread goes on: per-key round trips overlap instead of adding up.

The same machinery gives the Horovod stores their probes (:func:`probe`, a
callback once arrays are ready) and :class:`SimulatedLink` (arrays held for a
given time on one serial "wire", as a slow network would, for tests and benchmarks).
"""
from __future__ import annotations

import ctypes
import itertools
import logging
import queue
import threading
import time

import numpy as np
from mxnet.base import _LIB, check_call

log = logging.getLogger("kvstore_ext.engine")


class _Context(ctypes.Structure):
    """mxnet::Context: the device type (1 = CPU) and id."""

    _fields_ = [("dev_type", ctypes.c_int), ("dev_id", ctypes.c_int)]


class _OnComplete(ctypes.Structure):
    """mxnet::engine::CallbackOnComplete (include/mxnet/engine.h): three pointers."""

    _fields_ = [("callback", ctypes.c_void_p), ("engine", ctypes.c_void_p),
                ("param", ctypes.c_void_p)]


_SYNC_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
_ASYNC_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_COMPLETE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_CPU = _Context(1, 0)
_CPU_PRIORITIZED = ctypes.c_int(3)          # mxnet::FnProperty::kCPUPrioritized
_jobs: dict[int, tuple] = {}
_finished: list = []        # jobs that ran; dropped by the next push, never on an engine thread
_ids = itertools.count(1)
_lock = threading.Lock()
#: array handle -> how many operations of ours that write it have not run yet (an array in
#: here is alive, held by its job, and allocated: its address was taken before the push)
_writing: dict[int, int] = {}


def _take(param):
    """The job of ``param``; its arrays are released later on the Python thread that pushes."""
    with _lock:
        job = _jobs.pop(param, None)
        if job is not None:
            _finished.append(job)
    return job


def _run_sync(_rctx, param) -> None:
    job = _take(param)
    if job is None:
        return
    try:
        job[0]()
    except Exception:   # never let an exception cross into the engine's C++ thread
        log.exception("kvstore_ext: an engine operation failed")
    finally:
        _done_writing(job[2])


def _done_writing(handles) -> None:
    with _lock:
        for h in handles:
            left = _writing.get(h, 0) - 1
            if left > 0:
                _writing[h] = left
            else:
                _writing.pop(h, None)


def _run_async(_rctx, on_complete, param) -> None:
    job = _take(param)
    done = _OnComplete.from_address(on_complete)
    handle = (done.callback, done.engine, done.param)   # the struct lives on the caller's stack
    if job is None:
        _complete(handle)
        return
    job[0](handle)


def _complete(handle) -> None:
    """Tell the engine an asynchronous operation has finished (from any thread)."""
    callback, engine, param = handle
    _COMPLETE(callback)(engine, param, None)


_RUN_SYNC = _SYNC_FN(_run_sync)
_RUN_ASYNC = _ASYNC_FN(_run_async)


def _handles(arrays):
    return (ctypes.c_void_p * max(1, len(arrays)))(*[a.handle for a in arrays])


def _register(fn, arrays, writes=()) -> int:
    """Keep ``fn`` and its arrays alive until the engine has run it.

    No deleter is given to the engine: it may call one from its own thread while
    Python shuts down, which aborts the process. Nor are a job's arrays freed on
    an engine thread (freeing an array pushes engine work): jobs that ran are
    dropped here, on the caller's thread.
    """
    job_id = next(_ids)
    with _lock:
        dropped = _finished[:]
        del _finished[:]
        handles = [a.handle.value for a in writes]
        for h in handles:
            _writing[h] = _writing.get(h, 0) + 1
        _jobs[job_id] = (fn, list(arrays), handles)
    del dropped
    return job_id


def on_cpu(arrays) -> bool:
    return all(a.context.device_type == "cpu" for a in arrays)


def run(fn, reads, writes, name: bytes = b"kvstore_ext") -> None:
    """Run ``fn()`` in the engine once ``reads`` are ready and nothing else uses ``writes``.

    Later readers and writers of ``writes`` wait for it; an array may not be in both lists.
    """
    job = _register(fn, [*reads, *writes], writes)
    check_call(_LIB.MXEnginePushSyncND(_RUN_SYNC, ctypes.c_void_p(job), None, ctypes.byref(_CPU),
                                       _handles(reads), len(reads), _handles(writes), len(writes),
                                       ctypes.byref(_CPU_PRIORITIZED), 0, ctypes.c_char_p(name)))


def push(fn, mutable, name: bytes = b"kvstore_ext") -> None:
    """Run ``fn()`` in the engine once nothing else uses ``mutable``; readers of them wait for it."""
    run(fn, [], mutable, name)


def probe(fn, arrays, name: bytes = b"kvx_probe") -> None:
    """Run ``fn()`` in the engine once ``arrays`` are ready; it only reads them."""
    run(fn, arrays, [], name)


def host_view(array) -> np.ndarray:
    """A numpy array on a CPU NDArray's memory, for use inside an engine operation that lists it.

    The address is taken now, on the calling thread (see :class:`Destination`).
    """
    dtype = np.dtype(array.dtype)
    if array.size == 0:
        return np.empty(array.shape, dtype)
    ptr = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(array.handle, ctypes.byref(ptr)))
    memory = (ctypes.c_char * (array.size * dtype.itemsize)).from_address(ptr.value)
    return np.frombuffer(memory, dtype=dtype).reshape(array.shape)


def settled_view(array) -> np.ndarray:
    """:func:`host_view` taken only once the array surely has its memory.

    The address is taken on the calling thread, before any operation that uses it
    is pushed: asking for it inside the operation would make MXNet convert an array
    held in an MKL-DNN layout back to the default one, which waits for the engine,
    and so for the very operation asking (a deadlock).

    It waits for the array's pending writes first (unless one of them is an
    operation of ours, which took the address before): a fresh array
    (``mx.nd.zeros``, a first gradient) gets its memory only when the operation
    that fills it runs, on an engine thread, and MXNet does not lock that
    allocation.  Asking for the address at the same moment can allocate a second
    buffer: values written there are lost, and a view of a buffer being replaced
    can point at freed memory (a segmentation fault).
    """
    with _lock:
        ours = array.handle.value in _writing   # then allocated already: no need to wait
    if not ours:
        array.wait_to_read()
    return host_view(array)


class Destination:
    """Where an engine operation writes an output array: its memory, located up front
    (:func:`settled_view`)."""

    __slots__ = ("array", "flat")

    def __init__(self, array):
        self.array = array
        self.flat = settled_view(array).reshape(-1)

    def write(self, parts) -> None:
        """Copy in ``(start, stop, values)`` parts of the flattened array (the whole array, or
        the blocks that arrived); only inside an engine operation that lists it as written."""
        for start, stop, value in parts:
            src = np.asarray(value).reshape(-1)
            if src.size != stop - start or not 0 <= start <= stop <= self.flat.size:
                raise ValueError(f"{src.size} values for elements [{start}, {stop}) of an array "
                                 f"of {self.flat.size}")
            self.flat[start:stop] = src


class SimulatedLink:
    """One serial wire: each array waits its time in the order it became ready.

    ``hold(array, seconds)`` makes every later reader or writer of ``array`` wait
    until the array has been ready and the wire free for ``seconds``; as with a
    real network, transfers queue behind each other rather than run in parallel.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="kvx-simulated-link", daemon=True)
        self._thread.start()

    def hold(self, array, seconds: float) -> None:
        job = _register(lambda handle: self._queue.put((seconds, handle)), [array])
        handles = _handles([array])
        check_call(_LIB.MXEnginePushAsyncND(_RUN_ASYNC, ctypes.c_void_p(job), None,
                                            ctypes.byref(_CPU), None, 0, handles, 1,
                                            ctypes.byref(_CPU_PRIORITIZED), 0,
                                            ctypes.c_char_p(b"kvx_simulated_link"),
                                            ctypes.c_bool(False)))

    def _serve(self) -> None:
        free_at = 0.0
        while True:
            seconds, handle = self._queue.get()
            start = max(time.perf_counter(), free_at)
            free_at = start + seconds
            delay = free_at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            _complete(handle)
