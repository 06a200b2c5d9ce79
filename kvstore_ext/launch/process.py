"""The processes of a job and their supervision, whatever starts them (ssh, mpirun, Horovod).

Whatever happens, no process is left behind: the first process to fail stops the job (its
exit status is the job's), and Ctrl-C or SIGTERM stops all of them.
"""
from __future__ import annotations

import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Callable

from .. import jobenv

PR_SET_PDEATHSIG = 1

#: What a node started by ssh or mpirun runs under (``python -c REMOTE_GUARD MODE COMMAND...``,
#: see :func:`guarded`).  Without it a node can outlive its launcher: sshd sends a command
#: without a terminal no signal when its client goes away, and a process that mpirun started
#: on its own host lives on when mpirun is killed.  It starts the node in a process group of
#: its own, with no input, and stops that group (SIGTERM, then SIGKILL 3 s later) when the
#: process that started it (sshd's session, mpirun) dies, when it gets SIGTERM, SIGHUP or
#: SIGINT, and in MODE ``watch-input`` when its own standard input ends (over ssh: the launcher
#: closed it at the end of the job, or died, or the connection dropped).  Its status is the
#: node's (128 + N after signal N, as a shell's).  A worker's ``KVX_AUTOLOAD`` (the launcher's
#: autoload folder, ``options.autoload_env``) goes first on the node's ``PYTHONPATH``; where that
#: path is not on this host, this host's own kvstore_ext's folder does (found, not imported),
#: and where there is none the node is told its script needs ``import kvstore_ext``.  Standard
#: library only: ``import kvstore_ext`` or ``mxnet`` here could turn it into a node itself.
REMOTE_GUARD = """\
import ctypes, os, signal, subprocess, sys, threading
node = None
AUTOLOAD = %r
def autoload_env():
    folder = os.environ.get(AUTOLOAD)
    if not folder:
        return None
    if not os.path.isdir(folder):
        import importlib.util
        try:
            spec = importlib.util.find_spec("kvstore_ext")
        except (ImportError, ValueError):
            spec = None
        places = (spec.submodule_search_locations or []) if spec else []
        folder = os.path.join(places[0], "launch", "autoload") if places else ""
    if not os.path.isdir(folder):
        print("kvstore_ext: not found on this host, so its stores are not registered when the "
              "script imports mxnet: add 'import kvstore_ext' to the script", file=sys.stderr,
              flush=True)
        return None
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != folder]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([folder] + rest))
def signal_group(sig):
    if node is None:   # stopped before the node started
        os._exit(128 + sig)
    try:
        os.killpg(node.pid, sig)
    except OSError:
        pass
def stop(*_):
    signal_group(signal.SIGTERM)
    timer = threading.Timer(3.0, signal_group, (signal.SIGKILL,))
    timer.daemon = True
    timer.start()
def watch_input():
    while os.read(0, 4096):
        pass
    stop()
for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(s, stop)
try:
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: SIGTERM when the parent dies
except (OSError, AttributeError):
    pass
node = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, start_new_session=True,
                        env=autoload_env())
if sys.argv[1] == "watch-input":
    threading.Thread(target=watch_input, daemon=True).start()
code = node.wait()
signal_group(signal.SIGKILL)
sys.exit(128 - code if code < 0 else code)
"""
REMOTE_GUARD %= jobenv.AUTOLOAD   # the variable's name as jobenv spells it


def guarded(argv: list[str], watch_input: bool, python: str = sys.executable,
            shown: bool = False) -> list[str]:
    """``argv`` under :data:`REMOTE_GUARD` (``shown``: with a placeholder for its code, for
    --dry-run)."""
    code = "<process.REMOTE_GUARD>" if shown else REMOTE_GUARD
    return [python, "-c", code, "watch-input" if watch_input else "parent-only", *argv]


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
        """``stdin``: written to the process, whose standard input then stays open until the
        job ends (a node under :data:`REMOTE_GUARD` over ssh stops when it closes)."""
        self.name, self.argv, self.env, self.host, self.stdin = name, argv, env, host, stdin
        self.job_env = env   # the job's variables it gets (over ssh: on its command line)
        self.shown_argv: list[str] | None = None   # what --dry-run prints instead of argv
        self.proc: subprocess.Popen | None = None
        self.reported = False

    @property
    def label(self) -> str:
        """Its name and, for a node on another host, the host: for messages."""
        return f"{self.name} on {self.host}" if self.host else self.name

    def describe(self, prefixes: tuple[str, ...]) -> str:
        """Its command and the variables of the job it gets (the secret hidden), for --dry-run."""
        shown = {k: ("<secret>" if k == jobenv.SECRET else v) for k, v in self.env.items()
                 if k.startswith(prefixes)}
        return (f"{self.name}: {shlex.join(self.shown_argv or self.argv)}\n"
                f"    env: {' '.join(f'{k}={v}' for k, v in sorted(shown.items()))}")

    @property
    def is_worker(self) -> bool:
        return self.name.startswith("worker")

    def start(self, stdout=None) -> None:
        self.proc = subprocess.Popen(self.argv, env=self.env, start_new_session=True,
                                     preexec_fn=_die_with_parent, stdout=stdout,
                                     stdin=subprocess.PIPE if self.stdin is not None else None)
        if self.stdin:
            try:
                self.proc.stdin.write(self.stdin)
                self.proc.stdin.flush()
            except BrokenPipeError:   # it exited at once: its status tells why
                self.close_stdin()

    def close_stdin(self) -> None:
        if self.proc and self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def signal(self, sig) -> None:
        """Signal the node's process group: the processes its script started too, which
        outlive it (a worker that ended cleanly may leave a child holding the job's output)."""
        if self.proc:
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


#: seconds the supervisor waits, after a node fails, for the failures that follow from it
CAUSE_GRACE = 2.0


def failure_reason(pipe) -> Callable[[], str | None]:
    """Reads, without waiting, the scheduler's ``jobenv.FAILURE_LINE`` from its output (the
    only line it prints after its port)."""
    def read() -> str | None:
        os.set_blocking(pipe.fileno(), False)
        try:
            text = os.read(pipe.fileno(), 65536).decode(errors="replace")
        except OSError:   # nothing printed yet (BlockingIOError), or the pipe is gone
            return None
        for line in text.splitlines():
            if line.startswith(jobenv.FAILURE_LINE):
                try:
                    return str(json.loads(line[len(jobenv.FAILURE_LINE):]))
                except ValueError:
                    return None
        return None
    return read


def _status(code: int) -> int:
    """A process's return code as an exit status (128 + N after signal N, as a shell's)."""
    return code if code > 0 else 128 - code


def _ended(code: int) -> str:
    """How a process ended, for the job's messages: ``exited with status -11 (killed by
    SIGSEGV, a crash)``; the status is kept as it was so that scripts may look for it."""
    said = f"exited with status {code}"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            return said
        crash = ", a crash" if -code in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL,
                                          signal.SIGFPE, signal.SIGABRT) else ""
        said += f" (killed by {name}{crash})"
    return said


class Supervisor:
    """Runs a job's nodes to the end: the job's exit status, and nothing left running.

    ``elastic``: a worker that fails does not stop the others (``--on-worker-death
    continue``); its status is still the job's.
    """

    def __init__(self, timeout: float = 0, elastic: bool = False):
        self.timeout, self.elastic = timeout, elastic
        self.nodes: list[Node] = []
        #: why the job failed as its coordinator saw it (the scheduler's word), or None
        self.reason: Callable[[], str | None] | None = None

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
                if not elastic:
                    _cause, code = self.cause_of_failure(node, code)
                    return failure if failure is not None else _status(code)
                print(f"launch.py: {node.label} {_ended(code)}; the others "
                      "continue (--on-worker-death continue)", file=sys.stderr, flush=True)
                if failure is None:
                    failure = _status(code)
            if all(n.proc.poll() is not None for n in workers):
                # workers are done: give servers and the scheduler a moment to close cleanly
                grace = time.monotonic() + 10
                while time.monotonic() < grace and any(n.proc.poll() is None for n in others):
                    time.sleep(0.05)
                # a server or the scheduler that failed while closing (its metrics not
                # written, say) fails the job: its error is not lost behind the workers' 0
                late = [n for n in others if n.proc.poll() not in (None, 0) and not n.reported]
                if late and failure is None:
                    late[0].reported = True
                    code = late[0].proc.poll()
                    print(f"launch.py: {late[0].label} {_ended(code)} after the workers "
                          f"finished", file=sys.stderr, flush=True)
                    return _status(code)
                return failure or 0
            if deadline and time.monotonic() > deadline:
                print(f"launch.py: the job ran past --timeout {self.timeout:g} s; stopping it",
                      file=sys.stderr, flush=True)
                return 124
            time.sleep(0.05)

    def cause_of_failure(self, first: Node, code: int) -> tuple[Node, int]:
        """The failure that stops the job, named.  One node's death makes others fail too
        (the scheduler stops the job), and over ssh or mpirun the dead node's own status may
        arrive after theirs: wait up to :data:`CAUSE_GRACE` s for the others to end, then name
        the likeliest cause: the first node ended by a signal (a crash, a kill; 128 + N from
        ssh or mpirun), else the first one that failed other than the scheduler."""
        failed = [(first, code)]
        end = time.monotonic() + CAUSE_GRACE
        while time.monotonic() < end:
            for node in self.nodes:
                c = node.proc.poll()
                if c not in (None, 0) and not node.reported:
                    node.reported = True
                    failed.append((node, c))
            if all(node.proc.poll() is not None for node in self.nodes):
                break
            time.sleep(0.05)
        cause = (next((f for f in failed if f[1] < 0 or f[1] > 128), None) or
                 next((f for f in failed if f[0].name != "scheduler"), failed[0]))
        print(f"launch.py: {cause[0].label} {_ended(cause[1])}; stopping the job",
              file=sys.stderr, flush=True)
        why = self.reason() if self.reason is not None else None
        if why:   # the node the job lost, which a frozen process never names by exiting
            print(f"launch.py: the scheduler's reason: {why}", file=sys.stderr, flush=True)
        others = [f"{n.label} ({c})" for n, c in failed if n is not cause[0]]
        if others:
            print(f"launch.py: also failed (status): {', '.join(others)}", file=sys.stderr,
                  flush=True)
        return cause

    def teardown(self) -> None:
        everyone = [n for n in self.nodes if n.proc]
        for n in everyone:
            n.close_stdin()   # a remote node's guard stops it (and its ssh ends) on end of input
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
