"""Delay-aware optimizers that asynchronous parameter servers run per push.

On ``dist_asp``, ``dist_ssp`` and ``dist_dssp`` the server applies every push on its own,
and it knows who pushed and the push's delay τ: the updates applied to the key between that
worker's last pull and this push (the staleness in the metrics).  The optimizers here use
them, as the Adaptable Asynchrony dissertation (Owl's parameter server) does:

- ``adadelay``: AdaDelay (Sra et al., 2015), AdaGrad whose accumulator weighs a gradient
  by t/(t+τ) and whose step is scaled back by the same factor; τ = 0 is AdaGrad exactly.
- ``adaptiverevision``: AdaptiveRevision (McMahan and Streeter, 2014): a step, then a
  revision of the steps taken meanwhile with the learning rate they were given.
- ``dcasgda``: DC-ASGD-a (Zheng et al., 2017), SGD with a delay compensation that needs the
  weights each worker last pulled.  MXNet's own ``dcasgd`` keeps one previous weight per key,
  overwritten at every update, so it compensates even at τ = 0 and with the wrong weights
  at τ > 1; it stays available under its own name.
- ``adagradmomentum``: AdaGrad with momentum, the dissertation's "m-" baseline (an ordinary
  optimizer: it needs no delay and runs on any store).

AsyncAdagrad needs nothing new: MXNet's ``adagrad`` on ``dist_asp`` is applied per push.

Registered with MXNet by ``import kvstore_ext``, so ``gluon.Trainer(params, 'adadelay', ...,
kvstore='dist_asp')`` works.  The server calls :meth:`DelayAwareOptimizer.update_delayed` for
each push and :meth:`~DelayAwareOptimizer.pulled` when it sends a worker the weights.  A
summing store (``dist_bsp``, ``dist_psp``) has no single τ per update: these optimizers are
refused there.  Outside a server (a local updater, one process) ``update`` takes τ = 0.

:class:`ServerOptimizer` is what the servers and the virtual-time trainer apply updates
through: any of these, MXNet's own optimizers, and MXNet's SGD fused over many keys per kernel
call, on a server's blocks held back to back in :class:`FlatArrays`.
"""
from __future__ import annotations

import pickle
import weakref
from collections import Counter
from itertools import accumulate, chain, groupby
from operator import itemgetter
from typing import NamedTuple

import mxnet as mx
import numpy as np
from mxnet import nd
from mxnet.optimizer import Optimizer

from .engine import host_view, wait_to_write
from .kernels import sgd_step


class PushState:
    """What a delay-aware optimizer keeps for one key: arrays of the key's shape, and one
    snapshot per worker (of the weights, or of the sum of gradients) taken at its pull."""

    def __init__(self, arrays: dict, initial=None):
        self.arrays = arrays                 # name -> NDArray
        self.initial = initial               # the snapshot of a worker that never pulled
        self.snapshots: dict[int, nd.NDArray] = {}

    def snapshot(self, worker: int):
        return self.snapshots.get(worker, self.initial)

    @classmethod
    def join(cls, blocks: list["PushState"], merge) -> "PushState":
        """One key's state from the states of its blocks (``merge`` joins NDArrays), for
        ``save_optimizer_states`` of a key split across servers."""
        first = blocks[0]
        joined = cls({name: merge([b.arrays[name] for b in blocks]) for name in first.arrays},
                     None if first.initial is None else merge([b.initial for b in blocks]))
        for worker in set.intersection(*(set(b.snapshots) for b in blocks)):
            joined.snapshots[worker] = merge([b.snapshots[worker] for b in blocks])
        return joined

    def cut(self, cut) -> "PushState":
        """The state of one block (``cut`` slices an NDArray), for ``load_optimizer_states``."""
        part = type(self)({name: cut(a) for name, a in self.arrays.items()},
                          None if self.initial is None else cut(self.initial))
        part.snapshots = {w: cut(a) for w, a in self.snapshots.items()}
        return part

    def per_worker_bytes(self) -> int:
        return sum(a.size * np.dtype(a.dtype).itemsize for a in self.snapshots.values())


class DelayAwareOptimizer(Optimizer):
    """An optimizer told, for each push, who pushed and the push's delay τ."""

    #: the servers hand each push to :meth:`update_delayed` on its own, never a sum of pushes
    needs_delay = True

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.delays: Counter = Counter()    # τ -> pushes given that τ (checked against metrics)

    # -- what the server calls ------------------------------------------------------------
    def update(self, index, weight, grad, state):
        """One update without a push behind it (a local updater): τ = 0."""
        self.update_delayed(index, weight, grad, state, worker=0, delay=0)

    def update_delayed(self, index, weight, grad, state, worker: int, delay: int) -> None:
        """Apply one worker's push of ``grad`` to ``weight``, ``delay`` updates stale."""
        if delay < 0:
            raise ValueError(f"key {index!r}: a push cannot be {delay} updates stale")
        self._update_count(index)
        t = self._index_update_count[index]
        g = grad * self.rescale_grad
        if self.clip_gradient is not None:
            g = nd.clip(g, -self.clip_gradient, self.clip_gradient)
        self.delays[delay] += 1
        self.step(weight, g, state, self._get_lr(index), self._get_wd(index), t, delay, worker)

    def pulled(self, index, weight, state, worker: int) -> None:
        """``worker`` has been sent the key's current weights."""

    def forget(self, state, worker: int) -> None:
        """``worker`` left the job: its snapshot goes."""
        if isinstance(state, PushState):
            state.snapshots.pop(worker, None)

    def step(self, weight, g, state, lr, wd, t, delay, worker) -> None:
        raise NotImplementedError


@mx.optimizer.register
class AdaDelay(DelayAwareOptimizer):
    """AdaDelay: ``z += t/(t+τ)·g²;  w -= lr·(g/√(z·(t+τ)/t + eps) + wd·w)``.

    ``t`` is the key's update count including this one.  With τ = 0 it is MXNet's AdaGrad
    (the same ``eps`` inside the square root, the same weight decay).
    """

    def __init__(self, eps=1e-7, **kwargs):
        super().__init__(**kwargs)
        self.float_stable_eps = eps

    def create_state(self, index, weight):
        return nd.zeros(weight.shape, weight.context, dtype=weight.dtype)   # z

    def step(self, weight, g, z, lr, wd, t, delay, worker):
        z[:] += (t / (t + delay)) * nd.square(g)
        weight[:] += (g / nd.sqrt(z * ((t + delay) / t) + self.float_stable_eps)
                      + wd * weight) * -lr


@mx.optimizer.register
class AdaptiveRevision(DelayAwareOptimizer):
    """AdaptiveRevision, per coordinate, with the worker's ḡ_old kept on the server::

        g_bck = ḡ − ḡ_old(worker);  lr_old = lr/(√z′ + eps)
        z += g² + 2·g·g_bck;  z′ = max(z, z′);  lr_new = lr/(√z′ + eps)
        w += −lr_new·g + (lr_old − lr_new)·g_bck − lr·wd·w;  ḡ += g

    ḡ starts at 0, z and z′ at 1; ḡ_old is ḡ when the worker was last sent the weights.
    With no delay (g_bck = 0) it is AdaGrad with an accumulator that starts at 1.
    """

    def __init__(self, eps=1e-7, **kwargs):
        super().__init__(**kwargs)
        self.float_stable_eps = eps

    def create_state(self, index, weight):
        zeros = nd.zeros(weight.shape, weight.context, dtype=weight.dtype)
        return PushState({"gbar": zeros, "z": nd.ones_like(weight), "zp": nd.ones_like(weight)},
                         initial=zeros.copy())

    def pulled(self, index, weight, state, worker):
        state.snapshots[worker] = state.arrays["gbar"].copy()

    def step(self, weight, g, state, lr, wd, t, delay, worker):
        a = state.arrays
        back = a["gbar"] - state.snapshot(worker)
        lr_old = lr / (nd.sqrt(a["zp"]) + self.float_stable_eps)
        a["z"][:] += nd.square(g) + 2 * g * back
        a["zp"][:] = nd.maximum(a["z"], a["zp"])
        lr_new = lr / (nd.sqrt(a["zp"]) + self.float_stable_eps)
        weight[:] += -lr_new * g + (lr_old - lr_new) * back - lr * wd * weight
        a["gbar"][:] += g


@mx.optimizer.register
class DCASGDA(DelayAwareOptimizer):
    """DC-ASGD-a with the weights each worker last pulled (registered as ``dcasgda``)::

        z = m·z + (1−m)·g²;  w -= lr·(g + λ/(√z + eps)·g⊙g⊙(w − w_pulled(worker)) + wd·w)

    At τ = 0, ``w`` is what the worker pulled and this is SGD.  ``lamda`` and ``m`` default to
    the paper's 2 and 0.95; z starts at 0.
    """

    def __init__(self, lamda=2.0, m=0.95, eps=1e-7, **kwargs):
        super().__init__(**kwargs)
        self.lamda, self.m, self.float_stable_eps = lamda, m, eps

    def create_state(self, index, weight):
        return PushState({"z": nd.zeros(weight.shape, weight.context, dtype=weight.dtype)},
                         initial=weight.copy())

    def pulled(self, index, weight, state, worker):
        state.snapshots[worker] = weight.copy()

    def step(self, weight, g, state, lr, wd, t, delay, worker):
        z = state.arrays["z"]
        z[:] = self.m * z + (1 - self.m) * nd.square(g)
        compensation = (self.lamda / (nd.sqrt(z) + self.float_stable_eps)) * g * g \
            * (weight - state.snapshot(worker))
        weight[:] += (g + compensation + wd * weight) * -lr


@mx.optimizer.register
class AdaGradMomentum(Optimizer):
    """AdaGrad with momentum, the "m-" baseline::

        h += g²;  mom = momentum·mom − lr·(g/√(h + eps) + wd·w);  w += mom
    """

    def __init__(self, momentum=0.9, eps=1e-7, **kwargs):
        super().__init__(**kwargs)
        self.momentum, self.float_stable_eps = momentum, eps

    def create_state(self, index, weight):
        return (nd.zeros(weight.shape, weight.context, dtype=weight.dtype),
                nd.zeros(weight.shape, weight.context, dtype=weight.dtype))

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        history, mom = state
        g = grad * self.rescale_grad
        if self.clip_gradient is not None:
            g = nd.clip(g, -self.clip_gradient, self.clip_gradient)
        history[:] += nd.square(g)
        mom[:] = self.momentum * mom - lr * (g / nd.sqrt(history + self.float_stable_eps)
                                             + wd * weight)
        weight[:] += mom


def needs_delay(optimizer) -> bool:
    """True for an optimizer that must be applied push by push with its delay."""
    return bool(getattr(optimizer, "needs_delay", False))


def delay_refusal(optimizer, store_type: str, asynchronous: bool) -> str | None:
    """Why ``optimizer`` cannot run on ``store_type``, or None."""
    if not needs_delay(optimizer) or asynchronous:
        return None
    name = type(optimizer).__name__.lower()
    if "async" in store_type:   # MXNet's own: its servers know no delay
        why = (f"MXNet's {store_type} servers apply each push without its delay, which would "
               f"make it AdaGrad or SGD")
    else:
        why = (f"{store_type} sums the workers' gradients before each update, so an update has "
               f"no single delay")
    return (f"optimizer {name!r} needs the delay of each push, but {why}; use it with dist_asp, "
            f"dist_ssp or dist_dssp (or use 'adagrad' here)")


def home_dtype(dtype) -> np.dtype:
    """The dtype a server holds and updates keys of ``dtype`` in: float16 in float32, as
    MXNet 1.9.1's servers do on every store whatever ``multi_precision`` says (its
    ``store_realt_``; docs/mxnet_tests.md), so that a round's float16 gradients sum without
    overflow and small updates are not rounded away.  Replies round back to ``dtype``.  The
    real servers and the virtual-time ones both hold their blocks so."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype == np.float16 else dtype


class FlatArrays:
    """Blocks of one dtype held back to back: one flat NDArray per role (``"weight"``,
    ``"grad"``, an optimizer's ``"momentum"``), every block a view at its offset.  Adjacent
    blocks are then one slice: one optimizer kernel, one copy for a reply, one addition for
    a gather.

    The capacity doubles as blocks are added, so adding blocks one by one copies each element
    O(1) times.  When the arrays move, :attr:`generation` rises: their contents move with them,
    offsets stay, and views taken before must be taken again.
    """

    MIN_CAPACITY = 1 << 12

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)
        self.used = 0
        self.capacity = 0
        self.generation = 0
        self._arrays: dict[str, nd.NDArray] = {}
        self._views: dict[tuple, nd.NDArray] = {}
        self._numpy: dict[str, np.ndarray] = {}

    def add(self, size: int) -> int:
        """Room for a block of ``size`` elements after the others; returns its offset."""
        offset = self.used
        if offset + size > self.capacity:
            self._move(max(2 * self.capacity, offset + size, self.MIN_CAPACITY))
        self.used += size
        return offset

    def array(self, role: str) -> nd.NDArray:
        """The flat NDArray of ``role`` (zeros when first asked for)."""
        array = self._arrays.get(role)
        if array is None:
            array = self._arrays[role] = self._zeros(self.capacity)
        return array

    def view(self, role: str, start: int, stop: int) -> nd.NDArray:
        """Elements ``start:stop`` of ``role``, an NDArray that shares its memory."""
        key = (role, start, stop)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = self.array(role)[start:stop]
        return view

    def numpy(self, role: str) -> np.ndarray:
        """All of ``role`` as a numpy view of its memory."""
        array = self._numpy.get(role)
        if array is None:
            array = self._numpy[role] = host_view(self.array(role))
        return array

    def _zeros(self, size: int) -> nd.NDArray:
        array = nd.zeros(size, dtype=self.dtype)
        array.wait_to_read()   # filled before numpy views write into it, outside MXNet's engine
        return array

    def _move(self, capacity: int) -> None:
        for role, old in self._arrays.items():
            new = self._zeros(capacity)
            if self.used:
                old[:self.used].copyto(new[:self.used])
                new.wait_to_read()
            self._arrays[role] = new
        self.capacity = capacity
        self.generation += 1
        self._views.clear()
        self._numpy.clear()


class Run:
    """Blocks that lie back to back in one :class:`FlatArrays`, in storage order: their keys
    and where each begins and ends (``bounds[i]:bounds[i + 1]``)."""

    __slots__ = ("home", "keys", "bounds", "__weakref__")

    def __init__(self, home: FlatArrays, keys, bounds):
        self.home, self.keys, self.bounds = home, tuple(keys), tuple(bounds)


class Piece(NamedTuple):
    """Elements that one array of a multi-tensor kernel updates with one rate and decay."""

    weight: nd.NDArray
    grad: nd.NDArray
    momentum: nd.NDArray | None
    lr: float
    wd: float
    size: int
    dtype: np.dtype


def block_views(runs) -> tuple[list, list, list]:
    """The keys of ``runs``' blocks, and views of their gradients and weights, block by
    block (for an optimizer that updates key by key)."""
    keys, grads, weights = [], [], []
    for run in runs:
        for key, start, stop in zip(run.keys, run.bounds, run.bounds[1:]):
            keys.append(key)
            grads.append(run.home.view("grad", start, stop))
            weights.append(run.home.view("weight", start, stop))
    return keys, grads, weights


def kernel_calls(pieces, limit: int, spare: int):
    """``pieces`` grouped into calls of MXNet's multi-tensor kernels: one dtype a call, at most
    ``limit`` arrays, and lengths alike.  The kernel visits every array at every index up to
    the longest length, so an array batched with a longer one costs that difference in
    visits; it joins the call only when the difference is at most ``spare`` (about what a
    call of its own would cost)."""
    call: list = []
    for piece in sorted(pieces, key=lambda p: (p.dtype.str, -p.size)):
        if call and (piece.dtype != call[0].dtype or len(call) == limit or
                     call[0].size - piece.size > spare):
            yield call
            call = []
        call.append(piece)
    if call:
        yield call


def equal_rate_spans(lrs, wds, first: int, last: int):
    """The maximal spans ``(a, b)`` of ``first:last`` whose keys share learning rate and
    weight decay."""
    a = first
    for i in range(first + 1, last):
        if lrs[i] != lrs[a] or wds[i] != wds[a]:
            yield a, i
            a = i
    yield a, last


class ServerOptimizer:
    """What a server runs on the gradients it gathered: MXNet's optimizer (the one the workers
    set), applied to a round's keys in one go, or push by push with the delay for a delay-aware
    optimizer.  The servers and the virtual-time trainer (:mod:`kvstore_ext.virtual_training`)
    both apply updates through this one object.

    MXNet's SGD, the optimizer of nearly every job, is run here on MXNet's own kernels, the
    multi-tensor ones (``multi_sgd_update``, ``multi_sgd_mom_update``), and on a longer array
    the same float operations compiled into one loop (:func:`~kvstore_ext.kernels.sgd_step`),
    with the update counts, learning rates (scheduler and ``lr_mult`` included) and weight
    decays MXNet's optimizer gives key by key: the same bits, in fewer calls.  Blocks held in
    :class:`FlatArrays` (a server's) are updated a run at a time: one kernel array for all
    the adjacent keys that share their rates, their momentum kept in the same flat storage.
    Other optimizers go through MXNet's Updater.
    """

    #: keys per call of MXNet's Updater (other optimizers): more than its default, fewer calls
    AGGREGATE_KEYS = 32
    #: arrays one call of MXNet's multi-tensor SGD kernels takes at most
    KERNEL_ARRAYS = 60
    #: visits beyond its arrays' elements that one kernel call may waste (:func:`kernel_calls`)
    SPARE_VISITS = 1 << 15
    #: an array this long or longer is updated alone: by the compiled :func:`sgd_step` (the
    #: kernels' bits) for float32 and float64, by MXNet's one-array kernel
    #: (``sgd_mom_update``) for other dtypes with momentum.  Either gives the multi-tensor
    #: kernel's bits; the compiled loop at about 0.16 ns an element and 20 us a call, with or
    #: without clipping, where the multi-tensor one (which visits every array of the call at
    #: every index) takes 2.9 ns: from 2,000 elements on it is the faster even alone, and
    #: below 4,096 several short arrays share one multi-tensor call (scripts/bench_optimizer.py)
    ALONE_ELEMENTS = 1 << 12
    #: dtypes :func:`sgd_step` updates (MXNet computes float16 in its own way)
    COMPILED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

    def __init__(self, optimizer, store_type: str, asynchronous: bool):
        problem = delay_refusal(optimizer, store_type, asynchronous)
        if problem:
            raise ValueError(problem)
        if getattr(optimizer, "aggregate_num", 0) > 0:
            optimizer.aggregate_num = max(optimizer.aggregate_num, self.AGGREGATE_KEYS)
        self.updater = mx.optimizer.get_updater(optimizer)
        self.delay_aware = needs_delay(optimizer)
        # exactly MXNet's SGD: a subclass may update otherwise
        self.fused_sgd = type(optimizer) is mx.optimizer.SGD
        self._flat: dict = {}    # key -> (FlatArrays, start, stop) holding its momentum
        self._bound = weakref.WeakKeyDictionary()   # Run -> (generation, momentum) bound at
        # a pool tunes these from the values the workers set (a scheduler keeps its own lr)
        self.base_hyper = {"lr": None if optimizer.lr_scheduler else optimizer.lr,
                           "momentum": getattr(optimizer, "momentum", None)}

    @property
    def optimizer(self):
        return self.updater.optimizer

    def apply(self, keys, grads, weights, pusher=None) -> None:
        """One update of ``weights`` (NDArrays, in place) by ``grads``; ``pusher``: the
        (worker, delay) of the one push they hold, which a delay-aware optimizer needs."""
        if pusher is not None and self.delay_aware:
            worker, delay = pusher
            for key, grad, weight in zip(keys, grads, weights):
                self.optimizer.update_delayed(key, weight, grad, self.state(key, weight),
                                              worker, delay)
            return
        keys, grads, weights = list(keys), list(grads), list(weights)
        if not self.fused_sgd:
            self.updater(keys, grads, weights)
            return
        dtypes = [np.dtype(w.dtype) for w in weights]
        fused = [i for i, dtype in enumerate(dtypes) if self._fusable(dtype)]
        if len(fused) < len(keys):
            taken = set(fused)
            rest = [i for i in range(len(keys)) if i not in taken]
            self.updater([keys[i] for i in rest], [grads[i] for i in rest],
                         [weights[i] for i in rest])
        if not fused:
            return
        lrs, wds = self._rates([keys[i] for i in fused], weights[fused[0]].context.device_id)
        momentum = self.optimizer.momentum > 0
        states = [self._sgd_state(keys[i], weights[i], momentum) for i in fused]
        self._launch([Piece(weights[i], grads[i], state if momentum else None, lr, wd,
                            weights[i].size, dtypes[i])
                      for i, state, lr, wd in zip(fused, states, lrs, wds)])

    def apply_runs(self, runs, pusher=None) -> None:
        """One update of blocks held in :class:`FlatArrays` (a server's), given as runs of
        adjacent blocks: with MXNet's SGD, one kernel array for each stretch of a run whose
        keys share their rates (all of it, usually).  ``pusher``: as for :meth:`apply`; a
        delay-aware optimizer takes the blocks one by one with it."""
        if pusher is not None and self.delay_aware:
            self.apply(*block_views(runs), pusher)
            return
        fused = [run for run in runs if self._fusable(run.home.dtype)]
        if len(fused) < len(runs):
            self.apply(*block_views([run for run in runs if run not in fused]))
        if not fused:
            return
        lrs, wds = self._rates(list(chain.from_iterable(run.keys for run in fused)))
        momentum = self.optimizer.momentum > 0
        uniform = lrs.count(lrs[0]) == len(lrs) and wds.count(wds[0]) == len(wds)
        pieces, first = [], 0
        for run in fused:
            self._bind(run, momentum)
            home, last = run.home, first + len(run.keys)
            spans = [(first, last)] if uniform else equal_rate_spans(lrs, wds, first, last)
            for a, b in spans:
                start, stop = run.bounds[a - first], run.bounds[b - first]
                pieces.append(Piece(home.view("weight", start, stop),
                                    home.view("grad", start, stop),
                                    home.view("momentum", start, stop) if momentum else None,
                                    lrs[a], wds[a], stop - start, home.dtype))
            first = last
        self._launch(pieces)

    def _fusable(self, dtype) -> bool:
        """Whether keys of ``dtype`` take the fused SGD (MXNet's Updater keeps float16 with a
        float32 master copy, and refuses what is not a float)."""
        return self.fused_sgd and dtype.kind == "f" and \
            not (self.optimizer.multi_precision and dtype == np.float16)

    def _rates(self, keys, device_id: int = 0):
        """Count one update of each of ``keys`` and give each its learning rate and weight
        decay, as MXNet's optimizer does when it updates them one by one in this order: with a
        scheduler, key i's rate is taken at the update count reached by then."""
        opt = self.optimizer
        opt._set_current_context(device_id)
        counts, begin = opt._index_update_count, opt.begin_num_update
        new = [counts.get(key, begin) + 1 for key in keys]
        counts.update(zip(keys, new))
        running = list(accumulate([opt.num_update, *new], max))[1:]
        if opt.lr_scheduler is None or running[0] == running[-1]:
            opt.num_update = running[-1]
            lrs = opt._get_lrs(keys)
        else:
            lrs = []
            for count, same in groupby(zip(running, keys), key=itemgetter(0)):
                opt.num_update = count
                lrs.extend(opt._get_lrs([key for _, key in same]))
        return lrs, opt._get_wds(keys)

    def _sgd_state(self, key, weight, momentum: bool):
        """The state of a key updated from a list, made as MXNet's Updater makes it."""
        state = self.state(key, weight)
        if state is None and momentum:   # momentum set after the state was made without it
            state = self.updater.states[key] = nd.zeros(weight.shape, weight.context,
                                                        dtype=weight.dtype)
        return state

    def _bind(self, run: Run, momentum: bool) -> None:
        """Give ``run``'s keys their states as MXNet's SGD holds them: with momentum, views
        into the run's flat storage (a state loaded with :meth:`set_states` is copied in,
        else zeros), otherwise None.  Done once per run and per move of its storage."""
        home = run.home
        mark = (home.generation, momentum)
        if self._bound.get(run) == mark:
            return
        states, synced = self.updater.states, self.updater.states_synced
        for key, start, stop in zip(run.keys, run.bounds, run.bounds[1:]):
            if not momentum:
                if key not in states:
                    states[key], synced[key] = None, True
                continue
            view = home.view("momentum", start, stop)
            if self._flat.get(key) != (home, start, stop):
                loaded = states.get(key)
                if loaded is None:
                    view[:] = 0
                elif isinstance(loaded, nd.NDArray) and loaded.size == stop - start:
                    loaded.reshape((-1,)).copyto(view)
                else:
                    raise ValueError(f"key {key!r}: its optimizer state {loaded!r:.80} is not "
                                     f"SGD's momentum for {stop - start} elements")
                self._flat[key] = (home, start, stop)
            states[key], synced[key] = view, True
        self._bound[run] = mark

    def _launch(self, pieces) -> None:
        """MXNet's SGD kernels over ``pieces``, with the arguments MXNet's SGD gives them:
        the multi-tensor ones, but a long piece alone (:attr:`ALONE_ELEMENTS`): by the
        compiled loop when its dtype allows, else, with momentum, on the one-array kernel."""
        opt = self.optimizer
        kwargs = {"rescale_grad": opt.rescale_grad}
        if opt.clip_gradient:
            kwargs["clip_gradient"] = opt.clip_gradient
        momentum = opt.momentum > 0
        if momentum:
            kwargs["momentum"] = opt.momentum
        update = nd.multi_sgd_mom_update if momentum else nd.multi_sgd_update
        width = 3 if momentum else 2
        together = []
        for p in pieces:
            if p.size < self.ALONE_ELEMENTS:
                together.append(p)
            elif self._compiles(p):
                self._sgd_compiled(p, opt.momentum, opt.rescale_grad,
                                   kwargs.get("clip_gradient", -1.0))
            elif momentum:
                nd.sgd_mom_update(p.weight, p.grad, p.momentum, out=p.weight, lr=p.lr, wd=p.wd,
                                  **kwargs)
            else:
                together.append(p)
        for call in kernel_calls(together, self.KERNEL_ARRAYS, self.SPARE_VISITS):
            update(*chain.from_iterable(p[:width] for p in call), out=[p.weight for p in call],
                   num_weights=len(call), lrs=[p.lr for p in call], wds=[p.wd for p in call],
                   **kwargs)

    def _compiles(self, p: Piece) -> bool:
        """Whether :func:`sgd_step` updates ``p`` (in host memory, of a dtype it computes as
        MXNet does)."""
        return p.dtype in self.COMPILED_DTYPES and p.weight.context.device_type == "cpu"

    def _sgd_compiled(self, p: Piece, momentum, rescale_grad, clip_gradient) -> None:
        """:func:`sgd_step` on the memory of ``p``'s NDArrays, once MXNet's engine is done
        with them (at once on a server's naive engine)."""
        wait_to_write(p.weight)
        p.grad.wait_to_read()
        if p.momentum is not None:
            wait_to_write(p.momentum)
        sgd_step(host_view(p.weight, (p.size,)), host_view(p.grad, (p.size,)),
                 None if p.momentum is None else host_view(p.momentum, (p.size,)),
                 p.lr, p.wd, momentum, rescale_grad, clip_gradient)

    def state(self, key, weight):
        """The updater's state of ``key``, made as MXNet's Updater makes it."""
        states = self.updater.states
        if key not in states:
            states[key] = self.optimizer.create_state_multi_precision(key, weight)
            self.updater.states_synced[key] = True
        return states[key]

    def get_states(self) -> bytes:
        """The states pickled as MXNet's ``Updater.get_states`` pickles them (a state kept in
        flat storage is copied out of it)."""
        states = dict(self.updater.states)
        for key, (home, start, stop) in self._flat.items():
            states[key] = home.view("momentum", start, stop).copy()
        return pickle.dumps(states)

    def update_counts(self) -> tuple[int, dict]:
        """Where the optimizer is: ``num_update`` and each key's update count, which MXNet's
        schedulers and Adam's bias correction read."""
        return self.optimizer.num_update, dict(self.optimizer._index_update_count)

    def set_states(self, states: dict) -> None:
        """Take ``states`` (as :meth:`get_states` gives them); flat storage copies them in at
        the next update."""
        self.updater.states = states
        self.updater.states_synced = dict.fromkeys(states, False)
        self._flat.clear()
        self._bound.clear()

    def pulled(self, key, weight, worker: int) -> None:
        """``worker`` is being sent ``key``'s weights (a delay-aware optimizer keeps them)."""
        if self.delay_aware:
            self.optimizer.pulled(key, weight, self.state(key, weight), worker)

    def forget(self, worker: int) -> None:
        """``worker`` left: what the optimizer kept for it goes."""
        if self.delay_aware:
            for state in self.updater.states.values():
                self.optimizer.forget(state, worker)

    def set_learning_rate(self, lr: float) -> None:
        """The workers' new learning rate (``gluon.Trainer.set_learning_rate``), for every
        update from now on; a worker pool scales it as it scaled the one before."""
        if self.optimizer.lr_scheduler is not None:
            raise ValueError(f"cannot set the learning rate to {lr}: the optimizer's "
                             f"lr_scheduler sets it")
        self.optimizer.lr = self.base_hyper["lr"] = float(lr)

    def tune(self, lr_scale: float, momentum) -> None:
        """Scale the learning rate the workers set by ``lr_scale``; set ``momentum`` (a
        function of the workers' momentum), for a worker pool."""
        opt = self.optimizer
        if self.base_hyper.get("lr") is not None:
            opt.lr = self.base_hyper["lr"] * lr_scale
        if self.base_hyper.get("momentum") is not None:
            opt.momentum = momentum(self.base_hyper["momentum"])
