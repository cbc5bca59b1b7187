"""A real `capexec serve` for the provider tests, on a Unix socket.

The binary is $CAPEXEC_BIN, else <repository>/target/debug/capexec. The
server runs with a plain PATH (/usr/bin:/bin), so what the sandboxed
commands find does not depend on the developer's shell (version managers'
shims live outside the sandbox's readable roots).
"""

from __future__ import annotations

import os
import select
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import capnp  # type: ignore[import-untyped]
import pytest

import capexec

REPO = Path(__file__).resolve().parents[3]


def _binary() -> str:
    explicit = os.environ.get("CAPEXEC_BIN")
    if explicit:
        return explicit
    return str(REPO / "target" / "debug" / "capexec")


@pytest.fixture(scope="session")
def integration_server() -> Iterator[str]:
    """The address ("unix:PATH") of a capexec server that lives for the session."""
    with tempfile.TemporaryDirectory(prefix="capexec-int-") as tmp:
        sock = Path(tmp) / "capexec.sock"
        env = dict(os.environ)
        env["PATH"] = "/usr/bin:/bin"
        env["HOME"] = tmp
        env["XDG_CONFIG_HOME"] = str(Path(tmp) / "config")
        env["XDG_RUNTIME_DIR"] = tmp
        log = open(Path(tmp) / "serve.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [_binary(), "serve", "--listen", f"unix:{sock}"],
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            cwd=tmp,
        )
        try:
            assert proc.stdout is not None
            # The server prints each address once it listens: the first line is the go-ahead.
            ready, _, _ = select.select([proc.stdout], [], [], 30)
            line = proc.stdout.readline().decode().strip() if ready else ""
            if not line:
                proc.wait(timeout=10)
                err = (Path(tmp) / "serve.log").read_text()
                raise RuntimeError(f"capexec serve did not start: {err}")
            yield line if line.startswith("unix:") else f"unix:{sock}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A fresh directory the provider is confined to, with a sibling outside it."""
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "outside.txt").write_text("secret outside the root\n")
    return root


@pytest.fixture
async def integration_executor(integration_server: str) -> AsyncIterator[capexec.Executor]:
    """The executor of a connection to `integration_server`, on the test's event loop."""
    async with capnp.kj_loop():
        conn = await capexec.connect(integration_server)
        try:
            yield conn.executor
        finally:
            await conn.close()
