"""Two gluon.Trainers in one worker process, on one distributed store type (argv[1]).

1. A Trainer made again over the same parameters while the first is still alive (a new
   optimizer for fine-tuning): allowed, and the servers follow the new optimizer.
2. A second model's Trainer while the first model (and so its Trainer and store) is alive,
   its parameters of the same shapes (a GAN's generator and discriminator): refused at its
   first step, naming the key; and the first Trainer's optimizer on the servers is untouched.
Prints ``TWO_TRAINERS {json}``.

With ``one-store`` (argv[2]), one store object is given to two models' Trainers instead
(``kvstore=kv``): both initialise keys 0 and 1 in it, from two models' arrays.  Keeping the
first values would train the second model on the first one's weights, in silence; the
second Trainer's first step must be refused, naming the key, and the first model must go on
training its own weights.  Initialising a key again from the same array is kept.
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


def model(value):
    net = gluon.nn.Dense(3, in_units=3)
    net.initialize(mx.init.Constant(value))
    return net


def second_model_step(net, trainer):
    """One step of the second model: its weights if it was taken, else the refusal and the
    weights it kept."""
    try:
        steps(net, trainer, 1)
        report["second_model"] = net.weight.data().asnumpy()[0].tolist()
    except kvstore_ext.KVStoreError as exc:
        report["second_model_error"] = str(exc)
        report["second_model_after"] = net.weight.data().asnumpy()[0].tolist()


def two_stores():
    a = model(1.0)
    first = gluon.Trainer(a.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=store)
    steps(a, first, 2)
    again = gluon.Trainer(a.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore=store)
    report["same_parameters"] = steps(a, again, 2)
    b = model(5.0)
    second_model_step(b, gluon.Trainer(b.collect_params(), "sgd", {"learning_rate": 0.0},
                                       kvstore=store))
    # the first model's Trainer goes on: its servers' optimizer must still be lr 0.01, not 0
    report["first_after"] = steps(a, again, 1)
    report["num_workers"] = again._kvstore.num_workers


def one_store():
    kv = mx.kv.create(store)
    a = model(1.0)
    first = gluon.Trainer(a.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)
    report["first"] = steps(a, first, 2)
    b = model(5.0)
    second_model_step(b, gluon.Trainer(b.collect_params(), "sgd", {"learning_rate": 0.1},
                                       kvstore=kv))
    report["first_after"] = steps(a, first, 1)
    try:   # the same array again: kept, as a Trainer made anew over the same parameters does
        kv.init(0, first._params[0].data())   # key 0 is the Trainer's first parameter
        report["same_array_again"] = "kept"
    except kvstore_ext.KVStoreError as exc:
        report["same_array_again"] = str(exc)
    report["num_workers"] = kv.num_workers


if sys.argv[2:] == ["one-store"]:
    one_store()
else:
    two_stores()
sys.stdout.write(f"TWO_TRAINERS {json.dumps(report)}\n")   # one write: the workers share a pipe
sys.stdout.flush()
