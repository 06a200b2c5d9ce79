"""Every worker gives ``kv.init`` a numpy array (not an NDArray), then does it right.

    launch.py -n 2 -s 1 python init_numpy.py STORE

MXNet's stores raise AssertionError on every worker at once.  Before, worker 0 failed alone
(``'numpy.ndarray' object has no attribute 'asnumpy'``) and the others waited for its values
until the start timeout.  Each worker prints what it got, and the value after one round.
"""
import sys
import time

import mxnet as mx
import numpy as np

import kvstore_ext  # noqa: F401

kv = mx.kv.create(sys.argv[1])
t0 = time.monotonic()
for call in (lambda: kv.init(30, np.zeros((2, 3), np.float32)),
             lambda: kv.init([31, 32], [mx.nd.zeros((2, 3)), np.zeros((2, 3), np.float32)])):
    try:
        call()
        print(f"worker {kv.rank}: no error", flush=True)
    except AssertionError as exc:
        print(f"worker {kv.rank}: {type(exc).__name__}: {exc} ({time.monotonic() - t0:.1f} s)",
              flush=True)
w = mx.nd.zeros((2, 3))
kv.init(30, w)
try:
    kv.pull(30, out=np.zeros((2, 3), np.float32))
except TypeError as exc:
    print(f"worker {kv.rank}: pull: {exc}", flush=True)
kv.pushpull(30, mx.nd.ones((2, 3)), out=w)
print(f"worker {kv.rank}: value {w.asnumpy()[0, 0]}", flush=True)
