"""Several pulled values land in one array: the call returns and the last value wins.

MXNet's own stores write the outputs of a call in ascending key order (string keys:
in the order they were first initialised), so the largest key's value is what an
array listed for several keys ends up holding; ``test_mxnet_compat`` checks that
rule on ``mx.kv.create('local')``.  Every step runs under an alarm so that a
deadlock fails the job quickly instead of hanging it.  Worker 0 writes a JSON report.
"""
import json
import signal
import sys

import mxnet as mx

import kvstore_ext  # noqa: F401


def value(a):
    signal.alarm(30)       # a hang in MXNet's engine shows as SIGALRM, not a stuck test
    out = a.asnumpy().tolist()
    signal.alarm(0)
    return out


def main():
    kvstore, out = sys.argv[1], sys.argv[2]
    kv = mx.kv.create(kvstore)
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=1.0, momentum=0.0, wd=0.0, rescale_grad=1.0))
    kv.init([3, 1, 2], [mx.nd.full((2,), v) for v in (30.0, 10.0, 20.0)])
    named = mx.kv.create(kvstore)   # MXNet does not mix int and str keys in one store
    named.init(["z", "a", "m"], [mx.nd.full((2,), v) for v in (26.0, 1.0, 13.0)])
    kv.barrier()
    a, b = mx.nd.zeros((2,)), mx.nd.zeros((2,))
    report = {}
    kv.pull([3, 1, 2], out=[a, a, a])
    report["pull_keys"] = value(a)
    kv.pull([1, 3, 2], out=[a, a, a])
    report["pull_keys_reordered"] = value(a)
    kv.pull(1, out=[a, a, a])
    report["pull_one_key"] = value(a)
    kv.pull([2, 1], out=[[a, b], [b, a]])
    report["pull_nested"] = [value(a), value(b)]
    named.pull(["a", "m", "z"], out=[a, a, a])
    report["pull_str_keys"] = value(a)
    kv.barrier()
    # every worker pushes 1 per key and learning rate 1: each weight drops by the workers' count
    kv.pushpull([3, 1, 2], [mx.nd.ones((2,))] * 3, out=[a, a, a])
    kv.barrier()
    kv.pull(3, out=b)
    report["pushpull_keys"] = [value(a), value(b)]
    kv.barrier()
    kv.pushpull(1, mx.nd.ones((2,)), out=[a, a])      # one key: the batched path
    kv.barrier()
    kv.pull(1, out=b)
    report["pushpull_one_key"] = [value(a), value(b)]
    report["num_workers"] = kv.num_workers
    if kv.rank == 0:
        with open(out, "w") as f:
            json.dump(report, f)
    kv.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
