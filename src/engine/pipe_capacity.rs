//! Pipes grow only when a child moves bulk data through them.
//!
//! A bigger pipe lets a fast producer run further ahead and makes every read
//! and write move more, but the kernel charges the whole capacity of an
//! unprivileged user's pipes against `pipe-user-pages-soft` (64 MiB by
//! default), and once over it every *new* pipe of that user, the children's
//! own included, gets a single page. So pipes start at the default 64 KiB
//! and grow the first time they are seen full: idle and chatty processes
//! never pay, bulk transfers do.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use tokio::net::unix::pipe;

/// What a pipe holds before it grows (Linux's default).
pub const DEFAULT_CAPACITY: usize = 64 * 1024;
/// What it grows to.
pub const BULK_CAPACITY: libc::c_int = 1 << 20;

/// Asks for [`BULK_CAPACITY`] if the pipe holds less: a pipe its maker
/// made bigger (past `pipe-max-size`, with CAP_SYS_RESOURCE; `capexec
/// run` grows a pipe it was handed) is never shrunk, and a descriptor that
/// is no pipe (F_GETPIPE_SZ fails) is left alone. Where the system
/// refuses, the pipe keeps working at its current size.
pub fn grow(fd: RawFd) {
    // SAFETY: F_GETPIPE_SZ only reads the pipe's capacity.
    let capacity = unsafe { libc::fcntl(fd, libc::F_GETPIPE_SZ) };
    if !(0..BULK_CAPACITY).contains(&capacity) {
        return;
    }
    // SAFETY: F_SETPIPE_SZ takes an int and only resizes the pipe buffer.
    let _ = unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, BULK_CAPACITY) };
}

/// The write end of a child's stdin pipe, grown at the first write bigger
/// than the default capacity.
pub struct GrowingSender {
    sender: pipe::Sender,
    grown: bool,
}

impl GrowingSender {
    pub fn new(sender: pipe::Sender) -> GrowingSender {
        GrowingSender {
            sender,
            grown: false,
        }
    }
}

impl AsyncWrite for GrowingSender {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if !self.grown && buf.len() > DEFAULT_CAPACITY {
            self.grown = true;
            grow(self.sender.as_raw_fd());
        }
        Pin::new(&mut self.sender).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.sender).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.sender).poll_shutdown(cx)
    }
}
