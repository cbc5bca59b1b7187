"""capexec's errors, one class per tag.

Every error a capexec server raises carries a machine-readable tag at the
end of its description, `[capexec:CODE]` (see the schema's conventions).
`translate` turns a pycapnp exception into the class of its tag, with the
tag (`.tag`) and the sentence for people (`.sentence`: without the hops'
`remote exception:` prefixes or the tag). Every exception the package's
public API raises for a failed call is one of these.

Errors without a tag come from the RPC system itself: `Disconnected` (the
connection, or a link of a chain, broke), `Overloaded` (the connection was
closed for exceeding a limit), `Unimplemented` (an older server) and
`RemoteError` (anything else). `ConnectError` says why a connection could
not be made, or why the configuration that names it is wrong.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import capnp  # type: ignore[import-untyped]

__all__ = [
    "CapexecError",
    "RefusalError",
    "InvalidArgument",
    "ProgramNotFound",
    "PermissionDenied",
    "BadCwd",
    "Unsupported",
    "Unavailable",
    "SpawnFailed",
    "UpstreamUnavailable",
    "UnknownEnvironment",
    "UnknownToken",
    "LimitReached",
    "NotAllowed",
    "SocketFailed",
    "Forbidden",
    "Unauthenticated",
    "Internal",
    "NotFound",
    "NotADirectory",
    "IsADirectory",
    "Exists",
    "NotEmpty",
    "TooLarge",
    "Conflict",
    "OutsideDirectory",
    "NoSpace",
    "Busy",
    "RpcError",
    "Disconnected",
    "Overloaded",
    "Unimplemented",
    "RemoteError",
    "ConnectError",
    "OutputLost",
    "CommandFailed",
    "UnknownCertificate",
    "ChangedCertificate",
    "REFUSALS",
    "translate",
    "human_description",
]


class CapexecError(Exception):
    """A failed call or connection: `tag` for programs, `sentence` for people."""

    def __init__(self, tag: str, sentence: str) -> None:
        super().__init__(sentence)
        self.tag = tag
        self.sentence = sentence

    def __str__(self) -> str:
        return self.sentence

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.sentence!r})"


class RefusalError(CapexecError):
    """A call the server refused, with the tag its description carried.

    Each subclass is one tag (its `TAG`); `translate` picks it."""

    TAG: ClassVar[str] = ""

    def __init__(self, sentence: str) -> None:
        super().__init__(self.TAG, sentence)


class InvalidArgument(RefusalError):
    """Malformed or impossible parameters."""

    TAG = "invalid-argument"


class ProgramNotFound(RefusalError):
    """`argv[0]` does not resolve to a file."""

    TAG = "program-not-found"


class PermissionDenied(RefusalError):
    """The program exists but cannot be executed; on a Directory, the
    operating system refused (EACCES, EPERM, a read-only file system)."""

    TAG = "permission-denied"


class BadCwd(RefusalError):
    """The working directory does not exist or is not a directory."""

    TAG = "bad-cwd"


class Unsupported(RefusalError):
    """The server cannot honour a requested feature."""

    TAG = "unsupported"


class Unavailable(RefusalError):
    """The executor does nothing new now (it is shutting down)."""

    TAG = "unavailable"


class SpawnFailed(RefusalError):
    """Any other operating-system failure of a start."""

    TAG = "spawn-failed"


class UpstreamUnavailable(RefusalError):
    """The call was for an upstream environment that cannot be reached."""

    TAG = "upstream-unavailable"


class UnknownEnvironment(RefusalError):
    """No environment has the name asked for."""

    TAG = "unknown-environment"


class UnknownToken(RefusalError):
    """`restore`: no process has this token (any more)."""

    TAG = "unknown-token"


class LimitReached(RefusalError):
    """A configured limit would be exceeded."""

    TAG = "limit"


class NotAllowed(RefusalError):
    """A rule of a restricted executor forbids it."""

    TAG = "not-allowed"


class SocketFailed(RefusalError):
    """A socket operation of a port (dial, listen, a connection's transfer)
    failed on the executor's machine."""

    TAG = "socket-failed"


class Forbidden(RefusalError):
    """The capability may not make this call (an attenuated facet, a
    read-only directory)."""

    TAG = "forbidden"


class Unauthenticated(RefusalError):
    """A login was refused."""

    TAG = "unauthenticated"


class Internal(RefusalError):
    """The server failed in a way the request could not have avoided."""

    TAG = "internal"


class NotFound(RefusalError):
    """No file or directory by that name."""

    TAG = "not-found"


class NotADirectory(RefusalError):
    """A path component, or the target, is not a directory."""

    TAG = "not-a-directory"


class IsADirectory(RefusalError):
    """A file was expected; the path names a directory."""

    TAG = "is-a-directory"


class Exists(RefusalError):
    """The target exists and may not be replaced."""

    TAG = "exists"


class NotEmpty(RefusalError):
    """A directory to remove or replace is not empty."""

    TAG = "not-empty"


class TooLarge(RefusalError):
    """A file is larger than a one-shot call carries."""

    TAG = "too-large"


class Conflict(RefusalError):
    """The file changed since the version the call names."""

    TAG = "conflict"


class OutsideDirectory(RefusalError):
    """The path would leave the directory capability."""

    TAG = "outside-directory"


class NoSpace(RefusalError):
    """The file system is full, or a quota is reached."""

    TAG = "no-space"


class Busy(RefusalError):
    """The file is in use (a mount point, a running program)."""

    TAG = "busy"


#: Every refusal class by its tag's code, in the schema's order.
REFUSALS: dict[str, type[RefusalError]] = {
    cls.TAG: cls
    for cls in (
        InvalidArgument,
        ProgramNotFound,
        PermissionDenied,
        BadCwd,
        Unsupported,
        Unavailable,
        SpawnFailed,
        UpstreamUnavailable,
        UnknownEnvironment,
        UnknownToken,
        LimitReached,
        NotAllowed,
        SocketFailed,
        Forbidden,
        Unauthenticated,
        Internal,
        NotFound,
        NotADirectory,
        IsADirectory,
        Exists,
        NotEmpty,
        TooLarge,
        Conflict,
        OutsideDirectory,
        NoSpace,
        Busy,
    )
}


class RpcError(CapexecError):
    """An error of the RPC system itself, without a capexec tag; `tag` is
    its kind ("disconnected", "overloaded", "unimplemented", "failed")."""


class Disconnected(RpcError):
    """The connection, or a link of a chain, broke (or was closed)."""

    def __init__(self, sentence: str) -> None:
        super().__init__("disconnected", sentence)


class Overloaded(RpcError):
    """The connection was closed for exceeding a limit (the sentence says
    which), or the peer is overloaded."""

    def __init__(self, sentence: str) -> None:
        super().__init__("overloaded", sentence)


class Unimplemented(RpcError):
    """The server does not know the method (an older server)."""

    def __init__(self, sentence: str) -> None:
        super().__init__("unimplemented", sentence)


class RemoteError(RpcError):
    """Any other failure without a capexec tag."""

    def __init__(self, sentence: str) -> None:
        super().__init__("failed", sentence)


class ConnectError(CapexecError):
    """A connection could not be made, or the configuration naming it is
    wrong; the sentence says which and what to do (as the command line's
    does). `address` is the address it was for, when known."""

    def __init__(self, sentence: str, *, address: str | None = None) -> None:
        super().__init__("connect", sentence)
        self.address = address


class UnknownCertificate(ConnectError):
    """Trust on first use: the server's TLS certificate is not known here
    (`offered`, its SHA-256 fingerprint); nothing was sent to it."""

    def __init__(self, sentence: str, *, address: str, offered: str) -> None:
        super().__init__(sentence, address=address)
        self.offered = offered


class ChangedCertificate(ConnectError):
    """Trust on first use: the server's TLS certificate is not the one
    remembered for it; nothing was sent to it."""

    def __init__(self, sentence: str, *, address: str, known: str, offered: str) -> None:
        super().__init__(sentence, address=address)
        self.known = known
        self.offered = offered


class OutputLost(CapexecError):
    """Output was evicted from the server's retained log before it was
    read (seqs `from_seq` to `to_seq`): `run` never returns output with a
    hole in it."""

    def __init__(self, from_seq: int, to_seq: int) -> None:
        super().__init__(
            "output-lost", f"output was lost before it was read (events {from_seq} to {to_seq})"
        )
        self.from_seq = from_seq
        self.to_seq = to_seq


class CommandFailed(CapexecError):
    """`run(..., check=True)` of a command that did not exit with code 0,
    as subprocess's CalledProcessError: `argv`, `status` (an ExitStatus),
    `stdout`, `stderr`."""

    def __init__(self, argv: list[bytes], status: Any, stdout: bytes, stderr: bytes) -> None:
        program = argv[0].decode(errors="replace") if argv else "?"
        super().__init__("command-failed", f"{program} ended with {status}")
        self.argv = argv
        self.status = status
        self.stdout = stdout
        self.stderr = stderr

    @property
    def returncode(self) -> int:
        return int(self.status.returncode)


_REMOTE_PREFIX = "remote exception:"
_TAG = re.compile(r"\[capexec:([a-z-]+)\]")


def human_description(description: str) -> str:
    """An error description for people: without the hops' prefixes or
    capexec's machine tags."""
    text = description.strip()
    while text.startswith(_REMOTE_PREFIX):
        text = text[len(_REMOTE_PREFIX) :].lstrip()
    text = re.sub(r"\[capexec:[^\]]*\]", "", text)
    return text.strip()


def _kind(description: str) -> type[RefusalError] | None:
    for match in _TAG.finditer(description):
        cls = REFUSALS.get(match.group(1))
        if cls is not None:
            return cls
    return None


def translate(exc: BaseException) -> BaseException:
    """The package's exception for `exc`: a pycapnp `KjException` becomes
    the class of its `[capexec:CODE]` tag (or `Disconnected`, `Overloaded`,
    `Unimplemented`, `RemoteError` when it has none), with the sentence for
    people; anything else is returned unchanged. The result has `exc` as
    its `__cause__`."""
    if isinstance(exc, CapexecError) or not isinstance(exc, capnp.KjException):
        return exc
    description = str(getattr(exc, "description", None) or exc)
    sentence = human_description(description)
    refusal = _kind(description)
    result: CapexecError
    if refusal is not None:
        result = refusal(sentence)
    else:
        kind = str(getattr(exc, "type", "") or "")
        if kind == "DISCONNECTED":
            result = Disconnected(sentence)
        elif kind == "OVERLOADED":
            result = Overloaded(sentence)
        elif kind == "UNIMPLEMENTED":
            result = Unimplemented(sentence)
        else:
            result = RemoteError(sentence)
    result.__cause__ = exc
    return result
