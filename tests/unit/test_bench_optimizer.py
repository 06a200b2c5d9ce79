"""scripts/bench_optimizer.py: the three kernels timed through the servers' optimizer, with the
same bits."""
import importlib.util
import json
import os

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "bench_optimizer.py")
spec = importlib.util.spec_from_file_location("bench_optimizer", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_every_kernel_is_timed_and_gives_the_same_bits(tmp_path):
    assert bench.main(["--sizes", "1000,20000", "--passes", "1", "--reps", "2", "--any-env",
                       "--clip-gradient", "0.5",
                       "--out", str(tmp_path)]) == 0
    with open(tmp_path / "optimizer_kernels.json") as f:
        rows = json.load(f)["rows"]
    assert [(r["elements"], r["kernel"]) for r in rows] == [
        (n, k) for n in (1000, 20000) for k in bench.KERNELS]
    assert len(bench.KERNELS) == 3
    assert all(r["same_bits"] and r["calls"] == 2 and r["ns_per_element"] > 0
               for r in rows)
