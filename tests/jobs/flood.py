"""Floods from someone without the secret, in the middle of a job.

Workers push exact (power-of-two) gradients in rounds.  Half way, worker 0 also plays
an attacker with no secret: it connects its own socket to every server and to the
scheduler and sends one frame of ``--frame-mb`` MB, then one message of ``--frames``
empty frames.  At the end worker 0 prints how much each server's peak memory grew
across the flood and checks the weights.
"""
import argparse
import json
import sys
import time

import mxnet as mx
import numpy as np
import zmq

import kvstore_ext  # noqa: F401

LR = 2.0 ** -6


def flood(addresses, frame_mb: int, frames: int) -> float:
    t = time.monotonic()
    ctx = zmq.Context()
    big = np.zeros(frame_mb << 20, dtype=np.uint8)
    for address in addresses:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.SNDTIMEO, 5000)
        sock.connect(address)
        try:   # with CURVE no connection is ever made: the sends time out, nothing leaves
            if frame_mb:
                sock.send(big, copy=False)
            if frames:
                sock.send_multipart([b""] * frames)
        except zmq.Again:
            pass
        time.sleep(1.0)
        sock.close(linger=0)
    ctx.term()
    return time.monotonic() - t


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kvstore", default="dist_asp")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--frame-mb", type=int, default=1024)
    p.add_argument("--frames", type=int, default=1_000_000)
    args = p.parse_args()
    kv = mx.kv.create(args.kvstore)
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=LR, momentum=0.0, wd=0.0, rescale_grad=1.0))
    w = mx.nd.zeros((100, 100))
    kv.init(0, w)
    grad = mx.nd.ones((100, 100))
    before = after = None
    for i in range(args.rounds):
        kv.pushpull(0, grad, out=w)
        if i == args.rounds // 2:
            w.wait_to_read()
            if kv.rank == 0:
                before = [s["peak_rss_mb"] for s in kv.stats()["servers"]]
                seconds = flood(kv._conn.topology["servers"] + [kv._conn.env.scheduler_address],
                                args.frame_mb, args.frames)
                after = [s["peak_rss_mb"] for s in kv.stats()["servers"]]
        time.sleep(0.01)
    kv.barrier()
    kv.pull(0, out=w)
    value = w.asnumpy()
    expected = -LR * args.rounds * kv.num_workers
    if kv.rank == 0:
        stats = kv.stats()
        print("FLOOD " + json.dumps({
            "flood_s": seconds, "server_peak_rss_mb_before": before,
            "server_peak_rss_mb_after": after,
            "rejected": [s["rejected"] for s in stats["servers"]],
            "exact": bool(np.all(value == expected))}), flush=True)
    kv.barrier()
    return 0 if np.all(value == expected) else 3


if __name__ == "__main__":
    sys.exit(main())
