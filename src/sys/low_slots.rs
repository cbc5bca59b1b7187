//! The first 64 slots of the descriptor table, kept for the server's own.
//!
//! Why: children are cloned on a thread whose table starts as a copy of
//! the first 64 slots of the server's (the kernel copies at least that
//! many when a table is unshared, `NR_OPEN_DEFAULT`), closed there at once
//! (`engine/spawn/spawner.rs`); and a close of a copy of what a client
//! sent can sleep for as long as the client likes (a pipe's last close
//! takes its lock, a FUSE file's close waits for its daemon). An upgrade
//! hands what it had not closed yet to the next binary under the same
//! numbers, so a client's descriptor there would come back below 64 too.
//!
//! So `capexec serve` fills every free slot below [`BELOW`] with a
//! placeholder (`/dev/null`, close-on-exec) before it takes in anything
//! ([`reserve`]): the kernel gives each new descriptor the lowest free
//! number, so what it opens or takes in from then on lands above. A slot
//! freed later would be the next one taken, so none is left free. What
//! sits below 64 and is let go of while the server serves puts a
//! placeholder in its place as it closes ([`close`]): sockets passed in
//! by whoever started the server (a service manager, a users-mode
//! monitor, the binary before), closed once bound ([`KeepsItsSlot`]), and
//! what a binary without the placeholders left to close (closing
//! threads). What such a binary handed over for its processes (pidfds,
//! pipes, a terminal), freed when a process ends, is moved above 64 when
//! taken over ([`raise`]). [`refill`], after binding, fills whatever else
//! was freed before the server takes anything in.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

/// The slots kept: the kernel copies at least this many of a table it
/// unshares (`NR_OPEN_DEFAULT`).
pub const BELOW: RawFd = 64;

/// `/dev/null`, once [`reserve`] has run: what fills the slots, and what
/// [`close`] copies into the slot it closes.
static PLACEHOLDER: OnceLock<OwnedFd> = OnceLock::new();

/// Fills every free slot below [`BELOW`] with a placeholder, kept for
/// good; again, it fills what was freed since. Answers how many it placed.
/// Costs at most 65 descriptors (the placeholders and `/dev/null` itself),
/// which a server counts as its own.
pub fn reserve() -> io::Result<usize> {
    let placeholder = match PLACEHOLDER.get() {
        Some(placeholder) => placeholder,
        None => {
            let null = OwnedFd::from(std::fs::File::open("/dev/null")?);
            // (Should another thread set it first, this one is closed
            // here, before the loop fills the slot it may leave.)
            PLACEHOLDER.get_or_init(|| null)
        }
    };
    let mut placed = 0;
    loop {
        // The lowest free number.
        // SAFETY: fcntl on a descriptor we own; what it returns is ours.
        let copy = unsafe { libc::fcntl(placeholder.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if copy < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just made, owned by nothing else.
        let copy = unsafe { OwnedFd::from_raw_fd(copy) };
        if copy.as_raw_fd() >= BELOW {
            return Ok(placed);
        }
        // Kept for good: a slot given back would be the next one taken.
        std::mem::forget(copy);
        placed += 1;
    }
}

/// After [`reserve`], fills what was freed below [`BELOW`] since (by
/// drops that did not go through [`close`]); before it, nothing.
pub fn refill() -> io::Result<usize> {
    if PLACEHOLDER.get().is_none() {
        return Ok(0);
    }
    reserve()
}

/// `fd`, our own, moved above [`BELOW`] if it is below, a placeholder put
/// in its slot in the same step: for what the binary before handed over
/// under its numbers (a process's pidfds, pipes and terminal), whose
/// slots would be freed when the process ends. The copy is close-on-exec.
/// A descriptor whose close could sleep (one a client sent) must not come
/// here: putting the placeholder in its slot closes it there (though
/// never its last close), on the calling thread. As it was where it
/// cannot be moved (the table full above), or before [`reserve`].
pub fn raise(fd: OwnedFd) -> OwnedFd {
    let number = fd.as_raw_fd();
    let Some(placeholder) = PLACEHOLDER.get().filter(|_| number < BELOW) else {
        return fd;
    };
    // SAFETY: fcntl on a descriptor we own; what it returns is ours.
    let raised = unsafe { libc::fcntl(number, libc::F_DUPFD_CLOEXEC, BELOW) };
    if raised < 0 {
        return fd;
    }
    // SAFETY: just made, owned by nothing else.
    let raised = unsafe { OwnedFd::from_raw_fd(raised) };
    // SAFETY: dup3 onto a descriptor we own, whose file `raised` holds
    // too; the slot then holds a placeholder, kept for good.
    if unsafe { libc::dup3(placeholder.as_raw_fd(), number, libc::O_CLOEXEC) } >= 0 {
        std::mem::forget(fd);
    }
    raised
}

/// A descriptor that goes through [`close`] when dropped: one that may
/// sit below [`BELOW`] and be let go of while the server serves (a socket
/// passed in by whoever started this process, closed once copied).
#[derive(Debug)]
pub struct KeepsItsSlot(std::mem::ManuallyDrop<OwnedFd>);

impl KeepsItsSlot {
    pub fn new(fd: OwnedFd) -> KeepsItsSlot {
        KeepsItsSlot(std::mem::ManuallyDrop::new(fd))
    }
}

impl From<OwnedFd> for KeepsItsSlot {
    fn from(fd: OwnedFd) -> KeepsItsSlot {
        KeepsItsSlot::new(fd)
    }
}

impl std::ops::Deref for KeepsItsSlot {
    type Target = OwnedFd;
    fn deref(&self) -> &OwnedFd {
        &self.0
    }
}

impl std::os::fd::AsFd for KeepsItsSlot {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl AsRawFd for KeepsItsSlot {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl Drop for KeepsItsSlot {
    fn drop(&mut self) {
        // SAFETY: taken once, here, and never used again.
        close(unsafe { std::mem::ManuallyDrop::take(&mut self.0) });
    }
}

/// Closes `fd`, our own: one below [`BELOW`] by putting a placeholder in
/// its slot in the same step (`dup3`, which closes what was there as a
/// close would, and may sleep as long), so that the slot is never free;
/// any other as a drop does. Before [`reserve`], every one as a drop does.
pub fn close(fd: OwnedFd) {
    let number = fd.as_raw_fd();
    let Some(placeholder) = PLACEHOLDER.get().filter(|_| number < BELOW) else {
        drop(fd);
        return;
    };
    // SAFETY: dup3 onto a descriptor we own, which it closes; the slot
    // then holds a placeholder, kept for good.
    if unsafe { libc::dup3(placeholder.as_raw_fd(), number, libc::O_CLOEXEC) } >= 0 {
        std::mem::forget(fd);
    } else {
        // (Never: dup3's EBUSY is for a slot being filled, not one we own.)
        drop(fd);
    }
}
