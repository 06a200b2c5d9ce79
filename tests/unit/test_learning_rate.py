"""A learning rate set on the workers' optimizer after ``set_optimizer``
(``gluon.Trainer.set_learning_rate``) as the servers take it: the ``set_lr`` request's check,
and the servers' optimizer applying it as MXNet's own optimizer with that rate does."""
import math

import mxnet as mx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kvstore_ext.optimizers import ServerOptimizer
from kvstore_ext.ps.protocol import Op, ProtocolError, check_request


def request(lr):
    return {"op": Op.SET_LR, "seq": 1, "worker": 0, "reply_to": "w0", "lr": lr}


@pytest.mark.parametrize("lr", [0, 0.5, 3, 1e-30])
def test_a_finite_rate_of_zero_or_more_is_a_request(lr):
    check_request(request(lr), 2)


@given(st.one_of(st.floats(max_value=-1e-300), st.just(math.nan), st.just(math.inf),
                 st.booleans(), st.none(), st.text(max_size=5), st.lists(st.floats(), max_size=2)))
@settings(max_examples=60, deadline=None)
def test_any_other_rate_is_refused_naming_the_field(lr):
    with pytest.raises(ProtocolError, match="set_lr: lr must be a finite number >= 0"):
        check_request(request(lr), 2)


def test_the_servers_optimizer_applies_the_new_rate_as_mxnet_does():
    """Three momentum-SGD steps, the rate changed before the third: the same weights as MXNet's
    own updater whose optimizer's rate is changed the same way."""
    rng = np.random.default_rng(0)
    weight0 = rng.standard_normal((3, 5)).astype(np.float32)
    grads = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(3)]
    theirs = mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=1e-4)
    updater = mx.optimizer.get_updater(theirs)
    ours = ServerOptimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=1e-4),
                           "dist_bsp", asynchronous=False)
    w_theirs, w_ours = mx.nd.array(weight0), mx.nd.array(weight0)
    for step, g in enumerate(grads):
        if step == 2:
            theirs.set_learning_rate(0.001)
            ours.set_learning_rate(0.001)
        updater(0, mx.nd.array(g), w_theirs)
        ours.updater(0, mx.nd.array(g), w_ours)
    assert ours.optimizer.lr == 0.001 and ours.base_hyper["lr"] == 0.001
    np.testing.assert_array_equal(w_ours.asnumpy(), w_theirs.asnumpy())


def test_a_pool_scales_the_new_rate_as_it_scaled_the_first():
    ours = ServerOptimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9),
                           "dist_bsp", asynchronous=False)
    ours.tune(0.5, lambda m: m)
    assert ours.optimizer.lr == pytest.approx(0.05)
    ours.set_learning_rate(0.02)
    ours.tune(0.5, lambda m: m)
    assert ours.optimizer.lr == pytest.approx(0.01)


def test_a_scheduler_keeps_the_rate_and_says_why():
    scheduled = mx.optimizer.SGD(learning_rate=0.1,
                                 lr_scheduler=mx.lr_scheduler.FactorScheduler(step=5, factor=0.5))
    ours = ServerOptimizer(scheduled, "dist_bsp", asynchronous=False)
    with pytest.raises(ValueError, match="lr_scheduler sets it"):
        ours.set_learning_rate(0.01)
