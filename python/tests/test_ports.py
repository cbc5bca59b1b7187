"""Ports against a real server, over every transport the `connection`
fixture offers: `dial` as asyncio streams and `forward` as `ssh -L`. The
far peers are asyncio servers on this machine's loopback (where the
executor runs)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import pytest

import capexec
from capexec import errors, ports

T = TypeVar("T")

MiB = 1024 * 1024

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def within(awaitable: Awaitable[T], seconds: float = 60) -> T:
    return await asyncio.wait_for(awaitable, seconds)


def pattern(size: int, seed: int = 0) -> bytes:
    block = hashlib.sha256(str(seed).encode()).digest() * 4099
    return (block * (size // len(block) + 1))[:size] + b"\x00"


@asynccontextmanager
async def far_server(handler: Handler) -> AsyncIterator[int]:
    """A TCP server on 127.0.0.1 running `handler` per connection; its
    port. Handlers still running at the end are cancelled."""
    tasks: set[asyncio.Task[None]] = set()

    async def handled(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(handled(reader, writer))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(accepted, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Echoes until end of file, then half-closes and waits for the
    other side to close."""
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.write_eof()
    await writer.drain()
    writer.close()


def reset(writer: asyncio.StreamWriter) -> None:
    """Closes with an RST."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def test_dial_round_trip_exact_bytes(connection: capexec.Connection) -> None:
    async with far_server(echo) as port:
        reader, writer = await within(connection.executor.dial("127.0.0.1", port))
        assert isinstance(reader, asyncio.StreamReader)
        assert isinstance(writer, asyncio.StreamWriter)
        assert writer.get_extra_info("peername") == ("127.0.0.1", port)
        info = writer.get_extra_info("capexec")
        assert isinstance(info, ports.PortConnectionInfo)
        assert info.peer == f"tcp:127.0.0.1:{port}"
        assert info.local.startswith("tcp:127.0.0.1:")

        writer.write(b"line one\n\x00\x01\xff\n")
        await writer.drain()
        assert await within(reader.readline()) == b"line one\n"
        assert await within(reader.readexactly(4)) == b"\x00\x01\xff\n"

        payload = pattern(8 * MiB + 3)

        async def send() -> None:
            # Writes of every size: tiny ones gathered, big ones split.
            view = memoryview(payload)
            offset = 0
            for size in (1, 2, 70_000, 3 * MiB, 1):
                writer.write(view[offset : offset + size])
                offset += size
            writer.write(view[offset:])
            await writer.drain()
            writer.write_eof()

        sending = asyncio.ensure_future(send())
        echoed = await within(reader.read())
        await within(sending)
        assert len(echoed) == len(payload)
        assert echoed == payload
        assert reader.at_eof()
        writer.close()
        await within(writer.wait_closed())


async def test_half_close_both_ways(connection: capexec.Connection) -> None:
    got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def reply_after_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Reads the whole request (to our end of file), then answers.
        request = await reader.read()
        writer.write(b"you said: " + request)
        await writer.drain()
        writer.write_eof()
        # Our end of file does not end its reading of us.
        got.set_result(await reader.read())
        writer.close()

    async with far_server(reply_after_eof) as port:
        reader, writer = await connection.executor.dial(f"tcp:127.0.0.1:{port}")
        writer.write(b"hello\x00")
        writer.write_eof()
        assert writer.can_write_eof()
        assert await within(reader.read()) == b"you said: hello\x00"
        # The far peer's end of file, clean.
        assert reader.at_eof()
        assert await within(got) == b""
        writer.close()
        await within(writer.wait_closed())

    # The far peer ends first; this side goes on writing.
    received: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def greet_then_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"greeting")
        writer.write_eof()
        received.set_result(await reader.read())
        writer.close()

    async with far_server(greet_then_read) as port:
        reader, writer = await connection.executor.dial("127.0.0.1", port)
        assert await within(reader.read()) == b"greeting"
        writer.write(b"still writing \x00 after your end")
        writer.write_eof()
        assert await within(received) == b"still writing \x00 after your end"
        writer.close()
        await within(writer.wait_closed())
    with pytest.raises(RuntimeError):
        writer.write(b"after close")


async def test_close_ends_this_direction_at_once(connection: capexec.Connection) -> None:
    """`close` sends what is buffered and the end of this direction; it
    does not wait for the far peer, which reads everything, then end of
    file."""
    got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    finish = asyncio.Event()

    async def read_then_linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.set_result(await reader.read())
        # Still open on this side until the test is done.
        await finish.wait()

    async with far_server(read_then_linger) as port:
        reader, writer = await connection.executor.dial("127.0.0.1", port)
        payload = pattern(2 * MiB, seed=5)
        writer.write(payload)
        writer.close()
        assert writer.is_closing()
        await within(writer.wait_closed(), 30)
        assert await within(got) == payload
        with pytest.raises(RuntimeError):
            writer.write(b"more")
        finish.set()


async def test_a_reset_is_an_error_not_end_of_file(connection: capexec.Connection) -> None:
    async def reset_after_hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello")
        await writer.drain()
        await reader.readexactly(1)
        reset(writer)

    async with far_server(reset_after_hello) as port:
        reader, writer = await connection.executor.dial("127.0.0.1", port)
        assert await within(reader.readexactly(5)) == b"hello"
        writer.write(b"!")
        with pytest.raises(ConnectionResetError):
            await within(reader.read())

    # This side's abort resets the far peer.
    outcome: asyncio.Future[BaseException | bytes] = asyncio.get_running_loop().create_future()

    async def read_all(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            outcome.set_result(await reader.read())
        except ConnectionError as error:
            outcome.set_result(error)

    async with far_server(read_all) as port:
        reader, writer = await connection.executor.dial("127.0.0.1", port)
        writer.write(b"partial")
        await writer.drain()
        writer.transport.abort()
        result = await within(outcome)
        assert isinstance(result, ConnectionResetError)


async def test_dial_refusals(connection: capexec.Connection) -> None:
    # A port nobody listens on: bound, never listening.
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
        with pytest.raises(errors.SocketFailed) as refused:
            await within(connection.executor.dial("127.0.0.1", port))
    assert refused.value.tag == "socket-failed"
    assert type(refused.value) is errors.SocketFailed
    assert "[capexec:" not in refused.value.sentence
    with pytest.raises(errors.InvalidArgument) as malformed:
        await connection.executor.dial("tcp:::1:80")
    assert malformed.value.tag == "invalid-argument"
    with pytest.raises(errors.InvalidArgument):
        await connection.executor.dial("unix:relative/path")
    with pytest.raises(ValueError):
        await connection.executor.dial("127.0.0.1", 0)
    with pytest.raises(ValueError):
        await connection.executor.dial("127.0.0.1")
    # A directory's executor has no network.
    sandboxed = connection.executor.directory("/tmp").executor()
    with pytest.raises(errors.NotAllowed) as not_allowed:
        await sandboxed.dial("127.0.0.1", 9)
    assert not_allowed.value.tag == "not-allowed"


async def test_dial_a_unix_socket(connection: capexec.Connection, tmp_path: Path) -> None:
    path = tmp_path / "far.sock"
    server = await asyncio.start_unix_server(echo, path=str(path))
    try:
        reader, writer = await connection.executor.dial(f"unix:{path}")
        assert writer.get_extra_info("peername") == str(path)
        writer.write(b"\x00unix\xff")
        writer.write_eof()
        assert await within(reader.read()) == b"\x00unix\xff"
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_ipv6_addresses_are_bracketed() -> None:
    assert ports.format_address("::1", 80) == "tcp:[::1]:80"
    assert ports.format_address("[::1]", 80) == "tcp:[::1]:80"
    assert ports.format_address("example.org", 443) == "tcp:example.org:443"
    assert ports.format_address("unix:/run/x.sock") == "unix:/run/x.sock"


async def test_flow_control_holds_a_writer_back(connection: capexec.Connection) -> None:
    """A far peer that does not read stops `drain`; once it reads, every
    byte arrives, in order."""
    start_reading = asyncio.Event()
    digest: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()

    async def slow_reader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await start_reading.wait()
        hasher = hashlib.sha256()
        total = 0
        while data := await reader.read(1 << 20):
            hasher.update(data)
            total += len(data)
        digest.set_result((total, hasher.hexdigest()))
        writer.close()

    payload = pattern(64 * MiB, seed=3)
    async with far_server(slow_reader) as port:
        reader, writer = await connection.executor.dial("127.0.0.1", port)
        writer.write(payload)
        # The kernel's buffers and the window take a few MiB, not 64.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(writer.drain()), 1.0)
        assert writer.transport.get_write_buffer_size() > 32 * MiB
        start_reading.set()
        await within(writer.drain(), 120)
        writer.write_eof()
        total, hexdigest = await within(digest, 120)
        assert total == len(payload)
        assert hexdigest == hashlib.sha256(payload).hexdigest()
        writer.close()


async def test_flow_control_holds_the_far_writer_back(connection: capexec.Connection) -> None:
    """A reader here that does not read stops the far writer's drain."""
    payload = pattern(32 * MiB, seed=4)
    drained = asyncio.Event()

    async def fast_writer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(payload)
        await writer.drain()
        drained.set()
        writer.write_eof()
        await reader.read()
        writer.close()

    async with far_server(fast_writer) as port:
        reader, writer = await connection.executor.dial("127.0.0.1", port, limit=1 << 16)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(drained.wait(), 1.0)
        hasher = hashlib.sha256()
        total = 0
        while data := await within(reader.read(1 << 20)):
            hasher.update(data)
            total += len(data)
        assert total == len(payload)
        assert hasher.hexdigest() == hashlib.sha256(payload).hexdigest()
        assert drained.is_set()
        writer.close()


async def test_forward_like_ssh_l(connection: capexec.Connection) -> None:
    async with far_server(echo) as port:
        async with connection.executor.forward("127.0.0.1:0", f"127.0.0.1:{port}") as fwd:
            assert fwd.local_address == f"tcp:127.0.0.1:{fwd.local_port}"
            assert fwd.remote == f"tcp:127.0.0.1:{port}"

            async def round_trip(seed: int) -> None:
                reader, writer = await asyncio.open_connection("127.0.0.1", fwd.local_port)
                payload = pattern(3 * MiB, seed=seed)
                writer.write(payload)
                await writer.drain()
                # Half-close passes through: the echo ends after our end.
                writer.write_eof()
                assert await within(reader.read()) == payload
                writer.close()
                await writer.wait_closed()

            # Several connections at once, each its own dial.
            await within(asyncio.gather(*(round_trip(seed) for seed in range(4))))
            assert fwd.connections == 4
            assert fwd.failures == 0


async def test_forward_passes_resets_and_failures_on(connection: capexec.Connection) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead_port = unused.getsockname()[1]
        async with connection.executor.forward(0, dead_port) as fwd:
            reader, writer = await asyncio.open_connection("127.0.0.1", fwd.local_port)
            # The dial fails: the local connection is reset, not ended.
            with pytest.raises(ConnectionResetError):
                await within(reader.read())
            writer.close()
            assert fwd.failures == 1

    async def reset_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(2)
        reset(writer)

    async with far_server(reset_at_once) as port:
        async with connection.executor.forward("127.0.0.1:0", port) as fwd:
            reader, writer = await asyncio.open_connection("127.0.0.1", fwd.local_port)
            writer.write(b"go")
            with pytest.raises(ConnectionResetError):
                await within(reader.read())
            writer.close()


async def test_forward_from_a_unix_socket(connection: capexec.Connection, tmp_path: Path) -> None:
    local = tmp_path / "local.sock"
    async with far_server(echo) as port:
        async with connection.executor.forward(f"unix:{local}", f"localhost:{port}") as fwd:
            assert fwd.local_address == f"unix:{local}"
            reader, writer = await asyncio.open_unix_connection(str(local))
            writer.write(b"\x00through a unix socket\xff")
            writer.write_eof()
            assert await within(reader.read()) == b"\x00through a unix socket\xff"
            writer.close()
    assert not os.path.exists(local)


async def test_a_lost_server_connection_is_an_error(connection: capexec.Connection) -> None:
    finish = asyncio.Event()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hi")
        await finish.wait()

    async with far_server(hold) as port:
        reader, writer = await connection.executor.dial("127.0.0.1", port)
        assert await within(reader.readexactly(2)) == b"hi"
        await connection.close()
        # Lost, not reset by the far peer, and never an end of file.
        with pytest.raises(ConnectionAbortedError, match="the connection through the executor was lost"):
            await within(reader.read())
        with pytest.raises(ConnectionError):
            writer.write(b"x")
            await writer.drain()
        finish.set()
