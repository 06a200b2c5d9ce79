"""DSSP: the controller (Algorithm 2) on hand-worked cases, the policy on scripted pushes,
and the s_U bound on simulated clusters (no processes)."""
import random
import time

import pytest

import kvstore_ext
from kvstore_ext.registry import StoreConfig
from kvstore_ext.policies import DSSPPolicy, SSPPolicy
from kvstore_ext.simulate import simulate


def ok(decision):
    return dict(decision.released)


# -- the controller ----------------------------------------------------------------------------
def test_controller_picks_the_push_that_lands_on_a_slow_push():
    # p every 1 s from 10: 10, 11, 12, 13, 14; slow every 3 s from 9: 12, 15, 18, 21, 24
    assert kvstore_ext.dssp_extra_iterations(10, 9, 9, 6, 4) == 2


def test_controller_ties_go_to_the_smallest_r():
    # p: 0, 2, 4, 6; slow: 3, 5, 7, 9 -> gaps 3, 1, 1, 1
    assert kvstore_ext.dssp_extra_iterations(0, -2, 1, -1, 3) == 1


def test_controller_runs_to_r_max_when_the_slow_worker_is_far_behind():
    # slow pushes every 100 s: the nearest simulated push of p is its last one
    assert kvstore_ext.dssp_extra_iterations(0.0, -1.0, 0.0, -100.0, 5) == 5


def test_controller_waits_now_when_the_next_slow_push_is_imminent():
    # slow's next push at 10.2; p's at 10, 11, ...: r = 0 is the nearest
    assert kvstore_ext.dssp_extra_iterations(10.0, 9.0, 9.2, 8.2, 12) == 0


@pytest.mark.parametrize("args", [(None, None, 5.0, 4.0), (3.0, None, 5.0, 4.0),
                                  (3.0, 2.0, 5.0, None), (3.0, 2.0, None, None)])
def test_controller_with_an_unknown_interval_grants_nothing(args):
    assert kvstore_ext.dssp_extra_iterations(*args, 12) == 0


def test_controller_with_no_range_grants_nothing():
    assert kvstore_ext.dssp_extra_iterations(10, 9, 9, 6, 0) == 0


def test_controller_matches_brute_force_on_random_inputs():
    rng = random.Random(3)
    for _ in range(500):
        p_prev, s_prev = rng.uniform(0, 10), rng.uniform(0, 10)
        p_last, s_last = p_prev + rng.uniform(0, 3), s_prev + rng.uniform(0, 9)
        r_max = rng.randint(0, 15)
        sims = [s_last + (k + 1) * (s_last - s_prev) for k in range(r_max + 1)]
        gaps = [min(abs(x - (p_last + r * (p_last - p_prev))) for x in sims)
                for r in range(r_max + 1)]
        expected = gaps.index(min(gaps))
        assert kvstore_ext.dssp_extra_iterations(p_last, p_prev, s_last, s_prev, r_max) == expected


# -- the policy on a scripted run ----------------------------------------------------------------
def scripted_policy():
    """2 workers, s_L = 1, s_U = 4; worker 1 pushes every 10 s, worker 0 every 1 s."""
    p = DSSPPolicy(range(2), 1, 4, record=True)
    assert ok(p.on_push(0, 0.0)) == {0: 1}
    assert ok(p.on_push(1, 0.0)) == {1: 0}
    assert ok(p.on_push(0, 1.0)) == {0: 1}
    assert ok(p.on_push(1, 10.0)) == {1: 0}
    assert ok(p.on_push(0, 2.0)) == {0: 1}       # lead 1 <= s_L
    return p


def test_dssp_grants_uses_and_bounds_an_extension():
    p = scripted_policy()
    # lead 2 > s_L, worker 0 is fastest: p pushes at 3, 4, 5, 6; slow at 20, 30, 40, 50 -> r* = 3
    assert ok(p.on_push(0, 3.0)) == {0: 2}
    assert p.calls[-1].extra == 3 and p.calls[-1].bound == 4 and p.bound(0) == 4
    assert ok(p.on_push(0, 4.0)) == {0: 3}       # extension used, no new controller call
    assert ok(p.on_push(0, 5.0)) == {0: 4}
    assert len(p.calls) == 1
    # lead 5 > s_U: the controller is asked again, but can never set a bound above s_U
    d = p.on_push(0, 6.0)
    assert d.released == [] and len(p.calls) == 2 and p.calls[-1].bound <= 4
    assert not p.accepts_now(0)
    d = p.on_push(1, 20.0)                       # min 3: worker 0's lead is back to 4
    assert ok(d) == {1: 0, 0: 4}


def test_dssp_drops_the_extension_once_back_within_s_lower():
    p = scripted_policy()
    p.on_push(0, 3.0)
    assert 0 in p.extension
    for t in (20.0, 30.0):                       # worker 1 catches up: leads of 0 are 1, then 0
        p.on_push(1, t)
    assert 0 not in p.extension and p.bound(0) == 1
    assert p.bound_changes[-1][1:] == (0, 1)


def test_dssp_without_intervals_behaves_as_ssp_with_s_lower():
    p = DSSPPolicy(range(2), 1, 10)
    assert ok(p.on_push(0, 0.0)) == {0: 1}
    assert p.on_push(0, 1.0).released == []      # interval of worker 1 unknown: r* = 0, waits
    assert p.extension == {} and p.controller_calls == 1


def test_dssp_only_the_fastest_worker_asks_the_controller():
    p = DSSPPolicy(range(3), 0, 5)
    for t in (0.0, 1.0):                         # two rounds: every interval is known (1 s)
        for w in range(3):
            p.on_push(w, t)
    # worker 0 now every 0.75 s: 1.75, 2.5, 3.25, 4.0 meets slow pushes at 2, 3, 4 -> r* = 3
    assert ok(p.on_push(0, 1.75)) == {0: 1} and p.bound(0) == 3
    assert ok(p.on_push(0, 2.5)) == {0: 2}
    calls = p.controller_calls
    assert p.on_push(1, 3.0).released == []      # lead 1 > s_L, but worker 0 is ahead: waits
    assert p.controller_calls == calls
    assert ok(p.on_push(2, 3.1)) == {2: 0, 1: 0}


def test_dssp_dead_slow_worker_releases_the_others():
    p = DSSPPolicy(range(3), 1, 3)
    p.on_push(0, 0)
    assert p.on_push(0, 1).released == []        # lead 2, no interval known for the slowest
    p.on_push(1, 2)
    assert ok(p.remove_worker(2, 3)) == {0: 1}


@pytest.mark.parametrize("lower,upper", [(0, 0), (1, 4), (3, 15), (2, 2)])
@pytest.mark.parametrize("n", [2, 3, 16])
def test_dssp_bound_holds_on_random_schedules(n, lower, upper):
    """Random workers and times: no OK above s_U, the fastest comes back again and again."""
    rng = random.Random(n * 100 + lower * 10 + upper)
    p = DSSPPolicy(range(n), lower, upper)
    waiting, now, seen_above_lower = set(), 0.0, False
    for _ in range(4000):
        ready = [w for w in range(n) if w not in waiting]
        assert ready, "deadlock: every worker waits"
        # worker 0 is picked most often: it is the fastest and keeps asking the controller
        w = 0 if 0 in ready and rng.random() < 0.7 else rng.choice(ready)
        now += rng.uniform(0.01, 1.0)
        waiting.add(w)
        for worker, lead in p.on_push(w, now).released:
            assert lead <= upper and lead == p.clocks.lead(worker)
            seen_above_lower |= lead > lower
            waiting.discard(worker)
        assert all(e <= upper for e in p.extension.values())
    assert p.controller_calls > 0
    if upper > lower:
        assert seen_above_lower


@pytest.mark.parametrize("jitter", [0.0, 0.3])
def test_dssp_on_a_simulated_mixed_speed_pair_stays_in_its_range(jitter):
    r = simulate("dist_dssp", {"staleness_lower": 3, "staleness_upper": 15}, [1.0, 0.43],
                 horizon=2000, jitter=jitter, seed=1)
    assert r.max_lead_at_ok <= 15 and max(r.leads) > 3
    bsp = simulate("dist_bsp", {}, [1.0, 0.43], horizon=2000, jitter=jitter, seed=1)
    asp = simulate("dist_asp", {}, [1.0, 0.43], horizon=2000, jitter=jitter, seed=1)
    # a bounded lead cannot outrun the slow worker for long: DSSP does BSP's work, ASP more
    assert abs(r.total_iterations / bsp.total_iterations - 1) < 0.05
    assert asp.total_iterations > 1.5 * bsp.total_iterations


def test_dssp_decision_cost_does_not_grow_with_the_number_of_workers():
    """O(log n) or better: the cost per push at n = 1024 is within a small factor of n = 2."""
    def cost(n):
        p = DSSPPolicy(range(n), 2, 8)
        rng = random.Random(n)
        waiting, now = set(), 0.0
        ready = list(range(n))
        start = time.perf_counter()
        pushes = 20000
        for i in range(pushes):
            w = ready[i % len(ready)] if rng.random() < 0.5 else rng.choice(ready)
            now += 0.001
            waiting.add(w)
            for worker, _ in p.on_push(w, now).released:
                waiting.discard(worker)
            ready = [x for x in ready if x not in waiting] if w in waiting else ready
            if not ready:
                ready = [x for x in range(n) if x not in waiting]
        return (time.perf_counter() - start) / pushes
    small = min(cost(2) for _ in range(3))
    large = min(cost(1024) for _ in range(3))
    assert large < 4 * small + 20e-6


# -- parameters --------------------------------------------------------------------------------
@pytest.mark.parametrize("params,match", [
    ({"staleness_lower": -1}, "staleness_lower"),
    ({"staleness_lower": 4, "staleness_upper": 2}, "staleness_upper must be >= staleness_lower"),
    ({"staleness_lower": 1.5}, "staleness_lower"),
    ({"staleness_upper": "many"}, "staleness_upper"),
    ({"staleness": 3}, "unknown parameter 'staleness'"),
])
def test_bad_dssp_parameters_name_the_value(params, match):
    with pytest.raises(ValueError, match=match):
        StoreConfig.build("dist_dssp", params)
    with pytest.raises(ValueError, match=match.split()[0]):
        kvstore_ext.create("dist_dssp", **params)


def test_dssp_defaults_are_the_papers_range():
    assert StoreConfig.build("dist_dssp").params == {"staleness_lower": 3, "staleness_upper": 15,
                                                     "rule": "bounded"}


def test_dssp_with_equal_bounds_is_ssp():
    rng = random.Random(5)
    d, s = DSSPPolicy(range(3), 2, 2), SSPPolicy(range(3), 2)
    waiting = set()
    for i in range(2000):
        ready = [w for w in range(3) if w not in waiting]
        w = rng.choice(ready)
        waiting.add(w)
        a, b = d.on_push(w, float(i)), s.on_push(w, float(i))
        assert sorted(a.released) == sorted(b.released)
        for worker, _ in a.released:
            waiting.discard(worker)
