"""Drives every tool of `capexec mcp` with the official MCP Python SDK
(PyPI `mcp`), as a Python agent would: over stdio (the SDK starts the
server) or over Streamable HTTP (a server the test started), with a bearer
token when given.

    python drive_tools.py CONFIG_JSON

CONFIG_JSON: {"transport": "stdio" | "http", "command": [...] (stdio),
"url": ..., "token": ... or null (http), "root": the server's --root,
"outside": a directory outside it, "port": a TCP port a listener of the
test holds, "python": a Python of the system directories, which confined
commands may run}.

Plain asserts, no pytest: the first failure ends the script with exit 1
and says which check and what was seen. The SDK checks each
structuredContent against the tool's outputSchema: a mismatch is an
exception, so a failure here too.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import traceback

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

TOOLS = [
    "exec",
    "process_output",
    "process_input",
    "process_signal",
    "process_terminate",
    "process_list",
    "read_file",
    "write_file",
    "edit_file",
    "list_directory",
    "search_files",
    "file_info",
    "move_path",
    "remove_path",
    "make_directory",
]


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        # Gone before the open, or reaped between the open and the read.
        return False


class Check(Exception):
    pass


def check(condition: bool, what: str, seen: object = None) -> None:
    if not condition:
        raise Check(f"{what}; seen: {seen!r}")


def stream_bytes(stream: dict) -> bytes:
    check(stream["cut_bytes"] == 0, "a stream that was not cut", stream)
    if stream["encoding"] == "base64":
        return base64.b64decode(stream["text"])
    return stream["text"].encode()


class Agent:
    def __init__(self, client: Client, config: dict):
        self.client = client
        self.root = config["root"]
        self.outside = config["outside"]
        self.port = config["port"]
        self.python = config["python"]

    async def call(self, tool: str, **arguments) -> dict:
        result = await self.client.call_tool(tool, arguments)
        text = result.content[0].text if result.content else ""
        check(not result.is_error, f"{tool} {arguments} succeeds", text)
        check(result.structured_content is not None, f"{tool}: structuredContent", result)
        check(json.loads(text) == result.structured_content, f"{tool}: the text block is the JSON", text)
        return result.structured_content

    async def fails(self, tool: str, **arguments) -> str:
        result = await self.client.call_tool(tool, arguments)
        text = result.content[0].text
        check(result.is_error, f"{tool} {arguments} fails", result)
        check(text.startswith(f"capexec: {tool}: "), f"{tool}: the error starts with its tag", text)
        return text

    async def read_to_end(self, process_id: str, after: int = 0) -> tuple[bytes, bytes, dict]:
        out, err = b"", b""
        for _ in range(200):
            answer = await self.call("process_output", process_id=process_id, after_seq=after, wait_ms=5000)
            check(answer["gaps"] == [], "no gaps", answer)
            out += stream_bytes(answer["stdout"])
            err += stream_bytes(answer["stderr"])
            after = answer["next_seq"]
            if answer["closed"]:
                return out, err, answer
        raise Check(f"{process_id} never closed")

    async def run(self) -> None:
        listed = await self.client.list_tools()
        names = [tool.name for tool in listed.tools]
        check(names == TOOLS, "the tools, in order", names)
        for tool in listed.tools:
            check(tool.output_schema is not None, f"{tool.name} has an outputSchema", tool)
        await self.processes()
        await self.long_work()
        await self.confinement()
        await self.files()

    async def processes(self) -> None:
        # Exact bytes on both streams, and the exit code.
        r = await self.call("exec", argv=["sh", "-c", "printf 'out\\0put\\n'; printf 'err' >&2; exit 3"])
        check(r["running"] is False and r["exit"]["code"] == 3, "exit code 3", r)
        check(r["exit"]["signal"] is None and r["exit"]["shell_code"] == 3, "no signal", r)
        check(stream_bytes(r["stdout"]) == b"out\0put\n", "stdout's exact bytes", r["stdout"])
        check(stream_bytes(r["stderr"]) == b"err", "stderr's exact bytes", r["stderr"])
        # Bytes that are not UTF-8 come as base64.
        r = await self.call("exec", command="printf '\\377\\376ok'")
        check(r["stdout"]["encoding"] == "base64", "non-UTF-8 output in base64", r["stdout"])
        check(stream_bytes(r["stdout"]) == b"\xff\xfeok", "non-UTF-8 bytes", r["stdout"])
        # A signal.
        r = await self.call("exec", command="kill -KILL $$")
        check(r["exit"]["signal"] == "KILL" and r["exit"]["code"] is None, "killed by SIGKILL", r)
        check(r["exit"]["shell_code"] == 137 and r["exit"]["signal_number"] == 9, "137", r)
        # stdin, cwd and env.
        await self.call("make_directory", path="sub")
        r = await self.call("exec", command="cat; pwd; echo \"$GREETING\"", stdin="in\n", cwd="sub", env={"GREETING": "hi"})
        check(stream_bytes(r["stdout"]) == f"in\n{self.root}/sub\nhi\n".encode(), "stdin, cwd, env", r["stdout"])
        # The executor's timeout.
        r = await self.call("exec", argv=["sleep", "30"], timeout_ms=200)
        check(r["exit"]["timed_out"] is True, "timed out", r)
        # Handed back, then read on: a gapless, exact sequence.
        r = await self.call("exec", command="echo first; read line; echo \"got $line\"; exit 7", keep_stdin_open=True, yield_ms=300)
        check(r["running"] is True and r["exit"] is None, "still running after yield_ms", r)
        pid = r["process_id"]
        first = stream_bytes(r["stdout"])
        listed = await self.call("process_list")
        check(any(p["process_id"] == pid and p["running"] for p in listed["processes"]), "listed running", listed)
        # Idempotent input: the same write_id twice is written once.
        i = await self.call("process_input", process_id=pid, data="once\n", write_id="w-1")
        check(i["status"] == "accepted", "accepted", i)
        i = await self.call("process_input", process_id=pid, data="once\n", write_id="w-1")
        check(i["status"] == "accepted", "accepted again, not written again", i)
        out, err, last = await self.read_to_end(pid, r["next_seq"])
        check(first + out == b"first\ngot once\n", "the output after the handback", first + out)
        check(last["exit"]["code"] == 7, "exit 7 once closed", last)
        # An after_seq past the newest is refused.
        text = await self.fails("process_output", process_id=pid, after_seq=10**9)
        check("[capexec:invalid-argument]" in text, "the tag", text)
        # A signal by name; terminate.
        r = await self.call("exec", argv=["sleep", "60"], yield_ms=0)
        s = await self.call("process_signal", process_id=r["process_id"], signal="INT")
        check(s["signal"] == "INT" and s["running"] is True, "INT sent", s)
        _, _, last = await self.read_to_end(r["process_id"])
        check(last["exit"]["signal"] == "INT", "ended by INT", last)
        r = await self.call("exec", argv=["sleep", "60"], yield_ms=0)
        t = await self.call("process_terminate", process_id=r["process_id"])
        check(t["running"] is True, "terminated while running", t)
        _, _, last = await self.read_to_end(r["process_id"])
        check(last["exit"]["signal"] == "TERM", "ended by TERM", last)
        # Closing stdin.
        r = await self.call("exec", argv=["cat"], keep_stdin_open=True, yield_ms=0)
        i = await self.call("process_input", process_id=r["process_id"], data="abc", close=True)
        check(i["closed"] is True, "stdin closed", i)
        out, _, last = await self.read_to_end(r["process_id"])
        check(out == b"abc" and last["exit"]["code"] == 0, "cat echoed and ended", (out, last))
        # Bounded: a huge output is cut, the byte count said.
        r = await self.call("exec", command="head -c 1000000 /dev/zero | tr '\\0' a", max_output_bytes=1000)
        o = r["stdout"]
        check(o["bytes"] == 1000000 and o["cut_bytes"] == 1000000 - 1000, "cut with the count", {k: o[k] for k in ("bytes", "cut_bytes")})
        check(o["text"] == "a" * 500 and o["tail"] == "a" * 500, "head and tail kept", len(o["text"]))
        r = await self.call("exec", command="head -c 1000000 /dev/zero | tr '\\0' b")
        check(r["stdout"]["cut_bytes"] == 1000000 - 65536, "the default 64 KiB", r["stdout"]["cut_bytes"])

    async def long_work(self) -> None:
        # Progress while exec waits, when the call has a progress token.
        seen = []

        async def progress(value, total, message):
            seen.append((value, message))

        result = await self.client.call_tool(
            "exec", {"argv": ["sleep", "3"]}, progress_callback=progress
        )
        check(not result.is_error and result.structured_content["exit"]["code"] == 0, "slept", result)
        check(len(seen) >= 1 and seen[0][0] == 1, "a progress notification a second", seen)
        # Cancelling the call (the SDK sends notifications/cancelled) ends
        # the process, which was not handed back.
        # Cancelled once the command has said its pid (a fixed delay could
        # cancel a loaded machine's start before the command runs).
        pid_file = f"{self.root}/cancelled.pid"

        def said_its_pid() -> bool:
            return os.path.exists(pid_file) and open(pid_file).read().endswith("\n")

        async with anyio.create_task_group() as calls:

            async def cancelled_exec() -> None:
                await self.client.call_tool("exec", {"command": "echo $$ > cancelled.pid; exec sleep 300", "yield_ms": 60000})
                raise Check("the call was not cancelled")

            calls.start_soon(cancelled_exec)
            for _ in range(600):
                if said_its_pid():
                    break
                await anyio.sleep(0.05)
            calls.cancel_scope.cancel()
        check(said_its_pid(), "the cancelled exec's command ran", pid_file)
        pid = int(open(pid_file).read())
        for _ in range(600):
            if not alive(pid):
                break
            await anyio.sleep(0.05)
        check(not alive(pid), "the cancelled exec's process ended", pid)
        os.remove(pid_file)

    async def confinement(self) -> None:
        # Commands write beneath the root only.
        r = await self.call("exec", command=f"echo no > {self.outside}/escaped")
        check(r["exit"]["code"] != 0, "a write outside the root fails", r)
        check(not os.path.exists(f"{self.outside}/escaped"), "nothing written outside", self.outside)
        r = await self.call("exec", command="echo yes > inside.txt")
        check(r["exit"]["code"] == 0, "a write inside succeeds", r)
        with open(f"{self.root}/inside.txt", "rb") as f:
            check(f.read() == b"yes\n", "written inside", None)
        # No network by default: a TCP connect to the test's listener fails.
        script = f"import socket; socket.create_connection(('127.0.0.1', {self.port}), timeout=5)"
        r = await self.call("exec", argv=[self.python, "-c", script])
        check(r["exit"]["code"] == 1, "the connect fails", r)
        err = stream_bytes(r["stderr"])
        check(b"PermissionError" in err, "refused by the sandbox", err)
        # File tools: a path outside the root is refused with the tag.
        text = await self.fails("write_file", path=f"{self.outside}/f", content="x")
        check("[capexec:outside-directory]" in text, "outside-directory", text)
        text = await self.fails("read_file", path="../x")
        check("[capexec:outside-directory]" in text, "outside-directory", text)
        check(os.listdir(self.outside) == [], "nothing outside", os.listdir(self.outside))

    async def files(self) -> None:
        w = await self.call("write_file", path="dir/a.txt", content="one\ntwo\nthree\n")
        check(w["size"] == 14, "14 bytes written", w)
        r = await self.call("read_file", path="dir/a.txt", offset=1, limit=1)
        check(r["content"] == "two\n" and r["first_line"] == 2, "line 2", r)
        check(r["version"] == w["version"], "the version read is the version written", r)
        r = await self.call("read_file", path="dir/a.txt", byte_offset=4, byte_length=3)
        check(r["content"] == "two", "a byte range", r)
        # Compare-and-swap.
        old = await self.call("write_file", path="dir/cas.txt", content="v1")
        new = await self.call("write_file", path="dir/cas.txt", content="v2", if_version=old["version"])
        text = await self.fails("write_file", path="dir/cas.txt", content="lost", if_version=old["version"])
        check("[capexec:conflict]" in text, "a stale if_version conflicts", text)
        check(open(f"{self.root}/dir/cas.txt", "rb").read() == b"v2", "the newer write stands", new)
        await self.call("remove_path", path="dir/cas.txt")
        # edit_file is refused whole when one edit does not match.
        before = open(f"{self.root}/dir/a.txt", "rb").read()
        text = await self.fails("edit_file", path="dir/a.txt", edits=[
            {"old_text": "one", "new_text": "ONE"},
            {"old_text": "absent", "new_text": "x"},
        ])
        check(text == "capexec: edit_file: edit 2 of 2: old_text was found 0 times, expected 1 (old_text "
              "must match the file exactly, whitespace and line ends included); nothing was changed",
              "the failing edit is named", text)
        check(open(f"{self.root}/dir/a.txt", "rb").read() == before, "the file is byte-identical", None)
        e = await self.call("edit_file", path="dir/a.txt", edits=[
            {"old_text": "one", "new_text": "ONE"},
            {"old_text": "three", "new_text": "3"},
        ])
        check(e["replacements"] == 2, "two replacements", e)
        check(open(f"{self.root}/dir/a.txt", "rb").read() == b"ONE\ntwo\n3\n", "edited", None)
        listing = await self.call("list_directory", path="dir", depth=2)
        check([x["path"] for x in listing["entries"]] == ["dir/a.txt"], "the listing", listing)
        found = await self.call("search_files", pattern="^tw", path=".")
        check([(m["path"], m["line"], m["text"]) for m in found["matches"]] == [("dir/a.txt", 2, "two")], "found", found)
        info = await self.call("file_info", path="dir/a.txt")
        check(info["type"] == "file" and info["size"] == 10, "file_info", info)
        await self.call("make_directory", path="dir/sub")
        m = await self.call("move_path", **{"from": "dir/a.txt", "to": "dir/sub/b.txt"})
        check(m["to"] == "dir/sub/b.txt", "moved", m)
        check(os.path.exists(f"{self.root}/dir/sub/b.txt") and not os.path.exists(f"{self.root}/dir/a.txt"), "moved on disk", None)
        rm = await self.call("remove_path", path="dir", recursive=True)
        check(rm["removed"] == 3, "removed dir, sub and b.txt", rm)
        check(not os.path.exists(f"{self.root}/dir"), "gone", None)


async def main(config: dict) -> None:
    if config["transport"] == "stdio":
        command = config["command"]
        server = StdioServerParameters(command=command[0], args=command[1:], env=config.get("env"))
        async with Client(server, read_timeout_seconds=120) as client:
            await Agent(client, config).run()
    else:
        headers = {"Authorization": f"Bearer {config['token']}"} if config.get("token") else None
        async with create_mcp_http_client(headers=headers) as http:
            async with Client(streamable_http_client(config["url"], http_client=http), read_timeout_seconds=120) as client:
                await Agent(client, config).run()


def leaves(error: BaseException):
    """The exceptions inside (nested) exception groups."""
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from leaves(inner)
    else:
        yield error


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    try:
        asyncio.run(main(config))
    except BaseException as error:
        for leaf in leaves(error):
            if isinstance(leaf, Check):
                print(f"drive_tools.py ({config['transport']}): FAILED: {leaf}", file=sys.stderr)
            else:
                print(f"drive_tools.py ({config['transport']}): FAILED with an exception:", file=sys.stderr)
                traceback.print_exception(leaf)
        sys.exit(1)
    print(f"drive_tools.py ({config['transport']}): every check passed")
