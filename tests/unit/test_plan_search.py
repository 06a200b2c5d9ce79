"""The scalability optimizer on a mixed pool of devices with store parameter grids: its exact
ranking against brute force, its bounds against the simulator, the staleness it reports, and
the options' errors."""
import itertools
import json

import numpy as np
import pytest

from kvstore_ext.plan import cli
from kvstore_ext.plan.model import Costs, ModelProfile, busiest, predict, server_service, \
    simulated_run
from kvstore_ext.plan.search import (Simulations, Space, Variant, applied_samples,
                                     closed_form_staleness, evaluate, knees, parse_dssp_bounds,
                                     parse_psp, parse_staleness, parse_stores, rank)
from kvstore_ext.simulate import simulate

COSTS = Costs(interference={1: 1.0, 2: 1.2}, server_frame=1e-4)   # its big key: a frame
PROFILE = ModelProfile("toy", [1000, 250_000, 4000], compute_fixed=0.001,
                       compute_per_sample=0.0004, activation_elements_per_sample=5000)
#: three fast machines and three 2.5 times slower, at each batch
POOL = {32: (0.025, 0.01, 0.025, 0.01, 0.025, 0.01), 64: (0.02,) * 3 + (0.05,) * 3}
ITERATIONS = 100
TOP = 8


def mixed_space() -> Space:
    return Space(workers=tuple(range(1, 7)), servers=(1, 2), batch_sizes=(32, 64),
                 stores=("dist_bsp", "dist_asp", "dist_ssp", "dist_dssp", "dist_psp"),
                 machines=8, device_ms_at=POOL,
                 params={"dist_ssp": parse_staleness("1,4"), "dist_dssp": parse_dssp_bounds("1:4"),
                         "dist_psp": parse_psp("0.5:1,1:1")})


@pytest.fixture(scope="module")
def searched():
    space = mixed_space()
    return space, evaluate(PROFILE, COSTS, space, dataset_size=10_000, iterations=ITERATIONS)


@pytest.fixture(scope="module")
def brute_force():
    """Every configuration on its own: predict (the simulator where the policy sets the pace),
    its applied samples/s, its staleness (the simulator's, or the closed form's rule)."""
    space = mixed_space()
    out = {}
    for n, s, b, variant, col in itertools.product(space.workers, space.servers,
                                                   space.batch_sizes, space.variants(),
                                                   space.colocate):
        machines = max(n, s) if col else n + s
        if machines > space.machines or (col and s > n):
            continue
        p = predict(PROFILE, COSTS, store=variant.store, workers=n, servers=s, batch_size=b,
                    device_s=sorted(POOL[b])[:n], params=variant.params, colocated=col,
                    shared_host=False, host_compute=False, horizon_iterations=ITERATIONS)
        stale = p.run.mean_staleness if p.run else float(closed_form_staleness(variant.store, n))
        samples = applied_samples(p) if p.run else p.samples_per_s
        out[(n, s, b, variant.label, col)] = (samples, machines, stale, p.method)
    return out


def config(row) -> tuple:
    return (row["workers"], row["servers"], row["batch_size"],
            Variant(row["store"], row["params"]).label, row["colocated"])


@pytest.mark.parametrize("max_staleness", [None, 3.0, 2.0, 0.5])
def test_the_search_on_a_mixed_pool_equals_brute_force(searched, brute_force, max_staleness):
    space, result = searched
    simulations = Simulations(PROFILE, COSTS, space, result)
    top = rank(result, TOP, simulate=simulations, max_staleness=max_staleness)
    allowed = [(-v[0], v[1], k) for k, v in brute_force.items()
               if max_staleness is None or v[2] <= max_staleness]
    best = sorted(allowed)[:TOP]
    assert [r["samples_per_s"] for r in top] == pytest.approx([-b[0] for b in best], rel=1e-9)
    for r in top:       # each row is the configuration it names, valued as brute force has it
        samples, machines, stale, method = brute_force[config(r)]
        assert (r["samples_per_s"], r["staleness"]) == pytest.approx((samples, stale), rel=1e-9)
        assert (r["machines"], r["method"]) == (machines, method)
    assert config(top[0]) == best[0][2]
    bounded = int((result["fits"] & ~result["exact"]).sum())
    assert len(simulations.done) < bounded / 4      # lazily: few of the bounded configurations
    if max_staleness is None:       # ASP's rates add up: its closed form beats every bound
        assert not simulations.done


def test_a_staleness_cap_keeps_fewer_workers_and_brings_bsp_up(searched):
    space, result = searched
    top = rank(result, TOP, simulate=Simulations(PROFILE, COSTS, space, result),
               max_staleness=2.0, merge_stores=True)
    assert all(r["staleness"] <= 2.0 for r in top)
    assert top[0]["label"] == "asp = ssp = dssp s=1..4" and top[0]["workers"] == 3
    assert "bsp" in {r["store"].replace("dist_", "") for r in top}


def test_the_bound_is_never_below_the_simulated_value(searched):
    space, result = searched
    simulations = Simulations(PROFILE, COSTS, space, result)
    bounded = np.flatnonzero(result["fits"] & ~result["exact"])
    assert len(bounded) > 50
    for i in bounded:
        p = simulations(i)
        assert result["samples_per_s"][i] >= p.samples_per_s >= applied_samples(p)


def test_knees_are_exact_per_store(searched, brute_force):
    space, result = searched
    k = knees(result, simulate=Simulations(PROFILE, COSTS, space, result))
    for store in ("dist_ssp", "dist_psp", "dist_asp"):
        label = {"dist_ssp": "ssp", "dist_psp": "psp", "dist_asp": "asp"}[store]
        for n, samples in k[store]["curve"].items():
            best = max(v[0] for key, v in brute_force.items()
                       if key[0] == n and key[3].split()[0] == label)
            assert samples == pytest.approx(best, rel=1e-9)


def test_one_device_keeps_the_closed_form_and_merges_the_unbinding_parameters():
    space = Space(workers=(1, 2, 4, 8), servers=(1, 2), batch_sizes=(64,), machines=16,
                  device_ms_at={64: 0.03}, params={"dist_ssp": parse_staleness("1,3,6,15"),
                                                   "dist_dssp": parse_dssp_bounds("1:15,3:15")})
    result = evaluate(PROFILE, COSTS, space)
    assert result["exact"].all()
    top = rank(result, 3, merge_stores=True)
    assert top[0]["label"] == "asp = ssp = dssp" and len(top[0]["variants"]) == 7
    assert top[0]["staleness"] == top[0]["workers"] - 1


def test_variants_name_the_store_and_its_parameters():
    assert Variant.checked("dist_ssp", {"staleness": 6}).label == "ssp s=6"
    assert Variant.checked("dist_dssp", {"staleness_lower": 1}).label == "dssp s=1..15"
    assert [Variant.checked("dist_psp", p).label for p in parse_psp("0.9:1,1:0.5")] == \
        ["psp c=0.9n b=1", "psp c=n b=0.5"]
    assert Variant.checked("dist_bsp").label == "bsp"


@pytest.mark.parametrize("parse,text,message", [
    (parse_staleness, "1,-2", "staleness must be an integer >= 0, got -2"),
    (parse_staleness, "1.5", "staleness must be an integer >= 0, got 1.5"),
    (parse_dssp_bounds, "5:3", "staleness_upper must be >= staleness_lower, got "
                               "staleness_lower=5, staleness_upper=3"),
    (parse_dssp_bounds, "3", "--dssp-bounds takes LOWER:UPPER pairs"),
    (parse_psp, "0:1", "min_pushes=0.0"),
    (parse_psp, "0.5:1.5", r"min_pull_fraction must be in \(0, 1\], got 1.5"),
    (parse_psp, "4:1", r"min_pushes is a fraction of the workers in \(0, 1\] here, got 4"),
    (parse_stores, "dist_bsp,dist_pool", "no equations for store 'dist_pool'"),
])
def test_a_bad_parameter_value_is_named_with_its_value(parse, text, message):
    with pytest.raises(ValueError, match=message):
        parse(text)


def test_the_command_line_refuses_a_bad_value_with_status_2(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["search", "--staleness", "3,x"])
    assert stop.value.code == 2
    assert "argument --staleness: staleness must be an integer >= 0, got 'x'" in \
        capsys.readouterr().err


def test_the_simulator_counts_the_updates_between_a_read_and_its_push_by_hand():
    # two equal workers pushing at t = 1, 2, ...: worker 0's first push lands first (nothing
    # applied since its read), worker 1's after it (one); from then on each push finds the
    # other's in between: 1 + 19 x 1 over 20 pushes
    asp = simulate("dist_asp", {}, [1.0, 1.0], 10.5)
    assert asp.staleness == {0: 1, 1: 19} and asp.mean_staleness == pytest.approx(0.95)
    bsp = simulate("dist_bsp", {}, [1.0, 1.0], 10.5)     # a round applies what it gathered
    assert bsp.staleness == {0: 20} and bsp.mean_staleness == 0.0
    assert simulate("dist_psp", {}, [1.0, 0.4], 10.5).mean_staleness == 0.0
    assert simulate("dist_asp", {}, [1.0], 0.5).mean_staleness is None


@pytest.mark.parametrize("store,devices", [
    ("dist_bsp", [0.1] * 4), ("dist_asp", [0.1] * 4), ("dist_asp", [0.1] * 8),
    ("dist_asp", [0.05, 0.1, 0.1, 0.25]), ("dist_ssp", [0.1] * 4), ("dist_dssp", [0.1] * 4)])
def test_closed_form_staleness_matches_the_simulator(store, devices):
    n = len(devices)
    place = busiest(PROFILE, 1, COSTS, n)
    push_s, apply_s = server_service(COSTS, place)
    _, run = simulated_run(store, {}, devices, 0.0, 0.003, push_s, apply_s, n, 300, 0, COSTS,
                           False)
    assert run.mean_staleness == pytest.approx(float(closed_form_staleness(store, n)), abs=0.05)


def test_search_on_the_command_line_with_a_pool_grids_and_a_cap(tmp_path, capsys):
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({"coefficients": COSTS.to_dict(), "profiles": {
        "toy": {"key_sizes": PROFILE.key_sizes, "compute_fixed": 0.001,
                "compute_per_sample": 0.0004}}}))
    code = cli.main(["search", "--calibration", str(calibration), "--model", "toy", "--cluster",
                     "--device", "20ms*3,50ms*3", "--machines", "8", "--servers", "1,2",
                     "--batch-sizes", "64", "--stores",
                     "dist_bsp,dist_asp,dist_ssp,dist_dssp,dist_psp", "--staleness", "1,4",
                     "--dssp-bounds", "1:4", "--psp", "0.5:1", "--max-staleness", "2",
                     "--top", "4", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "simulated for an exact top 4" in out and "mean staleness <= 2 only" in out
    assert " stale " in out.splitlines()[3]
    found = json.loads((tmp_path / "search.json").read_text())
    assert found["simulated"] > 0 and found["max_staleness"] == 2.0
    assert all(r["workers"] <= 6 and r["staleness"] <= 2 for r in found["top"])
    assert {"label", "params", "staleness", "dropped", "method"} <= set(found["top"][0])
