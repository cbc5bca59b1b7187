"""Executor and Process against a real server, over each transport (the
`connection` fixture: unix, tcp with a token, tls with a pin)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

import capexec
from capexec import errors

from capexec_servers import Server, start_server


async def test_run_collects_exact_bytes_and_the_exit_code(connection: capexec.Connection) -> None:
    done = await connection.executor.run(
        ["sh", "-c", "printf 'out\\000put'; printf 'err' >&2; exit 3"]
    )
    assert (done.exit_code, done.signal, done.stdout, done.stderr) == (3, None, b"out\x00put", b"err")
    assert done.status.code == 3 and not done.status.success
    assert done.argv == [b"sh", b"-c", b"printf 'out\\000put'; printf 'err' >&2; exit 3"]
    assert done.returncode == 3


async def test_run_with_stdin_cwd_and_env(connection: capexec.Connection) -> None:
    payload = bytes(range(256)) * 4096 + b"end"  # 1 MiB and 3 bytes: two write calls
    done = await connection.executor.run(
        ["sh", "-c", 'pwd; echo "$CAPEXEC_PY_A-${CAPEXEC_PY_B-unset}"; wc -c; exit 0'],
        cwd="/",
        env={"CAPEXEC_PY_A": "set", "CAPEXEC_PY_B": None},
        stdin=payload,
    )
    assert done.stdout == f"/\nset-unset\n{len(payload)}\n".encode()
    assert done.exit_code == 0
    echoed = await connection.executor.run(["cat"], stdin=payload)
    assert echoed.stdout == payload


async def test_run_of_a_large_output(connection: capexec.Connection) -> None:
    # 8 MiB: far beyond the server's retained log and the lossless window.
    done = await connection.executor.run(["head", "-c", str(8 * 1024 * 1024), "/dev/zero"])
    assert done.exit_code == 0
    assert done.stdout == bytes(8 * 1024 * 1024)


async def test_run_killed_by_a_signal_and_check(connection: capexec.Connection) -> None:
    done = await connection.executor.run(["sh", "-c", "kill -TERM $$"])
    assert (done.exit_code, done.signal, done.status.signal_name) == (None, signal.SIGTERM, "term")
    assert done.returncode == -signal.SIGTERM
    with pytest.raises(capexec.CommandFailed) as raised:
        await connection.executor.run(["sh", "-c", "echo no >&2; exit 4"], check=True)
    assert (raised.value.returncode, raised.value.stderr) == (4, b"no\n")
    assert str(raised.value) == "sh ended with exit code 4"


async def test_run_timeout(connection: capexec.Connection) -> None:
    began = time.monotonic()
    done = await connection.executor.run(["sleep", "30"], timeout=0.2)
    assert done.status.timed_out
    assert done.signal == signal.SIGTERM
    assert time.monotonic() - began < 10


async def test_refusals_have_their_class(connection: capexec.Connection) -> None:
    ex = connection.executor
    with pytest.raises(errors.ProgramNotFound) as missing:
        await ex.run(["capexec-no-such-program-anywhere"])
    assert missing.value.tag == "program-not-found"
    assert "capexec-no-such-program-anywhere" in missing.value.sentence
    assert "[capexec:" not in missing.value.sentence
    with pytest.raises(errors.BadCwd):
        await ex.start(["true"], cwd="/capexec/no/such/dir")
    with pytest.raises(TypeError):
        await ex.run("echo hi")
    with pytest.raises(ValueError):
        await ex.run([])


async def test_start_events_replay_then_live(connection: capexec.Connection) -> None:
    async with await connection.executor.start(
        ["sh", "-c", "echo one; read line; echo \"got $line\"; echo two >&2; exit 7"]
    ) as proc:
        seen: list[capexec.Event] = []
        events = proc.events()
        async for event in events:
            seen.append(event)
            if isinstance(event, capexec.Output) and event.data == b"one\n":
                assert await proc.write(b"hello\n", id="w1") == capexec.WriteStatus.ACCEPTED
                # The same id again is not written again.
                assert await proc.write(b"hello\n", id="w1") == capexec.WriteStatus.ACCEPTED
                await proc.close_stdin()
        out = b"".join(e.data for e in seen if isinstance(e, capexec.Output) and e.stream == "stdout")
        err = b"".join(e.data for e in seen if isinstance(e, capexec.Output) and e.stream == "stderr")
        assert (out, err) == (b"one\ngot hello\n", b"two\n")
        exits = [e for e in seen if isinstance(e, capexec.Exited)]
        assert [e.code for e in exits] == [7]
        assert isinstance(seen[-1], capexec.Closed)
        seqs = [e.seq for e in seen]
        assert seqs == list(range(1, len(seen) + 1))
        # Replay: everything again from the start, and from the middle.
        again = [e async for e in proc.events()]
        assert again == seen
        assert [e async for e in proc.events(after_seq=seqs[-3])] == seen[-2:]
        assert (await proc.wait()).code == 7
        # After the close, writes say so.
        assert await proc.write(b"late") in (capexec.WriteStatus.EXITED, capexec.WriteStatus.STDIN_CLOSED)


async def test_read_long_polls(connection: capexec.Connection) -> None:
    async with await connection.executor.start(
        ["sh", "-c", "read x; printf \"$x\"; read y; exit 5"]
    ) as proc:
        empty = await proc.read(0, wait=0.05)
        assert (empty.events, empty.next_seq, empty.closed, empty.exit) == ([], 1, False, None)
        await proc.write(b"abc\n")
        first = await proc.read(0, wait=10)
        assert first.events == [capexec.Output(1, "stdout", b"abc")]
        assert (first.next_seq, first.closed, first.exit) == (2, False, None)
        await proc.close_stdin()
        rest: list[capexec.Event] = []
        after = first.next_seq - 1
        while True:
            result = await proc.read(after, wait=10)
            rest += result.events
            after = result.next_seq - 1
            if result.closed and any(isinstance(e, capexec.Closed) for e in rest):
                break
        assert [type(e) for e in rest] == [capexec.Exited, capexec.Closed]
        assert result.exit is not None and result.exit.code == 5
        with pytest.raises(errors.InvalidArgument):
            await proc.read(after + 10)


async def test_gaps_are_explicit(connection: capexec.Connection) -> None:
    # Retained log: 1 MiB. 3 MiB of output read only after the close.
    async with await connection.executor.start(
        ["head", "-c", str(3 * 1024 * 1024), "/dev/zero"], flow="retain"
    ) as proc:
        status = await proc.wait()
        assert status.code == 0
        seen = [e async for e in proc.events()]
        assert isinstance(seen[0], capexec.Gap) and seen[0].from_seq == 1
        kept = sum(len(e.data) for e in seen if isinstance(e, capexec.Output))
        assert 0 < kept <= 1024 * 1024
        assert isinstance(seen[-1], capexec.Closed)
        numbers = [seen[0].from_seq] + [e.seq for e in seen]
        assert numbers[1] >= numbers[0]
        assert [e.seq for e in seen[1:]] == list(range(seen[0].seq + 1, seen[-1].seq + 1))


async def test_signal_terminate_info_and_release(connection: capexec.Connection) -> None:
    ex = connection.executor
    proc = await ex.start(
        ["sh", "-c", "trap 'echo usr1' USR1; echo ready; while :; do sleep 0.05; done"]
    )
    info = await proc.info()
    assert info.pid > 0 and info.exit is None and not info.tty and info.flow == "retain"
    outputs = []
    # stdout only: the shell may say on stderr that the signal ended its
    # `sleep` (the whole group gets it).
    async for event in proc.events():
        if isinstance(event, capexec.Output) and event.stream == "stdout":
            outputs.append(event.data)
            if event.data == b"ready\n":
                await proc.signal("USR1")
            else:
                break
    assert outputs == [b"ready\n", b"usr1\n"]
    assert await proc.terminate() is True
    status = await proc.wait()
    assert status.signal == signal.SIGTERM
    assert await proc.terminate() is False
    await proc.release()
    assert proc.released
    with pytest.raises(RuntimeError):
        await proc.info()
    # Releasing a running process ends it.
    sleeper = await ex.start(["sleep", "60"])
    pid = (await sleeper.info()).pid
    await sleeper.release()
    deadline = time.monotonic() + 10
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the released process still runs"
        await asyncio.sleep(0.02)


async def test_tty_and_resize(connection: capexec.Connection) -> None:
    async with await connection.executor.start(
        ["sh", "-c", "stty size; read x; stty size"], tty=(100, 30), term="xterm"
    ) as proc:
        text = b""
        async for event in proc.events():
            if isinstance(event, capexec.Output):
                assert event.stream == "pty"
                text += event.data
                if text.endswith(b"30 100\r\n"):
                    await proc.resize(cols=120, rows=40)
                    await proc.write(b"\n")
        assert text.startswith(b"30 100\r\n")
        assert text.endswith(b"40 120\r\n")


async def test_facets(connection: capexec.Connection) -> None:
    async with await connection.executor.start(["sh", "-c", "read x; echo $x"]) as proc:
        view = proc.observer()
        writer = proc.stdin_writer()
        with pytest.raises(errors.Forbidden):
            await view.write(b"x\n")
        await writer.write(b"fed\n")
        seen = [e async for e in view.events()]
        assert [e.data for e in seen if isinstance(e, capexec.Output)] == [b"fed\n"]
        await view.release()
        await writer.release()


async def test_detach_and_restore(connection: capexec.Connection) -> None:
    ex = connection.executor
    proc = await ex.start(["sh", "-c", "read x; echo back $x"])
    token = await proc.detachable(30)
    assert len(token) == 64
    await proc.release()
    again = await ex.restore(token)
    async with again:
        await again.write(b"again\n")
        assert (await again.wait()).code == 0
        outputs = [e async for e in again.events() if isinstance(e, capexec.Output)]
        assert b"".join(e.data for e in outputs) == b"back again\n"
    with pytest.raises(errors.UnknownToken):
        await ex.restore("0" * 64)


async def test_info_environments_and_environment(connection: capexec.Connection) -> None:
    ex = connection.executor
    info = await ex.info()
    assert info.environment == "local" and info.os == "linux"
    assert {"start", "subscribe", "write-id"} <= set(info.features)
    envs = await ex.environments()
    assert [(e.name, e.state, e.is_default) for e in envs] == [("local", "local", True)]
    assert (await ex.environment("local").run(["echo", "x"])).stdout == b"x\n"
    with pytest.raises(errors.UnknownEnvironment):
        await ex.environment("nowhere").info()
    with pytest.raises(errors.UnknownEnvironment):
        await ex.run(["true"], environment="nowhere")


async def test_restrict(connection: capexec.Connection) -> None:
    ex = connection.executor.restrict(programs=["echo"], cwd_roots=["/"])
    assert (await ex.run(["echo", "allowed"])).stdout == b"allowed\n"
    with pytest.raises(errors.NotAllowed) as raised:
        await ex.run(["sh", "-c", "true"])
    assert "programs" in raised.value.sentence
    info = await ex.info()
    assert "restricted" in info.features
    with pytest.raises(errors.InvalidArgument):
        await connection.executor.restrict(programs=["capexec-no-such-program"]).info()


async def test_connection_close_breaks_capabilities(connection: capexec.Connection) -> None:
    ex = connection.executor
    proc = await ex.start(["sleep", "60"])
    directory = ex.directory("/")
    assert (await directory.stat(".")).kind is not None
    events = proc.events()
    waiting = asyncio.ensure_future(events.__anext__())
    await connection.close()
    with pytest.raises(errors.Disconnected):
        await asyncio.wait_for(waiting, 10)
    with pytest.raises(errors.Disconnected):
        await ex.info()
    with pytest.raises(errors.Disconnected):
        await proc.info()
    with pytest.raises(errors.Disconnected):
        await directory.stat(".")
    with pytest.raises(errors.Disconnected):
        connection.executor
    await connection.close()  # idempotent


async def test_environments_of_a_chain(server: Server, server_home: Path) -> None:
    """A server forwarding to the test server as its environment "inner":
    `environment()` hops, `run(environment=)` and `connect(environment=)`."""
    home = server_home / "chain"
    home.mkdir(exist_ok=True)
    chain = start_server(home, [f"unix:{home}/chain.sock"], ["--upstream", f"inner={server.unix}"])
    try:
        async with await capexec.connect(chain.unix) as conn:
            ex = conn.executor
            assert (await ex.environment("inner").info()).environment == "inner"
            done = await ex.run(["sh", "-c", "echo far; exit 2"], environment="inner")
            assert (done.exit_code, done.stdout) == (2, b"far\n")
            names = [(e.name, e.address) for e in await ex.environments()]
            assert names == [("local", ""), ("inner", server.unix)]
        async with await capexec.connect(chain.unix, environment="inner") as conn:
            assert (await conn.executor.info()).environment == "inner"
    finally:
        chain.stop()
