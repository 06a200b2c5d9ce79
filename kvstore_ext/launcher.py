"""Start a job: scheduler, servers and workers, on this machine, over ssh, or with mpirun.

The command line is MXNet's ``tools/launch.py`` (``-n``, ``-s``, ``-H``,
``--launcher``, ``--env``...), plus options for this project's stores.  With
``--backend mxnet`` it starts MXNet's own ps-lite job (``DMLC_*`` variables,
``dist_sync``/``dist_async``) instead, so both can be compared run for run.

Whatever happens, no process is left behind: the first process to fail stops
the job (its exit status is the job's), and Ctrl-C or SIGTERM stops all of them.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time

from . import config as cfg
from . import faults

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Run in the child before exec: it gets SIGKILL if the launcher dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="launch.py",
        description="Launch a distributed training job with kvstore_ext's stores (dist_bsp, "
                    "dist_asp, dist_ssp, ...) or, with --backend mxnet, MXNet's own dist_sync / "
                    "dist_async. Same command line as MXNet's tools/launch.py.",
        epilog="example: python scripts/launch.py -n 2 -s 1 --launcher local "
               "python train.py --kvstore dist_ssp")
    p.add_argument("-n", "--num-workers", required=True, type=int,
                   help="number of worker processes; each runs the command")
    p.add_argument("-s", "--num-servers", type=int,
                   help="number of server processes (default: the number of workers, as MXNet)")
    p.add_argument("-H", "--hostfile", type=str,
                   help="file with one host per line (host or host:ssh_port); workers and servers "
                        "are placed on them round-robin (ssh and mpi launchers)")
    p.add_argument("--launcher", choices=["local", "ssh", "mpi", "horovod"],
                   help="how to start the processes: 'local' on this machine, 'ssh' on the hosts "
                        "of --hostfile, 'mpi' with mpirun, 'horovod' workers only for dist_dcs3gd / "
                        "dist_ssgd (Gloo; horovodrun with a hostfile) (default: ssh with a "
                        "hostfile, else local)")
    p.add_argument("--sync-dst-dir", type=str,
                   help="(ssh) rsync the current directory to this directory on every host first")
    p.add_argument("--env-server", action="append", default=[],
                   help="NAME:VALUE (or NAME to forward this shell's value) for servers only; repeatable")
    p.add_argument("--env-worker", action="append", default=[],
                   help="NAME:VALUE (or NAME) for workers only; repeatable")
    p.add_argument("--env", action="append", default=[],
                   help="NAME:VALUE (or NAME) for every process of the job; repeatable")
    p.add_argument("--backend", choices=["kvstore_ext", "mxnet"], default="kvstore_ext",
                   help="kvstore_ext: this project's scheduler and servers (for kvstore='dist_bsp' "
                        "and the other kvstore_ext types; default). mxnet: MXNet's ps-lite "
                        "scheduler and servers (for kvstore='dist_sync' or 'dist_async')")
    p.add_argument("--kv-param", action="append", default=[], metavar="NAME=VALUE",
                   help="a store parameter for every worker, e.g. --kv-param staleness=2; repeatable")
    p.add_argument("--scheduler-host", type=str,
                   help="address the scheduler binds to and nodes connect to (default: 127.0.0.1 "
                        "for local jobs, else this machine's address towards the first host)")
    p.add_argument("--scheduler-port", type=int, default=0,
                   help="scheduler port (default: a free one)")
    p.add_argument("--on-worker-death", choices=list(cfg.ON_DEATH_CHOICES), default="fail",
                   help="when a worker dies: 'fail' stops the job with a message naming it; "
                        "'continue' lets the others go on without it (default: fail)")
    p.add_argument("--heartbeat-interval", type=float, default=1.0,
                   help="seconds between ZeroMQ (ZMTP) heartbeats on every connection (default 1)")
    p.add_argument("--heartbeat-timeout", type=float, default=10.0,
                   help="a connection whose peer answers no heartbeat for this long is closed and "
                        "the peer declared dead (a hung host or a cut network); a process that "
                        "exits or is killed is noticed at once, and one busy computing, even "
                        "holding Python's GIL, still answers (default 10 s)")
    p.add_argument("--start-timeout", type=float, default=600.0,
                   help="seconds every wait during start-up may take: all nodes registering "
                        "with the scheduler, and every worker initialising a key (kv.init); the "
                        "error names who is missing (default 600)")
    p.add_argument("--window-mb", type=float, default=64.0,
                   help="flow control: a worker sends no more requests while this many MB of "
                        "its requests are unanswered (one request always goes), which bounds "
                        "the memory of workers and servers whatever the push rate (default 64)")
    p.add_argument("--curve", action="store_true",
                   help="ZeroMQ CURVE security for untrusted networks: every connection is "
                        "authenticated and encrypted with a key derived from the job secret, "
                        "and a peer without it is refused during the handshake, before it can "
                        "make a node hold any data. Costs much more CPU per byte than the "
                        "default per-message tags (see docs/reliability.md)")
    p.add_argument("--max-frame-mb", type=float, default=512.0,
                   help="the largest array (message frame) any node accepts; ZeroMQ drops a "
                        "connection that announces a larger one before reading it. Raise it for "
                        "a key larger than this on one server (default 512)")
    p.add_argument("--max-frames", type=int, default=4096,
                   help="the most frames one message may have: about the most arrays of 64 KB "
                        "or more that one call sends to one server (default 4096)")
    p.add_argument("--worker-speed", type=str, metavar="V0,V1,...",
                   help="straggler emulation: the speed of each worker in (0, 1], e.g. 1.0,0.43 "
                        "(a GTX 1080 Ti and a GTX 1060); a worker of speed v sleeps so that each "
                        "iteration takes 1/v of its measured compute time. One value applies to "
                        "all. The training script applies it (gluon_trainers.Straggler)")
    p.add_argument("--speed-jitter", type=float, default=0.0,
                   help="straggler emulation: each iteration's length is multiplied by a uniform "
                        "factor in [1 - J, 1 + J], but never falls below the real compute time "
                        "(default 0)")
    p.add_argument("--speed-seed", type=int, default=0,
                   help="seed of the jitter, so runs are reproducible (default 0)")
    p.add_argument("--delay-replies", type=str, metavar="FRACTION:SECONDS",
                   help="fault injection: each server holds back this fraction of its replies "
                        "that carry weights by this many seconds, e.g. 0.0016:4 (the PSP-SGD "
                        "paper: 0.16%% of pull replies late by 4 s); off by default")
    p.add_argument("--slow-server", type=str, metavar="RANK:SECONDS",
                   help="fault injection: server RANK answers every pull this many seconds late, "
                        "e.g. 1:0.5; off by default")
    p.add_argument("--fault-seed", type=int, default=0,
                   help="seed of the fault injection draws, so runs are reproducible (default 0)")
    p.add_argument("--metrics-dir", type=str,
                   help="each worker and server writes its metrics here as JSON at the end")
    p.add_argument("--timeout", type=float, default=0,
                   help="stop the whole job after this many seconds (default: no limit)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the command and environment of every process, start nothing")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="the command each worker runs; with the local launcher a leading 'python' "
                        "means the launcher's own interpreter")
    return p


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


def read_hostfile(path: str) -> list[tuple[str, int | None]]:
    hosts = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            host = line.split()[0]
            port = None
            if host.count(":") == 1:
                host, p = host.split(":")
                port = int(p)
            hosts.append((host, port))
    if not hosts:
        raise SystemExit(f"launch.py: hostfile {path} lists no host")
    return hosts


def address_towards(host: str) -> str:
    """This machine's address on the route to ``host`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
            return s.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Node:
    """One process of the job and how to start it."""

    def __init__(self, name: str, argv: list[str], env: dict, host: str | None = None,
                 stdin: bytes | None = None):
        self.name, self.argv, self.env, self.host, self.stdin = name, argv, env, host, stdin
        self.proc: subprocess.Popen | None = None

    def start(self, stdout=None) -> None:
        self.proc = subprocess.Popen(self.argv, env=self.env, start_new_session=True,
                                     preexec_fn=_die_with_parent, stdout=stdout,
                                     stdin=subprocess.PIPE if self.stdin else None)
        if self.stdin:
            self.proc.stdin.write(self.stdin)
            self.proc.stdin.close()

    def signal(self, sig) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass


class Job:
    """Builds the nodes from the arguments, runs them, and tears everything down."""

    def __init__(self, args):
        self.args = args
        self.nodes: list[Node] = []
        self.scheduler: Node | None = None
        if args.num_workers < 1:
            raise SystemExit("launch.py: -n must be at least 1")
        self.num_servers = args.num_servers if args.num_servers is not None else args.num_workers
        if self.num_servers < 1:
            raise SystemExit("launch.py: -s must be at least 1")
        self.launcher = args.launcher or ("ssh" if args.hostfile else "local")
        if self.launcher != "local" and not args.hostfile:
            raise SystemExit(f"launch.py: --launcher {self.launcher} needs -H HOSTFILE")
        self.hosts = read_hostfile(args.hostfile) if args.hostfile else [("127.0.0.1", None)]
        if args.scheduler_host:
            self.sched_host = args.scheduler_host
        elif self.launcher == "local":
            self.sched_host = "127.0.0.1"
        else:
            self.sched_host = address_towards(self.hosts[0][0])
        self.secret = secrets.token_hex(32)
        self.straggler_env = {}
        if args.worker_speed:
            try:
                speeds = cfg.parse_speeds(args.worker_speed, args.num_workers)
            except ValueError as exc:
                raise SystemExit(f"launch.py: --worker-speed: {exc}") from None
            if not 0 <= args.speed_jitter < 1:
                raise SystemExit(f"launch.py: --speed-jitter must be in [0, 1), got "
                                 f"{args.speed_jitter}")
            self.straggler_env = {cfg.WORKER_SPEED: ",".join(map(str, speeds)),
                                  cfg.SPEED_JITTER: str(args.speed_jitter),
                                  cfg.SPEED_SEED: str(args.speed_seed)}
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
        self.command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not self.command:
            raise SystemExit("launch.py: give the command each worker runs")
        if self.launcher == "local" and self.command[0] in ("python", "python3"):
            # run workers under the launcher's own interpreter (the project's virtualenv)
            self.command = [sys.executable] + self.command[1:]

    # -- environments -------------------------------------------------------------------------
    def base_env(self, role: str) -> dict:
        a = self.args
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("DMLC_") and k not in cfg.IDENTITY_VARIABLES}
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
            return env
        env.update({cfg.ROLE: role, cfg.SCHEDULER_HOST: self.sched_host,
                    cfg.NUM_WORKER: str(a.num_workers), cfg.NUM_SERVER: str(self.num_servers),
                    cfg.ON_WORKER_DEATH: a.on_worker_death,
                    cfg.HEARTBEAT_INTERVAL: str(a.heartbeat_interval),
                    cfg.HEARTBEAT_TIMEOUT: str(a.heartbeat_timeout),
                    cfg.START_TIMEOUT: str(a.start_timeout), cfg.WINDOW_MB: str(a.window_mb),
                    "KVX_MAX_FRAME_MB": str(a.max_frame_mb),
                    "KVX_MAX_FRAMES": str(a.max_frames), "KVX_CURVE": "1" if a.curve else "0"})
        if self.launcher != "ssh":
            env[cfg.SECRET] = self.secret   # over ssh it travels on stdin, not argv
        if a.kv_param:
            env[cfg.STORE_PARAMS] = json.dumps(parse_kv_params(a.kv_param))
        if a.metrics_dir:
            env[cfg.METRICS_DIR] = os.path.abspath(a.metrics_dir)
        if role == "server":
            env.update(self.fault_env)
            env.setdefault("MXNET_ENGINE_TYPE", "NaiveEngine")
            env.setdefault("OMP_NUM_THREADS", "1")
        return env

    def plan(self, sched_port: int) -> list[Node]:
        """Servers then workers, placed round-robin on the hosts."""
        a = self.args
        nodes = []
        if a.backend == "mxnet":
            server_argv = [sys.executable, "-c", "import mxnet"]
        else:
            server_argv = [sys.executable, "-m", "kvstore_ext.server"]
        for j in range(self.num_servers):
            env = self.base_env("server")
            nodes.append(self.place(f"server {j}", server_argv, env, self.hosts[j % len(self.hosts)]))
        for i in range(a.num_workers):
            env = self.base_env("worker")
            env.update(self.straggler_env)
            if a.backend != "mxnet":
                env[cfg.WORKER_RANK] = str(i)
            nodes.append(self.place(f"worker {i}", list(self.command), env,
                                    self.hosts[i % len(self.hosts)]))
        for node in nodes:
            if a.backend != "mxnet":
                node.env[cfg.SCHEDULER_PORT] = str(sched_port)
                if self.launcher == "local":
                    node.env[cfg.NODE_HOST] = "127.0.0.1"
        return nodes

    def place(self, name, argv, env, host) -> Node:
        if self.launcher == "local":
            return Node(name, argv, env)
        hostname, port = host
        if self.launcher == "ssh":
            if self.args.backend != "mxnet":
                env[cfg.NODE_HOST] = hostname
            wd = self.args.sync_dst_dir or os.getcwd()
            exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())
                               if k.startswith(("KVX_", "DMLC_", "MXNET_", "OMP_")) or
                               k in parse_env_pairs(self.args.env))
            remote = (f"read -r {cfg.SECRET}; export {cfg.SECRET}; cd {shlex.quote(wd)} && "
                      f"env {exports} {shlex.join(argv)}")
            ssh = ["ssh", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes"]
            if port:
                ssh += ["-p", str(port)]
            return Node(name, ssh + [hostname, remote], dict(os.environ), host=hostname,
                        stdin=(self.secret + "\n").encode())
        # mpi: one mpirun per process, so each gets its own role and rank
        exported = sorted(k for k in env if k.startswith(("KVX_", "DMLC_", "MXNET_", "OMP_")))
        mpirun = ["mpirun", "--allow-run-as-root", "-n", "1", "-H", hostname]
        for k in exported:
            mpirun += ["-x", k]
        return Node(name, mpirun + argv, env, host=hostname)

    # -- running ------------------------------------------------------------------------------
    def start_scheduler(self) -> int:
        if self.args.backend == "mxnet":
            self.native_port = self.args.scheduler_port or free_port(self.sched_host)
            node = Node("scheduler", [sys.executable, "-c", "import mxnet"],
                        self.base_env("scheduler"))
            node.start()
            self.scheduler = node
            return self.native_port
        env = self.base_env("scheduler")
        node = Node("scheduler", [sys.executable, "-m", "kvstore_ext.scheduler", "--host",
                                  self.sched_host, "--port", str(self.args.scheduler_port)], env)
        node.start(stdout=subprocess.PIPE)
        self.scheduler = node
        line = node.proc.stdout.readline().decode().strip()
        if not line.startswith(f"{cfg.SCHEDULER_PORT}="):
            raise RuntimeError(f"the scheduler did not start (it printed {line!r})")
        return int(line.split("=", 1)[1])

    def dry_run(self) -> None:
        self.native_port = self.args.scheduler_port or 9091
        sched_port = self.args.scheduler_port or 9091
        print(f"scheduler on {self.sched_host}:{sched_port} (this machine)")
        for node in self.plan(sched_port):
            shown = {k: ("<secret>" if k == cfg.SECRET else v) for k, v in node.env.items()
                     if k.startswith(("KVX_", "DMLC_"))}
            print(f"{node.name}: {shlex.join(node.argv)}")
            print(f"    env: {' '.join(f'{k}={v}' for k, v in sorted(shown.items()))}")

    def run(self) -> int:
        if self.args.dry_run:
            self.dry_run()
            return 0
        stop = {"signal": None}

        def on_signal(signum, _frame):
            stop["signal"] = signum

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            sched_port = self.start_scheduler()
            self.nodes = self.plan(sched_port)
            for node in self.nodes:
                node.start()
            return self.supervise(stop)
        finally:
            self.teardown()
            for s, h in old.items():
                signal.signal(s, h)

    def supervise(self, stop) -> int:
        workers = [n for n in self.nodes if n.name.startswith("worker")]
        others = [n for n in self.nodes if not n.name.startswith("worker")] + [self.scheduler]
        deadline = time.monotonic() + self.args.timeout if self.args.timeout else None
        failure = None
        while True:
            if stop["signal"] is not None:
                print(f"launch.py: stopping the job ({signal.Signals(stop['signal']).name})",
                      file=sys.stderr, flush=True)
                return 128 + stop["signal"]
            for node in self.nodes + [self.scheduler]:
                code = node.proc.poll()
                if code is None or code == 0 or getattr(node, "reported", False):
                    continue
                node.reported = True
                elastic = node in workers and self.args.on_worker_death == "continue"
                print(f"launch.py: {node.name} exited with status {code}"
                      + ("; the others continue (--on-worker-death continue)" if elastic
                         else "; stopping the job"), file=sys.stderr, flush=True)
                if failure is None:
                    failure = code if code > 0 else 128 - code
                if not elastic:
                    return failure
            if all(n.proc.poll() is not None for n in workers):
                # workers are done: give servers and the scheduler a moment to close cleanly
                grace = time.monotonic() + 10
                while time.monotonic() < grace and any(n.proc.poll() is None for n in others):
                    time.sleep(0.05)
                return failure or 0
            if deadline and time.monotonic() > deadline:
                print(f"launch.py: the job ran past --timeout {self.args.timeout:g} s; stopping it",
                      file=sys.stderr, flush=True)
                return 124
            time.sleep(0.05)

    def teardown(self) -> None:
        everyone = [n for n in self.nodes + [self.scheduler] if n is not None and n.proc]
        for n in everyone:
            n.signal(signal.SIGTERM)
        end = time.monotonic() + 3
        while time.monotonic() < end and any(n.proc.poll() is None for n in everyone):
            time.sleep(0.05)
        for n in everyone:
            n.signal(signal.SIGKILL)
            try:
                n.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.launcher == "horovod":
        from .horovod_launch import run as run_horovod
        return run_horovod(args)
    return Job(args).run()


def run_local_job(workers: int, servers: int, command: list[str], options=(), timeout=1800,
                  quiet=True) -> subprocess.CompletedProcess:
    """Run ``command`` as a local job through launch.py and wait (for scripts and benchmarks).

    Raises ``RuntimeError`` with the job's last output if it fails.
    """
    argv = [sys.executable, "-m", "kvstore_ext.launcher", "-n", str(workers), "-s", str(servers),
            "--launcher", "local", "--timeout", str(timeout), *options, *command]
    proc = subprocess.run(argv, stdout=subprocess.PIPE if quiet else None,
                          stderr=subprocess.STDOUT if quiet else None, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout or "")[-3000:]
        raise RuntimeError(f"job {shlex.join(command)} failed with status {proc.returncode}:\n{tail}")
    return proc


if __name__ == "__main__":
    sys.exit(main())
