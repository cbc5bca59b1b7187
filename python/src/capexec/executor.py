"""The Executor: runs processes on the server's machine."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import _rpc

if TYPE_CHECKING:
    from .directory import Directory

__all__ = ["Environment", "Executor", "ExecutorInfo"]

PathArg = str | bytes | os.PathLike[str] | os.PathLike[bytes]


def _fsbytes(value: PathArg) -> bytes:
    return os.fsencode(value)


@dataclass(frozen=True)
class ExecutorInfo:
    """What an executor reports about itself (`Executor.info`)."""

    version: str
    features: tuple[str, ...]
    os: str
    arch: str
    hostname: str
    default_shell: bytes
    cwd: bytes
    temp_dir: bytes
    environment: str


@dataclass(frozen=True)
class Environment:
    """An environment a server offers (`Executor.environments`)."""

    name: str
    address: str
    is_default: bool
    #: "local", "idle", "connecting", "connected" or "failed".
    state: str
    #: Why the last attempt failed ("failed" only).
    reason: str | None = None
    #: Milliseconds until the next use may try again ("failed" only).
    retry_in_ms: int | None = None


class Executor:
    """A capability to run processes (see the schema's `Executor`)."""

    def __init__(self, client: Any, owner: _rpc.Owner | None = None) -> None:
        self._client = client
        # What must live as long as this executor (its connection), and
        # says why it failed if it never came up.
        self._owner = owner

    @classmethod
    def _from_client(cls, client: Any, owner: Any = None) -> Executor:
        return cls(client, owner)

    @property
    def client(self) -> Any:
        """The pycapnp `Executor` client, for calls this class lacks."""
        return self._client

    async def info(self) -> ExecutorInfo:
        """What the executor reports about itself."""
        info = (await _rpc.call(self._client.info(), self._owner)).info
        return ExecutorInfo(
            version=str(info.version),
            features=tuple(str(name) for name in info.features),
            os=str(info.os),
            arch=str(info.arch),
            hostname=str(info.hostname),
            default_shell=bytes(info.defaultShell),
            cwd=bytes(info.cwd),
            temp_dir=bytes(info.tempDir),
            environment=str(info.environment),
        )

    async def environments(self) -> list[Environment]:
        """The environments the server offers, with their states."""
        answer = await _rpc.call(self._client.environments(), self._owner)
        result = []
        for env in answer.environments:
            state = str(env.state.which())
            failed = state == "failed"
            result.append(
                Environment(
                    name=str(env.name),
                    address=str(env.address),
                    is_default=bool(env.isDefault),
                    state=state,
                    reason=str(env.state.failed.reason) if failed else None,
                    retry_in_ms=int(env.state.failed.retryInMs) if failed else None,
                )
            )
        return result

    def directory(self, path: PathArg) -> Directory:
        """The directory `path` of the executor's machine, as a capability
        (pipelined: it costs no round trip; a missing directory makes the
        first call on it fail)."""
        from .directory import Directory

        return Directory(self._client.directory(path=_fsbytes(path)).dir, _owner=self._owner)
