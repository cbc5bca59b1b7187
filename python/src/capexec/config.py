"""Where `connect` leads, read as the command line reads it.

- The configuration file, `$XDG_CONFIG_HOME/capexec/config.toml` (else
  `~/.config/capexec/config.toml`), names servers:

      [servers.build]
      address = "tcp:build-box:7000"     # or build-box:7000, unix:PATH, /PATH
      token-file = "build.token"         # beside this file
      tls-pin = "3f1c...64 hex digits"   # or tls-ca = "/path/ca.pem", or tls = true
      environment = "gpu"                # optional
      # insecure-plaintext = true        # only over a network you trust

  Relative paths are beside the file, `~/` is the home directory. An entry
  the file gets wrong breaks only its own name, with one sentence naming
  the file and the line.
- `CAPEXEC_CONNECT` gives the address when none is passed (empty counts as
  unset); `local` is the default socket.
- The login token of a tcp: address: `token_file=`, else the named
  server's `token-file`, else `CAPEXEC_TOKEN` (the token itself), else the
  default token file (`$XDG_CONFIG_HOME/capexec/token`) if it exists.
- TLS: `tls_ca=` / `tls_pin=` / `tls=True` (trust on first use against the
  known-servers file, `$XDG_CONFIG_HOME/capexec/known-servers`), else the
  named server's; an address remembered in the known-servers file is always
  checked against it. Without TLS the token goes in clear text only to
  addresses that resolve to loopback, unless `insecure_plaintext`.

Arguments win over the file, as flags do on the command line.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _address
from ._address import Address, TcpAddress, UnixAddress
from .errors import ConnectError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "CONNECT_VARIABLE",
    "LOCAL",
    "TOKEN_VARIABLE",
    "Config",
    "Named",
    "Target",
    "Trust",
    "config_dir",
    "config_path",
    "default_token_path",
    "known_servers_path",
    "load_token",
    "lookup_known",
    "parse_fingerprint",
    "remember_known",
    "resolve",
]

#: The name `connect("local")` gives the default socket.
LOCAL = "local"
#: The variable that gives the address when `connect` is given none.
CONNECT_VARIABLE = "CAPEXEC_CONNECT"
#: The variable that holds the login token itself.
TOKEN_VARIABLE = "CAPEXEC_TOKEN"

#: The largest configuration or known-servers file read.
MAX_CONFIG_BYTES = 16 * 1024 * 1024
#: The largest token file read, and the shortest token accepted.
MAX_TOKEN_FILE_BYTES = 64 * 1024
MIN_TOKEN_BYTES = 16


def config_dir() -> Path | None:
    """`$XDG_CONFIG_HOME/capexec`, else `~/.config/capexec`; None without
    either variable."""
    xdg = os.environ.get("XDG_CONFIG_HOME")
    if xdg:
        return Path(xdg) / "capexec"
    home = os.environ.get("HOME")
    if home is not None:
        return Path(home) / ".config" / "capexec"
    return None


def config_path() -> Path | None:
    """Where the configuration file is looked for."""
    directory = config_dir()
    return directory / "config.toml" if directory is not None else None


def default_token_path() -> Path | None:
    """The default token file (`capexec serve`'s, and the client's last
    resort)."""
    directory = config_dir()
    return directory / "token" if directory is not None else None


def known_servers_path() -> Path | None:
    """Where certificates trusted on first use are remembered."""
    directory = config_dir()
    return directory / "known-servers" if directory is not None else None


# -- reading files -------------------------------------------------------


def _io_message(error: OSError) -> str:
    """An OSError as the command line says it ("No such file or
    directory"), without the errno and path Python adds."""
    return error.strerror or str(error)


def _read_regular(path: Path, limit: int) -> bytes:
    """A regular file of at most `limit` bytes (never blocking on a FIFO);
    OSError otherwise, FileNotFoundError if it is missing."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        meta = os.fstat(fd)
        if not stat.S_ISREG(meta.st_mode):
            raise OSError(0, "not a regular file")
        if meta.st_size > limit:
            raise OSError(0, f"larger than {limit} bytes")
        chunks = []
        total = 0
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                raise OSError(0, f"larger than {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_text(path: Path, limit: int) -> str:
    data = _read_regular(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise OSError(0, "not UTF-8 text") from None


def load_token(path: str | os.PathLike[str], source: str = "token_file ") -> str:
    """The token in `path` (surrounding white space ignored): a regular file
    of at most 64 KiB holding at least 16 bytes. ConnectError naming
    `source` (where the file came from) otherwise."""
    path = Path(path)
    try:
        secret = _read_text(path, MAX_TOKEN_FILE_BYTES).strip()
    except OSError as error:
        raise ConnectError(f"{source}{path}: {_io_message(error)}") from None
    if not secret:
        raise ConnectError(f"{source}{path}: the file is empty")
    if len(secret.encode()) < MIN_TOKEN_BYTES:
        raise ConnectError(
            f"{source}{path}: it holds a token of {len(secret.encode())} bytes; a token has at "
            f"least {MIN_TOKEN_BYTES} (copy the server's token file)"
        )
    _warn_if_shared(path, source)
    return secret


def _warn_if_shared(path: Path, source: str) -> None:
    """Warns, as the command line does, when others may read the token."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if mode & 0o077:
        warnings.warn(
            f"{source}{path}: other users may read it (mode {mode & 0o777:o}); chmod 600 it",
            stacklevel=3,
        )


# -- fingerprints and the known-servers file -------------------------------


def parse_fingerprint(text: str) -> bytes:
    """A SHA-256 fingerprint in any of the usual spellings (hex with or
    without colons, `sha256:` or `SHA256 Fingerprint=` before it); ValueError
    with the command line's sentence otherwise."""

    def unquoted(value: str) -> str:
        return value.strip().strip("\"'")

    rest = unquoted(text)
    lower = rest.lower()
    for label in ("sha256 fingerprint", "sha-256 fingerprint", "sha256", "sha-256"):
        if lower.startswith(label):
            after = rest[len(label) :].lstrip()
            if after[:1] in ("=", ":"):
                rest = unquoted(after[1:])
                break
    digits = "".join(c for c in rest if c not in ": -")
    hexdigits = all(c in "0123456789abcdefABCDEF" for c in digits)
    if len(digits) == 40 and hexdigits:
        raise ValueError(
            f"{_quote(text)} is a SHA-1 fingerprint (40 hex digits): pin the SHA-256 one, which "
            "`capexec serve` logs (or `openssl x509 -noout -fingerprint -sha256 -in CERT`)"
        )
    if len(digits) != 64 or not hexdigits:
        raise ValueError(
            f"{_quote(text)} is not a SHA-256 fingerprint: expected 64 hex digits (colons "
            "allowed), as `capexec serve` logs it"
        )
    return bytes.fromhex(digits)


_quote = _address.quote


@dataclass(frozen=True)
class Known:
    """A certificate remembered for an address: its fingerprint and line."""

    fingerprint: bytes
    line: int


def lookup_known(file: Path, address: Address) -> Known | None:
    """What the known-servers file remembers for `address` (its first
    line for it); ConnectError if that line is wrong or the file unreadable."""
    try:
        text = _read_text(file, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ConnectError(f"{file}: {_io_message(error)}") from None
    wanted = str(address)
    for index, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0] != wanted:
            continue
        try:
            if len(fields) < 2:
                raise ValueError("no fingerprint")
            fingerprint = parse_fingerprint(fields[1])
        except ValueError as why:
            raise ConnectError(
                f"{file}:{index}: the line for {wanted} is not ADDRESS SHA256 ({why}): fix or "
                "delete it"
            ) from None
        return Known(fingerprint, index)
    return None


def remember_known(file: Path, address: Address, fingerprint: str) -> None:
    """Adds `address` with `fingerprint` (hex) to the known-servers file,
    creating it (mode 0600, its directory 0700) if needed."""
    try:
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            existing = _read_regular(file, MAX_CONFIG_BYTES)
        except FileNotFoundError:
            existing = b""
        fd = os.open(
            file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY, 0o600
        )
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(0, "not a regular file")
            line = ""
            if not existing:
                line += "# TLS certificates trusted by capexec: ADDRESS SHA256 (see capexec --help)\n"
            elif not existing.endswith(b"\n"):
                line += "\n"
            line += f"{address} {fingerprint}\n"
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError as error:
        raise ConnectError(
            f"cannot remember the certificate in {file}: {_io_message(error)}"
        ) from None


# -- the configuration file ------------------------------------------------


@dataclass(frozen=True)
class Origin:
    """A server's entry in the configuration file, for errors about what it
    names."""

    file: Path
    server: str
    #: The line of each key given.
    lines: dict[str, int] = field(default_factory=dict)

    def of(self, key: str) -> str:
        """"FILE:LINE: [servers.NAME]: KEY", the place of `key` in the file."""
        return f"{self.file}:{self.lines.get(key, 1)}: [servers.{self.server}]: {key}"


@dataclass(frozen=True)
class Named:
    """A server to connect to, with what the configuration file says of it."""

    address: Address
    token_file: Path | None = None
    tls_ca: Path | None = None
    tls_pin: str | None = None
    tls: bool = False
    insecure_plaintext: bool = False
    environment: str | None = None
    origin: Origin | None = None


def _valid_name(name: str) -> bool:
    return bool(name) and all(c.isascii() and (c.isalnum() or c in "-_.") for c in name)


def _valid_environment(name: str) -> bool:
    return name == LOCAL or all(_valid_name(part) for part in name.split("/"))


def typed(text: str) -> Address | str | None:
    """What a `connect` value (or a configuration file's address) is by its
    shape: an Address, why it is a wrong one (str), or None for a name.
    `unix:PATH`, `tcp:HOST:PORT`, a path (anything with a `/`) or HOST:PORT."""
    if text.startswith(("unix:", "tcp:")):
        try:
            return _address.parse(text)
        except ValueError as why:
            return str(why)
    if "/" in text:
        return UnixAddress(text)
    host, sep, port = text.rpartition(":")
    if not sep:
        return None
    try:
        if host:
            return _address.parse(f"tcp:{text}")
    except ValueError as why:
        if port.isdigit() and int(port) <= 65535:
            return str(why)
    return f"{_quote(text)}: {_quote(port)} is not a port number"


_HEADER = re.compile(r"""^\s*\[\s*servers\s*\.\s*(?:"([^"]*)"|'([^']*)'|([A-Za-z0-9_.-]+))\s*\]""")


def _header_name(line: str) -> str | None:
    match = _HEADER.match(line.split("#", 1)[0])
    if match is None:
        return None
    return next(group for group in match.groups() if group is not None)


@dataclass
class Config:
    """The servers of a configuration file, and the parts of it that could
    not be read: a wrong entry breaks its own name only."""

    file: Path | None = None
    servers: dict[str, tuple[Named, int]] = field(default_factory=dict)
    #: (scope, sentence): scope is a server's name, "*" (any name) or ""
    #: (none).
    broken: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def load(cls, file: Path | None = None) -> Config:
        """The file at `file` (default: `config_path()`); an empty
        configuration if it does not exist."""
        file = file if file is not None else config_path()
        if file is None:
            return cls()
        try:
            text = _read_text(file, MAX_CONFIG_BYTES)
        except FileNotFoundError:
            return cls(file=file)
        except OSError as error:
            raise ConnectError(f"{file}: {_io_message(error)}") from None
        return cls.parse(file, text)

    @classmethod
    def parse(cls, file: Path, text: str) -> Config:
        config = cls(file=file)
        lines = text.splitlines()
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            # Read a table at a time, so that what is wrong in one
            # server's table leaves the others usable.
            for first, scope, section in _sections(lines):
                try:
                    part = tomllib.loads(section)
                except tomllib.TOMLDecodeError as error:
                    line = _error_line(error)
                    config.broken.append(
                        (scope, f"{file}:{first + line - 1}: {_error_words(error)}")
                    )
                    continue
                config._add_all(part, lines, first)
            return config
        config._add_all(raw, lines, 1)
        return config

    def _add_all(self, raw: dict[str, Any], lines: list[str], first: int) -> None:
        file = self.file or Path("config.toml")
        unknown = [key for key in raw if key != "servers"]
        if unknown:
            self.broken.append(("*", f"{file}:{first}: unknown field `{unknown[0]}`"))
        servers = raw.get("servers", {})
        if not isinstance(servers, dict):
            self.broken.append(("*", f"{file}:{first}: servers: expected a table"))
            return
        for name, entry in servers.items():
            header = next(
                (
                    index
                    for index, line in enumerate(lines, start=1)
                    if index >= first and _header_name(line) == name
                ),
                first,
            )
            self._add(file, lines, header, str(name), entry)

    def _add(self, file: Path, lines: list[str], header: int, name: str, entry: Any) -> None:
        if name in self.servers:
            first_line = self.servers.pop(name)[1]
            self.broken.append(
                (name, f"{file}:{header}: [servers.{name}]: defined again (first at line {first_line})")
            )
            return
        try:
            self.servers[name] = (_checked(file, lines, header, name, entry), header)
        except ValueError as why:
            self.broken.append((name, str(why)))

    def lookup(self, name: str) -> Named | str | None:
        """What the file says of `name`: its entry, the sentence of what is
        wrong with it, or None."""
        for scope, sentence in self.broken:
            if scope == name:
                return sentence
        if name in self.servers:
            return self.servers[name][0]
        for scope, sentence in self.broken:
            if scope == "*":
                return sentence
        return None

    def names(self) -> list[str]:
        return sorted(self.servers)


def _error_line(error: Exception) -> int:
    match = re.search(r"at line (\d+)", str(error))
    return int(match.group(1)) if match else 1


def _error_words(error: Exception) -> str:
    return re.sub(r"\s*\(at line \d+, column \d+\)", "", str(error)).strip()


def _sections(lines: list[str]) -> list[tuple[int, str, str]]:
    """(first line, scope, text) of each table of the file, and of the text
    before the first one."""
    sections: list[tuple[int, str, str]] = []
    start = 0
    scope = "*"
    for index, line in enumerate(lines):
        opens = line.lstrip().startswith("[")
        if index > 0 and opens:
            sections.append((start + 1, scope, "\n".join(lines[start:index]) + "\n"))
            start = index
            scope = ""
        if opens:
            name = _header_name(line)
            if name is not None:
                scope = name
            elif line.split("#", 1)[0].strip() == "[servers]":
                scope = "*"
            else:
                scope = ""
    sections.append((start + 1, scope, "\n".join(lines[start:]) + "\n"))
    return sections


_KEYS = ("address", "token-file", "tls-pin", "tls-ca", "tls", "insecure-plaintext", "environment")


def _checked(file: Path, lines: list[str], header: int, name: str, entry: Any) -> Named:
    """One server's entry, checked; ValueError with the sentence naming the
    file and the line otherwise."""

    def line_of(key: str) -> int:
        pattern = re.compile(rf"""^\s*(?:{re.escape(key)}|"{re.escape(key)}")\s*=""")
        for index in range(header, len(lines) + 1):
            text = lines[index - 1]
            if index > header and text.lstrip().startswith("["):
                break
            if pattern.match(text):
                return index
        return header

    def wrong(key: str, why: str) -> ValueError:
        return ValueError(f"{file}:{line_of(key)}: [servers.{name}]: {why}")

    if not isinstance(entry, dict):
        return_error = f"{file}:{header}: [servers.{name}]: expected a table"
        raise ValueError(return_error)
    for key in entry:
        if key not in _KEYS:
            raise ValueError(f"{file}:{line_of(key)}: unknown field `{key}`")
    if "address" not in entry:
        raise ValueError(f"{file}:{header}: missing field `address`")
    if not _valid_name(name):
        raise ValueError(
            f"{file}:{header}: [servers.{name}]: a server name is letters, digits, '-', '_' and '.'"
        )
    strings = ("address", "token-file", "tls-pin", "tls-ca", "environment")
    for key in strings:
        if key in entry and not isinstance(entry[key], str):
            raise ValueError(f"{file}:{line_of(key)}: {key}: expected a string")
    for key in ("tls", "insecure-plaintext"):
        if key in entry and not isinstance(entry[key], bool):
            raise ValueError(f"{file}:{line_of(key)}: {key}: expected a boolean")
    text = entry["address"]
    address = typed(text)
    if isinstance(address, str):
        if "is not a port number" in address:
            address += "; write tcp:HOST:PORT, HOST:PORT, unix:PATH or /PATH"
        raise wrong("address", f"address {address}")
    if address is None:
        raise wrong(
            "address",
            f"address {_quote(text)}: an address is tcp:HOST:PORT, HOST:PORT, unix:PATH or /PATH",
        )
    if "tls-pin" in entry and "tls-ca" in entry:
        raise wrong("tls-ca", "give tls-pin or tls-ca, not both")
    if "tls-pin" in entry:
        try:
            parse_fingerprint(entry["tls-pin"])
        except ValueError as why:
            raise wrong("tls-pin", f"tls-pin {why}") from None
    if not isinstance(address, TcpAddress):
        for key in ("token-file", "tls-pin", "tls-ca"):
            if key in entry:
                raise wrong(
                    key,
                    f"{key} is for tcp: addresses: a Unix socket needs no token and no TLS (its "
                    "file permissions protect it)",
                )
    environment = entry.get("environment")
    if environment is not None and not _valid_environment(environment):
        raise wrong(
            "environment",
            f"environment {_quote(environment)} is not an environment name (letters, digits, "
            "'-', '_' and '.', hops joined by '/')",
        )
    base = file.parent

    def path_of(value: str) -> Path:
        home = os.environ.get("HOME")
        if value.startswith("~/") and home is not None:
            return Path(home) / value[2:]
        path = Path(value)
        return path if path.is_absolute() else base / path

    origin = Origin(
        file=file,
        server=name,
        lines={key: line_of(key) for key in ("token-file", "tls-ca", "tls-pin", "tls") if key in entry},
    )
    return Named(
        address=address,
        token_file=path_of(entry["token-file"]) if "token-file" in entry else None,
        tls_ca=path_of(entry["tls-ca"]) if "tls-ca" in entry else None,
        tls_pin=entry.get("tls-pin"),
        tls=bool(entry.get("tls", False)),
        insecure_plaintext=bool(entry.get("insecure-plaintext", False)),
        environment=environment,
        origin=origin,
    )


# -- resolving a connect target ------------------------------------------


def _distance(a: str, b: str) -> int:
    """Optimal string alignment distance (Damerau-Levenshtein without
    repeated edits of a substring)."""
    rows = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        rows[i][0] = i
    for j in range(len(b) + 1):
        rows[0][j] = j
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            rows[i][j] = min(rows[i - 1][j] + 1, rows[i][j - 1] + 1, rows[i - 1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                rows[i][j] = min(rows[i][j], rows[i - 2][j - 2] + 1)
    return rows[len(a)][len(b)]


def _did_you_mean(text: str, candidates: list[str]) -> str | None:
    best: tuple[int, str] | None = None
    for candidate in candidates:
        if candidate == text:
            continue
        distance = _distance(text, candidate)
        longer = max(len(text), len(candidate))
        if distance <= max(longer // 3, 1) and distance < len(text):
            if best is None or distance < best[0]:
                best = (distance, candidate)
    return best[1] if best else None


def resolve_named(text: str, given: str | None = None) -> Named:
    """What `text` names, as `--connect` takes it. `given` is where it
    came from ("CAPEXEC_CONNECT"), which errors name."""

    def named(why: str) -> ConnectError:
        return ConnectError(f"{given}={why}" if given else why)

    if "@" in text and not text.startswith("unix:") and "/" not in text:
        host = text.removeprefix("tcp:").rsplit("@", 1)[1]
        raise named(
            f"{_quote(text)}: capexec has no users to log in as: a command runs as the user "
            f"that runs the server (start one as that user); connect to {host}"
        )
    shape = typed(text)
    if isinstance(shape, (UnixAddress, TcpAddress)):
        return Named(address=shape)
    if isinstance(shape, str):
        if "is not a port number" in shape and not shape.startswith(_quote(text) + ": an IPv6"):
            shape += "; write tcp:HOST:PORT, unix:PATH or the name of a server in the configuration file"
        raise named(shape)
    config = Config.load()
    found = config.lookup(text)
    if isinstance(found, Named):
        return found
    if isinstance(found, str):
        raise ConnectError(found)
    if text == LOCAL:
        try:
            return Named(address=UnixAddress(_address.default_socket_path()))
        except ValueError as why:
            raise named(f"{LOCAL}: {why}") from None
    file = config_path()
    place = f"in {file}" if file is not None else "(there is no configuration file: HOME is not set)"
    known = config.names()
    listed = f"it names {', '.join(known)}" if known else "it names none"
    candidates = known + ([LOCAL] if LOCAL not in config.servers else [])
    close = _did_you_mean(text, candidates)
    if close is not None:
        listed += f"; did you mean {close}?"
    raise named(
        f"{_quote(text)}: no server of that name {place} ({listed}); an address is unix:PATH or "
        "tcp:HOST:PORT"
    )


@dataclass(frozen=True)
class Trust:
    """How a tcp: server's certificate is trusted.

    kind "ca" (`ca`), "pin" (`pin`), "first-use" (against `known_file`,
    what it remembers: `known`), or "plaintext"; `place` is what asked for
    it (the argument, or the configuration file's key), for errors."""

    kind: str
    place: str | None = None
    ca: Path | None = None
    pin: bytes | None = None
    known_file: Path | None = None
    known: Known | None = None

    def describe(self) -> str:
        if self.kind in ("ca", "pin"):
            return f"TLS, trusting {self.place}"
        if self.kind == "first-use" and self.known is not None:
            return (
                f"TLS, trusting the certificate remembered in {self.known_file} "
                f"(line {self.known.line})"
            )
        if self.kind == "first-use":
            return f"TLS, trusting on first use (nothing remembered for it in {self.known_file})"
        return "no TLS"


@dataclass(frozen=True)
class Target:
    """Where `connect` leads: the address, the login token (tcp: only), how
    the certificate is trusted, whether clear text may leave loopback, and
    the environment the configuration file names for the server."""

    address: Address
    token: str | None
    trust: Trust
    insecure_plaintext: bool
    environment: str | None = None
    tls_accept_new: bool = False


def _login_token(token_file: str | os.PathLike[str] | None) -> str | None:
    """`token_file`, else $CAPEXEC_TOKEN (the token itself), else the
    default token file if it exists."""
    if token_file is not None:
        return load_token(token_file, "token_file ")
    secret = os.environ.get(TOKEN_VARIABLE, "").strip()
    if secret:
        return secret
    default = default_token_path()
    if default is not None and default.exists():
        return load_token(default, "the default token file ")
    return None


def resolve(
    address: str | None,
    *,
    token_file: str | os.PathLike[str] | None = None,
    tls: bool = False,
    tls_pin: str | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
    tls_accept_new: bool = False,
    insecure_plaintext: bool = False,
) -> Target:
    """Where `address` leads and how to log in there, as `capexec run
    --connect` decides (see the module's doc). ConnectError with the
    sentence of what is wrong."""
    given: str | None = None
    if address is None:
        address = os.environ.get(CONNECT_VARIABLE) or None
        given = CONNECT_VARIABLE if address is not None else None
        if address is None:
            address = LOCAL
    named = resolve_named(address, given)
    target = named.address
    if tls_pin is not None and tls_ca is not None:
        raise ConnectError("give tls_pin or tls_ca, not both")
    # As the command line refuses --insecure-plaintext with a TLS option:
    # a caller that asked for TLS never gets clear text instead.
    asked_tls = [
        name
        for name, given in (
            ("tls", tls),
            ("tls_accept_new", tls_accept_new),
            ("tls_pin", tls_pin is not None),
            ("tls_ca", tls_ca is not None),
        )
        if given
    ]
    if insecure_plaintext and asked_tls:
        raise ConnectError(f"give insecure_plaintext or {asked_tls[0]}, not both")
    if isinstance(target, UnixAddress):
        options = [
            ("token_file", token_file is not None),
            ("tls_ca", tls_ca is not None),
            ("tls_pin", tls_pin is not None),
            ("insecure_plaintext", insecure_plaintext),
            ("tls", tls),
            ("tls_accept_new", tls_accept_new),
        ]
        for option, set_ in options:
            if set_:
                raise ConnectError(
                    f"{option} is for tcp: addresses: a Unix socket needs no token and no TLS "
                    "(its file permissions protect it)",
                    address=str(target),
                )
        return Target(target, None, Trust("plaintext"), False)
    if token_file is None and named.token_file is not None and named.origin is not None:
        token: str | None = load_token(named.token_file, named.origin.of("token-file") + " ")
    else:
        token = _login_token(token_file)
    trust = _trust(
        target,
        named,
        tls=tls or tls_accept_new,
        tls_pin=tls_pin,
        tls_ca=tls_ca,
        insecure_plaintext=insecure_plaintext,
    )
    return Target(
        address=target,
        token=token,
        trust=trust,
        insecure_plaintext=insecure_plaintext or named.insecure_plaintext,
        environment=named.environment,
        tls_accept_new=tls_accept_new,
    )


def _trust(
    address: TcpAddress,
    named: Named,
    *,
    tls: bool,
    tls_pin: str | None,
    tls_ca: str | os.PathLike[str] | None,
    insecure_plaintext: bool,
) -> Trust:
    """The arguments' TLS options, else the configuration file's, else trust
    on first use where it is asked for or a certificate is remembered for
    the address."""
    from_args = tls_ca is not None or tls_pin is not None or tls or insecure_plaintext

    def place(argument: str, key: str) -> str:
        if named.origin is not None and not from_args:
            return named.origin.of(key)
        return argument

    if from_args:
        ca: Path | None = Path(tls_ca) if tls_ca is not None else None
        pin, first_use, insecure = tls_pin, tls, insecure_plaintext
    else:
        ca, pin, first_use, insecure = (
            named.tls_ca,
            named.tls_pin,
            named.tls,
            named.insecure_plaintext,
        )
    if ca is not None:
        return Trust("ca", place("tls_ca=", "tls-ca"), ca=ca)
    if pin is not None:
        where = place("tls_pin=", "tls-pin")
        try:
            fingerprint = parse_fingerprint(pin)
        except ValueError as why:
            raise ConnectError(f"{where} {why}", address=str(address)) from None
        return Trust("pin", where, pin=fingerprint)
    if insecure:
        return Trust("plaintext")
    file = known_servers_path()
    if file is None:
        raise ConnectError(
            "no known-servers file for trust on first use (HOME is not set): give tls_ca= or "
            "tls_pin=",
            address=str(address),
        )
    known = lookup_known(file, address)
    if first_use or known is not None:
        asked = place("tls=True", "tls") if first_use else None
        return Trust("first-use", asked, known_file=file, known=known)
    return Trust("plaintext")
