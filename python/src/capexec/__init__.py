"""capexec: a Python client of capexec servers (asyncio, over pycapnp).

    import capexec

    async with await capexec.connect("unix:/run/user/1000/capexec/capexec.sock") as conn:
        done = await conn.executor.run(["echo", "hello"])
        assert done.stdout == b"hello\\n"

See python/README.md for connecting, processes, files, ports and errors.
"""

from __future__ import annotations

from . import errors
from .connection import CONNECT_TIMEOUT, Connection, connect, local
from .errors import (
    CapexecError,
    ChangedCertificate,
    CommandFailed,
    ConnectError,
    UnknownCertificate,
)
from .executor import Completed, Environment, Executor, ExecutorInfo, Limits, Sandbox
from .process import (
    Closed,
    Event,
    ExitStatus,
    Exited,
    Gap,
    Output,
    Process,
    ProcessInfo,
    ReadResult,
    ResourceUsage,
    WriteStatus,
)

__all__ = [
    "CONNECT_TIMEOUT",
    "CapexecError",
    "ChangedCertificate",
    "Closed",
    "CommandFailed",
    "Completed",
    "ConnectError",
    "Connection",
    "Environment",
    "Event",
    "ExitStatus",
    "Exited",
    "Executor",
    "ExecutorInfo",
    "Gap",
    "Limits",
    "Output",
    "Process",
    "ProcessInfo",
    "ReadResult",
    "ResourceUsage",
    "Sandbox",
    "UnknownCertificate",
    "WriteStatus",
    "connect",
    "errors",
    "local",
]
