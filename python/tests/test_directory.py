"""Directory against a real server, over every transport the `connection`
fixture offers. The server runs on this machine, so each test opens its
own temporary directory through the protocol and checks what the protocol
did with the local file system too."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import sys
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import TypeVar

import pytest

import capexec
from capexec import errors
from capexec.directory import (
    DirEntry,
    Directory,
    FileKind,
    WatchEvent,
    WatchEventKind,
)
from capexec_servers import Server, isolated_env

T = TypeVar("T")

MiB = 1024 * 1024

# Every byte value, NULs included, and a tail that is not a multiple of
# anything.
BINARY = bytes(range(256)) * 1024 + b"\x00\x00end\x00"


async def within(awaitable: Awaitable[T], seconds: float = 60) -> T:
    return await asyncio.wait_for(awaitable, seconds)


def pattern(size: int, seed: int = 0) -> bytes:
    """`size` bytes that differ at every offset modulo a large prime, so a
    chunk dropped, doubled or shifted shows."""
    block = hashlib.sha256(str(seed).encode()).digest() * 4099
    return (block * (size // len(block) + 1))[:size]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The local path of the test's directory (beside what other fixtures
    keep in `tmp_path`)."""
    path = tmp_path / "files"
    path.mkdir()
    return path


@pytest.fixture
async def directory(connection: capexec.Connection, root: Path) -> Directory:
    # Pipelined: it needs the running loop, not a round trip.
    return connection.executor.directory(str(root))


async def test_binary_round_trip_exact(directory: Directory, root: Path) -> None:
    stat = await directory.write_bytes("data.bin", BINARY)
    assert stat.kind is FileKind.FILE
    assert stat.size == len(BINARY)
    assert (root / "data.bin").read_bytes() == BINARY
    assert await directory.read_bytes("data.bin") == BINARY
    data, read_stat = await directory.read_range("data.bin", 256, 300)
    assert data == BINARY[256:556]
    assert read_stat.version == stat.version
    # Past the end: what there is; none past it.
    assert (await directory.read_range("data.bin", len(BINARY) - 3, 100))[0] == b"end"[:0] + BINARY[-3:]
    assert (await directory.read_range("data.bin", len(BINARY) + 5, 10))[0] == b""
    assert await directory.read_text("data.bin", errors="surrogateescape") == BINARY.decode(
        "utf-8", "surrogateescape"
    )


async def test_write_text_and_names_that_are_not_utf8(directory: Directory, root: Path) -> None:
    await directory.write_text("héllo.txt", "grüße\n")
    assert (root / "héllo.txt").read_text() == "grüße\n"
    raw = b"raw-\xff\xfe"
    (root / os.fsdecode(raw)).write_bytes(b"x")
    names = sorted(entry.path for entry in await directory.list().collect())
    assert names == sorted(["héllo.txt", os.fsdecode(raw)])
    # The name the listing gave leads back to the file.
    assert await directory.read_bytes(os.fsdecode(raw)) == b"x"
    assert await directory.read_bytes(raw) == b"x"


async def test_write_is_atomic_with_options(directory: Directory, root: Path) -> None:
    stat = await directory.write_bytes("run.sh", b"#!/bin/sh\n", mode=0o750)
    assert stat.permissions == 0o750
    assert (root / "run.sh").stat().st_mode & 0o7777 == 0o750
    # A replaced file keeps its bits by default.
    stat = await directory.write_bytes("run.sh", b"#!/bin/sh\necho\n")
    assert stat.permissions == 0o750
    with pytest.raises(errors.Exists) as refused:
        await directory.write_bytes("run.sh", b"", exclusive=True)
    assert refused.value.tag == "exists"
    with pytest.raises(errors.NotFound) as missing:
        await directory.write_bytes("nope/run.sh", b"")
    assert missing.value.tag == "not-found"
    with pytest.raises(errors.NotFound):
        await directory.write_bytes("absent", b"", must_exist=True)
    stat = await directory.write_bytes("a/b/c.txt", b"deep", create_parents=True)
    assert (root / "a" / "b" / "c.txt").read_bytes() == b"deep"
    stat = await directory.write_bytes("timed", b"t", modified_ns=1_000_000_000_123)
    assert stat.modified_ns == 1_000_000_000_123
    assert (root / "timed").stat().st_mtime_ns == 1_000_000_000_123


async def test_if_version_conflict(directory: Directory, root: Path) -> None:
    first = await directory.write_bytes("shared.txt", b"one")
    second = await directory.write_bytes("shared.txt", b"two", if_version=first.version)
    assert second.version != first.version
    assert (root / "shared.txt").read_bytes() == b"two"
    # The first version is stale now: somebody else wrote.
    with pytest.raises(errors.Conflict) as conflict:
        await directory.write_bytes("shared.txt", b"three", if_version=first.version)
    assert conflict.value.tag == "conflict"
    assert "shared.txt" in conflict.value.sentence
    assert "[capexec:" not in conflict.value.sentence
    assert (root / "shared.txt").read_bytes() == b"two"
    # Read and version in one call, then a write over exactly that.
    data, stat = await directory.read_range("shared.txt")
    assert data == b"two"
    await directory.write_bytes("shared.txt", b"four", if_version=stat.version)
    assert (root / "shared.txt").read_bytes() == b"four"
    # A missing file is a conflict too.
    with pytest.raises(errors.Conflict):
        await directory.write_bytes("missing.txt", b"x", if_version=stat.version)
    assert not (root / "missing.txt").exists()
    # Uploads check it too.
    with pytest.raises(errors.Conflict):
        await directory.upload("shared.txt", b"five", if_version=first.version)
    assert (root / "shared.txt").read_bytes() == b"four"
    with pytest.raises(ValueError):
        await directory.write_bytes("shared.txt", b"x", if_version=b"")


async def test_read_only_directory_refuses_writes(directory: Directory, root: Path) -> None:
    (root / "kept.txt").write_bytes(b"kept")
    (root / "sub").mkdir()
    read_only = directory.read_only()
    assert await read_only.read_bytes("kept.txt") == b"kept"
    assert (await read_only.info()).read_only is True
    assert (await directory.info()).read_only is False
    with pytest.raises(errors.Forbidden) as refused:
        await read_only.write_bytes("kept.txt", b"changed")
    assert refused.value.tag == "forbidden"
    assert type(refused.value) is errors.Forbidden
    with pytest.raises(errors.Forbidden):
        await read_only.mkdir("new")
    with pytest.raises(errors.Forbidden):
        await read_only.remove("kept.txt")
    with pytest.raises(errors.Forbidden):
        await read_only.upload("big.bin", pattern(5 * MiB))
    # Everything derived from it is read-only too.
    with pytest.raises(errors.Forbidden):
        await read_only.subdirectory("sub").write_bytes("x", b"x")
    assert (root / "kept.txt").read_bytes() == b"kept"
    assert sorted(p.name for p in root.iterdir()) == ["kept.txt", "sub"]


async def test_errors_have_their_classes(directory: Directory, root: Path) -> None:
    (root / "dir").mkdir()
    (root / "dir" / "f").write_bytes(b"f")
    cases: list[tuple[Awaitable[object], type[errors.RefusalError], str]] = [
        (directory.read_bytes("absent"), errors.NotFound, "not-found"),
        (directory.read_bytes("../outside"), errors.OutsideDirectory, "outside-directory"),
        (directory.read_bytes("/etc/passwd"), errors.OutsideDirectory, "outside-directory"),
        (directory.read_bytes("dir"), errors.IsADirectory, "is-a-directory"),
        (directory.mkdir("dir"), errors.Exists, "exists"),
        (directory.remove("dir"), errors.NotEmpty, "not-empty"),
        (directory.read_bytes("dir/f/x"), errors.NotADirectory, "not-a-directory"),
        (directory.stat("a\x00b"), errors.InvalidArgument, "invalid-argument"),
        (directory.read_range("dir/f", 0, 5 * MiB), errors.LimitReached, "limit"),
    ]
    for call, cls, tag in cases:
        with pytest.raises(cls) as raised:
            await call
        assert type(raised.value) is cls
        assert raised.value.tag == tag
    # A missing directory makes the first call on it fail.
    with pytest.raises(errors.NotFound):
        await directory.subdirectory("nowhere").list().collect()
    assert await directory.exists("dir/f")
    assert not await directory.exists("dir/g")


async def test_large_files_stream_both_ways(directory: Directory, root: Path) -> None:
    big = pattern(9 * MiB + 12345, seed=1)
    # write_bytes past 4 MiB uploads; read_bytes past it downloads.
    stat = await within(directory.write_bytes("big.bin", big))
    assert stat.size == len(big)
    assert (root / "big.bin").read_bytes() == big
    assert await within(directory.read_bytes("big.bin")) == big
    # The one-shot call says it is too large.
    with pytest.raises(errors.TooLarge) as too_large:
        await directory.read_range("big.bin")
    assert too_large.value.tag == "too-large"

    # Chunks of at most 256 KiB, in order, with the server's answer.
    stream = directory.download_iter("big.bin")
    chunks = [chunk async for chunk in stream]
    assert all(0 < len(chunk) <= 256 * 1024 for chunk in chunks)
    assert b"".join(chunks) == big
    assert stream.size == len(big)
    assert stream.stat is not None and stream.stat.size == len(big)

    # A range.
    part = b"".join([c async for c in directory.download_iter("big.bin", offset=7, length=3 * MiB)])
    assert part == big[7 : 7 + 3 * MiB]

    # Into a local path and into an open file.
    target = root / "local-copy.bin"
    assert await within(directory.download("big.bin", target)) == len(big)
    assert target.read_bytes() == big
    buffer = io.BytesIO()
    assert await within(directory.download("big.bin", buffer)) == len(big)
    assert buffer.getvalue() == big


async def test_upload_sources(directory: Directory, root: Path) -> None:
    big = pattern(6 * MiB + 1, seed=2)
    local = root / "source.bin"
    local.write_bytes(big)

    stat = await within(directory.upload("from-path.bin", local))
    assert stat.size == len(big)
    assert (root / "from-path.bin").read_bytes() == big

    with open(local, "rb") as file:
        await within(directory.upload("from-file.bin", file))
    assert (root / "from-file.bin").read_bytes() == big

    async def pieces() -> AsyncIterator[bytes]:
        # Odd sizes: small ones gathered, big ones split.
        offset = 0
        for size in (1, 7, 300_000, 65_536, 1_000_001, 3):
            yield big[offset : offset + size]
            offset += size
        yield big[offset:]

    await within(directory.upload("from-async.bin", pieces()))
    assert (root / "from-async.bin").read_bytes() == big

    await within(directory.upload("from-list.bin", [b"a\x00", b"", b"b"]))
    assert (root / "from-list.bin").read_bytes() == b"a\x00b"

    await within(directory.upload("empty.bin", b""))
    assert (root / "empty.bin").read_bytes() == b""


async def test_failed_upload_leaves_nothing(directory: Directory, root: Path) -> None:
    (root / "target.bin").write_bytes(b"old")

    async def broken() -> AsyncIterator[bytes]:
        yield pattern(2 * MiB)
        raise OSError("the source broke")

    with pytest.raises(OSError, match="the source broke"):
        await within(directory.upload("target.bin", broken()))
    # Announced and delivered sizes that differ.
    with pytest.raises(errors.InvalidArgument) as wrong_size:
        await within(directory.upload("target.bin", [b"12345"], size=6))
    assert wrong_size.value.tag == "invalid-argument"
    with pytest.raises(errors.InvalidArgument):
        await within(directory.upload("target.bin", [b"1234567"], size=6))
    assert (root / "target.bin").read_bytes() == b"old"
    # No temporary left behind.
    assert sorted(p.name for p in root.iterdir()) == ["target.bin"]


async def test_list_and_walk(directory: Directory, root: Path) -> None:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "a.py").write_bytes(b"a" * 10)
    (root / "src" / "pkg" / "b.py").write_bytes(b"b" * 20)
    (root / "src" / "pkg" / "c.txt").write_bytes(b"")
    (root / "link").symlink_to("src/a.py")

    top = {entry.path: entry for entry in await directory.list().collect()}
    assert sorted(top) == ["link", "src"]
    assert top["src"].stat is not None and top["src"].stat.is_dir
    link = top["link"]
    assert link.stat is not None and link.stat.kind is FileKind.SYMLINK
    assert link.link_target == "src/a.py"
    assert link.error is None

    stream = directory.walk("src")
    walked: dict[str, DirEntry] = {entry.path: entry async for entry in stream}
    assert sorted(walked) == ["a.py", "pkg", "pkg/b.py", "pkg/c.txt"]
    assert walked["pkg/b.py"].stat is not None and walked["pkg/b.py"].stat.size == 20
    assert walked["pkg/b.py"].name == "b.py"
    assert stream.summary is not None
    assert stream.summary.entries == 4 and stream.summary.truncated is False

    shallow = [entry.path for entry in await directory.walk("src", max_depth=1).collect()]
    assert sorted(shallow) == ["a.py", "pkg"]
    python = [entry.path for entry in await directory.walk("", include=["**/*.py"]).collect()]
    assert sorted(python) == ["src/a.py", "src/pkg/b.py"]
    pruned = [entry.path for entry in await directory.walk("", exclude=["src/pkg"]).collect()]
    assert sorted(pruned) == ["link", "src", "src/a.py"]
    truncated = directory.walk("", max_entries=2)
    assert len(await truncated.collect()) == 2
    assert truncated.summary is not None and truncated.summary.truncated is True

    with pytest.raises(errors.NotADirectory):
        await directory.list("src/a.py").collect()


async def test_a_listing_of_many_batches(directory: Directory, root: Path) -> None:
    many = root / "many"
    many.mkdir()
    names = {f"f{index:05}" for index in range(4500)}
    for name in names:
        (many / name).touch()
    # More than the server's 1,024 a batch, and more batches than are
    # queued here: the server waits for this consumer.
    stream = directory.list("many")
    seen = [entry.path async for entry in stream]
    assert sorted(seen) == sorted(names)
    assert stream.summary is not None and stream.summary.entries == 4500

    # Leaving early ends the listing on the server (whose next push fails)
    # while it waits for this consumer; the connection goes on.
    for _ in range(3):
        async for _entry in directory.list("many"):
            break
        walk = directory.walk("")
        await walk.__anext__()
        await walk.aclose()
    assert len(await directory.list("many").collect()) == 4500


async def test_leaving_a_download_early_ends_it(directory: Directory, root: Path) -> None:
    # A connection may have 64 transfers at once: downloads left early but
    # still going on the server would make the 65th fail. 4 MiB are 16
    # chunks, more than are queued here, so each is still going when left.
    data = pattern(4 * MiB)
    (root / "big.bin").write_bytes(data)
    for _ in range(70):
        async for chunk in directory.download_iter("big.bin"):
            assert chunk == data[: len(chunk)]
            break
    for _ in range(70):
        stream = directory.download_iter("big.bin")
        await stream.__anext__()
        await stream.aclose()
    assert await within(directory.read_bytes("big.bin")) == data


async def test_changes(directory: Directory, root: Path) -> None:
    await directory.mkdir("a/b/c", recursive=True)
    assert (root / "a" / "b" / "c").is_dir()
    await directory.mkdir("a/b/c", recursive=True)  # mkdir -p: no error
    await directory.mkdir("m", mode=0o700)
    assert (root / "m").stat().st_mode & 0o777 == 0o700

    await directory.write_bytes("a/one", b"1")
    await directory.write_bytes("a/b/two", b"2")
    assert await directory.copy("a", "copy", recursive=True) == 5
    assert (root / "copy" / "b" / "two").read_bytes() == b"2"
    assert await directory.copy("a/one", "one-copy") == 1
    with pytest.raises(errors.IsADirectory):
        await directory.copy("a", "nope")
    with pytest.raises(errors.Exists):
        await directory.copy("a/one", "one-copy", no_replace=True)

    await directory.rename("one-copy", "renamed")
    assert (root / "renamed").read_bytes() == b"1"
    with pytest.raises(errors.Exists):
        await directory.rename("renamed", "a/one", no_replace=True)

    await directory.symlink("a/one", "to-one")
    assert await directory.readlink("to-one") == "a/one"
    assert (await directory.stat("to-one")).kind is FileKind.FILE
    assert (await directory.stat("to-one", follow_symlinks=False)).kind is FileKind.SYMLINK
    assert await directory.canonicalize("to-one") == "a/one"
    assert await directory.canonicalize("a/b/..") == "a"

    await directory.chmod("renamed", 0o600)
    assert (root / "renamed").stat().st_mode & 0o7777 == 0o600
    await directory.set_times("renamed", 5_000_000_000, 7_000_000_001)
    assert (root / "renamed").stat().st_mtime_ns == 7_000_000_001
    assert (root / "renamed").stat().st_atime_ns == 5_000_000_000

    assert await directory.remove("copy", recursive=True) == 5
    assert not (root / "copy").exists()
    assert await directory.remove("copy", missing_ok=True) == 0
    assert await directory.remove("renamed") == 1
    info = await directory.info()
    assert info.path == str(root.resolve())


async def test_subdirectory_is_confined(directory: Directory, root: Path) -> None:
    (root / "inner").mkdir()
    (root / "secret").write_bytes(b"secret")
    inner = directory.subdirectory("inner")
    await inner.write_bytes("file", b"in")
    assert (root / "inner" / "file").read_bytes() == b"in"
    with pytest.raises(errors.OutsideDirectory):
        await inner.read_bytes("../secret")
    (root / "inner" / "escape").symlink_to("../secret")
    with pytest.raises(errors.OutsideDirectory):
        await inner.read_bytes("escape")
    assert (await inner.info()).path == str((root / "inner").resolve())


async def test_watch(directory: Directory, root: Path) -> None:
    (root / "watched").mkdir()
    watched = directory.subdirectory("watched")

    async def next_matching(
        changes: capexec.directory.Watch, kind: WatchEventKind, path: str
    ) -> WatchEvent:
        async for event in changes:
            if event.kind is kind and event.path == path:
                return event
        raise AssertionError(f"the watch ended before {kind} {path}")

    async with directory.watch("watched", recursive=True) as changes:
        await watched.write_bytes("new.txt", b"x")
        created = await within(next_matching(changes, WatchEventKind.CREATED, "new.txt"), 30)
        assert created.is_directory is False
        await watched.mkdir("sub")
        made = await within(next_matching(changes, WatchEventKind.CREATED, "sub"), 30)
        assert made.is_directory is True
        (root / "watched" / "sub" / "deep.txt").write_bytes(b"deep")
        await within(next_matching(changes, WatchEventKind.CREATED, "sub/deep.txt"), 30)
        os.rename(root / "watched" / "sub" / "deep.txt", root / "watched" / "moved.txt")
        renamed = await within(next_matching(changes, WatchEventKind.RENAMED, "sub/deep.txt"), 30)
        assert renamed.to_path == "moved.txt"
        (root / "watched" / "moved.txt").unlink()
        await within(next_matching(changes, WatchEventKind.REMOVED, "moved.txt"), 30)

    # The watched directory going away is the last event.
    changes = await directory.watch("watched")
    await directory.remove("watched", recursive=True)
    events = [event async for event in changes]
    assert events[-1].kind is WatchEventKind.GONE
    await changes.close()

    with pytest.raises(errors.NotFound):
        await directory.watch("absent")


async def test_many_files_in_one_call(directory: Directory, root: Path) -> None:
    (root / "dir").mkdir()
    stats = await directory.write_many(
        [("a.txt", b"a\x00"), ("sub/b.txt", b"b"), ("dir", b"not over a directory")],
        create_parents=True,
    )
    assert isinstance(stats[0], capexec.directory.FileStat) and stats[0].size == 2
    assert isinstance(stats[1], capexec.directory.FileStat) and stats[1].size == 1
    # One file failing does not stop the others; its error has its class.
    assert isinstance(stats[2], errors.IsADirectory)
    assert stats[2].tag == "is-a-directory"
    assert (root / "a.txt").read_bytes() == b"a\x00"
    assert (root / "sub" / "b.txt").read_bytes() == b"b"

    outcomes = await directory.read_many(["a.txt", "absent", "sub/b.txt"])
    first, missing, second = outcomes
    assert isinstance(first, tuple) and first[0] == b"a\x00"
    assert first[1].version == stats[0].version
    assert isinstance(missing, errors.NotFound)
    assert "absent" in missing.sentence and "[capexec:" not in missing.sentence
    assert isinstance(second, tuple) and second[0] == b"b"

    with pytest.raises(errors.LimitReached):
        await directory.write_many([(f"f{index}", b"") for index in range(1025)])
    assert not (root / "f0").exists()


async def test_search(directory: Directory, root: Path) -> None:
    (root / "src").mkdir()
    (root / "src" / "a.py").write_bytes(b"import os\n\ndef Main():\n    return 1\n")
    (root / "src" / "b.txt").write_bytes(b"no main here? MAIN\n")
    (root / "src" / "bin").write_bytes(b"main\x00binary")
    result = await directory.search(r"main\(", "src")
    assert result.matches == []
    result = await directory.search(r"def \w+\(", case_insensitive=True)
    assert [(m.path, m.line_number, m.line) for m in result.matches] == [
        ("src/a.py", 3, "def Main():")
    ]
    match = result.matches[0]
    assert (match.match_start, match.match_end, match.line_bytes) == (0, 9, 11)
    found = await directory.search("main", case_insensitive=True, include=["**/*.txt"])
    assert [m.path for m in found.matches] == ["src/b.txt"]
    everything = await directory.search("(?i)main")
    assert sorted(m.path for m in everything.matches) == ["src/a.py", "src/b.txt"]
    assert everything.binary_skipped == 1
    assert everything.files_searched == 2
    assert everything.truncated is False
    capped = await directory.search(".", max_matches=1)
    assert len(capped.matches) == 1 and capped.truncated is True
    with pytest.raises(errors.InvalidArgument):
        await directory.search("(unclosed")


async def test_directory_executor(directory: Directory, root: Path) -> None:
    executor = directory.executor()
    assert isinstance(executor, capexec.Executor)
    info = await executor.info()
    assert "restricted" in info.features
    # Its directories are confined to this one.
    with pytest.raises(errors.NotAllowed):
        await executor.directory("/").list().collect()
    inner = executor.directory(str(root))
    await inner.write_bytes("via-executor", b"ok")
    assert (root / "via-executor").read_bytes() == b"ok"


@pytest.mark.parametrize("transport", ["unix", "tcp"])
async def test_the_files_example_works(server: Server, transport: str) -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "files.py"
    args = [sys.executable, str(example)]
    if transport == "unix":
        args.append(server.unix)
    else:
        assert server.token_file is not None
        args += [server.tcp, "--token-file", str(server.token_file)]
    process = await asyncio.create_subprocess_exec(
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=isolated_env(server.home),
    )
    stdout, stderr = await within(process.communicate(), 120)
    assert process.returncode == 0, stderr.decode(errors="replace")
    assert stderr.decode().splitlines()[-1] == "all steps worked"


async def test_a_watch_ends_with_an_error_when_the_connection_goes(
    connection: capexec.Connection, root: Path
) -> None:
    changes = await connection.executor.directory(str(root)).watch()
    (root / "before").write_bytes(b"")
    first = await within(changes.__anext__(), 30)
    assert first.path == "before"
    await connection.close()
    with pytest.raises(errors.Disconnected):
        async for _event in changes:
            pass


async def test_a_failed_download_leaves_no_local_file(directory: Directory, root: Path) -> None:
    (root / "dir").mkdir()
    target = root / "local.bin"
    with pytest.raises(errors.IsADirectory):
        await directory.download("dir", target)
    assert not target.exists()
    with pytest.raises(errors.NotFound):
        async for _chunk in directory.download_iter("absent"):
            pass


async def test_watch_batches(directory: Directory, root: Path) -> None:
    async with directory.watch() as changes:
        (root / "one").write_bytes(b"1")
        batch = await within(changes.next_batch(), 30)
        assert batch
        assert batch[0].kind is WatchEventKind.CREATED and batch[0].path == "one"
