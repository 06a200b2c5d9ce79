"""Decentralised stores on Horovod (Gloo): ``dist_dcs3gd`` and its baseline ``dist_ssgd``.

No scheduler and no servers: every worker holds the weights and runs MXNet's
optimizer itself (``gluon.Trainer`` takes the update-on-kvstore path: it hands
the optimizer over with ``set_optimizer`` and ``pushpull(key, grad, out=weight)``
returns the new weight).  Workers are started by ``horovodrun --gloo`` or
``scripts/launch.py --launcher horovod``.

``dist_dcs3gd`` (DC-S3GD, Rigazzi 2019) allreduces each weight *update* without
waiting for it: the sum started at step t is only needed at step t+1, after the
next forward and backward pass, so communication hides behind computation.
Every operation, Horovod's allreduce included, goes through MXNet's engine: a
``pushpull`` returns at once, and the "wait" for the previous allreduce is a
dependency inside the engine, never a block of the Python thread.

``dist_ssgd`` allreduces the gradients and applies their *mean* (as Horovod's
``DistributedTrainer`` and the paper's SSGD do), so that both stores take the
same step for the same optimizer settings.  MXNet's ``dist_sync`` sums instead:
multiply the learning rate by the number of workers to compare with it.
"""
from __future__ import annotations

import atexit
import itertools
import logging
import os
import sys
import time
import weakref

import mxnet as mx
import numpy as np
from mxnet.kvstore import KVStoreBase

from .. import jobenv, registry
from ..errors import KVStoreError
from ..engine import SimulatedLink, probe, run as run_in_engine, settled_view
from .params import MKLDNN_ENV
from ..keys import MXNetCalls, as_list as _as_list, check_key as _check_key, pairs as _pairs
from ..keys import grouped_pairs, refuse_second_array, refuse_sparse
from ..metrics import WorkerMetrics, write_json
from .overlap import OverlapMeter
from ..stalls import after_seconds
from .progress import ProgressBoard
from .stall import StallReporter

#: seconds of simulated communication per step (spread over the keys by size); tests, benches
SIM_COMM_ENV = "KVX_SIM_COMM_S"
#: measure the overlap on every n-th step (default 10); 0 turns the probes off
PROBES_ENV = "KVX_HVD_PROBE_EVERY"

_TINY = 1e-20   # λ0·‖g‖ / 1e-20 stays finite for any ‖g‖ below 1e18

log = logging.getLogger("kvstore_ext")
_STORES_MADE = itertools.count()    # the stores this process has made: their collectives' names


def delay_compensated(grad, d, lambda0: float):
    """The corrected gradient g + λ·g⊙g⊙D, with λ = λ0·‖g‖ / ‖g⊙g⊙D‖ (0 if that norm is 0).

    ``g⊙g⊙D`` is the pseudo-Hessian's first-order estimate of how the gradient
    changes between this worker's weights and the average weights (D away).
    The dynamic λ makes the correction λ0 times as long as the gradient, whatever
    the scale of g and D.  A store sees one key at a time, so the norms are per
    key (per layer).  NDArrays in and out; nothing waits in Python.
    """
    h = mx.nd.square(grad) * d
    # 1-D dot products: MXNet's norm is about 30 times slower on CPU
    gg = mx.nd.dot(grad.reshape((-1,)), grad.reshape((-1,)))
    hh = mx.nd.dot(h.reshape((-1,)), h.reshape((-1,)))
    # when ‖h‖ = 0, h is 0 and so is the correction: the clamp only avoids 0/0
    lam = lambda0 * mx.nd.sqrt(gg) / mx.nd.maximum(mx.nd.sqrt(hh), _TINY)
    return grad + mx.nd.broadcast_mul(h, lam.reshape((1,) * h.ndim))


def delay_compensate_host(grad: np.ndarray, d: np.ndarray, lambda0: float) -> np.ndarray:
    """:func:`delay_compensated` in numpy, in place: ``d`` (D in, g̃ out) is returned.

    The CPU path: one engine operation per key instead of a dozen MXNet operations,
    each with its own dispatch; no temporary arrays.
    """
    h = np.multiply(d, grad, out=d)
    np.multiply(h, grad, out=h)
    gf, hf = grad.reshape(-1), h.reshape(-1)
    lam = lambda0 * float(np.dot(gf, gf)) ** 0.5 / max(float(np.dot(hf, hf)) ** 0.5, _TINY)
    np.multiply(h, lam, out=h)
    return np.add(h, grad, out=h)


#: the most dimensions :func:`_declaration` describes exactly (a longer shape is one more
#: number: its element count, so a difference there still shows)
_MAX_DIMS = 8


def _declaration(value) -> np.ndarray:
    """A key's shape and dtype as a fixed-length row of integers, for one allgather."""
    shape = tuple(int(d) for d in value.shape)
    dims = shape if len(shape) <= _MAX_DIMS else (*shape[:_MAX_DIMS - 1], int(np.prod(shape)))
    row = np.full(_MAX_DIMS + 2, -1, np.int64)
    row[0], row[1] = np.dtype(value.dtype).num, len(shape)
    row[2:2 + len(dims)] = dims
    return row


def _describe_declaration(row) -> str:
    """What :func:`_declaration` wrote, in words: ``shape (3, 4) float32``."""
    ndim = int(row[1])
    dims = tuple(int(d) for d in row[2:2 + min(ndim, _MAX_DIMS)])
    shape = f"{ndim} dimensions" if ndim > _MAX_DIMS else f"shape {dims}"
    try:
        dtype = np.dtype(np.sctypeDict[int(row[0])]).name
    except (KeyError, TypeError):
        dtype = f"dtype #{int(row[0])}"
    return f"{shape} {dtype}"


def _hvd():
    import horovod.mxnet as hvd
    if not hvd.is_initialized():
        hvd.init()
    return hvd


class _Key:
    """One parameter: the worker's weights and, for DC-S3GD, the update in flight."""

    __slots__ = ("weight", "avg", "reduced", "pending", "corrected", "host", "grad", "step",
                 "outs", "sim_s", "name", "source")

    def __init__(self, weight, name: str, source: int):
        self.weight = weight   # this worker's weights w_i
        self.source = source   # the handle of the array the key was initialised from
        self.name = name       # its allreduce's name (the same on every worker)
        self.avg = None        # DC-S3GD: the workers' average w̄ as of the last allreduce
        self.reduced = None    # the buffer Horovod reduces in place: Δw_i, then the mean of them
        self.pending = False   # DC-S3GD: ``reduced`` holds a mean not yet added to ``avg``
        self.corrected = None  # DC-S3GD, CPU path: the buffer of D, then of g̃
        self.host = None       # DC-S3GD, CPU path: numpy views of weight, avg, reduced, corrected
        self.grad = None       # DC-S3GD, CPU path: (the gradient array, a numpy view of it)
        self.step = 0
        self.outs = []
        self.sim_s = 0.0


class HorovodStore(MXNetCalls, KVStoreBase):
    """What ``dist_dcs3gd`` and ``dist_ssgd`` share: keys, optimizer, metrics, job checks."""

    store_type = ""
    lag = 0

    def __init__(self, **params):
        config = registry.job_config(self.store_type, params, strict=False)
        stall_after = after_seconds()     # a bad value is an error before any collective
        self._type, self._params = config.type, config.params
        # MKL-DNN arrays cannot be read in place (MXNet reorders them first, and waits)
        self._mkldnn = (os.environ.get(MKLDNN_ENV, "1") != "0"
                        and mx.runtime.Features().is_enabled("MKLDNN"))
        if self._mkldnn:
            log.warning("kvstore_ext %s: MXNet's MKL-DNN kernels are on; their array layouts "
                        "break Horovod's allreduce for convolution layers. Start the workers with "
                        "%s=0 (scripts/launch.py --launcher horovod does)", config.type, MKLDNN_ENV)
        self._metrics_dir = jobenv.metrics_dir()   # a folder it cannot write: an error now
        self._hvd = _hvd()
        # the n-th store of this process names its collectives kvx<n>.*: two Trainers' stores
        # (a GAN's) would otherwise both allreduce "key 0", and Horovod refuses a name that is
        # in flight.  Every worker makes its stores in the same order, so the names agree.
        self._names = f"kvx{next(_STORES_MADE)}"
        self._keys: dict = {}
        self._updater = None
        self._metrics = WorkerMetrics()
        every = int(os.environ.get(PROBES_ENV, "10") or 0)
        self._probes = every > 0
        self._meter = OverlapMeter(self.lag, every or 1)
        self._sim_comm_s = float(os.environ.get(SIM_COMM_ENV, "0") or 0)
        self._link = None
        if self._sim_comm_s > 0:
            self._link = SimulatedLink()
            # the link's thread must get the GIL back soon after each transfer's time is up
            sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
        self._check_agreement()
        # an allreduce that does not end is reported, with every thread's stack (.stall), and
        # the workers it waits for, from their progress on the rendezvous server (.progress)
        self._stall = StallReporter(stall_after, lambda: f"{self._type} worker {self.rank}",
                                    probe, board=ProgressBoard.from_environ(
                                        self.rank, self.num_workers, self._names))
        if self.num_workers > 1:
            self._stall.start()
        # a script's last step leaves its allreduces in flight; Horovod's own exit handler,
        # registered by hvd.init above, would shut Horovod down under them (they fail, or the
        # exit hangs).  Handlers run last-registered first: this one waits for them before.
        atexit.register(_close_at_exit, weakref.ref(self))

    # -- what MXNet asks for ------------------------------------------------------------------
    @property
    def type(self) -> str:
        return self._type

    @property
    def params(self) -> dict:
        return dict(self._params)

    @property
    def rank(self) -> int:
        return self._hvd.rank()

    @property
    def num_workers(self) -> int:
        return self._hvd.size()

    @staticmethod
    def is_capable(capability):
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return True
        raise ValueError(f"Unknown capability: {capability}")

    def describe(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in sorted(self._params.items()))
        return f"{self._type}({inner})"

    def _check_agreement(self) -> None:
        """Every worker must run the same store with the same parameters (names both)."""
        mine = self.describe()
        values = self._allgather_text(mine, f"{self._names}.config")
        for rank, other in enumerate(values):
            if other != mine:
                raise ValueError(f"workers disagree on the kvstore: worker {self.rank} has {mine}, "
                                 f"worker {rank} has {other}")

    def _allgather_text(self, text: str, name: str) -> list[str]:
        data = np.frombuffer(text.encode(), dtype=np.uint8)
        sizes = self._hvd.allgather(mx.nd.array([len(data)], dtype="int32"), name=name + ".n")
        sizes = sizes.asnumpy().tolist()
        joined = self._hvd.allgather(mx.nd.array(data, dtype="uint8"), name=name).asnumpy()
        offsets = np.cumsum([0] + sizes)
        return [joined[offsets[i]:offsets[i + 1]].tobytes().decode() for i in range(len(sizes))]

    # -- keys ---------------------------------------------------------------------------------
    def init(self, key, value):
        """Take worker 0's values for new keys (a broadcast).  Initialising a key again from
        the same array keeps its weights; from another array, or with another shape, it is
        an error."""
        for k, v in _pairs(key, value):
            self._init_key(_check_key(k), _as_list(v)[0])

    def _init_key(self, k, v, adopt=None) -> _Key:
        refuse_sparse(self._type, k, v)
        known = self._keys.get(k)
        if known is not None:
            w = known.weight
            if (tuple(w.shape), w.dtype) != (tuple(v.shape), v.dtype):
                raise KVStoreError(f"key {k!r} is already initialised with shape {tuple(w.shape)} "
                                   f"{np.dtype(w.dtype).name}; cannot initialise it again with shape "
                                   f"{tuple(v.shape)} {np.dtype(v.dtype).name}")
            refuse_second_array(self._type, k, known.source, v)
            return known
        if adopt is not None:
            # the caller's weight array becomes the store's (gluon's parameter): no copy per step
            weight = adopt
            if adopt is not v:
                v.copyto(weight)
        else:
            weight = v.copyto(mx.cpu()) if v.context.device_type != "cpu" else v.copy()
        if self.num_workers > 1:
            self._check_declarations(k, v)
            self._hvd.broadcast_(weight, root_rank=0, name=f"{self._names}.init.{k}")
        st = _Key(weight, f"{self._names}.{self._type}.{k}", v.handle.value)
        if self.lag:
            st.avg = weight.copy()
        self._keys[k] = st
        self._spread_sim_comm()
        return st

    def _check_declarations(self, k, v) -> None:
        """Every worker must declare key ``k`` with one shape and dtype; otherwise each gets an
        error naming the key and both declarations (Horovod's own broadcast would stop with
        "Mismatched BROADCAST tensor shapes", naming neither the key nor the workers)."""
        mine = _declaration(v)
        rows = self._hvd.allgather(mx.nd.array(mine.reshape(1, -1), dtype="int64"),
                                   name=f"{self._names}.init.declared.{k}").asnumpy()
        for rank, row in enumerate(rows):
            if not np.array_equal(row, mine):
                raise KVStoreError(
                    f"key {k!r}: worker {self.rank} initialises it with shape {tuple(v.shape)} "
                    f"{np.dtype(v.dtype).name}, worker {rank} with {_describe_declaration(row)}; "
                    f"every worker must create the same parameters in the same order")

    def _spread_sim_comm(self) -> None:
        """Simulated communication per step, shared among the keys by size (as bytes on a wire)."""
        total = sum(st.weight.size * np.dtype(st.weight.dtype).itemsize for st in self._keys.values())
        for st in self._keys.values():
            size = st.weight.size * np.dtype(st.weight.dtype).itemsize
            st.sim_s = self._sim_comm_s * size / total if total else 0.0

    def broadcast(self, key, value, out, priority=0):
        """Initialise from worker 0 and write the weights into ``out``."""
        for (k, v), (_, o) in zip(_pairs(key, value), _pairs(key, out, "out array")):
            k, v, outs = _check_key(k), _as_list(v)[0], _as_list(o)
            adopt = outs[0] if outs and outs[0].context.device_type == "cpu" else None
            if adopt is not None and (tuple(adopt.shape), adopt.dtype) != (tuple(v.shape), v.dtype):
                raise KVStoreError(f"key {k!r}: out has shape {tuple(adopt.shape)}, but the value "
                                   f"has shape {tuple(v.shape)}")
            self._write_out(k, self._init_key(k, v, adopt), o)

    def _state(self, k) -> _Key:
        st = self._keys.get(k)
        if st is None:
            raise KVStoreError(f"key {k!r} has not been initialised on this kvstore "
                               f"(call kv.init({k!r}, value) or kv.broadcast first)")
        return st

    def _gradient(self, k, st, value):
        """The gradient summed over this worker's devices, checked against the key."""
        arrays = _as_list(value)
        refuse_sparse(self._type, k, arrays, "pushed value")
        w = st.weight
        for a in arrays:
            if tuple(a.shape) != tuple(w.shape):
                raise KVStoreError(f"key {k!r}: pushed shape {tuple(a.shape)}, but the key was "
                                   f"initialised with shape {tuple(w.shape)}")
            if a.dtype != w.dtype:
                raise KVStoreError(f"key {k!r}: pushed dtype {np.dtype(a.dtype).name}, but the key "
                                   f"was initialised as {np.dtype(w.dtype).name}")
        if len(arrays) == 1 and arrays[0].context == w.context:
            return arrays[0]
        total = arrays[0].as_in_context(w.context)
        for a in arrays[1:]:
            total = total + a.as_in_context(w.context)
        return total

    def _write_out(self, k, st, out) -> None:
        outs = _as_list(out) if out is not None else []
        refuse_sparse(self._type, k, outs, "out array")
        self._check_out(k, st, outs)
        for o in outs:
            if o is not st.weight:
                st.weight.copyto(o)
        if outs:
            st.outs = outs

    # -- data plane ---------------------------------------------------------------------------
    def pushpull(self, key, value, out=None, priority=0):
        """Push this step's gradients, get the new weights in ``out`` (in ``value`` when no
        ``out`` is given, as MXNet's stores do); returns at once."""
        if self._updater is None:
            raise KVStoreError(f"{self._type} updates the weights itself: call set_optimizer first "
                               f"(gluon.Trainer does, with update_on_kvstore)")
        outs = grouped_pairs(key, value if out is None else out, "out array")
        for i, (k, v) in enumerate(grouped_pairs(key, value)):
            k = _check_key(k)
            st = self._state(k)
            g = self._gradient(k, st, v)
            refuse_sparse(self._type, k, outs[i][1], "out array")   # checked before it starts
            self._check_out(k, st, _as_list(outs[i][1]))
            step = st.step
            self._metrics.count_pushes([k])
            self._meter.pushed(step)
            if self._probes and self._meter.measures_grad(step):
                probe(lambda s=step: self._meter.grad_ready(s, time.perf_counter()), [g])
            self._step(k, st, g, priority)
            st.step += 1
            self._write_out(k, st, outs[i][1])

    @staticmethod
    def _check_out(k, st, outs) -> None:
        for o in outs:
            if tuple(o.shape) != tuple(st.weight.shape):
                raise KVStoreError(f"key {k!r}: out has shape {tuple(o.shape)}, but the key has "
                                   f"shape {tuple(st.weight.shape)}")

    def push(self, key, value, priority=0):
        self.pushpull(key, value, out=None, priority=priority)

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        if out is None:
            raise ValueError("pull needs out=")
        for k, o in grouped_pairs(key, out, "out array"):
            k = _check_key(k)
            self._write_out(k, self._state(k), o)

    def _allreduce(self, k, st, priority: int):
        """Start the mean over workers of the key's buffer ``st.reduced``, in place.

        It returns at once: Horovod's operation runs in MXNet's engine, and whatever
        reads the buffer waits for it there (through the simulated link first, if
        asked).  One buffer per key also keeps a key's allreduces in order (Horovod
        refuses two in flight under one name).
        """
        r = st.step
        measure = self._probes and self._meter.measures_round(r)
        if measure:
            probe(lambda: self._meter.started(r, time.perf_counter()), [st.reduced])
        if self._link is not None and st.sim_s > 0:
            self._link.hold(st.reduced, st.sim_s)
        if self.num_workers > 1:
            self._hvd.allreduce_(st.reduced, op=self._hvd.Average, name=st.name,
                                 priority=priority)
            self._stall.started(r, k, st.reduced)
            # the array handed to allreduce, and the mean that comes back (what goes over the
            # wire depends on Gloo's algorithm: about twice this for a ring)
            nbytes = st.reduced.size * np.dtype(st.reduced.dtype).itemsize
            self._metrics.bytes_sent += nbytes
            self._metrics.bytes_received += nbytes
        if measure:
            probe(lambda: self._meter.done(r, time.perf_counter()), [st.reduced])

    def _step(self, k, st, g, priority) -> None:
        raise NotImplementedError

    # -- optimizer ----------------------------------------------------------------------------
    def set_optimizer(self, optimizer):
        """Keep MXNet's optimizer: this worker applies it (update on kvstore)."""
        self._updater = mx.optimizer.get_updater(optimizer)

    def save_optimizer_states(self, fname, dump_optimizer=False):
        if self._updater is None:
            raise KVStoreError("no optimizer set: call set_optimizer first")
        with open(fname, "wb") as f:
            f.write(self._updater.get_states(dump_optimizer))

    def load_optimizer_states(self, fname):
        if self._updater is None:
            raise KVStoreError("no optimizer set: call set_optimizer first")
        with open(fname, "rb") as f:
            self._updater.set_states(f.read())

    # -- job ----------------------------------------------------------------------------------
    def barrier(self):
        """Wait until every worker reaches this point."""
        if self.num_workers > 1:
            self._hvd.allreduce(mx.nd.zeros((1,)), name=f"{self._names}.barrier").wait_to_read()

    def stats(self) -> dict:
        """This worker's metrics: iterations, exposed allreduce wait, overlap achieved."""
        mx.nd.waitall()   # every probe has run
        worker = self._metrics.to_dict()
        worker.update(self._meter.to_dict(worker["iterations"]))
        worker["simulated_comm_s_per_step"] = self._sim_comm_s
        return {"type": self.type, "params": self.params, "rank": self.rank,
                "num_workers": self.num_workers, "worker": worker}

    def save_metrics(self, path: str | None = None) -> str | None:
        """Write :meth:`stats` as JSON (default: ``$KVX_METRICS_DIR/worker-<rank>.json``)."""
        data = self.stats()
        if path is None:
            if not self._metrics_dir:
                return None
            return write_json(self._metrics_dir, f"worker-{self.rank}.json", data)
        return write_json(os.path.dirname(os.path.abspath(path)), os.path.basename(path), data)

    def close(self):
        """Wait for this worker's allreduces still in flight (a hung one is reported as while
        training), then stop watching.  A collective that failed is an error naming the key."""
        try:
            for k, st in list(self._keys.items()):
                if st.reduced is not None:
                    try:
                        st.reduced.wait_to_read()
                    except mx.base.MXNetError as exc:
                        raise KVStoreError(f"{self._type} worker {self.rank}: an allreduce of "
                                           f"key {k!r} failed (the last one started at step "
                                           f"{st.step - 1}): "
                                           + self._failure(exc, st.step - 1)) from exc
            try:
                mx.nd.waitall()
            except mx.base.MXNetError as exc:
                step = max((st.step for st in self._keys.values()), default=1) - 1
                raise KVStoreError(f"{self._type} worker {self.rank}: an operation failed: "
                                   + self._failure(exc, step)) from exc
        finally:
            self._stall.stop()

    def _failure(self, exc, step: int) -> str:
        """The first line of MXNet's error, then the workers this one waited for at
        ``step``, as far as their progress on the rendezvous server tells."""
        peers = self._stall.waiting_for(step)
        return str(exc).strip().splitlines()[0] + (f" {peers}" if peers else "")


def _close_at_exit(ref) -> None:
    store = ref()
    if store is None:
        return
    try:
        store.close()
    except KVStoreError as exc:
        # at exit: say it plainly, once, and exit 1, as the parameter-server stores do: the
        # script may never have seen it (an exception in an exit handler leaves the status 0).
        # Exiting here also skips Horovod's own exit handler, which can crash (free(): invalid
        # next size, SIGABRT) shutting down after a failed collective, 1 run in 5 here
        print(f"kvstore_ext {exc}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)


class DCS3GDStore(HorovodStore):
    """DC-S3GD: non-blocking allreduce of weight updates with delay compensation."""

    lag = 1

    def __init__(self, **params):
        super().__init__(**params)
        # which path the key steps took: numpy in one engine operation (CPU arrays without
        # MKL-DNN) or MXNet operations (GPU, MKL-DNN); in stats() as "key_steps_by_path"
        self._key_steps = {"numpy": 0, "mxnet": 0}

    def stats(self) -> dict:
        data = super().stats()
        data["worker"]["key_steps_by_path"] = dict(self._key_steps)
        return data

    @property
    def lambda0(self) -> float:
        return self._params["lambda0"]

    def _step(self, k, st, g, priority) -> None:
        if st.reduced is None:
            st.reduced = mx.nd.zeros(st.weight.shape, st.weight.context, dtype=st.weight.dtype)
        on_host = not self._mkldnn and st.weight.context.device_type == "cpu" \
            and g.context.device_type == "cpu"
        self._key_steps["numpy" if on_host else "mxnet"] += 1
        if on_host:
            g = self._catch_up_on_host(st, g)
        else:
            if st.pending:
                st.avg += st.reduced            # w̄ += Δ/N, the mean of the workers' last updates
                if self.lambda0 > 0:
                    # D = Δ/N − Δw = w̄ − w: from this worker's weights to the workers' average
                    g = delay_compensated(g, st.avg - st.weight, self.lambda0)
            st.avg.copyto(st.weight)
        # w ← w + D + Δw is w̄ + Δw: U (MXNet's optimizer, in place) runs on the average weights.
        # Keeping w̄ itself (the same bits on every worker) stops rounding drift between workers.
        self._updater(k, g, st.weight)
        # Δw = w − w̄ straight into the buffer the last mean was read from
        mx.nd.elemwise_sub(st.weight, st.avg, out=st.reduced)
        st.pending = True
        self._allreduce(k, st, priority)

    def _catch_up_on_host(self, st, g):
        """The step up to U as one engine operation in numpy: w̄ += mean, g̃, w ← w̄.

        Returns the gradient U must use (g̃ in ``st.corrected``, or g itself).
        """
        correct = st.pending and self.lambda0 > 0
        if st.host is None:     # the views are taken once, when the arrays surely have memory
            if self.lambda0 > 0:
                st.corrected = mx.nd.zeros(st.weight.shape, st.weight.context,
                                           dtype=st.weight.dtype)
            st.host = tuple(settled_view(a) if a is not None else None
                            for a in (st.weight, st.avg, st.reduced, st.corrected))
        if st.grad is None or st.grad[0] is not g:
            st.grad = (g, settled_view(g))      # a first gradient may not have its memory yet
        w, avg, mean, gc = st.host
        grad, pending, lambda0 = st.grad[1], st.pending, self.lambda0

        def catch_up():
            if pending:
                np.add(avg, mean, out=avg)
            if correct:
                delay_compensate_host(grad, np.subtract(avg, w, out=gc), lambda0)
            np.copyto(w, avg)

        writes = [st.avg, st.weight] + ([st.corrected] if correct else [])
        run_in_engine(catch_up, [g, st.reduced], writes, b"kvx_dcs3gd_catch_up")
        return st.corrected if correct else g

    def sync_weights(self) -> None:
        """Move to the workers' average weights now (waits for the allreduce in flight).

        Afterwards every worker holds the same weights, bit for bit; training may go
        on from there.  Call it before evaluating or saving the model.
        """
        for st in self._keys.values():
            if not st.pending:
                continue
            st.avg += st.reduced
            st.pending = False
            st.avg.copyto(st.weight)
            for o in st.outs:
                if o is not st.weight:
                    st.weight.copyto(o)
        mx.nd.waitall()


class SSGDStore(HorovodStore):
    """Synchronous SGD: the mean of the gradients, then the optimizer, every step."""

    lag = 0

    def _step(self, k, st, g, priority) -> None:
        if st.reduced is None:
            st.reduced = g.copy()
        else:
            g.copyto(st.reduced)
        self._allreduce(k, st, priority)
        self._updater(k, st.reduced, st.weight)

    def sync_weights(self) -> None:
        """Nothing to do: the workers' weights are always the same."""
        mx.nd.waitall()


def _register(name: str, base: type, doc: str) -> type:
    """A class named after the type, so that ``KVStoreBase.register`` files it under it."""
    cls = type(name, (base,), {"store_type": name, "__doc__": doc,
                               "__module__": __name__})
    return KVStoreBase.register(cls)


DistDCS3GD = _register("dist_dcs3gd", DCS3GDStore,
                       "DC-S3GD on Horovod: overlapped allreduce of updates, delay-compensated.")
DistSSGD = _register("dist_ssgd", SSGDStore,
                     "Synchronous SGD on Horovod: blocking mean of gradients (the baseline).")

