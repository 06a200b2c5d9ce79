"""Virtual-time training end to end: ``python -m kvstore_ext.simulate --train`` on the
shipped config (16 virtual workers of LeNet on the MNIST digits), its records, table and
plots; reproduce.py runs a config's virtual cluster in process; every virtual config loads."""
import glob
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from kvstore_ext.experiments import ConfigError, load_experiment
from kvstore_ext.simulate.__main__ import run as run_simulate

VIRTUAL_CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "virtual", "*.yaml")))
SMALL = os.path.join(ROOT, "configs", "virtual", "mnist_16.yaml")


def simulate(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "kvstore_ext.simulate", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("path", VIRTUAL_CONFIGS, ids=os.path.basename)
def test_every_virtual_config_loads_and_dry_runs(path, capsys):
    """``simulate --train CONFIG --dry-run``, in this process (the command line runs below)."""
    exp = load_experiment(path)
    assert any(exp.is_virtual(c) for c in exp.clusters)
    assert run_simulate(["--train", path, "--dry-run"]) == 0, capsys.readouterr().err
    runs = [line for line in capsys.readouterr().out.splitlines() if line.startswith("# trial")]
    assert len(runs) == exp.trials * len(exp.clusters) * len(exp.paradigms)


@pytest.fixture(scope="module")
def sixteen(tmp_path_factory):
    """The 16-worker config's quick run of four paradigms, two at a time (``--jobs 2``):
    its folder and records."""
    out = tmp_path_factory.mktemp("sixteen") / "out"
    proc = simulate("--train", SMALL, "--quick", "--out", str(out), "--paradigm", "BSP",
                    "--paradigm", "SSP s=3", "--paradigm", "DSSP 3..15",
                    "--paradigm", "PSP c=0.75n", "--jobs", "2", timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads((out / "runs.json").read_text())["runs"]


def test_sixteen_virtual_workers_train_lenet_in_under_a_minute(sixteen):
    out, runs = sixteen
    assert [r["paradigm"] for r in runs] == ["BSP", "SSP s=3", "DSSP 3..15", "PSP c=0.75n"]
    for run in runs:
        assert run["virtual"] and run["workers"] == 16 and len(run["iterations"]) == 16
        # every push reached every server (PSP: 2 servers) and was applied or dropped
        servers = 2 if run["kvstore"] == "dist_psp" else 1
        assert sum(run["staleness"].values()) + run["pushes_dropped"] \
            == servers * sum(run["iterations"])
        assert 100 <= sum(run["iterations"]) <= 1000    # a few hundred iterations
        assert run["job_seconds"] < 40
        curve = run["curve"]
        assert curve[-1]["time_s"] == pytest.approx(2.0)   # the quick virtual horizon
        assert curve[-1]["test_accuracy"] > curve[0]["test_accuracy"] + 0.3, curve   # learns
    bsp, ssp, dssp, psp = runs
    # DSSP's controller, recorded as a real server's metrics record it, and its plot
    log = dssp["dssp"]
    assert log["staleness_lower"] == 3 and log["controller_calls"] == len(log["calls"]) > 0
    assert all(0 <= c["extra"] <= 12 and c["time"] <= 2.0 for c in log["calls"])
    assert all(r["dssp"] is None for r in (bsp, ssp, psp))
    assert set(bsp["staleness"]) == {"0"} and bsp["max_lead"] == 0
    assert max(map(int, ssp["staleness"])) > 0 and ssp["max_lead"] <= 3
    assert psp["pushes_dropped"] > 0
    # a straggler pattern makes BSP wait: SSP gets through more iterations in the same time
    assert sum(ssp["iterations"]) > sum(bsp["iterations"])
    for name in ("results.md", "results.csv", "accuracy_vs_time_transient.png",
                 "accuracy_vs_iterations_transient.png", "staleness_transient.png",
                 "test_error_vs_time_transient.png", "dssp_threshold_transient.png"):
        assert (out / name).stat().st_size > 0, name
    assert "| transient | SSP s=3 |" in (out / "results.md").read_text()


@pytest.mark.long
def test_a_study_run_in_parts_resumes_into_one_runs_json(tmp_path):
    """--resume keeps the records already in --out and runs only the plan's others: a study
    run a part at a time (or one that stopped) ends with one runs.json and one table."""
    config = tmp_path / "small.yaml"           # 4 workers: the records, not their number
    config.write_text(open(SMALL).read().replace("workers: 16", "workers: 4"))
    out = tmp_path / "out"
    first = simulate("--train", str(config), "--quick", "--out", str(out), "--paradigm", "BSP",
                     timeout=120)
    assert first.returncode == 0, first.stderr[-3000:]
    bsp, = json.loads((out / "runs.json").read_text())["runs"]
    again = simulate("--train", str(config), "--quick", "--out", str(out), "--paradigm", "BSP",
                     "--paradigm", "ASP", "--resume", timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 runs kept" in again.stderr and "1 to run" in again.stderr
    runs = json.loads((out / "runs.json").read_text())["runs"]
    assert [r["paradigm"] for r in runs] == ["BSP", "ASP"] and runs[0] == bsp
    table = (out / "results.md").read_text()
    assert "| transient | BSP |" in table and "| transient | ASP |" in table
    # records of another config are refused, naming it, and nothing runs
    other = tmp_path / "other"
    other.mkdir()
    (other / "runs.json").write_text(json.dumps({"config": "configs/other.yaml", "runs": []}))
    refused = simulate("--train", str(config), "--quick", "--out", str(other), "--resume",
                       timeout=60)
    assert refused.returncode == 2 and "configs/other.yaml" in refused.stderr
    assert json.loads((other / "runs.json").read_text())["runs"] == []


@pytest.mark.long
def test_runs_in_two_processes_give_the_same_records_as_in_one(tmp_path, sixteen):
    """--jobs 2 runs paradigms side by side (the 16-worker run); each run's curve,
    iterations and staleness are those of --jobs 1, bit for bit, and runs.json keeps the
    config's order whatever order --paradigm names them in."""
    out = tmp_path / "jobs1"
    proc = simulate("--train", SMALL, "--quick", "--out", str(out), "--paradigm", "SSP s=3",
                    "--paradigm", "BSP", "--jobs", "1", timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    alone = json.loads((out / "runs.json").read_text())["runs"]
    assert [r["paradigm"] for r in alone] == ["BSP", "SSP s=3"]
    side_by_side = {r["paradigm"]: r for r in sixteen[1]}
    for one in alone:
        two = side_by_side[one["paradigm"]]
        for key in ("paradigm", "curve", "iterations", "staleness", "final_accuracy"):
            assert one[key] == two[key], key


def test_reproduce_runs_a_virtual_cluster_beside_the_others(tmp_path):
    config = tmp_path / "mixed.yaml"
    config.write_text(open(SMALL).read().replace("workers: 16", "workers: 2")
                      .replace("patterns:", "workers: 4, patterns:"))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "reproduce.py"),
                           str(config), "--quick", "--paradigm", "ASP", "--out",
                           str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run, = json.loads((tmp_path / "out" / "runs.json").read_text())["runs"]
    assert run["workers"] == 4 and len(run["iterations"]) == 4 and run["virtual"]


@pytest.mark.parametrize("change,bad,says", [
    ("latency: 0.002", "latency: -1", "latency"),
    ("virtual: true, ", "virtual: false, ", "virtual"),
    ("virtual: true, ", "virtual: yes please, ", "virtual"),
    ("eval_every: 0.5", "eval_every_iterations: -20", "eval_every_iterations must be"),
    ("eval_every: 0.5", "eval_every: 0.5, eval_every_iterations: 20", "not both"),
    ("latency: 0.002", "compute: calibration, latency: 0.002", "compute: calibration needs"),
])
def test_bad_virtual_keys_name_the_key(tmp_path, change, bad, says):
    config = tmp_path / "bad.yaml"
    config.write_text(open(SMALL).read().replace(change, bad))
    with pytest.raises(ConfigError) as err:
        load_experiment(str(config))
    assert "clusters.transient" in str(err.value) and says in str(err.value)
