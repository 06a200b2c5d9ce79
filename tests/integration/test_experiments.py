"""Experiment configs: every file in configs/ loads and dry-runs; bad ones name the key;
the time-to-accuracy reduction; and one short real run of reproduce.py end to end."""
import glob
import os
import subprocess
import sys

import pytest

from conftest import ROOT, read_json
from kvstore_ext.experiments import (ConfigError, load_experiment, median_run, summarise,
                                     time_to_accuracy)
from kvstore_ext.reproduce import main as reproduce_main

CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))
REPRODUCE = os.path.join(ROOT, "scripts", "reproduce.py")


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_every_config_loads_and_dry_runs(path, capsys):
    """reproduce.py's --dry-run, in this process (the command line itself runs below)."""
    exp = load_experiment(path)
    assert exp.paradigms and exp.clusters
    assert reproduce_main([path, "--dry-run"]) == 0, capsys.readouterr().err
    commands = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert len(commands) == exp.trials * len(exp.clusters) * len(exp.paradigms)
    assert all("launch.py" in c and ("--worker-speed" in c or "--device" in c) for c in commands)


def write(tmp_path, text):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return str(path)


GOOD = """
name: t
script: scripts/train_mnist.py
workers: 2
clusters: {mixed: [1.0, 0.43]}
targets: [0.9]
paradigms:
  - {name: BSP, kvstore: dist_bsp}
  - {name: DSSP, kvstore: dist_dssp, params: {staleness_lower: 1, staleness_upper: 4}}
"""


@pytest.mark.parametrize("change,match", [
    (("targets: [0.9]", "targets: [0.9]\nepochz: 3"), "unknown key 'epochz'"),
    (("{name: BSP, kvstore: dist_bsp}", "{name: BSP, kvstore: dist_bsp, stalness: 2}"),
     r"paradigms\[0\]: unknown key 'stalness'"),
    (("staleness_upper: 4", "staleness_upper: 0"), "staleness_upper must be >= staleness_lower"),
    (("dist_bsp", "dist_nope"), "unknown kvstore 'dist_nope'"),
    (("[1.0, 0.43]", "[1.0, 0.43, 1.0]"), "clusters.mixed: 3 worker speeds"),
    (("[1.0, 0.43]", "[1.0, 0]"), r"clusters.mixed: worker speed 0.0 must be in \(0, 1\]"),
    (("targets: [0.9]", "targets: [90]"), "targets must be a list of accuracies"),
    (("workers: 2", "workers: zero"), "workers must be an integer"),
    (("name: BSP, kvstore: dist_bsp", "name: DSSP, kvstore: dist_bsp"), "'DSSP' is used twice"),
    (("[1.0, 0.43]", "{speeds: [1.0, 0.43], delay_replies: '2:1'}"),
     r"clusters.mixed: --delay-replies: the fraction must be in \[0, 1\]"),
    (("[1.0, 0.43]", "{speeds: [1.0, 0.43], slow_server: '3:1'}"),
     "clusters.mixed: --slow-server: server 3 does not exist"),
    (("[1.0, 0.43]", "{speeds: [1.0, 0.43], slow_servr: '0:1'}"),
     "clusters.mixed: unknown key 'slow_servr'"),
    (("{name: BSP, kvstore: dist_bsp}", "{name: PSP, kvstore: dist_psp, params: {min_pushes: 0}}"),
     r"paradigms\[0\]: min_pushes=0 must be >= 1"),
])
def test_bad_configs_name_the_key(tmp_path, change, match):
    old, new = change
    assert old in GOOD
    with pytest.raises(ConfigError, match=match):
        load_experiment(write(tmp_path, GOOD.replace(old, new, 1)))


def test_a_paradigms_args_are_its_runs_only_and_quick_still_shortens_them(tmp_path):
    text = GOOD.replace("{name: BSP, kvstore: dist_bsp}",
                        "{name: BSP, kvstore: dist_bsp, args: {lr: 0.5, momentum: 0.9}}")
    text += "args: {lr: 0.05, max-time: 30}\nquick: {max-time: 2}\n"
    exp = load_experiment(write(tmp_path, text))
    bsp, dssp = exp.paradigms
    assert exp.run_args(bsp) == {"lr": 0.5, "max-time": 30, "momentum": 0.9}
    assert exp.run_args(dssp) == {"lr": 0.05, "max-time": 30}
    assert exp.run_args(bsp, quick=True)["max-time"] == 2
    assert exp.script_args(bsp) == ["--lr", "0.5", "--max-time", "30", "--momentum", "0.9"]
    with pytest.raises(ConfigError, match=r"paradigms\[0\]: args must be a mapping"):
        load_experiment(write(tmp_path, GOOD.replace("{name: BSP, kvstore: dist_bsp}",
                                                     "{name: BSP, kvstore: dist_bsp, args: 3}")))


def test_seed_by_trial_gives_each_launched_trial_its_own_seed(tmp_path):
    from kvstore_ext.reproduce import job_command
    exp = load_experiment(write(tmp_path, GOOD + "seed_by_trial: true\n"))
    bsp = exp.paradigms[0]
    _, command = job_command(exp, bsp, "mixed", str(tmp_path), False, trial=2)
    assert command[command.index("--seed") + 1] == "2"
    plain = load_experiment(write(tmp_path, GOOD))
    _, command = job_command(plain, bsp, "mixed", str(tmp_path), False, trial=2)
    assert "--seed" not in command                  # the script's own default, every trial
    for bad, match in [("seed_by_trial: 1\n", "seed_by_trial must be true or false, got 1"),
                       ("seed_by_trial: true\nargs: {seed: 3}\n",
                        "give seed_by_trial .* or args: seed, not both")]:
        with pytest.raises(ConfigError, match=match):
            load_experiment(write(tmp_path, GOOD + bad))


def test_cluster_faults_and_env_become_launch_options(tmp_path):
    text = GOOD.replace("[1.0, 0.43]", "{speeds: [1.0, 0.43], delay_replies: '0.01:2', "
                                       "fault_seed: 4}") + "env: {KVX_BIGARRAY_BOUND: 100}\n"
    exp = load_experiment(write(tmp_path, text))
    assert exp.clusters["mixed"] == [1.0, 0.43]
    assert exp.launch_options("mixed") == ["--delay-replies", "0.01:2", "--fault-seed", "4",
                                           "--env", "KVX_BIGARRAY_BOUND:100"]


def test_cluster_speed_jitter_becomes_launch_options(tmp_path):
    text = GOOD.replace("[1.0, 0.43]", "{speeds: [1.0, 1.0], speed_jitter: 0.8, speed_seed: 3}")
    exp = load_experiment(write(tmp_path, text))
    assert exp.clusters["mixed"] == [1.0, 1.0]
    assert exp.launch_options("mixed") == ["--speed-jitter", "0.8", "--speed-seed", "3"]
    for bad, match in [("speed_jitter: 1.2", "speed_jitter must be a number in \\[0, 1\\), got 1.2"),
                       ("speed_jitter: fast", "speed_jitter must be a number"),
                       ("speed_seed: 0.5", "speed_seed must be an integer, got 0.5")]:
        broken = GOOD.replace("[1.0, 0.43]", "{speeds: [1.0, 1.0], %s}" % bad)
        with pytest.raises(ConfigError, match=match):
            load_experiment(write(tmp_path, broken))


def test_cluster_of_emulated_devices_becomes_launch_options(tmp_path):
    text = GOOD.replace("[1.0, 0.43]", "{device: 'gtx1080ti,gtx1060', device_model: "
                                       "cifar_resnet110_v1, device_batch: 128, patterns: "
                                       "['jitter:0.1', 'rotate:2:30'], speed_seed: 2}")
    exp = load_experiment(write(tmp_path, text))
    assert exp.uses_devices("mixed")
    assert exp.clusters["mixed"][0] == 1.0 and 0.38 < exp.clusters["mixed"][1] < 0.39
    assert exp.launch_options("mixed") == [
        "--device", "gtx1080ti,gtx1060", "--device-batch", "128",
        "--device-model", "cifar_resnet110_v1",
        "--straggler-pattern", "jitter:0.1", "--straggler-pattern", "rotate:2:30",
        "--speed-seed", "2"]
    clocks = exp.device_clocks("mixed")
    assert [len(c.patterns) for c in clocks] == [2, 2]
    assert clocks[1].base > clocks[0].base
    for bad, match in [("{device: titan}", "clusters.mixed: unknown device 'titan'"),
                       ("{device: 10ms, patterns: ['often:1']}", "unknown straggler pattern"),
                       ("{device: 10ms, speeds: [1.0, 1.0]}", "device .* or speeds, not both"),
                       ("{speeds: [1.0, 1.0], patterns: ['jitter:0.1']}", "patterns needs device"),
                       ("{device: gtx1060}", "needs a model to time")]:
        with pytest.raises(ConfigError, match=match):
            load_experiment(write(tmp_path, GOOD.replace("[1.0, 0.43]", bad)))


def test_bad_config_fails_the_script_cleanly(tmp_path):
    path = write(tmp_path, GOOD.replace("targets: [0.9]", "targets: [0.9]\nepochz: 3"))
    proc = subprocess.run([sys.executable, REPRODUCE, path, "--dry-run"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "epochz" in proc.stderr and "Traceback" not in proc.stderr


def test_time_to_accuracy_and_median_trial():
    curve = [{"time_s": 1.0, "test_accuracy": 0.5}, {"time_s": 2.0, "test_accuracy": 0.91},
             {"time_s": 3.0, "test_accuracy": 0.89}, {"time_s": 4.0, "test_accuracy": 0.95}]
    assert time_to_accuracy(curve, 0.9) == 2.0 and time_to_accuracy(curve, 0.99) is None
    runs = [{"trial": t, "cluster": "c", "paradigm": "P", "final_accuracy": a, "curve": curve,
             "train_time_s": 4.0} for t, a in enumerate([0.97, 0.93, 0.95])]
    assert median_run(runs)["trial"] == 2
    row = summarise(runs, [0.9, 0.99])[0]
    assert row["median_trial"] == 2 and row["time_to_0.9"] == 2.0
    assert row["time_to_0.99"] is None and row["reached_0.99"] == "0/3"


def test_ratios_to_bsp_where_bsp_or_the_other_falls_short():
    slow = [{"time_s": 1.0, "test_accuracy": 0.5}, {"time_s": 4.0, "test_accuracy": 0.95}]
    fast = [{"time_s": 1.0, "test_accuracy": 0.95}]
    runs = [{"trial": 0, "cluster": "c", "paradigm": p, "final_accuracy": 0.95, "curve": c,
             "train_time_s": 4.0} for p, c in [("BSP", slow), ("ASP", fast)]]
    rows = {r["paradigm"]: r for r in summarise(runs, [0.9, 0.99])}
    assert rows["ASP"]["vs_bsp_0.9"] == pytest.approx(0.25) and rows["BSP"]["vs_bsp_0.9"] == 1.0
    assert rows["ASP"]["vs_bsp_0.99"] is None  # BSP never reached it: no ratio, no error
    # the order of the rows does not matter
    rows = {r["paradigm"]: r for r in summarise(runs[::-1], [0.9])}
    assert rows["ASP"]["vs_bsp_0.9"] == pytest.approx(0.25)


@pytest.mark.long
def test_demo_quick_runs_end_to_end_and_prints_its_table(tmp_path):
    """make demo in its short form: five paradigms on the emulated mixed pair, the table, both
    plots, and the one-line takeaway; DSSP as published passes s_U, the bounded rule never."""
    out = str(tmp_path / "demo")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "demo.py"), "--quick",
                           "--out", out], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("results.md", "results.csv", "runs.json", "accuracy_vs_time_mixed.png",
                 "dssp_threshold_mixed.png"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    # the printed table: one row per paradigm, with the accuracy and the iterations per worker
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines()
            if line.startswith("| mixed |")]
    assert [r[1].strip() for r in rows] == ["BSP", "ASP", "SSP s=3", "DSSP 3..15",
                                            "DSSP 3..15 published"]
    for r in rows:
        assert 0.1 <= float(r[2]) <= 1.0
    runs = read_json(os.path.join(out, "runs.json"))["runs"]
    by_name = {r["paradigm"]: r for r in runs}
    bsp, asp = by_name["BSP"], by_name["ASP"]
    assert abs(bsp["iterations"][0] - bsp["iterations"][1]) <= 1       # BSP: in lock step
    assert asp["iterations"][0] > 1.3 * asp["iterations"][1]           # ASP: the fast one runs on
    assert by_name["DSSP 3..15"]["dssp"]["controller_calls"] > 0
    assert by_name["DSSP 3..15"]["max_lead"] <= 15 < by_name["DSSP 3..15 published"]["max_lead"]
    assert len(bsp["curve"]) >= 2
    # emulated devices: every host kept up with its device (its median iteration's compute
    # within the device time, so that the iterations last the device's times), and the
    # takeaway is printed.  Not the workers' warning line of half the device time: on a
    # loaded or slow host the fast worker's share reached 0.86 in BSP (2026-11-29) where it
    # is about 0.3 on a quiet one, and the demo then warns but still runs at the devices' pace
    assert all(share < 1 for r in runs for share in r["host_share"])
    assert "Takeaway: " in proc.stdout or "No paradigm reached" in proc.stdout
