"""capexec as a sandbox provider for the OpenAI Agents SDK (`agents.sandbox`).

`CapexecSandboxClient` creates sessions whose workspace is a directory of a
capexec server. A session works through two capabilities for it:

- a `Directory` for the workspace root: `read`, `write`, `ls`, `mkdir`,
  `rm` and `mv` are native calls on it, confined by construction (`..`,
  absolute paths elsewhere and symlinks leading out are refused by the
  server's kernel, after the SDK's own path policy);
- the directory's executor (`Directory.executor()`): `exec` and the PTY
  calls run in the workspace, can write only there and have no network.

Exposed ports are reached through a capexec port forward (the client's
executor dials the port on the server's machine), so `resolve_exposed_port`
answers a local address that leads to it.

    import capexec
    from agents.sandbox import Manifest
    from capexec.integrations.openai_agents import CapexecSandboxClient, CapexecSandboxClientOptions

    conn = await capexec.connect("unix:/run/capexec.sock")
    client = CapexecSandboxClient(conn.executor)
    session = await client.create(manifest=Manifest(), options=CapexecSandboxClientOptions())
    async with session:
        result = await session.exec("echo hi")
    await client.delete(session)
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import posixpath

import tarfile
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal, cast

from agents.sandbox.errors import (
    ExecNonZeroError,
    ExecTimeoutError,
    ExecTransportError,
    ExposedPortUnavailableError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.files import EntryKind, FileEntry
from agents.sandbox.manifest import Manifest
from agents.sandbox.session import SandboxSession, SandboxSessionState
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.dependencies import Dependencies
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.pty_output import collect_pty_output
from agents.sandbox.session.pty_types import (
    PTY_PROCESSES_MAX,
    PtyExecUpdate,
    allocate_pty_process_id,
    clamp_pty_yield_time_ms,
    process_id_to_prune_from_meta,
    resolve_pty_write_yield_time_ms,
)
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.workspace_payloads import coerce_write_payload
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, ExposedPortEndpoint, Permissions, User
from agents.sandbox.util.tar_utils import UnsafeTarMemberError, should_skip_tar_member, validate_tarfile

import capexec
from capexec.directory import Directory, FileKind
from capexec.errors import CapexecError
from capexec.process import Closed, Exited, Output, Process

from ._collect import collect

__all__ = [
    "CapexecSandboxClient",
    "CapexecSandboxClientOptions",
    "CapexecSandboxSession",
    "CapexecSandboxSessionState",
]

BACKEND_ID = "capexec"
_DEFAULT_MANIFEST_ROOT = cast(str, Manifest.model_fields["root"].default)
_EXEC_MAX_OUTPUT_BYTES = 64 * 1024 * 1024


class CapexecSandboxClientOptions(BaseSandboxClientOptions):
    """Options of `CapexecSandboxClient.create`.

    `workspace_root`: the workspace's absolute path on the server. Unset: the
    manifest's `root` if it names one, else a new directory in the server's
    temporary directory, which `delete` removes. `exposed_ports`: the TCP
    ports of the server's machine that `resolve_exposed_port` may forward.
    """

    type: Literal["capexec"] = "capexec"
    workspace_root: str | None = None
    exposed_ports: tuple[int, ...] = ()


class CapexecSandboxSessionState(SandboxSessionState):
    type: Literal["capexec"] = "capexec"
    workspace_root_owned: bool = False


@dataclass
class _PtyEntry:
    process: Process
    tty: bool
    last_used: float = field(default_factory=time.monotonic)
    output_chunks: deque[bytes] = field(default_factory=deque)
    output_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    output_notify: asyncio.Event = field(default_factory=asyncio.Event)
    output_closed: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: int | None = None
    pump: asyncio.Task[None] | None = None


class CapexecSandboxSession(BaseSandboxSession):
    """A session whose workspace is `state.manifest.root` on a capexec server."""

    state: CapexecSandboxSessionState

    def __init__(self, *, state: CapexecSandboxSessionState, executor: capexec.Executor) -> None:
        self.state = state
        self._executor = executor
        self._directory: Directory | None = None
        self._workspace_executor: capexec.Executor | None = None
        self._running = False
        self._pty_lock = asyncio.Lock()
        self._pty: dict[int, _PtyEntry] = {}
        self._forwards: dict[int, ExposedPortEndpoint] = {}
        self._forward_stack = contextlib.AsyncExitStack()

    # -- backend lifecycle ------------------------------------------------

    @property
    def _root(self) -> str:
        return posixpath.normpath(self.state.manifest.root)

    def _dir(self) -> Directory:
        if self._directory is None:
            self._directory = self._executor.directory(self._root)
            self._workspace_executor = self._directory.executor()
        return self._directory

    def _wexec(self) -> capexec.Executor:
        self._dir()
        assert self._workspace_executor is not None
        return self._workspace_executor

    async def _prepare_backend_workspace(self) -> None:
        if self.state.manifest.users or self.state.manifest.groups:
            raise ValueError("CapexecSandboxSession does not support manifest users or groups")
        try:
            await self._executor.directory("/").mkdir(self._root.lstrip("/"), recursive=True)
        except CapexecError as exc:
            raise WorkspaceArchiveWriteError(path=Path(self._root), cause=exc) from exc
        self._dir()

    async def _after_start(self) -> None:
        self._running = True

    async def _after_start_failed(self) -> None:
        self._running = False

    async def _shutdown_backend(self) -> None:
        await self._forward_stack.aclose()
        self._forward_stack = contextlib.AsyncExitStack()
        self._forwards.clear()

    async def _after_shutdown(self) -> None:
        self._running = False

    async def running(self) -> bool:
        return self._running

    # -- paths ------------------------------------------------------------

    def _rel(self, path: Path | str, *, for_write: bool = False) -> tuple[Path, str]:
        """The workspace path (SDK-normalized: confined lexically) and its part below the root."""
        normalized = self.normalize_path(path, for_write=for_write)
        rel = PurePosixPath(normalized.as_posix()).relative_to(PurePosixPath(self._root)).as_posix()
        return normalized, "" if rel == "." else rel

    # -- exec -------------------------------------------------------------

    def _prepare_exec_command(self, *command: str | Path, shell: bool | list[str], user: str | User | None) -> list[str]:
        if user is not None:
            raise ValueError("CapexecSandboxSession runs every command as the server's user; `user` is not supported")
        if shell is True:
            shell = ["sh", "-c"]
        return super()._prepare_exec_command(*command, shell=shell, user=None)

    async def _environment(self) -> dict[str, str]:
        env = dict(await self.state.manifest.environment.resolve())
        env.setdefault("HOME", self._root)
        return env

    async def _exec_internal(self, *command: str | Path, timeout: float | None = None) -> ExecResult:
        argv = [str(c) for c in command]
        try:
            proc = await self._wexec().start(
                argv, cwd=self._root, env=await self._environment(), stdin=False, flow="lossless", timeout=timeout or None
            )
        except CapexecError as exc:
            if exc.tag == "program-not-found":
                return ExecResult(stdout=b"", stderr=f"{argv[0]}: command not found\n".encode(), exit_code=127)
            if exc.tag == "permission-denied":
                return ExecResult(stdout=b"", stderr=f"{argv[0]}: {exc.sentence}\n".encode(), exit_code=126)
            raise ExecTransportError(command=argv, cause=exc) from exc
        try:
            async with proc:
                got = await collect(proc, timeout=timeout, max_bytes=_EXEC_MAX_OUTPUT_BYTES)
        except CapexecError as exc:
            raise ExecTransportError(command=argv, cause=exc) from exc
        if got.timed_out:
            raise ExecTimeoutError(command=argv, timeout_s=timeout)
        if got.exit_code is None:
            raise ExecTransportError(command=argv, message="the process ended without an exit status")
        return ExecResult(stdout=bytes(got.stdout), stderr=bytes(got.stderr), exit_code=got.exit_code)

    # -- files ------------------------------------------------------------

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        if user is not None:
            raise ValueError("CapexecSandboxSession does not support `user` on file calls")
        normalized, rel = self._rel(path)
        try:
            data = await self._dir().read_bytes(rel)
        except CapexecError as exc:
            if exc.tag == "not-found":
                raise WorkspaceReadNotFoundError(path=path, cause=exc) from exc
            raise WorkspaceArchiveReadError(path=normalized, cause=exc) from exc
        return io.BytesIO(data)

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        if user is not None:
            raise ValueError("CapexecSandboxSession does not support `user` on file calls")
        payload = coerce_write_payload(path=path, data=data)
        normalized, rel = self._rel(path, for_write=True)
        content = payload.stream.read()
        blob = content.encode("utf-8") if isinstance(content, str) else bytes(content)
        try:
            await self._dir().write_bytes(rel, blob, create_parents=True)
        except CapexecError as exc:
            raise WorkspaceArchiveWriteError(path=normalized, cause=exc) from exc

    async def ls(self, path: Path | str, *, user: str | User | None = None) -> list[FileEntry]:
        if user is not None:
            raise ValueError("CapexecSandboxSession does not support `user` on file calls")
        normalized, rel = self._rel(path)
        listed: list[FileEntry] = []
        try:
            async for e in self._dir().list(rel):
                st = e.stat
                if st is None:
                    continue  # gone before its stat could be had
                kind = _entry_kind(st.kind)
                perms = Permissions.from_mode(st.permissions)
                if kind == EntryKind.DIRECTORY:
                    perms = perms.model_copy(update={"directory": True})
                listed.append(
                    FileEntry(
                        path=str(normalized / e.path),
                        permissions=perms,
                        owner=str(st.uid),
                        group=str(st.gid),
                        size=st.size,
                        kind=kind,
                    )
                )
        except CapexecError as exc:
            raise _nonzero(("ls", "-la", "--", str(normalized)), exc) from exc
        return listed

    async def mkdir(self, path: Path | str, *, parents: bool = False, user: str | User | None = None) -> None:
        if user is not None:
            raise ValueError("CapexecSandboxSession does not support `user` on file calls")
        normalized, rel = self._rel(path, for_write=True)
        if not rel:
            return
        try:
            await self._dir().mkdir(rel, recursive=parents)
        except CapexecError as exc:
            raise WorkspaceArchiveWriteError(path=normalized, cause=exc) from exc

    async def rm(self, path: Path | str, *, recursive: bool = False, user: str | User | None = None) -> None:
        if user is not None:
            raise ValueError("CapexecSandboxSession does not support `user` on file calls")
        normalized, rel = self._rel(path, for_write=True)
        try:
            await self._dir().remove(rel, recursive=recursive, missing_ok=recursive)
        except CapexecError as exc:
            if exc.tag in ("not-found", "not-empty", "is-a-directory", "not-a-directory"):
                raise _nonzero(("rm", "-rf" if recursive else "--", str(normalized)), exc) from exc
            raise WorkspaceArchiveWriteError(path=normalized, cause=exc) from exc

    async def mv(self, source: Path | str, destination: Path | str, *, user: str | User | None = None) -> None:
        if user is not None:
            raise ValueError("CapexecSandboxSession does not support `user` on file calls")
        src, src_rel = self._rel(source, for_write=True)
        dst, dst_rel = self._rel(destination, for_write=True)
        command = ("mv", "-f", "--", str(src), str(dst))
        try:
            st = await self._dir().stat(src_rel, follow_symlinks=False)
            if _entry_kind(st.kind) not in (EntryKind.FILE, EntryKind.SYMLINK):
                raise ExecNonZeroError(
                    ExecResult(stdout=b"", stderr=b"Move source must be a regular file or symlink\n", exit_code=1),
                    command=command,
                )
            await self._dir().rename(src_rel, dst_rel)
        except CapexecError as exc:
            raise _nonzero(command, exc) from exc

    # -- workspace archives -----------------------------------------------

    async def persist_workspace(self) -> io.IOBase:
        """A tar of the workspace (members relative to it), made by `tar` in the
        workspace and fetched through the directory."""
        name = f".capexec-persist-{uuid.uuid4().hex}.tar"
        skips = {PurePosixPath(name)} | {PurePosixPath(p.as_posix()) for p in self._persist_workspace_skip_relpaths()}
        argv = ["tar", "-cf", name]
        for skip in sorted(skips, key=str):
            argv.append(f"--exclude=./{skip.as_posix()}")
        argv += ["-C", ".", "."]
        root = Path(self._root)
        try:
            result = await self._exec_internal(*argv)
            if result.exit_code != 0:
                raise WorkspaceArchiveReadError(path=root, context={"stderr": result.stderr.decode("utf-8", "replace"), "exit_code": result.exit_code})
            blob = await self._dir().read_bytes(name)
        except CapexecError as exc:
            raise WorkspaceArchiveReadError(path=root, cause=exc) from exc
        finally:
            with contextlib.suppress(CapexecError):
                await self._dir().remove(name, missing_ok=True)
        return io.BytesIO(blob)

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """Unpacks a tar (as `persist_workspace` makes) into the workspace: it is
        checked first (no absolute or `..` members, no links leading out), then
        sent through the directory and unpacked by `tar` in the workspace."""
        root = Path(self._root)
        raw = data.read()
        blob = raw.encode("utf-8") if isinstance(raw, str) else bytes(raw)
        try:
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as tar:
                validate_tarfile(tar, allow_external_symlink_targets=False)
        except UnsafeTarMemberError as exc:
            raise WorkspaceArchiveWriteError(path=root, context={"reason": exc.reason, "member": exc.member}, cause=exc) from exc
        except (tarfile.TarError, OSError) as exc:
            raise WorkspaceArchiveWriteError(path=root, cause=exc) from exc
        name = f".capexec-hydrate-{uuid.uuid4().hex}.tar"
        try:
            await self._dir().upload(name, blob)
            result = await self._exec_internal("tar", "-xf", name, "--no-same-owner", "-C", ".")
            if result.exit_code != 0:
                raise WorkspaceArchiveWriteError(path=root, context={"stderr": result.stderr.decode("utf-8", "replace"), "exit_code": result.exit_code})
        except CapexecError as exc:
            raise WorkspaceArchiveWriteError(path=root, cause=exc) from exc
        finally:
            with contextlib.suppress(CapexecError):
                await self._dir().remove(name, missing_ok=True)

    # -- PTY --------------------------------------------------------------

    def supports_pty(self) -> bool:
        return True

    async def _pump(self, entry: _PtyEntry) -> None:
        """Moves the process's output into `entry` until it closed (or the
        connection broke: then the entry ends without an exit code)."""
        try:
            async for event in entry.process.events():
                if isinstance(event, Output):
                    async with entry.output_lock:
                        entry.output_chunks.append(bytes(event.data))
                    entry.output_notify.set()
                elif isinstance(event, Exited):
                    entry.exit_code = event.code if event.code is not None else 128 + (event.signal or 0)
                elif isinstance(event, Closed):
                    break
        except CapexecError:
            pass
        finally:
            entry.output_closed.set()
            entry.output_notify.set()

    async def pty_exec_start(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
        tty: bool = False,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        _ = timeout
        argv = self._prepare_exec_command(*command, shell=shell, user=user)
        try:
            if tty:
                proc = await self._wexec().start(argv, cwd=self._root, env=await self._environment(), tty=True)
            else:
                proc = await self._wexec().start(argv, cwd=self._root, env=await self._environment(), stdin=False)
        except CapexecError as exc:
            raise ExecTransportError(command=argv, cause=exc) from exc
        entry = _PtyEntry(process=proc, tty=tty)
        entry.pump = asyncio.ensure_future(self._pump(entry))
        pruned: _PtyEntry | None = None
        async with self._pty_lock:
            process_id = allocate_pty_process_id(set(self._pty))
            if len(self._pty) >= PTY_PROCESSES_MAX:
                victim = process_id_to_prune_from_meta([(pid, e.last_used, e.output_closed.is_set()) for pid, e in self._pty.items()])
                if victim is not None:
                    pruned = self._pty.pop(victim, None)
            self._pty[process_id] = entry
        if pruned is not None:
            await self._end(pruned)
        yield_ms = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._update(process_id, entry, clamp_pty_yield_time_ms(yield_ms), max_output_tokens)

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        async with self._pty_lock:
            entry = self._resolve_pty_session_entry(pty_processes=self._pty, session_id=session_id)
        if chars:
            if not entry.tty:
                raise RuntimeError("stdin is not available for this process")
            await entry.process.write(chars.encode("utf-8"))
        yield_ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        entry.last_used = time.monotonic()
        return await self._update(
            session_id,
            entry,
            resolve_pty_write_yield_time_ms(yield_time_ms=yield_ms, input_empty=chars == ""),
            max_output_tokens,
        )

    async def _update(self, process_id: int, entry: _PtyEntry, yield_ms: int, max_output_tokens: int | None) -> PtyExecUpdate:
        output, original_tokens, closed = await collect_pty_output(
            output_chunks=entry.output_chunks,
            output_lock=entry.output_lock,
            output_notify=entry.output_notify,
            is_done=entry.output_closed.is_set,
            yield_time_ms=yield_ms,
            max_output_tokens=max_output_tokens,
        )
        exit_code = entry.exit_code if closed else None
        live: int | None = process_id
        if closed:
            async with self._pty_lock:
                removed = self._pty.pop(process_id, None)
            if removed is not None:
                await self._end(removed)
            live = None
        return PtyExecUpdate(process_id=live, output=output, exit_code=exit_code, original_token_count=original_tokens)

    async def _end(self, entry: _PtyEntry) -> None:
        with contextlib.suppress(CapexecError):
            if not entry.output_closed.is_set():
                await entry.process.terminate()
        if entry.pump is not None:
            entry.pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, CapexecError):
                await entry.pump
        with contextlib.suppress(CapexecError):
            await entry.process.release()

    async def pty_terminate_all(self) -> None:
        async with self._pty_lock:
            entries = list(self._pty.values())
            self._pty.clear()
        for entry in entries:
            await self._end(entry)

    # -- ports ------------------------------------------------------------

    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        known = self._forwards.get(port)
        if known is not None:
            return known
        try:
            fwd = await self._forward_stack.enter_async_context(
                self._executor.forward(local="127.0.0.1:0", remote=f"127.0.0.1:{port}")
            )
        except CapexecError as exc:
            raise ExposedPortUnavailableError(
                port=port,
                exposed_ports=self.state.exposed_ports,
                reason="backend_unavailable",
                context={"backend": BACKEND_ID, "error": str(exc)},
            ) from exc
        address = fwd.local_address
        address = address[len("tcp:") :] if address.startswith("tcp:") else address
        host, _, local_port = address.rpartition(":")
        endpoint = ExposedPortEndpoint(host=host.strip("[]"), port=int(local_port), tls=False)
        self._forwards[port] = endpoint
        return endpoint


class CapexecSandboxClient(BaseSandboxClient[CapexecSandboxClientOptions | None]):
    """Creates sessions on the capexec server behind `executor`.

    The executor is the client's (as `Connection.executor`, or a restricted
    one): each session confines itself to its workspace with
    `Directory.executor()`, and port forwards use this executor's `dial`.
    """

    backend_id = BACKEND_ID
    supports_default_options = True

    def __init__(
        self,
        executor: capexec.Executor,
        *,
        instrumentation: Instrumentation | None = None,
        dependencies: Dependencies | None = None,
    ) -> None:
        self._executor = executor
        self._instrumentation = instrumentation if instrumentation is not None else Instrumentation()
        self._dependencies = dependencies

    async def _new_workspace(self) -> str:
        result = await self._executor.run(["mktemp", "-d", "-t", "openai-agents-XXXXXXXX"])
        path = result.stdout.decode("utf-8", "replace").strip()
        if result.exit_code != 0 or not path.startswith("/"):
            raise WorkspaceArchiveWriteError(
                path=Path("/"),
                context={"reason": "mktemp failed", "stderr": result.stderr.decode("utf-8", "replace")},
            )
        return path

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: CapexecSandboxClientOptions | None = None,
    ) -> SandboxSession:
        opts = options if options is not None else CapexecSandboxClientOptions()
        manifest = manifest if manifest is not None else Manifest()
        self._validate_manifest_for_create(manifest)
        owned = False
        if opts.workspace_root is not None:
            root = opts.workspace_root
        elif manifest.root != _DEFAULT_MANIFEST_ROOT:
            root = manifest.root
        else:
            root = await self._new_workspace()
            owned = True
        if not root.startswith("/"):
            raise ValueError(f"the workspace root must be an absolute path, not {root!r}")
        manifest = manifest.model_copy(update={"root": root}, deep=True)
        session_id = uuid.uuid4()
        state = CapexecSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            workspace_root_owned=owned,
            exposed_ports=opts.exposed_ports,
        )
        inner = CapexecSandboxSession(state=state, executor=self._executor)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """Ends the session's processes and forwards; removes its workspace if
        `create` made it."""
        inner = session._inner
        if not isinstance(inner, CapexecSandboxSession):
            raise TypeError("CapexecSandboxClient.delete expects a CapexecSandboxSession")
        await inner.pty_terminate_all()
        await inner._shutdown_backend()
        if inner.state.workspace_root_owned:
            parent, name = posixpath.split(posixpath.normpath(inner.state.manifest.root))
            with contextlib.suppress(CapexecError):
                await self._executor.directory(parent).remove(name, recursive=True, missing_ok=True)
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """A session on the workspace `state` names (it stays on the server
        between sessions: a resumed session finds its files there)."""
        if not isinstance(state, CapexecSandboxSessionState):
            raise TypeError("CapexecSandboxClient.resume expects a CapexecSandboxSessionState")
        state.assert_path_grants_rebound()
        inner = CapexecSandboxSession(state=state, executor=self._executor)
        inner._set_start_state_preserved(True)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, CapexecSandboxSessionState)


def _entry_kind(kind: FileKind) -> EntryKind:
    if kind is FileKind.FILE:
        return EntryKind.FILE
    if kind is FileKind.DIRECTORY:
        return EntryKind.DIRECTORY
    if kind is FileKind.SYMLINK:
        return EntryKind.SYMLINK
    return EntryKind.OTHER


def _nonzero(command: tuple[str, ...], exc: CapexecError) -> ExecNonZeroError:
    return ExecNonZeroError(
        ExecResult(stdout=b"", stderr=f"{exc.sentence} [{exc.tag}]\n".encode(), exit_code=1),
        command=command,
        cause=exc,
    )



