"""Scripted pushes and pulls of one key, one worker at a time, for the delay-aware optimizers.

Every step is a barrier, then one named worker pushes a known gradient (``kv.push``: it does
not bring the weights back) or pulls.  The delay τ of each push is then known exactly: the
updates applied since that worker's last pull.  Worker 0 writes the final weights; the test
recomputes them in float64 with :func:`reference` (the same events, no MXNet).
"""
import argparse
import json
import sys

import numpy as np

SHAPE = (6, 5)


def events(seed: int, workers: int, pushes: int) -> list[tuple[str, int]]:
    """A seeded sequence of ``("push" | "pull", worker)``: each worker pulls before some of its
    pushes only, so delays run from 0 to several updates."""
    rng = np.random.default_rng(seed)
    out = [("pull", w) for w in range(workers)]
    for _ in range(pushes):
        w = int(rng.integers(workers))
        if rng.random() < 0.4:
            out.append(("pull", w))
        out.append(("push", w))
    return out


def gradient(i: int) -> np.ndarray:
    """The i-th push's gradient: signs and sizes vary by element and by push."""
    x = np.arange(np.prod(SHAPE), dtype=np.float64).reshape(SHAPE)
    return (np.sin(0.7 * x + 1.3 * i) * (1 + (i % 4))).astype(np.float32)


def initial() -> np.ndarray:
    return np.linspace(-1, 1, int(np.prod(SHAPE)), dtype=np.float32).reshape(SHAPE)


def delays(evs) -> list[int]:
    """τ of every push: updates applied since its worker's last pull."""
    version, pulled, out = 0, {}, []
    for op, w in evs:
        if op == "pull":
            pulled[w] = version
        else:
            out.append(version - pulled.get(w, 0))
            version += 1
    return out


def reference(name: str, params: dict, evs) -> np.ndarray:
    """The final weights, recomputed in float64 from the algorithms' formulas."""
    lr, eps = params["learning_rate"], params.get("eps", 1e-7)
    w = initial().astype(np.float64)
    version, pulled, i = 0, {}, 0
    z = np.zeros_like(w)
    gbar, zr, zp = np.zeros_like(w), np.ones_like(w), np.ones_like(w)
    snap_g, snap_w = {}, {}
    history, mom = np.zeros_like(w), np.zeros_like(w)
    w0 = w.copy()
    for op, worker in evs:
        if op == "pull":
            pulled[worker] = version
            snap_g[worker], snap_w[worker] = gbar.copy(), w.copy()
            continue
        g = gradient(i).astype(np.float64)
        i += 1
        t, tau = version + 1, version - pulled.get(worker, 0)
        if name in ("adadelay", "adagrad"):
            tau = tau if name == "adadelay" else 0
            z += t / (t + tau) * g * g
            w -= lr * g / np.sqrt(z * (t + tau) / t + eps)
        elif name == "adaptiverevision":
            back = gbar - snap_g.get(worker, np.zeros_like(w))
            lr_old = lr / (np.sqrt(zp) + eps)
            zr += g * g + 2 * g * back
            zp = np.maximum(zr, zp)
            lr_new = lr / (np.sqrt(zp) + eps)
            w = w - lr_new * g + (lr_old - lr_new) * back
            gbar += g
        elif name == "dcasgda":
            lam, m = params.get("lamda", 2.0), params.get("m", 0.95)
            z = m * z + (1 - m) * g * g
            w = w - lr * (g + lam / (np.sqrt(z) + eps) * g * g * (w - snap_w.get(worker, w0)))
        elif name == "sgd":
            w = w - lr * g
        elif name == "adagradmomentum":
            history += g * g
            mom = params.get("momentum", 0.9) * mom - lr * g / np.sqrt(history + eps)
            w = w + mom
        else:
            raise ValueError(name)
        version += 1
    return w


def main():
    import mxnet as mx
    import kvstore_ext  # noqa: F401

    p = argparse.ArgumentParser()
    p.add_argument("--kvstore", default="dist_asp")
    p.add_argument("--optimizer", required=True)
    p.add_argument("--params", default='{"learning_rate": 0.05}', help="JSON")
    p.add_argument("--pushes", type=int, default=50)
    p.add_argument("--seed", type=int, default=4)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    params = json.loads(args.params)
    kv = mx.kv.create(args.kvstore)
    try:
        kv.set_optimizer(mx.optimizer.create(args.optimizer, rescale_grad=1.0, wd=0.0, **params))
    except mx.MXNetError as exc:
        print("REFUSED " + json.dumps({"rank": kv.rank, "error": str(exc)}), flush=True)
        return 0
    kv.init("w", mx.nd.array(initial()))
    out = mx.nd.zeros(SHAPE)
    evs = events(args.seed, kv.num_workers, args.pushes)
    pushed = 0
    for op, worker in evs:
        kv.barrier()            # the previous step has been applied (barrier waits for acks)
        if worker == kv.rank:
            if op == "pull":
                kv.pull("w", out=out)
                out.wait_to_read()
            else:
                kv.push("w", mx.nd.array(gradient(pushed)))
        pushed += op == "push"
    kv.barrier()
    if kv.rank == 0:
        kv.pull("w", out=out)
        stats = kv.stats()
        # the optimizer's state, saved, loaded back (split again per server) and saved again
        first, second = args.out + ".states1", args.out + ".states2"
        kv.save_optimizer_states(first)
        kv.load_optimizer_states(first)
        kv.save_optimizer_states(second)
        with open(args.out, "w") as f:
            json.dump({"weights": out.asnumpy().astype(float).tolist(), "stats": stats,
                       "states": [first, second]}, f)
    kv.barrier()   # nobody leaves (taking its snapshots with it) before worker 0 has saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
