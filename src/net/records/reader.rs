//! The receiving half: reads the socket in large reads, opens each record
//! straight into the caller's buffer when it has room for it (one pass that
//! decrypts and copies) and in place otherwise, and answers the records
//! that are not data: alerts, session tickets, key updates.
//!
//! The buffer follows the traffic: allocated on the first read at one
//! record's size, doubled
//! whenever a read fills it, up to [`MAX_BYTES`], and let go once drained
//! after a read that brought less than a record, so an idle connection
//! holds none.

use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, ReadBuf};

use super::keys::Keys;
use super::protection::{
    ALERT, APPLICATION_DATA, HANDSHAKE, HEADER, MAX_BODY, Protection, Version, broken,
};

/// The first buffer: one whole record of the longest kind.
const MIN_BYTES: usize = HEADER + MAX_BODY;
/// The most a busy connection reads at once (four records, and room for
/// one more to finish): what a thousand connections may hold is bounded.
pub(crate) const MAX_BYTES: usize = 64 * 1024 + MIN_BYTES;
/// The longest post-handshake message taken (a session ticket is a few
/// hundred bytes; a KeyUpdate one).
const MAX_HANDSHAKE_MESSAGE: usize = 64 * 1024;

const KEY_UPDATE: u8 = 24;
const NEW_SESSION_TICKET: u8 = 4;
const CLOSE_NOTIFY: u8 = 0;
const USER_CANCELED: u8 = 90;

pub(crate) struct RecordReader<R> {
    socket: R,
    protection: Protection,
    keys: Arc<Keys>,
    buffer: Vec<u8>,
    /// `buffer[start..end]` is read and not yet opened.
    start: usize,
    end: usize,
    /// Content opened in place and not yet handed on.
    opened: Range<usize>,
    /// Content rustls opened during the handshake, handed on first.
    early: Vec<u8>,
    /// A post-handshake message begun and not yet whole.
    handshake: Vec<u8>,
    /// The size of the next buffer allocated.
    next: usize,
    /// Whether the buffer is kept once drained.
    keep: bool,
    /// The peer's close_notify arrived: the end of its data.
    closed: bool,
}

impl<R> RecordReader<R> {
    /// The reader over `socket`, with `leftover` (read past the handshake)
    /// still to open and `early` (data rustls opened) to hand on first.
    pub(crate) fn new(
        socket: R,
        protection: Protection,
        keys: Arc<Keys>,
        leftover: Vec<u8>,
        early: Vec<u8>,
    ) -> RecordReader<R> {
        let end = leftover.len();
        RecordReader {
            socket,
            protection,
            keys,
            buffer: leftover,
            start: 0,
            end,
            opened: 0..0,
            early,
            handshake: Vec::new(),
            next: MIN_BYTES,
            keep: false,
            closed: false,
        }
    }

    /// The length of the whole record at `start`, if all of it is here; an
    /// error for a header no TLS peer sends.
    fn whole_record(&self) -> io::Result<Option<usize>> {
        let held = &self.buffer[self.start..self.end];
        if held.len() < HEADER {
            return Ok(None);
        }
        if held[1] != 3 {
            return Err(broken("the peer sent a record that is not TLS"));
        }
        let length = usize::from(u16::from_be_bytes([held[3], held[4]]));
        if length > MAX_BODY {
            return Err(broken("the peer sent a record longer than TLS allows"));
        }
        Ok((held.len() >= HEADER + length).then_some(HEADER + length))
    }

    /// A record that is not data, opened: its content taken in.
    fn take_in(&mut self, kind: u8, content: &[u8]) -> io::Result<()> {
        match kind {
            ALERT => self.alert(content),
            HANDSHAKE => self.post_handshake(content),
            other => Err(broken(format!(
                "the peer sent a record of type {other} after the handshake"
            ))),
        }
    }

    fn alert(&mut self, content: &[u8]) -> io::Result<()> {
        let &[level, description] = content else {
            return Err(broken("the peer sent a malformed alert"));
        };
        match description {
            CLOSE_NOTIFY => {
                self.closed = true;
                Ok(())
            }
            USER_CANCELED => Ok(()),
            // TLS 1.2's warnings other than these say nothing to act on.
            _ if level == 1 && self.keys.version() == Version::Tls12 => Ok(()),
            _ => Err(broken(format!(
                "the peer ended the connection with alert {description} ({})",
                rustls::AlertDescription::from(description)
                    .as_str()
                    .unwrap_or("unknown")
            ))),
        }
    }

    /// Session tickets and key updates, which may be split across records
    /// or share one.
    fn post_handshake(&mut self, content: &[u8]) -> io::Result<()> {
        if self.keys.version() == Version::Tls12 {
            return Err(broken(
                "the peer asked to renegotiate, which capexec does not",
            ));
        }
        if self.handshake.len() + content.len() > MAX_HANDSHAKE_MESSAGE {
            return Err(broken(
                "the peer sent a handshake message longer than 64 KiB",
            ));
        }
        self.handshake.extend_from_slice(content);
        let mut at = 0;
        while let [kind, a, b, c, ..] = self.handshake[at..] {
            let length = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
            let Some(message) = self.handshake.get(at + 4..at + 4 + length) else {
                break;
            };
            match kind {
                NEW_SESSION_TICKET => self.keys.take_ticket(message)?,
                KEY_UPDATE => {
                    let &[requested @ (0 | 1)] = message else {
                        return Err(broken("the peer sent a malformed KeyUpdate"));
                    };
                    // RFC 8446 5.1: the next record is under the new key,
                    // so nothing may follow it in this one.
                    if at + 4 + length != self.handshake.len() {
                        return Err(broken(
                            "the peer's KeyUpdate was not at the end of its record",
                        ));
                    }
                    self.protection = self.keys.next_receiving()?;
                    if requested == 1 {
                        self.keys.request_update();
                    }
                }
                other => {
                    return Err(broken(format!(
                        "the peer sent handshake message {other} after the handshake"
                    )));
                }
            }
            at += 4 + length;
        }
        self.handshake.drain(..at);
        Ok(())
    }

    /// Room to read more into: a drained buffer let go if the traffic is
    /// small, the unread bytes (part of one record) moved to the front, the
    /// buffer allocated or grown as the traffic asks.
    fn make_room(&mut self) {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if !self.keep {
                self.buffer = Vec::new();
            }
        } else if self.start > 0 && self.buffer.len() - self.end < MIN_BYTES {
            self.buffer.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buffer.len() == self.end {
            let size = self.next.max(self.end + MIN_BYTES);
            self.buffer.resize(size, 0);
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for RecordReader<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if !this.early.is_empty() {
            let count = out.remaining().min(this.early.len());
            out.put_slice(&this.early[..count]);
            this.early.drain(..count);
            return Poll::Ready(Ok(()));
        }
        loop {
            if !this.opened.is_empty() {
                let count = out.remaining().min(this.opened.len());
                out.put_slice(&this.buffer[this.opened.start..this.opened.start + count]);
                this.opened.start += count;
                return Poll::Ready(Ok(()));
            }
            if this.closed {
                return Poll::Ready(Ok(()));
            }
            if let Some(length) = this.whole_record()? {
                let record = this.start..this.start + length;
                this.start = record.end;
                let (_, plaintext) = this.protection.plaintext_of(length - HEADER)?;
                if this.buffer[record.start] == APPLICATION_DATA && out.remaining() >= plaintext {
                    // SAFETY: only written to, by the opening, which
                    // initialises what it writes (and `assume_init` covers
                    // no more than that); nothing here de-initialises.
                    let room = unsafe { out.unfilled_mut() };
                    let (kind, content) = this.protection.open_into(&this.buffer[record], room)?;
                    let length = content.len();
                    if kind == APPLICATION_DATA && this.handshake.is_empty() {
                        // SAFETY: the opening initialised these bytes.
                        unsafe { out.assume_init(length) };
                        out.advance(length);
                        if length > 0 {
                            return Poll::Ready(Ok(()));
                        }
                    } else {
                        let content = content.to_vec();
                        this.take_in(kind, &content)?;
                    }
                } else {
                    let (kind, content) = this
                        .protection
                        .open_in_place(&mut this.buffer[record.clone()])?;
                    let content = record.start + content.start..record.start + content.end;
                    if kind == APPLICATION_DATA && this.handshake.is_empty() {
                        this.opened = content;
                    } else {
                        let content = this.buffer[content].to_vec();
                        this.take_in(kind, &content)?;
                    }
                }
                continue;
            }
            this.make_room();
            let mut room = ReadBuf::new(&mut this.buffer[this.end..]);
            ready!(Pin::new(&mut this.socket).poll_read(cx, &mut room))?;
            let read = room.filled().len();
            if read == 0 {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    if this.start == this.end {
                        "TLS: the peer closed the connection without close_notify"
                    } else {
                        "TLS: the peer closed the connection inside a record"
                    },
                )));
            }
            this.end += read;
            // Doubled after a read that filled it; let go once drained
            // after one that brought less than a record.
            if this.end == this.buffer.len() {
                this.next = (this.buffer.len() * 2).min(MAX_BYTES);
                this.keep = true;
            } else if read < MIN_BYTES {
                this.next = MIN_BYTES;
                this.keep = false;
            }
        }
    }
}
