"""DC-S3GD and its SSGD baseline on Horovod (Gloo), in real 2-worker jobs on 127.0.0.1."""
import os
import re
import signal
import sys
import time

import mxnet as mx
import numpy as np
import pytest

from conftest import (JOBS, LAUNCH, ROOT, job_processes_left, read_json, tagged,
                      wait_until)

pytest.importorskip("horovod.mxnet")

TRAIN = os.path.join(ROOT, "scripts", "train_dcs3gd.py")
EXACT = os.path.join(JOBS, "dcs3gd_exact.py")
sys.path.insert(0, JOBS)
import dcs3gd_exact as ex  # noqa: E402


def horovod_argv(command, *options, workers=2):
    return [sys.executable, LAUNCH, "-n", str(workers), "--launcher", "horovod", *options,
            sys.executable, *command]


@pytest.fixture
def run_hvd(jobs):
    def run(command, *options, env=None, timeout=180, workers=2):
        job = jobs(horovod_argv(command, *options, workers=workers),
                   env={"OMP_NUM_THREADS": "1", **(env or {})})
        return job.wait(timeout), job.output
    return run


# -- the correction, a pure function --------------------------------------------------------------
def correct_np(g, d, lambda0):
    h = g * g * d
    denom = np.linalg.norm(h)
    lam = lambda0 * np.linalg.norm(g) / denom if denom > 0 else 0.0
    return g + lam * h


def _on_ndarrays(g, d, lambda0):
    from kvstore_ext.horovod.store import delay_compensated
    return delay_compensated(mx.nd.array(g), mx.nd.array(d), lambda0).asnumpy()


def _on_host(g, d, lambda0):
    from kvstore_ext.horovod.store import delay_compensate_host
    buf = d.copy()
    out = delay_compensate_host(g, buf, lambda0)
    assert out is buf      # in place: the CPU path allocates nothing per step
    return out


@pytest.mark.parametrize("correct", [_on_ndarrays, _on_host], ids=["ndarray", "host"])
def test_correction_matches_numpy(correct):
    rng = np.random.RandomState(0)
    for shape in [(7,), (4, 3, 2)]:
        g = rng.normal(size=shape).astype(np.float32)
        d = (1e-3 * rng.normal(size=shape)).astype(np.float32)
        for lambda0 in (0.0, 0.2, 1.5):
            got = correct(g, d, lambda0)
            want = correct_np(g.astype(np.float64), d.astype(np.float64), lambda0)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
            # the correction is λ0 times as long as the gradient
            assert np.linalg.norm(got - g) == pytest.approx(lambda0 * np.linalg.norm(g), rel=1e-4)
    g = rng.normal(size=(5,)).astype(np.float32)
    zero = correct(g, np.zeros((5,), np.float32), 0.2)
    np.testing.assert_array_equal(zero, g)          # D = 0: λ = 0, nothing changes, no NaN


# -- the algorithm, step for step against numpy ---------------------------------------------------
def sgd(w, mom, g):
    """MXNet's momentum SGD: mom = μ·mom − η·(rescale·g + wd·w); w += mom."""
    mom = ex.MOMENTUM * mom - ex.LR * (ex.RESCALE * g + ex.WD * w)
    return w + mom, mom


def simulate_dcs3gd(lambda0, n=2):
    """DESIGN.md's loop, literally: w ← w + D + Δw, Δw = U(g̃) taken at w + D."""
    init = {k: ex.initial(0, k).astype(np.float64) for k in ex.SHAPES}
    w = [dict(init) for _ in range(n)]
    mom = [{k: np.zeros(s) for k, s in ex.SHAPES.items()} for _ in range(n)]
    delta = [dict() for _ in range(n)]
    mean = None
    for step in range(ex.STEPS):
        for i in range(n):
            for k in ex.SHAPES:
                g = ex.gradient(i, step, k).astype(np.float64)
                d = 0.0
                if mean is not None:
                    d = mean[k] - delta[i][k]
                    if lambda0:
                        g = correct_np(g, d, lambda0)
                new, mom[i][k] = sgd(w[i][k] + d, mom[i][k], g)
                delta[i][k] = new - (w[i][k] + d)
                w[i][k] = new
        mean = {k: sum(delta[i][k] for i in range(n)) / n for k in ex.SHAPES}
    synced = [{k: w[i][k] + mean[k] - delta[i][k] for k in ex.SHAPES} for i in range(n)]
    return w, synced


def simulate_ssgd(n=2):
    w = {k: ex.initial(0, k).astype(np.float64) for k in ex.SHAPES}
    mom = {k: np.zeros(s) for k, s in ex.SHAPES.items()}
    for step in range(ex.STEPS):
        for k in ex.SHAPES:
            g = sum(ex.gradient(i, step, k).astype(np.float64) for i in range(n)) / n
            w[k], mom[k] = sgd(w[k], mom[k], g)
    return [w] * n, [w] * n


def assert_close(got, want, what):
    rel = np.abs(got - want).max() / max(np.abs(want).max(), 1e-12)
    assert rel <= 1e-5, f"{what}: relative difference {rel}"


@pytest.mark.parametrize("store,lambda0,mkldnn", [("dist_dcs3gd", 0.0, "0"), ("dist_dcs3gd", 0.2, "0"),
                                                  ("dist_dcs3gd", 0.2, "1"), ("dist_ssgd", 0.0, "0")],
                         ids=["plain", "corrected", "corrected-ndarray-path", "ssgd"])
def test_steps_equal_the_algorithm(run_hvd, tmp_path, store, lambda0, mkldnn):
    """λ0 = 0 is the plain algorithm; λ0 = 0.2 adds the correction; SSGD is mean-gradient SGD.

    With MKL-DNN on, DC-S3GD takes its MXNet-operations path instead of the numpy one.
    """
    out = str(tmp_path / "w-{rank}.npz")
    code, log = run_hvd([EXACT, store, str(lambda0), out], env={"MXNET_MKLDNN_ENABLED": mkldnn})
    assert code == 0, log[-3000:]
    before, after = simulate_dcs3gd(lambda0) if store == "dist_dcs3gd" else simulate_ssgd()
    got = [np.load(out.replace("{rank}", str(r))) for r in range(2)]
    for r in range(2):
        for k in ex.SHAPES:
            assert_close(got[r][f"before_{k}"], before[r][k], f"{store} λ0={lambda0} worker {r} key {k}")
            assert_close(got[r][f"after_{k}"], after[r][k], f"synced worker {r} key {k}")
    if store == "dist_dcs3gd":   # every key step took the path asked for
        path, other = ("mxnet", "numpy") if mkldnn == "1" else ("numpy", "mxnet")
        assert int(got[0][f"path_{path}"]) == ex.STEPS * len(ex.SHAPES)
        assert int(got[0][f"path_{other}"]) == 0
    for k in ex.SHAPES:   # after sync_weights the workers hold the same weights, bit for bit
        np.testing.assert_array_equal(got[0][f"after_{k}"], got[1][f"after_{k}"])
    if store == "dist_dcs3gd":   # the workers did drift apart before the sync
        assert np.abs(got[0]["before_0"] - got[1]["before_0"]).max() > 1e-4
    if lambda0:
        plain, _ = simulate_dcs3gd(0.0)
        assert np.abs(plain[0][0] - before[0][0]).max() > 1e-5   # the correction did something


def load_params(path):
    return {k: v.asnumpy() for k, v in mx.nd.load(path).items()}


def test_identical_data_equals_single_process_momentum_sgd(run_hvd, jobs, tmp_path):
    common = ["--same-data", "--no-shuffle", "--max-steps", "15", "--lr", "0.05", "--momentum",
              "0.9", "--wd", "1e-3", "--batch-size", "32"]
    local = str(tmp_path / "local.params")
    # the same kernels as the Horovod workers, which launch.py starts without MKL-DNN
    job = jobs([sys.executable, TRAIN, "--kvstore", "local", "--save-params", local, *common],
               env={"OMP_NUM_THREADS": "1", "MXNET_MKLDNN_ENABLED": "0"})
    assert job.wait(180) == 0, job.output[-3000:]
    ref = load_params(local)
    for store in ("dist_dcs3gd", "dist_ssgd"):
        out = str(tmp_path / f"{store}-{{rank}}.params")
        code, log = run_hvd([TRAIN, "--kvstore", store, "--save-params", out, *common])
        assert code == 0, log[-3000:]
        for r in range(2):
            got = load_params(out.replace("{rank}", str(r)))
            assert got.keys() == ref.keys()
            for k in ref:
                assert_close(got[k], ref[k], f"{store} worker {r} {k}")


# -- overlap, measured ----------------------------------------------------------------------------
# The machine is shared and small, so "compute" is mostly simulated device time (held in MXNet's
# engine after the forward pass, taking no CPU) plus a small real LeNet step, and the allreduce is
# Horovod's real one plus injected wire time: CPU contention from elsewhere cannot swamp the figures.
DEVICE_S = 0.1


def step_time(run_hvd, tmp_path, store, sim_s, tag):
    out = str(tmp_path / f"{tag}-{{rank}}.json")
    code, log = run_hvd([TRAIN, "--kvstore", store, "--max-steps", "24", "--time-from", "6",
                         "--batch-size", "16", "--sim-compute-s", str(DEVICE_S), "--out", out],
                        env={"KVX_SIM_COMM_S": str(sim_s), "KVX_HVD_PROBE_EVERY": "1"})
    assert code == 0, log[-3000:]
    results = [read_json(out.replace("{rank}", str(r))) for r in range(2)]
    return max(r["step_time_s"] for r in results), results[0]["kvstore_stats"]["worker"]


@pytest.mark.long
def test_overlap_is_real(run_hvd, tmp_path):
    """Allreduce as long as the compute: DC-S3GD ≈ max of the two, SSGD ≈ their sum."""
    t_dc0, _ = step_time(run_hvd, tmp_path, "dist_dcs3gd", 0, "c")    # compute (+ hidden allreduce)
    t_ss0, _ = step_time(run_hvd, tmp_path, "dist_ssgd", 0, "s")      # compute + real allreduce
    inject = t_dc0                      # wire time per step: as long as the compute
    dc = [step_time(run_hvd, tmp_path, "dist_dcs3gd", inject, f"dc{i}") for i in range(2)]
    ss = [step_time(run_hvd, tmp_path, "dist_ssgd", inject, f"ss{i}") for i in range(2)]
    (t_dc, m_dc), (t_ss, m_ss) = min(dc, key=lambda x: x[0]), min(ss, key=lambda x: x[0])
    t_allreduce = m_dc["allreduce_time_s"]      # measured: injected wire time + Horovod's own
    report = (f"compute {t_dc0 * 1e3:.1f} ms (SSGD with its allreduce {t_ss0 * 1e3:.1f} ms); "
              f"allreduce {t_allreduce * 1e3:.1f} ms ({inject * 1e3:.1f} injected); iteration "
              f"DC-S3GD {t_dc * 1e3:.1f} ms, SSGD {t_ss * 1e3:.1f} ms; overlap "
              f"{m_dc['overlap']:.2f} vs {m_ss['overlap']:.2f}")
    print(report)
    assert inject * 0.9 <= t_allreduce <= 2 * inject, report
    assert t_dc <= 1.2 * max(t_dc0, t_allreduce), report
    assert 0.85 * (t_ss0 + inject) <= t_ss <= 1.3 * (t_ss0 + inject), report
    assert t_ss / t_dc >= 1.4, report
    # the stores' own metrics see it too
    assert m_dc["overlap"] > 0.6 and m_ss["overlap"] < 0.2, report
    assert m_dc["iterations"] == 24


# -- training -------------------------------------------------------------------------------------
@pytest.mark.long
def test_lenet_reaches_95_percent_close_to_ssgd(run_hvd, tmp_path):
    acc = {}
    for store in ("dist_dcs3gd", "dist_ssgd"):
        out = str(tmp_path / f"{store}-{{rank}}.json")
        metrics = tmp_path / f"metrics-{store}"
        code, log = run_hvd([TRAIN, "--kvstore", store, "--epochs", "3", "--out", out],
                            "--metrics-dir", str(metrics))
        assert code == 0, log[-3000:]
        results = [read_json(out.replace("{rank}", str(r))) for r in range(2)]
        assert results[0]["test_accuracy"] == results[1]["test_accuracy"]   # synced weights
        acc[store] = results[0]["test_accuracy"]
        stats = results[0]["kvstore_stats"]
        assert stats["type"] == store and stats["worker"]["iterations"] == results[0]["steps"]
        written = read_json(str(metrics / "worker-1.json"))
        assert written["rank"] == 1 and written["worker"]["iterations"] == results[1]["steps"]
        assert 0.0 <= written["worker"]["overlap"] <= 1.0
    assert acc["dist_dcs3gd"] >= 0.95, acc
    assert acc["dist_dcs3gd"] >= acc["dist_ssgd"] - 0.01, acc


@pytest.mark.long
def test_paper_schedule_trains_with_the_store(run_hvd, tmp_path):
    out = str(tmp_path / "r-{rank}.json")
    code, log = run_hvd([TRAIN, "--config", os.path.join(ROOT, "configs", "recipes", "dcs3gd_lenet_mnist_cpu.yaml"),
                         "--epochs", "2", "--out", out])
    assert code == 0, log[-3000:]
    result = read_json(out.replace("{rank}", "0"))
    assert result["test_accuracy"] >= 0.9, result
    assert result["lr_last"] == 0.0 and result["wd_last"] == 0.0   # decayed to zero at the end


# -- errors, job agreement, launcher --------------------------------------------------------------
def test_bad_parameters_name_the_key_and_value():
    import kvstore_ext
    with pytest.raises(ValueError, match="'lambda0'.*-1"):
        kvstore_ext.create("dist_dcs3gd", lambda0=-1)
    with pytest.raises(ValueError, match="unknown parameter 'staleness'.*dist_dcs3gd"):
        kvstore_ext.create("dist_dcs3gd", staleness=2)
    with pytest.raises(ValueError, match="unknown parameter 'lambda0'.*dist_ssgd"):
        kvstore_ext.create("dist_ssgd", lambda0=0.1)


def test_bad_keys_and_shapes_get_clear_errors():
    import kvstore_ext
    from kvstore_ext import KVStoreError
    kv = kvstore_ext.create("dist_dcs3gd", lambda0=0.1)   # one worker: Horovod size 1
    assert (kv.type, kv.params, kv.num_workers) == ("dist_dcs3gd", {"lambda0": 0.1}, 1)
    w = mx.nd.ones((2, 3))
    with pytest.raises(KVStoreError, match="set_optimizer"):
        kv.pushpull(0, mx.nd.ones((2, 3)), out=w)
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1))
    with pytest.raises(KVStoreError, match="key 7 has not been initialised"):
        kv.pushpull(7, mx.nd.ones((2, 3)), out=w)
    kv.broadcast(0, w, out=w)
    with pytest.raises(KVStoreError, match=r"key 0: pushed shape \(3, 2\).*\(2, 3\)"):
        kv.pushpull(0, mx.nd.ones((3, 2)), out=w)
    with pytest.raises(KVStoreError, match="key 0: pushed dtype float64"):
        kv.pushpull(0, mx.nd.ones((2, 3), dtype="float64"), out=w)
    with pytest.raises(KVStoreError, match=r"key 0 is already initialised with shape \(2, 3\)"):
        kv.init(0, mx.nd.ones((4,)))
    with pytest.raises(KVStoreError, match=r"key 0: out has shape \(6,\)"):
        kv.pushpull(0, mx.nd.ones((2, 3)), out=mx.nd.ones((6,)))
    kv.pushpull(0, mx.nd.ones((2, 3)), out=w)
    np.testing.assert_allclose(w.asnumpy(), 0.9)          # one worker: plain SGD
    g = mx.nd.ones((2, 3))
    kv.pushpull(0, g)     # no out: the new weights land in the value, as MXNet's stores do
    np.testing.assert_allclose(g.asnumpy(), 0.8, rtol=1e-6)
    kv.pull(0, out=w)
    np.testing.assert_allclose(w.asnumpy(), 0.8, rtol=1e-6)
    assert isinstance(kv, mx.kv.KVStoreBase) and mx.kv.create("dist_ssgd").type == "dist_ssgd"


DISAGREE = """
import os, kvstore_ext
kvstore_ext.create("dist_dcs3gd", lambda0=0.1 if os.environ["HOROVOD_RANK"] == "0" else 0.3)
"""

FAIL_ONE = """
import os, sys, time, mxnet as mx, kvstore_ext
kv = kvstore_ext.create("dist_ssgd")
if kv.rank == 1:
    sys.exit(3)
kv.barrier()          # worker 0 would wait for worker 1 here
time.sleep(600)
"""

SLEEP = """
import time, kvstore_ext
kv = kvstore_ext.create("dist_ssgd")
print("READY", kv.rank, flush=True)
time.sleep(600)
"""


def test_an_allreduce_that_does_not_end_is_reported_with_every_threads_stack(run_hvd, tmp_path):
    """Worker 1 stays away 12 s: worker 0's allreduces of step 1 cannot end, and the one
    watched is reported after the bound (3 s here), naming its step, with the stacks; worker 1
    reports nothing, and then the job ends as usual."""
    script = os.path.join(JOBS, "busy_elsewhere.py")
    t0 = time.monotonic()
    code, log = run_hvd([script, "dist_ssgd", "12"], env={"KVX_STALL_REPORT_S": "3"}, timeout=120)
    assert code == 0, log[-3000:]
    reports = re.findall(r"kvstore_ext dist_ssgd worker (\d): an allreduce of key \d+ \(step "
                         r"(\d+) or later\) has not ended after (\d+) s", log)
    # the newest allreduce worker 0 started when the reporter looked: step 1's, or step 2's
    assert reports and {w for w, _, _ in reports} == {"0"}, log[-3000:]
    assert {s for _, s, _ in reports} <= {"1", "2"}, reports
    assert len(reports) <= 2 and all(3 <= int(t) < 12 for _, _, t in reports), reports
    # worker 1, asleep in its script, still beats on the rendezvous server: named as heard
    # from, behind
    assert re.search(r"has not ended after \d+ s\. Waiting for: worker 1 heard from [\d.]+ s "
                     r"ago, its newest allreduce at step [01]\.", log), log[-3000:]
    lines = open(script).read().splitlines()
    at = next(i for i, line in enumerate(lines, 1) if "loss.asscalar()" in line)
    assert "Thread 0x" in log and f'busy_elsewhere.py", line {at}' in log   # the stacks
    assert "worker 0 step 2" in log and "worker 1 step 2" in log
    assert time.monotonic() - t0 < 60



@pytest.mark.long     # it waits on purpose for Gloo's timeout; the busy-elsewhere test above
# checks the heartbeats in the default suite
def test_a_frozen_worker_is_named_by_the_stall_report_and_by_the_failed_allreduces_error(
        run_hvd):
    """Worker 1 freezes (SIGSTOP) before step 1. Worker 0's stall report (bound 2 s) and, once
    Gloo's timeout (10 s) fails its allreduces, the error it exits with name worker 1 as not
    heard from, from the heartbeats both put on the launcher's rendezvous server; the job
    fails in bounded time (worker 1, still frozen, is stopped with it)."""
    script = os.path.join(JOBS, "frozen_peer.py")
    t0 = time.monotonic()
    code, log = run_hvd([script, "dist_ssgd", "60"], env={"KVX_STALL_REPORT_S": "2",
                                                         "HOROVOD_GLOO_TIMEOUT_SECONDS": "10"},
                        timeout=120)
    took = time.monotonic() - t0
    assert code != 0, log[-3000:]
    assert "worker 1 freezes" in log and "worker 0 step 0" in log
    # at the report (2 s), worker 1 may have frozen under a second before: named either way
    report = re.search(r"kvstore_ext dist_ssgd worker 0: an allreduce of key \d+ \(step [12] or "
                       r"later\) has not ended after \d+ s\. Waiting for: worker 1 (not heard "
                       r"from in the last [\d.]+ s \(its newest allreduce: step 0\)|heard from "
                       r"[\d.]+ s ago, its newest allreduce at step 0)\.", log)
    assert report, log[-4000:]
    # the error it exits with: a key's allreduce, or (if the script's read met it first) the
    # engine's last operation
    failed = re.search(r"kvstore_ext dist_ssgd worker 0: (an allreduce of key \d+ failed \(the "
                       r"last one started at step \d\)|an operation failed): .*Waiting for: "
                       r"worker 1 not heard from in the last ([\d.]+) s \(its newest allreduce: "
                       r"step 0\)\.", log)
    assert failed and float(failed.group(2)) >= 5, log[-4000:]
    assert took < 60, took


LAST_STEP_AT_EXIT = """
import sys, mxnet as mx
from mxnet import autograd, gluon
import kvstore_ext
kv = kvstore_ext.create(sys.argv[1])
net = gluon.nn.Dense(4096, in_units=1024)     # 4 M weights: the last allreduce still runs at exit
net.initialize(mx.init.Constant(0.01))
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)
for step in range(3):
    with autograd.record():
        loss = net(mx.nd.ones((2, 1024))).sum()
    loss.backward()
    trainer.step(2)
print(f"worker {kv.rank} done", flush=True)
"""


@pytest.mark.parametrize("store", ["dist_ssgd", "dist_dcs3gd"])
def test_a_script_that_ends_right_after_its_last_step_exits_cleanly(run_hvd, tmp_path, store):
    """A script's last ``trainer.step`` returns with its allreduces in flight.  Horovod's own
    exit handler shut Horovod down under them: every run printed "Horovod has been shut down"
    from MXNet's exit handler, and now and then the job never ended.  The store waits for
    them first."""
    script = tmp_path / "last_step.py"
    script.write_text(LAST_STEP_AT_EXIT)
    code, log = run_hvd([str(script), store], timeout=120)
    assert code == 0, log[-3000:]
    assert "worker 0 done" in log and "worker 1 done" in log, log[-3000:]
    assert "shut down" not in log and "Exception ignored" not in log, log[-3000:]


def test_a_bad_stall_bound_is_an_error_naming_it():
    import kvstore_ext
    os.environ["KVX_STALL_REPORT_S"] = "soon"
    try:
        with pytest.raises(ValueError, match="KVX_STALL_REPORT_S='soon'"):
            kvstore_ext.create("dist_ssgd")
    finally:
        del os.environ["KVX_STALL_REPORT_S"]


def test_workers_disagreeing_on_parameters_is_an_error(run_hvd, tmp_path):
    script = tmp_path / "disagree.py"
    script.write_text(DISAGREE)
    code, log = run_hvd([str(script)], timeout=120)
    assert code != 0
    assert "workers disagree" in log and "lambda0=0.1" in log and "lambda0=0.3" in log, log[-2000:]


MISMATCHED = """
import sys, mxnet as mx
from mxnet import autograd, gluon
import kvstore_ext
kv = kvstore_ext.create(sys.argv[1])
inputs = 3 if kv.rank == 0 else 5          # worker 1 builds another network
net = gluon.nn.Dense(4, in_units=inputs)
net.initialize()
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)
with autograd.record():
    loss = net(mx.nd.ones((2, inputs))).sum()
loss.backward()
try:
    trainer.step(2)
except kvstore_ext.KVStoreError as exc:
    print(f"worker {kv.rank} error: {exc}", flush=True)
    sys.exit(3)
print(f"worker {kv.rank} trained", flush=True)
"""


@pytest.mark.parametrize("store", ["dist_ssgd", "dist_dcs3gd"])
def test_workers_with_other_parameter_shapes_get_an_error_naming_the_key(run_hvd, tmp_path,
                                                                           store):
    """Worker 0's weight (key 1, after the bias) is 4 x 3, worker 1's 4 x 5: each worker is
    told which key and both shapes, before any broadcast (Horovod's own error, "Mismatched
    BROADCAST tensor shapes", names neither the key nor the workers)."""
    script = tmp_path / "mismatched.py"
    script.write_text(MISMATCHED)
    code, log = run_hvd([str(script), store], timeout=120)
    assert code == 3, log[-3000:]
    for me, other, mine, theirs in [(0, 1, "(4, 3)", "(4, 5)"), (1, 0, "(4, 5)", "(4, 3)")]:
        assert (f"worker {me} error: key 1: worker {me} initialises it with shape {mine} "
                f"float32, worker {other} with shape {theirs} float32") in log, log[-3000:]
    assert "trained" not in log and "Mismatched" not in log, log[-3000:]


@pytest.mark.parametrize("store", ["dist_ssgd", "dist_dcs3gd"])
def test_two_trainers_in_one_worker_train_their_own_weights(run_hvd, store):
    """A GAN's two Trainers each make a store.  Both stores named their collectives after the
    key alone, so on ``dist_dcs3gd`` (an allreduce in flight across steps) the second one's key
    0 met the first one's: Horovod refused the name, and the error surfaced only at exit as
    "Exception ignored in atexit callback", with exit status 0."""
    code, log = run_hvd([os.path.join(JOBS, "two_trainers.py"), store], timeout=120)
    assert code == 0, log[-3000:]
    assert "Exception ignored" not in log and "same name" not in log, log[-3000:]
    reports = tagged(log, "TWO_TRAINERS")
    assert len(reports) == 2, log[-3000:]
    for r in reports:
        assert r["second_model"] == [5.0] * 3, r          # lr 0: its own weights, untouched
        assert r["first_after"][0] < r["same_parameters"][0] < 1.0, r


@pytest.mark.parametrize("store", ["dist_ssgd", "dist_dcs3gd"])
def test_one_store_given_to_two_trainers_refuses_the_second_model(run_hvd, store):
    """One store object given to two models' Trainers (``kvstore=kv``): the second one's
    init of key 0 returned the first model's key, so the second model trained on the first
    one's weights (5 became 0.7) and moved them (0.6 instead of 0.7), in silence.  Now its
    first step is refused naming the key, and the first model trains on alone."""
    code, log = run_hvd([os.path.join(JOBS, "two_trainers.py"), store, "one-store"], timeout=120)
    assert code == 0, log[-3000:]
    reports = tagged(log, "TWO_TRAINERS")
    assert len(reports) == 2, log[-3000:]
    for r in reports:
        assert r["second_model_error"].startswith(f"{store}: duplicate init of key 0: "), r
        assert r["second_model_after"] == [5.0] * 3, r
        assert r["same_array_again"] == "kept", r
        # lr 0.1, a gradient of 1 on each worker, averaged
        assert r["first"] == pytest.approx([0.8] * 3, abs=1e-6), r
        assert r["first_after"] == pytest.approx([0.7] * 3, abs=1e-6), r


def test_a_failing_worker_stops_the_job(run_hvd, tmp_path):
    script = tmp_path / "fail_one.py"
    script.write_text(FAIL_ONE)
    t0 = time.monotonic()
    code, log = run_hvd([str(script)], timeout=120)
    # worker 1 exits 3; Horovod then also stops worker 0 (status 1): either is the first seen
    assert code in (1, 3), log[-2000:]
    assert "exited with status" in log and "stopping the job" in log
    assert time.monotonic() - t0 < 60
    assert wait_until(lambda: not job_processes_left(str(script)), 10)


def test_ctrl_c_stops_every_worker(jobs, tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEP)
    job = jobs(horovod_argv([str(script)]))
    assert wait_until(lambda: len(job_processes_left(str(script))) >= 3, 60)  # launcher + 2
    time.sleep(3)   # both workers past Horovod's rendezvous
    os.kill(job.proc.pid, signal.SIGINT)
    code = job.wait(30)
    assert code == 128 + signal.SIGINT, job.output[-2000:]
    assert wait_until(lambda: not job_processes_left(str(script)), 10)


# -- the paper's recipes --------------------------------------------------------------------------
def test_table_one_recipes_and_missing_imagenet_files(jobs, tmp_path):
    import glob
    import yaml
    recipes = sorted(glob.glob(os.path.join(ROOT, "configs", "recipes", "dcs3gd_*_imagenet_*.yaml")))
    rows = set()
    for path in recipes:
        with open(path) as f:
            r = yaml.safe_load(f)
        assert r["batch_size"] * r["num_workers"] == r["batch_size_global"], path
        assert (r["kvstore"], r["lambda0"], r["schedule"], r["epochs"]) == ("dist_dcs3gd", 0.2, "paper", 90)
        rows.add((r["model"], r["batch_size_global"] // 1024, r["num_workers"]))
    assert rows == {("resnet50_v1", 16, 32), ("resnet50_v1", 32, 32), ("resnet50_v1", 32, 64),
                    ("resnet50_v1", 64, 64), ("resnet50_v1", 64, 128), ("resnet50_v1", 128, 128),
                    ("resnet101_v1", 64, 64), ("resnet152_v1", 32, 64), ("vgg16", 16, 64)}
    job = jobs([sys.executable, TRAIN, "--config", recipes[0], "--data-dir", str(tmp_path)])
    assert job.wait(60) != 0
    assert str(tmp_path / "train.rec") in job.output and str(tmp_path / "val.rec") in job.output
