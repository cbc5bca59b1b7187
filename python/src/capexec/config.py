"""Where `connect` leads: the same configuration as the command line's."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from . import _address
from .errors import ConnectError

__all__ = ["Target", "resolve"]


@dataclass
class Target:
    """A resolved `connect` target."""

    address: _address.Address
    token: str | None
    tls: Any
    insecure_plaintext: bool


def _read_token(path: str | os.PathLike[str]) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            token = file.read().strip()
    except OSError as error:
        raise ConnectError(f"cannot read the token file {os.fspath(path)}: {error.strerror}") from error
    if not token:
        raise ConnectError(f"the token file {os.fspath(path)} is empty")
    return token


def resolve(
    address: str | None,
    *,
    token_file: str | os.PathLike[str] | None = None,
    tls: bool = False,
    tls_pin: str | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
    insecure_plaintext: bool = False,
) -> Target:
    """Where `address` leads and how to log in there."""
    text = address if address is not None else os.environ.get("CAPEXEC_CONNECT") or "local"
    try:
        parsed = (
            _address.UnixAddress(_address.default_socket_path())
            if text == "local"
            else _address.parse(text)
        )
    except ValueError as error:
        raise ConnectError(str(error)) from None
    token: str | None = None
    if isinstance(parsed, _address.TcpAddress):
        if token_file is not None:
            token = _read_token(token_file)
        elif os.environ.get("CAPEXEC_TOKEN"):
            token = os.environ["CAPEXEC_TOKEN"].strip()
    return Target(parsed, token, None, insecure_plaintext)
