"""Workers push every iteration; one of them is made slower by sleeping.

Without --emulate, worker --slow-rank sleeps --slow-factor times longer. With
--emulate, every worker "computes" for --step-time and the project's straggler
emulation (launch.py --worker-speed) stretches it.
"""
import argparse
import json
import sys
import time

import mxnet as mx

import kvstore_ext  # noqa: F401
from gluon_trainers.straggler import Straggler


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kvstore", required=True)
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--slow-rank", type=int, default=0)
    p.add_argument("--slow-factor", type=float, default=5.0)
    p.add_argument("--step-time", type=float, default=0.004)
    p.add_argument("--emulate", action="store_true")
    p.add_argument("--out", default=None, help="JSON of the straggler's figures ({rank})")
    args = p.parse_args()
    kv = mx.kv.create(args.kvstore)
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.01))
    keys = [0, 1]
    weights = [mx.nd.zeros((10,)), mx.nd.zeros((3, 3))]
    kv.init(keys, weights)
    kv.barrier()
    pause = args.step_time * (args.slow_factor if kv.rank == args.slow_rank else 1.0)
    straggler = Straggler.from_env(kv.rank, kv.num_workers)
    started = time.perf_counter()
    for _ in range(args.iters):
        if args.emulate:
            straggler.begin()
            time.sleep(args.step_time)
            straggler.end()
        else:
            time.sleep(pause)
        kv.pushpull(keys, [mx.nd.ones((10,)), mx.nd.ones((3, 3))], out=weights)
    mx.nd.waitall()
    kv.save_metrics()
    if args.out:
        with open(args.out.replace("{rank}", str(kv.rank)), "w") as f:
            json.dump({"straggler": straggler.to_dict(),
                       "seconds": time.perf_counter() - started}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
