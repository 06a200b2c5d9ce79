"""The asynchronous stores against MXNet's own dist_async, on a plain Gluon script, in one run.

``scripts/plain_gluon_mnist.py`` is a stock script (LeNet, Xavier, momentum SGD, batch 32);
only the kvstore name and launch.py's ``--backend`` change.  Its staleness probe reads, on the
worker, how many updates by others came between each pull and the push that followed, the
same way for both stores.  docs/reliability.md has the multi-seed comparison at higher rates.
"""
import os

import numpy as np
import pytest

from conftest import ROOT, tagged

SCRIPT = os.path.join(ROOT, "scripts", "plain_gluon_mnist.py")


def run(run_job, workers, kvstore, *args, options=()):
    backend = ["--backend", "mxnet"] if kvstore in ("dist_sync", "dist_async") else []
    code, log = run_job(workers, 1, [SCRIPT, "--kvstore", kvstore, "--staleness-probe", *args],
                        *backend, *options, timeout=600)
    assert code == 0, log[-3000:]
    results = tagged(log, "RESULT")
    assert len(results) == workers, log[-3000:]
    staleness = np.concatenate([r["staleness"] for r in results])
    return float(np.mean([r["accuracy"] for r in results])), staleness


@pytest.mark.parametrize("workers,seeds", [(2, [1]),
                                           pytest.param(4, [1, 2, 3, 4], marks=pytest.mark.long)])
def test_dist_asp_trains_and_is_as_stale_as_native_dist_async(run_job, workers, seeds):
    """dist_asp may not train worse than dist_async by more than 2 points.  With 4 workers a
    single run of either store spreads by about 2 points, with an occasional run 5-10 points
    low (under load, both stores), so the stores are compared on the median of 4 seeds, run
    interleaved.  This check failed on the suite's first runs (dist_asp 2.5-4 points low at 4
    workers) until the server answered a pushpull only after the pushes queued behind it:
    the replies had been one update staler than MXNet's (docs/reliability.md)."""
    native, mine = [], []
    for seed in seeds:
        native.append(run(run_job, workers, "dist_async", "--lr", "0.01", "--seed", str(seed)))
        mine.append(run(run_job, workers, "dist_asp", "--lr", "0.01", "--seed", str(seed)))
    native_acc, acc = np.median([a for a, _ in native]), np.median([a for a, _ in mine])
    native_st, st = np.concatenate([s for _, s in native]), np.concatenate([s for _, s in mine])
    assert native_acc >= 0.9 and acc >= 0.9, (native, mine)
    assert acc >= native_acc - 0.02, ([a for a, _ in native], [a for a, _ in mine])
    # no push lost or doubled (each applied once: the probe counts them), and the gradients
    # are no staler than with MXNet's own store
    assert st.min() >= 0 and native_st.min() >= 0
    assert st.mean() <= native_st.mean() * 1.25 + 0.5, (st.mean(), native_st.mean())


@pytest.mark.long
def test_dist_ssp_with_staleness_0_trains_at_lr_0_05_like_native_dist_sync(run_job):
    """lr 0.05 with momentum 0.9 (the script's default) is where MXNet's dist_async diverges
    (4 of 5 seeds); s = 0 bounds the lead, so each worker's gradient is computed on weights
    that carry every push of the round before.  Exactly so: with 2 workers every reply brings
    the other worker's push and this one's (staleness 1 on the probe, every time), none lost
    or applied twice.  But s = 0 applies the round's two pushes one after the other, so the
    order they land in matters: replayed in one process (docs/reliability.md), seed 4 gives
    0.9515 when worker 0's push lands first in every round, 0.9235 in random order, and
    diverges when worker 1's does; under load the real job diverged for seed 4 in 4 of 7 runs,
    and a run in a suite's first minutes gave 0.902, 0.964, 0.9065 and 0.8935 for
    seeds 1-4 (2026-12-01; 0.916-0.969 over 16 seeds run alone, 0.886-0.959 in virtual time with
    one worker first in every round).  A clean-clone CI run on 2026-12-05 had seeds 3 and 4
    both diverge (0.1155, 0.097; seed 3 trained in 3 of 3 runs under load just after, and seed
    4 diverged there once with the code before and once, to 0.69, with the code after).  So
    against native dist_sync in the same run, 6 seeds interleaved: at most two runs diverged
    (near 0.1), and the median no more than 8 points below dist_sync's (a lost or doubled
    update fails the staleness check exactly; a wrong update rule would sink most seeds)."""
    native, mine = [], []
    for seed in (1, 2, 3, 4, 5, 6):
        if seed <= 2:    # dist_sync's accuracy is its seed's: two are enough for its level
            native.append(run(run_job, 2, "dist_sync", "--lr", "0.05", "--seed", str(seed))[0])
        mine.append(run(run_job, 2, "dist_ssp", "--lr", "0.05", "--seed", str(seed),
                        options=["--kv-param", "staleness=0"]))
    accuracies = [acc for acc, _ in mine]
    for _, st in mine:   # the bound, exactly: each reply carries the round's two pushes
        assert (st == 1).all(), np.bincount(st)
    assert sum(acc < 0.5 for acc in accuracies) <= 2, (native, accuracies)
    assert np.median(accuracies) >= np.median(native) - 0.08, (native, accuracies)
