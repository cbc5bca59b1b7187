"""Awaiting calls with their errors translated: the one place the public
API turns pycapnp's exceptions into the package's."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import capnp  # type: ignore[import-untyped]

from . import errors


class Owner(Protocol):
    """What a capability's calls may ask about its connection: why it
    could not be established, if that is why they failed."""

    async def _failure(self) -> BaseException | None: ...

    def _lost(self) -> asyncio.Future[None] | None:
        """Resolves when the connection has ended (None: not known)."""
        ...

    def _check_open(self) -> None:
        """Raises Disconnected if the connection was closed here (pycapnp
        can make no call then, not even one that fails)."""
        ...


def check_open(owner: Owner | None) -> None:
    """Raises Disconnected if `owner`'s connection was closed."""
    if owner is not None:
        owner._check_open()


async def call(promise: Any, owner: Owner | None = None) -> Any:
    """The answer to a call sent, or its error as the package raises it."""
    try:
        return await promise
    except capnp.KjException as error:
        raise await translated(error, owner) from None


async def translated(error: BaseException, owner: Owner | None = None) -> BaseException:
    """`error` as the public API raises it. A call that failed because the
    connection broke before the server ever answered raises why the
    connection could not be made (a ConnectError) instead."""
    result = errors.translate(error)
    if owner is not None and isinstance(result, errors.RpcError):
        failure = await owner._failure()
        if failure is not None:
            failure.__cause__ = error
            return failure
    return result


def detach(capability: Any) -> Any:
    """`capability` without the reference pycapnp keeps to the message it
    came in: that message holds every capability it carried, so without
    this none of them is released while any one of them is held."""
    try:
        capability._parent = None
    except AttributeError:
        pass
    return capability
