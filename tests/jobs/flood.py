"""Floods from someone without the secret, in the middle of a job.

Workers push exact (power-of-two) gradients in rounds.  Half way, worker 0 also plays
an attacker with no secret: it connects its own socket to every server and to the
scheduler and sends one frame of ``--frame-mb`` MB, then one message of ``--frames``
empty frames; then, over a hand-made connection, ``--unfinished`` frames of 64 MB of a
message whose last frame never comes (ZeroMQ holds such frames until the message ends);
then ``--reconnecting`` seconds of small messages from sockets that keep reconnecting.  With
``--sniffed`` the attacker has seen the job's handshake password on the wire (it crosses
in clear without CURVE): its connections are accepted, and only the per-message checks
stand.  At the end worker 0 prints how much each server's peak memory grew across the
flood and checks the weights.
"""
import argparse
import json
import os
import socket
import struct
import sys
import time

import mxnet as mx
import numpy as np
import zmq

import kvstore_ext  # noqa: F401
from kvstore_ext.ps.transport import HANDSHAKE_USER

LR = 2.0 ** -6


def unfinished_message(address: str, frames: int, frame_mb: int) -> None:
    """Speak ZMTP 3.0 over a plain TCP socket (NULL mechanism) and send ``frames`` frames of
    ``frame_mb`` MB, each marked "more", and never the last one: a ZeroMQ sender cannot
    (it sends nothing of a message until its end), a hand-made one can."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    chunk = b"\x01" * (1 << 20)
    try:
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0")
                         + bytes(32))
            ready = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
            sock.sendall(bytes([0x04, len(ready)]) + ready)
            for _ in range(frames):
                sock.sendall(b"\x03" + struct.pack(">Q", frame_mb << 20))
                for _ in range(frame_mb):
                    sock.sendall(chunk)
            time.sleep(2.0)
    except OSError:   # refused at the handshake: the connection is closed under it
        pass


def reconnecting(ctx, address: str, seconds: float, password) -> None:
    """50 sockets of random identities send 4 KB messages; each makes a new connection
    every 20 (ZeroMQ gives each connection a queue of its own)."""
    payload = bytes(4096)
    deadline = time.monotonic() + seconds
    socks = [None] * 50
    sent = 0
    while time.monotonic() < deadline:
        for i, sock in enumerate(socks):
            if sock is None or sent % 20 == 0:
                if sock is not None:
                    sock.close(linger=0)
                sock = socks[i] = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.ROUTING_ID, os.urandom(8))
                sock.setsockopt(zmq.SNDHWM, 100000)
                if password:
                    sock.plain_username, sock.plain_password = HANDSHAKE_USER, password
                sock.connect(address)
            try:
                sock.send(payload, zmq.NOBLOCK)
            except zmq.Again:
                pass
        sent += 1
        time.sleep(0.002)
    for sock in socks:
        sock.close(linger=0)


def flood(addresses, frame_mb: int, frames: int, unfinished: int, seconds: float,
          password) -> float:
    t = time.monotonic()
    ctx = zmq.Context()
    big = np.zeros(frame_mb << 20, dtype=np.uint8)
    for address in addresses:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.SNDTIMEO, 5000)
        if password:
            sock.plain_username, sock.plain_password = HANDSHAKE_USER, password
        sock.connect(address)
        try:   # refused at the handshake, nothing leaves: the sends time out
            if frame_mb:
                sock.send(big, copy=False)
            if frames:
                sock.send_multipart([b""] * frames)
        except zmq.Again:
            pass
        time.sleep(1.0)
        sock.close(linger=0)
        if unfinished:
            unfinished_message(address, unfinished, 64)
        if seconds:
            reconnecting(ctx, address, seconds, password)
    ctx.term()
    return time.monotonic() - t


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kvstore", default="dist_asp")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--frame-mb", type=int, default=1024)
    p.add_argument("--frames", type=int, default=1_000_000)
    p.add_argument("--unfinished", type=int, default=0)
    p.add_argument("--reconnecting", type=float, default=0.0,
                   help="seconds of small messages from reconnecting sockets, per address")
    p.add_argument("--sniffed", action="store_true")
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
                password = kv._conn.limits.handshake_password if args.sniffed else None
                seconds = flood(kv._conn.topology["servers"] + [kv._conn.env.scheduler_address],
                                args.frame_mb, args.frames, args.unfinished, args.reconnecting,
                                password)
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
