"""Synchronisation models as small pure objects (no I/O, no arrays).

``make_policy(store_type, workers, params)`` builds the model a server runs
for one key; the unit tests and the simulator call the same constructor.
"""
from __future__ import annotations

from .asp import ASPPolicy
from .base import Decision, PolicyError, SyncPolicy, WaitingRoom
from .bsp import BSPPolicy
from .clocks import ClockTable
from .dssp import ControllerCall, DSSPPolicy, dssp_extra_iterations
from .ssp import SSPPolicy, check_staleness

__all__ = ["ASPPolicy", "BSPPolicy", "SSPPolicy", "DSSPPolicy", "ClockTable", "ControllerCall",
           "Decision", "PolicyError", "SyncPolicy", "WaitingRoom", "make_policy",
           "check_staleness", "dssp_extra_iterations"]


def make_policy(store_type: str, workers, params: dict, record: bool = False) -> SyncPolicy:
    """The synchronisation model of ``store_type`` for one key held by a server.

    ``record``: keep a log of decisions for the metrics (a server asks it of one key).
    """
    if store_type == "dist_bsp":
        return BSPPolicy(workers)
    if store_type == "dist_asp":
        return ASPPolicy(workers)
    if store_type == "dist_ssp":
        return SSPPolicy(workers, params["staleness"])
    if store_type == "dist_dssp":
        return DSSPPolicy(workers, params["staleness_lower"], params["staleness_upper"],
                          record=record)
    raise ValueError(f"no synchronisation model for store type {store_type!r}")
