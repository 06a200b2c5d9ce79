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
"""
from __future__ import annotations

from collections import Counter

import mxnet as mx
import numpy as np
from mxnet import nd
from mxnet.optimizer import Optimizer


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


class ServerOptimizer:
    """What a server runs on the gradients it gathered: MXNet's updater for the optimizer the
    workers set, applied to a round's keys in one call, or push by push with the delay for a
    delay-aware optimizer.  The servers and the virtual-time trainer
    (:mod:`kvstore_ext.virtual_training`) both apply updates through this one object.
    """

    #: a server updates many keys at once: fuse more of them per kernel call (the same
    #: arithmetic per element, fewer calls)
    AGGREGATE_KEYS = 32

    def __init__(self, optimizer, store_type: str, asynchronous: bool):
        problem = delay_refusal(optimizer, store_type, asynchronous)
        if problem:
            raise ValueError(problem)
        if getattr(optimizer, "aggregate_num", 0) > 0:
            optimizer.aggregate_num = max(optimizer.aggregate_num, self.AGGREGATE_KEYS)
        self.updater = mx.optimizer.get_updater(optimizer)
        self.delay_aware = needs_delay(optimizer)
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
        else:
            self.updater(list(keys), list(grads), list(weights))

    def state(self, key, weight):
        """The updater's state of ``key``, made as MXNet's Updater makes it."""
        states = self.updater.states
        if key not in states:
            states[key] = self.optimizer.create_state_multi_precision(key, weight)
            self.updater.states_synced[key] = True
        return states[key]

    def pulled(self, key, weight, worker: int) -> None:
        """``worker`` is being sent ``key``'s weights (a delay-aware optimizer keeps them)."""
        if self.delay_aware:
            self.optimizer.pulled(key, weight, self.state(key, weight), worker)

    def forget(self, worker: int) -> None:
        """``worker`` left: what the optimizer kept for it goes."""
        if self.delay_aware:
            for state in self.updater.states.values():
                self.optimizer.forget(state, worker)

    def tune(self, lr_scale: float, momentum) -> None:
        """Scale the learning rate the workers set by ``lr_scale``; set ``momentum`` (a
        function of the workers' momentum), for a worker pool."""
        opt = self.optimizer
        if self.base_hyper.get("lr") is not None:
            opt.lr = self.base_hyper["lr"] * lr_scale
        if self.base_hyper.get("momentum") is not None:
            opt.momentum = momentum(self.base_hyper["momentum"])
