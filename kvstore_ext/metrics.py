"""Counters every store reports: readable live with ``kv.stats()``, written as JSON at the end."""
from __future__ import annotations

import collections
import json
import os
import resource
import time


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


#: what :func:`rusage_counts` reports, each a count since the process started
RUSAGE_COUNTS = ("minor_faults", "major_faults", "voluntary_switches", "involuntary_switches")


def rusage_counts() -> dict:
    """This process's page faults (minor: a page mapped in; major: read from disk) and context
    switches (voluntary: it waited; involuntary: it was preempted) so far, all threads."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return dict(zip(RUSAGE_COUNTS, (u.ru_minflt, u.ru_majflt, u.ru_nvcsw, u.ru_nivcsw)))


class Histogram:
    """Counts of integer values (staleness, lead at OK)."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}

    def add(self, value: int, n: int = 1) -> None:
        self.counts[value] = self.counts.get(value, 0) + n

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def max(self) -> int | None:
        return max(self.counts) if self.counts else None

    def to_dict(self) -> dict:
        return {str(k): v for k, v in sorted(self.counts.items())}


class ServerMetrics:
    """Per server: pushes applied and dropped; per worker: staleness and lead at OK."""

    #: what the machine measures (times, memory, the kernel's counts), not what the server
    #: decided: two servers given the same messages differ in these alone
    MEASURED = ("uptime_s", "cpu_s", "peak_rss_mb", "optimizer_cpu_s", *RUSAGE_COUNTS)

    def __init__(self, rank: int):
        self.rank = rank
        self.started = time.time()
        self.pushes_received = 0
        self.pushes_applied = 0
        self.pushes_dropped = 0
        self.updates = 0
        #: CPU seconds of the server's thread in its optimizer calls (all of the optimizer's
        #: work under the servers' synchronous engine): what an update costs in place, with
        #: the caches as the traffic around it leaves them, for the planner
        self.optimizer_cpu_s = 0.0
        self.staleness: dict[int, Histogram] = {}
        self.lead_at_ok: dict[int, Histogram] = {}
        self.errors = 0
        self.rejected_unauthenticated = 0
        self.messages = 0          # requests served (authenticated and well-formed)
        self.malloc = "default"    # "fixed": the process's malloc thresholds (ps.heap)
        #: (key, block, what reports that block's decisions: its ``report(wall_offset)``);
        #: set by the server on its first key
        self.decision_log = None
        self._wall_offset = time.time() - time.monotonic()   # policies see monotonic time

    def record_ok(self, worker: int, lead: int, blocks: int = 1) -> None:
        """``worker`` got OK at ``lead`` for ``blocks`` blocks (one count each)."""
        self.lead_at_ok.setdefault(worker, Histogram()).add(lead, blocks)

    def record_staleness(self, worker: int, staleness: int, blocks: int = 1) -> None:
        """``blocks`` blocks of a push of ``worker`` were ``staleness`` updates stale."""
        self.staleness.setdefault(worker, Histogram()).add(staleness, blocks)

    def to_dict(self) -> dict:
        return {
            "server": self.rank,
            "uptime_s": time.time() - self.started,
            # CPU seconds of the whole process, MXNet's engine threads included: the planner
            # (kvstore_ext.plan) divides the change over a run by the messages served
            "cpu_s": time.process_time(),
            # page faults and context switches of the whole process: a server that faults its
            # receive buffers in every round pays for it in cpu_s (docs/planner.md)
            **rusage_counts(),
            "messages": self.messages,
            "pushes_received": self.pushes_received,
            "pushes_applied": self.pushes_applied,
            "pushes_dropped": self.pushes_dropped,
            "updates": self.updates,
            "optimizer_cpu_s": self.optimizer_cpu_s,
            "errors": self.errors,
            "rejected_unauthenticated": self.rejected_unauthenticated,
            "peak_rss_mb": peak_rss_mb(),
            "malloc": self.malloc,
            "staleness": {str(w): h.to_dict() for w, h in sorted(self.staleness.items())},
            "lead_at_ok": {str(w): h.to_dict() for w, h in sorted(self.lead_at_ok.items())},
            "max_lead_at_ok": {str(w): h.max for w, h in sorted(self.lead_at_ok.items())},
            **self._decisions(),
        }

    def _decisions(self) -> dict:
        """What the logged key's policy reports about its decisions (DSSP: its controller's
        calls and bound changes, in wall-clock times), if anything."""
        if self.decision_log is None:
            return {}
        key, block, reporter = self.decision_log
        return {name: {"key": key, "block": block, **data}
                for name, data in reporter.report(self._wall_offset).items()}


class WorkerMetrics:
    """Per worker: iterations, compute time, time waiting for OK, bytes moved."""

    def __init__(self) -> None:
        self.pushes: collections.Counter = collections.Counter()   # key -> pushes
        self.calls = 0
        self.wait_time = 0.0
        self.compute_time = 0.0
        self.bytes_sent = 0        # array bytes this worker sent (pushes) or handed to allreduce
        self.bytes_received = 0    # array bytes of the replies (pulls) or allreduce results
        self._last_end: float | None = None
        self._call_start = 0.0

    def begin_call(self) -> None:
        now = time.perf_counter()
        if self._last_end is not None:
            self.compute_time += now - self._last_end
        self._call_start = now

    def end_call(self) -> None:
        now = time.perf_counter()
        self.wait_time += now - self._call_start
        self._last_end = now
        self.calls += 1

    def add_wait(self, seconds: float) -> None:
        """Time an engine operation spent waiting for replies after its call returned."""
        self.wait_time += seconds

    def count_pushes(self, keys: list) -> None:
        """One push more of each of ``keys``."""
        if len(keys) == 1:          # a per-key call: most calls
            self.pushes[keys[0]] += 1
        else:
            self.pushes.update(keys)

    @property
    def iterations(self) -> int:
        return max(self.pushes.values()) if self.pushes else 0

    def to_dict(self) -> dict:
        return {
            "iterations": self.iterations,
            "calls": self.calls,
            "compute_time_s": self.compute_time,
            "wait_time_s": self.wait_time,
            "wait_share": self.wait_time / max(1e-12, self.wait_time + self.compute_time),
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "peak_rss_mb": peak_rss_mb(),
        }


def write_json(directory: str, name: str, data: dict) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path
