"""An asyncio event loop on a thread of its own, for synchronous callers.

pycapnp's RPC objects belong to the event loop they were made on. A provider
whose interface is synchronous (deepagents calls its backends' sync methods
from worker threads) keeps its connection on a dedicated loop and hands every
call to it: `run` blocks the calling thread until the coroutine finished on
the loop, `run_async` awaits it from any other event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import capnp  # type: ignore[import-untyped]

T = TypeVar("T")


class LoopThread:
    """A running event loop (with pycapnp's KJ loop) on a daemon thread."""

    def __init__(self, name: str = "capexec-loop") -> None:
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the constructor
            if not self._ready.is_set():
                self._error = exc
                self._ready.set()

    async def _serve(self) -> None:
        async with capnp.kj_loop():
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None
        return self._loop

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Runs `coro` on the loop and waits for its result in this thread."""
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError("a synchronous capexec call was made on the loop that serves it; await the async method instead")
        return self.submit(coro).result(timeout)

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs `coro` on the loop; awaitable from any event loop (or the loop itself)."""
        if self.in_loop_thread():
            return await coro
        return await asyncio.wrap_future(self.submit(coro))

    def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        async def wrapper() -> T:
            return await fn()

        return self.run(wrapper())

    def close(self) -> None:
        """Stops the loop and joins its thread (idempotent)."""
        if self._loop is None or not self._thread.is_alive():
            return
        stop = self._stop
        assert stop is not None
        self._loop.call_soon_threadsafe(stop.set)
        if not self.in_loop_thread():
            self._thread.join()
