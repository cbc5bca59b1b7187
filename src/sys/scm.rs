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

/// Room for a cmsghdr and one descriptor.
const ONE_DESCRIPTOR_WORDS: usize = {
    let header = std::mem::size_of::<libc::cmsghdr>();
    let data = std::mem::size_of::<RawFd>();
    (header.next_multiple_of(8) + data.next_multiple_of(8)) / 8
};

/// One recvmsg(2) of `socket` into `data` with `flags` (and
/// `MSG_CMSG_CLOEXEC`).
pub fn receive(
    socket: RawFd,
    data: &mut [MaybeUninit<u8>],
    flags: libc::c_int,
) -> io::Result<Received> {
    let mut control = [0u64; CONTROL_WORDS];
    let room = std::mem::size_of_val(&control);
    receive_into(socket, data, flags, &mut control, room)
}

/// The same with room for one descriptor only: the kernel closes the
/// others that came with the bytes on the calling thread (which must be
/// one that may sleep), and the caller's table never holds more than
/// one of them.
pub fn receive_one_descriptor(
    socket: RawFd,
    data: &mut [MaybeUninit<u8>],
    flags: libc::c_int,
) -> io::Result<Received> {
    // The kernel fills what the length leaves after the header: exactly
    // one descriptor's room, not the padding after it.
    // SAFETY: CMSG_LEN only computes.
    let room = unsafe { libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) } as usize;
    receive_into(socket, data, flags, &mut [0u64; ONE_DESCRIPTOR_WORDS], room)
}

fn receive_into(
    socket: RawFd,
    data: &mut [MaybeUninit<u8>],
    flags: libc::c_int,
    control: &mut [u64],
    room: usize,
) -> io::Result<Received> {
    debug_assert!(room <= std::mem::size_of_val(control));
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = room as _;
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

/// How many of the bytes waiting on the Unix stream `socket` (up to
/// `data.len()`, looked at there, not taken) a read may take without
/// taking descriptors: `None` if descriptors came with them, or with the
/// message right after them (a look goes on to the next message whatever
/// room is left). A look with no room for descriptors installs none and
/// closes none for good (the socket still holds them), and a read of at
/// most that many bytes stops before any that came with descriptors: the
/// bytes are the same ones, in the same messages.
pub fn bytes_without_descriptors(
    socket: RawFd,
    data: &mut [MaybeUninit<u8>],
) -> io::Result<Option<usize>> {
    let look = receive_into(
        socket,
        data,
        libc::MSG_PEEK | libc::MSG_DONTWAIT,
        &mut [],
        0,
    )?;
    Ok((!look.cut && look.descriptors.is_empty()).then_some(look.bytes))
}

/// Sends `fds` with one byte `x` over `socket`: the spawner's hand-back
/// (and, in tests, a peer's send).
pub(crate) fn send_with_byte(socket: RawFd, fds: &[RawFd]) -> io::Result<()> {
    let header = std::mem::size_of::<libc::cmsghdr>();
    let mut control = vec![0u64; (header + std::mem::size_of_val(fds)).div_ceil(8) + 1];
    let mut byte = [b'x'];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: an all-zero msghdr is a valid empty one; the control buffer
    // holds one cmsghdr with `fds`.
    unsafe {
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) as usize as _;
        let cmsg = libc::CMSG_FIRSTHDR(&message);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
        std::ptr::copy_nonoverlapping(
            fds.as_ptr(),
            libc::CMSG_DATA(cmsg).cast::<RawFd>(),
            fds.len(),
        );
        if libc::sendmsg(socket, &message, 0) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, OwnedFd};

    /// Whether every reader of the pipe whose write end is `write` is gone.
    fn reader_closed(write: &OwnedFd) -> bool {
        let mut probe = std::fs::File::from(write.try_clone().expect("dup"));
        std::io::Write::write(&mut probe, b"x")
            .is_err_and(|error| error.kind() == std::io::ErrorKind::BrokenPipe)
    }

    #[test]
    fn a_read_with_room_for_one_descriptor_takes_the_first_and_closes_the_rest() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("pair");
        let pipes: Vec<(OwnedFd, OwnedFd)> = (0..5)
            .map(|_| {
                let (read, write) = std::io::pipe().expect("pipe");
                (read.into(), write.into())
            })
            .collect();
        let sent: Vec<RawFd> = pipes.iter().map(|(read, _)| read.as_raw_fd()).collect();
        send_with_byte(theirs.as_raw_fd(), &sent).expect("send");
        let writes: Vec<OwnedFd> = pipes.into_iter().map(|(_, write)| write).collect();
        let mut data = [MaybeUninit::<u8>::uninit(); 16];
        let read = receive_one_descriptor(ours.as_raw_fd(), &mut data, 0).expect("recvmsg");
        assert_eq!((read.bytes, read.descriptors.len(), read.cut), (1, 1, true));
        // Ours are the only readers left: the first is held, the kernel
        // closed the four it had no room for.
        assert!(!reader_closed(&writes[0]));
        assert!(writes[1..].iter().all(reader_closed));
        drop(read);
        assert!(reader_closed(&writes[0]));
    }

    #[test]
    fn a_look_tells_how_much_comes_before_descriptors_and_takes_none() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("pair");
        std::io::Write::write_all(&mut &theirs, b"plain").expect("write");
        let mut data = [MaybeUninit::<u8>::uninit(); 64];
        let look = bytes_without_descriptors(ours.as_raw_fd(), &mut data).expect("look");
        assert_eq!(look, Some(5));
        let (read_end, write_end) = std::io::pipe().expect("pipe");
        send_with_byte(theirs.as_raw_fd(), &[read_end.as_raw_fd()]).expect("send");
        drop(read_end);
        let write_end = OwnedFd::from(write_end);
        // Descriptors come within what a read would take, or right after
        // (a look goes on to the next message): none installed, none
        // closed (the socket holds the pipe's reader).
        let look = bytes_without_descriptors(ours.as_raw_fd(), &mut data).expect("look");
        assert_eq!(look, None);
        let look = bytes_without_descriptors(ours.as_raw_fd(), &mut data[..5]).expect("look");
        assert_eq!(look, None);
        assert!(!reader_closed(&write_end));
        // A read of the bytes before them takes none.
        let read = receive(ours.as_raw_fd(), &mut data[..5], 0).expect("read");
        assert_eq!((read.bytes, read.descriptors.len()), (5, 0));
        let read = receive(ours.as_raw_fd(), &mut data, 0).expect("read");
        assert_eq!((read.bytes, read.descriptors.len()), (1, 1));
    }

    #[test]
    fn a_read_with_room_for_all_takes_them_all() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("pair");
        let (read_end, write_end) = std::io::pipe().expect("pipe");
        let sent = vec![read_end.as_raw_fd(); SCM_MAX_FD];
        send_with_byte(theirs.as_raw_fd(), &sent).expect("send");
        drop(read_end);
        let mut data = [MaybeUninit::<u8>::uninit(); 16];
        let read = receive(ours.as_raw_fd(), &mut data, 0).expect("recvmsg");
        assert_eq!((read.descriptors.len(), read.cut), (SCM_MAX_FD, false));
        let write_end = OwnedFd::from(write_end);
        assert!(!reader_closed(&write_end));
        drop(read);
        assert!(reader_closed(&write_end));
    }
}
