"""DC-S3GD against SSGD in real jobs: 2 Horovod workers training LeNet on MNIST
(``scripts/train_dcs3gd.py``), ``dist_ssgd`` and ``dist_dcs3gd``, in two regimes:

- communication negligible: Horovod's own allreduce over loopback;
- communication as long as the compute: each step's allreduce is made longer by injected wire
  time (``KVX_SIM_COMM_S``, a serial link that takes no CPU) equal to the compute, measured as
  DC-S3GD's step time in the first regime (its allreduce hides there, so its step is the compute).

Trials are interleaved store by store and each figure is the median of its trials.
``plan validate`` scores these measurements against the model (:func:`.validate.dcs3gd_rows`);
``scripts/bench_dcs3gd.py`` prints them against the algorithm's targets.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass

from ..horovod.params import worker_kernels
from .validate import DCS3GD_REGIMES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.path.join(ROOT, "scripts", "launch.py")
TRAIN = os.path.join(ROOT, "scripts", "train_dcs3gd.py")
STORES = ("dist_ssgd", "dist_dcs3gd")
WORKERS = 2
(NEGLIGIBLE, _), (LOADED, _) = DCS3GD_REGIMES
#: launch.py's status when a worker crashed: 128 + SIGSEGV, SIGBUS or SIGABRT
CRASHED = tuple(128 + sig for sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT))
#: the measurements ``plan validate`` keeps beside validate.json, for ``--measured``
MEASURED_FILE = "validate_dcs3gd_measured.json"


@dataclass(frozen=True)
class Setting:
    """What one measurement runs: ``bench_dcs3gd.py``'s options."""
    trials: int = 3
    steps: int = 40            # steps per job
    warmup: int = 10           # steps before the timed window
    batch_size: int = 64
    device_s: float = 0.0      # simulated accelerator seconds per step (0: the CPU computes)

    @classmethod
    def for_device(cls, device_s: float, trials: int = 3, steps: int = 40,
                   warmup: int = 10) -> "Setting":
        """``make bench-dcs3gd``'s pairing: batch 64 when the CPU computes, 16 behind a
        simulated device (the host's forward and backward then stay short beside it)."""
        return cls(trials, steps, warmup, 16 if device_s else 64, device_s)

    @property
    def label(self) -> str:
        where = f"a simulated {self.device_s * 1e3:.0f} ms device" if self.device_s else "the CPU"
        return f"LeNet on {where}, batch {self.batch_size}"

    def jobs(self) -> int:
        """How many jobs :func:`measure` starts."""
        return self.trials * len(STORES) * len(DCS3GD_REGIMES)


def worker_env(environ=None) -> dict:
    """The environment these jobs' workers compute in: one OpenMP thread each unless set (two
    workers share two cores), MKL-DNN off unless set, as ``launch.py --launcher horovod``
    starts Horovod workers (its layouts break the allreduce).  MXNet's own CPU kernels are
    then about twice as slow on LeNet's convolutions, so ``calibrate`` measures the Horovod
    stores' compute in this environment too."""
    environ = os.environ if environ is None else environ
    return dict(environ, OMP_NUM_THREADS=environ.get("OMP_NUM_THREADS", "1"),
                **worker_kernels(environ))


def run_job(store: str, setting: Setting, inject_s: float) -> dict:
    """One 2-worker job; its step time (the slower worker's) and worker 0's store metrics."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r-{rank}.json")
        argv = [sys.executable, LAUNCH, "-n", str(WORKERS), "--launcher", "horovod",
                "--timeout", "600", "--env", f"KVX_SIM_COMM_S:{inject_s}", sys.executable, TRAIN,
                "--kvstore", store, "--max-steps", str(setting.steps),
                "--time-from", str(setting.warmup), "--batch-size", str(setting.batch_size),
                "--sim-compute-s", str(setting.device_s), "--out", out]
        crashed = None
        for attempt in range(2):
            proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, env=worker_env(), cwd=ROOT)
            if proc.returncode not in CRASHED or attempt:
                break
            # a worker crashed (launch.py's 128 + N): once in a few hundred jobs a worker of
            # these has died of SIGSEGV inside MXNet or Horovod in its first steps; the job is
            # run again once, and the crash is reported and kept in the result (a job stopped
            # by SIGINT or SIGTERM, or past its timeout, is not run again)
            crashed = {"status": proc.returncode, "output": proc.stdout[-3000:]}
            print(f"kvstore_ext.plan: {store} job ended with status {proc.returncode} (a worker "
                  f"killed by {signal.Signals(proc.returncode - 128).name}); running it again once:\n"
                  f"{proc.stdout[-1500:]}", file=sys.stderr, flush=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
        results = []
        for rank in range(WORKERS):
            with open(out.replace("{rank}", str(rank))) as f:
                results.append(json.load(f))
    worker = results[0]["kvstore_stats"]["worker"]
    return {"step_time_s": max(r["step_time_s"] for r in results),
            "allreduce_time_s": worker["allreduce_time_s"], "overlap": worker["overlap"],
            "command": shlex.join(argv), **({"crashed_first": crashed} if crashed else {})}


def interleaved(setting: Setting, inject_s: float, on_job=None) -> dict:
    """Every store ``setting.trials`` times, trials interleaved; each store's medians."""
    runs = {s: [] for s in STORES}
    for _ in range(setting.trials):
        for store in STORES:
            runs[store].append(run_job(store, setting, inject_s))
            if on_job:
                on_job()
    return {s: {"step_time_s": statistics.median(r["step_time_s"] for r in rs),
                "allreduce_time_s": statistics.median(r["allreduce_time_s"] for r in rs),
                "overlap": statistics.median(r["overlap"] for r in rs),
                "trials_s": [r["step_time_s"] for r in rs], "command": rs[0]["command"],
                # jobs run again after a worker crashed (see run_job): their first output
                "crashed_first": [r["crashed_first"] for r in rs if "crashed_first" in r]}
            for s, rs in runs.items()}


def measure(setting: Setting, on_job=None, on_regime=None) -> dict:
    """Both regimes, in the form ``bench_dcs3gd.py --out`` writes (``dcs3gd.json``).

    ``on_job()`` is called after every job, ``on_regime(regime, summary)`` after each regime
    with the figures so far.
    """
    summary = {"args": asdict(setting)}
    quiet = summary[NEGLIGIBLE] = interleaved(setting, 0.0, on_job)
    summary["dcs3gd_slower_when_comm_negligible"] = \
        quiet["dist_dcs3gd"]["step_time_s"] / quiet["dist_ssgd"]["step_time_s"] - 1
    summary["injected_comm_s"] = compute = quiet["dist_dcs3gd"]["step_time_s"]
    if on_regime:
        on_regime(NEGLIGIBLE, summary)
    loaded = summary[LOADED] = interleaved(setting, compute, on_job)
    summary["ssgd_over_dcs3gd_when_comm_equals_compute"] = \
        loaded["dist_ssgd"]["step_time_s"] / loaded["dist_dcs3gd"]["step_time_s"]
    if on_regime:
        on_regime(LOADED, summary)
    return summary


def save_measured(out_dir: str, measured: list[tuple[str, dict]]) -> str:
    """Keep ``(label, measurement)`` pairs in ``out_dir`` for a later ``validate --measured``."""
    from ..metrics import write_json
    return write_json(out_dir, MEASURED_FILE,
                      {"measurements": [{"label": k, "bench": b} for k, b in measured]})


def load_measured(validate_json: str) -> list[tuple[str, dict]]:
    """The measurements kept beside ``validate_json`` (none if there are none)."""
    path = os.path.join(os.path.dirname(os.path.abspath(validate_json)), MEASURED_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [(m["label"], m["bench"]) for m in json.load(f)["measurements"]]
