#!/usr/bin/env python3
"""The servers' SGD update on its three kinds of kernel, per element, in one run.

A server updates a run of adjacent blocks as one array (:class:`kvstore_ext.optimizers.
ServerOptimizer`).  With momentum, a long array is updated alone, by MXNet's one-array kernel
(``sgd_mom_update``) or by the kernels' float operations compiled into one loop
(``kvstore_ext.kernels.sgd_step``, the servers' choice for float32 and float64), rather than
by the multi-tensor kernel (``multi_sgd_mom_update``); this times the three through
``ServerOptimizer.apply_runs`` on the same flat arrays, interleaved, in the servers'
environment (MXNet's naive engine, one OpenMP thread), and checks that all give the same bits.

    python scripts/bench_optimizer.py --out results/bench
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))


def _module(path: str):
    """One of the package's files loaded alone, without ``kvstore_ext/__init__``."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_" + os.path.basename(path)[:-3],
                                                  os.path.join(HERE, "..", path))
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000,16384,65536,262144,1048576",
                   help="elements of the flat array updated, comma-separated "
                        "(default 1000,16384,65536,262144,1048576)")
    p.add_argument("--passes", type=int, default=5,
                   help="passes over the kernels, taken in turn (default 5)")
    p.add_argument("--reps", type=int, default=20, help="calls in a row per pass (default 20)")
    p.add_argument("--clip-gradient", type=float, default=None,
                   help="SGD's clip_gradient (default: none, as MXNet's SGD)")
    p.add_argument("--any-env", action="store_true",
                   help="keep this environment's engine and threads instead of the servers'")
    p.add_argument("--out", default=None,
                   help="folder for optimizer_kernels.{json,csv,md} (default: print only)")
    return p.parse_args(argv)


def flat_run(size: int):
    """A one-block run of ``size`` elements, as a server holds it."""
    import numpy as np
    from kvstore_ext.optimizers import FlatArrays, Run
    home = FlatArrays(np.float32)
    home.add(size)
    rng = np.random.default_rng(size)
    home.numpy("weight")[:size] = rng.standard_normal(size)
    home.numpy("grad")[:size] = rng.standard_normal(size)
    return home, Run(home, [0], [0, size])


#: the paths timed: the multi-tensor kernel for every array, MXNet's one-array kernel for a
#: long one, and the servers' choice (the compiled loop for a float32 or float64 array)
KERNELS = ("multi-tensor always", "one-array kernel", "as the servers choose")


def optimizer(kernel: str, clip_gradient=None):
    import mxnet as mx
    from kvstore_ext.optimizers import ServerOptimizer
    opt = ServerOptimizer(mx.optimizer.SGD(learning_rate=0.01, momentum=0.9, wd=1e-4,
                                           rescale_grad=1 / 3, clip_gradient=clip_gradient),
                          "dist_bsp", asynchronous=False)
    if kernel == "multi-tensor always":
        opt.ALONE_ELEMENTS = float("inf")
    elif kernel == "one-array kernel":
        opt.COMPILED_DTYPES = ()
    return opt


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.any_env:   # as the servers set them, before mxnet is loaded (the package loads it)
        os.environ.update(_module("kvstore_ext/jobenv.py").SERVER_COMPUTE_DEFAULTS)
    import mxnet as mx
    import numpy as np
    from kvstore_ext.plan.timing import sample
    from kvstore_ext.reports import write_results
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        homes, fns = {}, {}
        for name in KERNELS:
            home, run = flat_run(size)
            opt = optimizer(name, args.clip_gradient)

            def apply(opt=opt, run=run):
                opt.apply_runs([run])
                mx.nd.waitall()
            homes[name], fns[name] = home, apply
        times = sample(fns, args.passes, args.reps)
        weights = [homes[name].numpy("weight")[:size] for name in KERNELS]
        same = all(np.array_equal(weights[0], w) for w in weights[1:])   # as many updates
        for name, t in times.items():
            rows.append({"elements": size, "kernel": name, "calls": len(t),
                         "us_per_call": statistics.median(t) * 1e6,
                         "ns_per_element": statistics.median(t) / size * 1e9,
                         "same_bits": same})
    columns = [("elements", "elements", "{}"), ("path", "kernel", "{}"),
               ("us a call (median)", "us_per_call", "{:.1f}"),
               ("ns an element", "ns_per_element", "{:.2f}"),
               ("same bits", "same_bits", "{}")]
    if args.out:
        print(write_results(args.out, "optimizer_kernels", rows, columns))
    else:
        for r in rows:
            print(f"{r['elements']:>9} {r['kernel']:<20} {r['us_per_call']:9.1f} us "
                  f"{r['ns_per_element']:6.2f} ns/element  same bits: {r['same_bits']}")
    return 0 if all(r["same_bits"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
