//! Sending one direction of a port connection's bytes into a `PortSink`:
//! the one sender the server (socket to client), the hops of a chain and
//! the client (its writes to the socket) all use, so that every hop holds
//! the same bounded window.
//!
//! `PortSink.write` is a `-> stream` method, but the sender does not use
//! capnp-rpc's streaming requests: their flow control says when a window
//! has room, not which writes were answered, and one window per
//! capability (512 KiB here) times a thousand connections would let one
//! Cap'n Proto connection hold half a gigabyte. Writes are sent as plain
//! calls instead (the receiver still runs them one at a time, in order,
//! since the method is declared `-> stream`), and the sender counts what
//! is unanswered: at most its share of a [`PortBudget`] that every sender
//! on the same Cap'n Proto connection shares.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Context, Poll};

use capnp::any_pointer;
use capnp::traits::HasTypeId;
use futures::StreamExt;
use futures::future::LocalBoxFuture;
use futures::stream::FuturesOrdered;

use crate::capexec_capnp::port_sink;

/// The most bytes capexec puts in one `PortSink.write`: big enough that
/// the per-message costs (the call, its answer and `Finish`, three
/// wake-ups on each side) are small next to the bytes' own, small enough
/// that a window holds four in flight.
pub const PORT_CHUNK_BYTES: usize = 256 * 1024;

/// The most bytes a `PortSink.write` may carry (the schema's limit).
pub const MAX_PORT_WRITE_BYTES: usize = 1 << 20;

/// The most bytes one direction of one connection has unanswered.
pub const PORT_WINDOW_BYTES: usize = 1 << 20;

/// What all the senders on one Cap'n Proto connection may have
/// unanswered together, shared fairly.
pub const PORT_POOL_BYTES: usize = 16 << 20;

/// Every sender's share of a pool, however many share it.
pub const MIN_PORT_SHARE_BYTES: usize = 16 * 1024;

/// Unanswered bytes shared by the senders of one Cap'n Proto connection:
/// each may have [`PORT_POOL_BYTES`] divided by their number (between
/// [`MIN_PORT_SHARE_BYTES`] and [`PORT_WINDOW_BYTES`]), so a thousand
/// connections hold no more than a few, and a stalled reader holds only
/// its share while the others go on.
#[derive(Clone)]
pub struct PortBudget(Rc<BudgetState>);

struct BudgetState {
    pool: usize,
    senders: Cell<usize>,
}

impl Default for PortBudget {
    fn default() -> Self {
        PortBudget::new(PORT_POOL_BYTES)
    }
}

impl PortBudget {
    pub fn new(pool: usize) -> PortBudget {
        PortBudget(Rc::new(BudgetState {
            pool,
            senders: Cell::new(0),
        }))
    }

    /// What one sender may have unanswered now.
    pub fn share(&self) -> usize {
        let senders = self.0.senders.get().max(1);
        (self.0.pool / senders).clamp(MIN_PORT_SHARE_BYTES, PORT_WINDOW_BYTES)
    }

    /// Senders sharing the pool now.
    pub fn senders(&self) -> usize {
        self.0.senders.get()
    }
}

type Ack = LocalBoxFuture<'static, Result<usize, capnp::Error>>;

/// Writes into one `PortSink`, in order, with at most its budget's share
/// unanswered.
pub struct PortSender {
    sink: port_sink::Client,
    budget: PortBudget,
    state: RefCell<SenderState>,
}

#[derive(Default)]
struct SenderState {
    /// The answers still to come, oldest first, each with its size.
    acks: FuturesOrdered<Ack>,
    in_flight: usize,
    /// The first failed write: every later call fails with it.
    failed: Option<capnp::Error>,
}

/// A `PortSink.write` being filled in place (see [`PortSender::open_write`]).
pub struct OpenWrite {
    request: capnp::capability::Request<port_sink::write_params::Owned, any_pointer::Owned>,
    size: usize,
    filled: usize,
}

impl OpenWrite {
    /// The part not filled yet.
    pub fn unfilled(&mut self) -> &mut [u8] {
        let filled = self.filled;
        match self.request.get().get_bytes() {
            Ok(bytes) => &mut bytes[filled..],
            // Set by `open_write`; never fails on a message being built.
            Err(_) => &mut [],
        }
    }

    /// Appends as much of `bytes` as fits, and says how much.
    pub fn append(&mut self, bytes: &[u8]) -> usize {
        let unfilled = self.unfilled();
        let n = unfilled.len().min(bytes.len());
        unfilled[..n].copy_from_slice(&bytes[..n]);
        self.filled += n;
        n
    }

    /// Whether nothing more fits.
    pub fn is_full(&self) -> bool {
        self.filled == self.size
    }
}

impl PortSender {
    pub fn new(sink: port_sink::Client, budget: PortBudget) -> PortSender {
        budget.0.senders.set(budget.0.senders.get() + 1);
        PortSender {
            sink,
            budget,
            state: RefCell::new(SenderState::default()),
        }
    }

    /// The sink written into.
    pub fn sink(&self) -> &port_sink::Client {
        &self.sink
    }

    /// Unanswered bytes now (answers that arrived are only counted once
    /// the sender is next used).
    pub fn in_flight(&self) -> usize {
        self.state.borrow().in_flight
    }

    /// Whether bytes may be sent now, and how many: at most
    /// [`PORT_CHUNK_BYTES`], or half the share if that is less. Pending
    /// until an answer makes room for that much: a sender that took every
    /// sliver of room the answers make would cut its stream into ever
    /// smaller writes, each costing the receiver a message.
    pub fn poll_room(&self, cx: &mut Context<'_>) -> Poll<Result<usize, capnp::Error>> {
        let mut state = self.state.borrow_mut();
        state.retire(cx)?;
        let share = self.budget.share();
        let room = share.saturating_sub(state.in_flight);
        let enough = PORT_CHUNK_BYTES.min(share / 2).max(1);
        if room >= enough || (state.in_flight == 0 && room > 0) {
            // At most `enough`, not a whole chunk: with a share under two
            // chunks, two writes stay in flight instead of one.
            Poll::Ready(Ok(room.min(enough)))
        } else {
            // An answer is due (something is in flight): it wakes us.
            Poll::Pending
        }
    }

    /// Waits until bytes may be sent, and says how many: for reading just
    /// that much from a socket.
    pub async fn room(&self) -> Result<usize, capnp::Error> {
        poll_fn(|cx| self.poll_room(cx)).await
    }

    /// Collects the answers that have arrived, registering `cx` for the
    /// next: whoever waits for something else in the meantime (a socket's
    /// bytes) calls it too, since the receiver of a local capability gets
    /// the next write only once the answer to the last one was polled.
    /// An error says a write failed: the stream is broken.
    pub fn poll_progress(&self, cx: &mut Context<'_>) -> Result<(), capnp::Error> {
        self.state.borrow_mut().retire(cx)
    }

    /// Ready once every write sent has been answered (or one failed).
    pub fn poll_drained(&self, cx: &mut Context<'_>) -> Poll<Result<(), capnp::Error>> {
        let mut state = self.state.borrow_mut();
        state.retire(cx)?;
        if state.in_flight == 0 {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    /// Sends `bytes` (at most [`MAX_PORT_WRITE_BYTES`]) now, without
    /// waiting for room or for the answer: call it after
    /// [`PortSender::poll_room`] said how much fits.
    pub fn send_now(&self, bytes: &[u8]) {
        let mut request = self.write_request(bytes.len());
        request.get().set_bytes(bytes);
        self.dispatch(request, bytes.len());
    }

    /// Sends what `read` puts into a write of `size` bytes (at most what
    /// [`PortSender::poll_room`] said fits), read straight into the
    /// message, with no copy of its own; what `read` says it read is
    /// sent, nothing if it read nothing or failed.
    pub fn send_read(
        &self,
        size: usize,
        read: impl FnOnce(&mut [u8]) -> std::io::Result<usize>,
    ) -> std::io::Result<usize> {
        let mut write = self.open_write(size);
        let got = read(write.unfilled())?;
        write.filled = got;
        self.send_open(write);
        Ok(got)
    }

    /// A write of up to `size` bytes (at most what [`PortSender::poll_room`]
    /// said fits) to fill in place before [`PortSender::send_open`] sends
    /// it; its bytes count as unanswered only once sent.
    pub fn open_write(&self, size: usize) -> OpenWrite {
        let mut request = self.write_request(size);
        request.get().init_bytes(size as u32);
        OpenWrite {
            request,
            size,
            filled: 0,
        }
    }

    /// Sends the bytes filled into `write`: a full one as it is, a part
    /// as a write of just those (one copy), nothing if it is empty.
    pub fn send_open(&self, write: OpenWrite) {
        let OpenWrite {
            mut request,
            size,
            filled,
        } = write;
        if filled == size {
            self.dispatch(request, size);
        } else if filled > 0 {
            let params = request.get().into_reader();
            if let Ok(bytes) = params.get_bytes() {
                self.send_now(&bytes[..filled]);
            }
        }
    }

    fn write_request(
        &self,
        size: usize,
    ) -> capnp::capability::Request<port_sink::write_params::Owned, any_pointer::Owned> {
        let words = size.div_ceil(8) as u64 + 8;
        self.sink
            .client
            .new_call::<port_sink::write_params::Owned, any_pointer::Owned>(
                <port_sink::Client as HasTypeId>::TYPE_ID,
                0,
                Some(capnp::MessageSize {
                    word_count: words,
                    cap_count: 0,
                }),
            )
    }

    fn dispatch(
        &self,
        request: capnp::capability::Request<port_sink::write_params::Owned, any_pointer::Owned>,
        size: usize,
    ) {
        let answer = request.send().promise;
        let mut ack: Ack = Box::pin(async move { answer.await.map(|_| size) });
        // A call on a local capability is only dispatched when first
        // polled: poll it now, so that writes (and the `end` after them)
        // reach the receiver in the order they were sent. Its answer is
        // polled again, with a real waker, from the queue.
        let early = ack
            .as_mut()
            .poll(&mut Context::from_waker(futures::task::noop_waker_ref()));
        let mut state = self.state.borrow_mut();
        state.in_flight += size;
        match early {
            Poll::Ready(Ok(_)) => state.in_flight -= size,
            Poll::Ready(Err(error)) => {
                state.failed.get_or_insert(error);
            }
            Poll::Pending => state.acks.push_back(ack),
        }
    }

    /// Ends this direction after every write sent, and waits for the
    /// receiver's answer (which comes after every earlier write's, so a
    /// write that failed fails it too).
    pub async fn end(&self) -> Result<(), capnp::Error> {
        // Every write answered first: a local capability runs the calls on
        // it one at a time, and only once their answers are polled.
        poll_fn(|cx| self.poll_drained(cx)).await?;
        let answer = self.sink.end_request().send().promise;
        answer.await?;
        Ok(())
    }

    /// Tells the receiver this direction broke, after every write sent;
    /// the answer may be awaited or dropped.
    pub fn fail(&self, reason: &str) -> impl Future<Output = Result<(), capnp::Error>> + use<> {
        let mut request = self.sink.fail_request();
        request.get().set_reason(reason);
        let answer = request.send().promise;
        async move { answer.await.map(|_| ()) }
    }
}

impl SenderState {
    /// Counts the answers that have arrived; the first failure is kept.
    fn retire(&mut self, cx: &mut Context<'_>) -> Result<(), capnp::Error> {
        while let Poll::Ready(Some(answer)) = self.acks.poll_next_unpin(cx) {
            match answer {
                Ok(size) => self.in_flight -= size,
                Err(error) => {
                    self.failed.get_or_insert(error);
                }
            }
        }
        match &self.failed {
            Some(error) => Err(error.clone()),
            None => Ok(()),
        }
    }
}

impl Drop for PortSender {
    fn drop(&mut self) {
        self.budget
            .0
            .senders
            .set(self.budget.0.senders.get().saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_shrink_with_senders_between_the_bounds() {
        let budget = PortBudget::new(PORT_POOL_BYTES);
        assert_eq!(budget.share(), PORT_WINDOW_BYTES);
        budget.0.senders.set(64);
        assert_eq!(budget.share(), PORT_POOL_BYTES / 64);
        budget.0.senders.set(100_000);
        assert_eq!(budget.share(), MIN_PORT_SHARE_BYTES);
    }

    /// A sink that leaves every write unanswered.
    struct Unanswered;

    impl port_sink::Server for Unanswered {
        fn write(
            self: Rc<Self>,
            _: port_sink::WriteParams,
        ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
            std::future::pending()
        }

        fn end(
            self: Rc<Self>,
            _: port_sink::EndParams,
            _: port_sink::EndResults,
        ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
            std::future::pending()
        }
    }

    /// With room for a chunk and a half, writes of half the share keep two
    /// in flight (whole chunks would leave room for none after the first).
    #[test]
    fn a_share_under_two_chunks_keeps_two_writes_in_flight() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        tokio::task::LocalSet::new().block_on(&runtime, async {
            let share = PORT_CHUNK_BYTES * 3 / 2;
            let sender = PortSender::new(capnp_rpc::new_client(Unanswered), PortBudget::new(share));
            assert_eq!(sender.budget.share(), share);
            let data = vec![7u8; PORT_CHUNK_BYTES];
            let mut sizes = Vec::new();
            while let Poll::Ready(room) = poll_fn(|cx| Poll::Ready(sender.poll_room(cx))).await {
                let room = room.expect("room");
                sender.send_now(&data[..room]);
                sizes.push(room);
                assert!(sizes.len() < 10, "{sizes:?}");
            }
            assert_eq!(sizes, [share / 2, share / 2]);
            assert_eq!(sender.in_flight(), share);
        });
    }

    use super::fixtures::Collecting;

    /// Writes of every size, sent, filled in pieces or read, arrive whole
    /// and in order.
    #[test]
    fn every_kind_of_write_arrives_whole_and_in_order() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        tokio::task::LocalSet::new().block_on(&runtime, async {
            let sink = Rc::new(Collecting::default());
            let client: port_sink::Client = capnp_rpc::new_client_from_rc(Rc::clone(&sink));
            let sender = PortSender::new(client, PortBudget::new(PORT_POOL_BYTES));
            let pattern: Vec<u8> = (0..PORT_CHUNK_BYTES)
                .map(|i| (i * 31 + i / 257) as u8)
                .collect();
            let mut expected = Vec::new();
            let mut at = 0;
            let mut take = |len: usize| {
                let piece = pattern[at % 1000..at % 1000 + len].to_vec();
                at += 7;
                piece
            };
            let lens = [1, 16_383, 16_384, 16_385, 100_000, PORT_CHUNK_BYTES - 1000];
            for len in lens {
                let piece = take(len);
                sender.send_now(&piece);
                expected.extend_from_slice(&piece);
            }
            for len in lens {
                let piece = take(len);
                let mut open = sender.open_write(len);
                let (first, rest) = piece.split_at(len / 3);
                assert_eq!(open.append(first), first.len());
                assert!(open.is_full() == rest.is_empty());
                assert_eq!(open.append(rest), rest.len());
                assert!(open.is_full());
                sender.send_open(open);
                expected.extend_from_slice(&piece);
            }
            for len in lens {
                let piece = take(len);
                // Read short of the room given: only what was read goes.
                let sent = sender.send_read(len + 5, |buffer| {
                    buffer[..len].copy_from_slice(&piece);
                    Ok(len)
                });
                assert_eq!(sent.expect("read"), len);
                expected.extend_from_slice(&piece);
            }
            sender.end().await.expect("ended");
            assert!(*sink.bytes.borrow() == expected, "the bytes differ");
        });
    }
}

/// Sinks for the tests of the senders and of what they send into.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::cell::{Cell, RefCell};
    use std::future::Future;
    use std::rc::Rc;

    use crate::capexec_capnp::port_sink;

    /// A sink that keeps what it is sent, and whether it was ended,
    /// answering each call at once.
    #[derive(Default)]
    pub(crate) struct Collecting {
        pub(crate) bytes: RefCell<Vec<u8>>,
        pub(crate) ended: Cell<bool>,
    }

    impl port_sink::Server for Collecting {
        fn write(
            self: Rc<Self>,
            params: port_sink::WriteParams,
        ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
            let bytes = params.get().and_then(|params| params.get_bytes());
            let kept = bytes.map(|bytes| self.bytes.borrow_mut().extend_from_slice(bytes));
            std::future::ready(kept)
        }

        fn end(
            self: Rc<Self>,
            _: port_sink::EndParams,
            _: port_sink::EndResults,
        ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
            self.ended.set(true);
            std::future::ready(Ok(()))
        }
    }
}
