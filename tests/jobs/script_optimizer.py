"""An optimizer class defined in the training script itself, run on the servers.

    launch.py -n 2 -s 1 python script_optimizer.py STORE

The servers cannot load it (their ``__main__`` is not this script): every worker is told so
at its first step, with what to do instead; MXNet's own servers log the failure and go on
without an updater (``dist_sync`` then serves the summed gradients as the weights).
"""
import sys

import mxnet as mx
from mxnet import autograd, gluon

import kvstore_ext  # noqa: F401


@mx.optimizer.register
class HalfSGD(mx.optimizer.Optimizer):
    def create_state(self, index, weight):
        return None

    def update(self, index, weight, grad, state):
        weight[:] -= 0.5 * self._get_lr(index) * grad * self.rescale_grad


kv = mx.kv.create(sys.argv[1])
w = gluon.Parameter("w", shape=(3,), init=mx.init.One())
w.initialize()
trainer = gluon.Trainer([w], "halfsgd", {"learning_rate": 1.0}, kvstore=kv)
with autograd.record():
    loss = (w.data() * 2).sum()
loss.backward()
trainer.step(1)
print(f"worker {kv.rank}: trained, w = {w.data().asnumpy()}", flush=True)
