"""Per-key calls gathered into one message per server.

Stock ``gluon.Trainer`` calls ``pushpull`` once per parameter.  Each call
returns at once (its result arrives through MXNet's engine), so calls can be
held for a moment and sent together: a step of ResNet-20 becomes one message
per server instead of 65.  A batch is sent when the step's key sequence
comes round to its last key (learned from the first step: the key before the
first key came again), when a key would appear twice, when any other call
needs the store, or, as a backstop, when an engine operation waits for a
batch that nobody sent and no call has joined it for ``QUIET`` seconds.
"""
from __future__ import annotations

import threading
import time

QUIET = 0.001


class Batch:
    """Requests of several calls, per server: items, gradient buffers, blocks."""

    def __init__(self, op: str):
        self.op = op
        self.plan: dict[int, tuple[list, list, list]] = {}
        self.keys: set = set()
        self.first_key = None
        self.last_key = None
        self.sent = threading.Event()
        self.tickets = None
        self.error: Exception | None = None
        self._values = None
        self._values_lock = threading.Lock()

    def add(self, plan, key) -> None:
        for server, (items, bufs, where) in plan.items():
            mine = self.plan.setdefault(server, ([], [], []))
            mine[0].extend(items)
            mine[1].extend(bufs)
            mine[2].extend(where)
        if not self.keys:
            self.first_key = key
        self.keys.add(key)
        self.last_key = key

    def values(self, compute) -> dict:
        """The pulled values of every key, assembled once for all the calls of the batch."""
        with self._values_lock:
            if self._values is None:
                self._values = compute()
            return self._values


class Coalescer:
    """Holds the open batch and decides when it goes out."""

    def __init__(self, send, clock=time.monotonic):
        self._send = send            # plan messages -> tickets
        self._clock = clock          # what "quiet for QUIET seconds" is measured with
        self._lock = threading.Lock()
        self._open: Batch | None = None
        self.cycle_end = None
        self.last_add = 0.0
        self._previous = (None, None)   # first and last key of the batch sent last

    def add(self, op: str, key, plan) -> Batch:
        with self._lock:
            batch = self._open
            if batch is not None and (key in batch.keys or batch.op != op):
                self.cycle_end = batch.last_key
                self._send_locked()
                batch = None
            if batch is None:
                batch = self._open = Batch(op)
                if self.cycle_end is None and key == self._previous[0]:
                    self.cycle_end = self._previous[1]   # the last batch was one whole step
            batch.add(plan, key)
            self.last_add = self._clock()
            if key == self.cycle_end:
                self._send_locked()
            return batch

    def flush(self, batch: Batch | None = None) -> None:
        """Send the open batch (only if it is ``batch``, when one is named)."""
        with self._lock:
            if self._open is not None and (batch is None or self._open is batch):
                self._send_locked()

    def wait_sent(self, batch: Batch) -> None:
        """Wait until ``batch`` is sent; send it if the calls feeding it have stopped."""
        while not batch.sent.wait(QUIET):
            if self._clock() - self.last_add >= QUIET:
                self.flush(batch)

    def _send_locked(self) -> None:
        batch, self._open = self._open, None
        self._previous = (batch.first_key, batch.last_key)
        try:
            batch.tickets = self._send({s: ({"op": batch.op, "items": its}, bufs)
                                        for s, (its, bufs, _) in batch.plan.items()})
        except Exception as exc:
            batch.error = exc
        finally:
            batch.sent.set()
