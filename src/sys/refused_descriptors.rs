//! Unix sockets that take no descriptors (SO_PASSRIGHTS, Linux 6.16).
//!
//! A peer can send descriptors (SCM_RIGHTS) over any Unix socket, and a
//! read that does not take them in (a plain read, a splice) has the
//! kernel close them on the reading thread. The last close of a pipe
//! takes the pipe's lock, which the peer can hold for as long as it
//! likes, so a socket the server reads plainly (a forwarded Unix socket,
//! a direct channel) could put the serving thread to sleep. With
//! SO_PASSRIGHTS off, the peer's sendmsg fails instead (EPERM), checked
//! under the same lock that queues what it sends.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::OnceLock;

/// SO_PASSRIGHTS as the kernel's asm-generic numbers it (x86, ARM,
/// RISC-V, LoongArch, PowerPC, s390); not yet in the libc crate.
const SO_PASSRIGHTS: libc::c_int = 83;

/// Makes the Unix socket `fd` refuse descriptors from now on: a peer's
/// send that carries any fails. On a listening socket, so do the sockets
/// it accepts, from their first byte. `ENOPROTOOPT` on a kernel before
/// 6.16.
pub fn refuse_descriptors(fd: BorrowedFd<'_>) -> io::Result<()> {
    let off: libc::c_int = 0;
    // SAFETY: setsockopt(2) reads one c_int through the pointer given.
    let done = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PASSRIGHTS,
            (&raw const off).cast(),
            std::mem::size_of_val(&off) as libc::socklen_t,
        )
    };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// [`refuse_descriptors`], or a warning (once) that the kernel cannot,
/// naming `what` the socket is: the server runs on, as it did before.
pub fn refuse_descriptors_or_warn(fd: BorrowedFd<'_>, what: &str) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if let Err(error) = refuse_descriptors(fd) {
        WARNED.call_once(|| {
            tracing::warn!(
                %error,
                "{what}: this kernel cannot refuse descriptors on a Unix socket \
                 (SO_PASSRIGHTS, Linux 6.16): a peer that sends one there whose close \
                 sleeps (a pipe whose lock it holds) can stall the thread that reads it"
            );
        });
    }
}

/// Whether this kernel lets a Unix socket refuse descriptors (asked once).
pub fn kernel_refuses_descriptors() -> bool {
    static REFUSES: OnceLock<bool> = OnceLock::new();
    *REFUSES.get_or_init(|| {
        std::os::unix::net::UnixStream::pair()
            .is_ok_and(|(near, _far)| refuse_descriptors(std::os::fd::AsFd::as_fd(&near)).is_ok())
    })
}

/// Whether what already waits on the Unix socket `fd` carries
/// descriptors (sent before it refused them). Looks without taking:
/// the bytes stay; descriptors a look brings in are copies, closed off
/// this thread (the socket still holds them: its own close, or a read
/// that does not take them in, would release them on that thread).
pub fn descriptors_waiting(fd: BorrowedFd<'_>) -> io::Result<bool> {
    // A look stops after the first bytes that came with descriptors, so a
    // look at all that waits finds any. A send that passed the refusal
    // just before it was set may be queued after FIONREAD was read, but
    // it holds the lock a look takes until it is queued: after one look,
    // FIONREAD counts it, and a second look sees it.
    let (came, looked) = look_at_what_waits(fd, pending_bytes(fd)?)?;
    if came {
        return Ok(true);
    }
    let pending = pending_bytes(fd)?;
    if pending <= looked {
        return Ok(false);
    }
    Ok(look_at_what_waits(fd, pending)?.0)
}

/// A look (MSG_PEEK) at up to `bytes` of what waits on `fd`: whether
/// descriptors came with them, and how many bytes it saw.
fn look_at_what_waits(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<(bool, usize)> {
    let mut data = vec![std::mem::MaybeUninit::uninit(); bytes.max(1)];
    let flags = libc::MSG_PEEK | libc::MSG_DONTWAIT;
    match super::scm::receive(fd.as_raw_fd(), &mut data, flags) {
        Ok(look) => {
            let came = look.cut || !look.descriptors.is_empty();
            super::close_in_background(look.descriptors);
            Ok((came, look.bytes))
        }
        Err(error) if error.kind() == io::ErrorKind::WouldBlock => Ok((false, 0)),
        Err(error) => Err(error),
    }
}

/// How many bytes wait to be read on `fd` (FIONREAD).
fn pending_bytes(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut pending: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer given.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut pending) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(pending).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn send_a_descriptor(from: &std::os::unix::net::UnixStream) -> io::Result<()> {
        let null = std::fs::File::open("/dev/null")?;
        super::super::scm::send_with_byte(from.as_raw_fd(), &[null.as_raw_fd()])
    }

    #[test]
    fn a_socket_that_refuses_descriptors_fails_their_send_and_tells_those_that_came_before() {
        assert!(
            kernel_refuses_descriptors(),
            "this kernel cannot refuse descriptors on a Unix socket (SO_PASSRIGHTS, Linux 6.16)"
        );
        let (near, far) = std::os::unix::net::UnixStream::pair().expect("pair");
        near.set_nonblocking(true).expect("nonblocking");
        assert!(!descriptors_waiting(near.as_fd()).expect("look"));
        std::io::Write::write_all(&mut &far, b"plain").expect("write");
        assert!(!descriptors_waiting(near.as_fd()).expect("look"));
        send_a_descriptor(&far).expect("sent before the refusal");
        refuse_descriptors(near.as_fd()).expect("refuse");
        let refused = send_a_descriptor(&far).expect_err("refused");
        assert_eq!(refused.raw_os_error(), Some(libc::EPERM));
        assert!(descriptors_waiting(near.as_fd()).expect("look"));
        let mut read = Vec::new();
        let mut chunk = [0u8; 16];
        while read.len() < 6 {
            let count = std::io::Read::read(&mut &near, &mut chunk).expect("read");
            read.extend_from_slice(&chunk[..count]);
        }
        assert_eq!(read, b"plainx", "the look took nothing");
    }
}
