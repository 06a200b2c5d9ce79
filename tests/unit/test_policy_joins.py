"""Workers that join a running job, at the policy level: they start at the minimum clock."""
import pytest

from kvstore_ext.policies import ASPPolicy, BSPPolicy, DSSPPolicy, PolicyError, SSPPolicy
from kvstore_ext.policies.clocks import ClockTable
from kvstore_ext.policies.pool import PoolConfig, PoolPolicy


def test_a_clock_table_adds_a_worker_at_the_minimum():
    clocks = ClockTable([0, 1])
    for _ in range(5):
        clocks.tick(0)
    for _ in range(3):
        clocks.tick(1)
    assert clocks.add(2) == 3
    assert clocks.lead(2) == 0 and clocks.min == 3 and clocks.max == 5
    clocks.tick(2)
    clocks.remove(1)
    assert clocks.min == 4 and clocks.slowest() == 2
    with pytest.raises(ValueError, match="already a member"):
        clocks.add(0)


def test_ssp_takes_a_joiner_at_the_slowest_clock_so_it_holds_nobody_back():
    policy = SSPPolicy([0, 1], staleness=1)
    for _ in range(3):
        policy.on_push(0, 0.0)
        policy.on_push(1, 0.0)
    policy.add_worker(2, 1.0)
    assert policy.clocks.min == 3
    # the joiner pushes: within the bound at once
    assert [w for w, _ in policy.on_push(2, 1.1).released] == [2]
    # worker 0 may go one ahead of the slowest (1 and 2 at 3... 2 now 4)
    assert [w for w, _ in policy.on_push(0, 1.2).released] == [0]
    assert policy.on_push(0, 1.3).released == []           # lead 2 over worker 1: waits
    assert [w for w, _ in policy.on_push(1, 1.4).released] == [1, 0]


def test_asp_and_dssp_take_a_joiner():
    asp = ASPPolicy([0])
    asp.on_push(0, 0.0)
    asp.add_worker(1, 0.1)
    assert asp.on_push(1, 0.2).released == [(1, 1)]
    dssp = DSSPPolicy([0, 1], 1, 4)
    dssp.on_push(0, 0.0)
    dssp.add_worker(2, 0.5)
    assert dssp.push_times[2] == (None, None)
    assert [w for w, _ in dssp.on_push(2, 0.6).released] == [2]


def test_bsp_refuses_a_joiner_by_name():
    with pytest.raises(PolicyError, match="dist_bsp does not take workers into a running job"):
        BSPPolicy([0, 1]).add_worker(2, 0.0)


def test_a_pool_parks_a_joiner_outside_its_lowest_ranks_and_grows_to_it():
    config = PoolConfig.from_params({"pool": "progressive", "pool_start": 2, "pool_every": 1,
                                     "batch_size": 10, "epoch_samples": 40})
    policy = PoolPolicy([0, 1], config)
    assert policy.pool.max == 2
    decision = policy.add_worker(2, 0.0)
    assert decision.released == [] and 2 in policy.parked
    assert policy.pool.max == 3                            # no pool_max: the job's size
    for _ in range(2):                                     # 40 samples: the pool doubles
        policy.on_push(0, 0.1)
        released = policy.on_push(1, 0.2).released
    assert policy.pool.size == 3 and 2 in [w for w, _ in released]
