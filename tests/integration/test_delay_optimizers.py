"""Delay-aware optimizers on real servers: each push applied with its worker and delay.

tests/jobs/delay_schedule.py makes 3 workers push and pull one key in a seeded order, one at
a time, so every push's delay is known; the servers' final weights must equal a float64
re-computation of the algorithm, and the delays the optimizer was given must be the
staleness the metrics counted.
"""
import json
import os
import pickle
import sys

import numpy as np
import pytest

from conftest import JOBS, ROOT, read_json, tagged

sys.path.insert(0, JOBS)
import delay_schedule as sched  # noqa: E402

PARAMS = {"adadelay": {"learning_rate": 0.05},
          "adaptiverevision": {"learning_rate": 0.05},
          "dcasgda": {"learning_rate": 0.05, "lamda": 2.0, "m": 0.95},
          "adagrad": {"learning_rate": 0.05}}


@pytest.mark.parametrize("name,servers", [("adadelay", 1), ("adaptiverevision", 1),
                                          ("dcasgda", 2), ("adagrad", 1)])
def test_servers_apply_each_push_with_its_delay(run_job, tmp_path, name, servers):
    """(``adagrad`` on dist_asp is AsyncAdagrad: MXNet's AdaGrad per push, delays ignored.)"""
    out = str(tmp_path / "final.json")
    code, log = run_job(3, servers, [os.path.join(JOBS, "delay_schedule.py"), "--optimizer", name,
                                     "--params", json.dumps(PARAMS[name]), "--pushes", "50",
                                     "--seed", "4", "--out", out],
                        env={"KVX_BIGARRAY_BOUND": "10"})   # 30 elements: split over 2 servers
    assert code == 0, log[-3000:]
    result = read_json(out)
    evs = sched.events(4, 3, 50)
    want = sched.reference(name, PARAMS[name], evs)
    np.testing.assert_allclose(np.array(result["weights"]), want, rtol=1e-5, atol=1e-6)
    taus = sched.delays(evs)
    for server in result["stats"]["servers"]:
        seen = {}
        for hist in server["staleness"].values():
            for tau, n in hist.items():
                seen[tau] = seen.get(tau, 0) + n
        assert sum(seen.values()) == len(taus)
        if name == "adagrad":
            assert "delay_optimizer" not in server
            continue
        given = server["delay_optimizer"]["delays"]
        assert given == {str(t): taus.count(t) for t in sorted(set(taus))}
        assert given == seen, (given, seen)
        if name == "dcasgda":   # one snapshot of its block per worker
            assert server["delay_optimizer"]["per_worker_bytes"] == 15 * 4
    # save_optimizer_states joins the blocks' states, load splits them again: nothing lost
    with open(result["states"][0], "rb") as f:
        first = pickle.load(f)
    with open(result["states"][1], "rb") as f:
        second = pickle.load(f)
    assert _flat(first) and _flat(first).keys() == _flat(second).keys()
    for where, array in _flat(first).items():
        np.testing.assert_array_equal(array, _flat(second)[where], err_msg=where)
    if name == "dcasgda":   # the weights each worker last pulled, whole (30 elements)
        snapshots = first["w"].snapshots
        assert sorted(snapshots) == [0, 1, 2] and all(a.size == 30 for a in snapshots.values())


def _flat(states) -> dict:
    """Every array of saved optimizer states, by where it sits."""
    out = {}

    def walk(x, where):
        if hasattr(x, "arrays"):
            for name, a in x.arrays.items():
                walk(a, f"{where}.{name}")
            for w, a in x.snapshots.items():
                walk(a, f"{where}.snapshot[{w}]")
        elif isinstance(x, (tuple, list)):
            for i, a in enumerate(x):
                walk(a, f"{where}[{i}]")
        elif x is not None:
            out[where] = x.asnumpy()

    for key, state in states.items():
        walk(state, str(key))
    return out


def test_a_summing_store_refuses_them_with_the_reason(run_job, tmp_path):
    code, log = run_job(2, 1, [os.path.join(JOBS, "delay_schedule.py"), "--kvstore", "dist_bsp",
                               "--optimizer", "adadelay", "--out", str(tmp_path / "x.json")])
    assert code == 0, log[-3000:]
    refused = tagged(log, "REFUSED")
    assert len(refused) == 2
    assert all("'adadelay' needs the delay of each push" in r["error"] and "dist_bsp" in
               r["error"] for r in refused)


def test_stock_trainer_trains_with_adadelay_on_dist_asp(run_job):
    """What a user writes: gluon.Trainer(..., 'adadelay', kvstore='dist_asp')."""
    code, log = run_job(2, 1, [os.path.join(ROOT, "scripts", "plain_gluon_mnist.py"), "--kvstore",
                               "dist_asp", "--optimizer", "adadelay", "--lr", "0.01",
                               "--epochs", "1"])
    assert code == 0, log[-3000:]
    results = tagged(log, "RESULT")
    assert len(results) == 2 and min(r["accuracy"] for r in results) >= 0.9, results
