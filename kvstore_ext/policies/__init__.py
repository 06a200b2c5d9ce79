"""Synchronisation models as small pure objects (no I/O, no arrays).

Each store type's row in :mod:`kvstore_ext.registry` says which model its servers
run for a key (``registry.make_policy``); the unit tests and the simulator build
the same objects.
"""
from __future__ import annotations

from .asp import ASPPolicy
from .base import Decision, PolicyError, SyncPolicy, WaitingRoom
from .bsp import BSPPolicy
from .clocks import ClockTable
from .dssp import ControllerCall, DSSPPolicy, dssp_extra_iterations
from .ssp import SSPPolicy, check_staleness

__all__ = ["ASPPolicy", "BSPPolicy", "SSPPolicy", "DSSPPolicy", "ClockTable", "ControllerCall",
           "Decision", "PolicyError", "SyncPolicy", "WaitingRoom",
           "check_staleness", "dssp_extra_iterations"]
