"""The planner's equations on hand-worked cases, the search against brute force, and the
closed form against the simulator that drives the real policies."""
import itertools
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore_ext.plan.calibrate import fit
from kvstore_ext.plan.model import (Costs, ModelProfile, busiest, expected_max, iteration_time,
                                    predict)
from kvstore_ext.plan.search import Space, evaluate, knees, rank
from kvstore_ext.plan.timing import sample, trimmed_mean
from kvstore_ext.plan.validate import kendall_tau, knee_of
from kvstore_ext.ps.partition import Partitioner
from kvstore_ext.simulate import simulate


def costs(**over) -> Costs:
    base = dict(worker_msg=1e-3, worker_key=1e-4, worker_byte=1e-9, server_msg=2e-3,
                server_key=1e-4, server_byte=1e-9, opt_key=1e-4, opt_param=1e-9, latency=1e-4,
                bandwidth=1e9, allreduce_latency=1e-4, allreduce_bandwidth=1e9,
                interference={1: 1.0, 2: 1.5}, cores=2)
    base.update(over)
    return Costs(**base)


PROFILE = ModelProfile("toy", [1000, 250_000], compute_fixed=0.0, compute_per_sample=0.0)


def one(store, n, device=0.1, host=0.0, shared=False, c=None, **kw):
    c = c or costs()
    place = busiest(PROFILE, 1, c, n)
    seconds, parts = iteration_time(
        store=store, workers=n, batch_size=64, host_s=host, device_s=device,
        keys=place["items"], elements=PROFILE.params, messages=place["messages"],
        server_keys=place["keys"], server_elements=place["elements"],
        server_max_elements=place["max_elements"], costs=c, shared_host=shared, **kw)
    return float(seconds), {k: float(v) for k, v in parts.items()}


def test_bsp_round_by_hand():
    # worker CPU 1e-3 + 2 keys x 1e-4 + 1,004,000 B x 1e-9 = 2.204 ms; link 2 x 0.1 ms + 2 x
    # 1.004 ms = 2.208 ms; a push on the server 2 + 0.2 + 1.004 = 3.204 ms; one apply 0.2 +
    # 0.251 = 0.451 ms; the round serves both workers' pushes: 6.859 ms
    seconds, parts = one("dist_bsp", 2)
    assert seconds == pytest.approx(0.1 + 0.002204 + 0.002208 + 0.006859)
    assert parts["server CPU"] == pytest.approx(0.006859)
    assert parts["server link"] == 0.0   # 2 x 2 x 1.004 MB at 1 GB/s = 4.016 ms < 6.859 ms
    fast_cpu, parts = one("dist_bsp", 2, c=costs(server_msg=0.0, server_key=0.0, server_byte=0.0,
                                                 opt_key=0.0, opt_param=0.0))
    assert parts["server link"] == pytest.approx(0.004016) and parts["server CPU"] == 0.0
    assert parts["worker CPU"] == pytest.approx(0.002204)


def test_asp_worker_by_hand_and_the_servers_cap():
    seconds, _ = one("dist_asp", 2)
    assert seconds == pytest.approx(0.1 + 0.002204 + 0.002208 + 0.003204 + 0.000451)
    # 64 workers: the server serves one push + apply (3.655 ms) at a time: 64 x 3.655 ms
    seconds, _ = one("dist_asp", 64)
    assert seconds == pytest.approx(64 * 0.003655)


def test_an_optimizer_call_costs_once_per_application():
    # the fused kernels' fixed cost: once per BSP round, once per push under ASP
    bsp, _ = one("dist_bsp", 2)
    asp, _ = one("dist_asp", 2)
    assert one("dist_bsp", 2, c=costs(opt_call=1e-3))[0] == pytest.approx(bsp + 1e-3)
    assert one("dist_asp", 2, c=costs(opt_call=1e-3))[0] == pytest.approx(asp + 1e-3)
    assert float(costs(opt_call=1e-3).apply_seconds(2, 251_000)) == pytest.approx(
        1e-3 + 2 * 1e-4 + 251_000 * 1e-9)


def test_the_slowest_device_sets_a_bsp_round():
    seconds, parts = one("dist_bsp", 2, device=0.1, device_max_s=0.25)
    assert seconds == pytest.approx(0.25 + 0.002204 + 0.002208 + 0.006859)
    assert parts["barrier wait"] == pytest.approx(0.15)


def test_one_host_cannot_do_more_cpu_work_than_its_cores():
    c = costs(interference={1: 1.0, 8: 1.0})
    seconds, parts = one("dist_bsp", 8, device=0.01, host=0.03, shared=True, c=c)
    # 8 workers x (30 ms compute + 2.204 ms) + 8 pushes x 3.204 ms + 0.451 ms, on 2 cores
    cpu = 8 * (0.03 + 0.002204) + 8 * 0.003204 + 0.000451
    assert seconds == pytest.approx(cpu / 2)
    assert parts["host CPU"] > 0
    alone, _ = one("dist_bsp", 8, device=0.01, host=0.03, shared=False, c=c)
    assert alone == pytest.approx(0.03 + 0.002204 + 0.002208 + 8 * 0.003204 + 0.000451)


def test_the_queue_stretch_is_erlang_c():
    from kvstore_ext.plan.model import queue_stretch
    u = np.array([0.0, 0.3, 0.6, 0.9])
    assert np.allclose(queue_stretch(u, 1), 1 / (1 - u))          # M/M/1
    assert np.allclose(queue_stretch(u, 2), 1 / (1 - u ** 2))     # M/M/2, worked by hand
    # M/M/4 at u = 0.5 by hand: a = 2, sum_{k<4} a^k/k! = 1 + 2 + 2 + 4/3 = 19/3,
    # a^4/4!/(1 - u) = 4/3, Erlang C = (4/3) / (19/3 + 4/3) = 4/23, stretch 1 + C/(4 x 0.5)
    assert float(queue_stretch(0.5, 4)) == pytest.approx(1 + (4 / 23) / 2)


def test_a_bsp_rounds_phases_share_the_hosts_cores():
    # 8 workers on 2 cores: their CPU work (2.204 ms each) runs at once, 4 per core; the
    # one server's round (8 pushes of 3.204 ms, one apply of 0.451 ms) runs on one core
    c = costs(interference={1: 1.0, 8: 1.0})
    seconds, parts = one("dist_bsp", 8, device=0.2, shared=True, c=c)
    assert seconds == pytest.approx(0.2 + 4 * 0.002204 + 0.002208 + 8 * 0.003204 + 0.000451)
    assert parts["worker CPU"] == pytest.approx(0.002204)
    assert parts["host CPU"] == pytest.approx(3 * 0.002204)


def test_an_async_workers_cpu_waits_for_the_cores_the_others_keep_busy():
    # 8 workers of 30 ms host compute on a 0.2 s device: each worker's CPU per iteration is
    # 30 + 2.204 + 3.204 + 0.451 ms = 35.859 ms; the 7 others keep the 2 cores busy
    # u = 7 x 35.859 ms / (2 x T) of the time, and the worker's 5.859 ms of CPU work past its
    # compute is stretched by the M/M/2 response time 1 / (1 - u^2): T solves the fixed point
    c = costs(interference={1: 1.0, 8: 1.0})
    seconds, _ = one("dist_asp", 8, device=0.2, host=0.03, shared=True, c=c)
    base = 0.2 + 0.002204 + 0.002208 + 0.003204 + 0.000451
    u = 7 * 0.035859 / (2 * seconds)
    assert seconds == pytest.approx(base + (1 / (1 - u ** 2) - 1) * 0.005859, rel=1e-4)
    assert seconds > base * 1.001
    alone, _ = one("dist_asp", 8, device=0.2, host=0.03, shared=False, c=c)
    assert alone == pytest.approx(base)


def test_interference_interpolates_and_grows_past_the_last_point():
    c = costs(interference={1: 1.0, 2: 1.5, 4: 2.5})
    assert float(c.interference_at(3)) == pytest.approx(2.0)
    assert float(c.interference_at(8)) == pytest.approx(5.0)
    seconds, parts = one("dist_asp", 4, device=0.0, host=0.01, shared=True,
                         c=costs(interference={1: 1.0, 2: 1.5, 4: 2.5}))
    assert parts["compute"] == pytest.approx(0.025)


def test_a_round_after_idling_costs_the_idle_factor_and_back_to_back_none():
    """The calibration times rounds back to back; training idles between them (compute, a
    device), and the worker's and the server's CPU of a round then take ``idle_factor``:
    in full from IDLE_FULL_S between rounds, linearly below, never for the Horovod stores."""
    from kvstore_ext.plan.model import IDLE_FULL_S
    c = costs(idle_factor=1.5)
    assert float(c.idle_at(0.0)) == 1.0
    assert float(c.idle_at(IDLE_FULL_S / 2)) == pytest.approx(1.25)
    assert list(c.idle_at([IDLE_FULL_S, 1.0])) == [1.5, 1.5]
    for store in ("dist_bsp", "dist_asp"):
        _, warm = one(store, 2, device=0.1, c=costs())
        _, cold = one(store, 2, device=0.1, c=c)
        assert cold["worker CPU"] == pytest.approx(1.5 * warm["worker CPU"]), store
        assert cold["server CPU"] == pytest.approx(1.5 * warm["server CPU"]), store
        _, b2b = one(store, 2, device=0.0, c=c)     # nothing between rounds: as calibrated
        _, b2b_warm = one(store, 2, device=0.0, c=costs())
        assert b2b["worker CPU"] == pytest.approx(b2b_warm["worker CPU"]), store
    # by hand: BSP, 2 workers on their own hosts, one server, a 100 ms device
    keys, nbytes = 2, 4 * 251_000
    worker = 1.5 * (1e-3 + 1e-4 * keys + 1e-9 * nbytes)
    push = 1.5 * (2e-3 + 1e-4 * keys + 1e-9 * nbytes)
    apply = 1.5 * (1e-4 * keys + 1e-9 * 251_000)
    link = 2 * 1e-4 + 2 * nbytes / 1e9
    seconds, _ = one("dist_bsp", 2, device=0.1, c=c)
    assert seconds == pytest.approx(0.1 + worker + link + 2 * push + apply)
    _, ring = one("dist_ssgd", 2, device=0.1, c=c)
    assert ring == one("dist_ssgd", 2, device=0.1, c=costs())[1]


def test_allreduce_ring_by_hand():
    seconds, parts = one("dist_ssgd", 4)
    ring = 2 * 3 * 1e-4 + 2 * 3 / 4 * 1_004_000 / 1e9
    assert parts["worker link"] == pytest.approx(ring)
    assert seconds == pytest.approx(0.1 + 0.002204 + ring)
    overlapped, _ = one("dist_dcs3gd", 4)
    assert overlapped == pytest.approx(0.1 + 0.002204)   # the ring hides under the compute


def test_injected_wire_time_lengthens_the_ring_and_dcs3gd_hides_it_up_to_the_compute():
    ring = 2 * 1 * 1e-4 + 2 * 1 / 2 * 1_004_000 / 1e9
    worker = 0.002204
    plain, parts = one("dist_ssgd", 2, wire_s=0.1)
    assert parts["worker link"] == pytest.approx(ring + 0.1)
    assert plain == pytest.approx(0.1 + worker + ring + 0.1)
    hidden, _ = one("dist_dcs3gd", 2, wire_s=0.1)
    assert hidden == pytest.approx(0.1 + worker + ring)   # all but the compute's 0.1 s shows
    half, _ = one("dist_dcs3gd", 2, wire_s=0.1, overlap=0.5)
    assert half == pytest.approx(0.1 + worker + ring + 0.05)
    bsp, parts = one("dist_bsp", 2, wire_s=0.1)
    assert parts["worker link"] == pytest.approx(2 * 1e-4 + 2 * 1_004_000 / 1e9 + 0.1)


def test_the_rings_cpu_is_on_the_hosts_roofline_and_dcs3gd_cannot_hide_it_there():
    # 2 workers on one 2-core host, 20 ms of host compute each, C_interf 1: the ring takes
    # 2 x 1e-4 s + 1,004,000 B / 1 GB/s = 1.204 ms of wall time and, per worker,
    # 2 x 5e-5 s + 1,004,000 B x 5e-10 s/B = 0.602 ms of CPU
    c = costs(interference={1: 1.0, 2: 1.0}, allreduce_cpu_latency=5e-5,
              allreduce_cpu_byte=5e-10)
    ring, ring_cpu, worker = 2e-4 + 1_004_000 / 1e9, 1e-4 + 1_004_000 * 5e-10, 0.002204
    ssgd, _ = one("dist_ssgd", 2, device=0.0, host=0.02, shared=True, c=c)
    assert ssgd == pytest.approx(0.02 + worker + ring)
    # DC-S3GD would hide the ring's 1.204 ms, but the cores carry compute, worker CPU and the
    # ring's CPU of both workers: (20 + 2.204 + 0.602) ms x 2 / 2 cores
    dcs3gd, parts = one("dist_dcs3gd", 2, device=0.0, host=0.02, shared=True, c=c)
    assert dcs3gd == pytest.approx(0.02 + worker + ring_cpu)
    assert parts["host CPU"] == pytest.approx(ring_cpu)
    # on hosts of their own (or behind a device) it hides as before
    apart, _ = one("dist_dcs3gd", 2, device=0.0, host=0.02, shared=False, c=c)
    assert apart == pytest.approx(0.02 + worker)
    # the parameter-server stores take no ring CPU
    assert one("dist_bsp", 2, device=0.0, host=0.02, shared=True, c=c)[0] == pytest.approx(
        one("dist_bsp", 2, device=0.0, host=0.02, shared=True,
            c=costs(interference={1: 1.0, 2: 1.0}))[0])


def test_expected_max_is_clarks_formula_against_draws():
    """Equal means: the later of two paths ends 0.40 x theta after them; apart, the longer
    one's mean; no deviation, the plain max; and Monte Carlo agrees in between."""
    assert float(expected_max(0.05, 0.05, 0.01)) == pytest.approx(0.05 + 0.01 / np.sqrt(2 * np.pi))
    assert float(expected_max(0.05, 0.05, 0.006, 0.008)) == pytest.approx(
        0.05 + 0.01 / np.sqrt(2 * np.pi))
    assert float(expected_max(0.05, 0.02, 0.002)) == pytest.approx(0.05, rel=1e-9)
    assert float(expected_max(0.03, 0.04, 0.0)) == 0.04
    rng = np.random.default_rng(0)
    for a, b, sa, sb in ((0.05, 0.055, 0.01, 0.0), (0.02, 0.015, 0.004, 0.003), (1.0, 0.9, 0.2, 0.1)):
        draws = np.maximum(rng.normal(a, sa, 400_000), rng.normal(b, sb, 400_000) if sb else b)
        assert float(expected_max(a, b, sa, sb)) == pytest.approx(draws.mean(), rel=2e-3)
    grid = expected_max(np.array([0.01, 0.05, 0.09]), 0.05, np.array([0.0, 0.01, 0.01]))
    assert grid.shape == (3,) and grid[0] == 0.05 and grid[2] > 0.09


def test_a_jittery_compute_makes_dcs3gd_wait_for_the_ring_it_hides_on_average():
    """DC-S3GD with communication as long as the compute: the step waits for the later of the
    two; with the host's step jitter calibrated (compute_cv) that is later on average by
    0.40 x the compute's deviation.  SSGD, which hides nothing, and a ring far shorter than
    the compute are not moved; no jitter measured, nothing changes."""
    host, wire = 0.05, 0.05
    c0 = costs(interference={1: 1.0, 2: 1.0}, allreduce_latency=0.0, allreduce_bandwidth=1e15)
    c1 = costs(interference={1: 1.0, 2: 1.0}, allreduce_latency=0.0, allreduce_bandwidth=1e15,
               compute_cv={1: 0.1, 2: 0.2})
    worker = one("dist_dcs3gd", 2, device=0.0, host=host, shared=True, c=c0)[1]["worker CPU"]
    plain, _ = one("dist_dcs3gd", 2, device=0.0, host=host, shared=True, c=c0, wire_s=wire)
    assert plain == pytest.approx(host + worker)                       # max(compute, ring)
    jittery, parts = one("dist_dcs3gd", 2, device=0.0, host=host, shared=True, c=c1, wire_s=wire)
    sigma = 0.2 * host
    assert jittery == pytest.approx(plain + sigma / np.sqrt(2 * np.pi))
    assert parts["worker link"] == pytest.approx(sigma / np.sqrt(2 * np.pi))
    assert sum(v for k, v in parts.items()) == pytest.approx(jittery)
    for store, w in (("dist_ssgd", wire), ("dist_dcs3gd", 0.0)):
        assert one(store, 2, device=0.0, host=host, shared=True, c=c1, wire_s=w)[0] == \
            pytest.approx(one(store, 2, device=0.0, host=host, shared=True, c=c0, wire_s=w)[0],
                          rel=1e-6)
    # the cv of the Horovod workers' own environment wins for the Horovod stores
    c2 = costs(interference={1: 1.0, 2: 1.0}, allreduce_latency=0.0, allreduce_bandwidth=1e15,
               compute_cv={2: 0.2}, horovod_compute_cv={2: 0.4})
    assert one("dist_dcs3gd", 2, device=0.0, host=host, shared=True, c=c2, wire_s=wire)[0] == \
        pytest.approx(plain + 0.4 * host / np.sqrt(2 * np.pi))
    assert float(c1.compute_cv_at(8)) == 0.2 and float(c0.compute_cv_at(2)) == 0.0


def test_horovod_workers_compute_and_share_a_host_as_measured_in_their_environment():
    profile = ModelProfile("toy", [1000], compute_fixed=0.001, compute_per_sample=1e-4,
                           horovod_compute_fixed=0.002, horovod_compute_per_sample=3e-4)
    assert float(profile.host_time(10)) == pytest.approx(0.002)
    assert float(profile.host_time(10, "dist_bsp")) == pytest.approx(0.002)
    assert float(profile.host_time(10, "dist_dcs3gd")) == pytest.approx(0.005)
    both = profile.host_time(np.array([10, 10]), np.array(["dist_asp", "dist_ssgd"]))
    assert np.allclose(both, [0.002, 0.005])
    plain = ModelProfile("toy", [1000], compute_fixed=0.001, compute_per_sample=1e-4)
    assert float(plain.host_time(10, "dist_ssgd")) == pytest.approx(0.002)   # not measured
    c = costs(interference={1: 1.0, 2: 1.5}, horovod_interference={1: 1.0, 2: 1.1})
    assert float(c.interference_at(2, horovod=True)) == pytest.approx(1.1)
    assert float(c.interference_at(2)) == pytest.approx(1.5)
    _, parts = one("dist_ssgd", 2, device=0.0, host=0.02, shared=True, c=c)
    assert parts["compute"] == pytest.approx(0.022)
    _, parts = one("dist_bsp", 2, device=0.0, host=0.02, shared=True, c=c)
    assert parts["compute"] == pytest.approx(0.03)
    assert Costs.from_calibration({"coefficients": c.to_dict()}) == c


def test_dcs3gd_rows_score_a_bench_result_by_hand():
    from kvstore_ext.plan.validate import dcs3gd_rows
    c = costs(interference={1: 1.0, 2: 1.0})
    calibration = {"coefficients": c.to_dict(),
                   "profiles": {"lenet": {"key_sizes": [1000, 250_000],
                                          "compute_fixed": 0.01, "compute_per_sample": 0.0}}}
    bench = {"args": {"batch_size": 16, "device_s": 0.1}, "injected_comm_s": 0.12,
             "negligible_comm": {"dist_ssgd": {"step_time_s": 0.12, "overlap": 0.0},
                                 "dist_dcs3gd": {"step_time_s": 0.12, "overlap": 0.9}},
             "comm_equals_compute": {"dist_ssgd": {"step_time_s": 0.24, "overlap": 0.0},
                                     "dist_dcs3gd": {"step_time_s": 0.125, "overlap": 0.95}}}
    rows = {(r["regime"], r["store"]): r for r in dcs3gd_rows(bench, calibration)}
    worker = 1e-3 * 1 + 1e-4 * 2 + 1e-9 * 4 * 251_000      # one message, two keys
    ring = 2 * 1e-4 + 251_000 * 4 / 1e9
    compute = 0.01 + 0.1                                      # host around the device's hold
    quiet = rows[("negligible_comm", "dist_ssgd")]
    assert quiet["predicted_ms"] == pytest.approx(1e3 * (compute + worker + ring))
    loaded = rows[("comm_equals_compute", "dist_ssgd")]
    assert loaded["predicted_ms"] == pytest.approx(1e3 * (compute + worker + ring + 0.12))
    ratio = rows[("comm_equals_compute", "ratio")]
    hidden = compute + worker + max(ring + 0.12 - compute, 0.0)
    assert ratio["predicted_ratio"] == pytest.approx((compute + worker + ring + 0.12) / hidden)
    assert ratio["measured_ratio"] == pytest.approx(0.24 / 0.125)
    assert ratio["error"] == pytest.approx(ratio["predicted_ratio"] / ratio["measured_ratio"] - 1)
    assert ratio["measured_overlap"] == 0.95


def test_placement_is_the_partitioners():
    profile = ModelProfile("p", [1000, 250_000, 30, 7])
    held = profile.placement(2, bigarray_bound=100_000)
    part = Partitioner(2, 100_000)
    expect = [[0, 0], [0, 0]]
    for key, size in enumerate(profile.key_sizes):
        for block in part.blocks(key, size):
            expect[block.server][0] += 1
            expect[block.server][1] += block.size
    assert [h[:2] for h in held] == [tuple(e) for e in expect]
    assert held == [(3, 1000 + 125_000 + 30, 1), (2, 125_000 + 7, 1)]
    # a block travels in a frame of its own from 64 KB (16,384 float32) up, as transport packs
    frames = ModelProfile("f", [16_383, 16_384, 40_000]).placement(2, bigarray_bound=30_000)
    # 40,000 cut: 80 KB on each server, staged whole in server 0's buffer after 16,383
    # elements and a 4-byte gap (frame 0 takes those); server 1's half is not beside its
    # 16,384 elements (in server 1's buffer): a frame each
    assert [h[2] for h in frames] == [1, 2]
    from kvstore_ext.ps.transport import OWN_FRAME_BYTES, pack
    layout, _ = pack([memoryview(bytearray(4 * n)) for n in (16_383, 16_384)])
    assert [frame for frame, _, _ in layout] == [0, 1] and OWN_FRAME_BYTES == 4 * 16_384


def test_a_push_pays_for_its_own_frames_by_hand():
    # two workers, one server holding both keys; the 250,000-element key (1 MB) travels in a
    # frame of its own: a push costs 3.204 ms as in the BSP case plus 0.5 ms for its frame
    c = costs(server_frame=5e-4)
    place = busiest(PROFILE, 1, c, 2)
    assert (place["frames"], place["all_frames"]) == (1, 1)
    seconds, parts = one("dist_bsp", 2, c=c, server_frames=1, frames=1)
    assert parts["server CPU"] == pytest.approx(2 * 0.003704 + 0.000451)
    assert seconds == pytest.approx(0.1 + 0.002204 + 0.002208 + 2 * 0.003704 + 0.000451)
    p = predict(PROFILE, c, store="dist_bsp", workers=2, device_s=0.1, shared_host=False,
                host_compute=False)
    assert p.seconds == pytest.approx(seconds)
    # the busiest server is the one with the frames when they decide it: 4 small keys on
    # server 0 against one 64 KB key on server 1
    frame_heavy = ModelProfile("h", [10, 16_384, 10, 10, 10, 10, 10])
    assert busiest(frame_heavy, 2, costs(server_frame=5e-3), 1)["frames"] == 1
    assert busiest(frame_heavy, 2, costs(), 1)["frames"] == 0


def test_predict_names_the_bottleneck_and_refuses_an_unknown_store():
    p = predict(PROFILE, costs(), store="dist_bsp", workers=2, device_s=0.1, shared_host=False,
                host_compute=False, dataset_size=6400)
    assert p.bottleneck == "compute"
    assert p.samples_per_s == pytest.approx(2 * 64 / p.seconds)
    assert p.epoch_s == pytest.approx(6400 / p.samples_per_s)
    slow_server = costs(server_key=0.05)
    assert predict(PROFILE, slow_server, store="dist_bsp", workers=4, device_s=0.01,
                   shared_host=False).bottleneck == "server CPU"
    with pytest.raises(ValueError, match="dist_nope"):
        predict(PROFILE, costs(), store="dist_nope")
    with pytest.raises(ValueError, match="3 device times for 2 workers"):
        predict(PROFILE, costs(), workers=2, device_s=[0.1, 0.1, 0.1])


def test_uneven_asp_workers_add_their_rates():
    c = costs()
    fast = predict(PROFILE, c, store="dist_asp", workers=1, device_s=0.1, shared_host=False)
    slow = predict(PROFILE, c, store="dist_asp", workers=1, device_s=0.3, shared_host=False)
    both = predict(PROFILE, c, store="dist_asp", workers=2, device_s=[0.1, 0.3], shared_host=False)
    assert 2 / both.seconds == pytest.approx(1 / fast.seconds + 1 / slow.seconds)


@pytest.mark.parametrize("store", ["dist_bsp", "dist_asp"])
@pytest.mark.parametrize("n", [1, 4, 16, 64, 256])
def test_the_closed_form_and_the_simulator_agree_within_5_percent(store, n):
    """The simulator runs the store's real policy with the model's service times: the same
    pace, on homogeneous devices, from 1 to 256 workers (past the servers' knee for ASP)."""
    c = costs()
    closed = predict(PROFILE, c, store=store, workers=n, device_s=0.1, shared_host=False,
                     host_compute=False)
    from kvstore_ext.plan.model import server_service, simulated_time
    push_s, apply_s = server_service(c, busiest(PROFILE, 1, c, n))
    assert (push_s, apply_s) == pytest.approx((0.003204, 0.000451))
    sim = simulated_time(store, {}, [0.1] * n, 0.0, 0.002204 + 0.002208, push_s, apply_s, n,
                         200, 0, c, False)
    assert sim == pytest.approx(closed.seconds, rel=0.05)


def test_ssp_with_a_slow_worker_goes_to_the_simulator_and_keeps_its_pace():
    p = predict(PROFILE, costs(), store="dist_ssp", workers=4, device_s=[0.1, 0.1, 0.1, 0.3],
                shared_host=False, params={"staleness": 2})
    assert p.method == "simulator"
    # within the bound, the fast workers cannot get more than s ahead: all go at the slow pace
    assert 0.3 < p.seconds < 0.32


def test_the_simulator_serves_pushes_one_at_a_time():
    # BSP, 3 equal workers of 1 s: each round ends 3 x 0.1 + 0.05 after the pushes arrive, so
    # pushes arrive at 1 + 1.35k: 7 of them by t = 10 (10 without a server to wait for)
    served = simulate("dist_bsp", {}, [1.0] * 3, 10.0, service=0.1, apply_time=0.05)
    assert served.iterations == {0: 7, 1: 7, 2: 7}
    assert simulate("dist_bsp", {}, [1.0] * 3, 10.0).iterations == {0: 10, 1: 10, 2: 10}
    with pytest.raises(ValueError, match="service"):
        simulate("dist_bsp", {}, [1.0], 10.0, service=-1)


def test_search_equals_brute_force_on_a_small_space():
    c = costs(interference={1: 1.0, 2: 1.2, 4: 2.0}, server_frame=2e-4)
    profile = ModelProfile("toy", [1000, 250_000, 4000], compute_fixed=0.001,
                           compute_per_sample=0.0004, activation_elements_per_sample=5000)
    space = Space(workers=(1, 2, 3, 4, 6, 8), servers=(1, 2, 3), batch_sizes=(32, 64, 128),
                  stores=("dist_bsp", "dist_asp"), colocate=(False, True), machines=8,
                  memory_bytes=6e6, device_ms_at={32: 0.02, 64: 0.035, 128: 0.07})
    result = evaluate(profile, c, space, dataset_size=10_000)
    brute = []
    for n, s, b, store, col in itertools.product(space.workers, space.servers, space.batch_sizes,
                                                 space.stores, space.colocate):
        machines = max(n, s) if col else n + s
        if machines > space.machines or (col and s > n) or profile.memory_bytes(b) > 6e6:
            continue
        p = predict(profile, c, store=store, workers=n, servers=s, batch_size=b,
                    device_s=space.device_ms_at[b], shared_host=False, host_compute=False,
                    colocated=col)
        brute.append((-p.samples_per_s, machines, n, s, b, store, col))
    brute.sort(key=lambda r: (round(r[0], 6), r[1]))
    top = rank(result, 10)
    assert len(brute) == int(result["fits"].sum())
    assert [r["samples_per_s"] for r in top] == pytest.approx([-b[0] for b in brute[:10]])
    assert top[0]["machines"] == brute[0][1]
    assert (top[0]["workers"], top[0]["servers"], top[0]["batch_size"], top[0]["store"]) == \
        brute[0][2:6]
    k = knees(result)
    assert set(k) == {"dist_bsp", "dist_asp"}
    assert all(k[s]["knee"] in space.workers for s in k)


def test_a_search_of_100_000_configurations_takes_under_5_seconds():
    space = Space(workers=tuple(range(1, 257)), servers=tuple(range(1, 17)),
                  batch_sizes=(32, 64, 128, 256, 512), stores=("dist_bsp", "dist_asp", "dist_ssp"),
                  colocate=(False, True), machines=300,
                  device_ms_at={32: 0.01, 64: 0.02, 128: 0.04, 256: 0.08, 512: 0.16})
    assert space.size() >= 100_000
    t0 = time.perf_counter()
    result = evaluate(PROFILE, costs(), space)
    rank(result, 10)
    knees(result)
    assert time.perf_counter() - t0 < 5.0


def test_jobs_in_two_modes_are_summarised_by_a_trimmed_mean_not_a_median():
    """Runtime jobs fall in one of two modes; the median of 7 jumps to whichever mode holds
    4 of them, the trimmed mean moves by the share in each (and drops one stray each side)."""
    assert trimmed_mean([1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 50.0], drop=1) == pytest.approx(1.6)
    assert trimmed_mean([0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0], drop=1) == pytest.approx(1.8)
    assert trimmed_mean([3.0, 1.0, 2.0], drop=1) == pytest.approx(2.0)
    assert trimmed_mean([1.0, 4.0], drop=1) == pytest.approx(2.5)   # too few to trim: all


def test_a_cheap_function_is_called_often_enough_to_trim_a_stray_call():
    """``min_seconds`` gives a cheap call enough repetitions in each pass to last that long
    (capped), so the trimmed mean has calls to trim; a costly one keeps ``reps``."""
    calls = {"cheap": 0, "costly": 0}

    def cheap():
        calls["cheap"] += 1

    def costly():
        calls["costly"] += 1
        time.sleep(0.02)

    times = sample({"cheap": cheap, "costly": costly}, passes=2, reps=3, warmup=1,
                   min_seconds=0.01, max_reps=40)
    assert len(times["cheap"]) == 2 * 40 and calls["cheap"] == 1 + 2 * 40
    assert len(times["costly"]) == 2 * 3 and calls["costly"] == 1 + 2 * 3
    # without it, every function gets ``reps`` calls a pass, as before
    assert {k: len(v) for k, v in sample({"cheap": cheap}, 2, 3, 1).items()} == {"cheap": 6}


def test_fit_recovers_exact_coefficients():
    x = np.array([1.0, 2.0, 5.0, 9.0])
    k = np.array([3.0, 1.0, 4.0, 1.0])
    f = fit({"one": np.ones(4), "x": x, "k": k}, 2.0 + 3.0 * x + 0.5 * k)
    assert f["one"] == pytest.approx(2.0) and f["x"] == pytest.approx(3.0)
    assert f["k"] == pytest.approx(0.5) and f["r2"] == pytest.approx(1.0)


def test_a_relative_fit_keeps_a_small_intercept_under_proportional_noise():
    # a message's cost (1e-4 s) beside keys costing up to 256 x 3e-5 s: 3% noise on every
    # point, as run-to-run drift gives; the absolute fit lets the big points decide the
    # intercept, the relative one reads it from the small points
    keys = np.array([1, 2, 8, 8, 32, 64, 256, 256], dtype=float)
    truth = 1e-4 + 3e-5 * keys
    rng = np.random.default_rng(7)
    spread = {"absolute": [], "relative": []}
    for _ in range(40):
        y = truth * (1 + 0.03 * rng.standard_normal(len(keys)))
        for name, rel in (("absolute", False), ("relative", True)):
            f = fit({"msg": np.ones(len(keys)), "per_key": keys}, y, nonnegative=True,
                    relative=rel)
            spread[name].append(f["msg"])
    error = {k: np.median(np.abs(np.array(v) / 1e-4 - 1)) for k, v in spread.items()}
    assert error["relative"] < 0.05
    assert error["absolute"] > 2 * error["relative"]
    exact = fit({"msg": np.ones(len(keys)), "per_key": keys}, truth, relative=True)
    assert exact["msg"] == pytest.approx(1e-4) and exact["r2"] == pytest.approx(1.0)


def test_kendall_tau_and_the_knee_by_hand():
    assert kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0
    # 2 -> 4 adds 58% (> 2 x 5%); 4 -> 8 adds 6.7% (< 4 x 5%): the knee is 4
    assert knee_of({1: 100, 2: 190, 4: 300, 8: 320}) == 4
    assert knee_of({1: 100, 2: 200, 4: 400}) == 4


@pytest.mark.parametrize("store", ["dist_bsp", "dist_asp", "dist_ssgd", "dist_dcs3gd"])
@pytest.mark.parametrize("n,shared", [(2, False), (64, False), (8, True)])
def test_the_breakdown_adds_up_to_the_iteration(store, n, shared):
    seconds, parts = one(store, n, device=0.01, host=0.03, shared=shared,
                         c=costs(interference={1: 1.0, 8: 1.0}))
    assert sum(parts.values()) == pytest.approx(seconds)
    assert all(v >= 0 for v in parts.values())


def test_a_saturated_async_server_is_named_the_bottleneck():
    p = predict(PROFILE, costs(), store="dist_asp", workers=64, device_s=0.1, shared_host=False,
                host_compute=False)
    assert p.bottleneck == "server CPU"
    assert p.parts["server CPU"] == pytest.approx(p.seconds - 0.1 - 0.002204 - 0.002208)


def test_a_nonnegative_fit_keeps_costs_at_or_above_zero():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    y = np.array([0.9, 2.1, 2.9, 4.2]) - 0.3      # the best free intercept would be negative
    free = fit({"one": np.ones(4), "x": x}, y)
    kept = fit({"one": np.ones(4), "x": x}, y, nonnegative=True)
    assert free["one"] < 0 and kept["one"] == 0.0 and kept["x"] > 0
    assert 0.9 < kept["r2"] <= free["r2"]


def test_repeatability_compares_every_coefficient_and_each_environments_compute():
    from kvstore_ext.plan.calibrate import repeatability

    def calibration(scale):
        c = costs(interference={1: 1.0, 2: 1.2}, horovod_interference={1: 1.0, 2: 1.1 * scale},
                  allreduce_cpu_byte=5e-10).to_dict()
        return {"coefficients": c,
                "profiles": {"lenet": {"compute_per_sample": 2e-4,
                                       "horovod_compute_per_sample": 4e-4 * scale}}}
    rows = {r["coefficient"]: r for r in repeatability(calibration(1.0), calibration(1.25))}
    assert rows["horovod_interference@2"]["difference"] == pytest.approx(0.2)
    assert rows["lenet compute/sample (Horovod workers)"]["difference"] == pytest.approx(0.2)
    assert rows["interference@2"]["difference"] == 0.0
    assert rows["allreduce_cpu_byte"]["difference"] == 0.0
    assert "cores" not in rows and "interference" not in rows


def test_the_servers_own_optimizer_timing_is_fitted_beside_the_model_not_in_it():
    """Servers time their optimizer calls; calibrate fits that cost in place and reports it,
    while the push cost stays the server's CPU less the warm loop's optimizer, as the model
    (validated so) reads it."""
    from kvstore_ext.plan.calibrate import fit_runtime, optimizer_seconds
    msg, key, byte = 2e-4, 6e-6, 1e-9                    # the push: per message, key, byte
    call, per_key, per_param = 7e-5, 9e-7, 3.6e-9        # the optimizer in place
    warm = {"per_call": 7e-5, "per_key": 2.4e-7, "per_param": 1.4e-9}
    rows = []
    frame = 5e-5                                         # per array of 64 KB or more
    for keys, params, frames in ((1, 100, 0), (8, 800, 0), (512, 8192, 0), (16, 1 << 20, 16),
                                 (1, 800_000, 1), (64, 1 << 18, 0), (32, 1 << 19, 32)):
        rows.append({"keys": keys, "bytes": 4 * params, "frames": frames,
                     "worker_cpu_s": 1e-4 + 3e-5 * keys,
                     "server_optimizer_cpu_s": call + per_key * keys + per_param * params,
                     "server_cpu_s": optimizer_seconds(warm, keys, params)
                     + msg + key * keys + byte * 4 * params + frame * frames})
    out = fit_runtime(rows, warm)
    s, o = out["server_fit"], out["optimizer_in_place_fit"]
    assert (s["msg"], s["per_key"], s["per_byte"], s["per_frame"]) == pytest.approx(
        (msg, key, byte, frame))
    assert "per_frame" not in out["worker_fit"]
    assert (o["per_call"], o["per_key"], o["per_param"]) == pytest.approx(
        (call, per_key, per_param))
    assert rows[0]["server_push_cpu_s"] == pytest.approx(msg + key + 400 * byte)
    # a calibration made before the servers timed their optimizer has no such fit
    old = fit_runtime([{k: v for k, v in r.items() if k != "server_optimizer_cpu_s"}
                       for r in rows], warm)
    assert "optimizer_in_place_fit" not in old
    assert old["server_fit"]["per_byte"] == pytest.approx(byte)


def test_the_runtime_sets_frames_are_the_transports():
    """The frames the planner counts for each calibration set are those the transport makes of
    the set's gradients staged as a worker stages them (one staging buffer, side by side)."""
    from kvstore_ext.plan.calibrate import RUNTIME_SETS, set_frames
    from kvstore_ext.plan.jobs import model_shapes
    from kvstore_ext.ps.batching import Staging
    from kvstore_ext.ps.transport import pack
    for name in RUNTIME_SETS:
        sizes = [4 * int(np.prod(s)) for s in model_shapes(name)]
        views = [memoryview(seg.view(np.float32)).cast("B")
                 for seg in Staging(chunk_bytes=1 << 20).take(sizes)]
        _, frames = pack(views)
        assert set_frames(name) == len(frames) - 1, name
    # arrays side by side travel as one frame: a whole set, whatever its arrays' sizes
    assert {name: set_frames(name) for name in ("64x16384", "16x65536", "256x1024", "512x16",
                                                "8x100")} == \
        {"64x16384": 1, "16x65536": 1, "256x1024": 1, "512x16": 0, "8x100": 0}


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 40_000), min_size=1, max_size=12), st.integers(1, 3),
       st.integers(1_000, 50_000))
def test_the_frames_the_model_counts_are_those_the_transport_makes(sizes, servers, bound):
    """Any float32 key sizes (odd ones leave a gap after them), any servers and split bound:
    per server, the model's frames are pack's of the blocks a worker's push carries, staged
    as the store stages them."""
    import mxnet as mx
    from kvstore_ext.plan.model import staged_frames
    from kvstore_ext.ps.store import ParameterServerStore
    from kvstore_ext.ps.transport import pack
    kv = ParameterServerStore.__new__(ParameterServerStore)
    kv._type, kv._part = "dist_bsp", Partitioner(servers, bound)
    kv._meta = {k: ((n,), np.dtype("float32")) for k, n in enumerate(sizes)}
    plan = kv._plan("pushpull", [(k, mx.nd.ones((n,))) for k, n in enumerate(sizes)])
    model = staged_frames([plan.get(s, ((), (), ()))[2] for s in range(servers)])
    for server, (_, bufs, where) in plan.items():
        views = [memoryview(b).cast("B") for b in bufs]
        _, frames = pack(views) if len(views) > 1 else (None, [None] + [
            v for v in views if v.nbytes >= 1 << 16])
        assert model[server] == len(frames) - 1, (server, [(b.key, b.start, b.size) for b in where])


def test_calibrations_made_together_take_each_step_in_turn_in_alternating_order(monkeypatch):
    """``calibrate(runs=2)`` (``calibrate --repeat-out``): every step is measured for both
    calibrations before the next begins, A B then B A, each into its own result."""
    from kvstore_ext.plan import calibrate as cal
    log = []

    def steps(models, counts, quick):
        def measure(name):
            return lambda out: (log.append((name, out)), out.setdefault("steps", []).append(name))
        return [(name, measure(name)) for name in ("compute", "wire", "optimizer")]
    monkeypatch.setattr(cal, "calibration_steps", steps)
    monkeypatch.setattr(cal, "with_coefficients", lambda out: out)
    a, b = cal.calibrate(runs=2)
    assert a is not b
    assert [(name, "A" if out is a else "B") for name, out in log] == [
        ("compute", "A"), ("compute", "B"), ("wire", "B"), ("wire", "A"),
        ("optimizer", "A"), ("optimizer", "B")]
    assert a["steps"] == b["steps"] == ["compute", "wire", "optimizer"]
    assert (a["interleaved"], b["interleaved"]) == ({"run": 1, "of": 2}, {"run": 2, "of": 2})
    assert cal.interleaved_order(3, 1) == [2, 1, 0]
    single = cal.calibrate()
    assert isinstance(single, dict) and "interleaved" not in single


def test_calibrations_made_together_alternate_unit_by_unit_within_a_step(monkeypatch):
    """A measurement made of units (processes, rounds, jobs: a generator that yields after
    each) is taken unit by unit for both calibrations, the order reversed at every unit, and
    the order runs on across steps; each calibration gets its own result."""
    from kvstore_ext.plan import calibrate as cal
    log = []

    def units(name, count):
        def measure(out):
            for u in range(count):
                log.append((name, u, out))
                yield
            out[name] = [name] * count
        return measure
    monkeypatch.setattr(cal, "calibration_steps", lambda *a: [
        ("optimizer", units("optimizer", 3)),
        ("wire", lambda out: (log.append(("wire", 0, out)), out.update(wire=1))),
        ("runtime", units("runtime", 2))])
    monkeypatch.setattr(cal, "with_coefficients", lambda out: out)
    a, b = cal.calibrate(runs=2)
    order = [(name, u, "A" if out is a else "B") for name, u, out in log]
    assert order == [("optimizer", 0, "A"), ("optimizer", 0, "B"),
                     ("optimizer", 1, "B"), ("optimizer", 1, "A"),
                     ("optimizer", 2, "A"), ("optimizer", 2, "B"),
                     # the optimizer's fourth turn only returns; the wire's one unit is the 5th
                     ("wire", 0, "A"), ("wire", 0, "B"),
                     ("runtime", 0, "B"), ("runtime", 0, "A"),
                     ("runtime", 1, "A"), ("runtime", 1, "B")]
    for out in (a, b):
        assert out["optimizer"] == ["optimizer"] * 3 and out["wire"] == 1
        assert out["runtime"] == ["runtime"] * 2
    assert cal.measured(units("compute", 2)({})) is None
    assert cal.interleave([iter(())], 0) == ([None], 1)


# -- the host probe: a host that drifts after its calibration ------------------------------------
def test_a_host_twice_as_slow_doubles_every_cpu_second_and_keeps_the_device():
    """Every CPU coefficient doubles, bandwidths halve, ratios stay: a CPU-bound iteration
    takes twice as long, and a device-bound one's device time does not move."""
    c = costs(server_frame=1e-4, opt_call=1e-5, allreduce_cpu_latency=1e-5,
              allreduce_cpu_byte=1e-10, compute_cv={2: 0.1})
    slow = c.scaled(2.0)
    for name in Costs.CPU_SECONDS:
        assert getattr(slow, name) == pytest.approx(2 * getattr(c, name)), name
    assert (slow.bandwidth, slow.allreduce_bandwidth) == (c.bandwidth / 2, c.allreduce_bandwidth / 2)
    assert (slow.interference, slow.compute_cv, slow.cores) == (c.interference, c.compute_cv, c.cores)
    assert c.worker_msg == 1e-3          # a copy: the calibration's costs are unchanged
    # every field that is seconds of CPU is scaled or named as kept: a new one cannot be missed
    kept = {"interference", "horovod_interference", "compute_cv", "horovod_compute_cv", "cores",
            "bandwidth", "allreduce_bandwidth", "idle_factor"}
    assert set(Costs.__dataclass_fields__) == set(Costs.CPU_SECONDS) | kept
    profile = ModelProfile("toy", [1000, 250_000], compute_fixed=0.001, compute_per_sample=1e-4,
                           horovod_compute_fixed=0.002, horovod_compute_per_sample=2e-4)
    twice = profile.scaled(2.0)
    assert twice.host_time(64) == pytest.approx(2 * profile.host_time(64))
    assert twice.host_time(64, "dist_ssgd") == pytest.approx(2 * profile.host_time(64, "dist_ssgd"))
    assert ModelProfile("toy", [10]).scaled(3.0).horovod_compute_fixed is None
    kw = dict(store="dist_asp", workers=1, servers=1, batch_size=64, shared_host=False)
    cpu = predict(profile, c, device_s=[0.0], **kw).seconds
    assert predict(twice, slow, device_s=[0.0], **kw).seconds == pytest.approx(2 * cpu, rel=1e-6)
    # a 1 s device: only the CPU around it doubles
    on_device = predict(profile, c, device_s=[1.0], host_compute=False, **kw).seconds
    slow_device = predict(twice, slow, device_s=[1.0], host_compute=False, **kw).seconds
    assert slow_device - 1.0 == pytest.approx(2 * (on_device - 1.0), rel=1e-6)


def test_host_drift_is_the_median_probe_against_the_calibration_and_adjusts_the_rows():
    from kvstore_ext.plan.validate import (Case, adjusted, drift_warning, host_drift,
                                           probe_reference, summarise, table_rows)
    calibration = {
        "compute": {"lenet": {"batch_sizes": [16, 64], "seconds": [0.01, 0.03],
                              "fit": {"fixed": 0.0, "per_sample": 0.0005}}},
        "runtime": {"jobs": [{"set": "8x100", "worker_cpu_s": 9.0, "server_cpu_s": 9.0},
                             {"set": "lenet", "worker_cpu_s": 0.002, "server_cpu_s": 0.002}]},
        "coefficients": costs().to_dict(),
        "profiles": {"lenet": {"key_sizes": [1000, 250_000], "compute_fixed": 0.0,
                               "compute_per_sample": 0.0005}}}
    ref = probe_reference(calibration)
    assert ref == {"compute_s": 0.03, "worker_cpu_s": 0.002, "server_cpu_s": 0.002}
    probes = [{"compute_s": s, "worker_cpu_s": w, "server_cpu_s": 0.002}
              for s, w in ((0.033, 0.003), (0.036, 0.002), (0.090, 0.004))]
    drift = host_drift(probes, ref)
    assert drift["compute"] == pytest.approx(1.2)              # the median, not the stray probe
    assert drift["runtime"] == pytest.approx(0.005 / 0.004)
    assert "compute 20% slower" in drift_warning(drift) and "runtime 25% slower" in drift_warning(drift)
    assert drift_warning(host_drift([ref], ref)) is None
    # without the probe's batch, the calibration's fitted line at 64
    del calibration["compute"]["lenet"]["seconds"][1], calibration["compute"]["lenet"]["batch_sizes"][1]
    assert probe_reference(calibration)["compute_s"] == pytest.approx(0.032)

    cases = [Case("lenet", n, 1, st, "100ms", True) for n in (1, 2) for st in ("dist_bsp", "dist_asp")]
    measured = {c: [0.05, 0.06, 0.07] for c in cases}
    rows = table_rows(cases, measured, calibration, drift)
    for r in rows:
        assert r["measured_s"] == 0.06 and r["adjusted_predicted_s"] > r["predicted_s"]
        assert r["adjusted_error"] == pytest.approx(r["adjusted_predicted_s"] / 0.06 - 1)
    plain = table_rows(cases, measured, calibration)
    assert all("adjusted_error" not in r for r in plain)
    assert [r["predicted_s"] for r in plain] == [r["predicted_s"] for r in rows]
    again = summarise(adjusted(rows))
    assert again["median_abs_error"] == pytest.approx(
        float(np.median([abs(r["adjusted_error"]) for r in rows])))
    no_runtime = {**calibration, "runtime": {"jobs": []}}
    with pytest.raises(ValueError, match="no runtime job of 'lenet'"):
        probe_reference(no_runtime)
    with pytest.raises(ValueError, match="no compute of 'lenet'.*--models including lenet"):
        probe_reference({**calibration, "compute": {"cifar_resnet20_v1": {}}})


def test_jobs_are_summarised_per_round_without_the_highest_and_lowest_job():
    """calibrate's runtime and idle rounds and the host probe read a set of jobs alike."""
    from kvstore_ext.plan.jobs import per_round, round_cpu
    jobs = [{"rounds": 10, "comm_cpu_s": w, "servers": [{"cpu_s": s}]}
            for w, s in ((0.01, 0.5), (0.02, 0.02), (0.03, 0.04), (0.9, 0.03))]
    assert per_round(jobs, lambda r: r["comm_cpu_s"]) == pytest.approx(0.0025)
    assert round_cpu(jobs) == pytest.approx({"worker_cpu_s": 0.0025, "server_cpu_s": 0.0035})
