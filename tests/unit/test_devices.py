"""Emulated devices: profiles, device lists, straggler patterns by seed, the host's share,
``max(host, device)``, launch and config options, and DSSP as published against bounded."""
import argparse
import re
import statistics

import pytest

from gluon_trainers.straggler import EmulatedDevice
from kvstore_ext import devices
from kvstore_ext.devices import DeviceClock, parse_devices, parse_pattern, profile_ms
from kvstore_ext.launch.options import straggler_env
from kvstore_ext.policies import DSSPPolicy
from kvstore_ext.simulate import simulate


def test_profile_is_the_models_work_over_the_devices_throughput():
    macs = devices.MODELS["cifar_resnet110_v1"][0]
    ms = profile_ms("gtx1080ti", "cifar_resnet110_v1", 128)
    assert ms == pytest.approx(macs * 6 * 128 / (11.34e12 * devices.EFFICIENCY) * 1e3)
    assert 40 < ms < 80    # ResNet-110, batch 128, a GTX 1080 Ti
    # a GTX 1060 is slower by the ratio of peaks, and names are read loosely
    assert profile_ms("GTX-1060", "cifar_resnet110_v1", 128) / ms == pytest.approx(11.34 / 4.37)
    assert profile_ms("gtx1080ti", "cifar_resnet110_v1", 64) == pytest.approx(ms / 2)


@pytest.mark.parametrize("model,shape", [("lenet", (1, 28, 28)), ("alexnet_small", (1, 28, 28)),
                                         ("alexnet_small_cifar", (3, 32, 32))])
def test_profile_table_counts_are_the_models_own(model, shape):
    from gluon_trainers.models import MODELS, forward_macs
    net = MODELS[model.replace("_cifar", "")]()
    net.initialize()
    assert forward_macs(net, shape) == devices.MODELS[model][0]


def test_cifar_resnet20_count():
    from gluoncv.model_zoo import get_model
    from gluon_trainers.models import forward_macs
    net = get_model("cifar_resnet20_v1", classes=100)
    net.initialize()
    assert forward_macs(net, (3, 32, 32)) == devices.MODELS["cifar_resnet20_v1"][0]


def test_device_lists():
    assert parse_devices("200ms*3,0.5e3ms", 4) == [0.2, 0.2, 0.2, 0.5]
    assert parse_devices("150ms", 3) == [0.15] * 3
    pair = parse_devices("gtx1080ti,gtx1060", 2, "cifar_resnet110_v1", 128)
    assert pair[0] < pair[1]
    assert devices.count_devices("gtx1080ti*7,gtx1060") == 8


@pytest.mark.parametrize("text,workers,named", [
    ("gtx1080ti", 2, "needs a model"), ("titan", 1, "unknown device 'titan'"),
    ("0ms", 1, "'0ms' must be more than 0"), ("200ms*0", 1, "'200ms*0'"),
    ("200ms*x", 1, "'200ms*x'"), ("100ms,200ms", 3, "2 devices given"), ("100ms,,1ms", 3, "empty")])
def test_bad_devices_are_named(text, workers, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        parse_devices(text, workers)


def test_unknown_profile_model_is_named():
    with pytest.raises(ValueError, match="no profile for model 'vgg16'"):
        profile_ms("gtx1060", "vgg16", 128)


def run_clock(clock, iterations):
    t, out = 0.0, []
    for _ in range(iterations):
        d = clock.next_time(t)
        out.append((t, d, clock.last_factor))
        t += d
    return out


def test_jitter_statistics_and_seeds():
    times = [d for _, d, _ in run_clock(DeviceClock.from_specs("100ms", ["jitter:0.5"], 0, 2,
                                                                seed=1), 4000)]
    assert min(times) >= 0.05 and max(times) <= 0.15
    assert statistics.fmean(times) == pytest.approx(0.1, rel=0.02)
    again = [d for _, d, _ in run_clock(DeviceClock.from_specs("100ms", ["jitter:0.5"], 0, 2,
                                                                seed=1), 4000)]
    other = [d for _, d, _ in run_clock(DeviceClock.from_specs("100ms", ["jitter:0.5"], 1, 2,
                                                                seed=1), 4000)]
    assert times == again and times != other


def test_transient_stragglers_start_with_probability_p_and_last_their_length():
    p, f, length = 0.05, 3.0, 1.0
    run = run_clock(DeviceClock.from_specs("100ms", [f"transient:{p}:{f}:{length}"], 0, 1,
                                           seed=5), 20000)
    starts = [i for i in range(1, len(run)) if run[i][2] == f and run[i - 1][2] == 1]
    free = sum(1 for _, _, factor in run if factor == 1) + len(starts)
    rate = len(starts) / free
    assert abs(rate - p) < 4 * (p * (1 - p) / free) ** 0.5, rate
    for i in starts:   # a spell covers every iteration that starts within its length
        j = i
        while j < len(run) and run[j][2] == f:
            j += 1
        if j < len(run):
            assert run[j][0] >= run[i][0] + length - 1e-9
            assert run[j - 1][0] < run[i][0] + length or run[j - 1][2] == f


def test_rotating_and_slow_period():
    rot = [DeviceClock.from_specs("100ms", ["rotate:2:5"], r, 3) for r in range(3)]
    for t in (0.0, 4.9, 5.0, 12.0, 16.0):
        slow = [r for r in range(3) if rot[r].next_time(t) == pytest.approx(0.2)]
        assert slow == [int(t // 5) % 3]
    period = DeviceClock.from_specs("100ms", ["slow:4:10:20:1+2"], 2, 4)
    assert [period.next_time(t) for t in (9.9, 10, 19.9, 20)] == pytest.approx([0.1, 0.4, 0.4, 0.1])
    assert DeviceClock.from_specs("100ms", ["slow:4:10:20:1+2"], 0, 4).next_time(15) == 0.1


@pytest.mark.parametrize("spec,named", [
    ("sometimes:1", "unknown straggler pattern"), ("jitter:1.5", "jitter must be in"),
    ("transient:0.1:0.5:1", "slow-down factor must be >= 1"), ("transient:2:2:1", "probability"),
    ("rotate:2", "has 1 fields"), ("slow:2:5:1", "START < END"), ("slow:2:0:5:9", "no worker 9"),
    ("transient:a:2:1", "every field must be a number")])
def test_bad_patterns_are_named(spec, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        parse_pattern(spec, 0, 4, 0)


def test_iteration_lasts_the_longer_of_host_and_device():
    slept, clock_now = [], [100.0]
    dev = EmulatedDevice(DeviceClock(0.2), sleep=slept.append, wait_all=lambda: None,
                         now=lambda: clock_now[0])
    for host in (0.05, 0.3, 0.1):
        dev.begin()
        clock_now[0] += host
        dev.end()
        clock_now[0] += slept[-1] if slept and len(slept) == len(dev.rows) else 0
    assert [round(r["slept_s"], 9) for r in dev.rows] == [0.15, 0.0, 0.1]
    # each start from the first one's, and on the host's clock, which the workers share
    assert [r["start_s"] for r in dev.rows] == pytest.approx([0.0, 0.2, 0.5])
    assert [r["host_clock_s"] for r in dev.rows] == pytest.approx([100.0, 100.2, 100.5])
    assert slept == pytest.approx([0.15, 0.1])
    assert dev.host_share() == pytest.approx(0.5)   # median of 0.25, 1.5, 0.5
    assert dev.to_dict()["iterations"] == 3


def test_host_share_over_half_warns_once(capsys):
    t = [0.0]
    dev = EmulatedDevice(DeviceClock(0.1), rank=3, sleep=lambda s: None, wait_all=lambda: None,
                         now=lambda: t[0])
    for _ in range(25):
        dev.begin()
        t[0] += 0.08
        dev.end()
    err = capsys.readouterr().err
    assert err.count("worker 3: host work takes 80%") == 1


def launch_args(**kw):
    base = dict(num_workers=2, device=None, device_model=None, device_batch=None,
                straggler_pattern=[], worker_speed=None, speed_jitter=0.0, speed_seed=0)
    base.update(kw)
    return argparse.Namespace(**base)


def test_launch_options_become_the_workers_variables_and_bad_ones_are_named():
    env = straggler_env(launch_args(device="gtx1080ti,gtx1060", device_model="cifar_resnet110_v1",
                                    straggler_pattern=["jitter:0.1", "rotate:2:30"], speed_seed=4))
    assert env == {"KVX_DEVICE": "gtx1080ti,gtx1060", "KVX_SPEED_SEED": "4",
                   "KVX_STRAGGLER_PATTERNS": "jitter:0.1;rotate:2:30",
                   "KVX_DEVICE_MODEL": "cifar_resnet110_v1"}
    for kw, named in ((dict(device="gtx1060"), "needs a model"),
                      (dict(device="1ms", worker_speed="1,0.5"), "give one"),
                      (dict(straggler_pattern=["jitter:0.1"]), "needs --device"),
                      (dict(device="1ms", straggler_pattern=["jitter:2"]), "jitter:2")):
        with pytest.raises(SystemExit, match=named):
            straggler_env(launch_args(**kw))


def test_emulated_device_from_the_environment(monkeypatch):
    monkeypatch.setenv("KVX_DEVICE", "gtx1080ti*3,gtx1060")
    monkeypatch.setenv("KVX_DEVICE_MODEL", "cifar_resnet20_v1")
    monkeypatch.setenv("KVX_STRAGGLER_PATTERNS", "jitter:0.2")
    dev = EmulatedDevice.from_env(3, 4, batch_size=64)
    assert dev.clock.base == pytest.approx(profile_ms("gtx1060", "cifar_resnet20_v1", 64) / 1e3)
    assert len(dev.clock.patterns) == 1


def test_dssp_as_published_passes_the_upper_bound_and_bounded_never_does():
    pair = dict(devices="gtx1080ti,gtx1060", patterns=[], num_workers=2,
                model="cifar_resnet110_v1")
    leads = {}
    for rule in DSSPPolicy.RULES:
        r = simulate("dist_dssp", {"staleness_lower": 3, "staleness_upper": 15, "rule": rule},
                     None, 120.0, clocks=DeviceClock.for_cluster(**pair))
        leads[rule] = r.max_lead_at_ok
    assert leads["bounded"] <= 15 < leads["published"], leads


def test_published_rule_spends_extra_oks_one_per_push():
    policy = DSSPPolicy([0, 1], 1, 4, rule="published")
    t = 0.0
    oks = []
    # worker 0 pushes every 1 s, worker 1 every 3 s: 0 runs ahead and asks the controller
    events = sorted([(k * 1.0, 0) for k in range(1, 13)] + [(k * 3.0, 1) for k in range(1, 5)])
    waiting = set()
    for t, w in events:
        if w in waiting:
            continue
        d = policy.on_push(w, t)
        released = {x for x, _ in d.released}
        waiting -= released
        if w not in released:
            waiting.add(w)
        oks += [lead for x, lead in d.released if x == 0]
    assert policy.controller_calls >= 1
    assert max(oks) > 1   # past s_L on the controller's extra OKs
    with pytest.raises(ValueError, match="rule must be one of"):
        DSSPPolicy([0, 1], 1, 4, rule="paper")
