//! One recvmsg(2) on a Unix socket that takes in every descriptor that
//! came with the bytes (SCM_RIGHTS), with room for all one message can
//! carry: descriptors a read has no room for are closed by the kernel on
//! the reading thread, and a pipe among them whose lock the peer holds
//! would put that thread to sleep for as long as the peer likes.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Every descriptor one message can carry (the kernel's SCM_MAX_FD).
pub const SCM_MAX_FD: usize = 253;

/// What one read brought.
pub struct Received {
    /// Bytes written at the start of the buffer given.
    pub bytes: usize,
    /// The descriptors that came with them, in the order sent.
    pub descriptors: Vec<OwnedFd>,
    /// Some did not fit (`MSG_CTRUNC`: the kernel closed them).
    pub cut: bool,
}

/// Room for a cmsghdr and SCM_MAX_FD descriptors, aligned for cmsghdr.
const CONTROL_WORDS: usize = {
    let header = std::mem::size_of::<libc::cmsghdr>();
    let data = SCM_MAX_FD * std::mem::size_of::<RawFd>();
    (header.next_multiple_of(8) + data.next_multiple_of(8)) / 8
};

/// One recvmsg(2) of `socket` into `data` with `flags` (and
/// `MSG_CMSG_CLOEXEC`).
pub fn receive(
    socket: RawFd,
    data: &mut [MaybeUninit<u8>],
    flags: libc::c_int,
) -> io::Result<Received> {
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut control = [0u64; CONTROL_WORDS];
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: every pointer in `message` is valid for its length.
    let count = unsafe { libc::recvmsg(socket, &mut message, flags | libc::MSG_CMSG_CLOEXEC) };
    if count < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut descriptors = Vec::new();
    // SAFETY: walking the control messages recvmsg just wrote; each
    // descriptor in them is new and ours.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&message);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let first = libc::CMSG_DATA(header);
                let bytes = (*header).cmsg_len as usize - (first as usize - header as usize);
                for index in 0..bytes / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(first.cast::<RawFd>().add(index));
                    descriptors.push(OwnedFd::from_raw_fd(fd));
                }
            }
            header = libc::CMSG_NXTHDR(&message, header);
        }
    }
    Ok(Received {
        bytes: count as usize,
        descriptors,
        cut: message.msg_flags & libc::MSG_CTRUNC != 0,
    })
}
