"""Run a paper's experiment from its config: every paradigm on every cluster, a table and plots.

    python scripts/reproduce.py configs/dssp_mnist.yaml            # make reproduce
    python scripts/reproduce.py configs/dssp_mnist.yaml --dry-run  # print the commands
    python -m kvstore_ext.simulate --train configs/virtual/mnist_scaling.yaml   # virtual time

Each run is a local job through launch.py (with the cluster's worker speeds or emulated
devices; for the latter the table puts the simulator's iterations beside the measured ones),
or, for a cluster with ``virtual: true`` (every cluster, with ``--virtual``), N virtual
workers trained in virtual time (:mod:`kvstore_ext.virtual_training`), in --jobs processes
of one thread each, never while a job runs; launched runs are interleaved trial by trial so
that drift of the machine hits every paradigm alike. Writes into --out (default
results/<name>): runs.json (every
run, with worker 0's accuracy curve), results.csv/.md (per cluster and
paradigm: the median trial by final accuracy, its time to each target
accuracy), accuracy_vs_time_<cluster>.png, accuracy_vs_epoch_<cluster>.png
(when the curves carry epochs), accuracy_vs_iterations_<cluster>.png (against worker 0's
steps, or a virtual run's pushes / n), for dist_psp runs test_error_vs_time_<cluster>.png,
for DSSP runs dssp_threshold_<cluster>.png, for virtual runs staleness_<cluster>.png and, over
virtual clusters <kind>_<n> of several sizes, time_to_<target>_vs_workers_<kind>.png. The table
also gives, averaged over the trials, the running time (until the last worker is done), test
error and pushes dropped.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import statistics
import sys
import tempfile
import time

from tqdm import tqdm

from kvstore_ext.experiments import (ConfigError, histogram_mean, load_experiment, median_of,
                                     summarise)
from kvstore_ext.launch import run_local_job
from kvstore_ext.policies.psp import resolve_min_pushes
from kvstore_ext.reports import plot_accuracy, write_results
from kvstore_ext.virtual_training import (agreement_columns, agreement_rows, cluster_kinds,
                                          iterations_text, plot_staleness, plot_time_to_target,
                                          run_virtual_runs)
from gluon_trainers.straggler import (exchange_slowdown, iteration_overhead, overhead_model,
                                      read_device_logs, round_overhead, warm_up)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def virtual_jobs() -> int:
    """The default number of virtual-run processes: the cores this process may run on, plus
    one.  A run's calling thread and MXNet's engine thread keep about 1.3 cores busy between
    them, so as many processes as cores fill the cores while all run; one more keeps them
    filled while the last runs end (``make bench-virtual``'s five runs on two cores,
    2026-12-07: 13 min 27 s to 15 min 1 s with 3 processes, 15 min 7 s with 2; the same
    records; docs/virtual_training.md)."""
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count())
    return (cores or 1) + 1


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="reproduce.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("config", help="an experiment YAML from configs/")
    p.add_argument("--out", default=None, help="results folder (default: results/<config name>)")
    p.add_argument("--trials", type=int, default=None, help="trials per paradigm (default: the config's)")
    p.add_argument("--quick", action="store_true",
                   help="apply the config's 'quick' arguments (a shorter run, for smoke tests)")
    p.add_argument("--cluster", action="append", default=[],
                   help="only this cluster of the config (repeatable)")
    p.add_argument("--paradigm", action="append", default=[],
                   help="only this paradigm, by its name in the config (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--virtual", action="store_true",
                   help="run every cluster in virtual time (each needs device, or compute: "
                        "calibration; python -m kvstore_ext.simulate --train does this)")
    p.add_argument("--jobs", type=int, default=virtual_jobs(),
                   help="processes that run virtual runs side by side, one thread each "
                        "(default: this machine's cores plus one, %(default)s: a run keeps "
                        "about 1.3 cores busy, and as the last runs end, one more process "
                        "keeps the cores from going idle); the records are the same whatever "
                        "the number")
    p.add_argument("--resume", action="store_true",
                   help="keep the runs already in --out's runs.json and run only the others "
                        "of this plan: a study run a part at a time (--cluster, --paradigm, "
                        "--trials), or one that stopped, gets one runs.json, table and set of "
                        "plots over every run kept")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: rebuild the table and plots from the runs.json already in "
                        "--out (for example after changing the config's targets)")
    return p.parse_args(argv)


def job_command(exp, paradigm, cluster, workdir, quick, trial=None):
    """The launch.py options and the worker command of one run (``trial``: its seed, when the
    config seeds by trial)."""
    script = os.path.normpath(os.path.join(ROOT, exp.script))
    speeds = exp.clusters[cluster]
    emulation = [] if exp.uses_devices(cluster) else ["--worker-speed", ",".join(map(str, speeds))]
    options = [*paradigm.launch_options(), *emulation,
               *exp.launch_options(cluster), "--metrics-dir", os.path.join(workdir, "metrics")]
    command = [sys.executable, script, "--kvstore", paradigm.kvstore,
               *exp.script_args(paradigm, quick, trial),
               "--out", os.path.join(workdir, "worker-{rank}.json")]
    return options, command


SIMULATED_AS = {"dist_sync": "dist_bsp", "dist_async": "dist_asp"}


def predict(runs, rows, exp) -> None:
    """For clusters of emulated devices: the simulator's iterations per worker for each
    paradigm's median trial, beside the measured ones.  The simulator gets the workers' own
    device clocks and what k workers let go together cost, ``a + k*b`` (``overhead_model``:
    fitted to the cluster's BSP round overhead and, where it has an ASP run, one worker's); its
    time is the run's training time less the first iteration's warm-up.  A slow server
    (``slow_server``) is simulated for ``dist_psp`` with the job's servers and the blocks each
    held (the servers' metrics); its delay is taken out of the measured round overhead, which
    includes it.  Random late replies (``delay_replies``) are not simulated: no prediction."""
    from kvstore_ext import registry
    from kvstore_ext.ps.faults import parse_slow_server
    from kvstore_ext.simulate import simulate
    for row in rows:
        cluster = row["cluster"]
        options = exp.cluster_options.get(cluster, {})
        if not exp.uses_devices(cluster) or "delay_replies" in options:
            continue
        run = median_of(runs, row)
        store = SIMULATED_AS.get(run["kvstore"], run["kvstore"])
        simulated = store in registry.STORE_TYPES and (registry.lookup(store).policy or
                                                       registry.lookup(store).block_policy)
        overheads = [r["round_overhead_s"] for r in runs if r["cluster"] == cluster and
                     r.get("round_overhead_s") is not None]
        if not simulated or not overheads:
            continue
        latency = statistics.median(overheads)
        lones = [r["iteration_overhead_s"] for r in runs if r["cluster"] == cluster and
                 r.get("iteration_overhead_s") is not None]
        servers = {}
        if "slow_server" in options:
            blocks = run.get("server_blocks")
            if store != "dist_psp" or not blocks or None in blocks:
                continue
            slow, seconds = parse_slow_server(options["slow_server"], exp.servers)
            delays = [0.0] * exp.servers
            delays[slow] = seconds
            latency = max(0.0, latency - seconds)
            lones = [max(0.0, x - seconds) for x in lones]
            servers = {"servers": exp.servers, "reply_delays": delays, "blocks": blocks}
        fixed, per_worker = overhead_model(
            latency, statistics.median(lones) if lones else None, exp.workers)
        horizon = run["train_time_s"] - (run.get("warm_up_s") or 0.0) + latency
        result = simulate(store, run["params"] if store == run["kvstore"] else {}, None,
                          horizon, clocks=exp.device_clocks(cluster), latency=fixed,
                          release_latency=per_worker, **servers)
        row["simulated_iterations"] = [result.iterations[w] for w in sorted(result.iterations)]
        row["simulated_max_lead"] = result.max_lead_at_ok
        if servers:
            row["simulated_pushes_dropped"] = result.dropped


def launched_run(exp, trial, cluster, paradigm, quick) -> dict:
    """One run as a local job of real processes (launch.py), and its record."""
    with tempfile.TemporaryDirectory() as workdir:
        options, command = job_command(exp, paradigm, cluster, workdir, quick, trial)
        t0 = time.perf_counter()
        run_local_job(exp.workers, exp.servers, command, options=options, timeout=exp.timeout)
        return collect(workdir, exp, trial, cluster, paradigm, time.perf_counter() - t0)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def collect(workdir, exp, trial, cluster, paradigm, seconds) -> dict:
    """One run's record: worker 0's curve, every worker's iterations, the DSSP log."""
    workers = [read_json(os.path.join(workdir, f"worker-{r}.json")) for r in range(exp.workers)]
    w0 = workers[0]
    dssp, dropped, delayed = None, 0, 0
    blocks = [None] * exp.servers   # blocks each server held, by rank
    staleness: dict[int, int] = {}  # of applied pushes, every key's (each key sees every push)
    for path in sorted(glob.glob(os.path.join(workdir, "metrics", "server-*.json"))):
        server = read_json(path)
        for hist in server.get("staleness", {}).values():
            for value, count in hist.items():
                staleness[int(value)] = staleness.get(int(value), 0) + count
        if 0 <= server.get("server", -1) < exp.servers:
            blocks[server["server"]] = server.get("blocks")
        dropped += server.get("pushes_dropped", 0)
        delayed += server.get("faults", {}).get("replies_delayed", 0)
        if "dssp" in server and dssp is None:
            dssp = server["dssp"]
    devices = [w.get("straggler", {}) for w in workers]
    logs = read_device_logs(os.path.join(workdir, "metrics"), exp.workers) \
        if exp.uses_devices(cluster) else None
    synchronous = paradigm.kvstore in ("dist_bsp", "dist_sync") or (
        paradigm.kvstore == "dist_psp" and paradigm.params.get("min_pull_fraction", 1.0) == 1.0
        and resolve_min_pushes(paradigm.params.get("min_pushes", 1.0), exp.workers) == exp.workers)
    lone = bool(logs) and paradigm.kvstore in ("dist_asp", "dist_async")
    waits = [w.get("kvstore_stats", {}).get("worker", {}).get("wait_share") for w in workers]
    waits = [x for x in waits if x is not None]
    return {"trial": trial, "cluster": cluster, "paradigm": paradigm.name,
            "kvstore": paradigm.kvstore, "params": paradigm.params,
            "speeds": exp.clusters[cluster], "job_seconds": seconds,
            "final_accuracy": w0["test_accuracy"], "train_time_s": w0["wall_time_s"],
            # the job's running time: until its last worker finished training
            "running_time_s": max(w["wall_time_s"] for w in workers),
            "pushes_dropped": dropped, "replies_delayed": delayed, "server_blocks": blocks,
            "train_start_wall": w0.get("train_start_wall"),
            "iterations": [w["steps"] for w in workers],
            "wait_share": sum(waits) / len(waits) if waits else None,
            "curve": w0["accuracy_curve"], "dssp": dssp,
            "staleness_mean": histogram_mean(staleness),
            "max_lead": dssp.get("max_lead_at_ok") if dssp else None,
            "host_share": [d.get("host_share") for d in devices],
            "round_overhead_s": round_overhead(logs) if logs and synchronous else None,
            # no policy holds an ASP worker back: what one push and pull cost alone, and how
            # much longer beside other workers' compute (what a shared_host is checked against)
            "iteration_overhead_s": iteration_overhead(logs) if lone else None,
            "exchange_slowdown": exchange_slowdown(logs) if lone else None,
            "warm_up_s": warm_up(logs) if logs else None}


def plot_thresholds(runs, rows, cluster, path, title) -> bool:
    """Each worker's DSSP lead bound over time (the median DSSP trial); False if no DSSP run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    chosen = [median_of(runs, row) for row in rows if row["cluster"] == cluster]
    chosen = [r for r in chosen if r.get("dssp")]
    if not chosen:
        return False
    fig, axes = plt.subplots(len(chosen), 1, figsize=(7, 3.2 * len(chosen)), squeeze=False)
    for ax, run in zip(axes[:, 0], chosen):
        log = run["dssp"]
        start = 0.0 if run.get("virtual") else run["train_start_wall"] or (
            log["bound_changes"][0]["time"] if log["bound_changes"] else 0.0)
        end = start + run["train_time_s"]
        for worker in range(len(run["speeds"])):
            changes = [c for c in log["bound_changes"] if c["worker"] == worker]
            xs, ys = [0.0], [log["staleness_lower"]]
            for c in changes:
                xs.append(c["time"] - start)
                ys.append(c["bound"])
            xs.append(max(xs[-1], end - start))
            ys.append(ys[-1])
            line, = ax.step(xs, ys, where="post",
                            label=f"worker {worker} (speed {run['speeds'][worker]})")
            calls = [c for c in log["calls"] if c["worker"] == worker]
            if calls:
                ax.scatter([c["time"] - start for c in calls], [c["lead"] for c in calls], s=10,
                           color=line.get_color(), marker="x",
                           label=f"worker {worker}: its lead when it asked the controller")
        ax.axhline(log["staleness_upper"], color="grey", ls="--", lw=0.8, label="s_U")
        ax.axhline(log["staleness_lower"], color="grey", ls=":", lw=0.8, label="s_L")
        ax.set_ylabel("lead bound (threshold)")
        ax.set_title(f"{title}: {run['paradigm']}, {log['controller_calls']} controller calls")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("time since training started (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def table_columns(exp):
    cols = [("cluster", "cluster", "{}"), ("paradigm", "paradigm", "{}"),
            ("final acc (median trial)", "final_accuracy", "{:.4f}")]
    for t in exp.targets:
        cols.append((f"time to {t} (s)", f"time_to_{t}", "{}"))
        cols.append((f"vs BSP @{t}", f"vs_bsp_{t}", "{}"))
    cols += [("trials reaching " + str(exp.targets[-1]) if exp.targets else "trials",
              f"reached_{exp.targets[-1]}" if exp.targets else "trials", "{}"),
             ("iterations per worker", "iterations_text", "{}"),
             ("staleness (mean)", "staleness_mean", "{:.2f}"),
             ("training time (s)", "train_time_s", "{:.1f}")]
    if any(exp.uses_devices(c) for c in exp.clusters):
        cols += [("simulated iterations", "simulated_text", "{}"),
                 ("max lead", "max_lead", "{}"), ("simulated max lead", "simulated_max_lead", "{}")]
    if any(p.kvstore == "dist_psp" for p in exp.paradigms):   # the PSP-SGD paper's Table 1
        cols += [("running time (s, mean)", "running_time_s", "{:.1f}"),
                 ("vs " + exp.paradigms[0].name, "running_vs_first", "{:.2f}x"),
                 ("test error (mean)", "test_error", "{:.4f}"),
                 ("pushes dropped (mean)", "pushes_dropped", "{:.0f}"),
                 ("simulated pushes dropped", "simulated_pushes_dropped", "{}")]
    return cols


def decorate(rows, exp):
    """Printable cells: times rounded, ratios to BSP as '0.67x', '-' where a run fell short."""
    for row in rows:
        for t in exp.targets:
            mine, ratio = row[f"time_to_{t}"], row[f"vs_bsp_{t}"]
            row[f"vs_bsp_{t}"] = f"{ratio:.2f}x" if ratio is not None else "-"
            row[f"time_to_{t}"] = round(mine, 1) if mine is not None else "not reached"
        row["iterations_text"] = iterations_text(row["iterations"])
        row["simulated_text"] = "/".join(str(i) for i in row.get("simulated_iterations") or [])
    return rows


def run_plan(exp, plan, out: str, quick: bool, jobs: int, kept=()) -> list[dict]:
    """Every run of ``plan``, its record into ``out``/runs.json (after the ``kept`` records,
    then in the plan's order) as it ends: the virtual runs first, in ``jobs`` processes, then
    the launched ones one at a time (a virtual run beside a job would take the cores the job
    is measured on)."""
    records: dict[int, dict] = {-len(kept) + k: r for k, r in enumerate(kept)}
    bar = tqdm(total=len(plan), desc=exp.name, unit="run", disable=not plan)

    def done(index: int, record: dict) -> None:
        records[index] = record
        with open(os.path.join(out, "runs.json"), "w") as f:
            json.dump({"config": exp.path, "command": " ".join(sys.argv),
                       "runs": [records[i] for i in sorted(records)]}, f)
        tqdm.write(f"trial {record['trial']} {record['cluster']:<12} {record['paradigm']:<12} "
                   f"final accuracy {record['final_accuracy']:.4f}, training "
                   f"{record['train_time_s']:.1f} s, "
                   f"iterations {iterations_text(record['iterations'])}")
        bar.update(1)

    virtual = [i for i, (_, cluster, _) in enumerate(plan) if exp.is_virtual(cluster)]
    for k, record in run_virtual_runs(exp, [plan[i] for i in virtual], quick, jobs):
        done(virtual[k], record)
    for i, (trial, cluster, paradigm) in enumerate(plan):
        if i not in records:
            bar.set_postfix_str(f"trial {trial} {cluster} {paradigm.name}")
            done(i, launched_run(exp, trial, cluster, paradigm, quick))
    bar.close()
    return [records[i] for i in sorted(records)]


def run_id(trial, cluster: str, paradigm: str) -> tuple:
    """What names one run of a plan, and its record in runs.json."""
    return int(trial), cluster, paradigm


def resumed(path: str, exp, plan) -> tuple[list[dict], list]:
    """The records of ``path`` (a runs.json) to keep, and the runs of ``plan`` not among
    them; the records must be of ``exp``'s config and name its clusters and paradigms."""
    if not os.path.exists(path):
        return [], plan
    data = read_json(path)
    if os.path.basename(data.get("config", "")) != os.path.basename(exp.path):
        raise ConfigError(f"--resume: {path} holds runs of {data.get('config')!r}, not of "
                          f"{exp.path!r}")
    names = {p.name for p in exp.paradigms}
    for r in data["runs"]:
        if r["cluster"] not in exp.clusters or r["paradigm"] not in names:
            raise ConfigError(f"--resume: {path} holds a run of cluster {r['cluster']!r}, "
                              f"paradigm {r['paradigm']!r}, which {exp.path} no longer has")
    have = {run_id(r["trial"], r["cluster"], r["paradigm"]) for r in data["runs"]}
    return data["runs"], [(t, c, p) for t, c, p in plan if run_id(t, c, p.name) not in have]


def cluster_title(exp, cluster: str) -> str:
    """A plot's title: the experiment, the cluster and what its workers' speeds come from."""
    opts = exp.cluster_options.get(cluster, {})
    if exp.uses_devices(cluster):
        return f"{exp.name}: {cluster} cluster, devices {opts['device']}"
    if "compute" in opts:
        return (f"{exp.name}: {cluster} cluster, {exp.workers_of(cluster)} workers, compute "
                f"from {os.path.basename(opts['calibration'])}")
    return f"{exp.name}: {cluster} cluster, speeds {exp.clusters[cluster]}"


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        exp = load_experiment(args.config)
    except (ConfigError, OSError) as exc:
        print(f"reproduce.py: {exc}", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print(f"reproduce.py: --jobs must be >= 1, got {args.jobs}", file=sys.stderr)
        return 2
    if args.virtual:
        for name in exp.clusters:
            exp.cluster_options.setdefault(name, {})["virtual"] = True
            if not exp.times_iterations(name):
                print(f"reproduce.py: cluster {name!r} of {args.config} names no device; a "
                      f"virtual cluster takes its iteration times from emulated devices "
                      f"(device) or the planner (compute: calibration)", file=sys.stderr)
                return 2
    clusters = args.cluster or list(exp.clusters)
    unknown = [c for c in clusters if c not in exp.clusters]
    if unknown:
        print(f"reproduce.py: no cluster {unknown[0]!r} in {args.config} "
              f"(it has {', '.join(exp.clusters)})", file=sys.stderr)
        return 2
    names = [p.name for p in exp.paradigms]
    if any(n not in names for n in args.paradigm):
        bad = next(n for n in args.paradigm if n not in names)
        print(f"reproduce.py: no paradigm {bad!r} in {args.config} (it has {', '.join(names)})",
              file=sys.stderr)
        return 2
    plan = [(t, c, p) for t, c, p in exp.runs(args.trials)
            if c in clusters and (not args.paradigm or p.name in args.paradigm)]
    out = args.out or os.path.join("results", exp.name)

    if args.dry_run:
        for trial, cluster, paradigm in plan:
            if exp.is_virtual(cluster):
                print(f"# trial {trial}, cluster {cluster}, {paradigm.name}: "
                      f"{exp.workers_of(cluster)} workers in virtual time, in a process")
                print(shlex.join([sys.executable, "-m", "kvstore_ext.simulate", "--train",
                                  args.config, "--cluster", cluster, "--paradigm",
                                  paradigm.name, "--trials", str(trial + 1)]))
                continue
            options, command = job_command(exp, paradigm, cluster,
                                           f"<tmp>/{trial}-{cluster}-{paradigm.name}", args.quick,
                                           trial)
            launch = [sys.executable, os.path.join(ROOT, "scripts", "launch.py"), "-n", str(exp.workers),
                      "-s", str(exp.servers), "--launcher", "local", *options, *command]
            print(f"# trial {trial}, cluster {cluster}, {paradigm.name}")
            print(shlex.join(launch))
        return 0

    os.makedirs(out, exist_ok=True)
    if args.report_only:
        runs = [r for r in read_json(os.path.join(out, "runs.json"))["runs"]
                if r["cluster"] in clusters]
    else:
        kept = []
        if args.resume:
            try:
                kept, plan = resumed(os.path.join(out, "runs.json"), exp, plan)
            except ConfigError as exc:
                print(f"reproduce.py: {exc}", file=sys.stderr)
                return 2
            print(f"reproduce.py: {len(kept)} runs kept from {out}/runs.json, "
                  f"{len(plan)} to run", file=sys.stderr)
            # the table and plots cover every cluster with a run, in the config's order
            clusters = [c for c in exp.clusters if c in clusters
                        or any(r["cluster"] == c for r in kept)]
        runs = run_plan(exp, plan, out, args.quick, args.jobs, kept)

    rows = summarise(runs, exp.targets)
    for row in rows:   # the median trial's largest lead at an OK (DSSP's log)
        row["max_lead"] = median_of(runs, row).get("max_lead")
    predict(runs, rows, exp)
    rows = decorate(rows, exp)
    table = write_results(out, "results", rows, table_columns(exp))
    figures = []
    for cluster in clusters:
        title = cluster_title(exp, cluster)
        path = os.path.join(out, f"accuracy_vs_time_{cluster}.png")
        plot_accuracy(runs, rows, cluster, path, title)
        figures.append(path)
        points = [p for r in runs if r["cluster"] == cluster for p in r["curve"]]
        # both kinds of run record these with each evaluation: a launched run worker 0's
        # epochs and steps, a virtual one the job's pushes / n and the epochs they make
        for x, name in (("epoch", "epoch"), ("step", "iterations")):
            if points and all(x in p for p in points):
                path = os.path.join(out, f"accuracy_vs_{name}_{cluster}.png")
                plot_accuracy(runs, rows, cluster, path, title, x=x)
                figures.append(path)
        if any(p.kvstore == "dist_psp" for p in exp.paradigms):   # the PSP-SGD paper's figures
            path = os.path.join(out, f"test_error_vs_time_{cluster}.png")
            plot_accuracy(runs, rows, cluster, path, title, error=True)
            figures.append(path)
        path = os.path.join(out, f"dssp_threshold_{cluster}.png")
        if plot_thresholds(runs, rows, cluster, path, cluster):
            figures.append(path)
        path = os.path.join(out, f"staleness_{cluster}.png")
        if plot_staleness(runs, rows, cluster, path, title):
            figures.append(path)
    for kind, members in cluster_kinds(exp).items():   # a scaling study: one plot per kind
        for target in exp.targets:
            path = os.path.join(out, f"time_to_{target}_vs_workers_{kind}.png")
            if plot_time_to_target(rows, exp, target, [c for c in members if c in clusters],
                                   path, f"{exp.name}, {kind}: time to {target}"):
                figures.append(path)
    print()
    print(table)
    written = ["results.md", "results.csv", "runs.json"]
    agreement = agreement_rows(runs, exp)
    if agreement:   # a virtual cluster beside a real one on the same devices
        target = exp.targets[0] if exp.targets else None
        print(f"\nvirtual time against real jobs (medians of the seeds and of the trials):\n"
              + write_results(out, "agreement", agreement, agreement_columns(target)))
        written += ["agreement.md", "agreement.csv"]
    print(f"\nresults in {os.path.abspath(out)}: " + ", ".join(written) + ", "
          + ", ".join(os.path.basename(f) for f in figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
