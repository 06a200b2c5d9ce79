"""A raw script on ``dist_pool`` that reads its weights, then waits at a barrier.

Workers outside the pool wait for OK at their first pull, and the pool's workers pushed
nothing and waited at the barrier for them: the job hung.  Prints ``POOL_BARRIER {json}``
per worker once it is through the barrier.
"""
import json
import sys

import mxnet as mx

import kvstore_ext  # noqa: F401

kv = mx.kv.create("dist_pool")
kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.5, rescale_grad=1.0))
w = mx.nd.zeros((4,))
kv.init(0, w)
kv.pull(0, out=w)
pulled = float(w.asnumpy()[0])          # a worker outside the pool waits here for OK
kv.barrier()
kv.push(0, mx.nd.ones((4,)))            # and after it, the pool goes on as before
kv.barrier()
kv.pull(0, out=w)
after = float(w.asnumpy()[0])
kv.barrier()
report = {"rank": kv.rank, "pulled": pulled, "after": after}
sys.stdout.write(f"POOL_BARRIER {json.dumps(report)}\n")   # one write: the workers share a pipe
sys.stdout.flush()
