"""Stock gluon.Trainer on the Horovod store named in argv[1]; worker 1 freezes before step 1
(SIGSTOP: a frozen process or host), 1.5 s after step 0, and a child of its own lets it go after argv[2] seconds.
Worker 0's step-1 allreduces wait for it until Gloo's timeout fails them."""
import os
import signal
import subprocess
import sys
import time

import mxnet as mx
from mxnet import autograd, gluon

import kvstore_ext

frozen = float(sys.argv[2])
kv = kvstore_ext.create(sys.argv[1])
net = gluon.nn.Dense(4, in_units=3)
net.initialize(mx.init.Constant(0.1))
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)
for step in range(3):
    if kv.rank == 1 and step == 1:
        time.sleep(1.5)    # a heartbeat or two first
        print(f"worker 1 freezes for {frozen:g} s", flush=True)
        # in the job's process group: it goes with the job if the job is stopped first
        subprocess.Popen(["sh", "-c", f"sleep {frozen}; kill -CONT {os.getpid()}"])
        os.kill(os.getpid(), signal.SIGSTOP)
    with autograd.record():
        loss = net(mx.nd.ones((2, 3))).sum()
    loss.backward()
    trainer.step(2)
    print(f"worker {kv.rank} step {step} loss {loss.asscalar():.4f}", flush=True)
