"""scripts/bench_optimizer.py: both kernels timed through the servers' optimizer, with the
same bits."""
import importlib.util
import json
import os

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "bench_optimizer.py")
spec = importlib.util.spec_from_file_location("bench_optimizer", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_both_kernels_are_timed_and_give_the_same_bits(tmp_path):
    assert bench.main(["--sizes", "1000,20000", "--passes", "1", "--reps", "2", "--any-env",
                       "--out", str(tmp_path)]) == 0
    with open(tmp_path / "optimizer_kernels.json") as f:
        rows = json.load(f)["rows"]
    assert [(r["elements"], r["kernel"]) for r in rows] == [
        (n, k) for n in (1000, 20000) for k in ("multi-tensor always", "as the servers choose")]
    assert all(r["same_bits"] and r["calls"] == 2 and r["ns_per_element"] > 0
               for r in rows)
