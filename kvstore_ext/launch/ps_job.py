"""A parameter-server job: scheduler, servers and workers, on this machine, over ssh, or with
mpirun (``launch.py``'s default).  With ``--backend mxnet`` it starts MXNet's own ps-lite job
(``DMLC_*`` variables, ``dist_sync``/``dist_async``) instead, so both can be compared run for run.
"""
from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import sys

from .. import jobenv
from ..ps import faults
from .hosts import address_towards, free_port, read_hostfile
from .options import autoload_env, parse_env_pairs, store_env, straggler_env, worker_command
from .process import Node, Supervisor, failure_reason, guarded

#: variables a node on another host gets from this machine's environment, besides the job's
#: own and those named by --env, --env-server and --env-worker
FORWARDED_PREFIXES = ("KVX_", "DMLC_", "MXNET_", "OMP_")


def ssh_argv(port: int | None) -> list[str]:
    """``ssh`` with the options of every connection the launcher makes (nodes and rsync)."""
    argv = ["ssh", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes"]
    return argv + ["-p", str(port)] if port else argv


class Job:
    """A parameter-server job (this project's or, with ``--backend mxnet``, MXNet's ps-lite):
    the scheduler, the servers and the workers, placed on this machine or the hosts."""

    def __init__(self, args):
        self.args = args
        if args.num_workers < 1:
            raise SystemExit("launch.py: -n must be at least 1")
        if getattr(args, "join", None) and (args.backend != "kvstore_ext" or
                                            (args.launcher or "local") != "local"):
            raise SystemExit("launch.py: --join starts workers on this machine, for a "
                             "kvstore_ext job (--launcher local, --backend kvstore_ext)")
        self.num_servers = args.num_servers if args.num_servers is not None else args.num_workers
        if self.num_servers < 1:
            raise SystemExit("launch.py: -s must be at least 1")
        self.launcher = args.launcher or ("ssh" if args.hostfile else "local")
        if self.launcher != "local" and not args.hostfile:
            raise SystemExit(f"launch.py: --launcher {self.launcher} needs -H HOSTFILE")
        if args.sync_dst_dir and self.launcher != "ssh":
            raise SystemExit("launch.py: --sync-dst-dir copies the working directory to the hosts "
                             "over ssh: it needs --launcher ssh (as MXNet's)")
        self.hosts = read_hostfile(args.hostfile) if args.hostfile else [("127.0.0.1", None)]
        if args.scheduler_host:
            self.sched_host = args.scheduler_host
        elif self.launcher == "local":
            self.sched_host = "127.0.0.1"
        else:
            self.sched_host = address_towards(self.hosts[0][0])
        self.secret = secrets.token_hex(32)
        self.straggler_env = straggler_env(args)
        self.fault_env = {faults.FAULT_SEED: str(args.fault_seed)}
        try:
            if args.delay_replies:
                faults.parse_delay_replies(args.delay_replies)
                self.fault_env[faults.DELAY_REPLIES] = args.delay_replies
            if args.slow_server:
                faults.parse_slow_server(args.slow_server, self.num_servers)
                self.fault_env[faults.SLOW_SERVER] = args.slow_server
        except ValueError as exc:
            raise SystemExit(f"launch.py: {exc}") from None
        self.command = worker_command(args, local=self.launcher == "local")
        self.supervisor = Supervisor(args.timeout, elastic=args.on_worker_death == "continue")

    # -- environments -------------------------------------------------------------------------
    def base_env(self, role: str) -> dict:
        a = self.args
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("DMLC_") and k not in jobenv.IDENTITY_VARIABLES}
        env.update(parse_env_pairs(a.env))
        env.update(parse_env_pairs(a.env_server if role == "server" else
                                   a.env_worker if role == "worker" else []))
        if a.backend == "mxnet":
            env.update({"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": self.sched_host,
                        "DMLC_PS_ROOT_PORT": str(self.native_port),
                        "DMLC_NUM_WORKER": str(a.num_workers),
                        "DMLC_NUM_SERVER": str(self.num_servers)})
            if self.launcher == "local":
                env["DMLC_NODE_HOST"] = "127.0.0.1"
            if a.metrics_dir:   # the training script's own logs (emulated devices)
                env[jobenv.METRICS_DIR] = os.path.abspath(a.metrics_dir)
            return env
        env.update({jobenv.ROLE: role, jobenv.SCHEDULER_HOST: self.sched_host,
                    jobenv.NUM_WORKER: str(a.num_workers), jobenv.NUM_SERVER: str(self.num_servers),
                    jobenv.ON_WORKER_DEATH: a.on_worker_death,
                    jobenv.HEARTBEAT_INTERVAL: str(a.heartbeat_interval),
                    jobenv.HEARTBEAT_TIMEOUT: str(a.heartbeat_timeout),
                    jobenv.START_TIMEOUT: str(a.start_timeout), jobenv.WINDOW_MB: str(a.window_mb),
                    jobenv.MAX_FRAME_MB: str(a.max_frame_mb),
                    jobenv.MAX_FRAMES: str(a.max_frames), jobenv.CURVE: "1" if a.curve else "0"})
        if a.no_shm:
            env[jobenv.SHM] = "0"
        if self.launcher != "ssh":
            env[jobenv.SECRET] = self.secret   # over ssh it travels on stdin, not argv
        bound = os.environ.get(jobenv.MXNET_BIGARRAY_BOUND)
        if bound and not env.get(jobenv.BIGARRAY_BOUND):   # MXNet's variable, on every host
            env[jobenv.BIGARRAY_BOUND] = bound
        env.update(store_env(a))
        if role == "worker":
            env.update(autoload_env(a, env, local=self.launcher == "local"))
        if role == "server":
            env.update(self.fault_env)
            for var, value in jobenv.SERVER_COMPUTE_DEFAULTS.items():
                env.setdefault(var, value)
        return env

    def plan(self, sched_port: int) -> list[Node]:
        """Servers then workers, placed round-robin on the hosts as MXNet's launcher does:
        node k of them all (the servers first) on host k modulo the number of hosts."""
        a = self.args
        if a.backend == "mxnet":
            server_argv = [sys.executable, "-c", "import mxnet"]
        else:
            server_argv = [sys.executable, "-m", "kvstore_ext.ps.server"]
        roles = [("server", f"server {j}", server_argv, {}) for j in range(self.num_servers)]
        roles += [("worker", f"worker {i}", list(self.command),
                   {**self.straggler_env,
                    **({jobenv.WORKER_RANK: str(i)} if a.backend != "mxnet" else {})})
                  for i in range(a.num_workers)]
        nodes = []
        for k, (role, name, argv, extra) in enumerate(roles):
            env = self.base_env(role)
            env.update(extra)
            host = self.hosts[k % len(self.hosts)]
            if a.backend != "mxnet":
                # every variable is set before place(): a remote node gets them on its
                # command line (ssh) or by name (mpirun -x)
                env[jobenv.SCHEDULER_PORT] = str(sched_port)
                env[jobenv.NODE_HOST] = "127.0.0.1" if self.launcher == "local" else host[0]
            nodes.append(self.place(name, role, argv, env, host))
        return nodes

    def forwarded(self, role: str, env: dict) -> list[str]:
        """The names of the variables a node on another host gets."""
        a = self.args
        named = set(parse_env_pairs(a.env))
        named |= set(parse_env_pairs(a.env_server if role == "server" else
                                     a.env_worker if role == "worker" else []))
        return sorted(k for k in env if k.startswith(FORWARDED_PREFIXES) or k in named)

    def place(self, name, role, argv, env, host) -> Node:
        if self.launcher == "local":
            return Node(name, argv, env)
        hostname, port = host
        if self.launcher == "ssh":
            # the job's secret is read from ssh's input, never put on a command line; the
            # guard (process.REMOTE_GUARD) stops the node when that input ends
            # the variables are set for the guard too, which reads KVX_AUTOLOAD (process.py)
            wd = self.args.sync_dst_dir or os.getcwd()
            variables = ["env", *(f"{k}={env[k]}" for k in self.forwarded(role, env))]

            def remote(shown: bool) -> str:
                command = variables + guarded(argv, watch_input=True, shown=shown)
                return (f"read -r {jobenv.SECRET}; export {jobenv.SECRET}; "
                        f"cd {shlex.quote(wd)} && exec {shlex.join(command)}")

            node = Node(name, ssh_argv(port) + [hostname, remote(False)], dict(os.environ),
                        host=hostname, stdin=(self.secret + "\n").encode())
            node.job_env = {**env, jobenv.SECRET: self.secret}
            node.shown_argv = ssh_argv(port) + [hostname, remote(True)]
            return node
        # mpi: one mpirun per process, so each gets its own role and rank; the variables go
        # by name (-x NAME), their values (the secret among them) in mpirun's environment.
        # --bind-to none: Open MPI binds a job of one or two processes to a core, the same
        # first core for every one of these separate mpiruns.  --stdin none: this terminal's
        # input is not the node's
        mpirun = ["mpirun", "--allow-run-as-root", "-n", "1", "-H", hostname]
        for k in self.forwarded(role, env):
            mpirun += ["-x", k]
        mpirun += ["--bind-to", "none", "--stdin", "none"]
        if os.geteuid() == 0:   # Open MPI refuses root without both of these (or the option)
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        node = Node(name, mpirun + guarded(argv, watch_input=False), env, host=hostname)
        node.shown_argv = mpirun + guarded(argv, watch_input=False, shown=True)
        return node

    def sync_working_dir(self, dry_run: bool = False) -> None:
        """``--sync-dst-dir``, as MXNet's launcher: rsync this directory to that one on every
        host that runs a node (all at once), before anything starts; nodes then run there."""
        src, dst = os.getcwd().rstrip("/") + "/", self.args.sync_dst_dir
        used = self.hosts[:self.num_servers + self.args.num_workers]
        copies = []
        for hostname, port in dict.fromkeys(used):
            argv = ["rsync", "-az", "--rsh", shlex.join(ssh_argv(port)),
                    "--rsync-path", f"mkdir -p {shlex.quote(dst)} && rsync", src,
                    f"{hostname}:{dst}"]
            if dry_run:
                print(f"rsync {src} -> {hostname}:{dst}: {shlex.join(argv)}")
            else:
                print(f"launch.py: rsync {src} -> {hostname}:{dst}", file=sys.stderr, flush=True)
                try:
                    copies.append((hostname, subprocess.Popen(argv, stdin=subprocess.DEVNULL)))
                except FileNotFoundError:
                    raise SystemExit("launch.py: --sync-dst-dir needs rsync (Debian: apt-get "
                                     "install rsync), here and on every host") from None
        failed = [(h, p.wait()) for h, p in copies]
        failed = [f"{h} (status {code})" for h, code in failed if code != 0]
        if failed:
            raise SystemExit(f"launch.py: --sync-dst-dir: rsync to {', '.join(failed)} failed")

    def check_mpirun(self) -> None:
        """The mpi launcher speaks Open MPI's mpirun (-x NAME, --allow-run-as-root)."""
        try:
            out = subprocess.run(["mpirun", "--version"], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                 timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SystemExit(f"launch.py: --launcher mpi needs Open MPI's mpirun ({exc}; Debian: "
                             "apt-get install openmpi-bin)") from None
        if "Open MPI" not in out and "OpenRTE" not in out:
            raise SystemExit("launch.py: --launcher mpi needs Open MPI's mpirun; this mpirun "
                             f"says {out.strip()[:200]!r}")

    # -- running ------------------------------------------------------------------------------
    def start_scheduler(self) -> int:
        if self.args.backend == "mxnet":
            self.native_port = self.args.scheduler_port or free_port(self.sched_host)
            self.supervisor.spawn(Node("scheduler", [sys.executable, "-c", "import mxnet"],
                                       self.base_env("scheduler")))
            return self.native_port
        env = self.base_env("scheduler")
        env[jobenv.SECRET] = self.secret   # this machine's process: in its environment
        node = self.supervisor.spawn(
            Node("scheduler", [sys.executable, "-m", "kvstore_ext.ps.scheduler", "--host",
                               self.sched_host, "--port", str(self.args.scheduler_port)], env),
            stdout=subprocess.PIPE)
        line = node.proc.stdout.readline().decode().strip()
        if not line.startswith(f"{jobenv.SCHEDULER_PORT}="):
            raise SystemExit(f"launch.py: the scheduler did not start (it printed {line!r})")
        self.supervisor.reason = failure_reason(node.proc.stdout)
        return int(line.split("=", 1)[1])

    def start(self) -> None:
        if getattr(self.args, "join", None):
            return self.start_joining()
        if self.launcher == "mpi":
            self.check_mpirun()
        if self.args.sync_dst_dir:
            self.sync_working_dir()
        sched_port = self.start_scheduler()
        nodes = self.plan(sched_port)
        if getattr(self.args, "job_file", None):
            self.write_job_file(next(n for n in nodes if n.is_worker).job_env)
        for node in nodes:
            self.supervisor.spawn(node)

    def write_job_file(self, worker_env: dict) -> None:
        """What a worker needs to join: the job's variables (with its secret), for its owner
        only, written where nobody else can have opened it first."""
        path = self.args.job_file
        job = {k: v for k, v in worker_env.items()
               if k.startswith("KVX_") and k != jobenv.WORKER_RANK}
        if os.path.exists(path):
            os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"env": job}, f)

    def remove_job_file(self) -> None:
        path = getattr(self.args, "job_file", None)
        if path and not getattr(self.args, "join", None) and os.path.exists(path):
            os.unlink(path)

    def start_joining(self) -> None:
        """Start -n workers that join the running job of ``--join PATH``."""
        try:
            with open(self.args.join) as f:
                job = json.load(f)["env"]
        except (OSError, ValueError, KeyError) as exc:
            raise SystemExit(f"launch.py: --join {self.args.join}: not a job file ({exc})") \
                from None
        for i in range(self.args.num_workers):
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith("DMLC_") and k not in jobenv.IDENTITY_VARIABLES}
            env.update(job)
            env[jobenv.JOINING] = "1"   # waits for the job to start, never takes one of its ranks
            self.supervisor.spawn(Node(f"worker (joining) {i}", list(self.command), env))

    def dry_run(self) -> None:
        self.native_port = self.args.scheduler_port or 9091
        sched_port = self.args.scheduler_port or 9091
        if self.args.sync_dst_dir:
            self.sync_working_dir(dry_run=True)
        print(f"scheduler on {self.sched_host}:{sched_port} (this machine)")
        for node in self.plan(sched_port):
            print(node.describe(("KVX_", "DMLC_")))

    def run(self) -> int:
        if self.args.dry_run:
            self.dry_run()
            return 0
        return self.supervisor.run(self.start, cleanup=self.remove_job_file)
