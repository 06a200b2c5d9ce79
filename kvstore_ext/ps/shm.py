"""Shared-memory lanes: a message's arrays between two processes of one host, past the kernel.

Over TCP (or a Unix socket) every byte is copied into the kernel by the sender and out of it
by the receiver: for LeNet's 1.7 MB that is about 0.35 ms of CPU a side, a third of what a
2 x 1 job spends on a round (docs/performance.md).  Between processes that share
``/dev/shm``, a sender instead copies a message's data frames into a ring of its own in
shared memory (a lane, one per peer it sends to) and sends on the socket only the header,
the authenticator and a descriptor of where the bytes lie.  The receiver copies them out
(one ``memcpy`` of memory the other core just wrote), releases that part of the ring, and
checks the message's tag over its copy: a tag made over the same bytes as on a socket, so
nothing about authentication changes, and the sender's later writes cannot change a message
the receiver has checked.

What a lane never does is wait.  A message that does not fit in the free part of the ring
(the receiver is slow, hung or gone) travels on the socket as before, as do messages under
``MIN_BYTES``.  Only peers whose :func:`host_token` equals ours use lanes: the same boot,
the same mount and IPC namespaces, the same user and the same ``/dev/shm``, on x86-64.

Cleanup: the sender creates a ring's file (``/dev/shm/kvx-<uid>-<pid ns>-<pid>-<random>``, 0600,
its pages reserved up front so a full ``/dev/shm`` is an error at creation, not a SIGBUS at
a write); the receiver maps it on the first message that names it and unlinks the name at
once, so from then on the memory goes when both processes have unmapped it, however they
end.  A sender unlinks its rings when it closes; rings whose creator died before a receiver
took them are removed by the next lane a process of the same user and PID namespace creates
(:func:`sweep`).

The descriptor is authenticated on its own (a keyed BLAKE2b tag of the message's nonce and
the descriptor) before a ring is opened: a peer without the job's secret cannot make a node
open, map or unlink anything.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import mmap
import os
import platform
import re
import stat
import struct

import numpy as np

from .. import jobenv

log = logging.getLogger("kvstore_ext")

#: the directory POSIX shared memory lives in (Linux)
SHM_DIR = "/dev/shm"
#: a message whose data frames hold fewer bytes travels on the socket (a lane saves ~0.2 ms
#: of CPU a MB; below this a socket's copies cost microseconds)
MIN_BYTES = 1 << 18
#: a ring holds this many of the largest message it was made for, and at least RING_MIN_BYTES
RING_MESSAGES = 4
RING_MIN_BYTES = 4 << 20
#: the largest ring a sender makes, and a receiver maps
RING_MAX_BYTES = 1 << 30
#: a ring's header: the receiver's release mark (bytes consumed, a little-endian uint64),
#: alone on its cache line
RING_HEADER = 64
#: frames start at multiples of this in a ring (a cache line: aligned for any dtype)
FRAME_ALIGN = 64
#: rings a receiving socket keeps mapped (its job's senders to it: a few per peer, see Lanes)
MAX_RINGS = 4096
#: the most frames a lane's message carries (a message of more goes on the socket)
MAX_FRAMES = 4096
#: rings' names: the creator's uid, PID namespace and pid, and a random part (a /dev/shm
#: shared between containers holds rings whose pids mean nothing in ours)
NAME = re.compile(r"kvx-(\d+)-(\d+)-(\d+)-[0-9a-f]{12}")
_NAME_BYTES = 64
#: descriptor: ring name, ring capacity, start, end (bytes written in all, after this
#: message), frame count; then one uint64 size per frame; then its tag
_FIXED = struct.Struct(f"<{_NAME_BYTES}sQQQI")
DESC_TAG_BYTES = 16


class UnauthenticDescriptor(ValueError):
    """A descriptor whose tag is not the job's."""


class LaneError(Exception):
    """A descriptor that cannot be honoured (a ring gone, of the wrong size, out of bounds)."""


def host_token() -> str | None:
    """Equal in two processes exactly when they can share memory through ``/dev/shm``; None
    when this host has no such directory, or lanes are off (``KVX_SHM=0``, ``launch.py
    --no-shm``)."""
    if os.environ.get(jobenv.SHM, "1") in ("0", ""):
        return None
    if platform.machine().lower() not in ("x86_64", "amd64"):
        # the receiver releases a ring's bytes with a plain store after its copy of them: in
        # order on x86-64's memory model, not on weaker ones (ARM), where it would need a fence
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        namespaces = [os.readlink(f"/proc/self/ns/{ns}") for ns in ("mnt", "ipc")]
        st = os.stat(SHM_DIR)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    parts = [boot, *namespaces, str(os.geteuid()), str(st.st_dev), str(st.st_ino)]
    return hashlib.blake2b("|".join(parts).encode(), digest_size=12).hexdigest()


def descriptor_key(secret: bytes) -> bytes:
    return hashlib.blake2b(secret, digest_size=32, person=b"kvx-shm").digest()


def _aligned(n: int) -> int:
    return -(-n // FRAME_ALIGN) * FRAME_ALIGN


def pid_namespace() -> str:
    """This process's PID namespace (its inode), "0" when it cannot be told."""
    try:
        return re.sub(r"\D", "", os.readlink("/proc/self/ns/pid")) or "0"
    except OSError:
        return "0"


def orphans() -> list[str]:
    """This user's rings in ``SHM_DIR`` made by processes of this PID namespace that are gone
    (and that no receiver took)."""
    uid, ns = str(os.geteuid()), pid_namespace()
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    return [n for n in names if (m := NAME.fullmatch(n)) and m.group(1) == uid
            and m.group(2) == ns and not os.path.exists(f"/proc/{m.group(3)}")]


def _cut(buffer, sizes, at: int = 0) -> list[memoryview]:
    """Views of frames of ``sizes`` bytes laid out from ``at`` in ``buffer``, each starting
    on a ``FRAME_ALIGN`` boundary (as :meth:`SendRing.write` places them)."""
    whole, out = memoryview(buffer), []
    for n in sizes:
        out.append(whole[at:at + n])
        at += _aligned(n)
    return out


def sweep() -> int:
    """Remove :func:`orphans`; how many."""
    removed = 0
    for name in orphans():
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed += 1
        except OSError:
            pass
    return removed


class SendRing:
    """A sender's ring to one peer: it writes, the peer releases (the header's mark)."""

    def __init__(self, capacity: int):
        sweep()
        self.capacity = capacity
        self.name = f"kvx-{os.geteuid()}-{pid_namespace()}-{os.getpid()}-{os.urandom(6).hex()}"
        self.path = os.path.join(SHM_DIR, self.name)
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        try:
            # pages now: a full /dev/shm fails here, not with a SIGBUS at a later write
            os.posix_fallocate(fd, 0, RING_HEADER + capacity)
            self._map = mmap.mmap(fd, RING_HEADER + capacity)
        except BaseException:
            os.close(fd)
            self.unlink()
            raise
        os.close(fd)
        self._mark = np.frombuffer(self._map, np.uint64, 1, 0)
        self.data = np.frombuffer(self._map, np.uint8, capacity, RING_HEADER)
        self.head = 0        # bytes written in all (including skipped tails at a wrap)

    def reserve(self, nbytes: int) -> int | None:
        """Where a message of ``nbytes`` (aligned) goes, in bytes written in all; None when
        the free part of the ring cannot take it now."""
        at = self.head % self.capacity
        start = self.head if at + nbytes <= self.capacity else self.head + self.capacity - at
        released = int(self._mark[0])
        if start + nbytes - released > self.capacity:
            return None
        return start

    def write(self, frames) -> tuple[int, int, list[int]] | None:
        """Copy ``frames`` (byte views) into the ring; ``(start, end, sizes)``, or None when
        they do not fit now."""
        frames = [memoryview(f) for f in frames]
        sizes = [f.nbytes for f in frames]
        total = sum(_aligned(n) for n in sizes)
        start = self.reserve(total)
        if start is None:
            return None
        at = start % self.capacity
        for f, n in zip(frames, sizes):
            if n:
                self.data[at:at + n] = np.frombuffer(f, np.uint8)
            at += _aligned(n)
        self.head = start + total
        return start, self.head, sizes

    def views(self, start: int, sizes) -> list[memoryview]:
        return _cut(self.data, sizes, start % self.capacity)

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def close(self) -> None:
        self.unlink()
        self._mark = self.data = None
        try:
            self._map.close()
        except (BufferError, AttributeError):   # views still held: the mapping goes with them
            pass


class ReceiveRing:
    """A peer's ring, mapped by the receiver (its name unlinked at once)."""

    def __init__(self, name: str, capacity: int):
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as exc:
            raise LaneError(f"shared-memory ring {name} cannot be opened: {exc.strerror}") \
                from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() \
                    or st.st_size != RING_HEADER + capacity:
                raise LaneError(f"shared-memory ring {name} is not the ring described "
                                f"({st.st_size} bytes, not {RING_HEADER + capacity})")
            self._map = mmap.mmap(fd, RING_HEADER + capacity)
        finally:
            os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
        self.capacity = capacity
        self._mark = np.frombuffer(self._map, np.uint64, 1, 0)
        self.data = np.frombuffer(self._map, np.uint8, capacity, RING_HEADER)

    def take(self, start: int, end: int, sizes) -> list[memoryview]:
        """Copies of the frames at ``start`` (one copy of the span), then the span released."""
        total = sum(_aligned(n) for n in sizes)
        at = start % self.capacity
        if end != start + total or at + total > self.capacity:
            raise LaneError(f"a descriptor out of its ring's bounds (start {start}, end {end}, "
                            f"{total} bytes, capacity {self.capacity})")
        copy = np.empty(total, np.uint8)
        copy[:] = self.data[at:at + total]
        if end > int(self._mark[0]):
            self._mark[0] = end
        return _cut(copy, sizes)

    def close(self) -> None:
        self._mark = self.data = None
        try:
            self._map.close()
        except BufferError:
            pass


class Lanes:
    """A sending socket's rings, one per peer (by node name), made at its first large message.

    A message larger than half its peer's ring gets a new ring of four times its size (the
    first message to a peer may be a small key's); the old one stays mapped, since the peer
    may not have read (or even mapped) it yet, until the lanes close.  Each new ring is at
    least twice the last, so a peer has at most a few, up to ``RING_MAX_BYTES``."""

    def __init__(self):
        self.rings: dict[str, SendRing] = {}
        self.retired: dict[str, list[SendRing]] = {}
        self.failed: set[str] = set()

    def ring(self, to: str, nbytes: int) -> SendRing | None:
        ring = self.rings.get(to)
        if ring is not None and 2 * _aligned(nbytes) <= ring.capacity:
            return ring
        if to in self.failed:
            return None
        capacity = max(RING_MIN_BYTES, RING_MESSAGES * _aligned(nbytes))
        capacity = -(-capacity // (1 << 20)) * (1 << 20)
        if capacity > RING_MAX_BYTES:
            return None
        try:
            new = SendRing(capacity)
        except OSError as exc:
            self.failed.add(to)
            log.warning("kvstore_ext: no shared-memory lane to %s (%s); its messages go on the "
                        "socket", to, exc.strerror or exc)
            return None
        if ring is not None:
            self.retired.setdefault(to, []).append(ring)
        self.rings[to] = new
        return new

    def forget(self, to: str) -> None:
        """Close the rings to ``to`` (a new process under that name maps new ones)."""
        rings = self.retired.pop(to, [])
        if to in self.rings:
            rings.append(self.rings.pop(to))
        for ring in rings:
            ring.close()
        self.failed.discard(to)

    def close(self) -> None:
        for to in [*self.rings, *self.retired]:
            self.forget(to)


def frames_bytes(frames) -> int:
    return sum(_aligned(memoryview(f).nbytes) for f in frames)


def describe(key: bytes, nonce: bytes, ring: SendRing, placed) -> bytes:
    """The descriptor of frames ``placed`` (``SendRing.write``'s result) and its tag."""
    start, end, sizes = placed
    body = _FIXED.pack(ring.name.encode().ljust(_NAME_BYTES, b"\0"), ring.capacity, start, end,
                       len(sizes)) + struct.pack(f"<{len(sizes)}Q", *sizes)
    return body + hashlib.blake2b(nonce + body, key=key, digest_size=DESC_TAG_BYTES).digest()


def read_descriptor(key: bytes, nonce: bytes, data: bytes):
    """``(name, capacity, start, end, sizes)`` of an authentic descriptor; raises ValueError
    (unauthentic or malformed), before anything in it is used."""
    if len(data) < _FIXED.size + DESC_TAG_BYTES:
        raise UnauthenticDescriptor("malformed message: bad authenticator length")
    body, tag = data[:-DESC_TAG_BYTES], data[-DESC_TAG_BYTES:]
    expected = hashlib.blake2b(nonce + body, key=key, digest_size=DESC_TAG_BYTES).digest()
    if not hmac.compare_digest(expected, tag):
        raise UnauthenticDescriptor("lane descriptor not authenticated with the job secret")
    raw, capacity, start, end, count = _FIXED.unpack_from(body)
    if count > MAX_FRAMES or len(body) != _FIXED.size + 8 * count:
        raise ValueError("descriptor's frame count does not fit it")
    sizes = list(struct.unpack_from(f"<{count}Q", body, _FIXED.size))
    name = raw.rstrip(b"\0").decode("ascii", "replace")
    if NAME.fullmatch(name) is None or not 0 < capacity <= RING_MAX_BYTES:
        raise ValueError("descriptor names no ring of this job")
    return name, capacity, start, end, sizes


class Mapped:
    """A receiving socket's mapped rings, by name (at most ``MAX_RINGS``)."""

    def __init__(self):
        self.rings: dict[str, ReceiveRing] = {}

    def get(self, name: str, capacity: int) -> ReceiveRing:
        ring = self.rings.get(name)
        if ring is None:
            if len(self.rings) >= MAX_RINGS:
                raise LaneError(f"more than {MAX_RINGS} shared-memory rings sent to one socket")
            ring = self.rings[name] = ReceiveRing(name, capacity)
        elif ring.capacity != capacity:
            raise LaneError(f"shared-memory ring {name} described with another capacity")
        return ring

    def close(self) -> None:
        for ring in self.rings.values():
            ring.close()
        self.rings.clear()
