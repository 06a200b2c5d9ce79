"""How a worker or a server joins its job: its registration goes to the scheduler, and it
waits for the job to start while it watches its connection.

The connection is watched because ZeroMQ hides what happens on it: a scheduler that refuses
this process at the handshake (another job's, or a wrong secret) closes the connection for
good, and a blocking send on a socket with no connection left waits forever.  The
registration is therefore queued without blocking, again and again until it goes, and each
pass reads the connection's monitor: a refusal, a closed connection, or nothing answering at
all each end the wait with an error that says which.
"""
from __future__ import annotations

import sys
import time

import zmq

from .. import jobenv
from ..errors import JobAbortedError, KVStoreError, SchedulerLostError
from .protocol import Op
from .transport import HANDSHAKE_REFUSED, AuthError, monitor_events, queue

#: seconds a registering node waits without any answer from the scheduler before it says so
NO_SCHEDULER_NOTE_S = 10.0
#: handshakes that failed without a reason given that count as a refusal (one alone can be a
#: connection cut during its handshake)
NO_DETAIL_REFUSAL = 3
#: seconds within which ZeroMQ makes a new connection after one failed (it waits 0.1 s)
RECONNECT_GRACE_S = 1.0
#: the monitor events :func:`join` reads
EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | HANDSHAKE_REFUSED
          | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_SUCCEEDED)


def connection_lost(who: str, heartbeat_timeout: float) -> str:
    """What a lost connection to ``who`` means, for the error it raises."""
    return (f"{who} closed its connection: it exited or was killed, or its host stopped "
            f"answering for {heartbeat_timeout:g} s")


def join(sock: zmq.Socket, inbox, registration: list, monitor: zmq.Socket, env,
         role: str) -> dict:
    """Send ``registration`` (sealed frames) to the scheduler on ``sock`` and return the
    scheduler's answer: the job's topology.  ``monitor`` watches ``sock`` for :data:`EVENTS`.
    Raises :class:`JobAbortedError` when the scheduler refuses this node, and a
    :class:`KVStoreError` (:class:`SchedulerLostError` when the connection closed) when the
    job cannot start, by ``env.start_timeout``."""
    start_timeout = env.start_timeout
    address = env.scheduler_address
    scheduler = f"the scheduler at {address}"
    deadline = time.monotonic() + start_timeout
    note_at = time.monotonic() + min(NO_SCHEDULER_NOTE_S, start_timeout / 2)
    unsent = registration
    reached = False       # a scheduler of this job answered the connection
    failed = 0            # handshakes that failed without a reason given
    connected_at = time.monotonic()   # when the last connection was made (its handshake began)
    cut_at = None         # when a connection was cut during its handshake, until the next one
    poller = zmq.Poller()   # an answer, and the connection's events, are each seen at once
    poller.register(sock, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    while True:
        if unsent is not None and queue(sock, unsent):
            unsent = None
        wait = max(0.0, min(deadline - time.monotonic(), 0.05 if unsent is not None else 0.2))
        if sock in dict(poller.poll(int(wait * 1000))):
            try:
                header, _ = inbox.open(sock.recv_multipart())
            except AuthError:
                header = None   # not from the job's scheduler: dropped
            if header is not None and header["op"] == Op.ABORT:
                raise JobAbortedError(header["error"])
            if header is not None:
                return header
        events = monitor_events(monitor)
        reached = reached or zmq.EVENT_HANDSHAKE_SUCCEEDED in events
        for event in events:   # in order: a cut, then a new connection, is no cut
            if event == zmq.EVENT_CONNECTED:
                connected_at, cut_at = time.monotonic(), None
            elif event == zmq.EVENT_DISCONNECTED:
                cut_at = cut_at or time.monotonic()
        if not reached and note_at and time.monotonic() >= note_at:
            note_at = 0   # said once: the wait is not silent
            print(f"kvstore_ext {role}: nothing answers at {address} yet; waiting up to "
                  f"{start_timeout:g} s for the job's scheduler (launch.py --start-timeout)",
                  file=sys.stderr, flush=True)
        failed += sum(1 for event in events if event & zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        # ZeroMQ connects again after a connection fails, except after a refusal (a protocol
        # error): a cut not followed by a new connection soon was one, its reason unsaid
        not_again = cut_at is not None and time.monotonic() - cut_at >= RECONNECT_GRACE_S
        if any(event & HANDSHAKE_REFUSED for event in events) or failed >= NO_DETAIL_REFUSAL \
                or (not_again and not reached):
            raise KVStoreError(
                f"{scheduler} refused this process's connection at the handshake: it belongs "
                f"to another job, or this process's {jobenv.SECRET} (or {jobenv.CURVE}) is "
                f"not the job's")
        # gone, or frozen: a scheduler that took the connection, or one that did not end its
        # handshake in time (a refusal can also cut the connection at once, without saying
        # why: ZeroMQ connects again, and the next handshake tells)
        if zmq.EVENT_DISCONNECTED in events and (
                reached or time.monotonic() - connected_at >= env.heartbeat_timeout / 2):
            raise SchedulerLostError(f"{connection_lost(scheduler, env.heartbeat_timeout)} "
                                     f"before the job started")
        if time.monotonic() >= deadline and not reached:
            raise KVStoreError(f"nothing answered at {address} in {start_timeout:g} s: no "
                               f"scheduler of this job runs there (the job has ended, or its "
                               f"launcher has not started it; launch.py --start-timeout)")
        if time.monotonic() >= deadline:
            raise KVStoreError(f"{scheduler} did not start the job within {start_timeout:g} s "
                               f"(launch.py --start-timeout; are all {env.num_workers} workers "
                               f"and {env.num_servers} servers running?)")
