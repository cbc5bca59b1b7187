"""TCP transports for pycapnp, plaintext or TLS, trusting a server's
certificate as the command line does (src/net/tls.rs, src/net/trust.rs):
a CA file (which may hold the server's own self-signed certificate), a
pinned SHA-256 fingerprint, or trust on first use against the
known-servers file. A refused certificate is refused during the
handshake: nothing (no token) is sent to the server."""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import os
import socket
import ssl
from typing import Any

import capnp  # type: ignore[import-untyped]

from ._address import TcpAddress
from .config import Trust
from .errors import ChangedCertificate, ConnectError, UnknownCertificate

__all__ = ["ClientTls", "fingerprint", "open_tcp", "speaks_tls"]


def fingerprint(der: bytes) -> str:
    """The SHA-256 of a DER certificate, in lowercase hex, as `capexec
    serve` prints it and `tls_pin` takes it."""
    return hashlib.sha256(der).hexdigest()


class _Verdict:
    """What the fingerprint check decided, for the error after the
    handshake failed."""

    def __init__(self) -> None:
        self.offered: str | None = None
        self.refused: str | None = None


class _Refused(ssl.SSLError):
    pass


def _checking_class(expect: bytes | None, first_use: bool, verdict: _Verdict) -> type[ssl.SSLObject]:
    """An SSLObject that, once the handshake is done (the server has
    proved it holds the key of the certificate it offered), accepts the
    certificate only if its fingerprint is `expect`."""

    class Checked(ssl.SSLObject):
        def do_handshake(self) -> None:
            super().do_handshake()
            der = self.getpeercert(binary_form=True)
            offered = fingerprint(der) if der else ""
            verdict.offered = offered
            if expect is None or bytes.fromhex(offered or "00") != expect:
                verdict.refused = "unknown" if first_use and expect is None else "mismatch"
                raise _Refused("the server's certificate is not trusted")

    return Checked


class ClientTls:
    """The client side of TLS, trusting as `trust` says (kind "ca", "pin"
    or "first-use")."""

    def __init__(self, trust: Trust) -> None:
        self.trust = trust

    def _context(self, verdict: _Verdict) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # The certificate is checked once, at the handshake: no TLS 1.2
        # renegotiation may bring another (rustls has none either).
        context.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
        if self.trust.kind == "ca":
            assert self.trust.ca is not None
            try:
                context.load_verify_locations(cafile=str(self.trust.ca))
            except (OSError, ssl.SSLError) as error:
                why = getattr(error, "strerror", None) or getattr(error, "reason", None) or str(error)
                raise ConnectError(
                    f"{self.trust.place} {self.trust.ca}: not a usable CA certificate ({why})"
                ) from None
            context.check_hostname = True
            context.verify_mode = ssl.CERT_REQUIRED
            # The server's own self-signed certificate as its trust anchor,
            # as curl --cacert users expect; dates and names still checked.
            context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
            strict = getattr(ssl, "VERIFY_X509_STRICT", 0)
            context.verify_flags &= ~strict
            return context
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        first_use = self.trust.kind == "first-use"
        if first_use:
            expect = self.trust.known.fingerprint if self.trust.known is not None else None
        else:
            expect = self.trust.pin
        context.sslobject_class = _checking_class(expect, first_use, verdict)
        return context

    async def handshake(self, address: TcpAddress, sock: socket.socket) -> Any:
        """The TLS handshake over the connected `sock`: a pycapnp stream, or
        ConnectError saying why not in the terms of how this client trusts."""
        verdict = _Verdict()
        context = self._context(verdict)
        text = str(address)
        try:
            return await capnp.AsyncIoStream.create_connection(
                sock=sock,
                ssl=context,
                server_hostname=address.host,
                ssl_handshake_timeout=None,
            )
        except ssl.SSLCertVerificationError as error:
            sock.close()
            raise ConnectError(
                f"cannot connect to {text}: TLS: {self._explain(address, error)}", address=text
            ) from None
        except ssl.SSLError as error:
            sock.close()
            if verdict.refused is not None:
                raise self._refusal(address, verdict) from None
            if _not_tls(error):
                raise ConnectError(self._no_tls(address), address=text) from None
            raise ConnectError(
                f"cannot connect to {text}: TLS: the TLS handshake failed: {_ssl_words(error)}",
                address=text,
            ) from None
        except (ConnectionResetError, BrokenPipeError, EOFError):
            sock.close()
            raise ConnectError(
                f"cannot connect to {text}: TLS: the server closed the connection during the "
                "TLS handshake",
                address=text,
            ) from None

    def _explain(self, address: TcpAddress, error: ssl.SSLCertVerificationError) -> str:
        message = str(error.verify_message or error.reason or error)
        lowered = message.lower()
        if "hostname mismatch" in lowered or "ip address mismatch" in lowered:
            return f"the server's certificate is not valid for {address.host}"
        if "expired" in lowered:
            return "the server's certificate has expired"
        if "not yet valid" in lowered:
            return "the server's certificate is not valid yet"
        if (
            "local issuer" in lowered
            or "self-signed" in lowered
            or "self signed" in lowered
            or "signature failure" in lowered
        ):
            return f"the server's certificate is not signed by the CA in {self.trust.ca}"
        return f"the server's certificate was refused ({message})"

    def _refusal(self, address: TcpAddress, verdict: _Verdict) -> ConnectError:
        text = str(address)
        offered = verdict.offered or ""
        if self.trust.kind == "pin":
            return ConnectError(
                f"cannot connect to {text}: TLS: the server's certificate does not have the "
                f"pinned fingerprint (it offered {offered})",
                address=text,
            )
        if verdict.refused == "unknown":
            return UnknownCertificate(
                f"the server at {text} offers a TLS certificate that is not known here (SHA-256 "
                f"{offered}); nothing was sent to it. Compare it with the fingerprint `capexec "
                f"serve` printed, then connect again with tls_accept_new=True to remember it in "
                f"{self.trust.known_file} (or give tls_pin={offered!r})",
                address=text,
                offered=offered,
            )
        known = self.trust.known
        assert known is not None
        return ChangedCertificate(
            f"the TLS certificate of {text} has CHANGED: it was {known.fingerprint.hex()}, it is "
            f"now {offered}; nothing was sent to it. Someone may be intercepting the connection, "
            f"or the server has a new certificate: if you know it has, delete line {known.line} "
            f"of {self.trust.known_file} and connect again",
            address=text,
            known=known.fingerprint.hex(),
            offered=offered,
        )

    def _no_tls(self, address: TcpAddress) -> str:
        if self.trust.place is not None:
            return f"the server at {address} does not speak TLS: remove {self.trust.place}"
        if self.trust.kind == "first-use":
            line = f" (line {self.trust.known.line})" if self.trust.known is not None else ""
            return (
                f"the server at {address} does not speak TLS, yet its certificate is remembered "
                f"in {self.trust.known_file}{line}; nothing was sent to it (if it no longer "
                "serves TLS, delete that line)"
            )
        return f"the server at {address} does not speak TLS"


def _not_tls(error: ssl.SSLError) -> bool:
    """Whether the handshake failed on bytes that are not TLS."""
    reason = str(getattr(error, "reason", "") or "").upper()
    return reason in {
        "WRONG_VERSION_NUMBER",
        "RECORD_LAYER_FAILURE",
        "PACKET_LENGTH_TOO_LONG",
        "UNKNOWN_PROTOCOL",
        "HTTP_REQUEST",
        "UNEXPECTED_EOF_WHILE_READING",
    } or isinstance(error, ssl.SSLEOFError)


def _ssl_words(error: ssl.SSLError) -> str:
    reason = getattr(error, "reason", None)
    if reason:
        return str(reason).lower().replace("_", " ")
    return str(error)


async def _resolve(address: TcpAddress) -> list[tuple[Any, ...]]:
    loop = asyncio.get_running_loop()
    try:
        return await loop.getaddrinfo(
            address.host, address.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except OSError as error:
        raise ConnectError(
            f"cannot connect to {address}: {error.strerror or error}", address=str(address)
        ) from None


def _is_loopback(info: tuple[Any, ...]) -> bool:
    host = str(info[4][0])
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


async def open_tcp(
    address: TcpAddress, tls: ClientTls | None, *, plaintext_only_to_loopback: bool
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
    loop = asyncio.get_running_loop()
    for family, kind, proto, _, sockaddr in resolved:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError as error:
            last = error
            continue
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, sockaddr)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as error:
            sock.close()
            last = error
            continue
        except BaseException:
            sock.close()
            raise
        if tls is None:
            return await capnp.AsyncIoStream.create_connection(sock=sock)
        return await tls.handshake(address, sock)
    if last is None:
        message = "the name resolves to no address"
    else:
        # asyncio's own words ("Connect call failed (...)") are not the
        # system's: say what the system said.
        message = os.strerror(last.errno) if last.errno else (last.strerror or str(last))
    raise ConnectError(f"cannot connect to {address}: {message}", address=str(address)) from None


async def speaks_tls(address: TcpAddress, *, timeout: float) -> bool:
    """Whether the server at `address` completes a TLS handshake (asked
    when a plaintext client was dropped without a word, which is what a TLS
    server does with one). Sends nothing but a ClientHello."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(
                address.host, address.port, ssl=context, server_hostname=address.host
            ),
            timeout=timeout,
        )
    except (OSError, asyncio.TimeoutError, ssl.SSLError):
        return False
    writer.close()
    try:
        await writer.wait_closed()
    except (OSError, ssl.SSLError):
        pass
    return True
