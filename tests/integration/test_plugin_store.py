"""A store added by one registry row, outside the package, trains in a real job.

``tests/jobs/pkg/lead1_store.py`` is a policy and one ``register(StoreType(...))`` call;
``launch.py --plugin lead1_store`` makes the scheduler, the server and every worker import it.
"""
import os

from conftest import JOBS, ROOT, read_json

TRAIN = os.path.join(ROOT, "scripts", "train_mnist.py")
PKG = os.path.join(JOBS, "pkg")
LENET_BYTES = (20 * 25 + 20 + 50 * 20 * 25 + 50 + 800 * 500 + 500 + 500 * 10 + 10) * 4


def test_a_store_added_by_one_registry_row_trains_in_a_real_job(run_job, tmp_path):
    out = str(tmp_path / "r-{rank}.json")
    metrics = tmp_path / "metrics"
    code, log = run_job(3, 1, [TRAIN, "--kvstore", "dist_lead1", "--max-steps", "60",
                               "--train-size", "3840", "--test-size", "500", "--batch-size", "32",
                               "--out", out],
                        "--plugin", "lead1_store", "--env", f"PYTHONPATH:{PKG}",
                        "--worker-speed", "1.0,0.3,1.0", "--metrics-dir", str(metrics),
                        timeout=300)
    assert code == 0, log[-3000:]
    results = [read_json(out.replace("{rank}", str(r))) for r in range(3)]
    assert all(r["kvstore"] == "dist_lead1" for r in results), results
    # it learns (chance is 0.1; after 40 steps single runs ranged 0.43-0.80)
    assert min(r["test_accuracy"] for r in results) > 0.3, results
    server = read_json(str(metrics / "server-0.json"))
    leads = {int(w): lead for w, lead in server["max_lead_at_ok"].items()}
    # the bound held, and it was reached: the slow worker 1 held the others back
    assert sorted(leads) == [0, 1, 2] and max(leads.values()) == 1, server["max_lead_at_ok"]
    # the link counts the array bytes it moves: the weights pulled after init and at every
    # step, the gradients of every step (plus the optimizer, and the initial weights on rank 0)
    for r, result in enumerate(results):
        worker = read_json(str(metrics / f"worker-{r}.json"))["worker"]
        steps = result["steps"]
        assert worker["bytes_received"] == (steps + 1) * LENET_BYTES, (r, worker, steps)
        assert steps * LENET_BYTES < worker["bytes_sent"] < (steps + 2) * LENET_BYTES, worker
