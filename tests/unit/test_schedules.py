"""The DC-S3GD paper's schedules: LR and WD curves, and no weight decay on BN and biases."""
import mxnet as mx
import pytest
from mxnet import gluon

from gluon_trainers.schedules import WD_FACTOR, WarmupLinearDecay, no_weight_decay_on_bn_and_bias


def paper_schedule(**kw):
    # 4 workers, η_single 0.1, 100 updates per epoch, 10 epochs, 2 of warm-up, wd 1e-4
    args = dict(lr_single=0.1, num_workers=4, updates_per_epoch=100, epochs=10, warmup_epochs=2,
                wd=1e-4)
    args.update(kw)
    return WarmupLinearDecay.from_epochs(**args)


def test_lr_curve_warmup_start_end_and_last_iteration():
    s = paper_schedule()
    assert (s.max_update, s.warmup_updates, s.base_lr) == (1000, 200, pytest.approx(0.4))
    assert s(0) == 0.0                                   # warm-up starts at 0
    assert s(1) == pytest.approx(0.4 / 200)              # first update: one step up
    assert s(100) == pytest.approx(0.2)                  # linear: half way, half the peak
    assert s(200) == pytest.approx(0.4)                  # end of warm-up: N·η_single
    assert s(600) == pytest.approx(0.2)                  # linear decay ...
    assert s(999) == pytest.approx(0.4 / 800)
    assert s(1000) == 0.0                                # ... to zero at the last iteration
    assert s(5000) == 0.0
    lrs = [s(n) for n in range(1001)]
    assert max(lrs) == pytest.approx(0.4) and lrs.index(max(lrs)) == 200


def test_wd_follows_the_lr_curve_times_k():
    s = paper_schedule()
    assert WD_FACTOR == 2.3
    for n in (0, 1, 100, 200, 600, 999, 1000):
        assert s.wd_at(n) == pytest.approx(2.3 * 1e-4 * s.lr_at(n) / 0.4)
    assert s.wd_at(200) == pytest.approx(2.3e-4)
    assert s.wd_at(0) == 0.0 and s.wd_at(1000) == 0.0


def test_early_stopped_warmup_as_in_the_paper():
    # planned to reach the peak at half of 90 epochs, stopped at 15: a third of the peak
    s = paper_schedule(epochs=90, warmup_epochs=15, ramp_epochs=45)
    assert s(1500) == pytest.approx(0.4 / 3)
    assert s(1501) < s(1500)
    assert s(9000) == 0.0


def test_the_optimizer_follows_both_schedules():
    s = paper_schedule()
    opt = s.attach(mx.optimizer.SGD(momentum=0.9))
    w, g = mx.nd.ones((3,)), mx.nd.zeros((3,))
    state = opt.create_state(0, w)
    for _ in range(200):
        opt.update(0, w, g, state)
    assert opt.num_update == 200
    assert opt.learning_rate == pytest.approx(0.4)
    assert opt.wd == pytest.approx(2.3e-4)


def test_bad_schedule_names_the_value():
    with pytest.raises(ValueError, match="warmup_updates"):
        WarmupLinearDecay(max_update=10, warmup_updates=20, base_lr=0.1)


def test_no_weight_decay_on_batch_norm_and_biases():
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Conv2D(4, 3, use_bias=False), gluon.nn.BatchNorm(),
                gluon.nn.Dense(5), gluon.nn.Dense(2, use_bias=False))
    net.initialize()
    net(mx.nd.zeros((1, 1, 6, 6)))
    changed = no_weight_decay_on_bn_and_bias(net)
    params = net.collect_params()
    for name, p in params.items():
        bn_or_bias = any(t in name for t in ("batchnorm", "bias"))
        assert (p.wd_mult == 0.0) == bn_or_bias, (name, p.wd_mult)
        assert (name in changed) == bn_or_bias
    assert any("gamma" in n for n in changed) and any("bias" in n for n in changed)
    # the optimizer of a Trainer sees it: decay 0 for those, the schedule's for the rest
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.1, "wd": 1e-4})
    opt = trainer.optimizer
    for i, p in enumerate(trainer._params):
        assert opt._get_wd(i) == (0.0 if p.name in changed else pytest.approx(1e-4))
