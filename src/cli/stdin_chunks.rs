//! Our stdin, read in chunks for `capexec run` to relay (`input.rs`).
//!
//! A read takes what is there, and then whatever more is already waiting
//! (a producer such as `head` or `cat` writes 4-8 KiB at a time), up to
//! [`STDIN_CHUNK`]: a fast stream leaves in big writes, a keystroke at
//! once. A pipe found full grows, as the server grows its children's
//! (`engine::pipe_capacity`): the producer runs further ahead and each
//! read takes up to a chunk.
//!
//! A pipe is read on the RPC thread itself, whenever epoll says it is
//! readable, with preadv2(RWF_NOWAIT): a read that would wait fails with
//! EAGAIN instead, and the pipe, which we share with whoever gave it to
//! us, is not switched to O_NONBLOCK. Chunks read by a thread of their own
//! each cost a wake-up of the RPC thread, and on a machine of two vCPUs
//! often the wake-up of a halted vCPU (docs/BENCHMARKS.md, "Stdin read on
//! the RPC thread"). Anything else (a terminal, a regular file, a socket),
//! and a pipe that refuses RWF_NOWAIT (a named FIFO does), is read by a
//! thread of its own with blocking reads, so that it never blocks the RPC
//! thread. (RWF_NOWAIT spares a read the wait for data, not the wait for
//! the pipe's lock: a writer that splices a silent socket into our stdin
//! holds that lock while it waits, and the read with it, as tokio's own
//! non-blocking pipes would.)

use std::fs::File;
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, RawFd};

use bytes::Bytes;
use capexec::client::{OutgoingBytes, SegmentBuffer};
use capexec::engine::pipe_capacity;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

/// Most bytes of our stdin forwarded in one `write`: what a pipe holds
/// when it is growing fast, so a fast producer costs few round trips.
const STDIN_CHUNK: usize = 256 * 1024;

/// Reads smaller than this are copied into a chunk of their own, so a
/// keystroke does not hold a whole [`STDIN_CHUNK`] buffer.
const STDIN_COPY_BELOW: usize = 32 * 1024;

/// The biggest packet of a pipe in packet mode (PIPE_BUF): a read into
/// less room than that loses the rest of the packet.
const PACKET_BYTES: usize = 4096;

/// Chunks read ahead of the relay.
const READ_AHEAD_CHUNKS: usize = 2;

/// Reads our stdin until its end; `None` marks end-of-file. Must be called
/// inside a `LocalSet` (a pipe is read by a task of the calling thread).
pub fn read_stdin() -> mpsc::Receiver<Option<OutgoingBytes>> {
    let (chunks, receiver) = mpsc::channel(READ_AHEAD_CHUNKS);
    match PipeReadiness::of_stdin() {
        Some(readiness) => {
            tokio::task::spawn_local(read_pipe_here(readiness, chunks));
        }
        None => read_on_a_thread(chunks, Chunk::default()),
    }
    receiver
}

/// The chunk being filled.
struct Chunk {
    /// Filled into spare capacity: zeroing each fresh buffer first cost
    /// more than the read itself. Laid out to leave as a message segment
    /// of its own, so that a big chunk is not copied into its `write`.
    buf: SegmentBuffer,
    /// Whether our stdin pipe has been grown.
    grown: bool,
}

impl Default for Chunk {
    fn default() -> Self {
        Chunk {
            buf: SegmentBuffer::with_capacity(STDIN_CHUNK),
            grown: false,
        }
    }
}

impl Chunk {
    /// Counts a read of `read` bytes, growing a pipe found full (`grow`
    /// leaves anything but a pipe alone).
    fn took(&mut self, read: usize) {
        if read >= pipe_capacity::DEFAULT_CAPACITY && !self.grown {
            self.grown = true;
            pipe_capacity::grow(0);
        }
    }

    /// Whether to send what was read before reading more: a read into
    /// less than [`PACKET_BYTES`] of room could cut a packet of a pipe in
    /// packet mode (`pipe2(O_DIRECT)`), which loses the rest of it.
    fn is_full(&self) -> bool {
        self.buf.len() + PACKET_BYTES > STDIN_CHUNK
    }

    /// What was read since the last chunk: a small read is copied out and
    /// the buffer kept; a big one leaves as it is, without a copy.
    fn take(&mut self) -> Option<OutgoingBytes> {
        if self.buf.is_empty() {
            return None;
        }
        Some(if self.buf.len() < STDIN_COPY_BELOW {
            let chunk = Bytes::copy_from_slice(self.buf.as_slice());
            self.buf.clear();
            chunk.into()
        } else {
            std::mem::replace(&mut self.buf, SegmentBuffer::with_capacity(STDIN_CHUNK)).freeze()
        })
    }
}

/// fd 0, for epoll.
struct Stdin;

impl AsRawFd for Stdin {
    fn as_raw_fd(&self) -> RawFd {
        0
    }
}

/// Our stdin when it is a pipe, registered with the runtime's epoll.
struct PipeReadiness(AsyncFd<Stdin>);

impl PipeReadiness {
    fn of_stdin() -> Option<PipeReadiness> {
        // SAFETY: fd 0 stays open for the life of the process.
        let stdin = unsafe { BorrowedFd::borrow_raw(0) };
        let stat = rustix::fs::fstat(stdin).ok()?;
        if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::Fifo {
            return None;
        }
        // SAFETY: fd 0 stays open for the life of the process (nothing
        // closes or replaces it), so it outlives the registration.
        unsafe { AsyncFd::register_with_interest(Stdin, Interest::READABLE) }
            .ok()
            .map(PipeReadiness)
    }
}

/// What a read without waiting came to.
enum Read {
    Bytes(usize),
    End,
    /// Nothing there yet (EAGAIN).
    Empty,
    /// The pipe refused the read: a named FIFO does not take RWF_NOWAIT,
    /// nor did pipes on older kernels, and a seccomp filter may refuse
    /// preadv2 itself. The thread's plain reads take over, and report any
    /// error that is the pipe's own.
    Refused(io::Error),
}

/// preadv2(RWF_NOWAIT) of fd 0 into the chunk's spare capacity.
fn read_without_waiting(chunk: &mut Chunk) -> Read {
    let buf = &mut chunk.buf;
    let spare = buf.spare_capacity_mut();
    let iov = libc::iovec {
        iov_base: spare.as_mut_ptr().cast(),
        iov_len: spare.len(),
    };
    loop {
        // SAFETY: the kernel writes at most `iov_len` bytes into the
        // spare capacity `iov` points at, which `buf` owns; an offset of
        // -1 reads at the pipe's current position.
        let read = unsafe { libc::preadv2(0, &iov, 1, -1, libc::RWF_NOWAIT) };
        let Ok(read) = usize::try_from(read) else {
            let error = io::Error::last_os_error();
            return match error.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => Read::Empty,
                _ => Read::Refused(error),
            };
        };
        if read == 0 {
            return Read::End;
        }
        // SAFETY: the kernel initialised `read` bytes of the spare
        // capacity, at most its length.
        unsafe { buf.set_len(buf.len() + read) };
        return Read::Bytes(read);
    }
}

/// Reads the pipe on this thread as it becomes readable. Hands what it has
/// read to a thread that reads on with blocking reads if the pipe refuses
/// a read without waiting, or if epoll can no longer say when to read.
async fn read_pipe_here(readiness: PipeReadiness, chunks: mpsc::Sender<Option<OutgoingBytes>>) {
    let mut chunk = Chunk::default();
    // The last read found the pipe empty: wait before the next.
    let mut drained = false;
    // epoll has reported the pipe's writers all gone.
    let mut hung_up = false;
    let mut ended = false;
    while !ended {
        // However the pipe behaves, the RPC thread's other tasks get
        // their turn.
        tokio::task::consume_budget().await;
        if drained {
            if hung_up {
                // A pipe empty but not ended after its last writer left
                // has been opened for writing again (`exec 3<>/dev/stdin`),
                // and tokio keeps a hang-up for good: `readable` would
                // answer at once for ever, and this loop would spin.
                tracing::debug!("stdin was reopened for writing; reading it on a thread");
                read_on_a_thread(chunks, chunk);
                return;
            }
            // Edge-triggered: the readiness seen is cleared and the pipe
            // read again before waiting for the next edge, so a write
            // that lands in between is never missed.
            match readiness.0.readable().await {
                Ok(mut ready) => {
                    hung_up = ready.ready().is_read_closed();
                    ready.clear_ready();
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot wait for stdin; closing the child's stdin");
                    break;
                }
            }
            drained = false;
        }
        match read_without_waiting(&mut chunk) {
            Read::Bytes(read) => {
                chunk.took(read);
                if !chunk.is_full() {
                    continue;
                }
            }
            Read::Empty => {
                drained = true;
                if chunk.buf.is_empty() {
                    continue;
                }
            }
            Read::End => ended = true,
            Read::Refused(error) => {
                tracing::debug!(%error, "stdin refuses reads without waiting; reading it on a thread");
                read_on_a_thread(chunks, chunk);
                return;
            }
        }
        if let Some(bytes) = chunk.take()
            && chunks.send(Some(bytes)).await.is_err()
        {
            return;
        }
    }
    let _ = chunks.send(None).await;
}

/// Reads our stdin on a thread of its own, with blocking reads, starting
/// with what `chunk` already holds.
fn read_on_a_thread(chunks: mpsc::Sender<Option<OutgoingBytes>>, mut chunk: Chunk) {
    let spawned = std::thread::Builder::new()
        .name("capexec-stdin".into())
        .spawn(move || {
            // SAFETY: fd 0 stays open for the life of the process;
            // ManuallyDrop keeps this File from closing it.
            let stdin = ManuallyDrop::new(unsafe { File::from_raw_fd(0) });
            let mut ended = false;
            while !ended {
                loop {
                    match rustix::io::read(&*stdin, chunk.buf.spare_capacity_mut()) {
                        Ok(([], _)) => {
                            ended = true;
                            break;
                        }
                        Ok((read, _)) => {
                            let read = read.len();
                            // SAFETY: the kernel initialised `read` bytes of
                            // the spare capacity.
                            unsafe { chunk.buf.set_len(chunk.buf.len() + read) };
                            chunk.took(read);
                        }
                        Err(rustix::io::Errno::INTR) => continue,
                        Err(errno) => {
                            let error = io::Error::from(errno);
                            tracing::warn!(%error, "reading stdin failed; closing the child's stdin");
                            ended = true;
                            break;
                        }
                    }
                    if chunk.is_full() || waiting_bytes(0) == 0 {
                        break;
                    }
                }
                if let Some(bytes) = chunk.take()
                    && chunks.blocking_send(Some(bytes)).is_err()
                {
                    return;
                }
            }
            let _ = chunks.blocking_send(None);
        });
    if let Err(error) = spawned {
        tracing::error!(%error, "cannot start the stdin thread");
    }
}

/// Bytes that a read of `fd` would return at once (FIONREAD); 0 when none
/// or when `fd` cannot tell (a regular file: the next read then decides).
fn waiting_bytes(fd: i32) -> usize {
    let mut waiting: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int into `waiting`.
    if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut waiting) } < 0 {
        return 0;
    }
    usize::try_from(waiting).unwrap_or(0)
}
