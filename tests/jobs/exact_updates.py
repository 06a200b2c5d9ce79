"""Every worker pushes known gradients; worker 0 saves the final weights.

Gradient values and the learning rate are powers of two, so every update is
exact in float32: any lost or doubled push changes the result.

``--calls pushpull``: each round is a ``kv.pushpull`` into fresh arrays, made back to back
with no wait between rounds (the gradients do not read the weights), and worker 0 also saves
the weights every round's call brought back: a synchronous store's round i must bring the
weights after exactly i + 1 rounds.
"""
import argparse
import json
import sys

import mxnet as mx
import numpy as np

import kvstore_ext  # noqa: F401

LR = 2.0 ** -7
# str keys: MXNet does not mix int and str.  'lane' (640 KB) makes every message to a server
# large enough for a shared-memory lane between processes of one host (ps.shm.MIN_BYTES)
SHAPES = {"small": (7,), "big": (40, 50), "lane": (400, 400)}


def grad(key, worker, i):
    shape = SHAPES[key]
    pattern = (np.arange(int(np.prod(shape))) % 5 + 1).reshape(shape)
    return (pattern * ((worker + i) % 3 + 1) / 16.0).astype(np.float32)


def init_value(key):
    return np.full(SHAPES[key], 1000.0, dtype=np.float32)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kvstore", default="dist_asp")
    p.add_argument("--pushes", type=int, default=200)
    p.add_argument("--out", required=True)
    p.add_argument("--calls", choices=("push", "pushpull"), default="push")
    p.add_argument("--momentum", type=float, default=0.0)
    args = p.parse_args()
    kv = mx.kv.create(args.kvstore)
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=LR, momentum=args.momentum, wd=0.0,
                                      rescale_grad=1.0))
    keys = list(SHAPES)
    kv.init(keys, [mx.nd.array(init_value(k)) for k in keys])
    kv.barrier()
    brought = []                                         # --calls pushpull: each round's outs
    for i in range(args.pushes):
        grads = [mx.nd.array(grad(k, kv.rank, i)) for k in keys]
        if args.calls == "pushpull":
            outs = [mx.nd.zeros(SHAPES[k]) for k in keys]
            brought.append(outs)
            if i % 2:
                kv.pushpull(keys, grads, out=outs)
            else:
                for k, g, o in zip(keys, grads, outs):
                    kv.pushpull(k, g, out=o)
        elif i % 2:
            kv.push(keys, grads)                         # the list form: one message per server
        else:
            for k, g in zip(keys, grads):
                kv.push(k, g)                            # one key at a time
    mx.nd.waitall()
    kv.barrier()
    outs = [mx.nd.zeros(SHAPES[k]) for k in keys]
    kv.pull(keys, out=outs)
    if kv.rank == 0:
        stats = kv.stats()
        rounds = {f"{k}_rounds": np.stack([r[j].asnumpy() for r in brought])
                  for j, k in enumerate(keys)} if brought else {}
        np.savez(args.out, **{str(k): o.asnumpy() for k, o in zip(keys, outs)}, **rounds)
        with open(args.out + ".json", "w") as f:
            json.dump({"num_workers": kv.num_workers, "stats": stats}, f)
    kv.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
