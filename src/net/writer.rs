//! The socket end of capnp's write queue: a buffer that coalesces a
//! frame's segment table and small segments into one write(2), grows only
//! as far as the messages written need (an idle connection holds a few
//! hundred bytes, not a fixed 64 KiB), and counts the bytes taken, so the
//! call guard knows which queued answers have left the process.

use std::cell::Cell;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, ready};

use tokio::io::AsyncWrite;

/// Writes of this size or more go to the socket without a copy; smaller
/// ones are gathered up to it.
pub(crate) const COALESCE_BYTES: usize = 64 * 1024;

pub(crate) struct FrameWriter<W> {
    output: W,
    buffer: Vec<u8>,
    /// Bytes of `buffer` already written.
    written: usize,
    /// Bytes taken from the write queue so far.
    taken: Rc<Cell<u64>>,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    pub fn new(output: W, taken: Rc<Cell<u64>>) -> FrameWriter<W> {
        FrameWriter {
            output,
            buffer: Vec::new(),
            written: 0,
            taken,
        }
    }

    fn take(&mut self, count: usize) {
        self.taken.set(self.taken.get() + count as u64);
    }

    fn poll_write_buffer(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buffer.len() {
            let written =
                ready!(Pin::new(&mut self.output).poll_write(cx, &self.buffer[self.written..]))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += written;
        }
        self.buffer.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<W: AsyncWrite + Unpin> futures::io::AsyncWrite for FrameWriter<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if data.len() < COALESCE_BYTES {
            if this.buffer.len() + data.len() > COALESCE_BYTES {
                ready!(this.poll_write_buffer(cx))?;
            }
            this.buffer.extend_from_slice(data);
            this.take(data.len());
            return Poll::Ready(Ok(data.len()));
        }
        // A big segment: whatever is buffered (its table, usually) goes out
        // with it in one system call.
        loop {
            let pending = &this.buffer[this.written..];
            if pending.is_empty() {
                let written = ready!(Pin::new(&mut this.output).poll_write(cx, data))?;
                this.take(written);
                return Poll::Ready(Ok(written));
            }
            let slices = [IoSlice::new(pending), IoSlice::new(data)];
            let written = ready!(Pin::new(&mut this.output).poll_write_vectored(cx, &slices))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            if written < pending.len() {
                this.written += written;
                continue;
            }
            let of_data = written - pending.len();
            this.buffer.clear();
            this.written = 0;
            if of_data > 0 {
                this.take(of_data);
                return Poll::Ready(Ok(of_data));
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_write_buffer(cx))?;
        Pin::new(&mut this.output).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_write_buffer(cx))?;
        Pin::new(&mut this.output).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::AsyncWriteExt;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn small_and_big_writes_arrive_in_order_and_are_counted() {
        let (output, mut input) = tokio::io::duplex(1 << 20);
        let taken = Rc::new(Cell::new(0));
        let mut writer = FrameWriter::new(output, Rc::clone(&taken));
        let big: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
        writer.write_all(b"table!!!").await.unwrap();
        writer.write_all(&big).await.unwrap();
        writer.write_all(b"small").await.unwrap();
        assert_eq!(taken.get(), 8 + 300_000 + 5);
        assert!(
            writer.buffer.capacity() < 1024,
            "grew for small writes only"
        );
        writer.flush().await.unwrap();
        writer.close().await.unwrap();
        let mut received = Vec::new();
        input.read_to_end(&mut received).await.unwrap();
        let mut expected = b"table!!!".to_vec();
        expected.extend(&big);
        expected.extend(b"small");
        assert_eq!(received, expected);
    }
}
