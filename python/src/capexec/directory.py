"""Files on an executor's machine: a `Directory` and everything beneath it,
and nothing else (see the schema's `Directory`).

Every path is relative to the directory and resolved beneath it by the
server's kernel: an absolute path, ".." past the directory or a symlink
leading out fails with `OutsideDirectory`. Paths are `str` (or `bytes`, or
`os.PathLike`); the names the server reports are `str` decoded as the
`os` module decodes file names (`os.fsdecode`: bytes that are not UTF-8
survive as surrogates, and `os.fsencode` gives them back).

Listings, walks, watches and downloads are async iterators over the
server's pushes; each push is acknowledged only once it is in a small
queue here, so a consumer that stops reading holds the server back, and
memory stays bounded whatever the size. Uploads keep at most 1 MiB of
writes unanswered.
"""

from __future__ import annotations

import asyncio
import builtins
import enum
import os
from collections.abc import AsyncIterable, AsyncIterator, Callable, Generator, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, TypeVar, Union, cast

from . import _rpc, errors
from ._flow import Channel, ChannelClosed, Window
from ._schema import schema

_Answer = TypeVar("_Answer")

if TYPE_CHECKING:
    from .executor import Executor

PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
"""A path beneath a directory."""

UploadSource = Union[
    PathArg, IO[bytes], bytes, bytearray, memoryview, AsyncIterable[bytes], Iterable[bytes]
]
"""What `Directory.upload` reads: a local file (its path or an open binary
file), bytes, or an (async) iterable of bytes."""

DownloadTarget = Union[PathArg, IO[bytes]]
"""Where `Directory.download` writes: a local file's path or an open binary
file."""

MAX_ONE_SHOT_BYTES = 4 * 1024 * 1024
"""What one `readFile` or `writeFile` carries at most; more goes through
`download` and `upload`."""

CHUNK_BYTES = 256 * 1024
"""An upload's write (the server's download chunks are at most this)."""

WINDOW_BYTES = 1024 * 1024
"""An upload's writes unanswered at once."""

BUFFERED_BATCHES = 2
"""Batches (of up to 1,024 entries, or download chunks of up to 256 KiB)
received and not consumed yet: past that, the sink's call waits, which
holds the server back."""

BUFFERED_CHUNKS = 4
"""A download's chunks received and not consumed yet; a watch's batches."""


def _path(path: PathArg) -> bytes:
    return os.fsencode(path)


class FileKind(enum.Enum):
    """What a file system entry is (the schema's `FileKind`)."""

    UNKNOWN = "unknown"
    FILE = "file"
    DIRECTORY = "directory"
    SYMLINK = "symlink"
    FIFO = "fifo"
    SOCKET = "socket"
    CHAR_DEVICE = "charDevice"
    BLOCK_DEVICE = "blockDevice"


@dataclass(frozen=True)
class FileStat:
    """What a path is (the schema's `FileStat`). Times are nanoseconds
    since the Unix epoch; `version` is opaque, for `if_version`."""

    kind: FileKind
    size: int
    permissions: int
    modified_ns: int
    accessed_ns: int
    changed_ns: int
    uid: int
    gid: int
    links: int
    inode: int
    device: int
    version: bytes

    @property
    def is_file(self) -> bool:
        return self.kind is FileKind.FILE

    @property
    def is_dir(self) -> bool:
        return self.kind is FileKind.DIRECTORY

    @property
    def is_symlink(self) -> bool:
        return self.kind is FileKind.SYMLINK

    @classmethod
    def _from_wire(cls, stat: Any) -> FileStat:
        # `_get` reads a field without the attribute machinery: a listing
        # converts a dozen fields of each of its entries.
        get = stat._get
        return cls(
            _kind(get("kind")),
            get("size"),
            get("permissions"),
            get("modifiedNs"),
            get("accessedNs"),
            get("changedNs"),
            get("uid"),
            get("gid"),
            get("links"),
            get("inode"),
            get("device"),
            get("version"),
        )


_KINDS = {kind.value: kind for kind in FileKind}


def _kind(kind: Any) -> FileKind:
    # A kind added after this client: what it is, is unknown here.
    return _KINDS.get(str(kind), FileKind.UNKNOWN)


@dataclass(frozen=True)
class DirEntry:
    """One entry of a listing or a walk (the schema's `DirEntry`): `path`
    is the name (`list`) or the path relative to the walked directory
    (`walk`); `stat` describes the entry itself (a symlink not followed)
    and is None when `error` says why it could not be had."""

    path: str
    stat: FileStat | None
    link_target: str | None
    error: str | None

    @property
    def name(self) -> str:
        """The last component of `path`."""
        return self.path.rsplit("/", 1)[-1]

    @classmethod
    def _from_wire(cls, entry: Any) -> DirEntry:
        get, has = entry._get, entry._has
        error = get("error")
        return cls(
            os.fsdecode(get("path")),
            FileStat._from_wire(get("stat")) if has("stat") else None,
            os.fsdecode(get("linkTarget")) if has("linkTarget") else None,
            str(error) if error else None,
        )


class WatchEventKind(enum.Enum):
    """What changed (the schema's `WatchEventKind`)."""

    CREATED = "created"
    MODIFIED = "modified"
    REMOVED = "removed"
    RENAMED = "renamed"
    ATTRIBUTES = "attributes"
    OVERFLOW = "overflow"
    """Events were lost: look again (`list`, `walk`)."""
    GONE = "gone"
    """The watched directory was removed or moved away: the last event."""


@dataclass(frozen=True)
class WatchEvent:
    """One change beneath a watched directory; paths are relative to it
    ("" for the directory itself), `to_path` the new path of a rename."""

    kind: WatchEventKind
    path: str
    to_path: str | None
    is_directory: bool

    @classmethod
    def _from_wire(cls, event: Any) -> WatchEvent:
        kind = str(event.kind)
        try:
            parsed = WatchEventKind(kind)
        except ValueError:
            # A kind added after this client: the safe reading is "look
            # again".
            parsed = WatchEventKind.OVERFLOW
        return cls(
            kind=parsed,
            path=os.fsdecode(bytes(event.path)),
            to_path=os.fsdecode(bytes(event.toPath)) if event._has("toPath") else None,
            is_directory=bool(event.isDirectory),
        )


@dataclass(frozen=True)
class SearchMatch:
    """A line with a match (`Directory.search`): its file, relative to the
    searched directory; its number (1 for the first) and whole length in
    bytes; `text`, the line (or, for a line longer than 512 bytes, the 512
    bytes around the match, starting at `text_offset` in the line); and the
    match, bytes `match_start` .. `match_end` of the line."""

    path: str
    line_number: int
    line_bytes: int
    text: bytes
    text_offset: int
    match_start: int
    match_end: int

    @property
    def line(self) -> str:
        """`text` decoded as UTF-8 (invalid bytes replaced)."""
        return self.text.decode("utf-8", "replace")


@dataclass(frozen=True)
class SearchResult:
    """What `Directory.search` found: the matching lines in the order
    found, how many files it read, skipped (binary, too large) or could
    not read (`first_error` says why the first), and whether
    `max_matches` cut it short."""

    matches: list[SearchMatch]
    files_searched: int
    binary_skipped: int
    too_large_skipped: int
    unreadable: int
    first_error: str | None
    truncated: bool


@dataclass(frozen=True)
class DirectoryInfo:
    """Where a directory is on the server's machine (its absolute path as
    the kernel names it now) and whether this capability is read-only."""

    path: str
    read_only: bool


@dataclass(frozen=True)
class WalkSummary:
    """What the server answered once a listing or walk ended: how many
    entries it pushed, and whether `max_entries` cut the walk short."""

    entries: int
    truncated: bool


def _write_options(
    *,
    if_version: bytes | None,
    mode: int | None,
    new_file_mode: int | None,
    exclusive: bool,
    must_exist: bool,
    create_parents: bool,
    in_place: bool,
    sync: bool,
    modified_ns: int | None,
) -> dict[str, Any]:
    if mode is not None and new_file_mode is not None:
        raise ValueError("give mode or new_file_mode, not both")
    options: dict[str, Any] = {
        "exclusive": exclusive,
        "mustExist": must_exist,
        "inPlace": in_place,
        "createParents": create_parents,
        "sync": sync,
    }
    if if_version is not None:
        if not if_version:
            raise ValueError("if_version is empty: give a FileStat.version")
        options["ifVersion"] = bytes(if_version)
    if mode is not None:
        options["permissions"] = {"set": mode}
    elif new_file_mode is not None:
        options["permissions"] = {"newFile": new_file_mode}
    if modified_ns is not None:
        options["modified"] = {"at": modified_ns}
    return options


class Directory:
    """A directory on an executor's machine (see the module's doc).

    Get one from `Executor.directory(path)`; narrow it with
    `subdirectory`, attenuate it with `read_only`. Those three are
    pipelined: they cost no round trip, and a missing directory makes the
    first call on it fail.
    """

    def __init__(self, client: Any, *, _owner: _rpc.Owner | None = None) -> None:
        self._client = client
        # What must live as long as this directory (its connection).
        self._owner = _owner

    @classmethod
    def _open(
        cls, executor_client: Any, path: PathArg, owner: _rpc.Owner | None = None
    ) -> Directory:
        """Directory `path` of the executor `executor_client` (pipelined)."""
        return cls(executor_client.directory(path=_path(path)).dir, _owner=owner)

    @property
    def client(self) -> Any:
        """The pycapnp `Directory` client, for calls this class lacks.
        Disconnected once its connection was closed."""
        _rpc.check_open(self._owner)
        return self._client

    async def _call(self, promise: Any) -> Any:
        return await _rpc.call(promise, self._owner)

    # -- capabilities derived from this one (pipelined) ---------------------

    def subdirectory(self, path: PathArg) -> Directory:
        """Directory `path` beneath this one, confined to it."""
        return Directory(self.client.subdirectory(path=_path(path)).dir, _owner=self._owner)

    def read_only(self) -> Directory:
        """The same directory, read-only, and so is everything derived
        from it: writes fail with `Forbidden`."""
        return Directory(self.client.readOnly().dir, _owner=self._owner)

    def executor(self) -> Executor:
        """An executor whose processes run in this directory, may write
        only there and have no network (see the schema's
        `Directory.executor`)."""
        from .executor import Executor

        return Executor._from_client(self.client.executor().executor, self._owner)

    async def info(self) -> DirectoryInfo:
        info = (await self._call(self.client.info())).info
        return DirectoryInfo(path=os.fsdecode(bytes(info.path)), read_only=bool(info.readOnly))

    # -- metadata -----------------------------------------------------------

    async def stat(self, path: PathArg = "", *, follow_symlinks: bool = True) -> FileStat:
        """What `path` is; a final symlink is followed (within the
        directory) unless `follow_symlinks` is false."""
        response = await self._call(self.client.stat(path=_path(path), noFollow=not follow_symlinks))
        return FileStat._from_wire(response.stat)

    async def exists(self, path: PathArg) -> bool:
        """Whether `path` exists (a dangling symlink does not)."""
        try:
            await self.stat(path)
        except errors.NotFound:
            return False
        return True

    # -- whole files --------------------------------------------------------

    async def read_range(
        self, path: PathArg, offset: int = 0, length: int = 0
    ) -> tuple[bytes, FileStat]:
        """Bytes `offset` .. `offset + length` of file `path` (`length` 0:
        to the end), at most 4 MiB, and the file's stat as it was read
        (whose `version` a later `write_bytes(if_version=...)` names)."""
        response = await self._call(
            self.client.readFile(path=_path(path), offset=offset, length=length)
        )
        return bytes(response.data), FileStat._from_wire(response.stat)

    async def read_bytes(self, path: PathArg) -> bytes:
        """The whole content of file `path`, of any size (one call up to
        4 MiB, a download past that)."""
        try:
            data, _ = await self.read_range(path)
            return data
        except errors.TooLarge:
            content = bytearray()
            async for chunk in self.download_iter(path):
                content += chunk
            return bytes(content)

    async def read_text(
        self, path: PathArg, encoding: str = "utf-8", errors: str = "strict"
    ) -> str:
        return (await self.read_bytes(path)).decode(encoding, errors)

    async def write_bytes(
        self,
        path: PathArg,
        data: bytes | bytearray | memoryview,
        *,
        if_version: bytes | None = None,
        mode: int | None = None,
        new_file_mode: int | None = None,
        exclusive: bool = False,
        must_exist: bool = False,
        create_parents: bool = False,
        in_place: bool = False,
        sync: bool = False,
        modified_ns: int | None = None,
    ) -> FileStat:
        """Makes `data` the content of file `path`, atomically (readers see
        the old content or the new, never a mix), and answers the new
        file's stat. Data of any size (an upload past 4 MiB).

        `if_version`: write only over that `FileStat.version`, else
        `Conflict` (a missing file is a conflict too). `mode`: the file's
        permission bits (else a replaced file keeps its own, a new one gets
        0o666 less the umask); `new_file_mode`: those of a new file only.
        `exclusive`: `Exists` if the target exists; `must_exist`:
        `NotFound` unless it does. `create_parents`: missing parent
        directories too. `in_place`: not atomic, into the existing inode.
        `sync`: on stable storage before answering. `modified_ns`: the new
        file's modification time."""
        options = _write_options(
            if_version=if_version,
            mode=mode,
            new_file_mode=new_file_mode,
            exclusive=exclusive,
            must_exist=must_exist,
            create_parents=create_parents,
            in_place=in_place,
            sync=sync,
            modified_ns=modified_ns,
        )
        data = bytes(data)
        if len(data) > MAX_ONE_SHOT_BYTES:
            return await self._upload(path, _chunks_of(data), options, len(data))
        response = await self._call(
            self.client.writeFile(path=_path(path), data=data, options=options)
        )
        return FileStat._from_wire(response.stat)

    async def write_text(
        self,
        path: PathArg,
        text: str,
        encoding: str = "utf-8",
        *,
        if_version: bytes | None = None,
        mode: int | None = None,
        exclusive: bool = False,
        create_parents: bool = False,
    ) -> FileStat:
        return await self.write_bytes(
            path,
            text.encode(encoding),
            if_version=if_version,
            mode=mode,
            exclusive=exclusive,
            create_parents=create_parents,
        )

    # -- streams ------------------------------------------------------------

    async def upload(
        self,
        path: PathArg,
        source: UploadSource,
        *,
        size: int | None = None,
        if_version: bytes | None = None,
        mode: int | None = None,
        new_file_mode: int | None = None,
        exclusive: bool = False,
        must_exist: bool = False,
        create_parents: bool = False,
        in_place: bool = False,
        sync: bool = False,
        modified_ns: int | None = None,
    ) -> FileStat:
        """Streams `source` into file `path` and commits it when `source`
        ends: nothing is visible before, and nothing is left behind if
        anything fails (unless `in_place`). `source` is a local file's
        path, an open binary file, bytes, or an (async) iterable of bytes;
        it is sent in writes of at most 256 KiB, with at most 1 MiB
        unanswered. `size`, when given (or known: bytes, a local path),
        is checked by the server. The options are `write_bytes`'s."""
        options = _write_options(
            if_version=if_version,
            mode=mode,
            new_file_mode=new_file_mode,
            exclusive=exclusive,
            must_exist=must_exist,
            create_parents=create_parents,
            in_place=in_place,
            sync=sync,
            modified_ns=modified_ns,
        )
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
            return await self._upload(path, _chunks_of(data), options, len(data))
        if isinstance(source, (str, os.PathLike)):
            with open(source, "rb") as file:
                known = size if size is not None else os.fstat(file.fileno()).st_size
                return await self._upload(path, _chunks_of_file(file), options, known)
        if hasattr(source, "read"):
            readable = cast(IO[bytes], source)
            return await self._upload(path, _chunks_of_file(readable), options, size)
        if isinstance(source, AsyncIterable):
            return await self._upload(path, _rechunked(source), options, size)
        if isinstance(source, Iterable):
            return await self._upload(path, _rechunked(_aiter_of(source)), options, size)
        raise TypeError(f"cannot upload from {type(source).__name__}")

    async def _upload(
        self,
        path: PathArg,
        chunks: AsyncIterator[bytes],
        options: dict[str, Any],
        size: int | None,
    ) -> FileStat:
        call = self.client.upload(
            path=_path(path),
            options=options,
            size=size if size is not None else 0,
            sizeKnown=size is not None,
        )
        sink = call.sink
        window = Window(WINDOW_BYTES)
        pushed: Exception | None = None
        try:
            async for chunk in chunks:
                await window.room(len(chunk))
                window.add(sink.write(data=chunk), len(chunk))
            await window.drain()
        except Exception as error:
            pushed = error
        finally:
            window.cancel()
        # The upload's own refusal says more than a write's echo of it.
        await self._call(call)
        if pushed is not None:
            raise await _rpc.translated(pushed, self._owner) from None
        response = await self._call(sink.done())
        return FileStat._from_wire(response.stat)

    def download_iter(self, path: PathArg, *, offset: int = 0, length: int = 0) -> Download:
        """The bytes of file `path` (`offset` .. `offset + length`;
        `length` 0: to the end) as an async iterator of chunks of at most
        256 KiB. The server sends the next chunks only as these are
        consumed; leaving the loop early stops the download."""
        return Download(self.client, _path(path), offset, length, self._owner)

    async def download(
        self,
        path: PathArg,
        target: DownloadTarget,
        *,
        offset: int = 0,
        length: int = 0,
    ) -> int:
        """Writes the content of file `path` (or `offset` .. `offset +
        length`) into `target`, a local path (created or truncated;
        removed again if the download fails) or an open binary file, and
        answers the number of bytes."""
        stream = self.download_iter(path, offset=offset, length=length)
        # Written off the event loop, as uploads read: a slow disk must not
        # hold back every other call of the connection.
        if hasattr(target, "write"):
            written = 0
            async for chunk in stream:
                await asyncio.to_thread(target.write, chunk)
                written += len(chunk)
            return written
        local = os.fspath(target)
        try:
            with open(local, "wb") as file:
                written = 0
                async for chunk in stream:
                    await asyncio.to_thread(file.write, chunk)
                    written += len(chunk)
                return written
        except BaseException:
            try:
                os.unlink(local)
            except OSError:
                pass
            raise

    # -- listings -----------------------------------------------------------

    def list(self, path: PathArg = "") -> EntryStream:
        """The entries of directory `path` (not "." and ".."), in the
        order the file system gives them, each with its stat (symlinks not
        followed): `async for entry in d.list("src")`."""
        p = _path(path)
        return EntryStream(
            lambda sink: self.client.list(path=p, sink=sink), walk=False, owner=self._owner
        )

    def walk(
        self,
        path: PathArg = "",
        *,
        max_depth: int = 0,
        max_entries: int = 0,
        include: Iterable[PathArg] = (),
        exclude: Iterable[PathArg] = (),
    ) -> EntryStream:
        """Every entry beneath directory `path`, depth first, paths
        relative to it. `max_depth` 1: its entries only (0: the server's
        limit); `max_entries`: stop after that many (the stream's
        `summary.truncated`); `include` and `exclude`: glob patterns
        (`*`, `**`, `?`, `[...]`, `{a,b}`) on the relative path.
        Symlinks are reported, never followed; a directory that cannot
        be read comes with its `error`, and the walk goes on."""
        p = _path(path)
        options = {
            "maxDepth": max_depth,
            "maxEntries": max_entries,
            "include": [_path(pattern) for pattern in include],
            "exclude": [_path(pattern) for pattern in exclude],
        }
        return EntryStream(
            lambda sink: self.client.walk(path=p, options=options, sink=sink),
            walk=True,
            owner=self._owner,
        )

    def watch(self, path: PathArg = "", *, recursive: bool = False) -> Watch:
        """Changes beneath directory `path` from when the watch is in
        place: `async with d.watch("") as changes: async for event in
        changes: ...` (or `changes = await d.watch("")`, then
        `await changes.close()`). Events come coalesced, in order; an
        `OVERFLOW` event says some were lost (look again), `GONE` that the
        directory went away (the last event: the iteration ends)."""
        return Watch(self.client, _path(path), recursive, self._owner)

    # -- many small files in one call ---------------------------------------

    async def read_many(
        self, paths: Iterable[PathArg]
    ) -> builtins.list[tuple[bytes, FileStat] | errors.CapexecError]:
        """Many small files read whole in one call (at most 1,024 paths,
        and 4 MiB of data in all, past which a file fails alone with
        `TooLarge`): each file's content and stat, or its error, in the
        order given. A server from before `readFiles` gets one pipelined
        call per file."""
        wire = [_path(path) for path in paths]
        try:
            response = await self._call(self.client.readFiles(paths=wire))
        except errors.Unimplemented:
            return list(
                await asyncio.gather(
                    *(self._read_one(path) for path in wire), return_exceptions=False
                )
            )
        outcomes = response.outcomes
        _one_outcome_each("readFiles", len(outcomes), len(wire))
        results: builtins.list[tuple[bytes, FileStat] | errors.CapexecError] = []
        for outcome in outcomes:
            if outcome.which() == "failure":
                results.append(_outcome_failure(str(outcome.failure)))
            else:
                results.append((bytes(outcome.file.data), FileStat._from_wire(outcome.file.stat)))
        return results

    async def _read_one(self, path: bytes) -> tuple[bytes, FileStat] | errors.CapexecError:
        try:
            return await self.read_range(path)
        except errors.RefusalError as error:
            return error

    async def write_many(
        self,
        files: Iterable[tuple[PathArg, bytes | bytearray | memoryview]],
        *,
        mode: int | None = None,
        new_file_mode: int | None = None,
        exclusive: bool = False,
        must_exist: bool = False,
        create_parents: bool = False,
        sync: bool = False,
    ) -> builtins.list[FileStat | errors.CapexecError]:
        """Many small files written in one call (at most 1,024 files and
        4 MiB in all, else `LimitReached` and nothing is written), each
        atomically as `write_bytes` writes it, with the options given, in
        order: the new stat of each, or its error (a file that fails does
        not stop the others). A server from before `writeFiles` gets one
        pipelined call per file."""
        options = _write_options(
            if_version=None,
            mode=mode,
            new_file_mode=new_file_mode,
            exclusive=exclusive,
            must_exist=must_exist,
            create_parents=create_parents,
            in_place=False,
            sync=sync,
            modified_ns=None,
        )
        wire = [
            {"path": _path(path), "data": bytes(data), "options": options} for path, data in files
        ]
        try:
            response = await self._call(self.client.writeFiles(files=wire))
        except errors.Unimplemented:
            return list(await asyncio.gather(*(self._write_one(file) for file in wire)))
        outcomes = response.outcomes
        _one_outcome_each("writeFiles", len(outcomes), len(wire))
        results: builtins.list[FileStat | errors.CapexecError] = []
        for outcome in outcomes:
            if outcome.which() == "failure":
                results.append(_outcome_failure(str(outcome.failure)))
            else:
                results.append(FileStat._from_wire(outcome.stat))
        return results

    async def _write_one(self, file: dict[str, Any]) -> FileStat | errors.CapexecError:
        try:
            response = await self._call(self.client.writeFile(**file))
            return FileStat._from_wire(response.stat)
        except errors.RefusalError as error:
            return error

    async def search(
        self,
        pattern: str,
        path: PathArg = "",
        *,
        case_insensitive: bool = False,
        max_depth: int = 0,
        include: Iterable[PathArg] = (),
        exclude: Iterable[PathArg] = (),
        max_matches: int = 0,
        max_file_bytes: int = 0,
    ) -> SearchResult:
        """Lines matching the regular expression `pattern` (the Rust
        `regex` crate's syntax) in the regular files beneath directory
        `path`, searched on the server: only matching lines cross the
        connection. `max_depth`, `include` and `exclude` as `walk`'s;
        `max_matches` (0: 1,000) stops the search (`truncated`); files
        larger than `max_file_bytes` (0: 4 MiB) and binary files are
        skipped. A malformed pattern or glob raises `InvalidArgument`."""
        options = {
            "pattern": pattern,
            "caseInsensitive": case_insensitive,
            "maxDepth": max_depth,
            "include": [_path(glob) for glob in include],
            "exclude": [_path(glob) for glob in exclude],
            "maxMatches": max_matches,
            "maxFileBytes": max_file_bytes,
        }
        try:
            response = await self._call(self.client.search(path=_path(path), options=options))
        except errors.Unimplemented:
            raise errors.Unsupported(
                "the server is too old to search files (it does not implement Directory.search)"
            ) from None
        result = response.result
        first_error = str(result.firstError)
        return SearchResult(
            matches=[
                SearchMatch(
                    path=os.fsdecode(bytes(match.path)),
                    line_number=int(match.lineNumber),
                    line_bytes=int(match.lineBytes),
                    text=bytes(match.text),
                    text_offset=int(match.textOffset),
                    match_start=int(match.matchStart),
                    match_end=int(match.matchEnd),
                )
                for match in result.matches
            ],
            files_searched=int(result.filesSearched),
            binary_skipped=int(result.binarySkipped),
            too_large_skipped=int(result.tooLargeSkipped),
            unreadable=int(result.unreadable),
            first_error=first_error or None,
            truncated=bool(result.truncated),
        )

    # -- changes ------------------------------------------------------------

    async def mkdir(self, path: PathArg, *, recursive: bool = False, mode: int = 0o777) -> None:
        """Creates directory `path` (`mode` less the server's umask).
        `recursive`: its missing parents too, and an existing directory is
        no error (mkdir -p); else `Exists` if it exists."""
        await self._call(self.client.mkdir(path=_path(path), recursive=recursive, mode=mode))

    async def remove(
        self, path: PathArg, *, recursive: bool = False, missing_ok: bool = False
    ) -> int:
        """Removes a file, a symlink or an empty directory (`recursive`: a
        directory and everything in it; `NotEmpty` without); answers how
        many entries went. `missing_ok`: a missing path removes 0."""
        response = await self._call(
            self.client.remove(path=_path(path), recursive=recursive, missingOk=missing_ok)
        )
        return int(response.removed)

    async def rename(self, source: PathArg, target: PathArg, *, no_replace: bool = False) -> None:
        """Renames atomically, replacing `target` unless `no_replace`
        (`Exists`)."""
        await self._call(
            self.client.rename(**{"from": _path(source), "to": _path(target)}, noReplace=no_replace)
        )

    async def copy(
        self,
        source: PathArg,
        target: PathArg,
        *,
        recursive: bool = False,
        no_replace: bool = False,
        preserve: bool = False,
    ) -> int:
        """Copies on the server (no data crosses the connection): a file,
        or with `recursive` a tree, to `target` (the copy's own name).
        Answers how many entries were copied."""
        response = await self._call(
            self.client.copy(
                **{"from": _path(source), "to": _path(target)},
                options={"recursive": recursive, "noReplace": no_replace, "preserve": preserve},
            )
        )
        return int(response.copied)

    async def symlink(self, target: PathArg, path: PathArg) -> None:
        """Creates symlink `path` pointing to `target`, stored as given."""
        await self._call(self.client.symlink(target=_path(target), path=_path(path)))

    async def readlink(self, path: PathArg) -> str:
        response = await self._call(self.client.readlink(path=_path(path)))
        return os.fsdecode(bytes(response.target))

    async def chmod(self, path: PathArg, mode: int) -> None:
        """Sets the permission bits (0o7777) of `path`."""
        await self._call(self.client.setPermissions(path=_path(path), mode=mode))

    async def set_times(self, path: PathArg, accessed_ns: int, modified_ns: int) -> None:
        """Sets the access and modification times (ns since the epoch)."""
        await self._call(
            self.client.setTimes(path=_path(path), accessedNs=accessed_ns, modifiedNs=modified_ns)
        )

    async def canonicalize(self, path: PathArg) -> str:
        """`path` with ".", ".." and symlinks resolved, relative to this
        directory ("" for the directory itself)."""
        response = await self._call(self.client.canonicalize(path=_path(path)))
        return os.fsdecode(bytes(response.path))


def _one_outcome_each(method: str, outcomes: int, files: int) -> None:
    """A batch's answer has an outcome for each file it carried."""
    if outcomes != files:
        raise errors.RemoteError(f"{method} answered {outcomes} outcomes for {files} files")


def _outcome_failure(text: str) -> errors.CapexecError:
    """The error of one file of a batch, as its own call would have
    raised it."""
    for code, cls in errors.REFUSALS.items():
        if f"[capexec:{code}]" in text:
            return cls(errors.human_description(text))
    return errors.RemoteError(errors.human_description(text))


# -- chunking ----------------------------------------------------------------


async def _chunks_of(data: bytes) -> AsyncIterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(data), CHUNK_BYTES):
        yield bytes(view[start : start + CHUNK_BYTES])


async def _chunks_of_file(file: IO[bytes]) -> AsyncIterator[bytes]:
    # Read off the event loop: a slow disk or a pipe must not hold back
    # every other call of the connection.
    while True:
        chunk = await asyncio.to_thread(file.read, CHUNK_BYTES)
        if not chunk:
            return
        yield bytes(chunk)


async def _aiter_of(items: Iterable[bytes]) -> AsyncIterator[bytes]:
    for item in items:
        yield item


async def _rechunked(source: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """`source`'s bytes in chunks of at most 256 KiB, small ones gathered."""
    pending = bytearray()
    async for piece in source:
        if not isinstance(piece, (bytes, bytearray, memoryview)):
            raise TypeError(f"an upload's iterable gave {type(piece).__name__}, not bytes")
        pending += piece
        while len(pending) >= CHUNK_BYTES:
            yield bytes(pending[:CHUNK_BYTES])
            del pending[:CHUNK_BYTES]
    if pending:
        yield bytes(pending)


# -- streams over sinks --------------------------------------------------------


class _EntrySink(schema.EntrySink.Server):  # type: ignore[misc]
    """Receives a listing's batches; each push is answered once its batch
    is queued."""

    def __init__(self, batches: Channel[Any]) -> None:
        self._batches = batches

    async def push(self, entries: Any, _context: Any, **_: Any) -> None:
        try:
            # Copied out (the message is not ours once the call returns),
            # once there is room for it: a copy of the message, made in one
            # go; its entries become `DirEntry`s one by one as they are
            # consumed, so a listing left early costs little here.
            await self._batches.put(lambda: _context.params.as_builder().entries)
        except ChannelClosed:
            raise RuntimeError("the listing was dropped") from None


class EntryStream:
    """The entries of a listing or a walk, as an async iterator. It ends
    after the last entry or with the call's error; `summary` then tells
    how many entries there were and whether the walk was truncated.
    Leaving the loop early (or `aclose`) stops the server's listing."""

    def __init__(self, call: Any, *, walk: bool, owner: _rpc.Owner | None = None) -> None:
        self._call = call
        self._owner = owner
        self._walk = walk
        # Each batch a list of the schema's DirEntry, in a message copied
        # out of the push.
        self._batches: Channel[Any] = Channel(BUFFERED_BATCHES)
        self._batch: Any = None
        self._index = 0
        self._count = 0
        self._task: Any = None
        self.summary: WalkSummary | None = None

    def __aiter__(self) -> EntryStream:
        return self

    def _start(self) -> None:
        batches = self._batches
        promise = self._call(_EntrySink(batches))
        self._call = None
        walk = self._walk
        self._task = _answered_into(
            batches,
            promise,
            self._owner,
            lambda response: WalkSummary(
                entries=int(response.entries),
                truncated=bool(response.truncated) if walk else False,
            ),
        )

    async def __anext__(self) -> DirEntry:
        if self._task is None:
            if self._call is None:
                raise StopAsyncIteration
            self._start()
        while self._index >= self._count:
            try:
                self._batch = await self._batches.get()
            except StopAsyncIteration:
                self._batch = None
                task = self._task
                if task is not None and task.done() and not task.cancelled():
                    if task.exception() is None:
                        self.summary = task.result()
                raise
            self._index, self._count = 0, len(self._batch)
        entry = DirEntry._from_wire(self._batch[self._index])
        self._index += 1
        return entry

    async def collect(self) -> list[DirEntry]:
        """Every entry, or the first error."""
        return [entry async for entry in self]

    async def aclose(self) -> None:
        """Stops the listing (the server's next push fails)."""
        self._close()

    def _close(self) -> None:
        self._call = None
        self._batches.close()
        self._batch = None
        self._index = self._count = 0

    def __del__(self) -> None:
        self._batches.close()


def _answered_into(
    channel: Channel[Any],
    promise: Any,
    owner: _rpc.Owner | None,
    convert: Callable[[Any], _Answer],
) -> asyncio.Future[_Answer]:
    """The answer to a call that pushes into `channel` (a listing, a
    download), converted, as a task; the channel ends when the call is
    answered, with the call's error if it failed, so the consumer sees
    every pushed item first and then the end or the error."""

    async def answered() -> _Answer:
        try:
            response = await _rpc.call(promise, owner)
        except BaseException as error:
            channel.end(error)
            raise
        result = convert(response)
        channel.end()
        return result

    task = asyncio.ensure_future(answered())
    # Its error reaches the consumer through the channel.
    task.add_done_callback(_consume_error)
    return task


def _consume_error(task: Any) -> None:
    if not task.cancelled():
        task.exception()


class _ByteSink(schema.ByteSink.Server):  # type: ignore[misc]
    def __init__(self, chunks: Channel[bytes]) -> None:
        self._chunks = chunks

    async def write(self, data: bytes, **_: Any) -> None:
        try:
            await self._chunks.put(lambda: data)
        except ChannelClosed:
            raise RuntimeError("the download's receiver went away") from None


class Download:
    """A download's chunks, as an async iterator (see
    `Directory.download_iter`); once it has ended, `size` and `stat` are
    the server's answer (the file as it was opened)."""

    def __init__(
        self, client: Any, path: bytes, offset: int, length: int, owner: _rpc.Owner | None
    ) -> None:
        self._client = client
        self._owner = owner
        self._path = path
        self._offset = offset
        self._length = length
        self._chunks: Channel[bytes] = Channel(BUFFERED_CHUNKS)
        self._task: Any = None
        self._received = 0
        self.size: int | None = None
        self.stat: FileStat | None = None

    def __aiter__(self) -> Download:
        return self

    def _start(self) -> None:
        chunks = self._chunks
        promise = self._client.download(
            path=self._path, offset=self._offset, length=self._length, sink=_ByteSink(chunks)
        )
        self._client = None
        self._task = _answered_into(
            chunks,
            promise,
            self._owner,
            lambda response: (int(response.size), FileStat._from_wire(response.stat)),
        )

    async def __anext__(self) -> bytes:
        if self._task is None:
            if self._client is None:
                raise StopAsyncIteration
            self._start()
        try:
            chunk = await self._chunks.get()
        except StopAsyncIteration:
            task = self._task
            if task is not None and task.done() and not task.cancelled() and task.exception() is None:
                size, stat = task.result()
                if size != self._received:
                    raise errors.RemoteError(
                        f"the download announced {size} bytes and delivered {self._received}"
                    ) from None
                self.size, self.stat = size, stat
            raise
        self._received += len(chunk)
        return chunk

    async def aclose(self) -> None:
        """Stops the download (the server's next write fails)."""
        self._client = None
        self._chunks.close()

    def __del__(self) -> None:
        self._chunks.close()


class _WatchSink(schema.WatchSink.Server):  # type: ignore[misc]
    def __init__(self, events: Channel[list[WatchEvent]]) -> None:
        self._events = events

    async def push(self, events: Any, **_: Any) -> None:
        batch: list[WatchEvent] = []

        def converted() -> list[WatchEvent]:
            batch.extend(WatchEvent._from_wire(event) for event in events)
            return batch

        try:
            await self._events.put(converted)
        except ChannelClosed:
            raise RuntimeError("the watch was closed") from None
        if any(event.kind is WatchEventKind.GONE for event in batch):
            self._events.end()

    def __del__(self) -> None:
        # Released by the server: after `gone` (ended already), or because
        # the connection broke.
        self._events.end(errors.Disconnected("the watch ended: the connection to the server was lost"))


class Watch:
    """Changes beneath a watched directory (see `Directory.watch`): an
    async iterator of `WatchEvent`s, usable as `async with` (which puts
    the watch in place and ends it) or awaited (then `close()` ends it)."""

    def __init__(
        self, client: Any, path: bytes, recursive: bool, owner: _rpc.Owner | None
    ) -> None:
        self._client = client
        self._owner = owner
        self._path = path
        self._recursive = recursive
        self._events: Channel[list[WatchEvent]] = Channel(BUFFERED_CHUNKS)
        self._pending: list[WatchEvent] = []
        self._watch: Any = None
        self._started = False

    async def _start(self) -> Watch:
        if self._started:
            raise RuntimeError("this watch was started already")
        self._started = True
        response = await _rpc.call(
            self._client.watch(
                path=self._path,
                options={"recursive": self._recursive},
                sink=_WatchSink(self._events),
            ),
            self._owner,
        )
        self._watch = _rpc.detach(response.watch)
        self._client = None
        return self

    def __await__(self) -> Generator[Any, None, Watch]:
        return self._start().__await__()

    async def __aenter__(self) -> Watch:
        return await self._start()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> WatchEvent:
        if not self._started:
            await self._start()
        while not self._pending:
            self._pending = list(reversed(await self._events.get()))
        return self._pending.pop()

    async def next_batch(self) -> list[WatchEvent]:
        """The next batch as the server pushed it (`StopAsyncIteration`
        after the last)."""
        if self._pending:
            batch, self._pending = list(reversed(self._pending)), []
            return batch
        return await self._events.get()

    async def close(self) -> None:
        """Ends the watch (releases it on the server)."""
        self._watch = None
        self._events.close()

    def __del__(self) -> None:
        self._events.close()
