"""Flow control shared by files and ports: a bounded queue between a sink
the server calls and the code that consumes what it receives, and a window
of calls sent without waiting for their answers.

Both keep memory bounded. A sink's call is answered only once its item is
in the queue, so a consumer that stops reading stops the acknowledgements
and holds the server back; a sender keeps at most a window of bytes in
calls not yet answered, so a slow receiver holds the sender back.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class ChannelClosed(Exception):
    """The consumer went away: what was put is not wanted any more."""


class Channel(Generic[T]):
    """A queue of at most `capacity` items, with an end that is either
    clean or an error. `put` waits for room; `get` waits for an item."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._items: deque[T] = deque()
        self._ended = False
        self._error: BaseException | None = None
        self._closed = False
        self._waiters: list[asyncio.Future[None]] = []
        self._producers: deque[object] = deque()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _changed(self) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await waiter

    async def put(self, make: Callable[[], T]) -> None:
        """Adds the item `make()` makes once it is this call's turn (puts
        go in the order they were called) and there is room; `make` runs
        only then, so a producer held back has not copied anything yet.
        `ChannelClosed` if the consumer is gone (or goes while this waits).
        """
        turn = object()
        self._producers.append(turn)
        try:
            while not self._closed and (
                self._producers[0] is not turn or len(self._items) >= self._capacity
            ):
                await self._changed()
            if self._closed:
                raise ChannelClosed("the consumer went away")
            self._items.append(make())
        finally:
            self._producers.remove(turn)
            self._wake()

    def end(self, error: BaseException | None = None) -> None:
        """No more items: `get` raises `error` (or stops) once the items
        before are taken. Only the first end counts."""
        if not self._ended:
            self._ended = True
            self._error = error
            self._wake()

    def close(self) -> None:
        """The consumer is gone: items are dropped, puts fail."""
        self._closed = True
        self._items.clear()
        self._wake()

    async def get(self) -> T:
        """The next item; `StopAsyncIteration` after a clean end, the
        error after a failed one."""
        while True:
            if self._items:
                item = self._items.popleft()
                self._wake()
                return item
            if self._closed:
                raise StopAsyncIteration
            if self._ended:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            await self._changed()


class Window:
    """Calls sent without waiting, at most `limit` bytes of them
    unanswered: `room` waits for the oldest answers until the next call
    fits, then the call is sent and `add`ed. The first failure is raised
    by `room` or `drain`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._pending: deque[tuple[asyncio.Future[Any], int]] = deque()
        self._bytes = 0

    async def _oldest(self) -> None:
        future, size = self._pending[0]
        try:
            await asyncio.shield(future)
        finally:
            if future.done():
                self._pending.popleft()
                self._bytes -= size

    async def room(self, size: int) -> None:
        """Waits until `size` more bytes fit (always once nothing is
        unanswered)."""
        while self._pending and self._bytes + size > self.limit:
            await self._oldest()

    def add(self, call: Awaitable[Any], size: int) -> asyncio.Future[Any]:
        """Counts a call just sent."""
        future = asyncio.ensure_future(call)
        self._pending.append((future, size))
        self._bytes += size
        return future

    async def drain(self) -> None:
        """Waits for every answer."""
        while self._pending:
            await self._oldest()

    def cancel(self) -> None:
        """Gives up on every call not answered yet."""
        for future, _ in self._pending:
            if future.done() and not future.cancelled():
                # Its failure, if any, is the one being handled already.
                future.exception()
            future.cancel()
        self._pending.clear()
        self._bytes = 0
