"""TCP transports, plaintext or TLS, for pycapnp."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl as _ssl
from typing import Any

import capnp  # type: ignore[import-untyped]

from ._address import TcpAddress
from .errors import ConnectError


async def _resolve(address: TcpAddress) -> list[tuple[Any, ...]]:
    loop = asyncio.get_running_loop()
    try:
        return await loop.getaddrinfo(
            address.host, address.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except OSError as error:
        raise ConnectError(
            f"cannot connect to {address}: {error.strerror or error}", address=str(address)
        ) from error


def _is_loopback(info: tuple[Any, ...]) -> bool:
    host = info[4][0]
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


async def open_tcp(
    address: TcpAddress, tls: Any, *, plaintext_only_to_loopback: bool
) -> Any:
    """A pycapnp stream to `address`, over TLS if `tls` is given. Without
    TLS and with `plaintext_only_to_loopback`, a host that does not resolve
    to loopback addresses only is refused before anything is sent (checked
    on the addresses connected to, not on the name)."""
    resolved = await _resolve(address)
    loopback = bool(resolved) and all(_is_loopback(info) for info in resolved)
    if tls is None and plaintext_only_to_loopback and not loopback:
        raise ConnectError(
            f"refusing to send the login token in clear text to {address.host}: give tls=True "
            "(trust on first use), tls_ca=FILE or tls_pin=SHA256 (or insecure_plaintext=True "
            "over a network you trust)",
            address=str(address),
        )
    last: OSError | None = None
    for family, kind, proto, _, sockaddr in resolved:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError as error:
            last = error
            continue
        try:
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, sockaddr)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as error:
            sock.close()
            last = error
            continue
        if tls is None:
            return await capnp.AsyncIoStream.create_connection(sock=sock)
        return await tls.handshake(address, sock)
    message = (last.strerror or str(last)) if last is not None else "the name resolves to no address"
    raise ConnectError(f"cannot connect to {address}: {message}", address=str(address)) from last


async def speaks_tls(address: TcpAddress, *, timeout: float) -> bool:
    """Whether the server at `address` completes a TLS handshake."""
    context = _ssl.SSLContext(_ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = _ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(address.host, address.port, ssl=context), timeout=timeout
        )
    except (OSError, asyncio.TimeoutError, _ssl.SSLError):
        return False
    writer.close()
    try:
        await writer.wait_closed()
    except (OSError, _ssl.SSLError):
        pass
    return True
