//! Closing descriptors off the thread that serves connections.

use std::os::fd::OwnedFd;

/// Closes descriptors a client handed over on one of tokio's blocking
/// threads (inline outside a runtime): closing a file on a FUSE mount
/// waits for its daemon (FLUSH), which must not hold up the thread that
/// serves every connection.
pub fn close_in_background(fds: Vec<OwnedFd>) {
    if fds.is_empty() {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(move || drop(fds))),
        Err(_) => drop(fds),
    }
}
