"""Train with an inference pass and weight copies between steps (as evaluations do).

MXNet may then hold the conv weights in an MKL-DNN layout; the store must
still write pulled weights into them without deadlocking the engine.
"""
import argparse
import sys

import mxnet as mx
from mxnet import autograd, gluon

import kvstore_ext  # noqa: F401
from gluon_trainers.models import alexnet_small


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kvstore", required=True)
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args()
    mx.random.seed(1)
    net = alexnet_small()
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01},
                            kvstore=args.kvstore)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = mx.nd.random.uniform(shape=(16, 1, 28, 28)), mx.nd.zeros(16)
    params = list(net.collect_params().values())
    for step in range(args.steps):
        net(x).wait_to_read()                 # inference: weights may be reordered in place
        if step % 2:
            mx.nd.waitall()                   # a copy of the weights, as an evaluation takes
            [p.data().asnumpy() for p in params]
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(16)
    mx.nd.waitall()
    print(f"steps done {args.steps}", flush=True)   # one write: the job shares one output
    return 0


if __name__ == "__main__":
    sys.exit(main())
