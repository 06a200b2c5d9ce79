"""Shared-memory lanes (ps.shm) through the real codec: real rings in /dev/shm, two codecs
sharing the job's secret as a sender and a receiver would."""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kvstore_ext.ps import shm
from kvstore_ext.ps.transport import AuthError, Codec, MalformedError, ReplayError

SECRET = b"lane-test-secret-0123456789abcdef"

pytestmark = pytest.mark.skipif(shm.host_token() is None, reason="no /dev/shm on this host")


def ours() -> set:
    """This process's rings in /dev/shm."""
    mine = f"kvx-{os.geteuid()}-{shm.pid_namespace()}-{os.getpid()}-"
    return {n for n in os.listdir(shm.SHM_DIR) if n.startswith(mine)}


@pytest.fixture
def pair():
    sender, receiver = Codec(SECRET, names={"a"}), Codec(SECRET, names={"b"})
    sender.local_peers.add("b")
    before = ours()
    yield sender, sender.outbox(), receiver, receiver.inbox()
    sender.close()
    receiver.close()
    assert ours() <= before, "a ring was left in /dev/shm"


def arrays(seed: int, n: int = 300_000):
    rng = np.random.RandomState(seed)
    return [rng.rand(n).astype(np.float32), np.arange(5, dtype=np.float64) + seed,
            rng.rand(1000).astype(np.float32)]


def check(buffers, want):
    assert len(buffers) == len(want)
    for got, w in zip(buffers, want):
        assert np.array_equal(np.frombuffer(got, w.dtype), w)


def test_large_messages_go_by_the_lane_small_ones_by_the_socket(pair):
    sender, out, receiver, inbox = pair
    frames = sender.seal({"op": "x"}, arrays(0), to="b", outbox=out)
    assert len(frames) == 2          # header and authenticator (with the descriptor) only
    header, buffers = inbox.open(frames)
    assert header == {"op": "x"}
    check(buffers, arrays(0))
    small = [np.ones(100, np.float32)]
    assert len(sender.seal({"op": "y"}, small, to="b", outbox=out)) == 3
    # a peer not known to be on this host never gets a lane
    assert len(sender.seal({"op": "z"}, arrays(1), to="c", outbox=out)) > 2
    assert sender.lane_messages["sent"] == 1 and receiver.lane_messages["received"] == 1


def test_the_receiver_unlinks_the_ring_it_maps_and_the_sender_the_ones_never_taken(pair):
    sender, out, receiver, inbox = pair
    before = ours()
    frames = sender.seal({"op": "x"}, arrays(0), to="b", outbox=out)
    made = ours() - before
    assert len(made) == 1                   # the ring to b, by name, until b maps it
    inbox.open(frames)
    assert not ours() - before              # mapped and unlinked: it goes with the processes
    sender.local_peers.add("c")
    sender.seal({"op": "x"}, arrays(0), to="c", outbox=out)
    assert len(ours() - before) == 1
    sender.close()
    assert not ours() - before


def test_a_ring_wraps_and_every_message_comes_out_whole(pair):
    sender, out, receiver, inbox = pair
    for i in range(40):                    # 1.2 MB messages through a 4-8 MB ring, ten times round
        frames = sender.seal({"i": i}, arrays(i), to="b", outbox=out)
        assert len(frames) == 2
        header, buffers = inbox.open(frames)
        assert header == {"i": i}
        check(buffers, arrays(i))


def test_a_full_ring_sends_on_the_socket_and_the_lane_resumes_once_read(pair):
    """A receiver that reads nothing (hung, slow) never makes its sender wait."""
    sender, out, receiver, inbox = pair
    sent = [sender.seal({"i": i}, arrays(i), to="b", outbox=out) for i in range(12)]
    by_lane = [len(f) == 2 for f in sent]
    assert by_lane[0] and not all(by_lane), by_lane
    for i, frames in enumerate(sent):       # in order, as one socket delivers them
        header, buffers = inbox.open(frames)
        assert header == {"i": i}
        check(buffers, arrays(i))
    assert len(sender.seal({"i": 12}, arrays(12), to="b", outbox=out)) == 2


def test_bytes_changed_in_the_ring_are_refused_after_the_copy(pair):
    sender, out, receiver, inbox = pair
    frames = sender.seal({"op": "x"}, arrays(0), to="b", outbox=out)
    ring = out.lanes.rings["b"]
    ring.data[100] ^= 0xFF
    with pytest.raises(AuthError, match="not authenticated"):
        inbox.open(frames)


def test_a_descriptor_without_the_secret_opens_nothing(pair):
    sender, out, receiver, inbox = pair
    before = ours()
    frames = sender.seal({"op": "x"}, arrays(0), to="b", outbox=out)
    auth = bytearray(frames[1])
    auth[40] ^= 1                           # the ring's name, in the descriptor
    with pytest.raises(AuthError, match="lane descriptor not authenticated"):
        inbox.open([frames[0], bytes(auth)])
    forger = Codec(b"another-jobs-secret-0123456789ab", names={"a"})
    forger.local_peers.add("b")
    forged = forger.seal({"op": "x"}, arrays(0), to="b")
    with pytest.raises(AuthError, match="lane descriptor not authenticated"):
        inbox.open(forged)
    forger.close()
    assert len(ours() - before) == 1 and not inbox.mapped.rings   # nothing mapped or unlinked
    inbox.open(frames)                                               # the real one still opens
    assert receiver.rejected["unauthenticated"] == 2


def test_a_replayed_lane_message_is_refused(pair):
    sender, out, receiver, inbox = pair
    frames = sender.seal({"op": "x"}, arrays(0), to="b", outbox=out)
    inbox.open(frames)
    with pytest.raises(ReplayError):
        inbox.open(frames)
    for i in range(6):                       # its bytes overwritten since
        inbox.open(sender.seal({"i": i}, arrays(i), to="b", outbox=out))
    with pytest.raises(AuthError):
        inbox.open(frames)


def test_a_lane_message_with_data_frames_too_is_refused(pair):
    sender, out, receiver, inbox = pair
    frames = sender.seal({"op": "x"}, arrays(0), to="b", outbox=out)
    with pytest.raises(AuthError, match="lane's message with data frames"):
        inbox.open([*frames, b"extra"])


def test_a_ring_gone_is_a_clear_error_for_that_message(pair):
    sender, out, receiver, inbox = pair
    frames = sender.seal({"op": "x"}, arrays(0), to="b", outbox=out)
    out.lanes.rings["b"].unlink()
    with pytest.raises(MalformedError, match="cannot be opened"):
        inbox.open(frames)


def test_no_shared_memory_means_the_socket(pair, monkeypatch, caplog):
    sender, out, receiver, inbox = pair
    monkeypatch.setattr(shm, "SHM_DIR", "/nonexistent-shm-dir")
    frames = sender.seal({"op": "x"}, arrays(0), to="b", outbox=out)
    assert len(frames) > 2
    check(inbox.open(frames)[1], arrays(0))
    assert "no shared-memory lane to b" in caplog.text
    assert len(sender.seal({"op": "x"}, arrays(0), to="b", outbox=out)) > 2   # not tried again


def test_rings_of_dead_creators_are_swept_and_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    ns = shm.pid_namespace()
    stale = os.path.join(shm.SHM_DIR, f"kvx-{os.geteuid()}-{ns}-{pid}-{'ab' * 6}")
    live = os.path.join(shm.SHM_DIR, f"kvx-{os.geteuid()}-{ns}-{os.getpid()}-{'cd' * 6}")
    # a ring of a process of another PID namespace (a container sharing /dev/shm): its pid
    # means nothing here, and it is never swept from here
    elsewhere = os.path.join(shm.SHM_DIR, f"kvx-{os.geteuid()}-1{ns}-{pid}-{'ef' * 6}")
    for path in (stale, live, elsewhere):
        with open(path, "wb") as f:
            f.write(b"x")
    try:
        assert shm.sweep() >= 1
        assert not os.path.exists(stale) and os.path.exists(live) and os.path.exists(elsewhere)
    finally:
        for path in (stale, live, elsewhere):
            if os.path.exists(path):
                os.unlink(path)


def test_the_host_token_is_shared_by_processes_of_this_host_and_off_on_request():
    here = shm.host_token()
    code = "from kvstore_ext.ps import shm; print(shm.host_token())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert here and other == here
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "KVX_SHM": "0"}).stdout.strip()
    assert off == "None"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2_000_000), st.booleans()), min_size=1, max_size=30))
def test_any_sizes_and_any_lag_deliver_every_message_whole_and_in_order(plan):
    """Messages of any size (some by the lane, some by the socket), the receiver reading
    after any lag: each opens to exactly what was sealed, in order."""
    sender, receiver = Codec(SECRET, names={"a"}), Codec(SECRET, names={"b"})
    sender.local_peers.add("b")
    out, inbox = sender.outbox(), receiver.inbox()
    try:
        queued = []
        for i, (n, read_now) in enumerate(plan):
            data = [np.full(n // 4, i, np.float32), np.arange(i % 7, dtype=np.int64)]
            queued.append((i, data, sender.seal({"i": i}, data, to="b", outbox=out)))
            while queued and (read_now or len(queued) > 8):
                j, want, frames = queued.pop(0)
                header, buffers = inbox.open(frames)
                assert header == {"i": j}
                check(buffers, want)
                read_now = False
        for j, want, frames in queued:
            header, buffers = inbox.open(frames)
            assert header == {"i": j}
            check(buffers, want)
    finally:
        sender.close()
        receiver.close()


def test_an_authenticator_of_the_wrong_length_is_unauthenticated_not_a_lane(pair):
    """A long authenticator from someone without the secret (a pickle, say) is refused as
    unauthenticated, as before lanes, whatever its length."""
    sender, out, receiver, inbox = pair
    for auth in (b"x" * 33, b"x" * 200, b"x" * 4000):
        with pytest.raises(AuthError) as caught:
            inbox.open([b"{}", auth])
        assert caught.value.reason == "unauthenticated"
    assert receiver.rejected["unauthenticated"] == 3 and not inbox.mapped.rings


def test_a_message_too_large_for_its_ring_gets_a_larger_one_and_the_old_one_still_reads(pair):
    """The first message to a peer may be a small key's: a later, larger one makes a ring of
    its size, while the first ring, not yet read (nor mapped), stays for its message."""
    sender, out, receiver, inbox = pair
    small = [np.arange(80_000, dtype=np.float32)]              # 320 KB: a 4 MB ring
    large = [np.arange(1_500_000, dtype=np.float32) * 0.5]     # 6 MB: too large for it
    first = sender.seal({"i": 0}, small, to="b", outbox=out)
    second = sender.seal({"i": 1}, large, to="b", outbox=out)
    assert len(first) == 2 and len(second) == 2
    assert out.lanes.rings["b"].capacity >= 4 * large[0].nbytes
    assert len(out.lanes.retired["b"]) == 1
    check(inbox.open(first)[1], small)
    check(inbox.open(second)[1], large)
    check(inbox.open(sender.seal({"i": 2}, small, to="b", outbox=out))[1], small)
    assert len(inbox.mapped.rings) == 2
