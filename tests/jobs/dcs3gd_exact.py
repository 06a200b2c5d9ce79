"""Two keys, known gradients per (rank, step, key), through a Horovod store; saves the weights.

    dcs3gd_exact.py STORE LAMBDA0 OUT    (OUT gets {rank}; STORE is dist_dcs3gd or dist_ssgd)
"""
import sys

import mxnet as mx
import numpy as np

import kvstore_ext

SHAPES = {0: (3, 4), "fc": (5,)}
STEPS, LR, MOMENTUM, WD, RESCALE = 6, 0.1, 0.9, 0.01, 0.5


def gradient(rank, step, key):
    seed = 1000 * rank + 10 * step + (0 if key == 0 else 1)
    return np.random.RandomState(seed).normal(size=SHAPES[key]).astype(np.float32)


def initial(rank, key):
    return np.random.RandomState(99 + rank).normal(size=SHAPES[key]).astype(np.float32)


def main():
    store, lambda0, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    params = {"lambda0": lambda0} if store == "dist_dcs3gd" else {}
    kv = kvstore_ext.create(store, **params)
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=LR, momentum=MOMENTUM, wd=WD,
                                      rescale_grad=RESCALE))
    weights = {k: mx.nd.array(initial(kv.rank, k)) for k in SHAPES}
    for k, w in weights.items():      # worker 0's values must win
        kv.broadcast(k, w, out=w)
    for step in range(STEPS):
        for k, w in weights.items():
            kv.pushpull(k, mx.nd.array(gradient(kv.rank, step, k)), out=w)
    before = {f"before_{k}": w.asnumpy() for k, w in weights.items()}
    kv.sync_weights()
    after = {f"after_{k}": w.asnumpy() for k, w in weights.items()}
    stats = kv.stats()
    paths = stats["worker"].get("key_steps_by_path", {})
    np.savez(out.replace("{rank}", str(kv.rank)), **before, **after,
             **{f"path_{p}": n for p, n in paths.items()})
    assert stats["worker"]["iterations"] == STEPS, stats


if __name__ == "__main__":
    main()
