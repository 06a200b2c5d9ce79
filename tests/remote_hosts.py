"""Two throwaway "hosts" on this machine for the ssh and mpi launchers' tests, and what the
tests read about processes from /proc.

:class:`Sshd` is an sshd of the test's own on a free port of 127.0.0.1 and 127.0.0.2, with a
host key, a user key and a known_hosts file in the test's directory; ``ssh`` (and rsync's ssh)
reach it through a wrapper first on PATH that adds ``-F`` with the test's client config, so
nothing in ~/.ssh or /etc/ssh is read or written.  What is missing for a test is named, with
how to install it, by :func:`ssh_missing`, :func:`rsync_missing` and :func:`mpirun_missing`
(``make setup`` installs all of it as root).
"""
from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field

from kvstore_ext.launch.hosts import free_port

SSHD = "/usr/sbin/sshd"
HOSTS = ("127.0.0.1", "127.0.0.2")
SETUP_HINT = "`make setup` installs it when run as root, or: apt-get install {}"


def ssh_missing() -> str | None:
    """Why an sshd of our own cannot run here, or None."""
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} not found: openssh-server is not installed ({SETUP_HINT.format('openssh-server')})"
    for tool in ("ssh", "ssh-keygen"):
        if not shutil.which(tool):
            return f"{tool} not found: openssh-client is not installed ({SETUP_HINT.format('openssh-client')})"
    if not os.path.isdir("/run/sshd"):
        if os.geteuid() != 0:
            return "sshd needs its privilege separation directory /run/sshd, which only root can create"
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    for host in HOSTS:
        try:
            with socket.socket() as s:
                s.bind((host, 0))
        except OSError as exc:
            return f"cannot bind {host} ({exc}): the tests need the whole 127.0.0.0/8 on loopback"
    return None


def rsync_missing() -> str | None:
    if not shutil.which("rsync"):
        return f"rsync not found ({SETUP_HINT.format('rsync')})"
    return None


def mpirun_missing() -> str | None:
    if not shutil.which("mpirun"):
        return f"mpirun not found: Open MPI is not installed ({SETUP_HINT.format('openmpi-bin')})"
    out = subprocess.run(["mpirun", "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, text=True).stdout
    if "Open MPI" not in out:
        return f"mpirun is not Open MPI's ({out.strip()[:100]!r}): {SETUP_HINT.format('openmpi-bin')}"
    return None


def _free_port() -> int:
    """A port free on both loopback addresses (sshd is told to listen on both)."""
    for _ in range(50):
        port = free_port(HOSTS[0])
        try:
            with socket.socket() as s:
                s.bind((HOSTS[1], port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on both 127.0.0.1 and 127.0.0.2")


class Sshd:
    """An sshd on 127.0.0.1 and 127.0.0.2 for this test only; :meth:`stop` ends it and every
    session it started."""

    def __init__(self, directory):
        self.dir = str(directory)
        self.proc: subprocess.Popen | None = None
        d = self.dir
        for key in ("host_key", "user_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "kvx-test",
                            "-f", os.path.join(d, key)], check=True, stdin=subprocess.DEVNULL)
        shutil.copy(os.path.join(d, "user_key.pub"), os.path.join(d, "authorized_keys"))
        self.bin = os.path.join(d, "bin")
        os.makedirs(self.bin)
        wrapper = os.path.join(self.bin, "ssh")
        with open(wrapper, "w") as f:
            f.write(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {d}/ssh_config "$@"\n')
        os.chmod(wrapper, 0o755)
        with open(os.path.join(d, "ssh_config"), "w") as f:
            f.write(f"Host *\n  User {getpass.getuser()}\n  IdentityFile {d}/user_key\n"
                    f"  IdentitiesOnly yes\n  UserKnownHostsFile {d}/known_hosts\n"
                    f"  GlobalKnownHostsFile /dev/null\n  BatchMode yes\n  LogLevel ERROR\n"
                    f"  ConnectTimeout 10\n")
        self.log_path = os.path.join(d, "sshd.log")
        self.start()

    def start(self) -> None:
        d = self.dir
        for _attempt in range(3):   # the port may be taken between choosing and binding it
            self.port = _free_port()
            with open(os.path.join(d, "sshd_config"), "w") as f:
                f.write(f"Port {self.port}\n" + "".join(f"ListenAddress {h}\n" for h in HOSTS) +
                        f"HostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n"
                        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                        "KbdInteractiveAuthentication no\nStrictModes no\nUsePAM no\n"
                        f"PidFile {d}/sshd.pid\nMaxStartups 100\nMaxSessions 100\n"
                        "LogLevel INFO\n")
            log = open(self.log_path, "a")
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", os.path.join(d, "sshd_config")],
                                         stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
            log.close()
            if self._wait_listening():
                return
            self.stop()
        raise RuntimeError(f"sshd did not start:\n{self.log()}")

    def _wait_listening(self, timeout: float = 10) -> bool:
        end = time.monotonic() + timeout
        waiting = set(HOSTS)
        while waiting and time.monotonic() < end and self.proc.poll() is None:
            for host in list(waiting):
                try:
                    socket.create_connection((host, self.port), timeout=1).close()
                    waiting.discard(host)
                except OSError:
                    pass
            time.sleep(0.05)
        return not waiting

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def hostfile(self, path, hosts=HOSTS) -> str:
        """A hostfile naming ``hosts`` with this sshd's port (host:port)."""
        with open(path, "w") as f:
            f.write("# two 'hosts' of one machine, each reached through its own address\n")
            f.writelines(f"{h}:{self.port}\n" for h in hosts)
        return str(path)

    def env(self) -> dict:
        """What the launcher needs to reach this sshd: the ``ssh`` wrapper first on PATH."""
        return {"PATH": self.bin + os.pathsep + os.environ.get("PATH", "")}

    def sessions(self) -> list[int]:
        """Processes sshd started for connections (each session's own sshd), still running."""
        if self.proc is None:
            return []
        return [p.pid for p in processes().values() if p.ppid == self.proc.pid]

    def stop(self) -> None:
        if self.proc is None:
            return
        leftovers = self.sessions()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in leftovers:   # sessions outlive the listener: end them and what they run
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except OSError:
                    pass


# -- /proc ------------------------------------------------------------------------------------
@dataclass
class Proc:
    pid: int
    ppid: int
    cmdline: bytes                     # NUL-separated, as in /proc
    _environ: dict | None = field(default=None, repr=False)

    @property
    def argv(self) -> list[str]:
        return [a.decode(errors="replace") for a in self.cmdline.split(b"\0")[:-1]]

    @property
    def environ(self) -> dict:
        """Its environment (empty if gone or unreadable)."""
        if self._environ is None:
            self._environ = {}
            try:
                with open(f"/proc/{self.pid}/environ", "rb") as f:
                    raw = f.read()
            except OSError:
                return self._environ
            for item in raw.split(b"\0"):
                name, sep, value = item.partition(b"=")
                if sep:
                    self._environ[name.decode(errors="replace")] = value.decode(errors="replace")
        return self._environ

    def mentions(self, marker: str) -> bool:
        return marker.encode() in self.cmdline or any(marker in v for v in self.environ.values())


def processes() -> dict[int, Proc]:
    """Every process of this machine now, by pid."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        table[int(name)] = Proc(int(name), ppid, cmdline)
    return table


def marked(marker: str, table: dict[int, Proc] | None = None) -> list[Proc]:
    """The processes whose command line or environment holds ``marker`` (this process aside)."""
    table = processes() if table is None else table
    return [p for p in table.values() if p.pid != os.getpid() and p.mentions(marker)]


def kill_marked(marker: str) -> None:
    """SIGKILL what a test's job left behind (found by its marker), for cleanup."""
    for p in marked(marker):
        try:
            os.kill(p.pid, signal.SIGKILL)
        except OSError:
            pass

