//! How many TCP connections may be open without having logged in, on the
//! whole server and from one peer address: beyond either limit a new
//! connection is refused at once, so a peer that never logs in can hold
//! only a bounded share of the server.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The limits on connections that have not logged in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingLimits {
    /// On the whole server.
    pub total: usize,
    /// From one peer: one IPv4 address, or one IPv6 /64 (what one host or
    /// one customer of a provider is given).
    pub per_address: usize,
}

impl Default for PendingLimits {
    fn default() -> Self {
        PendingLimits {
            total: 1024,
            per_address: 256,
        }
    }
}

/// The peer, as a per-address limit groups peers (here and at the
/// metrics endpoint).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum PeerKey {
    V4(u32),
    V6Prefix(u64),
}

impl PeerKey {
    pub(crate) fn of(address: IpAddr) -> PeerKey {
        match address {
            IpAddr::V4(v4) => PeerKey::V4(u32::from(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => PeerKey::V4(u32::from(v4)),
                None => PeerKey::V6Prefix((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

/// Places per peer (by default a [`PeerKey`]; a Unix user's uid on a
/// server that runs logins as users): a semaphore of `per_peer` for each
/// peer that holds some, forgotten once it holds none.
#[derive(Clone)]
pub(crate) struct PeerShares<K: Copy + Eq + std::hash::Hash = PeerKey> {
    per_peer: usize,
    peers: Rc<RefCell<HashMap<K, Arc<Semaphore>>>>,
}

/// A place a peer holds in its [`PeerShares`]: the permit, given back
/// when dropped.
pub(crate) struct PeerShare<K: Copy + Eq + std::hash::Hash = PeerKey> {
    place: Option<OwnedSemaphorePermit>,
    peer: K,
    peers: Rc<RefCell<HashMap<K, Arc<Semaphore>>>>,
}

impl PeerShares {
    /// A place for the peer at `address`, unless it holds its share.
    pub(crate) fn take(&self, address: IpAddr) -> Option<PeerShare> {
        self.take_for(PeerKey::of(address))
    }
}

impl<K: Copy + Eq + std::hash::Hash> PeerShares<K> {
    pub(crate) fn new(per_peer: usize) -> PeerShares<K> {
        PeerShares {
            per_peer,
            peers: Rc::default(),
        }
    }

    /// The most places one peer may hold.
    pub(crate) fn per_peer(&self) -> usize {
        self.per_peer
    }

    /// A place for `key`, unless it holds its share.
    pub(crate) fn take_for(&self, key: K) -> Option<PeerShare<K>> {
        let mut peers = self.peers.borrow_mut();
        let places = peers
            .entry(key)
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_peer.min(Semaphore::MAX_PERMITS))));
        let Ok(place) = Arc::clone(places).try_acquire_owned() else {
            forget_if_unused(&mut peers, key);
            return None;
        };
        Some(PeerShare {
            place: Some(place),
            peer: key,
            peers: Rc::clone(&self.peers),
        })
    }

    /// Peers that hold a place now.
    #[cfg(test)]
    fn peers(&self) -> usize {
        self.peers.borrow().len()
    }
}

/// Forgets `peer` if it holds no place (each permit holds its semaphore
/// too).
fn forget_if_unused<K: Eq + std::hash::Hash>(peers: &mut HashMap<K, Arc<Semaphore>>, peer: K) {
    if peers
        .get(&peer)
        .is_some_and(|places| Arc::strong_count(places) == 1)
    {
        peers.remove(&peer);
    }
}

impl<K: Copy + Eq + std::hash::Hash> Drop for PeerShare<K> {
    fn drop(&mut self) {
        drop(self.place.take());
        forget_if_unused(&mut self.peers.borrow_mut(), self.peer);
    }
}

/// The connections of a server that have not logged in yet: a semaphore
/// for the server, and places per peer, whose permits are a [`Place`]'s.
#[derive(Clone)]
pub(crate) struct PendingLogins {
    limits: PendingLimits,
    total: Arc<Semaphore>,
    by_peer: PeerShares,
}

/// One connection counted as not logged in; dropped at its login or when
/// it closes.
pub(crate) struct Place {
    _total: OwnedSemaphorePermit,
    _peer: PeerShare,
}

impl Drop for Place {
    fn drop(&mut self) {
        crate::metrics::awaiting_login(-1);
    }
}

impl PendingLogins {
    pub fn new(limits: PendingLimits) -> PendingLogins {
        PendingLogins {
            limits,
            total: Arc::new(Semaphore::new(limits.total.min(Semaphore::MAX_PERMITS))),
            by_peer: PeerShares::new(limits.per_address),
        }
    }

    /// A place for a new connection from `peer`, or why there is none.
    pub fn admit(&self, peer: IpAddr) -> Result<Place, String> {
        let Ok(total) = Arc::clone(&self.total).try_acquire_owned() else {
            return Err(format!(
                "too many connections have not logged in (the server's limit is {}); try again \
                 later",
                self.limits.total
            ));
        };
        let Some(from_peer) = self.by_peer.take(peer) else {
            return Err(format!(
                "too many connections from this address have not logged in (the limit is {}); \
                 try again later",
                self.limits.per_address
            ));
        };
        crate::metrics::awaiting_login(1);
        Ok(Place {
            _total: total,
            _peer: from_peer,
        })
    }

    #[cfg(test)]
    fn total(&self) -> usize {
        self.limits.total - self.total.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_hold_per_server_and_per_address_and_places_come_back() {
        let pending = PendingLogins::new(PendingLimits {
            total: 3,
            per_address: 2,
        });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = pending.admit(a).expect("first");
        let _second = pending.admit(a).expect("second");
        let refused = pending.admit(a).err().expect("third from a");
        assert!(
            refused.contains("from this address have not logged in (the limit is 2)"),
            "{refused}"
        );
        let _third = pending.admit(b).expect("b has its own count");
        let full = pending
            .admit("10.0.0.3".parse().unwrap())
            .err()
            .expect("full");
        assert!(full.contains("(the server's limit is 3)"), "{full}");
        drop(first);
        assert_eq!(pending.total(), 2);
        pending.admit(a).expect("a place came back");
    }

    #[test]
    fn a_peer_with_no_connection_waiting_is_forgotten() {
        let pending = PendingLogins::new(PendingLimits {
            total: 3,
            per_address: 2,
        });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let places: Vec<_> = (0..2).map(|_| pending.admit(a).expect("room")).collect();
        assert!(pending.admit(a).is_err());
        assert_eq!(pending.by_peer.peers(), 1);
        drop(places);
        assert_eq!(pending.total(), 0);
        assert_eq!(pending.by_peer.peers(), 0);
        let none = PendingLogins::new(PendingLimits {
            total: 3,
            per_address: 0,
        });
        assert!(none.admit(a).is_err());
        assert_eq!(none.by_peer.peers(), 0);
        assert_eq!(none.total(), 0, "the server's place is given back too");
    }

    #[test]
    fn an_ipv6_peer_is_its_slash_64_and_a_mapped_ipv4_is_itself() {
        let pending = PendingLogins::new(PendingLimits {
            total: 10,
            per_address: 1,
        });
        let _one = pending.admit("2001:db8::1".parse().unwrap()).expect("one");
        assert!(pending.admit("2001:db8::ffff:2".parse().unwrap()).is_err());
        let _other = pending
            .admit("2001:db8:0:1::1".parse().unwrap())
            .expect("another /64");
        let _v4 = pending.admit("192.0.2.7".parse().unwrap()).expect("v4");
        assert!(pending.admit("::ffff:192.0.2.7".parse().unwrap()).is_err());
    }
}
