"""The scalability optimizer: the best configurations for a model under a machine budget.

Every configuration of the space (workers n, servers s, dedicated or on the workers' hosts,
batch size, store with one setting of its parameters) is evaluated at once by the model's
arrays (:func:`.model.iteration_time`); those over the machine budget or a device's memory are
pruned first.  The machines may carry different devices (a pool): n workers run on the n
fastest.  Where the pace depends on the policy (SSP and DSSP on uneven devices, PSP always, as
:func:`.model.predict` has it), the arrays give an optimistic bound instead, and the ranking
simulates those configurations with their real policies lazily, best bound first, until the
top ones are exact (:class:`Frontier`).  Each configuration also has a mean staleness (the
updates applied between a worker's read of the weights and its push's application), which a
ranking may cap.  The knee of each store is where one more worker adds less than 5% throughput.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import numpy as np

from .. import registry
from .model import (CLOSED_FORM, Costs, ModelProfile, bottleneck, busiest, iteration_time,
                    placement_inputs, predict, server_service, simulated_time)

SEARCHED_STORES = ("dist_bsp", "dist_asp", "dist_ssp", "dist_dssp")
#: stores the model covers: in closed form, or simulated (dist_psp)
SEARCHABLE = CLOSED_FORM + ("dist_psp",)
#: stores whose pace on uneven devices is the policy's, not the closed form's
BOUNDED_STALENESS = ("dist_ssp", "dist_dssp")
#: no update lands between a worker's read and its push's application (a round, a ring)
SYNCHRONOUS = ("dist_bsp", "dist_psp", "dist_ssgd")
KNEE_GAIN = 0.05
#: iterations of the slowest worker each simulation runs (predict's horizon)
SIMULATED_ITERATIONS = 400


@dataclass(frozen=True)
class Variant:
    """A store with one setting of its parameters (the registry row's, checked by it)."""

    store: str
    params: dict = field(default_factory=dict)

    @classmethod
    def checked(cls, store: str, params: dict | None = None) -> "Variant":
        return cls(store, registry.lookup(store).check(dict(params or {})))

    @property
    def label(self) -> str:
        """``ssp s=6``, ``dssp s=1..15``, ``psp c=0.9n b=1``, ``asp``."""
        name, p = self.store.replace("dist_", ""), self.params
        if self.store == "dist_ssp":
            return f"{name} s={p['staleness']}"
        if self.store == "dist_dssp":
            rule = " published" if p.get("rule") == "published" else ""
            return f"{name} s={p['staleness_lower']}..{p['staleness_upper']}{rule}"
        if self.store == "dist_psp":
            c = p.get("min_pushes")
            share = "n" if c is None or c == 1 else (f"{c:g}n" if c < 1 else f"{c:g}")
            return f"{name} c={share} b={p['min_pull_fraction']:g}"
        return name

    def to_dict(self) -> dict:
        return {"store": self.store, "params": self.params, "label": self.label}


def merged_label(variants: list[Variant], space_variants) -> str:
    """One row's variants (alike in pace and staleness) as one label: a store all of whose
    several settings are in the row by its bare name (``asp = ssp = dssp`` on even devices,
    where the bounds never bind), the others by their settings."""
    parts = []
    for store in dict.fromkeys(v.store for v in variants):
        mine = [v for v in variants if v.store == store]
        tried = sum(v.store == store for v in space_variants)
        parts += [store.replace("dist_", "")] if len(mine) == tried > 1 else \
            [v.label for v in mine]
    return " = ".join(parts)


# -- the options' grammar -------------------------------------------------------------------------

def _number(text: str):
    """An int, else a float, else the text itself (for the registry's check to name)."""
    text = text.strip()
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _pairs(text: str, option: str, form: str) -> list[tuple[str, str]]:
    """``a:b,c:d`` as ``[("a", "b"), ("c", "d")]``, or an error naming ``option``."""
    out = []
    for item in text.split(","):
        first, sep, second = item.partition(":")
        if not (sep and first.strip() and second.strip()):
            raise ValueError(f"{option} takes {form} pairs separated by commas, got {item!r}")
        out.append((first, second))
    return out


def parse_stores(text: str) -> tuple[str, ...]:
    """``dist_bsp,dist_asp``: stores the model covers."""
    stores = tuple(s.strip() for s in text.split(",") if s.strip())
    if not stores:
        raise ValueError("no store named")
    for store in stores:
        registry.lookup(store)
        if store not in SEARCHABLE:
            raise ValueError(f"the model has no equations for store {store!r} (it covers "
                             f"{', '.join(SEARCHABLE)})")
    return stores


def parse_staleness(text: str) -> tuple[dict, ...]:
    """``1,3,6,15``: dist_ssp's ``staleness`` values."""
    return tuple(Variant.checked("dist_ssp", {"staleness": _number(s)}).params
                 for s in text.split(","))


def parse_dssp_bounds(text: str) -> tuple[dict, ...]:
    """``1:15,3:15``: dist_dssp's ``staleness_lower:staleness_upper`` pairs."""
    return tuple(Variant.checked("dist_dssp", {"staleness_lower": _number(lo),
                                               "staleness_upper": _number(hi)}).params
                 for lo, hi in _pairs(text, "--dssp-bounds", "LOWER:UPPER"))


def parse_psp(text: str) -> tuple[dict, ...]:
    """``0.75:1,0.9:0.9``: dist_psp's ``min_pushes`` as a fraction of the workers (so that one
    setting fits every n) and ``min_pull_fraction``."""
    out = []
    for share, pull in _pairs(text, "--psp", "C:B"):
        c = _number(share)
        c = float(c) if isinstance(c, int) else c      # 1 is every worker, not one of them
        params = Variant.checked("dist_psp", {"min_pushes": c,
                                              "min_pull_fraction": _number(pull)}).params
        if params["min_pushes"] > 1:
            raise ValueError(f"min_pushes is a fraction of the workers in (0, 1] here, "
                             f"got {share.strip()}")
        out.append(params)
    return tuple(out)


# -- the space ----------------------------------------------------------------------------------

@dataclass
class Space:
    """What may vary, and the limits.

    ``device_ms_at`` maps a batch size to device seconds per iteration: one time, for as many
    workers as asked (None or 0: the host computes), or one per machine of a pool, of which a
    configuration of n workers takes the n fastest.  ``params`` maps a store to the settings
    of its parameters tried (default: the registry's defaults, once).
    """

    workers: tuple = tuple(range(1, 17))
    servers: tuple = (1, 2, 4, 8)
    batch_sizes: tuple = (32, 64, 128)
    stores: tuple = SEARCHED_STORES
    colocate: tuple = (False, True)      # servers on their own machines, or on the workers'
    machines: int = 16
    memory_bytes: float | None = None    # a device's memory
    device_ms_at: dict = field(default_factory=dict)   # batch -> device seconds (None: host)
    params: dict = field(default_factory=dict)          # store -> settings tried

    def variants(self) -> tuple[Variant, ...]:
        return tuple(Variant.checked(store, p) for store in self.stores
                     for p in self.params.get(store, ({},)))

    def size(self) -> int:
        return (len(self.workers) * len(self.servers) * len(self.batch_sizes)
                * len(self.variants()) * len(self.colocate))

    def pool(self, batch: int) -> tuple[float, ...] | None:
        """The pool's device seconds at ``batch``, fastest first; None for one device (or the
        host) for every worker."""
        at = self.device_ms_at.get(batch)
        return tuple(sorted(at)) if isinstance(at, (tuple, list)) else None

    def devices(self, workers: int, batch: int) -> list[float]:
        """Each worker's device seconds: the ``workers`` fastest of the pool."""
        pool = self.pool(batch)
        if pool is None:
            return [self.device_ms_at.get(batch) or 0.0] * workers
        return list(pool[:workers])


def device_runs(space: Space, batch_index, workers) -> dict:
    """Per configuration, the devices of its workers as runs of equal times: ``times`` and
    ``counts`` (configurations x runs), their ``mean`` and ``slowest``, whether they are
    ``uneven``, and whether the pool has that many machines (``enough``)."""
    runs = []
    for b in space.batch_sizes:
        pool = space.pool(b)
        if pool is None:
            runs.append([(space.device_ms_at.get(b) or 0.0, 0, np.inf)])
            continue
        start, mine = 0, []
        for t, same in itertools.groupby(pool):
            size = len(list(same))
            mine.append((t, start, size))
            start += size
        runs.append(mine)
    width = max(len(r) for r in runs)
    table = np.zeros((len(runs), width, 3))
    for i, r in enumerate(runs):
        table[i, :len(r)] = r
    times, starts, sizes = (table[batch_index, :, j] for j in range(3))
    n = np.asarray(workers, dtype=float)[:, None]
    counts = np.clip(n - starts, 0.0, sizes)
    slowest = np.where(counts > 0, times, -np.inf).max(axis=1)
    return {"times": times, "counts": counts, "mean": (counts * times).sum(axis=1) / n[:, 0],
            "slowest": slowest, "uneven": slowest > times[:, 0],
            "enough": sizes.sum(axis=1) >= n[:, 0]}


def closed_form_staleness(store, workers):
    """Mean updates applied between a worker's read of the weights and its push's application,
    where the closed form holds: none in a synchronous round (BSP, PSP's accepted pushes, SSGD's
    ring), one for DC-S3GD (it applies the previous step's sum), and n - 1 for ASP, SSP and DSSP
    (each worker's read-to-apply windows tile time, so every other worker's update lands in
    exactly one of them: n - 1 per push on average, even or uneven; SSP and DSSP on even devices
    never wait).  Under SSP and DSSP with uneven devices a worker waiting for OK reads late, and
    the simulator counts what it misses."""
    store = np.asarray(store)
    n = np.asarray(workers, dtype=float)
    return np.select([np.isin(store, SYNCHRONOUS), store == "dist_dcs3gd"], [0.0, 1.0], n - 1.0)


def _take(arrays: dict, mask) -> dict:
    """``arrays``' per-configuration arrays at ``mask`` (the rest as they are)."""
    size = len(mask)
    return {k: (v[mask] if isinstance(v, np.ndarray) and v.shape == (size,) else v)
            for k, v in arrays.items()}


def summed_rates(cycle, devices: dict, mask) -> np.ndarray:
    """Iterations per second of the workers together, each at its own pace: ``cycle(times)``
    gives one worker's seconds per iteration for device ``times`` (configurations at ``mask``)."""
    counts, times = devices["counts"][mask], devices["times"][mask]
    return sum(counts[:, k] / cycle(times[:, k]) for k in range(times.shape[1]))


def uneven_asp_seconds(inputs: dict, parts: dict, devices: dict, mask) -> np.ndarray:
    """ASP on uneven devices as :func:`.model.predict` has it: the workers' rates add up, and
    the busiest server serves one push (and its application) at a time."""
    sub = _take(inputs, mask)
    rate = summed_rates(lambda t: iteration_time(store="dist_asp", device_s=t, **sub)[0],
                        devices, mask)
    cap = sub["workers"] * np.maximum(parts["server CPU"][mask], parts["server link"][mask])
    return np.maximum(sub["workers"] / rate, cap)


def lead_bound(variant: Variant) -> float:
    """The most pushes a worker can make beyond the slowest one's under ``variant``'s policy
    (inf: no bound).  SSP gives OK only at a lead of at most s, DSSP (its bounded rule) at most
    s_U, and PSP with c = n closes no round without every worker's push, which each worker
    waits for; PSP with c < n drops the late pushes and lets their workers on."""
    p = variant.params
    if variant.store == "dist_ssp":
        return float(p["staleness"])
    if variant.store == "dist_dssp" and p.get("rule", "bounded") == "bounded":
        return float(p["staleness_upper"])
    if variant.store == "dist_psp" and p.get("min_pushes") in (None, 1.0):
        return 0.0
    return np.inf


def bound_seconds(inputs: dict, parts: dict, devices: dict, mask, store, lead,
                  iterations: int):
    """A lower bound on the simulator's seconds per iteration of SSP, DSSP and PSP
    configurations (at ``mask``; ``lead``: :func:`lead_bound` of each), from the simulator's
    own cycle.

    The simulator (:func:`.model.simulated_run`) starts a worker's iteration ``comm`` after its
    OK, computes for ``t_i = max(device, host slowed)``, and its push gets OK no sooner than the
    server has served it: ``push + apply`` later under SSP and DSSP (one push at a time, so the
    job makes at most one push per ``push + apply``), and ``n push + apply`` later under PSP
    (the server's round is its delay).  Bounds, waiting rooms and partial rounds only add
    waits, so each worker makes at most ``1 / c_i`` iterations per second, ``c_i = t_i + comm
    + server``: the ASP-like rate.  Nor can it make more than ``lead + 1`` beyond the slowest
    worker, which makes at most one per ``c_slowest``: over a horizon of ``iterations`` such
    cycles, at most ``(1 + (lead + 1) / iterations) / c_slowest`` per second.  A run's edges
    (pushes counted when they arrive, up to n queued at the horizon) can exceed the rates by
    one iteration in ``iterations``; a margin of two covers that.  The closed form's host
    roofline and server link are not in the simulator, so they are left out of the bound too.
    """
    sub = _take(inputs, mask)
    n, costs = sub["workers"], sub["costs"]
    comm = parts["worker CPU"][mask] + parts["worker link"][mask]
    # the least a round can cost, however long its processes idle (Costs.idle_at)
    push_s, apply_s = server_service(costs, {"keys": sub["server_keys"],
                                             "elements": sub["server_elements"],
                                             "frames": sub["server_frames"]},
                                     min(1.0, costs.idle_factor))
    psp = np.asarray(store)[mask] == "dist_psp"
    server = np.where(psp, n * push_s, push_s) + apply_s
    host = sub["host_s"] * costs.interference_at(np.where(sub["shared_host"], n, 1.0))

    def rate(t):
        return 1.0 / (np.maximum(t, host) + comm + server)
    held_back = (1.0 + (lead[mask] + 1.0) / iterations) * rate(devices["slowest"][mask])
    rates = summed_rates(lambda t: 1.0 / np.minimum(rate(t), held_back), devices, mask)
    seconds = np.where(psp, n / rates, np.maximum(n / rates, n * (push_s + apply_s)))
    return seconds / (1.0 + 2.0 / iterations)


def evaluate(profile: ModelProfile, costs: Costs, space: Space, *, shared_host: bool = False,
             host_compute: bool = False, dataset_size: int = 60000, bigarray_bound=1_000_000,
             bandwidth=None, iterations: int = SIMULATED_ITERATIONS) -> dict:
    """Every configuration of ``space`` in arrays, vectorised over the whole space: its
    parameters, seconds per iteration, samples/s, epoch seconds, mean staleness and whether it
    fits.  Where ``exact`` is False (the policy sets the pace), ``seconds`` is a lower bound
    (:func:`bound_seconds`), ``samples_per_s`` an upper one and ``staleness`` unknown (NaN) until
    the simulator runs it (:class:`Simulations`, with ``iterations``)."""
    variants = space.variants()
    grid = np.meshgrid(np.arange(len(space.workers)), np.arange(len(space.servers)),
                       np.arange(len(space.batch_sizes)), np.arange(len(variants)),
                       np.arange(len(space.colocate)), indexing="ij")
    wi, si, bi, vi, ci = (g.ravel() for g in grid)
    n = np.asarray(space.workers)[wi]
    s = np.asarray(space.servers)[si]
    b = np.asarray(space.batch_sizes)[bi]
    store = np.asarray([v.store for v in variants])[vi]
    colocated = np.asarray(space.colocate)[ci]
    # the busiest server's share depends on s (and n only as a factor): one table per s
    table = {sv: busiest(profile, sv, costs, 1, bigarray_bound) for sv in space.servers}
    col = {k: np.array([table[sv][k] for sv in s]) for k in
           ("keys", "elements", "frames", "messages", "max_elements", "items", "all_frames")}
    devices = device_runs(space, bi, n)
    host = profile.host_time(b, store) if host_compute or not space.device_ms_at \
        else np.zeros(len(b))
    inputs = dict(workers=n, batch_size=b, host_s=host, elements=profile.params,
                  **placement_inputs(col), costs=costs, shared_host=shared_host,
                  bandwidth=bandwidth, colocated=colocated)
    seconds, parts = iteration_time(store=store, device_s=devices["mean"],
                                    device_max_s=devices["slowest"], **inputs)
    uneven = devices["uneven"]
    asp = uneven & (store == "dist_asp")
    seconds[asp] = uneven_asp_seconds(inputs, parts, devices, asp)
    bounded = (uneven & np.isin(store, BOUNDED_STALENESS)) | (store == "dist_psp")
    lead = np.array([lead_bound(v) for v in variants])[vi]
    seconds[bounded] = bound_seconds(inputs, parts, devices, bounded, store, lead, iterations)
    machines = np.where(colocated, np.maximum(n, s), n + s)
    fits = (machines <= space.machines) & devices["enough"]
    fits &= ~(colocated & (s > n))
    if space.memory_bytes:
        fits &= profile.memory_bytes(b) <= space.memory_bytes
    samples = n * b / seconds
    staleness = np.where(bounded, np.nan, closed_form_staleness(store, n))
    return {"workers": n, "servers": s, "batch_size": b, "store": store, "variant": vi,
            "variants": variants, "colocated": colocated, "machines": machines,
            "seconds": seconds, "samples_per_s": samples, "epoch_s": dataset_size / samples,
            "exact": ~bounded, "staleness": staleness, "fits": fits, "parts": parts,
            "dataset_size": dataset_size,
            "options": dict(shared_host=shared_host, host_compute=host_compute,
                            bigarray_bound=bigarray_bound, bandwidth=bandwidth,
                            horizon_iterations=iterations)}


class Simulations:
    """Configurations of a search run by the simulator on demand (:func:`.model.predict`, the
    real policy with the model's service times), each once."""

    def __init__(self, profile: ModelProfile, costs: Costs, space: Space, result: dict):
        self.profile, self.costs, self.space, self.result = profile, costs, space, result
        self.done: dict[int, object] = {}

    def __call__(self, i: int):
        """The :class:`.model.Prediction` of configuration ``i``."""
        if i not in self.done:
            r, options = self.result, dict(self.result["options"])
            n, b = int(r["workers"][i]), int(r["batch_size"][i])
            variant = r["variants"][int(r["variant"][i])]
            options["host_compute"] |= not self.space.device_ms_at   # as evaluate has it
            self.done[i] = predict(
                self.profile, self.costs, store=variant.store, workers=n,
                servers=int(r["servers"][i]), batch_size=b, device_s=self.space.devices(n, b),
                params=variant.params, colocated=bool(r["colocated"][i]),
                dataset_size=r["dataset_size"], **options)
        return self.done[i]


def applied_samples(prediction) -> float:
    """Samples per second whose gradients reach the weights: PSP's pushes dropped as late
    trained nothing, so they do not count."""
    run = prediction.run
    return prediction.samples_per_s * (1.0 - dropped_share(run))


def dropped_share(run) -> float:
    """The share of a simulated run's pushes dropped as late (PSP; 0 for the others): its
    dropped blocks over its pushes, one block each in the planner's simulations."""
    return run.dropped / max(run.total_iterations, 1)


class Frontier:
    """The configurations ``idx`` of a result, best first by exact samples/s (ties: fewer
    machines), those over ``max_staleness`` left out.

    Exact values come in order; a bounded configuration is simulated when its bound is the best
    left, and goes back in with its value.  So whatever is handed out is at least the best
    bound left, and nothing left can beat it: the order is exact while simulating only the
    configurations whose bounds reach the top.  A configuration whose staleness stays unknown
    is never handed out under a cap.
    """

    def __init__(self, result: dict, idx, simulate=None, max_staleness: float | None = None):
        self.result, self.simulate, self.max_staleness = result, simulate, max_staleness
        exact = result["exact"][idx]
        if max_staleness is not None:
            exact &= result["staleness"][idx] <= max_staleness
        self.exact = self._ordered(idx[exact])
        self.bounded = self._ordered(idx[~result["exact"][idx]])
        if self.bounded and simulate is None:
            raise ValueError("the ranking of configurations whose pace is the policy's "
                             "needs the simulator (simulate=Simulations(...))")
        self.simulated: list = []      # heap of (-samples/s, machines, index, prediction)

    def _ordered(self, idx) -> list[int]:
        r = self.result
        order = np.lexsort((idx, r["machines"][idx], -r["samples_per_s"][idx]))
        return idx[order].tolist()[::-1]          # popped from the end

    def _key(self, i: int) -> tuple:
        return (-float(self.result["samples_per_s"][i]), int(self.result["machines"][i]), i)

    def _heads(self) -> list[tuple]:
        heads = [(self._key(q[-1]), name) for name, q in (("exact", self.exact),
                                                         ("bounded", self.bounded)) if q]
        if self.simulated:
            heads.append((self.simulated[0][:3], "simulated"))
        return heads

    def best(self) -> float:
        """The most samples/s anything left may have (-inf when nothing is left)."""
        heads = self._heads()
        return -min(heads)[0][0] if heads else -np.inf

    def pop(self):
        """``(index, prediction)`` of the next configuration (the prediction is the
        simulator's, or None for a closed form), or None when none is left."""
        while True:
            heads = self._heads()
            if not heads:
                return None
            _, source = min(heads)
            if source == "exact":
                return self.exact.pop(), None
            if source == "simulated":
                return heapq.heappop(self.simulated)[2:]
            i = self.bounded.pop()
            p = self.simulate(i)
            stale = p.run.mean_staleness
            if self.max_staleness is None or (stale is not None and stale <= self.max_staleness):
                heapq.heappush(self.simulated, (-applied_samples(p), self._key(i)[1], i, p))


def rank(result: dict, top: int = 10, merge_stores: bool = False, simulate=None,
         max_staleness: float | None = None) -> list[dict]:
    """The ``top`` fitting configurations by exact samples/s (ties: fewer machines first),
    simulating bounded ones as :class:`Frontier` needs (``simulate``: a :class:`Simulations`);
    with ``max_staleness``, only those whose mean staleness is known and at most that.
    ``merge_stores``: variants predicted alike in pace and staleness for the same cluster and
    batch (ASP, SSP and DSSP on even devices) make one row, whose ``variants`` lists them all."""
    frontier = Frontier(result, np.flatnonzero(result["fits"]), simulate, max_staleness)
    rows, seen = [], {}
    while len(rows) < top or (merge_stores and rows
                              and frontier.best() >= rows[-1]["samples_per_s"]):
        hit = frontier.pop()
        if hit is None:
            break
        r = row(result, *hit)
        key = (r["workers"], r["servers"], r["batch_size"], r["colocated"],
               round(r["seconds_per_iteration"], 12),
               None if r["staleness"] is None else round(r["staleness"], 9))
        if merge_stores and key in seen:
            seen[key]["variants"].append(r["variants"][0])
        elif len(rows) < top:
            seen[key] = r
            rows.append(r)
    for r in rows:
        variants = [Variant(v["store"], v["params"]) for v in r["variants"]]
        r["stores"] = list(dict.fromkeys(v.store for v in variants))
        r["label"] = merged_label(variants, result["variants"])
    return rows


def row(result: dict, i: int, prediction=None) -> dict:
    """Configuration ``i`` as a dict: the closed form's values, or the simulator's
    ``prediction`` (with its staleness, and the share of pushes PSP dropped, which
    ``samples_per_s`` leaves out)."""
    variant = result["variants"][int(result["variant"][i])]
    out = {"index": int(i), "workers": int(result["workers"][i]),
           "servers": int(result["servers"][i]), "batch_size": int(result["batch_size"][i]),
           "store": variant.store, "params": variant.params, "variants": [variant.to_dict()],
           "colocated": bool(result["colocated"][i]), "machines": int(result["machines"][i]),
           "seconds_per_iteration": float(result["seconds"][i]),
           "samples_per_s": float(result["samples_per_s"][i]),
           "epoch_s": float(result["epoch_s"][i]), "bottleneck": bottleneck(result["parts"], i),
           "staleness": float(result["staleness"][i]), "dropped": 0.0,
           "method": "closed form"}
    if prediction is not None:
        samples = applied_samples(prediction)
        out.update(seconds_per_iteration=prediction.seconds, samples_per_s=samples,
                   epoch_s=result["dataset_size"] / samples,
                   staleness=prediction.run.mean_staleness, method=prediction.method,
                   dropped=dropped_share(prediction.run))
    return out


def knee_of(curve: dict, gain: float = KNEE_GAIN) -> int:
    """The first worker count after which the next one (m workers more) adds less than m x
    ``gain`` of the throughput; the last if none (``curve``: workers -> samples/s)."""
    ns = sorted(curve)
    for a, nxt in zip(ns, ns[1:]):
        if curve[nxt] < curve[a] * (1 + gain * (nxt - a)):
            return a
    return ns[-1]


def knees(result: dict, gain: float = KNEE_GAIN, simulate=None) -> dict:
    """Per store: the best exact samples/s at each worker count (over everything else that
    fits: :class:`Frontier`'s first), and its knee (:func:`knee_of`).  Throughput's alone: a
    staleness cap would have every bounded configuration simulated only to learn that it is
    over the cap."""
    out = {}
    for store in np.unique(result["store"]):
        mask = result["fits"] & (result["store"] == store)
        curve = {}
        for n in np.unique(result["workers"][mask]):
            idx = np.flatnonzero(mask & (result["workers"] == n))
            hit = Frontier(result, idx, simulate).pop()
            if hit is not None:
                curve[int(n)] = row(result, *hit)["samples_per_s"]
        if curve:
            out[str(store)] = {"curve": curve, "knee": knee_of(curve, gain)}
    return out


def known_samples(result: dict, simulations: Simulations | None = None) -> np.ndarray:
    """Samples/s of every configuration where it is known: the closed form's, the simulated
    ones', NaN for the bounds not simulated."""
    samples = np.where(result["exact"], result["samples_per_s"], np.nan)
    for i, p in (simulations.done.items() if simulations else ()):
        samples[i] = applied_samples(p)
    return samples


def recheck(profile: ModelProfile, costs: Costs, rows: list[dict], space: Space, *,
            shared_host: bool = False, host_compute: bool = False, bandwidth=None,
            iterations: int = 300) -> list[dict]:
    """Each closed-form row re-run by the simulator (the store's real policy, service times
    from the model); ``simulated_s`` and its difference from the closed form (0 for a row
    the simulator already gave)."""
    out = []
    for r in rows:
        if r["method"] == "simulator":
            out.append({**r, "simulated_s": r["seconds_per_iteration"],
                        "simulator_vs_model": 0.0})
            continue
        devices = space.devices(r["workers"], r["batch_size"])
        p = predict(profile, costs, store=r["store"], workers=r["workers"], servers=r["servers"],
                    batch_size=r["batch_size"], device_s=devices, shared_host=shared_host,
                    host_compute=host_compute, colocated=r["colocated"], bandwidth=bandwidth)
        host = float(profile.host_time(r["batch_size"], r["store"])) \
            if host_compute or not any(devices) else 0.0
        push_s, apply_s = server_service(costs, busiest(profile, r["servers"], costs,
                                                        r["workers"]),
                                         costs.idle_at(p.parts["compute"]))
        sim = simulated_time(r["store"], r["params"], devices, host,
                             p.parts["worker CPU"] + p.parts["worker link"], push_s, apply_s,
                             r["workers"], iterations, 0, costs, shared_host)
        out.append({**r, "simulated_s": sim,
                    "simulator_vs_model": sim / r["seconds_per_iteration"] - 1.0})
    return out
