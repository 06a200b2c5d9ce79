"""``launch.py``'s command line: MXNet's ``tools/launch.py`` (``-n``, ``-s``, ``-H``,
``--launcher``, ``--env``...), plus options for this project's stores.

``--launcher horovod`` runs the Horovod stores' workers (:mod:`.horovod_job`); every other
launcher runs a parameter-server job (:mod:`.ps_job`).
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

from .. import devices, jobenv
from .ps_job import Job


def positive(text: str) -> float:
    """An option's number of seconds (or MB), checked as the job's variables are
    (:func:`jobenv.positive`: above 0, below a year, not NaN)."""
    try:
        return jobenv.positive(text, "the value")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="launch.py",
        # the workers' command follows the options: with abbreviations on, one of its own
        # options that begins like two of ours ("--sched") stopped the launch as ambiguous
        allow_abbrev=False,
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
                   help="file with one host per line (host or host:ssh_port); the servers, then "
                        "the workers, are placed on them round-robin as by MXNet's launcher: with "
                        "-s 1 -n 2 on two hosts, server 0 and worker 1 on the first, worker 0 on "
                        "the second (ssh and mpi launchers)")
    p.add_argument("--launcher", choices=["local", "ssh", "mpi", "horovod"],
                   help="how to start the processes: 'local' on this machine, 'ssh' on the hosts "
                        "of --hostfile (the job's secret goes on ssh's input, never on a command "
                        "line), 'mpi' with Open MPI's mpirun, one per process (variables forwarded "
                        "by name, -x NAME), 'horovod' workers only for dist_dcs3gd / dist_ssgd "
                        "(Gloo; horovodrun with a hostfile) (default: ssh with a hostfile, else "
                        "local). With ssh and mpi every host needs this launcher's Python at the "
                        "same path (it runs the servers, and a guard that stops each node when "
                        "the launcher goes away)")
    p.add_argument("--sync-dst-dir", type=str,
                   help="(ssh) rsync the current directory to this directory on every host that "
                        "runs a node first (it is created if missing; nothing is deleted); the "
                        "nodes then run there, as with MXNet's launcher")
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
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="a Python module that registers more store types "
                        "(kvstore_ext.registry.register); every process of the job imports it "
                        "on `import kvstore_ext` (KVX_PLUGINS); repeatable")
    p.add_argument("--no-autoload", action="store_true",
                   help="leave the workers' Python as it is. By default a local or Horovod "
                        "job's workers import kvstore_ext as soon as their script imports mxnet "
                        "(a sitecustomize put first on their PYTHONPATH), so that an unmodified "
                        "MXNet script can name the stores, e.g. --kv-store dist_bsp; with this "
                        "option (and on ssh or mpi hosts) the script needs 'import kvstore_ext'")
    p.add_argument("--scheduler-host", type=str,
                   help="address the scheduler binds to and nodes connect to (default: 127.0.0.1 "
                        "for local jobs, else this machine's address towards the first host)")
    p.add_argument("--scheduler-port", type=int, default=0,
                   help="scheduler port (default: a free one)")
    p.add_argument("--on-worker-death", choices=list(jobenv.ON_DEATH_CHOICES), default="fail",
                   help="when a worker dies: 'fail' stops the job with a message naming it; "
                        "'continue' lets the others go on without it (default: fail)")
    p.add_argument("--heartbeat-interval", type=positive, default=1.0,
                   help="seconds between ZeroMQ (ZMTP) heartbeats on every connection (default 1)")
    p.add_argument("--heartbeat-timeout", type=positive, default=10.0,
                   help="a connection whose peer answers no heartbeat for this long is closed and "
                        "the peer declared dead (a hung host or a cut network); a process that "
                        "exits or is killed is noticed at once, and one busy computing, even "
                        "holding Python's GIL, still answers (default 10 s)")
    p.add_argument("--start-timeout", type=positive, default=600.0,
                   help="seconds every wait during start-up may take: all nodes registering "
                        "with the scheduler, and every worker initialising a key (kv.init); the "
                        "error names who is missing (default 600)")
    p.add_argument("--window-mb", type=positive, default=64.0,
                   help="flow control: a worker sends no more requests while this many MB of "
                        "its requests are unanswered (one request always goes), which bounds "
                        "the memory of workers and servers whatever the push rate (default 64)")
    p.add_argument("--curve", action="store_true",
                   help="ZeroMQ CURVE security for untrusted networks: every connection is "
                        "authenticated and encrypted with a key derived from the job secret, "
                        "and a peer without it is refused during the handshake, before it can "
                        "make a node hold any data. Without it, a connection needs the job's "
                        "password (derived from the secret), which crosses the network in "
                        "clear, and every message carries a tag. Costs much more CPU per byte "
                        "than the default (see docs/reliability.md)")
    p.add_argument("--max-frame-mb", type=float, default=512.0,
                   help="the largest array (message frame) any node accepts; ZeroMQ drops a "
                        "connection that announces a larger one before reading it. Raise it for "
                        "a key larger than this on one server (default 512)")
    p.add_argument("--max-frames", type=int, default=4096,
                   help="the most frames one message may have: about the most arrays of 64 KB "
                        "or more that one call sends to one server (default 4096)")
    p.add_argument("--no-shm", action="store_true",
                   help="send every message through the sockets. By default, nodes on one host "
                        "(the same boot, namespaces and user) pass a message's arrays of 256 KB "
                        "or more through shared memory (/dev/shm, one ring per peer), which "
                        "saves the kernel's copies; the socket still carries the authenticated "
                        "header (see docs/performance.md)")
    p.add_argument("--device", type=str, metavar="D0,D1,...",
                   help="emulated devices: each worker's iteration lasts max(host compute, device "
                        "time), whatever the host's load. A device is a GPU name timed on "
                        "--device-model (gtx1080ti, gtx1080, gtx1060, p100, v100, k80) or a time "
                        "such as 150ms; NAME*k gives k workers that device; one value applies to "
                        "all. E.g. gtx1080ti,gtx1060 (the DSSP paper's pair) or 200ms*8. "
                        "Per-iteration times go to --metrics-dir (gluon_trainers.EmulatedDevice)")
    p.add_argument("--device-model", type=str, metavar="MODEL",
                   help="the model device profiles are timed on (its forward multiply-adds x 6 x "
                        "batch / (peak FP32 x 0.3)): " + ", ".join(sorted(devices.MODELS)) +
                        "; the host may train another, smaller model")
    p.add_argument("--device-batch", type=int, metavar="N",
                   help="batch size device profiles are timed at (default: the training "
                        "script's own)")
    p.add_argument("--straggler-pattern", action="append", default=[], metavar="SPEC",
                   help="time-varying device slow-downs, reproducible by --speed-seed "
                        "(repeatable; needs --device): " + devices.PATTERN_HELP)
    p.add_argument("--worker-speed", type=str, metavar="V0,V1,...",
                   help="straggler emulation on real, uncontended devices: the speed of each "
                        "worker in (0, 1], e.g. 1.0,0.43; a worker of speed v sleeps so that each "
                        "iteration takes 1/v of its measured compute time. On a shared host the "
                        "measured time includes the other workers' load: use --device there. One "
                        "value applies to all (gluon_trainers.Straggler)")
    p.add_argument("--speed-jitter", type=float, default=0.0,
                   help="with --worker-speed: each iteration's length is multiplied by a uniform "
                        "factor in [1 - J, 1 + J], but never falls below the real compute time "
                        "(default 0)")
    p.add_argument("--speed-seed", type=int, default=0,
                   help="seed of the jitter and the straggler patterns, so runs are "
                        "reproducible (default 0)")
    p.add_argument("--delay-replies", type=str, metavar="FRACTION:SECONDS",
                   help="fault injection: each server holds back this fraction of its replies "
                        "that carry weights by this many seconds, e.g. 0.0016:4 (the PSP-SGD "
                        "paper: 0.16%% of pull replies late by 4 s); off by default")
    p.add_argument("--slow-server", type=str, metavar="RANK:SECONDS",
                   help="fault injection: server RANK answers every pull this many seconds late, "
                        "e.g. 1:0.5; off by default")
    p.add_argument("--fault-seed", type=int, default=0,
                   help="seed of the fault injection draws, so runs are reproducible (default 0)")
    p.add_argument("--job-file", type=str, metavar="PATH",
                   help="write what a worker needs to join this running job (the scheduler's "
                        "address, the job's secret and settings) to PATH, readable by you only; "
                        "removed when the job ends. Asynchronous stores only (dist_asp, "
                        "dist_ssp, dist_dssp, dist_pool)")
    p.add_argument("--join", type=str, metavar="PATH",
                   help="start -n more workers in the running job whose --job-file is PATH: "
                        "each gets the next free rank and the current weights; the store and "
                        "its parameters are the job's (local launcher)")
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


def main(argv=None) -> int:
    # The launcher's role only kept mxnet out of this process's import of the package
    # (jobenv.WITHOUT_MXNET); no process it starts may inherit it.
    if os.environ.get(jobenv.ROLE) == jobenv.LAUNCHER:
        del os.environ[jobenv.ROLE]
    args = build_parser().parse_args(argv)
    if args.launcher == "horovod":
        from .horovod_job import run as run_horovod   # imports horovod's runner
        return run_horovod(args)
    return Job(args).run()


def launcher_env() -> dict:
    """This process's environment, for a launcher process: in the launcher's role."""
    return {**os.environ, jobenv.ROLE: jobenv.LAUNCHER}


def local_job_argv(workers: int, servers: int, command: list[str], options=(),
                   timeout=1800) -> list[str]:
    """The command line of a local job of ``command`` through launch.py (run it with
    :func:`launcher_env`)."""
    return [sys.executable, "-m", "kvstore_ext.launch", "-n", str(workers), "-s", str(servers),
            "--launcher", "local", "--timeout", str(timeout), *options, *command]


def run_local_job(workers: int, servers: int, command: list[str], options=(), timeout=1800,
                  quiet=True) -> subprocess.CompletedProcess:
    """Run ``command`` as a local job through launch.py and wait (for scripts and benchmarks).

    Raises ``RuntimeError`` with the job's last output if it fails.
    """
    argv = local_job_argv(workers, servers, command, options, timeout)
    proc = subprocess.run(argv, env=launcher_env(), stdout=subprocess.PIPE if quiet else None,
                          stderr=subprocess.STDOUT if quiet else None, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout or "")[-3000:]
        raise RuntimeError(f"job {shlex.join(command)} failed with status {proc.returncode}:\n{tail}")
    return proc
