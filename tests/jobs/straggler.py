"""Workers push every iteration; one of them is made slower by sleeping."""
import argparse
import sys
import time

import mxnet as mx

import kvstore_ext  # noqa: F401


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kvstore", required=True)
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--slow-rank", type=int, default=0)
    p.add_argument("--slow-factor", type=float, default=5.0)
    p.add_argument("--step-time", type=float, default=0.004)
    args = p.parse_args()
    kv = mx.kv.create(args.kvstore)
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.01))
    keys = [0, 1]
    weights = [mx.nd.zeros((10,)), mx.nd.zeros((3, 3))]
    kv.init(keys, weights)
    kv.barrier()
    pause = args.step_time * (args.slow_factor if kv.rank == args.slow_rank else 1.0)
    for _ in range(args.iters):
        time.sleep(pause)
        kv.pushpull(keys, [mx.nd.ones((10,)), mx.nd.ones((3, 3))], out=weights)
    kv.save_metrics()
    return 0


if __name__ == "__main__":
    sys.exit(main())
