"""`CapexecSandbox` against deepagents' `SandboxBackendProtocol`, on a real server.

Every method of the protocol is called, sync and async, with exact results:
outputs, exit codes, the error vocabulary, and confinement to the root (a
path outside it, a `..` escape and a symlink leading out are refused, and
commands cannot write outside it).
"""

from __future__ import annotations

import asyncio
import base64
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("deepagents")

from deepagents.backends.protocol import (  # noqa: E402
    FileDownloadResponse,
    FileUploadResponse,
    SandboxBackendProtocol,
)
from deepagents.backends.utils import EMPTY_CONTENT_WARNING  # noqa: E402

from capexec.integrations.deepagents import CapexecSandbox  # noqa: E402


@pytest.fixture
def sandbox(integration_server: str, workspace: Path) -> Iterator[CapexecSandbox]:
    backend = CapexecSandbox.open(str(workspace), connect=integration_server)
    try:
        yield backend
    finally:
        backend.close()


def test_is_a_sandbox_backend(sandbox: CapexecSandbox, workspace: Path) -> None:
    assert isinstance(sandbox, SandboxBackendProtocol)
    assert sandbox.id.startswith("capexec-")
    assert sandbox.root == str(workspace)


# -- execute ------------------------------------------------------------------


def test_execute_combines_output_in_order_with_exit_code(sandbox: CapexecSandbox) -> None:
    r = sandbox.execute("echo one; echo two >&2; echo three; exit 3")
    assert r.output == "one\ntwo\nthree\n"
    assert r.exit_code == 3
    assert r.truncated is False


def test_execute_runs_in_the_root(sandbox: CapexecSandbox, workspace: Path) -> None:
    r = sandbox.execute("pwd -P")
    assert (r.output, r.exit_code) == (f"{workspace.resolve()}\n", 0)


def test_execute_missing_program_is_127(sandbox: CapexecSandbox) -> None:
    r = sandbox.execute("no-such-program-xyz")
    assert r.exit_code == 127
    assert "no-such-program-xyz" in r.output


def test_execute_signal_is_128_plus(sandbox: CapexecSandbox) -> None:
    r = sandbox.execute("kill -KILL $$")
    assert (r.output, r.exit_code) == ("", 137)


def test_execute_timeout(sandbox: CapexecSandbox) -> None:
    r = sandbox.execute("echo started; sleep 30", timeout=1)
    assert r.exit_code == 124
    assert r.output == "started\n\n\nError: Command timed out after 1 seconds."


def test_execute_large_output_untruncated(sandbox: CapexecSandbox) -> None:
    r = sandbox.execute("head -c 512000 /dev/zero | tr '\\0' x")
    assert r.exit_code == 0
    assert r.truncated is False
    assert r.output == "x" * 512000


def test_execute_output_cap(integration_server: str, workspace: Path) -> None:
    with CapexecSandbox.open(str(workspace), connect=integration_server, max_output_bytes=1000) as small:
        r = small.execute("head -c 5000 /dev/zero | tr '\\0' y")
    assert r.exit_code == 0
    assert r.truncated is True
    assert r.output == "y" * 1000 + "\n\n... Output truncated at 1000 bytes."


def test_execute_cannot_write_outside_the_root(sandbox: CapexecSandbox, workspace: Path) -> None:
    target = workspace.parent / "escaped.txt"
    r = sandbox.execute(f"echo x > {target}")
    assert r.exit_code != 0
    assert not target.exists()
    inside = sandbox.execute("echo x > inside.txt && cat inside.txt")
    assert (inside.output, inside.exit_code) == ("x\n", 0)


async def test_aexecute_from_another_loop(sandbox: CapexecSandbox) -> None:
    results = await asyncio.gather(*(sandbox.aexecute(f"echo {i}") for i in range(5)))
    assert [(r.output, r.exit_code) for r in results] == [(f"{i}\n", 0) for i in range(5)]


def test_sync_calls_from_threads(sandbox: CapexecSandbox, workspace: Path) -> None:
    outputs: dict[int, str] = {}

    def work(i: int) -> None:
        assert sandbox.write(f"{workspace}/t{i}.txt", f"thread {i}").error is None
        outputs[i] = sandbox.execute(f"cat t{i}.txt").output

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outputs == {i: f"thread {i}" for i in range(4)}


# -- write / read -------------------------------------------------------------


def test_write_then_read(sandbox: CapexecSandbox, workspace: Path) -> None:
    path = f"{workspace}/dir/sub/a.txt"
    w = sandbox.write(path, "alpha\nbeta\ngamma\n")
    assert (w.error, w.path) == (None, path)
    assert (workspace / "dir/sub/a.txt").read_bytes() == b"alpha\nbeta\ngamma\n"
    r = sandbox.read(path)
    assert r.error is None
    assert r.file_data == {"content": "alpha\nbeta\ngamma", "encoding": "utf-8"}
    assert (r.start_line, r.end_line, r.total_lines, r.next_offset) == (1, 3, 3, None)


def test_write_overwrites(sandbox: CapexecSandbox, workspace: Path) -> None:
    path = f"{workspace}/a.txt"
    assert sandbox.write(path, "first").error is None
    assert sandbox.write(path, "second").error is None
    assert (workspace / "a.txt").read_text() == "second"


def test_read_window(sandbox: CapexecSandbox, workspace: Path) -> None:
    (workspace / "n.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    r = sandbox.read(f"{workspace}/n.txt", offset=3, limit=4)
    assert r.file_data is not None
    assert r.file_data["content"] == "line 4\nline 5\nline 6\nline 7"
    assert (r.start_line, r.end_line, r.total_lines, r.next_offset) == (4, 7, 10, 7)
    beyond = sandbox.read(f"{workspace}/n.txt", offset=10)
    assert beyond.error == "Line offset 10 exceeds file length (10 lines)"
    zero = sandbox.read(f"{workspace}/n.txt", limit=0)
    assert zero.no_lines_requested is True


def test_read_empty_binary_and_missing(sandbox: CapexecSandbox, workspace: Path) -> None:
    (workspace / "empty.txt").write_bytes(b"")
    assert sandbox.read(f"{workspace}/empty.txt").file_data == {"content": EMPTY_CONTENT_WARNING, "encoding": "utf-8"}
    (workspace / "img.png").write_bytes(bytes(range(256)))
    r = sandbox.read(f"{workspace}/img.png")
    assert r.file_data is not None and r.file_data["encoding"] == "base64"
    assert base64.b64decode(r.file_data["content"]) == bytes(range(256))
    (workspace / "blob.txt").write_bytes(b"\xff\xfe\x00binary")
    blob = sandbox.read(f"{workspace}/blob.txt")
    assert blob.file_data == {"content": base64.b64encode(b"\xff\xfe\x00binary").decode(), "encoding": "base64"}
    (workspace / "big.png").write_bytes(b"\x00" * (500 * 1024 + 1))
    assert sandbox.read(f"{workspace}/big.png").error == f"File '{workspace}/big.png': Binary file exceeds maximum preview size of 512000 bytes"
    assert sandbox.read(f"{workspace}/missing.txt").error == f"File '{workspace}/missing.txt': file_not_found"
    assert sandbox.read(str(workspace)).error == f"File '{workspace}': is_directory"


def test_read_large_text_is_cut_with_a_note(sandbox: CapexecSandbox, workspace: Path) -> None:
    line = "z" * 1023
    (workspace / "long.txt").write_text((line + "\n") * 1000)
    r = sandbox.read(f"{workspace}/long.txt")
    assert r.file_data is not None
    content = r.file_data["content"]
    assert content.endswith("Continue reading with a larger offset or smaller limit to inspect the rest of the file.]")
    assert r.end_line is not None and r.end_line < 1000
    assert r.next_offset == r.end_line


# -- edit ---------------------------------------------------------------------


def test_edit(sandbox: CapexecSandbox, workspace: Path) -> None:
    path = f"{workspace}/e.txt"
    (workspace / "e.txt").write_text("apple banana apple\n")
    multiple = sandbox.edit(path, "apple", "pear")
    assert multiple.error == (
        "Error: String 'apple' appears multiple times (2 occurrences). Use replace_all=True to replace all occurrences, "
        "or provide a more specific string with surrounding context."
    )
    assert (workspace / "e.txt").read_text() == "apple banana apple\n"
    r = sandbox.edit(path, "apple", "pear", replace_all=True)
    assert (r.error, r.path, r.occurrences) == (None, path, 2)
    assert (workspace / "e.txt").read_text() == "pear banana pear\n"
    assert sandbox.edit(path, "kiwi", "x").error == "Error: String not found in file: 'kiwi'"
    assert sandbox.edit(path, "", "x").error == "Error: old_string cannot be empty. Provide the exact text to replace."
    assert sandbox.edit(f"{workspace}/none.txt", "a", "b").error == f"Error: File '{workspace}/none.txt' not found"


def test_edit_keeps_crlf(sandbox: CapexecSandbox, workspace: Path) -> None:
    (workspace / "w.txt").write_bytes(b"one\r\ntwo\r\n")
    r = sandbox.edit(f"{workspace}/w.txt", "one\ntwo", "uno\ndos")
    assert (r.error, r.occurrences) == (None, 1)
    assert (workspace / "w.txt").read_bytes() == b"uno\r\ndos\r\n"


# -- ls / glob / grep / delete ------------------------------------------------


def test_ls(sandbox: CapexecSandbox, workspace: Path) -> None:
    (workspace / "d").mkdir()
    (workspace / "f.txt").write_text("12345")
    r = sandbox.ls(str(workspace))
    assert r.error is None and r.entries is not None
    assert [(e["path"], e["is_dir"], e["size"]) for e in r.entries] == [
        (f"{workspace}/d", True, 0),
        (f"{workspace}/f.txt", False, 5),
    ]
    assert sandbox.ls(f"{workspace}/nope").error == f"Path '{workspace}/nope': path_not_found"
    assert sandbox.ls(f"{workspace}/f.txt").error == f"Path '{workspace}/f.txt': not_a_directory"


def test_glob(sandbox: CapexecSandbox, workspace: Path) -> None:
    for rel in ("a.py", "src/b.py", "src/deep/c.py", "src/d.txt", ".hidden/e.py"):
        (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        (workspace / rel).write_text("x")
    (workspace / "dir.py").mkdir()
    r = sandbox.glob("*.py", path=str(workspace))
    assert r.error is None and r.matches is not None
    assert [m["path"] for m in r.matches] == [f"{workspace}/{p}" for p in (".hidden/e.py", "a.py", "src/b.py", "src/deep/c.py")]
    anchored = sandbox.glob("src/**/*.py", path=str(workspace))
    assert [m["path"] for m in anchored.matches or []] == [f"{workspace}/src/b.py", f"{workspace}/src/deep/c.py"]
    default_root = sandbox.glob("*.txt")
    assert [m["path"] for m in default_root.matches or []] == [f"{workspace}/src/d.txt"]
    traversal = sandbox.glob("../*.txt", path=str(workspace))
    assert traversal.matches is None and traversal.error is not None and "traversal" in traversal.error.lower()


def test_grep(sandbox: CapexecSandbox, workspace: Path) -> None:
    (workspace / "src").mkdir()
    (workspace / "src/a.py").write_text("x = 1\nneedle (literal) here\n")
    (workspace / "b.txt").write_text("needle (literal)\nno\nneedle (literal) again\n")
    (workspace / ".git").mkdir()
    (workspace / ".git/objects").write_text("needle (literal)\n")
    r = sandbox.grep("needle (literal)", path=str(workspace))
    assert r.error is None
    assert r.matches == [
        {"path": f"{workspace}/b.txt", "line": 1, "text": "needle (literal)"},
        {"path": f"{workspace}/b.txt", "line": 3, "text": "needle (literal) again"},
        {"path": f"{workspace}/src/a.py", "line": 2, "text": "needle (literal) here"},
    ]
    only_py = sandbox.grep("needle", path=str(workspace), glob="*.py")
    assert only_py.matches == [{"path": f"{workspace}/src/a.py", "line": 2, "text": "needle (literal) here"}]
    capped = sandbox.grep("needle", path=str(workspace), max_count=1)
    assert (len(capped.matches or []), capped.truncated) == (1, True)
    one_file = sandbox.grep("again", path=f"{workspace}/b.txt")
    assert one_file.matches == [{"path": f"{workspace}/b.txt", "line": 3, "text": "needle (literal) again"}]
    assert sandbox.grep("needle", path=f"{workspace}/missing").matches == []


def test_delete(sandbox: CapexecSandbox, workspace: Path) -> None:
    (workspace / "tree/sub").mkdir(parents=True)
    (workspace / "tree/sub/f").write_text("x")
    assert sandbox.delete(f"{workspace}/tree").path == f"{workspace}/tree"
    assert not (workspace / "tree").exists()
    assert sandbox.delete(f"{workspace}/tree").error == f"Error: '{workspace}/tree' not found"
    assert sandbox.delete(str(workspace)).error is not None
    assert workspace.is_dir()


# -- upload / download ----------------------------------------------------------


def test_upload_download(sandbox: CapexecSandbox, workspace: Path) -> None:
    big = os.urandom(5 * 1024 * 1024 + 7)
    files = [(f"{workspace}/u/one.bin", bytes(range(256))), (f"{workspace}/big.bin", big), ("relative.txt", b"x")]
    assert sandbox.upload_files(files) == [
        FileUploadResponse(path=f"{workspace}/u/one.bin", error=None),
        FileUploadResponse(path=f"{workspace}/big.bin", error=None),
        FileUploadResponse(path="relative.txt", error="invalid_path"),
    ]
    assert (workspace / "big.bin").read_bytes() == big
    (workspace / "dir").mkdir()
    assert sandbox.download_files([f"{workspace}/u/one.bin", f"{workspace}/big.bin", f"{workspace}/missing", f"{workspace}/dir", "rel"]) == [
        FileDownloadResponse(path=f"{workspace}/u/one.bin", content=bytes(range(256)), error=None),
        FileDownloadResponse(path=f"{workspace}/big.bin", content=big, error=None),
        FileDownloadResponse(path=f"{workspace}/missing", content=None, error="file_not_found"),
        FileDownloadResponse(path=f"{workspace}/dir", content=None, error="is_directory"),
        FileDownloadResponse(path="rel", content=None, error="invalid_path"),
    ]


# -- confinement ----------------------------------------------------------------


def test_paths_outside_the_root_are_refused(sandbox: CapexecSandbox, workspace: Path) -> None:
    outside = str(workspace.parent / "outside.txt")
    escape = f"{workspace}/../outside.txt"
    for path in (outside, escape, "/etc/passwd"):
        assert sandbox.read(path).error is not None
        assert sandbox.read(path).file_data is None
        assert sandbox.download_files([path]) == [FileDownloadResponse(path=path, content=None, error="invalid_path")]
        assert sandbox.upload_files([(path, b"pwned")]) == [FileUploadResponse(path=path, error="invalid_path")]
        assert sandbox.write(path, "pwned").error is not None
        assert sandbox.edit(path, "secret", "pwned").error is not None
        assert sandbox.delete(path).error is not None
        assert sandbox.ls(path).error is not None
    assert (workspace.parent / "outside.txt").read_text() == "secret outside the root\n"
    assert sandbox.grep("secret", path=str(workspace.parent)).error is not None
    assert sandbox.glob("*", path=str(workspace.parent)).error is not None


def test_symlink_leading_out_is_refused(sandbox: CapexecSandbox, workspace: Path) -> None:
    (workspace / "link").symlink_to(workspace.parent / "outside.txt")
    (workspace / "dirlink").symlink_to(workspace.parent)
    assert sandbox.read(f"{workspace}/link").file_data is None
    assert sandbox.download_files([f"{workspace}/link"])[0].content is None
    assert sandbox.download_files([f"{workspace}/dirlink/outside.txt"])[0].error == "invalid_path"
    assert sandbox.write(f"{workspace}/dirlink/outside.txt", "pwned").error is not None
    assert (workspace.parent / "outside.txt").read_text() == "secret outside the root\n"
    # grep and glob do not follow symlinks out of the root either.
    assert sandbox.grep("secret", path=str(workspace)).matches == []
    assert sandbox.glob("*.txt", path=str(workspace)).matches == []


# -- async twins ----------------------------------------------------------------


async def test_async_methods(sandbox: CapexecSandbox, workspace: Path) -> None:
    path = f"{workspace}/async.txt"
    assert (await sandbox.awrite(path, "hello async\n")).path == path
    r = await sandbox.aread(path)
    assert r.file_data == {"content": "hello async", "encoding": "utf-8"}
    assert (await sandbox.aedit(path, "async", "world")).occurrences == 1
    assert (await sandbox.agrep("world", path=str(workspace))).matches == [{"path": path, "line": 1, "text": "hello world"}]
    assert [m["path"] for m in (await sandbox.aglob("*.txt", path=str(workspace))).matches or []] == [path]
    assert [e["path"] for e in (await sandbox.als(str(workspace))).entries or []] == [path]
    assert await sandbox.aupload_files([(f"{workspace}/b.bin", b"\x00\x01")]) == [FileUploadResponse(path=f"{workspace}/b.bin", error=None)]
    assert await sandbox.adownload_files([f"{workspace}/b.bin"]) == [FileDownloadResponse(path=f"{workspace}/b.bin", content=b"\x00\x01", error=None)]
    assert (await sandbox.adelete(path)).path == path
    assert not Path(path).exists()


def test_execute_shell_errors_name_the_commands_line(sandbox: CapexecSandbox) -> None:
    r = sandbox.execute("no-such-program-xyz")
    assert (r.output, r.exit_code) == ("sh: 1: no-such-program-xyz: not found\n", 127)


def test_on_loop_shares_a_caller_owned_loop(integration_server: str, workspace: Path) -> None:
    import capexec
    from capexec.integrations.deepagents import LoopThread

    loop = LoopThread()
    try:

        async def setup() -> tuple[capexec.Connection, capexec.Directory]:
            conn = await capexec.connect(integration_server)
            return conn, conn.executor.directory(str(workspace))

        conn, directory = loop.run(setup())
        backend = CapexecSandbox.on_loop(str(workspace), directory, loop)
        assert backend.write(f"{workspace}/shared.txt", "shared").error is None
        assert (backend.execute("cat shared.txt").output, backend.execute("true").exit_code) == ("shared", 0)
        backend.close()  # the caller's connection and loop stay
        assert backend.execute("echo still").output == "still\n"
        loop.run(conn.close())
    finally:
        loop.close()


def test_a_deep_agent_uses_the_backend(sandbox: CapexecSandbox, workspace: Path) -> None:
    """deepagents' own tools (its filesystem middleware and execute tool) on the
    backend, driven by a scripted chat model (langchain_core's fake one, which
    replays the tool calls given; no model is asked anything)."""
    from deepagents import create_deep_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, ToolMessage

    class Scripted(GenericFakeChatModel):
        def bind_tools(self, tools: object, **kwargs: object) -> Scripted:  # type: ignore[override]
            return self

    def call(name: str, args: dict[str, str], n: int) -> AIMessage:
        return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call{n}"}])

    script = iter(
        [
            call("write_file", {"file_path": f"{workspace}/hello.txt", "content": "hi there\n"}, 1),
            call("execute", {"command": "cat hello.txt; exit 3"}, 2),
            call("edit_file", {"file_path": f"{workspace}/hello.txt", "old_string": "there", "new_string": "capexec"}, 3),
            call("read_file", {"file_path": f"{workspace}/hello.txt"}, 4),
            call("read_file", {"file_path": "/etc/passwd"}, 5),
            AIMessage(content="done"),
        ]
    )
    agent = create_deep_agent(model=Scripted(messages=script), backend=sandbox)
    out = agent.invoke({"messages": [{"role": "user", "content": "go"}]})
    tool_results = [m.content for m in out["messages"] if isinstance(m, ToolMessage)]
    assert tool_results == [
        f"Updated file {workspace}/hello.txt",
        "hi there\n\n[Command failed with exit code 3]",
        f"Successfully replaced 1 instance(s) of the string in '{workspace}/hello.txt'",
        "@@ lines 1-1 of 1 @@\nhi capexec",
        f"Error: File '/etc/passwd': invalid_path (outside the sandbox root {workspace})",
    ]
    assert (workspace / "hello.txt").read_text() == "hi capexec\n"
