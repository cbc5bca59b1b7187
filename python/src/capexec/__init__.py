"""capexec: a Python client of capexec servers (asyncio, over pycapnp).

    import capexec

    async with await capexec.connect("unix:/run/user/1000/capexec/capexec.sock") as conn:
        done = await conn.executor.run(["echo", "hello"])
        assert done.stdout == b"hello\\n"
"""

from __future__ import annotations

from . import errors
from .connection import Connection, connect, local
from .errors import CapexecError, ConnectError
from .executor import Environment, Executor, ExecutorInfo

__all__ = [
    "CapexecError",
    "ConnectError",
    "Connection",
    "Environment",
    "Executor",
    "ExecutorInfo",
    "connect",
    "errors",
    "local",
]
