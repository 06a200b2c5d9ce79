"""Stock gluon.Trainer on real MNIST through launch.py, and equality with MXNet's dist_sync."""
import os

import mxnet as mx
import numpy as np
import pytest

from conftest import JOBS, ROOT, read_json

TRAIN = os.path.join(ROOT, "scripts", "train_mnist.py")


def load_params(path):
    return {k: v.asnumpy() for k, v in mx.nd.load(path).items()}


def test_dist_bsp_equals_native_dist_sync(run_job, tmp_path):
    """Same model, data and seeds, 2 workers, momentum SGD with weight decay: same weights."""
    common = ["--no-shuffle", "--max-steps", "12", "--lr", "0.05", "--momentum", "0.9",
              "--wd", "1e-3", "--batch-size", "32"]
    runs = {"native": ("dist_sync", "gluon", ["--backend", "mxnet"]),
            "bsp": ("dist_bsp", "gluon", []),
            "bsp_batched": ("dist_bsp", "batched", [])}
    params = {}
    for name, (kvstore, trainer, options) in runs.items():
        out = str(tmp_path / f"{name}-{{rank}}.params")
        code, log = run_job(2, 1, [TRAIN, "--kvstore", kvstore, "--trainer", trainer,
                                   "--save-params", out, *common], *options)
        assert code == 0, log[-3000:]
        params[name] = [load_params(out.replace("{rank}", str(r))) for r in range(2)]
    ref = params["native"][0]
    for name in ("bsp", "bsp_batched"):
        for rank in range(2):
            got = params[name][rank]
            assert got.keys() == ref.keys()
            for k in ref:
                rel = np.abs(got[k] - ref[k]).max() / max(np.abs(ref[k]).max(), 1e-12)
                assert rel <= 1e-5, f"{name} worker {rank} {k}: relative difference {rel}"
    # the weights did move: the comparison is not between two initialisations
    moved = [np.abs(ref[k]).sum() for k in ref]
    assert all(m > 0 for m in moved)


@pytest.mark.parametrize("kvstore,params", [("dist_bsp", []), ("dist_asp", []),
                                            ("dist_ssp", ["--kv-param", "staleness=2"]),
                                            ("dist_dssp", ["--kv-param", "staleness_lower=1",
                                                           "--kv-param", "staleness_upper=4"])])
def test_stock_gluon_trainer_reaches_95_percent(run_job, tmp_path, kvstore, params):
    """5 epochs.  After 4, dist_dssp (s in [1, 4]) reached 0.955-0.9725 over 3 quiet seeds but
    0.9485 once in a loaded suite run; after 5, 0.9685-0.974 (the bar stays at 0.95)."""
    out = str(tmp_path / "result-{rank}.json")
    code, log = run_job(2, 1, [TRAIN, "--kvstore", kvstore, "--epochs", "5", "--out", out], *params)
    assert code == 0, log[-3000:]
    for rank in range(2):
        result = read_json(out.replace("{rank}", str(rank)))
        assert result["test_accuracy"] >= 0.95, result
        assert result["kvstore_stats"]["type"] == kvstore
        assert result["kvstore_stats"]["worker"]["iterations"] == result["steps"]


@pytest.mark.parametrize("kvstore", ["dist_asp", "dist_bsp"])
def test_inference_between_steps_does_not_stall_the_store(run_job, kvstore):
    """Weights that MXNet keeps in an MKL-DNN layout still receive the pulled values."""
    code, log = run_job(2, 1, [os.path.join(JOBS, "inference_between_steps.py"),
                               "--kvstore", kvstore], timeout=120)
    assert code == 0, log[-3000:]
    assert log.count("steps done 12") == 2
