"""Parameters of the Horovod stores (``dist_dcs3gd``, ``dist_ssgd``), checked without mxnet.

Kept apart from :mod:`kvstore_ext.horovod.store` so that the registry can check these
parameters without importing mxnet or horovod (the scheduler and servers read it).
"""
from __future__ import annotations

import math

LAMBDA0_DEFAULT = 0.2


def dcs3gd_params(params: dict) -> dict:
    """``lambda0`` ≥ 0 (default 0.2): the delay compensation's strength (the paper's λ0)."""
    raw = params.get("lambda0", LAMBDA0_DEFAULT)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"kvstore parameter 'lambda0' must be a number, got {raw!r}") from None
    if isinstance(raw, bool) or not math.isfinite(value) or value < 0:
        raise ValueError(f"kvstore parameter 'lambda0' must be a finite number >= 0, got {raw!r}")
    return {"lambda0": value}


#: MXNet's switch for MKL-DNN kernels; Horovod's allreduce cannot take their array layouts
MKLDNN_ENV = "MXNET_MKLDNN_ENABLED"


def worker_kernels(environ) -> dict:
    """The kernel switch a Horovod worker gets from ``environ``: MKL-DNN off unless it is set
    (``launch.py --launcher horovod`` starts workers so; the planner calibrates them so)."""
    return {MKLDNN_ENV: environ.get(MKLDNN_ENV, "0")}
