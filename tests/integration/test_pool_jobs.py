"""Worker pools (``dist_pool``, Adaptable Asynchrony) in real jobs: LeNet on MNIST through
launch.py and ``scripts/train_pool.py``; the servers decide who computes, the batch sizes and
the learning rate, and the job ends when its sample budget is applied."""
import glob
import json
import math
import os

from conftest import ROOT, read_json, tagged

from kvstore_ext.policies.pool import PoolConfig, WorkerPool

SCRIPT = os.path.join(ROOT, "scripts", "train_pool.py")


def pool_job(run_job, tmp_path, workers, servers, params, *script_args):
    metrics = str(tmp_path / "metrics")
    options = ["--metrics-dir", metrics]
    for k, v in params.items():
        options += ["--kv-param", f"{k}={v}"]
    out = str(tmp_path / "worker-{rank}.json")
    code, log = run_job(workers, servers, [SCRIPT, "--train-size", "3200", "--out", out,
                                           *script_args], *options, timeout=300)
    assert code == 0, log[-3000:]
    results = [read_json(out.replace("{rank}", str(r))) for r in range(workers)]
    pools = [read_json(p)["pool"] for p in sorted(glob.glob(os.path.join(metrics, "server-*.json")))]
    assert len(pools) == servers
    return results, pools


def test_progressive_pool_grows_at_its_points_with_tuned_batch_and_rate(run_job, tmp_path):
    """2 workers, then 4 after a quarter epoch (800 samples); "aa" tuning with k = 0.1."""
    params = {"pool": "progressive", "pool_every": 0.25, "tune": "aa", "tune_k": 0.1,
              "batch_size": 32, "epoch_samples": 3200, "epochs": 1}
    results, (pool,) = pool_job(run_job, tmp_path, 4, 1, params, "--lr", "0.004")
    history = pool["history"]
    assert [h["workers"] for h in history][:2] == [2, 4]
    assert 800 <= history[1]["samples"] < 800 + 32          # the push that crossed 800
    steps = sorted((s for r in results for s in r["steps"]), key=lambda s: s["start"])
    for s in steps:   # every step used the batch size and rate its pool size gives
        d = s["pool"] - 2
        assert s["batch_size"] == math.floor(32 * math.exp(0.1 * d)), s
        assert abs(s["lr"] - 0.004 * math.exp(-0.1 * d)) < 1e-9, s
    for s in steps:   # nobody ever computes beyond the pool: at each step's start, the steps
        # under way are at most the pool's size then (it only grows here: the largest size
        # told with any step started so far; a step records the size its worker was told
        # before it, which may have grown since)
        busy = sum(1 for t in steps if t["start"] <= s["start"] < t["end"])
        size = max(t["pool"] for t in steps if t["start"] <= s["start"])
        assert busy <= size, (s, busy, size)
    # ranks 2 and 3 waited at their first pull until the pool took them in
    first = {r["rank"]: r["steps"][0]["start"] for r in results}
    grew_at = min(s["start"] for s in steps if s["pool"] == 4)
    assert first[2] >= grew_at and first[3] >= grew_at
    assert all(s["pool"] == 2 for r in results if r["rank"] < 2 for s in r["steps"][:3])
    # every sample was applied once, and the budget was met
    assert pool["samples"] == sum(r["samples"] for r in results) >= 3200
    assert pool["updates"] == sum(len(r["steps"]) for r in results)
    assert all(r["test_accuracy"] >= 0.85 for r in results), [r["test_accuracy"] for r in results]


def test_dynamic_pool_follows_one_trajectory_on_every_server(run_job, tmp_path):
    """Two servers decide independently; both follow the trajectory the pure pool gives."""
    params = {"pool": "dynamic", "pool_every": 10, "pool_seed": 7, "pool_max": 4,
              "batch_size": 32, "epoch_samples": 3200, "epochs": 0.75}
    results, pools = pool_job(run_job, tmp_path, 4, 2, params)
    trajectories = [[(h["updates"], h["workers"]) for h in p["history"]] for p in pools]
    assert trajectories[0] == trajectories[1]
    reference = WorkerPool(PoolConfig.from_params(params), 4)
    for _ in range(pools[0]["updates"]):
        reference.advance(32)
    assert trajectories[0] == reference.trajectory()
    assert len({w for _, w in trajectories[0]}) > 1       # it did change
    assert pools[0]["samples"] == sum(r["samples"] for r in results) >= 2400


def test_the_experiments_config_plans_valid_pool_jobs():
    """Every run of configs/adaptable_asynchrony/experiments.yaml has pool parameters the
    servers accept and arguments train_pool.py takes (nothing started)."""
    import subprocess
    import sys
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import aa_experiments
    import yaml
    with open(os.path.join(ROOT, "configs", "adaptable_asynchrony", "experiments.yaml")) as f:
        config = yaml.safe_load(f)
    plan = aa_experiments.plan(config, list(config["experiments"]), None, False)
    assert len(plan) >= 60
    for _, _, _, settings in plan:
        PoolConfig.from_params(settings["kv"])
        assert 1 <= settings["workers"] <= 8
    args = {k for _, _, _, s in plan for k in s["args"]}
    helptext = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True,
                              text=True, timeout=60).stdout
    assert all(f"--{k}" in helptext for k in args), args


def test_workers_outside_the_pool_reach_a_barrier(run_job):
    """A fixed pool of 1 of 3 workers and a raw script that reads its weights before a
    barrier (``tests/jobs/pool_barrier.py``): ranks 1 and 2 waited for OK at their pull, rank
    0 waited at the barrier for them, and the job hung.  A worker at a barrier now leaves its
    place in the pool to the next rank, so every worker gets through, and the pushes made
    after it are all applied (3 of lr 0.5 on ones)."""
    code, log = run_job(3, 2, [os.path.join(ROOT, "tests", "jobs", "pool_barrier.py")],
                        "--kv-param", "pool=fixed", "--kv-param", "pool_start=1",
                        "--kv-param", "pool_min=1", env={"KVX_STALL_REPORT_S": "20"},
                        timeout=90)
    assert code == 0, log[-3000:]
    reports = tagged(log, "POOL_BARRIER")
    assert sorted(r["rank"] for r in reports) == [0, 1, 2], log[-3000:]
    assert all(r["pulled"] == 0.0 and r["after"] == -1.5 for r in reports), reports
    assert "has had no reply" not in log, log[-3000:]
