#!/usr/bin/env python3
"""capexec as a deepagents sandbox backend, without a model.

Opens a `CapexecSandbox` confined to a fresh directory of the server, then
does what a deep agent's tools do: writes a file, edits it, reads it,
lists, globs and greps, runs a command, and checks that a path outside the
directory is refused. Exits 0 only if every step gave the expected result.

    pip install './python[deepagents]'
    python3 python/examples/deepagents_backend.py [ADDRESS] [--token-file FILE]

ADDRESS is anything `capexec.connect` takes (unix:PATH, tcp:HOST:PORT, a
server named in the configuration file); without it, $CAPEXEC_CONNECT or
the local server's default socket.
"""

from __future__ import annotations

import argparse
import sys

from capexec.integrations.deepagents import CapexecSandbox


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("address", nargs="?")
    parser.add_argument("--token-file")
    args = parser.parse_args()
    failures: list[str] = []

    def check(what: str, ok: bool) -> None:
        print(f"{'ok' if ok else 'FAILED'}: {what}", file=sys.stderr)
        if not ok:
            failures.append(what)

    # Without a root: a new directory on the server, removed when the sandbox closes.
    with CapexecSandbox.open(connect=args.address, token_file=args.token_file) as sandbox:
        root = sandbox.root
        check("write", sandbox.write(f"{root}/src/app.py", "print('hello')\n").error is None)
        edited = sandbox.edit(f"{root}/src/app.py", "hello", "hello, capexec")
        check("edit", edited.error is None and edited.occurrences == 1)
        read = sandbox.read(f"{root}/src/app.py")
        check("read", read.file_data is not None and read.file_data["content"] == "print('hello, capexec')")
        listing = sandbox.ls(root)
        check("ls", [e["path"] for e in listing.entries or []] == [f"{root}/src"])
        globbed = sandbox.glob("*.py", path=root)
        check("glob", [m["path"] for m in globbed.matches or []] == [f"{root}/src/app.py"])
        grepped = sandbox.grep("capexec", path=root)
        check("grep", grepped.matches == [{"path": f"{root}/src/app.py", "line": 1, "text": "print('hello, capexec')"}])
        ran = sandbox.execute("cat src/app.py; echo to stderr >&2; exit 7")
        check("execute", (ran.output, ran.exit_code) == ("print('hello, capexec')\nto stderr\n", 7))
        refused = sandbox.read(f"{root}/../etc/passwd")
        check("a path outside the root is refused", refused.file_data is None and refused.error is not None)
        escaped = sandbox.execute("echo x > /tmp/capexec-example-escape.txt")
        check("a command cannot write outside the root", escaped.exit_code != 0)
    print("all steps worked" if not failures else f"{len(failures)} step(s) failed", file=sys.stderr)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
