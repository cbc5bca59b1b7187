from __future__ import annotations

import capexec


async def test_info_over_each_transport(connection: capexec.Connection) -> None:
    info = await connection.executor.info()
    assert info.environment == "local"
    assert "start" in info.features
    await connection.established()
