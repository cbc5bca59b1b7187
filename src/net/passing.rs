//! Descriptors over a Unix socket connection (SCM_RIGHTS): the client's
//! writer sends the descriptors its outbox holds with the next bytes it
//! writes, and the server's reader files those that arrive with the bytes
//! it reads (see `rpc::handoff`). Bytes flow as through the plain halves:
//! no copy, no extra system call while nothing is queued.
//!
//! The kernel hands descriptors over with the bytes they were sent with,
//! and a read never takes bytes beyond them, so a start's descriptors,
//! sent no later than the start, are filed before the start is read.

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::rpc::{DescriptorOutbox, ReceivedDescriptors};

/// Most descriptors one write sends (and one read has room for, with
/// some to spare, so that a peer's descriptors are never cut off): as
/// many as a server keeps per connection. A start's descriptors leave
/// with its bytes or before them as long as no more than this wait at
/// once; beyond (many handed starts coalesced into one write), a start
/// may be read before its descriptors and has pipes.
const MAX_PER_WRITE: usize = crate::rpc::MAX_KEPT_DESCRIPTORS;

/// The server's read half, filing the descriptors that arrive.
pub(crate) struct ReceivingReader {
    half: OwnedReadHalf,
    received: ReceivedDescriptors,
    /// While reads wait for the connection's closes: when to look whether
    /// the close in progress sleeps.
    look_again: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl ReceivingReader {
    pub fn new(half: OwnedReadHalf, received: ReceivedDescriptors) -> ReceivingReader {
        ReceivingReader {
            half,
            received,
            look_again: None,
        }
    }

    /// Ready once a read may bring in more descriptors (see
    /// `ReceivedDescriptors::room`): an error if the connection ends.
    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            match self.received.room(cx) {
                Poll::Ready(Ok(())) => {
                    self.look_again = None;
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Err(why)) => {
                    crate::metrics::limit_hit("descriptors-waiting-to-close");
                    tracing::warn!("{why}");
                    return Poll::Ready(Err(io::Error::other(why)));
                }
                Poll::Pending => {}
            }
            let look_again = self
                .look_again
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(crate::sys::ASLEEP_AFTER)));
            ready!(look_again.as_mut().poll(cx));
            self.look_again = None;
        }
    }
}

/// The connection has ended: what it kept is closed now, even while a
/// process it started is held (its quota outlives the connection). What
/// the peer sent and nobody read may carry descriptors too, which the
/// socket's last close releases on the closing thread (a pipe whose lock
/// the peer holds: asleep for as long as it likes). So the peer can send
/// nothing more, and a copy of the socket goes to the connection's
/// closes, which read it out and close it off this thread: the copy makes
/// its close the last.
impl Drop for ReceivingReader {
    fn drop(&mut self) {
        self.received.close();
        let socket = self.half.as_ref().as_fd();
        // SAFETY: shutdown(2) of our own socket; the peer's sends fail
        // from now on.
        unsafe { libc::shutdown(socket.as_raw_fd(), libc::SHUT_RD) };
        // Nothing left (descriptors come with a byte at least, and
        // nothing more can come): nothing to read out, no thread to start.
        let mut left: libc::c_int = 0;
        // SAFETY: FIONREAD writes one c_int through the pointer given.
        let asked = unsafe { libc::ioctl(socket.as_raw_fd(), libc::FIONREAD, &mut left) };
        if asked == 0 && left == 0 {
            return;
        }
        match socket.try_clone_to_owned() {
            Ok(copy) => self.received.read_out_and_close(copy),
            Err(error) => {
                // No descriptor to spare: read out here, each closed off
                // this thread as it comes.
                tracing::warn!(%error, "a connection's socket read out on the serving thread");
                let mut scratch = vec![MaybeUninit::<u8>::uninit(); 64 * 1024];
                while let Ok((1.., _)) = receive(socket.as_raw_fd(), &mut scratch, &self.received) {
                }
            }
        }
    }
}

impl AsyncRead for ReceivingReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // Too many of its descriptors wait to close: a read could bring
        // in a message's worth more.
        ready!(this.poll_room(cx))?;
        let stream = this.half.as_ref();
        loop {
            ready!(stream.poll_read_ready(cx))?;
            // SAFETY: recvmsg only writes to the bytes it reports read,
            // and only those are marked initialised.
            let unfilled = unsafe { buf.unfilled_mut() };
            // Too many wait to close server-wide: a read takes only bytes
            // that came without descriptors, and a peer that sends some
            // now ends before they come in (after would be too late:
            // every connection could bring a message's worth more). The
            // look also sees descriptors just after the bytes it covers:
            // such a peer ends a little early.
            let room = match this.received.overfull_in_server() {
                None => unfilled.len(),
                Some(why) => match stream.try_io(Interest::READABLE, || {
                    crate::sys::bytes_without_descriptors(stream.as_raw_fd(), unfilled)
                }) {
                    Ok(Some(0)) => unfilled.len(),
                    Ok(Some(bytes)) => bytes,
                    Ok(None) => {
                        crate::metrics::limit_hit("descriptors-waiting-to-close");
                        tracing::warn!("{why}");
                        return Poll::Ready(Err(io::Error::other(why)));
                    }
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(error) => return Poll::Ready(Err(error)),
                },
            };
            let read = stream.try_io(Interest::READABLE, || {
                receive(stream.as_raw_fd(), &mut unfilled[..room], &this.received)
            });
            match read {
                Ok((count, descriptors)) => {
                    // SAFETY: recvmsg wrote `count` bytes.
                    unsafe { buf.assume_init(count) };
                    buf.advance(count);
                    // Their closes wait behind one that sleeps: the peer
                    // sends no more to this server through here.
                    if let Some(why) = descriptors
                        .then(|| this.received.overfull_in_server())
                        .flatten()
                    {
                        crate::metrics::limit_hit("descriptors-waiting-to-close");
                        tracing::warn!("{why}");
                        return Poll::Ready(Err(io::Error::other(why)));
                    }
                    return Poll::Ready(Ok(()));
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }
}

/// One recvmsg(2) into `data`, filing any descriptors that came with it:
/// how many bytes it read, and whether descriptors came. Some that did
/// not fit (the kernel closed them) end the connection: the numbers are
/// no longer the peer's, and a peer that sends more than a read has room
/// for (SCM_MAX_FD) is up to no good.
fn receive(
    socket: RawFd,
    data: &mut [MaybeUninit<u8>],
    received: &ReceivedDescriptors,
) -> io::Result<(usize, bool)> {
    let read = crate::sys::receive_with_descriptors(socket, data, libc::MSG_DONTWAIT)?;
    let descriptors = !read.descriptors.is_empty() || read.cut;
    for fd in read.descriptors {
        received.arrived(fd);
    }
    if read.cut {
        received.lost_some();
        return Err(io::Error::other(
            "[capexec:limit] descriptors the peer sent did not fit a read and were closed",
        ));
    }
    Ok((read.bytes, descriptors))
}

const fn control_words(descriptors: usize) -> usize {
    // CMSG_SPACE: the header, then the data, each padded to a word.
    let header = std::mem::size_of::<libc::cmsghdr>();
    let data = descriptors * std::mem::size_of::<RawFd>();
    (header.next_multiple_of(8) + data.next_multiple_of(8)) / 8
}

/// The client's write half, sending the descriptors its outbox holds with
/// the bytes it writes next.
pub(crate) struct SendingWriter {
    half: OwnedWriteHalf,
    outbox: DescriptorOutbox,
}

impl SendingWriter {
    pub fn new(half: OwnedWriteHalf, outbox: DescriptorOutbox) -> SendingWriter {
        SendingWriter { half, outbox }
    }

    fn poll_send(&mut self, cx: &mut Context<'_>, data: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let stream = self.half.as_ref();
        loop {
            ready!(stream.poll_write_ready(cx))?;
            let sent = stream.try_io(Interest::WRITABLE, || {
                self.outbox
                    .send_with(MAX_PER_WRITE, |fds| send(stream.as_raw_fd(), data, fds))
            });
            match sent {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                other => return Poll::Ready(other),
            }
        }
    }
}

/// One sendmsg(2) of `data` with `fds`.
fn send(socket: RawFd, data: &[IoSlice<'_>], fds: &[RawFd]) -> io::Result<usize> {
    let mut control = [0u64; control_words(MAX_PER_WRITE)];
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is an iovec on Unix; sendmsg only reads through it.
    message.msg_iov = data.as_ptr() as *mut libc::iovec;
    message.msg_iovlen = data.len() as _;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds);
        // SAFETY: the control buffer has room for MAX_PER_WRITE
        // descriptors and `fds` holds at most that many.
        unsafe {
            message.msg_control = control.as_mut_ptr().cast();
            message.msg_controllen = libc::CMSG_SPACE(bytes as u32) as _;
            let header = libc::CMSG_FIRSTHDR(&message);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(bytes as u32) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(header).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    // SAFETY: every pointer in `message` is valid for its length.
    let count = unsafe { libc::sendmsg(socket, &message, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if count < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(count as usize)
}

impl AsyncWrite for SendingWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.outbox.is_empty() || data.is_empty() {
            return Pin::new(&mut this.half).poll_write(cx, data);
        }
        this.poll_send(cx, &[IoSlice::new(data)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.outbox.is_empty() || data.iter().all(|slice| slice.is_empty()) {
            return Pin::new(&mut this.half).poll_write_vectored(cx, data);
        }
        this.poll_send(cx, data)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().half).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().half).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::OwnedFd;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn pipe() -> (std::fs::File, std::fs::File) {
        let (read, write) = std::io::pipe().expect("pipe");
        (OwnedFd::from(read).into(), OwnedFd::from(write).into())
    }

    #[tokio::test]
    async fn descriptors_arrive_with_the_bytes_they_were_sent_with_in_order() {
        use std::io::{Read, Write};
        let (client, server) = tokio::net::UnixStream::pair().expect("pair");
        let (_client_read, client_write) = client.into_split();
        let (server_read, _server_write) = server.into_split();
        let outbox = DescriptorOutbox::default();
        let received = ReceivedDescriptors::default();
        let mut writer = SendingWriter::new(client_write, outbox.clone());
        let mut reader = ReceivingReader::new(server_read, received.clone());

        let mut kept_ends = Vec::new();
        let mut sent = Vec::new();
        for _ in 0..20 {
            let (read, write) = pipe();
            kept_ends.push(read);
            sent.push(OwnedFd::from(write));
        }
        // More than one write sends: they go with the following writes.
        assert_eq!(outbox.queue(sent), 0);
        let writing = async {
            writer.write_all(b"first").await.expect("write");
            writer.write_all(b"second").await.expect("write");
            assert!(outbox.is_empty());
            writer.write_all(&vec![7u8; 300_000]).await.expect("write");
            drop(writer);
        };
        let mut bytes = Vec::new();
        let reading = reader.read_to_end(&mut bytes);
        let ((), read) = tokio::join!(writing, reading);
        read.expect("read");
        assert_eq!(&bytes[..11], b"firstsecond");
        assert_eq!(bytes.len(), 11 + 300_000);
        assert!(bytes[11..].iter().all(|&byte| byte == 7));

        // Each received descriptor is the write end of the pipe of its
        // number: what is written through it comes out of that pipe.
        // A connection keeps the latest 16: the first four were closed.
        let oldest = 20 - crate::rpc::MAX_KEPT_DESCRIPTORS;
        for (number, mut kept) in kept_ends.into_iter().enumerate() {
            if number < oldest {
                assert!(received.take(number as u64, 1).is_none());
                continue;
            }
            let fd = received.take(number as u64, 1).expect("arrived").remove(0);
            let mut file = std::fs::File::from(fd);
            file.write_all(&[number as u8]).expect("write");
            drop(file);
            // One byte, not to the end: a child another test forks
            // meanwhile may hold a copy of the write end until it execs.
            let mut byte = [0u8];
            kept.read_exact(&mut byte).expect("read");
            assert_eq!(byte, [number as u8]);
        }
    }

    /// While too many descriptors wait to close server-wide, a read takes
    /// bytes that came without descriptors, and a connection that sends
    /// some ends before they come into the table (the kernel's read into a
    /// full table would close them on the serving thread).
    #[tokio::test]
    async fn while_too_many_wait_to_close_a_read_takes_no_descriptors() {
        use std::os::fd::AsRawFd;
        let (client, server) = std::os::unix::net::UnixStream::pair().expect("pair");
        server.set_nonblocking(true).expect("nonblocking");
        let server = tokio::net::UnixStream::from_std(server).expect("tokio");
        let (server_read, _server_write) = server.into_split();
        let received = ReceivedDescriptors::default();
        received.as_if_overfull();
        let mut reader = ReceivingReader::new(server_read, received.clone());
        std::io::Write::write_all(&mut &client, b"plain").expect("write");
        let mut five = [0u8; 5];
        reader
            .read_exact(&mut five)
            .await
            .expect("bytes without descriptors");
        assert_eq!(&five, b"plain");
        let (sent, write_end) = pipe();
        crate::sys::send_with_byte(client.as_raw_fd(), &[sent.as_raw_fd()]).expect("send");
        drop(sent);
        let mut more = [0u8; 64];
        let error = reader
            .read(&mut more)
            .await
            .expect_err("the connection ends");
        assert!(
            error.to_string().contains("wait to close server-wide"),
            "{error}"
        );
        assert!(received.take(0, 1).is_none(), "nothing was filed");
        // The socket still holds the pipe's read end: no read took it.
        let mut write_end = write_end;
        std::io::Write::write_all(&mut write_end, b"x").expect("a reader is left");
    }

    #[tokio::test]
    async fn a_reader_without_descriptors_reads_into_uninitialised_memory() {
        let (client, server) = tokio::net::UnixStream::pair().expect("pair");
        let (_client_read, mut client_write) = client.into_split();
        let (server_read, _server_write) = server.into_split();
        let mut reader = ReceivingReader::new(server_read, ReceivedDescriptors::default());
        client_write.write_all(b"hello").await.expect("write");
        drop(client_write);
        let mut buffer = Vec::with_capacity(64);
        reader.read_buf(&mut buffer).await.expect("read");
        assert_eq!(buffer, b"hello");
    }
}
