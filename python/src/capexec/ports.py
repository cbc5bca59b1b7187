"""Ports through an executor: `dial` a connection from the executor's
machine (as asyncio streams), and `forward` local connections to an
address there, like `ssh -L` (see the schema's "Ports").

A connection is a pair of real `asyncio.StreamReader` and
`asyncio.StreamWriter` over a transport whose bytes travel as `PortSink`
calls. Half-close works both ways: `writer.write_eof()` makes the far
peer read end of file while reading goes on, and the far peer's
shutdown reads here as end of file. A reset, a refusal or a lost
connection to the server is an error (`ConnectionResetError`,
`ConnectionAbortedError`), never an end of file.

Flow control is end to end: a write is answered once the far socket took
the bytes, and at most 1 MiB is unanswered per connection (less when many
share one connection to the server), so `await writer.drain()` waits for a
slow far reader; what arrives is answered only while the reader's buffer
is below its limit, so a slow reader here holds the far writer back.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import _rpc, errors
from ._schema import schema

if TYPE_CHECKING:
    from .executor import Executor

__all__ = ["Forward", "PortConnectionInfo", "dial", "format_address", "forward"]

log = logging.getLogger("capexec.ports")

CHUNK_BYTES = 256 * 1024
"""The most one `PortSink.write` carries (the server's own senders too)."""

WINDOW_BYTES = 1024 * 1024
"""A connection's bytes unanswered at most."""

POOL_BYTES = 16 * 1024 * 1024
"""What all the connections of this thread may have unanswered: each gets
its share of it, between 16 KiB and 1 MiB."""

MIN_SHARE_BYTES = 16 * 1024

LINGER_SECONDS = 60.0
"""How long a closed connection waits for the far peer's end of file
before it is released (and reset), as a kernel's FIN_WAIT_2 does."""

_senders = 0
"""Connections of this thread that send (see POOL_BYTES)."""


def _share() -> int:
    return max(MIN_SHARE_BYTES, min(WINDOW_BYTES, POOL_BYTES // max(1, _senders)))


@dataclass(frozen=True)
class PortConnectionInfo:
    """The socket's own address on the executor's machine
    ("tcp:127.0.0.1:40312") and its peer's ("tcp:127.0.0.1:5432")."""

    local: str
    peer: str


def format_address(host: str, port: int | None = None) -> str:
    """The wire address of `host` and `port`: "tcp:HOST:PORT" (an IPv6
    address in brackets); `host` alone may be a whole address already
    ("tcp:...", "unix:/path")."""
    if port is None:
        if host.startswith(("tcp:", "unix:")):
            return host
        raise ValueError(f"{host!r}: give a port, or an address tcp:HOST:PORT or unix:PATH")
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is not between 1 and 65535")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        if isinstance(ipaddress.ip_address(bare), ipaddress.IPv6Address):
            return f"tcp:[{bare}]:{port}"
    except ValueError:
        pass
    return f"tcp:{host}:{port}"


def _socket_name(address: str) -> Any:
    """An address as asyncio reports a socket's name: (host, port) for
    TCP, the path for Unix."""
    if address.startswith("unix:"):
        return address[len("unix:") :]
    if address.startswith("tcp:"):
        host, _, port = address[len("tcp:") :].rpartition(":")
        if port.isdigit():
            return (host.strip("[]"), int(port))
    return address


class _PortTransport(asyncio.Transport):
    """One connection through an executor, as an asyncio transport.

    Outgoing bytes wait in `_buffer` until the sender task puts them in
    `toSocket.write` calls; incoming ones are handed to the protocol by
    `_FromSocket`. The protocol's `connection_lost` comes once: after a
    close, an abort, or a failure of either direction.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        protocol: asyncio.Protocol,
        owner: _rpc.Owner | None,
    ) -> None:
        super().__init__()
        self._loop = loop
        self._protocol = protocol
        self._owner = owner
        self._info: PortConnectionInfo | None = None
        self._to_socket: Any = None
        self._connection: Any = None
        self._buffer = bytearray()
        self._unanswered = 0
        self._high = 2 * CHUNK_BYTES
        self._low = CHUNK_BYTES
        self._writing_paused = False
        self._eof_asked = False  # write_eof or close: `end` once flushed
        self._end_sent = False  # `end` answered
        self._closing = False  # close() or abort() called
        self._in_ended = False  # the far peer's end arrived
        self._done = False  # connection_lost given to the protocol
        self._released = False
        self._reading_paused = False
        self._resumed: asyncio.Future[None] | None = None
        self._progress = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._counted = False

    # -- set up ---------------------------------------------------------------

    def _connected(self, connection: Any, to_socket: Any, info: PortConnectionInfo) -> None:
        global _senders
        self._connection = connection
        self._to_socket = to_socket
        self._info = info
        _senders += 1
        self._counted = True
        self._sender = self._loop.create_task(self._send_loop())

    # -- asyncio.Transport ------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        info = self._info
        if info is None:
            return default
        if name == "peername":
            return _socket_name(info.peer)
        if name == "sockname":
            return _socket_name(info.local)
        if name == "capexec":
            return info
        return default

    def is_closing(self) -> bool:
        return self._closing or self._done

    def close(self) -> None:
        """Sends what is buffered, then the end of this direction; the
        protocol hears `connection_lost(None)` once the end is answered.
        The connection itself is released once the far peer's end arrives
        too (or bytes arrive, which reset it, as a closed socket's kernel
        does; or after `LINGER_SECONDS`)."""
        if self._closing:
            return
        self._closing = True
        self._eof_asked = True
        self._progress.set()
        if self._end_sent:
            self._closed_and_ended()

    def _closed_and_ended(self) -> None:
        """Closed, and `end` was answered."""
        self._lose(None)
        if self._in_ended:
            self._release()
        elif not self._released and self._linger is None:
            self._linger = self._loop.call_later(
                LINGER_SECONDS, self._release, "closed, and the peer never ended"
            )

    def abort(self) -> None:
        """Resets the connection now; buffered bytes are dropped."""
        self._closing = True
        self._buffer.clear()
        self._release(reset="the client reset the connection")
        self._lose(None)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._eof_asked:
            raise RuntimeError("cannot write after write_eof() or close()")
        if self._done or not data:
            # As asyncio's sockets: a write after the loss is dropped; the
            # next drain() raises.
            return
        self._buffer += data
        self._progress.set()
        self._check_pause()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def write_eof(self) -> None:
        if self._eof_asked:
            return
        self._eof_asked = True
        self._progress.set()

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return len(self._buffer) + self._unanswered

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (self._low, self._high)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = 2 * CHUNK_BYTES if low is None else 4 * low
        if low is None:
            low = high // 4
        if not 0 <= low <= high:
            raise ValueError(f"high ({high}) must be >= low ({low}) must be >= 0")
        self._high, self._low = high, low
        self._check_pause()

    def pause_reading(self) -> None:
        if not self._reading_paused:
            self._reading_paused = True
            self._resumed = self._loop.create_future()

    def resume_reading(self) -> None:
        if self._reading_paused:
            self._reading_paused = False
            if self._resumed is not None and not self._resumed.done():
                self._resumed.set_result(None)
            self._resumed = None

    def is_reading(self) -> bool:
        return not self._reading_paused

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    # -- writing ----------------------------------------------------------------

    def _check_pause(self) -> None:
        size = self.get_write_buffer_size()
        if not self._writing_paused and size > self._high and not self._done:
            self._writing_paused = True
            self._protocol.pause_writing()
        elif self._writing_paused and size <= self._low:
            self._writing_paused = False
            self._protocol.resume_writing()

    async def _send_loop(self) -> None:
        try:
            while not self._done and not self._released:
                share = _share()
                if self._buffer and self._unanswered < share:
                    size = min(len(self._buffer), CHUNK_BYTES, share - self._unanswered)
                    chunk = bytes(self._buffer[:size])
                    del self._buffer[:size]
                    self._sent(self._to_socket.write(bytes=chunk), size)
                    continue
                if not self._buffer and self._eof_asked and not self._end_sent:
                    if self._unanswered == 0:
                        await _rpc.call(self._to_socket.end(), self._owner)
                        self._end_sent = True
                        self._ended_out()
                        return
                self._progress.clear()
                await self._progress.wait()
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self._fail(error)

    def _sent(self, call: Any, size: int) -> None:
        self._unanswered += size
        future = asyncio.ensure_future(call)

        def answered(future: asyncio.Future[Any]) -> None:
            self._unanswered -= size
            if future.cancelled():
                return
            error = future.exception()
            if error is not None:
                self._fail(error)
                return
            self._progress.set()
            self._check_pause()

        future.add_done_callback(answered)

    def _ended_out(self) -> None:
        """`end` was answered: the far peer reads end of file."""
        if self._closing:
            self._closed_and_ended()
        elif self._in_ended:
            # Both directions ended cleanly: the server closed the socket.
            self._release()
            self._lose(None)

    # -- reading ----------------------------------------------------------------

    async def _received(self, data: bytes) -> None:
        """A `fromSocket.write`: handed to the protocol now (calls arrive
        in order), answered once the reader has room."""
        if self._closing or self._done or self._released:
            # A closed socket's kernel resets a peer that goes on.
            self._release(reset="bytes arrived after the client closed the connection")
            self._lose(None)
            raise _refusal("socket-failed", "the client closed the connection")
        if self._in_ended:
            raise _refusal("invalid-argument", "a write after the end of the connection")
        self._protocol.data_received(data)
        while self._reading_paused and self._resumed is not None and not self._done:
            await asyncio.shield(self._resumed)

    def _received_end(self) -> None:
        if self._in_ended:
            return
        self._in_ended = True
        if self._closing:
            if self._end_sent:
                self._release()
            return
        if self._done:
            return
        if not self._protocol.eof_received():
            self.close()
        elif self._end_sent:
            # Both directions ended cleanly: the server closed the socket.
            self._release()
            self._lose(None)

    def _received_fail(self, reason: str) -> None:
        if self._in_ended and self._end_sent:
            # Both ended before: the release's report, nothing lost.
            return
        self._release()
        self._lose(ConnectionResetError(reason))

    def _lost_sink(self) -> None:
        """`fromSocket` was released with neither `end` nor `fail`: the
        server, or a link on the way to it, is gone. (After `end` the
        server has no more use for it: that release loses nothing.)"""
        if self._released or self._in_ended:
            return
        self._release()
        self._lose(ConnectionAbortedError("the connection through the executor was lost"))

    # -- the end ------------------------------------------------------------------

    def _fail(self, error: BaseException) -> None:
        """A call on `toSocket` failed: the connection was reset (or the
        connection to the server lost)."""
        reason = errors.translate(error)
        lost: Exception
        if isinstance(reason, errors.SocketFailed):
            lost = ConnectionResetError(str(reason))
        else:
            lost = ConnectionAbortedError(str(reason))
        lost.__cause__ = reason
        self._release()
        self._lose(lost)

    def _lose(self, error: Exception | None) -> None:
        if self._done:
            return
        self._done = True
        self._buffer.clear()
        self._progress.set()
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)
        self._protocol.connection_lost(error)

    def _release(self, reset: str | None = None) -> None:
        """Releases the connection's capabilities (the server resets the
        socket unless both directions ended), after a `fail` if `reset`
        says why."""
        global _senders
        if self._released:
            return
        self._released = True
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self._counted:
            self._counted = False
            _senders -= 1
        to_socket = self._to_socket
        if reset is not None and to_socket is not None:
            failing = asyncio.ensure_future(to_socket.fail(reason=reset))
            failing.add_done_callback(_ignore)
        self._to_socket = None
        self._connection = None
        self._progress.set()
        if self._sender is not None and self._sender is not asyncio.current_task():
            self._sender.cancel()


def _refusal(code: str, message: str) -> Exception:
    """An error for the server, tagged as the schema says."""
    return RuntimeError(f"{message} [capexec:{code}]")


def _ignore(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class _FromSocket(schema.PortSink.Server):  # type: ignore[misc]
    """`fromSocket`: the far socket's bytes, answered as the reader takes
    them."""

    def __init__(self, transport: _PortTransport) -> None:
        self._transport = transport

    async def write(self, bytes: bytes, **_: Any) -> None:
        await self._transport._received(bytes)

    async def end(self, **_: Any) -> None:
        self._transport._received_end()

    async def fail(self, reason: str, **_: Any) -> None:
        self._transport._received_fail(str(reason))

    def __del__(self) -> None:
        try:
            self._transport._lost_sink()
        except Exception:  # noqa: BLE001 - in a finalizer, with the loop maybe gone
            pass


async def dial(
    executor: Executor,
    host: str,
    port: int | None = None,
    *,
    limit: int = 2**16,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Opens a connection to `host`:`port` (or the address `host`:
    "tcp:HOST:PORT", "unix:/path") from `executor`'s machine, and answers
    once it is connected (`Executor.dial`). `limit` is the
    reader's buffer limit, as `asyncio.open_connection`'s. Refusals raise
    their capexec class: `SocketFailed` (refused, unreachable, a name
    that does not resolve), `NotAllowed`, `InvalidArgument`,
    `LimitReached`.

    `writer.close()` ends this direction at once and releases the
    connection once the far peer has ended too (bytes arriving after the
    close reset it, as a closed socket's kernel does); `writer.transport.
    abort()` resets it now. A connection neither closed nor aborted stays
    open (it counts against the server's 1,024 per connection) until the
    far peer or the connection to the server ends it."""
    address = format_address(host, port)
    owner = executor._owner
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport = _PortTransport(loop, protocol, owner)
    protocol.connection_made(transport)
    response = await _rpc.call(
        executor.client.dial(address=address, fromSocket=_FromSocket(transport), direct=False),
        owner,
    )
    info = PortConnectionInfo(local=str(response.info.local), peer=str(response.info.peer))
    transport._connected(_rpc.detach(response.connection), _rpc.detach(response.toSocket), info)
    del response
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return reader, writer


# -- forward -----------------------------------------------------------------------


def _local_spec(local: str | int) -> tuple[str, str | None, int]:
    """("tcp", host, port) or ("unix", path, 0) for a local listening spec:
    PORT, HOST:PORT, tcp:HOST:PORT, unix:PATH ("*" as HOST: every
    interface)."""
    if isinstance(local, int):
        return ("tcp", "127.0.0.1", local)
    if local.startswith("unix:"):
        return ("unix", local[len("unix:") :], 0)
    spec = local[len("tcp:") :] if local.startswith("tcp:") else local
    host, sep, port = spec.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"{local!r}: expected PORT, HOST:PORT, tcp:HOST:PORT or unix:PATH")
    if not sep:
        host = "127.0.0.1"
    host = host.strip("[]")
    return ("tcp", None if host == "*" else host, int(port))


def _remote_address(remote: str | int) -> str:
    if isinstance(remote, int):
        return format_address("localhost", remote)
    if remote.startswith(("tcp:", "unix:")):
        return remote
    host, sep, port = remote.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{remote!r}: expected PORT, HOST:PORT, tcp:HOST:PORT or unix:PATH")
    return format_address(host, int(port))


def _reset(writer: asyncio.StreamWriter) -> None:
    """Resets a local connection (TCP: RST), as the far side was."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


class Forward:
    """Local connections forwarded to an address on the executor's
    machine (see `forward`). `local_address` is where it listens
    ("tcp:127.0.0.1:40117", "unix:/path"); `failures` counts the
    connections that could not be dialled or broke."""

    def __init__(
        self,
        dial: Callable[[str], Any],
        local: str | int,
        remote: str | int,
    ) -> None:
        self._dial = dial
        self._local = _local_spec(local)
        self.remote = _remote_address(remote)
        self.local_address = ""
        self.failures = 0
        self.connections = 0
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def local_port(self) -> int:
        """The local TCP port (the one the kernel chose for port 0)."""
        name = _socket_name(self.local_address)
        if not isinstance(name, tuple):
            raise ValueError(f"{self.local_address} has no port")
        return int(name[1])

    async def start(self) -> Forward:
        kind, where, port = self._local
        if kind == "unix":
            assert where is not None
            self._server = await asyncio.start_unix_server(self._accepted, path=where)
            self.local_address = f"unix:{where}"
        else:
            self._server = await asyncio.start_server(self._accepted, host=where, port=port)
            name = self._server.sockets[0].getsockname()
            self.local_address = format_address(str(name[0]), int(name[1]))
        return self

    async def close(self) -> None:
        """Stops listening and resets the connections still open."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
        kind, where, _ = self._local
        if kind == "unix" and where is not None:
            try:
                os.unlink(where)
            except OSError:
                pass

    async def __aenter__(self) -> Forward:
        return await self.start()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._relay(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _relay(self, local_in: asyncio.StreamReader, local_out: asyncio.StreamWriter) -> None:
        self.connections += 1
        peer = local_out.get_extra_info("peername")
        try:
            remote_in, remote_out = await self._dial(self.remote)
        except Exception as error:  # noqa: BLE001 - reported, the forward goes on
            self.failures += 1
            log.warning("forward %s -> %s: connection from %s failed: %s",
                        self.local_address, self.remote, peer, error)
            _reset(local_out)
            return
        up = asyncio.ensure_future(_pump(local_in, remote_out))
        down = asyncio.ensure_future(_pump(remote_in, local_out))
        try:
            done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                failure = task.exception()
                if failure is not None:
                    raise failure
            remote_out.close()
            local_out.close()
        except asyncio.CancelledError:
            _reset(local_out)
            remote_out.transport.abort()
            raise
        except Exception as error:  # noqa: BLE001 - a broken connection, reported
            self.failures += 1
            log.warning("forward %s -> %s: connection from %s failed: %s",
                        self.local_address, self.remote, peer, error)
            # A reset at either end resets the other.
            _reset(local_out)
            remote_out.transport.abort()
        finally:
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copies `source` into `sink` and passes its end of file on."""
    while True:
        data = await source.read(CHUNK_BYTES)
        if not data:
            break
        sink.write(data)
        await sink.drain()
    if sink.can_write_eof() and not sink.transport.is_closing():
        sink.write_eof()
    await sink.drain()


def forward(executor: Executor, local: str | int, remote: str | int) -> Forward:
    """Listens on `local` ("127.0.0.1:0", "PORT", "HOST:PORT", "*:PORT",
    "unix:/path"; an int: a port on 127.0.0.1) and connects each accepted
    connection to `remote` ("HOST:PORT", "tcp:HOST:PORT", "unix:/path"; an
    int: a port on localhost) from the executor's machine, like
    `ssh -L`. Use it as `async with forward(...) as fwd:` (listening once
    entered; `fwd.local_address`, `fwd.local_port`). `Executor.forward`."""

    async def dial_remote(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await dial(executor, address)

    return Forward(dial_remote, local, remote)
