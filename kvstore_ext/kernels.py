"""MXNet's SGD step compiled to one loop (numba), for flat numpy arrays in host memory.

The servers and the virtual-time trainer update a run of adjacent blocks as one array
(:class:`kvstore_ext.optimizers.ServerOptimizer`).  MXNet's kernels at the one OpenMP thread
a server runs take 1.5-2.9 ns an element, and the same float operations as numpy passes
0.55; compiled into one loop they go through memory once, at 0.16-0.32 ns an element
(``scripts/bench_optimizer.py``).  The loop does the float operations of MXNet's kernels
(``SGDMomKernel``, ``MultiSGDKernel`` in MXNet's optimizer_op-inl.h) in their order, in the
array's dtype, with no contraction to fused multiply-adds (numba's default), so the bits are
MXNet's (``tests/unit/test_fused_optimizer.py`` checks every case against its kernels).

numba is imported and the loop compiled (or read from numba's cache, next to this file) at the
first step, so a process that never updates a long array pays for neither.
"""
from __future__ import annotations

import numpy as np

_compiled = None


def _step_loop(weight, grad, mom, zero, lr, lr_wd, lr_rescale, rescale, momentum, clip,
               has_mom, clipping):
    """The loop :func:`sgd_step` compiles: each element's operations in the kernels' order."""
    for i in range(weight.size):
        if has_mom:
            m = mom[i] * momentum
            m = m - weight[i] * lr_wd
        else:
            m = zero - weight[i] * lr_wd       # 0·0 − (lr·wd)·w: the kernel's sign of a zero
        if clipping:
            g = grad[i] * rescale
            if g > clip:
                g = clip
            elif g < -clip:
                g = -clip
            m = m - g * lr
        else:
            m = m - grad[i] * lr_rescale
        if has_mom:
            mom[i] = m
        weight[i] = weight[i] + m


def _compile():
    """:func:`_step_loop` compiled, kept in numba's cache (next to this file, else in the
    user's cache folder; numba refuses to cache where neither is writable: then not kept)."""
    import numba
    try:
        return numba.njit(cache=True, nogil=True)(_step_loop)
    except RuntimeError:
        return numba.njit(nogil=True)(_step_loop)


def sgd_step(weight: np.ndarray, grad: np.ndarray, mom, lr: float, wd: float,
             momentum: float, rescale_grad: float, clip_gradient: float = -1.0) -> None:
    """One step of MXNet's SGD on flat numpy arrays of one float dtype, in place, bit for
    bit as its kernels, their float32 parameters widened to the dtype::

        mom = momentum·mom − (lr·wd)·w − (lr·rescale)·g    (− lr·clip(rescale·g) with clipping)
        w = w + mom

    ``mom`` None: no momentum, as MXNet's ``multi_sgd_update`` runs it (its momentum term a
    zero)."""
    global _compiled
    if _compiled is None:
        _compiled = _compile()
    cast = weight.dtype.type
    lr, wd, momentum, rescale_grad, clip_gradient = (
        cast(np.float32(v)) for v in (lr, wd, momentum, rescale_grad, clip_gradient))
    has_mom = mom is not None
    # without momentum the loop never touches ``mom``: ``weight`` stands in, one array type
    # for numba to compile for
    _compiled(weight, grad, mom if has_mom else weight, cast(0), lr, lr * wd,
              lr * rescale_grad, rescale_grad, momentum, clip_gradient, has_mom,
              bool(clip_gradient >= 0))
