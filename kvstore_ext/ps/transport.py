"""Message framing and authentication over ZeroMQ; no store logic lives here.

A message is a list of frames ``[header, auth, buffer...]``: a JSON header, a
32-byte authenticator (a random nonce and a tag), then raw array buffers sent
without copies.  To a peer on this host (``Codec.local_peers``) a message of
256 KB or more is ``[header, auth + descriptor]``: its buffers lie in a
shared-memory ring (:mod:`.shm`), and the tag is the same as on the socket.
The tag is AES-GMAC (AES-GCM over associated data only) under a one-time
AES-128 key derived from the job secret and the nonce (keyed
BLAKE2b), taken over every frame with its length, so a peer without the secret
can neither forge nor alter a message.  Every step moves the whole model, so
the MAC's cost per byte matters: with AES and carry-less multiplication in the
CPU (VAES, VPCLMULQDQ) GMAC runs at about 21 GB/s here, Poly1305 (this
transport's MAC before) at 6 and HMAC-SHA256 at 1.4; without the wide
instructions, GMAC and Poly1305 are level (6.3 and 5.6 GB/s,
docs/performance.md).  Nothing from the network is parsed beyond the header
length before its tag checks out; pickled payloads (optimizers, optimizer
states) are only ever loaded from authenticated messages.

Inside the authenticated header every message also names its sender's session
(a random id per sending socket), a counter that rises by one per message,
and the node it is meant for.  An :class:`Inbox` (one per receiving socket)
rejects a counter it has already passed and a message meant for another
node, so a captured message cannot be played again, here or elsewhere.
Limits are enforced before anything is read into Python: ZeroMQ drops a
connection that announces a frame above ``max_frame_bytes``
(``ZMQ_MAXMSGSIZE``), and :func:`recv_message` stops collecting a message
past ``max_frames`` frames.  Liveness is ZeroMQ's too (:func:`configure`):
ZMTP heartbeats run in ZeroMQ's I/O thread, so a busy event loop or a long
call holding the GIL does not look like a dead peer, while a closed or silent
connection shows up at once as a socket-monitor event.  Before all of this, a
connection is accepted only with the job's handshake password or CURVE key
(:func:`configure`, :class:`HandshakeGuard`): ZeroMQ holds memory for a connection
(its queue, an unfinished message) before Python reads a byte of it.
"""
from __future__ import annotations

import ctypes
import hashlib
import hmac
import itertools
import json
import math
import os
import struct
import threading
from collections import Counter

from dataclasses import dataclass

import numpy as np
import zmq
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .. import jobenv
from . import shm
from .protocol import ALIGN, OWN_FRAME_BYTES, pack_runs

NONCE_BYTES = 16
TAG_BYTES = 16
#: GCM's IV: fixed, because every message has a key of its own (never two messages per key)
_GCM_IV = bytes(12)
#: the most bytes handed to the MAC in one call: ``cryptography`` (46) panics on 2 GiB or more
#: (a PanicException, which is no Exception), and a frame may be that large
#: (``launch.py --max-frame-mb``)
MAC_CHUNK_BYTES = 1 << 30


#: header fields the transport adds: sender session, its counter, the addressee
SESSION, COUNTER, TO = "_sid", "_ctr", "_to"
MAX_HEADER_BYTES = 8 << 20
#: sessions an inbox remembers; only holders of the secret can open one (a job has a few per node)
MAX_SESSIONS = 1 << 16
DEFAULT_MAX_FRAME_BYTES = 512 << 20
DEFAULT_MAX_FRAMES = 4096


_SIXTEEN_FLOATS = np.zeros(16, np.float32)


def clear_vector_upper_state() -> None:
    """Leave this thread's vector registers with clean upper halves (VZEROUPPER).

    OpenSSL's Poly1305 (its AVX2 and AVX-512 code, OpenSSL 3.x here) returns from a short
    input or a partial last block with the upper halves of the vector registers in use.
    Until something clears them, every legacy-SSE instruction the thread runs pays a
    state-transition penalty, and MXNet's own kernels are SSE code: the servers' optimizer
    (``sgd_mom_update``) ran at 3.9 ns an element after a message was sealed or opened
    against 1.2 before (docs/performance.md).  A system call does not clear them; a numpy
    ufunc on float32 runs a loop compiled for AVX, which ends with VZEROUPPER: about a
    microsecond.  On a CPU without AVX there is nothing to clear and this costs the same.
    OpenSSL's GCM (the MAC now) left no such penalty in that test on a CPU with VAES; the
    codec clears them after every tag all the same, for the CPUs and OpenSSL builds where
    an assembly path may not."""
    np.add(_SIXTEEN_FLOATS, _SIXTEEN_FLOATS)


class AuthError(Exception):
    """A message whose authenticator does not match the job secret (or is malformed)."""

    reason = "unauthenticated"


class ReplayError(AuthError):
    """An authenticated message seen before (or older than one seen): a replay."""

    reason = "replayed"


class MisaddressedError(AuthError):
    """An authenticated message meant for another node."""

    reason = "misaddressed"


class MalformedError(AuthError):
    """An authenticated message whose header or frame layout cannot be read."""

    reason = "malformed"


class LimitError(AuthError):
    """A message over the job's size or frame-count limits."""

    reason = "oversized"


def _as_bytes_view(buf):
    """A flat byte view of an array or buffer, without copying."""
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            raise ValueError("array buffers must be C-contiguous")
        return memoryview(buf).cast("B") if buf.ndim else memoryview(buf.reshape(1)).cast("B")
    if isinstance(buf, zmq.Frame):
        buf = buf.buffer
    if isinstance(buf, memoryview):
        return buf if (buf.format == "B" and buf.ndim == 1) else buf.cast("B")
    return memoryview(buf)


class Outbox:
    """A sending socket's session: a random id and a counter that only goes up.

    Messages of one session are sealed and sent in order (the caller sends under
    the lock it already holds for the socket), so the receiver can insist that
    every counter is above the last one it accepted.
    """

    def __init__(self):
        self.session = os.urandom(8).hex()
        self._counter = itertools.count(1)
        #: shared-memory rings to the peers on this host it sends large messages to
        self.lanes = shm.Lanes()

    def stamp(self, header: dict, to: str | None) -> dict:
        stamped = {**header, SESSION: self.session, COUNTER: next(self._counter)}
        if to is not None:
            stamped[TO] = to
        return stamped


class Inbox:
    """A receiving socket's memory of sessions: the last counter accepted from each."""

    def __init__(self, codec: "Codec"):
        self.codec = codec
        self.last: dict[str, int] = {}
        self.mapped = shm.Mapped()   # the rings of the peers on this host that send to it

    def open(self, frames) -> tuple[dict, list]:
        return self.codec.open(frames, self)

    def accept(self, header: dict) -> None:
        """Raise unless ``header`` is for us and newer than its session's last message."""
        names = self.codec.names
        if names and header.get(TO) not in names:
            raise MisaddressedError(f"message for {header.get(TO)!r}, not for this node")
        session, counter = header.get(SESSION), header.get(COUNTER)
        if not isinstance(session, str) or len(session) > 64 or isinstance(counter, bool) \
                or not isinstance(counter, int):
            raise MalformedError("malformed header: no session or counter")
        last = self.last.get(session)
        if last is None and len(self.last) >= MAX_SESSIONS:
            raise LimitError("too many sessions")
        if last is not None and counter <= last:
            raise ReplayError(f"message {counter} of session {session} is not newer than "
                              f"{last}: a replay")
        self.last[session] = counter


class Codec:
    """Seals and opens messages with the job's secret.

    ``names``: what this node answers to (``"scheduler"``, ``"server:0"``, ...); a
    message addressed elsewhere is refused.  ``rejected`` counts refusals by reason.
    """

    def __init__(self, secret: bytes, names=(), max_frame_bytes: int = 0):
        if len(secret) < 16:
            raise ValueError("the job secret must hold at least 16 bytes")
        self._secret = bytes(secret[:64])
        #: arrays that lie side by side travel as one frame up to this size, the receivers'
        #: limit (``Limits.max_frame_bytes``)
        self.max_frame_bytes = max_frame_bytes or DEFAULT_MAX_FRAME_BYTES
        self.names: set[str] = set(names)
        self.rejected: Counter = Counter()
        #: the peers (node names) on this host: large messages to them go by shared memory
        self.local_peers: set[str] = set()
        #: messages sent and received through shared-memory lanes
        self.lane_messages = Counter()
        self._lane_key = shm.descriptor_key(self._secret)
        self._outboxes: list[Outbox] = []
        self._inboxes: list[Inbox] = []
        self._default_outbox = self.outbox()
        self._default_inbox = self.inbox()
        self._lock = threading.Lock()

    def worth_logging(self, exc: AuthError) -> bool:
        """Log the first few refusals of each kind, then one in a thousand: a flood of bad
        messages must not become a flood of log lines."""
        n = self.rejected[exc.reason]
        return n <= 5 or n % 1000 == 0

    def outbox(self) -> Outbox:
        box = Outbox()
        self._outboxes.append(box)
        return box

    def inbox(self) -> Inbox:
        box = Inbox(self)
        self._inboxes.append(box)
        return box

    def close(self) -> None:
        """Unlink and unmap the shared-memory rings of its outboxes and inboxes."""
        for box in self._outboxes:
            box.lanes.close()
        for box in self._inboxes:
            box.mapped.close()

    def _tag(self, nonce: bytes, head: bytes, buffers) -> bytes:
        """AES-GMAC of ``len(head), head, (len(buffer), buffer)...`` (lengths as 8 bytes,
        little-endian) under the message's one-time key."""
        key = hashlib.blake2b(nonce, key=self._secret, digest_size=16).digest()
        first = struct.pack("<Q", len(head)) + head
        if not buffers:   # one call: a third of the setup of the streaming object
            tag = AESGCM(key).encrypt(_GCM_IV, b"", first)
        else:
            mac = Cipher(algorithms.AES(key), modes.GCM(_GCM_IV)).encryptor()
            mac.authenticate_additional_data(first)
            for buf in buffers:
                view = _as_bytes_view(buf)
                mac.authenticate_additional_data(struct.pack("<Q", view.nbytes))
                for start in range(0, view.nbytes, MAC_CHUNK_BYTES):
                    mac.authenticate_additional_data(view[start:start + MAC_CHUNK_BYTES])
            mac.finalize()
            tag = mac.tag
        clear_vector_upper_state()
        return tag

    def packed(self, buffers) -> "Packed":
        """``buffers`` cut into this codec's frames once, for several messages to carry."""
        return Packed(buffers, self.max_frame_bytes)

    def seal(self, header: dict, buffers=(), to: str | None = None,
             outbox: Outbox | None = None) -> list:
        """Frames for ``header`` and ``buffers`` (arrays, or a :class:`Packed`), sent from
        ``outbox`` (its session and next counter go into the authenticated header) to the
        node named ``to``."""
        header = (outbox or self._default_outbox).stamp(header, to)
        if not isinstance(buffers, Packed):
            buffers = self.packed(buffers)
        head = json.dumps(header, separators=(",", ":"))
        if buffers.layout_json is not None:    # the header stamped: never "{}"
            head = f'{head[:-1]},"{LAYOUT}":{buffers.layout_json}}}'
        head = head.encode()
        nonce = os.urandom(NONCE_BYTES)
        if to in self.local_peers:
            frames = self._by_lane(head, nonce, buffers.frames, to, outbox or self._default_outbox)
            if frames is not None:
                return frames
        return [head, nonce + self._tag(nonce, head, buffers.frames), *buffers.frames]

    def _by_lane(self, head: bytes, nonce: bytes, frames, to: str, outbox: Outbox):
        """The message with its data frames in ``outbox``'s ring to ``to``: header and
        authenticator, the descriptor after the tag; None when it goes on the socket."""
        views = [_as_bytes_view(f) for f in frames]
        nbytes = shm.frames_bytes(views)
        if nbytes < shm.MIN_BYTES or len(views) > shm.MAX_FRAMES:
            return None
        ring = outbox.lanes.ring(to, nbytes)
        placed = ring.write(views) if ring is not None else None
        if placed is None:
            return None
        self.lane_messages["sent"] += 1
        tag = self._tag(nonce, head, ring.views(placed[0], placed[2]))
        return [head, nonce + tag + shm.describe(self._lane_key, nonce, ring, placed)]

    def open(self, frames, inbox: Inbox | None = None) -> tuple[dict, list[memoryview]]:
        """Check the authenticator, then parse, then the session counter and addressee;
        raises :class:`AuthError` (or a subclass) and counts it on any mismatch."""
        try:
            return self._open(frames, inbox or self._default_inbox)
        except AuthError as exc:
            with self._lock:
                self.rejected[exc.reason] += 1
            raise

    def _from_lane(self, auth: bytes, inbox: Inbox) -> list:
        """Copies of a lane message's data frames, taken (and released) from the ring its
        authenticated descriptor names; the message's tag is checked over them after."""
        nonce = auth[:NONCE_BYTES]
        try:
            name, capacity, start, end, sizes = shm.read_descriptor(
                self._lane_key, nonce, auth[NONCE_BYTES + TAG_BYTES:])
        except shm.UnauthenticDescriptor as exc:
            raise AuthError(str(exc)) from None
        except ValueError as exc:
            raise MalformedError(f"malformed message: {exc}") from None
        try:
            buffers = inbox.mapped.get(name, capacity).take(start, end, sizes)
        except shm.LaneError as exc:
            raise MalformedError(str(exc)) from None
        self.lane_messages["received"] += 1
        return buffers

    def _open(self, frames, inbox: Inbox):
        if len(frames) < 2:
            raise AuthError("malformed message: fewer than two frames")
        head = _frame_bytes(frames[0])
        auth = _frame_bytes(frames[1])
        if len(auth) < NONCE_BYTES + TAG_BYTES:
            raise AuthError("malformed message: bad authenticator length")
        if len(head) > MAX_HEADER_BYTES:
            raise LimitError(f"header of {len(head)} bytes")
        if len(auth) > NONCE_BYTES + TAG_BYTES:   # its data frames in a shared-memory lane
            if len(frames) != 2:
                raise AuthError("malformed message: a lane's message with data frames")
            buffers = self._from_lane(auth, inbox)
            auth = auth[:NONCE_BYTES + TAG_BYTES]
        else:
            buffers = [_as_bytes_view(f) for f in frames[2:]]
        expected = self._tag(auth[:NONCE_BYTES], head, buffers)
        if not hmac.compare_digest(expected, auth[NONCE_BYTES:]):
            raise AuthError("message not authenticated with the job secret")
        try:
            header = json.loads(head)
        except (ValueError, RecursionError):
            raise MalformedError("malformed header") from None
        if not isinstance(header, dict):
            raise MalformedError("malformed header")
        inbox.accept(header)
        for field in (SESSION, COUNTER, TO):
            header.pop(field, None)
        layout = header.pop(LAYOUT, None)
        if layout is not None:
            try:
                buffers = [buffers[f][off:off + n] for f, off, n in layout]
                if any(len(b) != n for b, (_, _, n) in zip(buffers, layout)):
                    raise ValueError
            except (TypeError, ValueError, IndexError):
                raise MalformedError("malformed layout: it does not fit the data frames") from None
        return header, buffers


LAYOUT = "_layout"
_PADS = [bytes(n) for n in range(ALIGN)]


class Packed:
    """A message's arrays cut into frames (:func:`pack`), with the layout that goes into its
    header, made once for messages that carry the same arrays: a round's replies to its
    workers differ only in their headers (the frames are views: the arrays must not change
    while the messages are in flight)."""

    __slots__ = ("arrays", "frames", "layout_json", "sizes")

    def __init__(self, buffers, limit: int = DEFAULT_MAX_FRAME_BYTES):
        self.arrays = list(buffers)
        views = [_as_bytes_view(b) for b in self.arrays]
        self.sizes = [v.nbytes for v in views]     # each array's bytes (the limits' check)
        if len(views) > 1:
            # small arrays travel together in one frame (a copy is cheaper than a frame each);
            # large ones keep a frame of their own and are sent without a copy
            layout, self.frames = pack(views, limit)
            self.layout_json = json.dumps(layout, separators=(",", ":"))
        else:
            self.frames, self.layout_json = views, None

    def __len__(self) -> int:
        """The arrays (not frames) it carries."""
        return len(self.sizes)

    def __iter__(self):
        """The arrays it was made of (a :meth:`RegionLayout.packed` message has only bytes)."""
        if self.arrays is None:
            raise TypeError("a message cut from a region holds no arrays")
        return iter(self.arrays)


class RegionLayout:
    """How :class:`Packed` cuts arrays that lie at fixed offsets of one region of memory
    (a worker's gradients, staged side by side), worked out once: a message of another
    region of that size is then cut the same way, its frames views of that region, with no
    work per array (for ResNet-20's 65 gradients :class:`Packed` costs ~0.2 ms a message).

    ``offsets``, ``sizes`` (bytes) and ``dtypes`` say where each array lies in a region of
    ``total`` bytes.  ``usable`` is False when :func:`pack` would copy some of them into a
    frame of their own making (small arrays that do not lie back to back): such a message
    has to be packed from its arrays each time.
    """

    __slots__ = ("usable", "_spans", "_layout_json", "_sizes")

    def __init__(self, offsets, sizes, dtypes, total: int, limit: int = DEFAULT_MAX_FRAME_BYTES):
        probe = np.empty(total, np.uint8)
        base = probe.ctypes.data
        model = Packed([probe[o:o + n].view(d) for o, n, d in zip(offsets, sizes, dtypes)], limit)
        frames = model.frames[1:] if model.layout_json is not None else model.frames
        spans = [(_address(f) - base, f.nbytes) if f.nbytes else (0, 0) for f in frames]
        self.usable = (model.layout_json is None or len(model.frames[0]) == 0) and all(
            0 <= start and start + n <= total for start, n in spans)
        self._spans = spans if self.usable else []
        self._layout_json, self._sizes = model.layout_json, model.sizes

    def packed(self, region: np.ndarray) -> Packed:
        """The message of ``region`` (``total`` bytes, C-contiguous), as :class:`Packed`
        would cut it from the arrays that lie in it."""
        whole = memoryview(region).cast("B")
        frames = [whole[start:start + n] for start, n in self._spans]
        out = Packed.__new__(Packed)
        out.arrays, out.sizes, out.layout_json = None, self._sizes, self._layout_json
        out.frames = [b"", *frames] if self._layout_json is not None else frames
        return out


def pack(views, limit: int = DEFAULT_MAX_FRAME_BYTES) -> tuple[list, list]:
    """Frames for byte views, and where each view lies: ``[frame, offset, nbytes]``.

    Views that lie back to back in one array's memory (a server's reply, copied one run of
    blocks at a time; a worker's gradients, staged side by side) and hold at least
    ``OWN_FRAME_BYTES`` together travel as one frame, a view of that memory sent without a
    copy (``protocol.pack_runs`` says where), up to ``limit`` bytes (the receivers' frame
    limit): one frame for a whole model, where it took a frame per large array and a copy of
    every small one.  Other views of at least ``OWN_FRAME_BYTES`` are frames of their own;
    the rest are copied into frame 0, each at an offset aligned for any dtype, the gaps
    zeroed.  Frame 0 is one ``bytes.join`` of the small views and their pads: one C
    loop of copies, where a numpy slice assignment per view cost a server ~1.5 µs each.
    """
    layout, frames, small, offset = [], [None], [], 0
    places = [(_address(v), v.nbytes, _itemsize(v)) for v in views]
    for first, stop, together in pack_runs(places, limit):
        memory = _memory(views[first], places[first][0],
                         places[stop - 1][0] + places[stop - 1][1]) if together else None
        if memory is not None:
            index, at = len(frames), 0
            frames.append(memory)
            for v in views[first:stop]:
                layout.append([index, at, v.nbytes])
                at += v.nbytes
            continue
        for v in views[first:stop]:
            n = v.nbytes
            if n >= OWN_FRAME_BYTES:     # protocol.own_frame, inline on the hot path
                layout.append([len(frames), 0, n])
                frames.append(v)
            else:
                layout.append([0, offset, n])
                small.append(v)
                pad = -n % ALIGN
                if pad:
                    small.append(_PADS[pad])
                offset += n + pad
    frames[0] = b"".join(small)
    return layout, frames


def _memory(view, start: int, end: int):
    """A byte view of ``start:end`` in the memory of the numpy array ``view`` was taken of,
    or None when that array does not hold all of it (arrays side by side in memory can be
    two allocations)."""
    root = view.obj
    while isinstance(root, np.ndarray) and isinstance(root.base, np.ndarray):
        root = root.base
    if not isinstance(root, np.ndarray) or not root.flags.c_contiguous:
        return None
    whole = memoryview(root.reshape(-1)).cast("B")
    base = _address(whole)
    if base < 0 or start < base or end > base + whole.nbytes:
        return None
    return whole[start - base:end - base]


def _address(view) -> int:
    """Where a writable byte view's memory begins; -1 when it cannot be told (read-only,
    empty)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    except (TypeError, ValueError):
        return -1


def _itemsize(view) -> int:
    """The item size of the array a byte view was taken of (its alignment), at most 8."""
    obj = view.obj
    return min(obj.itemsize, ALIGN) if isinstance(obj, np.ndarray) and obj.itemsize else 1


def _frame_bytes(frame) -> bytes:
    if isinstance(frame, zmq.Frame):
        return frame.bytes
    return bytes(frame)


def array_from_buffer(buf, dtype, shape) -> np.ndarray:
    """A read-only numpy view of a received buffer, checked against its declared size."""
    dt = np.dtype(dtype)
    count = math.prod(shape)
    if buf.nbytes != count * dt.itemsize:
        raise ValueError(f"buffer holds {buf.nbytes} bytes, but {tuple(shape)} {dt.name} needs "
                         f"{count * dt.itemsize}")
    return np.frombuffer(buf, dtype=dt).reshape(shape)


def new_context() -> zmq.Context:
    ctx = zmq.Context()
    ctx.setsockopt(zmq.LINGER, 0)
    return ctx


@dataclass(frozen=True)
class Limits:
    """What one job's sockets accept and how they watch their peers."""

    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_frames: int = DEFAULT_MAX_FRAMES
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 10.0
    #: ZeroMQ CURVE secret key (Z85) of the job, or None: plain TCP with per-message tags
    curve_key: bytes | None = None
    #: without CURVE, the password (derived from the job secret) of ZeroMQ's PLAIN handshake,
    #: or None: every peer may connect
    handshake_password: bytes | None = None

    @classmethod
    def for_job(cls, env) -> "Limits":
        """The limits of the job a :class:`~kvstore_ext.jobenv.JobEnv` describes."""
        return cls.from_environ(env.heartbeat_interval, env.heartbeat_timeout, env.secret)

    @classmethod
    def from_environ(cls, heartbeat_interval: float = 1.0, heartbeat_timeout: float = 10.0,
                     secret: bytes | None = None):
        frame_mb = float(os.environ.get(jobenv.MAX_FRAME_MB) or DEFAULT_MAX_FRAME_BYTES / 2 ** 20)
        frames = int(os.environ.get(jobenv.MAX_FRAMES) or DEFAULT_MAX_FRAMES)
        if frame_mb <= 0 or frames < 4:
            raise ValueError(f"{jobenv.MAX_FRAME_MB} must be > 0 and {jobenv.MAX_FRAMES} >= 4, "
                             f"got {frame_mb} and {frames}")
        curve = os.environ.get(jobenv.CURVE, "0") not in ("", "0")
        if curve and not secret:
            raise ValueError(f"{jobenv.CURVE} needs the job secret")
        key = curve_secret_key(secret) if curve else None
        password = handshake_password(secret) if secret and not curve else None
        return cls(int(frame_mb * 2 ** 20), frames, heartbeat_interval, heartbeat_timeout, key,
                   password)


def curve_secret_key(secret: bytes) -> bytes:
    """The job's CURVE key pair is derived from its secret: every node holds it, nobody
    without the secret can complete a handshake (and so send a single byte)."""
    from zmq.utils import z85
    return z85.encode(hashlib.blake2b(secret, digest_size=32, person=b"kvx-curve").digest())


#: ZAP domain and PLAIN user name of every job's handshake (the password is the job's own)
HANDSHAKE_DOMAIN = "kvstore_ext"
HANDSHAKE_USER = b"kvstore_ext"


def handshake_password(secret: bytes) -> bytes:
    """The password of the job's PLAIN handshake: one-way from the secret, so seeing it on
    the wire lets a peer connect but never forge a message (the tags need the secret)."""
    return hashlib.blake2b(secret, digest_size=32, person=b"kvx-plain").hexdigest().encode()


def configure(sock: zmq.Socket, limits: Limits) -> zmq.Socket:
    """Size limit, ZMTP heartbeats and the handshake on a socket (before it binds or connects).

    The heartbeats are answered by ZeroMQ's I/O thread, which needs no GIL: a
    peer is only timed out when its process is gone or its host unreachable.
    With CURVE, every connection is authenticated and encrypted by ZeroMQ
    (binding sockets are CURVE servers); a peer without the job's key is refused
    during the handshake, before any of its messages is read or held.  Without
    CURVE, binding sockets are PLAIN servers whose :class:`HandshakeGuard` refuses a
    peer without the job's password the same way, at no cost per byte: ZeroMQ holds
    nothing for a connection it has not accepted (an unfinished message of large
    frames, a queue per reconnecting socket).  The password crosses the network in
    clear, so a peer that can read the job's traffic gets past it; the per-message tags
    and counters still refuse all it sends.
    """
    if limits.curve_key is not None:
        public = zmq.curve_public(limits.curve_key)
        if sock.type == zmq.ROUTER:
            sock.curve_server = True
            sock.curve_secretkey = limits.curve_key
        else:
            sock.curve_serverkey = public
            sock.curve_publickey = public
            sock.curve_secretkey = limits.curve_key
    elif limits.handshake_password is not None:
        if sock.type == zmq.ROUTER:
            sock.plain_server = True
            sock.zap_domain = HANDSHAKE_DOMAIN.encode()
        else:
            sock.plain_username = HANDSHAKE_USER
            sock.plain_password = limits.handshake_password
    sock.setsockopt(zmq.MAXMSGSIZE, limits.max_frame_bytes)
    sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, int(limits.heartbeat_interval * 1000)))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(1, int(limits.heartbeat_timeout * 1000)))
    sock.setsockopt(zmq.HEARTBEAT_TTL, max(100, int(limits.heartbeat_timeout * 1000)))
    # heartbeats start once the handshake is done: a peer that froze before it (a server
    # stopped right after it registered) is timed out by this instead (ZeroMQ's default: 30 s)
    sock.setsockopt(zmq.HANDSHAKE_IVL, max(1, int(limits.heartbeat_timeout * 1000)))
    return sock


#: socket-monitor events of a connection the peer refused at the handshake: not the job's
#: password (or key), or CURVE on one side only
HANDSHAKE_REFUSED = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
#: and every handshake that failed (a malformed greeting, one that did not finish in time)
HANDSHAKE_FAILED = HANDSHAKE_REFUSED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL


def destroy(ctx: zmq.Context) -> None:
    """Close ``ctx``'s sockets, dropping what they still queue, and end it."""
    ctx.destroy(0)


def queue(sock: zmq.Socket, frames: list, copy: bool = True) -> bool:
    """Queue ``frames`` on ``sock`` without blocking; False when it cannot take them now (its
    queue is full, or it has no connection to queue them on), and they must be sent again.
    A blocking send on such a socket can wait forever: after a peer refused it at the
    handshake, ZeroMQ keeps no connection to queue on, and a full queue to a peer that died
    does not empty."""
    try:
        sock.send_multipart(frames, zmq.NOBLOCK, copy=copy)
    except zmq.Again:
        return False
    return True


def monitor_events(monitor) -> list[int]:
    """The events a socket monitor reported since the last look, in order."""
    from zmq.utils.monitor import recv_monitor_message
    seen = []
    while True:
        try:
            seen.append(recv_monitor_message(monitor, zmq.NOBLOCK)["event"])
        except zmq.Again:
            return seen


def disconnected(monitor) -> bool:
    """Whether the socket a monitor watches lost a connection since the last look."""
    return zmq.EVENT_DISCONNECTED in monitor_events(monitor)


class HandshakeGuard:
    """The handshake of one context's binding sockets.  Without CURVE it runs ZeroMQ's
    authentication handler (ZAP), which checks the PLAIN password of each new connection
    in a thread of its own, at connection time only; start it before the sockets bind
    (without it ZeroMQ refuses every PLAIN peer).  ``refused`` counts the connections
    refused at the handshake, as the sockets' monitors report them (:meth:`note`)."""

    def __init__(self, ctx: zmq.Context, limits: Limits):
        self.refused = 0
        self._auth = None
        if limits.curve_key is None and limits.handshake_password is not None:
            from zmq.auth.thread import ThreadAuthenticator

            class Authenticator(ThreadAuthenticator):
                def _authenticate_plain(self, domain, username, password):
                    # in constant time, unlike the library's ==
                    ok = (domain == HANDSHAKE_DOMAIN
                          and hmac.compare_digest(username.encode(), HANDSHAKE_USER)
                          and hmac.compare_digest(password.encode(), limits.handshake_password))
                    return ok, b"" if ok else b"not this job's handshake password"

            self._auth = Authenticator(ctx)
            self._auth.start()

    def note(self, event: int) -> bool:
        """Count ``event`` (a socket-monitor event) if it is a refused handshake."""
        refused = bool(event & HANDSHAKE_FAILED)
        self.refused += refused
        return refused

    def stop(self) -> None:
        """Stop the handler thread (before its context is destroyed)."""
        if self._auth is not None:
            self._auth.stop()
            self._auth = None


def recv_message(sock: zmq.Socket, max_frames: int):
    """One whole message as frames (no copy), or raise :class:`LimitError` once it is
    known to hold more than ``max_frames`` frames (the rest is read and dropped)."""
    frames = [sock.recv(zmq.NOBLOCK, copy=False)]
    while frames[-1].more:
        if len(frames) >= max_frames:
            sink = bytearray(256)
            dropped = 0
            while sock.getsockopt(zmq.RCVMORE):
                sock.recv_into(sink)
                dropped += 1
            raise LimitError(f"message of more than {max_frames} frames ({len(frames) + dropped})")
        frames.append(sock.recv(copy=False))
    return frames


def receive_until(sock: zmq.Socket, inbox: Inbox, deadline: float):
    """The next authentic message on ``sock`` (others are dropped), or None at ``deadline``
    (a ``time.monotonic()`` time)."""
    import time
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not sock.poll(int(left * 1000)):
            return None
        try:
            return inbox.open(sock.recv_multipart())
        except AuthError:
            continue


def message_size_problem(sizes: list[int], limits: Limits) -> str | None:
    """Why a message of buffers of ``sizes`` bytes would be refused by its receiver, or None."""
    big = [n for n in sizes if n > limits.max_frame_bytes]
    if big:
        return (f"an array of {big[0]} bytes is over the job's frame limit of "
                f"{limits.max_frame_bytes} bytes (raise launch.py --max-frame-mb, or use more "
                f"servers so that large keys are split)")
    if len(sizes) + 4 > limits.max_frames:
        return (f"{len(sizes)} arrays in one message are over the job's limit of "
                f"{limits.max_frames} frames (launch.py --max-frames)")
    return None


def bind_random(sock: zmq.Socket, host: str) -> int:
    """Bind to ``host`` (the address the job names) on a free port; return the port."""
    return sock.bind_to_random_port(f"tcp://{host}", min_port=20000, max_port=60000, max_tries=200)
