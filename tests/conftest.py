"""Helpers that start real jobs (scheduler, servers, workers on 127.0.0.1) and always clean up."""
from __future__ import annotations

import json
import secrets
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
JOBS = os.path.join(ROOT, "tests", "jobs")
LAUNCH = os.path.join(ROOT, "scripts", "launch.py")
SHARED_MNIST = os.path.join(ROOT, "..", "shared", "data", "mnist10k.npz")

if os.path.exists(SHARED_MNIST):   # the tests train on the shared real MNIST set when present
    os.environ.setdefault("KVX_MNIST", SHARED_MNIST)


class Job:
    """A process group started for a test; killed whole when the test ends, pass or fail."""

    def __init__(self, argv, env=None, cwd=None):
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        self.argv = argv
        self.proc = subprocess.Popen(argv, env=full_env, cwd=cwd or ROOT, start_new_session=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.output = ""

    def wait(self, timeout: float) -> int:
        try:
            self.output, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stacks = self.stacks()
            self.kill()
            self.output, _ = self.proc.communicate()
            raise AssertionError(f"job did not finish within {timeout} s:\n{self.output[-4000:]}"
                                 f"\n{stacks}")
        return self.proc.returncode

    def stacks(self) -> str:
        """Every process of the job's Python stacks (py-spy), taken before it is killed: what
        a hung job waits on, which its log, ending where it stopped, cannot say."""
        import psutil
        try:
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.Error:
            return ""
        spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
        dumps = []
        for p in procs:
            try:
                cmd = " ".join(p.cmdline())[:200]
                out = subprocess.run([spy, "dump", "--pid", str(p.pid)], capture_output=True,
                                     text=True, timeout=30).stdout
            except (psutil.Error, OSError, subprocess.SubprocessError) as exc:
                out = f"(no stack: {exc})"
            dumps.append(f"--- pid {p.pid}: {cmd}\n{out[-3000:]}")
        return "stacks of the job's processes when it was stopped:\n" + "\n".join(dumps)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def crash_reports(output: str) -> list[str]:
    """The fault handler's reports in a job's output (a native crash: every thread's Python
    stack), without their list of extension modules.  A test's message keeps only the end of
    the output, where a crash early in a long log would not show."""
    reports = []
    start = output.find("Fatal Python error")
    while start >= 0:
        end = output.find("Fatal Python error", start + 1)
        block = output[start:end if end >= 0 else len(output)]
        reports.append("\n".join(line for line in block.splitlines()[:80]
                                 if not line.startswith("Extension modules:")))
        start = end
    return reports


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.call_failed = report.failed


def rings_left() -> set[str]:
    """Shared-memory rings (kvstore_ext.ps.shm) in /dev/shm whose creator has exited: what a
    job leaves behind when a ring's cleanup fails."""
    from kvstore_ext.ps import shm
    return set(shm.orphans())


@pytest.fixture
def jobs(request):
    started: list[Job] = []
    left_before = rings_left()

    def start(argv, env=None, cwd=None) -> Job:
        job = Job(argv, env, cwd)
        started.append(job)
        return job

    yield start
    for job in started:
        job.kill()
        try:
            job.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    if getattr(request.node, "call_failed", False):
        for job in started:
            for report in crash_reports(job.output):
                print(f"a process of {' '.join(job.argv[:4])} ... crashed:\n{report}")
    leaked = rings_left() - left_before
    if started and leaked:
        from kvstore_ext.ps import shm
        shm.sweep()
        pytest.fail(f"the test's jobs left {len(leaked)} shared-memory rings in /dev/shm: "
                    f"{sorted(leaked)[:5]}")


def launch_argv(workers: int, servers: int, command: list[str], *options: str) -> list[str]:
    return [sys.executable, LAUNCH, "-n", str(workers), "-s", str(servers), "--launcher", "local",
            *options, sys.executable, *command]


@pytest.fixture
def run_job(jobs):
    """Run a job through launch.py and return (exit code, output)."""

    def run(workers, servers, command, *options, env=None, timeout=240):
        job = jobs(launch_argv(workers, servers, command, *options), env=env)
        code = job.wait(timeout)
        return code, job.output

    return run


def tagged(log: str, tag: str) -> list[dict]:
    """The JSON objects printed after ``tag``.  The job's processes share one output: another
    process's text may come before the tag or right after the object, and two processes'
    objects may share a line (``print`` writes the text and the newline separately)."""
    decoder = json.JSONDecoder()
    found, at = [], log.find(tag + " {")
    while at >= 0:
        value, end = decoder.raw_decode(log, at + len(tag) + 1)
        found.append(value)
        at = log.find(tag + " {", end)
    return found


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def job_processes_left(marker: str) -> list[str]:
    """Command lines of processes still running that mention ``marker``."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], stdout=subprocess.PIPE, text=True).stdout
    me = str(os.getpid())
    return [l for l in out.splitlines()[1:] if marker in l and not l.strip().startswith(me)
            and "ps -eo" not in l]


def wait_until(predicate, timeout: float, step: float = 0.1) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


class ManualJob:
    """Scheduler, server and workers started one by one, without launch.py."""

    def __init__(self, tmp_path, workers, on_death, script_args, heartbeat_timeout=2.0,
                 script="die.py", servers=1, worker_env=None):
        """``worker_env``: rank -> variables that worker alone is given."""
        self.procs = []
        env = dict(os.environ, KVX_SECRET=secrets.token_hex(32), KVX_NUM_WORKER=str(workers),
                   KVX_NUM_SERVER=str(servers), KVX_SCHEDULER_HOST="127.0.0.1",
                   KVX_ON_WORKER_DEATH=on_death, KVX_HEARTBEAT_INTERVAL="0.2",
                   KVX_HEARTBEAT_TIMEOUT=str(heartbeat_timeout), PYTHONUNBUFFERED="1")
        sched = self.start([sys.executable, "-m", "kvstore_ext.ps.scheduler"], env, "scheduler",
                           stdout=subprocess.PIPE)
        port = sched.stdout.readline().decode().strip().split("=")[1]
        env["KVX_SCHEDULER_PORT"] = port
        self.env = env
        self.servers = [self.start([sys.executable, "-m", "kvstore_ext.ps.server"], env, "server")
                        for _ in range(servers)]
        self.scheduler = sched
        self.logs = []
        self.workers = []
        for r in range(workers):
            log = open(tmp_path / f"worker{r}.log", "w+")
            self.logs.append(log)
            self.workers.append(self.start([sys.executable, os.path.join(JOBS, script), *script_args],
                                           dict(env, KVX_WORKER_RANK=str(r),
                                                **(worker_env or {}).get(r, {})),
                                           "worker", stdout=log))

    def start(self, argv, env, role, stdout=None):
        p = subprocess.Popen(argv, env=dict(env, KVX_ROLE=role), cwd=ROOT, stdout=stdout,
                             stderr=subprocess.STDOUT if stdout else None, start_new_session=True)
        self.procs.append(p)
        return p

    def output(self, rank):
        self.logs[rank].seek(0)
        return self.logs[rank].read()

    def kill(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
