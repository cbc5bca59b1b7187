//! How many file transfers and watches one connection may have at once
//! (see the schema's limits of `Directory`).

use std::cell::Cell;
use std::rc::Rc;

use crate::model::{
    MAX_TRANSFERS_PER_CONNECTION, MAX_WATCHES_PER_CONNECTION, Refusal, RefusalKind,
};

/// One connection's counters, shared by every directory reached from it.
#[derive(Clone, Default)]
pub(crate) struct FileLimits {
    transfers: Rc<Cell<usize>>,
    watches: Rc<Cell<usize>>,
}

/// One transfer or watch counted; dropping it gives the place back.
pub(crate) struct FileTicket(Rc<Cell<usize>>);

impl Drop for FileTicket {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

fn take(
    counter: &Rc<Cell<usize>>,
    max: usize,
    what: &str,
    metric: &'static str,
) -> Result<FileTicket, Refusal> {
    if counter.get() >= max {
        crate::metrics::limit_hit(metric);
        return Err(Refusal::new(
            RefusalKind::LimitReached,
            format!("this connection already has its maximum of {max} {what} in progress"),
        ));
    }
    counter.set(counter.get() + 1);
    Ok(FileTicket(Rc::clone(counter)))
}

impl FileLimits {
    /// An upload, a download, a listing or a walk.
    pub(crate) fn transfer(&self) -> Result<FileTicket, Refusal> {
        take(
            &self.transfers,
            MAX_TRANSFERS_PER_CONNECTION,
            "file transfers (uploads, downloads, listings, walks)",
            "file-transfers",
        )
    }

    pub(crate) fn watch(&self) -> Result<FileTicket, Refusal> {
        take(
            &self.watches,
            MAX_WATCHES_PER_CONNECTION,
            "watches",
            "file-watches",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_come_back_when_tickets_drop() {
        let limits = FileLimits::default();
        let held: Vec<_> = (0..MAX_WATCHES_PER_CONNECTION)
            .map(|_| limits.watch().expect("room"))
            .collect();
        let refusal = limits.watch().err().expect("full");
        assert_eq!(refusal.kind, RefusalKind::LimitReached);
        // Operators see it (the counter is process-wide: other tests may
        // have added to it, never taken away).
        assert!(
            crate::metrics::render(0).contains("capexec_limit_hits_total{limit=\"file-watches\"}"),
            "{}",
            crate::metrics::render(0)
        );
        drop(held);
        assert!(limits.watch().is_ok());
    }
}
