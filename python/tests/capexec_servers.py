"""Real `capexec serve` servers for the tests, and connections to them.

The binary is $CAPEXEC_BIN, else <repo>/target/debug/capexec (which
`cargo build` makes). Each server runs with its own HOME, XDG_CONFIG_HOME
and XDG_RUNTIME_DIR, so nothing of the user's configuration is read or
written.
"""

from __future__ import annotations

import hashlib
import os
import select
import ssl
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import capexec

REPO = Path(__file__).resolve().parents[2]


def capexec_binary() -> str:
    binary = os.environ.get("CAPEXEC_BIN") or str(REPO / "target" / "debug" / "capexec")
    if not os.access(binary, os.X_OK):
        raise RuntimeError(
            f"no capexec binary at {binary}: run `cargo build` or set CAPEXEC_BIN"
        )
    return binary


@dataclass
class Server:
    """A running `capexec serve`: its addresses, token file and home."""

    process: subprocess.Popen[bytes]
    home: Path
    addresses: list[str]
    token_file: Path | None = None
    stderr_lines: list[str] = field(default_factory=list)

    @property
    def unix(self) -> str:
        return next(a for a in self.addresses if a.startswith("unix:"))

    @property
    def tcp(self) -> str:
        return next(a for a in self.addresses if a.startswith("tcp:"))

    @property
    def config_dir(self) -> Path:
        return self.home / ".config" / "capexec"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def isolated_env(home: Path) -> dict[str, str]:
    """The environment of a server or client that reads nothing of the
    user's: its own HOME and XDG directories."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAPEXEC_", "XDG_"))}
    env["HOME"] = str(home)
    env["XDG_CONFIG_HOME"] = str(home / ".config")
    runtime = home / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env["XDG_RUNTIME_DIR"] = str(runtime)
    return env


def start_server(
    home: Path, listens: list[str], extra: list[str] | None = None, binary: str | None = None
) -> Server:
    """Starts `capexec serve` (`binary`, else the one under test)
    listening on `listens` and waits (with a deadline) for it to print each
    resolved address."""
    token_file = home / "token" if any(a.startswith("tcp:") for a in listens) else None
    args = [binary or capexec_binary(), "serve"]
    for listen in listens:
        args += ["--listen", listen]
    if token_file is not None:
        args += ["--token-file", str(token_file)]
    args += extra or []
    process = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=isolated_env(home),
        cwd=home,
    )
    server = Server(process=process, home=home, addresses=[], token_file=token_file)
    assert process.stdout is not None and process.stderr is not None
    deadline = time.monotonic() + 30
    buffered = b""
    while len(server.addresses) < len(listens):
        left = deadline - time.monotonic()
        ready, _, _ = select.select([process.stdout], [], [], max(left, 0))
        if not ready:
            server.stop()
            raise RuntimeError(f"capexec serve printed no address within 30 s: {args}")
        chunk = os.read(process.stdout.fileno(), 4096)
        if not chunk:
            server.stop()
            err = process.stderr.read().decode(errors="replace")
            raise RuntimeError(f"capexec serve ended: {args}\n{err}")
        buffered += chunk
        *lines, rest = buffered.split(b"\n")
        buffered = rest
        server.addresses += [line.decode() for line in lines if line]
    return server


def certificate_fingerprint(cert: Path) -> str:
    """The SHA-256 of the PEM certificate `cert`, as `capexec serve` prints
    it."""
    der = ssl.PEM_cert_to_DER_cert(cert.read_text())
    return hashlib.sha256(der).hexdigest()


TRANSPORTS = ["unix", "tcp", "tls"]


async def connect_over(
    transport: str, server: Server, tls_server: Server, tls_pin: str
) -> capexec.Connection:
    """A connection to a real server over `transport`: "unix", "tcp" (with
    a token) or "tls" (with a token, the certificate pinned)."""
    if transport == "unix":
        return await capexec.connect(server.unix)
    if transport == "tcp":
        assert server.token_file is not None
        return await capexec.connect(server.tcp, token_file=server.token_file)
    assert tls_server.token_file is not None
    return await capexec.connect(tls_server.tcp, token_file=tls_server.token_file, tls_pin=tls_pin)
