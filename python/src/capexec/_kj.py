"""The KJ event loop pycapnp needs, run on the caller's asyncio loop for as
long as a connection needs it.

pycapnp's RPC works only inside `capnp.kj_loop()`. A program that already
runs one (`capnp.run(main())`) keeps it; otherwise the first connection on
an asyncio loop starts one, and the last connection closed stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from typing import Any

import capnp  # type: ignore[import-untyped]


class _Held:
    def __init__(self) -> None:
        self.users = 0
        self.stack: contextlib.AsyncExitStack | None = None


_HELD: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Held] = weakref.WeakKeyDictionary()


def running() -> bool:
    """Whether a KJ event loop runs on the current asyncio loop."""
    return getattr(asyncio.get_running_loop(), "_kj_loop", None) is not None


class Lease:
    """One user's hold on the KJ event loop; `release` once."""

    def __init__(self, loop: asyncio.AbstractEventLoop, held: _Held | None) -> None:
        self._loop = loop
        self._held = held

    async def release(self) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        held.users -= 1
        if held.users == 0 and held.stack is not None:
            stack, held.stack = held.stack, None
            _HELD.pop(self._loop, None)
            await stack.aclose()


async def acquire() -> Lease:
    """Makes sure a KJ event loop runs on the current asyncio loop until the
    lease is released (a loop the caller started is left alone)."""
    loop = asyncio.get_running_loop()
    held = _HELD.get(loop)
    if held is None:
        if running():
            # The caller's own: not ours to stop.
            return Lease(loop, None)
        held = _Held()
        stack = contextlib.AsyncExitStack()
        manager: Any = capnp.kj_loop()
        await stack.enter_async_context(manager)
        held.stack = stack
        _HELD[loop] = held
    held.users += 1
    return Lease(loop, held)
