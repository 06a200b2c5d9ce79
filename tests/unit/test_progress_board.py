"""The Horovod stores' progress board, on Horovod's own Gloo rendezvous server (the one the
launcher runs), in this process: heartbeats put and read back, the workers a stall waits for
named, and nothing a peer or anyone else puts there able to break or mislead a reader."""
import io
import json
import socket
import urllib.request

import pytest
from hypothesis import given, settings, strategies as st

from kvstore_ext.horovod.progress import SCOPE, ProgressBoard
from kvstore_ext.horovod.stall import StallReporter

SECRET = bytes(range(32))


@pytest.fixture(scope="module")
def rendezvous():
    from horovod.runner.http.http_server import RendezvousServer
    server = RendezvousServer()
    port = server.start()
    yield port
    server.stop()


_boards = iter(range(1 << 30))


def boards(port, size=3, secret=SECRET):
    """One board per rank of a fresh job name (the tests share the server)."""
    name = f"t{next(_boards)}"
    return [ProgressBoard("127.0.0.1", port, r, size, name, secret) for r in range(size)]


def put(port, board, rank, raw: bytes):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/{SCOPE}/{board.name}.{rank}",
                                     data=raw, method="PUT")
    urllib.request.urlopen(request, timeout=2).close()


def test_a_frozen_worker_is_named_not_heard_from_and_a_busy_one_alive_but_behind(rendezvous):
    b0, b1, b2 = boards(rendezvous)
    for b in (b0, b1, b2):
        assert b.publish(1)
    b0.observe(10.0)
    assert b0.describe(2, 10.0, silent_after=2.0) == ""      # too soon to tell anything
    b2.publish(1)                   # worker 2 goes on beating at step 1; worker 1 is frozen
    b0.observe(11.0)
    b2.publish(1)
    b0.observe(12.5)
    text = b0.describe(2, 12.5, silent_after=2.0)
    assert text == ("Waiting for: worker 1 not heard from in the last 2.5 s (its newest "
                    "allreduce: step 1); worker 2 heard from 0.0 s ago, its newest allreduce at "
                    "step 1."), text
    b1.publish(2)                   # worker 1 is back, and starts step 2
    b2.publish(2)
    b0.observe(13.0)
    assert b0.describe(2, 13.0, silent_after=2.0).startswith(
        "Every other worker was heard from in the last 2.0 s and has started step 2")


def test_a_worker_that_never_put_anything_is_named_once_the_reads_have_lasted(rendezvous):
    b0, b1 = boards(rendezvous, size=2)
    b0.observe(5.0)
    assert b0.describe(0, 6.0, silent_after=2.0) == ""
    assert b0.describe(0, 7.5, silent_after=2.0) == \
        "Waiting for: worker 1 not heard from in the last 2.5 s."
    b0.settle()                     # the stall ended: the next starts afresh
    assert b0.describe(0, 8.0, silent_after=2.0) == "" and not b0.peers


def test_values_not_written_with_the_jobs_secret_or_replayed_are_ignored(rendezvous):
    b0, b1 = boards(rendezvous, size=2)
    outsider = ProgressBoard("127.0.0.1", rendezvous, 1, 2, b0.name, secret=bytes(32))
    outsider.beat = 100
    outsider.publish(9)                       # a forged heartbeat of worker 1
    b0.observe(1.0)
    assert 1 not in b0.peers
    b1.beat = 5
    b1.publish(3)
    stale = b1.encode(3)                       # beat 6, step 3
    b1.publish(4)                              # beat 7
    b0.observe(2.0)
    assert (b0.peers[1].step, b0.peers[1].beat) == (4, 7)
    put(rendezvous, b0, 1, stale)              # an older value of worker 1, put again
    b0.observe(3.0)
    assert (b0.peers[1].step, b0.peers[1].beat, b0.peers[1].since) == (4, 7, 2.0)
    no_secret = boards(rendezvous, size=2, secret=None)
    assert no_secret[1].publish(0) and json.loads(no_secret[1].encode(0)).keys() == \
        {"rank", "step", "beat"}
    no_secret[0].observe(1.0)
    assert no_secret[0].peers[1].step == 0


@settings(max_examples=300, deadline=None)
@given(raw=st.one_of(st.binary(max_size=2048),
                     st.builds(lambda v: json.dumps(v).encode(),
                               st.recursive(st.none() | st.booleans() | st.integers() |
                                            st.floats() | st.text(max_size=20),
                                            lambda c: st.lists(c, max_size=4) |
                                            st.dictionaries(st.text(max_size=8), c, max_size=5),
                                            max_leaves=12))))
def test_any_bytes_decode_to_a_worker_value_or_to_nothing_never_an_error(raw):
    for secret in (None, SECRET):
        board = ProgressBoard("127.0.0.1", 1, 0, 2, "fuzz", secret)
        got = board.decode(1, raw)
        assert got is None or (type(got[0]) is int and type(got[1]) is int)


def test_a_value_with_a_tag_of_any_text_is_refused_not_an_error():
    board = ProgressBoard("127.0.0.1", 1, 0, 2, "tags", SECRET)
    for tag in ("é" * 64, "\udcff", "", 7, None):
        raw = json.dumps({"rank": 1, "step": 0, "beat": 1, "tag": tag}).encode()
        assert board.decode(1, raw) is None


def test_a_value_too_long_or_of_another_rank_is_ignored(rendezvous):
    b0, b1, b2 = boards(rendezvous)
    put(rendezvous, b0, 1, b"{" + b" " * 5000 + b"}")
    put(rendezvous, b0, 2, b1.encode(3))          # worker 1's value under worker 2's key
    b0.observe(1.0)
    assert b0.peers == {}


def test_no_server_costs_a_look_little_and_breaks_nothing():
    with socket.socket() as s:                    # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    board = ProgressBoard("127.0.0.1", port, 0, 2, "gone", SECRET, timeout=0.5)
    assert board.publish(0) is False
    board.observe(1.0)
    assert board.peers == {} and board.describe(0, 1.5, silent_after=2.0) == ""


def test_the_board_comes_from_the_environment_of_a_launched_job():
    env = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "4000",
           "KVX_SECRET": SECRET.hex()}
    board = ProgressBoard.from_environ(1, 4, "kvx0", env)
    assert (board.url, board.rank, board.size, board.secret) == \
        (f"http://127.0.0.1:4000/{SCOPE}", 1, 4, SECRET)
    assert ProgressBoard.from_environ(0, 1, "kvx0", env) is None          # one worker
    assert ProgressBoard.from_environ(0, 2, "kvx0", {}) is None           # mpirun: no server
    assert ProgressBoard.from_environ(0, 2, "kvx0", {**env, "KVX_SECRET": "zz"}).secret is None


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_a_stall_report_names_the_frozen_worker(rendezvous):
    b0, b1 = boards(rendezvous, size=2)
    clock, out = Clock(), io.StringIO()
    r = StallReporter(4.0, lambda: "dist_ssgd worker 0", lambda fn, arrays: None, out=out,
                      clock=clock, board=b0)
    assert (r.read_after, r.silent_after) == (1.0, 2.0)
    b1.publish(2)
    r.started(3, 0, "array")
    r.look()                                       # watching step 3's allreduce from now
    for _ in range(5):                             # worker 1 is frozen at step 2
        clock.t += 1.0
        r.beat()
        r.look()
    report = out.getvalue()
    assert "an allreduce of key 0 (step 3 or later) has not ended after 4 s. Waiting for: " \
           "worker 1 not heard from in the last 3.0 s (its newest allreduce: step 2)." in report
    assert r.waiting_for(3).startswith("Waiting for: worker 1 not heard from")
