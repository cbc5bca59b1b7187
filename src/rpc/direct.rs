//! Tickets for the direct channels of port connections (see "Direct
//! channels" in the schema): a `dial` that is granted one takes a ticket
//! here, and the connection that presents it to the server's listener
//! hands its socket to that dial. One table per server, shared by all of
//! its connections, since a channel arrives on a connection of its own.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use crate::ports::Socket;

pub use crate::model::{DIRECT_TICKET_BYTES as TICKET_BYTES, DirectTicket as Ticket};

/// How long a ticket waits for its channel after the `dial` is answered.
pub const CLAIM_WITHIN: Duration = Duration::from_secs(10);

/// Unclaimed tickets a server holds at most; past that, `dial`s go
/// through their sinks.
pub const MAX_UNCLAIMED_TICKETS: usize = 1024;

/// Unclaimed tickets one Cap'n Proto connection holds at most, so that no
/// client can take the server's whole table.
pub const MAX_UNCLAIMED_PER_CONNECTION: usize = 32;

/// The byte a server writes on a channel once its ticket claimed it.
pub const CHANNEL_CLAIMED: u8 = 1;

/// The server's unclaimed tickets.
#[derive(Clone, Default)]
pub struct DirectChannels(Rc<RefCell<HashMap<Ticket, oneshot::Sender<Socket>>>>);

impl DirectChannels {
    /// A new ticket and the wait for its channel, holding a place of
    /// `places` (a connection's [`MAX_UNCLAIMED_PER_CONNECTION`] for
    /// unclaimed tickets); `None` if the server or the connection holds
    /// its maximum of unclaimed tickets, or the kernel gave no randomness.
    pub(crate) fn issue(&self, places: &Arc<Semaphore>) -> Option<(Ticket, Claim)> {
        let mut table = self.0.borrow_mut();
        let place = (table.len() < MAX_UNCLAIMED_TICKETS)
            .then(|| Arc::clone(places).try_acquire_owned().ok())
            .flatten();
        let Some(place) = place else {
            crate::metrics::limit_hit("direct-channel-tickets");
            return None;
        };
        let mut ticket = [0u8; TICKET_BYTES];
        if let Err(error) = crate::secret::fill_random(&mut ticket) {
            tracing::warn!(%error, "no randomness for a direct channel's ticket");
            return None;
        }
        let (hand, wait) = oneshot::channel();
        table.insert(ticket, hand);
        Some((
            ticket,
            Claim {
                ticket,
                table: Rc::downgrade(&self.0),
                _place: place,
                wait,
            },
        ))
    }

    /// Hands `channel` to the dial that holds `ticket`; false (and the
    /// channel closed) if no dial does: unknown, used, or given up.
    pub fn claim(&self, ticket: &Ticket, channel: Socket) -> bool {
        let hand = self.0.borrow_mut().remove(ticket);
        match hand {
            Some(hand) => hand.send(channel).is_ok(),
            None => false,
        }
    }

    /// Unclaimed tickets, for tests and the metrics.
    pub fn unclaimed(&self) -> usize {
        self.0.borrow().len()
    }
}

/// A dial's wait for its channel; dropping it withdraws the ticket and
/// gives its connection's place back.
pub(crate) struct Claim {
    ticket: Ticket,
    table: Weak<RefCell<HashMap<Ticket, oneshot::Sender<Socket>>>>,
    _place: OwnedSemaphorePermit,
    wait: oneshot::Receiver<Socket>,
}

impl Claim {
    /// The channel, or `None` if it did not come within [`CLAIM_WITHIN`].
    pub(crate) async fn channel(self) -> Option<Socket> {
        self.channel_within(CLAIM_WITHIN).await
    }

    async fn channel_within(mut self, within: Duration) -> Option<Socket> {
        tokio::time::timeout(within, &mut self.wait)
            .await
            .ok()
            .and_then(Result::ok)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(table) = self.table.upgrade() {
            table.borrow_mut().remove(&self.ticket);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection's places for unclaimed tickets.
    fn places() -> Arc<Semaphore> {
        Arc::new(Semaphore::new(MAX_UNCLAIMED_PER_CONNECTION))
    }

    fn channel() -> Socket {
        let (near, _far) = std::os::unix::net::UnixStream::pair().expect("pair");
        near.set_nonblocking(true).expect("nonblocking");
        Socket::Unix(tokio::net::UnixStream::from_std(near).expect("register"))
    }

    #[tokio::test]
    async fn a_ticket_claims_one_channel_once() {
        let channels = DirectChannels::default();
        let held = places();
        let (ticket, claim) = channels.issue(&held).expect("issued");
        assert_eq!(channels.unclaimed(), 1);
        assert!(channels.claim(&ticket, channel()));
        assert!(claim.channel().await.is_some());
        assert!(!channels.claim(&ticket, channel()), "a used ticket");
        assert_eq!(channels.unclaimed(), 0);
    }

    #[tokio::test]
    async fn unknown_and_withdrawn_tickets_claim_nothing() {
        let channels = DirectChannels::default();
        assert!(!channels.claim(&[7u8; TICKET_BYTES], channel()));
        let held = places();
        let (ticket, claim) = channels.issue(&held).expect("issued");
        let (other, _other_claim) = channels.issue(&held).expect("issued");
        assert_ne!(ticket, other, "tickets are random");
        drop(claim);
        assert!(
            !channels.claim(&ticket, channel()),
            "withdrawn with its dial"
        );
        assert_eq!(channels.unclaimed(), 1);
    }

    #[tokio::test]
    async fn a_full_table_grants_none() {
        let channels = DirectChannels::default();
        let connections: Vec<Arc<Semaphore>> = (0..MAX_UNCLAIMED_TICKETS
            / MAX_UNCLAIMED_PER_CONNECTION)
            .map(|_| places())
            .collect();
        let claims: Vec<_> = connections
            .iter()
            .flat_map(|held| {
                (0..MAX_UNCLAIMED_PER_CONNECTION).map(|_| channels.issue(held).expect("issued"))
            })
            .collect();
        assert!(channels.issue(&places()).is_none(), "the server's maximum");
        drop(claims);
        assert!(
            connections
                .iter()
                .all(|held| held.available_permits() == MAX_UNCLAIMED_PER_CONNECTION)
        );
        assert!(channels.issue(&places()).is_some());
    }

    #[tokio::test]
    async fn one_connection_holds_at_most_its_share() {
        let channels = DirectChannels::default();
        let held = places();
        let claims: Vec<_> = (0..MAX_UNCLAIMED_PER_CONNECTION)
            .map(|_| channels.issue(&held).expect("issued"))
            .collect();
        assert!(channels.issue(&held).is_none(), "the connection's maximum");
        assert!(channels.issue(&places()).is_some(), "another connection's");
        drop(claims);
        assert!(channels.issue(&held).is_some());
    }

    #[tokio::test]
    async fn an_unclaimed_ticket_gives_up_after_its_time() {
        let channels = DirectChannels::default();
        let (ticket, claim) = channels.issue(&places()).expect("issued");
        assert!(
            claim
                .channel_within(Duration::from_millis(10))
                .await
                .is_none()
        );
        assert!(!channels.claim(&ticket, channel()));
    }
}
