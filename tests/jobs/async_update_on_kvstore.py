"""update_on_kvstore with kvstore_ext's stores, as MXNet's dist_async test checks it.

MXNet 1.9's ``tests/nightly/dist_async_kvstore.py::test_gluon_trainer_type``: on an
asynchronous store ``trainer._init_kvstore()`` raises ValueError only when
update_on_kvstore is False, and otherwise updates on the kvstore, even with
MXNET_UPDATE_ON_KVSTORE=0.  Synchronous stores keep MXNet's choice.  A raw push on an
asynchronous store with no optimizer is refused on the worker.  Every worker checks;
each writes ``<out>.<rank>.json``.
"""
import json
import os
import sys

import mxnet as mx
from mxnet import autograd, gluon

import kvstore_ext


def trainer_type(kv, update_on_kv):
    """What Trainer._init_kvstore did: 'ValueError: ...' or the resulting _update_on_kvstore."""
    x = gluon.Parameter("x", shape=(10, 1), lr_mult=1.0)
    x.initialize(ctx=[mx.cpu(0), mx.cpu(1)], init="zeros")
    trainer = gluon.Trainer([x], "sgd", {"learning_rate": 0.1}, kvstore=kv,
                            update_on_kvstore=update_on_kv)
    try:
        trainer._init_kvstore()
    except ValueError as exc:
        return f"ValueError: {exc}", trainer._kv_initialized
    return trainer._update_on_kvstore, trainer._kv_initialized


def step_works(kv):
    """A full Trainer step with update_on_kvstore left to MXNet (None): what it chose."""
    net = gluon.nn.Dense(1, in_units=3)
    net.initialize(mx.init.Constant(1.0))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)
    with autograd.record():
        loss = net(mx.nd.ones((4, 3))).sum()
    loss.backward()
    trainer.step(4)
    net.weight.data().wait_to_read()
    return trainer._update_on_kvstore


def main():
    kvstore, out = sys.argv[1], sys.argv[2]
    report = {"asynchronous": getattr(mx.kv.create(kvstore), "asynchronous", None)}
    raw = kvstore_ext.create(kvstore)        # a new store: no optimizer set on it
    raw.init(99, mx.nd.zeros((2,)))
    try:
        raw.push(99, mx.nd.ones((2,)))
        report["raw_push"] = "accepted"
    except kvstore_ext.KVStoreError as exc:
        report["raw_push"] = f"KVStoreError: {exc}"
    for env in (None, "0"):
        if env is None:
            os.environ.pop("MXNET_UPDATE_ON_KVSTORE", None)
        else:
            os.environ["MXNET_UPDATE_ON_KVSTORE"] = env
        for form in ("name", "instance"):
            for update_on_kv in (False, True, None):
                kv = kvstore if form == "name" else mx.kv.create(kvstore)
                report[f"env={env} {form} update_on_kvstore={update_on_kv}"] = \
                    trainer_type(kv, update_on_kv)
    # once (a second Trainer would start from the same keys' state): MXNet's choice for the
    # store where MXNET_UPDATE_ON_KVSTORE=0 asks for updates on the workers
    report["env=0 step"] = step_works(kvstore)
    with open(f"{out}.{kvstore_ext.create(kvstore).rank}.json", "w") as f:
        json.dump(report, f)
    mx.kv.create(kvstore).barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
