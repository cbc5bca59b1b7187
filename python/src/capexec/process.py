"""Processes on an executor's machine: `Process` and its events.

Holding a `Process` is owning the child: when it is released (`release()`,
leaving `async with proc:`, or the connection's end) the server terminates
the child's whole tree, unless it was made `detachable`.
"""

from __future__ import annotations

import asyncio
import enum
import os
import signal as _signal
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from . import _rpc, errors
from ._schema import schema

__all__ = [
    "Closed",
    "Event",
    "ExitStatus",
    "Exited",
    "Gap",
    "Output",
    "Process",
    "ProcessInfo",
    "ReadResult",
    "ResourceUsage",
    "SignalArg",
    "WriteStatus",
]

#: The most `write` sends in one call; longer writes are sent as several
#: calls, each with its own write id (the wire takes 4 MiB).
WRITE_CHUNK_BYTES = 1024 * 1024
#: Calls of one write unanswered at once: the server refuses writes beyond
#: 16 MiB the child has not read.
WRITE_WINDOW = 8

#: How many pushed batches of events a subscription buffers before its
#: sink stops acknowledging (and so the server stops pushing).
_BUFFERED_BATCHES = 8


@dataclass(frozen=True)
class ResourceUsage:
    """What the process tree used, as the kernel accounts it at the child's
    exit (`ExitStatus.usage`)."""

    user_cpu_micros: int
    system_cpu_micros: int
    peak_rss_bytes: int


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended: `code` for a normal exit, `signal` (its number)
    for a death by signal; never both."""

    code: int | None
    signal: int | None = None
    #: The signal's name in the schema ("term", "kill"...), "unknown" for
    #: one without a name there.
    signal_name: str | None = None
    core_dumped: bool = False
    #: Ended by its start's timeout.
    timed_out: bool = False
    #: Ended by its memory limit (the kernel's out-of-memory killer).
    killed_by_memory_limit: bool = False
    #: Terminated because the server shut down.
    server_shutdown: bool = False
    #: None when the server does not report it.
    usage: ResourceUsage | None = None

    @property
    def success(self) -> bool:
        """Exited with code 0."""
        return self.code == 0

    @property
    def returncode(self) -> int:
        """As subprocess says it: the code, or minus the signal number."""
        if self.code is not None:
            return self.code
        return -(self.signal or 0)

    def __str__(self) -> str:
        if self.code is not None:
            text = f"exit code {self.code}"
        else:
            text = f"killed by signal {self.signal}"
            if self.signal_name and self.signal_name != "unknown":
                text += f" (SIG{self.signal_name.upper()})"
        if self.timed_out:
            text += ", timed out"
        if self.killed_by_memory_limit:
            text += ", over its memory limit"
        return text

    @classmethod
    def _from_wire(cls, status: Any) -> ExitStatus:
        usage = None
        if status._has("usage"):
            wire = status.usage
            usage = ResourceUsage(
                user_cpu_micros=int(wire.userCpuMicros),
                system_cpu_micros=int(wire.systemCpuMicros),
                peak_rss_bytes=int(wire.peakRssBytes),
            )
        flags = {
            "timed_out": bool(status.timedOut),
            "killed_by_memory_limit": bool(status.killedByMemoryLimit),
            "server_shutdown": bool(status.serverShutdown),
            "usage": usage,
        }
        if status.which() == "code":
            return cls(code=int(status.code), **flags)  # type: ignore[arg-type]
        killed = status.killed
        return cls(
            code=None,
            signal=int(killed.number),
            signal_name=str(killed.signal),
            core_dumped=bool(killed.coreDumped),
            **flags,  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class Output:
    """Output of the process: `stream` is "stdout", "stderr" or "pty"."""

    seq: int
    stream: str
    data: bytes


@dataclass(frozen=True)
class Gap:
    """Output lost before this reader got it (evicted from the server's
    retained log): seqs `from_seq` to `seq`, inclusive."""

    from_seq: int
    seq: int


@dataclass(frozen=True)
class Exited:
    """The child ended (output its descendants write later may follow)."""

    seq: int
    status: ExitStatus

    @property
    def code(self) -> int | None:
        return self.status.code

    @property
    def signal(self) -> int | None:
        return self.status.signal

    @property
    def usage(self) -> ResourceUsage | None:
        return self.status.usage


@dataclass(frozen=True)
class Closed:
    """The last event: the process exited and every output stream ended."""

    seq: int


Event = Output | Gap | Exited | Closed


def _event(wire: Any) -> Event:
    """One wire event, copied out of its message."""
    seq = int(wire.seq)
    kind = wire.which()
    if kind == "output":
        return Output(seq, str(wire.output.stream), bytes(wire.output.data))
    if kind == "exited":
        return Exited(seq, ExitStatus._from_wire(wire.exited))
    if kind == "gap":
        return Gap(int(wire.gap.fromSeq), seq)
    return Closed(seq)


class WriteStatus(str, enum.Enum):
    """The outcome of a `write`."""

    #: The bytes are in the child's stdin (or this write id was accepted
    #: before).
    ACCEPTED = "accepted"
    #: Stdin is not open (not piped, closed, or the child closed it).
    STDIN_CLOSED = "stdinClosed"
    #: Not spawned yet (capexec servers never say this).
    STARTING = "starting"
    #: The process has exited.
    EXITED = "exited"


@dataclass(frozen=True)
class ReadResult:
    """What `Process.read` returned: events after the seq asked for, the
    seq to read after next (`next_seq - 1`), and the process's state."""

    events: list[Event]
    next_seq: int
    closed: bool
    #: None while the child runs.
    exit: ExitStatus | None


@dataclass(frozen=True)
class ProcessInfo:
    """A snapshot of a process (`Process.info`)."""

    pid: int
    tty: bool
    #: "retain" or "lossless".
    flow: str
    stdin_open: bool
    next_seq: int
    closed: bool
    exit: ExitStatus | None
    retained_bytes: int
    retained_chunks: int
    evicted_through_seq: int
    unconsumed_bytes: int
    uptime_ms: int
    timed_out: bool
    tree_running: bool


SignalArg = int | str | _signal.Signals

_SIGNALS: frozenset[str] = frozenset(
    str(name) for name in schema.Signal.schema.enumerants if name != "unknown"
)


def _signal_name(sig: SignalArg) -> str:
    """The schema's name of `sig`: a number, a `signal.Signals`, or a name
    ("TERM", "SIGTERM", "term")."""
    if isinstance(sig, str):
        name = sig.lower().removeprefix("sig")
    else:
        try:
            name = _signal.Signals(int(sig)).name.lower().removeprefix("sig")
        except ValueError:
            raise ValueError(f"{sig} is not a signal number of this machine") from None
    if name not in _SIGNALS:
        raise ValueError(f"{sig!r} is not a signal capexec knows (names: {', '.join(sorted(_SIGNALS))})")
    return name


class _Sink:
    """The receiving end of a subscription: batches in seq order, with a
    bounded buffer (a full buffer holds the server's pushes back)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[list[Event]] = asyncio.Queue(_BUFFERED_BATCHES)
        self.server = _make_sink_server(self)


def _make_sink_server(sink: _Sink) -> Any:
    class EventSink(schema.EventSink.Server):  # type: ignore[misc]
        async def push(self, events: Any, **kwargs: Any) -> None:
            # Copied out: the message is not ours after push returns.
            await sink.queue.put([_event(event) for event in events])

    return EventSink()


class _Subscription:
    """A subscription made (or being made), and the sink it delivers to."""

    def __init__(self, process: Any, after_seq: int) -> None:
        self.sink = _Sink()
        self.answer: Any = process.subscribe(sink=self.sink.server, afterSeq=after_seq)
        self.after_seq = after_seq
        self.capability: Any = None

    def release(self) -> None:
        """Stops delivery (the server ends it when the capability goes)."""
        self.answer = None
        self.capability = None
        self.sink.server = None


class _Feeder:
    """Writes `data` to a process's stdin in chunks, the first window of
    them sent at once (so they travel with whatever was sent just before,
    a start included), the rest as earlier ones are answered; then, if
    asked, closes stdin behind the last."""

    def __init__(
        self,
        client: Any,
        data: bytes,
        write_id: str,
        owner: _rpc.Owner | None,
        *,
        close: bool = False,
    ) -> None:
        view = memoryview(data)
        self._chunks = [
            bytes(view[at : at + WRITE_CHUNK_BYTES]) for at in range(0, len(view), WRITE_CHUNK_BYTES)
        ] or ([b""] if not close else [])
        self._single = len(self._chunks) == 1
        self._client = client
        self._id = write_id
        self._owner = owner
        self._close = close
        self._sent = 0
        self._inflight: deque[Any] = deque()
        self._closing: Any = None
        self._fill()

    def _fill(self) -> None:
        while len(self._inflight) < WRITE_WINDOW and self._sent < len(self._chunks):
            n = self._sent
            write_id = self._id if self._single else f"{self._id}/{n}"
            self._inflight.append(self._client.write(data=self._chunks[n], writeId=write_id))
            self._sent += 1
        if self._close and self._closing is None and self._sent == len(self._chunks):
            self._closing = self._client.closeStdin()

    async def finish(self) -> WriteStatus:
        """The outcome: ACCEPTED if every chunk was, else the first other
        status (the rest is not sent)."""
        status = WriteStatus.ACCEPTED
        try:
            while self._inflight:
                answer = await _rpc.call(self._inflight.popleft(), self._owner)
                status = WriteStatus(str(answer.status))
                del answer
                if status != WriteStatus.ACCEPTED:
                    self._chunks = self._chunks[: self._sent]
                    break
                self._fill()
            if self._closing is None and self._close:
                self._closing = self._client.closeStdin()
            if self._closing is not None:
                await _rpc.call(self._closing, self._owner)
        finally:
            self._inflight.clear()
            self._closing = None
            self._client = None
        return status


class Process:
    """A process started on an executor (see the module's doc).

    Use it as `async with await ex.start([...]) as proc:` so that it is
    released (and so terminated, if still running) on the way out.
    """

    def __init__(self, client: Any, owner: _rpc.Owner | None = None) -> None:
        self._client: Any = _rpc.detach(client)
        self._owner = owner
        # A subscription from seq 0 sent with the start (one round trip
        # for both), for the first `events()`.
        self._presubscribed: _Subscription | None = None

    @classmethod
    def _from_client(cls, client: Any, owner: Any = None) -> Process:
        return cls(client, owner)

    @property
    def client(self) -> Any:
        """The pycapnp `Process` client, for calls this class lacks."""
        if self._client is None:
            raise RuntimeError("the process was released")
        _rpc.check_open(self._owner)
        return self._client

    @property
    def released(self) -> bool:
        return self._client is None

    async def _call(self, promise: Any) -> Any:
        return await _rpc.call(promise, self._owner)

    # -- events ----------------------------------------------------------------

    def _presubscribe(self) -> None:
        self._presubscribed = _Subscription(self.client, 0)

    async def events(self, after_seq: int = 0) -> AsyncIterator[Event]:
        """Every event after `after_seq`: first those the server retained,
        then live ones, in seq order, each once, until `Closed` (the last).
        Output evicted before it was read comes as an explicit `Gap`.
        Leaving the loop early ends the subscription."""
        subscription = self._presubscribed if after_seq == 0 else None
        self._presubscribed = None
        if subscription is None:
            subscription = _Subscription(self.client, after_seq)
        try:
            answer = await self._call(subscription.answer)
            subscription.capability = _rpc.detach(answer.subscription)
            subscription.answer = None
            del answer
            queue = subscription.sink.queue
            lost = self._owner._lost() if self._owner is not None else None
            while True:
                if not queue.empty() or lost is None:
                    batch = await queue.get()
                else:
                    batch = await _get_unless(queue, lost)
                for event in batch:
                    yield event
                    if isinstance(event, Closed):
                        return
        finally:
            subscription.release()

    async def read(
        self, after_seq: int = 0, *, max_bytes: int = 0, wait: float = 0.0
    ) -> ReadResult:
        """The retained events after `after_seq` (output up to about
        `max_bytes`, whole chunks; 0: no budget), waiting up to `wait`
        seconds for the first if there is none yet. In lossless flow, this
        tells the server every event up to `after_seq` was consumed."""
        answer = await self._call(
            self.client.read(
                afterSeq=after_seq, maxBytes=max_bytes, waitMs=_millis(wait, 3_600_000)
            )
        )
        result = answer.result
        exit_status = None
        if result.exit.which() == "exited":
            exit_status = ExitStatus._from_wire(result.exit.exited)
        return ReadResult(
            events=[_event(event) for event in result.events],
            next_seq=int(result.nextSeq),
            closed=bool(result.closed),
            exit=exit_status,
        )

    async def wait(self) -> ExitStatus:
        """Waits until the process has closed (exited, its output ended)
        and returns its exit status; output not read is discarded."""
        status: ExitStatus | None = None
        async for event in self.events():
            if isinstance(event, Exited):
                status = event.status
        if status is None:
            raise RuntimeError("the process closed without an exit event")
        return status

    # -- stdin -------------------------------------------------------------------

    async def write(self, data: bytes, *, id: str | None = None) -> WriteStatus:
        """Appends `data` to the child's stdin; returns once the bytes are
        in its pipe (or terminal). `id` (at most 250 bytes) makes the write
        idempotent: a retry with the same id (after a lost answer) is not
        written twice. Without one, a fresh id is made. Data over 1 MiB
        goes as several calls with ids `ID/0`, `ID/1`..., at most 8 MiB
        unanswered at once; the first status other than ACCEPTED ends it."""
        write_id = id if id is not None else uuid.uuid4().hex
        feeder = _Feeder(self.client, bytes(data), write_id, self._owner)
        return await feeder.finish()

    async def close_stdin(self) -> None:
        """End-of-file for the child after every earlier write (a terminal's
        end-of-file character for a tty process). Idempotent."""
        await self._call(self.client.closeStdin())

    # -- control -------------------------------------------------------------------

    async def signal(self, sig: SignalArg) -> None:
        """Sends `sig` (a number, `signal.SIGINT`, or a name: "INT",
        "SIGINT") to the child's process group (a terminal's foreground
        group). A no-op once it has exited."""
        await self._call(self.client.signal(signal=_signal_name(sig)))

    async def terminate(self) -> bool:
        """Terminates the process's tree: SIGTERM, then SIGKILL after the
        server's grace (2 s by default). Returns at once: whether anything
        of the tree was running; the exit comes as an event."""
        answer = await self._call(self.client.terminate())
        return bool(answer.running)

    async def resize(self, cols: int, rows: int) -> None:
        """Changes the terminal size of a tty process (SIGWINCH follows)."""
        await self._call(self.client.resize(size={"rows": rows, "cols": cols}))

    async def close_output(self, stream: str) -> None:
        """Stops reading the child's "stdout" or "stderr" for good: its next
        write there gets SIGPIPE, as in a local pipeline whose reader left."""
        await self._call(self.client.closeOutput(stream=stream))

    async def info(self) -> ProcessInfo:
        """A snapshot of the process and its retained log."""
        info = (await self._call(self.client.info())).info
        exit_status = None
        if info.exit.which() == "exited":
            exit_status = ExitStatus._from_wire(info.exit.exited)
        return ProcessInfo(
            pid=int(info.pid),
            tty=bool(info.tty),
            flow=str(info.flow),
            stdin_open=bool(info.stdinOpen),
            next_seq=int(info.nextSeq),
            closed=bool(info.closed),
            exit=exit_status,
            retained_bytes=int(info.retainedBytes),
            retained_chunks=int(info.retainedChunks),
            evicted_through_seq=int(info.evictedThroughSeq),
            unconsumed_bytes=int(info.unconsumedBytes),
            uptime_ms=int(info.uptimeMs),
            timed_out=bool(info.timedOut),
            tree_running=bool(info.treeRunning),
        )

    async def detachable(self, grace: float) -> str:
        """Lets the process outlive the loss of every reference to it for
        `grace` seconds (rounded up, 1 s to a day) and returns the token
        `Executor.restore` takes to get it back."""
        seconds = max(1, min(86_400, int(-(-grace // 1))))
        answer = await self._call(self.client.detachable(graceSecs=seconds))
        return str(answer.restoreToken)

    def observer(self) -> Process:
        """A read-only view to hand out (read, events, info; everything
        else fails with `Forbidden`). It does not keep the process alive.
        Pipelined: usable at once."""
        return Process(self.client.observer().view, self._owner)

    def stdin_writer(self) -> Process:
        """A facet that may only write to and close stdin (and ask for
        info). It does not keep the process alive. Pipelined."""
        return Process(self.client.stdinWriter().writer, self._owner)

    # -- ownership -----------------------------------------------------------------

    async def release(self) -> None:
        """Lets go of the process: the server terminates its tree if it
        still runs (unless it was made detachable). Idempotent; calls on
        this object fail afterwards."""
        if self._presubscribed is not None:
            self._presubscribed.release()
            self._presubscribed = None
        self._client = None
        # The release message goes out on the next turn of the event loop.
        await asyncio.sleep(0)

    async def __aenter__(self) -> Process:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()

    def __repr__(self) -> str:
        return f"<capexec.Process{' released' if self._client is None else ''}>"


async def _get_unless(
    queue: asyncio.Queue[list[Event]], lost: asyncio.Future[None]
) -> list[Event]:
    """The next batch, or Disconnected once the connection has ended (a
    subscription of a lost connection never delivers again)."""
    getting = asyncio.ensure_future(queue.get())
    waiting: list[asyncio.Future[Any]] = [getting, lost]
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not getting.done():
            getting.cancel()
    if getting.done() and not getting.cancelled():
        return getting.result()
    raise errors.Disconnected("the connection was lost before the process closed")


def _millis(seconds: float | None, limit: int) -> int:
    if seconds is None or seconds <= 0:
        return 0
    return min(limit, max(1, int(seconds * 1000 + 0.5)))


def _fsbytes(value: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> bytes:
    return os.fsencode(value)
