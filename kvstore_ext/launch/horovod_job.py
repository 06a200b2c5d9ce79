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

import os
import secrets
import shlex
import shutil
import signal
import sys
import time

from .. import jobenv
from ..horovod.params import worker_kernels
from .hosts import loopback_interface, read_hostfile
from .options import autoload_env, parse_env_pairs, store_env, straggler_env, worker_command
from .process import Node, Supervisor

LOCALHOST = "localhost"


class HorovodJob:
    """Workers only, with Horovod's Gloo rendezvous server in the launcher; supervised like
    any job."""

    def __init__(self, args):
        if args.num_workers < 1:
            raise SystemExit("launch.py: -n must be at least 1")
        self.args = args
        self.command = worker_command(args, local=True)
        self.straggler_env = straggler_env(args)
        self.supervisor = Supervisor(args.timeout)
        self.rendezvous = None
        # authenticates what the workers put on the rendezvous server (horovod/progress.py)
        self.secret = secrets.token_hex(32)
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        self.slots = get_host_assignments(parse_hosts(f"{LOCALHOST}:{args.num_workers}"),
                                          args.num_workers)

    def worker_env(self, slot, port: int) -> dict:
        a = self.args
        # the user's Horovod settings (HOROVOD_FUSION_THRESHOLD, HOROVOD_GLOO_TIMEOUT_SECONDS,
        # ...) reach the workers, as horovodrun passes them; each worker's identity is set below
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("DMLC_") and k not in jobenv.IDENTITY_VARIABLES}
        # MXNet's MKL-DNN layouts (blocked, sometimes padded) reach Horovod's allreduce from
        # convolutions and break it (a failed check or a size mismatch between ranks): off,
        # unless the job's options say otherwise
        env.update(worker_kernels(env))
        env.update(parse_env_pairs(a.env))
        env.update(parse_env_pairs(a.env_worker))
        env.update(self.straggler_env)   # --worker-speed
        env.update(store_env(a))
        env.update(autoload_env(a, env))
        env.update({
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": loopback_interface(), "HOROVOD_HOSTNAME": slot.hostname,
            "HOROVOD_RANK": str(slot.rank), "HOROVOD_SIZE": str(slot.size),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank), "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "HOROVOD_CROSS_RANK": str(slot.cross_rank), "HOROVOD_CROSS_SIZE": str(slot.cross_size),
            "PYTHONUNBUFFERED": "1", jobenv.SECRET: self.secret})
        return env

    def plan(self, port: int) -> list[Node]:
        return [Node(f"worker {s.rank}", list(self.command), self.worker_env(s, port))
                for s in self.slots]

    def start(self) -> None:
        self.rendezvous = loopback_rendezvous()
        port = self.rendezvous.start()
        self.rendezvous.init(self.slots)
        for node in self.plan(port):
            self.supervisor.spawn(node)

    def stop_rendezvous(self) -> None:
        if self.rendezvous is not None:
            self.rendezvous.stop()
            self.rendezvous = None

    def dry_run(self) -> None:
        print("Gloo rendezvous server in the launcher (127.0.0.1, a free port)")
        for node in self.plan(0):
            print(node.describe(("HOROVOD_", "KVX_")))

    def run(self) -> int:
        if self.args.dry_run:
            self.dry_run()
            return 0
        return self.supervisor.run(self.start, cleanup=self.stop_rendezvous)


def loopback_rendezvous():
    """Horovod's Gloo rendezvous server, listening on 127.0.0.1 only, where the workers of a
    job on this machine look for it.  Horovod's own binds every interface: anyone on the
    network could then rewrite the addresses the ranks connect to, or stop the job."""
    from horovod.runner.http.http_server import (RendezvousHandler, RendezvousHTTPServer,
                                                 RendezvousServer)
    from horovod.runner.util.threads import in_thread

    class LoopbackRendezvousServer(RendezvousServer):
        def start(self, handler_cls=RendezvousHandler) -> int:
            self._httpd = RendezvousHTTPServer(("127.0.0.1", 0), handler_cls, self._verbose)
            self._listen_thread = in_thread(target=self._httpd.serve_forever)
            return self._httpd.server_address[1]

    return LoopbackRendezvousServer()


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
    command = worker_command(args, local=False)
    env = dict(os.environ)
    env.update(parse_env_pairs(args.env))
    env.update(parse_env_pairs(args.env_worker))
    env.update(store_env(args))
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
