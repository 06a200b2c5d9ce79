"""The scheduler before its job starts: what it keeps of the registrations it gets.  A real
:class:`~kvstore_ext.ps.scheduler.Scheduler` (its socket bound on 127.0.0.1), given register
messages as its loop would hand them over; what it sends is recorded as it goes out."""
import pytest

from kvstore_ext.ps.protocol import Op
from kvstore_ext.ps.scheduler import MAX_EARLY_JOINERS, Scheduler

ASYNC = {"type": "dist_asp", "params": {}}


class Recording(Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent = []

    def send(self, ident, header, to):
        self.sent.append((to, header))
        super().send(ident, header, to)

    def to(self, node):
        return [h for n, h in self.sent if n == node]


@pytest.fixture
def scheduler():
    made = []

    def make(workers=2, servers=1):
        s = Recording("127.0.0.1", 0, workers, servers, b"s" * 32, start_timeout=30)
        made.append(s)
        return s
    yield make
    for s in made:
        s.guard.stop()
        s.ctx.destroy(0)


def worker(node, rank=None, joining=False):
    return {"op": Op.REGISTER, "role": "worker", "node": node, "rank_hint": rank,
            "store": ASYNC, "joining": joining}


def server(node, padding=0):
    return {"op": Op.REGISTER, "role": "server", "node": node, "host": "127.0.0.1",
            "port": 9000, "pad": "x" * padding}


def test_registrations_beyond_the_job_are_refused_and_not_kept(scheduler):
    """A holder of the secret sending thousands of 'server' registrations before the start
    (each with 100 KB of header) made the scheduler keep every one (+900 MB) and the job never
    start.  Now each extra one is refused by name, nothing of it is kept, and the job's own
    nodes start it."""
    s = scheduler()
    s.register(b"w0", worker("node:w0", 0), None)
    s.register(b"s0", server("node:s0"), None)
    for i in range(2000):
        s.register(f"x{i}".encode(), server(f"node:x{i}", padding=100_000), None)
    assert len(s.pending) == 2 and not s.started
    refusal = s.to("node:x1999")[0]
    assert refusal["op"] == Op.ABORT
    assert refusal["error"].startswith("the job has 1 servers and all have registered")
    s.register(b"w0", worker("node:w0", 0), None)       # the same node again: kept once
    assert len(s.pending) == 2
    s.register(b"w1", worker("node:w1", 1), None)
    assert s.started and not s.failure
    assert [h["rank"] for h in s.to("node:w0") if h["op"] == Op.TOPOLOGY] == [0]
    assert [h["rank"] for h in s.to("node:w1") if h["op"] == Op.TOPOLOGY] == [1]


def test_a_worker_joining_before_the_start_waits_and_takes_a_fresh_rank(scheduler):
    """launch.py --join on a job whose workers are still starting: the joiner was counted as
    one of them, took rank 0 (the one that gives the initial values), and the job's own
    worker 0 was refused.  Now it waits for the start and then joins with rank 2."""
    s = scheduler()
    s.register(b"j", worker("node:j", joining=True), None)
    assert not s.pending and not s.to("node:j")
    s.register(b"w1", worker("node:w1", 1), None)
    s.register(b"s0", server("node:s0"), None)
    s.register(b"w0", worker("node:w0", 0), None)
    assert s.started and not s.failure
    assert [h["rank"] for h in s.to("node:w0") if h["op"] == Op.TOPOLOGY] == [0]
    joined = [h for h in s.to("node:j") if h["op"] == Op.TOPOLOGY]
    assert [(h["rank"], h.get("joined")) for h in joined] == [(2, True)]


def test_early_joiners_are_bounded(scheduler):
    s = scheduler()
    for i in range(MAX_EARLY_JOINERS + 10):
        s.register(f"j{i}".encode(), worker(f"node:j{i}", joining=True), None)
    assert len(s.early_joiners) == MAX_EARLY_JOINERS
    assert s.to(f"node:j{MAX_EARLY_JOINERS}")[0]["op"] == Op.ABORT


def test_heartbeats_tell_the_others_which_workers_make_no_kvstore_call(scheduler):
    """A worker stuck in its own code answers every heartbeat, so nothing named it: its peers'
    stall reports said only which request had no reply.  Now each worker's heartbeat says how
    long it has made no kvstore call, and the scheduler's answer names the others idle a
    second or more, the longest first; a value that is not a duration counts as none."""
    s = scheduler(workers=3)
    for ident, header in ((b"w0", worker("node:w0", 0)), (b"w1", worker("node:w1", 1)),
                          (b"w2", worker("node:w2", 2)), (b"s0", server("node:s0"))):
        s.register(ident, header, None)
    assert s.started

    def beat(rank, idle):
        s.dispatch(f"w{rank}".encode(), {"op": Op.HEARTBEAT, "role": "worker", "rank": rank,
                                         "idle": idle}, None)
        s.quiet = (float("-inf"), [])   # made again at once (it is, once a second, in a job)
        return [h for h in s.to(f"worker:{rank}") if h["op"] == Op.ACK][-1]["quiet"]

    assert beat(0, None) == []                 # worker 0 waits in a call
    beat(2, 3.0)
    assert beat(1, 40.0) == [[2, 3.0]]         # not itself
    quiet = beat(0, None)
    assert [rank for rank, _ in quiet] == [1, 2] and 40.0 <= quiet[0][1] < 41
    beat(2, 0.2)                               # under a second: computing, not named
    assert [rank for rank, _ in beat(0, None)] == [1]
    for bad in ("40", -1, float("nan"), float("inf"), 1e300, True, [1]):
        beat(1, bad)
        assert beat(0, None) == [], bad
