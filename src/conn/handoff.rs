//! Standard descriptors handed from a client to a server on its machine,
//! for its children to use as they are (see `StartParams.passedStdio`).
//!
//! A client queues them on its connection's [`DescriptorOutbox`], which
//! the transport sends with the next bytes it writes (SCM_RIGHTS over the
//! Unix socket, `net::passing`), before the start that names them; the
//! server's transport files what arrives in the connection's
//! [`ReceivedDescriptors`], where the start takes them by number. An
//! in-process client files them there itself ([`StdioRoute::InProcess`]).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::rc::Rc;

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::sys::{Closes, waiting_to_close};

/// Most descriptors one connection keeps for starts that have not taken
/// them yet; the oldest are closed first. A start sends its descriptors
/// just before it (at most 3), so only a peer that sends descriptors no
/// start asks for reaches this.
pub const MAX_KEPT_DESCRIPTORS: usize = 16;

/// Most kept over all of a server's connections: beyond it, arriving
/// descriptors are closed at once (their starts have pipes), so that
/// peers cannot take the descriptors the server's budget counts on.
pub const MAX_KEPT_DESCRIPTORS_IN_SERVER: usize = 1024;

/// Most descriptors of one connection that may wait to close while it is
/// read: beyond, its reads wait for closes, and the connection ends if
/// the close in progress sleeps (a pipe whose lock the peer holds;
/// [`ReceivedDescriptors::room`]).
pub const MAX_WAITING_TO_CLOSE: usize = 64;

/// Most descriptors waiting to close over the whole server while a
/// connection sends more: beyond, connections that send any end.
pub const MAX_WAITING_TO_CLOSE_IN_SERVER: usize = MAX_KEPT_DESCRIPTORS_IN_SERVER;

/// The server's places for kept descriptors: each kept one holds a permit.
static KEPT_IN_SERVER: Semaphore = Semaphore::const_new(MAX_KEPT_DESCRIPTORS_IN_SERVER);

/// A descriptor kept, with its number and its place in the server's count.
struct Kept {
    number: u64,
    fd: OwnedFd,
    _place: SemaphorePermit<'static>,
}

/// A connection's received descriptors, numbered from 0 in the order they
/// arrived (the order the peer sent them). Clones share them. Whatever is
/// closed here is closed off the calling thread, in order, one close at
/// a time ([`Closes`]): a close that sleeps holds up this connection's
/// closes only, and what waits behind it is counted.
#[derive(Clone, Default)]
pub struct ReceivedDescriptors(Rc<RefCell<Received>>);

#[derive(Default)]
struct Received {
    /// The number the next descriptor to arrive gets.
    next: u64,
    kept: VecDeque<Kept>,
    /// Some were lost on the way (a read had no room for them), so the
    /// numbers here are no longer the peer's: nothing is handed out again.
    out_of_step: bool,
    /// The connection has ended: nothing is kept any more.
    closed: bool,
    /// Where what is not kept is closed.
    closes: Closes,
    /// Tests: as if too many waited to close server-wide (the count is
    /// the whole process's, which other tests share).
    #[cfg(test)]
    overfull: bool,
}

impl Received {
    /// Kept entries' descriptors, their places given back.
    fn released(&mut self, entries: impl IntoIterator<Item = Kept>) -> Vec<OwnedFd> {
        entries.into_iter().map(|kept| kept.fd).collect()
    }
}

impl Drop for Received {
    fn drop(&mut self) {
        let kept = std::mem::take(&mut self.kept);
        let fds = self.released(kept);
        self.closes.close(fds);
    }
}

impl ReceivedDescriptors {
    /// Files `fd` as the next to arrive; returns its number. It is closed
    /// at once (and the start that names it has pipes) if none can be
    /// handed out any more, or the server keeps its maximum already.
    pub fn arrived(&self, fd: OwnedFd) -> u64 {
        let mut received = self.0.borrow_mut();
        let number = received.next;
        received.next += 1;
        let place = (!received.out_of_step && !received.closed)
            .then(|| KEPT_IN_SERVER.try_acquire().ok())
            .flatten();
        let Some(place) = place else {
            received.closes.close(vec![fd]);
            return number;
        };
        let mut evicted = Vec::new();
        if received.kept.len() >= MAX_KEPT_DESCRIPTORS {
            evicted.extend(received.kept.pop_front());
        }
        let evicted = received.released(evicted);
        received.kept.push_back(Kept {
            number,
            fd,
            _place: place,
        });
        received.closes.close(evicted);
        number
    }

    /// Whether a reader may read more (which can bring in
    /// `sys::SCM_MAX_FD` descriptors): `Ready(Ok)` while no more than
    /// [`MAX_WAITING_TO_CLOSE`] of this connection's wait to close;
    /// beyond, `Pending` until one is closed (`cx` is woken), or
    /// `Ready(Err)` naming why the connection ends if the close in
    /// progress sleeps (on a pipe whose lock the peer holds). A reader
    /// that waits asks again after `sys::ASLEEP_AFTER`.
    pub fn room(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), String>> {
        use std::task::Poll;
        let closes = self.0.borrow().closes.clone();
        if closes.waiting() <= MAX_WAITING_TO_CLOSE {
            return Poll::Ready(Ok(()));
        }
        closes.wake_when_one_closes(cx.waker());
        let waiting = closes.waiting();
        if waiting <= MAX_WAITING_TO_CLOSE {
            return Poll::Ready(Ok(()));
        }
        if closes.asleep() {
            return Poll::Ready(Err(format!(
                "[capexec:limit] {waiting} descriptors this connection sent wait to close \
                 behind closes that sleep (on pipes whose locks are held?), at most \
                 {MAX_WAITING_TO_CLOSE}: the connection ends"
            )));
        }
        Poll::Pending
    }

    /// The same over the whole server, asked after a read that brought
    /// descriptors: a connection that sends some while too many wait
    /// ends.
    pub fn overfull_in_server(&self) -> Option<String> {
        let everyone = waiting_to_close();
        #[cfg(test)]
        let everyone = everyone.max(if self.0.borrow().overfull {
            usize::MAX
        } else {
            0
        });
        (everyone > MAX_WAITING_TO_CLOSE_IN_SERVER).then(|| {
            format!(
                "[capexec:limit] {everyone} descriptors clients sent wait to close \
                 server-wide (at most {MAX_WAITING_TO_CLOSE_IN_SERVER}): a connection \
                 that sends more ends"
            )
        })
    }

    /// Descriptors the peer sent were lost on the way: from now on none
    /// is handed out (those kept are closed).
    pub fn lost_some(&self) {
        self.stop(|received| received.out_of_step = true);
    }

    /// The connection has ended: those kept are closed, and so is any
    /// that still arrives.
    pub fn close(&self) {
        self.stop(|received| received.closed = true);
    }

    fn stop(&self, mark: impl FnOnce(&mut Received)) {
        let mut received = self.0.borrow_mut();
        mark(&mut received);
        let kept = std::mem::take(&mut received.kept);
        let fds = received.released(kept);
        received.closes.close(fds);
    }

    /// Reads out what the Unix `socket` (a copy of the connection's,
    /// shut for reading) holds and closes it, after this connection's
    /// other closes, off the calling thread (`sys::Closes`).
    pub fn read_out_and_close(&self, socket: OwnedFd) {
        self.0.borrow().closes.read_out_and_close(socket);
    }

    /// Takes the `count` descriptors numbered from `first` on, in order,
    /// or none: if any of them is missing, those found are closed and
    /// `None` is the answer.
    pub fn take(&self, first: u64, count: u64) -> Option<Vec<OwnedFd>> {
        let mut received = self.0.borrow_mut();
        let wanted = first..first.checked_add(count)?;
        let mut taken = Vec::new();
        let mut index = 0;
        while index < received.kept.len() {
            if wanted.contains(&received.kept[index].number) {
                taken.extend(received.kept.remove(index));
            } else {
                index += 1;
            }
        }
        let complete = !received.out_of_step && taken.len() as u64 == count;
        let fds = received.released(taken);
        if complete {
            return Some(fds);
        }
        received.closes.close(fds);
        None
    }

    /// Tests: from now on, as if too many waited to close server-wide.
    #[cfg(test)]
    pub(crate) fn as_if_overfull(&self) {
        self.0.borrow_mut().overfull = true;
    }

    /// How many are kept.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.0.borrow().kept.len()
    }
}

/// Descriptors a client has queued to send with its connection's next
/// write, numbered from 0 in the order queued. Clones share the queue.
#[derive(Clone, Default)]
pub struct DescriptorOutbox(Rc<RefCell<Outgoing>>);

#[derive(Default)]
struct Outgoing {
    queued: u64,
    pending: VecDeque<OwnedFd>,
}

impl DescriptorOutbox {
    /// Queues `fds`; returns the number of the first.
    pub fn queue(&self, fds: Vec<OwnedFd>) -> u64 {
        let mut outgoing = self.0.borrow_mut();
        let first = outgoing.queued;
        outgoing.queued += fds.len() as u64;
        outgoing.pending.extend(fds);
        first
    }

    /// Whether descriptors wait to be sent.
    pub fn is_empty(&self) -> bool {
        self.0.borrow().pending.is_empty()
    }

    /// Runs `send` with up to `at_most` of the waiting descriptors, in
    /// order; those it reports sent (`Ok`) leave the queue, and are closed.
    pub fn send_with<T>(
        &self,
        at_most: usize,
        send: impl FnOnce(&[std::os::fd::RawFd]) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        use std::os::fd::AsRawFd;
        let mut outgoing = self.0.borrow_mut();
        let count = outgoing.pending.len().min(at_most);
        let raw: Vec<_> = outgoing
            .pending
            .iter()
            .take(count)
            .map(AsRawFd::as_raw_fd)
            .collect();
        let sent = send(&raw)?;
        outgoing.pending.drain(..count);
        Ok(sent)
    }
}

/// Where a client hands descriptors to its server for a start to name.
#[derive(Clone)]
pub enum StdioRoute {
    /// Over the connection's Unix socket.
    Socket(DescriptorOutbox),
    /// Straight to an executor in this process.
    InProcess(ReceivedDescriptors),
}

impl StdioRoute {
    /// Hands `fds` over; returns the number of the first, for
    /// `PassedStdio.first`.
    pub fn hand_over(&self, fds: Vec<OwnedFd>) -> u64 {
        match self {
            StdioRoute::Socket(outbox) => outbox.queue(fds),
            StdioRoute::InProcess(received) => {
                let mut fds = fds.into_iter();
                let Some(first) = fds.next() else {
                    return received.0.borrow().next;
                };
                // The same numbering as a socket's, one after the other.
                let first = received.arrived(first);
                fds.for_each(|fd| {
                    received.arrived(fd);
                });
                first
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor() -> OwnedFd {
        std::fs::File::open("/dev/null").expect("open").into()
    }

    #[test]
    fn a_start_takes_its_descriptors_by_number_and_leaves_the_others() {
        let received = ReceivedDescriptors::default();
        for expected in 0..5 {
            assert_eq!(received.arrived(descriptor()), expected);
        }
        let taken = received.take(1, 2).expect("both are there");
        assert_eq!(taken.len(), 2);
        assert_eq!(received.kept(), 3);
        assert!(received.take(1, 1).is_none(), "taken once only");
    }

    #[test]
    fn a_missing_descriptor_makes_the_start_take_none_and_closes_the_rest() {
        let received = ReceivedDescriptors::default();
        received.arrived(descriptor());
        assert!(received.take(0, 2).is_none());
        assert_eq!(received.kept(), 0, "the one found is closed");
        assert!(received.take(u64::MAX, 2).is_none(), "no overflow");
    }

    #[test]
    fn the_oldest_are_closed_beyond_the_limit() {
        let received = ReceivedDescriptors::default();
        for _ in 0..MAX_KEPT_DESCRIPTORS + 3 {
            received.arrived(descriptor());
        }
        assert_eq!(received.kept(), MAX_KEPT_DESCRIPTORS);
        assert!(received.take(2, 1).is_none());
        assert!(received.take(3, 1).is_some());
    }

    #[test]
    fn after_the_connection_ends_nothing_is_kept() {
        let received = ReceivedDescriptors::default();
        received.arrived(descriptor());
        received.close();
        assert_eq!(received.kept(), 0);
        assert_eq!(received.arrived(descriptor()), 1, "numbered all the same");
        assert_eq!(received.kept(), 0);
        assert!(received.take(1, 1).is_none());
    }

    #[test]
    fn after_a_loss_nothing_is_handed_out() {
        let received = ReceivedDescriptors::default();
        received.arrived(descriptor());
        received.lost_some();
        received.arrived(descriptor());
        assert!(received.take(1, 1).is_none());
    }
}
