"""Experiment configurations (``configs/*.yaml``) and what is computed from their runs.

A config names a training script and its arguments, the cluster (workers,
servers, and one or more named sets of worker speeds), the paradigms to
compare (a store type with its parameters), trials, and target accuracies.
Loading validates every key and value and names the bad one; the helpers
below expand a config into runs and reduce finished runs to the table.
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

import yaml

from .config import STORE_TYPES, StoreConfig, parse_speeds
from .horovod_params import HOROVOD_STORE_TYPES

TOP_KEYS = {"name", "description", "paper", "script", "args", "workers", "servers", "clusters",
            "trials", "targets", "paradigms", "timeout", "quick"}
PARADIGM_KEYS = {"name", "kvstore", "params", "backend"}
NATIVE_TYPES = {"dist_sync", "dist_async", "dist_sync_device", "dist_async_device"}


class ConfigError(ValueError):
    """A config file with an unknown key or a bad value (the message names it)."""


@dataclass
class Paradigm:
    name: str
    kvstore: str
    params: dict = field(default_factory=dict)
    backend: str = "kvstore_ext"

    def launch_options(self) -> list[str]:
        opts = ["--backend", self.backend] if self.backend != "kvstore_ext" else []
        if self.kvstore in HOROVOD_STORE_TYPES:   # decentralised: workers only, on Horovod
            opts += ["--launcher", "horovod"]
        for k, v in sorted(self.params.items()):
            if v is not None:   # None: the store's default
                opts += ["--kv-param", f"{k}={v}"]
        return opts


@dataclass
class Experiment:
    name: str
    script: str
    args: dict
    workers: int
    servers: int
    clusters: dict[str, list[float]]
    trials: int
    targets: list[float]
    paradigms: list[Paradigm]
    description: str = ""
    paper: str = ""
    timeout: float = 1800
    quick: dict = field(default_factory=dict)
    path: str = ""

    def runs(self, trials: int | None = None):
        """``(trial, cluster, paradigm)`` in interleaved order, so machine drift hits all alike."""
        for trial in range(trials or self.trials):
            for cluster in self.clusters:
                for paradigm in self.paradigms:
                    yield trial, cluster, paradigm

    def script_args(self, quick: bool = False) -> list[str]:
        merged = dict(self.args)
        if quick:
            merged.update(self.quick)
        out = []
        for k, v in merged.items():
            if v is True:
                out.append(f"--{k}")
            elif v is not False and v is not None:
                out += [f"--{k}", str(v)]
        return out


def _need(cond: bool, where: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"{where}: {message}")


def load_experiment(path: str) -> Experiment:
    """Read and validate a YAML experiment; every error names the file and the key."""
    with open(path) as f:
        raw = yaml.safe_load(f)
    where = os.path.basename(path)
    _need(isinstance(raw, dict), where, "must be a mapping of keys to values")
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} "
                          f"(known: {', '.join(sorted(TOP_KEYS))})")
    for key in ("name", "script", "paradigms"):
        _need(key in raw, where, f"missing key {key!r}")
    workers, servers = raw.get("workers", 2), raw.get("servers", 1)
    for key, value in (("workers", workers), ("servers", servers)):
        _need(isinstance(value, int) and not isinstance(value, bool) and value >= 1, where,
              f"{key} must be an integer >= 1, got {value!r}")
    trials = raw.get("trials", 1)
    _need(isinstance(trials, int) and not isinstance(trials, bool) and trials >= 1, where,
          f"trials must be an integer >= 1, got {trials!r}")
    args = raw.get("args") or {}
    _need(isinstance(args, dict), where, f"args must be a mapping, got {args!r}")
    quick = raw.get("quick") or {}
    _need(isinstance(quick, dict), where, f"quick must be a mapping, got {quick!r}")

    clusters_raw = raw.get("clusters") or {"default": [1.0] * workers}
    _need(isinstance(clusters_raw, dict), where, "clusters must map a name to a list of speeds")
    clusters = {}
    for name, speeds in clusters_raw.items():
        text = ",".join(str(s) for s in speeds) if isinstance(speeds, list) else str(speeds)
        try:
            clusters[str(name)] = parse_speeds(text, workers)
        except ValueError as exc:
            raise ConfigError(f"{where}: clusters.{name}: {exc}") from None

    targets = raw.get("targets") or []
    _need(isinstance(targets, list) and all(isinstance(t, (int, float)) and 0 < t <= 1
                                            for t in targets), where,
          f"targets must be a list of accuracies in (0, 1], got {targets!r}")

    paradigms = []
    _need(isinstance(raw["paradigms"], list) and raw["paradigms"], where,
          "paradigms must be a non-empty list")
    for i, entry in enumerate(raw["paradigms"]):
        at = f"{where}: paradigms[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{at}: must be a mapping with name and kvstore")
        unknown = sorted(set(entry) - PARADIGM_KEYS)
        if unknown:
            raise ConfigError(f"{at}: unknown key {unknown[0]!r} "
                              f"(known: {', '.join(sorted(PARADIGM_KEYS))})")
        if "kvstore" not in entry:
            raise ConfigError(f"{at}: missing key 'kvstore'")
        kvstore, params = str(entry["kvstore"]), dict(entry.get("params") or {})
        backend = entry.get("backend", "mxnet" if kvstore in NATIVE_TYPES else "kvstore_ext")
        if backend not in ("kvstore_ext", "mxnet"):
            raise ConfigError(f"{at}: backend must be kvstore_ext or mxnet, got {backend!r}")
        if backend == "kvstore_ext":
            if kvstore not in STORE_TYPES:
                raise ConfigError(f"{at}: unknown kvstore {kvstore!r} (kvstore_ext provides "
                                  f"{', '.join(sorted(STORE_TYPES))})")
            try:
                params = StoreConfig.build(kvstore, params).params
            except ValueError as exc:
                raise ConfigError(f"{at}: {exc}") from None
        elif params:
            raise ConfigError(f"{at}: MXNet's {kvstore} takes no params")
        paradigms.append(Paradigm(str(entry.get("name", kvstore)), kvstore, params, backend))
    names = [p.name for p in paradigms]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{where}: paradigm name {dup[0]!r} is used twice")

    return Experiment(name=str(raw["name"]), script=str(raw["script"]), args=args,
                      workers=workers, servers=servers, clusters=clusters, trials=trials,
                      targets=[float(t) for t in targets], paradigms=paradigms,
                      description=str(raw.get("description", "")), paper=str(raw.get("paper", "")),
                      timeout=float(raw.get("timeout", 1800)), quick=quick, path=path)


# -- reducing runs -------------------------------------------------------------------------------
def time_to_accuracy(curve: list[dict], target: float) -> float | None:
    """The first training time at which the test accuracy reached ``target`` (None: never)."""
    for point in curve:
        if point["test_accuracy"] >= target:
            return point["time_s"]
    return None


def median_run(runs: list[dict]) -> dict:
    """The trial whose final accuracy is the median (the lower middle one for an even count)."""
    ordered = sorted(runs, key=lambda r: (r["final_accuracy"], r["trial"]))
    return ordered[(len(ordered) - 1) // 2]


def summarise(runs: list[dict], targets: list[float]) -> list[dict]:
    """One row per (cluster, paradigm): the median trial's times to the targets, and spreads."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["cluster"], r["paradigm"]), []).append(r)
    rows = []
    for (cluster, paradigm), group in groups.items():
        chosen = median_run(group)
        row = {"cluster": cluster, "paradigm": paradigm, "trials": len(group),
               "median_trial": chosen["trial"], "final_accuracy": chosen["final_accuracy"],
               "train_time_s": chosen["train_time_s"],
               "iterations": chosen.get("iterations"),
               "wait_share": chosen.get("wait_share")}
        for target in targets:
            times = [time_to_accuracy(r["curve"], target) for r in group]
            row[f"time_to_{target}"] = time_to_accuracy(chosen["curve"], target)
            reached = [t for t in times if t is not None]
            row[f"reached_{target}"] = f"{len(reached)}/{len(group)}"
            row[f"median_time_to_{target}"] = statistics.median(reached) if reached else None
        rows.append(row)
    for row in rows:  # ratios to BSP in the same cluster; None where either did not reach
        bsp = next((r for r in rows if r["cluster"] == row["cluster"] and r["paradigm"] == "BSP"),
                   None)
        for target in targets:
            mine = row[f"time_to_{target}"]
            base = bsp[f"time_to_{target}"] if bsp else None
            row[f"vs_bsp_{target}"] = mine / base if mine is not None and base else None
    return rows
