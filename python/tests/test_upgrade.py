"""An upgrade of the server (`capexec upgrade`) ends nothing a client can
restore: after reconnecting, `restore(token)` gives back the process with
its retained output and sequence numbers, and its stdin goes on."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import capexec

from capexec_servers import capexec_binary, isolated_env, start_server


async def test_a_restored_process_goes_on_across_an_upgrade(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # The server runs from a copy: an upgrade executes what is at its path.
    binary = tmp_path / "capexec"
    shutil.copy(capexec_binary(), binary)
    admin = tmp_path / "admin.sock"
    server = start_server(
        home, [f"unix:{tmp_path / 's.sock'}"], ["--admin", f"unix:{admin}"], binary=str(binary)
    )
    try:
        connection = await capexec.connect(server.unix)
        proc = await connection.executor.start(["sh", "-c", "echo before; read x; echo after $x; exit 6"])
        token = await proc.detachable(60)
        seen = b""
        async for event in proc.events():
            if isinstance(event, capexec.Output):
                seen += event.data
            if seen == b"before\n":
                break
        upgraded = subprocess.run(
            [capexec_binary(), "upgrade", "--connect", f"unix:{admin}"],
            env=isolated_env(home),
            capture_output=True,
            timeout=60,
        )
        assert upgraded.returncode == 0, upgraded.stderr
        await connection.close()
        again_connection = await capexec.connect(server.unix)
        async with again_connection:
            again = await again_connection.executor.restore(token)
            async with again:
                await again.write(b"x\n")
                assert (await again.wait()).code == 6
                outputs = [e async for e in again.events() if isinstance(e, capexec.Output)]
                assert b"".join(e.data for e in outputs) == b"before\nafter x\n"
                assert [e.seq for e in outputs] == [1, 2]
    finally:
        server.stop()
