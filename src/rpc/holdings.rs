//! What the capabilities a peer holds cost the server beyond its
//! processes: descriptors (directories, port connections and listeners,
//! file transfers, watches) and memory (restricted executors' rules,
//! transfers' buffers). Counted per connection and server-wide, so that
//! one connection can take neither everything the server has nor what the
//! others need: a connection may hold at most half of the server's share
//! (of memory, at most [`MAX_HELD_MEMORY_PER_CONNECTION`]); the last
//! quarter of the server's share is kept for connections that hold
//! little (at most [`LIGHT_DESCRIPTORS`] descriptors and [`LIGHT_MEMORY`]),
//! so that while a few connections hold everything else, another client
//! still opens its directory and its files; and the server's share of
//! descriptors
//! comes out of its descriptor budget (`engine::descriptors`), never out
//! of what processes and new connections are kept.

use std::rc::Rc;
use std::sync::Arc;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::model::{Refusal, RefusalKind};

/// Descriptors one connection's capabilities may hold, at most.
pub const MAX_HELD_DESCRIPTORS_PER_CONNECTION: usize = 4096;

/// Memory one connection's capabilities may hold, at most: its 64
/// transfers and some restricted executors.
pub const MAX_HELD_MEMORY_PER_CONNECTION: usize = 160 << 20;

/// Memory every connection's capabilities may hold together, at most.
pub const MAX_HELD_MEMORY: usize = 512 << 20;

/// What a connection may hold and still take from the quarter of the
/// server's share kept for connections that hold little.
pub const LIGHT_DESCRIPTORS: usize = 16;

/// See [`LIGHT_DESCRIPTORS`].
pub const LIGHT_MEMORY: usize = 8 << 20;

/// The server's limits of what capabilities hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldingLimits {
    /// Descriptors held by every connection's capabilities together (one
    /// connection: half of it).
    pub descriptors: usize,
    /// Memory held by every connection's capabilities together (one
    /// connection: half of it, at most [`MAX_HELD_MEMORY_PER_CONNECTION`]).
    pub memory: usize,
}

impl HoldingLimits {
    /// The share of this process's descriptor limit kept for capabilities
    /// (see `engine::descriptors`).
    pub fn of_this_process() -> HoldingLimits {
        let descriptors = crate::engine::descriptors::DescriptorBudget::of_this_process(0)
            .map_or(1024, |budget| budget.held as usize);
        HoldingLimits {
            descriptors,
            memory: MAX_HELD_MEMORY,
        }
    }

    /// The share of this process's descriptor limit kept for
    /// connections (see `engine::descriptors`): a server's default
    /// bound on the connections open at once.
    pub fn connections_of_this_process() -> usize {
        crate::engine::descriptors::DescriptorBudget::of_this_process(0)
            .map_or(1024, |budget| budget.connections as usize)
    }

    /// What connections that hold much may take of these together: all
    /// but the quarter kept for those that hold little.
    fn for_heavy_holders(self) -> HoldingLimits {
        HoldingLimits {
            descriptors: self.descriptors - self.descriptors / 4,
            memory: self.memory - self.memory / 4,
        }
    }

    /// What one connection may hold of these.
    fn per_connection(self) -> HoldingLimits {
        HoldingLimits {
            descriptors: (self.descriptors / 2).clamp(1, MAX_HELD_DESCRIPTORS_PER_CONNECTION),
            memory: (self.memory / 2).clamp(1, MAX_HELD_MEMORY_PER_CONNECTION),
        }
    }
}

/// An account of descriptors and memory: a semaphore of each, whose
/// permits a [`Hold`] carries.
struct Pool {
    descriptors: Places,
    memory: Places,
    limits: HoldingLimits,
    /// Woken when descriptors are given back (accepting listeners wait
    /// for room instead of failing).
    freed: Rc<Notify>,
}

/// Up to `capacity` units, a semaphore's permits.
struct Places {
    semaphore: Arc<Semaphore>,
    capacity: usize,
}

impl Places {
    fn new(capacity: usize) -> Places {
        let capacity = capacity.min(Semaphore::MAX_PERMITS);
        Places {
            semaphore: Arc::new(Semaphore::new(capacity)),
            capacity,
        }
    }

    /// Units taken now.
    fn held(&self) -> usize {
        self.capacity - self.semaphore.available_permits()
    }

    /// `count` units, if there is room for them.
    fn take(&self, count: usize) -> Option<OwnedSemaphorePermit> {
        let count = u32::try_from(count).ok()?;
        Arc::clone(&self.semaphore)
            .try_acquire_many_owned(count)
            .ok()
    }
}

impl Pool {
    fn new(limits: HoldingLimits, freed: Rc<Notify>) -> Rc<Pool> {
        Rc::new(Pool {
            descriptors: Places::new(limits.descriptors),
            memory: Places::new(limits.memory),
            limits,
            freed,
        })
    }

    /// What is missing for `descriptors` and `memory` more within
    /// `limits`, if anything.
    fn short_of(
        &self,
        descriptors: usize,
        memory: usize,
        limits: HoldingLimits,
    ) -> Option<(&'static str, usize)> {
        if self.descriptors.held() + descriptors > limits.descriptors {
            return Some(("descriptors", limits.descriptors));
        }
        if self.memory.held() + memory > limits.memory {
            return Some(("bytes of memory", limits.memory));
        }
        None
    }

    /// Whether it would still hold little with `descriptors` and `memory`
    /// more.
    fn light_with(&self, descriptors: usize, memory: usize) -> bool {
        self.descriptors.held() + descriptors <= LIGHT_DESCRIPTORS
            && self.memory.held() + memory <= LIGHT_MEMORY
    }

    /// The permits of `descriptors` and `memory` more, if there is room
    /// for both.
    fn take(&self, descriptors: usize, memory: usize) -> Option<[OwnedSemaphorePermit; 2]> {
        Some([
            self.descriptors.take(descriptors)?,
            self.memory.take(memory)?,
        ])
    }
}

/// Every connection's holdings together: one per server.
#[derive(Clone)]
pub struct ServerHoldings(Rc<Pool>);

impl ServerHoldings {
    pub fn new(limits: HoldingLimits) -> ServerHoldings {
        ServerHoldings(Pool::new(limits, Rc::new(Notify::new())))
    }

    /// A new connection's account within these.
    pub(crate) fn connection(&self) -> Holdings {
        Holdings {
            server: Rc::clone(&self.0),
            connection: Pool::new(self.0.limits.per_connection(), Rc::clone(&self.0.freed)),
        }
    }

    /// Descriptors and memory held now, server-wide.
    pub fn held(&self) -> (usize, usize) {
        (self.0.descriptors.held(), self.0.memory.held())
    }
}

/// One connection's account of what its capabilities hold.
#[derive(Clone)]
pub(crate) struct Holdings {
    server: Rc<Pool>,
    connection: Rc<Pool>,
}

impl Default for Holdings {
    /// An account of its own (an embedded executor's), within the share
    /// of the process's descriptor limit that every embedded executor of
    /// this thread shares.
    fn default() -> Self {
        thread_local! {
            static EMBEDDED: ServerHoldings = ServerHoldings::new(HoldingLimits::of_this_process());
        }
        EMBEDDED.with(ServerHoldings::connection)
    }
}

impl Holdings {
    /// Counts `descriptors` and `memory` for `what` (a plural noun, for
    /// the refusal) until the returned hold is dropped; refused with
    /// `[capexec:limit]` past the connection's share or the server's.
    pub(crate) fn hold(
        &self,
        descriptors: usize,
        memory: usize,
        what: &str,
    ) -> Result<Hold, Refusal> {
        if let Some((unit, max)) =
            self.connection
                .short_of(descriptors, memory, self.connection.limits)
        {
            crate::metrics::limit_hit("held-per-connection");
            return Err(Refusal::new(
                RefusalKind::LimitReached,
                format!(
                    "this connection's capabilities already hold its maximum of {max} {unit} \
                     (directories, port connections, transfers, watches, restrictions); \
                     release some before opening more {what}"
                ),
            ));
        }
        let server_limits = if self.connection.light_with(descriptors, memory) {
            self.server.limits
        } else {
            self.server.limits.for_heavy_holders()
        };
        if let Some((unit, max)) = self.server.short_of(descriptors, memory, server_limits) {
            crate::metrics::limit_hit("held");
            return Err(Refusal::new(
                RefusalKind::LimitReached,
                format!(
                    "the server's capabilities already hold its maximum of {max} {unit} for \
                     every connection together (of {}, the rest is kept for connections that \
                     hold little); no more {what} until some are released",
                    if unit == "descriptors" {
                        self.server.limits.descriptors
                    } else {
                        self.server.limits.memory
                    }
                ),
            ));
        }
        // Room in both was just seen (this thread alone takes from them).
        let (Some(connection), Some(server)) = (
            self.connection.take(descriptors, memory),
            self.server.take(descriptors, memory),
        ) else {
            return Err(Refusal::new(
                RefusalKind::LimitReached,
                format!("no room for more {what} in this connection's or the server's share"),
            ));
        };
        Ok(Hold {
            permits: Some([connection, server]),
            freed: (descriptors > 0).then(|| Rc::clone(&self.server.freed)),
        })
    }

    /// Whether [`Holdings::hold`] of `descriptors` would succeed now.
    pub(crate) fn has_room_for(&self, descriptors: usize) -> bool {
        let server_limits = if self.connection.light_with(descriptors, 0) {
            self.server.limits
        } else {
            self.server.limits.for_heavy_holders()
        };
        self.connection
            .short_of(descriptors, 0, self.connection.limits)
            .is_none()
            && self
                .server
                .short_of(descriptors, 0, server_limits)
                .is_none()
    }

    /// Woken when descriptors are given back, by any connection.
    pub(crate) fn freed(&self) -> Rc<Notify> {
        Rc::clone(&self.server.freed)
    }
}

/// Descriptors and memory counted in a [`Holdings`]: the permits of the
/// connection's account and the server's, given back when dropped.
pub(crate) struct Hold {
    permits: Option<[[OwnedSemaphorePermit; 2]; 2]>,
    /// Woken once descriptors are back.
    freed: Option<Rc<Notify>>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        drop(self.permits.take());
        if let Some(freed) = &self.freed {
            freed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_that_holds_little_still_gets_the_last_quarter() {
        let server = ServerHoldings::new(HoldingLimits {
            descriptors: 64,
            memory: 1 << 30,
        });
        let heavy: Vec<_> = (0..2).map(|_| server.connection()).collect();
        let mut held = Vec::new();
        for holdings in &heavy {
            while let Ok(hold) = holdings.hold(1, 0, "directories") {
                held.push(hold);
            }
        }
        // Half each, but not past three quarters of the server's share.
        assert_eq!(server.held().0, 48);
        let light = server.connection();
        let taken: Vec<_> = (0..LIGHT_DESCRIPTORS)
            .map(|_| light.hold(1, 0, "directories").expect("kept for it"))
            .collect();
        let refusal = light
            .hold(1, 0, "directories")
            .err()
            .expect("no longer light");
        assert!(refusal.message.contains("of 64"), "{refusal}");
        drop((held, taken));
        assert_eq!(server.held(), (0, 0));
    }

    #[test]
    fn a_connection_holds_half_and_the_server_the_whole() {
        let server = ServerHoldings::new(HoldingLimits {
            descriptors: 4,
            memory: 1000,
        });
        let first = server.connection();
        let second = server.connection();
        let held: Vec<_> = (0..2)
            .map(|_| first.hold(1, 0, "directories").expect("room"))
            .collect();
        let refusal = first.hold(1, 0, "directories").err().expect("a quarter");
        assert_eq!(refusal.kind, RefusalKind::LimitReached);
        assert!(refusal.message.contains("this connection"), "{refusal}");
        let memory = second.hold(0, 500, "restrictions").expect("room");
        assert!(second.hold(0, 1, "restrictions").is_err());
        drop(memory);
        let more: Vec<_> = (0..2)
            .map(|_| second.hold(1, 0, "x").expect("room"))
            .collect();
        assert_eq!(server.held(), (4, 0));
        let refusal = server
            .connection()
            .hold(1, 0, "directories")
            .err()
            .expect("full");
        assert!(refusal.message.contains("the server's"), "{refusal}");
        drop(held);
        drop(more);
        assert_eq!(server.held(), (0, 0));
    }
}
