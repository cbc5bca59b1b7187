//! TLS on TCP: certificates made here (rcgen) for a CA, a server, an
//! expired server and a server under another name; clients that trust a CA
//! file or a pinned fingerprint; and the refusals, each with its reason.

use crate::common;

use std::path::PathBuf;

use capexec::client::Command;
use capexec::net::{self, Address, ServerTrust, TlsClient, TlsServer, Token};
use common::data::TempDir;
use common::pki::Authority;
use common::server::ServerThread;

struct Setup {
    _dir: TempDir,
    server: ServerThread,
    ca: PathBuf,
    fingerprint: String,
}

/// A TLS server on 127.0.0.1 whose certificate (from its own CA) names
/// `names`, expired if asked.
fn serve(names: &[&str], expired: bool) -> Setup {
    let dir = TempDir::new("tls");
    let authority = Authority::new(dir.path(), "ca");
    let (cert, key) = authority.server(dir.path(), "server", names, expired);
    let tls = TlsServer::from_files(&cert, &key).expect("server TLS");
    let fingerprint = tls.fingerprint().to_string();
    Setup {
        server: ServerThread::start_tls(TempDir::new("tls-server"), tls),
        ca: authority.pem,
        fingerprint,
        _dir: dir,
    }
}

fn trusting(trust: ServerTrust) -> TlsClient {
    TlsClient::new(trust).expect("client TLS")
}

async fn run_echo(address: &Address, token: &Token, tls: &TlsClient) -> Result<Vec<u8>, String> {
    let connection = net::connect_with(address, Some(token), Some(tls))
        .await
        .map_err(|error| error.to_string())?;
    let mut command = Command::new("echo");
    command.arg("over tls");
    let output = command
        .output(&connection.executor())
        .await
        .map_err(|error| error.to_string())?;
    Ok(output.stdout)
}

async fn refusal(address: &Address, token: &Token, tls: &TlsClient) -> String {
    match net::connect_with(address, Some(token), Some(tls)).await {
        Err(error) => error.to_string(),
        Ok(_) => panic!("connected although the certificate is not trusted"),
    }
}

#[test]
fn a_client_trusting_the_ca_runs_commands() {
    common::run_local(async {
        let setup = serve(&["localhost", "127.0.0.1"], false);
        let token = setup.server.token.clone().expect("token");
        let tls = trusting(ServerTrust::Ca(setup.ca.clone()));
        let output = run_echo(&setup.server.address, &token, &tls).await;
        assert_eq!(output, Ok(b"over tls\n".to_vec()));
    });
}

#[test]
fn no_sandbox_may_read_the_servers_tls_key() {
    common::run_local(async {
        let dir = TempDir::new("tls");
        let authority = Authority::new(dir.path(), "ca");
        let (cert, key) = authority.server(dir.path(), "server", &["127.0.0.1"], false);
        let server = ServerThread::start_tls(
            TempDir::new("tls-server"),
            TlsServer::from_files(&cert, &key).expect("server TLS"),
        );
        let token = server.token.clone().expect("token");
        let tls = trusting(ServerTrust::Ca(authority.pem.clone()));
        let connection = net::connect_with(&server.address, Some(&token), Some(&tls))
            .await
            .expect("connect");
        let cwd = TempDir::new("tls-cwd");
        let cat_key = |read_only: Vec<PathBuf>| {
            let mut command = Command::new("cat");
            command
                .arg(&key)
                .current_dir(cwd.path())
                .sandbox(capexec::model::Sandbox {
                    read_only,
                    ..capexec::model::Sandbox::default()
                });
            command
        };
        // A root that contains it, or is it: refused before anything runs.
        for root in [dir.path().to_path_buf(), key.clone()] {
            let error = cat_key(vec![root])
                .output(&connection.executor())
                .await
                .expect_err("refused");
            assert_eq!(
                error.refusal_kind(),
                Some(capexec::model::RefusalKind::NotAllowed),
                "{error}"
            );
            assert!(error.to_string().contains("TLS certificate"), "{error}");
        }
        // Outside the roots: the read fails.
        let output = cat_key(Vec::new())
            .output(&connection.executor())
            .await
            .expect("start");
        assert_eq!(output.stdout, b"");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("Permission denied"),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    });
}

#[test]
fn a_pinned_fingerprint_is_enough_and_a_wrong_one_is_refused() {
    common::run_local(async {
        let setup = serve(&["localhost", "127.0.0.1"], false);
        let token = setup.server.token.clone().expect("token");
        let pinned = trusting(ServerTrust::Pin(setup.fingerprint.clone()));
        let output = run_echo(&setup.server.address, &token, &pinned).await;
        assert_eq!(output, Ok(b"over tls\n".to_vec()));

        let wrong = trusting(ServerTrust::Pin("00".repeat(32)));
        assert_eq!(
            refusal(&setup.server.address, &token, &wrong).await,
            format!(
                "cannot connect to {}: TLS: the server's certificate does not have the pinned \
                 fingerprint (it offered {})",
                setup.server.address, setup.fingerprint
            )
        );
    });
}

#[test]
fn a_certificate_from_another_ca_is_refused() {
    common::run_local(async {
        let setup = serve(&["127.0.0.1"], false);
        let token = setup.server.token.clone().expect("token");
        let other_dir = TempDir::new("other-ca");
        let other = Authority::new(other_dir.path(), "other");
        let tls = trusting(ServerTrust::Ca(other.pem.clone()));
        assert_eq!(
            refusal(&setup.server.address, &token, &tls).await,
            format!(
                "cannot connect to {}: TLS: the server's certificate is not signed by the CA in {}",
                setup.server.address,
                other.pem.display()
            )
        );
    });
}

#[test]
fn an_expired_certificate_is_refused() {
    common::run_local(async {
        let setup = serve(&["127.0.0.1"], true);
        let token = setup.server.token.clone().expect("token");
        let tls = trusting(ServerTrust::Ca(setup.ca.clone()));
        assert_eq!(
            refusal(&setup.server.address, &token, &tls).await,
            format!(
                "cannot connect to {}: TLS: the server's certificate has expired",
                setup.server.address
            )
        );
    });
}

#[test]
fn a_certificate_for_another_name_is_refused() {
    common::run_local(async {
        let setup = serve(&["build.example"], false);
        let token = setup.server.token.clone().expect("token");
        let tls = trusting(ServerTrust::Ca(setup.ca.clone()));
        assert_eq!(
            refusal(&setup.server.address, &token, &tls).await,
            format!(
                "cannot connect to {}: TLS: the server's certificate is not valid for 127.0.0.1",
                setup.server.address
            )
        );
    });
}

/// A plaintext client gets nothing from a TLS listener (not even a login
/// answer), and the server goes on serving TLS clients.
#[test]
fn a_plaintext_client_gets_nothing_from_a_tls_listener() {
    common::run_local(async {
        let setup = serve(&["127.0.0.1"], false);
        let token = setup.server.token.clone().expect("token");
        let plain = net::connect(&setup.server.address, Some(&token))
            .await
            .expect("the TCP connection itself is accepted");
        let refused = Command::new("true").status(&plain.executor()).await;
        assert!(
            refused.is_err(),
            "a plaintext client was served: {refused:?}"
        );

        let tls = trusting(ServerTrust::Ca(setup.ca.clone()));
        let output = run_echo(&setup.server.address, &token, &tls).await;
        assert_eq!(output, Ok(b"over tls\n".to_vec()));
    });
}

/// A TLS client against a plaintext listener fails saying so, instead of
/// sending its token in clear (the command line adds the flag to remove:
/// the library does not know which one asked for TLS).
#[test]
fn a_tls_client_refuses_a_plaintext_listener() {
    common::run_local(async {
        let server = ServerThread::start(true);
        let token = server.token.clone().expect("token");
        let dir = TempDir::new("ca-only");
        let authority = Authority::new(dir.path(), "ca");
        let tls = trusting(ServerTrust::Ca(authority.pem.clone()));
        assert_eq!(
            refusal(&server.address, &token, &tls).await,
            format!("the server at {} does not speak TLS", server.address)
        );
    });
}

#[test]
fn tls_is_refused_for_unix_sockets() {
    common::run_local(async {
        let server = ServerThread::start(false);
        let dir = TempDir::new("ca-unix");
        let authority = Authority::new(dir.path(), "ca");
        let tls = trusting(ServerTrust::Ca(authority.pem.clone()));
        match net::connect_with(&server.address, None, Some(&tls)).await {
            Err(error) => assert_eq!(
                error.to_string(),
                format!(
                    "cannot connect to {}: TLS is for tcp: addresses; a Unix socket is protected \
                     by its file permissions",
                    server.address
                )
            ),
            Ok(_) => panic!("TLS over a Unix socket was accepted"),
        }
    });
}

/// The server picks AES-128-GCM whatever order a client prefers (10 AES
/// rounds against 14, on every byte of a bulk stream): here OpenSSL's
/// client, told to prefer AES-256 (run by the server itself: the test
/// process reaps its own children).
#[test]
fn the_server_chooses_aes_128_gcm_over_a_clients_preference() {
    common::run_local(async {
        let setup = serve(&["127.0.0.1"], false);
        let token = setup.server.token.clone().expect("token");
        let Address::Tcp { host, port } = &setup.server.address else {
            panic!("a TCP server: {}", setup.server.address);
        };
        let tls = trusting(ServerTrust::Pin(setup.fingerprint.clone()));
        let connection = net::connect_with(&setup.server.address, Some(&token), Some(&tls))
            .await
            .expect("connects");
        let mut command = Command::new("openssl");
        command
            .args(["s_client", "-connect", &format!("{host}:{port}")])
            .args([
                "-ciphersuites",
                "TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256",
            ]);
        let output = command
            .output(&connection.executor())
            .await
            .expect("openssl runs (the tests need it)");
        let printed = String::from_utf8_lossy(&output.stdout);
        assert!(
            printed.contains("Cipher is TLS_AES_128_GCM_SHA256"),
            "openssl s_client printed:\n{printed}"
        );
    });
}

/// Forwards one connection from the returned address to `upstream`,
/// flipping the lowest bit of the byte at `offset` of one direction: the
/// client's bytes (`to_server`) or the server's.
async fn tampering_proxy(
    upstream: std::net::SocketAddr,
    to_server: bool,
    offset: usize,
) -> Address {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let address = Address::from_socket_addr(listener.local_addr().expect("its address"));
    tokio::spawn(async move {
        let Ok((client, _)) = listener.accept().await else {
            return;
        };
        let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
            return;
        };
        let (from_client, to_client) = client.into_split();
        let (from_server, to_server_half) = server.into_split();
        let (up, down) = if to_server {
            (Some(offset), None)
        } else {
            (None, Some(offset))
        };
        tokio::join!(
            pass(from_client, to_server_half, up),
            pass(from_server, to_client, down)
        );
    });
    address
}

async fn pass(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    flip_at: Option<usize>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut seen = 0;
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if let Some(at) = flip_at
            && (seen..seen + read).contains(&at)
        {
            buffer[at - seen] ^= 1;
        }
        seen += read;
        if to.write_all(&buffer[..read]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// A record changed on the way, after the handshake, is refused by the
/// end that opens it (the AEAD's tag), in each direction: the command's
/// output never arrives with the flipped bit, the connection ends as a lost
/// one, saying why (the server telling the client with a bad_record_mac
/// alert), and the server goes on serving others.
#[test]
fn a_record_changed_on_the_way_ends_the_connection_in_each_direction() {
    common::run_local(async {
        let setup = serve(&["127.0.0.1"], false);
        let token = setup.server.token.clone().expect("token");
        let Address::Tcp { host, port } = &setup.server.address else {
            panic!("a TCP server: {}", setup.server.address);
        };
        let upstream: std::net::SocketAddr = format!("{host}:{port}").parse().expect("an IP");
        let tls = trusting(ServerTrust::Pin(setup.fingerprint.clone()));

        // The server's 4 MiB of zeros, a bit flipped 1 MiB in: well past
        // its handshake flight, in the middle of the output.
        let proxy = tampering_proxy(upstream, false, 1 << 20).await;
        let connection = net::connect_with(&proxy, Some(&token), Some(&tls))
            .await
            .expect("connects through the proxy");
        let mut command = Command::new("head");
        command.args(["-c", "4194304", "/dev/zero"]);
        match command.output(&connection.executor()).await {
            Ok(output) => panic!(
                "{} bytes of output arrived through a changed record, {} of them not zero",
                output.stdout.len(),
                output.stdout.iter().filter(|&&byte| byte != 0).count()
            ),
            Err(error) => assert!(!error.to_string().is_empty()),
        }
        // The client's calls fail from then on as over a lost connection,
        // saying why: a resilient client reports it and may reconnect.
        let error = connection
            .executor()
            .environments_request()
            .send()
            .promise
            .await
            .err()
            .expect("the connection is over");
        assert_eq!(error.kind, capnp::ErrorKind::Disconnected, "{error}");
        assert!(error.extra.contains("bad_record_mac"), "{error}");

        // The client's start of a command with a 120 KB argument, a bit
        // flipped 60 KB in: past the handshake and the login.
        let proxy = tampering_proxy(upstream, true, 60_000).await;
        let connection = net::connect_with(&proxy, Some(&token), Some(&tls))
            .await
            .expect("connects through the proxy");
        let mut command = Command::new("true");
        command.arg("a".repeat(120_000));
        let ran = command.output(&connection.executor()).await;
        // The server says why, with the alert TLS has for it.
        let error = ran.expect_err("a changed record was taken");
        assert!(
            error.to_string().contains("alert 20 (BadRecordMac)"),
            "{error}"
        );

        let output = run_echo(&setup.server.address, &token, &tls).await;
        assert_eq!(output, Ok(b"over tls\n".to_vec()), "the server serves on");
    });
}

/// A resilient process over TLS recovers after its connection is cut, as
/// over TCP: the end of a TLS connection without close_notify is a lost
/// connection, not a failed call.
#[test]
fn a_resilient_process_over_tls_recovers_after_a_cut() {
    use capexec::client::{Connect, Error, ResilientProcess, Session};
    use std::time::Duration;

    common::run_local(async {
        let setup = serve(&["127.0.0.1"], false);
        let token = setup.server.token.clone().expect("token");
        let tls = trusting(ServerTrust::Pin(setup.fingerprint.clone()));
        let dir = TempDir::new("tls-recovery");
        let proxy =
            common::proxy::Proxy::in_front_of(&setup.server.address, dir.path(), Duration::ZERO)
                .await
                .expect("start the proxy");
        let address = proxy.address().clone();
        let connect: Connect = std::rc::Rc::new(move || {
            let (address, token, tls) = (address.clone(), token.clone(), tls.clone());
            Box::pin(async move {
                let connection = net::connect_with(&address, Some(&token), Some(&tls))
                    .await
                    .map_err(|error| Error::Connect(error.to_string()))?;
                Ok(Session::new(
                    connection.executor(),
                    Some(Box::new(connection)),
                ))
            })
        });
        let go = dir.path().join("go");
        let command = common::sh(&format!(
            "echo ready; while [ ! -e {go} ]; do sleep 0.01; done; echo after",
            go = go.display()
        ));
        let (process, started) =
            ResilientProcess::spawn(&command, connect, Duration::from_secs(30))
                .await
                .expect("connect");
        started.await.expect("start");
        let (mut after, mut text) = (0, String::new());
        while !text.contains("ready") {
            let outcome = process
                .read(after, 0, Duration::from_secs(10))
                .await
                .expect("read");
            after = outcome.next_seq - 1;
            text.push_str(&String::from_utf8_lossy(&common::output_bytes(
                &outcome.events,
                None,
            )));
        }

        proxy.cut();
        std::fs::write(&go, b"").expect("let it go on");
        proxy.restore();
        let mut rest = String::new();
        while !rest.contains("after") {
            let outcome = process
                .read(after, 0, Duration::from_secs(30))
                .await
                .expect("a read, recovered over TLS");
            after = outcome.next_seq - 1;
            rest.push_str(&String::from_utf8_lossy(&common::output_bytes(
                &outcome.events,
                None,
            )));
        }
        assert_eq!(rest, "after\n");
    });
}
