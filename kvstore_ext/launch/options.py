"""What the launch options mean, shared by every kind of job: environment pairs, store
parameters, the workers' command and the straggler emulation's variables."""
from __future__ import annotations

import json
import os
import sys

from .. import devices, jobenv, stragglers


def parse_env_pairs(items) -> dict:
    out = {}
    for item in items:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            if ":" in part:
                name, value = part.split(":", 1)
            elif "=" in part:
                name, value = part.split("=", 1)
            else:
                name, value = part, os.environ.get(part, "")
            out[name] = value
    return out


def parse_kv_params(items) -> dict:
    params = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"launch.py: --kv-param expects NAME=VALUE, got {item!r}")
        name, value = item.split("=", 1)
        try:
            params[name] = json.loads(value)
        except json.JSONDecodeError:
            params[name] = value
    return params


def worker_command(args, local: bool) -> list[str]:
    """The command each worker runs; on this machine a leading ``python`` is the launcher's
    own interpreter (the project's virtualenv)."""
    command = args.command[1:] if args.command[:1] == ["--"] else list(args.command)
    if not command:
        raise SystemExit("launch.py: give the command each worker runs")
    if local and command[0] in ("python", "python3"):
        command = [sys.executable] + command[1:]
    return command


def straggler_env(args) -> dict:
    """``--device`` (with its model, batch and patterns) or ``--worker-speed`` (with its jitter),
    and ``--speed-seed``, as the workers' variables; every value checked here, named if bad."""
    device = getattr(args, "device", None)
    patterns = getattr(args, "straggler_pattern", None) or []
    if device:
        if args.worker_speed:
            raise SystemExit("launch.py: --device and --worker-speed are two emulations of slow "
                             "devices; give one")
        try:
            devices.DeviceClock.for_cluster(device, patterns, args.num_workers,
                                            args.device_model, args.device_batch or 128,
                                            args.speed_seed)
        except ValueError as exc:
            raise SystemExit(f"launch.py: --device/--straggler-pattern: {exc}") from None
        env = {jobenv.DEVICE: device, jobenv.SPEED_SEED: str(args.speed_seed),
               jobenv.STRAGGLER_PATTERNS: ";".join(patterns)}
        if args.device_model:
            env[jobenv.DEVICE_MODEL] = args.device_model
        if args.device_batch:
            env[jobenv.DEVICE_BATCH] = str(args.device_batch)
        return env
    if patterns:
        raise SystemExit("launch.py: --straggler-pattern needs --device (the device time it "
                         "slows down)")
    if not args.worker_speed:
        return {}
    try:
        speeds = stragglers.parse_speeds(args.worker_speed, args.num_workers)
    except ValueError as exc:
        raise SystemExit(f"launch.py: --worker-speed: {exc}") from None
    if not 0 <= args.speed_jitter < 1:
        raise SystemExit(f"launch.py: --speed-jitter must be in [0, 1), got {args.speed_jitter}")
    return {jobenv.WORKER_SPEED: ",".join(map(str, speeds)),
            jobenv.SPEED_JITTER: str(args.speed_jitter), jobenv.SPEED_SEED: str(args.speed_seed)}


def autoload_env(args, env: dict, local: bool = True) -> dict:
    """A worker's ``PYTHONPATH`` with :mod:`kvstore_ext.launch.autoload` first, so that its
    script's ``import mxnet`` registers the stores (unless ``--no-autoload``).  A worker on
    another host (ssh, mpi) gets the folder as ``KVX_AUTOLOAD`` instead: the guard it runs
    under puts it first on that host's own ``PYTHONPATH``, or this host's kvstore_ext's
    folder where the path is not there (see ``process.REMOTE_GUARD``)."""
    if getattr(args, "no_autoload", False):
        return {}
    from .autoload import FOLDER
    if not local:
        return {jobenv.AUTOLOAD: FOLDER}
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != FOLDER]
    return {"PYTHONPATH": os.pathsep.join([FOLDER, *rest])}


def store_env(args) -> dict:
    """``--kv-param``, ``--metrics-dir`` and ``--plugin`` as every process's variables."""
    env = {}
    if args.kv_param:
        env[jobenv.STORE_PARAMS] = json.dumps(parse_kv_params(args.kv_param))
    if args.metrics_dir:
        env[jobenv.METRICS_DIR] = os.path.abspath(args.metrics_dir)
    if args.plugin:
        env[jobenv.PLUGINS] = ",".join(args.plugin)
    return env
