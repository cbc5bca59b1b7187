#!/usr/bin/env python3
"""A capexec client in Python (pycapnp), straight from the schema.

Connects to a capexec server (unix:PATH, or tcp:HOST:PORT with a token
file), starts a command with its subscription pipelined on the start,
streams the output through an EventSink, prints the exit status, then makes
a round trip of a binary file through a Directory (writeFile, a streamed
download into a ByteSink, a listing through an EntrySink), and exits 0 only
if everything worked and the command exited 0.

    pip install pycapnp
    python3 examples/python/capexec_client.py ADDRESS [TOKEN_FILE] [-- PROGRAM ARGS...]

Without a program it runs `sh -c 'echo hello from python; echo to stderr >&2; exit 3'`
and expects exit code 3 (so the script tests what it shows).
"""

import asyncio
import os
import sys

import capnp

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA = os.path.join(HERE, "..", "..", "schema", "capexec.capnp")
# pycapnp ships /capnp/stream.capnp inside its package: import from its parent.
capexec = capnp.load(SCHEMA, imports=[os.path.dirname(os.path.dirname(capnp.__file__))])

DEFAULT = [b"sh", b"-c", b"echo hello from python; echo to stderr >&2; exit 3"]


class Sink(capexec.EventSink.Server):
    """Receives pushed events in seq order; resolves `done` at `closed`."""

    def __init__(self):
        self.done = asyncio.get_running_loop().create_future()
        self.exit = None
        self.usage = None
        self.next_seq = 1

    def fail(self, reason):
        """Ends the wait with `reason`, then refuses the push (which ends
        the subscription on the server)."""
        if not self.done.done():
            self.done.set_exception(RuntimeError(reason))
        raise ValueError(reason)

    async def push(self, events, **kwargs):
        for event in events:
            kind = event.which()
            first = event.gap.fromSeq if kind == "gap" else event.seq
            if first != self.next_seq:
                self.fail(f"event {first} after {self.next_seq - 1}")
            self.next_seq = event.seq + 1
            if kind == "output":
                out = sys.stderr if event.output.stream == "stderr" else sys.stdout
                out.buffer.write(event.output.data)
                out.flush()
            elif kind == "exited":
                # Copied out: the message is not ours after push returns.
                status = event.exited
                if status.which() == "code":
                    self.exit = ("code", status.code)
                else:
                    self.exit = ("signal", status.killed.number)
                # Servers with the "usage" feature say what the tree used.
                if status._has("usage"):
                    usage = status.usage
                    self.usage = (usage.userCpuMicros, usage.systemCpuMicros, usage.peakRssBytes)
            elif kind == "gap":
                self.fail(f"output lost: seqs {event.gap.fromSeq}..{event.seq}")
            elif kind == "closed" and not self.done.done():
                self.done.set_result(self.exit)


class Bytes(capexec.ByteSink.Server):
    """Collects a download's chunks."""

    def __init__(self):
        self.data = bytearray()

    async def write(self, data, **kwargs):
        self.data += data


class Entries(capexec.EntrySink.Server):
    """Collects a listing's names."""

    def __init__(self):
        self.names = []

    async def push(self, entries, **kwargs):
        self.names.extend(bytes(entry.path) for entry in entries)


async def file_round_trip(executor):
    """Writes a binary file into the server's temporary directory, reads it
    back two ways, lists it, and removes it; True if all bytes matched."""
    info = (await executor.info()).info
    # Pipelined: the subdirectory and the write travel with `directory`.
    tmp = executor.directory(path=info.tempDir).dir
    name = f"capexec-python-{os.getpid()}".encode()
    await tmp.mkdir(path=name, recursive=True)
    scratch = tmp.subdirectory(path=name).dir
    payload = bytes(range(256)) * 1024 + b"\x00end"
    written = (await scratch.writeFile(path=b"data.bin", data=payload, options={})).stat
    read = await scratch.readFile(path=b"data.bin", offset=0, length=0)
    sink = Bytes()
    downloaded = await scratch.download(path=b"data.bin", offset=0, length=0, sink=sink)
    entries = Entries()
    await scratch.list(path=b"", sink=entries)
    await tmp.remove(path=name, recursive=True, missingOk=False)
    ok = (
        written.size == len(payload)
        and bytes(read.data) == payload
        and bytes(sink.data) == payload
        and downloaded.size == len(payload)
        and entries.names == [b"data.bin"]
    )
    print(f"file round trip of {len(payload)} bytes: {'ok' if ok else 'MISMATCH'}", file=sys.stderr)
    return ok


async def connect(address, token_file):
    if address.startswith("unix:"):
        stream = await capnp.AsyncIoStream.create_unix_connection(path=address[len("unix:"):])
        client = capnp.TwoPartyClient(stream)
        return client, client.bootstrap().cast_as(capexec.Executor)
    if address.startswith("tcp:"):
        host, port = address[len("tcp:"):].rsplit(":", 1)
        stream = await capnp.AsyncIoStream.create_connection(host=host.strip("[]"), port=int(port))
        client = capnp.TwoPartyClient(stream)
        if not token_file:
            raise SystemExit("tcp: addresses need a token file")
        with open(token_file) as file:
            token = file.read().strip()
        gatekeeper = client.bootstrap().cast_as(capexec.Gatekeeper)
        # Pipelined: the executor is usable before the login answers.
        return client, gatekeeper.login(token).executor
    raise SystemExit(f"{address!r}: expected unix:PATH or tcp:HOST:PORT")


def describe(status):
    kind, number = status
    return f"exit code {number}" if kind == "code" else f"killed by signal {number}"


async def main(argv):
    address, rest = argv[0], argv[1:]
    token_file = rest.pop(0) if rest and rest[0] != "--" else None
    program = [arg.encode() for arg in rest[1:]] if rest[:1] == ["--"] else DEFAULT
    client, executor = await connect(address, token_file)

    # start and subscribe go out together: the subscription is pipelined on
    # the process the start has not returned yet.
    process = executor.start(params={"argv": program, "flow": "lossless"}).process
    sink = Sink()
    subscribed = process.subscribe(sink=sink, afterSeq=0)
    subscription = (await subscribed).subscription
    # The demo has a deadline so CI cannot hang; a command given by the
    # caller runs as long as it takes.
    waiting = sink.done if program != DEFAULT else asyncio.wait_for(sink.done, timeout=60)
    status = await waiting
    print(describe(status), file=sys.stderr)
    if sink.usage:
        user, system, peak_rss = sink.usage
        print(
            f"used {user / 1e6:.3f}s user, {system / 1e6:.3f}s system CPU, peak RSS {peak_rss // 1024} KiB",
            file=sys.stderr,
        )
    del subscription, process
    files_ok = await file_round_trip(executor)
    expected = ("code", 3 if program == DEFAULT else 0)
    return 0 if status == expected and files_ok else 1


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    sys.exit(asyncio.run(capnp.run(main(sys.argv[1:]))))
