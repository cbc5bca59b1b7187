#!/usr/bin/env python3
"""A capexec client in Python, with the `capexec` package.

Connects to a capexec server (an address or a configured name, as
`capexec run --connect` takes it; tcp: with a token file), starts a command
(the subscription to its output travels with the start), streams its
output as it comes, prints the exit status and what the process used, then
makes a round trip of a binary file through a Directory (a write, a read,
a streamed download, a listing) and exits 0 only if everything worked and
the command exited as expected.

    pip install ./python
    python3 python/examples/capexec_client.py ADDRESS [--token-file FILE] [--tls-pin SHA256]
        [-- PROGRAM ARGS...]

Without a program it runs `sh -c 'echo hello from python; echo to stderr >&2; exit 3'`
and expects exit code 3 (so the script tests what it shows); a program
given after `--` must exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import capexec

DEFAULT = ["sh", "-c", "echo hello from python; echo to stderr >&2; exit 3"]


async def stream(executor: capexec.Executor, argv: list[str]) -> capexec.ExitStatus:
    """Runs `argv`, copying its output here as it comes; its exit status."""
    async with await executor.start(argv, stdin=False) as process:
        status: capexec.ExitStatus | None = None
        async for event in process.events():
            if isinstance(event, capexec.Output):
                out = sys.stderr if event.stream == "stderr" else sys.stdout
                out.buffer.write(event.data)
                out.flush()
            elif isinstance(event, capexec.Gap):
                raise SystemExit(f"output lost: events {event.from_seq} to {event.seq}")
            elif isinstance(event, capexec.Exited):
                status = event.status
        if status is None:
            raise SystemExit("the process closed without an exit status")
        return status


async def file_round_trip(executor: capexec.Executor) -> bool:
    """Writes a binary file into the server's temporary directory, reads it
    back two ways, lists it and removes it; True if every byte matched."""
    info = await executor.info()
    # Pipelined: the directory and the first call on it travel together.
    tmp = executor.directory(info.temp_dir)
    name = f"capexec-python-{os.getpid()}"
    await tmp.mkdir(name, recursive=True)
    scratch = tmp.subdirectory(name)
    payload = bytes(range(256)) * 1024 + b"\x00end"
    try:
        written = await scratch.write_bytes("data.bin", payload)
        read = await scratch.read_bytes("data.bin")
        downloaded = b"".join([chunk async for chunk in scratch.download_iter("data.bin")])
        names = [entry.name async for entry in scratch.list()]
    finally:
        await tmp.remove(name, recursive=True)
    ok = (
        written.size == len(payload)
        and read == payload
        and downloaded == payload
        and names == ["data.bin"]
    )
    print(f"file round trip of {len(payload)} bytes: {'ok' if ok else 'MISMATCH'}", file=sys.stderr)
    return ok


async def main() -> int:
    parser = argparse.ArgumentParser(
        description="A capexec client with the capexec package.",
        usage="%(prog)s ADDRESS [--token-file FILE] [--tls-pin SHA256] [-- PROGRAM ARGS...]",
    )
    parser.add_argument("address", help="unix:PATH, tcp:HOST:PORT, or a configured name")
    parser.add_argument("--token-file", help="the login token of a tcp: address")
    parser.add_argument("--tls-pin", help="the server's certificate's SHA-256 fingerprint")
    given = sys.argv[1:]
    program = given[given.index("--") + 1 :] if "--" in given else []
    args = parser.parse_args(given[: given.index("--")] if "--" in given else given)
    argv = program or DEFAULT
    async with await capexec.connect(
        args.address, token_file=args.token_file, tls_pin=args.tls_pin
    ) as conn:
        # The demo has a deadline so that CI cannot hang; a command given
        # by the caller runs as long as it takes.
        running = stream(conn.executor, argv)
        status = await (asyncio.wait_for(running, 60) if argv is DEFAULT else running)
        print(status, file=sys.stderr)
        if status.usage is not None:
            usage = status.usage
            print(
                f"used {usage.user_cpu_micros / 1e6:.3f}s user, "
                f"{usage.system_cpu_micros / 1e6:.3f}s system CPU, "
                f"peak RSS {usage.peak_rss_bytes // 1024} KiB",
                file=sys.stderr,
            )
        files_ok = await file_round_trip(conn.executor)
    expected = 3 if argv is DEFAULT else 0
    return 0 if status.code == expected and files_ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
