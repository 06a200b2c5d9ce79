"""Worker 1 dies before the first round; worker 0's pull waits for that round, and MXNet's
engine starts its write-back only after the script has caught the job's stop (an operation
holds the pull's array until then).  The write-back then fails with the same stop: the exit
code stays the script's own (4)."""
import sys
import threading

import mxnet as mx

import kvstore_ext
from kvstore_ext import engine
from lose_worker_1 import one_key_then_worker_1_dies

kv, w = one_key_then_worker_1_dies()
held, release = mx.nd.zeros((4,)), threading.Event()
engine.push_async(lambda done: threading.Thread(target=lambda: (release.wait(), done())).start(),
                  [held])
try:
    kv.pushpull(0, mx.nd.ones((4,)), out=w)
    kv.pull(0, out=held)   # answered at the round's end; written once the hold ends
    w.wait_to_read()
    kv.barrier()
except kvstore_ext.NodeLostError as exc:
    print(f"worker {kv.rank} caught {type(exc).__name__}: {exc}", flush=True)
    release.set()
    held.wait_to_read()
    print(f"worker {kv.rank} let the held write-back fail", flush=True)
    sys.exit(4)
print(f"worker {kv.rank} was not told of the stop", flush=True)
