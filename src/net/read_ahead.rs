//! The socket under a TLS session, read ahead: rustls reads its transport
//! into at most 4 KiB of free buffer beyond what it holds (`read_tls`), so
//! without a buffer in between bulk traffic costs about one recv(2) and
//! one pass through the record layer per 16 KiB record (9,609 recvfrom
//! calls for 128 MiB, docs/PROFILES.md). Read through [`ReadAhead`], a
//! busy connection takes up to [`MAX_BYTES`] per recv(2) (1,533 calls for
//! the same 128 MiB at 256 KiB) and rustls is served from memory.
//!
//! The buffer follows the traffic: it is allocated on the first read,
//! doubles (from [`MIN_BYTES`]) whenever a recv(2) fills it, and is let go
//! once drained after a recv(2) that brought little, so an idle or
//! chatty connection holds no buffer between its messages.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The first buffer: one full TLS record and its header.
pub(crate) const MIN_BYTES: usize = 16 * 1024 + 256;

/// The biggest buffer: what a busy connection takes per recv(2). 64 KiB
/// keeps most of the gain (four records a call) while a thousand busy
/// connections, logged in or not, hold at most 64 MiB of it.
pub(crate) const MAX_BYTES: usize = 64 * 1024;

pub(crate) struct ReadAhead<S> {
    inner: S,
    buffer: Vec<u8>,
    /// `buffer[start..end]` is read and not yet handed on.
    start: usize,
    end: usize,
    /// The size of the next buffer allocated.
    next: usize,
    /// Whether the buffer is kept once drained: the last recv(2) brought
    /// enough, and the next wants the same size.
    keep: bool,
}

impl<S> ReadAhead<S> {
    pub(crate) fn new(inner: S) -> ReadAhead<S> {
        ReadAhead {
            inner,
            buffer: Vec::new(),
            start: 0,
            end: 0,
            next: MIN_BYTES,
            keep: false,
        }
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        self.buffer.len()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ReadAhead<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.start == this.end {
            if out.remaining() >= this.next {
                // A reader that asks for as much as the buffer would hold
                // gets it directly.
                return Pin::new(&mut this.inner).poll_read(cx, out);
            }
            if this.buffer.is_empty() {
                this.buffer = vec![0; this.next];
            }
            let mut fill = ReadBuf::new(&mut this.buffer);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut fill))?;
            let read = fill.filled().len();
            this.start = 0;
            this.end = read;
            if read == this.buffer.len() && this.next < MAX_BYTES {
                // Full: the next buffer is twice the size. This one is
                // kept until drained.
                this.next = (this.next * 2).min(MAX_BYTES);
            } else if read < this.buffer.len() / 4 {
                // Little came: the traffic is light, so is the next buffer.
                this.next = MIN_BYTES;
            }
            this.keep = read >= this.buffer.len() / 4 && this.buffer.len() == this.next;
            if read == 0 {
                this.buffer = Vec::new();
                return Poll::Ready(Ok(()));
            }
        }
        let handed = out.remaining().min(this.end - this.start);
        out.put_slice(&this.buffer[this.start..this.start + handed]);
        this.start += handed;
        if this.start == this.end {
            this.start = 0;
            this.end = 0;
            if !this.keep {
                // Drained, and the next read wants another size (bigger
                // for a busy connection), or little came (a light one).
                this.buffer = Vec::new();
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ReadAhead<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        slices: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, slices)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Every byte arrives in order through 4 KiB reads; a busy stream
    /// grows the buffer to its bound, and a drained quiet one holds none.
    #[tokio::test]
    async fn small_reads_see_every_byte_and_the_buffer_follows_the_traffic() {
        let (mut far, near) = tokio::io::duplex(1 << 20);
        let sent: Vec<u8> = (0..(3 << 20) as u32).map(|i| (i % 251) as u8).collect();
        let writer = {
            let sent = sent.clone();
            tokio::spawn(async move {
                far.write_all(&sent).await.unwrap();
                far.write_all(b"end").await.unwrap();
                far
            })
        };
        let mut reader = ReadAhead::new(near);
        let mut received = Vec::new();
        let mut chunk = [0u8; 4096];
        let mut biggest = 0;
        while received.len() < sent.len() + 3 {
            let read = reader.read(&mut chunk).await.unwrap();
            assert!(read > 0);
            received.extend_from_slice(&chunk[..read]);
            biggest = biggest.max(reader.held());
        }
        assert_eq!(&received[..sent.len()], &sent[..]);
        assert_eq!(&received[sent.len()..], b"end");
        assert_eq!(biggest, MAX_BYTES);
        assert_eq!(reader.held(), 0, "drained after a short read");
        let far = writer.await.unwrap();
        drop(far);
        assert_eq!(reader.read(&mut chunk).await.unwrap(), 0);
        assert_eq!(reader.held(), 0);
    }

    /// A reader asking for more than the buffer would hold reads directly.
    #[tokio::test]
    async fn big_reads_go_straight_through() {
        let (mut far, near) = tokio::io::duplex(1 << 20);
        far.write_all(&[7u8; 100_000]).await.unwrap();
        let mut reader = ReadAhead::new(near);
        let mut big = vec![0u8; 100_000];
        let read = reader.read(&mut big).await.unwrap();
        assert_eq!(read, 100_000);
        assert!(big.iter().all(|&b| b == 7));
        assert_eq!(reader.held(), 0);
    }
}
