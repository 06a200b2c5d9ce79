#!/usr/bin/env python3
"""Run the Adaptable Asynchrony experiments (E1-E6) from their config.

    python scripts/aa_experiments.py E3 E5 E6          # the pool experiments
    python scripts/aa_experiments.py E2 --seeds 1      # one seed only
    python scripts/aa_experiments.py E3 --report-only  # rebuild tables and plots from runs.json

The config is configs/adaptable_asynchrony/experiments.yaml.

Each variant of an experiment is a dist_pool job of scripts/train_pool.py through launch.py
(emulated devices, the config's seeds, variants interleaved seed by seed so that drift hits all
alike).  Worker 0 measures the validation loss every few of its steps.  Reported per variant,
medians over the seeds: the lowest validation loss and when it came (updates, seconds), the
time early stopping would stop (the config's patience, in measurements), the test accuracy of
the weights with the lowest validation loss, the final validation loss, the job's time, and
the largest jump of the validation loss after a change of the pool (a spike).  Writes into
--out (default results/adaptable_asynchrony): runs.json, <E>.json/.csv/.md and
<E>_val_loss.png (validation loss against updates and time, the pool's size overlaid).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, ROOT)

from tqdm import tqdm  # noqa: E402

from kvstore_ext.experiments import early_stop, pool_spikes  # noqa: E402
from kvstore_ext.launch import run_local_job  # noqa: E402
from kvstore_ext.reports import write_results  # noqa: E402

SCRIPT = os.path.join(HERE, "train_pool.py")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("experiments", nargs="*", help="E1 ... E6 (default: all in the config)")
    p.add_argument("--config",
                   default=os.path.join(ROOT, "configs", "adaptable_asynchrony", "experiments.yaml"),
                   help="the experiments' YAML "
                        "(default configs/adaptable_asynchrony/experiments.yaml)")
    p.add_argument("--out", default=None, help="results folder (default results/<config name>)")
    p.add_argument("--seeds", type=int, default=None, help="use only the first N seeds")
    p.add_argument("--quick", action="store_true", help="apply the config's 'quick' settings")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: rebuild tables and plots from --out/runs.json")
    return p.parse_args(argv)


def merged(*layers: dict) -> dict:
    out = {}
    for layer in layers:
        for k, v in (layer or {}).items():
            out[k] = {**out.get(k, {}), **v} if isinstance(v, dict) else v
    return out


def plan(config: dict, names: list[str], seeds: int | None, quick: bool):
    """``(experiment, variant, seed, settings)`` in run order: seed by seed, variants interleaved."""
    unknown = [n for n in names if n not in config["experiments"]]
    if unknown:
        raise SystemExit(f"aa_experiments.py: no experiment {unknown[0]!r} in the config "
                         f"(it has {', '.join(config['experiments'])})")
    out = []
    for name in names:
        exp = config["experiments"][name]
        exp_seeds = exp.get("seeds", config["seeds"])[:seeds or None]
        for seed in exp_seeds:
            for variant, spec in exp["variants"].items():
                settings = merged({"workers": config["workers"], "args": {}, "kv": {}},
                                  config["common"], spec, config.get("quick") if quick else {})
                out.append((name, variant, seed, settings))
    return out


def run_one(config, settings, seed: int, workdir: str) -> dict:
    kv = settings["kv"]
    options = ["--device", str(settings.get("device", config["device"])),
               "--metrics-dir", os.path.join(workdir, "m")]
    for k, v in kv.items():
        options += ["--kv-param", f"{k}={v}"]
    args = [SCRIPT, "--seed", str(seed), "--out", os.path.join(workdir, "w-{rank}.json")]
    for k, v in settings["args"].items():
        args += [f"--{k}", str(v)]
    t0 = time.perf_counter()
    run_local_job(settings["workers"], config["servers"], [sys.executable, *args],
                  options=options, timeout=1200)
    seconds = time.perf_counter() - t0
    workers = []
    for r in range(settings["workers"]):
        with open(os.path.join(workdir, f"w-{r}.json")) as f:
            workers.append(json.load(f))
    w0 = workers[0]
    return {"seed": seed, "job_seconds": seconds, "curve": w0["curve"], "best": w0.get("best"),
            "final_test_accuracy": w0["test_accuracy"],
            "train_time_s": max(w["wall_time_s"] for w in workers),
            "samples": sum(w["samples"] for w in workers),
            "steps": [len(w["steps"]) for w in workers],
            "host_share": [w.get("device", {}).get("host_share") for w in workers]}


def summarise_run(run: dict, patience: int) -> dict:
    """The early-stopping figures and the largest spike of one run's validation curve."""
    curve = run["curve"]
    if not curve:
        return {}
    losses = [p["val_loss"] for p in curve]
    best_i = min(range(len(curve)), key=lambda i: losses[i])
    stop_i, _ = early_stop(losses, patience)
    spikes = pool_spikes(losses, [p["pool"] for p in curve])
    return {"min_val_loss": curve[best_i]["val_loss"], "updates_at_min": curve[best_i]["updates"],
            "time_at_min_s": curve[best_i]["time_s"], "stop_time_s": curve[stop_i]["time_s"],
            "stop_updates": curve[stop_i]["updates"],
            "stopped_val_loss": min(p["val_loss"] for p in curve[:stop_i + 1]),
            "final_val_loss": curve[-1]["val_loss"],
            "largest_spike": max(spikes) if spikes else None,
            "best_test_accuracy": (run.get("best") or {}).get("test_accuracy")}


def table(runs: list[dict], name: str, patience: int) -> list[dict]:
    rows = []
    variants = list(dict.fromkeys(r["variant"] for r in runs if r["experiment"] == name))
    for variant in variants:
        mine = [r for r in runs if r["experiment"] == name and r["variant"] == variant]
        stats = [summarise_run(r, patience) for r in mine]
        row = {"experiment": name, "variant": variant, "seeds": len(mine)}
        for key in ("min_val_loss", "updates_at_min", "time_at_min_s", "stop_time_s",
                    "stopped_val_loss", "final_val_loss", "largest_spike", "best_test_accuracy"):
            values = [s[key] for s in stats if s.get(key) is not None]
            row[key] = statistics.median(values) if values else None
            row[key + "_all"] = values
        row["train_time_s"] = statistics.median(r["train_time_s"] for r in mine)
        row["runs"] = mine
        shares = [h for r in mine for h in r["host_share"] if h is not None]
        row["host_share_max"] = max(shares) if shares else None
        rows.append(row)
    # time to the first variant's (median) lowest loss: the same minimum, how much sooner
    target = rows[0]["min_val_loss"] if rows else None
    for row in rows:
        times = [next((p["time_s"] for p in r["curve"] if p["val_loss"] <= target), None)
                 for r in row.pop("runs")] if target is not None else []
        reached = [t for t in times if t is not None]
        row["target_loss"] = target
        row["time_to_target_s"] = statistics.median(reached) if len(reached) * 2 > len(times) \
            else None
        row["reached_target"] = f"{len(reached)}/{len(times)}"
    return rows


COLUMNS = [("variant", "variant", "{}"), ("seeds", "seeds", "{}"),
           ("lowest val loss", "min_val_loss", "{:.4f}"),
           ("at update", "updates_at_min", "{:.0f}"), ("at time (s)", "time_at_min_s", "{:.1f}"),
           ("early stop (s)", "stop_time_s", "{:.1f}"),
           ("time to 1st row's lowest (s)", "time_to_target_s", "{:.1f}"),
           ("reached", "reached_target", "{}"),
           ("test acc (best weights)", "best_test_accuracy", "{:.4f}"),
           ("final val loss", "final_val_loss", "{:.4f}"),
           ("largest spike", "largest_spike", "{:.4f}"),
           ("job time (s)", "train_time_s", "{:.1f}"), ("max host share", "host_share_max", "{:.2f}")]


def plot(runs: list[dict], rows: list[dict], name: str, title: str, path: str) -> None:
    """Each variant's median run (by lowest validation loss): validation loss against updates
    and against time, with the pool's size on a second axis."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    twins = [ax.twinx() for ax in axes]
    for k, row in enumerate(rows):
        mine = [r for r in runs if r["experiment"] == name and r["variant"] == row["variant"]
                and r["curve"]]
        if not mine:
            continue
        mine.sort(key=lambda r: min(p["val_loss"] for p in r["curve"]))
        run = mine[len(mine) // 2]
        color = f"C{k}"
        for ax, twin, x in zip(axes, twins, ("updates", "time_s")):
            xs = [p[x] for p in run["curve"]]
            ax.plot(xs, [p["val_loss"] for p in run["curve"]], color=color, label=row["variant"])
            twin.step(xs, [p["pool"] for p in run["curve"]], where="post", color=color,
                      alpha=0.3, ls="--")
    for ax, twin, label in zip(axes, twins, ("updates applied", "training time (s)")):
        ax.set_xlabel(label)
        ax.set_ylabel("validation loss (worker 0)")
        twin.set_ylabel("workers in the pool (dashed)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{name}: {title}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    with open(args.config) as f:
        config = yaml.safe_load(f)
    names = args.experiments or list(config["experiments"])
    out = args.out or os.path.join(ROOT, "results", config["name"])
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "runs.json")
    runs = []
    if os.path.exists(path):
        with open(path) as f:
            runs = json.load(f)["runs"]
    todo = [] if args.report_only else plan(config, names, args.seeds, args.quick)
    if todo:   # a new run of an experiment replaces its old runs
        runs = [r for r in runs if r["experiment"] not in names]
    bar = tqdm(todo, desc="adaptable asynchrony", unit="run", disable=not todo)
    for name, variant, seed, settings in bar:
        bar.set_postfix_str(f"{name} {variant} seed {seed}")
        with tempfile.TemporaryDirectory() as workdir:
            run = run_one(config, settings, seed, workdir)
        run.update(experiment=name, variant=variant, settings=settings)
        runs.append(run)
        with open(path, "w") as f:
            json.dump({"config": args.config, "command": " ".join(sys.argv), "runs": runs}, f)
        best = summarise_run(run, config["patience"])
        tqdm.write(f"{name} {variant:<24} seed {seed}: lowest val loss "
                   f"{best.get('min_val_loss', float('nan')):.4f}, job {run['train_time_s']:.1f} s")
    for name in names:
        rows = table(runs, name, config["patience"])
        if not rows:
            continue
        text = write_results(out, name, rows, COLUMNS)
        title = config["experiments"][name]["title"]
        plot(runs, rows, name, title, os.path.join(out, f"{name}_val_loss.png"))
        print(f"\n{name}: {title}\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
