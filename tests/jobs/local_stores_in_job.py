"""A worker of a kvstore_ext job also uses MXNet's own single-machine stores.

``mx.kv.create('local')``, ``'device'`` and a default multi-device Trainer (kvstore
'device') must reach MXNet unchanged; only an unknown ``dist_*`` name is refused.
Writes ``<out>.<rank>.json``.
"""
import json
import sys

import mxnet as mx
from mxnet import autograd, gluon

import kvstore_ext


def main():
    out = sys.argv[1]
    report = {}
    for name in ("local", "device"):
        kv = mx.kv.create(name)
        kv.init(0, mx.nd.ones((2,)))
        kv.push(0, [mx.nd.ones((2,)), mx.nd.ones((2,))])
        a = mx.nd.zeros((2,))
        kv.pull(0, out=a)
        report[name] = [kv.type, a.asnumpy().tolist()]
    net = gluon.nn.Dense(1, in_units=3)
    net.initialize(mx.init.Constant(1.0), ctx=[mx.cpu(0), mx.cpu(1)])
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    with autograd.record():
        losses = [net(mx.nd.ones((2, 3), ctx=c)).sum() for c in (mx.cpu(0), mx.cpu(1))]
    autograd.backward(losses)
    trainer.step(4)
    report["trainer"] = [trainer._kvstore.type,
                         [net.weight.data(c).asnumpy().tolist() for c in (mx.cpu(0), mx.cpu(1))]]
    try:
        mx.kv.create("dist_nonsense")
        report["dist_nonsense"] = "accepted"
    except ValueError as exc:
        report["dist_nonsense"] = str(exc)
    kv = kvstore_ext.create("dist_bsp")    # and the job's own store still works beside them
    kv.init(0, mx.nd.zeros((2,)))
    kv.barrier()
    with open(f"{out}.{kv.rank}.json", "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
