"""``launch.py --launcher horovod``: workers for the Horovod stores (dist_dcs3gd, dist_ssgd).

On this machine the launcher is its own Horovod driver: it runs Horovod's Gloo
rendezvous server in-process and starts one process per rank with the
``HOROVOD_*`` variables that ``horovodrun --gloo`` would set, so the usual job
rules hold: the first worker to fail stops the job (its status is the job's),
and Ctrl-C or SIGTERM stops every process group.  With ``-H HOSTFILE`` it hands
the job to ``horovodrun -np N -H host:slots,... --gloo``, which starts the
remote ranks over ssh and also stops all of them when one fails.

The same job by hand: ``horovodrun -np 2 -H localhost:2 --gloo python train.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import sys
import time

from . import config as cfg
from .horovod_params import MKLDNN_ENV
from .launcher import Job, Node, parse_env_pairs, parse_kv_params, read_hostfile

LOCALHOST = "localhost"


def loopback_interface() -> str:
    """The name of the interface holding 127.0.0.1 (Gloo binds to an interface by name)."""
    try:
        import psutil
        for name, addrs in psutil.net_if_addrs().items():
            if any(a.address == "127.0.0.1" for a in addrs):
                return name
    except ImportError:
        pass
    return "lo"


class _Served:
    """Stands in for the scheduler process: the rendezvous server lives in the launcher."""

    class _Proc:
        pid = os.getpid()

        @staticmethod
        def poll():
            return 0

        @staticmethod
        def wait(timeout=None):
            return 0

    name = "rendezvous"
    proc = _Proc()

    @staticmethod
    def signal(sig) -> None:
        pass


class HorovodJob(Job):
    """Workers only, with an in-process Gloo rendezvous; supervised like any job."""

    def __init__(self, args):
        local = argparse.Namespace(**vars(args))
        local.launcher = "local"
        super().__init__(local)
        self.launcher = "horovod"
        self.rendezvous = None
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        self.slots = get_host_assignments(parse_hosts(f"{LOCALHOST}:{args.num_workers}"),
                                          args.num_workers)

    def worker_env(self, slot, port: int) -> dict:
        a = self.args
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("DMLC_", "HOROVOD_")) and k not in cfg.IDENTITY_VARIABLES}
        # MXNet's MKL-DNN layouts (blocked, sometimes padded) reach Horovod's allreduce from
        # convolutions and break it (a failed check or a size mismatch between ranks): off,
        # unless the job's options say otherwise
        env.setdefault(MKLDNN_ENV, "0")
        env.update(parse_env_pairs(a.env))
        env.update(parse_env_pairs(a.env_worker))
        env.update(self.straggler_env)   # --worker-speed
        if a.kv_param:
            env[cfg.STORE_PARAMS] = json.dumps(parse_kv_params(a.kv_param))
        if a.metrics_dir:
            env[cfg.METRICS_DIR] = os.path.abspath(a.metrics_dir)
        env.update({
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": loopback_interface(), "HOROVOD_HOSTNAME": slot.hostname,
            "HOROVOD_RANK": str(slot.rank), "HOROVOD_SIZE": str(slot.size),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank), "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "HOROVOD_CROSS_RANK": str(slot.cross_rank), "HOROVOD_CROSS_SIZE": str(slot.cross_size),
            "PYTHONUNBUFFERED": "1"})
        return env

    def start_scheduler(self) -> int:
        from horovod.runner.http.http_server import RendezvousServer
        self.rendezvous = RendezvousServer()
        port = self.rendezvous.start()
        self.rendezvous.init(self.slots)
        self.scheduler = _Served()
        return port

    def plan(self, port: int) -> list[Node]:
        return [Node(f"worker {s.rank}", list(self.command), self.worker_env(s, port))
                for s in self.slots]

    def dry_run(self) -> None:
        print("Gloo rendezvous server in the launcher (127.0.0.1, a free port)")
        for node in self.plan(0):
            shown = {k: v for k, v in node.env.items() if k.startswith(("HOROVOD_", "KVX_"))}
            print(f"{node.name}: {shlex.join(node.argv)}")
            print(f"    env: {' '.join(f'{k}={v}' for k, v in sorted(shown.items()))}")

    def teardown(self) -> None:
        super().teardown()
        if self.rendezvous is not None:
            self.rendezvous.stop()
            self.rendezvous = None


def horovodrun_argv(args, command: list[str]) -> list[str]:
    """``horovodrun -np N -H h1:k1,h2:k2 --gloo COMMAND``, ranks placed round-robin on the hosts."""
    hosts = [h for h, _ in read_hostfile(args.hostfile)]
    slots: dict[str, int] = {}
    for i in range(args.num_workers):
        slots[hosts[i % len(hosts)]] = slots.get(hosts[i % len(hosts)], 0) + 1
    exe = shutil.which("horovodrun") or os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return [exe, "-np", str(args.num_workers), "-H", ",".join(f"{h}:{n}" for h, n in slots.items()),
            "--gloo", *command]


def run_horovodrun(args) -> int:
    """Several hosts: horovodrun starts and supervises the ranks; we stop it on Ctrl-C."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise SystemExit("launch.py: give the command each worker runs")
    env = dict(os.environ)
    env.update(parse_env_pairs(args.env))
    env.update(parse_env_pairs(args.env_worker))
    if args.kv_param:
        env[cfg.STORE_PARAMS] = json.dumps(parse_kv_params(args.kv_param))
    if args.metrics_dir:
        env[cfg.METRICS_DIR] = os.path.abspath(args.metrics_dir)
    node = Node("horovodrun", horovodrun_argv(args, command), env)
    if args.dry_run:
        print(shlex.join(node.argv))
        return 0
    node.start()
    deadline = time.monotonic() + args.timeout if args.timeout else None
    try:
        while node.proc.poll() is None:
            if deadline and time.monotonic() > deadline:
                print(f"launch.py: the job ran past --timeout {args.timeout:g} s; stopping it",
                      file=sys.stderr, flush=True)
                return 124
            time.sleep(0.05)
        return node.proc.returncode
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    finally:
        node.signal(signal.SIGTERM)   # horovodrun stops its ranks on SIGTERM
        try:
            node.proc.wait(timeout=10)
        except Exception:
            node.signal(signal.SIGKILL)


def run(args) -> int:
    """Entry point of ``launch.py --launcher horovod``."""
    if args.backend != "kvstore_ext":
        raise SystemExit("launch.py: --launcher horovod runs the Horovod stores "
                         "(dist_dcs3gd, dist_ssgd); it does not take --backend mxnet")
    if args.hostfile:
        return run_horovodrun(args)
    return HorovodJob(args).run()
