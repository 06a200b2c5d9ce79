"""Experiment configurations (``configs/*.yaml``) and what is computed from their runs.

A config names a training script and its arguments, the cluster (workers,
servers, and one or more named sets of worker speeds), the paradigms to
compare (a store type with its parameters), trials, and target accuracies.
Loading validates every key and value and names the bad one; the helpers
below expand a config into runs and reduce finished runs to the table.
"""
from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field

import yaml

from .registry import STORE_TYPES, StoreConfig, is_horovod
from .devices import DeviceClock, parse_devices, parse_pattern
from .stragglers import parse_speeds

TOP_KEYS = {"name", "description", "paper", "script", "args", "workers", "servers", "clusters",
            "trials", "targets", "paradigms", "timeout", "quick", "env", "seed_by_trial"}
#: a cluster is a list of worker speeds, or a mapping with the speeds, their jitter (launch.py's
#: --speed-jitter/--speed-seed) and server fault injection (--delay-replies, --slow-server, --fault-seed)
#: or emulated devices: ``device`` (launch.py's --device), ``device_model``, ``device_batch``,
#: ``patterns`` (a list of --straggler-pattern specs); ``virtual: true`` runs the cluster in
#: virtual time in one process (:mod:`kvstore_ext.virtual_training`), with its own ``workers``,
#: the ``latency`` and server ``service`` time of a message (seconds), ``eval_every``
#: (virtual seconds between evaluations) or ``eval_every_iterations`` (evaluate when worker 0
#: completes every k-th iteration, as a launched run's ``--eval-interval``), ``lr`` (the
#: learning rate at this size, over the script's: the stores sum n workers' gradients),
#: ``patience`` (end a run after this many evaluations below its best accuracy), ``min_delta``
#: (with patience: a new best must beat the old by more than this, as Keras' EarlyStopping),
#: ``calibration`` (a ``plan calibrate`` JSON: the latency, service and apply times of the
#: planner's model of this job, instead of ``latency`` and ``service``), and ``compute:
#: calibration`` (iteration times from that calibration's compute of the model instead of
#: ``device``; ``speeds`` scale them per worker, ``workers_per_host`` workers share a host),
#: ``shared_host`` (with a calibration: every worker's exchange on one host's cores, slowed while
#: others compute, as launched runs on one machine are: true, by the calibration's interference,
#: or a number f, by 1 + (f - 1) k beside k others)
VIRTUAL_KEYS = {"virtual", "workers", "latency", "service", "eval_every", "lr", "patience",
                "min_delta", "latency_jitter",
                "calibration", "eval_every_iterations", "compute", "workers_per_host",
                "shared_host"}
#: where a virtual cluster's iteration times can come from besides emulated devices
COMPUTE_SOURCES = ("calibration",)
CLUSTER_KEYS = {"speeds", "speed_jitter", "speed_seed", "delay_replies", "slow_server", "fault_seed",
                "device", "device_model", "device_batch", "patterns"} | VIRTUAL_KEYS
#: a paradigm's ``args`` are the training script's arguments for its runs only, over the
#: experiment's (each paradigm at its own learning rate, say), under ``quick``'s
PARADIGM_KEYS = {"name", "kvstore", "params", "backend", "args"}
NATIVE_TYPES = {"dist_sync", "dist_async", "dist_sync_device", "dist_async_device"}


class ConfigError(ValueError):
    """A config file with an unknown key or a bad value (the message names it)."""


@dataclass
class Paradigm:
    name: str
    kvstore: str
    params: dict = field(default_factory=dict)
    backend: str = "kvstore_ext"
    args: dict = field(default_factory=dict)

    def launch_options(self) -> list[str]:
        opts = ["--backend", self.backend] if self.backend != "kvstore_ext" else []
        if is_horovod(self.kvstore):   # decentralised: workers only, on Horovod
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
    cluster_options: dict[str, dict] = field(default_factory=dict)  # cluster -> jitter, faults
    cluster_workers: dict[str, int] = field(default_factory=dict)   # a virtual cluster's n
    env: dict = field(default_factory=dict)                 # variables for every process
    #: each launched trial runs the script with ``--seed TRIAL``, as a virtual run is seeded
    #: by its trial (its initial weights then match): without it, every trial has one seed
    seed_by_trial: bool = False

    def launch_options(self, cluster: str) -> list[str]:
        """launch.py options of a cluster besides the speeds: jitter, fault injection, environment."""
        opts = []
        for key, value in sorted(self.cluster_options.get(cluster, {}).items()):
            if key == "patterns":
                for spec in value:
                    opts += ["--straggler-pattern", str(spec)]
            else:
                opts += [f"--{key.replace('_', '-')}", str(value)]
        for name, value in sorted(self.env.items()):
            opts += ["--env", f"{name}:{value}"]
        return opts

    def is_virtual(self, cluster: str) -> bool:
        """Whether a cluster runs in virtual time, in this process (no job is launched)."""
        return bool(self.cluster_options.get(cluster, {}).get("virtual"))

    def workers_of(self, cluster: str) -> int:
        return self.cluster_workers.get(cluster, self.workers)

    def uses_devices(self, cluster: str) -> bool:
        """Whether a cluster emulates devices (``--device``) rather than worker speeds."""
        return "device" in self.cluster_options.get(cluster, {})

    def times_iterations(self, cluster: str) -> bool:
        """Whether a cluster says how long its workers' iterations take in virtual time:
        emulated devices, or the planner's compute (``compute: calibration``)."""
        opts = self.cluster_options.get(cluster, {})
        return "device" in opts or "compute" in opts

    def device_clocks(self, cluster: str):
        """Each worker's :class:`~kvstore_ext.devices.DeviceClock`, as the cluster's workers build
        them (profiles timed at the training script's batch size unless the cluster names one),
        for the simulator's prediction of the same cluster."""
        opts = self.cluster_options[cluster]
        batch = opts.get("device_batch", self.args.get("batch-size", 128))
        return DeviceClock.for_cluster(str(opts["device"]), [str(p) for p in
                                                             opts.get("patterns", [])],
                                       self.workers_of(cluster), opts.get("device_model"),
                                       int(batch),
                                       int(opts.get("speed_seed", 0)))

    def runs(self, trials: int | None = None):
        """``(trial, cluster, paradigm)`` in interleaved order, so machine drift hits all alike."""
        for trial in range(trials or self.trials):
            for cluster in self.clusters:
                for paradigm in self.paradigms:
                    yield trial, cluster, paradigm

    def run_args(self, paradigm: Paradigm | None = None, quick: bool = False) -> dict:
        """The training script's arguments of a run: the experiment's, the paradigm's over
        them, and with ``quick`` the quick ones over both."""
        merged = dict(self.args)
        if paradigm is not None:
            merged.update(paradigm.args)
        if quick:
            merged.update(self.quick)
        return merged

    def script_args(self, paradigm: Paradigm | None = None, quick: bool = False,
                    trial: int | None = None) -> list[str]:
        """The script's command-line arguments of a run (with ``seed_by_trial``, ``trial``'s
        seed)."""
        out = ["--seed", str(trial)] if self.seed_by_trial and trial is not None else []
        for k, v in self.run_args(paradigm, quick).items():
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
    clusters, cluster_options = {}, {}
    cluster_workers = {}
    for name, speeds in clusters_raw.items():
        n = workers
        if isinstance(speeds, dict):
            cluster_options[str(name)] = _cluster_options(speeds, f"{where}: clusters.{name}",
                                                          servers, workers)
            n = cluster_options[str(name)].get("workers", workers)
            if n != workers:
                cluster_workers[str(name)] = n
            if "device" in speeds:   # relative speeds of the devices, for labels and plots
                times = parse_devices(str(speeds["device"]), n, speeds.get("device_model"),
                                      int(speeds.get("device_batch", 128)))
                speeds = [round(min(times) / t, 3) for t in times]
            else:
                speeds = speeds.get("speeds", 1.0)
        text = ",".join(str(s) for s in speeds) if isinstance(speeds, list) else str(speeds)
        try:
            clusters[str(name)] = parse_speeds(text, n)
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
        run_args = entry.get("args") or {}
        _need(isinstance(run_args, dict), at, f"args must be a mapping of the training script's "
                                               f"arguments, got {run_args!r}")
        paradigms.append(Paradigm(str(entry.get("name", kvstore)), kvstore, params, backend,
                                  dict(run_args)))
    names = [p.name for p in paradigms]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{where}: paradigm name {dup[0]!r} is used twice")

    env = raw.get("env") or {}
    _need(isinstance(env, dict) and all(isinstance(k, str) and k.isidentifier() for k in env),
          where, f"env must map variable names to values, got {env!r}")

    seed_by_trial = raw.get("seed_by_trial", False)
    _need(isinstance(seed_by_trial, bool), where,
          f"seed_by_trial must be true or false, got {seed_by_trial!r}")
    _need(not (seed_by_trial and "seed" in args), where,
          "give seed_by_trial (each trial its own --seed) or args: seed, not both")

    return Experiment(name=str(raw["name"]), script=str(raw["script"]), args=args,
                      workers=workers, servers=servers, clusters=clusters, trials=trials,
                      targets=[float(t) for t in targets], paradigms=paradigms,
                      description=str(raw.get("description", "")), paper=str(raw.get("paper", "")),
                      timeout=float(raw.get("timeout", 1800)), quick=quick, path=path,
                      cluster_options=cluster_options, cluster_workers=cluster_workers,
                      env={k: str(v) for k, v in env.items()}, seed_by_trial=seed_by_trial)


def _cluster_options(entry: dict, at: str, servers: int, workers: int) -> dict:
    """A cluster's speed jitter, devices and fault injection, checked as launch.py checks them."""
    from .ps.faults import parse_delay_replies, parse_slow_server
    unknown = sorted(set(entry) - CLUSTER_KEYS)
    if unknown:
        raise ConfigError(f"{at}: unknown key {unknown[0]!r} (known: {', '.join(sorted(CLUSTER_KEYS))})")
    out = {k: v for k, v in entry.items() if k != "speeds"}
    virtual = sorted(set(out) & VIRTUAL_KEYS - {"virtual"})
    if virtual and out.get("virtual") is not True:
        raise ConfigError(f"{at}: {virtual[0]} is for a virtual-time cluster (virtual: true)")
    _need(out.get("virtual", False) in (True, False), at,
          f"virtual must be true or false, got {out.get('virtual')!r}")
    for key in ("workers", "patience", "eval_every_iterations", "workers_per_host"):
        value = out.get(key, 1)
        _need(isinstance(value, int) and not isinstance(value, bool) and value >= 1, at,
              f"{key} must be an integer >= 1, got {value!r}")
    if "min_delta" in out and "patience" not in out:
        raise ConfigError(f"{at}: min_delta is how much a new best must beat the old by before "
                          f"patience runs out: give patience too")
    if "eval_every" in out and "eval_every_iterations" in out:
        raise ConfigError(f"{at}: give eval_every (virtual seconds) or eval_every_iterations "
                          f"(worker 0's iterations), not both")
    workers = out.get("workers", workers)
    for key, what in (("latency", "seconds"), ("service", "seconds"),
                      ("eval_every", "virtual seconds"), ("lr", "a learning rate"),
                      ("min_delta", "an accuracy")):
        value = out.get(key, 0.0)
        _need(isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
              and math.isfinite(value), at, f"{key} must be {what} >= 0, got {value!r}")
    jitter = out.get("latency_jitter", 0.0)
    _need(isinstance(jitter, (int, float)) and not isinstance(jitter, bool)
          and 0 <= jitter <= 1, at,
          f"latency_jitter must be a fraction of the latency in [0, 1], got {jitter!r}")
    if "calibration" in out:
        _need(isinstance(out["calibration"], str) and out["calibration"], at,
              f"calibration must be the path of a 'plan calibrate' JSON, got {out['calibration']!r}")
        given = sorted(set(out) & {"latency", "service"})
        if given:
            raise ConfigError(f"{at}: give calibration (the planner's message costs) or "
                              f"{given[0]}, not both")
    if "shared_host" in out:
        value = out["shared_host"]
        _need(isinstance(value, bool) or (isinstance(value, (int, float)) and
                                          math.isfinite(value) and value >= 1), at,
              f"shared_host must be true, false or an exchange's slow-down beside another "
              f"worker's compute (a number >= 1), got {value!r}")
        _need("calibration" in out or value is False, at,
              "shared_host needs calibration (the host's compute of the model and its "
              "interference come from the 'plan calibrate' JSON)")
    if "compute" in out:
        _need(out["compute"] in COMPUTE_SOURCES, at,
              f"compute must be calibration (the planner's compute of the model, from the "
              f"calibration's profile), got {out['compute']!r}")
        _need("calibration" in out, at,
              "compute: calibration needs calibration (the 'plan calibrate' JSON it reads)")
        if "device" in out:
            raise ConfigError(f"{at}: give device (emulated devices) or compute "
                              f"({out['compute']}), not both")
    elif "workers_per_host" in out:
        raise ConfigError(f"{at}: workers_per_host is for compute: calibration (how many "
                          f"workers share a host, slowed by the calibration's interference)")
    if out.get("virtual") is True:
        _need("device" in out or "compute" in out, at,
              "a virtual cluster needs device (emulated devices) or compute: calibration (the "
              "planner's compute): its workers' iteration times")
        if "speed_jitter" in out:
            raise ConfigError(f"{at}: speed_jitter is for launched workers; a virtual cluster "
                              f"varies its iteration times by patterns (jitter:J)")
    device_keys = sorted(set(out) & {"device_model", "device_batch"})
    if device_keys and "device" not in out:
        raise ConfigError(f"{at}: {device_keys[0]} needs device (the emulated devices)")
    if "patterns" in out and "device" not in out and "compute" not in out:
        raise ConfigError(f"{at}: patterns needs device (the emulated devices) or compute")
    if "device" in out:
        if "speeds" in entry or "speed_jitter" in entry:
            raise ConfigError(f"{at}: give device (emulated devices) or speeds, not both")
        patterns = out.get("patterns", [])
        _need(isinstance(patterns, list), at, f"patterns must be a list, got {patterns!r}")
        try:
            DeviceClock.for_cluster(str(out["device"]), [str(p) for p in patterns], workers,
                                    out.get("device_model"), int(out.get("device_batch", 128)),
                                    int(out.get("speed_seed", 0)))
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{at}: {exc}") from None
    elif "patterns" in out:
        patterns = out["patterns"]
        _need(isinstance(patterns, list), at, f"patterns must be a list, got {patterns!r}")
        try:
            for i, spec in enumerate(patterns):
                parse_pattern(str(spec), 0, workers, int(out.get("speed_seed", 0)), i)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{at}: {exc}") from None
    try:
        if "delay_replies" in out:
            parse_delay_replies(str(out["delay_replies"]))
        if "slow_server" in out:
            parse_slow_server(str(out["slow_server"]), servers)
    except ValueError as exc:
        raise ConfigError(f"{at}: {exc}") from None
    jitter = out.get("speed_jitter", 0.0)
    _need(isinstance(jitter, (int, float)) and not isinstance(jitter, bool) and 0 <= jitter < 1,
          at, f"speed_jitter must be a number in [0, 1), got {jitter!r}")
    for key in ("fault_seed", "speed_seed"):
        seed = out.get(key, 0)
        _need(isinstance(seed, int) and not isinstance(seed, bool), at,
              f"{key} must be an integer, got {seed!r}")
    return out


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


def median_of(runs: list[dict], row: dict) -> dict:
    """The run behind a row of :func:`summarise`: its cluster's and paradigm's median trial."""
    return next(r for r in runs if r["cluster"] == row["cluster"] and
                r["paradigm"] == row["paradigm"] and r["trial"] == row["median_trial"])


def histogram_mean(counts: dict) -> float | None:
    """The mean of a histogram ``{value: count}`` (values as ints or strings), or None."""
    total = sum(counts.values())
    return sum(int(k) * v for k, v in counts.items()) / total if total else None


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


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
               "staleness_mean": chosen.get("staleness_mean"),
               "wait_share": chosen.get("wait_share"),
               # averages over the trials, as the PSP-SGD paper reports them
               "running_time_s": _mean(r.get("running_time_s") for r in group),
               "test_error": _mean(1 - r["final_accuracy"] for r in group),
               "pushes_dropped": _mean(r.get("pushes_dropped") for r in group)}
        for target in targets:
            times = [time_to_accuracy(r["curve"], target) for r in group]
            row[f"time_to_{target}"] = time_to_accuracy(chosen["curve"], target)
            reached = [t for t in times if t is not None]
            row[f"reached_{target}"] = f"{len(reached)}/{len(group)}"
            row[f"median_time_to_{target}"] = statistics.median(reached) if reached else None
        rows.append(row)
    for cluster in {r["cluster"] for r in rows}:   # running time against the first paradigm
        mine = [r for r in rows if r["cluster"] == cluster]
        base = mine[0]["running_time_s"]
        for r in mine:
            r["running_vs_first"] = (r["running_time_s"] / base
                                     if base and r["running_time_s"] is not None else None)
    for row in rows:  # ratios to BSP in the same cluster; None where either did not reach
        bsp = next((r for r in rows if r["cluster"] == row["cluster"] and r["paradigm"] == "BSP"),
                   None)
        for target in targets:
            mine = row[f"time_to_{target}"]
            base = bsp[f"time_to_{target}"] if bsp else None
            row[f"vs_bsp_{target}"] = mine / base if mine is not None and base else None
    return rows


# -- validation curves (the Adaptable Asynchrony experiments) -----------------------------------

def early_stop(losses: list[float], patience: int,
               min_delta: float = 0.0) -> tuple[int, int]:
    """``(stop, best)`` indices of early stopping on a validation-loss curve: training stops at
    the first measurement ``patience`` after the lowest so far (or at the end), and keeps the
    weights of the lowest measurement up to there. As Keras' ``EarlyStopping``, a measurement
    is a new low only when it is below the low by more than ``min_delta``."""
    if not losses:
        raise ValueError("early stopping needs at least one validation measurement")
    if patience < 1:
        raise ValueError(f"patience must be >= 1 measurement, got {patience}")
    if not min_delta >= 0:
        raise ValueError(f"min_delta must be >= 0, got {min_delta}")
    low = 0
    for i, loss in enumerate(losses):
        if loss < losses[low] - min_delta:
            low = i
        if i - low >= patience:
            return i, low
    return len(losses) - 1, low


def pool_spikes(losses: list[float], pools: list[int], window: int = 3) -> list[float]:
    """For every change of the pool's size between two measurements: how far the validation
    loss rose above its last value before the change, at most ``window`` measurements after
    (negative: it kept falling)."""
    if len(losses) != len(pools):
        raise ValueError(f"{len(losses)} losses but {len(pools)} pool sizes")
    return [max(losses[i:i + window]) - losses[i - 1]
            for i in range(1, len(losses)) if pools[i] != pools[i - 1]]
