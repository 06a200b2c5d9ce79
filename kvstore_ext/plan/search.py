"""The scalability optimizer: the best configurations for a model under a machine budget.

Every configuration of the space (workers n, servers s, dedicated or on the workers' hosts,
batch size, store) is evaluated at once by the model's arrays (:func:`.model.iteration_time`);
those over the machine budget or a device's memory are pruned first.  The ranked top ones are
then re-run by the discrete-event simulator (the real policy objects, with the model's service
times), and the knee of each store is where one more worker adds less than 5% throughput.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .model import (Costs, ModelProfile, busiest, iteration_time, server_service,
                    simulated_time)

SEARCHED_STORES = ("dist_bsp", "dist_asp", "dist_ssp", "dist_dssp")
KNEE_GAIN = 0.05


@dataclass
class Space:
    """What may vary, and the limits."""

    workers: tuple = tuple(range(1, 17))
    servers: tuple = (1, 2, 4, 8)
    batch_sizes: tuple = (32, 64, 128)
    stores: tuple = SEARCHED_STORES
    colocate: tuple = (False, True)      # servers on their own machines, or on the workers'
    machines: int = 16
    memory_bytes: float | None = None    # a device's memory
    device_ms_at: dict = field(default_factory=dict)   # batch -> device seconds (None: host)

    def size(self) -> int:
        return (len(self.workers) * len(self.servers) * len(self.batch_sizes) * len(self.stores)
                * len(self.colocate))


def evaluate(profile: ModelProfile, costs: Costs, space: Space, *, shared_host: bool = False,
             host_compute: bool = False, dataset_size: int = 60000, bigarray_bound=1_000_000,
             bandwidth=None) -> dict:
    """Every configuration of ``space`` in arrays: its parameters, seconds per iteration,
    samples/s, epoch seconds and whether it fits; vectorised over the whole space."""
    grid = np.meshgrid(np.arange(len(space.workers)), np.arange(len(space.servers)),
                       np.arange(len(space.batch_sizes)), np.arange(len(space.stores)),
                       np.arange(len(space.colocate)), indexing="ij")
    wi, si, bi, sti, ci = (g.ravel() for g in grid)
    n = np.asarray(space.workers)[wi]
    s = np.asarray(space.servers)[si]
    b = np.asarray(space.batch_sizes)[bi]
    store = np.asarray(space.stores)[sti]
    colocated = np.asarray(space.colocate)[ci]
    # the busiest server's share depends on s (and n only as a factor): one table per s
    table = {sv: busiest(profile, sv, costs, 1, bigarray_bound) for sv in space.servers}
    col = {k: np.array([table[sv][k] for sv in s]) for k in
           ("keys", "elements", "messages", "max_elements", "items")}
    device = np.array([space.device_ms_at.get(int(x)) or 0.0 for x in space.batch_sizes])[bi]
    host = profile.host_time(b) if host_compute or not space.device_ms_at else np.zeros(len(b))
    seconds, parts = iteration_time(
        store=store, workers=n, batch_size=b, host_s=host, device_s=device,
        keys=col["items"], elements=profile.params, messages=col["messages"],
        server_keys=col["keys"], server_elements=col["elements"],
        server_max_elements=col["max_elements"], costs=costs, shared_host=shared_host,
        bandwidth=bandwidth, colocated=colocated)
    machines = np.where(colocated, np.maximum(n, s), n + s)
    fits = machines <= space.machines
    fits &= ~(colocated & (s > n))
    if space.memory_bytes:
        fits &= profile.memory_bytes(b) <= space.memory_bytes
    samples = n * b / seconds
    return {"workers": n, "servers": s, "batch_size": b, "store": store, "colocated": colocated,
            "machines": machines, "seconds": seconds, "samples_per_s": samples,
            "epoch_s": dataset_size / samples, "fits": fits, "parts": parts}


def rank(result: dict, top: int = 10, merge_stores: bool = False) -> list[dict]:
    """The ``top`` fitting configurations by samples/s (ties: fewer machines first).
    ``merge_stores``: stores predicted alike for the same cluster and batch (ASP, SSP and
    DSSP on even devices) make one row, whose ``stores`` lists them all."""
    idx = np.flatnonzero(result["fits"])
    order = idx[np.lexsort((result["machines"][idx], -result["samples_per_s"][idx]))]
    rows, seen = [], {}
    stores = max(1, len(np.unique(result["store"])))
    for i in order[:top * stores]:       # enough to gather every store of the last row
        r = row(result, i)
        key = (r["workers"], r["servers"], r["batch_size"], r["colocated"],
               round(r["seconds_per_iteration"], 12))
        if merge_stores and key in seen:
            seen[key]["stores"].append(r["store"])
            continue
        if len(rows) < top:
            r["stores"] = [r["store"]]
            seen[key] = r
            rows.append(r)
    return rows


def row(result: dict, i: int) -> dict:
    from .model import bottleneck
    return {"workers": int(result["workers"][i]), "servers": int(result["servers"][i]),
            "batch_size": int(result["batch_size"][i]), "store": str(result["store"][i]),
            "colocated": bool(result["colocated"][i]), "machines": int(result["machines"][i]),
            "seconds_per_iteration": float(result["seconds"][i]),
            "samples_per_s": float(result["samples_per_s"][i]),
            "epoch_s": float(result["epoch_s"][i]),
            "bottleneck": bottleneck(result["parts"], i)}


def knee_of(curve: dict, gain: float = KNEE_GAIN) -> int:
    """The first worker count after which the next one (m workers more) adds less than m x
    ``gain`` of the throughput; the last if none (``curve``: workers -> samples/s)."""
    ns = sorted(curve)
    for a, nxt in zip(ns, ns[1:]):
        if curve[nxt] < curve[a] * (1 + gain * (nxt - a)):
            return a
    return ns[-1]


def knees(result: dict, gain: float = KNEE_GAIN) -> dict:
    """Per store: the best samples/s at each worker count (over everything else that fits),
    and its knee (:func:`knee_of`)."""
    out = {}
    for store in np.unique(result["store"]):
        mask = result["fits"] & (result["store"] == store)
        curve = {}
        for n in np.unique(result["workers"][mask]):
            m = mask & (result["workers"] == n)
            curve[int(n)] = float(result["samples_per_s"][m].max())
        out[str(store)] = {"curve": curve, "knee": knee_of(curve, gain)}
    return out


def recheck(profile: ModelProfile, costs: Costs, rows: list[dict], space: Space, *,
            shared_host: bool = False, host_compute: bool = False, bandwidth=None,
            iterations: int = 300, params: dict | None = None) -> list[dict]:
    """Each row re-run by the simulator (the store's real policy, service times from the
    model); ``simulated_s`` and its difference from the closed form."""
    from .model import predict
    out = []
    for r in rows:
        device = space.device_ms_at.get(r["batch_size"]) or 0.0
        p = predict(profile, costs, store=r["store"], workers=r["workers"], servers=r["servers"],
                    batch_size=r["batch_size"], device_s=device, shared_host=shared_host,
                    host_compute=host_compute, colocated=r["colocated"], bandwidth=bandwidth)
        host = float(profile.host_time(r["batch_size"])) if host_compute or not device else 0.0
        push_s, apply_s = server_service(costs, busiest(profile, r["servers"], costs,
                                                        r["workers"]))
        sim = simulated_time(r["store"], (params or {}).get(r["store"], {}),
                             [device] * r["workers"], host,
                             p.parts["worker CPU"] + p.parts["worker link"], push_s, apply_s,
                             r["workers"], iterations, 0, costs, shared_host)
        out.append({**r, "simulated_s": sim,
                    "simulator_vs_model": sim / r["seconds_per_iteration"] - 1.0})
    return out
