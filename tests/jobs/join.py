"""A worker that joins a running job (``launch.py --job-file`` / ``--join``).

The job's workers push 25 times each, pull the weights (worker 0 saves them), then wait for
the joiner's first pull (its weights must equal worker 0's bitwise: nothing was applied in
between).  Then everybody pushes 10 times (the joiner starts at the slowest clock, so under
dist_ssp they move together); the joiner leaves, the job's workers save the final weights.  Every push of worker r is ``(r + 1) / 16`` everywhere and the
optimizer is SGD with lr 0.5, so the final weights are ``init - 0.5 * sum of all pushes``,
exactly in float32, whatever the order.
"""
import argparse
import json
import os
import sys
import time

import mxnet as mx
import numpy as np

import kvstore_ext  # noqa: F401

SHAPES = {0: (3, 4), 1: (120_000,), 2: (7,)}


def initial(key):
    return np.linspace(-1, 1, int(np.prod(SHAPES[key]))).reshape(SHAPES[key]).astype(np.float32)


def wait_for(path, seconds=120):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path}")
        time.sleep(0.05)


def step(kv, rank, outs):
    keys = sorted(SHAPES)
    grads = [mx.nd.full(SHAPES[k], (rank + 1) / 16.0) for k in keys]
    kv.pushpull(keys, grads, out=outs)
    for o in outs:
        o.wait_to_read()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--kvstore", default="dist_asp")
    p.add_argument("--joiner", action="store_true")
    args = p.parse_args()
    kv = mx.kv.create(args.kvstore)
    rank = kv.rank
    keys = sorted(SHAPES)
    outs = [mx.nd.zeros(SHAPES[k]) for k in keys]
    values = [mx.nd.array(initial(k)) if not args.joiner else mx.nd.zeros(SHAPES[k])
              for k in keys]
    kv.init(keys, values)    # a joiner's values are ignored: the keys exist
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.5, rescale_grad=1.0))
    done = os.path.join(args.dir, "joined")
    if args.joiner:
        kv.pull(keys, out=outs)
        np.savez(os.path.join(args.dir, "joiner_pulled.npz"),
                 **{str(k): o.asnumpy() for k, o in zip(keys, outs)})
        open(os.path.join(args.dir, "pulled"), "w").close()
        for _ in range(10):
            step(kv, rank, outs)
        with open(os.path.join(args.dir, f"pushes-{rank}.json"), "w") as f:
            json.dump({"rank": rank, "pushes": 10, "num_workers": kv.num_workers}, f)
        open(done, "w").close()
        print(f"joiner: rank {rank}, 10 pushes", flush=True)
        return 0
    for _ in range(25):
        step(kv, rank, outs)
    open(os.path.join(args.dir, f"phase1-{rank}"), "w").close()
    for r in range(kv.num_workers):     # nobody pushes while the joiner takes its weights
        wait_for(os.path.join(args.dir, f"phase1-{r}"))
    if rank == 0:
        kv.pull(keys, out=outs)
        np.savez(os.path.join(args.dir, "before_join.npz"),
                 **{str(k): o.asnumpy() for k, o in zip(keys, outs)})
        open(os.path.join(args.dir, "ready"), "w").close()
    wait_for(os.path.join(args.dir, "pulled"))
    for _ in range(10):
        step(kv, rank, outs)
    with open(os.path.join(args.dir, f"pushes-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "pushes": 35}, f)
    open(os.path.join(args.dir, f"finished-{rank}"), "w").close()
    for r in range(2):    # every push is in before the final pull
        wait_for(os.path.join(args.dir, f"finished-{r}"))
    wait_for(done)
    kv.pull(keys, out=outs)
    if rank == 0:
        np.savez(os.path.join(args.dir, "final.npz"),
                 **{str(k): o.asnumpy() for k, o in zip(keys, outs)})
    print(f"worker {rank}: 35 pushes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
