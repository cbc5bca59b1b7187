"""connect(): addresses, names, tokens and TLS trust, as the command line
reads them, with its sentences."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import capexec
from capexec import errors

from capexec_servers import Server, start_server


async def echo(conn: capexec.Connection) -> None:
    """One call that must work on `conn`."""
    info = await conn.executor.info()
    assert info.environment == "local"


# -- Unix sockets ------------------------------------------------------------


async def test_unix_socket_path_forms(server: Server) -> None:
    path = server.unix.removeprefix("unix:")
    for address in (server.unix, path):
        async with await capexec.connect(address) as conn:
            assert conn.address == f"unix:{path}"
            await echo(conn)
            await conn.established()


async def test_unix_socket_missing(tmp_path: Path) -> None:
    with pytest.raises(capexec.ConnectError) as raised:
        await capexec.connect(f"unix:{tmp_path}/none.sock")
    assert str(raised.value) == (
        f"cannot connect to unix:{tmp_path}/none.sock: No such file or directory"
    )


async def test_unix_socket_that_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(capexec.ConnectError) as raised:
        await capexec.connect(f"unix:{tmp_path}")
    assert str(raised.value) == (
        f"cannot connect to unix:{tmp_path}: {tmp_path} is a directory, not a socket"
    )


async def test_unix_refuses_tcp_options(server: Server, tmp_path: Path) -> None:
    with pytest.raises(capexec.ConnectError) as raised:
        await capexec.connect(server.unix, token_file=tmp_path / "t")
    assert str(raised.value) == (
        "token_file is for tcp: addresses: a Unix socket needs no token and no TLS (its file "
        "permissions protect it)"
    )


async def test_local_and_the_default(
    server: Server, client_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = client_home / "run"
    (runtime / "capexec").mkdir()
    (runtime / "capexec" / "capexec.sock").symlink_to(server.unix.removeprefix("unix:"))
    async with await capexec.local() as conn:
        await echo(conn)
    for address in (None, "local"):
        async with await capexec.connect(address) as conn:
            assert conn.address == f"unix:{runtime}/capexec/capexec.sock"
            await echo(conn)
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    if os.geteuid() != 0:
        with pytest.raises(capexec.ConnectError) as raised:
            await capexec.local()
        assert str(raised.value) == (
            "local: there is no default socket: XDG_RUNTIME_DIR is not set (and only root uses "
            "/run/capexec); give unix:PATH"
        )


# -- TCP with a token ----------------------------------------------------------


async def test_tcp_needs_a_token(server: Server) -> None:
    with pytest.raises(capexec.ConnectError) as raised:
        await capexec.connect(server.tcp)
    assert str(raised.value) == f"{server.tcp} needs a login token (token_file= or CAPEXEC_TOKEN)"


async def test_tcp_token_sources(
    server: Server, client_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert server.token_file is not None
    token = server.token_file.read_text().strip()
    # HOST:PORT as people type it, the token in CAPEXEC_TOKEN.
    monkeypatch.setenv("CAPEXEC_TOKEN", token + "\n")
    async with await capexec.connect(server.tcp.removeprefix("tcp:")) as conn:
        assert conn.address == server.tcp
        await echo(conn)
    monkeypatch.delenv("CAPEXEC_TOKEN")
    # The default token file.
    default = client_home / ".config" / "capexec" / "token"
    default.parent.mkdir(parents=True)
    default.write_text(token)
    async with await capexec.connect(server.tcp) as conn:
        await echo(conn)


async def test_wrong_token_is_unauthenticated(server: Server, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("x" * 64)
    conn = await capexec.connect(server.tcp, token_file=wrong)
    async with conn:
        with pytest.raises(errors.Unauthenticated) as raised:
            await conn.executor.info()
        assert raised.value.tag == "unauthenticated"
        assert raised.value.sentence.startswith("login refused")
        with pytest.raises(errors.Unauthenticated):
            await conn.established()


async def test_token_file_problems(server: Server, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    short = tmp_path / "short"
    short.write_text("abc")
    cases = {
        tmp_path / "none": f"token_file {tmp_path}/none: No such file or directory",
        empty: f"token_file {empty}: the file is empty",
        short: (
            f"token_file {short}: it holds a token of 3 bytes; a token has at least 16 (copy the "
            "server's token file)"
        ),
    }
    for path, sentence in cases.items():
        with pytest.raises(capexec.ConnectError) as raised:
            await capexec.connect(server.tcp, token_file=path)
        assert str(raised.value) == sentence


async def test_clear_text_only_to_loopback(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t" * 32)
    # TEST-NET-1: nothing is sent; the refusal comes before connecting.
    with pytest.raises(capexec.ConnectError) as raised:
        await capexec.connect("tcp:192.0.2.1:7000", token_file=token)
    assert str(raised.value) == (
        "refusing to send the login token in clear text to 192.0.2.1: give tls=True (trust on "
        "first use), tls_ca=FILE or tls_pin=SHA256 (or insecure_plaintext=True over a network "
        "you trust)"
    )


@pytest.mark.parametrize(
    "tls_option",
    [{"tls": True}, {"tls_accept_new": True}, {"tls_pin": "0" * 64}, {"tls_ca": "/nonexistent"}],
)
async def test_insecure_plaintext_and_a_tls_option_are_refused_together(
    tmp_path: Path, tls_option: dict[str, object]
) -> None:
    # As the command line refuses the pair: asking for TLS never yields
    # clear text. TEST-NET-1: the refusal comes before connecting.
    token = tmp_path / "token"
    token.write_text("t" * 32)
    token.chmod(0o600)
    with pytest.raises(capexec.ConnectError) as raised:
        await capexec.connect(
            "tcp:192.0.2.1:7000",
            token_file=token,
            insecure_plaintext=True,
            **tls_option,  # type: ignore[arg-type]
        )
    name = next(iter(tls_option))
    assert str(raised.value) == f"give insecure_plaintext or {name}, not both"


def test_a_token_file_others_may_read_is_warned_about(tmp_path: Path) -> None:
    from capexec import config

    token = tmp_path / "token"
    token.write_text("t" * 32)
    token.chmod(0o640)
    with pytest.warns(UserWarning, match=r"other users may read it \(mode 640\); chmod 600 it"):
        assert config.load_token(token) == "t" * 32
    token.chmod(0o600)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert config.load_token(token) == "t" * 32


async def test_nothing_listening(tmp_path: Path) -> None:
    import socket

    token = tmp_path / "token"
    token.write_text("t" * 32)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(capexec.ConnectError) as raised:
        await capexec.connect(f"tcp:127.0.0.1:{port}", token_file=token)
    assert str(raised.value) == f"cannot connect to tcp:127.0.0.1:{port}: Connection refused"


async def test_a_server_that_never_answers(tmp_path: Path) -> None:
    import socket

    token = tmp_path / "token"
    token.write_text("t" * 32)
    # Connections wait in the backlog, never accepted: the login is never
    # answered.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"tcp:127.0.0.1:{silent.getsockname()[1]}"
        async with await capexec.connect(address, token_file=token, connect_timeout=0.25) as conn:
            with pytest.raises(capexec.ConnectError) as raised:
                await conn.established()
    assert str(raised.value) == (
        f"cannot connect to {address}: no answer within 0.25 s (is a capexec server listening "
        "there?)"
    )


async def test_address_shapes() -> None:
    cases = {
        "tcp:host": '"tcp:host": expected tcp:HOST:PORT',
        "host:http": (
            '"host:http": "http" is not a port number; write tcp:HOST:PORT, unix:PATH or the name '
            "of a server in the configuration file"
        ),
        "::1:7000": '"tcp:::1:7000": an IPv6 address goes in brackets (tcp:[::1]:80)',
        "me@box:7000": (
            '"me@box:7000": capexec has no users to log in as: a command runs as the user that '
            "runs the server (start one as that user); connect to box:7000"
        ),
    }
    for text, sentence in cases.items():
        with pytest.raises(capexec.ConnectError) as raised:
            await capexec.connect(text)
        assert str(raised.value) == sentence, text


# -- TLS -------------------------------------------------------------------------


async def test_tls_pin_spellings(tls_server: Server, tls_pin: str) -> None:
    colons = ":".join(tls_pin[i : i + 2] for i in range(0, 64, 2)).upper()
    for pin in (tls_pin, colons, f"sha256:{tls_pin}", f"SHA256 Fingerprint={colons}"):
        async with await capexec.connect(
            tls_server.tcp, token_file=tls_server.token_file, tls_pin=pin
        ) as conn:
            await echo(conn)
            await conn.established()


async def test_tls_wrong_pin(tls_server: Server, tls_pin: str) -> None:
    wrong = ("0" if tls_pin[0] != "0" else "1") + tls_pin[1:]
    with pytest.raises(capexec.ConnectError) as raised:
        await capexec.connect(tls_server.tcp, token_file=tls_server.token_file, tls_pin=wrong)
    assert str(raised.value) == (
        f"cannot connect to {tls_server.tcp}: TLS: the server's certificate does not have the "
        f"pinned fingerprint (it offered {tls_pin})"
    )


async def test_tls_pin_that_is_not_one(tls_server: Server) -> None:
    with pytest.raises(capexec.ConnectError) as raised:
        await capexec.connect(tls_server.tcp, token_file=tls_server.token_file, tls_pin="sha256:abcd")
    assert str(raised.value) == (
        'tls_pin= "sha256:abcd" is not a SHA-256 fingerprint: expected 64 hex digits (colons '
        "allowed), as `capexec serve` logs it"
    )
    sha1 = "ab" * 20
    with pytest.raises(capexec.ConnectError) as raised:
        await capexec.connect(tls_server.tcp, token_file=tls_server.token_file, tls_pin=sha1)
    assert str(raised.value) == (
        f'tls_pin= "{sha1}" is a SHA-1 fingerprint (40 hex digits): pin the SHA-256 one, which '
        "`capexec serve` logs (or `openssl x509 -noout -fingerprint -sha256 -in CERT`)"
    )


async def test_tls_ca_file_holding_the_servers_own_certificate(tls_server: Server) -> None:
    cert = tls_server.config_dir / "server-cert.pem"
    async with await capexec.connect(
        tls_server.tcp, token_file=tls_server.token_file, tls_ca=cert
    ) as conn:
        await echo(conn)
    # The certificate names localhost too.
    port = tls_server.tcp.rsplit(":", 1)[1]
    async with await capexec.connect(
        f"tcp:localhost:{port}", token_file=tls_server.token_file, tls_ca=cert
    ) as conn:
        await echo(conn)


async def test_tls_ca_that_did_not_sign_it(
    tls_server: Server, server: Server, tmp_path: Path
) -> None:
    # Another server's self-signed certificate is no CA of this one's.
    other = tmp_path / "other-home"
    other.mkdir()
    made = start_server(other, ["tcp:127.0.0.1:0"], ["--tls-self-signed"])
    made.stop()
    with pytest.raises(capexec.ConnectError) as raised:
        await capexec.connect(
            tls_server.tcp,
            token_file=tls_server.token_file,
            tls_ca=made.config_dir / "server-cert.pem",
        )
    assert str(raised.value) == (
        f"cannot connect to {tls_server.tcp}: TLS: the server's certificate is not signed by "
        f"the CA in {made.config_dir / 'server-cert.pem'}"
    )


async def test_tls_ca_file_that_is_not_one(tls_server: Server, tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(capexec.ConnectError) as raised:
        await capexec.connect(tls_server.tcp, token_file=tls_server.token_file, tls_ca=bad)
    assert str(raised.value).startswith(f"tls_ca= {bad}: not a usable CA certificate (")


async def test_plaintext_to_a_tls_server(tls_server: Server) -> None:
    conn = await capexec.connect(tls_server.tcp, token_file=tls_server.token_file)
    async with conn:
        expected = (
            f"the server at {tls_server.tcp} speaks TLS: give tls_pin=, tls_ca= or tls=True "
            "(trust on first use)"
        )
        with pytest.raises(capexec.ConnectError) as raised:
            await conn.executor.info()
        assert str(raised.value) == expected
        with pytest.raises(capexec.ConnectError) as raised:
            await conn.established()
        assert str(raised.value) == expected


async def test_tls_to_a_plaintext_server(server: Server, tls_pin: str) -> None:
    with pytest.raises(capexec.ConnectError) as raised:
        await capexec.connect(server.tcp, token_file=server.token_file, tls_pin=tls_pin)
    assert str(raised.value) == f"the server at {server.tcp} does not speak TLS: remove tls_pin="


async def test_trust_on_first_use(tls_server: Server, tls_pin: str, client_home: Path) -> None:
    known = client_home / ".config" / "capexec" / "known-servers"
    with pytest.raises(errors.UnknownCertificate) as raised:
        await capexec.connect(tls_server.tcp, token_file=tls_server.token_file, tls=True)
    assert raised.value.offered == tls_pin
    assert str(raised.value) == (
        f"the server at {tls_server.tcp} offers a TLS certificate that is not known here "
        f"(SHA-256 {tls_pin}); nothing was sent to it. Compare it with the fingerprint `capexec "
        f"serve` printed, then connect again with tls_accept_new=True to remember it in {known} "
        f"(or give tls_pin='{tls_pin}')"
    )
    assert not known.exists()
    async with await capexec.connect(
        tls_server.tcp, token_file=tls_server.token_file, tls_accept_new=True
    ) as conn:
        await echo(conn)
    assert known.read_text() == (
        "# TLS certificates trusted by capexec: ADDRESS SHA256 (see capexec --help)\n"
        f"{tls_server.tcp} {tls_pin}\n"
    )
    assert known.stat().st_mode & 0o777 == 0o600
    # Remembered: TLS and the check, asked for or not.
    for tls in (True, False):
        async with await capexec.connect(
            tls_server.tcp, token_file=tls_server.token_file, tls=tls
        ) as conn:
            await echo(conn)
    # A changed certificate is refused, naming the line to delete.
    other = "ab" * 32
    known.write_text(f"# mine\n{tls_server.tcp} {other}\n")
    with pytest.raises(errors.ChangedCertificate) as changed:
        await capexec.connect(tls_server.tcp, token_file=tls_server.token_file)
    assert (changed.value.known, changed.value.offered) == (other, tls_pin)
    assert str(changed.value) == (
        f"the TLS certificate of {tls_server.tcp} has CHANGED: it was {other}, it is now "
        f"{tls_pin}; nothing was sent to it. Someone may be intercepting the connection, or the "
        f"server has a new certificate: if you know it has, delete line 2 of {known} and "
        "connect again"
    )


# -- the configuration file and CAPEXEC_CONNECT -------------------------------------


def write_config(client_home: Path, text: str) -> Path:
    config = client_home / ".config" / "capexec" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(text)
    return config


async def test_named_servers(
    server: Server, tls_server: Server, tls_pin: str, client_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert server.token_file is not None and tls_server.token_file is not None
    config_dir = client_home / ".config" / "capexec"
    config_dir.mkdir(parents=True)
    (config_dir / "tls.token").write_text(tls_server.token_file.read_text())
    write_config(
        client_home,
        f"""# servers of the tests
[servers.sock]
address = "{server.unix.removeprefix('unix:')}"

[servers.plain]
address = "{server.tcp.removeprefix('tcp:')}"
token-file = "{server.token_file}"

[servers.secure]
address = "{tls_server.tcp}"
token-file = "tls.token"
tls-pin = "{tls_pin}"
environment = "local"

[servers.broken]
address = "{tls_server.tcp}"
tls-pin = "abc"
""",
    )
    for name in ("sock", "plain", "secure"):
        async with await capexec.connect(name) as conn:
            await echo(conn)
    monkeypatch.setenv("CAPEXEC_CONNECT", "secure")
    async with await capexec.connect() as conn:
        assert conn.address == tls_server.tcp
        await echo(conn)
    config = config_dir / "config.toml"
    with pytest.raises(capexec.ConnectError) as raised:
        await capexec.connect("broken")
    assert str(raised.value) == (
        f'{config}:17: [servers.broken]: tls-pin "abc" is not a SHA-256 fingerprint: expected '
        "64 hex digits (colons allowed), as `capexec serve` logs it"
    )
    monkeypatch.setenv("CAPEXEC_CONNECT", "secrue")
    with pytest.raises(capexec.ConnectError) as raised:
        await capexec.connect()
    assert str(raised.value) == (
        f'CAPEXEC_CONNECT="secrue": no server of that name in {config} (it names plain, secure, '
        "sock; did you mean secure?); an address is unix:PATH or tcp:HOST:PORT"
    )
    # Arguments win over the file: a wrong pin given is used.
    wrong = ("0" if tls_pin[0] != "0" else "1") + tls_pin[1:]
    with pytest.raises(capexec.ConnectError) as raised:
        await capexec.connect("secure", tls_pin=wrong)
    assert "does not have the pinned fingerprint" in str(raised.value)


async def test_config_that_toml_cannot_read_breaks_only_its_table(
    server: Server, client_home: Path
) -> None:
    config = write_config(
        client_home,
        f"""[servers.good]
address = "{server.unix}"

[servers.bad]
address = "tcp:x:1
""",
    )
    async with await capexec.connect("good") as conn:
        await echo(conn)
    with pytest.raises(capexec.ConnectError) as raised:
        await capexec.connect("bad")
    assert str(raised.value).startswith(f"{config}:5: ")


async def test_config_entry_problems(client_home: Path) -> None:
    config = write_config(
        client_home,
        """[servers.a]
address = "unix:/s"
token-file = "t"

[servers.b]
address = "b-box"

[servers.c]
address = "tcp:c:1"
tokn-file = "x"
""",
    )
    expected = {
        "a": (
            f"{config}:3: [servers.a]: token-file is for tcp: addresses: a Unix socket needs no "
            "token and no TLS (its file permissions protect it)"
        ),
        "b": (
            f'{config}:6: [servers.b]: address "b-box": an address is tcp:HOST:PORT, HOST:PORT, '
            "unix:PATH or /PATH"
        ),
        "c": f"{config}:10: unknown field `tokn-file`",
    }
    for name, sentence in expected.items():
        with pytest.raises(capexec.ConnectError) as raised:
            await capexec.connect(name)
        assert str(raised.value) == sentence
