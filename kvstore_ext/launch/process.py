"""The processes of a job and their supervision, whatever starts them (ssh, mpirun, Horovod).

Whatever happens, no process is left behind: the first process to fail stops the job (its
exit status is the job's), and Ctrl-C or SIGTERM stops all of them.
"""
from __future__ import annotations

import ctypes
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Callable

from .. import jobenv

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Run in the child before exec: it gets SIGKILL if the launcher dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


class Node:
    """One process of the job and how to start it."""

    def __init__(self, name: str, argv: list[str], env: dict, host: str | None = None,
                 stdin: bytes | None = None):
        self.name, self.argv, self.env, self.host, self.stdin = name, argv, env, host, stdin
        self.proc: subprocess.Popen | None = None
        self.reported = False

    def describe(self, prefixes: tuple[str, ...]) -> str:
        """Its command and the variables of the job it gets (the secret hidden), for --dry-run."""
        shown = {k: ("<secret>" if k == jobenv.SECRET else v) for k, v in self.env.items()
                 if k.startswith(prefixes)}
        return (f"{self.name}: {shlex.join(self.argv)}\n"
                f"    env: {' '.join(f'{k}={v}' for k, v in sorted(shown.items()))}")

    @property
    def is_worker(self) -> bool:
        return self.name.startswith("worker")

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


class Supervisor:
    """Runs a job's nodes to the end: the job's exit status, and nothing left running.

    ``elastic``: a worker that fails does not stop the others (``--on-worker-death
    continue``); its status is still the job's.
    """

    def __init__(self, timeout: float = 0, elastic: bool = False):
        self.timeout, self.elastic = timeout, elastic
        self.nodes: list[Node] = []

    def spawn(self, node: Node, stdout=None) -> Node:
        """Start ``node``; from now on it is supervised and torn down with the job."""
        self.nodes.append(node)
        node.start(stdout=stdout)
        return node

    def run(self, start: Callable[[], None], cleanup: Callable[[], None] | None = None) -> int:
        """``start()`` starts the nodes with :meth:`spawn`; ``cleanup()`` runs after teardown."""
        stop = {"signal": None}

        def on_signal(signum, _frame):
            stop["signal"] = signum

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            start()
            return self.supervise(stop)
        finally:
            self.teardown()
            if cleanup is not None:
                cleanup()
            for s, h in old.items():
                signal.signal(s, h)

    def supervise(self, stop) -> int:
        workers = [n for n in self.nodes if n.is_worker]
        others = [n for n in self.nodes if not n.is_worker]
        deadline = time.monotonic() + self.timeout if self.timeout else None
        failure = None
        while True:
            if stop["signal"] is not None:
                print(f"launch.py: stopping the job ({signal.Signals(stop['signal']).name})",
                      file=sys.stderr, flush=True)
                return 128 + stop["signal"]
            for node in self.nodes:
                code = node.proc.poll()
                if code is None or code == 0 or node.reported:
                    continue
                node.reported = True
                elastic = node.is_worker and self.elastic
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
                print(f"launch.py: the job ran past --timeout {self.timeout:g} s; stopping it",
                      file=sys.stderr, flush=True)
                return 124
            time.sleep(0.05)

    def teardown(self) -> None:
        everyone = [n for n in self.nodes if n.proc]
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
