//! The sending half: seals what it is given into records of at most 16 KiB
//! (a whole record in one slice sealed straight from it into the outgoing
//! buffer, in one pass; the rest copied into their record and sealed in
//! place, as rustls's writer does), up to [`BATCH`] at a call, and writes them out before it
//! takes more. Sends a KeyUpdate when the peer asked for one and before
//! its key has sealed as many records as its cipher allows, close_notify
//! at shutdown, and, once the reader has refused the peer's records, the
//! fatal alert that says why in place of anything more.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use tokio::io::AsyncWrite;

use super::keys::Keys;
use super::protection::{
    ALERT, APPLICATION_DATA, Ending, HANDSHAKE, MAX_CONTENT, Protection, Version, broken,
};

/// An alert's level: fatal.
const FATAL: u8 = 2;

/// The most content sealed at one call: four records, one write(2). What
/// the caller counts as sent may be this much ahead of the socket (as much
/// as rustls's writer held).
const BATCH: usize = 4 * MAX_CONTENT;

pub(crate) struct RecordWriter<W> {
    socket: W,
    protection: Protection,
    keys: Arc<Keys>,
    /// Sealed records; `sealed[written..]` not yet written.
    sealed: Vec<u8>,
    written: usize,
    /// close_notify is sealed: nothing more may be.
    closing: bool,
    /// KeyUpdates sent.
    updates: u64,
    /// A seal failed: what was sealed before it is written, nothing after.
    failed: bool,
    /// The socket failed a write: every later call says so.
    broken: Option<(io::ErrorKind, String)>,
    /// The reader ended the connection: nothing more is sealed, saying
    /// why.
    ended: Option<&'static str>,
}

impl<W> RecordWriter<W> {
    pub(crate) fn new(socket: W, protection: Protection, keys: Arc<Keys>) -> RecordWriter<W> {
        RecordWriter {
            socket,
            protection,
            keys,
            sealed: Vec::new(),
            written: 0,
            closing: false,
            updates: 0,
            failed: false,
            broken: None,
            ended: None,
        }
    }

    /// KeyUpdates this side has sent.
    #[cfg(test)]
    pub(crate) fn updates(&self) -> u64 {
        self.updates
    }

    /// Seals `content` as one record of type `kind`, as a hostile peer
    /// might.
    #[cfg(test)]
    pub(crate) fn seal_raw(&mut self, kind: u8, content: &[u8]) -> io::Result<()> {
        let start = self.protection.begin(&mut self.sealed);
        self.sealed.extend_from_slice(content);
        self.protection.seal(&mut self.sealed, start, kind)
    }

    /// Flips a bit of the last record's tag, as a hostile peer might.
    #[cfg(test)]
    pub(crate) fn corrupt_last(&mut self) {
        if let Some(byte) = self.sealed.last_mut() {
            *byte ^= 1;
        }
    }

    #[cfg(test)]
    pub(crate) fn keys(&self) -> &Keys {
        &self.keys
    }

    /// A KeyUpdate, sealed under the current key, and the next key for
    /// what follows: when the peer asked (RFC 8446 4.6.3), and before the
    /// current key reaches its limit. TLS 1.2 has no way to update keys.
    fn update_keys_if_due(&mut self) -> io::Result<()> {
        let asked = self.keys.take_update_request();
        let worn = self.protection.seq() >= self.keys.limit();
        if !asked && !worn {
            return Ok(());
        }
        if self.keys.version() == Version::Tls12 {
            return Err(broken(
                "the connection has sealed as many records as its cipher allows, and TLS 1.2 \
                 cannot update its keys",
            ));
        }
        let start = self.protection.begin(&mut self.sealed);
        // KeyUpdate, 1 byte long: update_not_requested.
        self.sealed.extend_from_slice(&[24, 0, 0, 1, 0]);
        self.protection.seal(&mut self.sealed, start, HANDSHAKE)?;
        self.protection = self.keys.next_sending()?;
        self.updates += 1;
        Ok(())
    }

    /// Once the reader has ended the connection, nothing more is sealed
    /// (RFC 8446 6.2): after refusing the peer's records, but for the
    /// fatal alert that says why, sealed after what is sealed already;
    /// after the peer's own fatal alert, nothing at all, not even
    /// close_notify.
    fn follow_the_reader(&mut self) {
        let Some(ending) = self.keys.take_ending() else {
            return;
        };
        self.ended = Some(match ending {
            Ending::Alert(alert) => {
                if !self.failed && !self.closing {
                    let start = self.protection.begin(&mut self.sealed);
                    self.sealed.extend_from_slice(&[FATAL, u8::from(alert)]);
                    if self
                        .protection
                        .seal(&mut self.sealed, start, ALERT)
                        .is_err()
                    {
                        self.sealed.truncate(start);
                    }
                }
                "TLS: the connection ended when the peer's records were refused"
            }
            Ending::Silent => "TLS: the peer ended the connection with an alert",
        });
        self.closing = true;
    }

    /// Seals up to [`BATCH`] bytes of `slices` into records: how many. On
    /// an error nothing of this call's is left to be written (its content
    /// would go out in clear), and no later call seals.
    fn seal(&mut self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        if let Some(why) = self.ended {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, why));
        }
        if self.failed {
            return Err(broken("a record could not be sealed earlier"));
        }
        let before = self.sealed.len();
        let sealed = self.seal_records(slices);
        if sealed.is_err() {
            self.sealed.truncate(before);
            self.failed = true;
        }
        sealed
    }

    fn seal_records(&mut self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        if self.closing {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "TLS: written after close_notify",
            ));
        }
        self.update_keys_if_due()?;
        let mut taken = 0;
        let mut record: Option<(usize, usize)> = None;
        for slice in slices {
            let mut rest: &[u8] = slice;
            while !rest.is_empty() && taken < BATCH {
                // A whole record in this slice: sealed straight from it.
                if record.is_none() && rest.len() >= MAX_CONTENT && BATCH - taken >= MAX_CONTENT {
                    let (content, after) = rest.split_at(MAX_CONTENT);
                    self.protection
                        .seal_from(&mut self.sealed, content, APPLICATION_DATA)?;
                    rest = after;
                    taken += MAX_CONTENT;
                    continue;
                }
                let (start, held) = match record {
                    Some(open) => open,
                    None => (self.protection.begin(&mut self.sealed), 0),
                };
                let count = rest.len().min(MAX_CONTENT - held).min(BATCH - taken);
                self.sealed.extend_from_slice(&rest[..count]);
                rest = &rest[count..];
                taken += count;
                if held + count == MAX_CONTENT {
                    self.protection
                        .seal(&mut self.sealed, start, APPLICATION_DATA)?;
                    record = None;
                } else {
                    record = Some((start, held + count));
                }
            }
        }
        if let Some((start, _)) = record {
            self.protection
                .seal(&mut self.sealed, start, APPLICATION_DATA)?;
        }
        Ok(taken)
    }
}

impl<W: AsyncWrite + Unpin> RecordWriter<W> {
    /// Writes out every sealed record.
    fn poll_written(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some((kind, why)) = &self.broken {
            return Poll::Ready(Err(io::Error::new(*kind, why.clone())));
        }
        if self.sealed.is_empty() {
            return Poll::Ready(Ok(()));
        }
        while self.written < self.sealed.len() {
            let count =
                ready!(Pin::new(&mut self.socket).poll_write(cx, &self.sealed[self.written..]))?;
            if count == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += count;
        }
        // A full batch's buffer is kept for the next (a busy connection);
        // after a smaller one, let go, so an idle connection holds none.
        if self.sealed.len() < BATCH {
            self.sealed = Vec::new();
        } else {
            self.sealed.clear();
        }
        self.written = 0;
        Poll::Ready(Ok(()))
    }

    fn poll_sealed(
        &mut self,
        cx: &mut Context<'_>,
        slices: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.follow_the_reader();
        ready!(self.poll_written(cx))?;
        let taken = self.seal(slices)?;
        // Start the write now; what the socket does not take yet is
        // written before the next batch is sealed, or at a flush. The
        // batch is taken either way: an error of the socket's is kept for
        // the next call, since a caller told that nothing was taken would
        // give the same bytes again, and they would go out twice.
        if let Poll::Ready(Err(error)) = self.poll_written(cx) {
            self.broken = Some((error.kind(), error.to_string()));
        }
        Poll::Ready(Ok(taken))
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for RecordWriter<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_sealed(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        slices: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_sealed(cx, slices)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.follow_the_reader();
        ready!(this.poll_written(cx))?;
        Pin::new(&mut this.socket).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.follow_the_reader();
        if !this.closing {
            ready!(this.poll_written(cx))?;
            if !this.failed {
                let start = this.protection.begin(&mut this.sealed);
                // close_notify, a warning.
                this.sealed.extend_from_slice(&[1, 0]);
                if let Err(error) = this.protection.seal(&mut this.sealed, start, ALERT) {
                    this.sealed.truncate(start);
                    this.failed = true;
                    return Poll::Ready(Err(error));
                }
            }
            this.closing = true;
        }
        ready!(this.poll_written(cx))?;
        Pin::new(&mut this.socket).poll_shutdown(cx)
    }
}
