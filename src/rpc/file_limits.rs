//! How many file transfers and watches one connection may have at once
//! (see the schema's limits of `Directory`).

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::model::{
    DOWNLOAD_CHUNK_BYTES, MAX_TRANSFERS_PER_CONNECTION, MAX_UPLOAD_CHUNK_BYTES,
    MAX_WATCHES_PER_CONNECTION, Refusal, RefusalKind,
};
use crate::rpc::holdings::{Hold, Holdings};
use crate::wire::TRANSFER_WINDOW_BYTES;

/// One connection's places for transfers and watches, shared by every
/// directory reached from it: a semaphore each, whose permit is the
/// [`FileTicket`].
#[derive(Clone)]
pub(crate) struct FileLimits {
    transfers: Arc<Semaphore>,
    watches: Arc<Semaphore>,
    /// What the connection's capabilities hold, directories included.
    holdings: Holdings,
    /// The connection's share of the blocking pool, for its file calls.
    work: crate::files::Work,
}

/// What a transfer may hold in memory while it runs: a download, listing
/// or walk its window of unacknowledged bytes and a chunk or batch read
/// ahead; an upload a chunk queued and one being written.
const TRANSFER_MEMORY: usize = {
    let sending = TRANSFER_WINDOW_BYTES + 2 * DOWNLOAD_CHUNK_BYTES;
    let receiving = 2 * MAX_UPLOAD_CHUNK_BYTES;
    if sending > receiving {
        sending
    } else {
        receiving
    }
};

/// One transfer or watch counted: its permit, given back (with what it
/// holds) when the ticket drops.
pub(crate) struct FileTicket {
    _place: OwnedSemaphorePermit,
    _held: Hold,
}

/// Descriptors counted (a directory's, a walk's open levels), given back
/// when dropped.
pub(crate) struct DescriptorHold(#[allow(dead_code)] Hold);

impl FileLimits {
    pub(crate) fn new(holdings: Holdings) -> FileLimits {
        FileLimits {
            transfers: Arc::new(Semaphore::new(MAX_TRANSFERS_PER_CONNECTION)),
            watches: Arc::new(Semaphore::new(MAX_WATCHES_PER_CONNECTION)),
            holdings,
            work: crate::files::Work::default(),
        }
    }

    /// The connection's share of the blocking pool.
    pub(crate) fn work(&self) -> &crate::files::Work {
        &self.work
    }

    fn take(
        &self,
        places: &Arc<Semaphore>,
        max: usize,
        what: &str,
        metric: &'static str,
        memory: usize,
    ) -> Result<FileTicket, Refusal> {
        let Ok(place) = Arc::clone(places).try_acquire_owned() else {
            crate::metrics::limit_hit(metric);
            return Err(Refusal::new(
                RefusalKind::LimitReached,
                format!("this connection already has its maximum of {max} {what} in progress"),
            ));
        };
        // Refused here, the place goes back with `place`.
        let held = self.holdings.hold(1, memory, what)?;
        Ok(FileTicket {
            _place: place,
            _held: held,
        })
    }

    /// An upload, a download, a listing or a walk.
    pub(crate) fn transfer(&self) -> Result<FileTicket, Refusal> {
        self.take(
            &self.transfers,
            MAX_TRANSFERS_PER_CONNECTION,
            "file transfers (uploads, downloads, listings, walks)",
            "file-transfers",
            TRANSFER_MEMORY,
        )
    }

    pub(crate) fn watch(&self) -> Result<FileTicket, Refusal> {
        self.take(
            &self.watches,
            MAX_WATCHES_PER_CONNECTION,
            "watches",
            "file-watches",
            0,
        )
    }

    /// One more `Directory` capability: its descriptor.
    pub(crate) fn directory(&self) -> Result<DescriptorHold, Refusal> {
        self.descriptors(1, "directories")
    }

    /// `count` descriptors more, for `what` (a plural noun).
    pub(crate) fn descriptors(&self, count: usize, what: &str) -> Result<DescriptorHold, Refusal> {
        self.holdings.hold(count, 0, what).map(DescriptorHold)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_come_back_when_tickets_drop() {
        let limits = FileLimits::new(Holdings::default());
        let held: Vec<_> = (0..MAX_WATCHES_PER_CONNECTION)
            .map(|_| limits.watch().expect("room"))
            .collect();
        let refusal = limits.watch().err().expect("full");
        assert_eq!(refusal.kind, RefusalKind::LimitReached);
        // Operators see it (the counter is process-wide: other tests may
        // have added to it, never taken away).
        assert!(
            crate::metrics::render(&crate::metrics::Now::default())
                .contains("capexec_limit_hits_total{limit=\"file-watches\"}"),
            "{}",
            crate::metrics::render(&crate::metrics::Now::default())
        );
        drop(held);
        assert!(limits.watch().is_ok());
    }
}
