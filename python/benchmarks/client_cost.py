#!/usr/bin/env python3
"""What the Python client costs: the Python side of `cargo bench --bench
capexec -- --only python`, which runs the Rust client beside it.

    client_cost.py ADDRESS

Connects once, then answers requests read from stdin one line at a time,
each with one line of durations in seconds on stdout:

    latency N      N runs of `true`, each from the start to its exit
    output BYTES   `head -c BYTES /dev/zero` read to its close through
                   Process.events(), lossless; every byte counted

End of input ends it.
"""

from __future__ import annotations

import asyncio
import sys
import time

import capexec


async def latency(executor: capexec.Executor, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        completed = await executor.run(["true"])
        samples.append(time.perf_counter() - started)
        if completed.exit_code != 0:
            raise SystemExit(f"`true` through the Python client: {completed}")
    return samples


async def output(executor: capexec.Executor, size: int) -> list[float]:
    started = time.perf_counter()
    received = 0
    async with await executor.start(
        ["head", "-c", str(size), "/dev/zero"], flow="lossless"
    ) as process:
        async for event in process.events():
            if isinstance(event, capexec.Output):
                received += len(event.data)
            elif isinstance(event, capexec.Gap):
                raise SystemExit(f"lossless output lost events {event}")
    elapsed = time.perf_counter() - started
    if received != size:
        raise SystemExit(f"Python client: {received} of {size} bytes")
    return [elapsed]


async def main(address: str) -> None:
    connection = await capexec.connect(address)
    async with connection:
        executor = connection.executor
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            request, argument = line.split()
            if request == "latency":
                samples = await latency(executor, int(argument))
            elif request == "output":
                samples = await output(executor, int(argument))
            else:
                raise SystemExit(f"unknown request {line!r}")
            print(" ".join(f"{sample:.9f}" for sample in samples), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1]))
