"""capexec as a deepagents sandbox backend (`SandboxBackendProtocol`).

`CapexecSandbox` runs a deep agent's commands and file tools on a capexec
server, confined to one directory of it (the *root*):

- file tools (`ls`, `read`, `write`, `edit`, `grep`, `glob`, `delete`,
  `upload_files`, `download_files`) work natively on a `Directory`
  capability for the root, so they cannot name anything outside it: `..`,
  symlinks leading out and mount points are refused by the server's kernel,
  not by string checks here;
- `execute` runs `sh -c COMMAND` through the directory's executor
  (`Directory.executor()`): in the root, writing nowhere else, without
  network.

Paths are the server's absolute paths, as the commands see them: a tool
path must lie within the root (`/srv/ws/a.txt` for the root `/srv/ws`); a
relative path, a path outside the root, or one with a `..` component is
refused.

Every method has its async twin (`aexecute`, `als`...). The sync ones may
be called from any thread: the backend keeps its connection on an event
loop thread of its own (deepagents calls sync methods from worker threads).

    from capexec.integrations.deepagents import CapexecSandbox

    with CapexecSandbox.open("/srv/ws", connect="unix:/run/capexec.sock") as sandbox:
        # (or CapexecSandbox.open(connect=...): a new directory, removed on close)
        agent = create_deep_agent(model=..., backend=sandbox)
"""

from __future__ import annotations

import base64
import posixpath
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime, timezone
from types import TracebackType
from typing import Any, TypeVar

from deepagents.backends.protocol import (
    FILE_NOT_FOUND,
    INVALID_PATH,
    IS_DIRECTORY,
    PERMISSION_DENIED,
    DeleteResult,
    EditResult,
    ExecuteResponse,
    FileData,
    FileDownloadResponse,
    FileInfo,
    FileUploadResponse,
    GlobResult,
    GrepMatch,
    GrepResult,
    LsResult,
    ReadResult,
    SandboxBackendProtocol,
    WriteResult,
)
from deepagents.backends.utils import (
    EMPTY_CONTENT_WARNING,
    EMPTY_OLD_STRING_ERROR,
    _get_backend_read_file_type,
    compile_grep_include_glob,
    normalize_read_bounds,
    perform_string_replacement,
)

import capexec
from capexec.directory import DirEntry, Directory, FileKind
from capexec.errors import CapexecError

from ._collect import collect
from ._loop import LoopThread

T = TypeVar("T")

__all__ = ["CapexecSandbox", "LoopThread"]

MAX_BINARY_READ_BYTES = 500 * 1024
"""Largest binary file `read` returns (base64), as deepagents' `BaseSandbox`."""

MAX_TEXT_READ_BYTES = 500 * 1024
"""Most text one `read` page returns; a longer page is cut with a note to paginate."""

_READ_TRUNCATION_NOTE = (
    "\n\n[Output was truncated due to size limits. "
    "This paginated read result exceeded the sandbox stdout limit. "
    "Continue reading with a larger offset or smaller limit to inspect the rest of the file.]"
)

GREP_MAX_FILE_BYTES = 10 * 1024 * 1024
"""`grep` skips files larger than this (as deepagents' `FilesystemBackend`)."""

GREP_EXCLUDE_DIRS: tuple[str, ...] = (".git",)
"""Directory names `grep` does not descend into (as deepagents' `BaseSandbox`)."""


class _PathRefused(Exception):
    """A tool path that does not name anything inside the root."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{reason}: {path}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class _Entry:
    rel: str  # relative to the listed or walked directory
    kind: str  # "file", "directory", "symlink", "other"
    size: int
    modified_ns: int


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat()


def _file_error_code(exc: CapexecError) -> str:
    """deepagents' `FileOperationError` vocabulary for a capexec refusal."""
    tag = exc.tag
    if tag == "not-found":
        return FILE_NOT_FOUND
    if tag == "is-a-directory":
        return IS_DIRECTORY
    if tag in ("permission-denied", "forbidden"):
        return PERMISSION_DENIED
    if tag in ("outside-directory", "not-a-directory", "invalid-argument", "exists"):
        return INVALID_PATH
    return f"{tag}: {exc.sentence}"


class CapexecSandbox(SandboxBackendProtocol):
    """A deepagents sandbox backend on a capexec `Directory` and its executor.

    Build one with `CapexecSandbox.open(root, connect=...)` (it connects on a
    loop thread of its own and closes the connection with `close()`), or with
    `CapexecSandbox.on_loop(root, directory, loop)` for a directory made on a
    `LoopThread` you keep (several backends can share one connection).
    """

    def __init__(
        self,
        *,
        root: str,
        directory: Directory,
        executor: capexec.Executor,
        loop: LoopThread,
        connection: capexec.Connection | None = None,
        owns_loop: bool = False,
        default_timeout: float = 300.0,
        max_output_bytes: int = 1024 * 1024,
        sandbox_id: str | None = None,
    ) -> None:
        if not root.startswith("/"):
            raise ValueError(f"the root must be an absolute path, not {root!r}")
        self._root = posixpath.normpath(root) if root != "/" else "/"
        self._directory = directory
        self._executor = executor
        self._loop = loop
        self._connection = connection
        self._owns_loop = owns_loop
        self._default_timeout = default_timeout
        self._max_output_bytes = max_output_bytes
        self._id = sandbox_id or f"capexec-{uuid.uuid4().hex[:12]}"
        self._closed = False
        self._owns_root = False

    # -- construction -----------------------------------------------------

    @classmethod
    def open(
        cls,
        root: str | None = None,
        *,
        connect: str | None = None,
        create: bool = True,
        default_timeout: float = 300.0,
        max_output_bytes: int = 1024 * 1024,
        **connect_options: Any,
    ) -> CapexecSandbox:
        """Connects to the server (`capexec.connect(connect, **connect_options)`)
        on a new loop thread and confines the backend to `root`, an absolute
        path on the server (created first, with its parents, if `create`).
        Without `root`, a new directory in the server's temporary directory,
        which `close()` removes."""
        loop = LoopThread("capexec-deepagents")

        async def setup() -> tuple[capexec.Connection, str, Directory, capexec.Executor]:
            conn = await capexec.connect(connect, **connect_options)
            try:
                if root is None:
                    made = await conn.executor.run(["mktemp", "-d", "-t", "deepagents-XXXXXXXX"])
                    path = made.stdout.decode("utf-8", "replace").strip()
                    if made.exit_code != 0 or not path.startswith("/"):
                        raise RuntimeError(f"could not make a directory on the server: {made.stderr.decode('utf-8', 'replace')}")
                else:
                    path = root
                    if create:
                        await conn.executor.directory("/").mkdir(path.lstrip("/") or ".", recursive=True)
                directory = conn.executor.directory(path)
                return conn, path, directory, directory.executor()
            except BaseException:
                await conn.close()
                raise

        try:
            conn, path, directory, executor = loop.run(setup())
        except BaseException:
            loop.close()
            raise
        backend = cls(
            root=path,
            directory=directory,
            executor=executor,
            loop=loop,
            connection=conn,
            owns_loop=True,
            default_timeout=default_timeout,
            max_output_bytes=max_output_bytes,
        )
        backend._owns_root = root is None
        return backend

    @classmethod
    def on_loop(
        cls,
        root: str,
        directory: Directory,
        loop: LoopThread,
        *,
        default_timeout: float = 300.0,
        max_output_bytes: int = 1024 * 1024,
    ) -> CapexecSandbox:
        """A backend on `directory` (the directory `root` of the server), made on
        `loop`, which the caller keeps running and closes."""
        async def executor_of(directory: Directory) -> capexec.Executor:
            return directory.executor()  # pipelined, but made on the loop's thread

        return cls(
            root=root,
            directory=directory,
            executor=loop.run(executor_of(directory)),
            loop=loop,
            default_timeout=default_timeout,
            max_output_bytes=max_output_bytes,
        )

    def close(self) -> None:
        """Closes the connection and the loop thread if this backend made them
        (and removes the root if `open` made it)."""
        if self._closed:
            return
        self._closed = True
        conn = self._connection
        if conn is not None:
            owned = self._owns_root
            parent, name = posixpath.split(self._root)

            async def finish(conn: capexec.Connection) -> None:
                # Every capability call, pipelined ones too, is made on the loop's thread.
                try:
                    if owned:
                        await conn.executor.directory(parent).remove(name, recursive=True, missing_ok=True)
                finally:
                    await conn.close()

            self._loop.run(finish(conn))
        if self._owns_loop:
            self._loop.close()

    def __enter__(self) -> CapexecSandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- identity ---------------------------------------------------------

    @property
    def id(self) -> str:
        return self._id

    @property
    def root(self) -> str:
        """The server path of the directory this backend is confined to."""
        return self._root

    # -- plumbing ---------------------------------------------------------

    def _sync(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return self._loop.run(make())

    async def _async(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return await self._loop.run_async(make())

    def _rel(self, path: str) -> str:
        """The path relative to the root ("" for the root) of an absolute tool path."""
        if not isinstance(path, str) or not path.startswith("/"):
            raise _PathRefused(str(path), "not an absolute path")
        if "\x00" in path:
            raise _PathRefused(path, "a path may not contain NUL")
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise _PathRefused(path, "path traversal (..) is not allowed")
        norm = "/" + "/".join(parts)
        if self._root == "/":
            return norm.lstrip("/")
        if norm == self._root:
            return ""
        if norm.startswith(self._root + "/"):
            return norm[len(self._root) + 1 :]
        raise _PathRefused(path, f"outside the sandbox root {self._root}")

    def _abs(self, rel: str) -> str:
        if not rel:
            return self._root
        return posixpath.join(self._root, rel)

    async def _stat_kind(self, rel: str) -> str | None:
        """"file", "directory", "symlink", "other", or None if nothing is there."""
        try:
            st = await self._directory.stat(rel, follow_symlinks=False)
        except CapexecError as exc:
            if exc.tag == "not-found":
                return None
            raise
        return _kind_name(st.kind)

    async def _fetch(self, rel: str) -> bytes:
        return await self._directory.read_bytes(rel)

    async def _store(self, rel: str, data: bytes) -> None:
        await self._directory.write_bytes(rel, data, create_parents=True)

    async def _list(self, rel: str) -> list[_Entry]:
        return [_entry(e) async for e in self._directory.list(rel)]

    async def _walk(self, rel: str) -> list[_Entry]:
        return [_entry(e) async for e in self._directory.walk(rel)]

    # -- execute ----------------------------------------------------------

    async def _aexecute(self, command: str, timeout: float | None) -> ExecuteResponse:
        if not command or not isinstance(command, str):
            return ExecuteResponse(output="Error: Command must be a non-empty string.", exit_code=1)
        limit = self._default_timeout if timeout is None else timeout
        if limit < 0:
            raise ValueError(f"timeout must be non-negative, got {limit}")
        try:
            # stderr joins stdout in the shell, so the output keeps the order it was written in.
            # The server ends the command at the deadline too, should this client stall or go.
            proc = await self._executor.start(
                ["sh", "-c", "exec 2>&1; " + command], stdin=False, flow="lossless", timeout=limit or None
            )
        except CapexecError as exc:
            return ExecuteResponse(output=f"Error executing command: {exc}", exit_code=1)
        try:
            async with proc:
                got = await collect(proc, timeout=limit or None, max_bytes=self._max_output_bytes)
        except CapexecError as exc:
            # The connection broke (or the server shut down) while the command ran.
            return ExecuteResponse(output=f"Error executing command: {exc}", exit_code=None)
        text = got.combined.decode("utf-8", errors="replace")
        if got.truncated:
            text += f"\n\n... Output truncated at {self._max_output_bytes} bytes."
        if got.timed_out:
            shown = int(limit) if float(limit).is_integer() else limit
            note = f"Error: Command timed out after {shown} seconds."
            return ExecuteResponse(output=f"{text}\n\n{note}" if text else note, exit_code=124, truncated=got.truncated)
        return ExecuteResponse(output=text, exit_code=got.exit_code, truncated=got.truncated)

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Runs `sh -c command` in the root; the output is stdout and stderr
        together, in the order written (as `2>&1`)."""
        return self._sync(lambda: self._aexecute(command, timeout))

    async def aexecute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:  # noqa: ASYNC109
        return await self._async(lambda: self._aexecute(command, timeout))

    # -- ls ---------------------------------------------------------------

    async def _als(self, path: str) -> LsResult:
        try:
            rel = self._rel(path)
        except _PathRefused as exc:
            return LsResult(error=f"Path '{path}': invalid_path ({exc.reason})")
        try:
            entries = await self._list(rel)
        except CapexecError as exc:
            if exc.tag == "not-found":
                return LsResult(error=f"Path '{path}': path_not_found")
            if exc.tag == "not-a-directory":
                return LsResult(error=f"Path '{path}': not_a_directory")
            if exc.tag in ("permission-denied", "forbidden"):
                return LsResult(error=f"Path '{path}': permission_denied")
            return LsResult(error=f"Path '{path}': {exc}")
        base = self._abs(rel)
        infos: list[FileInfo] = []
        for e in entries:
            info: FileInfo = {"path": posixpath.join(base, e.rel), "is_dir": e.kind == "directory"}
            info["size"] = e.size if e.kind != "directory" else 0
            info["modified_at"] = _iso(e.modified_ns)
            infos.append(info)
        infos.sort(key=lambda i: i["path"])
        return LsResult(entries=infos)

    def ls(self, path: str) -> LsResult:
        return self._sync(lambda: self._als(path))

    async def als(self, path: str) -> LsResult:
        return await self._async(lambda: self._als(path))

    # -- read -------------------------------------------------------------

    async def _aread(self, file_path: str, offset: int, limit: int) -> ReadResult:
        try:
            rel = self._rel(file_path)
        except _PathRefused as exc:
            return ReadResult(error=f"File '{file_path}': invalid_path ({exc.reason})")
        try:
            st = await self._directory.stat(rel)
            kind = _kind_name(st.kind)
            if kind == "directory":
                return ReadResult(error=f"File '{file_path}': is_directory")
            if kind != "file":
                return ReadResult(error=f"File '{file_path}': not_a_file")
            if _get_backend_read_file_type(file_path) != "text":
                if st.size > MAX_BINARY_READ_BYTES:
                    return ReadResult(error=f"File '{file_path}': Binary file exceeds maximum preview size of {MAX_BINARY_READ_BYTES} bytes")
                raw = await self._fetch(rel)
                return ReadResult(file_data=FileData(content=base64.b64encode(raw).decode("ascii"), encoding="base64"))
            raw = await self._fetch(rel)
        except CapexecError as exc:
            if exc.tag == "not-found":
                return ReadResult(error=f"File '{file_path}': file_not_found")
            if exc.tag in ("permission-denied", "forbidden"):
                return ReadResult(error=f"File '{file_path}': permission_denied")
            return ReadResult(error=f"File '{file_path}': {exc}")
        if not raw:
            return ReadResult(file_data=FileData(content=EMPTY_CONTENT_WARNING, encoding="utf-8"))
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            if len(raw) > MAX_BINARY_READ_BYTES:
                return ReadResult(error=f"File '{file_path}': Binary file exceeds maximum preview size of {MAX_BINARY_READ_BYTES} bytes")
            return ReadResult(file_data=FileData(content=base64.b64encode(raw).decode("ascii"), encoding="base64"))
        return _read_window(text, offset, limit)

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return self._sync(lambda: self._aread(file_path, offset, limit))

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return await self._async(lambda: self._aread(file_path, offset, limit))

    # -- write ------------------------------------------------------------

    async def _awrite(self, file_path: str, content: str) -> WriteResult:
        try:
            rel = self._rel(file_path)
            if not rel:
                raise _PathRefused(file_path, "the sandbox root is a directory")
        except _PathRefused as exc:
            return WriteResult(error=f"Error writing file '{file_path}': invalid_path ({exc.reason})")
        try:
            await self._store(rel, content.encode("utf-8"))
        except CapexecError as exc:
            return WriteResult(error=f"Error writing file '{file_path}': {_file_error_code(exc)}")
        return WriteResult(path=file_path)

    def write(self, file_path: str, content: str) -> WriteResult:
        """Creates or replaces the file (atomically), with its missing parents."""
        return self._sync(lambda: self._awrite(file_path, content))

    async def awrite(self, file_path: str, content: str) -> WriteResult:
        return await self._async(lambda: self._awrite(file_path, content))

    # -- edit -------------------------------------------------------------

    async def _aedit(self, file_path: str, old: str, new: str, replace_all: bool) -> EditResult:
        if not old:
            return EditResult(error=EMPTY_OLD_STRING_ERROR)
        try:
            rel = self._rel(file_path)
        except _PathRefused as exc:
            return EditResult(error=f"Error editing file '{file_path}': invalid_path ({exc.reason})")
        try:
            st = await self._directory.stat(rel)
            if _kind_name(st.kind) != "file":
                return EditResult(error=f"Error: '{file_path}' is not a regular file")
            raw = await self._fetch(rel)
        except CapexecError as exc:
            if exc.tag == "not-found":
                return EditResult(error=f"Error: File '{file_path}' not found")
            if exc.tag in ("permission-denied", "forbidden"):
                return EditResult(error=f"Error: Permission denied editing file '{file_path}'")
            return EditResult(error=f"Error editing file '{file_path}': {exc}")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return EditResult(error=f"Error: File '{file_path}' is not a text file")
        # `read` hands the model LF line ends; try the string as sent, then in
        # the file's CRLF style, and write the replacement in the style matched.
        candidates = [(old, new)]
        old_lf, new_lf = old.replace("\r\n", "\n"), new.replace("\r\n", "\n")
        candidates.append((old_lf.replace("\n", "\r\n"), new_lf.replace("\n", "\r\n")))
        candidates.append((old_lf, new_lf))
        chosen = candidates[0]
        for cand in candidates:
            if cand[0] in text:
                chosen = cand
                break
        count = text.count(chosen[0])
        if count > 1 and not replace_all:
            # deepagents' sandbox wording ("multiple"), with the count.
            return EditResult(
                error=f"Error: String '{old}' appears multiple times ({count} occurrences). "
                "Use replace_all=True to replace all occurrences, or provide a more specific string with surrounding context."
            )
        outcome = perform_string_replacement(text, chosen[0], chosen[1], replace_all)
        if isinstance(outcome, str):
            return EditResult(error=outcome)
        new_text, occurrences = outcome
        try:
            await self._directory.write_bytes(rel, new_text.encode("utf-8"), if_version=st.version)
        except CapexecError as exc:
            if exc.tag == "conflict":
                return EditResult(error=f"Error editing file '{file_path}': the file changed while it was being edited; read it again")
            return EditResult(error=f"Error editing file '{file_path}': {_file_error_code(exc)}")
        return EditResult(path=file_path, occurrences=int(occurrences))

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:  # noqa: FBT001, FBT002
        return self._sync(lambda: self._aedit(file_path, old_string, new_string, replace_all))

    async def aedit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:  # noqa: FBT001, FBT002
        return await self._async(lambda: self._aedit(file_path, old_string, new_string, replace_all))

    # -- delete -----------------------------------------------------------

    async def _adelete(self, file_path: str) -> DeleteResult:
        try:
            rel = self._rel(file_path)
            if not rel:
                raise _PathRefused(file_path, "the sandbox root itself cannot be deleted")
        except _PathRefused as exc:
            return DeleteResult(error=f"Error deleting '{file_path}': invalid_path ({exc.reason})")
        try:
            if await self._stat_kind(rel) is None:
                return DeleteResult(error=f"Error: '{file_path}' not found")
            await self._directory.remove(rel, recursive=True)
        except CapexecError as exc:
            return DeleteResult(error=f"Error deleting '{file_path}': {_file_error_code(exc)}")
        return DeleteResult(path=file_path)

    def delete(self, file_path: str) -> DeleteResult:
        """Removes a file, a symlink (not its target) or a directory tree."""
        return self._sync(lambda: self._adelete(file_path))

    async def adelete(self, file_path: str) -> DeleteResult:
        return await self._async(lambda: self._adelete(file_path))

    # -- grep -------------------------------------------------------------

    async def _agrep(self, pattern: str, path: str | None, glob: str | None, max_count: int | None) -> GrepResult:
        search = path or self._root
        matcher: Callable[[str], bool] | None = None
        if glob:
            try:
                matcher = compile_grep_include_glob(glob)
            except ValueError as exc:
                return GrepResult(error=str(exc), matches=[])
        try:
            rel = self._rel(search)
        except _PathRefused as exc:
            return GrepResult(error=f"Path '{search}': invalid_path ({exc.reason})")
        try:
            kind = await self._stat_kind(rel)
            if kind is None:
                return GrepResult(matches=[])
            if kind == "file":
                files = [(rel, search)]
            elif kind == "directory":
                files = []
                base = self._abs(rel)
                for e in await self._walk(rel):
                    if e.kind != "file" or e.size > GREP_MAX_FILE_BYTES:
                        continue
                    if any(part in GREP_EXCLUDE_DIRS for part in e.rel.split("/")[:-1]):
                        continue
                    if matcher is not None and not matcher(e.rel):
                        continue
                    files.append((posixpath.join(rel, e.rel) if rel else e.rel, posixpath.join(base, e.rel)))
                files.sort(key=lambda f: f[1])
            else:
                return GrepResult(matches=[])
        except CapexecError as exc:
            return GrepResult(error=f"Error searching path '{search}': {exc}", matches=[])
        matches: list[GrepMatch] = []
        truncated = False
        errors: list[str] = []
        for file_rel, shown in files:
            try:
                raw = await self._fetch(file_rel)
            except CapexecError as exc:
                errors.append(f"{shown}: {exc.tag}")
                continue
            if b"\x00" in raw:
                continue  # binary, as grep -I
            for number, line in enumerate(raw.decode("utf-8", errors="replace").split("\n"), 1):
                if pattern in line:
                    if max_count is not None and len(matches) >= max_count:
                        truncated = True
                        break
                    matches.append({"path": shown, "line": number, "text": line})
            if truncated:
                break
        error = f"Some files could not be read: {', '.join(errors[:5])}" if errors else None
        return GrepResult(error=error, matches=matches, truncated=truncated)

    def grep(self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None) -> GrepResult:
        """Searches files for the literal `pattern`, line by line (paths absolute)."""
        return self._sync(lambda: self._agrep(pattern, path, glob, max_count))

    async def agrep(self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None) -> GrepResult:
        return await self._async(lambda: self._agrep(pattern, path, glob, max_count))

    # -- glob -------------------------------------------------------------

    async def _aglob(self, pattern: str, path: str | None) -> GlobResult:
        try:
            matcher = compile_grep_include_glob(pattern)
        except ValueError as exc:
            return GlobResult(error=str(exc), matches=None)
        search = path or self._root
        try:
            rel = self._rel(search)
        except _PathRefused as exc:
            return GlobResult(error=f"Path '{search}': invalid_path ({exc.reason})", matches=None)
        try:
            if await self._stat_kind(rel) != "directory":
                return GlobResult(matches=[])
            entries = await self._walk(rel)
        except CapexecError as exc:
            return GlobResult(error=f"Error globbing path '{search}': {exc}", matches=None)
        base = self._abs(rel)
        found: list[FileInfo] = []
        for e in entries:
            if e.kind != "file" or not matcher(e.rel):
                continue
            found.append({"path": posixpath.join(base, e.rel), "is_dir": False, "size": e.size, "modified_at": _iso(e.modified_ns)})
        found.sort(key=lambda i: i["path"])
        return GlobResult(matches=found)

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        """Regular files under `path` matching `pattern` (deepagents' glob contract), absolute."""
        return self._sync(lambda: self._aglob(pattern, path))

    async def aglob(self, pattern: str, path: str | None = None) -> GlobResult:
        return await self._async(lambda: self._aglob(pattern, path))

    # -- upload / download ------------------------------------------------

    async def _aupload(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        out: list[FileUploadResponse] = []
        for path, content in files:
            try:
                rel = self._rel(path)
                if not rel:
                    raise _PathRefused(path, "the sandbox root is a directory")
                await self._store(rel, content)
            except _PathRefused:
                out.append(FileUploadResponse(path=path, error=INVALID_PATH))
            except CapexecError as exc:
                out.append(FileUploadResponse(path=path, error=_file_error_code(exc)))
            else:
                out.append(FileUploadResponse(path=path, error=None))
        return out

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Writes each file (atomically, creating its parents); errors per file."""
        return self._sync(lambda: self._aupload(files))

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return await self._async(lambda: self._aupload(files))

    async def _adownload(self, paths: list[str]) -> list[FileDownloadResponse]:
        out: list[FileDownloadResponse] = []
        for path in paths:
            try:
                rel = self._rel(path)
                if not rel:
                    out.append(FileDownloadResponse(path=path, error=IS_DIRECTORY))
                    continue
                data = await self._fetch(rel)
            except _PathRefused:
                out.append(FileDownloadResponse(path=path, error=INVALID_PATH))
            except CapexecError as exc:
                out.append(FileDownloadResponse(path=path, error=_file_error_code(exc)))
            else:
                out.append(FileDownloadResponse(path=path, content=data, error=None))
        return out

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Reads each file whole; errors per file."""
        return self._sync(lambda: self._adownload(paths))

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return await self._async(lambda: self._adownload(paths))


def _read_window(text: str, offset: int, limit: int) -> ReadResult:
    """The `read` page of `text`: lines `offset`.. (at most `limit`), LF-ended, capped in size."""
    offset, limit = normalize_read_bounds(offset, limit)
    if text.strip() == "":
        return ReadResult(file_data=FileData(content=text, encoding="utf-8"))
    if limit == 0:
        return ReadResult(file_data=FileData(content="", encoding="utf-8"), no_lines_requested=True)
    lines = text.splitlines()
    total = len(lines)
    if offset >= total:
        return ReadResult(error=f"Line offset {offset} exceeds file length ({total} lines)")
    budget = MAX_TEXT_READ_BYTES - len(_READ_TRUNCATION_NOTE.encode("utf-8"))
    parts: list[str] = []
    used = 0
    cut = False
    for line in lines[offset : offset + limit]:
        piece = line if not parts else "\n" + line
        size = len(piece.encode("utf-8"))
        if used + size > budget:
            cut = True
            if not parts:
                parts.append(piece.encode("utf-8")[:budget].decode("utf-8", errors="ignore"))
            break
        parts.append(piece)
        used += size
    shown = len(parts)
    content = "".join(parts) + (_READ_TRUNCATION_NOTE if cut else "")
    end = offset + shown
    return ReadResult(
        file_data=FileData(content=content, encoding="utf-8"),
        total_lines=total,
        start_line=offset + 1,
        end_line=end,
        next_offset=end if end < total else None,
    )


def _kind_name(kind: FileKind) -> str:
    if kind in (FileKind.FILE, FileKind.DIRECTORY, FileKind.SYMLINK):
        return str(kind.value)
    return "other"


def _entry(e: DirEntry) -> _Entry:
    st = e.stat
    if st is None:  # gone before its stat, or unreadable: reported as "other"
        return _Entry(rel=e.path, kind="other", size=0, modified_ns=0)
    return _Entry(rel=e.path, kind=_kind_name(st.kind), size=st.size, modified_ns=st.modified_ns)
