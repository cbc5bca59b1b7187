"""The providers' examples work against a real server, over unix and tcp."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from capexec_servers import Server, isolated_env

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("transport", ["unix", "tcp"])
@pytest.mark.parametrize(
    ("example", "framework"),
    [("deepagents_backend.py", "deepagents"), ("openai_agents_sandbox.py", "agents")],
)
async def test_example_works(server: Server, transport: str, example: str, framework: str) -> None:
    pytest.importorskip(framework)
    args = [sys.executable, str(EXAMPLES / example)]
    if transport == "unix":
        args.append(server.unix)
    else:
        assert server.token_file is not None
        args += [server.tcp, "--token-file", str(server.token_file)]
    process = await asyncio.create_subprocess_exec(
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=isolated_env(server.home),
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 120)
    text = stderr.decode(errors="replace")
    assert process.returncode == 0, text
    assert text.splitlines()[-1] == "all steps worked"
    assert "FAILED" not in text
