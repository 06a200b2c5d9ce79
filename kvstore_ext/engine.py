"""Finishing a kvstore call inside MXNet's dependency engine, as MXNet's own stores do.

``pushpull`` sends its gradients at once and returns; an operation pushed to
MXNet's engine (:func:`push_async`), which lists the output arrays as written
by it, ends only when the servers' replies have been copied into them.  Anything
that reads those arrays (the next forward pass) waits for it through the
engine's ordinary dependency tracking, while the Python thread goes on: per-key
round trips overlap instead of adding up.  Such an operation holds no engine
thread while it waits: it is told to end (``done()``) by whichever thread writes
its arrays.  The gradients go the other way through :func:`copy_to_host`, one
copy by MXNet straight into the message's memory.

Only the thread that makes the store's calls pushes operations on several arrays.  MXNet's
engine queues an operation on its arrays one array at a time (``ThreadedEngine::Push``), so
two threads that push operations sharing two arrays can queue them in opposite orders on the
two and wait for each other forever (MXNet's architecture notes: "Push APIs are not
thread-safe").  An operation on one array cannot be caught so (the Horovod stores' stall
reporter probes one array from its own thread).  A thread of ours that must not push at
all says so (:func:`never_push_here`); a push from it raises.

The same machinery gives the Horovod stores their probes (:func:`probe`, a
callback once arrays are ready) and :class:`SimulatedLink` (arrays held for a
given time on one serial "wire", as a slow network would, for tests and benchmarks).
"""
from __future__ import annotations

import ctypes
import itertools
import logging
import math
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
_finished: list = []        # jobs that ended; dropped by the next push, never on an engine thread
_ids = itertools.count(1)
_lock = threading.Lock()
#: array handle -> how many operations of ours that write it have not ended yet (an array in
#: here is alive, held by its job, and allocated: its address was taken before the push)
_writing: dict[int, int] = {}


_here = threading.local()


def never_push_here() -> None:
    """The calling thread (a receiving or watching thread of ours) must never push an
    operation: it would race the training loop's pushes on the same arrays (see above)."""
    _here.no_push = threading.current_thread().name


def _check_thread() -> None:
    name = getattr(_here, "no_push", None)
    if name is not None:
        raise RuntimeError(f"kvstore_ext: an engine operation pushed from thread {name!r}: "
                           f"only the thread that calls the store may push (MXNet's engine "
                           f"deadlocks when two threads push operations on the same arrays)")


def _job_fn(param):
    """The function of a job that has not ended (the job itself stays in ``_jobs``)."""
    with _lock:
        job = _jobs.get(param)
        return None if job is None else job[0]


def _release(param) -> None:
    """One holder of a job is done with it: the engine thread that ran its function, or
    (for an asynchronous operation) its completion.  After the last, the job moves to
    ``_finished``, whose arrays :func:`_register` frees on the Python thread that pushes.

    No reference to the job outlives the lock on this thread: a local one kept past it
    could become the last once ``_finished`` is emptied, and the arrays would then be
    freed here, on an engine thread or a completion's thread.
    """
    with _lock:
        job = _jobs.get(param)
        if job is not None:
            job[3] -= 1
            if job[3] == 0:
                del _jobs[param]
                for h in job[2]:
                    left = _writing.get(h, 0) - 1
                    if left > 0:
                        _writing[h] = left
                    else:
                        _writing.pop(h, None)
                _finished.append(job)
        del job


def _run_sync(_rctx, param) -> None:
    fn = _job_fn(param)
    try:
        if fn is not None:
            fn()
    except Exception:   # never let an exception cross into the engine's C++ thread
        log.exception("kvstore_ext: an engine operation failed")
    finally:
        del fn          # before the job is handed back (see _release)
        _release(param)


def _run_async(_rctx, on_complete, param) -> None:
    fn = _job_fn(param)
    struct = _OnComplete.from_address(on_complete)   # it lives on the caller's stack: copied
    done = _Done((struct.callback, struct.engine, struct.param), param)
    try:
        if fn is None:
            done()
        else:
            fn(done)
    except Exception:   # never let an exception cross into the engine's C++ thread
        log.exception("kvstore_ext: an engine operation failed")
        done()
    finally:
        del fn
        _release(param)


class _Done:
    """Ends one asynchronous operation; from any thread, and only the first call counts (the
    engine aborts on a second completion)."""

    __slots__ = ("_handle", "_param", "_once")

    def __init__(self, handle, param):
        self._handle, self._param = handle, param
        self._once = threading.Lock()

    def __call__(self) -> None:
        if self._once.acquire(blocking=False):
            _release(self._param)
            callback, engine, param = self._handle
            _COMPLETE(callback)(engine, param, None)


_RUN_SYNC = _SYNC_FN(_run_sync)
_RUN_ASYNC = _ASYNC_FN(_run_async)


def _handles(arrays):
    if isinstance(arrays, Arrays):
        return arrays.c_handles
    return (ctypes.c_void_p * max(1, len(arrays)))(*[a.handle for a in arrays])


class Arrays:
    """Arrays that operations are pushed for again and again (the weights a training loop's
    list call writes at every step), their handles gathered once: what each push would
    otherwise build anew, 65 handles for ResNet-20.  It holds the arrays."""

    __slots__ = ("arrays", "handles", "c_handles")

    def __init__(self, arrays):
        self.arrays = list(arrays)
        self.handles = [a.handle.value for a in self.arrays]
        self.c_handles = (ctypes.c_void_p * max(1, len(self.arrays)))(*self.handles)

    def __len__(self) -> int:
        return len(self.arrays)

    def __iter__(self):
        return iter(self.arrays)


def _register(fn, arrays, writes=(), holders: int = 1) -> int:
    """Keep ``fn`` and its arrays alive until its operation has ended.

    No deleter is given to the engine: it may call one from its own thread while
    Python shuts down, which aborts the process. Nor are a job's arrays freed on
    an engine thread (freeing an array pushes engine work): jobs that ended are
    dropped here, on the caller's thread.  ``holders``: 1 for an operation that ends
    when its function returns, 2 for one that also waits for its ``done()``.
    """
    _check_thread()       # every push registers first: a refused one leaves nothing behind
    job_id = next(_ids)
    with _lock:
        dropped = _finished[:]
        del _finished[:]
        handles = writes.handles if isinstance(writes, Arrays) else \
            [a.handle.value for a in writes]
        for h in handles:
            _writing[h] = _writing.get(h, 0) + 1
        _jobs[job_id] = [fn, arrays if isinstance(arrays, Arrays) else list(arrays), handles,
                         holders]
    del dropped
    return job_id


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


def push_async(start, mutable, name: bytes = b"kvstore_ext") -> None:
    """An operation that writes ``mutable`` (a list, or :class:`Arrays`) and ends when it is
    told to, not when it returns.

    ``start(done)`` is called on an engine thread once nothing else uses ``mutable``; it
    should return soon.  The operation, and every later reader or writer of ``mutable``,
    goes on once ``done()`` is called (from any thread; see :class:`_Done`).  While it waits
    for that, it holds no engine thread.
    """
    _push_async(_register(start, mutable, mutable, holders=2), [], mutable, name)


def _push_async(job: int, reads, writes, name: bytes) -> None:
    check_call(_LIB.MXEnginePushAsyncND(_RUN_ASYNC, ctypes.c_void_p(job), None, ctypes.byref(_CPU),
                                        _handles(reads), len(reads), _handles(writes), len(writes),
                                        ctypes.byref(_CPU_PRIORITIZED), 0, ctypes.c_char_p(name),
                                        ctypes.c_bool(False)))


def probe(fn, arrays, name: bytes = b"kvx_probe") -> None:
    """Run ``fn()`` in the engine once ``arrays`` are ready; it only reads them."""
    run(fn, arrays, [], name)


def host_view(array, shape=None, dtype=None) -> np.ndarray:
    """A numpy array on a CPU NDArray's memory, for use inside an engine operation that lists it.

    The address is taken now, on the calling thread (see :class:`Destination`).  ``shape``
    and ``dtype``, when the caller knows them, spare asking MXNet.
    """
    shape = tuple(array.shape) if shape is None else shape
    dtype = np.dtype(array.dtype if dtype is None else dtype)
    size = math.prod(shape)
    if size == 0:
        return np.empty(shape, dtype)
    memory = (ctypes.c_char * (size * dtype.itemsize)).from_address(data_address(array))
    return np.frombuffer(memory, dtype=dtype).reshape(shape)


def data_address(array) -> int:
    """Where a CPU NDArray's memory begins, as MXNet says (one C call; an array held in an
    MKL-DNN layout is brought back to the default one first, which waits for the engine)."""
    ptr = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(array.handle, ctypes.byref(ptr)))
    return ptr.value or 0


def wait_to_write(array) -> None:
    """Wait until MXNet's engine has no operation pending on ``array`` (reads included), so
    that numpy may write its memory (:func:`host_view`) outside the engine."""
    check_call(_LIB.MXNDArrayWaitToWrite(array.handle))


_COPYTO = None


class Copy:
    """MXNet's own copy operation (``_copyto``, what ``NDArray.copyto`` pushes) of ``src``
    into each of ``dests``, its C arguments built once: pushing it again is one C call per
    destination, without the operator wrapper's Python.  It holds the arrays it names."""

    __slots__ = ("arrays", "_args")

    def __init__(self, src, dests):
        global _COPYTO
        if _COPYTO is None:
            handle = ctypes.c_void_p()
            check_call(_LIB.NNGetOpHandle(ctypes.c_char_p(b"_copyto"), ctypes.byref(handle)))
            _COPYTO = handle
        self.arrays = (src, *dests)
        inputs = _handles([src])
        count, stypes = ctypes.c_int(1), ctypes.POINTER(ctypes.c_int)()
        self._args = []         # (the call's arguments, what they point to)
        for d in dests:
            outputs = _handles([d])
            pointer = ctypes.cast(outputs, ctypes.POINTER(ctypes.c_void_p))
            self._args.append(((_COPYTO, 1, inputs, ctypes.byref(count), ctypes.byref(pointer),
                                0, None, None, ctypes.byref(stypes)),
                               (inputs, count, stypes, outputs, pointer)))

    def copies_to(self, dests) -> bool:
        """Whether it copies into these very arrays, in this order."""
        if len(dests) == 1:
            return len(self.arrays) == 2 and self.arrays[1] is dests[0]
        return len(self.arrays) == len(dests) + 1 and all(
            a is b for a, b in zip(dests, self.arrays[1:]))

    def __call__(self) -> None:
        invoke = _LIB.MXImperativeInvokeEx
        for args, _ in self._args:
            check_call(invoke(*args))


def copy_to_host(array, dest: np.ndarray, address: int | None = None) -> None:
    """MXNet copies ``array`` into ``dest`` (C-contiguous, as many elements, the same dtype),
    on this thread, once whatever computes ``array`` is done.  ``address``: where ``dest``
    begins, if the caller knows (asking numpy costs about a microsecond a call).

    One C call: the array may live on any device or in an MKL-DNN layout (MXNet converts it
    on the way), and no engine operation is pushed, so the values are those of the array at
    this point of the program, as a push's read of them would be in MXNet's own stores.
    """
    if address is None:
        address = dest.ctypes.data
    check_call(_LIB.MXNDArraySyncCopyToCPU(array.handle, ctypes.c_void_p(address),
                                           ctypes.c_size_t(dest.size)))


class HostCopies:
    """:func:`copy_to_host` of several arrays into one region of host memory, each at a fixed
    offset (a worker's gradients into its staging buffer), the C arguments made once: a
    call is then one C call per array and nothing else.  It holds the arrays."""

    __slots__ = ("arrays", "_args")

    def __init__(self, arrays, offsets):
        self.arrays = list(arrays)
        self._args = [(a.handle, offset, ctypes.c_size_t(a.size))
                      for a, offset in zip(self.arrays, offsets)]

    def __call__(self, address: int) -> None:
        """Copy each array to ``address`` + its offset (C-contiguous, its dtype and size)."""
        copy, void_p = _LIB.MXNDArraySyncCopyToCPU, ctypes.c_void_p
        for handle, offset, count in self._args:
            check_call(copy(handle, void_p(address + offset), count))


def settled_view(array, shape=None, dtype=None) -> np.ndarray:
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
    return host_view(array, shape, dtype)


class Destination:
    """Where an engine operation writes an output array: its memory, located up front
    (:func:`settled_view`; ``shape`` and ``dtype`` if the caller knows them)."""

    __slots__ = ("array", "flat", "address", "_asked", "_answer")

    def __init__(self, array, shape=None, dtype=None):
        self.array = array
        self.flat = settled_view(array, shape, dtype).reshape(-1)
        self.address = self.flat.ctypes.data if self.flat.size else None
        self._answer = ctypes.c_void_p()       # in_place's C arguments, made once
        self._asked = (array.handle, ctypes.byref(self._answer))

    def in_place(self) -> bool:
        """Whether MXNet still says the array's memory is where it was located, so that this
        destination may serve a later call (one C call, where locating anew costs ~5 us: the
        wait, the view).  Asking also brings an array that MXNet has since put in an MKL-DNN
        layout (an inference pass) back to the default layout, as locating it did; an
        array's memory, once it has some, is otherwise never replaced."""
        if self.address is None:
            return False
        check_call(_LIB.MXNDArrayGetData(*self._asked))      # data_address, its arguments kept
        return self._answer.value == self.address

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
    A transfer starts when its array became ready or the one before it ended,
    whichever is later, not when this thread next gets a core and the GIL: that
    wake-up comes late on a busy host, and counted from it the lateness added up
    along a queue of transfers (20 of 10 ms beside a thread holding the GIL: 0.34
    to 0.38 s, 0.21 s now) where a real wire sends them back to back.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="kvx-simulated-link", daemon=True)
        self._thread.start()

    def hold(self, array, seconds: float) -> None:
        job = _register(lambda done: self._queue.put((time.perf_counter(), seconds, done)),
                        [array], holders=2)
        _push_async(job, [], [array], b"kvx_simulated_link")

    def _serve(self) -> None:
        never_push_here()
        free_at = 0.0
        while True:
            ready_at, seconds, done = self._queue.get()
            free_at = max(ready_at, free_at) + seconds
            delay = free_at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            done()
