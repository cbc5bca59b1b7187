//! Bytes to send that can leave as a Cap'n Proto segment of their own.
//!
//! A `write` call's data is otherwise put in the message the way Cap'n
//! Proto puts any field: room for it is allocated zeroed, and the bytes are
//! copied in. For a client relaying its stdin that is two passes over every
//! byte, a sixth of its CPU (docs/PROFILES.md, "Stdin into `wc -c`: the
//! client's copies"). [`SegmentBuffer`] reads the bytes into memory laid
//! out as the segment their field will land in: one word of room for the
//! landing pad the message writes there, the bytes, zeros to the end of
//! the last word. The message then takes that memory as it is
//! (`capnp_rpc::with_offered_segment`), and the connection writes it from
//! there.

use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;

/// The bytes of a Cap'n Proto word.
const WORD: usize = 8;

/// Memory laid out as a segment: `words` words at `start`, the first the
/// landing pad's, then the bytes, then zeros; the allocation may go on
/// beyond them (`allocated` words in all).
struct Segment {
    start: NonNull<u64>,
    words: usize,
    allocated: usize,
    len: usize,
    /// Offered to a message once: a message writes its landing pad into
    /// the first word, and a second message must not write it while the
    /// first may still be reading it on its way out.
    offered: AtomicBool,
}

// SAFETY: the memory is owned by the segment and, once shared, only read,
// but for the landing pad word, which the one message it is offered to
// (`offered`) writes on the thread that builds it.
unsafe impl Send for Segment {}
// SAFETY: as above; shared readers see only the bytes after the first
// word, which nothing writes once the segment is shared.
unsafe impl Sync for Segment {}

impl Segment {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes after the first word are initialised and lie
        // within the allocation (`words` is enough for them, see
        // `SegmentBuffer::freeze`), and nothing writes them once shared.
        unsafe { std::slice::from_raw_parts(self.start.as_ptr().cast::<u8>().add(WORD), self.len) }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: allocated as a boxed slice of `allocated` words in
        // `SegmentBuffer::with_capacity` and given up in `freeze`.
        drop(unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.start.as_ptr().cast::<MaybeUninit<u64>>(),
                self.allocated,
            ))
        });
    }
}

/// A segment's bytes, as [`Bytes`] share them.
struct SegmentBytes(Arc<Segment>);

impl AsRef<[u8]> for SegmentBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

/// Bytes to send, and the segment they lie in when they were read into
/// one.
#[derive(Clone, Debug)]
pub struct OutgoingBytes {
    bytes: Bytes,
    segment: Option<Arc<Segment>>,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Segment({} bytes)", self.len)
    }
}

impl From<Bytes> for OutgoingBytes {
    fn from(bytes: Bytes) -> OutgoingBytes {
        OutgoingBytes {
            bytes,
            segment: None,
        }
    }
}

impl OutgoingBytes {
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The segment to offer the message that carries these bytes, the
    /// first time it is asked for: `None` after that, or for bytes that
    /// are not laid out as one.
    pub(crate) fn offer(&self) -> Option<capnp_rpc::OfferedSegment> {
        let segment = self.segment.as_ref()?;
        if segment.offered.swap(true, Ordering::AcqRel) {
            return None;
        }
        let words = u32::try_from(segment.words).ok()?;
        // SAFETY: `start` is aligned to a word and valid for `words` words
        // while the owner given here (a reference to the segment) lives;
        // the bytes after the first word are the field's, zero-padded to a
        // word (`SegmentBuffer::freeze`), and nothing else writes any of
        // it: shared readers only read, and the first word is offered
        // once.
        Some(unsafe {
            capnp_rpc::OfferedSegment::new(
                segment.start.cast::<u8>(),
                words,
                Box::new(Arc::clone(segment)),
            )
        })
    }
}

/// A buffer that bytes are read into, laid out to leave as a segment.
pub struct SegmentBuffer {
    words: Box<[MaybeUninit<u64>]>,
    len: usize,
}

impl SegmentBuffer {
    /// Room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> SegmentBuffer {
        // Uninitialised: zeroing first would cost the pass this saves.
        let words = 1 + capacity.div_ceil(WORD);
        SegmentBuffer {
            words: Box::new_uninit_slice(words),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        (self.words.len() - 1) * WORD
    }

    /// The bytes read so far.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the first `len` bytes after the first word are
        // initialised (`set_len`'s contract), and lie within `words`.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>().add(WORD), self.len) }
    }

    /// The room left after the bytes read so far.
    pub fn spare_capacity_mut(&mut self) -> &mut [MaybeUninit<u8>] {
        let (len, capacity) = (self.len, self.capacity());
        // SAFETY: bytes WORD + len .. WORD + capacity lie within `words`;
        // MaybeUninit bytes need no initialisation.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.words
                    .as_mut_ptr()
                    .cast::<MaybeUninit<u8>>()
                    .add(WORD + len),
                capacity - len,
            )
        }
    }

    /// Counts `read` more bytes as read.
    ///
    /// # Safety
    ///
    /// The first `read` bytes of [`Self::spare_capacity_mut`] must have
    /// been initialised.
    pub unsafe fn set_len(&mut self, read: usize) {
        debug_assert!(read <= self.capacity());
        self.len = read;
    }

    /// Forgets what was read, keeping the buffer.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The bytes read, laid out as their segment: the words they take,
    /// the last one zero-padded. The segment offered is just those words
    /// (a message takes one only at the exact size it asks for), though
    /// the allocation goes on to the buffer's capacity.
    pub fn freeze(self) -> OutgoingBytes {
        let SegmentBuffer { mut words, len } = self;
        let needed = 1 + len.div_ceil(WORD);
        let pad = (needed - 1) * WORD - len;
        // SAFETY: bytes WORD + len .. WORD + len + pad lie within the
        // first `needed` words, which `words` holds.
        unsafe {
            words
                .as_mut_ptr()
                .cast::<u8>()
                .add(WORD + len)
                .write_bytes(0, pad)
        };
        let allocated = words.len();
        let raw = Box::into_raw(words);
        let segment = Arc::new(Segment {
            // SAFETY: a boxed slice's pointer is never null.
            start: unsafe { NonNull::new_unchecked(raw.cast::<u64>()) },
            words: needed,
            allocated,
            len,
            offered: AtomicBool::new(false),
        });
        OutgoingBytes {
            bytes: Bytes::from_owner(SegmentBytes(Arc::clone(&segment))),
            segment: Some(segment),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capexec_capnp::process::write_params;

    fn read_into(buffer: &mut SegmentBuffer, bytes: &[u8]) {
        let spare = buffer.spare_capacity_mut();
        for (to, from) in spare.iter_mut().zip(bytes) {
            to.write(*from);
        }
        // SAFETY: the loop initialised `bytes.len()` bytes of the spare
        // capacity (the callers keep within it).
        unsafe { buffer.set_len(buffer.len() + bytes.len()) };
    }

    fn laid_out(bytes: &[u8]) -> OutgoingBytes {
        let mut buffer = SegmentBuffer::with_capacity(256 * 1024);
        read_into(&mut buffer, bytes);
        buffer.freeze()
    }

    /// The message a `write` of `data` makes, as the connection writes it.
    fn on_the_wire(data: &OutgoingBytes, offer: bool) -> (Vec<u8>, bool) {
        let mut message = capnp::message::Builder::new(capnp_rpc::MessageAllocator::new());
        let mut params = message.init_root::<write_params::Builder>();
        params.set_write_id("stdin-1");
        let bytes = data.bytes();
        let len = u32::try_from(bytes.len()).expect("small");
        let taken = match data.offer().filter(|_| offer) {
            Some(segment) => {
                let (field, taken) = capnp_rpc::with_offered_segment(segment, || {
                    params.reborrow().init_data(len).as_ptr()
                });
                assert!(!taken || std::ptr::eq(field, bytes.as_ptr()));
                if !taken {
                    params
                        .reborrow()
                        .get_data()
                        .expect("data")
                        .copy_from_slice(bytes);
                }
                taken
            }
            None => {
                params.set_data(bytes);
                false
            }
        };
        let mut wire = Vec::new();
        capnp::serialize::write_message(&mut wire, &message).expect("write");
        (wire, taken)
    }

    #[test]
    fn a_chunk_leaves_as_its_own_segment_byte_for_byte_as_a_copied_one() {
        let pattern: Vec<u8> = (0..256 * 1024).map(|i| (i * 7 + i / 251) as u8).collect();
        for len in [32 * 1024, 100_001, 131_075, 256 * 1024 - 3, 256 * 1024] {
            let data = laid_out(&pattern[..len]);
            assert_eq!(&data.bytes()[..], &pattern[..len]);
            let copied = on_the_wire(&Bytes::copy_from_slice(&pattern[..len]).into(), false).0;
            let (adopted, taken) = on_the_wire(&data, true);
            assert!(taken, "{len} bytes were copied into the message");
            assert!(adopted == copied, "{len} bytes differ on the wire");
            let read = capnp::serialize::read_message(
                &mut &adopted[..],
                capnp::message::ReaderOptions::new(),
            )
            .expect("read");
            let params = read.get_root::<write_params::Reader>().expect("root");
            assert_eq!(params.get_data().expect("data"), &pattern[..len]);
            assert_eq!(params.get_write_id().expect("id").to_str(), Ok("stdin-1"));
        }
    }

    #[test]
    fn bytes_are_offered_to_one_message_only_and_copied_into_the_next() {
        let pattern = vec![0x5a_u8; 40_000];
        let data = laid_out(&pattern);
        let (first, taken) = on_the_wire(&data, true);
        assert!(taken);
        assert!(data.offer().is_none());
        let (again, taken) = on_the_wire(&data, true);
        assert!(!taken);
        assert!(first == again);
        assert!(
            OutgoingBytes::from(Bytes::from_static(b"not laid out"))
                .offer()
                .is_none()
        );
    }

    #[test]
    fn a_field_that_fits_the_first_segment_leaves_the_offer_untaken_and_is_copied() {
        // 2 KiB fit the message's first segment, so no segment is
        // allocated while the offer stands, and the field is filled where
        // it lies.
        let pattern = vec![0xa5_u8; 2048];
        let data = laid_out(&pattern);
        let (wire, taken) = on_the_wire(&data, true);
        assert!(!taken);
        assert!(wire == on_the_wire(&Bytes::copy_from_slice(&pattern).into(), false).0);
    }

    #[test]
    fn a_buffer_read_in_pieces_keeps_them_in_order_and_clears() {
        let mut buffer = SegmentBuffer::with_capacity(64);
        assert_eq!(buffer.capacity(), 64);
        read_into(&mut buffer, b"hello, ");
        read_into(&mut buffer, b"world");
        assert_eq!(buffer.as_slice(), b"hello, world");
        assert_eq!(buffer.spare_capacity_mut().len(), 64 - 12);
        buffer.clear();
        assert!(buffer.is_empty());
        read_into(&mut buffer, b"again");
        assert_eq!(&buffer.freeze().bytes()[..], b"again");
    }

    #[test]
    fn an_offer_is_withdrawn_when_the_build_it_stands_for_panics() {
        let data = laid_out(&[1_u8; 40_000]);
        let segment = data.offer().expect("laid out");
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            capnp_rpc::with_offered_segment(segment, || panic!("the build failed"))
        }));
        assert!(built.is_err());
        // A field of the same size, built later with no offer standing,
        // lies in zeroed memory of the message's own, not in the bytes
        // offered before.
        let mut message = capnp::message::Builder::new(capnp_rpc::MessageAllocator::new());
        let mut params = message.init_root::<write_params::Builder>();
        let field = params.reborrow().init_data(40_000);
        assert!(field.iter().all(|&byte| byte == 0));
        assert!(!std::ptr::eq(field.as_ptr(), data.bytes().as_ptr()));
    }
}
