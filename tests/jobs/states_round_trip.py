"""Stock gluon.Trainer, Adam on the servers: train 20 steps; with --round-trip-at K, save the
trainer's states after K steps and load them straight back (as a resumed job would), which
must change nothing.  Worker 0 saves the final weights and the saved optimizer's counts."""
import argparse
import json
import pickle

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import kvstore_ext  # noqa: F401
from gluon_trainers.data import load_mnist, shard

p = argparse.ArgumentParser()
p.add_argument("kvstore")
p.add_argument("out")
p.add_argument("--round-trip-at", type=int, default=0)
args = p.parse_args()

mx.random.seed(1)
kv = mx.kv.create(args.kvstore)
x, y, _, _ = load_mnist(None, 2560, 100)
x, y = shard(x.reshape(len(x), -1), y, kv.rank, kv.num_workers)
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(64, activation="relu"), gluon.nn.Dense(10))
net.initialize(mx.init.Xavier())
trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.003, "wd": 1e-4},
                        kvstore=kv)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
batch, report = 64, {}
for step in range(20):
    if args.round_trip_at and step == args.round_trip_at:
        states = f"{args.out}.{kv.rank}.states"
        trainer.save_states(states)
        with open(states, "rb") as f:
            _, saved = pickle.loads(f.read())
        report["num_update"] = saved.num_update
        report["counts"] = sorted(set(saved._index_update_count.values()))
        trainer.load_states(states)
    with autograd.record():
        loss = loss_fn(net(mx.nd.array(x[step * batch:(step + 1) * batch])),
                       mx.nd.array(y[step * batch:(step + 1) * batch]))
    loss.backward()
    trainer.step(batch)
if kv.rank == 0:
    np.savez(args.out + ".npz", **{k: v.data().asnumpy()
                                   for k, v in net.collect_params().items()})
    with open(args.out + ".json", "w") as f:
        json.dump(report, f)
