//! Moving one direction of a connection from one socket to another in the
//! kernel: splice(2) from the source into a pipe of our own, then from the
//! pipe into the destination, so the bytes are never copied into this
//! process (a direct channel's relay, see "Direct channels" in the
//! schema). Flow control is the sockets' own: nothing is read while the
//! pipe still holds bytes the destination has not taken, so at most one
//! pipe's worth is in flight here.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use tokio::io::Interest;

use crate::ports::Socket;

/// A pipe's default size (16 pages): what one splice moves while a
/// direction is not busy.
pub const PUMP_CHUNK_BYTES: usize = 64 * 1024;

/// What a busy direction's pipe grows to (one splice filled it): fewer
/// calls and wake-ups per byte, the difference between 41 % and 68-76 % of
/// a direct copy peer to client in the benchmark.
pub const PUMP_BUSY_BYTES: usize = 256 * 1024;

/// Busy pipes a server holds at once. A pipe counts against its user's
/// pipe pages (`pipe-user-pages-soft`, 16,384) whatever it holds, and past
/// that limit every new pipe of the user, its processes' stdio too, is cut
/// to 2 pages: 64 pipes of 64 pages keep to a quarter of it, and the
/// others stay at the default.
pub const MAX_BUSY_PIPES: usize = 64;

/// Pipes a server's pumps hold at once (two descriptors each): a
/// direction that finds no place moves its bytes through a buffer of its
/// own instead, so that however many direct channels clients hold, their
/// pipes cannot fill the descriptor table (the server's budget keeps
/// room for these: `engine::descriptors::PUMP_PIPE_DESCRIPTORS`).
pub const MAX_PUMP_PIPES: usize = 256;

thread_local! {
    /// Places for busy pipes of this thread's pumps (the RPC thread's: all
    /// of them); a busy pipe holds a permit.
    static BUSY_PIPES: std::sync::Arc<tokio::sync::Semaphore> =
        std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_BUSY_PIPES));
    /// Places for this thread's pumps' pipes; each pipe holds a permit.
    static PUMP_PIPES: std::sync::Arc<tokio::sync::Semaphore> =
        std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_PUMP_PIPES));
}

/// Why a pump stopped before the source's end of file.
#[derive(Debug)]
pub enum PumpError {
    /// Reading the source failed (a reset arrives as `ConnectionReset`).
    Reading(io::Error),
    /// Writing into the destination failed.
    Writing(io::Error),
    /// No pipe to move the bytes through (out of descriptors).
    Pipe(io::Error),
}

impl PumpError {
    /// The system's error inside.
    pub fn into_io(self) -> io::Error {
        match self {
            PumpError::Reading(error) | PumpError::Writing(error) | PumpError::Pipe(error) => error,
        }
    }
}

/// A pipe whose two ends this process holds, non-blocking.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// How much one splice into it moves.
    size: usize,
    /// Its place among the busy pipes, once grown.
    busy: Option<tokio::sync::OwnedSemaphorePermit>,
    /// Its place among the pumps' pipes.
    _place: tokio::sync::OwnedSemaphorePermit,
}

impl Pipe {
    /// Grows to [`PUMP_BUSY_BYTES`] if the server has room for another
    /// busy pipe (and the kernel agrees).
    fn grow(&mut self) {
        if self.busy.is_some() {
            return;
        }
        let Ok(place) = BUSY_PIPES.with(|busy| std::sync::Arc::clone(busy).try_acquire_owned())
        else {
            return;
        };
        // SAFETY: F_SETPIPE_SZ only resizes the pipe's buffer.
        let set = unsafe {
            libc::fcntl(
                self.write.as_raw_fd(),
                libc::F_SETPIPE_SZ,
                PUMP_BUSY_BYTES as libc::c_int,
            )
        };
        if let Ok(size @ PUMP_BUSY_BYTES..) = usize::try_from(set) {
            self.size = size;
            self.busy = Some(place);
        }
    }
}

impl Pipe {
    /// A new pipe, or `None` if the pumps hold their most.
    fn new() -> io::Result<Option<Pipe>> {
        let Ok(place) = PUMP_PIPES.with(|places| std::sync::Arc::clone(places).try_acquire_owned())
        else {
            return Ok(None);
        };
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both were just created and are ours alone.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(Some(Pipe {
            read,
            write,
            size: PUMP_CHUNK_BYTES,
            busy: None,
            _place: place,
        }))
    }
}

/// What a direction with no pipe copies at a time: small, as each such
/// direction whose destination is slow holds its chunk meanwhile.
const COPY_CHUNK_BYTES: usize = 16 * 1024;

/// Moves what `from` has (waiting for some) into `to` through a buffer,
/// for a direction with no pipe; how much, 0 at `from`'s end of file. The
/// buffer is held only while bytes are in it.
async fn copy_some(from: &Socket, to: &Socket) -> Result<usize, PumpError> {
    let mut buffer = Vec::new();
    let read = loop {
        from.readable().await.map_err(PumpError::Reading)?;
        buffer.resize(COPY_CHUNK_BYTES, 0);
        match from.try_io(Interest::READABLE, || {
            read_into(from.as_raw_fd(), &mut buffer)
        }) {
            Ok(read) => break read,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => buffer = Vec::new(),
            Err(error) => return Err(PumpError::Reading(error)),
        }
    };
    let mut written = 0;
    while written < read {
        let taken = to
            .io(Interest::WRITABLE, || {
                write_from(to.as_raw_fd(), &buffer[written..read])
            })
            .await
            .map_err(PumpError::Writing)?;
        if taken == 0 {
            return Err(PumpError::Writing(io::ErrorKind::WriteZero.into()));
        }
        written += taken;
    }
    Ok(read)
}

fn read_into(from: RawFd, buffer: &mut [u8]) -> io::Result<usize> {
    // SAFETY: read writes at most `buffer.len()` bytes into it.
    let read = unsafe { libc::read(from, buffer.as_mut_ptr().cast(), buffer.len()) };
    if read < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(read as usize)
}

fn write_from(to: RawFd, bytes: &[u8]) -> io::Result<usize> {
    // SAFETY: send reads at most `bytes.len()` bytes of it; MSG_NOSIGNAL:
    // a peer gone is EPIPE, not SIGPIPE.
    let written = unsafe { libc::send(to, bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) };
    if written < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(written as usize)
}

fn splice(from: RawFd, to: RawFd, length: usize) -> io::Result<usize> {
    // SAFETY: both descriptors are open for the length of the call; no
    // offsets are given (neither end is a file).
    let moved = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            length,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if moved < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(moved as usize)
}

/// A direction quiet this long lets its pipe go.
const PIPE_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// Moves everything `from` sends into `to` until `from`'s end of file;
/// returns how many bytes moved. Neither socket is shut down or closed:
/// what an end or a failure means is the caller's to say. The pipe is
/// made when bytes come and let go once the direction has been quiet for
/// `PIPE_IDLE`, so an idle connection holds none. While the pumps hold
/// their most pipes ([`MAX_PUMP_PIPES`]) the bytes go through a buffer.
pub async fn pump(from: &Socket, to: &Socket) -> Result<u64, PumpError> {
    let (source, sink) = (from.as_raw_fd(), to.as_raw_fd());
    let mut pipe: Option<Pipe> = None;
    let mut moved = 0u64;
    from.readable().await.map_err(PumpError::Reading)?;
    loop {
        let through = match &mut pipe {
            Some(pipe) => pipe,
            None => match Pipe::new().map_err(PumpError::Pipe)? {
                Some(new) => pipe.insert(new),
                None => match copy_some(from, to).await? {
                    0 => return Ok(moved),
                    copied => {
                        moved += copied as u64;
                        continue;
                    }
                },
            },
        };
        let arrived = match from.try_io(Interest::READABLE, || {
            splice(source, through.write.as_raw_fd(), through.size)
        }) {
            Ok(0) => return Ok(moved),
            Ok(arrived) => arrived,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                // The pipe is empty here: every splice in is spliced out.
                let quiet = tokio::time::timeout(PIPE_IDLE, from.readable()).await;
                match quiet {
                    Ok(ready) => ready.map_err(PumpError::Reading)?,
                    Err(_) => {
                        pipe = None;
                        from.readable().await.map_err(PumpError::Reading)?;
                    }
                }
                continue;
            }
            Err(error) => return Err(PumpError::Reading(error)),
        };
        let mut held = arrived;
        while held > 0 {
            let taken = to
                .io(Interest::WRITABLE, || {
                    splice(through.read.as_raw_fd(), sink, held)
                })
                .await
                .map_err(PumpError::Writing)?;
            if taken == 0 {
                return Err(PumpError::Writing(io::ErrorKind::WriteZero.into()));
            }
            held -= taken;
        }
        if arrived >= through.size {
            // More was waiting than the pipe holds: a busy direction.
            through.grow();
        }
        moved += arrived as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixStream;

    /// A pump between two socket pairs: what goes in at `a`'s far end
    /// comes out at `b`'s far end.
    fn pair() -> (Socket, UnixStream) {
        let (near, far) = UnixStream::pair().expect("socketpair");
        (Socket::Unix(near), far)
    }

    /// Pumps `length` bytes from one socket pair to another and checks
    /// they arrive exactly, with the end reported.
    async fn pumped_exactly(length: u32) {
        let (from, mut writer) = pair();
        let (to, mut reader) = pair();
        let data: Vec<u8> = (0..length).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writing = tokio::spawn(async move {
            writer.write_all(&sent).await.expect("write");
            writer.shutdown().await.expect("shutdown");
        });
        let reading = tokio::spawn(async move {
            let mut got = Vec::new();
            reader.read_to_end(&mut got).await.expect("read");
            got
        });
        let moved = pump(&from, &to).await.expect("pump");
        assert_eq!(moved, data.len() as u64);
        writing.await.expect("writer");
        drop(to);
        assert_eq!(reading.await.expect("reader"), data);
    }

    #[tokio::test]
    async fn bytes_arrive_exactly_and_the_end_is_reported() {
        pumped_exactly(3_000_000).await;
        assert_eq!(
            BUSY_PIPES.with(|busy| busy.available_permits()),
            MAX_BUSY_PIPES,
            "the pump's pipe went with it"
        );
        assert_eq!(
            PUMP_PIPES.with(|places| places.available_permits()),
            MAX_PUMP_PIPES
        );
    }

    #[tokio::test]
    async fn without_a_pipe_place_the_bytes_go_through_a_buffer() {
        let places: Vec<_> = (0..MAX_PUMP_PIPES)
            .map(|_| {
                PUMP_PIPES
                    .with(|places| std::sync::Arc::clone(places).try_acquire_owned())
                    .expect("a place")
            })
            .collect();
        pumped_exactly(1_000_000).await;
        drop(places);
    }

    #[tokio::test]
    async fn a_destination_gone_is_a_writing_error() {
        let (from, mut writer) = pair();
        let (to, reader) = pair();
        drop(reader);
        writer.write_all(b"hello").await.expect("write");
        match pump(&from, &to).await {
            Err(PumpError::Writing(error)) => {
                assert_eq!(error.kind(), io::ErrorKind::BrokenPipe, "{error}")
            }
            other => panic!("expected a writing error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_reset_source_is_a_reading_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let client = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        socket2::SockRef::from(&client)
            .set_linger(Some(std::time::Duration::ZERO))
            .expect("linger");
        drop(client);
        let (to, _reader) = pair();
        match pump(&Socket::Tcp(server), &to).await {
            Err(PumpError::Reading(error)) => {
                assert_eq!(error.kind(), io::ErrorKind::ConnectionReset, "{error}")
            }
            other => panic!("expected a reset, got {other:?}"),
        }
    }
}
