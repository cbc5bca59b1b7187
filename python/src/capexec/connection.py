"""Connections to a capexec server: `connect`, `local`, `Connection`."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from types import TracebackType
from typing import TYPE_CHECKING, Any

import capnp  # type: ignore[import-untyped]

from . import _address, _kj, _tls, errors
from ._schema import schema
from .errors import ConnectError

if TYPE_CHECKING:
    from .executor import Executor

__all__ = ["CONNECT_TIMEOUT", "Connection", "connect", "local"]

#: How long connecting, the TLS handshake and the server's first answer may
#: take by default (the command line's too).
CONNECT_TIMEOUT = 10.0


def _show_duration(seconds: float) -> str:
    """A duration as the command line shows it: "10 s", "0.25 s", "2 min"."""
    whole = seconds == int(seconds)
    if whole and seconds >= 3600 and int(seconds) % 3600 == 0:
        return f"{int(seconds) // 3600} h"
    if whole and seconds >= 60 and int(seconds) % 60 == 0:
        return f"{int(seconds) // 60} min"
    text = f"{seconds:.3f}".rstrip("0").rstrip(".")
    return f"{text} s"


class Connection:
    """A live connection to a capexec server.

    Capabilities obtained through it work while it lives; closing it (or
    leaving `async with conn:`) ends the connection, which releases, and so
    terminates, every process started through it that was not detached.
    """

    def __init__(
        self,
        *,
        address: str,
        client: Any,
        stream: Any,
        executor: Any,
        first_answer: Any,
        deadline: float,
        lease: _kj.Lease,
        probe_tls: _address.TcpAddress | None = None,
    ) -> None:
        self._address = address
        self._client = client
        self._stream = stream
        self._executor_client = executor
        self._lease = lease
        self._closed = False
        self._probe_tls = probe_tls
        self._established = asyncio.ensure_future(self._establish(first_answer, deadline))
        self._ended: asyncio.Future[None] = asyncio.ensure_future(self._watch(client))

    @staticmethod
    async def _watch(client: Any) -> None:
        try:
            await client.on_disconnect()
        except Exception:  # noqa: BLE001 - ended either way
            pass

    def _lost(self) -> asyncio.Future[None]:
        return self._ended

    def _check_open(self) -> None:
        if self._closed:
            raise errors.Disconnected(f"the connection to {self._address} is closed")

    @property
    def address(self) -> str:
        """The address connected to (`unix:PATH` or `tcp:HOST:PORT`)."""
        return self._address

    @property
    def executor(self) -> Executor:
        """The server's Executor. Over TCP it is the pipelined result of the
        login: using it right away costs no extra round trip, and a refused
        login makes its calls fail with `Unauthenticated`."""
        from .executor import Executor

        if self._executor_client is None:
            raise errors.Disconnected(f"the connection to {self._address} is closed")
        return Executor._from_client(self._executor_client, self)

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._closed

    async def established(self) -> None:
        """Waits until the server has answered (the login over TCP, a cheap
        call over a Unix socket). Raises `Unauthenticated` if it refused the
        login, ConnectError if it did not answer within the connect
        timeout or closed the connection first. Calls made meanwhile on
        `executor` travel pipelined and need not wait for this."""
        failure = await asyncio.shield(self._established)
        if failure is not None:
            raise failure

    async def _establish(self, first_answer: Any, deadline: float) -> BaseException | None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(first_answer, timeout=max(deadline - loop.time(), 0.0))
        except asyncio.TimeoutError:
            return ConnectError(
                f"cannot connect to {self._address}: no answer within "
                f"{_show_duration(self._timeout)} (is a capexec server listening there?)",
                address=self._address,
            )
        except capnp.KjException as error:
            return await self._failed(error)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - pycapnp raises others on a closed client
            return ConnectError(f"cannot connect to {self._address}: {error}", address=self._address)
        return None

    _timeout = CONNECT_TIMEOUT

    async def _failed(self, error: BaseException) -> BaseException:
        translated = errors.translate(error)
        if isinstance(translated, errors.RefusalError):
            return translated
        if self._closed:
            return ConnectError(
                f"cannot connect to {self._address}: the connection was closed before the "
                "server answered",
                address=self._address,
            )
        if isinstance(translated, errors.Disconnected):
            if self._probe_tls is not None:
                if await _tls.speaks_tls(self._probe_tls, timeout=min(self._timeout, 5.0)):
                    return ConnectError(
                        f"the server at {self._address} speaks TLS: give tls_pin=, tls_ca= "
                        "or tls=True (trust on first use)",
                        address=self._address,
                    )
            return ConnectError(
                f"cannot connect to {self._address}: the server closed the connection "
                "before answering",
                address=self._address,
            )
        sentence = translated.sentence if isinstance(translated, errors.CapexecError) else str(error)
        return ConnectError(f"cannot connect to {self._address}: {sentence}", address=self._address)

    async def _failure(self) -> BaseException | None:
        """Why the connection could not be established, once that is known
        (waiting briefly: a broken connection fails its first answer in the
        same turn as the call that asks)."""
        if not self._established.done():
            await asyncio.wait({self._established}, timeout=1.0)
        if not self._established.done() or self._established.cancelled():
            return None
        failure = self._established.result()
        return failure if isinstance(failure, ConnectError) else None

    async def close(self) -> None:
        """Ends the connection (idempotent). Capabilities still held fail
        with `Disconnected` from then on."""
        if self._closed:
            return
        self._closed = True
        if not self._established.done():
            self._established.cancel()
        try:
            await asyncio.gather(self._established, return_exceptions=True)
            if not self._ended.done():
                self._ended.cancel()
            await asyncio.gather(self._ended, return_exceptions=True)
            self._executor_client = None
            self._client.close()
            self._stream.close()
        finally:
            await self._lease.release()

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<capexec.Connection {self._address} {state}>"


async def _open_unix(path: str) -> Any:
    try:
        return await capnp.AsyncIoStream.create_unix_connection(path=path)
    except ConnectionRefusedError as error:
        if os.path.isdir(path):
            why = f"{path} is a directory, not a socket"
        elif os.path.exists(path) and not _is_socket(path):
            why = f"{path} is not a socket"
        else:
            why = (
                f"nothing is listening on {path} (the server is gone; the socket file was "
                "left behind)"
            )
        raise ConnectError(f"cannot connect to unix:{path}: {why}", address=f"unix:{path}") from error
    except OSError as error:
        raise ConnectError(
            f"cannot connect to unix:{path}: {_os_message(error)}", address=f"unix:{path}"
        ) from error


def _is_socket(path: str) -> bool:
    import stat

    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def _os_message(error: OSError) -> str:
    """An OSError as the command line says it ("No such file or
    directory"), without the errno and path Python adds."""
    return error.strerror or str(error)


async def connect_address(
    address: _address.Address,
    *,
    token: str | None = None,
    tls: _tls.ClientTls | None = None,
    plaintext_only_to_loopback: bool = True,
    connect_timeout: float | None = None,
    environment: str | None = None,
) -> Connection:
    """Connects to `address` (parsed), logging in with `token` over TCP,
    over TLS if `tls` is given; `environment` (names joined by "/") picks
    the executor of that environment. Returns as soon as the transport is
    up: the login, and the environment hops, travel pipelined with the
    first calls."""
    timeout = CONNECT_TIMEOUT if connect_timeout is None else connect_timeout
    lease = await _kj.acquire()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        text = str(address)
        probe: _address.TcpAddress | None = None
        if isinstance(address, _address.UnixAddress):
            if tls is not None:
                raise ConnectError(
                    f"cannot connect to {text}: TLS is for tcp: addresses; a Unix socket is "
                    "protected by its file permissions",
                    address=text,
                )
            stream = await _within(_open_unix(address.path), text, timeout)
        else:
            if token is None:
                raise ConnectError(
                    f"{text} needs a login token (token_file= or CAPEXEC_TOKEN)", address=text
                )
            stream = await _within(
                _tls.open_tcp(address, tls, plaintext_only_to_loopback=plaintext_only_to_loopback),
                text,
                timeout,
            )
            if tls is None:
                probe = address
        client = capnp.TwoPartyClient(stream)
        if token is None:
            executor = client.bootstrap().cast_as(schema.Executor)
            # A cheap call the server answers itself, sent with the
            # caller's first ones: any answer shows a server is there.
            first = executor.environments()
        else:
            gatekeeper = client.bootstrap().cast_as(schema.Gatekeeper)
            login = gatekeeper.login(token=token)
            # Pipelined: the executor is usable before the login answers.
            executor = login.executor
            first = login
        if environment is not None and environment != "local":
            for hop in environment.split("/"):
                executor = executor.environment(hop).executor
        connection = Connection(
            address=text,
            client=client,
            stream=stream,
            executor=executor,
            first_answer=first,
            deadline=deadline,
            lease=lease,
            probe_tls=probe,
        )
        connection._timeout = timeout
        return connection
    except BaseException:
        await lease.release()
        raise


async def _within(opening: Any, address: str, timeout: float) -> Any:
    try:
        return await asyncio.wait_for(opening, timeout=timeout)
    except asyncio.TimeoutError:
        raise ConnectError(
            f"cannot connect to {address}: no answer within {_show_duration(timeout)} "
            "(is a capexec server listening there?)",
            address=address,
        ) from None


async def connect(
    address: str | None = None,
    *,
    token_file: str | os.PathLike[str] | None = None,
    tls: bool = False,
    tls_pin: str | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
    tls_accept_new: bool = False,
    insecure_plaintext: bool = False,
    environment: str | None = None,
    connect_timeout: float | None = None,
) -> Connection:
    """Connects to a capexec server, as `capexec run --connect` does.

    `address` is `unix:PATH`, `tcp:HOST:PORT` (or as people type them,
    `HOST:PORT` and `/path/to.sock`), `local` (the default socket) or the
    name of a server in the configuration file; None means
    $CAPEXEC_CONNECT, else `local`.

    A tcp: address logs in with the token of `token_file`, else the named
    server's token file, else $CAPEXEC_TOKEN, else the default token file.
    TLS: `tls_pin` (the SHA-256 fingerprint `capexec serve` prints),
    `tls_ca` (a PEM file: a CA, or the server's own certificate) or `tls`
    (trust on first use against the known-servers file: an unknown
    certificate raises UnknownCertificate unless `tls_accept_new`, which
    remembers it; a changed one raises ChangedCertificate), else what the
    configuration file says, else TLS if the known-servers file remembers a
    certificate for the address. Without TLS the token goes in clear text
    only to addresses that resolve to loopback, unless
    `insecure_plaintext`. `environment` ("gpu", or hops "a/b") is the
    environment `executor` runs in (default: the named server's, else the
    server's default).

    Returns once the transport is up; the login travels pipelined with the
    first calls (`await conn.established()` waits for it). Raises
    ConnectError (UnknownCertificate, ChangedCertificate) saying what is
    wrong and what to do.
    """
    from . import config

    target = config.resolve(
        address,
        token_file=token_file,
        tls=tls,
        tls_pin=tls_pin,
        tls_ca=tls_ca,
        tls_accept_new=tls_accept_new,
        insecure_plaintext=insecure_plaintext,
    )

    async def attempt(trust: config.Trust) -> Connection:
        return await connect_address(
            target.address,
            token=target.token,
            tls=None if trust.kind == "plaintext" else _tls.ClientTls(trust),
            plaintext_only_to_loopback=not target.insecure_plaintext,
            connect_timeout=connect_timeout,
            environment=environment if environment is not None else target.environment,
        )

    try:
        return await attempt(target.trust)
    except errors.UnknownCertificate as unknown:
        file = target.trust.known_file
        if not target.tls_accept_new or file is None:
            raise
        config.remember_known(file, target.address, unknown.offered)
        known = config.Known(bytes.fromhex(unknown.offered), 0)
        return await attempt(dataclasses.replace(target.trust, known=known))


async def local(*, connect_timeout: float | None = None) -> Connection:
    """Connects to the server on this machine's default socket
    ($XDG_RUNTIME_DIR/capexec/capexec.sock; for root
    /run/capexec/capexec.sock), as `--connect local` does."""
    try:
        path = _address.default_socket_path()
    except ValueError as error:
        raise ConnectError(f"local: {error}") from None
    return await connect_address(_address.UnixAddress(path), connect_timeout=connect_timeout)
