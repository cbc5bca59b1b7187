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

use rustls::AlertDescription;
use tokio::io::{AsyncRead, ReadBuf};

use super::keys::Keys;
use super::protection::{
    ALERT, APPLICATION_DATA, ENDED, Ending, HANDSHAKE, HEADER, MAX_BODY, MAX_BODY_TLS13,
    Protection, Version, ended_by_peer, ending_for, refused,
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
const WARNING: u8 = 1;
const FATAL: u8 = 2;
/// Records in a row with no data a peer may send (rustls allows 32 empty
/// ones, and as many KeyUpdates).
const MAX_QUIET: u32 = 32;
/// The stack buffer an idle connection reads into.
const STACK_BYTES: usize = 4096;

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
    /// Records in a row that carried no data.
    quiet: u32,
    /// Why the connection ended, for every read after.
    failed: Option<(io::ErrorKind, String)>,
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
            quiet: 0,
            failed: None,
            closed: false,
        }
    }

    /// The bytes of buffer held.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.buffer.len()
    }

    /// What the reader holds once a read of nothing has come back
    /// pending: polls once.
    #[cfg(test)]
    pub(crate) async fn poll_held_while_waiting(&mut self) -> usize
    where
        R: AsyncRead + Unpin,
    {
        let mut byte = [0];
        let mut out = ReadBuf::new(&mut byte);
        let pending = std::future::poll_fn(|cx| {
            Poll::Ready(Pin::new(&mut *self).poll_read(cx, &mut out).is_pending())
        })
        .await;
        assert!(pending, "there was something to read");
        self.held()
    }

    /// The length of the whole record at `start`, if all of it is here; an
    /// error for a header no TLS peer sends.
    fn whole_record(&self) -> io::Result<Option<usize>> {
        let held = &self.buffer[self.start..self.end];
        if held.len() < HEADER {
            return Ok(None);
        }
        if held[1] != 3 {
            return Err(refused(
                AlertDescription::DecodeError,
                "the peer sent a record that is not TLS",
            ));
        }
        let length = usize::from(u16::from_be_bytes([held[3], held[4]]));
        let most = match self.keys.version() {
            Version::Tls13 => MAX_BODY_TLS13,
            Version::Tls12 => MAX_BODY,
        };
        if length > most {
            return Err(refused(
                AlertDescription::RecordOverflow,
                "the peer sent a record longer than TLS allows",
            ));
        }
        Ok((held.len() >= HEADER + length).then_some(HEADER + length))
    }

    /// A record that is not data, opened: its content taken in.
    fn take_in(&mut self, kind: u8, content: &[u8]) -> io::Result<()> {
        // An alert first: the peer's close_notify or fatal alert is its end
        // whatever came before it (half a handshake message, a run of
        // records without data), and a fatal one is not answered.
        if kind == ALERT {
            self.alert(content)?;
            if self.closed {
                return Ok(());
            }
        }
        if kind != HANDSHAKE && !self.handshake.is_empty() {
            return Err(refused(
                AlertDescription::UnexpectedMessage,
                "the peer sent another record inside a handshake message",
            ));
        }
        self.quiet()?;
        match kind {
            ALERT => Ok(()),
            // RFC 8446 5.1, RFC 5246 6.2.1: no handshake record is empty.
            HANDSHAKE if content.is_empty() => Err(refused(
                AlertDescription::UnexpectedMessage,
                "the peer sent an empty handshake record",
            )),
            HANDSHAKE => self.post_handshake(content),
            other => Err(refused(
                AlertDescription::UnexpectedMessage,
                format!("the peer sent a record of type {other} after the handshake"),
            )),
        }
    }

    fn alert(&mut self, content: &[u8]) -> io::Result<()> {
        let &[level, description] = content else {
            return Err(refused(
                AlertDescription::DecodeError,
                "the peer sent a malformed alert",
            ));
        };
        match (level, description) {
            (WARNING, CLOSE_NOTIFY) => {
                self.closed = true;
                Ok(())
            }
            (WARNING, USER_CANCELED) => Ok(()),
            // TLS 1.2's other warnings say nothing to act on; TLS 1.3 has
            // none.
            (WARNING, _) if self.keys.version() == Version::Tls12 => Ok(()),
            (WARNING | FATAL, _) => Err(ended_by_peer(format!(
                "the peer ended the connection with alert {description} ({:?})",
                rustls::AlertDescription::from(description)
            ))),
            _ => Err(refused(
                AlertDescription::IllegalParameter,
                format!("the peer sent an alert of level {level}"),
            )),
        }
    }

    /// Session tickets and key updates, which may be split across records
    /// or share one.
    fn post_handshake(&mut self, content: &[u8]) -> io::Result<()> {
        if self.keys.version() == Version::Tls12 {
            return self.hello_requests(content);
        }
        if self.handshake.len() + content.len() > MAX_HANDSHAKE_MESSAGE {
            return Err(refused(
                AlertDescription::UnexpectedMessage,
                "the peer sent a handshake message longer than 64 KiB",
            ));
        }
        self.handshake.extend_from_slice(content);
        let mut at = 0;
        while let [kind, a, b, c, ..] = self.handshake[at..] {
            let length = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
            // Refused on its header, before any of it is held: what a peer
            // may send here is short (a KeyUpdate is one byte, a ticket a
            // few hundred), and a client sends no tickets.
            match kind {
                KEY_UPDATE if length != 1 => {
                    return Err(refused(
                        AlertDescription::DecodeError,
                        "the peer sent a malformed KeyUpdate",
                    ));
                }
                NEW_SESSION_TICKET if !self.keys.is_client() => {
                    return Err(refused(
                        AlertDescription::UnexpectedMessage,
                        "the client sent a session ticket",
                    ));
                }
                KEY_UPDATE | NEW_SESSION_TICKET => {}
                other => {
                    return Err(refused(
                        AlertDescription::UnexpectedMessage,
                        format!("the peer sent handshake message {other} after the handshake"),
                    ));
                }
            }
            let Some(message) = self.handshake.get(at + 4..at + 4 + length) else {
                break;
            };
            match kind {
                NEW_SESSION_TICKET => self.keys.take_ticket(message)?,
                KEY_UPDATE => {
                    let &[requested @ (0 | 1)] = message else {
                        return Err(refused(
                            AlertDescription::DecodeError,
                            "the peer sent a malformed KeyUpdate",
                        ));
                    };
                    // RFC 8446 5.1: the next record is under the new key,
                    // so nothing may follow it in this one.
                    if at + 4 + length != self.handshake.len() {
                        return Err(refused(
                            AlertDescription::UnexpectedMessage,
                            "the peer's KeyUpdate was not at the end of its record",
                        ));
                    }
                    self.protection = self.keys.next_receiving()?;
                    if requested == 1 {
                        self.keys.request_update();
                    }
                }
                other => {
                    return Err(refused(
                        AlertDescription::UnexpectedMessage,
                        format!("the peer sent handshake message {other} after the handshake"),
                    ));
                }
            }
            at += 4 + length;
        }
        self.handshake.drain(..at);
        if self.handshake.is_empty() {
            self.handshake = Vec::new();
        }
        Ok(())
    }

    /// TLS 1.2's only message a peer may send after the handshake: a
    /// server's HelloRequest (type 0, length 0: four zero bytes), asking
    /// for a renegotiation, which a client may decline by ignoring it (RFC
    /// 5246 7.4.1.1), as capexec does. Anything else asks to renegotiate.
    fn hello_requests(&mut self, content: &[u8]) -> io::Result<()> {
        if !self.keys.is_client() || content.iter().any(|&byte| byte != 0) {
            return Err(refused(
                AlertDescription::UnexpectedMessage,
                "the peer asked to renegotiate, which capexec does not",
            ));
        }
        // Only what is left of a request split across records is kept.
        let held = (self.handshake.len() + content.len()) % 4;
        self.handshake = vec![0; held];
        Ok(())
    }

    /// Room to read more into: the unread bytes (part of one record) moved
    /// to the front, the buffer grown to the size the traffic asks for.
    /// `None` when nothing is held and the traffic is light: the next read
    /// goes to the stack first, so that an idle connection holds no buffer
    /// while it waits.
    fn make_room(&mut self) -> bool {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.next == MIN_BYTES {
                self.buffer = Vec::new();
                return false;
            }
            if self.buffer.len() != self.next {
                self.buffer = vec![0; self.next];
            }
        } else if self.next == MIN_BYTES && self.buffer.len() > MIN_BYTES {
            // Light traffic after busy, part of a record held: into a
            // buffer of one record's size, which that part fits (a peer
            // that stops mid-record keeps no more than that).
            let mut smaller = vec![0; MIN_BYTES];
            let held = self.end - self.start;
            smaller[..held].copy_from_slice(&self.buffer[self.start..self.end]);
            (self.buffer, self.start, self.end) = (smaller, 0, held);
        } else if self.buffer.len() - self.end < MIN_BYTES {
            self.buffer.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            let size = self.next.max(self.end + MIN_BYTES);
            if self.buffer.len() < size {
                self.buffer.resize(size, 0);
            }
        }
        true
    }

    /// The next bytes from the socket into the buffer: how many (0 at its
    /// end).
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>>
    where
        R: AsyncRead + Unpin,
    {
        let read = match self.make_room() {
            true => {
                let room = &mut self.buffer[self.end..];
                let free = room.len();
                let mut room = ReadBuf::new(room);
                ready!(Pin::new(&mut self.socket).poll_read(cx, &mut room))?;
                let read = room.filled().len();
                // Busy: the next buffer is twice the size; light: one
                // record's, given up once drained.
                if read == free {
                    self.next = (self.buffer.len() * 2).min(MAX_BYTES);
                } else if read < MIN_BYTES / 4 {
                    self.next = MIN_BYTES;
                }
                read
            }
            false => {
                let mut stack = [0; STACK_BYTES];
                let mut room = ReadBuf::new(&mut stack);
                ready!(Pin::new(&mut self.socket).poll_read(cx, &mut room))?;
                let read = room.filled().len();
                if read == STACK_BYTES {
                    self.next = MIN_BYTES * 2;
                }
                self.buffer = vec![0; MIN_BYTES];
                self.buffer[..read].copy_from_slice(room.filled());
                read
            }
        };
        self.end += read;
        Poll::Ready(Ok(read))
    }

    fn poll_open(&mut self, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>>
    where
        R: AsyncRead + Unpin,
    {
        loop {
            if !self.opened.is_empty() {
                let count = out.remaining().min(self.opened.len());
                out.put_slice(&self.buffer[self.opened.start..self.opened.start + count]);
                self.opened.start += count;
                return Poll::Ready(Ok(()));
            }
            if self.closed {
                return Poll::Ready(Ok(()));
            }
            if let Some(length) = self.whole_record()? {
                let record = self.start..self.start + length;
                self.start = record.end;
                let (_, plaintext) = self.protection.plaintext_of(length - HEADER)?;
                let data = self.buffer[record.start] == APPLICATION_DATA;
                if data && self.handshake.is_empty() && out.remaining() >= plaintext {
                    // SAFETY: only written to, by the opening, which
                    // initialises what it writes (and `assume_init` covers
                    // no more than that); nothing here de-initialises.
                    let room = unsafe { out.unfilled_mut() };
                    let (kind, content) = self.protection.open_into(&self.buffer[record], room)?;
                    let length = content.len();
                    if kind == APPLICATION_DATA {
                        // SAFETY: the opening initialised these bytes.
                        unsafe { out.assume_init(length) };
                        out.advance(length);
                        if length > 0 {
                            self.quiet = 0;
                            return Poll::Ready(Ok(()));
                        }
                        self.quiet()?;
                    } else {
                        let content = content.to_vec();
                        self.take_in(kind, &content)?;
                    }
                } else {
                    let (kind, content) = self
                        .protection
                        .open_in_place(&mut self.buffer[record.clone()])?;
                    let content = record.start + content.start..record.start + content.end;
                    if kind == APPLICATION_DATA && self.handshake.is_empty() {
                        // Empty (padded, say): a record without data.
                        if content.is_empty() {
                            self.quiet()?;
                        } else {
                            self.quiet = 0;
                            self.opened = content;
                        }
                    } else {
                        let content = self.buffer[content].to_vec();
                        self.take_in(kind, &content)?;
                    }
                }
                continue;
            }
            if ready!(self.poll_fill(cx))? == 0 {
                return Poll::Ready(Err(io::Error::new(
                    ENDED,
                    if self.start == self.end {
                        "TLS: the peer closed the connection without close_notify"
                    } else {
                        "TLS: the peer closed the connection inside a record"
                    },
                )));
            }
        }
    }

    /// One more record in a row that carried no data: a peer may send a
    /// few (tickets, a KeyUpdate, an empty record), not a stream of them.
    fn quiet(&mut self) -> io::Result<()> {
        self.quiet += 1;
        if self.quiet > MAX_QUIET {
            return Err(refused(
                AlertDescription::UnexpectedMessage,
                format!("the peer sent more than {MAX_QUIET} records in a row with no data"),
            ));
        }
        Ok(())
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for RecordReader<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some((kind, why)) = &this.failed {
            return Poll::Ready(Err(io::Error::new(*kind, why.clone())));
        }
        if out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if !this.early.is_empty() {
            let count = out.remaining().min(this.early.len());
            out.put_slice(&this.early[..count]);
            this.early.drain(..count);
            if this.early.is_empty() {
                this.early = Vec::new();
            }
            return Poll::Ready(Ok(()));
        }
        let polled = this.poll_open(cx, out);
        if let Poll::Ready(Err(error)) = &polled {
            // The connection is over: every later read says why, and the
            // writer tells the peer, in place of what it would send next.
            this.failed = Some((error.kind(), error.to_string()));
            if let Some(ending) = ending_for(error) {
                // The reason goes no further than this end's log: the
                // RPC system ends as for any lost connection.
                match ending {
                    Ending::Alert(_) => tracing::info!(%error, "refused the peer's TLS records"),
                    Ending::Silent => tracing::info!(%error, "TLS connection ended by the peer"),
                }
                this.keys.end(ending);
            }
        }
        polled
    }
}
