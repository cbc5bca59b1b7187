//! The TLS hop: a TCP hop (`hop.rs`) whose bytes travel as TLS 1.3
//! records sealed with AES-128-GCM, the least any TLS connection can cost
//! on this machine and so the floor of a command run over TLS. Each byte
//! is read into user space once at the sending end (a cipher cannot work
//! on spliced pages), sealed in place by aws-lc (the code that seals
//! capexec's records, AVX-512 where the processor has it), and written
//! with its record's header and tag; the receiving end reads records in
//! bulk, opens each in place and writes the plaintext straight from there
//! into the far side's pipe. No handshake (a fixed key: the cipher's cost
//! does not depend on it), no framing beyond the records, no event loop,
//! no copy the cipher does not force. The ports section (`ports.rs`) runs
//! the same two ends between sockets, as a relay in front of its peer (the
//! least a forward over TLS, or `ssh -L`, costs) and, sealing bytes from
//! memory, as the client of a connection (the least TLS `dial` costs).

use std::io::{self, IoSlice, Read, Write};
use std::os::fd::AsRawFd;

use aws_lc_rs::aead::{AES_128_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};

/// The most plaintext one TLS record carries (RFC 8446, 5.1).
const RECORD_PLAINTEXT: usize = 16 * 1024;
/// A record's header: type, legacy version, length.
const HEADER: usize = 5;
/// The inner content type (RFC 8446, 5.2) and the AEAD's tag.
const TRAILER: usize = 1 + 16;
/// One record's room in the sender's buffer.
const SLOT: usize = HEADER + RECORD_PLAINTEXT + TRAILER;
/// Records the sender fills with one readv(2) and sends with one writev(2):
/// room for 256 KiB of plaintext, though a read from a pipe of the
/// default size brings at most 64 KiB (four records).
const SLOTS: usize = 16;
/// What the receiver reads with one read(2), at least a whole record.
const RECEIVED: usize = 256 * 1024;
/// TLS 1.3's outer content type, application data, and legacy version.
const APPLICATION_DATA: u8 = 0x17;

/// The key and IV both ends use, and the per-record nonce (RFC 8446,
/// 5.3: the IV with the record's sequence number XORed into its end).
/// Both directions share them, which TLS never does; the cipher's cost is
/// the same.
struct Keys {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
}

impl Keys {
    fn new() -> io::Result<Keys> {
        let key = UnboundKey::new(&AES_128_GCM, &[0x5a; 16])
            .map_err(|_| io::Error::other("aws-lc refused an AES-128 key"))?;
        Ok(Keys {
            key: LessSafeKey::new(key),
            iv: [0xa5; NONCE_LEN],
        })
    }

    fn nonce(&self, sequence: u64) -> Nonce {
        let mut nonce = self.iv;
        for (byte, seq) in nonce[NONCE_LEN - 8..]
            .iter_mut()
            .zip(sequence.to_be_bytes())
        {
            *byte ^= seq;
        }
        Nonce::assume_unique_for_key(nonce)
    }
}

fn header(ciphertext: usize) -> [u8; HEADER] {
    // At most SLOT - HEADER, which fits in the header's 16 bits.
    let [high, low] = (ciphertext as u16).to_be_bytes();
    [APPLICATION_DATA, 0x03, 0x03, high, low]
}

/// What `from` (a pipe or a socket) gives, as sealed records written to
/// `to`, until `from`'s end.
pub fn send(from: &impl AsRawFd, to: &mut impl Write) -> io::Result<()> {
    send_filled(|buffer| read_into_slots(from, buffer), to)
}

/// What `source` reads (bytes in memory), copied into records and sealed,
/// as a TLS library copies what it is given to send.
pub fn send_from_memory(mut source: impl Read, to: &mut impl Write) -> io::Result<()> {
    send_filled(|buffer| copy_into_slots(&mut source, buffer), to)
}

/// Sealed records written to `to` from what `fill` puts into the buffer's
/// record slots (the plaintext room of the first slots whole, of the last
/// in part; how many bytes), until it puts nothing.
fn send_filled(
    mut fill: impl FnMut(&mut [u8]) -> io::Result<usize>,
    to: &mut impl Write,
) -> io::Result<()> {
    let keys = Keys::new()?;
    let mut buffer = vec![0u8; SLOT * SLOTS];
    let mut sequence = 0u64;
    loop {
        let read = fill(&mut buffer)?;
        if read == 0 {
            break;
        }
        let mut records = Vec::with_capacity(SLOTS);
        let mut left = read;
        for slot in buffer.chunks_exact_mut(SLOT) {
            if left == 0 {
                break;
            }
            let plaintext = left.min(RECORD_PLAINTEXT);
            left -= plaintext;
            let ciphertext = plaintext + TRAILER;
            let head = header(ciphertext);
            let (room, body) = slot.split_at_mut(HEADER);
            room.copy_from_slice(&head);
            body[plaintext] = APPLICATION_DATA;
            let (sealed, tag) = body[..ciphertext].split_at_mut(plaintext + 1);
            let made = keys
                .key
                .seal_in_place_separate_tag(keys.nonce(sequence), Aad::from(head), sealed)
                .map_err(|_| io::Error::other("sealing failed"))?;
            tag.copy_from_slice(made.as_ref());
            sequence += 1;
            records.push(IoSlice::new(&slot[..HEADER + ciphertext]));
        }
        write_all_vectored(to, &mut records)?;
    }
    Ok(())
}

/// One readv(2) from `from` into the plaintext room of every slot, in
/// order; the bytes read fill the first slots whole and the last one in
/// part. 0 at the end.
fn read_into_slots(from: &impl AsRawFd, buffer: &mut [u8]) -> io::Result<usize> {
    let mut rooms: Vec<libc::iovec> = buffer
        .chunks_exact_mut(SLOT)
        .map(|slot| libc::iovec {
            iov_base: slot[HEADER..HEADER + RECORD_PLAINTEXT].as_mut_ptr().cast(),
            iov_len: RECORD_PLAINTEXT,
        })
        .collect();
    loop {
        // SAFETY: every iovec points into `buffer`, borrowed mutably for
        // the call, and their count is the vector's length.
        let read = unsafe {
            libc::readv(
                from.as_raw_fd(),
                rooms.as_mut_ptr(),
                rooms.len() as libc::c_int,
            )
        };
        match usize::try_from(read) {
            Ok(read) => return Ok(read),
            Err(_) => {
                let why = io::Error::last_os_error();
                if why.kind() != io::ErrorKind::Interrupted {
                    return Err(why);
                }
            }
        }
    }
}

/// Fills the slots' plaintext rooms in order from `source`, each whole
/// before the next, until the buffer is full or `source` ends.
fn copy_into_slots(source: &mut impl Read, buffer: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    for slot in buffer.chunks_exact_mut(SLOT) {
        let room = &mut slot[HEADER..HEADER + RECORD_PLAINTEXT];
        let mut at = 0;
        while at < room.len() {
            match source.read(&mut room[at..]) {
                Ok(0) => return Ok(filled + at),
                Ok(read) => at += read,
                Err(why) if why.kind() == io::ErrorKind::Interrupted => {}
                Err(why) => return Err(why),
            }
        }
        filled += at;
    }
    Ok(filled)
}

/// Sealed records read from `from`, opened in place, their plaintext
/// written to `to` until `from`'s end.
pub fn receive(from: &mut impl Read, to: &mut impl Write) -> io::Result<()> {
    let keys = Keys::new()?;
    let mut buffer = vec![0u8; RECEIVED];
    let (mut start, mut end) = (0, 0);
    let mut sequence = 0u64;
    loop {
        let read = match from.read(&mut buffer[end..]) {
            Err(why) if why.kind() == io::ErrorKind::Interrupted => continue,
            read => read?,
        };
        if read == 0 {
            if start != end {
                return Err(io::Error::other("the connection ended inside a record"));
            }
            return Ok(());
        }
        end += read;
        let mut plaintexts = Vec::new();
        while end - start >= HEADER {
            let mut header = [0u8; HEADER];
            header.copy_from_slice(&buffer[start..start + HEADER]);
            if header[..3] != [APPLICATION_DATA, 0x03, 0x03] {
                return Err(io::Error::other("not an application-data record"));
            }
            let ciphertext = usize::from(u16::from_be_bytes([header[3], header[4]]));
            if !(TRAILER..=SLOT - HEADER).contains(&ciphertext) {
                return Err(io::Error::other(format!("a record of {ciphertext} bytes")));
            }
            let record = start + HEADER..start + HEADER + ciphertext;
            if record.end > end {
                break;
            }
            let opened = keys
                .key
                .open_in_place(
                    keys.nonce(sequence),
                    Aad::from(header),
                    &mut buffer[record.clone()],
                )
                .map_err(|_| io::Error::other("a record failed to open"))?;
            // The plaintext without its inner content type.
            let Some((&APPLICATION_DATA, _)) = opened.split_last() else {
                return Err(io::Error::other("a record of another content type"));
            };
            let plaintext = opened.len() - 1;
            plaintexts.push(record.start..record.start + plaintext);
            sequence += 1;
            start = record.end;
        }
        let mut slices: Vec<IoSlice> = plaintexts
            .into_iter()
            .map(|range| IoSlice::new(&buffer[range]))
            .collect();
        write_all_vectored(to, &mut slices)?;
        // The partial record left moves to the front (less than one
        // record's bytes), and the next read completes it.
        buffer.copy_within(start..end, 0);
        end -= start;
        start = 0;
    }
}

/// writev(2) until every slice is written.
fn write_all_vectored(to: &mut impl Write, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
    while !slices.is_empty() {
        match to.write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => IoSlice::advance_slices(&mut slices, written),
            Err(why) if why.kind() == io::ErrorKind::Interrupted => {}
            Err(why) => return Err(why),
        }
    }
    Ok(())
}
