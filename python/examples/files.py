#!/usr/bin/env python3
"""Files on a capexec server's machine, through a Directory capability.

    python3 python/examples/files.py [ADDRESS] [--token-file FILE]

ADDRESS is anything `capexec.connect` takes (unix:PATH, tcp:HOST:PORT, a
server named in the configuration file); without it, $CAPEXEC_CONNECT or
the local server's default socket.

In a scratch directory under the server's temporary directory it writes a
binary file and reads it back, streams a 6 MiB upload from an async
generator and downloads it into a local file, lists and walks the tree,
shows optimistic concurrency (`if_version` and a Conflict), a read-only
view refusing a write (Forbidden), a watch seeing a change, and that
nothing can leave the directory (OutsideDirectory). It removes the scratch
directory and exits 0 only if every step did what it should.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys
import tempfile
from collections.abc import AsyncIterator

import capexec
from capexec import errors
from capexec.directory import Directory, WatchEventKind

MiB = 1024 * 1024


def check(ok: bool, what: str) -> bool:
    print(f"{'ok' if ok else 'FAILED'}: {what}", file=sys.stderr)
    return ok


async def generated(size: int) -> AsyncIterator[bytes]:
    """`size` bytes made on the fly, in pieces of 100 KB."""
    counter = 0
    sent = 0
    while sent < size:
        block = hashlib.sha256(counter.to_bytes(8, "big")).digest() * 3125
        piece = block[: min(len(block), size - sent)]
        counter += 1
        sent += len(piece)
        yield piece


async def expected(size: int) -> bytes:
    return b"".join([piece async for piece in generated(size)])


async def tour(scratch: Directory) -> bool:
    results: list[bool] = []

    # A binary file, NULs and all, written atomically and read back.
    payload = bytes(range(256)) * 64 + b"\x00end"
    stat = await scratch.write_bytes("data.bin", payload)
    results.append(check(await scratch.read_bytes("data.bin") == payload, "binary round trip"))

    # Optimistic concurrency: a write over a version somebody replaced.
    await scratch.write_bytes("data.bin", b"somebody else's", if_version=stat.version)
    try:
        await scratch.write_bytes("data.bin", b"mine", if_version=stat.version)
        results.append(check(False, "a stale if_version is refused"))
    except errors.Conflict as conflict:
        results.append(check(conflict.tag == "conflict", f"a stale if_version: {conflict}"))

    # A 6 MiB upload from an async generator, streamed, then a download
    # into a local file.
    size = 6 * MiB + 17
    await scratch.upload("streamed/big.bin", generated(size), create_parents=True)
    with tempfile.TemporaryDirectory() as local:
        target = os.path.join(local, "big.bin")
        received = await scratch.download("streamed/big.bin", target)
        with open(target, "rb") as file:
            same = file.read() == await expected(size)
    results.append(check(received == size and same, f"{size} bytes up and down"))

    # Listing and walking.
    names = sorted([entry.path async for entry in scratch.list()])
    results.append(check(names == ["data.bin", "streamed"], f"list: {names}"))
    walked = sorted(entry.path for entry in await scratch.walk().collect())
    results.append(
        check(walked == ["data.bin", "streamed", "streamed/big.bin"], f"walk: {walked}")
    )

    # A read-only view refuses writes.
    try:
        await scratch.read_only().write_bytes("data.bin", b"no")
        results.append(check(False, "a read-only directory refuses writes"))
    except errors.Forbidden as forbidden:
        results.append(check(forbidden.tag == "forbidden", f"read-only: {forbidden}"))

    # Nothing leaves the directory.
    try:
        await scratch.read_bytes("../../etc/passwd")
        results.append(check(False, "paths stay inside the directory"))
    except errors.OutsideDirectory as outside:
        results.append(check(True, f"confined: {outside}"))

    # A watch sees a change made after it is in place.
    async with scratch.watch() as changes:
        await scratch.write_bytes("hello.txt", b"hello\n")

        async def created() -> bool:
            async for event in changes:
                if event.kind is WatchEventKind.CREATED and event.path == "hello.txt":
                    return True
            return False

        results.append(check(await asyncio.wait_for(created(), 30), "watch: hello.txt created"))
    return all(results)


async def main(address: str | None, token_file: str | None) -> int:
    async with await capexec.connect(address, token_file=token_file) as conn:
        info = await conn.executor.info()
        temp = conn.executor.directory(info.temp_dir)
        name = f"capexec-files-example-{os.getpid()}"
        await temp.mkdir(name)
        try:
            ok = await tour(temp.subdirectory(name))
        finally:
            await temp.remove(name, recursive=True)
        print("all steps worked" if ok else "some steps failed", file=sys.stderr)
        return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("address", nargs="?", default=None)
    parser.add_argument("--token-file", default=None)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.address, args.token_file)))
