"""Hosts and addresses: the hostfile, this machine's address towards a host, free ports."""
from __future__ import annotations

import socket


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
