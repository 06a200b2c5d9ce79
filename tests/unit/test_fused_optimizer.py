"""The servers' fused SGD (:class:`kvstore_ext.optimizers.ServerOptimizer`) against MXNet's own
Updater applied key by key: weights, momentum, update counts and the scheduler's rates."""
import pickle
import random

import mxnet as mx
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from kvstore_ext.optimizers import (FlatArrays, Piece, Run, ServerOptimizer, equal_rate_spans,
                                    kernel_calls, sgd_step)

#: key 5 is long enough to be updated alone by MXNet's one-array kernel (with momentum)
SIZES = [5, 17, 300, 4000, 3, 70000, 1, 2304]
#: the keys each step updates, in this order (some steps leave keys out, so counts differ)
STEPS = [list(range(8)), [2, 0, 5], list(range(8)), [7, 6], list(range(8)), [1, 2, 3, 4]]
#: MXNet's one-array and multi-tensor SGD kernels, called as MXNet's SGD calls them, give the
#: same bits: the servers' weights are MXNet's updater's, exactly
TOLERANCE = 0.0


def make_sgd(momentum=0.9, clip=0.7, scheduler=False, **extra):
    opt = mx.optimizer.SGD(learning_rate=None if scheduler else 0.1, momentum=momentum, wd=1e-3,
                           rescale_grad=0.5, clip_gradient=clip,
                           lr_scheduler=mx.lr_scheduler.FactorScheduler(step=2, factor=0.5,
                                                                        base_lr=0.1)
                           if scheduler else None, **extra)
    opt.set_lr_mult({1: 0.5, 3: 2.0, 6: 0.25})
    opt.set_wd_mult({2: 0.0, 5: 3.0})
    return opt


def data(dtype, seed=0):
    rng = np.random.default_rng(seed)
    initial = [rng.standard_normal(n).astype(dtype) for n in SIZES]
    grads = [[rng.standard_normal(n).astype(dtype) for n in SIZES] for _ in range(8)]
    return initial, grads


def reference(make, dtype, steps=STEPS):
    """MXNet's Updater, one key per call, in each step's order."""
    initial, grads = data(dtype)
    updater = mx.optimizer.get_updater(make())
    weights = [mx.nd.array(v, dtype=dtype) for v in initial]
    for keys, step in zip(steps, grads):
        for k in keys:
            updater(k, mx.nd.array(step[k], dtype=dtype), weights[k])
    return [w.asnumpy() for w in weights], updater


class FlatModel:
    """The keys of SIZES back to back in FlatArrays, as a server holds them."""

    def __init__(self, dtype, initial):
        self.home = FlatArrays(dtype)
        self.offsets = [self.home.add(n) for n in SIZES]
        for k, value in enumerate(initial):
            self.block("weight", k)[:] = value

    def block(self, role, k):
        return self.home.numpy(role)[self.offsets[k]:self.offsets[k] + SIZES[k]]

    def runs(self, keys):
        """``keys`` cut into runs of adjacent blocks, in the given order."""
        runs, current = [], []
        for k in keys:
            if current and k != current[-1] + 1:
                runs.append(current)
                current = []
            current.append(k)
        runs.append(current)
        return [Run(self.home, run, [self.offsets[k] for k in run]
                    + [self.offsets[run[-1]] + SIZES[run[-1]]]) for run in runs]

    def step(self, optimizer, keys, grads):
        for k in keys:
            self.block("grad", k)[:] = grads[k]
        optimizer.apply_runs(self.runs(keys))
        mx.nd.waitall()   # the next gradients are written straight into the memory

    def weights(self):
        return [self.block("weight", k).copy() for k in range(len(SIZES))]


def fused_runs(make, dtype, steps=STEPS):
    initial, grads = data(dtype)
    optimizer = ServerOptimizer(make(), "dist_bsp", asynchronous=False)
    model = FlatModel(dtype, initial)
    for keys, step in zip(steps, grads):
        model.step(optimizer, keys, step)
    return model.weights(), optimizer


def fused_lists(make, dtype, steps=STEPS):
    initial, grads = data(dtype)
    optimizer = ServerOptimizer(make(), "dist_bsp", asynchronous=False)
    weights = [mx.nd.array(v, dtype=dtype) for v in initial]
    for keys, step in zip(steps, grads):
        optimizer.apply(keys, [mx.nd.array(step[k], dtype=dtype) for k in keys],
                        [weights[k] for k in keys])
    return [w.asnumpy() for w in weights], optimizer


def largest_difference(got, want) -> float:
    return max(float(np.abs(g.astype(np.float64) - w).max()) for g, w in zip(got, want))


CASES = {"momentum": {}, "no momentum": {"momentum": 0.0}, "no clipping": {"clip": None},
         "scheduler": {"scheduler": True}}


@pytest.mark.parametrize("path", [fused_runs, fused_lists], ids=["runs", "lists"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_sgd_equals_mxnets_updater_key_by_key(path, dtype, case):
    def make():
        return make_sgd(**CASES[case])
    assert max(SIZES) >= ServerOptimizer.ALONE_ELEMENTS > sorted(SIZES)[-2]
    want, updater = reference(make, dtype)
    got, optimizer = path(make, dtype)
    assert largest_difference(got, want) <= TOLERANCE
    ours, theirs = optimizer.optimizer, updater.optimizer
    assert ours._index_update_count == theirs._index_update_count
    assert ours.num_update == theirs.num_update
    if CASES[case].get("momentum", 0.9):
        for k in range(len(SIZES)):
            np.testing.assert_allclose(optimizer.updater.states[k].asnumpy(),
                                       updater.states[k].asnumpy(), rtol=0, atol=TOLERANCE)
    else:
        assert all(optimizer.updater.states[k] is None for k in range(len(SIZES)))


def test_the_scheduler_takes_each_keys_rate_at_its_running_count():
    """Keys whose counts differ: MXNet's key-by-key updates see num_update rise within one
    call; the fused call gives each key the rate of its turn."""
    steps = [[0, 1], [0], [0], [0], [0, 1, 2, 3, 4]]   # key 0 runs ahead, then all at once
    want, updater = reference(lambda: make_sgd(scheduler=True), np.float32, steps)
    for path in (fused_runs, fused_lists):
        got, optimizer = path(lambda: make_sgd(scheduler=True), np.float32, steps)
        assert largest_difference(got, want) <= TOLERANCE
        assert optimizer.optimizer.lr_scheduler.base_lr == updater.optimizer.lr_scheduler.base_lr


def test_states_saved_and_loaded_go_on_as_mxnets():
    """get_states copies the momentum out of flat storage; set_states puts loaded momentum
    back in at the next update (into another server's storage here)."""
    initial, grads = data(np.float32)
    first, rest = STEPS[:3], STEPS[3:]
    # MXNet: an updater, its states saved, a new updater that loads them
    updater = mx.optimizer.get_updater(make_sgd())
    weights = [mx.nd.array(v) for v in initial]
    for keys, step in zip(first, grads):
        for k in keys:
            updater(k, mx.nd.array(step[k]), weights[k])
    resumed = mx.optimizer.get_updater(make_sgd())
    resumed.set_states(updater.get_states())
    for keys, step in zip(rest, grads[3:]):
        for k in keys:
            resumed(k, mx.nd.array(step[k]), weights[k])
    # ours, the same way
    optimizer = ServerOptimizer(make_sgd(), "dist_bsp", False)
    model = FlatModel(np.float32, initial)
    for keys, step in zip(first, grads):
        model.step(optimizer, keys, step)
    saved = pickle.loads(optimizer.get_states())
    for k in range(len(SIZES)):
        np.testing.assert_array_equal(saved[k].asnumpy(), updater.states[k].asnumpy())
    again = ServerOptimizer(make_sgd(), "dist_bsp", False)
    again.set_states(saved)
    other = FlatModel(np.float32, model.weights())
    for keys, step in zip(rest, grads[3:]):
        other.step(again, keys, step)
    assert largest_difference(other.weights(), [w.asnumpy() for w in weights]) <= TOLERANCE


def test_momentum_survives_the_storage_moving(monkeypatch):
    """Blocks added after updates make the flat arrays move (a new generation): the momentum
    moves with them and the states are views of the new arrays."""
    monkeypatch.setattr(FlatArrays, "MIN_CAPACITY", 8)
    steps = [list(range(i + 1)) for i in range(len(SIZES))]   # one more key each step
    initial, grads = data(np.float32)
    want, _ = reference(make_sgd, np.float32, steps)
    optimizer = ServerOptimizer(make_sgd(), "dist_bsp", False)
    home = FlatArrays(np.float32)
    offsets = []
    generations = set()
    for keys, step in zip(steps, grads):
        while len(offsets) < len(SIZES) and len(offsets) <= max(keys):
            offsets.append(home.add(SIZES[len(offsets)]))
            k = len(offsets) - 1
            home.numpy("weight")[offsets[k]:offsets[k] + SIZES[k]] = initial[k]
        generations.add(home.generation)
        runs = [Run(home, [k], [offsets[k], offsets[k] + SIZES[k]]) for k in keys]
        for k in keys:
            home.numpy("grad")[offsets[k]:offsets[k] + SIZES[k]] = step[k]
        optimizer.apply_runs(runs)
        mx.nd.waitall()
    assert len(generations) > 2
    got = [home.numpy("weight")[o:o + n] for o, n in zip(offsets, SIZES)]
    assert largest_difference(got, want) <= TOLERANCE


@pytest.mark.parametrize("name, params, dtype", [
    ("adam", {"learning_rate": 0.01, "wd": 1e-3}, np.float32),
    ("nag", {"learning_rate": 0.05, "momentum": 0.9}, np.float32),
    ("sgd", {"learning_rate": 0.05, "momentum": 0.9, "multi_precision": True}, np.float16)])
def test_other_optimizers_go_through_mxnets_updater(name, params, dtype):
    def make():
        return mx.optimizer.create(name, **params)
    want, _ = reference(make, dtype)
    for path in (fused_runs, fused_lists):
        got, optimizer = path(make, dtype)
        assert largest_difference(got, want) <= TOLERANCE


def test_kernel_calls_batch_alike_lengths_of_one_dtype():
    rng = random.Random(3)
    pieces = [Piece(None, None, None, 0.1, 0.0, size, np.dtype(dtype))
              for size, dtype in ((rng.choice([1, 16, 300, 5000, 70000, 1 << 20]),
                                   rng.choice(["float32", "float64"])) for _ in range(300))]
    calls = list(kernel_calls(pieces, limit=60, spare=1 << 15))
    assert sorted(id(p) for call in calls for p in call) == sorted(id(p) for p in pieces)
    for call in calls:
        assert len(call) <= 60 and len({p.dtype for p in call}) == 1
        longest = max(p.size for p in call)
        assert all(longest - p.size <= 1 << 15 for p in call)
    # one large array and many small ones: the large one is not batched with them
    mixed = [Piece(None, None, None, 0.1, 0.0, n, np.dtype("float32"))
             for n in [1 << 20] + [8] * 64]
    assert [[p.size for p in call] for call in kernel_calls(mixed, 60, 1 << 15)] == \
        [[1 << 20], [8] * 60, [8] * 4]


def test_equal_rate_spans():
    lrs = [0.1, 0.1, 0.2, 0.2, 0.2, 0.1]
    wds = [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert list(equal_rate_spans(lrs, wds, 0, 6)) == [(0, 2), (2, 3), (3, 5), (5, 6)]
    assert list(equal_rate_spans(lrs, wds, 3, 5)) == [(3, 5)]


#: hyper-parameters as users set them and awkward ones: rates and scales whose float32
#: products round, so that an operation done in another order changes the last bit
RATES = st.sampled_from([0.1, 0.01, 0.05, 0.37, 1e-3, 3e-4, 1.7])
SCALES = st.sampled_from([1.0, 0.5, 1 / 3, 1 / 64, 1 / 96, 0.37])


@given(size=st.integers(1, 200_000), dtype=st.sampled_from([np.float32, np.float64]),
       lr=RATES, wd=st.sampled_from([0.0, 1e-4, 5e-4, 0.01, 0.3]),
       momentum=st.sampled_from([None, 0.0, 0.5, 0.9, 0.99]), rescale=SCALES,
       clip=st.sampled_from([-1.0, 0.0, 0.1, 1.0, 5.0]), seed=st.integers(0, 2 ** 32 - 1),
       specials=st.booleans())
@example(size=2 * 65536 + 1, dtype=np.float32, lr=0.37, wd=1e-4, momentum=0.9,
         rescale=1 / 96, clip=-1.0, seed=1, specials=True)    # vector lanes, and a last one
@example(size=7, dtype=np.float64, lr=1.7, wd=0.3, momentum=None, rescale=0.37,
         clip=0.1, seed=2, specials=False)                     # shorter than a vector
@settings(max_examples=200, deadline=None)
def test_compiled_sgd_step_gives_mxnets_kernels_bits(size, dtype, lr, wd, momentum, rescale,
                                                     clip, seed, specials):
    """:func:`sgd_step` against MXNet's kernels as MXNet's SGD calls them, bit for bit: with
    momentum ``sgd_mom_update``; without (None), ``multi_sgd_update`` (NaN and infinities in
    the gradient where ``specials``, weights of both signs of zero)."""
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal(size) * 10.0 ** rng.integers(-3, 3)).astype(dtype)
    weight[rng.integers(0, size, 2)] = [0.0, -0.0]
    grad = (rng.standard_normal(size) * 10.0 ** rng.integers(-4, 4)).astype(dtype)
    if specials:
        grad[rng.integers(0, size, 3)] = rng.choice([np.nan, np.inf, -np.inf], 3)
    w, g = mx.nd.array(weight, dtype=dtype), mx.nd.array(grad, dtype=dtype)
    clipping = {"clip_gradient": clip} if clip >= 0 else {}
    if momentum is None:
        mom = None
        mx.nd.multi_sgd_update(w, g, out=[w], num_weights=1, lrs=[lr], wds=[wd],
                               rescale_grad=rescale, **clipping)
    else:
        mom = rng.standard_normal(size).astype(dtype)
        m = mx.nd.array(mom, dtype=dtype)
        mx.nd.sgd_mom_update(w, g, m, out=w, lr=lr, wd=wd, momentum=momentum,
                             rescale_grad=rescale, **clipping)
    sgd_step(weight, grad, mom, lr, wd, momentum or 0.0,
             rescale, clip)
    np.testing.assert_array_equal(weight, w.asnumpy())
    assert np.array_equal(np.signbit(weight), np.signbit(w.asnumpy()))
    if mom is not None:
        np.testing.assert_array_equal(mom, m.asnumpy())
