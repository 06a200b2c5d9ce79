"""scripts/bench_targets.py: each speed figure is the store's rate over MXNet's of the same
cluster, model and call pattern, beside its target."""
import importlib.util
import json
import os

import pytest

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "bench_targets.py")
spec = importlib.util.spec_from_file_location("bench_targets", SCRIPT)
targets = importlib.util.module_from_spec(spec)
spec.loader.exec_module(targets)


def rounds(model, w, s, store, rate):
    return {"model": model, "workers": w, "servers": s, "store": store, "rounds_per_s": rate}


def test_ratios_pair_each_store_with_mxnets_store_of_its_cluster(tmp_path):
    bench = [rounds("cifar_resnet20_v1", 2, 1, "native dist_sync list", 30.0),
             rounds("cifar_resnet20_v1", 2, 1, "dist_bsp list", 150.0),
             rounds("cifar_resnet20_v1", 4, 2, "native dist_sync list", 10.0),   # not its cluster
             rounds("cifar_resnet20_v1", 2, 1, "native dist_sync per-key", 40.0),
             rounds("cifar_resnet20_v1", 2, 1, "dist_bsp per-key", 60.0),
             rounds("lenet", 2, 1, "native dist_sync per-key", 100.0),
             rounds("lenet", 2, 1, "dist_bsp per-key", 130.0)]
    train = [{"case": "native dist_sync", "samples_per_s_per_worker": 1000.0},
             {"case": "dist_bsp (gluon.Trainer)", "samples_per_s_per_worker": 1100.0}]
    (tmp_path / "bench.json").write_text(json.dumps({"date": "d1", "rows": bench}))
    (tmp_path / "train.json").write_text(json.dumps({"date": "d2", "rows": train}))
    rows = {r["figure"]: r for r in targets.summary(str(tmp_path))}
    got = [(r["ratio"], r["met"]) for r in rows.values()]
    assert got == [(5.0, "met"), (1.5, "missed"), (None, None), (1.3, "met"), (None, None),
                   (pytest.approx(1.1), "met"), (None, None)]
    assert [r["target"] for r in rows.values()] == [4.0, 2.0, 1.5, 1.2, 1.2, 1.05, 1.05]


def test_a_folder_without_results_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        targets.main(["--bench", str(tmp_path)])
    assert str(tmp_path) in str(exc.value) and "bench_kvstore.py" in str(exc.value)
