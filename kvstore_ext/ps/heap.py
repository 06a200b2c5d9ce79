"""Keep a server's freed message buffers in its heap instead of handing them back every round.

A server receives a round's gradients as a few buffers of up to megabytes, frees them, and
receives the next round's.  glibc's malloc returns the free top of its heap to the system
whenever it exceeds the trim threshold (128 KB, raised on the fly by its "dynamic mmap
threshold" after the first large free, so it depends on the history of the process), and the
next round's buffers then fault every page back in: a brk pair per round and a page fault per
4 KB.  Whether a server churned so was set by the sizes it happened to free first: two
calibrations of the same code disagreed on the server's costs by up to 13%, and one job's
server spent 0.4 ms a round more than the next one's (docs/planner.md, "The servers' two
modes").

Fixing the thresholds (which also turns the dynamic adjustment off) keeps at most the
threshold's worth of freed memory: bounded, and no more than the server's own peak.  A user's
``MALLOC_*_`` environment variables are left to rule instead; ``KVX_SERVER_MALLOC=default``
leaves malloc as it is.
"""
from __future__ import annotations

import ctypes
import logging
import os

from ..jobenv import SERVER_MALLOC

log = logging.getLogger("kvstore_ext.heap")

# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

#: freed memory at the heap's top kept for the next rounds before any is returned
TRIM_THRESHOLD = 128 << 20
#: what each growth of the heap asks for beyond the request (fewer brk calls)
TOP_PAD = 16 << 20
#: allocations from here up get their own mapping (glibc's largest allowed value on 64 bits)
MMAP_THRESHOLD = 32 << 20

USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_")


def keep_freed_buffers() -> bool:
    """Set glibc's malloc thresholds for a server process; False where the C library has no
    ``mallopt`` or refuses one, the user set any of them in the environment, or
    ``KVX_SERVER_MALLOC=default`` (nothing is set in the last two cases)."""
    if os.environ.get(SERVER_MALLOC) == "default" or any(os.environ.get(n) for n in USER_SETTINGS):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt   # the C library's, as launch.process finds prctl
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    done = all(mallopt(param, value) == 1 for param, value in (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        (M_TOP_PAD, TOP_PAD)))
    if not done:
        log.debug("mallopt refused a threshold; malloc keeps its defaults")
    return done
