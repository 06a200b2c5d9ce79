"""Which server holds which part of a key.

As in MXNet's distributed store, a small array lives whole on one server
(chosen from the key), and an array of at least ``bigarray_bound`` elements is
cut into one contiguous block per server so that big layers spread their
traffic and update work.  Every worker computes the same plan from the key and
its size alone.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Block:
    """Elements ``[start, stop)`` of the flattened key, held by ``server``."""

    key: object
    index: int
    server: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


class Partitioner:
    def __init__(self, num_servers: int, bigarray_bound: int = 1_000_000):
        if num_servers < 1:
            raise ValueError(f"a job needs at least one server, got {num_servers}")
        self.num_servers = num_servers
        self.bigarray_bound = max(1, int(bigarray_bound))
        self.blocks = lru_cache(maxsize=None)(self._blocks)

    def home(self, key) -> int:
        """The server of a key that is not split: MXNet's choice for an int key
        (``kvstore_dist.h``: ``(key * 9973) % num_servers``), so that a job's load spreads
        over its servers as it does on MXNet's stores."""
        if isinstance(key, int):
            return (key * 9973) % self.num_servers
        return zlib.crc32(str(key).encode()) % self.num_servers

    def _blocks(self, key, size: int) -> tuple[Block, ...]:
        n = self.num_servers
        if n == 1 or size < self.bigarray_bound:
            return (Block(key, 0, self.home(key), 0, size),)
        # where MXNet cuts (kvstore_dist.h, EncodeDefaultKey: C's round of size / n * j, half
        # away from zero): optimizers that take a norm per block (LAMB, LARS) then agree
        bounds = [math.floor(size / n * j + 0.5) for j in range(n + 1)]
        return tuple(Block(key, j, j, bounds[j], bounds[j + 1]) for j in range(n))
