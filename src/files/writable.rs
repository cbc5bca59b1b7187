//! The descriptor a call that changes something beneath a directory takes.
//! Only [`Writable::checked`] makes one, and only for a directory that is
//! not read-only: every function that writes takes a `Writable`, so a new
//! write method of `Directory` cannot forget the check (it would have no
//! descriptor to write with), and a read-only capability stays read-only
//! by construction.

use std::os::fd::{AsFd, BorrowedFd};

use crate::model::{Refusal, RefusalKind};

/// A directory's descriptor, checked writable.
#[derive(Clone, Copy, Debug)]
pub struct Writable<'a> {
    fd: BorrowedFd<'a>,
    tmpfile: bool,
}

impl<'a> Writable<'a> {
    /// `fd` for `call`, unless the directory it belongs to is read-only;
    /// `tmpfile`: whether writes may stage in unnamed files (O_TMPFILE).
    pub(super) fn checked(
        fd: BorrowedFd<'a>,
        read_only: bool,
        tmpfile: bool,
        call: &str,
    ) -> Result<Writable<'a>, Refusal> {
        if read_only {
            return Err(refusal(call));
        }
        Ok(Writable { fd, tmpfile })
    }

    /// A directory the caller made itself (tests of the write functions),
    /// its writes staged in unnamed files where the kernel can, or in
    /// named temporaries (`tmpfile` false).
    #[cfg(test)]
    pub(super) fn of_own(fd: BorrowedFd<'a>, tmpfile: bool) -> Writable<'a> {
        Writable { fd, tmpfile }
    }

    /// Whether writes beneath it may stage in unnamed files (O_TMPFILE):
    /// not when the host hides them.
    pub(super) fn tmpfile(&self) -> bool {
        self.tmpfile
    }
}

impl AsFd for Writable<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd
    }
}

/// Why `call` cannot be made on a read-only directory.
pub(super) fn refusal(call: &str) -> Refusal {
    Refusal::new(
        RefusalKind::Forbidden,
        format!("`{call}` is not allowed: this directory is read-only"),
    )
}
