"""Worker 0 makes every kind of mistake; worker 1 trains normally all the while.

Each mistake must raise a clear error on worker 0 only, and the server must go
on serving both.  Worker 0 also plays an attacker: a raw ZeroMQ client that
sends a pickle to a server's port.
"""
import json
import os
import pickle
import sys

import mxnet as mx
import numpy as np
import zmq

import kvstore_ext
from kvstore_ext import KVStoreError
from kvstore_ext.ps.transport import HANDSHAKE_USER


class Boom:
    """Unpickling this would create a file: proof that nothing was unpickled if it is absent."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def expect(fn, *fragments):
    try:
        fn()
    except (KVStoreError, ValueError, TypeError) as exc:
        msg = str(exc)
        missing = [f for f in fragments if f not in msg]
        assert not missing, f"error {msg!r} lacks {missing}"
        return msg
    raise AssertionError(f"no error raised; expected one mentioning {fragments}")


def main():
    out = sys.argv[1]
    kv = mx.kv.create("dist_bsp")
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1))
    w = mx.nd.zeros((2, 3))
    kv.init(0, w)
    report = {}
    if kv.rank == 0:
        report["uninitialised"] = expect(lambda: kv.pushpull(99, mx.nd.ones((2, 3)), out=w),
                                         "key 99", "not been initialised")
        report["shape"] = expect(lambda: kv.pushpull(0, mx.nd.ones((3, 2)), out=w),
                                 "key 0", "(3, 2)", "(2, 3)")
        report["dtype"] = expect(lambda: kv.pushpull(0, mx.nd.ones((2, 3), dtype="float64"), out=w),
                                 "key 0", "float64", "float32")
        report["reinit"] = expect(lambda: kv.init(0, mx.nd.zeros((6,))),
                                  "key 0", "(2, 3)", "(6,)")
        report["bad_key"] = expect(lambda: kv.pushpull(1.5, mx.nd.ones((2, 3)), out=w), "1.5")
        report["ignore_sparse"] = expect(lambda: kv.pull(0, out=w, ignore_sparse=False),
                                         "doesn't support ignore_sparse=False")
        report["mixed_keys"] = expect(lambda: kv.init("w", mx.nd.zeros((2, 3))),
                                      "Mixed key types are not allowed", "'w'")
        report["unknown_type"] = expect(lambda: mx.kv.create("dist_nonsense"),
                                        "dist_nonsense", "dist_bsp")
        report["bad_staleness"] = expect(lambda: kvstore_ext.create("dist_ssp", staleness=-1),
                                         "staleness", "-1")
        # the server itself refuses a wrongly sized block, even from an authenticated client
        conn = kv._conn
        report["server_shape"] = expect(
            lambda: conn.request({0: ({"op": "push", "items": [[0, 0, "<f4", 5]]},
                                      [np.ones(5, np.float32)])}),
            "5 elements", "key 0", "holds 6")
        # an attacker without the secret (that saw the handshake's password on the wire):
        # raw pickles to the server's port
        proof = out + ".unpickled"
        sock = conn.ctx.socket(zmq.DEALER)
        sock.plain_username, sock.plain_password = HANDSHAKE_USER, conn.limits.handshake_password
        sock.connect(conn.topology["servers"][0])
        boom = pickle.dumps(Boom(proof))
        sock.send_multipart([boom, boom])
        sock.send_multipart([json.dumps({"op": "set_optimizer"}).encode(), b"0" * 32, boom])
        sock.send_multipart([boom])
        answered = sock.poll(1500)
        sock.close(0)
        report["forged_answered"] = bool(answered)
        report["unpickled"] = os.path.exists(proof)
    for _ in range(5):                      # both workers now train normally
        kv.pushpull(0, mx.nd.ones((2, 3)), out=w)
    report["weights"] = w.asnumpy().tolist()
    report["rejected"] = sum(s["rejected_unauthenticated"] for s in kv.stats()["servers"])
    with open(f"{out}.{kv.rank}.json", "w") as f:
        json.dump(report, f)
    kv.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
