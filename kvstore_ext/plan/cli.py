"""``python -m kvstore_ext.plan {calibrate,predict,search,validate}`` (also ``scripts/plan.py``)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .validate import GRID_CLUSTERS

DEFAULT_CALIBRATION = os.path.join("results", "plan", "calibration.json")
STORES = ("dist_bsp", "dist_asp", "dist_ssp", "dist_dssp", "dist_psp", "dist_ssgd", "dist_dcs3gd")


def _calibration(path: str) -> dict:
    from .calibrate import load
    if not os.path.exists(path):
        raise SystemExit(f"no calibration at {path}: run 'python -m kvstore_ext.plan calibrate "
                         f"--out {path}' first (about 10 minutes)")
    return load(path)


def _device_seconds(text: str, workers: int, model: str, batch: int,
                    device_batch: int = 64) -> list[float]:
    """Seconds per iteration of each worker's device at ``batch``: a time given in ms is for
    ``device_batch`` samples, and a device's time grows with its batch (as profiles do)."""
    from ..devices import MODELS, parse_devices
    if not text:
        return [0.0] * workers
    try:
        at = parse_devices(text, workers, model if model in MODELS else None, device_batch)
    except ValueError as exc:
        raise SystemExit(f"--device {text!r}: {exc}")
    return [t * batch / device_batch for t in at]


def _profile(data: dict, model: str):
    from .model import ModelProfile
    try:
        return ModelProfile.from_calibration(data, model)
    except ValueError as exc:
        raise SystemExit(str(exc))


def _params(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--kv-param {item!r} must be NAME=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def cmd_calibrate(args) -> int:
    from tqdm import tqdm
    from .calibrate import calibrate, calibration_steps, repeatability
    models = tuple(m for m in args.models.split(",") if m)
    bar = tqdm(total=len(calibration_steps(models, quick=args.quick)), desc="calibrate",
               disable=None)
    begun = []

    def step(name):         # called as each measurement begins
        if begun:
            bar.update(1)
        begun.append(name)
        bar.set_postfix_str(name)
    paths = [args.out] + ([args.repeat_out] if args.repeat_out else [])
    data = calibrate(models, tuple(int(k) for k in args.interference.split(",")), step,
                     quick=args.quick, runs=len(paths))
    bar.update(1)
    bar.close()
    runs = data if isinstance(data, list) else [data]
    for path, run in zip(paths, runs):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        run["command"] = " ".join(sys.argv)
        with open(path, "w") as f:
            json.dump(run, f, indent=1)
        print(f"wrote {path}")
    for row in runs[0]["fits"]:
        print(f"  R^2 {row['r2']:.4f}  {row['fit']}{'  (minor)' if row['minor'] else ''}")
    for k, v in runs[0]["coefficients"].items():
        print(f"  {k} = {v}")
    if len(runs) > 1:
        print(f"the two calibrations, measured unit by unit in turn ({paths[0]}, {paths[1]}):")
        _print_differences(repeatability(*runs), args.tolerance)
    return 0


def _model_inputs(args):
    """``(profile, costs, options)`` that predict and search read alike: the calibration's
    model and costs, and the host, network and compute options of the command line."""
    from .model import Costs
    data = _calibration(args.calibration)
    options = {"shared_host": not args.cluster,
               "host_compute": not (args.cluster and args.device),
               "bandwidth": args.bandwidth_gbps * 1e9 / 8 if args.bandwidth_gbps else None}
    return _profile(data, args.model), Costs.from_calibration(data), options


def cmd_predict(args) -> int:
    from .model import predict
    profile, costs, options = _model_inputs(args)
    devices = _device_seconds(args.device, args.workers, args.model, args.batch_size,
                              args.device_batch)
    try:
        p = predict(profile, costs, store=args.store, workers=args.workers, servers=args.servers,
                    batch_size=args.batch_size, device_s=devices,
                    bigarray_bound=args.bigarray_bound, dataset_size=args.dataset_size,
                    params=_params(args.kv_param), colocated=args.colocate,
                    wire_s=args.wire_ms / 1e3, **options)
    except ValueError as exc:
        raise SystemExit(f"predict: {exc}")
    out = {"model": args.model, "store": args.store, "workers": args.workers,
           "servers": args.servers, "batch_size": args.batch_size, **p.to_dict()}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{args.model} {args.workers}x{args.servers} {args.store} batch {args.batch_size}: "
              f"{p.seconds * 1e3:.1f} ms per iteration, {p.samples_per_s:.0f} samples/s, "
              f"epoch {p.epoch_s:.1f} s ({p.method}); bottleneck: {p.bottleneck}")
        for k, v in p.parts.items():
            print(f"  {k:<13} {v * 1e3:8.2f} ms")
    return 0


def cmd_search(args) -> int:
    from ..devices import count_devices
    from .search import Simulations, Space, evaluate, knees, known_samples, rank, recheck
    profile, costs, options = _model_inputs(args)
    if args.cores:
        costs.cores = args.cores
    batches = tuple(int(b) for b in args.batch_sizes.split(","))
    try:
        pool = count_devices(args.device) if args.device else 1
    except ValueError:
        pool = 1                     # _device_seconds names the mistake

    def device_at(batch):
        """One device for every worker, or the pool's machines (n workers take the n fastest)."""
        times = _device_seconds(args.device, pool, args.model, batch, args.device_batch)
        return tuple(times) if pool > 1 else times[0]
    space = Space(workers=tuple(range(1, (min(args.max_workers, pool) if pool > 1
                                          else args.max_workers) + 1)),
                  servers=tuple(int(s) for s in args.servers.split(",")), batch_sizes=batches,
                  stores=args.stores,
                  colocate=(False, True) if args.colocate == "both" else (args.colocate == "yes",),
                  machines=args.machines,
                  memory_bytes=args.memory_gb * 2 ** 30 if args.memory_gb else None,
                  device_ms_at={b: device_at(b) for b in batches} if args.device else {},
                  params={"dist_ssp": args.staleness, "dist_dssp": args.dssp_bounds,
                          "dist_psp": args.psp})
    t0 = time.perf_counter()
    result = evaluate(profile, costs, space, dataset_size=args.dataset_size, **options)
    seconds = time.perf_counter() - t0
    simulations = Simulations(profile, costs, space, result)
    top = rank(result, args.top, merge_stores=True, simulate=simulations,
               max_staleness=args.max_staleness)
    knee = knees(result, simulate=simulations)
    checked = recheck(profile, costs, top, space, **options)
    bounded = int((result["fits"] & ~result["exact"]).sum())
    print(f"{space.size():,} configurations evaluated in {seconds:.2f} s, "
          f"{int(result['fits'].sum()):,} within {args.machines} machines"
          + (f" and {args.memory_gb} GiB" if args.memory_gb else ""))
    if bounded:
        print(f"{bounded:,} paced by the policy (bounded, then simulated best bound first): "
              f"{len(simulations.done):,} simulated for an exact top {args.top} and knees")
    if args.max_staleness is not None:
        print(f"ranked: mean staleness <= {args.max_staleness:g} only")
    width = max([26] + [len(r["label"]) for r in checked])
    print(f"{'#':>2} {'store':<{width}} {'n':>4} {'s':>3} {'servers on':<10} {'batch':>5} "
          f"{'ms/iter':>8} {'samples/s':>10} {'epoch s':>8} {'stale':>6} {'drop':>5} {'sim':>6}  "
          f"bottleneck")
    for i, r in enumerate(checked, 1):
        stale = "-" if r["staleness"] is None else f"{r['staleness']:.1f}"
        sim = "(sim)" if r["method"] == "simulator" else f"{r['simulator_vs_model']:+.1%}"
        print(f"{i:>2} {r['label']:<{width}} {r['workers']:>4} {r['servers']:>3} "
              f"{'workers' if r['colocated'] else 'own hosts':<10} {r['batch_size']:>5} "
              f"{r['seconds_per_iteration'] * 1e3:>8.1f} {r['samples_per_s']:>10.0f} "
              f"{r['epoch_s']:>8.1f} {stale:>6} {r['dropped']:>5.0%} {sim:>6}  {r['bottleneck']}")
    for store, k in knee.items():
        print(f"knee of {store}: {k['knee']} workers (one more adds < 5% samples/s)")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "search.json"), "w") as f:
            json.dump({"command": " ".join(sys.argv), "seconds": seconds, "top": checked,
                       "knees": knee, "evaluated": space.size(), "bounded": bounded,
                       "simulated": len(simulations.done),
                       "max_staleness": args.max_staleness}, f, indent=1)
        for path in plot_search(result, knee, checked, args.out,
                                known_samples(result, simulations)):
            print(f"wrote {path}")
    return 0


def plot_search(result: dict, knee: dict, top: list[dict], out_dir: str,
                samples=None) -> list[str]:
    """throughput against n per store with the knee, an n x s heat map of the best store, and
    the time breakdown of the top configurations; ``samples``: each configuration's samples/s
    where known (NaN for a bound not simulated; default the result's)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from .model import BOTTLENECKS
    from .validate import save_figure
    paths = []
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for store, k in knee.items():
        ns = sorted(k["curve"])
        line, = ax.plot(ns, [k["curve"][n] for n in ns], label=store)
        ax.axvline(k["knee"], color=line.get_color(), ls=":", lw=0.8)
    ax.set_xlabel("workers")
    ax.set_ylabel("samples/s (best servers, batch)")
    ax.legend(fontsize=7)
    paths.append(save_figure(fig, out_dir, "search_throughput.png"))

    samples = result["samples_per_s"] if samples is None else samples
    ns, ss = np.unique(result["workers"]), np.unique(result["servers"])
    heat = np.full((len(ss), len(ns)), np.nan)
    for i, s in enumerate(ss):
        for j, n in enumerate(ns):
            m = (result["fits"] & (result["workers"] == n) & (result["servers"] == s)
                 & ~np.isnan(samples))
            if m.any():
                heat[i, j] = samples[m].max()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    im = ax.imshow(heat, aspect="auto", origin="lower", cmap="viridis")
    ax.set_xticks(range(0, len(ns), max(1, len(ns) // 8)))
    ax.set_xticklabels([str(ns[i]) for i in range(0, len(ns), max(1, len(ns) // 8))])
    ax.set_yticks(range(len(ss)))
    ax.set_yticklabels([str(s) for s in ss])
    ax.set_xlabel("workers")
    ax.set_ylabel("servers")
    fig.colorbar(im, label="samples/s")
    paths.append(save_figure(fig, out_dir, "search_heatmap.png"))

    fig, ax = plt.subplots(figsize=(6, 3.4))
    labels = [f"{r['label']} {r['workers']}x{r['servers']} b{r['batch_size']}" for r in top]
    bottom = np.zeros(len(top))
    idx = [r["index"] for r in top]
    for name in BOTTLENECKS:
        vals = np.array([result["parts"][name][i] * 1e3 for i in idx])
        ax.bar(range(len(top)), vals, bottom=bottom, label=name)
        bottom += vals
    ax.set_xticks(range(len(top)))
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=6)
    ax.set_ylabel("ms per iteration")
    ax.legend(fontsize=6)
    paths.append(save_figure(fig, out_dir, "search_breakdown.png"))
    return paths


def cmd_compare(args) -> int:
    """Two calibrations side by side: each coefficient's relative difference (repeatability)."""
    from .calibrate import refit, repeatability
    a, b = _calibration(args.first), _calibration(args.second)
    if args.refit:
        a, b = refit(a), refit(b)
    worst = _print_differences(repeatability(a, b), args.tolerance)
    return 0 if worst <= args.tolerance else 1


def _print_differences(rows, tolerance: float) -> float:
    """Each coefficient of two calibrations and their difference; returns the largest."""
    worst = 0.0
    for r in rows:
        flag = "" if r["difference"] <= tolerance else f"  over {tolerance:.0%}"
        worst = max(worst, r["difference"])
        print(f"  {r['coefficient']:<16} {r['first']:>12.4g} {r['second']:>12.4g} "
              f"{r['difference']:>7.1%}{flag}")
    print(f"largest difference {worst:.1%} (tolerance {tolerance:.0%})")
    return worst


def cmd_validate(args) -> int:
    import importlib.util
    from tqdm import tqdm
    from . import validate as v
    from .calibrate import calibrate
    from .dcs3gd_jobs import Setting, load_measured, measure, save_measured
    settings = [] if args.no_dcs3gd or args.measured else [
        Setting.for_device(float(d), args.trials, args.dcs3gd_steps, args.dcs3gd_warmup)
        for d in args.dcs3gd_device_s.split(",")]
    if settings and importlib.util.find_spec("horovod") is None:   # say so before any job
        raise SystemExit("validate: the DC-S3GD jobs need horovod (make setup installs it); "
                         "--no-dcs3gd leaves them out")
    if args.calibrate or not os.path.exists(args.calibration):
        print(f"calibrating into {args.calibration} first")
        data = calibrate()
        os.makedirs(os.path.dirname(os.path.abspath(args.calibration)), exist_ok=True)
        with open(args.calibration, "w") as f:
            json.dump(data, f, indent=1)
    data = _calibration(args.calibration)
    if args.measured:      # score earlier measurements against this calibration
        with open(args.measured) as f:
            earlier = json.load(f)["rows"]
        cases = [v.Case(r["model"], r["workers"], r["servers"], r["store"], r["device"],
                        r["host_compute"]) for r in earlier]
        measured = {c: r["trials_s"] for c, r in zip(cases, earlier)}
        kept = [] if args.no_dcs3gd else load_measured(args.measured)
        probes = load_probes(os.path.dirname(os.path.abspath(args.measured)))
        return report(v, cases, measured, data, args, kept, probes)
    cases = v.grid(models=tuple(args.models.split(",")),
                   clusters=tuple(tuple(int(x) for x in c.split("x")) for c in args.clusters.split(",")),
                   stores=tuple(args.stores.split(",")), devices=tuple(args.devices.split(",")),
                   mixed=not args.no_mixed)
    if args.max_cases:
        cases = cases[:args.max_cases]
    jobs = len(cases) * args.trials + sum(s.jobs() for s in settings)
    probes, probing = [], not args.no_host_probe
    if probing:       # before any job: a calibration the probe cannot be held against
        if args.host_probe_repeats < 1:
            raise SystemExit("validate: --host-probe-repeats must be at least 1 "
                             "(--no-host-probe leaves the probes out)")
        try:
            v.probe_reference(data)
        except ValueError as e:
            print(f"validate: no host probes: {e}", file=sys.stderr)
            probing = False
    stale = os.path.join(args.out, PROBES_FILE)
    if os.path.exists(stale):    # an earlier run's: --measured must not pair it with these jobs
        os.remove(stale)
    with tqdm(total=jobs, desc="validate", disable=None) as bar:
        def probe():
            bar.set_postfix_str("probing the host")
            probes.append(v.probe_host(args.host_probe_repeats))
            bar.set_postfix_str("")
        measured = v.run(cases, args.trials, args.rounds, args.warmup,
                         progress=lambda c: bar.update(1),
                         between=probe if probing else None)
        dcs3gd = [(s.label, measure(s, on_job=lambda: bar.update(1))) for s in settings]
    if dcs3gd:
        save_measured(args.out, dcs3gd)
    if probes:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, PROBES_FILE), "w") as f:
            json.dump({"probes": probes}, f, indent=1)
    return report(v, cases, measured, data, args, dcs3gd, probes)


#: validate's host probes, kept beside validate.json (``--measured`` reads them again)
PROBES_FILE = "host_probes.json"


def load_probes(folder: str) -> list:
    path = os.path.join(folder, PROBES_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)["probes"]


def cmd_validate_dcs3gd(args) -> int:
    """SSGD / DC-S3GD as predicted against bench_dcs3gd.py's measurement of it."""
    from . import validate as v
    data = _calibration(args.calibration)
    benches = []
    for path in args.bench:
        with open(path) as f:
            benches.append((path, json.load(f)))
    print(dcs3gd_verdict(report_dcs3gd(v, benches, data, args.out, args.overlap)))
    return 0


def report_dcs3gd(v, benches: list[tuple[str, dict]], data: dict, out: str,
                  overlap: float = 1.0) -> float:
    """The validate_dcs3gd table of ``(name, measurement)`` pairs against a calibration; the
    largest error of a predicted SSGD / DC-S3GD ratio."""
    from kvstore_ext.reports import write_results
    rows = [{"bench": name, **row} for name, bench in benches
            for row in v.dcs3gd_rows(bench, data, overlap=overlap)]
    os.makedirs(out, exist_ok=True)
    print(write_results(out, "validate_dcs3gd", rows, [
        ("bench", "bench", "{}"), ("case", "label", "{}"),
        ("device ms", "device_ms", "{:.0f}"), ("injected wire ms", "wire_ms", "{:.1f}"),
        ("predicted ms", "predicted_ms", "{:.1f}"), ("measured ms", "measured_ms", "{:.1f}"),
        ("predicted ratio", "predicted_ratio", "{:.2f}"),
        ("measured ratio", "measured_ratio", "{:.2f}"), ("error", "error", "{:+.1%}"),
        ("measured overlap", "measured_overlap", "{:.2f}")]))
    return v.worst_ratio_error(rows)


def dcs3gd_verdict(worst: float) -> str:
    """The worst ratio error against the bound it is held to."""
    from .validate import DCS3GD_RATIO_BOUND
    return (f"largest error of a predicted SSGD/DC-S3GD ratio: {worst:.1%} "
            f"(bound {DCS3GD_RATIO_BOUND:.0%})")


def report(v, cases, measured, data, args, dcs3gd=(), probes=()) -> int:
    """The table, the summary figures and the plots of measured cases against a calibration,
    the DC-S3GD table of ``(name, measurement)`` pairs ``dcs3gd`` if any, and with the host
    ``probes`` the figures again for the host as they found it."""
    from kvstore_ext.reports import write_results
    drift = v.host_drift(probes, v.probe_reference(data)) if probes else None
    rows = v.table_rows(cases, measured, data, drift)
    os.makedirs(args.out, exist_ok=True)
    columns = [("case", "label", "{}"), ("predicted ms", "predicted_ms", "{:.1f}"),
               ("measured ms (median)", "measured_ms", "{:.1f}"), ("error", "error", "{:+.1%}")]
    if drift:
        columns += [("predicted ms, host as probed", "adjusted_predicted_ms", "{:.1f}"),
                    ("its error", "adjusted_error", "{:+.1%}")]
    print(write_results(args.out, "validate", rows, columns))
    summary = v.summarise(rows)
    if drift:
        summary["host_drift"] = drift
        summary["adjusted"] = v.summarise(v.adjusted(rows))
    if dcs3gd:
        summary["dcs3gd_max_abs_ratio_error"] = report_dcs3gd(v, dcs3gd, data, args.out)
    with open(os.path.join(args.out, "validate_summary.json"), "w") as f:
        json.dump({"command": " ".join(sys.argv), **summary}, f, indent=1)
    print_figures(summary, "predicted from the calibration")
    if drift:
        print(f"host probes ({len(drift['probes'])}): {drift['compute']:.2f}x the calibration's "
              f"compute time, {drift['runtime']:.2f}x its runtime CPU")
        warning = v.drift_warning(drift)
        if warning:
            print(f"warning: {warning}")
        print_figures(summary["adjusted"], "predicted for the host as probed")
    if dcs3gd:
        print(dcs3gd_verdict(summary["dcs3gd_max_abs_ratio_error"]))
    if not args.no_plots:
        for path in v.plot(rows, args.out):
            print(f"wrote {path}")
    return 0


def print_figures(summary: dict, title: str) -> None:
    """The grid's figures of :func:`.validate.summarise`, one line each group."""
    print(f"{title}: median |error| {summary['median_abs_error']:.1%}, max "
          f"{summary['max_abs_error']:.1%}, {summary['over_25pct']} of {summary['cases']} over "
          f"25%; Kendall tau over all {summary['kendall_tau_all']:.2f}")
    for g in summary["groups"]:
        knees = ", ".join(f"{s} {k['predicted']}/{k['measured']}" for s, k in g["knees"].items())
        print(f"  {g['model']} {g['device']}: tau {g['kendall_tau']:.2f}; pick {g['pick']} "
              f"measures {g['pick_vs_best']:.0%} of the best ({g['best']}); knee predicted/"
              f"measured {knees}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kvstore_ext.plan",
        description="The planner: a performance model of data-parallel training (Yan et al., "
                    "KDD 2015) calibrated on this machine; predicts time per iteration, searches "
                    "configurations, and checks itself against real jobs.")
    sub = p.add_subparsers(dest="verb", required=True)

    c = sub.add_parser("calibrate", help="measure the model's coefficients on this machine",
                       description="Measure per-layer compute against batch size, compute "
                                   "interference between processes and a step's jitter, wire "
                                   "latency and bandwidth, "
                                   "the optimizer, and the worker's and server's CPU per message, "
                                   "key and byte in real jobs; write them as JSON with each "
                                   "fit's R^2 (about 14 minutes here; 20 on a slower day).")
    c.add_argument("--out", default=DEFAULT_CALIBRATION,
                   help=f"the calibration JSON to write (default {DEFAULT_CALIBRATION})")
    c.add_argument("--models", default="lenet,cifar_resnet20_v1",
                   help="models to time layer by layer (gluon_trainers or GluonCV names; "
                        "default lenet,cifar_resnet20_v1)")
    c.add_argument("--interference", default="1,2,4,8",
                   help="process counts at which to measure compute interference and a "
                        "step's jitter (default 1,2,4,8)")
    c.add_argument("--quick", action="store_true",
                   help="fewer and shorter measurements (under a minute): checks the pipeline, "
                        "not good enough for figures")
    c.add_argument("--repeat-out", default="", metavar="PATH",
                   help="also make a second, independent calibration, measured unit by unit "
                        "(a process, a round, a job) in turn with the first (the order reversed "
                        "at every unit), write it to "
                        "PATH and print both side by side as 'compare' does: the machine's drift "
                        "during the run then falls on both alike (twice as long)")
    c.add_argument("--tolerance", type=float, default=0.2,
                   help="with --repeat-out, the relative difference flagged (default 0.2)")
    c.set_defaults(func=cmd_calibrate)

    def common(q):
        q.add_argument("--calibration", default=DEFAULT_CALIBRATION,
                       help=f"calibration JSON from 'calibrate' (default {DEFAULT_CALIBRATION})")
        q.add_argument("--model", default="lenet", help="a calibrated model (default lenet)")
        q.add_argument("--device", default="",
                       help="emulated or real devices as launch.py --device takes them "
                            "(150ms, v100, gtx1080ti*3,gtx1060); default: the host computes")
        q.add_argument("--device-batch", type=int, default=64,
                       help="the batch a device time in ms is for; other batches scale it "
                            "(default 64)")
        q.add_argument("--cluster", action="store_true",
                       help="each worker and server on its own machine with a real device (the "
                            "host only feeds it); default: every process on this one host, as "
                            "validate runs them")
        q.add_argument("--bandwidth-gbps", type=float, default=0.0,
                       help="the network's bandwidth per link in Gbit/s (default: as calibrated "
                            "on this host's loopback)")
        q.add_argument("--dataset-size", type=int, default=60000,
                       help="samples per epoch, for the epoch time (default 60000)")

    q = sub.add_parser("predict", help="time per iteration of one configuration",
                       description="Time per iteration, samples/s and epoch time of one "
                                   "configuration, its breakdown and bottleneck.")
    common(q)
    q.add_argument("-n", "--workers", type=int, default=2, help="workers (default 2)")
    q.add_argument("-s", "--servers", type=int, default=1, help="servers (default 1)")
    q.add_argument("--store", default="dist_bsp", choices=STORES, help="store type (default dist_bsp)")
    q.add_argument("--kv-param", action="append", default=[], metavar="NAME=VALUE",
                   help="a store parameter (staleness=2, min_push_fraction=0.75); repeatable")
    q.add_argument("--batch-size", type=int, default=64, help="per-worker batch (default 64)")
    q.add_argument("--bigarray-bound", type=int, default=1_000_000,
                   help="arrays of at least this many elements are cut across the servers "
                        "(launch.py --bigarray-bound; default 1000000)")
    q.add_argument("--colocate", action="store_true",
                   help="with --cluster: the servers run on the workers' machines")
    q.add_argument("--wire-ms", type=float, default=0.0,
                   help="milliseconds per iteration a worker's exchange spends on a slow link "
                        "beyond the calibrated one, without CPU (what KVX_SIM_COMM_S injects; "
                        "default 0)")
    q.add_argument("--json", action="store_true", help="print the prediction as JSON")
    q.set_defaults(func=cmd_predict)

    from . import search as grids

    def checked(parse):
        """``parse`` as an option's type: its ValueError is argparse's error (exit status 2)."""
        def parsed(text):
            try:
                return parse(text)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None
        return parsed

    s = sub.add_parser("search", help="the best configurations under a machine budget",
                       description="Evaluate every configuration of workers, servers (dedicated "
                                   "or on the workers' machines), batch size, store and setting "
                                   "of its parameters at once, keep those within the budget, "
                                   "rank them by samples/s with their mean staleness, re-check "
                                   "the top ones with the simulator, and print each store's "
                                   "knee. --device lists the machines available as launch.py "
                                   "--device takes them (gtx1080ti*8,gtx1060*8): a "
                                   "configuration of n workers uses the n fastest, so workers "
                                   "stop at the pool's size; one device (gtx1080ti, 150ms) "
                                   "stands for every worker. Where the pace is the policy's "
                                   "(SSP and DSSP on uneven devices, PSP always), the closed "
                                   "form gives an optimistic bound and the simulator runs the "
                                   "real policies, best bound first, until the top ones and "
                                   "the knees are exact.")
    common(s)
    s.add_argument("--machines", type=int, default=16,
                   help="machines available, workers and dedicated servers (default 16)")
    s.add_argument("--max-workers", type=int, default=16,
                   help="most workers tried (default 16; at most the --device pool's size)")
    s.add_argument("--servers", default="1,2,4,8", help="server counts tried (default 1,2,4,8)")
    s.add_argument("--batch-sizes", default="32,64,128", help="per-worker batches (default 32,64,128)")
    s.add_argument("--stores", default="dist_bsp,dist_asp,dist_ssp,dist_dssp",
                   type=checked(grids.parse_stores),
                   help="stores tried (default dist_bsp,dist_asp,dist_ssp,dist_dssp; also "
                        "dist_psp, dist_ssgd, dist_dcs3gd)")
    s.add_argument("--staleness", default="1,3,6,15", type=checked(grids.parse_staleness),
                   help="dist_ssp's staleness values tried: a worker more than s iterations "
                        "ahead of the slowest waits (default 1,3,6,15)")
    s.add_argument("--dssp-bounds", default="1:15,3:15", type=checked(grids.parse_dssp_bounds),
                   help="dist_dssp's staleness_lower:staleness_upper pairs tried: a worker "
                        "past the lower bound runs on as far as the upper one when that makes "
                        "its wait for the slowest short (default 1:15,3:15)")
    s.add_argument("--psp", default="0.75:1,0.9:1", type=checked(grids.parse_psp),
                   help="dist_psp's min_pushes:min_pull_fraction pairs tried, with --stores "
                        "...,dist_psp: a round closes after c x n pushes (c a fraction of the "
                        "workers, in (0, 1]; later pushes are dropped as late), and a worker "
                        "goes on with a share b of the blocks (default 0.75:1,0.9:1)")
    s.add_argument("--max-staleness", type=float, default=None, metavar="X",
                   help="rank only configurations whose mean staleness (updates applied "
                        "between a worker's read of the weights and its push's application: 0 "
                        "for BSP and PSP, n-1 for ASP, less for SSP and DSSP where their bounds "
                        "hold fast workers back) is at most X; the knees stay throughput's "
                        "alone (default: no cap)")
    s.add_argument("--colocate", choices=("no", "yes", "both"), default="both",
                   help="servers on their own machines (no), on the workers' (yes) or either "
                        "(both, the default)")
    s.add_argument("--memory-gb", type=float, default=0.0,
                   help="a device's memory: configurations that need more are dropped")
    s.add_argument("--cores", type=int, default=0,
                   help="cores per machine (default: as calibrated)")
    s.add_argument("--top", type=int, default=10, help="configurations listed (default 10)")
    s.add_argument("--out", default="", help="folder for search.json and the PNGs")
    s.set_defaults(func=cmd_search)

    r = sub.add_parser("compare", help="two calibrations' coefficients side by side",
                       description="Print every coefficient of two calibrations and their "
                                   "relative difference; exit 1 if one differs by more than the "
                                   "tolerance (calibration repeatability).")
    r.add_argument("first", help="a calibration JSON")
    r.add_argument("second", help="another calibration JSON")
    r.add_argument("--tolerance", type=float, default=0.2,
                   help="largest relative difference accepted (default 0.2)")
    r.add_argument("--refit", action="store_true",
                   help="fit both calibrations' measured points again with this version's "
                        "fitting first (to compare calibrations made by older versions)")
    r.set_defaults(func=cmd_compare)

    v = sub.add_parser("validate", help="predicted against measured on a grid of real jobs",
                       description="Run a grid of real jobs on this machine (3 interleaved "
                                   "trials), predict each from the calibration, and write the "
                                   "errors, the ranking (Kendall tau), the pick and the knees; "
                                   "then dist_ssgd against dist_dcs3gd on 2 Horovod workers with "
                                   "communication negligible and as long as the compute, and "
                                   "the error of each predicted SSGD / DC-S3GD ratio.")
    v.add_argument("--calibration", default=DEFAULT_CALIBRATION,
                   help=f"calibration JSON (default {DEFAULT_CALIBRATION}; made if missing)")
    v.add_argument("--calibrate", action="store_true", help="calibrate again first")
    v.add_argument("--models", default="lenet,cifar_resnet20_v1",
                   help="models (lenet computes real gradients; others push their shapes)")
    v.add_argument("--clusters", default=",".join(f"{n}x{s}" for n, s in GRID_CLUSTERS),
                   help="workers x servers (default 1x1,2x1,2x2,4x1,4x2,8x2)")
    v.add_argument("--stores", default="dist_bsp,dist_asp", help="stores (default dist_bsp,dist_asp)")
    v.add_argument("--devices", default="60ms,150ms",
                   help="emulated device times per batch of 64 (default 60ms,150ms)")
    v.add_argument("--no-mixed", action="store_true",
                   help="leave out the mixed pair (2 workers at 100ms and 250ms)")
    v.add_argument("--trials", type=int, default=3, help="interleaved trials (default 3)")
    v.add_argument("--rounds", type=int, default=20, help="timed iterations per job (default 20)")
    v.add_argument("--warmup", type=int, default=5, help="untimed iterations first (default 5)")
    v.add_argument("--max-cases", type=int, default=0, help="run only the first K cases")
    v.add_argument("--no-dcs3gd", action="store_true",
                   help="leave out dist_ssgd against dist_dcs3gd (2 Horovod workers)")
    v.add_argument("--dcs3gd-device-s", default="0,0.1",
                   help="simulated accelerator seconds per step of the DC-S3GD measurements, "
                        "one measurement each: 0 is LeNet on the CPU at batch 64, a device "
                        "time is at batch 16 (default 0,0.1)")
    v.add_argument("--dcs3gd-steps", type=int, default=40,
                   help="steps per DC-S3GD or SSGD job (default 40)")
    v.add_argument("--dcs3gd-warmup", type=int, default=10,
                   help="steps of those jobs before timing (default 10)")
    v.add_argument("--measured", default="",
                   help="run no job: score the measurements of an earlier validate.json, and "
                        "the DC-S3GD ones kept beside it if any, against --calibration")
    v.add_argument("--no-host-probe", action="store_true",
                   help="do not probe the host's speed before each trial and after the last "
                        "(the probe times LeNet's compute and a 1x1 job's CPU as the "
                        "calibration did, and the figures are given again for the host as found)")
    v.add_argument("--host-probe-repeats", type=int, default=3,
                   help="compute processes and runtime jobs per host probe (default 3)")
    v.add_argument("--no-plots", action="store_true", help="write no PNGs")
    v.add_argument("--out", default=os.path.join("results", "plan"),
                   help="folder for validate.{json,csv,md}, validate_dcs3gd.{json,csv,md}, "
                        "the DC-S3GD measurements, host_probes.json, the summary and PNGs")
    v.set_defaults(func=cmd_validate)

    d = sub.add_parser("validate-dcs3gd", help="SSGD / DC-S3GD predicted against bench_dcs3gd.py",
                       description="Score scripts/bench_dcs3gd.py's measurements (2 Horovod "
                                   "workers, communication negligible and equal to computation) "
                                   "against the model: each step time and each SSGD / DC-S3GD "
                                   "ratio, predicted and measured ('validate' runs the same "
                                   "jobs itself).")
    d.add_argument("--bench", action="append", required=True, metavar="DCS3GD_JSON",
                   help="a dcs3gd.json that bench_dcs3gd.py --out wrote (make bench-dcs3gd "
                        "writes results/bench/dcs3gd.json and results/bench/device/dcs3gd.json); "
                        "repeatable")
    d.add_argument("--calibration", default=DEFAULT_CALIBRATION,
                   help=f"calibration JSON (default {DEFAULT_CALIBRATION})")
    d.add_argument("--overlap", type=float, default=1.0,
                   help="share of the allreduce DC-S3GD hides behind the next step's compute "
                        "(default 1.0, what the algorithm allows)")
    d.add_argument("--out", default=os.path.join("results", "plan"),
                   help="folder for validate_dcs3gd.{json,csv,md}")
    d.set_defaults(func=cmd_validate_dcs3gd)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
