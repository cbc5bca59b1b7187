"""Addresses: `unix:PATH` or `tcp:HOST:PORT`, parsed as the command line
parses them (src/model/address.rs)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class UnixAddress:
    path: str

    def __str__(self) -> str:
        return f"unix:{self.path}"


@dataclass(frozen=True)
class TcpAddress:
    #: A name or an IP address (an IPv6 address without brackets).
    host: str
    port: int

    def __str__(self) -> str:
        if ":" in self.host:
            return f"tcp:[{self.host}]:{self.port}"
        return f"tcp:{self.host}:{self.port}"


Address = UnixAddress | TcpAddress


def quote(text: str) -> str:
    """`text` quoted as the command line quotes it (Rust's `{:?}`)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def parse(text: str) -> Address:
    """`text` as an address; ValueError with the command line's sentence if
    it is not one."""
    if text.startswith("unix:"):
        path = text[len("unix:") :]
        if not path:
            raise ValueError(f"{quote(text)}: unix: needs a socket path")
        return UnixAddress(path)
    if text.startswith("tcp:"):
        rest = text[len("tcp:") :]
        host, sep, port_text = rest.rpartition(":")
        if not sep:
            raise ValueError(f"{quote(text)}: expected tcp:HOST:PORT")
        if not port_text.isdigit() or int(port_text) > 65535:
            raise ValueError(f"{quote(text)}: {quote(port_text)} is not a port number")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        elif ":" in host:
            # Unbracketed, "::1:80" could be ::1 port 80 or ::1:80 with no
            # port: which one is never guessed.
            raise ValueError(f"{quote(text)}: an IPv6 address goes in brackets (tcp:[::1]:80)")
        if not host:
            raise ValueError(f"{quote(text)}: expected tcp:HOST:PORT")
        return TcpAddress(host, int(port_text))
    raise ValueError(f"{quote(text)}: an address is unix:PATH or tcp:HOST:PORT")


def default_socket_path() -> str:
    """`capexec serve`'s socket without `--listen`, which `local` reaches:
    $XDG_RUNTIME_DIR/capexec/capexec.sock, for root /run/capexec/capexec.sock.
    ValueError if there is none."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "capexec", "capexec.sock")
    if os.geteuid() == 0:
        return "/run/capexec/capexec.sock"
    raise ValueError(
        "there is no default socket: XDG_RUNTIME_DIR is not set (and only root uses "
        "/run/capexec); give unix:PATH"
    )
