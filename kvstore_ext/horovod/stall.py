"""Say so, with every thread's stack, when a Horovod store's allreduce does not end.

A Horovod store never blocks in Python: its allreduces run in MXNet's engine, and the
training script waits for them wherever it next reads a weight (a forward pass, a
``loss.asscalar()``).  If an allreduce never ends (a hung peer, a lost message, a fault in
Gloo or the engine), that wait lasts forever and says nothing: Horovod warns only when the
ranks disagree on what they submitted.

:class:`StallReporter` watches one allreduce at a time, the newest the store started when
the last one watched has ended, from a daemon thread that looks every few seconds: at most
one engine probe per look, nothing on the training path but remembering the newest.  When
the one watched has run ``after_s`` seconds, it prints, once, which one it is and every
thread's stack (:mod:`faulthandler`), and lets the job go on: a peer that is only slow
(evaluating, saving a checkpoint) will catch up.  With a :class:`~.progress.ProgressBoard`
(the job's rendezvous server), each look also puts this worker's progress there, and while
the watched allreduce runs long it reads the others': the report, and the error of a
collective that failed (:meth:`StallReporter.waiting_for`), name the workers it waits for.
"""
from __future__ import annotations

import threading
import time
from typing import NamedTuple

from ..stalls import look_period, report


class Started(NamedTuple):
    step: int
    key: object
    array: object       # what the allreduce writes: it has ended when this can be read
    since: float


class StallReporter:
    """See the module.  ``describe()`` names the worker in a report; ``watch(fn, [array])``
    calls ``fn`` once ``array`` can be read (:func:`kvstore_ext.engine.probe`); ``out`` is
    where reports go (stderr).  ``clock`` is for tests of the logic, which call
    :meth:`look` themselves."""

    def __init__(self, after_s: float, describe, watch, out=None, clock=time.monotonic,
                 board=None):
        self.after_s = float(after_s)
        self.board = board       # a ProgressBoard, or None
        self.period = look_period(self.after_s) if self.after_s > 0 else 0.0
        #: the watched allreduce's age from which the others' progress is read, look by look
        self.read_after = self.period
        #: a peer whose heartbeat has not moved for this long is "not heard from": a live
        #: one moves it at each of its looks, and is read at each look here
        self.silent_after = 2 * self.period
        self.describe = describe
        self.watch = watch
        self.out = out
        self.clock = clock
        self.reports = 0
        self._newest = None      # the newest allreduce started (set on the training path)
        self._watched = None     # the one whose end the probe waits for
        self._armed = None       # the last one watched (not watched again)
        self._reported = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def started(self, step: int, key, array) -> None:
        """The store started an allreduce into ``array``: remember it, nothing more."""
        if self.after_s > 0:
            self._newest = Started(step, key, array, self.clock())

    def _ended(self, item: Started) -> None:     # on an engine thread: no engine work here
        with self._lock:
            if self._watched is item:
                self._watched = None

    def look(self) -> bool:
        """Watch the newest allreduce if none is watched; report the watched one if it has run
        ``after_s`` seconds.  True if this look reported."""
        with self._lock:
            watched, newest = self._watched, self._newest
            arm = watched is None and newest is not None and newest is not self._armed
            if arm:
                self._watched = self._armed = watched = newest
        if arm:
            try:
                self.watch(lambda item=newest: self._ended(item), [newest.array])
            except Exception:      # MXNet going away at exit: nothing left to watch
                self.stop()
            return False
        if watched is None or watched is self._reported:
            return False
        ran = self.clock() - watched.since
        if ran < self.after_s:
            return False
        self._reported = watched
        self.reports += 1
        # the probe waits for whatever wrote the array before it was pushed: the allreduce
        # watched, or one of the key's next ones if the store had moved on by then
        peers = self.waiting_for(watched.step)
        report(f"kvstore_ext {self.describe()}: an allreduce of key {watched.key!r} (step "
               f"{watched.step} or later) has not ended after {ran:.0f} s."
               + (f" {peers}" if peers else ""), self.out)
        return True

    def beat(self) -> None:
        """Put this worker's newest step on the board (a heartbeat); while the watched
        allreduce has run ``read_after`` seconds or more, read the others' too."""
        board = self.board
        if board is None:
            return
        newest, watched = self._newest, self._watched
        board.publish(-1 if newest is None else newest.step)
        if watched is None:
            board.settle()
        elif self.clock() - watched.since >= self.read_after:
            board.observe(self.clock())

    def waiting_for(self, step: int) -> str:
        """The board's sentence on the workers this one waits for at ``step`` (empty
        without a board, or before any read)."""
        if self.board is None:
            return ""
        return self.board.describe(step, self.clock(), self.silent_after)

    def start(self) -> "StallReporter":
        if self.after_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kvx-stall-reporter",
                                            daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        self.beat()          # heard from at once: a worker that hangs early is known
        while not self._stop.wait(self.period):
            self.beat()
            self.look()

    def stop(self) -> None:
        self._stop.set()
