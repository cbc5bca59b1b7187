"""Collecting a capexec process's output for the framework providers."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from capexec.process import Closed, Exited, Gap, Output, Process


@dataclass
class Collected:
    """What a process wrote, in the order it wrote it, and how it ended."""

    combined: bytearray = field(default_factory=bytearray)
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    exit_code: int | None = None
    timed_out: bool = False
    truncated: bool = False


async def collect(proc: Process, *, timeout: float | None, max_bytes: int) -> Collected:
    """Reads `proc`'s events until it closed (or `timeout` seconds passed: then
    its tree is terminated and `timed_out` set; it is set too when the
    server ended the process for its start's own timeout). Keeps at most `max_bytes` of
    each of `combined`, `stdout` and `stderr`; `truncated` tells that some
    output was dropped (by this limit, or a gap of the server's retained log).
    A death by signal N is reported as exit code 128 + N, as a shell does."""
    out = Collected()
    deadline = None if timeout is None else time.monotonic() + timeout

    def keep(buf: bytearray, data: bytes) -> None:
        room = max_bytes - len(buf)
        if len(data) > room:
            buf += data[: max(room, 0)]
            out.truncated = True
        else:
            buf += data

    async def read_all() -> None:
        async for event in proc.events():
            if isinstance(event, Output):
                keep(out.combined, event.data)
                keep(out.stderr if event.stream == "stderr" else out.stdout, event.data)
            elif isinstance(event, Gap):
                out.truncated = True
            elif isinstance(event, Exited):
                if event.status.timed_out:
                    out.timed_out = True  # the start's own timeout, on the server
                if event.code is not None:
                    out.exit_code = event.code
                elif event.signal is not None:
                    out.exit_code = 128 + event.signal
            elif isinstance(event, Closed):
                return

    if deadline is None:
        await read_all()
        return out
    task = asyncio.ensure_future(read_all())
    done, _ = await asyncio.wait({task}, timeout=max(deadline - time.monotonic(), 0))
    if task in done:
        task.result()
        return out
    out.timed_out = True
    await proc.terminate()
    # The exit comes at once (SIGTERM) or after the server's grace (SIGKILL).
    await task
    return out
