"""Fixtures: real `capexec serve` servers (see capexec_servers.py), and
connections to them over each transport. Test modules import helpers from
capexec_servers, never from conftest (a name every conftest.py shares)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import capexec
from capexec_servers import (
    REPO,
    TRANSPORTS,
    Server,
    capexec_binary,
    certificate_fingerprint,
    connect_over,
    isolated_env,
    start_server,
)

__all__ = [
    "REPO",
    "TRANSPORTS",
    "Server",
    "capexec_binary",
    "certificate_fingerprint",
    "connect_over",
    "isolated_env",
    "start_server",
]


@pytest.fixture(scope="session")
def server_home() -> Iterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="capexec-py-"))
    yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def server(server_home: Path) -> Iterator[Server]:
    """A server on a Unix socket and on loopback TCP with a token."""
    home = server_home / "plain"
    home.mkdir()
    served = start_server(home, [f"unix:{home}/capexec.sock", "tcp:127.0.0.1:0"])
    yield served
    served.stop()


@pytest.fixture(scope="session")
def tls_server(server_home: Path) -> Iterator[Server]:
    """A server on loopback TCP with a token, serving TLS with a
    self-signed certificate of its own (`--tls-self-signed`)."""
    home = server_home / "tls"
    home.mkdir()
    served = start_server(home, ["tcp:127.0.0.1:0"], ["--tls-self-signed"])
    yield served
    served.stop()


@pytest.fixture(scope="session")
def tls_pin(tls_server: Server) -> str:
    return certificate_fingerprint(tls_server.config_dir / "server-cert.pem")


@pytest.fixture(autouse=True)
def client_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's client reads nothing of the user's: its own HOME and
    XDG directories, no CAPEXEC_ variables."""
    home = tmp_path / "client-home"
    home.mkdir()
    for name in list(os.environ):
        if name.startswith(("CAPEXEC_", "XDG_")) and name != "CAPEXEC_BIN":
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    runtime = home / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    return home


@pytest.fixture
async def unix_connection(server: Server) -> AsyncIterator[capexec.Connection]:
    conn = await capexec.connect(server.unix)
    async with conn:
        yield conn


@pytest.fixture
async def tcp_connection(server: Server) -> AsyncIterator[capexec.Connection]:
    assert server.token_file is not None
    conn = await capexec.connect(server.tcp, token_file=server.token_file)
    async with conn:
        yield conn


@pytest.fixture(params=TRANSPORTS)
async def connection(
    request: pytest.FixtureRequest, server: Server, tls_server: Server, tls_pin: str
) -> AsyncIterator[capexec.Connection]:
    """A connection to a real server, once per transport: a Unix socket,
    TCP with a token, TLS with a token and the certificate pinned."""
    conn = await connect_over(request.param, server, tls_server, tls_pin)
    async with conn:
        yield conn
