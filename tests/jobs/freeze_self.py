"""Worker 1 freezes itself (SIGSTOP: a hung host) after 3 rounds; worker 0 goes on.

    launch.py -n 2 -s 1 --heartbeat-timeout 2 python freeze_self.py

Worker 0 is told worker 1 died and exits 1; worker 1 never exits by itself, so the last word
of launch.py must come from the scheduler, which saw it go."""
import os
import signal

import mxnet as mx

import kvstore_ext  # noqa: F401

kv = mx.kv.create("dist_bsp")
w = mx.nd.zeros((4,))
kv.init(0, w)
for step in range(200):
    if kv.rank == 1 and step == 3:
        os.kill(os.getpid(), signal.SIGSTOP)
    kv.pushpull(0, mx.nd.ones((4,)), out=w)
    w.wait_to_read()
