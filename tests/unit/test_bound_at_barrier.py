"""SSP and DSSP while a worker waits at a barrier (``set_away``), at the policy level.

A worker at a barrier pushes nothing until every worker is there.  With uneven iteration
counts, a faster worker held by the bound waited for that worker's next push, and the one at
the barrier waited for it: the job hung.  A worker at a barrier now leaves the minimum clock,
and comes back through it at the job's highest clock.
"""
from hypothesis import given, settings, strategies as st

from kvstore_ext.policies import DSSPPolicy, SSPPolicy
from kvstore_ext.policies.clocks import ClockTable


def released(decision):
    return [w for w, _ in decision.released]


def test_a_worker_held_by_the_bound_is_let_go_when_the_slowest_reaches_a_barrier():
    policy = SSPPolicy([0, 1], staleness=1)
    policy.on_push(0, 0.0)                              # worker 0: 1 push, then its barrier
    assert released(policy.on_push(1, 0.1)) == [1]
    assert released(policy.on_push(1, 0.2)) == [1]      # lead 1
    assert policy.on_push(1, 0.3).released == []        # lead 2: held for worker 0's push
    assert released(policy.set_away(0, True, 0.4)) == [1]
    for t in range(5):                                  # the rest of worker 1's iterations
        assert released(policy.on_push(1, 0.5 + t)) == [1]
    assert policy.set_away(1, True, 6.0).released == []
    assert policy.set_away(0, False, 7.0).released == []
    assert policy.set_away(1, False, 7.0).released == []
    # through the barrier both are at the highest clock: the bound counts from there
    assert policy.clocks.clock == {0: 8, 1: 8}
    assert released(policy.on_push(1, 8.0)) == [1]
    assert policy.on_push(1, 8.1).released == []        # lead 2 over worker 0 again
    assert released(policy.on_push(0, 8.2)) == [0, 1]


def test_workers_come_back_at_the_highest_clock_in_either_order():
    for order in ([0, 1, 2], [2, 1, 0], [1, 2, 0]):
        policy = SSPPolicy([0, 1, 2], staleness=5)
        for worker, pushes in ((0, 2), (1, 5), (2, 4)):
            for _ in range(pushes):
                policy.on_push(worker, 0.0)
            policy.set_away(worker, True, 1.0)
        assert len(policy.clocks) == 0 and policy.parked == {0: 2, 1: 5, 2: 4}
        for worker in order:
            policy.set_away(worker, False, 2.0)
        assert policy.clocks.clock == {0: 5, 1: 5, 2: 5}, order
        assert policy.clocks.min == policy.clocks.max == 5


def test_a_push_at_a_barrier_is_refused_by_name_and_changes_nothing():
    policy = SSPPolicy([0, 1], staleness=2)
    policy.set_away(1, True, 0.0)
    assert policy.check_push(1) == "worker 1 pushed while it waits at a barrier"
    assert policy.check_push(5).startswith("worker 5 is not a live member")
    assert policy.clocks.clock == {0: 0}


def test_a_worker_waiting_for_ok_cannot_be_at_a_barrier_and_unknown_workers_change_nothing():
    policy = SSPPolicy([0, 1], staleness=0)
    policy.on_push(0, 0.0)                              # lead 1 > 0: worker 0 waits
    assert 0 in policy.room
    assert policy.set_away(0, True, 0.1).released == []   # ignored: it waits for OK
    assert policy.set_away(7, True, 0.1).released == []
    assert policy.set_away(7, False, 0.1).released == []
    assert policy.set_away(1, False, 0.1).released == []  # back without having left
    assert policy.clocks.clock == {0: 1, 1: 0} and policy.parked == {}
    assert released(policy.on_push(1, 0.2)) == [1, 0]


def test_a_worker_that_dies_at_a_barrier_is_forgotten():
    policy = DSSPPolicy([0, 1, 2], 1, 4)
    policy.on_push(0, 0.0)
    policy.set_away(0, True, 0.1)
    policy.remove_worker(0, 0.2)
    assert policy.parked == {} and 0 not in policy.push_times
    policy.set_away(0, False, 0.3)                      # a late "through": nothing
    assert sorted(policy.clocks.clock) == [1, 2]


def test_dssp_lets_the_held_worker_go_and_drops_the_parked_workers_extension():
    policy = DSSPPolicy([0, 1], 1, 4)
    policy.on_push(1, 0.0)
    policy.on_push(0, 0.0)
    policy.on_push(1, 10.0)
    t = 10.0
    for _ in range(4):   # worker 0 pushes every 0.1 s, worker 1 every 10 s: 0's bound grows
        t += 0.1
        assert released(policy.on_push(0, t)) == [0]
    extended = dict(policy.extension)
    assert extended == {0: 4} and policy.clocks.lead(0) == 3
    policy.set_away(0, True, t)
    assert 0 not in policy.extension or extended.get(0) is None   # it comes back with no lead
    policy.set_away(1, True, t)
    policy.set_away(1, False, t + 0.1)
    policy.set_away(0, False, t + 0.1)
    assert policy.clocks.lead(0) == policy.clocks.lead(1) == 0
    assert policy.extension == {}
    while released(policy.on_push(0, t)) == [0]:    # worker 0 runs ahead until it is held
        t += 0.1
    assert 0 in policy.room
    assert released(policy.set_away(1, True, t)) == [0]


def test_a_worker_back_first_and_pushing_on_is_bounded_from_the_barriers_clock():
    policy = SSPPolicy([0, 1], staleness=1)
    for _ in range(4):
        policy.on_push(0, 0.0)
        policy.on_push(1, 0.0)
    policy.set_away(0, True, 1.0)
    policy.set_away(1, True, 1.0)
    policy.set_away(1, False, 2.0)                      # worker 1's "through" comes first
    assert released(policy.on_push(1, 2.1)) == [1]      # alone in the table: no bound yet
    assert released(policy.on_push(1, 2.2)) == [1]
    policy.set_away(0, False, 2.3)
    assert policy.clocks.clock == {0: 4, 1: 6}          # 0 at the barrier's clock, behind
    assert policy.on_push(1, 2.4).released == []        # lead 3 > 1: worker 1 waits
    assert released(policy.on_push(0, 2.5)) == [0]
    assert released(policy.on_push(0, 2.6)) == [0, 1]


def test_a_clock_table_adds_at_a_given_clock_below_the_minimum_too():
    clocks = ClockTable([0, 1])
    for _ in range(3):
        clocks.tick(0)
        clocks.tick(1)
    assert clocks.add(2, at=1) == 1 and clocks.min == 1 and clocks.slowest() == 2
    assert clocks.add(3, at=7) == 7 and clocks.max == 7
    clocks.remove(2)
    assert clocks.min == 3
    for w in (0, 1, 3):
        clocks.remove(w)
    assert clocks.add(4, at=2) == 2 and clocks.min == clocks.max == 2


# -- a job's workers against the bound, with barriers: someone can always go on ----------------

@st.composite
def jobs(draw):
    """Per worker, the iterations it runs before each of the job's barriers (uneven)."""
    workers = draw(st.integers(2, 4))
    barriers = draw(st.integers(1, 3))
    return [[draw(st.integers(0, 6)) for _ in range(barriers)] for _ in range(workers)]


@settings(max_examples=300, deadline=None)
@given(jobs(), st.sampled_from(["ssp0", "ssp1", "ssp3", "dssp"]), st.randoms(use_true_random=False))
def test_workers_with_uneven_iterations_and_barriers_always_finish(plan, model, rng):
    """Workers push their iterations, waiting for OK when the bound says so, and meet at
    barriers (a worker at a barrier is away; the barrier lets them all go once every one is
    there).  At every moment some worker can act, and every worker finishes."""
    n = len(plan)
    if model == "dssp":
        policy = DSSPPolicy(range(n), 1, 3)
    else:
        policy = SSPPolicy(range(n), int(model[3:]))
    left = [list(p) for p in plan]           # iterations left before each barrier
    waiting_ok: set[int] = set()
    at_barrier: set[int] = set()
    now = 0.0
    while any(left):
        ready = [w for w in range(n) if w not in waiting_ok and w not in at_barrier]
        if not ready:
            assert at_barrier == set(range(n)), (f"hung: {sorted(waiting_ok)} wait for OK, "
                                                 f"{sorted(at_barrier)} at the barrier")
            for w in sorted(at_barrier, key=lambda _: rng.random()):
                policy.set_away(w, False, now)
                left[w].pop(0)
            at_barrier.clear()
            continue
        worker = rng.choice(ready)
        now += 1.0
        if left[worker] and left[worker][0] > 0:
            left[worker][0] -= 1
            decision = policy.on_push(worker, now)
            waiting_ok.add(worker)
        else:
            at_barrier.add(worker)
            decision = policy.set_away(worker, True, now)
        for w, lead in decision.released:
            waiting_ok.discard(w)
        bound = policy.upper if model == "dssp" else policy.staleness
        assert all(lead <= bound for _, lead in decision.released)
