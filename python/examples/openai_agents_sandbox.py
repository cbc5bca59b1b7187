#!/usr/bin/env python3
"""capexec as an OpenAI Agents SDK sandbox, without a model.

Creates a session with `CapexecSandboxClient` (its workspace a new
directory of the server's, removed at the end), runs commands, reads and
writes files, drives an interactive terminal process through the PTY
calls, and checks that a path outside the workspace is refused. Exits 0
only if every step gave the expected result.

    pip install './python[openai-agents]'
    python3 python/examples/openai_agents_sandbox.py [ADDRESS]

ADDRESS is what `capexec.connect` takes; without it, $CAPEXEC_CONNECT or
the local server.
"""

from __future__ import annotations

import asyncio
import io
import sys
from pathlib import Path

import capnp
from agents.sandbox import Manifest
from agents.sandbox.entries import File
from agents.sandbox.errors import InvalidManifestPathError

import capexec
from capexec.integrations.openai_agents import CapexecSandboxClient, CapexecSandboxClientOptions


async def main(address: str | None) -> int:
    failures: list[str] = []

    def check(what: str, ok: bool) -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failures.append(what)

    conn = await capexec.connect(address)
    try:
        client = CapexecSandboxClient(conn.executor)
        manifest = Manifest(entries={"README.txt": File(content=b"written by the manifest\n")})
        session = await client.create(manifest=manifest, options=CapexecSandboxClientOptions())
        try:
            async with session:
                r = await session.exec("cat README.txt; echo oops >&2; exit 2")
                check("exec", (r.stdout, r.stderr, r.exit_code) == (b"written by the manifest\n", b"oops\n", 2))
                await session.write(Path("notes/today.txt"), io.BytesIO(b"capexec"))
                check("write + read", (await session.read(Path("notes/today.txt"))).read() == b"capexec")
                names = sorted(Path(e.path).name for e in await session.ls("."))
                check("ls", names == ["README.txt", "notes"])
                started = await session.pty_exec_start("cat", shell=False, tty=True, yield_time_s=0.3)
                pid = started.process_id
                echoed = await session.pty_write_stdin(session_id=pid or 0, chars="ping\n", yield_time_s=1.0)
                check("pty echo", echoed.output == b"ping\r\nping\r\n")
                ended = await session.pty_write_stdin(session_id=pid or 0, chars="\x04", yield_time_s=5.0)
                check("pty end of input", (ended.exit_code, ended.process_id) == (0, None))
                try:
                    await session.read(Path("../../etc/passwd"))
                    check("a path outside the workspace is refused", False)
                except InvalidManifestPathError:
                    check("a path outside the workspace is refused", True)
        finally:
            await client.delete(session)
    finally:
        await conn.close()
    print("all good" if not failures else f"{len(failures)} step(s) failed")
    return 0 if not failures else 1


async def run(address: str | None) -> int:
    async with capnp.kj_loop():
        return await main(address)


if __name__ == "__main__":
    sys.exit(asyncio.run(run(sys.argv[1] if len(sys.argv) > 1 else None)))
