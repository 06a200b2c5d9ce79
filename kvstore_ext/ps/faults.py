"""Fault injection on servers (off by default): late pull replies and a slow server.

The PSP-SGD paper delays 0.16% of pull replies by 4 s; a slow server answers everything late.
A server asks :meth:`FaultPlan.delay` for each block it sends back to a pull (as in the paper,
where each block comes back on its own) and sends that block that many seconds later, while it
goes on serving: the message is slow, not the server's loop.  (A store whose replies are not
split into blocks sends the whole reply as late as its latest block.)  Draws come
from a generator seeded by the job's seed and the server's rank, so a run can be repeated.

Set for a job by ``launch.py --delay-replies FRACTION:SECONDS --slow-server RANK:SECONDS
--fault-seed N`` (variables ``KVX_DELAY_REPLIES``, ``KVX_SLOW_SERVER``, ``KVX_FAULT_SEED``).
"""
from __future__ import annotations

import os
import random

DELAY_REPLIES = "KVX_DELAY_REPLIES"
SLOW_SERVER = "KVX_SLOW_SERVER"
FAULT_SEED = "KVX_FAULT_SEED"


def _pair(text: str, what: str, first: str, first_type):
    parts = str(text).split(":")
    if len(parts) != 2:
        raise ValueError(f"{what} must be {first}:SECONDS, got {text!r}")
    try:
        head, seconds = first_type(parts[0]), float(parts[1])
    except ValueError:
        raise ValueError(f"{what} must be {first}:SECONDS with numbers, got {text!r}") from None
    if not seconds >= 0:
        raise ValueError(f"{what}: the delay must be >= 0 seconds, got {parts[1]!r}")
    return head, seconds


def parse_delay_replies(text: str) -> tuple[float, float]:
    """``"0.0016:4"`` -> (fraction of pull replies, seconds)."""
    fraction, seconds = _pair(text, "--delay-replies", "FRACTION", float)
    if not 0 <= fraction <= 1:
        raise ValueError(f"--delay-replies: the fraction must be in [0, 1], got {fraction!r}")
    return fraction, seconds


def parse_slow_server(text: str, num_servers: int | None = None) -> tuple[int, float]:
    """``"1:0.05"`` -> (server rank, seconds added to each of its replies)."""
    rank, seconds = _pair(text, "--slow-server", "RANK", int)
    if rank < 0 or (num_servers is not None and rank >= num_servers):
        raise ValueError(f"--slow-server: server {rank} does not exist (the job has "
                         f"{num_servers} servers, ranks 0..{(num_servers or 1) - 1})")
    return rank, seconds


class FaultPlan:
    """Which replies of one server are late, and by how much; counts what it did."""

    def __init__(self, rank: int, delay_fraction: float = 0.0, delay_seconds: float = 0.0,
                 slow_seconds: float = 0.0, seed: int = 0):
        self.rank = rank
        self.delay_fraction, self.delay_seconds = delay_fraction, delay_seconds
        self.slow_seconds = slow_seconds
        self.seed = seed
        self._rng = random.Random(seed * 1_000_003 + rank)
        self.replies = 0
        self.delayed = 0
        self.delay_total = 0.0

    @classmethod
    def from_env(cls, rank: int, environ=os.environ) -> "FaultPlan":
        fraction = seconds = slow = 0.0
        if environ.get(DELAY_REPLIES):
            fraction, seconds = parse_delay_replies(environ[DELAY_REPLIES])
        if environ.get(SLOW_SERVER):
            slow_rank, slow_s = parse_slow_server(environ[SLOW_SERVER])
            slow = slow_s if slow_rank == rank else 0.0
        seed = int(environ.get(FAULT_SEED) or 0)
        return cls(rank, fraction, seconds, slow, seed)

    @property
    def active(self) -> bool:
        return self.slow_seconds > 0 or (self.delay_fraction > 0 and self.delay_seconds > 0)

    def delay(self) -> float:
        """Seconds to hold back the next block reply (0: send now)."""
        self.replies += 1
        late = self.slow_seconds
        if self.delay_fraction > 0 and self._rng.random() < self.delay_fraction:
            late += self.delay_seconds
        if late > 0:
            self.delayed += 1
            self.delay_total += late
        return late

    def to_dict(self) -> dict:
        return {"delay_fraction": self.delay_fraction, "delay_seconds": self.delay_seconds,
                "slow_seconds": self.slow_seconds, "seed": self.seed,
                "block_replies": self.replies, "replies_delayed": self.delayed,
                "delay_total_s": self.delay_total}
