//! Direct channels of port connections ("Direct channels" in the schema),
//! attacked and misused at the wire: forged and reused tickets, a
//! preamble that is not one, a write through the sinks of a claimed
//! connection, a ticket nobody claims, a ticket from a server beyond the
//! hop (declined: the sinks carry the bytes), and TCP, which grants none.
//! The ordinary behaviour of direct connections (bytes, half-close,
//! resets, flow control) is `ports::direct`, the same bodies as the sinks'.

use std::cell::RefCell;
use std::io::ErrorKind;
use std::rc::Rc;
use std::time::Duration;

use capexec::capexec_capnp::{port_dial_results, port_sink};
use capexec::model::RefusalKind;
use capexec::net::{Address, CHANNEL_MAGIC, DirectRoute};
use capexec::rpc::{DIRECT_CLAIM_WITHIN, MAX_UNCLAIMED_PER_CONNECTION, TICKET_BYTES, Ticket};
use common::Ctx;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common;
use crate::ports::{peer, raw_write, read_all};

/// What arrived on a `fromSocket` sink, as words.
#[derive(Clone, Default)]
struct Heard(Rc<RefCell<Vec<String>>>);

impl port_sink::Server for Heard {
    async fn write(self: Rc<Self>, params: port_sink::WriteParams) -> Result<(), capnp::Error> {
        let length = params.get()?.get_bytes()?.len();
        self.0.borrow_mut().push(format!("write {length}"));
        Ok(())
    }

    async fn end(
        self: Rc<Self>,
        _: port_sink::EndParams,
        _: port_sink::EndResults,
    ) -> Result<(), capnp::Error> {
        self.0.borrow_mut().push("end".to_string());
        Ok(())
    }

    async fn fail(
        self: Rc<Self>,
        params: port_sink::FailParams,
        _: port_sink::FailResults,
    ) -> Result<(), capnp::Error> {
        let reason = params.get()?.get_reason()?.to_string()?;
        self.0.borrow_mut().push(format!("fail {reason}"));
        Ok(())
    }
}

/// A dial that asks for a direct channel, its results kept (they hold
/// the connection), and what its `fromSocket` hears.
struct RawDial {
    response: capnp::capability::Response<port_dial_results::Owned>,
    heard: Heard,
}

impl RawDial {
    async fn new(ctx: &Ctx, address: &str) -> RawDial {
        let heard = Heard::default();
        let mut request = ctx.executor.dial_request();
        request.get().set_address(address);
        request.get().set_direct(true);
        request
            .get()
            .set_from_socket(capnp_rpc::new_client(heard.clone()));
        let response = request.send().promise.await.expect("dial");
        RawDial { response, heard }
    }

    fn ticket(&self) -> Option<Ticket> {
        let results = self.response.get().expect("results");
        if !results.has_direct_ticket() {
            return None;
        }
        let bytes = results.get_direct_ticket().expect("ticket");
        Some(bytes.try_into().expect("32 bytes"))
    }

    fn to_socket(&self) -> port_sink::Client {
        self.response
            .get()
            .expect("results")
            .get_to_socket()
            .expect("toSocket")
    }

    fn heard(&self) -> Vec<String> {
        self.heard.0.borrow().clone()
    }
}

fn route(ctx: &Ctx) -> DirectRoute {
    ctx.dial_route.clone().expect("a direct route")
}

/// A raw connection to the server's Unix socket.
async fn raw(ctx: &Ctx) -> tokio::net::UnixStream {
    match ctx.address.as_ref().expect("a network backend") {
        Address::Unix(path) => tokio::net::UnixStream::connect(path)
            .await
            .expect("connect"),
        other => panic!("direct channels are a Unix socket's, not {other}"),
    }
}

/// The server still serves: a dial through a direct channel moves bytes.
async fn still_serving(ctx: &Ctx) {
    let (listener, address) = peer().await;
    let far = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        socket.write_all(b"still here").await.expect("write");
    });
    let mut stream = capexec::client::dial_via(&ctx.executor, &address, ctx.dial_route.as_ref())
        .await
        .expect("dial");
    assert!(stream.is_direct());
    let mut got = [0u8; 10];
    stream.read_exact(&mut got).await.expect("read");
    assert_eq!(&got, b"still here");
    far.await.expect("peer");
}

/// Reads until the server closes the connection; what it sent first.
async fn read_until_closed(stream: &mut tokio::net::UnixStream) -> Vec<u8> {
    let mut got = Vec::new();
    match tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut got)).await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => panic!("{error}"),
        Err(_) => panic!("the server kept the connection open"),
    }
    got
}

async fn forged_and_reused_tickets_claim_nothing(ctx: Ctx) {
    // Never issued: closed with no answer.
    let mut forged = raw(&ctx).await;
    forged.write_all(&CHANNEL_MAGIC).await.expect("magic");
    forged
        .write_all(&[0x5a; TICKET_BYTES])
        .await
        .expect("ticket");
    assert_eq!(read_until_closed(&mut forged).await, b"");
    let refused = route(&ctx).open(&[0x5a; TICKET_BYTES]).await;
    assert_eq!(
        refused.map(drop).expect_err("forged").kind(),
        ErrorKind::ConnectionRefused
    );

    // Issued: claims once, then never again.
    let (listener, address) = peer().await;
    let far = tokio::spawn(async move { listener.accept().await.expect("accept").0 });
    let dial = RawDial::new(&ctx, &address).await;
    let ticket = dial.ticket().expect("granted");
    let _far = far.await.expect("peer");
    let _claimed = route(&ctx).open(&ticket).await.expect("claimed");
    let again = route(&ctx).open(&ticket).await;
    assert_eq!(
        again.map(drop).expect_err("used").kind(),
        ErrorKind::ConnectionRefused
    );
    still_serving(&ctx).await;
}

async fn a_preamble_that_is_not_one_is_closed(ctx: Ctx) {
    // The magic's segment count, then anything but "cxd1".
    let mut wrong = raw(&ctx).await;
    wrong
        .write_all(&[0xff, 0xff, 0xff, 0xff])
        .await
        .expect("write");
    wrong.write_all(&[b'x'; 36]).await.expect("write");
    assert_eq!(read_until_closed(&mut wrong).await, b"");
    // The magic trickled in a byte at a time, then the ticket never sent.
    let mut slow = raw(&ctx).await;
    for byte in CHANNEL_MAGIC {
        slow.write_all(&[byte]).await.expect("write");
        tokio::task::yield_now().await;
    }
    assert_eq!(
        read_until_closed(&mut slow).await,
        b"",
        "closed within 10 s"
    );
    still_serving(&ctx).await;
}

async fn a_write_through_the_sinks_of_a_claimed_connection_is_refused(ctx: Ctx) {
    let (listener, address) = peer().await;
    let far = tokio::spawn(async move { listener.accept().await.expect("accept").0 });
    let dial = RawDial::new(&ctx, &address).await;
    let ticket = dial.ticket().expect("granted");
    let mut far = far.await.expect("peer");
    let mut channel = route(&ctx).open(&ticket).await.expect("claimed");
    // The channel works both ways first.
    far.write_all(b"down").await.expect("peer writes");
    let mut four = [0u8; 4];
    match &mut channel {
        capexec::ports::Socket::Unix(stream) => stream.read_exact(&mut four).await,
        capexec::ports::Socket::Tcp(stream) => stream.read_exact(&mut four).await,
    }
    .expect("read the channel");
    assert_eq!(&four, b"down");
    let error = raw_write(&dial.to_socket(), b"around the channel")
        .promise
        .await
        .map(drop)
        .expect_err("refused");
    let refusal = capexec::wire::refusal_of(&error).expect("a refusal");
    assert_eq!(refusal.kind, RefusalKind::InvalidArgument, "{refusal}");
    // ... and the connection is reset, the peer told so, the client too.
    let error = read_all(&mut far)
        .await
        .expect_err("the peer reads a reset");
    assert_eq!(error.kind(), ErrorKind::ConnectionReset, "{error}");
    common::eventually_async("the dial hears", async || !dial.heard().is_empty()).await;
    let heard = dial.heard();
    assert!(
        heard.len() == 1 && heard[0].starts_with("fail ") && heard[0].contains("direct channel"),
        "{heard:?}"
    );
}

async fn a_ticket_nobody_claims_resets_the_connection(ctx: Ctx) {
    let (listener, address) = peer().await;
    let far = tokio::spawn(async move { listener.accept().await.expect("accept").0 });
    let started = tokio::time::Instant::now();
    let dial = RawDial::new(&ctx, &address).await;
    assert!(dial.ticket().is_some());
    let mut far = far.await.expect("peer");
    let error = read_all(&mut far)
        .await
        .expect_err("the peer reads a reset");
    assert_eq!(error.kind(), ErrorKind::ConnectionReset, "{error}");
    assert!(
        started.elapsed() >= DIRECT_CLAIM_WITHIN,
        "reset before its time"
    );
    common::eventually_async("the dial hears", async || !dial.heard().is_empty()).await;
    let heard = dial.heard();
    assert_eq!(
        heard,
        ["fail its direct channel was not opened within 10 s"],
        "{heard:?}"
    );
}

async fn a_declined_channel_leaves_the_bytes_to_the_sinks(ctx: Ctx) {
    let (listener, address) = peer().await;
    let far = tokio::spawn(async move { listener.accept().await.expect("accept").0 });
    let dial = RawDial::new(&ctx, &address).await;
    assert!(dial.ticket().is_some());
    let mut far = far.await.expect("peer");
    // Nothing moves while the channel is offered...
    far.write_all(b"held").await.expect("peer writes");
    // ... a write declines it, and is the first to reach the peer.
    let mut request = dial.to_socket().write_request();
    request.get().set_bytes(b"up");
    request.send().await.expect("written through the sinks");
    let mut two = [0u8; 2];
    far.read_exact(&mut two).await.expect("peer reads");
    assert_eq!(&two, b"up");
    common::eventually_async("the dial hears the write", async || {
        dial.heard() == ["write 4"]
    })
    .await;
}

/// A `Process` the front of a chain passes on is the far server's: its
/// ticket claims nothing at the front, and the client declines it.
async fn a_ticket_from_beyond_the_hop_is_declined(ctx: Ctx) {
    let process = crate::facets::spawn_cat(&ctx).await;
    let (listener, address) = peer().await;
    let far = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        socket
            .write_all(b"from the far machine")
            .await
            .expect("write");
        socket.shutdown().await.expect("half-close");
        let mut got = Vec::new();
        socket.read_to_end(&mut got).await.expect("read");
        got
    });
    let mut stream = process
        .dial_via(&address, ctx.dial_route.as_ref())
        .await
        .expect("dial");
    assert_eq!(stream.is_direct(), ctx.backend != common::Backend::Chained);
    let mut got = Vec::new();
    stream.read_to_end(&mut got).await.expect("read");
    assert_eq!(got, b"from the far machine");
    stream.write_all(b"and back").await.expect("write");
    stream.shutdown().await.expect("half-close");
    assert_eq!(far.await.expect("peer"), b"and back");
}

/// A client that asks for channels and never claims them holds at most
/// its share of the server's tickets; past that its dials go through the
/// sinks, and another connection is still granted channels.
async fn unclaimed_tickets_are_bounded_per_connection(ctx: Ctx) {
    let (listener, address) = peer().await;
    let accepting = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let mut dials = Vec::new();
    for _ in 0..MAX_UNCLAIMED_PER_CONNECTION + 8 {
        dials.push(RawDial::new(&ctx, &address).await);
    }
    let granted = dials.iter().filter(|dial| dial.ticket().is_some()).count();
    assert_eq!(granted, MAX_UNCLAIMED_PER_CONNECTION);
    let other = ctx.connect_again().await.expect("a second connection");
    let route = other.direct_route();
    let stream = capexec::client::dial_via(&other.executor(), &address, route.as_ref())
        .await
        .expect("dial");
    assert!(stream.is_direct(), "another connection has its own share");
    drop((dials, stream));
    accepting.abort();
}

/// The Cap'n Proto connection cut while a direct channel carries bytes:
/// both ends of the forwarded connection see an error, never an end of
/// file, though the channel itself is still up until the server resets.
async fn a_cut_connection_fails_its_channels_at_both_ends(ctx: Ctx) {
    let (listener, address) = peer().await;
    let far = tokio::spawn(async move { listener.accept().await.expect("accept").0 });
    let connection = ctx.connect_again().await.expect("a second connection");
    let route = connection.direct_route();
    let mut stream = capexec::client::dial_via(&connection.executor(), &address, route.as_ref())
        .await
        .expect("dial");
    assert!(stream.is_direct());
    let mut far = far.await.expect("peer");
    stream.write_all(b"up").await.expect("write");
    let mut two = [0u8; 2];
    far.read_exact(&mut two).await.expect("the peer reads");
    far.write_all(b"dn").await.expect("the peer writes");
    stream.read_exact(&mut two).await.expect("read");
    assert_eq!(&two, b"dn");
    drop(connection);
    let mut rest = Vec::new();
    let error = stream
        .read_to_end(&mut rest)
        .await
        .expect_err("an error, not an end of file");
    assert!(
        matches!(
            error.kind(),
            ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
        ),
        "{error}"
    );
    let error = read_all(&mut far)
        .await
        .expect_err("the peer reads a reset");
    assert_eq!(error.kind(), ErrorKind::ConnectionReset, "{error}");
}

/// `bytes` with a descriptor of /dev/null, in one sendmsg(2) on `socket`.
fn send_with_a_descriptor(socket: &impl std::os::fd::AsRawFd, bytes: &[u8]) -> nix::Result<usize> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    use std::os::fd::AsRawFd;
    let null = std::fs::File::open("/dev/null").expect("open");
    let fds = [null.as_raw_fd()];
    sendmsg::<()>(
        socket.as_raw_fd(),
        &[std::io::IoSlice::new(bytes)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
}

/// A channel's bytes are spliced, and a splice has the kernel close the
/// descriptors that came with them on the thread that splices (a pipe
/// whose lock the peer holds would keep it asleep): a claimed channel
/// refuses them (the kernel fails the send), and one that sent some with
/// its ticket is closed unclaimed.
async fn a_channel_takes_no_descriptors(ctx: Ctx) {
    let (listener, address) = peer().await;
    let far = tokio::spawn(async move { listener.accept().await.expect("accept").0 });
    let dial = RawDial::new(&ctx, &address).await;
    let ticket = dial.ticket().expect("granted");
    let mut far = far.await.expect("peer");
    let channel = route(&ctx).open(&ticket).await.expect("claimed");
    let refused = send_with_a_descriptor(&channel, b"x").expect_err("refused");
    assert_eq!(refused, nix::errno::Errno::EPERM);
    channel.write_all(b"up").await.expect("write");
    let mut got = [0u8; 2];
    far.read_exact(&mut got).await.expect("peer reads");
    assert_eq!(&got, b"up", "only the bytes sent without one");

    // With the ticket, before the server looked: closed, never claimed.
    let (listener, address) = peer().await;
    let far = tokio::spawn(async move { listener.accept().await.expect("accept").0 });
    let dial = RawDial::new(&ctx, &address).await;
    let ticket = dial.ticket().expect("granted");
    let _far = far.await.expect("peer");
    let mut opening = raw(&ctx).await;
    let mut preamble = CHANNEL_MAGIC.to_vec();
    preamble.extend_from_slice(&ticket);
    send_with_a_descriptor(&opening, &preamble).expect("sent before the claim");
    // Closed with its preamble unread: a reset, and no claim's answer.
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), opening.read_to_end(&mut got))
        .await
        .expect("the server kept the connection open");
    assert_eq!(got, b"", "never claimed");
    assert!(
        read.as_ref()
            .map_or_else(|error| error.kind() == ErrorKind::ConnectionReset, |_| true),
        "{read:?}"
    );
    still_serving(&ctx).await;
}

mod direct {
    use super::*;
    backend_tests!(
        with run_direct on [unix]:
        a_channel_takes_no_descriptors,
        a_cut_connection_fails_its_channels_at_both_ends,
        unclaimed_tickets_are_bounded_per_connection,
        forged_and_reused_tickets_claim_nothing,
        a_preamble_that_is_not_one_is_closed,
        a_write_through_the_sinks_of_a_claimed_connection_is_refused,
        a_declined_channel_leaves_the_bytes_to_the_sinks,
    );
}

/// Through the chain too: there the front server did not grant it.
mod beyond {
    use super::*;
    backend_tests!(with run_direct on [unix, chained]: a_ticket_from_beyond_the_hop_is_declined);
}

/// One backend: it waits out the 10 s a ticket has.
mod slow {
    use super::*;
    backend_tests!(with run_direct on [unix]: a_ticket_nobody_claims_resets_the_connection);
}

/// Over TCP the connection has no route, and a dial that asks anyway is
/// granted no channel (its bytes would need a login and TLS of their own).
async fn tcp_connections_are_granted_no_channel(ctx: Ctx) {
    assert!(ctx.dial_route.is_none());
    let (listener, address) = peer().await;
    let far = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        socket.write_all(b"through the sinks").await.expect("write");
    });
    let dial = RawDial::new(&ctx, &address).await;
    assert!(dial.ticket().is_none());
    far.await.expect("peer");
    common::eventually_async("the dial hears the write first", async || {
        dial.heard().first().map(String::as_str) == Some("write 17")
    })
    .await;
}

mod plain {
    use super::*;
    backend_tests!(with run_direct on [tcp]: tcp_connections_are_granted_no_channel);
}
