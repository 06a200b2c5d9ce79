"""The job's environment: every ``KVX_*`` variable and :class:`JobEnv`, which reads them.

The role and address variables are deliberately not MXNet's ``DMLC_*`` names:
``import mxnet`` in a process whose ``DMLC_ROLE`` is ``server`` turns it into an
MXNet ps-lite server.  ``DMLC_*`` stays free for running MXNet's own stores
side by side as baselines.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

ROLE = "KVX_ROLE"
SCHEDULER_HOST = "KVX_SCHEDULER_HOST"
SCHEDULER_PORT = "KVX_SCHEDULER_PORT"
NUM_WORKER = "KVX_NUM_WORKER"
NUM_SERVER = "KVX_NUM_SERVER"
SECRET = "KVX_SECRET"
NODE_HOST = "KVX_NODE_HOST"
WORKER_RANK = "KVX_WORKER_RANK"
JOINING = "KVX_JOINING"              # "1": a worker started to join a running job (launch --join)
STORE_PARAMS = "KVX_STORE_PARAMS"
ON_WORKER_DEATH = "KVX_ON_WORKER_DEATH"
HEARTBEAT_INTERVAL = "KVX_HEARTBEAT_INTERVAL"
HEARTBEAT_TIMEOUT = "KVX_HEARTBEAT_TIMEOUT"
START_TIMEOUT = "KVX_START_TIMEOUT"
WINDOW_MB = "KVX_WINDOW_MB"
METRICS_DIR = "KVX_METRICS_DIR"
BIGARRAY_BOUND = "KVX_BIGARRAY_BOUND"
#: how the scheduler tells launch.py why a job failed: a line of its standard output
FAILURE_LINE = "KVX_JOB_FAILURE="
#: MXNet's own name for it, which MXNet's users set: taken when ours is not set
MXNET_BIGARRAY_BOUND = "MXNET_KVSTORE_BIGARRAY_BOUND"
WORKER_SPEED = "KVX_WORKER_SPEED"     # straggler emulation: speed of each worker, "1.0,0.43"
SPEED_JITTER = "KVX_SPEED_JITTER"
SPEED_SEED = "KVX_SPEED_SEED"        # seed of the jitter and of the device patterns
DEVICE = "KVX_DEVICE"                # emulated devices: "gtx1080ti,gtx1060" or "150ms" (devices.py)
DEVICE_MODEL = "KVX_DEVICE_MODEL"    # the model a device profile is timed on
DEVICE_BATCH = "KVX_DEVICE_BATCH"    # its batch size (default: the training script's)
STRAGGLER_PATTERNS = "KVX_STRAGGLER_PATTERNS"   # ";"-joined devices.parse_pattern specs

#: the role a launcher process (launch.py) imports the package in; it drops the role before
#: it starts any process
LAUNCHER = "launcher"
#: roles whose processes import the package without mxnet: a server chooses MXNet's engine
#: before it imports it; the scheduler and the launcher never use it (2 s saved per job)
WITHOUT_MXNET = ("server", "scheduler", LAUNCHER)

#: what makes a process a node of one particular job (never inherited by a new job)
IDENTITY_VARIABLES = (ROLE, SCHEDULER_HOST, SCHEDULER_PORT, NUM_WORKER, NUM_SERVER, SECRET,
                      NODE_HOST, WORKER_RANK, JOINING)

ON_DEATH_CHOICES = ("fail", "continue")
PLUGINS = "KVX_PLUGINS"               # modules that register more store types (registry.load_plugins)
MAX_FRAME_MB = "KVX_MAX_FRAME_MB"     # transport limits (ps.transport.Limits)
MAX_FRAMES = "KVX_MAX_FRAMES"
CURVE = "KVX_CURVE"
SHM = "KVX_SHM"                       # "0": no shared-memory lanes between nodes of a host (ps.shm)
SERVER_MALLOC = "KVX_SERVER_MALLOC"   # "default": servers leave malloc's thresholds (ps.heap)
AUTOLOAD = "KVX_AUTOLOAD"             # a remote worker's autoload folder (launch.process)

#: how a server computes unless its environment says otherwise: updates run inline on small
#: arrays, and MXNet's threaded engine and OpenMP's threads only add latency there
SERVER_COMPUTE_DEFAULTS = {"MXNET_ENGINE_TYPE": "NaiveEngine", "OMP_NUM_THREADS": "1"}


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


def metrics_dir(name: str = METRICS_DIR) -> str | None:
    """The folder in variable ``name``, made now if need be: one this node cannot write is an
    error when its store starts, not after the training whose figures it was meant to keep."""
    path = os.environ.get(name) or None
    if path is None:
        return None
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{name} ({path!r}; launch.py --metrics-dir): cannot make the folder: "
                         f"{exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{name} ({path!r}; launch.py --metrics-dir): this node cannot write "
                         f"there")
    return path


def parse_secret(raw: str) -> bytes:
    """The job's secret from ``KVX_SECRET``'s hex; a value too short or not hex is an error
    naming the variable."""
    try:
        secret = bytes.fromhex(raw)
    except ValueError:
        raise ValueError(f"{SECRET} must be hex (as launch.py makes it)") from None
    if len(secret) < 16:
        raise ValueError(f"{SECRET} must hold at least 16 bytes (32 hex digits)")
    return secret


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    return positive(raw, name)


def positive(raw: str, name: str) -> float:
    """``raw`` as a number above 0 and below :data:`MAX_SECONDS` (NaN is not), else a
    ValueError naming ``name``."""
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None
    if not 0 < value < MAX_SECONDS:   # NaN too
        raise ValueError(f"{name} must be > 0 and below {MAX_SECONDS:g}, got {raw!r}")
    return value


#: the longest timeout or interval a job takes (a year): ZeroMQ's options are milliseconds in
#: a C int, and a longer one is a mistake
MAX_SECONDS = 365 * 86400.0


def _int(raw, name: str, default: int | None = None) -> int | None:
    """``raw`` as an integer (``default`` when unset), else a ValueError naming ``name``."""
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def _env_int(name: str, default: int | None = None) -> int:
    value = _int(os.environ.get(name), name, default)
    if value is None:
        raise ValueError(f"{name} is not set")
    return value


class NotInAJob(RuntimeError):
    """This process was not started as a node of a job (the job's variables are not set); a
    worker's store turns it into a ``KVStoreError`` (an ``MXNetError``, as MXNet raises)."""


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
    joining: bool = False    # started to join a running job (launch.py --join)

    @classmethod
    def from_environ(cls, role: str) -> "JobEnv":
        env = os.environ
        missing = [v for v in (SCHEDULER_HOST, SCHEDULER_PORT, NUM_WORKER, NUM_SERVER, SECRET)
                   if not env.get(v)]
        if missing:
            raise NotInAJob(
                f"kvstore_ext {role}: {', '.join(missing)} not set. Distributed stores run in a job "
                f"started by scripts/launch.py, e.g. `python scripts/launch.py -n 2 -s 1 "
                f"--launcher local python train.py`")
        on_death = env.get(ON_WORKER_DEATH, "fail")
        if on_death not in ON_DEATH_CHOICES:
            raise ValueError(f"{ON_WORKER_DEATH} must be one of {ON_DEATH_CHOICES}, got {on_death!r}")
        # an MPI launcher gives each worker its rank in its own variable
        rank = env.get(WORKER_RANK) or env.get("OMPI_COMM_WORLD_RANK") or env.get("PMI_RANK")
        secret = parse_secret(env[SECRET])
        interval = _env_float(HEARTBEAT_INTERVAL, 1.0)
        return cls(
            scheduler_host=env[SCHEDULER_HOST],
            scheduler_port=_env_int(SCHEDULER_PORT),
            num_workers=_env_int(NUM_WORKER),
            num_servers=_env_int(NUM_SERVER),
            secret=secret,
            node_host=env.get(NODE_HOST) or env[SCHEDULER_HOST],
            worker_rank=_int(rank, f"a worker's rank ({WORKER_RANK}, OMPI_COMM_WORLD_RANK "
                                   f"or PMI_RANK)"),
            on_worker_death=on_death,
            heartbeat_interval=interval,
            heartbeat_timeout=_env_float(HEARTBEAT_TIMEOUT, max(10.0, 5 * interval)),
            metrics_dir=metrics_dir(),
            bigarray_bound=_env_int(BIGARRAY_BOUND, _env_int(MXNET_BIGARRAY_BOUND, 1_000_000)),
            start_timeout=_env_float(START_TIMEOUT, 600.0),
            window_bytes=int(_env_float(WINDOW_MB, 64.0) * 2 ** 20),
            joining=env.get(JOINING) == "1",
        )

    @property
    def scheduler_address(self) -> str:
        return f"tcp://{self.scheduler_host}:{self.scheduler_port}"
