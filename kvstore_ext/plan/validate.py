"""Predicted against measured: a grid of real jobs on this machine (``plan validate``).

Each case is a real job started by launch.py (scheduler, servers, workers on 127.0.0.1) whose
workers do what stock ``gluon.Trainer`` does, with emulated devices (:mod:`.jobs`).  LeNet's
workers compute real gradients on MNIST; cifar_resnet20_v1's push its real shapes and let
the device time stand for the compute (a ResNet-20 step on this host's CPU would be the
device, not an emulation of one).  Trials are interleaved case by case, so drift hits every
case alike; each case's figure is the median of its trials.  The model's prediction of the
same case comes from the calibration, on this machine's terms: every process on one host of
its cores.  After the grid, ``dist_ssgd`` against ``dist_dcs3gd`` on 2 Horovod workers
(:mod:`.dcs3gd_jobs`) is judged by the ratio of their times per iteration (:func:`dcs3gd_rows`).

A calibration is a snapshot of a host that may not hold its speed for the hour the grid
takes, so before every trial and after the last, a short probe (:func:`probe_host`) measures
what the calibration measured of it; the figures are given as predicted from the calibration,
and again for the host as the probes found it (:func:`host_drift`, :func:`adjusted`).
"""
from __future__ import annotations

import itertools
import os
import statistics
import time
from dataclasses import dataclass

import numpy as np

from .model import Costs, ModelProfile, predict
from .search import knee_of
from .timing import trimmed_mean

GRID_CLUSTERS = ((1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (8, 2))


@dataclass(frozen=True)
class Case:
    model: str
    workers: int
    servers: int
    store: str
    device: str            # launch.py --device: "150ms" for all, or one per worker
    compute: bool          # the host computes real gradients
    batch_size: int = 64

    @property
    def label(self) -> str:
        return (f"{self.model} {self.workers}x{self.servers} {self.store} {self.device}"
                + ("" if self.compute else " (device only)"))

    def device_seconds(self) -> list[float]:
        from ..devices import parse_devices
        return parse_devices(self.device, self.workers, None, self.batch_size)


def grid(models=("lenet", "cifar_resnet20_v1"), clusters=GRID_CLUSTERS,
         stores=("dist_bsp", "dist_asp"), devices=("60ms", "150ms"), mixed=True) -> list[Case]:
    """The validation grid, and the mixed-speed pair (one device 2.5x slower than the other)."""
    cases = [Case(m, n, s, st, d, m == "lenet")
             for m, (n, s), st, d in itertools.product(models, clusters, stores, devices)]
    if mixed:
        cases += [Case("lenet", 2, 1, st, "100ms,250ms", True) for st in stores]
    return cases


def predicted(case: Case, profile: ModelProfile, costs: Costs) -> float:
    return predict(profile, costs, store=case.store, workers=case.workers,
                   servers=case.servers, batch_size=case.batch_size,
                   device_s=case.device_seconds(), shared_host=True,
                   host_compute=case.compute).seconds


def run(cases: list[Case], trials: int, rounds: int, warmup: int, progress=None,
        between=None) -> dict:
    """Seconds per iteration of every case in every trial, trials interleaved; ``between()``
    is called before every trial and after the last (the host probe, :func:`probe_host`)."""
    from .jobs import run_job, seconds_per_iteration
    measured = {c: [] for c in cases}
    for _ in range(trials):
        if between:
            between()
        for c in cases:
            results = run_job(c.store, c.model, c.workers, c.servers, compute=c.compute,
                              device=c.device, rounds=rounds, warmup=warmup,
                              batch_size=c.batch_size)
            measured[c].append(seconds_per_iteration(results, c.store))
            if progress:
                progress(c)
    if between:
        between()
    return measured


# -- the host's speed during the jobs against the calibration's --------------------------------

#: the probe's compute: LeNet's forward and backward at batch 64, as ``calibrate`` times it
PROBE_MODEL, PROBE_BATCH = "lenet", 64
#: a host this much slower or faster than at calibration is worth a warning
DRIFT_WARNING = 0.10


def probe_host(repeats: int = 3, rounds: int = 30) -> dict:
    """This host's speed now, measured as ``calibrate`` measures the same quantities: one
    LeNet forward and backward pass at batch 64 (each in a process of its own), and a worker's
    and a server's CPU per round of 1 x 1 ``dist_bsp`` jobs of LeNet's shapes; ``repeats`` of
    each, taken in turn, summarised by the mean without the highest and lowest.

    A calibration is a snapshot: on a shared machine the same job ran 15-25% slower an hour
    after one (docs/planner.md), and every prediction moved with it.  Probing before each
    trial of the grid tells the host's drift apart from the model's error."""
    from .jobs import round_cpu, run_job, run_layer_times
    compute, jobs = [], []
    for _ in range(repeats):
        compute.append(run_layer_times(PROBE_MODEL, PROBE_BATCH, 2)["whole"])
        jobs.append(run_job("dist_bsp", PROBE_MODEL, 1, 1, compute=False, rounds=rounds)[0])
    return {"when": time.strftime("%Y-%m-%d %H:%M:%S"),
            "compute_s": trimmed_mean(compute, drop=1), **round_cpu(jobs)}


def probe_reference(calibration: dict) -> dict:
    """The probe's quantities as the calibration measured them (its compute at batch 64, its
    runtime job of LeNet's shapes)."""
    compute = calibration.get("compute", {}).get(PROBE_MODEL)
    if compute is None:
        raise ValueError(f"the calibration has no compute of {PROBE_MODEL!r} to compare the host "
                         f"probe with; calibrate with --models including {PROBE_MODEL}")
    if PROBE_BATCH in compute["batch_sizes"]:
        seconds = compute["seconds"][compute["batch_sizes"].index(PROBE_BATCH)]
    else:
        seconds = compute["fit"]["fixed"] + compute["fit"]["per_sample"] * PROBE_BATCH
    jobs = [r for r in calibration.get("runtime", {}).get("jobs", []) if r["set"] == PROBE_MODEL]
    if not jobs:
        raise ValueError(f"the calibration has no runtime job of {PROBE_MODEL!r}'s shapes to "
                         f"compare the host probe with; run 'plan calibrate' again")
    return {"compute_s": seconds, "worker_cpu_s": jobs[0]["worker_cpu_s"],
            "server_cpu_s": jobs[0]["server_cpu_s"]}


def host_drift(probes: list[dict], reference: dict) -> dict:
    """How many times as slow the host ran during the jobs as at calibration (above 1: slower),
    the median over the probes: ``compute`` for the network's forward and backward, ``runtime``
    for a worker's and a server's CPU together (it scales every CPU coefficient)."""
    def ratio(of):
        return statistics.median(of(p) for p in probes) / of(reference)
    return {"compute": ratio(lambda p: p["compute_s"]),
            "runtime": ratio(lambda p: p["worker_cpu_s"] + p["server_cpu_s"]),
            "probes": list(probes), "reference": dict(reference)}


def drift_warning(drift: dict) -> str | None:
    """One line for a user whose host moved by more than :data:`DRIFT_WARNING` since the
    calibration, or None."""
    moved = {k: drift[k] for k in ("compute", "runtime") if abs(drift[k] - 1) > DRIFT_WARNING}
    if not moved:
        return None
    said = ", ".join(f"{k} {abs(v - 1):.0%} {'slower' if v > 1 else 'faster'}"
                     for k, v in moved.items())
    return (f"the host ran {said} during the jobs than at calibration: predictions from the "
            f"calibration are off by about as much ('plan calibrate' again to plan on this host "
            f"as it is now)")


def adjusted(rows: list[dict]) -> list[dict]:
    """The rows with the predictions made for the host as the probes found it (the
    ``adjusted_*`` fields :func:`table_rows` adds), for :func:`summarise`."""
    return [{**r, "predicted_s": r["adjusted_predicted_s"], "error": r["adjusted_error"],
             "predicted_samples_per_s": r["adjusted_predicted_samples_per_s"]} for r in rows]


def kendall_tau(a, b) -> float:
    """Kendall's tau-b of two sequences (ties counted as neither concordant nor discordant)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    conc = disc = ties_a = ties_b = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            da, db = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
            if da == 0 and db == 0:
                continue
            if da == 0:
                ties_a += 1
            elif db == 0:
                ties_b += 1
            elif da == db:
                conc += 1
            else:
                disc += 1
    denom = np.sqrt((conc + disc + ties_a) * (conc + disc + ties_b))
    return float((conc - disc) / denom) if denom else 1.0


def summarise(rows: list[dict]) -> dict:
    """The figures: error of predicted time per iteration, ranking, the pick and the knee."""
    errors = [abs(r["error"]) for r in rows]
    out = {"cases": len(rows), "median_abs_error": statistics.median(errors),
           "max_abs_error": max(errors), "over_25pct": sum(e > 0.25 for e in errors),
           "groups": []}
    groups = {}
    for r in rows:
        if "," in r["device"]:
            continue     # the mixed pair is judged by its error only
        groups.setdefault((r["model"], r["device"]), []).append(r)
    taus = []
    for (model, device), rs in sorted(groups.items()):
        tau = kendall_tau([r["predicted_samples_per_s"] for r in rs],
                          [r["measured_samples_per_s"] for r in rs])
        taus.append(tau)
        pick = max(rs, key=lambda r: r["predicted_samples_per_s"])
        best = max(rs, key=lambda r: r["measured_samples_per_s"])
        knees = {}
        for store in sorted({r["store"] for r in rs}):
            pred, meas = {}, {}
            for r in rs:
                if r["store"] == store:
                    pred[r["workers"]] = max(pred.get(r["workers"], 0), r["predicted_samples_per_s"])
                    meas[r["workers"]] = max(meas.get(r["workers"], 0), r["measured_samples_per_s"])
            kp, km = knee_of(pred), knee_of(meas)
            ns = sorted(pred)
            knees[store] = {"predicted": kp, "measured": km,
                            "within_one_step": abs(ns.index(kp) - ns.index(km)) <= 1}
        out["groups"].append({
            "model": model, "device": device, "kendall_tau": tau,
            "pick": pick["label"], "best": best["label"],
            "pick_vs_best": pick["measured_samples_per_s"] / best["measured_samples_per_s"],
            "knees": knees})
    out["kendall_tau_min"] = min(taus) if taus else None
    out["kendall_tau_all"] = kendall_tau([r["predicted_samples_per_s"] for r in rows],
                                         [r["measured_samples_per_s"] for r in rows])
    return out


def table_rows(cases, measured, calibration: dict, drift: dict | None = None) -> list[dict]:
    """Each case predicted against its median measurement; with ``drift`` (:func:`host_drift`)
    also predicted for the host as the probes found it (``adjusted_*``)."""
    costs = Costs.from_calibration(calibration)
    drifted = costs.scaled(drift["runtime"]) if drift else None
    rows = []
    for c in cases:
        profile = ModelProfile.from_calibration(calibration, c.model)
        pred = predicted(c, profile, costs)
        meas = statistics.median(measured[c])
        samples = c.workers * c.batch_size
        row = {"label": c.label, "model": c.model, "workers": c.workers,
               "servers": c.servers, "store": c.store, "device": c.device,
               "host_compute": c.compute, "predicted_s": pred, "measured_s": meas,
               "predicted_ms": pred * 1e3, "measured_ms": meas * 1e3,
               "trials_s": measured[c], "error": pred / meas - 1.0,
               "predicted_samples_per_s": samples / pred,
               "measured_samples_per_s": samples / meas}
        if drift:
            at_drift = predicted(c, profile.scaled(drift["compute"]), drifted)
            row.update(adjusted_predicted_s=at_drift, adjusted_predicted_ms=at_drift * 1e3,
                       adjusted_error=at_drift / meas - 1.0,
                       adjusted_predicted_samples_per_s=samples / at_drift)
        rows.append(row)
    return rows


def save_figure(fig, out_dir: str, name: str) -> str:
    """Write ``fig`` as ``out_dir/name`` (PNG, 120 dpi), close it, and return the path."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot(rows: list[dict], out_dir: str) -> list[str]:
    """predicted-vs-measured.png (with the +-25% band) and throughput-vs-workers.png."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    paths = []
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for model, marker in (("lenet", "o"), ("cifar_resnet20_v1", "s")):
        for store, color in (("dist_bsp", "tab:blue"), ("dist_asp", "tab:orange")):
            rs = [r for r in rows if r["model"] == model and r["store"] == store]
            if rs:
                ax.scatter([r["measured_s"] * 1e3 for r in rs], [r["predicted_s"] * 1e3 for r in rs],
                           marker=marker, color=color, label=f"{model} {store}", s=22)
    top = max(max(r["measured_s"], r["predicted_s"]) for r in rows) * 1e3 * 1.1
    xs = np.linspace(0, top, 50)
    ax.plot(xs, xs, "k-", lw=0.8)
    ax.fill_between(xs, xs * 0.75, xs * 1.25, color="grey", alpha=0.2, label="±25%")
    ax.set_xlabel("measured ms per iteration (median of trials)")
    ax.set_ylabel("predicted ms per iteration")
    ax.legend(fontsize=7)
    ax.set_title("kvstore_ext.plan: predicted against measured")
    paths.append(save_figure(fig, out_dir, "predicted_vs_measured.png"))

    groups = sorted({(r["model"], r["device"]) for r in rows if "," not in r["device"]})
    fig, axes = plt.subplots(1, len(groups), figsize=(4 * len(groups), 3.6), squeeze=False)
    for ax, (model, device) in zip(axes[0], groups):
        for store, color in (("dist_bsp", "tab:blue"), ("dist_asp", "tab:orange")):
            for key, style in (("measured_samples_per_s", "-o"), ("predicted_samples_per_s", "--x")):
                curve = {}
                for r in rows:
                    if (r["model"], r["device"], r["store"]) == (model, device, store):
                        curve[r["workers"]] = max(curve.get(r["workers"], 0), r[key])
                if curve:
                    ns = sorted(curve)
                    ax.plot(ns, [curve[n] for n in ns], style, color=color,
                            label=f"{store} {key.split('_')[0]}")
                    if key.startswith("measured"):
                        k = knee_of(curve)
                        ax.axvline(k, color=color, lw=0.6, ls=":")
        ax.set_title(f"{model}, {device}", fontsize=9)
        ax.set_xlabel("workers (best servers)")
        ax.set_ylabel("samples/s")
        ax.legend(fontsize=6)
    paths.append(save_figure(fig, out_dir, "throughput_vs_workers.png"))
    return paths


# -- DC-S3GD against SSGD: the two regimes of :mod:`.dcs3gd_jobs` -----------------------------

DCS3GD_REGIMES = (("negligible_comm", "communication negligible"),
                  ("comm_equals_compute", "communication = computation"))
#: the largest error accepted in a predicted SSGD / DC-S3GD ratio
DCS3GD_RATIO_BOUND = 0.10


def dcs3gd_rows(bench: dict, calibration: dict, overlap: float = 1.0) -> list[dict]:
    """Predicted against measured for a :func:`.dcs3gd_jobs.measure` result (also the
    ``dcs3gd.json`` of ``bench_dcs3gd.py``): each regime's step time of ``dist_ssgd`` and
    ``dist_dcs3gd`` (2 Horovod workers, LeNet on the host, the bench's device time held between
    its forward and backward pass, its injected wire time in the allreduce), and each regime's
    SSGD / DC-S3GD ratio.

    The model's ``overlap`` is the share of the allreduce DC-S3GD can hide behind the next
    step's compute: 1.0 is what the algorithm allows; the bench's measured overlap is beside it.
    """
    costs = Costs.from_calibration(calibration)
    profile = ModelProfile.from_calibration(calibration, "lenet")
    args = bench["args"]
    batch, device = int(args["batch_size"]), float(args.get("device_s") or 0.0)
    rows = []
    for regime, title in DCS3GD_REGIMES:
        wire = float(bench["injected_comm_s"]) if regime == "comm_equals_compute" else 0.0
        got = {}
        for store in ("dist_ssgd", "dist_dcs3gd"):
            host = float(profile.host_time(batch, store))
            # the device holds the step between the host's forward and backward: they add up
            pred = predict(profile, costs, store=store, workers=2, batch_size=batch,
                           device_s=host + device if device else 0.0, overlap=overlap,
                           wire_s=wire).seconds
            meas = float(bench[regime][store]["step_time_s"])
            got[store] = (pred, meas)
            rows.append({"label": f"{store}, {title}", "regime": regime, "store": store,
                         "device_ms": device * 1e3, "wire_ms": wire * 1e3,
                         "predicted_ms": pred * 1e3, "measured_ms": meas * 1e3,
                         "predicted_ratio": None, "measured_ratio": None,
                         "error": pred / meas - 1.0,
                         "measured_overlap": bench[regime][store].get("overlap")})
        (ps, ms), (pd, md) = got["dist_ssgd"], got["dist_dcs3gd"]
        rows.append({"label": f"SSGD / DC-S3GD, {title}", "regime": regime, "store": "ratio",
                     "device_ms": device * 1e3, "wire_ms": wire * 1e3,
                     "predicted_ms": None, "measured_ms": None,
                     "predicted_ratio": ps / pd, "measured_ratio": ms / md,
                     "error": (ps / pd) / (ms / md) - 1.0,
                     "measured_overlap": bench[regime]["dist_dcs3gd"].get("overlap")})
    return rows


def worst_ratio_error(rows: list[dict]) -> float:
    """The largest |error| of the predicted SSGD / DC-S3GD ratios among :func:`dcs3gd_rows`'."""
    return max(abs(r["error"]) for r in rows if r["store"] == "ratio")
