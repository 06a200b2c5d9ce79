"""MXNet behaviours a kvstore_ext job must keep, checked in real jobs started by launch.py.

- one array given several pulled values: the call returns, the last value wins as in MXNet;
- asynchronous stores follow gluon.Trainer's dist_async rule for update_on_kvstore;
- a worker of a job still has MXNet's own single-machine stores ('local', 'device');
- a Module script (``mod.fit``) trains under ``dist_bsp`` exactly as under ``dist_sync``.
"""
import os
import re
import sys

import mxnet as mx
import numpy as np
import pytest

from conftest import JOBS, LAUNCH, ROOT, read_json, tagged

# pull_same_array.py's pulls, as MXNet's own stores answer them (see the test below)
EXPECTED_PULLS = {"pull_keys": [30.0, 30.0], "pull_keys_reordered": [30.0, 30.0],
                  "pull_one_key": [10.0, 10.0], "pull_nested": [[20.0, 20.0], [20.0, 20.0]],
                  "pull_str_keys": [13.0, 13.0]}
ASYNC_ERROR = "ValueError: Please set update_on_kvstore=True when training in async mode."


def test_mxnet_local_store_writes_the_largest_key_last():
    """The rule the job below holds our stores to: MXNet's 'local' store, same calls."""
    kv, kv_str = mx.kv.create("local"), mx.kv.create("local")   # MXNet: one key type a store
    kv.init([3, 1, 2], [mx.nd.full((2,), v) for v in (30.0, 10.0, 20.0)])
    kv_str.init(["z", "a", "m"], [mx.nd.full((2,), v) for v in (26.0, 1.0, 13.0)])
    a, b = mx.nd.zeros((2,)), mx.nd.zeros((2,))
    got = {}
    kv.pull([3, 1, 2], out=[a, a, a])
    got["pull_keys"] = a.asnumpy().tolist()
    kv.pull([1, 3, 2], out=[a, a, a])
    got["pull_keys_reordered"] = a.asnumpy().tolist()
    kv.pull(1, out=[a, a, a])
    got["pull_one_key"] = a.asnumpy().tolist()
    kv.pull([2, 1], out=[[a, b], [b, a]])
    got["pull_nested"] = [a.asnumpy().tolist(), b.asnumpy().tolist()]
    kv_str.pull(["a", "m", "z"], out=[a, a, a])     # string keys: in the order first initialised
    got["pull_str_keys"] = a.asnumpy().tolist()
    assert got == EXPECTED_PULLS


@pytest.mark.parametrize("kvstore", ["dist_bsp", "dist_asp", "dist_psp"])
def test_one_array_receives_several_values(run_job, tmp_path, kvstore):
    out = str(tmp_path / "report.json")
    code, log = run_job(2, 2, [os.path.join(JOBS, "pull_same_array.py"), kvstore, out],
                        timeout=180)
    assert code == 0, log[-3000:]
    report = read_json(out)
    assert {k: report[k] for k in EXPECTED_PULLS} == EXPECTED_PULLS
    n = report["num_workers"]
    # pushpull into one array: key 3's new weight (30 less one per push applied so far)
    (a, b), (c, d) = report["pushpull_keys"], report["pushpull_one_key"]
    assert b == [30.0 - n] * 2 and d == [10.0 - 2 * n] * 2
    assert a[0] in [30.0 - i for i in range(1, n + 1)] and a[0] == a[1], report
    assert c[0] in [10.0 - n - i for i in range(1, n + 1)] and c[0] == c[1], report
    if kvstore != "dist_asp":                   # synchronous: every push is in
        assert a == b and c == d, report


def trainer_report(run_job, tmp_path, kvstore):
    out = str(tmp_path / "report")
    code, log = run_job(2, 1, [os.path.join(JOBS, "async_update_on_kvstore.py"), kvstore, out],
                        timeout=180)
    assert code == 0, log[-3000:]
    return [read_json(f"{out}.{rank}.json") for rank in range(2)]


@pytest.mark.parametrize("kvstore", ["dist_asp", "dist_ssp", "dist_dssp"])
def test_async_stores_follow_mxnet_dist_async_trainer_rule(run_job, tmp_path, kvstore):
    """As MXNet 1.9's nightly dist_async test_gluon_trainer_type, also with
    MXNET_UPDATE_ON_KVSTORE=0, for a store given by name or as an instance."""
    for report in trainer_report(run_job, tmp_path, kvstore):
        for env in ("None", "0"):
            for form in ("name", "instance"):
                key = f"env={env} {form} update_on_kvstore="
                assert report[key + "False"] == [ASYNC_ERROR, False], (key, report)
                assert report[key + "True"] == [True, True], (key, report)
                assert report[key + "None"] == [True, True], (key, report)
        assert report["env=0 step"] is True
        # a raw push with no optimizer is refused on the worker, saying why
        assert report["raw_push"].startswith("KVStoreError: "), report["raw_push"]
        assert "set_optimizer" in report["raw_push"] and "asynchronous" in report["raw_push"]
        assert report["asynchronous"] is True


@pytest.mark.parametrize("kvstore", ["dist_bsp", "dist_asp", "dist_psp"])
def test_one_store_given_to_two_trainers_never_trains_one_model_on_the_others_weights(
        run_job, kvstore):
    """One store object, ``kvstore=kv``, given to two models' Trainers: the second Trainer
    initialised keys 0 and 1 again from its own arrays, the store kept the first model's
    values, and the second model trained on them in silence, moving the first model's
    weights with its gradients (``tests/jobs/two_trainers.py one-store``: its weights, 5,
    became 0.4, and the first model's 0.2 instead of 0.4).  MXNet's ``local`` store refuses
    a repeated init, and its ``dist_sync`` hangs.  Now the second Trainer's first step is
    refused naming the key, the first model trains on as if it were alone, and the same
    array again is kept."""
    code, log = run_job(2, 1, [os.path.join(JOBS, "two_trainers.py"), kvstore, "one-store"],
                        timeout=120)
    assert code == 0, log[-3000:]
    reports = tagged(log, "TWO_TRAINERS")
    assert len(reports) == 2, log[-3000:]
    for r in reports:
        assert "second_model" not in r, r
        assert r["second_model_error"].startswith(f"{kvstore}: duplicate init of key 0: "), r
        assert r["second_model_after"] == [5.0] * 3, r
        assert r["same_array_again"] == "kept", r
        if kvstore != "dist_asp":
            # lr 0.1, a gradient of 1 per worker and step, summed over 2 workers
            assert r["first"] == pytest.approx([0.6] * 3, abs=1e-6), r
            assert r["first_after"] == pytest.approx([0.4] * 3, abs=1e-6), r
        else:   # the pushes of a step land one by one
            assert r["first_after"][0] < r["first"][0] < 1.0, r


@pytest.mark.parametrize("kvstore", ["dist_bsp", "dist_asp", "dist_psp"])
def test_a_second_trainers_store_never_trains_the_first_ones_weights(run_job, kvstore):
    """Two Trainers in one worker each make a store, and a process's stores share the
    servers' keys and optimizer.  A second model whose parameters had the shapes of the first
    one's (a GAN's generator and discriminator) used to be trained silently on the first
    model's weights, with its own optimizer for both (``tests/jobs/two_trainers.py``: its
    weights, 5 with lr 0, became the first model's; MXNet's own ``dist_sync`` hangs on a
    second store).  Now its first step is refused naming the key, and the first model's
    optimizer on the servers stays its own.  A Trainer made again over the same parameters
    still works, and the servers follow its optimizer."""
    code, log = run_job(2, 1, [os.path.join(JOBS, "two_trainers.py"), kvstore], timeout=120)
    assert code == 0, log[-3000:]
    reports = tagged(log, "TWO_TRAINERS")
    assert len(reports) == 2, log[-3000:]
    for r in reports:
        assert "second_model" not in r, r
        assert r["second_model_error"].startswith(f"{kvstore}: key 0 was initialised by another "
                                                  f"{kvstore} store of this process"), r
        if kvstore != "dist_asp":
            # 2 steps at lr 0.1, then 2 at 0.01 and 1 more after the refusal: a gradient of 1
            # per worker and step (two samples of ones, rescaled by 1/2), summed over 2 workers.
            # dist_psp (c = n) too: the Trainer made again used to stamp its first gradient
            # of the weight 0, and the servers, 2 rounds on, dropped it (0.58)
            assert r["same_parameters"] == pytest.approx([0.56] * 3, abs=1e-6), r
            assert r["first_after"] == pytest.approx([0.54] * 3, abs=1e-6), r
        else:
            # the pushes of a step land one by one, and nothing orders one worker's
            # set_optimizer (the Trainer made again, lr 0.01) after the other's last pushes at
            # lr 0.1 (seen once in CI, 0.76: k = 2): with k of the first 4 pushes applied at
            # 0.1 (k >= 2, a worker's own go first), 1 - 0.1 k - 0.01 (4 - k) = 0.96 - 0.09 k,
            # and a worker may read before the other's pushes are in: between 0.56 and 0.78
            assert all(0.55 < v < 0.79 for v in r["same_parameters"]), r
            assert r["first_after"][0] < r["same_parameters"][0], r   # lr 0.01, not 0


@pytest.mark.parametrize("kvstore", ["dist_bsp", "dist_psp"])
def test_synchronous_stores_keep_mxnet_update_on_kvstore_choice(run_job, tmp_path, kvstore):
    for report in trainer_report(run_job, tmp_path, kvstore):
        assert report["raw_push"] == "accepted"
        for env, default in (("None", True), ("0", False)):
            for form in ("name", "instance"):
                key = f"env={env} {form} update_on_kvstore="
                assert report[key + "False"] == [False, True], (key, report)
                assert report[key + "True"] == [True, True], (key, report)
                assert report[key + "None"] == [default, True], (key, report)
        assert report["env=0 step"] is False
        assert report["asynchronous"] is False


def test_mxnet_local_stores_work_in_a_job_worker(run_job, tmp_path):
    out = str(tmp_path / "report")
    code, log = run_job(2, 1, [os.path.join(JOBS, "local_stores_in_job.py"), out], timeout=180)
    assert code == 0, log[-3000:]
    for rank in range(2):
        report = read_json(f"{out}.{rank}.json")
        assert report["local"] == ["local", [2.0, 2.0]]
        assert report["device"] == ["device", [2.0, 2.0]]
        kv_type, weights = report["trainer"]
        assert kv_type == "device"
        # both devices' gradients summed (each sums 2 rows of ones), divided by 4: 1 - 0.1
        assert weights[0] == weights[1] == [[pytest.approx(0.9)] * 3]
        assert "unknown kvstore type 'dist_nonsense'" in report["dist_nonsense"]


MODULE_SCRIPT = os.path.join(ROOT, "scripts", "plain_module_mnist.py")


def module_run(run_job, tmp_path, kvstore, *args):
    backend = ["--backend", "mxnet"] if kvstore in ("dist_sync", "dist_async") else []
    weights = tmp_path / f"{kvstore}.npz"
    code, log = run_job(2, 1, [MODULE_SCRIPT, "--kvstore", kvstore, "--weights-out",
                               str(weights), *args], *backend, timeout=300)
    assert code == 0, log[-3000:]
    results = tagged(log, "RESULT")
    assert len(results) == 2, log[-3000:]
    with np.load(weights) as f:
        return results, {k: f[k] for k in f}


def test_module_fit_under_dist_bsp_equals_dist_sync(run_job, tmp_path):
    """MXNet's Module scales gradients by 1 / (batch x workers) on a store whose type holds
    '_sync', by 1 / batch otherwise: under dist_bsp, whose name does not, a Module script
    moved from dist_sync took twice its steps with 2 workers (0.89 against 0.9135 here, the
    weights far apart).  LeNet, momentum SGD at Module's lr 0.1 and batch 32, one epoch of
    125 steps: the same weights as dist_sync's, and dist_asp scaled as dist_async is."""
    native, native_weights = module_run(run_job, tmp_path, "dist_sync")
    mine, weights = module_run(run_job, tmp_path, "dist_bsp")
    assert [r["rescale_grad"] for r in native + mine] == [1 / 64] * 4
    assert native_weights.keys() == weights.keys()
    for k, ref in native_weights.items():
        rel = np.abs(weights[k] - ref).max() / max(np.abs(ref).max(), 1e-12)
        assert rel <= 1e-5, f"{k}: relative difference {rel}"
    assert min(r["accuracy"] for r in mine) >= 0.85, mine
    # an asynchronous store is scaled per push, as MXNet's dist_async (its lr 0.1 diverges
    # with Module on this script, as dist_async's does)
    asynchronous, _ = module_run(run_job, tmp_path, "dist_asp", "--lr", "0.02")
    assert [r["rescale_grad"] for r in asynchronous] == [1 / 32] * 2
    assert min(r["accuracy"] for r in asynchronous) >= 0.85, asynchronous


@pytest.mark.parametrize("kvstore,options", [("dist_bsp", []),
                                             ("dist_ssgd", ["--launcher", "horovod"])])
def test_an_unmodified_mxnet_script_names_the_stores(jobs, kvstore, options):
    """No ``import kvstore_ext`` in the script (as in MXNet's own examples, ``--kv-store
    dist_bsp``): launch.py's workers import it with mxnet.  Without that, MXNet gives the name
    to ps-lite, which dies on a missing DMLC_NUM_WORKER; --no-autoload keeps that behaviour."""
    script = [sys.executable, os.path.join(JOBS, "no_import.py"), kvstore]
    argv = [sys.executable, LAUNCH, "-n", "2", "-s", "1", "--launcher", "local", *options]
    job = jobs(argv + script)
    assert job.wait(180) == 0, job.output[-3000:]
    results = tagged(job.output, "RESULT")
    assert sorted(r["rank"] for r in results) == [0, 1], job.output[-3000:]
    for r in results:
        assert r["type"] == kvstore and r["module"].startswith("kvstore_ext."), r
        assert r["preloaded"] is True
    # one step, both workers' gradients [1, 2]: summed under dist_bsp (as dist_sync), their
    # mean under dist_ssgd (as Horovod's DistributedTrainer)
    step = 0.5 * (2 if kvstore == "dist_bsp" else 1)
    assert all(r["weight"] == [[1 - step, 1 - 2 * step]] for r in results), results
    if kvstore == "dist_bsp":
        refused = jobs(argv + ["--no-autoload"] + script)
        assert refused.wait(180) != 0
        assert "DMLC_NUM_WORKER" in refused.output, refused.output[-3000:]


def test_batchnorm_statistics_of_a_static_alloc_net_on_two_devices_reach_the_servers(run_job):
    """What Trainer's first step does, ten times on fresh nets: worker 0's running statistics
    after the forward pass are the ones initialised.  Before, worker 0's init read the arrays
    before a forward pass hybridized with static_alloc had written them in 3 of 5 jobs, and
    every worker trained from the initial statistics."""
    code, log = run_job(2, 1, [os.path.join(JOBS, "bn_static_alloc.py"), "dist_bsp"],
                        timeout=180)
    assert code == 0, log[-3000:]
    checks = re.findall(r"BNCHECK (\d) (\d+) of 10", log)
    assert sorted(r for r, _ in checks) == ["0", "1"], log[-3000:]
    assert all(lost == "0" for _, lost in checks), log[-3000:]
