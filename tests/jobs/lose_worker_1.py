"""The start two scripts share: one key on the store named by argv[1], then worker 1 dies
(SIGKILL) right after the barrier that ends the set-up."""
import os
import signal
import sys

import mxnet as mx

import kvstore_ext  # noqa: F401


def one_key_then_worker_1_dies():
    """Worker 0's store and its key's array (worker 1 never returns)."""
    kv = mx.kv.create(sys.argv[1])
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1))
    w = mx.nd.zeros((4,))
    kv.init(0, w)
    kv.barrier()
    if kv.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return kv, w
