"""A raw script whose workers run uneven iteration counts between barriers (rank r: 2 + 6r
pushpulls, then ``kv._barrier()``, a pull, a barrier, 3 more each, a barrier), as a script with
uneven shards that meets at each epoch's end does.  Every push is -1 on each weight (SGD, lr
1), so the weights after a barrier count every push applied.  Under a bound on the lead
(``dist_ssp``, ``dist_dssp``) a faster worker waited for the next push of one already at the
barrier, which waited there for it: the job hung.  Prints ``UNEVEN_BARRIER {json}`` per
worker.  The store's type is the first argument (MXNet's ``dist_async`` runs it too).
"""
import json
import sys

import mxnet as mx

import kvstore_ext  # noqa: F401

kv = mx.kv.create(sys.argv[1])
kv.set_optimizer(mx.optimizer.SGD(learning_rate=1.0, rescale_grad=1.0))
n, rank = kv.num_workers, kv.rank
w = mx.nd.zeros((1000,))
kv.init(0, w)
first = 2 + 6 * rank
for _ in range(first):
    kv.pushpull(0, mx.nd.ones((1000,)), out=w)
mx.nd.waitall()                         # MXNet's barrier does not wait for the pushes
kv._barrier()
kv.pull(0, out=w)
after_first = float(w.asnumpy().mean())
mx.nd.waitall()
kv._barrier()                           # every worker has read it before any pushes again
for _ in range(3):
    kv.pushpull(0, mx.nd.ones((1000,)), out=w)
mx.nd.waitall()
kv._barrier()
kv.pull(0, out=w)
after_second = float(w.asnumpy().mean())
report = {"rank": rank, "after_first": after_first, "after_second": after_second,
          "expected_first": -float(sum(2 + 6 * r for r in range(n))),
          "expected_second": -float(sum(2 + 6 * r for r in range(n)) + 3 * n)}
sys.stdout.write(f"UNEVEN_BARRIER {json.dumps(report)}\n")   # one write: a shared pipe
sys.stdout.flush()
