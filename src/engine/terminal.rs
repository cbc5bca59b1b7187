//! Pseudo-terminals: created by portable-pty at the requested size, read,
//! written and controlled through a non-blocking duplicate of the master on
//! the reactor, so no thread blocks on terminal I/O, and a master handed
//! over by the binary before (`engine::handover`) works the same.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncWrite, Interest};

use crate::engine::{os, reaper};
use crate::model::PtySize;

pub(crate) struct Terminal {
    /// The master, non-blocking, for output, input and control.
    io: Arc<AsyncFd<OwnedFd>>,
}

impl Terminal {
    /// Opens a terminal of `size`; returns it, an open descriptor of its
    /// slave side (which keeps the terminal from hanging up until the child
    /// has opened it) and the slave's path for the child to open. The size
    /// is set before the child exists, so it never sees 0x0.
    pub fn open(size: PtySize) -> io::Result<(Terminal, OwnedFd, PathBuf)> {
        let pair = portable_pty::native_pty_system()
            .openpty(portable_pty::PtySize {
                rows: size.rows,
                cols: size.cols,
                pixel_width: 0,
                pixel_height: 0,
            })
            .map_err(|error| {
                // Running out of descriptors keeps its errno, so it is
                // reported as the limit it is.
                let errno = error
                    .chain()
                    .find_map(|cause| cause.downcast_ref::<io::Error>())
                    .and_then(io::Error::raw_os_error);
                match errno {
                    Some(errno @ (libc::EMFILE | libc::ENFILE)) => {
                        io::Error::from_raw_os_error(errno)
                    }
                    _ => io::Error::other(error.to_string()),
                }
            })?;
        let master_fd = pair
            .master
            .as_raw_fd()
            .ok_or_else(|| io::Error::other("the pseudo-terminal has no master descriptor"))?;
        let slave_path = pair
            .master
            .tty_name()
            .ok_or_else(|| io::Error::other("the pseudo-terminal has no device name"))?;
        // Our own descriptor of the slave: portable-pty does not lend its own.
        let slave = nix::fcntl::open(
            &slave_path,
            nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_NOCTTY | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(io::Error::from)?;
        drop(pair.slave);

        // SAFETY: portable-pty keeps the master open while `pair.master` lives,
        // which outlives this borrow.
        let borrowed = unsafe { BorrowedFd::borrow_raw(master_fd) };
        let io_fd = borrowed.try_clone_to_owned()?;
        set_nonblocking(&io_fd)?;
        drop(pair.master);
        Ok((Terminal::adopt(io_fd)?, slave, slave_path))
    }

    /// The terminal whose non-blocking master `master` is.
    pub fn adopt(master: OwnedFd) -> io::Result<Terminal> {
        let io = Arc::new(reaper::register(
            master,
            Interest::READABLE | Interest::WRITABLE,
        )?);
        Ok(Terminal { io })
    }

    pub fn io(&self) -> Arc<AsyncFd<OwnedFd>> {
        Arc::clone(&self.io)
    }

    /// Changes the size; the kernel sends SIGWINCH to the foreground group.
    pub fn resize(&self, size: PtySize) -> io::Result<()> {
        let size = libc::winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one winsize, which lives across the call.
        os::cvt(unsafe { libc::ioctl(self.io.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &size) })
            .map(drop)
    }

    /// The terminal's foreground process group, if it has one.
    pub fn foreground_group(&self) -> Option<i32> {
        nix::unistd::tcgetpgrp(self.io.get_ref())
            .ok()
            .map(nix::unistd::Pid::as_raw)
            .filter(|&pgid| pgid > 0)
    }

    /// Sends SIGINT, SIGQUIT or SIGTSTP to the foreground job the way typing
    /// the character would (the kernel refuses other signals here).
    pub fn signal_foreground(&self, signal: i32) -> io::Result<()> {
        // SAFETY: TIOCSIG takes the signal number by value.
        os::cvt(unsafe {
            libc::ioctl(
                self.io.get_ref().as_raw_fd(),
                libc::TIOCSIG,
                signal as libc::c_long,
            )
        })
        .map(drop)
    }

    /// The character that makes a canonical-mode reader see end-of-file.
    pub fn eof_char(&self) -> u8 {
        nix::sys::termios::tcgetattr(self.io.get_ref())
            .map(|termios| termios.control_chars[libc::VEOF])
            .unwrap_or(0x04)
    }
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL).map_err(io::Error::from)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).map_err(io::Error::from)?;
    Ok(())
}

/// Writes to the terminal master without blocking a thread.
pub(crate) struct TerminalWriter(pub Arc<AsyncFd<OwnedFd>>);

impl AsyncWrite for TerminalWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.0.poll_write_ready(cx))?;
            let result = guard.try_io(|fd| os::write(fd.get_ref().as_raw_fd(), buf));
            match result {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
