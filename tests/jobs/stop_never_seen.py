"""Worker 1 dies; worker 0's last pushpull fails in MXNet's engine and the script makes no
other call: nobody saw the stop, so the process must not exit 0."""
import os
import signal
import sys
import time

import mxnet as mx

import kvstore_ext  # noqa: F401

kv = mx.kv.create(sys.argv[1])
kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1))
w = mx.nd.zeros((4,))
kv.init(0, w)
kv.barrier()
if kv.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
kv.pushpull(0, mx.nd.ones((4,)), out=w)
time.sleep(3)   # the stop arrives; the write-back fails in the engine
print(f"worker {kv.rank} ends without another call", flush=True)
