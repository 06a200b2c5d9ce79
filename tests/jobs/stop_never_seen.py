"""Worker 1 dies; worker 0's last pushpull fails in MXNet's engine and the script makes no
other call: nobody saw the stop, so the process must not exit 0."""
import time

import mxnet as mx

from lose_worker_1 import one_key_then_worker_1_dies

kv, w = one_key_then_worker_1_dies()
kv.pushpull(0, mx.nd.ones((4,)), out=w)
time.sleep(3)   # the stop arrives; the write-back fails in the engine
print(f"worker {kv.rank} ends without another call", flush=True)
