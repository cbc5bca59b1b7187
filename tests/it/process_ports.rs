//! Forwards tied to a process (`Process.dial`, `Process.listen`): they end
//! when the process's capability is released and not before (the child's
//! exit does not end them), only the owner may make them, and they follow
//! the rules of the executor that started the process. Every backend:
//! through the chain, the far server ties them to its process.

use std::time::Duration;

use capexec::client::Stdin;
use capexec::model::{ExitStatus, RefusalKind};
use common::Ctx;
use common::data::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common;
use crate::facets::{OBSERVER, WRITER, forbidden, spawn_cat};
use crate::ports::{assert_not_allowed, dial_only_to, peer, read_all, refusal, restricted};

/// What the forwards of a released process fail with.
const RELEASED: &str = "the process's capability was released";

/// Sends `ping` one way and `pong` back, and checks both arrive.
async fn exchange<A, B>(near: &mut A, far: &mut B)
where
    A: AsyncReadExt + AsyncWriteExt + Unpin,
    B: AsyncReadExt + AsyncWriteExt + Unpin,
{
    let mut four = [0u8; 4];
    near.write_all(b"ping").await.expect("write near");
    far.read_exact(&mut four).await.expect("read far");
    assert_eq!(&four, b"ping");
    far.write_all(b"pong").await.expect("write far");
    near.read_exact(&mut four).await.expect("read near");
    assert_eq!(&four, b"pong");
}

fn port_of(address: &str) -> u16 {
    let port = address
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .expect("a port chosen");
    assert_ne!(port, 0, "{address}");
    port
}

async fn forwards_tied_to_a_process_end_with_its_capability(ctx: Ctx) {
    let process = spawn_cat(&ctx).await;
    let (peer_listener, address) = peer().await;
    let mut dialled = process.dial(&address).await.expect("dial");
    let (mut far, _) = peer_listener.accept().await.expect("accept");
    exchange(&mut dialled, &mut far).await;
    // Made through the executor, not the process: the release spares it.
    let mut untied = capexec::client::dial(&ctx.executor, &address)
        .await
        .expect("dial through the executor");
    let (mut untied_far, _) = peer_listener.accept().await.expect("accept");

    let mut listener = process.listen("tcp:127.0.0.1:0").await.expect("listen");
    let port = port_of(listener.address());
    let mut outside = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let mut accepted = listener.accept().await.expect("a connection");
    exchange(&mut accepted, &mut outside).await;

    let dir = TempDir::new("process-ports");
    let path = dir.path().join("app.sock");
    let unix_listener = process
        .listen(&format!("unix:{}", path.display()))
        .await
        .expect("listen on a unix socket");
    assert!(path.exists());

    // The child's exit ends nothing: what it served may still be draining.
    process.close_stdin().await.expect("close stdin");
    assert_eq!(process.wait().await.expect("exit"), ExitStatus::Code(0));
    exchange(&mut dialled, &mut far).await;
    exchange(&mut accepted, &mut outside).await;
    let mut second = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect after the exit");
    let mut second_accepted = listener.accept().await.expect("a second connection");
    exchange(&mut second_accepted, &mut second).await;

    // Its release ends everything made through it, though the streams and
    // listeners are still held here.
    drop(process);
    for socket in [&mut far, &mut outside, &mut second] {
        let error = read_all(socket).await.expect_err("reset");
        assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    }
    for stream in [&mut dialled, &mut accepted, &mut second_accepted] {
        let error = read_all(stream).await.expect_err("reset here too");
        assert!(error.to_string().contains(RELEASED), "{error}");
    }
    // Polled: the release travels before it takes effect.
    common::eventually_async("the TCP listener stops listening", async || {
        TcpStream::connect(("127.0.0.1", port)).await.is_err()
    })
    .await;
    common::eventually_async("the unix socket's file is removed", async || !path.exists()).await;
    assert!(listener.accept().await.is_none());
    drop((listener, unix_listener));
    exchange(&mut untied, &mut untied_far).await;
}

async fn only_the_owner_makes_forwards_under_its_executors_rules(ctx: Ctx) {
    let (peer_listener, address) = peer().await;
    let port = peer_listener.local_addr().expect("address").port();

    let process = spawn_cat(&ctx).await;
    let facets = [
        ("an observer", process.observer(), OBSERVER),
        ("a stdin writer", process.stdin_writer(), WRITER),
    ];
    for (name, facet, described) in facets {
        let refused = refusal(facet.dial(&address).await).await;
        assert_eq!(refused.0, RefusalKind::Forbidden, "{name}: {}", refused.1);
        assert!(
            refused.1.starts_with(&forbidden("dial", described)),
            "{}",
            refused.1
        );
        let refused = refusal(facet.listen("tcp:127.0.0.1:0").await).await;
        assert_eq!(refused.0, RefusalKind::Forbidden, "{name}: {}", refused.1);
        assert!(
            refused.1.starts_with(&forbidden("listen", described)),
            "{}",
            refused.1
        );
    }

    // A process of a restricted executor forwards only where its rule says.
    let narrow = dial_only_to(&ctx, port);
    let mut cat = common::sh("exec cat");
    cat.stdin(Stdin::Piped);
    let confined = cat.spawn(&narrow).await.expect("start");
    let mut dialled = confined.dial(&address).await.expect("inside the rule");
    let (mut far, _) = peer_listener.accept().await.expect("accept");
    exchange(&mut dialled, &mut far).await;
    let other = format!("tcp:127.0.0.1:{}", port.wrapping_add(1).max(1));
    assert_not_allowed(&refusal(confined.dial(&other).await).await, "ports.dial");
    assert_not_allowed(
        &refusal(confined.listen("tcp:127.0.0.1:0").await).await,
        "ports.listen",
    );
    // Under a restriction of programs, no address unless it names some.
    let programs_only = restricted(&ctx, None, true);
    let limited = capexec::client::Command::new("true")
        .spawn(&programs_only)
        .await
        .expect("start true");
    assert_not_allowed(&refusal(limited.dial(&address).await).await, "ports.dial");

    let info = capexec::client::info(&ctx.executor).await.expect("info");
    assert!(
        info.features
            .iter()
            .any(|feature| feature == "process-ports"),
        "{:?}",
        info.features
    );
}

/// A capability from `restore` is another capability: the forwards made
/// through the first end with the first, those made through the restored
/// one live on until it goes too, and the process with them.
async fn a_restored_capability_has_forwards_of_its_own(ctx: Ctx) {
    let process = spawn_cat(&ctx).await;
    let token = process
        .detachable(Duration::from_secs(60))
        .await
        .expect("detachable");
    let (peer_listener, address) = peer().await;
    let mut first = process.dial(&address).await.expect("dial");
    let (mut first_far, _) = peer_listener.accept().await.expect("accept");
    let (restored, answered) = capexec::client::restore(&ctx.executor, &token);
    answered.await.expect("restored");
    let mut second = restored.dial(&address).await.expect("dial again");
    let (mut second_far, _) = peer_listener.accept().await.expect("accept again");
    exchange(&mut first, &mut first_far).await;
    exchange(&mut second, &mut second_far).await;

    drop(process);
    let error = read_all(&mut first_far).await.expect_err("reset");
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    let error = read_all(&mut first).await.expect_err("reset here too");
    assert!(error.to_string().contains(RELEASED), "{error}");
    // The process is still there, and so is what the restored one made.
    exchange(&mut second, &mut second_far).await;
    restored.close_stdin().await.expect("close stdin");
    assert_eq!(restored.wait().await.expect("exit"), ExitStatus::Code(0));

    drop(restored);
    let error = read_all(&mut second_far).await.expect_err("reset");
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
}

backend_tests!(
    forwards_tied_to_a_process_end_with_its_capability,
    only_the_owner_makes_forwards_under_its_executors_rules,
    a_restored_capability_has_forwards_of_its_own,
);
