"""The worker pool of Adaptable Asynchrony, driven directly: schedules, tuning formulas, the
active set, the send-back rule, determinism, and bad parameters."""
import heapq
import math
import random

import pytest
from hypothesis import given, settings, strategies as st

from kvstore_ext.policies.pool import PoolConfig, PoolPolicy, WorkerPool, parse_schedule


def pool(workers=8, **params):
    return WorkerPool(PoolConfig.from_params(params), workers)


def test_progressive_doubles_every_e_epochs_up_to_the_maximum():
    p = pool(8, pool="progressive", pool_every=1, batch_size=100, epoch_samples=1000)
    sizes = []
    for _ in range(40):   # 4 epochs of 10 pushes of 100 samples
        p.advance(100)
        sizes.append(p.size)
    # 2 until 1000 samples (push 10), 4 until 2000, then 8 and it stays there
    assert sizes[8] == 2 and sizes[9] == 4 and sizes[18] == 4 and sizes[19] == 8
    assert sizes[-1] == 8
    assert [(h.samples, h.workers) for h in p.history] == \
        [(0, 2), (1000, 4), (2000, 8), (3000, 8), (4000, 8)]


def test_pool_max_caps_the_growth_and_the_job_size_caps_pool_max():
    p = pool(8, pool_every=1, pool_max=6, batch_size=10, epoch_samples=10)
    for _ in range(5):
        p.advance(10)
    assert p.size == 6
    q = pool(3, pool_every=1, pool_max=16, batch_size=10, epoch_samples=10)
    for _ in range(5):
        q.advance(10)
    assert q.size == 3


@pytest.mark.parametrize("tune,k", [("l", 0.075), ("b", 0.075), ("aa", 0.15), ("m", 0.1),
                                    ("none", 0.2)])
def test_the_tuning_formulas_follow_d_equal_w_minus_w0(tune, k):
    p = pool(8, pool_every=1, batch_size=128, epoch_samples=128, tune=tune, tune_k=k)
    for _ in range(3):
        p.advance(128)
        d = p.size - 2
        lr = math.exp(-k * d) if tune in ("l", "aa") else 1.0
        batch = math.floor(128 * math.exp(k * d)) if tune in ("b", "aa") else 128
        assert p.lr_scale() == pytest.approx(lr)
        assert p.batch_size() == batch
        momentum = 0.9 + (1 - 1 / 2) - (1 - 1 / p.size) if tune == "m" else 0.9
        assert p.momentum(0.9) == pytest.approx(momentum)
    assert p.size == 8


def test_dynamic_pool_changes_every_k_updates_within_bounds_and_is_deterministic():
    def run(seed):
        p = pool(10, pool="dynamic", pool_every=5, pool_min=2, pool_max=10, pool_seed=seed,
                 batch_size=16)
        for _ in range(500):
            p.advance(16)
        return p.trajectory()
    a, b = run(3), run(3)
    assert a == b
    assert [u for u, _ in a] == list(range(0, 501, 5))
    assert all(2 <= w <= 10 for _, w in a)
    assert len({w for _, w in a}) > 3          # it does move around
    assert run(4) != a


def test_scripted_pool_follows_its_schedule():
    p = pool(8, pool="scripted", pool_schedule="1:6,2:3", batch_size=50, epoch_samples=100)
    sizes = []
    for _ in range(6):
        p.advance(50)
        sizes.append(p.size)
    assert sizes == [2, 6, 6, 3, 3, 3]


def test_growth_is_sent_back_when_the_budget_has_less_than_one_round_left():
    # budget 1000 samples; at 900 the pool would double to 4 workers x 100 > 100 left
    p = pool(8, pool_every=0.9, batch_size=100, epoch_samples=1000, epochs=1)
    for _ in range(9):
        p.advance(100)
    assert p.size == 2
    assert (p.history[-1].wanted, p.history[-1].workers) == (4, 2)
    p.advance(100)
    assert p.done


def test_the_active_set_is_the_lowest_live_ranks():
    p = pool(8, pool_start=3)
    assert p.active([7, 2, 5, 0, 4]) == [0, 2, 4]


@pytest.mark.parametrize("params,message", [
    ({"pool": "elastic"}, "pool must be one of"),
    ({"tune": "x"}, "tune must be one of"),
    ({"tune_k": -1}, "tune_k must be >= 0"),
    ({"pool_min": 4, "pool_max": 3, "pool_start": 4}, "pool_max must be >= pool_min"),
    ({"pool_start": 9, "pool_max": 4}, "pool_start must be within"),
    ({"pool": "dynamic", "pool_every": 0}, "pool_every must be > 0"),
    ({"pool": "scripted"}, "pool_schedule"),
    ({"pool": "scripted", "pool_schedule": "2:4,1:2"}, "epochs must increase"),
    ({"pool": "scripted", "pool_schedule": "two:4"}, "EPOCH:WORKERS"),
    ({"batch_size": 0}, "batch_size must be >= 1"),
    ({"pool_start": "2.5"}, "pool_start must be an integer"),
])
def test_bad_parameters_are_refused_by_name(params, message):
    with pytest.raises((ValueError, KeyError), match=message):
        PoolConfig.from_params(params)


def test_parse_schedule():
    assert parse_schedule("0:2, 1.5:4,3:8") == ((0.0, 2), (1.5, 4), (3.0, 8))


# -- the policy: who computes, and what they are told --------------------------------------------

def drive(policy, times, horizon=400.0):
    """Event loop: a worker started at t pushes at t + its time; the policy says who goes on.
    Returns the releases (time, worker, pool size, busy after) and the pushes."""
    n = len(times)
    active = set(policy.pool.active(range(n)))
    events = [(times[w], w) for w in sorted(active)]
    heapq.heapify(events)
    busy, log = set(active), []
    while events and events[0][0] <= horizon:
        now, w = heapq.heappop(events)
        busy.discard(w)
        decision = policy.on_push(w, now)
        assert decision.apply
        for r, _ in decision.released:
            assert policy.pool.done or r in policy.pool.active(policy.clocks.clock), (r, now)
            busy.add(r)
            log.append((now, r, policy.pool.size, len(busy), policy.next_batch(r)))
            if policy.next_batch(r):
                heapq.heappush(events, (now + times[r], r))
    return log


def test_progressive_policy_lets_go_only_the_active_set_and_busy_never_exceeds_w():
    config = PoolConfig.from_params({"pool": "progressive", "pool_every": 0.5, "batch_size": 10,
                                     "epoch_samples": 200, "tune": "b", "tune_k": 0.1})
    policy = PoolPolicy(range(8), config)
    log = drive(policy, [1.0 + 0.1 * w for w in range(8)])
    assert all(busy <= size for _, _, size, busy, _ in log)   # the pool only grows here
    assert [h.workers for h in policy.pool.history][:4] == [2, 4, 8, 8]
    started = {w for _, w, _, _, _ in log}
    assert started == set(range(8))
    # each worker is told the batch size the pool's size gives
    for _, _, size, _, batch in log:
        assert batch == math.floor(10 * math.exp(0.1 * (size - 2)))


@given(seed=st.integers(0, 10_000), every=st.integers(1, 20))
@settings(max_examples=40, deadline=None)
def test_dynamic_policy_never_lets_a_worker_outside_the_pool_go(seed, every):
    config = PoolConfig.from_params({"pool": "dynamic", "pool_every": every, "pool_seed": seed,
                                     "pool_max": 10, "batch_size": 8})
    policy = PoolPolicy(range(10), config)
    rng = random.Random(seed)
    log = drive(policy, [rng.uniform(0.5, 2.0) for _ in range(10)], horizon=150)
    assert log
    # after a shrink, the workers already computing finish their batch; nobody new starts
    # while the busy ones are more than the pool
    for _, _, size, busy, _ in log:
        assert busy <= max(size, 10)
    sizes = [h.workers for h in policy.pool.history]
    assert all(2 <= s <= 10 for s in sizes)


def test_a_departed_worker_makes_room_for_the_next_rank():
    config = PoolConfig.from_params({"pool": "fixed", "pool_start": 2, "batch_size": 4})
    policy = PoolPolicy(range(4), config)
    assert not policy.is_active(2)                      # rank 2 is outside a pool of 2
    decision = policy.remove_worker(0, 1.0)
    assert [w for w, _ in decision.released] == [2]     # now 1 and 2 are the lowest ranks


def test_a_worker_at_a_barrier_leaves_its_place_to_the_next_rank_until_it_is_through():
    """A fixed pool of 1 of 3 workers, and a script that reads its weights before a barrier:
    ranks 1 and 2 waited for OK, rank 0 waited at the barrier for them, for ever.  Each rank
    that reaches the barrier lets the next one go; back through it, rank 0 is the pool again,
    and rank 1, let in meanwhile, waits at its next push."""
    config = PoolConfig.from_params({"pool": "fixed", "pool_start": 1, "pool_min": 1,
                                     "batch_size": 4})
    policy = PoolPolicy(range(3), config)
    assert policy.parked == {1, 2}
    assert [w for w, _ in policy.set_away(0, True, 1.0).released] == [1]
    assert [w for w, _ in policy.set_away(1, True, 2.0).released] == [2]
    assert policy.set_away(2, True, 3.0).released == []
    for w in range(3):
        assert policy.set_away(w, False, 4.0).released == []
    assert policy.is_active(0) and not policy.is_active(1)
    assert [w for w, _ in policy.on_push(0, 5.0).released] == [0]
    assert policy.on_push(1, 5.1).released == []            # outside the pool again
    assert policy.set_away(7, True, 6.0).released == []      # not a member: nothing
    policy.set_away(0, True, 7.0)
    policy.remove_worker(0, 8.0)
    assert policy.away == set()


def test_everyone_waiting_is_let_go_with_batch_0_when_the_budget_is_spent():
    config = PoolConfig.from_params({"pool": "fixed", "batch_size": 50, "epoch_samples": 150,
                                     "epochs": 1})
    policy = PoolPolicy(range(4), config)
    assert [w for w, _ in policy.on_push(0, 0.0).released] == [0]
    assert [w for w, _ in policy.on_push(1, 0.1).released] == [1]
    decision = policy.on_push(0, 0.2)                    # 150 samples: 2 and 3 never started
    assert sorted(w for w, _ in decision.released) == [0, 2, 3]
    assert policy.next_batch(0) == 0 and policy.next_batch(3) == 0


# -- reading the experiments' validation curves --------------------------------------------------

def test_early_stop_stops_patience_measurements_after_the_lowest():
    from kvstore_ext.experiments import early_stop
    losses = [1.0, 0.8, 0.6, 0.65, 0.7, 0.5, 0.55, 0.56, 0.57, 0.58, 0.4]
    assert early_stop(losses, 2) == (4, 2)          # 0.6 at 2, no lower by 4: stop there
    assert early_stop(losses, 3) == (8, 5)          # 0.5 at 5 came in time; none lower by 8
    assert early_stop(losses, 5) == (10, 10)        # never 5 without a new low: to the end
    with pytest.raises(ValueError, match="patience must be >= 1"):
        early_stop(losses, 0)


def test_early_stop_needs_a_new_low_to_beat_the_old_by_min_delta():
    from kvstore_ext.experiments import early_stop
    creeping = [1.0, 0.5, 0.499, 0.498, 0.4975, 0.497, 0.3]
    assert early_stop(creeping, 2) == (6, 6)                   # every creep is a new low
    assert early_stop(creeping, 3, min_delta=0.01) == (4, 1)   # none beats 0.5 by 0.01
    assert early_stop(creeping, 2, min_delta=0.0015) == (5, 3)  # 0.498 beats 0.5 by 0.002
    with pytest.raises(ValueError, match="min_delta must be >= 0, got -0.1"):
        early_stop(creeping, 3, min_delta=-0.1)


def test_pool_spikes_measure_the_rise_after_each_change():
    from kvstore_ext.experiments import pool_spikes
    losses = [1.0, 0.9, 1.3, 1.1, 0.8, 0.7, 0.6]
    pools = [2, 2, 4, 4, 4, 8, 8]
    assert pool_spikes(losses, pools) == pytest.approx([1.3 - 0.9, 0.7 - 0.8])
    assert pool_spikes([1.0, 0.5], [2, 2]) == []
