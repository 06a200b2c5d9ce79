"""Which peer a stalled allreduce waits for: each worker's progress, kept on the job's
Gloo rendezvous server.

An allreduce that does not end says only that some rank is missing: Gloo's timeout names
an address at best, and Horovod's stall check cannot run while its own negotiation waits for
the missing rank.  So each worker's stall reporter, which wakes every few seconds anyway,
also puts on the rendezvous server that started the job (the launcher's, or horovodrun's:
``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``PORT``) the newest step whose allreduces it has started
and a count of its looks, a heartbeat.  While one of its own allreduces runs long, it reads
the others' and remembers when each one's count last moved.  A stall report, or the error of
a collective that failed, then names the ranks it waits for: one not heard from (a frozen
process or host, or the link to it), or one alive that has not started the step (busy
elsewhere, or hung in its script).

A value is a small JSON object, authenticated with the job's secret (``KVX_SECRET``, which
``launch.py`` gives every Horovod job on one machine; over several hosts only the user's, as
horovodrun would put a secret made here on ssh's command line) when there is one; one that is not what a worker
writes, too long, unauthenticated, or older than one seen (a replay) is ignored.  It only
feeds a message: nothing here can stop or slow the job, and a server that does not answer
costs each look at most ``TIMEOUT_S``.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import urllib.error
import urllib.request

from .. import jobenv

#: the rendezvous server's scope that holds the workers' progress
SCOPE = "kvstore_ext_progress"
#: seconds one request to the rendezvous server may take
TIMEOUT_S = 2.0
#: the longest value read (a worker writes under 200 bytes)
MAX_VALUE_BYTES = 1024


class Peer:
    """What this worker last read of another: its newest step, its heartbeat count, when
    (this worker's clock) the count was first seen at that value, and whether it has moved
    since the first read (only then is the peer known to be alive)."""

    __slots__ = ("step", "beat", "since", "moved")

    def __init__(self, step: int, beat: int, since: float):
        self.step, self.beat, self.since, self.moved = step, beat, since, False


class ProgressBoard:
    """This worker's progress put on the rendezvous server, and the others' read from it.

    ``name`` tells the stores of one process apart (each store's workers publish under it).
    """

    def __init__(self, address: str, port: int, rank: int, size: int, name: str,
                 secret: bytes | None = None, timeout: float = TIMEOUT_S):
        self.url = f"http://{address}:{int(port)}/{SCOPE}"
        self.rank, self.size, self.name = rank, size, name
        self.secret = secret
        self.timeout = timeout
        self.beat = 0
        self.peers: dict[int, Peer] = {}
        self.first_read: float | None = None    # when the reads of this stall began

    @classmethod
    def from_environ(cls, rank: int, size: int, name: str, environ=None):
        """The board of a job started by ``launch.py --launcher horovod`` or ``horovodrun``;
        None without a rendezvous server (``mpirun``) or with one worker."""
        env = os.environ if environ is None else environ
        address = env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
        port = env.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
        if size < 2 or not address or not (port or "").isdigit():
            return None
        try:        # none, or not one launch.py makes: the values go unauthenticated
            secret = jobenv.parse_secret(env.get(jobenv.SECRET, ""))
        except ValueError:
            secret = None
        return cls(address, int(port), rank, size, name, secret)

    # -- the value -------------------------------------------------------------------------------
    def _tag(self, rank: int, step: int, beat: int) -> str:
        body = f"{self.name}/{rank}/{step}/{beat}".encode()
        return hmac.new(self.secret, body, hashlib.sha256).hexdigest()

    def encode(self, step: int) -> bytes:
        value = {"rank": self.rank, "step": int(step), "beat": self.beat}
        if self.secret is not None:
            value["tag"] = self._tag(self.rank, int(step), self.beat)
        return json.dumps(value, separators=(",", ":")).encode()

    def decode(self, rank: int, raw: bytes) -> tuple[int, int] | None:
        """``(step, beat)`` of a value ``rank`` wrote, or None for anything else."""
        if not raw or len(raw) > MAX_VALUE_BYTES:
            return None
        try:
            value = json.loads(raw)
            step, beat = value["step"], value["beat"]
        except (ValueError, TypeError, KeyError, RecursionError):
            return None
        if not (type(step) is int and type(beat) is int and value.get("rank") == rank
                and -1 <= step < 1 << 62 and 0 <= beat < 1 << 62):
            return None
        if self.secret is not None:
            tag = value.get("tag")
            if not isinstance(tag, str) or not hmac.compare_digest(
                    tag.encode("utf-8", "replace"), self._tag(rank, step, beat).encode()):
                return None
        return step, beat

    # -- the server ------------------------------------------------------------------------------
    def _key_url(self, rank: int) -> str:
        return f"{self.url}/{self.name}.{rank}"

    def publish(self, step: int) -> bool:
        """Put this worker's newest step and its next heartbeat; False if the server did not
        take it."""
        self.beat += 1
        request = urllib.request.Request(self._key_url(self.rank), data=self.encode(step),
                                         method="PUT")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                return answer.status == 200
        except (OSError, ValueError):
            return False

    def _read(self, rank: int) -> tuple[int, int] | None:
        """``rank``'s value, or None; raises ``OSError`` if the server did not answer."""
        try:
            with urllib.request.urlopen(self._key_url(rank), timeout=self.timeout) as answer:
                raw = answer.read(MAX_VALUE_BYTES + 1)
        except urllib.error.HTTPError:       # it answered: nothing put yet (404), or refused
            return None
        except ValueError:
            return None
        return self.decode(rank, raw)

    def observe(self, now: float) -> None:
        """Read every other worker's value; remember when each heartbeat count moved."""
        if self.first_read is None:
            self.first_read = now
        for rank in range(self.size):
            if rank == self.rank:
                continue
            try:
                got = self._read(rank)
            except OSError:                # not answering: no more waits on it this look
                return
            if got is None:
                continue
            step, beat = got
            peer = self.peers.get(rank)
            if peer is None:
                self.peers[rank] = Peer(step, beat, now)
            elif beat > peer.beat:          # older or equal: a replay, or nothing new
                peer.step, peer.beat, peer.since, peer.moved = step, beat, now, True

    def settle(self) -> None:
        """The stall is over: the next one starts its reads afresh."""
        self.first_read = None
        self.peers.clear()

    def describe(self, step: int, now: float, silent_after: float) -> str:
        """One sentence naming the workers this one waits for at ``step``: those whose
        heartbeat has not moved for ``silent_after`` seconds or more of reads, and those heard
        from since (their heartbeat moved) that have not started ``step``.  Empty before any
        read, or while some peer's heartbeat has been read for less than that and not moved
        (too soon to tell)."""
        if self.first_read is None:
            return ""
        silent, behind, unsure = [], [], False
        for rank in range(self.size):
            if rank == self.rank:
                continue
            peer = self.peers.get(rank)
            quiet = now - (self.first_read if peer is None else peer.since)
            if quiet >= silent_after:
                newest = "" if peer is None else f" (its newest allreduce: step {peer.step})"
                silent.append(f"worker {rank} not heard from in the last "
                              f"{_seconds(quiet)}{newest}")
            elif peer is None or not peer.moved:
                unsure = True
            elif peer.step < step:
                behind.append(f"worker {rank} heard from {_seconds(quiet)} ago, its newest "
                              f"allreduce at step {peer.step}")
        if silent or behind:
            return "Waiting for: " + "; ".join(silent + behind) + "."
        if unsure:
            return ""
        return (f"Every other worker was heard from in the last {_seconds(silent_after)} and "
                f"has started step {step} (their progress on the rendezvous server): the wait "
                f"is in the collective or the link.")


def _seconds(x: float) -> str:
    return f"{x:.1f} s" if x < 10 else f"{x:.0f} s"
