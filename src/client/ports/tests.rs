//! A stream's reading of what arrives, against a sender of the library's
//! own on its `fromSocket` sink: no server in between, so the writes are
//! exactly the ones a test makes.

use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use super::PortStream;
use super::inbox::new_inbox;
use crate::capexec_capnp::{port_connection, port_sink};
use crate::model::PortConnectionInfo;
use crate::wire::fixtures::Collecting;
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
        .enable_time()
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
        assert_eq!(stream.fill_buf().await.expect("fill"), b"hello");
        stream.consume(2);
        assert_eq!(stream.fill_buf().await.expect("fill"), b"llo");
        // Not answered: "hello" is not all consumed yet.
        tokio::task::yield_now().await;
        let drained =
            std::future::poll_fn(|cx| std::task::Poll::Ready(far.poll_drained(cx).is_ready()));
        assert!(!drained.await, "a write answered before it was read");
        assert_eq!(far.in_flight(), 5);
        far.send_now(b"world");
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

/// How long a task that should wake is given before the test calls it
/// asleep for good: far beyond any wake-up, short of CI's patience.
const WAKE_DEADLINE: Duration = Duration::from_secs(30);

/// A `toSocket` whose writes are answered once the gate opens.
struct Gated(tokio::sync::watch::Receiver<bool>);

impl port_sink::Server for Gated {
    fn write(
        self: Rc<Self>,
        _: port_sink::WriteParams,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        let mut gate = self.0.clone();
        async move {
            let _ = gate.wait_for(|open| *open).await;
            Ok(())
        }
    }
}

/// A stream whose writes wait for the gate, the gate's opener, and the
/// far sender of what it reads.
fn gated_stream() -> (PortStream, tokio::sync::watch::Sender<bool>, PortSender) {
    let (open, gate) = tokio::sync::watch::channel(false);
    let (inbox, from_socket) = new_inbox();
    let stream = PortStream::new(
        inbox,
        capnp_rpc::new_client(Gated(gate)),
        capnp_rpc::new_client(Held),
        PortConnectionInfo::default(),
        None,
    );
    let far = PortSender::new(from_socket, PortBudget::new(1 << 20));
    (stream, open, far)
}

/// Four windows' worth, written by a task of its own: it must wait for
/// room, which only the gate's answers make.
async fn writer_waiting_for_room(
    mut writing: super::PortWriteHalf,
) -> tokio::task::JoinHandle<super::PortWriteHalf> {
    let writer = tokio::task::spawn_local(async move {
        writing.write_all(&vec![7u8; 4 << 20]).await.expect("write");
        writing
    });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!writer.is_finished(), "the window did not fill");
    writer
}

/// The halves in a task each, as `into_split` is for: the answers that
/// make the writer room wake it, though the reader, waiting for bytes in
/// a task of its own, polled them last. (Found by a review: the reader's
/// waker took the writer's place, and the writer slept for good.)
#[test]
fn a_writing_task_wakes_for_room_while_a_reading_task_waits() {
    run_local(async {
        let (stream, open, far) = gated_stream();
        let (mut reading, writing) = stream.into_split();
        let writer = writer_waiting_for_room(writing).await;
        let reader = tokio::task::spawn_local(async move {
            let _ = reading.fill_buf().await;
            reading
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        open.send(true).expect("open the gate");
        let writing = tokio::time::timeout(WAKE_DEADLINE, writer)
            .await
            .expect("the writing task was never woken")
            .expect("writer");
        assert!(!reader.is_finished(), "nothing was sent to read");
        drop((writing, reader, far));
    });
}

/// As above, with the reading task finished (the far direction ended)
/// before the answers come: they still wake the writer.
#[test]
fn a_writing_task_wakes_for_room_after_the_reading_task_ended() {
    run_local(async {
        let (stream, open, far) = gated_stream();
        let (mut reading, writing) = stream.into_split();
        let writer = writer_waiting_for_room(writing).await;
        let reader = tokio::task::spawn_local(async move {
            let mut all = Vec::new();
            reading.read_to_end(&mut all).await.expect("read");
            all
        });
        let far = Rc::new(far);
        far.send_now(b"response");
        let ending = Rc::clone(&far);
        tokio::task::spawn_local(async move { ending.end().await })
            .await
            .expect("end task")
            .expect("ended");
        assert_eq!(reader.await.expect("reader"), b"response");
        open.send(true).expect("open the gate");
        let writing = tokio::time::timeout(WAKE_DEADLINE, writer)
            .await
            .expect("the writing task was never woken")
            .expect("writer");
        drop(writing);
    });
}

/// What `write_all` said was written goes out when the writing half is
/// dropped at once, while the reading half lives on (found by a review:
/// the gathered bytes went with the half); the direction is not ended.
#[test]
fn bytes_written_before_the_writing_half_is_dropped_go_out() {
    run_local(async {
        let sink = Rc::new(Collecting::default());
        let (inbox, from_socket) = new_inbox();
        let stream = PortStream::new(
            inbox,
            capnp_rpc::new_client_from_rc(Rc::clone(&sink)),
            capnp_rpc::new_client(Held),
            PortConnectionInfo::default(),
            None,
        );
        let (reading, mut writing) = stream.into_split();
        writing
            .write_all(b"GET / HTTP/1.0\r\n\r\n")
            .await
            .expect("written");
        drop(writing);
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert_eq!(&sink.bytes.borrow()[..], b"GET / HTTP/1.0\r\n\r\n");
        assert!(!sink.ended.get(), "a drop does not end the direction");
        drop((reading, from_socket));
    });
}

/// A caller that says it consumed more than was handed out (`usize::MAX`
/// at worst) consumes the write at hand and no more: the next write's
/// bytes come next, none of the first's again.
#[test]
fn consuming_more_than_was_handed_out_takes_only_the_write_at_hand() {
    run_local(async {
        let (mut stream, far) = stream_and_far_sender();
        far.send_now(b"first");
        far.send_now(b"second");
        assert_eq!(stream.fill_buf().await.expect("fill"), b"first");
        stream.consume(2);
        stream.consume(usize::MAX);
        let far = Rc::new(far);
        let draining = Rc::clone(&far);
        let drained = tokio::task::spawn_local(async move {
            std::future::poll_fn(|cx| draining.poll_drained(cx)).await
        });
        assert_eq!(stream.fill_buf().await.expect("fill"), b"second");
        stream.consume(6);
        drained.await.expect("drained").expect("both answered");
    });
}
