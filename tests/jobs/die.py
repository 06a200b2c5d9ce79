"""Workers train in lock-step; worker 1 kills itself (SIGKILL) at round argv[3] (default 3, -1:
never), or with argv[4] ``raise`` its script raises an exception there instead; with
``barrier``, worker 1 is killed 2 s after the last round, while worker 0 waits at the barrier."""
import os
import signal
import sys
import time

import mxnet as mx

import kvstore_ext

kv = mx.kv.create(sys.argv[1])
kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1))
w = mx.nd.zeros((4,))
kv.init(0, w)
print(f"worker {kv.rank} started", flush=True)
rounds = int(sys.argv[2])
die_at = int(sys.argv[3]) if len(sys.argv) > 3 else 3
t0 = time.monotonic()
try:
    for i in range(rounds):
        if kv.rank == 1 and i == die_at:
            if sys.argv[4:5] == ["raise"]:
                raise RuntimeError(f"a bug in the script at round {i}")
            os.kill(os.getpid(), signal.SIGKILL)
        kv.pushpull(0, mx.nd.ones((4,)), out=w)
        time.sleep(0.01)
    # pushpull returns before its reply: a loss found after the last call surfaces here
    w.wait_to_read()
    if kv.rank == 1 and sys.argv[4:5] == ["barrier"]:
        time.sleep(2)
        os.kill(os.getpid(), signal.SIGKILL)
    kv.barrier()
except kvstore_ext.NodeLostError as exc:
    print(f"worker {kv.rank} stopped at {time.time():.3f} after {time.monotonic() - t0:.1f} s: "
          f"{type(exc).__name__}: {exc}", flush=True)
    sys.exit(4)
print(f"worker {kv.rank} finished {rounds} rounds, w={w.asnumpy()[0]:.2f}", flush=True)
