"""Virtual-time training (kvstore_ext.virtual_training) on hand-worked schedules, against
plain Gluon, and bit for bit against itself.

The schedule: three virtual workers whose iterations take 1, 2 and 3 s, no latency.  Each
trace entry is (worker, weight version it read, version its gradient was applied into), in
the order the gradients reached the server; the expected traces are worked out by hand in
the comments from each policy's rule (ties at one moment go in the order the workers started
their iterations).
"""
from __future__ import annotations

import os

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from gluon_trainers.data import load_mnist
from gluon_trainers.models import lenet
from kvstore_ext import registry
from kvstore_ext.devices import DeviceClock
from kvstore_ext.simulate import simulate

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
from kvstore_ext.virtual_training import ServerState, VirtualTraining

BATCH = 16


@pytest.fixture(scope="module")
def digits():
    return load_mnist(None, 2000, 200)


def fresh_net(seed: int = 0):
    mx.random.seed(seed)
    net = lenet()
    net.initialize(mx.init.Xavier(magnitude=2.24))
    net(mx.nd.zeros((1, 1, 28, 28)))
    return net


def make_sgd(lr=0.05, momentum=0.9, wd=1e-4):
    return lambda: mx.optimizer.create("sgd", learning_rate=lr, momentum=momentum, wd=wd,
                                       rescale_grad=1.0 / BATCH)


def train(digits, store, params, horizon, devices="1000ms,2000ms,3000ms", workers=3,
          servers=1, seed=0, eval_every_iterations=0, bigarray_bound=1_000_000, **optimizer):
    x, y, xt, yt = digits
    vt = VirtualTraining(fresh_net(seed), store, workers, x, y, xt, yt, BATCH,
                         make_sgd(**optimizer), servers=servers, seed=seed, record_trace=True,
                         eval_every_iterations=eval_every_iterations,
                         bigarray_bound=bigarray_bound)
    clocks = DeviceClock.for_cluster(devices, [], workers)
    blocks = vt.blocks_per_server() if servers > 1 else None
    simulate(store, registry.lookup(store).check(params), None, horizon, clocks=clocks,
             servers=servers, blocks=blocks, trainer=vt)
    return vt


def per_key_trace(vt):
    return [(w, read[0], applied[0]) for w, read, applied in vt.log.trace]


def test_asp_trace(digits):
    # t=1 w0 (read 0) -> v1; t=2 w1 (0) -> v2, w0 (1) -> v3; t=3 w2 (0) -> v4, w0 (3) -> v5;
    # t=4 w1 (2) -> v6, w0 (5) -> v7
    vt = train(digits, "dist_asp", {}, 4.0)
    assert per_key_trace(vt) == [(0, 0, 1), (1, 0, 2), (0, 1, 3), (2, 0, 4), (0, 3, 5),
                                 (1, 2, 6), (0, 5, 7)]
    # staleness: updates between the read and the push (applied - 1 - read)
    assert dict(vt.log.staleness) == {0: 1, 1: 4, 3: 2}


def test_bsp_trace(digits):
    # a round closes when the slowest (3 s) pushes: all three read v0 -> v1, then v1 -> v2
    vt = train(digits, "dist_bsp", {}, 6.0)
    assert per_key_trace(vt) == [(0, 0, 1), (1, 0, 1), (2, 0, 1), (0, 1, 2), (1, 1, 2),
                                 (2, 1, 2)]
    assert dict(vt.log.staleness) == {0: 6}


def test_ssp_trace(digits):
    # s=1: t=2 w0 (read 1) is 2 ahead of w2: applied (v3), waits; t=3 w2 (0) -> v4 lets it
    # go; t=4 w1 (2) -> v5, w0 (4) -> v6 waits again; t=6 w2 (4) -> v7, w1 (5) -> v8
    vt = train(digits, "dist_ssp", {"staleness": 1}, 6.5)
    assert per_key_trace(vt) == [(0, 0, 1), (1, 0, 2), (0, 1, 3), (2, 0, 4), (1, 2, 5),
                                 (0, 4, 6), (2, 4, 7), (1, 5, 8)]


def test_dssp_trace(digits):
    # s_L=1, s_U=3: as SSP s=1 until t=7, when w0 (read 7, lead 2) is the fastest and the
    # controller predicts w2's next push at 9: one more iteration (r*=1) lands nearest, so w0
    # gets OK at lead 2 (-> v9) where SSP s=1 makes it wait; t=8 w1 (read 8, lead 2) gets r*=2
    # (-> v10); w0 (read 9, lead 3 > its bound 2) -> v11 and waits
    vt = train(digits, "dist_dssp", {"staleness_lower": 1, "staleness_upper": 3}, 8.0)
    assert per_key_trace(vt) == [(0, 0, 1), (1, 0, 2), (0, 1, 3), (2, 0, 4), (1, 2, 5),
                                 (0, 4, 6), (2, 4, 7), (1, 5, 8), (0, 7, 9), (1, 8, 10),
                                 (0, 9, 11)]
    ssp = train(digits, "dist_ssp", {"staleness": 1}, 8.0)
    # under SSP s=1, w0's push at t=7 (lead 2) is applied but not OK'd: no push at t=8
    assert per_key_trace(ssp)[8:] == [(0, 7, 9), (1, 8, 10)]


def test_psp_trace(digits):
    # c=2: t=2 w1's push is the 2nd of round 0 -> v1 for w0 and w1; t=3 w2's push, stamped
    # v0, is dropped (None) and it pulls v1; w0 (1); t=4 w1 (1) closes round 1 -> v2;
    # t=5 w0 (2); t=6 w2 (1) dropped again, w1 (2) closes round 2 -> v3
    vt = train(digits, "dist_psp", {"min_pushes": 2}, 6.0)
    assert [(w, r[0], a[0]) for w, r, a in vt.log.trace] == [
        (0, 0, 1), (1, 0, 1), (2, 0, None), (0, 1, 2), (1, 1, 2), (0, 2, 3), (2, 1, None),
        (1, 2, 3)]
    assert vt.log.dropped == 2
    # a push every server drops costs no backward pass, but uses up its mini-batch: w2's
    # two dropped pushes took its first two, so it is at its third
    assert vt.log.gradients == vt.pushes - 2
    assert vt.cursor == [3 * BATCH, 3 * BATCH, 2 * BATCH]


class EveryPushComputed(VirtualTraining):
    """The reference: every push's gradient made at its first server, dropped or not."""

    def push(self, worker, server=0, accepted=True):
        super().push(worker, server, accepted)
        if server == 0 and self._unsent is not None:
            self._backward(*self._unsent)
            self._unsent = None


@pytest.mark.parametrize("slow", [0, 1])
def test_a_push_one_server_drops_is_computed_for_the_other_bit_for_bit(digits, slow):
    """With one server late (b < 1), a worker's push may be dropped by one server and summed
    by the other: its gradient is then made at the one that takes it, from the weights the
    worker read and on its own mini-batch, equal bit for bit to making it at every push."""
    x, y, xt, yt = digits
    params = registry.lookup("dist_psp").check({"min_pushes": 2, "min_pull_fraction": 0.5})
    runs = []
    for kind in (VirtualTraining, EveryPushComputed):
        vt = kind(fresh_net(), "dist_psp", 3, x, y, xt, yt, BATCH, make_sgd(), servers=2,
                  record_trace=True)
        delays = [0.0, 0.0]
        delays[slow] = 1.5
        simulate("dist_psp", params, None, 8.0,
                 clocks=DeviceClock.for_cluster("1000ms,2000ms,3000ms", [], 3), servers=2,
                 blocks=vt.blocks_per_server(), reply_delays=delays, trainer=vt)
        runs.append(vt)
    lazy, eager = runs
    applied = [tuple(a) for _, _, a in lazy.log.trace]
    assert any(a[slow] is None and a[1 - slow] is not None for a in applied)   # the case
    assert lazy.log.trace == eager.log.trace
    for a, b in zip(lazy.weights(), eager.weights()):
        assert np.array_equal(a, b)
    assert lazy.log.gradients == sum(1 for a in applied if a != (None, None)) < lazy.pushes


def test_psp_blocks_on_two_servers_read_what_each_worker_holds(digits):
    vt = train(digits, "dist_psp", {"min_pushes": 2}, 6.0, servers=2)
    assert sorted(vt.blocks_per_server()) == [4, 4]   # LeNet's 8 keys, placed by key
    # both servers see the same pushes, so their versions move together here
    assert [(w, r, tuple(a)) for w, r, a in vt.log.trace][:3] == [
        (0, (0, 0), (1, 1)), (1, (0, 0), (1, 1)), (2, (0, 0), (None, None))]


def test_one_asynchronous_worker_is_plain_gluon_sgd(digits):
    """n = 1 on dist_asp: the server's optimizer path gives what gluon.Trainer gives locally
    for the same mini-batches (the worker's own shuffle of the training set)."""
    x, y = digits[0], digits[1]
    vt = train(digits, "dist_asp", {}, 5.5, devices="1000ms", workers=1, seed=3)
    assert vt.pushes == 5
    net = fresh_net(3)
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    order = np.random.default_rng([3, 0]).permutation(len(x))
    for step in range(5):
        idx = order[step * BATCH:(step + 1) * BATCH]
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(x[idx])), mx.nd.array(y[idx]))
        loss.backward()
        trainer.step(BATCH)
    for mine, theirs in zip(vt.weights(), [p.data().asnumpy()
                                           for p in net.collect_params().values()]):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("store, params, servers", [
    ("dist_bsp", {}, 1),
    # every block its own round of all three workers, LeNet's larger arrays cut across two
    # servers (bigarray_bound 1,000): each server's flat storage must give every block back
    ("dist_psp", {"min_pushes": 3}, 2)])
def test_a_synchronous_round_sums_every_workers_gradient_from_the_same_weights(
        digits, store, params, servers):
    x, y = digits[0], digits[1]
    vt = train(digits, store, params, 3.0, seed=1, servers=servers,
               bigarray_bound=1000)   # exactly one round
    if servers > 1:   # keys with blocks on both servers
        assert {b.key for b in vt.servers[0].blocks} & {b.key for b in vt.servers[1].blocks}
    net = fresh_net(1)
    params = list(net.collect_params().values())
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    total = [np.zeros(p.shape, np.float32) for p in params]
    for worker in range(3):
        idx = np.random.default_rng([1, worker]).permutation(len(x))[:BATCH]
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(x[idx])), mx.nd.array(y[idx]))
        loss.backward()
        for t, p in zip(total, params):
            t += p.grad().asnumpy()
    for p, g in zip(params, total):   # one momentum-SGD step from zero momentum, by hand
        expected = p.data().asnumpy() * (1 - 0.05 * 1e-4) - 0.05 * g / BATCH
        p.set_data(mx.nd.array(expected))
    for mine, theirs in zip(vt.weights(), [p.data().asnumpy() for p in params]):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-6)


def test_the_same_seed_gives_the_same_weights_bit_for_bit(digits):
    runs = [train(digits, "dist_dssp", {"staleness_lower": 1, "staleness_upper": 3}, 12.0,
                  devices="700ms,1000ms,1900ms", seed=5) for _ in range(2)]
    assert runs[0].pushes == runs[1].pushes > 20
    for a, b in zip(runs[0].weights(), runs[1].weights()):
        assert np.array_equal(a, b)
    other = train(digits, "dist_dssp", {"staleness_lower": 1, "staleness_upper": 3}, 12.0,
                  devices="700ms,1000ms,1900ms", seed=6)
    assert not np.array_equal(other.weights()[0], runs[0].weights()[0])


def test_flat_parameters_compute_the_nets_own_gradients_bit_for_bit(digits):
    """The net's arrays as views into one flat array: the same forward and backward, to
    the bit, as the net with its own arrays, and writing the flat array writes the net."""
    from kvstore_ext.virtual_training import flatten_parameters
    x, y = digits[0][:BATCH], digits[1][:BATCH]
    nets = [fresh_net(4), fresh_net(4)]
    flat_data, flat_grad, where = flatten_parameters(list(nets[1].collect_params().values()))
    assert list(flat_data) == [np.dtype(np.float32)]
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for net in nets:
        net.hybridize(static_alloc=True, static_shape=True)
        for _ in range(2):   # the cached graph's first call and a later one
            with autograd.record():
                loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
            loss.backward()
    plain, flat = (list(net.collect_params().values()) for net in nets)
    for a, b in zip(plain, flat):
        assert np.array_equal(a.data().asnumpy(), b.data().asnumpy())
        assert np.array_equal(a.grad().asnumpy(), b.grad().asnumpy())
        assert np.abs(a.grad().asnumpy()).sum() > 0
    grads = flat_grad[np.dtype(np.float32)].asnumpy()
    for i, p in enumerate(flat):   # each parameter's gradient at its place in the flat one
        _, at = where[i]
        assert np.array_equal(grads[at:at + p.data().size], p.grad().asnumpy().ravel())
    flat_data[np.dtype(np.float32)][:] = 0.5
    assert all((p.data().asnumpy() == 0.5).all() for p in flat)


def test_the_bound_objective_gives_autograds_gradients_from_the_flat_weights(digits):
    """An iteration's executor, bound once over the flat arrays, computes what
    ``autograd.record()`` and ``backward`` compute on the same net, bit for bit: on two
    mini-batches, and after the flat weights are written (as a worker's weights are loaded),
    which the executor must see without being bound again."""
    from kvstore_ext.virtual_training import BoundObjective, flatten_parameters, objective_block
    x, y = digits[0], digits[1]
    xs, ys = mx.nd.array(x), mx.nd.array(y)
    nets = [fresh_net(4), fresh_net(4)]
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    flat_data, _, _ = flatten_parameters(list(nets[1].collect_params().values()))
    bound = BoundObjective(nets[1], loss_fn, list(nets[1].collect_params().values()), xs, ys,
                           BATCH)
    reference = objective_block(nets[0], loss_fn)
    reference.hybridize(static_alloc=True, static_shape=True)
    plain, flat = (list(net.collect_params().values()) for net in nets)
    rng = np.random.default_rng(0)
    for step in range(3):
        if step == 2:   # new weights written into the flat array and into the reference
            values = rng.normal(0, 0.05, flat_data[np.dtype(np.float32)].shape).astype("f4")
            flat_data[np.dtype(np.float32)][:] = values
            for p, q in zip(plain, flat):
                p.set_data(q.data().copy())
        idx = mx.nd.array(rng.permutation(len(x))[:BATCH])
        with autograd.record():
            loss = reference(xs, ys, idx)
        loss.backward()
        bound(idx)
        for a, b in zip(plain, flat):
            assert np.array_equal(a.grad().asnumpy(), b.grad().asnumpy()), (step, a.name)
            assert np.abs(b.grad().asnumpy()).sum() > 0


def test_flat_parameters_refuse_a_parameter_without_a_gradient_by_name():
    from kvstore_ext.virtual_training import flatten_parameters
    net = fresh_net()
    params = list(net.collect_params().values())
    params[2].grad_req = "null"
    with pytest.raises(ValueError, match=f"parameter {params[2].name} has no gradient"):
        flatten_parameters(params)


def test_contiguous_spans_join_parts_adjacent_on_both_sides():
    from kvstore_ext.virtual_training import contiguous_spans
    f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
    assert contiguous_spans([(f32, 0, 0, 5), (f32, 5, 5, 3), (f32, 8, 8, 2)]) == \
        [(f32, 0, 0, 10)]
    # a gap on one side, another dtype, or a gap on the other side cuts the span
    assert contiguous_spans([(f32, 0, 0, 5), (f32, 9, 5, 3), (f16, 12, 8, 1),
                             (f16, 13, 10, 1)]) == \
        [(f32, 0, 0, 5), (f32, 9, 5, 3), (f16, 12, 8, 1), (f16, 13, 10, 1)]
    assert contiguous_spans([]) == []


def test_a_version_no_worker_reads_is_never_copied(digits):
    """ASP behind a server queue: replies held for the pushes queued behind them, so several
    updates land between two reads.  The weights are copied when a version is first read
    (a worker's gradient is computed from the version it read), never at an update."""
    x, y, xt, yt = digits
    vt = VirtualTraining(fresh_net(), "dist_asp", 8, x, y, xt, yt, BATCH, make_sgd())
    state = vt.servers[0]
    copied, read, copied_at_update = [], [], []
    live, apply = state.live, state.apply

    def copying():
        copied.append(state.version)
        return live()

    def reading():
        read.append(state.version)
        return ServerState.snapshot(state)

    def applying(pusher=None):
        apply(pusher)
        copied_at_update.extend(v for v in copied if v == state.version)
    state.live, state.snapshot, state.apply = copying, reading, applying
    simulate("dist_asp", {}, None, 3.0, clocks=DeviceClock.for_cluster("1000ms*8", [], 8),
             service=0.004, trainer=vt)
    assert vt.pushes >= 16 and not copied_at_update
    assert copied == sorted(set(read))          # one copy per version read ...
    assert len(copied) < state.version          # ... fewer than the updates


def test_worker_pools_and_horovod_stores_are_refused_with_the_reason(digits):
    x, y, xt, yt = digits
    with pytest.raises(ValueError, match="dist_pool"):
        VirtualTraining(fresh_net(), "dist_pool", 2, x, y, xt, yt, BATCH, make_sgd())
    with pytest.raises(ValueError, match="dist_ssgd: no synchronisation model"):
        VirtualTraining(fresh_net(), "dist_ssgd", 2, x, y, xt, yt, BATCH, make_sgd())
    with pytest.raises(ValueError, match="batch_size 4000 is larger"):
        VirtualTraining(fresh_net(), "dist_bsp", 2, x, y, xt, yt, 4000, make_sgd())


def test_a_delay_aware_optimizer_gets_each_pushs_delay_as_the_servers_give_it(digits):
    """AdaDelay on dist_asp: applied push by push with the push's delay, which equals the
    staleness the run records (updates since the pusher read the weights)."""
    x, y, xt, yt = digits
    vt = VirtualTraining(fresh_net(), "dist_asp", 3, x, y, xt, yt, BATCH,
                         lambda: mx.optimizer.create("adadelay", learning_rate=0.05,
                                                     rescale_grad=1.0 / BATCH))
    simulate("dist_asp", {}, None, 6.0, clocks=DeviceClock.for_cluster("1000ms,2000ms,3000ms",
                                                                      [], 3), trainer=vt)
    optimizer = vt.servers[0].optimizer
    assert optimizer.delay_aware
    # every key is updated once per push, with that push's delay
    keys = len(vt.params)
    assert {d: n // keys for d, n in optimizer.optimizer.delays.items()} == dict(vt.log.staleness)
    assert max(vt.log.staleness) >= 3


def test_agreement_rows_compare_medians_against_the_bounds():
    """Virtual against real on the same devices: medians over runs, each bound of the issue."""
    from kvstore_ext.experiments import load_experiment
    from kvstore_ext.virtual_training import agreement_pairs, agreement_rows
    exp = load_experiment(os.path.join(ROOT, "configs", "virtual", "agreement_n4.yaml"))
    assert agreement_pairs(exp) == [("real", "virtual")]

    def run(cluster, paradigm, iterations, staleness, accuracy, reach_at):
        curve = [{"time_s": t, "test_accuracy": a} for t, a in
                 [(reach_at / 2, 0.5), (reach_at, 0.92), (40.0, accuracy)]]
        return {"cluster": cluster, "paradigm": paradigm, "iterations": iterations,
                "staleness_mean": staleness, "final_accuracy": accuracy, "curve": curve}
    runs = [run("real", "ASP", [100, 120], 2.0, 0.95, 10.0),
            run("real", "ASP", [200, 220], 2.2, 0.96, 12.0),     # the median of three:
            run("real", "ASP", [104, 124], 2.1, 0.97, 11.0),     # 114, 2.1, 0.96, 11 s
            run("virtual", "ASP", [118, 120], 2.5, 0.955, 11.5),  # +4.4%, +19%, -0.5, +4.5%
            run("virtual", "BSP", [50, 50], 0.0, 0.9, 30.0),      # no real BSP: no row
            run("real", "SSP s=3", [100, 100], 0.0, 0.9, 20.0),
            run("virtual", "SSP s=3", [110, 110], 0.02, 0.93, 20.0)]
    rows = {r["paradigm"]: r for r in agreement_rows(runs, exp)}
    assert set(rows) == {"ASP", "SSP s=3"}
    asp = rows["ASP"]
    assert asp["iterations_real"] == 114.0 and asp["iterations_virtual"] == 119.0
    assert asp["iterations_diff"] == pytest.approx(119 / 114 - 1)
    assert asp["staleness_diff"] == pytest.approx(2.5 / 2.1 - 1)
    assert asp["accuracy_diff_points"] == pytest.approx(-0.5)
    assert asp["time_diff"] == pytest.approx(11.5 / 11 - 1)
    assert asp["agrees"] == {"iterations": True, "staleness": False, "accuracy": True,
                             "time": True}
    assert asp["outside"] == "staleness"
    ssp = rows["SSP s=3"]     # 10% more iterations, 3 points; staleness ~0 on both agrees
    assert ssp["agrees"] == {"iterations": False, "staleness": True, "accuracy": False,
                             "time": True}


def test_agreement_rows_also_pair_the_times_seed_by_seed():
    """The medians of each side can come from different seeds: with launched trials seeded
    by their number, each seed's virtual time is also set against its real one."""
    from kvstore_ext.experiments import load_experiment
    from kvstore_ext.virtual_training import agreement_rows
    exp = load_experiment(os.path.join(ROOT, "configs", "virtual", "agreement_n2.yaml"))
    assert exp.seed_by_trial

    def run(cluster, trial, reach_at):
        return {"cluster": cluster, "paradigm": "BSP", "trial": trial, "iterations": [100],
                "staleness_mean": 0.0, "final_accuracy": 0.95,
                "curve": [{"time_s": reach_at, "test_accuracy": 0.95}]}
    # seed 0's real curve crossed one evaluation later: the medians are 20 against 15.7
    runs = [run("real", 0, 20.0), run("real", 1, 22.2), run("real", 2, 15.8),
            run("virtual", 0, 15.7), run("virtual", 1, 22.0), run("virtual", 2, 15.7)]
    row = agreement_rows(runs, exp)[0]
    assert row["time_diff"] == pytest.approx(15.7 / 20.0 - 1)
    assert row["time_paired_diff"] == pytest.approx(22.0 / 22.2 - 1)    # the median of three
    exp.seed_by_trial = False
    assert agreement_rows(runs, exp)[0]["time_paired_diff"] is None


def test_agreement_rows_tell_a_difference_from_the_seeds_spread():
    """Outside a bound is one thing; apart beyond what seeds do to one side is another. Three
    runs a side can never show it (the smallest two-sided p is 0.1); eight can, and a run
    that never reaches the target ranks after every one that does."""
    from kvstore_ext.experiments import load_experiment
    from kvstore_ext.virtual_training import agreement_rows
    exp = load_experiment(os.path.join(ROOT, "configs", "virtual", "agreement_n4.yaml"))

    def run(cluster, trial, accuracy, reach_at):
        curve = [{"time_s": 40.0, "test_accuracy": accuracy}] if reach_at is None else \
            [{"time_s": reach_at, "test_accuracy": 0.91}, {"time_s": 40.0, "test_accuracy": accuracy}]
        return {"cluster": cluster, "paradigm": "DSSP 3..15", "trial": trial,
                "iterations": [100], "staleness_mean": 2.5, "final_accuracy": accuracy,
                "curve": curve}

    def rows(k, virtual_accuracy, virtual_time):
        runs = [run("real", t, 0.95 + 0.001 * t, 20.0 + t) for t in range(k)]
        runs += [run("virtual", t, virtual_accuracy + 0.001 * t, virtual_time(t)) for t in range(k)]
        return agreement_rows(runs, exp)[0]

    three = rows(3, 0.92, lambda t: 30.0 + t)      # 3 points lower, half again as late
    assert three["outside"] == "accuracy, time"
    assert three["accuracy_p"] == pytest.approx(0.1) and three["time_p"] == pytest.approx(0.1)
    assert three["apart"] == "-"
    eight = rows(8, 0.92, lambda t: None if t % 2 else 30.0 + t)   # half never reach 0.9
    assert eight["accuracy_p"] < 0.001 and eight["time_p"] < 0.001
    assert eight["apart"] == "accuracy, time"
    # the same spread of seeds on both sides, interleaved: within the bound, not apart
    close = rows(8, 0.9505, lambda t: 20.5 + t)
    assert close["outside"] == "-" and close["apart"] == "-"
    assert close["accuracy_p"] > 0.05


def test_a_cluster_with_a_calibration_takes_the_planners_message_costs(tmp_path):
    """``calibration:`` in a virtual cluster: the simulator gets the planner's latency,
    service and apply times for this model, store and size (the same mapping predict's
    simulator path uses); with latency beside it, or a missing file, a clear error."""
    import json

    from kvstore_ext.experiments import ConfigError, _cluster_options
    from kvstore_ext.plan.model import Costs, simulator_delays
    from kvstore_ext.virtual_training import message_costs
    costs = Costs(worker_msg=1e-3, worker_key=1e-4, worker_byte=1e-9, server_msg=2e-3,
                  server_key=1e-4, server_byte=1e-9, opt_key=1e-4, opt_param=1e-9,
                  latency=1e-4, bandwidth=1e9)
    sizes = [500, 20, 25000, 50, 400000, 500, 5000, 10]
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"coefficients": costs.to_dict(), "profiles": {
        "lenet": {"key_sizes": sizes, "compute_fixed": 0.0, "compute_per_sample": 1e-4}}}))
    params = sum(sizes)
    worker = 1e-3 + 8 * 1e-4 + 4 * params * 1e-9
    link = 2 * 1e-4 + 2 * 4 * params / 1e9
    push = 2e-3 + 8 * 1e-4 + 4 * params * 1e-9
    apply = 8 * 1e-4 + params * 1e-9
    got = message_costs({"calibration": str(path)}, "lenet", "dist_asp", 8, 1, 64)
    assert got == pytest.approx({"latency": worker + link, "service": push, "apply_time": apply})
    psp = message_costs({"calibration": str(path)}, "lenet", "dist_psp", 8, 1, 64)
    assert psp == pytest.approx(simulator_delays(worker + link, push, apply))
    assert message_costs({"latency": 0.004, "service": 0.001}, "lenet", "dist_bsp", 8, 1, 64) \
        == {"latency": 0.004, "service": 0.001}
    with pytest.raises(ValueError, match="plan calibrate"):
        message_costs({"calibration": str(tmp_path / "none.json")}, "lenet", "dist_bsp", 8, 1, 64)
    with pytest.raises(ConfigError, match="calibration .* or latency, not both"):
        _cluster_options({"virtual": True, "device": "200ms", "calibration": str(path),
                          "latency": 0.004}, "clusters.v", 1, 8)
    # the jitter varies whichever latency the cluster gets, as a fraction of it
    assert _cluster_options({"virtual": True, "device": "200ms", "calibration": str(path),
                             "latency_jitter": 0.5}, "clusters.v", 1, 8)["latency_jitter"] == 0.5
    for bad in (1.5, -0.1, "half", True):
        with pytest.raises(ConfigError, match=f"latency_jitter must be a fraction .* got {bad!r}"):
            _cluster_options({"virtual": True, "device": "200ms", "latency_jitter": bad},
                             "clusters.v", 1, 8)
    # one host's cores: the calibration's compute of the model and its interference
    from kvstore_ext.virtual_training import shared_host
    assert _cluster_options({"virtual": True, "device": "200ms", "calibration": str(path),
                             "shared_host": True}, "clusters.v", 1, 8)["shared_host"] is True
    with pytest.raises(ConfigError, match="shared_host needs calibration"):
        _cluster_options({"virtual": True, "device": "200ms", "shared_host": True},
                         "clusters.v", 1, 8)
    for bad in ("yes", 0.9, float("nan")):
        with pytest.raises(ConfigError, match=f"shared_host must be true, false or an "
                                              f"exchange's slow-down .* got {bad!r}"):
            _cluster_options({"virtual": True, "device": "200ms", "calibration": str(path),
                              "shared_host": bad}, "clusters.v", 1, 8)
    assert shared_host({"device": "200ms"}, "lenet", 64) is None
    host = shared_host({"calibration": str(path), "shared_host": True}, "lenet", 64)
    assert host.host_time == pytest.approx(64 * 1e-4)    # the calibration's compute at 64
    assert host.interference(1) == pytest.approx(1.0)
    measured = shared_host({"calibration": str(path), "shared_host": 1.2}, "lenet", 64)
    assert [measured.interference(k) for k in (1, 2, 3)] == pytest.approx([1.0, 1.2, 1.4])


def test_evaluations_on_worker_0s_iteration_grid(digits):
    """``eval_every_iterations``: an evaluation when worker 0 is let go after every k-th
    iteration (as a launched run's worker 0 snapshots after every k-th step), stamped with
    that moment's virtual time and the pushes made by then."""
    # ASP (the trace above): worker 0 pushes at t = 1, 2, 3, 4, ...; its 2nd push is the 3rd
    # of the job, its 4th the 7th, its 6th (t = 6, after w2's and w1's) the 11th
    asp = train(digits, "dist_asp", {}, 6.5, eval_every_iterations=2)
    assert [(e.time, e.iterations) for e in asp.log.curve] == [(2.0, 3), (4.0, 7), (6.0, 11)]
    # BSP: worker 0 is let go when a round closes (t = 3, 6, 9, 12): the 2nd and 4th rounds,
    # and what it evaluates is the round's weights, as they are at the end of a shorter run
    bsp = train(digits, "dist_bsp", {}, 12.5, eval_every_iterations=2)
    assert [(e.time, e.iterations) for e in bsp.log.curve] == [(6.0, 6), (12.0, 12)]
    two_rounds = train(digits, "dist_bsp", {}, 6.5)
    assert two_rounds.evaluate(6.5) == bsp.log.curve[0].accuracy


def test_evaluation_stamped_when_worker_0_leaves_the_server_queue(digits):
    """With a server that takes 0.25 s per push, worker 0 is let go when its push has been
    served, not when it arrived: its 2nd push arrives at 2.25 (behind worker 1's at 2.0,
    served until 2.25) and is served until 2.5, and that is the evaluation's moment."""
    x, y, xt, yt = digits
    vt = VirtualTraining(fresh_net(0), "dist_asp", 3, x, y, xt, yt, BATCH, make_sgd(),
                         seed=0, eval_every_iterations=2)
    clocks = DeviceClock.for_cluster("1000ms,2000ms,3000ms", [], 3)
    simulate("dist_asp", {}, None, 2.9, clocks=clocks, service=0.25, trainer=vt)
    assert [(e.time, e.iterations) for e in vt.log.curve] == [(2.5, 3)]


def calibration_file(tmp_path, interference=None):
    """A ``plan calibrate`` JSON with hand-set costs and LeNet's profile: 1 ms + 0.1 ms per
    sample of compute."""
    import json

    from kvstore_ext.plan.model import Costs
    costs = Costs(interference=interference or {1: 1.0})
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"coefficients": costs.to_dict(), "profiles": {
        "lenet": {"key_sizes": [500, 20, 25000, 50, 400000, 500, 5000, 10],
                  "compute_fixed": 1e-3, "compute_per_sample": 1e-4}}}))
    return path


def test_compute_from_the_calibration_times_each_virtual_workers_iterations(tmp_path):
    """``compute: calibration``: a worker's iteration is the calibrated compute of the model at
    its batch (1 ms + 64 x 0.1 ms = 7.4 ms), slowed by the interference of ``workers_per_host``
    processes on a host (1.5 at 2), over its speed; straggler patterns on top."""
    from kvstore_ext.experiments import load_experiment
    from kvstore_ext.virtual_training import worker_clocks
    path = calibration_file(tmp_path, {1: 1.0, 2: 1.5, 4: 2.5})
    config = tmp_path / "compute.yaml"
    config.write_text(f"""
name: compute
script: scripts/train_mnist.py
args: {{model: lenet, batch-size: 64}}
workers: 2
clusters:
  alone: {{virtual: true, compute: calibration, calibration: {path}}}
  shared: {{virtual: true, compute: calibration, calibration: {path}, workers_per_host: 2,
           speeds: [1.0, 0.5], patterns: ["slow:3:0:1:1"]}}
paradigms: [{{name: BSP, kvstore: dist_bsp}}]
""")
    exp = load_experiment(str(config))
    assert exp.times_iterations("shared") and not exp.uses_devices("shared")
    alone = worker_clocks(exp, "alone", "lenet", 64)
    assert [c.next_time(0.0) for c in alone] == pytest.approx([7.4e-3, 7.4e-3])
    fast, slow = worker_clocks(exp, "shared", "lenet", 64)
    assert fast.next_time(0.0) == pytest.approx(7.4e-3 * 1.5)
    assert slow.next_time(0.5) == pytest.approx(7.4e-3 * 1.5 / 0.5 * 3)   # slowed until 1 s
    assert slow.next_time(1.0) == pytest.approx(7.4e-3 * 1.5 / 0.5)
    assert worker_clocks(exp, "alone", "lenet", 16)[0].next_time(0.0) == pytest.approx(2.6e-3)
    with pytest.raises(ValueError, match="no profile of model 'alexnet_small'"):
        worker_clocks(exp, "alone", "alexnet_small", 64)


@pytest.mark.parametrize("cluster,message", [
    ({"compute": "calibration"}, "compute: calibration needs calibration"),
    ({"compute": "gpu", "calibration": "c.json"}, "compute must be calibration .* got 'gpu'"),
    ({"compute": "calibration", "calibration": "c.json", "device": "200ms"},
     "give device .* or compute"),
    ({"device": "200ms", "workers_per_host": 2}, "workers_per_host is for compute"),
    ({"compute": "calibration", "calibration": "c.json", "workers_per_host": 0},
     "workers_per_host must be an integer >= 1, got 0"),
    ({}, "needs device .* or compute: calibration"),
    ({"device": "200ms", "eval_every_iterations": 0},
     "eval_every_iterations must be an integer >= 1, got 0"),
    ({"device": "200ms", "eval_every_iterations": 2.5},
     "eval_every_iterations must be an integer >= 1, got 2.5"),
    ({"device": "200ms", "eval_every": 4, "eval_every_iterations": 20},
     "eval_every .* or eval_every_iterations .* not both"),
    ({"compute": "calibration", "calibration": "c.json", "patterns": ["transient:2:3:2"]},
     "transient probability must be in"),
    ({"device": "200ms", "min_delta": 0.01}, "min_delta .* give patience too"),
    ({"device": "200ms", "patience": 3, "min_delta": -0.1}, "min_delta must be an accuracy >= 0"),
])
def test_bad_compute_and_evaluation_keys_name_the_key(cluster, message):
    from kvstore_ext.experiments import ConfigError, _cluster_options
    with pytest.raises(ConfigError, match=message):
        _cluster_options({"virtual": True, **cluster}, "clusters.v", 1, 8)
