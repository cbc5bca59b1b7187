//! Direct channels on the wire (see "Direct channels" in the schema): a
//! server's Unix listener tells a new connection that claims one from a
//! Cap'n Proto connection by its first bytes, and the client opens one.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::UnixStream;

use crate::ports::Socket;
use crate::rpc::{CHANNEL_CLAIMED, DIRECT_CLAIM_WITHIN, TICKET_BYTES, Ticket};

/// What a channel's connection sends first: a segment count no Cap'n
/// Proto message has (2^32), then "cxd1"; the ticket follows.
pub const CHANNEL_MAGIC: [u8; 8] = [0xff, 0xff, 0xff, 0xff, b'c', b'x', b'd', b'1'];

/// How long after its connect a channel's connection has to send its
/// magic and ticket.
pub const PREAMBLE_WITHIN: Duration = Duration::from_secs(10);

/// How long a client gives its channel's connect and preamble before it
/// declines the channel (a server that does not take it closes it at
/// once). The server's answer is then waited for as long as the server
/// waits for a claim ([`crate::rpc::DIRECT_CLAIM_WITHIN`]): declining a
/// channel the server has taken would reset the connection.
pub const CLAIM_SEND_WITHIN: Duration = Duration::from_secs(3);

/// What a new connection's first bytes say it is.
pub(crate) enum Opening {
    /// A Cap'n Proto connection (or one that closed or failed first: its
    /// frame reader says so); nothing was consumed.
    Rpc,
    /// A direct channel presenting this ticket, its preamble consumed.
    Channel(Ticket),
}

/// A socket whose first bytes can be looked at without taking them.
pub(crate) trait Peek: AsRawFd + AsyncRead + Unpin {
    fn try_peek(&self, buf: &mut [u8]) -> io::Result<usize>;
    fn readable(&self) -> impl Future<Output = io::Result<()>>;
    /// Takes no descriptors from now on; an error if some came already.
    fn take_no_descriptors(&self) -> io::Result<()>;
    /// Closes it off this thread: descriptors sent and not read are
    /// released by the socket's close.
    fn close_off_this_thread(self);
}

fn peek_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: recv writes at most `buf.len()` bytes into buf.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

impl Peek for UnixStream {
    fn try_peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.try_io(Interest::READABLE, || peek_fd(self.as_raw_fd(), buf))
    }
    fn readable(&self) -> impl Future<Output = io::Result<()>> {
        UnixStream::readable(self)
    }
    fn take_no_descriptors(&self) -> io::Result<()> {
        use std::os::fd::AsFd;
        crate::sys::refuse_descriptors_or_warn(self.as_fd(), "a direct channel");
        if crate::sys::descriptors_waiting(self.as_fd())? {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a direct channel's preamble came with descriptors, which a channel takes none of",
            ));
        }
        Ok(())
    }
    fn close_off_this_thread(self) {
        match self.into_std() {
            Ok(socket) => crate::sys::close_in_background(vec![socket.into()]),
            Err(error) => tracing::warn!(%error, "a direct channel closed on the serving thread"),
        }
    }
}

/// Looks at a new connection's first four bytes (without taking them, so
/// descriptors sent with a Cap'n Proto connection's first bytes stay for
/// its reader) and, if they open a direct channel, reads its preamble.
/// A channel that is not one (wrong magic, too slow, closed, descriptors
/// sent) is an error.
pub(crate) async fn opening<S: Peek>(stream: &mut S) -> io::Result<Opening> {
    let started = tokio::time::Instant::now();
    let mut first = [0u8; 4];
    // A Cap'n Proto peer writes its first frame (8 bytes or more) at once,
    // so this is one wait; one that trickles in its first bytes is looked
    // at again after a pause that grows, not in a busy loop (a peeked
    // socket stays readable).
    let mut pause = Duration::from_millis(1);
    loop {
        stream.readable().await?;
        match stream.try_peek(&mut first) {
            Ok(0) => return Ok(Opening::Rpc),
            Ok(n) if n < first.len() && first[..n] == CHANNEL_MAGIC[..n] => {
                if started.elapsed() > PREAMBLE_WITHIN {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            Ok(n) if n < first.len() => return Ok(Opening::Rpc),
            Ok(_) if first != CHANNEL_MAGIC[..4] => return Ok(Opening::Rpc),
            Ok(_) => break,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Ok(Opening::Rpc),
        }
    }
    // A channel from here on: its bytes are read plainly, then spliced,
    // and either has the kernel close the descriptors that came with them
    // on this thread (a pipe whose lock the peer holds: asleep for as
    // long as it likes). So it takes none, and one that sent some is
    // refused (its caller closes it off this thread).
    stream.take_no_descriptors()?;
    let mut preamble = [0u8; CHANNEL_MAGIC.len() + TICKET_BYTES];
    tokio::time::timeout_at(started + PREAMBLE_WITHIN, stream.read_exact(&mut preamble))
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    if preamble[..CHANNEL_MAGIC.len()] != CHANNEL_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a Cap'n Proto connection nor a direct channel",
        ));
    }
    let mut ticket = [0u8; TICKET_BYTES];
    ticket.copy_from_slice(&preamble[CHANNEL_MAGIC.len()..]);
    Ok(Opening::Channel(ticket))
}

/// Where a client opens the direct channels of its connection's dials:
/// the listener that connection came through.
#[derive(Clone, Debug)]
pub struct DirectRoute(PathBuf);

impl DirectRoute {
    /// The route of a connection to the Unix socket at `path`.
    pub(crate) fn unix(path: PathBuf) -> DirectRoute {
        DirectRoute(path)
    }

    /// Opens the channel that `ticket` claims, once the server says it
    /// took it; an error if the server closed it unanswered (the ticket
    /// came from another server, one beyond this hop), or it could not be
    /// sent within `CLAIM_SEND_WITHIN`, or the server did not answer
    /// within [`crate::rpc::DIRECT_CLAIM_WITHIN`].
    pub async fn open(&self, ticket: &Ticket) -> io::Result<Socket> {
        let mut preamble = [0u8; CHANNEL_MAGIC.len() + TICKET_BYTES];
        preamble[..CHANNEL_MAGIC.len()].copy_from_slice(&CHANNEL_MAGIC);
        preamble[CHANNEL_MAGIC.len()..].copy_from_slice(ticket);
        let timed_out = |_| io::Error::from(io::ErrorKind::TimedOut);
        let mut stream = tokio::time::timeout(CLAIM_SEND_WITHIN, async {
            let mut stream = UnixStream::connect(&self.0).await?;
            stream.write_all(&preamble).await?;
            Ok::<_, io::Error>(stream)
        })
        .await
        .map_err(timed_out)??;
        let mut answer = [0u8; 1];
        let read = tokio::time::timeout(DIRECT_CLAIM_WITHIN, stream.read(&mut answer))
            .await
            .map_err(timed_out)??;
        match read {
            1 if answer[0] == CHANNEL_CLAIMED => Ok(Socket::Unix(stream)),
            _ => Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "the server did not take the channel",
            )),
        }
    }
}
