"""Two gluon.Trainers in one worker process, on one distributed store type (argv[1]).

1. A Trainer made again over the same parameters while the first is still alive (a new
   optimizer for fine-tuning): allowed, and the servers follow the new optimizer.
2. A second model's Trainer while the first model (and so its Trainer and store) is alive,
   its parameters of the same shapes (a GAN's generator and discriminator): refused at its
   first step, naming the key; and the first Trainer's optimizer on the servers is untouched.
Prints ``TWO_TRAINERS {json}``.
"""
import json
import sys

import mxnet as mx
from mxnet import autograd, gluon

import kvstore_ext

store = sys.argv[1]
x = mx.nd.ones((2, 3))
report = {}


def steps(net, trainer, n):
    for _ in range(n):
        with autograd.record():
            loss = net(x).sum()
        loss.backward()
        trainer.step(2)
    return net.weight.data().asnumpy()[0].tolist()


a = gluon.nn.Dense(3, in_units=3)
a.initialize(mx.init.Constant(1.0))
first = gluon.Trainer(a.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=store)
steps(a, first, 2)
again = gluon.Trainer(a.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore=store)
report["same_parameters"] = steps(a, again, 2)

b = gluon.nn.Dense(3, in_units=3)
b.initialize(mx.init.Constant(5.0))
other = gluon.Trainer(b.collect_params(), "sgd", {"learning_rate": 0.0}, kvstore=store)
try:
    steps(b, other, 1)
    report["second_model"] = b.weight.data().asnumpy()[0].tolist()
except kvstore_ext.KVStoreError as exc:
    report["second_model_error"] = str(exc)
# the first model's Trainer goes on: its servers' optimizer must still be lr 0.01, not 0
report["first_after"] = steps(a, again, 1)
report["num_workers"] = again._kvstore.num_workers
sys.stdout.write(f"TWO_TRAINERS {json.dumps(report)}\n")   # one write: the workers share a pipe
sys.stdout.flush()
