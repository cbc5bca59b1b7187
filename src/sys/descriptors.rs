//! Closing descriptors off the thread that serves connections.

use std::os::fd::OwnedFd;
use std::sync::Mutex;

/// Set by an upgrade: what is to be closed from then on is kept for the
/// next binary instead ([`keep_closes_for_the_next_binary`]).
static FOR_THE_NEXT_BINARY: Mutex<Option<Vec<OwnedFd>>> = Mutex::new(None);

/// Closes descriptors a client handed over on one of tokio's blocking
/// threads (inline outside a runtime): closing a file on a FUSE mount
/// waits for its daemon (FLUSH), which must not hold up the thread that
/// serves every connection.
pub fn close_in_background(fds: Vec<OwnedFd>) {
    if fds.is_empty() {
        return;
    }
    if let Some(kept) = FOR_THE_NEXT_BINARY
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_mut()
    {
        kept.extend(fds);
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(move || drop(fds))),
        Err(_) => drop(fds),
    }
}

/// From now on, what [`close_in_background`] is given is kept, for the
/// next binary to close. An upgrade sets it before it closes the
/// connections: a descriptor a client sent may be a pipe whose lock the
/// client holds, its close then waits for as long as the client likes,
/// and execve waits for the thread that waits.
pub fn keep_closes_for_the_next_binary() {
    let mut kept = FOR_THE_NEXT_BINARY
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    kept.get_or_insert_with(Vec::new);
}

/// What was kept since [`keep_closes_for_the_next_binary`], taken.
pub fn kept_for_the_next_binary() -> Vec<OwnedFd> {
    FOR_THE_NEXT_BINARY
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_mut()
        .map(std::mem::take)
        .unwrap_or_default()
}
