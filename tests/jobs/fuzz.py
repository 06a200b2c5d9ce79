"""Property-based fuzzing of a live server and scheduler with authenticated malformed messages.

Worker 1 trains on exact (power-of-two) gradients.  Worker 0, which holds the job's
secret, meanwhile sends ``--examples`` messages that hypothesis builds to the server and
as many to the scheduler: random headers (any JSON), mutations of real requests (a
field replaced by any value, items of any shape), nested headers, extra frames.  Headers
that are simply valid requests touching the trained key, or valid scheduler requests
in a real worker's name, are not sent: they are not malformed, and a holder of the secret
may send them.  Afterwards both workers check their weights; the job must end cleanly.
"""
import argparse
import json
import sys
import time

import mxnet as mx
import numpy as np
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvstore_ext  # noqa: F401
from kvstore_ext.ps.protocol import check_request
from kvstore_ext.ps.scheduler import OPS, ROLES
from kvstore_ext.ps.transport import Codec, configure

LR = 2.0 ** -6
OPS_SERVER = ["init", "push", "pushpull", "pull", "set_optimizer", "set_lr", "get_states",
              "set_states", "stats", "hello", "away"]

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
                      st.floats(allow_nan=False), st.text(max_size=20))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=8), inner, max_size=6)),
    max_leaves=30)
item = st.lists(st.one_of(json_value, st.integers(-3, 3), st.sampled_from(["<f4", "|u1", "O"])),
                max_size=7)
server_header = st.fixed_dictionaries(
    {"op": st.one_of(st.sampled_from(OPS_SERVER), json_value)},
    optional={"seq": st.one_of(st.integers(-5, 2 ** 40), json_value),
              "worker": st.one_of(st.integers(-2, 3), json_value),
              "reply_to": st.one_of(st.text(max_size=30), json_value),
              "items": st.one_of(st.lists(item, max_size=5), json_value),
              "has_value": st.one_of(st.booleans(), json_value),
              "lr": st.one_of(st.floats(), json_value),
              "_layout": json_value})
sched_header = st.fixed_dictionaries(
    {"op": st.one_of(st.sampled_from(list(OPS) + ["abort", "node_dead"]), json_value)},
    optional={"role": st.one_of(st.sampled_from(list(ROLES)), json_value),
              "rank": st.one_of(st.integers(-2, 4), json_value),
              "node": st.one_of(st.text(max_size=10), json_value),
              "store": json_value, "rank_hint": json_value,
              "host": json_value, "port": json_value})
frames = st.lists(st.binary(max_size=64), max_size=3)


def server_harmless(header: dict, workers: int) -> bool:
    """A valid request that changes what the real workers train is not malformed: skip it."""
    try:
        check_request(header, workers)
    except Exception:
        return True
    return header["op"] not in ("init", "push", "pushpull", "set_optimizer", "set_lr",
                                "set_states", "away")


def scheduler_harmless(header: dict, workers: int) -> bool:
    rank = header.get("rank")
    valid_node = header.get("role") in ROLES and type(rank) is int and 0 <= rank < workers
    return not (header.get("op") in OPS and valid_node and header.get("op") != "register")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--examples", type=int, default=5000)
    p.add_argument("--kvstore", default="dist_asp")
    args = p.parse_args()
    kv = mx.kv.create(args.kvstore)
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=LR, momentum=0.0, wd=0.0, rescale_grad=1.0))
    w = mx.nd.zeros((8, 8))
    kv.init(0, w)
    conn = kv._conn
    rounds = 0
    if kv.rank == 1:
        deadline = time.monotonic() + 3600
        while not kv._conn.failure and time.monotonic() < deadline:
            kv.push(0, mx.nd.ones((8, 8)))
            rounds += 1
            if rounds >= 50:
                break
            time.sleep(0.05)
    else:
        ctx = zmq.Context()
        codec = Codec(conn.env.secret)
        sent = {"server": 0, "scheduler": 0}
        targets = {"server": (conn.topology["servers"][0], "server:0"),
                   "scheduler": (conn.env.scheduler_address, "scheduler")}
        socks = {}
        for name, (address, _) in targets.items():
            socks[name] = configure(ctx.socket(zmq.DEALER), conn.limits)   # holds the secret
            socks[name].setsockopt(zmq.SNDHWM, 100000)
            socks[name].connect(address)
        outbox = codec.outbox()

        def send(name, header, bufs):
            address, to = targets[name]
            socks[name].send_multipart(codec.seal(header, bufs, to=to, outbox=outbox))
            sent[name] += 1
            if sent[name] % 200 == 0:
                time.sleep(0.02)   # let the real workers' messages through too

        fuzz = settings(max_examples=args.examples, deadline=None, database=None,
                        suppress_health_check=list(HealthCheck))

        @fuzz
        @given(server_header, frames)
        def fuzz_server(header, bufs):
            if server_harmless(header, kv.num_workers):
                send("server", header, bufs)

        @fuzz
        @given(sched_header, frames)
        def fuzz_scheduler(header, bufs):
            if scheduler_harmless(header, kv.num_workers):
                send("scheduler", header, bufs)

        fuzz_server()
        fuzz_scheduler()
        deep = {"op": "push"}
        for _ in range(100_000):
            deep = {"op": "push", "items": [deep]}
        for name in targets:   # a header nested 100,000 deep, and frames with no header
            head = json.dumps({"op": "x"})
            send(name, {"op": "push", "items": [[0, 0, "<f4", 64]] * 2000, "seq": 1,
                        "worker": 0, "reply_to": "x"}, [])
            socks[name].send_multipart([b"[" * 100_000 + b"]" * 100_000, b"\0" * 32])
            socks[name].send_multipart([head.encode()])
        try:
            send("server", deep, [])
        except (RecursionError, ValueError):
            pass   # json.dumps cannot even write it; the raw frames above stand in for it
        for s in socks.values():
            s.close(linger=2000)
        ctx.term()
        print(f"FUZZ sent {json.dumps(sent)}", flush=True)
        rounds = 50
        for _ in range(rounds):
            kv.push(0, mx.nd.ones((8, 8)))
    kv.barrier()
    kv.pull(0, out=w)
    value = w.asnumpy()
    expected = -LR * 100
    stats = kv.stats()
    print(f"WEIGHTS worker {kv.rank} {float(value.min())} {float(value.max())} expected "
          f"{expected} rejected {json.dumps(stats['servers'][0]['rejected'])}", flush=True)
    ok = bool(np.all(value == expected))
    kv.barrier()
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
