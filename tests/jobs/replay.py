"""Capture real messages off the wire and play them again, as someone without the secret can.

Worker 1 records the exact frames of one of its pushes, one barrier request and one
heartbeat (what a sniffer on the network sees, with the handshake password, which crosses
in clear) and hands them to worker 0 through a file.  Worker 0 re-sends each of them ``--copies`` times from a socket of its own, while
worker 1 is held back before its next barrier.  Then both check that no replayed push
was applied, that the replayed barrier released nobody early, and print what the
servers counted.
"""
import argparse
import json
import os
import pickle
import sys
import time

import mxnet as mx
import numpy as np
import zmq

import kvstore_ext  # noqa: F401
from kvstore_ext.ps.transport import HANDSHAKE_USER

LR = 2.0 ** -4
HOLD = 2.0


class Recorder:
    """Stands in for a socket: records what is sent, then sends it."""

    def __init__(self, sock, sink: list):
        self.sock, self.sink = sock, sink

    def send_multipart(self, frames, *args, **kwargs):
        self.sink.append([bytes(memoryview(f)) for f in frames])
        return self.sock.send_multipart(frames, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.sock, name)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kvstore", default="dist_asp")
    p.add_argument("--copies", type=int, default=5)
    p.add_argument("--dir", required=True)
    args = p.parse_args()
    kv = mx.kv.create(args.kvstore)
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=LR, momentum=0.0, wd=0.0, rescale_grad=1.0))
    w = mx.nd.zeros((4, 5))
    kv.init(0, w)
    conn = kv._conn
    capture = os.path.join(args.dir, "captured.pkl")
    if kv.rank == 1:
        pushes, barriers = [], []
        conn.tx = [Recorder(s, pushes) for s in conn.tx]
        conn.sched = Recorder(conn.sched, barriers)
        kv.push(0, mx.nd.ones((4, 5)))
        kv.barrier()                       # 1: after the real pushes
        conn.tx = [r.sock for r in conn.tx]
        conn.sched = conn.sched.sock
        hb_frames = []
        link = conn.link
        sent = link.hb
        link.hb = Recorder(sent, hb_frames)
        while not hb_frames:
            time.sleep(0.05)
        link.hb = sent
        with open(capture + ".tmp", "wb") as f:
            pickle.dump({"password": conn.limits.handshake_password, "push": pushes[0], "barrier": barriers[-1], "heartbeat": hb_frames[0],
                         "server": conn.topology["servers"][0],
                         "scheduler": conn.env.scheduler_address}, f)
        os.replace(capture + ".tmp", capture)
        kv.barrier()                       # 2: worker 0 replays meanwhile
        time.sleep(HOLD)                   # worker 0 must wait for this in barrier 3
        kv.barrier()                       # 3
    else:
        kv.push(0, mx.nd.ones((4, 5)))
        kv.barrier()                       # 1
        while not os.path.exists(capture):
            time.sleep(0.05)
        with open(capture, "rb") as f:
            captured = pickle.load(f)
        ctx = zmq.Context()

        def attacker():
            sock = ctx.socket(zmq.DEALER)
            sock.plain_username, sock.plain_password = HANDSHAKE_USER, captured["password"]
            return sock
        for what, target in (("push", "server"), ("heartbeat", "scheduler")):
            sock = attacker()
            sock.connect(captured[target])
            for _ in range(args.copies):
                sock.send_multipart(captured[what])
            sock.close(linger=1000)
        kv.barrier()                       # 2
        sock = attacker()
        sock.connect(captured["scheduler"])
        for _ in range(args.copies):
            sock.send_multipart(captured["barrier"])
        sock.close(linger=1000)
        time.sleep(0.2)
        t = time.monotonic()
        kv.barrier()                       # 3: worker 1 arrives HOLD seconds late
        waited = time.monotonic() - t
        ctx.term()
        stats = kv.stats()
        print("REPLAY " + json.dumps({"barrier_wait_s": waited,
                                      "rejected": stats["servers"][0]["rejected"],
                                      "pushes_applied": stats["servers"][0]["pushes_applied"]}),
              flush=True)
    kv.pull(0, out=w)
    value = w.asnumpy()
    expected = -LR * kv.num_workers
    print(f"WEIGHTS worker {kv.rank} {float(value.min())} {float(value.max())} expected {expected}",
          flush=True)
    ok = np.all(value == expected)
    kv.barrier()
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
