"""The Executor: runs processes on the server's machine, hands out its
directories, environments and restricted versions of itself."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import _rpc, errors
from .process import (
    Closed,
    ExitStatus,
    Exited,
    Gap,
    Output,
    Process,
    _Feeder,
    _get_unless,
    _Subscription,
)

if TYPE_CHECKING:
    from .directory import Directory
    from .ports import Forward

__all__ = [
    "Arg",
    "Completed",
    "Environment",
    "Executor",
    "ExecutorInfo",
    "Limits",
    "PathArg",
    "Sandbox",
]

#: A path, as `os.fsencode` takes it.
PathArg = str | bytes | os.PathLike[str] | os.PathLike[bytes]
#: An argument of argv.
Arg = str | bytes | os.PathLike[str] | os.PathLike[bytes]
#: Environment changes: a value sets the variable, None unsets it.
EnvArg = Mapping[str, str | bytes | None] | Mapping[bytes, str | bytes | None]


def _fsbytes(value: PathArg) -> bytes:
    return os.fsencode(value)


def _argv(argv: Sequence[Arg]) -> list[bytes]:
    if isinstance(argv, (str, bytes, bytearray, memoryview)):
        raise TypeError(
            "argv is a sequence of arguments, not one string: write [\"sh\", \"-c\", command] "
            "to run a shell command"
        )
    args = [os.fsencode(arg) for arg in argv]
    if not args:
        raise ValueError("argv is empty: it needs at least the program")
    return args


@dataclass(frozen=True)
class ExecutorInfo:
    """What an executor reports about itself (`Executor.info`)."""

    version: str
    features: tuple[str, ...]
    os: str
    arch: str
    hostname: str
    default_shell: bytes
    cwd: bytes
    temp_dir: bytes
    #: Where starts run: "local", or the environments' path ("b/c").
    environment: str


@dataclass(frozen=True)
class Environment:
    """An environment a server offers (`Executor.environments`)."""

    name: str
    #: The upstream's address; empty for "local".
    address: str
    is_default: bool
    #: "local", "idle", "connecting", "connected" or "failed".
    state: str
    #: Why the last attempt failed ("failed" only).
    reason: str | None = None
    #: Milliseconds until the next use may try again ("failed" only).
    retry_in_ms: int | None = None


@dataclass(frozen=True)
class Sandbox:
    """Confinement of a process and all it starts (see the schema's
    `Sandbox`): the system directories read-only, the working directory
    writable (unless `read_only_cwd`), no network unless `network="all"`."""

    read_only: Sequence[PathArg] = ()
    writable: Sequence[PathArg] = ()
    #: "none" (Unix sockets only) or "all".
    network: str = "none"
    no_system_roots: bool = False
    read_only_cwd: bool = False
    best_effort: bool = False
    allow_namespaces: bool = False
    keep_root: bool = False
    leave_out_secrets: bool = False
    read_only_inside: Sequence[PathArg] = ()

    def _to_wire(self) -> dict[str, Any]:
        return {
            "readOnly": [_fsbytes(path) for path in self.read_only],
            "writable": [_fsbytes(path) for path in self.writable],
            "network": self.network,
            "noSystemRoots": self.no_system_roots,
            "readOnlyCwd": self.read_only_cwd,
            "bestEffort": self.best_effort,
            "allowNamespaces": self.allow_namespaces,
            "keepRoot": self.keep_root,
            "leaveOutSecrets": self.leave_out_secrets,
            "readOnlyInside": [_fsbytes(path) for path in self.read_only_inside],
        }


@dataclass(frozen=True)
class Limits:
    """Resource limits of the whole process tree (a cgroup); 0: none."""

    memory_bytes: int = 0
    max_pids: int = 0
    #: CPU in thousandths of a CPU (1500: one and a half).
    cpu_millis: int = 0
    best_effort: bool = False

    def _to_wire(self) -> dict[str, Any]:
        return {
            "memoryBytes": self.memory_bytes,
            "maxPids": self.max_pids,
            "cpuMillis": self.cpu_millis,
            "bestEffort": self.best_effort,
        }


def _wire_struct(value: Sandbox | Limits | Mapping[str, Any]) -> Any:
    if isinstance(value, (Sandbox, Limits)):
        return value._to_wire()
    return dict(value)


@dataclass(frozen=True)
class Completed:
    """A finished `run`: its exit status and all its output."""

    argv: list[bytes]
    #: The exit code, None if a signal ended it.
    exit_code: int | None
    #: The number of the signal that ended it, else None.
    signal: int | None
    stdout: bytes
    stderr: bytes
    status: ExitStatus = field(repr=False, default_factory=lambda: ExitStatus(code=None))

    @property
    def returncode(self) -> int:
        """As subprocess says it: the code, or minus the signal number."""
        return self.status.returncode

    def check(self) -> Completed:
        """Raises CommandFailed unless it exited with code 0."""
        if self.exit_code != 0:
            raise errors.CommandFailed(self.argv, self.status, self.stdout, self.stderr)
        return self


def _env_changes(env: EnvArg | None) -> tuple[list[dict[str, bytes]], list[bytes]]:
    setting: list[dict[str, bytes]] = []
    unsetting: list[bytes] = []
    for name, value in (env or {}).items():
        key = os.fsencode(name)
        if value is None:
            unsetting.append(key)
        else:
            setting.append({"name": key, "value": os.fsencode(value)})
    return setting, unsetting


def _start_params(
    argv: Sequence[Arg],
    *,
    cwd: PathArg | None,
    env: EnvArg | None,
    clear_env: bool,
    arg0: Arg | None,
    tty: bool | tuple[int, int],
    term: str | None,
    pipe_stdin: bool,
    flow: str,
    timeout: float | None,
    sandbox: Sandbox | Mapping[str, Any] | None,
    limits: Limits | Mapping[str, Any] | None,
) -> dict[str, Any]:
    if flow not in ("retain", "lossless"):
        raise ValueError(f"flow is 'retain' or 'lossless', not {flow!r}")
    params: dict[str, Any] = {"argv": _argv(argv), "flow": flow, "pipeStdin": pipe_stdin}
    if cwd is not None:
        params["cwd"] = _fsbytes(cwd)
    setting, unsetting = _env_changes(env)
    if setting:
        params["setEnv"] = setting
    if unsetting:
        params["unsetEnv"] = unsetting
    if clear_env:
        params["clearEnv"] = True
    if arg0 is not None:
        params["arg0"] = os.fsencode(arg0)
    if tty:
        params["tty"] = True
        if isinstance(tty, tuple):
            cols, rows = tty
            params["ptySize"] = {"rows": rows, "cols": cols}
        if term is not None:
            params["term"] = term.encode()
    if timeout is not None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        params["timeoutMs"] = max(1, int(timeout * 1000 + 0.5))
    if sandbox is not None:
        params["sandbox"] = _wire_struct(sandbox)
    if limits is not None:
        params["limits"] = _wire_struct(limits)
    return params


class Executor:
    """A capability to run processes (see the schema's `Executor`).

    Get one from `Connection.executor`; `environment`, `restrict` and
    `Directory.executor` make others. Those are pipelined: they cost no
    round trip, and their calls travel with the call that makes them.
    """

    def __init__(self, client: Any, owner: _rpc.Owner | None = None) -> None:
        self._client = client
        # What must live as long as this executor (its connection), and
        # says why it failed if it never came up.
        self._owner = owner

    @classmethod
    def _from_client(cls, client: Any, owner: Any = None) -> Executor:
        return cls(client, owner)

    @property
    def client(self) -> Any:
        """The pycapnp `Executor` client, for calls this class lacks.
        Disconnected once its connection was closed."""
        _rpc.check_open(self._owner)
        return self._client

    # -- what it is ----------------------------------------------------------------

    async def info(self) -> ExecutorInfo:
        """What the executor reports about itself (through a chain: the far
        end, where starts run)."""
        info = (await _rpc.call(self.client.info(), self._owner)).info
        return ExecutorInfo(
            version=str(info.version),
            features=tuple(str(name) for name in info.features),
            os=str(info.os),
            arch=str(info.arch),
            hostname=str(info.hostname),
            default_shell=bytes(info.defaultShell),
            cwd=bytes(info.cwd),
            temp_dir=bytes(info.tempDir),
            environment=str(info.environment),
        )

    async def environments(self) -> list[Environment]:
        """The environments the server offers, "local" first, with their
        states."""
        answer = await _rpc.call(self.client.environments(), self._owner)
        result = []
        for env in answer.environments:
            state = str(env.state.which())
            failed = state == "failed"
            result.append(
                Environment(
                    name=str(env.name),
                    address=str(env.address),
                    is_default=bool(env.isDefault),
                    state=state,
                    reason=str(env.state.failed.reason) if failed else None,
                    retry_in_ms=int(env.state.failed.retryInMs) if failed else None,
                )
            )
        return result

    # -- other capabilities (pipelined) -----------------------------------------------

    def environment(self, name: str) -> Executor:
        """The executor of environment `name` ("local", an upstream's name,
        or hops joined by "/": "build/gpu"). Pipelined; an unknown name
        makes the first call fail with `UnknownEnvironment`."""
        client = self.client
        for hop in name.split("/"):
            # Positional: pycapnp takes a parameter called `name` for its own.
            client = client.environment(hop).executor
        return Executor(client, self._owner)

    def restrict(
        self,
        *,
        programs: Sequence[PathArg] | None = None,
        cwd_roots: Sequence[PathArg] | None = None,
        env: Mapping[str, str | bytes] | Mapping[bytes, str | bytes] | None = None,
        settable_env: Sequence[str | bytes] | None = None,
        forbid_tty: bool = False,
        max_processes: int = 0,
        max_run_time: float | None = None,
        sandbox: Sandbox | Mapping[str, Any] | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        ports: Mapping[str, Any] | None = None,
    ) -> Executor:
        """An executor that can do less (see the schema's `Policy`): only
        `programs` (paths, or names looked up on the server's PATH), only
        working directories under `cwd_roots`, exactly the environment
        `env` plus the changes `settable_env` allows, no terminal, at most
        `max_processes` at once, each ended after `max_run_time` seconds,
        within `sandbox` and `limits`; `ports` is the wire `PortPolicy`
        (`{"dial": [...], "listen": [...]}`). None leaves a rule as the
        executor has it. Pipelined: a policy that cannot be resolved makes
        the first call fail (`InvalidArgument`, `NotAllowed`)."""
        policy: dict[str, Any] = {}
        if programs is not None:
            policy["programs"] = [_fsbytes(program) for program in programs]
        if cwd_roots is not None:
            policy["cwdRoots"] = [_fsbytes(root) for root in cwd_roots]
        if env is not None:
            policy["environment"] = [
                {"name": os.fsencode(name), "value": os.fsencode(value)}
                for name, value in env.items()
            ]
        if settable_env is not None:
            policy["settableEnv"] = [os.fsencode(name) for name in settable_env]
        if forbid_tty:
            policy["forbidTty"] = True
        if max_processes:
            policy["maxProcesses"] = max_processes
        if max_run_time is not None:
            policy["maxRunTimeMs"] = max(1, int(max_run_time * 1000 + 0.5))
        if sandbox is not None:
            policy["sandbox"] = _wire_struct(sandbox)
        if limits is not None:
            policy["limits"] = _wire_struct(limits)
        if ports is not None:
            policy["ports"] = dict(ports)
        return Executor(self.client.restrict(policy=policy).executor, self._owner)

    def directory(self, path: PathArg) -> Directory:
        """The directory `path` of the executor's machine, as a capability
        (pipelined: it costs no round trip; a missing directory makes the
        first call on it fail)."""
        from .directory import Directory

        return Directory(self.client.directory(path=_fsbytes(path)).dir, _owner=self._owner)

    # -- processes ---------------------------------------------------------------------

    async def start(
        self,
        argv: Sequence[Arg],
        *,
        cwd: PathArg | None = None,
        env: EnvArg | None = None,
        clear_env: bool = False,
        arg0: Arg | None = None,
        stdin: bool = True,
        tty: bool | tuple[int, int] = False,
        term: str | None = None,
        flow: str = "retain",
        timeout: float | None = None,
        sandbox: Sandbox | Mapping[str, Any] | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
    ) -> Process:
        """Starts `argv` and returns the Process that owns it, once it runs.

        `env` changes the server's environment (a value sets, None unsets;
        `clear_env` starts from none). `stdin` keeps the child's stdin open
        as a pipe fed by `Process.write` (else /dev/null); `tty` runs it on
        a terminal ((cols, rows), else 80x24) whose TERM is `term`. `flow`:
        "retain" (the server keeps the latest 1 MiB of output; a reader
        that falls behind gets a `Gap`) or "lossless" (the child is held
        back until its output is read). `timeout` (seconds) ends its tree.

        A subscription from the first event travels with the start, so the
        first `events()` costs no further round trip. Refusals raise their
        class: ProgramNotFound, PermissionDenied, BadCwd, NotAllowed...
        """
        params = _start_params(
            argv,
            cwd=cwd,
            env=env,
            clear_env=clear_env,
            arg0=arg0,
            tty=tty,
            term=term,
            pipe_stdin=stdin and not tty,
            flow=flow,
            timeout=timeout,
            sandbox=sandbox,
            limits=limits,
        )
        started = self.client.start(params=params)
        process = Process(started.process, self._owner)
        process._presubscribe()
        try:
            await _rpc.call(started, self._owner)
        except BaseException:
            await process.release()
            raise
        del started
        return process

    async def restore(self, token: str) -> Process:
        """The process `Process.detachable` gave `token` to, from any
        connection to the same server. UnknownToken if it is unknown or
        expired."""
        restored = self.client.restore(token=token)
        process = Process(restored.process, self._owner)
        await _rpc.call(restored, self._owner)
        return process

    async def run(
        self,
        argv: Sequence[Arg],
        *,
        cwd: PathArg | None = None,
        env: EnvArg | None = None,
        clear_env: bool = False,
        arg0: Arg | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
        environment: str | None = None,
        sandbox: Sandbox | Mapping[str, Any] | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        check: bool = False,
    ) -> Completed:
        """Runs `argv` to completion and returns its exit status and all its
        output, as `subprocess.run(capture_output=True)` does.

        `stdin` is written to the child's stdin, then closed (without it,
        stdin is /dev/null). `timeout` (seconds) ends the process's tree on
        the server; the status then says `timed_out`. `environment` runs it
        in that environment of the server. `check` raises CommandFailed
        unless it exited with code 0. The start, the subscription to its
        output, the writes and the close of stdin travel together: a short
        command costs one round trip. Output is lossless: the child is held
        back while its output is not read, never dropped.
        """
        executor = self.environment(environment) if environment is not None else self
        params = _start_params(
            argv,
            cwd=cwd,
            env=env,
            clear_env=clear_env,
            arg0=arg0,
            tty=False,
            term=None,
            pipe_stdin=stdin is not None,
            flow="lossless",
            timeout=timeout,
            sandbox=sandbox,
            limits=limits,
        )
        client = executor.client
        owner = self._owner
        started = client.start(params=params)
        process = started.process
        subscription = _Subscription(process, 0)
        # The first writes and the close of stdin go with the start.
        feeding = (
            _Feeder(process, bytes(stdin), "run", owner, close=True) if stdin is not None else None
        )
        try:
            await _rpc.call(started, owner)
            # Held until the end: releasing it would stop the delivery.
            subscription.capability = _rpc.detach(
                (await _rpc.call(subscription.answer, owner)).subscription
            )
            del started
            stdout: list[bytes] = []
            stderr: list[bytes] = []
            status: ExitStatus | None = None
            lost = owner._lost() if owner is not None else None
            feeder = asyncio.ensure_future(_finish(feeding))
            try:
                done = False
                while not done:
                    if lost is not None and subscription.sink.queue.empty():
                        batch = await _get_unless(subscription.sink.queue, lost)
                    else:
                        batch = await subscription.sink.queue.get()
                    for event in batch:
                        if isinstance(event, Output):
                            (stderr if event.stream == "stderr" else stdout).append(event.data)
                        elif isinstance(event, Exited):
                            status = event.status
                        elif isinstance(event, Gap):
                            raise errors.OutputLost(event.from_seq, event.seq)
                        elif isinstance(event, Closed):
                            done = True
                            break
                await feeder
            finally:
                if not feeder.done():
                    feeder.cancel()
                await asyncio.gather(feeder, return_exceptions=True)
        finally:
            subscription.release()
            feeding = None
            process = None
            started = None
        if status is None:
            raise RuntimeError("the process closed without an exit event")
        completed = Completed(
            argv=list(params["argv"]),
            exit_code=status.code,
            signal=status.signal,
            stdout=b"".join(stdout),
            stderr=b"".join(stderr),
            status=status,
        )
        if check:
            completed.check()
        return completed

    # -- ports (ports.py) -------------------------------------------------------------

    async def dial(
        self, host: str, port: int | None = None, *, limit: int = 2**16
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to `host`:`port` (or an address: "tcp:HOST:PORT",
        "unix:/path") opened from the executor's machine, as asyncio
        streams (see `capexec.ports.dial`)."""
        from .ports import dial

        return await dial(self, host, port, limit=limit)

    def forward(self, local: str | int, remote: str | int) -> Forward:
        """Forwards `local` (a listening address here) to `remote` (dialled
        from the executor's machine), like `ssh -L`; use it as
        `async with ex.forward(...) as fwd:` (see `capexec.ports.forward`)."""
        from .ports import forward

        return forward(self, local, remote)


async def _finish(feeding: _Feeder | None) -> None:
    """The writes and the close of stdin of a run. A child that closed its
    stdin early (or exited) is not an error: it did not want the rest."""
    if feeding is not None:
        await feeding.finish()
