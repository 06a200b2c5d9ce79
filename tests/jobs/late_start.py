"""A worker that makes its store late (argv[2] seconds), so that a test can freeze a server
between its registration and the workers' hello; prints how the start ended."""
import sys
import time

import mxnet as mx

import kvstore_ext

time.sleep(float(sys.argv[2]))
t0 = time.monotonic()
try:
    kv = mx.kv.create(sys.argv[1])
except kvstore_ext.KVStoreError as exc:
    print(f"STARTFAIL after {time.monotonic() - t0:.1f} s: {type(exc).__name__}: {exc}",
          flush=True)
    sys.exit(4)
print("STARTED", flush=True)
