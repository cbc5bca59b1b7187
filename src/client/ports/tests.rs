//! A stream's reading of what arrives, against a sender of the library's
//! own on its `fromSocket` sink: no server in between, so the writes are
//! exactly the ones a test makes.

use std::future::Future;
use std::rc::Rc;

use tokio::io::{AsyncBufReadExt, AsyncReadExt};

use super::PortStream;
use super::inbox::new_inbox;
use crate::capexec_capnp::{port_connection, port_sink};
use crate::model::PortConnectionInfo;
use crate::wire::{PortBudget, PortSender};

/// A `toSocket` that takes every write and end.
struct Taking;

impl port_sink::Server for Taking {
    fn write(
        self: Rc<Self>,
        _: port_sink::WriteParams,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        std::future::ready(Ok(()))
    }
}

/// The connection's capability, held.
struct Held;

impl port_connection::Server for Held {}

fn stream_and_far_sender() -> (PortStream, PortSender) {
    let (inbox, from_socket) = new_inbox();
    let stream = PortStream::new(
        inbox,
        capnp_rpc::new_client(Taking),
        capnp_rpc::new_client(Held),
        PortConnectionInfo::default(),
        None,
    );
    (
        stream,
        PortSender::new(from_socket, PortBudget::new(1 << 20)),
    )
}

fn run_local(test: impl Future<Output = ()>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    tokio::task::LocalSet::new().block_on(&runtime, test);
}

/// An empty write (the server sends none, but a peer may) is answered and
/// passed over: only the end is read as the end.
#[test]
fn an_empty_write_is_passed_over_not_read_as_the_end() {
    run_local(async {
        let (mut stream, far) = stream_and_far_sender();
        let far = Rc::new(far);
        for bytes in [&b""[..], b"abc", b"", b"", b"def", b""] {
            far.send_now(bytes);
        }
        let ending = Rc::clone(&far);
        let ended = tokio::task::spawn_local(async move { ending.end().await });
        let mut got = Vec::new();
        stream.read_to_end(&mut got).await.expect("read");
        assert_eq!(got, b"abcdef");
        ended.await.expect("ended").expect("every write answered");
    });
}

/// `fill_buf` hands out one write's bytes until they are consumed, and
/// the write is answered only then.
#[test]
fn a_write_is_answered_once_its_bytes_are_consumed() {
    run_local(async {
        let (mut stream, far) = stream_and_far_sender();
        let far = Rc::new(far);
        far.send_now(b"hello");
        far.send_now(b"world");
        assert_eq!(stream.fill_buf().await.expect("fill"), b"hello");
        stream.consume(2);
        assert_eq!(stream.fill_buf().await.expect("fill"), b"llo");
        // Nothing is answered: "hello" is not all consumed yet.
        tokio::task::yield_now().await;
        let drained =
            std::future::poll_fn(|cx| std::task::Poll::Ready(far.poll_drained(cx).is_ready()));
        assert!(!drained.await, "a write answered before it was read");
        assert_eq!(far.in_flight(), 10);
        stream.consume(3);
        // The far sender takes its answers (a local capability runs the
        // next call once the one before it is answered and polled).
        let draining = Rc::clone(&far);
        let drained = tokio::task::spawn_local(async move {
            std::future::poll_fn(|cx| draining.poll_drained(cx)).await
        });
        let mut rest = [0u8; 5];
        stream.read_exact(&mut rest).await.expect("read");
        assert_eq!(&rest, b"world");
        drained.await.expect("drained").expect("both answered");
        assert_eq!(far.in_flight(), 0);
    });
}
