#!/usr/bin/env python3
"""capexec as an OpenAI Agents SDK sandbox, without a model.

Creates a session with `CapexecSandboxClient` (its workspace a new
directory of the server's, removed at the end), runs commands, reads and
writes files, drives an interactive terminal process through the PTY
calls, and checks that a path outside the workspace is refused. Exits 0
only if every step gave the expected result.

    pip install './python[openai-agents]'
    python3 python/examples/openai_agents_sandbox.py [ADDRESS] [--token-file FILE]

ADDRESS is anything `capexec.connect` takes (unix:PATH, tcp:HOST:PORT, a
server named in the configuration file); without it, $CAPEXEC_CONNECT or
the local server's default socket.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
from pathlib import Path

from agents.sandbox import Manifest
from agents.sandbox.entries import File
from agents.sandbox.errors import InvalidManifestPathError

import capexec
from capexec.integrations.openai_agents import CapexecSandboxClient, CapexecSandboxClientOptions


async def main(address: str | None, token_file: str | None) -> int:
    failures: list[str] = []

    def check(what: str, ok: bool) -> None:
        print(f"{'ok' if ok else 'FAILED'}: {what}", file=sys.stderr)
        if not ok:
            failures.append(what)

    conn = await capexec.connect(address, token_file=token_file)
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
    print("all steps worked" if not failures else f"{len(failures)} step(s) failed", file=sys.stderr)
    return 0 if not failures else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("address", nargs="?")
    parser.add_argument("--token-file")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.address, args.token_file)))
