"""The DC-S3GD paper's schedules, usable with every kvstore (they live in the optimizer).

- Learning rate: linear warm-up by iteration to N·η_single (N workers), then
  linear decay to zero at the last iteration (:class:`WarmupLinearDecay`).
- Weight decay: the same curve times a factor k (2.3 in the paper), so that
  decay does not outweigh the tiny steps at both ends of training.
- No weight decay on batch-norm parameters and biases (:func:`no_weight_decay_on_bn_and_bias`).

The paper planned a warm-up to the peak at half of training, but stopped it once
the training error plateaued (epoch 15, or 20 on 64 and more nodes), at the rate
reached then; ``ramp_epochs`` (the planned length) and ``warmup_epochs`` (where
it stops) express that; by default both are the same and the warm-up reaches
the peak.
"""
from __future__ import annotations

from mxnet import gluon
from mxnet.lr_scheduler import LRScheduler

WD_FACTOR = 2.3


class WarmupLinearDecay(LRScheduler):
    """Learning rate (and, once attached, weight decay) by update count.

    ``lr(n) = begin_lr + (peak − begin_lr)·n / ramp_updates`` while ``n ≤ warmup_updates``;
    then straight down from ``lr(warmup_updates)`` to 0 at ``n = max_update``.
    ``peak`` is ``base_lr`` (an optimizer's ``learning_rate``, if given, replaces it, as
    with any MXNet scheduler).  ``wd(n) = wd_factor · wd · lr(n) / peak``.
    """

    def __init__(self, max_update: int, warmup_updates: int, base_lr: float, begin_lr: float = 0.0,
                 ramp_updates: int | None = None, wd: float = 0.0, wd_factor: float = WD_FACTOR):
        super().__init__(base_lr=base_lr)
        ramp = warmup_updates if ramp_updates is None else ramp_updates
        checks = {"max_update": max_update >= 1, "warmup_updates": 0 <= warmup_updates < max_update,
                  "ramp_updates": ramp >= max(warmup_updates, 1) if warmup_updates else True,
                  "base_lr": base_lr > 0, "begin_lr": 0 <= begin_lr <= base_lr,
                  "wd": wd >= 0, "wd_factor": wd_factor >= 0}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"WarmupLinearDecay: bad {name} (max_update={max_update}, "
                                 f"warmup_updates={warmup_updates}, ramp_updates={ramp}, "
                                 f"base_lr={base_lr}, begin_lr={begin_lr}, wd={wd}, "
                                 f"wd_factor={wd_factor})")
        self.max_update = int(max_update)
        self.warmup_updates = int(warmup_updates)
        self.ramp_updates = int(ramp)
        self.begin_lr = float(begin_lr)
        self.wd = float(wd)
        self.wd_factor = float(wd_factor)
        self._optimizer = None

    @classmethod
    def from_epochs(cls, lr_single: float, num_workers: int, updates_per_epoch: int,
                    epochs: float, warmup_epochs: float, ramp_epochs: float | None = None,
                    begin_lr: float = 0.0, wd: float = 0.0, wd_factor: float = WD_FACTOR):
        """The paper's recipe: peak N·η_single; warm-up and length given in epochs."""
        per = int(updates_per_epoch)
        return cls(max_update=max(1, int(round(epochs * per))),
                   warmup_updates=int(round(warmup_epochs * per)),
                   ramp_updates=None if ramp_epochs is None else int(round(ramp_epochs * per)),
                   base_lr=num_workers * lr_single, begin_lr=begin_lr, wd=wd, wd_factor=wd_factor)

    # -- the curves ---------------------------------------------------------------------------
    def shape(self, num_update: int) -> float:
        """The schedule's fraction of the peak at update ``num_update`` (0 at the last one)."""
        n = min(max(int(num_update), 0), self.max_update)
        peak = self.base_lr
        if n <= self.warmup_updates and self.warmup_updates > 0:
            return (self.begin_lr + (peak - self.begin_lr) * n / self.ramp_updates) / peak
        top = self._top() / peak
        return top * (self.max_update - n) / (self.max_update - self.warmup_updates)

    def _top(self) -> float:
        """The rate where the warm-up stops (the peak unless it stops early)."""
        if self.warmup_updates == 0:
            return self.base_lr
        return self.begin_lr + (self.base_lr - self.begin_lr) * self.warmup_updates / self.ramp_updates

    def lr_at(self, num_update: int) -> float:
        return self.base_lr * self.shape(num_update)

    def wd_at(self, num_update: int) -> float:
        return self.wd_factor * self.wd * self.shape(num_update)

    def __call__(self, num_update):
        lr = self.lr_at(num_update)
        if self._optimizer is not None:
            # MXNet reads the rate before the decay in each update, so this sets the step's wd
            self._optimizer.wd = self.wd_at(num_update)
        return lr

    def attach(self, optimizer):
        """Drive ``optimizer``'s learning rate and weight decay; returns the optimizer."""
        optimizer.lr_scheduler = self
        optimizer.wd = self.wd_at(optimizer.num_update)
        self._optimizer = optimizer
        return optimizer


def no_weight_decay_on_bn_and_bias(block_or_params) -> list[str]:
    """Set ``wd_mult = 0`` on batch-norm parameters and biases; returns their names.

    Batch norm makes a layer's output independent of its weights' scale, so decaying
    them only shrinks steps (the paper follows Jia et al. 2018); biases are too few to
    overfit.  Give a Block (batch-norm layers are found by type) or a ParameterDict
    (found by name: ``gamma``, ``beta``, ``running_mean``, ``running_var``, ``bias``).
    """
    names = set()
    if isinstance(block_or_params, gluon.Block):
        stack = [block_or_params]
        while stack:
            block = stack.pop()
            if isinstance(block, gluon.nn.BatchNorm):
                names.update(block.collect_params().keys())
            stack.extend(block._children.values())
        params = block_or_params.collect_params()
    else:
        params = block_or_params
    suffixes = ("gamma", "beta", "running_mean", "running_var", "bias")
    for name, param in params.items():
        if name in names or name.endswith(suffixes):
            param.wd_mult = 0.0
            names.add(name)
    return sorted(n for n in names if n in params.keys())
