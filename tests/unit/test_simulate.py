"""The simulator drives every registry row that has a policy, PSP's block rounds included."""
import pytest

from kvstore_ext.simulate import paradigms, simulate

SPEEDS = [1.0, 1.0, 1.0, 0.3]


@pytest.mark.parametrize("jitter", [0.0, 0.3])
def test_psp_with_c_n_is_bsp_round_for_round(jitter):
    psp = simulate("dist_psp", {}, SPEEDS, horizon=300, jitter=jitter, seed=4)
    bsp = simulate("dist_bsp", {}, SPEEDS, horizon=300, jitter=jitter, seed=4)
    assert psp.iterations == bsp.iterations and psp.dropped == 0
    assert psp.max_lead_at_ok == 0


def test_psp_with_c_below_n_leaves_the_straggler_behind_and_drops_its_late_pushes():
    psp = simulate("dist_psp", {"min_pushes": 3}, SPEEDS, horizon=300, seed=1)
    bsp = simulate("dist_bsp", {}, SPEEDS, horizon=300, seed=1)
    fast = [psp.iterations[w] for w in range(3)]
    assert min(fast) > 2.5 * bsp.iterations[0], (psp.iterations, bsp.iterations)
    # the straggler's gradients are mostly late: computed from a version the fast three
    # have already moved past
    assert 0.5 * psp.iterations[3] <= psp.dropped <= psp.iterations[3], psp
    assert psp.max_lead_at_ok > 100


def test_psp_push_timeout_holds_a_round_open_in_virtual_time():
    quick = simulate("dist_psp", {"min_pushes": 3}, SPEEDS, horizon=300, seed=1)
    held = simulate("dist_psp", {"min_pushes": 3, "push_timeout": 2.0}, SPEEDS, horizon=300,
                    seed=1)
    # after the third push each round stays open 2 more units (τ1) for the straggler: a round
    # of the fast workers takes 1 + 2 units instead of 1, unless the straggler's push (late,
    # so dropped, but a response all the same) comes meanwhile and ends the wait: at most one
    # round shortened per straggler push
    assert quick.iterations[0] == 300
    assert 300 / 3 <= held.iterations[0] <= 300 / 3 + held.iterations[3], held
    assert held.iterations[0] < quick.iterations[0] / 2, held


def test_psp_parameters_are_checked_as_the_store_checks_them():
    with pytest.raises(ValueError, match="min_pushes"):
        simulate("dist_psp", {"min_pushes": 0}, SPEEDS, horizon=10)
    with pytest.raises(ValueError, match="min_pushes=5 must be between 1 and the number of workers"):
        simulate("dist_psp", {"min_pushes": 5}, SPEEDS, horizon=10)


def test_every_simulated_paradigm_comes_from_the_registry():
    stores = {store for store, _ in paradigms().values()}
    assert stores == {"dist_bsp", "dist_asp", "dist_ssp", "dist_dssp", "dist_psp", "dist_pool"}
    assert {label for label, (store, _) in paradigms(["dist_psp"]).items()} == {
        "PSP c=n", "PSP c=0.75n"}


def test_device_clocks_and_latency_per_worker_released_together():
    """A BSP round of n workers on 1 s devices lasts 1 + n*b; an ASP worker's 1 + b."""
    from kvstore_ext.devices import DeviceClock
    n, b = 4, 0.05
    bsp = simulate("dist_bsp", {}, None, 100.0, clocks=DeviceClock.for_cluster("1000ms", [], n),
                   release_latency=b)
    asp = simulate("dist_asp", {}, None, 100.0, clocks=DeviceClock.for_cluster("1000ms", [], n),
                   release_latency=b)
    # the first iteration starts at 0 without a release
    assert bsp.iterations[0] == 1 + int((100.0 - 1.0) / (1.0 + n * b))
    assert asp.iterations[0] == 1 + int((100.0 - 1.0) / (1.0 + b))


# -- dist_psp with several servers, late replies and b -------------------------------------------
EQUAL = [1.0] * 4


def test_psp_b_one_pays_a_slow_servers_delay_every_iteration():
    r = simulate("dist_psp", {}, EQUAL, horizon=150, servers=2, reply_delays=[0, 0.5])
    assert all(99 <= v <= 100 for v in r.iterations.values()), r.iterations   # 150 / 1.5
    assert r.dropped == 0


def test_psp_b_below_one_goes_on_without_the_slow_server_and_its_block_trains_one_delay_behind():
    """The slow server's part of every pull comes after the worker went on; it is written into
    the weights when it comes (as the store does), so the next push is stamped with the block's
    current version and applied: nothing is dropped and nobody waits.  (Before the store wrote
    late parts, that block froze after its first round and every push to it was dropped.)"""
    r = simulate("dist_psp", {"min_pull_fraction": 0.5}, EQUAL, horizon=150, servers=2,
                 reply_delays=[0, 0.5])
    assert all(v == 150 for v in r.iterations.values()), r.iterations
    assert r.dropped == 0


def test_psp_a_part_later_than_an_iteration_is_written_late_and_its_pushes_dropped():
    """A part 1.5 iterations late: the worker has pushed once more with the old stamp by the
    time it comes, and that push is dropped; every second push to that block counts."""
    r = simulate("dist_psp", {"min_pull_fraction": 0.5}, EQUAL, horizon=150, servers=2,
                 reply_delays=[0, 1.5])
    assert all(v == 150 for v in r.iterations.values()), r.iterations
    assert 0.4 * r.total_iterations <= r.dropped <= 0.6 * r.total_iterations, r.dropped


def test_psp_a_pull_timeout_longer_than_the_delay_waits_for_the_slow_server():
    r = simulate("dist_psp", {"min_pull_fraction": 0.5, "pull_timeout": 1.0}, EQUAL, horizon=150,
                 servers=2, reply_delays=[0, 0.5])
    assert all(99 <= v <= 100 for v in r.iterations.values()), r.iterations
    assert r.dropped == 0


@pytest.mark.parametrize("slow,expected", [(0, 100), (1, 150)])
def test_psp_b_counts_blocks_not_servers(slow, expected):
    """Server 0 holds 3 blocks, server 1 one; b = 0.5 needs 2 of the 4."""
    delays = [0.0, 0.0]
    delays[slow] = 0.5
    r = simulate("dist_psp", {"min_pull_fraction": 0.5}, EQUAL, horizon=150, servers=2,
                 reply_delays=delays, blocks=[3, 1])
    assert all(expected - 1 <= v <= expected for v in r.iterations.values()), r.iterations


def test_servers_and_delays_are_refused_where_they_are_not_modelled():
    with pytest.raises(ValueError, match="per-block rounds"):
        simulate("dist_ssp", {"staleness": 3}, EQUAL, horizon=10, servers=2)
    with pytest.raises(ValueError, match="2 delays"):
        simulate("dist_psp", {}, EQUAL, horizon=10, servers=2, reply_delays=[0.5])


def test_simulate_cli_with_a_slow_server(capsys):
    from kvstore_ext.simulate import main
    assert main(["--device", "148ms*8", "--servers", "4", "--blocks", "4,3,4,3",
                 "--reply-delays", "0,0.3,0,0", "--kv-param", "min_pull_fraction=0.75",
                 "--time", "30"]) == 0
    out = capsys.readouterr().out
    rows = [line.split()[0] for line in out.splitlines()[1:]]
    assert rows == ["PSP", "PSP"], out      # the per-key policies are one server only


# -- a server's replies wait for the pushes queued behind them ---------------------------------
def test_asynchronous_replies_wait_for_the_pushes_already_queued():
    """Two 1 s workers push together to a server that takes 1 ms per push. As a server's event
    loop does, worker 0's reply waits until worker 1's push, already queued, is served: both
    read both updates and start at 1.002, and the next pushes are 0 and 1 stale (not 1 and 1,
    as replying at once made them)."""
    from kvstore_ext.devices import DeviceClock
    clocks = DeviceClock.for_cluster("1000ms", [], 2)
    run = simulate("dist_asp", {}, None, 2.5, clocks=clocks, service=0.001)
    assert run.staleness == {0: 2, 1: 2}
    # both are let go at 1.002 and at 2.004: 2 ms after each push came
    assert run.wait_time == pytest.approx({0: 0.004, 1: 0.004})
    # without a server's costs (no queue modelled) each reply goes at once, as it used to
    assert simulate("dist_asp", {}, None, 2.5, clocks=clocks).staleness == {0: 1, 1: 3}


def test_a_reply_is_held_at_most_the_servers_hold():
    """Four workers push together to a server that takes 15 ms per push: after three pushes
    the first reply has waited 30 ms (> MAX_REPLY_HOLD_S), so three replies go and the fourth
    goes once its own push is served."""
    from kvstore_ext.devices import DeviceClock
    from kvstore_ext.policies.base import MAX_REPLY_HOLD_S
    assert 0.015 < MAX_REPLY_HOLD_S < 0.03
    clocks = DeviceClock.for_cluster("1000ms", [], 4)
    run = simulate("dist_asp", {}, None, 1.5, clocks=clocks, service=0.015)
    # waits: served at 1.015, 1.030, 1.045 and all three let go at 1.045; the 4th at 1.060
    assert [round(run.wait_time[w], 3) for w in range(4)] == [0.045, 0.045, 0.045, 0.060]


def test_latency_jitter_draws_each_start_within_its_bounds_by_seed():
    from kvstore_ext.simulate import overhead_times
    constant = overhead_times(0.04, 0.01)
    assert [constant(k) for k in (0, 1, 4)] == pytest.approx([0.04, 0.05, 0.08])
    drawn = overhead_times(0.04, 0.01, 0.5, seed=3)
    costs = [drawn(2) for _ in range(2000)]
    assert 0.5 * 0.06 <= min(costs) < 0.55 * 0.06 and 1.45 * 0.06 < max(costs) <= 1.5 * 0.06
    assert sum(costs) / len(costs) == pytest.approx(0.06, rel=0.03)    # the mean is kept
    again = overhead_times(0.04, 0.01, 0.5, seed=3)
    assert [again(2) for _ in range(2000)] == costs
    other = overhead_times(0.04, 0.01, 0.5, seed=4)
    assert [other(2) for _ in range(20)] != costs[:20]
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=f"latency_jitter {bad} must be in"):
            overhead_times(0.04, 0.0, bad)


def test_latency_jitter_tells_equal_devices_apart_for_dssps_controller():
    """On equal devices without jitter the workers push at the same instants, so DSSP's
    controller sees one speed; a host's varying push and pull give it different ones."""
    from kvstore_ext.devices import DeviceClock

    def run(jitter, seed=0):
        clocks = DeviceClock.for_cluster("200ms", ["transient:0.05:3:2"], 4, seed=1)
        return simulate("dist_dssp", {"staleness_lower": 3, "staleness_upper": 15}, None,
                        40.0, clocks=clocks, latency=0.04, service=0.005, seed=seed,
                        latency_jitter=jitter, record=True)
    still, jittered = run(0.0), run(0.5)
    assert still.report == run(0.0, seed=9).report      # nothing drawn without jitter
    assert jittered.report == run(0.5).report           # deterministic by seed
    calls = [c["worker"] for c in still.report["dssp"]["calls"]]
    moved = [c["worker"] for c in jittered.report["dssp"]["calls"]]
    assert len(moved) > len(calls)                      # fastest and slowest change places
    assert abs(jittered.total_iterations - still.total_iterations) \
        <= 0.02 * still.total_iterations                # the mean overhead is the same
    # without record, no log is kept
    assert simulate("dist_dssp", {"staleness_lower": 3, "staleness_upper": 15}, [1.0, 0.5],
                    20.0).report == {}


def test_shared_host_slows_an_exchange_that_begins_while_others_compute():
    from kvstore_ext.simulate import SharedHost
    host = SharedHost(0.02, lambda k: {1: 1.0, 2: 1.5, 3: 2.0}[k])
    assert host.exchange(0, 0.0, 0.004) == pytest.approx(0.004)     # nobody computes
    # worker 0 computes from 0.004 to 0.024: worker 1's exchange beside it is 1.5x as long
    assert host.exchange(1, 0.010, 0.004) == pytest.approx(0.006)
    assert host.exchange(2, 0.020, 0.004) == pytest.approx(0.008)   # two others compute
    # worker 0's own host work (to 0.024) is over; 1 (to 0.036) and 2 (to 0.048) compute
    assert host.exchange(0, 0.030, 0.004) == pytest.approx(0.008)
    # worker 2's own host work (0.028-0.048) does not slow its exchange; 0's (to 0.054) does
    assert host.exchange(2, 0.040, 0.004) == pytest.approx(0.006)
    assert host.exchange(1, 0.100, 0.004) == pytest.approx(0.004)   # everyone is done by 0.1
    assert host.fresh().exchange(2, 0.0, 0.004) == pytest.approx(0.004)
    # workers let go at one moment: each after the first counts those before it (their host
    # work follows their exchange), which is what sets them apart on one host
    host = SharedHost(0.02, lambda k: {1: 1.0, 2: 1.5, 3: 2.0}[k])
    assert [host.exchange(w, 0.0, 0.004) for w in (0, 1, 2)] == pytest.approx([0.004, 0.006,
                                                                               0.008])
    with pytest.raises(ValueError, match="host_time -1 must be seconds >= 0"):
        SharedHost(-1, lambda k: 1.0)


class _PushTimes:
    """The simulator's trainer hooks, recording when each push arrives (no training)."""

    def __init__(self):
        self.now, self.pushes = 0.0, []

    def advance(self, now):
        self.now = now
        return True

    def start(self, worker, held=None, at=0.0):
        pass

    def push(self, worker, server=0, accepted=True):
        self.pushes.append((self.now, worker))

    def apply(self, server, pusher=None):
        pass


def test_shared_host_keeps_two_workers_let_go_together_from_pushing_in_step():
    """SSP s=3, 2 equal devices with transient stragglers: the one ahead waits at the bound
    and is let go with the other's push, and with the reply hold they push together from then
    on, each reading the other's update (staleness 0.5).  On one machine the second's exchange
    runs beside the first's forward and backward pass and falls behind: on 2026-12-01 11-13%
    of the two workers' consecutive pushes came under 10 ms apart, and the mean staleness was
    0.86-0.90 (real runs of configs/virtual/agreement_n2.yaml's SSP)."""
    from kvstore_ext.devices import DeviceClock
    from kvstore_ext.simulate import SharedHost

    def run(host, seed=1):
        clocks = DeviceClock.for_cluster("200ms", ["transient:0.05:3:2"], 2, seed=1)
        pushes = _PushTimes()
        result = simulate("dist_ssp", {"staleness": 3}, None, 40.0, clocks=clocks,
                          latency=0.006, service=0.001, apply_time=0.0005, latency_jitter=0.5,
                          seed=seed, trainer=pushes, shared_host=host)
        gaps = [b[0] - a[0] for a, b in zip(pushes.pushes, pushes.pushes[1:]) if a[1] != b[1]]
        return result, sum(g < 0.01 for g in gaps) / len(gaps)
    host = SharedHost(0.022, lambda k: 1.0 + 0.2 * (k - 1))   # as agreement_n2.yaml
    alone, in_step = run(None)
    shared, apart = run(host)
    assert in_step > 0.3 and apart < 0.2, (in_step, apart)
    assert alone.mean_staleness < 0.83 < shared.mean_staleness, (alone.mean_staleness,
                                                                 shared.mean_staleness)
    assert abs(shared.total_iterations - alone.total_iterations) <= 0.01 * alone.total_iterations
    assert run(host)[0].staleness == shared.staleness       # deterministic, the host fresh each run
    # no interference (one process's compute at any count): the same run as without the host
    assert run(SharedHost(0.024, lambda k: 1.0))[0].staleness == alone.staleness


def test_a_shared_host_slows_a_psp_workers_own_exchange_not_the_servers_round():
    """``dist_psp``'s servers are simulated without a queue: their round (a push from each of
    the n workers, ``service`` each, and ``apply_time``) is a delay of every exchange.  It runs
    in the server's process, so a shared host's slow-down (the worker's CPU waiting for a core
    beside the others' compute) applies to ``latency`` only.  Slowing the round too put PSP's
    iterations 8.3% under the machine's at n = 8 (2026-12-02)."""
    from kvstore_ext.devices import DeviceClock
    from kvstore_ext.simulate import SharedHost

    def run(host=None, seed=2, **costs):
        clocks = DeviceClock.for_cluster("200ms", ["transient:0.05:3:2"], 8, seed=1)
        return simulate("dist_psp", {"min_pushes": 0.75}, None, 20.0, clocks=clocks,
                        latency_jitter=0.5, seed=seed, shared_host=host, **costs)
    slow = SharedHost(0.022, lambda k: 3.0)
    # without a host the round is the delay it always was: latency + n x service + apply
    assert run(latency=0.004, service=0.001, apply_time=0.0005).iterations == \
        run(latency=0.004 + 8 * 0.001 + 0.0005).iterations
    # the server's round alone: nothing for the host to slow
    assert run(slow, service=0.002, apply_time=0.001).iterations == \
        run(service=0.002, apply_time=0.001).iterations
    # the worker's part is slowed: 3x a 20 ms exchange costs iterations
    together = run(slow, latency=0.02, service=0.001).total_iterations
    assert together < 0.95 * run(latency=0.02, service=0.001).total_iterations
    # and the round beside it is not: as if the host slowed the latency alone.  A 1-2% effect
    # beside the rounds' own jitter (which late pushes answer first): summed over five seeds
    def total(host, seeds=range(1, 6), **costs):
        return sum(run(host, seed=s, **costs).total_iterations for s in seeds)
    assert total(slow, latency=0.02, service=0.001) > total(slow, latency=0.02 + 8 * 0.001)
    with pytest.raises(ValueError, match="service -1"):
        run(service=-1)
