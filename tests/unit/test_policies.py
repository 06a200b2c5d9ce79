"""The synchronisation models driven directly with scripted pushes (no processes)."""
import random

import pytest

from kvstore_ext.policies import ASPPolicy, BSPPolicy, ClockTable, PolicyError, SSPPolicy
from kvstore_ext.registry import make_policy


def ok_workers(decision):
    return sorted(w for w, _ in decision.released)


# -- clocks -----------------------------------------------------------------------------------
def test_clock_table_min_max_and_removal():
    t = ClockTable(range(3))
    for w in (0, 0, 1, 0):
        t.tick(w)
    assert (t.min, t.max, t.lead(0), t.lead(2)) == (0, 3, 3, 0)
    assert t.slowest() == 2 and t.fastest() == 0
    t.remove(2)
    assert (t.min, t.lead(0)) == (1, 2)
    t.remove(0)
    assert (t.min, t.max) == (1, 1)


def test_clock_table_matches_brute_force_on_random_pushes():
    rng = random.Random(1)
    workers = list(range(50))
    t = ClockTable(workers)
    ref = {w: 0 for w in workers}
    for step in range(5000):
        if step % 997 == 0 and len(ref) > 1:
            gone = rng.choice(sorted(ref))
            del ref[gone]
            t.remove(gone)
        w = rng.choice(sorted(ref))
        ref[w] += 1
        t.tick(w)
        assert t.min == min(ref.values()) and t.max == max(ref.values())
        assert ref[t.slowest()] == t.min and ref[t.fastest()] == t.max


# -- BSP --------------------------------------------------------------------------------------
def test_bsp_applies_once_per_round_and_releases_everyone():
    p = BSPPolicy(range(3))
    assert p.on_push(1, 0.0).released == [] and not p.on_push(0, 0.1).apply
    d = p.on_push(2, 0.2)
    assert d.apply and ok_workers(d) == [0, 1, 2]
    assert all(lead == 0 for _, lead in d.released)


def test_bsp_single_worker_is_every_push():
    p = BSPPolicy([0])
    for i in range(3):
        d = p.on_push(0, i)
        assert d.apply and ok_workers(d) == [0]


def test_bsp_holds_a_second_push_in_one_round_for_the_next():
    p = BSPPolicy(range(2))
    p.on_push(0, 0)
    assert not p.accepts_now(0) and p.accepts_now(1)
    with pytest.raises(PolicyError, match="twice"):
        p.on_push(0, 0)
    assert p.clocks.clock == {0: 1, 1: 0}
    assert p.on_push(1, 0).apply
    assert p.accepts_now(0)


def test_bsp_worker_leaving_completes_the_round():
    p = BSPPolicy(range(3))
    p.on_push(0, 0)
    p.on_push(1, 0)
    d = p.remove_worker(2, 0)
    assert d.apply and ok_workers(d) == [0, 1]
    # a departed worker's pushed gradient stays in the round
    p.on_push(0, 1)
    assert not p.remove_worker(0, 1).apply   # worker 1 still has to push
    d = p.on_push(1, 1)
    assert d.apply and ok_workers(d) == [1]


def test_bsp_unknown_worker_is_refused():
    with pytest.raises(PolicyError, match="not a live member"):
        BSPPolicy(range(2)).on_push(5, 0)


# -- ASP --------------------------------------------------------------------------------------
def test_asp_applies_and_oks_every_push_and_reports_leads():
    p = ASPPolicy(range(2))
    leads = []
    for _ in range(4):
        d = p.on_push(0, 0)
        assert d.apply and ok_workers(d) == [0]
        leads.append(d.released[0][1])
    assert leads == [1, 2, 3, 4]


# -- SSP --------------------------------------------------------------------------------------
def test_ssp_zero_is_not_bsp_updates_apply_per_push():
    p = SSPPolicy(range(2), 0)
    d = p.on_push(0, 0)
    assert d.apply and d.released == []          # lead 1 > 0: waits, but the update is applied
    d = p.on_push(1, 0)
    assert d.apply and ok_workers(d) == [0, 1]


def test_ssp_releases_waiting_worker_when_slow_one_catches_up():
    p = SSPPolicy(range(2), 2)
    for i in range(2):
        assert ok_workers(p.on_push(0, i)) == [0]  # leads 1, 2
    assert p.on_push(0, 2).released == []          # lead 3 > 2: waits
    d = p.on_push(1, 3)
    assert ok_workers(d) == [0, 1]
    assert dict(d.released)[0] == 2                # released at lead 2


@pytest.mark.parametrize("s", [0, 1, 3])
@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_ssp_bound_holds_for_random_schedules(n, s):
    """Simulated workers with random speeds: no OK ever at a lead above s, nobody starves."""
    rng = random.Random(n * 10 + s)
    p = SSPPolicy(range(n), s)
    waiting = set()
    for step in range(3000):
        ready = [w for w in range(n) if w not in waiting]
        assert ready, "deadlock: every worker waits"
        w = rng.choice(ready if rng.random() < 0.8 else ready[:1])
        waiting.add(w)
        d = p.on_push(w, step)
        for worker, lead in d.released:
            assert lead <= s
            assert lead == p.clocks.lead(worker)
            waiting.discard(worker)


def test_ssp_dead_slow_worker_releases_the_others():
    p = SSPPolicy(range(3), 1)
    p.on_push(0, 0)
    assert p.on_push(0, 1).released == []          # lead 2 > 1
    p.on_push(1, 2)                                # min still 0 (worker 2)
    d = p.remove_worker(2, 3)
    assert ok_workers(d) == [0]


def test_ssp_rejects_bad_staleness():
    for bad in (-1, 1.5, "x", None, True):
        with pytest.raises(ValueError, match="staleness"):
            SSPPolicy(range(2), bad)


def test_make_policy_by_store_type():
    assert isinstance(make_policy("dist_bsp", [0], {}), BSPPolicy)
    assert isinstance(make_policy("dist_asp", [0], {}), ASPPolicy)
    assert make_policy("dist_ssp", [0, 1], {"staleness": 4}).staleness == 4
    with pytest.raises(ValueError, match="dist_nope"):
        make_policy("dist_nope", [0], {})
