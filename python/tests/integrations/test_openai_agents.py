"""The capexec provider against the OpenAI Agents SDK's sandbox interfaces.

A real server, no model: the client's `create` / `delete` / `resume` /
`serialize_session_state` / `deserialize_session_state`, and a session
driven through the SDK's public session methods (`exec`, `read`, `write`,
`ls`, `mkdir`, `rm`, `mv`, `pty_exec_start`, `pty_write_stdin`,
`resolve_exposed_port`, workspace persistence), with exact outputs and
exit codes, and confinement to the workspace.
"""

from __future__ import annotations

import asyncio
import io
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("agents")

from agents.sandbox import Manifest  # noqa: E402
from agents.sandbox.entries import File  # noqa: E402
from agents.sandbox.errors import (  # noqa: E402
    ExecNonZeroError,
    ExecTimeoutError,
    ExposedPortUnavailableError,
    InvalidManifestPathError,
    PtySessionNotFoundError,
    WorkspaceArchiveReadError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.files import EntryKind  # noqa: E402
from agents.sandbox.session import SandboxSession  # noqa: E402
from agents.sandbox.session.sandbox_client import BaseSandboxClientOptions  # noqa: E402

import capexec  # noqa: E402
from capexec.integrations.openai_agents import (  # noqa: E402
    CapexecSandboxClient,
    CapexecSandboxClientOptions,
    CapexecSandboxSession,
    CapexecSandboxSessionState,
)



@pytest.fixture
def client(integration_executor: capexec.Executor) -> CapexecSandboxClient:
    return CapexecSandboxClient(integration_executor)


@pytest.fixture
async def session(client: CapexecSandboxClient, workspace: Path) -> AsyncIterator[SandboxSession]:
    manifest = Manifest(root=str(workspace), entries={"hello.txt": File(content=b"hello from the manifest\n")})
    s = await client.create(manifest=manifest, options=CapexecSandboxClientOptions())
    async with s:
        yield s
    await client.delete(s)


def test_options_round_trip() -> None:
    opts = CapexecSandboxClientOptions(workspace_root="/srv/ws", exposed_ports=(8000,))
    dumped = opts.model_dump(mode="json")
    assert dumped == {"type": "capexec", "workspace_root": "/srv/ws", "exposed_ports": [8000]}
    assert BaseSandboxClientOptions.parse(dumped) == opts


async def test_exec(session: SandboxSession, workspace: Path) -> None:
    r = await session.exec("echo out; echo err >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code) == (b"out\n", b"err\n", 3)
    pwd = await session.exec("pwd", "-P", shell=False)
    assert (pwd.stdout, pwd.exit_code) == (f"{workspace.resolve()}\n".encode(), 0)
    missing = await session.exec("no-such-program-xyz", shell=False)
    assert missing.exit_code == 127
    manifest_file = await session.exec("cat hello.txt")
    assert manifest_file.stdout == b"hello from the manifest\n"


async def test_exec_timeout(session: SandboxSession) -> None:
    with pytest.raises(ExecTimeoutError):
        await session.exec("sleep 30", timeout=0.5)


async def test_exec_confined(session: SandboxSession, workspace: Path) -> None:
    target = workspace.parent / "escaped.txt"
    r = await session.exec(f"echo x > {target}")
    assert r.exit_code != 0
    assert not target.exists()


async def test_read_write(session: SandboxSession, workspace: Path) -> None:
    await session.write(Path("sub/dir/a.bin"), io.BytesIO(bytes(range(256))))
    assert (workspace / "sub/dir/a.bin").read_bytes() == bytes(range(256))
    got = await session.read(Path("sub/dir/a.bin"))
    assert got.read() == bytes(range(256))
    absolute = await session.read(workspace / "hello.txt")
    assert absolute.read() == b"hello from the manifest\n"
    with pytest.raises(WorkspaceReadNotFoundError):
        await session.read(Path("missing.txt"))


async def test_ls_mkdir_rm_mv(session: SandboxSession, workspace: Path) -> None:
    await session.mkdir("a/b", parents=True)
    assert (workspace / "a/b").is_dir()
    await session.write(Path("a/f.txt"), io.BytesIO(b"12345"))
    entries = sorted(await session.ls("a"), key=lambda e: e.path)
    assert [(e.path, e.kind, e.size if e.kind == EntryKind.FILE else None) for e in entries] == [
        (f"{workspace}/a/b", EntryKind.DIRECTORY, None),
        (f"{workspace}/a/f.txt", EntryKind.FILE, 5),
    ]
    assert entries[0].is_dir() and not entries[1].is_dir()
    await session.mv("a/f.txt", "a/g.txt")
    assert not (workspace / "a/f.txt").exists()
    assert (workspace / "a/g.txt").read_text() == "12345"
    with pytest.raises(ExecNonZeroError):
        await session.mv("a/b", "a/c")  # a directory is not moved
    with pytest.raises(ExecNonZeroError):
        await session.rm("a/b/missing")
    with pytest.raises(ExecNonZeroError):
        await session.rm("a")  # not empty, not recursive
    await session.rm("a", recursive=True)
    assert not (workspace / "a").exists()
    with pytest.raises(ExecNonZeroError):
        await session.ls("nothing-here")


async def test_paths_outside_are_refused(session: SandboxSession, workspace: Path) -> None:
    outside = workspace.parent / "outside.txt"
    for path in (Path("../outside.txt"), outside, Path("/etc/passwd")):
        with pytest.raises(InvalidManifestPathError):
            await session.read(path)
        with pytest.raises(InvalidManifestPathError):
            await session.write(path, io.BytesIO(b"pwned"))
        with pytest.raises(InvalidManifestPathError):
            await session.rm(path)
    (workspace / "link").symlink_to(outside)
    # The SDK's lexical check passes ("link" is inside); the Directory refuses to follow it out.
    with pytest.raises(WorkspaceArchiveReadError):
        await session.read(Path("link"))
    # Writing replaces the symlink itself (atomically), never what it points to.
    await session.write(Path("link"), io.BytesIO(b"replaced"))
    assert not (workspace / "link").is_symlink()
    assert (workspace / "link").read_bytes() == b"replaced"
    assert outside.read_text() == "secret outside the root\n"


async def test_pty_tty_session(session: SandboxSession) -> None:
    assert session.supports_pty()
    started = await session.pty_exec_start("cat", shell=False, tty=True, yield_time_s=0.3)
    assert started.exit_code is None and started.process_id is not None
    echoed = await session.pty_write_stdin(session_id=started.process_id, chars="hello\n", yield_time_s=1.0)
    assert echoed.output == b"hello\r\nhello\r\n"
    assert echoed.process_id == started.process_id and echoed.exit_code is None
    ended = await session.pty_write_stdin(session_id=started.process_id, chars="\x04", yield_time_s=5.0)
    assert (ended.exit_code, ended.process_id) == (0, None)
    with pytest.raises(PtySessionNotFoundError):
        await session.pty_write_stdin(session_id=started.process_id, chars="x")


async def test_pty_pipe_process(session: SandboxSession) -> None:
    done = await session.pty_exec_start("echo hi; exit 4", yield_time_s=5.0)
    assert (done.output, done.exit_code, done.process_id) == (b"hi\n", 4, None)
    running = await session.pty_exec_start("sleep 30", yield_time_s=0.3)
    assert running.exit_code is None and running.process_id is not None
    await session.pty_terminate_all()
    with pytest.raises(PtySessionNotFoundError):
        await session.pty_write_stdin(session_id=running.process_id, chars="")


async def test_persist_and_hydrate(client: CapexecSandboxClient, session: SandboxSession, workspace: Path, tmp_path: Path) -> None:
    (workspace / "d").mkdir()
    (workspace / "d/x.txt").write_text("x content")
    archive = await session.persist_workspace()
    blob = archive.read()
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        names = sorted(m.name for m in tar.getmembers())
    assert "./d/x.txt" in names and "./hello.txt" in names
    assert not any(".capexec-" in n for n in names)
    other_root = tmp_path / "other"
    other = await client.create(manifest=Manifest(root=str(other_root)), options=CapexecSandboxClientOptions())
    async with other:
        await other.hydrate_workspace(io.BytesIO(blob))
        assert (other_root / "d/x.txt").read_text() == "x content"
        assert (other_root / "hello.txt").read_text() == "hello from the manifest\n"
        assert sorted(p.name for p in other_root.iterdir()) == ["d", "hello.txt"]
    await client.delete(other)


async def test_hydrate_refuses_escaping_archive(session: SandboxSession, workspace: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("../evil.txt")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    buf.seek(0)
    with pytest.raises(Exception):  # noqa: B017 - the SDK's WorkspaceArchiveWriteError
        await session.hydrate_workspace(buf)
    assert not (workspace.parent / "evil.txt").exists()


async def test_exposed_port(client: CapexecSandboxClient, workspace: Path) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.readline()
        writer.write(b"echo:" + data)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    s = await client.create(manifest=Manifest(root=str(workspace)), options=CapexecSandboxClientOptions(exposed_ports=(port,)))
    try:
        async with s:
            endpoint = await s.resolve_exposed_port(port)
            assert endpoint.host == "127.0.0.1" and endpoint.tls is False
            assert (await s.resolve_exposed_port(port)) == endpoint
            reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
            writer.write(b"ping\n")
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 10) == b"echo:ping\n"
            writer.close()
            with pytest.raises(ExposedPortUnavailableError):
                await s.resolve_exposed_port(port + 1 if port < 65535 else port - 1)
    finally:
        server.close()
        await client.delete(s)


async def test_owned_workspace_and_resume(client: CapexecSandboxClient) -> None:
    s = await client.create(options=None)
    inner = s._inner
    assert isinstance(inner, CapexecSandboxSession)
    root = Path(inner.state.manifest.root)
    assert inner.state.workspace_root_owned is True
    async with s:
        await s.write(Path("keep.txt"), io.BytesIO(b"kept"))
    payload = client.serialize_session_state(inner.state)
    assert payload["type"] == "capexec" and payload["workspace_root_owned"] is True
    state = client.deserialize_session_state(payload)
    assert isinstance(state, CapexecSandboxSessionState)
    resumed = await client.resume(state)
    async with resumed:
        assert (await resumed.read(Path("keep.txt"))).read() == b"kept"
        assert await resumed._inner.running() is True
    await client.delete(resumed)
    assert not root.exists()


async def test_running(client: CapexecSandboxClient, workspace: Path) -> None:
    s = await client.create(manifest=Manifest(root=str(workspace)), options=CapexecSandboxClientOptions())
    inner = s._inner
    assert await inner.running() is False
    async with s:
        assert await inner.running() is True
    assert await inner.running() is False
    await client.delete(s)

