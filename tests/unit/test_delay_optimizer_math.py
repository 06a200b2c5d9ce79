"""The delay-aware optimizers' arithmetic, driven the way a server drives them, against float64
re-computations of the formulas (tests/jobs/delay_schedule.py); the server plumbing is in
tests/integration/test_delay_optimizers.py."""
import os
import sys

import mxnet as mx
import numpy as np
import pytest

import kvstore_ext  # noqa: F401  (registers the optimizers)
from kvstore_ext.optimizers import needs_delay, delay_refusal

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "jobs"))
import delay_schedule as sched  # noqa: E402

CASES = {"adadelay": {"learning_rate": 0.05},
         "adaptiverevision": {"learning_rate": 0.05},
         "dcasgda": {"learning_rate": 0.05, "lamda": 2.0, "m": 0.95},
         "adagradmomentum": {"learning_rate": 0.01, "momentum": 0.9}}


def drive(name, params, evs):
    """What a server does: ``pulled`` when it sends a worker the weights, ``update_delayed``
    with the push's worker and delay (an ordinary optimizer: ``update``)."""
    opt = mx.optimizer.create(name, rescale_grad=1.0, wd=0.0, **params)
    weight = mx.nd.array(sched.initial())
    state = opt.create_state_multi_precision("w", weight)
    version, pulled, i = 0, {}, 0
    for op, worker in evs:
        if op == "pull":
            pulled[worker] = version
            if needs_delay(opt):
                opt.pulled("w", weight, state, worker)
            continue
        grad = mx.nd.array(sched.gradient(i))
        i += 1
        if needs_delay(opt):
            opt.update_delayed("w", weight, grad, state, worker, version - pulled.get(worker, 0))
        else:
            opt.update("w", weight, grad, state)
        version += 1
    return opt, weight.asnumpy()


@pytest.mark.parametrize("name", sorted(CASES))
def test_scripted_pushes_equal_the_formulas(name):
    evs = sched.events(4, 3, 50)
    taus = sched.delays(evs)
    assert {0, 1, 2, 4} <= set(taus), sorted(set(taus))    # the schedule exercises the delays
    opt, got = drive(name, CASES[name], evs)
    want = sched.reference(name, CASES[name], evs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if needs_delay(opt):
        assert sorted(opt.delays.elements()) == sorted(taus)


def test_without_delay_adadelay_is_mxnets_adagrad():
    evs = [("pull", 0)] + [e for i in range(30) for e in (("push", 0), ("pull", 0))]
    _, ada = drive("adadelay", {"learning_rate": 0.1}, evs)
    _, mx_ada = drive("adagrad", {"learning_rate": 0.1}, evs)
    np.testing.assert_allclose(ada, mx_ada, rtol=1e-6, atol=1e-7)
    _, with_delays = drive("adadelay", {"learning_rate": 0.1}, sched.events(4, 3, 30))
    assert np.abs(with_delays - mx_ada).max() > 1e-3      # and delays do change it


def test_without_delay_dcasgda_is_sgd_but_mxnets_dcasgd_is_not():
    evs = [("pull", 0)] + [e for i in range(30) for e in (("push", 0), ("pull", 0))]
    _, dc = drive("dcasgda", {"learning_rate": 0.05}, evs)
    _, sgd = drive("sgd", {"learning_rate": 0.05}, evs)
    np.testing.assert_allclose(dc, sgd, rtol=1e-6, atol=1e-7)
    # MXNet's DCASGD compensates against the key's previous weights, whoever pushed: at τ = 0
    _, mx_dc = drive("dcasgd", {"learning_rate": 0.05, "lamda": 2.0, "momentum": 0.0}, evs)
    assert np.abs(mx_dc - sgd).max() > 1e-3


def test_a_departed_workers_snapshot_is_dropped_and_memory_is_reported():
    opt = mx.optimizer.create("dcasgda", learning_rate=0.1)
    weight = mx.nd.ones((10, 10))
    state = opt.create_state("w", weight)
    for worker in range(3):
        opt.pulled("w", weight, state, worker)
    assert state.per_worker_bytes() == 3 * 100 * 4
    opt.forget(state, 1)
    assert sorted(state.snapshots) == [0, 2] and state.per_worker_bytes() == 2 * 100 * 4


def test_summing_stores_refuse_delay_aware_optimizers_by_name():
    ada = mx.optimizer.create("adadelay")
    problem = delay_refusal(ada, "dist_bsp", asynchronous=False)
    assert "'adadelay'" in problem and "dist_bsp" in problem and "dist_asp" in problem
    assert delay_refusal(ada, "dist_asp", asynchronous=True) is None
    assert delay_refusal(mx.optimizer.create("adagrad"), "dist_bsp", False) is None


def test_a_negative_delay_names_the_key():
    opt = mx.optimizer.create("adadelay")
    w = mx.nd.ones(3)
    with pytest.raises(ValueError, match="key 'k'"):
        opt.update_delayed("k", w, mx.nd.ones(3), opt.create_state("k", w), 0, -1)


@pytest.mark.parametrize("kvstore,update_on_kvstore,why", [
    ("dist_async", None, "MXNet's dist_async servers apply each push without its delay"),
    ("dist_sync", None, "dist_sync sums the workers' gradients"),
    ("dist_bsp", False, "dist_bsp sums the workers' gradients"),
])
def test_stock_trainer_refuses_them_where_no_push_has_its_delay(kvstore, update_on_kvstore, why):
    """Before any store is made (a native dist store would start ps-lite)."""
    params = mx.gluon.nn.Dense(2, in_units=3)
    params.initialize()
    trainer = mx.gluon.Trainer(params.collect_params(), "adadelay", {"learning_rate": 0.1},
                               kvstore=kvstore, update_on_kvstore=update_on_kvstore)
    with pytest.raises(ValueError, match=why):
        trainer._init_kvstore()


def test_stock_trainer_keeps_them_on_a_local_store():
    net = mx.gluon.nn.Dense(2, in_units=3)
    net.initialize()
    trainer = mx.gluon.Trainer(net.collect_params(), "adadelay", {"learning_rate": 0.1},
                               kvstore="local")
    with mx.autograd.record():
        loss = net(mx.nd.ones((4, 3))).sum()
    loss.backward()
    trainer.step(4)
    assert np.isfinite(net.weight.data().asnumpy()).all()
