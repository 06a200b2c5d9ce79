"""Stock MXNet code tells stores apart by parts of ``kvstore.type``: each store's type must
answer those checks as the MXNet store whose gradient scaling it keeps (``dist_bsp`` and
``dist_psp`` as ``dist_sync``, the stores that apply each push as ``dist_async``), and be its
plain name everywhere else.  tests/integration/test_mxnet_compat.py trains Module under
``dist_bsp`` and ``dist_sync`` in real jobs; here MXNet's own ``Module.init_optimizer`` runs
against every row's type, without a job."""
import json
import pickle

import mxnet as mx
import numpy as np
import pytest
from mxnet.kvstore import KVStoreBase

import kvstore_ext  # noqa: F401  (registers the rows)
from kvstore_ext import registry

ROWS = registry.names()
WORKERS, BATCH = 4, 16


@pytest.mark.parametrize("name", ROWS)
def test_the_type_is_the_plain_name_for_everything_but_containment(name):
    t = registry.lookup(name).type_name()
    assert t == name and hash(t) == hash(name) and repr(t) == repr(name)
    assert type(str(t)) is str and str(t) == name
    assert json.dumps({"type": t}) == json.dumps({"type": name})
    assert type(pickle.loads(pickle.dumps(t))) is str      # no class of ours on the wire
    assert t.lower() == name and t.startswith("dist_") and "dist" in t
    assert name[5:] in t                      # its own parts are still in it ('bsp', 'ssp', ...)


@pytest.mark.parametrize("name", ROWS)
def test_mxnet_substring_checks_see_the_store_it_equals(name):
    row = registry.lookup(name)
    t = row.type_name()
    like = row.mxnet_like or name
    for part in ("_sync", "_async", "async", "dist", "device", "nccl", "local", "horovod"):
        assert (part in t) == (part in name or part in like), (name, part)
    if row.backend == registry.PS:
        assert like == ("dist_async" if row.asynchronous else "dist_sync")
    else:       # Horovod's stores apply the workers' mean gradient: their own name decides
        assert row.mxnet_like is None


class _NamedStore(KVStoreBase):
    """The least a store needs for ``Module.init_optimizer`` to run: its name and workers."""

    def __init__(self, name):
        self._name, self.values = name, {}

    type = property(lambda self: self._name)
    rank = property(lambda self: 0)
    num_workers = property(lambda self: WORKERS)

    @staticmethod
    def is_capable(capability):
        return True

    def set_optimizer(self, optimizer):
        self.optimizer = optimizer

    def init(self, key, value):
        self.values[key] = value.copy()

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        for o in out if isinstance(out, list) else [out]:
            self.values[key].copyto(o)

    def broadcast(self, key, value, out, priority=0):
        self.init(key, value)
        self.pull(key, out)

    def pushpull(self, key, value, out=None, priority=0):
        raise AssertionError("not called by init_optimizer")

    def save_optimizer_states(self, fname, dump_optimizer=False):
        pass

    def load_optimizer_states(self, fname):
        pass


def _module_rescale(type_name) -> float:
    """``rescale_grad`` of the optimizer MXNet's Module makes by name for this store."""
    data = mx.sym.Variable("data")
    net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(data, num_hidden=3, name="fc"),
                               name="softmax")
    mod = mx.mod.Module(net, context=mx.cpu())
    mod.bind(data_shapes=[("data", (BATCH, 5))], label_shapes=[("softmax_label", (BATCH,))])
    mod.init_params()
    store = _NamedStore(type_name)
    mod.init_optimizer(kvstore=store, optimizer="sgd", optimizer_params={"learning_rate": 0.1})
    assert store.optimizer is mod._optimizer      # the update runs on the store
    return mod._optimizer.rescale_grad


@pytest.mark.parametrize("name", ROWS)
def test_module_scales_gradients_as_for_the_mxnet_store(name):
    """dist_sync's Module steps by the mean of the n workers' summed gradients, dist_async's by
    each worker's: a store that stands for one must be given the same scale."""
    row = registry.lookup(name)
    got = _module_rescale(row.type_name())
    want = _module_rescale(row.mxnet_like or name)
    assert np.float32(got) == np.float32(want), (name, got, want)
    if row.mxnet_like == "dist_sync":
        assert got == pytest.approx(1 / (BATCH * WORKERS))
    elif row.mxnet_like == "dist_async":
        assert got == pytest.approx(1 / BATCH)


@pytest.mark.parametrize("name", registry.names(registry.HOROVOD))
def test_horovod_stores_refuse_update_on_kvstore_false_by_name(name):
    """They run the optimizer inside the store: gluon.Trainer's update_on_kvstore=False would
    fail at its first step with a hint; it is refused where MXNet refuses it for dist_async,
    before any store is made, naming the store and the option."""
    net = mx.gluon.nn.Dense(2, in_units=3)
    net.initialize()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                               kvstore=name, update_on_kvstore=False)
    with pytest.raises(ValueError, match=f"{name} runs the optimizer inside the store on every "
                                         f"worker: update_on_kvstore=False is not supported"):
        trainer._init_kvstore()


@pytest.mark.parametrize("name", [n for n in ROWS if registry.lookup(n).backend == registry.PS])
def test_a_store_made_outside_a_job_raises_mxnets_error_naming_what_is_missing(name, monkeypatch):
    """A script run without the launcher gets MXNet's error class (as ``dist_sync`` raises
    outside a job), naming the store and the variables the launcher sets, not a bare
    RuntimeError from deep inside the link."""
    from kvstore_ext import jobenv
    for var in (jobenv.SCHEDULER_HOST, jobenv.SCHEDULER_PORT, jobenv.NUM_WORKER,
                jobenv.NUM_SERVER, jobenv.SECRET):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(mx.base.MXNetError) as caught:
        mx.kv.create(name)
    message = str(caught.value)
    assert f"kvstore '{name}'" in message and jobenv.SCHEDULER_HOST in message
    assert "launch.py" in message
