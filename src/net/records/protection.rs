//! One direction's record protection: the AEAD key, its IV and the
//! record sequence number, and how a record of each TLS version is sealed
//! and opened (RFC 8446 5.2-5.3 for TLS 1.3; RFC 5288 and RFC 7905 for
//! TLS 1.2's AES-GCM and ChaCha20-Poly1305).

use std::io;
use std::mem::MaybeUninit;
use std::ops::Range;

use aws_lc_rs::aead::{AES_128_GCM, AES_256_GCM, Aad, CHACHA20_POLY1305, LessSafeKey, Nonce};
use aws_lc_rs::aead::{NONCE_LEN, UnboundKey};
use rustls::{AlertDescription, ConnectionTrafficSecrets};

use super::opening::{Aead, AeadKey};

/// A record's header: type, legacy version, length.
pub(crate) const HEADER: usize = 5;
/// The AEAD tag of each suite capexec offers.
pub(crate) const TAG: usize = 16;
/// The most content a record carries.
pub(crate) const MAX_CONTENT: usize = 1 << 14;
/// The longest record body a peer may send: content, TLS 1.2's explicit
/// nonce, TLS 1.3's inner type and padding, the tag. TLS 1.3 allows 256
/// bytes beyond the content, TLS 1.2 2,048 (RFC 5246 6.2.3).
pub(crate) const MAX_BODY: usize = MAX_CONTENT + 2048;
/// TLS 1.3's own limit on a record's body (RFC 8446 5.2).
pub(crate) const MAX_BODY_TLS13: usize = MAX_CONTENT + 256;

pub(crate) const ALERT: u8 = 21;
pub(crate) const HANDSHAKE: u8 = 22;
pub(crate) const APPLICATION_DATA: u8 = 23;

/// A record's header and nonce read before it is opened.
struct Sealed {
    /// The header's type.
    outer: u8,
    nonce: [u8; NONCE_LEN],
    /// The additional data: TLS 1.3's header or TLS 1.2's 13 bytes.
    aad: [u8; 13],
    aad_len: usize,
    /// Where the ciphertext starts in the record.
    start: usize,
    /// How long the plaintext is.
    plaintext: usize,
}

impl Sealed {
    fn aad(&self) -> &[u8] {
        &self.aad[..self.aad_len]
    }
}

/// The TLS version the handshake settled on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Version {
    Tls12,
    Tls13,
}

/// One direction's key, IV and next sequence number.
pub(crate) struct Protection {
    key: LessSafeKey,
    /// The same key, to open into memory not initialised yet and to seal
    /// out of place.
    raw: AeadKey,
    iv: [u8; NONCE_LEN],
    /// TLS 1.2's AES-GCM sends the nonce's last 8 bytes before the
    /// ciphertext; TLS 1.2's ChaCha20-Poly1305 and TLS 1.3 derive it.
    explicit_nonce: bool,
    version: Version,
    seq: u64,
}

/// The kind of every error that ends a connection once its handshake is
/// made: Cap'n Proto takes it for a lost connection (`Disconnected`), as
/// it takes the end of a TCP connection, so that a client says why it
/// lost its commands and may reconnect.
pub(crate) const ENDED: io::ErrorKind = io::ErrorKind::ConnectionAborted;

/// An error that ends the connection ([`ENDED`]), saying what. Met while
/// reading, it is answered with an `internal_error` alert.
pub(crate) fn broken(what: impl Into<String>) -> io::Error {
    ended(Some(AlertDescription::InternalError), what)
}

/// A peer's records refused ([`ENDED`]), saying what, answered with
/// `alert` (RFC 8446 6.2) before the connection ends.
pub(crate) fn refused(alert: AlertDescription, what: impl Into<String>) -> io::Error {
    ended(Some(alert), what)
}

/// The peer ended the connection with a fatal alert: nothing is sent back.
pub(crate) fn ended_by_peer(what: impl Into<String>) -> io::Error {
    ended(None, what)
}

fn ended(alert: Option<AlertDescription>, what: impl Into<String>) -> io::Error {
    io::Error::new(
        ENDED,
        Refusal {
            alert,
            what: format!("TLS: {}", what.into()),
        },
    )
}

/// Why the record layer ended a connection, and the alert the peer is
/// told.
#[derive(Debug)]
struct Refusal {
    alert: Option<AlertDescription>,
    what: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)
    }
}

impl std::error::Error for Refusal {}

/// How the writer ends a connection the reader ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// With this fatal alert: the peer's records were refused.
    Alert(AlertDescription),
    /// With nothing more: the peer ended it with a fatal alert, after
    /// which neither side sends anything (RFC 8446 6.2).
    Silent,
}

/// How the writer ends the connection after the reader's `error`; `None`
/// for an error of the socket's (the connection is gone).
pub(crate) fn ending_for(error: &io::Error) -> Option<Ending> {
    let refusal = error.get_ref()?.downcast_ref::<Refusal>()?;
    Some(match refusal.alert {
        Some(alert) => Ending::Alert(alert),
        None => Ending::Silent,
    })
}

impl Protection {
    /// The protection of one direction from the keys rustls derived.
    pub(crate) fn new(
        version: Version,
        (seq, secrets): (u64, ConnectionTrafficSecrets),
    ) -> io::Result<Protection> {
        let (algorithm, aead, key, iv, gcm) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => {
                (&AES_128_GCM, Aead::Aes128Gcm, key, iv, true)
            }
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => {
                (&AES_256_GCM, Aead::Aes256Gcm, key, iv, true)
            }
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&CHACHA20_POLY1305, Aead::Chacha20Poly1305, key, iv, false)
            }
            _ => {
                return Err(broken(
                    "the negotiated cipher suite has no record layer here",
                ));
            }
        };
        let raw = AeadKey::new(aead, key.as_ref())?;
        let key = UnboundKey::new(algorithm, key.as_ref())
            .map_err(|_| broken("the negotiated key does not fit its cipher"))?;
        let iv: [u8; NONCE_LEN] = iv
            .as_ref()
            .try_into()
            .map_err(|_| broken("the negotiated IV is not 12 bytes"))?;
        Ok(Protection {
            key: LessSafeKey::new(key),
            raw,
            iv,
            explicit_nonce: gcm && version == Version::Tls12,
            version,
            seq,
        })
    }

    /// Records protected so far (the next one's sequence number).
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// The IV with the sequence number folded into its last 8 bytes.
    fn nonce(&self) -> [u8; NONCE_LEN] {
        let mut nonce = self.iv;
        for (byte, seq) in nonce[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *byte ^= seq;
        }
        nonce
    }

    fn next_seq(&mut self) -> io::Result<()> {
        self.seq = self
            .seq
            .checked_add(1)
            .ok_or_else(|| broken("the record sequence number would wrap"))?;
        Ok(())
    }

    /// TLS 1.2's additional data: sequence number, type, version, length.
    fn tls12_aad(&self, kind: u8, content: usize) -> [u8; 13] {
        let mut aad = [0; 13];
        aad[..8].copy_from_slice(&self.seq.to_be_bytes());
        aad[8] = kind;
        aad[9..11].copy_from_slice(&[3, 3]);
        aad[11..].copy_from_slice(&(content as u16).to_be_bytes());
        aad
    }

    /// Starts a record at the end of `out`: its header and nonce, to be
    /// filled in by [`Protection::seal`] once the caller has appended at
    /// most [`MAX_CONTENT`] bytes of content.
    pub(crate) fn begin(&self, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        out.extend_from_slice(&[0; HEADER]);
        if self.explicit_nonce {
            out.extend_from_slice(&[0; 8]);
        }
        start
    }

    /// Seals `content` (at most [`MAX_CONTENT`] bytes) as one record of
    /// type `kind` at the end of `out`, in one pass from `content` into
    /// `out`'s room: the same record [`Protection::begin`], a copy of
    /// `content` and [`Protection::seal`] make. On an error `out` may end
    /// with part of a record: the caller drops what it sealed in the call.
    pub(crate) fn seal_from(
        &mut self,
        out: &mut Vec<u8>,
        content: &[u8],
        kind: u8,
    ) -> io::Result<()> {
        if content.len() > MAX_CONTENT {
            return Err(broken("a record's content is longer than 16 KiB"));
        }
        let nonce = self.nonce();
        let explicit = if self.explicit_nonce { 8 } else { 0 };
        let (outer, inner_type) = match self.version {
            Version::Tls13 => (APPLICATION_DATA, &[kind][..]),
            Version::Tls12 => (kind, &[][..]),
        };
        let length = explicit + content.len() + inner_type.len() + TAG;
        let header = [outer, 3, 3, (length >> 8) as u8, length as u8];
        out.reserve(HEADER + length);
        out.extend_from_slice(&header);
        if self.explicit_nonce {
            out.extend_from_slice(&nonce[4..]);
        }
        let tls12_aad = self.tls12_aad(kind, content.len());
        let aad = match self.version {
            Version::Tls13 => &header[..],
            Version::Tls12 => &tls12_aad[..],
        };
        let room = &mut out.spare_capacity_mut()[..length - explicit];
        let written = self.raw.seal_into(&nonce, aad, content, inner_type, room)?;
        // SAFETY: `seal_into` initialised the first `written` bytes of the
        // room, which `reserve` made.
        unsafe { out.set_len(out.len() + written) };
        self.next_seq()
    }

    /// Seals the record begun at `start` with the content appended since,
    /// as type `kind`.
    pub(crate) fn seal(&mut self, out: &mut Vec<u8>, start: usize, kind: u8) -> io::Result<()> {
        let body = start + HEADER + if self.explicit_nonce { 8 } else { 0 };
        let content = out.len() - body;
        // More only from a test playing a hostile peer.
        debug_assert!(content <= MAX_CONTENT || cfg!(test));
        let nonce = self.nonce();
        let outer = match self.version {
            Version::Tls13 => {
                out.push(kind);
                APPLICATION_DATA
            }
            Version::Tls12 => kind,
        };
        let length = out.len() - (start + HEADER) + TAG;
        let header = [outer, 3, 3, (length >> 8) as u8, length as u8];
        out[start..start + HEADER].copy_from_slice(&header);
        if self.explicit_nonce {
            out[start + HEADER..body].copy_from_slice(&nonce[4..]);
        }
        let tls12_aad = self.tls12_aad(kind, content);
        let aad = match self.version {
            Version::Tls13 => &header[..],
            Version::Tls12 => &tls12_aad[..],
        };
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut out[body..],
            )
            .map_err(|_| broken("a record could not be sealed"))?;
        out.extend_from_slice(tag.as_ref());
        self.next_seq()
    }

    /// Where a record's ciphertext starts after its header, and how long
    /// its plaintext is (inner type and padding included), for a record
    /// whose header says `length`; an error for a record too short to be
    /// one.
    pub(crate) fn plaintext_of(&self, length: usize) -> io::Result<(usize, usize)> {
        let nonce = if self.explicit_nonce { 8 } else { 0 };
        let plaintext = length.checked_sub(nonce + TAG).ok_or_else(|| {
            refused(
                AlertDescription::BadRecordMac,
                "the peer sent a record too short to hold its tag",
            )
        })?;
        Ok((nonce, plaintext))
    }

    /// Opens the record `record` (header included, `plaintext_of` bytes of
    /// plaintext) into the start of `out`, which has room for that many
    /// and need not be initialised: its type and its content, which starts
    /// `out` (the rest of the plaintext, initialised too, is its inner type
    /// and padding).
    pub(crate) fn open_into<'o>(
        &mut self,
        record: &[u8],
        out: &'o mut [MaybeUninit<u8>],
    ) -> io::Result<(u8, &'o mut [u8])> {
        let sealed = self.sealed(record)?;
        let (ciphertext, tag) = record[sealed.start..].split_at(sealed.plaintext);
        let opened = self
            .raw
            .open(&sealed.nonce, sealed.aad(), ciphertext, tag, out)?;
        self.next_seq()?;
        let (kind, content) = self.inner(sealed.outer, opened)?;
        Ok((kind, &mut opened[..content]))
    }

    /// Opens the record in `record` (header included) where it lies: its
    /// type and the range of `record` its content takes.
    pub(crate) fn open_in_place(&mut self, record: &mut [u8]) -> io::Result<(u8, Range<usize>)> {
        let sealed = self.sealed(record)?;
        let start = sealed.start;
        self.key
            .open_in_place(
                Nonce::assume_unique_for_key(sealed.nonce),
                Aad::from(sealed.aad()),
                &mut record[start..],
            )
            .map_err(|_| {
                refused(
                    AlertDescription::BadRecordMac,
                    "a record failed its integrity check (bad_record_mac)",
                )
            })?;
        self.next_seq()?;
        let plaintext = &record[start..start + sealed.plaintext];
        let (kind, content) = self.inner(sealed.outer, plaintext)?;
        Ok((kind, start..start + content))
    }

    /// What opening `record` (header included) needs from its header and
    /// explicit nonce, taken before it is opened: TLS 1.2's additional
    /// data has the plaintext's length, which for the suites here is the
    /// ciphertext's less the tag.
    fn sealed(&self, record: &[u8]) -> io::Result<Sealed> {
        let header: [u8; HEADER] = record
            .get(..HEADER)
            .and_then(|header| header.try_into().ok())
            .ok_or_else(|| broken("a record shorter than its header"))?;
        let (explicit, plaintext) = self.plaintext_of(record.len() - HEADER)?;
        let start = HEADER + explicit;
        let mut nonce = self.nonce();
        if self.explicit_nonce {
            nonce[4..].copy_from_slice(&record[HEADER..start]);
        }
        let (aad, aad_len) = match self.version {
            Version::Tls13 => {
                let mut aad = [0; 13];
                aad[..HEADER].copy_from_slice(&header);
                (aad, HEADER)
            }
            Version::Tls12 => (self.tls12_aad(header[0], plaintext), 13),
        };
        Ok(Sealed {
            outer: header[0],
            nonce,
            aad,
            aad_len,
            start,
            plaintext,
        })
    }

    /// The type and content length of an opened plaintext: TLS 1.3's
    /// inner type is its last byte that is not padding.
    fn inner(&self, outer: u8, plaintext: &[u8]) -> io::Result<(u8, usize)> {
        match self.version {
            Version::Tls12 if plaintext.len() > MAX_CONTENT => Err(refused(
                AlertDescription::RecordOverflow,
                "the peer sent a record longer than 16 KiB",
            )),
            Version::Tls12 => Ok((outer, plaintext.len())),
            // The inner plaintext, padding included, is at most 2^14 + 1
            // bytes (RFC 8446 5.4): padding may not stretch a record.
            Version::Tls13 if plaintext.len() > MAX_CONTENT + 1 => Err(refused(
                AlertDescription::RecordOverflow,
                "the peer sent a record longer than 16 KiB",
            )),
            Version::Tls13 => {
                if outer != APPLICATION_DATA {
                    return Err(refused(
                        AlertDescription::UnexpectedMessage,
                        format!("the peer sent a protected record of outer type {outer}"),
                    ));
                }
                let Some(last) = plaintext.iter().rposition(|&byte| byte != 0) else {
                    return Err(refused(
                        AlertDescription::UnexpectedMessage,
                        "the peer sent a record with no content type",
                    ));
                };
                Ok((plaintext[last], last))
            }
        }
    }
}
