"""Store types, their parameters, and the job environment (``KVX_*`` variables).

The role and address variables are deliberately not MXNet's ``DMLC_*`` names:
``import mxnet`` in a process whose ``DMLC_ROLE`` is ``server`` turns it into an
MXNet ps-lite server.  ``DMLC_*`` stays free for running MXNet's own stores
side by side as baselines.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from .horovod_params import HOROVOD_STORE_TYPES
from .policies import check_staleness
from .policies.psp import check_psp_params

ROLE = "KVX_ROLE"
SCHEDULER_HOST = "KVX_SCHEDULER_HOST"
SCHEDULER_PORT = "KVX_SCHEDULER_PORT"
NUM_WORKER = "KVX_NUM_WORKER"
NUM_SERVER = "KVX_NUM_SERVER"
SECRET = "KVX_SECRET"
NODE_HOST = "KVX_NODE_HOST"
WORKER_RANK = "KVX_WORKER_RANK"
STORE_PARAMS = "KVX_STORE_PARAMS"
ON_WORKER_DEATH = "KVX_ON_WORKER_DEATH"
HEARTBEAT_INTERVAL = "KVX_HEARTBEAT_INTERVAL"
HEARTBEAT_TIMEOUT = "KVX_HEARTBEAT_TIMEOUT"
START_TIMEOUT = "KVX_START_TIMEOUT"
WINDOW_MB = "KVX_WINDOW_MB"
METRICS_DIR = "KVX_METRICS_DIR"
BIGARRAY_BOUND = "KVX_BIGARRAY_BOUND"
WORKER_SPEED = "KVX_WORKER_SPEED"     # straggler emulation: speed of each worker, "1.0,0.43"
SPEED_JITTER = "KVX_SPEED_JITTER"
SPEED_SEED = "KVX_SPEED_SEED"

#: what makes a process a node of one particular job (never inherited by a new job)
IDENTITY_VARIABLES = (ROLE, SCHEDULER_HOST, SCHEDULER_PORT, NUM_WORKER, NUM_SERVER, SECRET,
                      NODE_HOST, WORKER_RANK)

ON_DEATH_CHOICES = ("fail", "continue")


def _no_params(params: dict) -> dict:
    return {}


def _ssp_params(params: dict) -> dict:
    return {"staleness": check_staleness("staleness", params.get("staleness", 3))}


def _dssp_params(params: dict) -> dict:
    lower = check_staleness("staleness_lower", params.get("staleness_lower", 3))
    upper = check_staleness("staleness_upper", params.get("staleness_upper", 15))
    if upper < lower:
        raise ValueError(f"staleness_upper must be >= staleness_lower, got "
                         f"staleness_lower={lower}, staleness_upper={upper}")
    return {"staleness_lower": lower, "staleness_upper": upper}


#: store type -> (parameter names, validator returning the normalised parameters)
STORE_TYPES = {
    "dist_bsp": ((), _no_params),
    "dist_asp": ((), _no_params),
    "dist_ssp": (("staleness",), _ssp_params),
    "dist_dssp": (("staleness_lower", "staleness_upper"), _dssp_params),
    "dist_psp": (("min_pushes", "min_pull_fraction", "push_timeout", "pull_timeout"),
                 check_psp_params),
    **HOROVOD_STORE_TYPES,   # decentralised: dist_dcs3gd, dist_ssgd
}
#: the types served by this project's scheduler and servers (the rest run on Horovod)
PARAMETER_SERVER_TYPES = tuple(t for t in STORE_TYPES if t not in HOROVOD_STORE_TYPES)


@dataclass(frozen=True)
class StoreConfig:
    """A store type with its validated parameters; every worker of a job must agree on it."""

    type: str
    params: dict = field(default_factory=dict)

    @classmethod
    def build(cls, store_type: str, params: dict | None = None) -> "StoreConfig":
        name = str(store_type).lower()
        if name not in STORE_TYPES:
            raise ValueError(f"unknown kvstore type {store_type!r}; kvstore_ext provides "
                             f"{', '.join(sorted(STORE_TYPES))}")
        allowed, validate = STORE_TYPES[name]
        params = dict(params or {})
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            what = ", ".join(allowed) if allowed else "none"
            raise ValueError(f"unknown parameter {unknown[0]!r} for kvstore type {name!r} "
                             f"(its parameters: {what})")
        return cls(name, validate(params))

    def describe(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.type}({inner})"

    def to_wire(self) -> dict:
        return {"type": self.type, "params": self.params}


def parse_speeds(text: str, num_workers: int | None = None) -> list[float]:
    """Worker speed factors from ``"1.0,0.43"``: each in (0, 1], one per worker (or one for all)."""
    speeds = []
    for part in str(text).split(","):
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"worker speed {part.strip()!r} is not a number (in {text!r})") from None
        if not 0 < value <= 1:
            raise ValueError(f"worker speed {value} must be in (0, 1] (1.0 = full speed; "
                             f"0.43 makes each iteration take 1/0.43 = 2.3 times as long)")
        speeds.append(value)
    if num_workers is not None and len(speeds) not in (1, num_workers):
        raise ValueError(f"{len(speeds)} worker speeds given ({text!r}) for {num_workers} workers; "
                         f"give one per worker or one for all")
    if num_workers is not None and len(speeds) == 1:
        speeds = speeds * num_workers
    return speeds


def stretched_time(compute: float, speed: float, jitter_draw: float = 0.0) -> float:
    """How long an iteration of ``compute`` seconds takes on a worker of ``speed``.

    ``compute / speed``, times ``1 + jitter_draw`` (a draw from ``[-jitter, jitter]``), but
    never less than ``compute``: an emulated straggler can only sleep, not run faster.
    The straggler emulation and the simulator both use this rule.
    """
    return max(compute, compute / speed * (1.0 + jitter_draw))


def params_from_env() -> dict:
    """Store parameters given to the whole job by ``launch.py --kv-param`` (JSON)."""
    raw = os.environ.get(STORE_PARAMS, "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{STORE_PARAMS} is not valid JSON: {raw!r} ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{STORE_PARAMS} must be a JSON object, got {raw!r}")
    return value


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {raw!r}")
    return value


@dataclass
class JobEnv:
    """Where the scheduler is and how the job behaves, read from ``KVX_*`` variables."""

    scheduler_host: str
    scheduler_port: int
    num_workers: int
    num_servers: int
    secret: bytes
    node_host: str
    worker_rank: int | None
    on_worker_death: str
    heartbeat_interval: float
    heartbeat_timeout: float
    metrics_dir: str | None
    bigarray_bound: int
    start_timeout: float = 600.0
    window_bytes: int = 64 << 20

    @property
    def limits(self):
        from .transport import Limits
        return Limits.from_environ(self.heartbeat_interval, self.heartbeat_timeout, self.secret)

    @classmethod
    def from_environ(cls, role: str) -> "JobEnv":
        env = os.environ
        missing = [v for v in (SCHEDULER_HOST, SCHEDULER_PORT, NUM_WORKER, NUM_SERVER, SECRET)
                   if not env.get(v)]
        if missing:
            raise RuntimeError(
                f"kvstore_ext {role}: {', '.join(missing)} not set. Distributed stores run in a job "
                f"started by scripts/launch.py, e.g. `python scripts/launch.py -n 2 -s 1 "
                f"--launcher local python train.py`")
        on_death = env.get(ON_WORKER_DEATH, "fail")
        if on_death not in ON_DEATH_CHOICES:
            raise ValueError(f"{ON_WORKER_DEATH} must be one of {ON_DEATH_CHOICES}, got {on_death!r}")
        # an MPI launcher gives each worker its rank in its own variable
        rank = env.get(WORKER_RANK) or env.get("OMPI_COMM_WORLD_RANK") or env.get("PMI_RANK")
        try:
            secret = bytes.fromhex(env[SECRET])
        except ValueError:
            raise ValueError(f"{SECRET} must be hex (as launch.py makes it)") from None
        if len(secret) < 16:
            raise ValueError(f"{SECRET} must hold at least 16 bytes (32 hex digits)")
        interval = _env_float(HEARTBEAT_INTERVAL, 1.0)
        return cls(
            scheduler_host=env[SCHEDULER_HOST],
            scheduler_port=int(env[SCHEDULER_PORT]),
            num_workers=int(env[NUM_WORKER]),
            num_servers=int(env[NUM_SERVER]),
            secret=secret,
            node_host=env.get(NODE_HOST) or env[SCHEDULER_HOST],
            worker_rank=int(rank) if rank not in (None, "") else None,
            on_worker_death=on_death,
            heartbeat_interval=interval,
            heartbeat_timeout=_env_float(HEARTBEAT_TIMEOUT, max(10.0, 5 * interval)),
            metrics_dir=env.get(METRICS_DIR) or None,
            bigarray_bound=int(env.get(BIGARRAY_BOUND, "1000000")),
            start_timeout=_env_float(START_TIMEOUT, 600.0),
            window_bytes=int(_env_float(WINDOW_MB, 64.0) * 2 ** 20),
        )

    @property
    def scheduler_address(self) -> str:
        return f"tcp://{self.scheduler_host}:{self.scheduler_port}"
