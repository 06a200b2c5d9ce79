"""Worker 0 leaves the job (exit 0) before it initialises anything; or, with --stall,
worker 1 never initialises its key.  The other worker must get an error naming the cause."""
import sys
import time

import mxnet as mx

import kvstore_ext  # noqa: F401

kv = mx.kv.create("dist_asp")
stall = "--stall" in sys.argv
if not stall and kv.rank == 0:
    sys.exit(0)
if stall and kv.rank == 1:
    time.sleep(60)
    sys.exit(0)
try:
    kv.init(0, mx.nd.zeros((3,)))
except kvstore_ext.KVStoreError as exc:
    print(f"worker {kv.rank}: {type(exc).__name__}: {exc}", flush=True)
    sys.exit(5)
print(f"worker {kv.rank} initialised", flush=True)
