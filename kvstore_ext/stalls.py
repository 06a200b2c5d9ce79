"""What both runtimes share to report a wait that does not end.

A worker waits on its peers: a parameter-server store for a server's reply, a Horovod store
for an allreduce.  A peer that is only slow (evaluating, saving a checkpoint) must not stop
the job, and a hung one must not leave it silent forever.  So, as Horovod's stall check warns
without stopping by default, a wait past ``KVX_STALL_REPORT_S`` seconds is reported once,
saying what waits and with every thread's stack, and the job goes on.
"""
from __future__ import annotations

import faulthandler
import math
import os
import sys

#: seconds a wait may last before a report (default 120; 0 turns the reports off)
STALL_ENV = "KVX_STALL_REPORT_S"
DEFAULT_AFTER_S = 120.0
#: seconds a parameter-server worker waits for a reply before its call raises
#: (:class:`~kvstore_ext.errors.StalledError`), as Horovod's
#: ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` (default 0: never, as MXNet's stores wait)
SHUTDOWN_ENV = "KVX_STALL_SHUTDOWN_S"


def after_seconds(environ=None, name: str = STALL_ENV, default: float = DEFAULT_AFTER_S,
                  zero: str = "turns the reports off") -> float:
    """The bound from ``name`` (``KVX_STALL_REPORT_S``); a bad value is an error naming it."""
    raw = (os.environ if environ is None else environ).get(name, "")
    if not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}={raw!r}: expected seconds, a number >= 0 (0 {zero})")
    return value


def shutdown_seconds(environ=None) -> float:
    """The bound from ``KVX_STALL_SHUTDOWN_S`` (0, the default: a call waits for ever)."""
    return after_seconds(environ, SHUTDOWN_ENV, 0.0, "never stops a call, the default")


def look_period(after_s: float) -> float:
    """How often to look: several times within the bound, so a report is at most a quarter
    of it late, and never more often than 20 times a second."""
    return min(5.0, max(0.05, after_s / 4))


_BUSY_OR_HUNG = ("a peer it waits for is busy elsewhere (evaluating, saving), a peer or the "
                 "link to it is hung")
PEER_HUNG = "Unless " + _BUSY_OR_HUNG
#: what else a wait for a server's reply may be on a store with a worker pool (``dist_pool``)
POOL_WAIT = ("Unless the worker pool keeps this worker out for now (it waits for OK until the "
             "pool grows, or a lower rank leaves the job or waits at a barrier) or "
             + _BUSY_OR_HUNG)


def report(what: str, out=None, unless: str = PEER_HUNG) -> None:
    """Print ``what`` (one sentence on what waits and since when), ``unless`` (what else it
    may be, and what it then is), and every thread's stack."""
    out = out or sys.stderr
    print(f"{what} {unless}; every thread's stack follows ({STALL_ENV} sets this "
          f"bound; 0 turns it off).", file=out, flush=True)
    try:
        faulthandler.dump_traceback(file=out, all_threads=True)
    except (AttributeError, ValueError, OSError):   # no file descriptor behind ``out``
        pass
