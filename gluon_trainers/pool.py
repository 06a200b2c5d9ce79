"""Training one worker of a ``dist_pool`` job (Adaptable Asynchrony) with a Gluon Trainer.

The servers own the pool: they decide how many workers compute at once, the learning rate
they apply, and each worker's next batch size, which comes back with the worker's OK
(``kv.pool_assignment``).  A worker outside the pool waits at its pull; a batch size of 0
means the job's sample budget is spent.  So a worker's loop is::

    batches = PoolBatches(x_train, y_train, seed=rank)
    log = train_in_pool(net, trainer, kv, batches, loss_fn)   # kv: the Trainer's dist_pool

Gluon fixes the gradient's normalisation at the first step when the servers update the
weights (``rescale_grad = 1/B`` is sent with the optimizer, and a later ``step`` with another
batch size is refused).  So the optimizer is sent with ``rescale_grad = 1/B0`` (the pool's
starting batch size), every step is taken as ``step(B0)``, and the loss is scaled by ``B0 / B``:
the servers apply the mean gradient of the batch really used.
"""
from __future__ import annotations

import time

import mxnet as mx
import numpy as np
from mxnet import autograd


class PoolBatches:
    """Mini-batches of any size from the whole training set, in this worker's own shuffled
    order (reshuffled at each pass): in a pool any worker may do any share of the work."""

    def __init__(self, x: np.ndarray, y: np.ndarray, seed: int = 0):
        self.x, self.y = x, y
        self.rng = np.random.RandomState(seed)
        self.order = self.rng.permutation(len(x))
        self.at = 0

    def take(self, n: int):
        if n < 1:
            raise ValueError(f"a batch needs at least one example, got batch size {n}")
        picks = []
        while n > 0:
            if self.at == len(self.order):
                self.order, self.at = self.rng.permutation(len(self.x)), 0
            step = min(n, len(self.order) - self.at)
            picks.append(self.order[self.at:self.at + step])
            self.at += step
            n -= step
        idx = np.concatenate(picks)
        return mx.nd.array(self.x[idx]), mx.nd.array(self.y[idx])


def join_pool(trainer, net, kv) -> dict:
    """Put the weights on the servers (worker 0's) and pull them; a worker outside the pool
    waits here until the pool takes it in.  Returns its first assignment."""
    if getattr(kv, "type", None) != "dist_pool":
        raise ValueError(f"train_in_pool needs a dist_pool store, got {getattr(kv, 'type', kv)!r}")
    # the normalisation every step will use, in the optimizer the servers get
    trainer._optimizer.rescale_grad = trainer._scale / kv.params["batch_size"]
    trainer._init_kvstore()      # what the Trainer's first step would do, done before computing
    trainer._init_params()
    for param in net.collect_params().values():
        param.data().wait_to_read()
    if kv.pool_assignment is None:
        raise RuntimeError("the servers gave no pool assignment with the weights")
    return dict(kv.pool_assignment)


def train_in_pool(net, trainer, kv, batches: PoolBatches, loss_fn, on_step=None,
                  max_steps: int = 0, device=None, device_batch: int = 0) -> list[dict]:
    """Take the batch size the pool says, one step at a time, until it says 0.

    ``device``: an emulated device (:mod:`gluon_trainers.straggler`, ``begin``/``end``); a
    step's device time is its profile's for ``device_batch`` samples, scaled to the batch.
    ``on_step(record)`` is called after each step (worker 0 evaluates there).
    Returns one record per step: when it started and ended (wall clock), the batch size,
    the pool's size and learning rate the step was taken under, and the servers' update
    count when the step was let go.
    """
    assignment = join_pool(trainer, net, kv)
    log = []
    params = list(net.collect_params().values())
    first = kv.params["batch_size"]
    while assignment["batch_size"] > 0 and (not max_steps or len(log) < max_steps):
        size = assignment["batch_size"]
        start = time.time()
        x, y = batches.take(size)
        if device is not None:
            device.begin()
        with autograd.record():
            loss = loss_fn(net(x), y)
            scaled = loss * (first / size) if size != first else loss
        scaled.backward()
        if device is not None:
            device.end(size / device_batch if device_batch else 1.0)
        trainer.step(first)
        for param in params:          # the reply brings the weights and the next assignment
            param.data().wait_to_read()
        record = {"start": start, "end": time.time(), "batch_size": size,
                  "pool": assignment["pool"], "lr": assignment["lr"],
                  "updates": assignment.get("updates"), "loss": float(loss.mean().asscalar())}
        log.append(record)
        if on_step is not None:
            on_step(record)
        assignment = dict(kv.pool_assignment)
    return log
