"""dist_psp: partial push and partial pull with timeouts, and fault injection on servers.

The policy objects on scripted events; then real jobs on 127.0.0.1 training LeNet on MNIST:
equality with dist_bsp at c = n, b = 1 (2 servers, split arrays), a 10x slower worker that
no longer holds the others back at c = n - 1, and a slow server that b < 1 works around.
"""
import os

import mxnet as mx
import numpy as np
import pytest

import kvstore_ext
from conftest import ROOT, read_json
from kvstore_ext.ps.faults import FaultPlan, parse_delay_replies, parse_slow_server
from kvstore_ext.ps.partition import Partitioner
from kvstore_ext.ps.transport import DEFAULT_MAX_FRAME_BYTES
from kvstore_ext.policies.psp import (HeldVersions, PartialPull, PartialPushPolicy,
                                      check_psp_params, resolve_min_pushes)

TRAIN = os.path.join(ROOT, "scripts", "train_mnist.py")


# -- the server's rounds ----------------------------------------------------------------------
def test_round_closes_at_the_c_th_push_when_there_is_no_timeout():
    p = PartialPushPolicy(range(4), min_pushes=3)
    assert not p.on_push(0, 0, 0.0).apply and not p.on_push(1, 0, 0.1).apply
    out = p.on_push(2, 0, 0.2)
    assert out.apply and out.summed == 3 and p.version == 1
    late = p.on_push(3, 0, 0.3)                 # worker 3's gradient for version 0 is late
    assert late.dropped and not late.apply and p.dropped == 1 and p.dropped_by_worker == {3: 1}


def test_push_timeout_waits_after_the_c_th_and_everyone_closes_early():
    p = PartialPushPolicy(range(3), min_pushes=1, push_timeout=0.5)
    first = p.on_push(0, 0, 10.0)
    assert not first.apply and first.deadline == 10.5
    assert not p.on_timer(10.4).apply
    second = p.on_push(1, 0, 10.45)
    assert not second.apply and second.deadline is None   # the wait started at the c-th only
    out = p.on_timer(10.5)
    assert out.apply and out.summed == 2 and p.version == 1
    # the same wait, but all three arrive in time: closed at once, no timer needed
    for w in range(2):
        p.on_push(w, 1, 11.0)
    out = p.on_push(2, 1, 11.1)
    assert out.apply and out.summed == 3 and p.version == 2


def test_c_equal_n_is_a_bsp_round_and_a_departed_worker_releases_it():
    p = PartialPushPolicy(range(3), min_pushes=3)
    assert not p.on_push(0, 0, 0).apply and not p.on_push(1, 0, 0).apply
    out = p.remove_worker(2, 1.0)
    assert out.apply and out.summed == 2
    assert p.on_push(0, 1, 2).apply is False and p.on_push(1, 1, 2).apply


def test_stamps_ahead_of_the_version_are_summed():
    """A worker that went on with part of the blocks may push a later stamp: it counts now."""
    p = PartialPushPolicy(range(2), min_pushes=2)
    p.on_push(0, 0, 0)
    out = p.on_push(1, 3, 0)
    assert out.apply and out.summed == 2 and p.dropped == 0


def test_a_late_reply_to_an_earlier_call_does_not_move_the_stamp_back():
    """c = n, b = 1 must drop nothing, also when a reply completes after a later one.

    Stock gluon.Trainer's first step broadcasts each key (pull, version >= 0), then pushpulls
    the gradient computed before (version >= 1).  Worker 3's pull of the block is late: its
    version 0 arrives after the pushpull's version 1.  Recording it stamped worker 3's next
    gradient 0, and the server, at version 1, dropped it (1-4 drops per run in the
    late-reply experiment, and sometimes a hang: the worker fell a round behind on the block).
    """
    n = 8
    policy = PartialPushPolicy(range(n), min_pushes=n)
    held = [HeldVersions() for _ in range(n)]
    block = ("w", 0)
    for w in range(n):                        # everyone's broadcast pull, except worker 3's
        if w != 3:
            held[w].arrived(block, 0)
    closed = [policy.on_push(w, held[w].stamp(block), 0.0) for w in range(n)]   # step 1
    assert [o.apply for o in closed] == [False] * (n - 1) + [True] and policy.version == 1
    for w in range(n):                        # the pushpull replies: the block at version 1
        assert held[w].arrived(block, policy.version)
    assert not held[3].arrived(block, 0)      # worker 3's late broadcast pull completes now
    assert held[3].stamp(block) == 1 and held[3].ignored == 1
    closed = [policy.on_push(w, held[w].stamp(block), 1.0) for w in range(n)]   # step 2
    assert not any(o.dropped for o in closed) and closed[-1].apply and closed[-1].summed == n
    assert policy.dropped == 0 and policy.version == 2


def test_an_answered_plain_push_stamps_the_next_gradient_for_the_next_round():
    """Pushes made with no pull between them: no weights come back, yet under c = n each must
    go into its own round, as under BSP."""
    held, block = HeldVersions(), ("w", 0)
    assert held.stamp(block) == 0 and held.held(block) is None
    held.pushed(block, 0)                     # the push's round closed: version 1
    assert held.stamp(block) == 1 and held.held(block) is None
    held.arrived(block, 3)                    # a pull brings a newer version
    assert held.stamp(block) == 3
    held.pushed(block, 3)
    held.pushed(block, 1)                     # an older answer never moves it back
    assert held.stamp(block) == 4 and held.held(block) == 3
    policy = PartialPushPolicy(range(2), min_pushes=2)
    stamps = HeldVersions(), HeldVersions()
    for _ in range(3):                        # push, answered when the round closes, x 3
        sent = [s.stamp(block) for s in stamps]
        outcomes = [policy.on_push(w, sent[w], 0.0) for w in range(2)]
        assert not any(o.dropped for o in outcomes) and outcomes[-1].apply
        for s, stamp in zip(stamps, sent):
            s.pushed(block, stamp)
    assert policy.version == 3 and policy.dropped == 0


class _Replies:
    """A stand-in for the worker's connection: each request's reply is given by the test."""

    num_workers = 8

    def __init__(self):
        self.replies = {}

    def wait_parts(self, tickets, counts, pull, late=None):
        reply = self.replies[tickets[0]]
        assert pull.done(len(reply[1]), 0.0)
        return {0: reply}


def _dist_psp_without_job(monkeypatch, conn, meta):
    """A DistPSP worker with everything its __init__ needs, but no job: ``conn`` stands in for
    its connection, ``meta`` is key -> (shape, dtype), one server."""
    from kvstore_ext.ps.store import DistPSP, ParameterServerStore

    def no_job(self, **params):
        self._config = type("Config", (), {"params": check_psp_params(params)})()
        self._conn, self._part = conn, Partitioner(1)
        self._meta = meta
        self._type = "dist_psp"
        self._frame_limit = DEFAULT_MAX_FRAME_BYTES
        self._coalescer = None

    monkeypatch.setattr(ParameterServerStore, "__init__", no_job)
    return DistPSP(min_pushes=8)


def test_dist_psp_stamps_with_the_newest_version_whatever_order_replies_complete(monkeypatch):
    """The worker's own bookkeeping (DistPSP._plan / _await) in the order of the defect: the
    broadcast pull is sent first, the pushpull second, and the pull's reply completes last."""
    conn = _Replies()
    kv = _dist_psp_without_job(monkeypatch, conn, {0: ((4,), np.dtype("float32"))})
    value = np.zeros(4, np.float32).tobytes()
    grad = mx.nd.ones(4)

    pull = kv._plan("pull", [(0, None)])                  # Trainer's broadcast: sent first
    first = kv._plan("pushpull", [(0, grad)])            # the first step's pushpull
    assert first[0][0][0][4:] == [0, 1]                   # stamp 0, wants version 1
    conn.replies = {"pushpull": ({"versions": [1]}, [value]), "pull": ({"versions": [0]}, [value])}
    kv._await("pushpull", {0: "pushpull"}, first)         # the pushpull's reply completes first
    kv._await("pull", {0: "pull"}, pull)                  # the late pull's reply, version 0
    second = kv._plan("pushpull", [(0, grad)])
    assert second[0][0][0][4:] == [1, 2]                  # stamped 1: the server sums it
    third = kv._plan("pushpull", [(0, grad)])             # staged as worked out: stamped anew
    assert third[0][0][0][4:] == [1, 2] and len(third[0][0][0]) == 6


def test_a_late_block_is_queued_by_the_receiving_thread_and_written_by_the_next_call(
        monkeypatch):
    """A block that comes after the pull went on is written into the weights, but the engine
    operation that writes it is pushed by the store's next call, on the caller's thread.
    Pushed by the receiving thread, it raced the training loop's pushes: MXNet's engine
    queues an operation on its arrays one at a time, so the late write of a layer's weight
    and bias and a forward pass reading both could each wait for the other, and the job hung
    (about one job in 15 with an always-late server under load)."""
    import threading
    from kvstore_ext import engine

    kv = _dist_psp_without_job(monkeypatch, _Replies(), {0: ((4,), np.dtype("float32")),
                                                         1: ((2,), np.dtype("float32"))})
    weight, bias = mx.nd.zeros(4), mx.nd.zeros(2)
    kv._writing_to([(0, engine.Destination(weight, (4,), np.dtype("float32"))),
                    (1, engine.Destination(bias, (2,), np.dtype("float32")))])
    blocks = kv._plan("pushpull", [(0, mx.nd.ones(4)), (1, mx.nd.ones(2))])[0][2]
    errors = []

    def receive():             # what the link thread does with a part that comes late
        engine.never_push_here()
        try:
            kv._late_parts(blocks, frozenset(), [0, 1], [1, 1],
                           [np.full(4, 7, np.float32).tobytes(), np.full(2, 5, np.float32)
                            .tobytes()])
        except Exception as exc:
            errors.append(exc)

    t = threading.Thread(target=receive, name="kvstore_ext-link")
    t.start()
    t.join(10)
    assert not errors, errors
    mx.nd.waitall()
    assert kv.late_blocks_applied == 0 and not weight.asnumpy().any()
    kv._push_late()                            # the first thing the next call does
    assert weight.asnumpy().tolist() == [7] * 4 and bias.asnumpy().tolist() == [5] * 2
    assert kv.late_blocks_applied == 2 and kv._held.stamp((0, 0)) == 1
    kv._push_late()                            # each late part is written once
    assert kv.late_blocks_applied == 2


def test_partial_pull_fraction_and_linger():
    pull = PartialPull(total=10, fraction=0.75, linger=0.2)
    assert pull.needed == 8
    assert not pull.done(7, 0.0) and pull.wake_at() is None
    assert not pull.done(8, 1.0) and pull.wake_at() == pytest.approx(1.2)
    assert not pull.done(9, 1.1) and pull.done(9, 1.2)
    assert PartialPull(10, 0.75, 5.0).done(10, 0.0)          # all arrived: no lingering
    assert PartialPull(4, 0.9).needed == 4 and PartialPull(4, 1.0).done(4, 0)
    assert not PartialPull(4, 1.0).done(3, 100.0)             # b = 1 waits for every block


def test_min_pushes_as_count_or_fraction():
    assert resolve_min_pushes(7, 8) == 7 and resolve_min_pushes(None, 8) == 8
    assert resolve_min_pushes(0.875, 8) == 7 and resolve_min_pushes(1.0, 8) == 8
    assert resolve_min_pushes(0.1, 8) == 1


@pytest.mark.parametrize("params,match", [
    ({"min_pushes": 0}, "min_pushes=0"),
    ({"min_pushes": -0.5}, "min_pushes=-0.5"),
    ({"min_pushes": 2.5}, "min_pushes=2.5"),
    ({"min_pushes": "all"}, "min_pushes"),
    ({"min_pull_fraction": 0}, "min_pull_fraction must be in \\(0, 1\\], got 0"),
    ({"min_pull_fraction": 1.5}, "min_pull_fraction.*1.5"),
    ({"push_timeout": -1}, "push_timeout must be a number of seconds >= 0, got -1"),
    ({"pull_timeout": "soon"}, "pull_timeout.*'soon'"),
])
def test_bad_parameters_name_the_parameter_and_value(params, match):
    with pytest.raises(ValueError, match=match):
        check_psp_params(params)
    with pytest.raises(ValueError, match=match):
        kvstore_ext.create("dist_psp", **params)   # refused before any connection is tried


def test_more_pushes_than_workers_is_refused():
    with pytest.raises(ValueError, match=r"min_pushes=9 must be between 1 and the number of workers \(8\)"):
        resolve_min_pushes(9, 8)


def test_bad_fault_options():
    assert parse_delay_replies("0.0016:4") == (0.0016, 4.0)
    with pytest.raises(ValueError, match="FRACTION:SECONDS"):
        parse_delay_replies("4")
    with pytest.raises(ValueError, match="fraction must be in \\[0, 1\\]"):
        parse_delay_replies("2:1")
    with pytest.raises(ValueError, match="server 4 does not exist"):
        parse_slow_server("4:1", num_servers=4)


def test_fault_plan_is_reproducible_by_seed_and_hits_the_fraction():
    env = {"KVX_DELAY_REPLIES": "0.1:2", "KVX_FAULT_SEED": "7"}
    a, b = FaultPlan.from_env(0, env), FaultPlan.from_env(0, env)
    draws = [a.delay() for _ in range(5000)]
    assert draws == [b.delay() for _ in range(5000)]
    assert set(draws) == {0.0, 2.0} and 400 < draws.count(2.0) < 600
    other = FaultPlan.from_env(1, env)                       # each server draws its own
    assert [other.delay() for _ in range(5000)] != draws
    assert a.to_dict()["replies_delayed"] == draws.count(2.0)
    slow = {"KVX_SLOW_SERVER": "1:0.3"}
    assert FaultPlan.from_env(1, slow).delay() == 0.3 and not FaultPlan.from_env(0, slow).active


# -- real jobs --------------------------------------------------------------------------------
def load_params(path):
    return {k: v.asnumpy() for k, v in mx.nd.load(path).items()}


def test_c_equal_n_b_one_equals_dist_bsp_with_two_servers_and_split_arrays(run_job, tmp_path):
    common = ["--no-shuffle", "--max-steps", "12", "--lr", "0.05", "--momentum", "0.9",
              "--wd", "1e-3", "--batch-size", "32"]
    split = ["--env", "KVX_BIGARRAY_BOUND:1000"]     # LeNet's big layers: one block per server
    params = {}
    for kvstore in ("dist_bsp", "dist_psp"):
        out = str(tmp_path / f"{kvstore}-{{rank}}.params")
        code, log = run_job(2, 2, [TRAIN, "--kvstore", kvstore, "--save-params", out, *common],
                            *split, "--metrics-dir", str(tmp_path / kvstore))
        assert code == 0, log[-3000:]
        params[kvstore] = [load_params(out.replace("{rank}", str(r))) for r in range(2)]
    ref = params["dist_bsp"][0]
    for rank in range(2):
        got = params["dist_psp"][rank]
        for k in ref:
            rel = np.abs(got[k] - ref[k]).max() / max(np.abs(ref[k]).max(), 1e-12)
            assert rel <= 1e-5, f"worker {rank} {k}: relative difference {rel}"
    servers = [read_json(str(tmp_path / "dist_psp" / f"server-{s}.json")) for s in range(2)]
    assert all(s["pushes_dropped"] == 0 and s["updates"] > 0 for s in servers)
    # the arrays really were split: some key has a block on each server
    assert servers[0]["pushes_applied"] > 0 and servers[1]["pushes_applied"] > 0


def rate(result):
    return result["steps"] / result["wall_time_s"]


@pytest.mark.long   # waits on purpose (about 20 s); CI runs it
def test_a_ten_times_slower_worker_no_longer_holds_the_others_back(run_job, tmp_path):
    """c = n - 1: the fast workers keep their pace; the slow one's late pushes are dropped.

    Emulated devices (100 ms per iteration, the slow one 1 s) set the pace, not this
    machine's contention, so one pair of runs decides.
    """
    common = [TRAIN, "--kvstore", "dist_psp", "--epochs", "100", "--max-time", "6",
              "--batch-size", "32"]
    out = str(tmp_path / "alone-{rank}.json")
    code, log = run_job(2, 1, [*common, "--out", out], "--kv-param", "min_pushes=2",
                        "--device", "100ms")
    assert code == 0, log[-3000:]
    alone = min(rate(read_json(out.replace("{rank}", str(r)))) for r in range(2))

    out = str(tmp_path / "slow-{rank}.json")
    metrics = tmp_path / "metrics"
    code, log = run_job(3, 1, [*common, "--out", out], "--kv-param", "min_pushes=2",
                        "--device", "100ms*2,1000ms", "--metrics-dir", str(metrics))
    assert code == 0, log[-3000:]
    results = [read_json(out.replace("{rank}", str(r))) for r in range(3)]
    assert results[2]["steps"] < 0.2 * results[0]["steps"]      # it really was slow
    server = read_json(str(metrics / "server-0.json"))
    dropped = server["psp"]["dropped_by_worker"]
    assert int(dropped.get("2", 0)) > 0, dropped
    assert server["pushes_dropped"] == sum(int(v) for v in dropped.values())
    # without PSP the fast pair would go at the slow one's pace: 0.1 of alone
    assert min(rate(r) for r in results[:2]) >= 0.7 * alone, (alone, results)


def test_with_b_below_one_c_below_n_drops_only_the_left_out_workers_gradients(run_job, tmp_path):
    """4 workers x 2 servers, c = 3, b = 0.9, 50 ms emulated devices, 60 steps: each round of
    each block closes at the third gradient, so the fourth is late, one in four (480 of
    the 1,920 block pushes).  A late gradient answers the next round (b < 1 needs that to stay
    live), and the same worker's fresh gradient answers it again; counted twice, rounds
    closed before the fresh gradients came, which were late in turn: 912-1,264 dropped in
    three runs of the code before, where the grace for fresh gradients gives 480."""
    metrics = tmp_path / "metrics"
    out = str(tmp_path / "r-{rank}.json")
    code, log = run_job(4, 2, [TRAIN, "--kvstore", "dist_psp", "--epochs", "100", "--max-steps",
                               "60", "--batch-size", "32", "--out", out],
                        "--kv-param", "min_pushes=3", "--kv-param", "min_pull_fraction=0.9",
                        "--device", "50ms", "--metrics-dir", str(metrics))
    assert code == 0, log[-3000:]
    assert [read_json(out.replace("{rank}", str(r)))["steps"] for r in range(4)] == [60] * 4
    servers = [read_json(str(metrics / f"server-{s}.json")) for s in range(2)]
    received = sum(s["pushes_received"] for s in servers)
    dropped = sum(s["pushes_dropped"] for s in servers)
    assert received == 60 * 4 * 8, received          # LeNet's 8 arrays, one block each
    assert dropped <= 1.2 * received / 4, (dropped, received)


def test_a_slow_server_stalls_b_one(run_job, tmp_path):
    """Server 1 answers pulls 1.5 s late. LeNet's 8 arrays sit 4 and 4 on the two servers:
    b = 1 waits for every reply (b = 0.5 going on without them is the next test)."""
    out = str(tmp_path / "r-{rank}.json")
    metrics = tmp_path / "metrics"
    code, log = run_job(2, 2, [TRAIN, "--kvstore", "dist_psp", "--epochs", "100", "--max-time",
                               "8", "--batch-size", "32", "--out", out],
                        "--kv-param", "min_pull_fraction=1.0", "--slow-server", "1:1.5",
                        "--fault-seed", "3", "--metrics-dir", str(metrics))
    assert code == 0, log[-3000:]
    results = [read_json(out.replace("{rank}", str(r))) for r in range(2)]
    steps = min(r["steps"] for r in results)
    faults = read_json(str(metrics / "server-1.json"))["faults"]
    assert faults["slow_seconds"] == 1.5 and faults["replies_delayed"] > 0
    assert "faults" not in read_json(str(metrics / "server-0.json"))
    assert steps <= 7, steps            # one step per 1.5 s at most (8 s of training)


def test_an_always_late_servers_blocks_keep_training_with_b_below_one(run_job, tmp_path):
    """b = 0.5 with server 1 answering every pull 0.2 s late: the workers go on with server
    0's half, and server 1's parts come after they did.  Those parts are written when they
    come, so server 1's blocks move one version per delay.  When they were dropped, every
    gradient for server 1 carried the version of the last complete pull (the first steps), the
    server dropped them all, and its blocks stopped: 16 versions in 10 s against 281 on
    server 0, test accuracy 0.64-0.69 (now about 45 versions and 0.79-0.87).

    What tells the fix from the bug is server 1's versions per delay (checked below); the
    test accuracy depends on how many steps each of server 1's versions spans, which the
    machine's load sets (0.88 unloaded; 0.61 in a loaded timed run, 0.455 in a clean-clone run
    of 360 steps), so it is only checked to be well above chance (0.1): the model learns with
    half its blocks late."""
    out = str(tmp_path / "r-{rank}.json")
    metrics = tmp_path / "metrics"
    delay = 0.2
    code, log = run_job(2, 2, [TRAIN, "--kvstore", "dist_psp", "--epochs", "100", "--max-steps",
                               "360", "--max-time", "60", "--batch-size", "32", "--out", out],
                        "--kv-param", "min_pull_fraction=0.5", "--slow-server", f"1:{delay}",
                        "--fault-seed", "3", "--metrics-dir", str(metrics))
    assert code == 0, log[-3000:]
    results = [read_json(out.replace("{rank}", str(r))) for r in range(2)]
    servers = [read_json(str(metrics / f"server-{s}.json")) for s in range(2)]
    assert servers[1]["faults"]["slow_seconds"] == delay and "faults" not in servers[0]
    # the workers went on without server 1: many steps per delay, blocks kept
    # (the first steps, before stock Trainer's per-key calls are gathered into one call
    # per step, and the first pull of each key wait for server 1 whatever b is)
    assert min(r["steps"] for r in results) == 360, [r["steps"] for r in results]
    # waiting for server 1 would cost the delay every step
    assert max(r["wall_time_s"] / r["steps"] for r in results) < delay, results
    assert min(r["kvstore_stats"]["worker"]["blocks_kept"] for r in results) > 0
    v0, v1 = (s["psp"]["versions"][-1] for s in servers)
    wall = min(r["wall_time_s"] for r in results)
    step = wall / v0
    # a version per delay and a step or two: at least half that rate, whatever the load
    assert v1 >= 0.5 * wall / (delay + 2 * step), (v0, v1, wall)
    applied = [r["kvstore_stats"]["worker"]["late_blocks_applied"] for r in results]
    assert min(applied) > 0, applied
    assert min(r["test_accuracy"] for r in results) >= 0.3, results


@pytest.mark.long
def test_c_equal_n_b_one_drops_nothing_with_late_replies_8_workers(run_job, tmp_path):
    """The late-reply experiment's Sync row, shortened: 8 workers, 4 servers, c = n, b = 1.

    With seed 1, server 1's 4th block reply is late (2 s here): a reply to one worker's first
    pull, which can then complete after that worker's first pushpull.  Before HeldVersions this
    dropped 1 to 4 pushes (4 when the block was part of the split array), or hung the job.
    Whether the replies cross depends on timing; the two tests above replay it exactly.
    """
    out = str(tmp_path / "r-{rank}.json")
    metrics = tmp_path / "metrics"
    code, log = run_job(8, 4, [TRAIN, "--kvstore", "dist_psp", "--model", "lenet", "--epochs",
                               "1", "--out", out],
                        "--kv-param", "min_pushes=8", "--kv-param", "min_pull_fraction=1.0",
                        "--delay-replies", "0.0016:2", "--fault-seed", "1",
                        "--env", "KVX_BIGARRAY_BOUND:10000", "--metrics-dir", str(metrics),
                        timeout=180)
    assert code == 0, log[-3000:]
    servers = [read_json(str(metrics / f"server-{s}.json")) for s in range(4)]
    assert servers[1]["faults"]["replies_delayed"] >= 1             # the late reply happened
    assert [s["pushes_dropped"] for s in servers] == [0] * 4, [s["psp"] for s in servers]
    assert all(s["pushes_applied"] == s["pushes_received"] for s in servers)
    workers = [read_json(out.replace("{rank}", str(r))) for r in range(8)]
    assert {w["steps"] for w in workers} == {15}
    assert all(w["kvstore_stats"]["worker"]["older_versions_ignored"] >= 0 for w in workers)
