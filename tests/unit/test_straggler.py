"""Straggler emulation: the stretch, its jitter and seed, and how a job is told the speeds."""
import pytest

from kvstore_ext import jobenv, stragglers
from kvstore_ext.launch.ps_job import Job
from kvstore_ext.launch import build_parser
from gluon_trainers.straggler import Straggler


def fake(speed, jitter=0.0, seed=0):
    slept = []
    return Straggler(speed, jitter, seed, sleep=slept.append, wait_all=lambda: None), slept


def test_a_slow_worker_sleeps_in_proportion_to_its_compute():
    s, slept = fake(0.43)
    assert s.stretch(0.1) == pytest.approx(0.1 * (1 / 0.43 - 1))
    assert s.stretch(0.2) == pytest.approx(0.2 * (1 / 0.43 - 1))
    assert sum(slept) == pytest.approx(s.slept)


def test_a_full_speed_worker_never_sleeps():
    s, slept = fake(1.0)
    assert s.stretch(0.5) == 0 and slept == [] and not s.active


def test_jitter_is_reproducible_by_seed_and_bounded():
    a, _ = fake(0.5, jitter=0.2, seed=7)
    b, _ = fake(0.5, jitter=0.2, seed=7)
    c, _ = fake(0.5, jitter=0.2, seed=8)
    xs = [a.stretch(0.1) for _ in range(50)]
    assert xs == [b.stretch(0.1) for _ in range(50)]
    assert xs != [c.stretch(0.1) for _ in range(50)]
    # iteration = 0.1 + extra = 0.2 * (1 +- 0.2)
    assert all(0.16 - 1e-9 <= 0.1 + x <= 0.24 + 1e-9 for x in xs)
    assert max(xs) - min(xs) > 0.02


def test_begin_end_measure_the_compute_between_them():
    s, _ = fake(0.5)
    s.begin()
    extra = s.end()
    assert s.iterations == 1 and extra == pytest.approx(s.compute_time)
    with pytest.raises(RuntimeError, match="begin"):
        s.end()


def test_speeds_come_from_the_job_environment(monkeypatch):
    monkeypatch.setenv(jobenv.WORKER_SPEED, "1.0,0.43")
    monkeypatch.setenv(jobenv.SPEED_JITTER, "0.1")
    monkeypatch.setenv(jobenv.SPEED_SEED, "3")
    assert Straggler.from_env(1, 2).speed == 0.43 and Straggler.from_env(0, 2).speed == 1.0
    assert Straggler.from_env(1, 2).jitter == 0.1
    monkeypatch.setenv(jobenv.WORKER_SPEED, "0.5")
    assert Straggler.from_env(3, 4).speed == 0.5   # one value for all
    monkeypatch.delenv(jobenv.WORKER_SPEED)
    assert Straggler.from_env(0).speed == 1.0


@pytest.mark.parametrize("text,match", [("1.0,x", "'x' is not a number"), ("0", r"in \(0, 1\]"),
                                        ("1.5", r"in \(0, 1\]"), ("1,1,1", "3 worker speeds")])
def test_bad_speeds_name_the_value(text, match):
    with pytest.raises(ValueError, match=match):
        stragglers.parse_speeds(text, 2)


def test_launcher_passes_speeds_to_workers_only():
    args = build_parser().parse_args(["-n", "2", "-s", "1", "--worker-speed", "1.0,0.43",
                                      "--speed-jitter", "0.1", "--speed-seed", "5", "python", "x.py"])
    nodes = Job(args).plan(1234)
    workers = [n for n in nodes if n.name.startswith("worker")]
    servers = [n for n in nodes if n.name.startswith("server")]
    assert all(n.env[jobenv.WORKER_SPEED] == "1.0,0.43" and n.env[jobenv.SPEED_SEED] == "5"
               for n in workers)
    assert all(jobenv.WORKER_SPEED not in n.env for n in servers)


def test_launcher_refuses_bad_speeds():
    args = build_parser().parse_args(["-n", "2", "--worker-speed", "1.0,2", "python", "x.py"])
    with pytest.raises(SystemExit, match="--worker-speed"):
        Job(args)


def test_stretch_rule_is_shared_with_the_simulator():
    from kvstore_ext.stragglers import stretched_time
    from kvstore_ext.simulate import simulate
    assert stretched_time(1.0, 0.5) == 2.0
    assert stretched_time(1.0, 0.5, 0.5) == 3.0
    assert stretched_time(1.0, 1.0, -0.5) == 1.0      # a straggler can sleep, not run faster
    # full-speed virtual workers with jitter never beat one iteration per time unit
    result = simulate("dist_asp", {}, [1.0, 1.0], 200.0, jitter=0.9, seed=1)
    assert all(n <= 200 for n in result.iterations.values())
    assert sum(result.iterations.values()) > 200     # but the jitter does not stop them


def rows(starts, device=0.2, host=0.05):
    return [{"start_s": t, "device_s": device, "host_s": host, "slept_s": max(0.0, device - host)}
            for t in starts]


def test_iteration_overhead_is_the_gap_beyond_the_device_time_first_iteration_left_out():
    from gluon_trainers.straggler import iteration_overhead
    # worker 0: a 1 s warm-up, then 30 ms beyond each 200 ms; worker 1: 20 ms
    logs = [rows([0.0, 1.2, 1.43, 1.66, 1.89]), rows([0.0, 1.2, 1.42, 1.64, 1.86])]
    assert iteration_overhead(logs) == pytest.approx(0.025)
    # a host slower than the device: the gap counts from the end of the host's work
    slow = [rows([0.0, 1.0, 1.35, 1.70], host=0.3)]
    assert iteration_overhead(slow) == pytest.approx(0.05)
    assert iteration_overhead([rows([0.0, 1.0])]) is None


def clocked(starts, device=0.2, host=0.05):
    """A log whose iterations start at ``starts`` on the host's clock (first at 0 s)."""
    return [{**r, "host_clock_s": t} for r, t in zip(rows([t - starts[0] for t in starts],
                                                             device, host), starts)]


def test_exchange_slowdown_sets_each_exchange_beside_the_others_compute_it_began_in():
    from gluon_trainers.straggler import exchange_slowdown
    # both: 200 ms of device time, the first 50 ms of it host compute.  Worker 0's
    # exchanges (from 1.2, 1.41, 1.62, 1.83) take 10 ms and begin while worker 1 sleeps (its
    # compute ended at 1.08, 1.295, 1.51, 1.725); worker 1's (from 1.23, 1.445, 1.66, 1.875)
    # take 15 ms and begin within worker 0's compute (1.21-1.26, 1.42-1.47, 1.63-1.68,
    # 1.84-1.89).  Each worker's first iteration (MXNet's warm-up) is left out.
    w0 = clocked([0.0, 1.0, 1.21, 1.42, 1.63, 1.84])
    w1 = clocked([0.02, 1.03, 1.245, 1.46, 1.675, 1.89])
    got = exchange_slowdown([w0, w1])
    assert got["exchanges"] == {0: 4, 1: 4}
    assert got["median_s"][0] == pytest.approx(0.01)
    assert got["median_s"][1] == pytest.approx(0.015)
    assert got["extra_s"] == pytest.approx(0.005)
    # nobody else computing ever: no extra to tell
    assert exchange_slowdown([w0])["extra_s"] is None
    # logs written before the host's clock was: nothing to set side by side
    assert exchange_slowdown([rows([0.0, 1.0, 1.21]), rows([0.0, 1.0, 1.21])]) is None


def test_overhead_model_gives_back_both_measurements_in_the_simulator():
    """k workers let go together cost a + k*b: a BSP round of 8 costs the round overhead, an
    ASP worker let go alone its own, and the simulator's periods are exactly those."""
    from gluon_trainers.straggler import overhead_model
    from kvstore_ext.simulate import simulate
    n, device, round_cost, lone_cost = 8, 0.2, 0.064, 0.024
    a, b = overhead_model(round_cost, lone_cost, n)
    assert (a + b, a + n * b) == pytest.approx((lone_cost, round_cost))
    horizon = 100 * (device + round_cost) - 1e-9
    bsp = simulate("dist_bsp", {}, [1.0] * n, horizon, base_time=device, latency=a,
                   release_latency=b)
    assert all(i == 100 for i in bsp.iterations.values())
    # ASP workers started apart, so that none is let go with another
    class Apart:
        def __init__(self, w):
            self.first = 0.001 * w

        def next_time(self, at):
            first, self.first = self.first, 0.0
            return device + first
    clocks = [Apart(w) for w in range(n)]
    asp = simulate("dist_asp", {}, None, 100 * (device + lone_cost) + 0.005, clocks=clocks,
                   latency=a, release_latency=b)
    assert all(i == 100 for i in asp.iterations.values()), asp.iterations
    # without a lone measurement all of the round is shared out per worker, as before
    assert overhead_model(round_cost, None, n) == (0.0, round_cost / n)
    # a lone cost outside [round/n, round] is clipped: b and a never go negative
    assert overhead_model(round_cost, 0.5, n) == pytest.approx((round_cost, 0.0))
    assert overhead_model(round_cost, 0.001, n) == pytest.approx((0.0, round_cost / n))
