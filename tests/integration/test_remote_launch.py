"""The ssh and mpi launchers for real, on this machine.

ssh: an sshd of the test's own on 127.0.0.1 and 127.0.0.2 (tests/remote_hosts.py) stands for
two hosts; the hostfile names both with the sshd's port.  mpi: Open MPI's mpirun on localhost.
Each test reads /proc while its job runs: where each node ran, what reached it and how, and
that the job's secret is on no command line; and afterwards that no process of the job is
left.  What is missing (sshd, rsync, mpirun) skips a test with the reason and how to install
it (``make setup`` installs everything as root).
"""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
import warnings

import pytest

from conftest import JOBS, LAUNCH, ROOT, read_json, wait_until
from remote_hosts import (HOSTS, Sshd, kill_marked, marked, mpirun_missing, processes,
                          rsync_missing, ssh_missing)
from kvstore_ext.launch.autoload import FOLDER as AUTOLOAD_FOLDER
from kvstore_ext.launch.process import REMOTE_GUARD

PY = sys.executable
TRAIN = os.path.join(ROOT, "scripts", "train_mnist.py")
MARKER = "KVX_TEST_MARKER"     # KVX_*: forwarded to every node by both launchers
SECRET = "KVX_SECRET"


class RemoteLaunchSkipped(UserWarning):
    """Shown in pytest's warnings summary, so a skip is never silent even without -rs."""


def skip_because(reason: str):
    warnings.warn(RemoteLaunchSkipped(f"test_remote_launch skipped: {reason}"))
    pytest.skip(reason)


@pytest.fixture
def sshd(tmp_path):
    reason = ssh_missing()
    if reason:
        skip_because(reason)
    directory = tmp_path / "sshd"
    directory.mkdir()
    server = Sshd(directory)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def mpirun():
    reason = mpirun_missing()
    if reason:
        skip_because(reason)


class Node:
    """A node of the job as seen in /proc: the process that the launcher's guard started."""

    def __init__(self, proc, guard, starter):
        env = dict(proc.environ)
        self.pid, self.env, self.argv = proc.pid, env, proc.argv
        self.role = env.get("KVX_ROLE")
        self.rank = int(env["KVX_WORKER_RANK"]) if "KVX_WORKER_RANK" in env else None
        self.starter = starter.argv if starter else []     # sshd's session, or mpirun
        self.guard_mode = guard.argv[3] if len(guard.argv) > 3 else None
        connection = env.get("SSH_CONNECTION", "").split()
        self.ssh_host = connection[2] if len(connection) == 4 else None   # where sshd accepted
        try:
            self.cpus = os.sched_getaffinity(proc.pid)
        except OSError:
            self.cpus = None

    def __repr__(self):
        return f"<{self.role} {self.rank} pid {self.pid} on {self.ssh_host}>"


class LaunchedJob:
    """launch.py in its own session, its output in a file; :meth:`sample` records what /proc
    shows of the job (found by its marker, an environment variable every node gets)."""

    def __init__(self, options, command, env, cwd, log_path):
        self.marker = f"kvx-remote-test-{uuid.uuid4().hex}"
        self.log_path = str(log_path)
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        full_env[MARKER] = self.marker
        self.argv = [PY, LAUNCH, *options, *command]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.argv, env=full_env, cwd=cwd, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.cmdlines: set[bytes] = set()     # every command line on the machine while it ran
        self.nodes: dict[int, Node] = {}
        self.starters: dict[int, object] = {}   # the ssh clients or mpiruns the launcher ran

    def sample(self) -> None:
        table = processes()
        self.cmdlines.update(p.cmdline for p in table.values())
        for p in table.values():
            if p.pid in self.nodes or not p.mentions(self.marker):
                continue
            name = os.path.basename(p.argv[0]) if p.argv else ""
            # (the launcher's `mpirun --version` probe carries the marker too, but starts no node)
            parent = table.get(p.ppid)
            forked = parent is not None and parent.argv == p.argv   # mpirun's fork of itself
            if name in ("ssh", "mpirun", "orterun") and p.argv[1:] != ["--version"] \
                    and not forked:
                p.environ   # read now, while it runs
                self.starters[p.pid] = p
            guard = table.get(p.ppid)
            if guard and guard.argv[1:3] == ["-c", REMOTE_GUARD] and p.argv != guard.argv:
                # (before the node runs, the guard's child is the guard's own forked copy, with
                # the guard's argv and environment: recorded then, a node kept no role; it is
                # the same pid once it runs.  Over ssh `env NAME=VALUE...` runs the guard itself)
                self.nodes[p.pid] = Node(p, guard, table.get(guard.ppid))

    def watch(self, timeout: float) -> int:
        """Sample until the job ends; its exit status."""
        end = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < end:
            self.sample()
            time.sleep(0.2)
        return self.wait(max(1.0, end - time.monotonic()))

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"launch.py did not finish within {timeout:.0f} s:\n"
                                 f"{self.output()[-4000:]}") from None

    def output(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def secret(self) -> str:
        """The job's secret, as every node got it in its environment."""
        secrets_seen = {n.env.get(SECRET) for n in self.nodes.values()}
        assert len(secrets_seen) == 1 and None not in secrets_seen, secrets_seen
        secret = secrets_seen.pop()
        assert re.fullmatch(r"[0-9a-f]{64}", secret), "not a secret launch.py made"
        return secret

    def check_secret_on_no_command_line(self) -> str:
        secret = self.secret()
        exposed = [c.replace(b"\0", b" ").decode(errors="replace")[:300]
                   for c in self.cmdlines if secret.encode() in c]
        assert not exposed, f"the job's secret is on a command line: {exposed}"
        assert secret not in self.output(), "the job's secret is in the launcher's output"
        return secret

    def leftovers(self) -> list[str]:
        return [" ".join(p.argv)[:200] for p in marked(self.marker)]


@pytest.fixture
def launch(tmp_path):
    started: list[LaunchedJob] = []

    def start(options, command, env=None, cwd=ROOT) -> LaunchedJob:
        job = LaunchedJob(options, command, env, cwd, tmp_path / f"launch{len(started)}.log")
        started.append(job)
        return job

    try:
        yield start
    finally:
        for job in started:
            job.kill()
            kill_marked(job.marker)


def check_results(out: str, workers: int, steps: int) -> None:
    for rank in range(workers):
        result = read_json(out.format(rank=rank))
        assert result["rank"] == rank and result["num_workers"] == workers
        assert result["steps"] == steps, result["steps"]
        # 10 digits: chance is 0.1; 30 steps of LeNet reach about 0.7
        assert result["test_accuracy"] > 0.2, result["test_accuracy"]


def mnist_command(tmp_path, steps=30):
    out = str(tmp_path / "result.{rank}.json")
    return out, [PY, TRAIN, "--kvstore", "dist_bsp", "--max-steps", str(steps), "--out", out]


def wait_for_nodes(job: LaunchedJob, count: int, timeout: float = 40) -> None:
    """Until ``count`` nodes run and the scheduler has started the job."""
    def ready():
        job.sample()
        return len(job.nodes) >= count and "job started" in job.output()
    assert wait_until(ready, timeout, step=0.2), (job.nodes, job.output()[-3000:])


# -- ssh ----------------------------------------------------------------------------------------

def kill_and_expect_the_job_to_stop(job, victim, host: str) -> None:
    """SIGKILL ``victim`` (a server on ``host``): the launcher must stop the whole job within
    15 s, non-zero, naming the server and its host, and leave no process of the job."""
    t0 = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    code = job.wait(30)
    elapsed = time.monotonic() - t0
    log = job.output()
    assert code != 0, log[-3000:]
    assert re.search(rf"launch\.py: server \d on {re.escape(host)} exited with status 137; "
                     r"stopping the job", log), log[-3000:]
    assert elapsed < 15, elapsed
    # nothing of the job is left on either host: nodes, guards, ssh clients
    assert wait_until(lambda: not job.leftovers(), 10), job.leftovers()


def test_ssh_job_trains_across_two_hosts_and_keeps_the_secret_off_command_lines(sshd, launch,
                                                                                tmp_path):
    hostfile = sshd.hostfile(tmp_path / "hosts")
    out, command = mnist_command(tmp_path)
    job = launch(["-n", "2", "-s", "2", "-H", hostfile, "--launcher", "ssh", "--timeout", "55"],
                 command, env=sshd.env())
    code = job.watch(60)
    log = job.output()
    assert code == 0, log[-4000:]
    check_results(out, workers=2, steps=30)

    # every node ran under an sshd session, on the host the launcher placed it on: MXNet's
    # round-robin over servers then workers puts server 0 and worker 0 on the first host,
    # server 1 and worker 1 on the second
    nodes = list(job.nodes.values())
    assert sorted(n.role for n in nodes) == ["server", "server", "worker", "worker"], nodes
    for n in nodes:
        assert n.starter and n.starter[0].startswith("sshd:"), n.starter
        assert n.ssh_host == n.env["KVX_NODE_HOST"], (n, n.env["KVX_NODE_HOST"])
        assert n.guard_mode == "watch-input"
    assert sorted(n.ssh_host for n in nodes if n.role == "server") == list(HOSTS)
    assert {n.rank: n.ssh_host for n in nodes if n.role == "worker"} == dict(enumerate(HOSTS))
    assert re.search(r"server \d serving dist_bsp on 127\.0\.0\.2:\d+", log), log[-3000:]

    # the secret travelled on ssh's input: on no command line on the machine while the job
    # ran, and not in the ssh clients' environments either
    secret = job.check_secret_on_no_command_line()
    clients = [p for p in job.starters.values() if os.path.basename(p.argv[0]) == "ssh"]
    assert len(clients) == 4
    for client in clients:
        assert "read -r KVX_SECRET" in client.argv[-1] and SECRET + "=" not in client.argv[-1]
        assert secret not in client.environ.values() and SECRET not in client.environ
    assert wait_until(lambda: not job.leftovers(), 10), job.leftovers()
    assert wait_until(lambda: not sshd.sessions(), 10), sshd.sessions()


def test_ssh_killed_server_stops_the_job_on_both_hosts(sshd, launch, tmp_path):
    hostfile = sshd.hostfile(tmp_path / "hosts")
    job = launch(["-n", "2", "-s", "2", "-H", hostfile, "--launcher", "ssh", "--timeout", "55"],
                 [PY, os.path.join(JOBS, "die.py"), "dist_bsp", "1000000", "-1"], env=sshd.env())
    wait_for_nodes(job, 4)
    time.sleep(0.5)   # a few rounds
    victim = next(n for n in job.nodes.values() if n.role == "server" and n.ssh_host == HOSTS[1])
    # the launcher names the node and its host; the killed process's status comes back over ssh
    kill_and_expect_the_job_to_stop(job, victim, HOSTS[1])
    assert wait_until(lambda: not sshd.sessions(), 10), sshd.sessions()


def test_ssh_sync_dst_dir_copies_the_working_directory_to_every_host_and_runs_there(
        sshd, launch, tmp_path):
    reason = rsync_missing()
    if reason:
        skip_because(reason)
    src = tmp_path / "project"
    (src / "data").mkdir(parents=True)
    (src / "data" / "greeting.txt").write_text("from the launcher's machine\n")
    (src / "job.py").write_text(SYNCED_JOB)
    dst = tmp_path / "synced" / "project"   # its parent does not exist yet either
    report = str(tmp_path / "report")
    job = launch(["-n", "2", "-s", "1", "-H", sshd.hostfile(tmp_path / "hosts"),
                  "--launcher", "ssh", "--sync-dst-dir", str(dst), "--timeout", "55"],
                 [PY, "job.py", report], env=sshd.env(), cwd=str(src))   # job.py: relative
    code = job.watch(60)
    log = job.output()
    assert code == 0, log[-4000:]
    for host in HOSTS:   # rsync to each host (one each), before the job
        assert log.count(f"launch.py: rsync {src}/ -> {host}:{dst}") == 1, log[-3000:]
    assert (dst / "data" / "greeting.txt").read_text() == "from the launcher's machine\n"
    reports = [read_json(f"{report}.{rank}.json") for rank in (0, 1)]
    for r in reports:
        assert os.path.realpath(r["cwd"]) == os.path.realpath(dst), r
        assert os.path.realpath(r["file"]) == os.path.realpath(dst / "job.py"), r
        assert r["greeting"] == "from the launcher's machine\n"
        assert r["w"] == pytest.approx([-1.0] * 3)   # 5 rounds of both workers' pushes
        assert r["type"] == "kvstore_ext.ps.store", r    # the store came by the autoload
    # server 0 on the first host, workers 0 and 1 on the second and the first
    assert {r["rank"]: r["ssh_host"] for r in reports} == {0: HOSTS[1], 1: HOSTS[0]}
    server = [n for n in job.nodes.values() if n.role == "server"]
    assert len(server) == 1 and server[0].ssh_host == HOSTS[0]
    job.check_secret_on_no_command_line()
    assert wait_until(lambda: not job.leftovers(), 10), job.leftovers()


def test_ssh_job_file_lets_a_local_worker_join(sshd, launch, tmp_path):
    """``--job-file`` on an ssh job: the file must hold the job's variables and secret (the
    nodes get them on their ssh command line and stdin, not in the launcher's environment), so
    that a worker started here with ``--join`` enters the job and its pushes count."""
    hostfile = sshd.hostfile(tmp_path / "hosts")
    job_file = str(tmp_path / "job.json")
    script = os.path.join(JOBS, "join.py")
    job = launch(["-n", "2", "-s", "1", "-H", hostfile, "--launcher", "ssh", "--timeout", "100",
                  "--job-file", job_file], [PY, script, "--dir", str(tmp_path), "--kvstore",
                                            "dist_asp"], env=sshd.env())
    def ready():
        job.sample()    # the nodes, for the secret they got
        return os.path.exists(tmp_path / "ready") or job.proc.poll() is not None
    assert wait_until(ready, 60, step=0.2), job.output()[-3000:]
    assert job.proc.poll() is None, job.output()[-3000:]
    with open(job_file) as f:
        env = json.load(f)["env"]
    assert env.get(SECRET) == job.secret() and "KVX_SCHEDULER_PORT" in env, sorted(env)
    joiner = launch(["-n", "1", "--join", job_file, "--timeout", "100"],
                    [PY, script, "--dir", str(tmp_path), "--kvstore", "dist_asp", "--joiner"])
    assert joiner.wait(100) == 0, joiner.output()[-3000:]
    assert job.wait(100) == 0, job.output()[-3000:]
    pushes = [read_json(p) for p in sorted(glob.glob(str(tmp_path / "pushes-*.json")))]
    assert sorted(p["rank"] for p in pushes) == [0, 1, 2], pushes      # a fresh rank


SYNCED_JOB = '''\
"""Run from the synced directory: a few dist_bsp rounds, then where it ran and what it read.
It does not import kvstore_ext: the launcher's autoload registers the stores on the host."""
import json
import os
import sys

import mxnet as mx

kv = mx.kv.create("dist_bsp")
kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1))
w = mx.nd.zeros((3,))
kv.init(0, w)
for _ in range(5):
    kv.pushpull(0, mx.nd.ones((3,)), out=w)
w.wait_to_read()
kv.barrier()
with open(os.path.join("data", "greeting.txt")) as f:
    greeting = f.read()
with open(f"{sys.argv[1]}.{kv.rank}.json", "w") as f:
    json.dump({"rank": kv.rank, "cwd": os.getcwd(), "file": os.path.abspath(__file__),
               "greeting": greeting, "w": w.asnumpy().tolist(), "type": type(kv).__module__,
               "ssh_host": os.environ["SSH_CONNECTION"].split()[2]}, f)
'''


# -- mpi ----------------------------------------------------------------------------------------
def mpi_hostfile(tmp_path) -> str:
    path = tmp_path / "mpi_hosts"
    path.write_text("localhost\n")
    return str(path)


def test_mpi_job_trains_and_gets_the_secret_by_name(mpirun, launch, tmp_path):
    out, command = mnist_command(tmp_path)
    job = launch(["-n", "2", "-s", "1", "-H", mpi_hostfile(tmp_path), "--launcher", "mpi",
                  "--timeout", "55"], command)
    code = job.watch(60)
    log = job.output()
    assert code == 0, log[-4000:]
    check_results(out, workers=2, steps=30)

    nodes = list(job.nodes.values())
    assert sorted(n.role for n in nodes) == ["server", "worker", "worker"], nodes
    assert sorted(n.rank for n in nodes if n.role == "worker") == [0, 1]
    mine = os.sched_getaffinity(0)
    for n in nodes:
        assert os.path.basename(n.starter[0]) == "mpirun", n.starter   # mpirun's own child
        assert "OMPI_COMM_WORLD_RANK" in n.env and n.guard_mode == "parent-only"
        # a worker's script finds the stores registered once it imports mxnet (the autoload)
        assert (n.env.get("PYTHONPATH", "").split(os.pathsep)[0] == AUTOLOAD_FOLDER) == \
            (n.role == "worker"), (n, n.env.get("PYTHONPATH"))
        # every node may use every core this test may (mpirun alone binds a one-process
        # job to the first core)
        assert n.cpus == mine, (n, n.cpus, mine)
    # the variables go by name: each mpirun has `-x KVX_SECRET`, the value is in its
    # environment only, and reached the node
    secret = job.check_secret_on_no_command_line()
    runs = list(job.starters.values())
    assert len(runs) == 3, [r.argv for r in runs]
    for run in runs:
        forwarded = {run.argv[i + 1] for i, a in enumerate(run.argv[:-1]) if a == "-x"}
        assert {SECRET, "KVX_SCHEDULER_PORT", "KVX_ROLE", MARKER} <= forwarded, run.argv
        assert run.environ.get(SECRET) == secret
    assert wait_until(lambda: not job.leftovers(), 10), job.leftovers()


def test_mpi_killed_server_stops_the_job(mpirun, launch, tmp_path):
    job = launch(["-n", "2", "-s", "1", "-H", mpi_hostfile(tmp_path), "--launcher", "mpi",
                  "--timeout", "55"],
                 [PY, os.path.join(JOBS, "die.py"), "dist_bsp", "1000000", "-1"])
    wait_for_nodes(job, 3)
    time.sleep(0.5)
    victim = next(n for n in job.nodes.values() if n.role == "server")
    kill_and_expect_the_job_to_stop(job, victim, "localhost")


# -- both -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("launcher", ["ssh", "mpi"])
def test_killed_launcher_leaves_no_node_behind(launcher, request, launch, tmp_path):
    """SIGKILL to launch.py: its ssh clients and mpiruns die with it, and the guards stop
    the nodes they ran.  The worker is a plain `sleep`, which no lost connection would stop."""
    if launcher == "ssh":
        sshd = request.getfixturevalue("sshd")
        options, env = ["-H", sshd.hostfile(tmp_path / "hosts")], sshd.env()
    else:
        request.getfixturevalue("mpirun")
        options, env = ["-H", mpi_hostfile(tmp_path)], None
    job = launch(["-n", "1", "-s", "1", "--launcher", launcher, *options],
                 ["sleep", "600"], env=env)
    assert wait_until(lambda: (job.sample(), len(job.nodes) == 2)[1], 30, step=0.2), \
        (job.nodes, job.output()[-3000:])
    sleeper = next(n for n in job.nodes.values() if n.role == "worker")
    assert sleeper.argv == ["sleep", "600"]
    os.kill(job.proc.pid, signal.SIGKILL)
    job.proc.wait()
    assert wait_until(lambda: not job.leftovers(), 10), job.leftovers()
    if launcher == "ssh":
        assert wait_until(lambda: not sshd.sessions(), 10), sshd.sessions()
