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

use crate::capexec_capnp::process;

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
    /// The bytes, through a reference made afresh from `start` each time:
    /// a message that took the segment made a `&mut` over them (Cap'n
    /// Proto's `init_data`), which ends any reference made before it.
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

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Segment({} bytes)", self.len)
    }
}

/// Bytes to send: shared as [`Bytes`], or laid out as a segment of their
/// own (read into a [`SegmentBuffer`]).
#[derive(Clone, Debug)]
pub struct OutgoingBytes(Shape);

#[derive(Clone, Debug)]
enum Shape {
    Shared(Bytes),
    Laid(Arc<Segment>),
}

impl From<Bytes> for OutgoingBytes {
    fn from(bytes: Bytes) -> OutgoingBytes {
        OutgoingBytes(Shape::Shared(bytes))
    }
}

impl OutgoingBytes {
    /// The bytes. A view of laid-out bytes is not to be kept across their
    /// send (`write_outgoing_in_order`): the message makes a `&mut` over
    /// them as it takes them (Cap'n Proto's `init_data`), which, though it
    /// never writes through it, Stacked Borrows counts against any view
    /// made before. Ask again after.
    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            Shape::Shared(bytes) => bytes,
            Shape::Laid(segment) => segment.bytes(),
        }
    }

    /// The segment to offer the message that carries these bytes, the
    /// first time it is asked for: `None` after that, or for bytes that
    /// are not laid out as one.
    fn offer(&self) -> Option<capnp_rpc::OfferedSegment> {
        let Shape::Laid(segment) = &self.0 else {
            return None;
        };
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

/// Sends `write(data, writeId)` on `process`, `data` taken whole as the
/// data field's own segment the first time it is sent (copied into the
/// message otherwise). Built and sent in one step: once it is the shared
/// segment, nothing may write the field again.
pub(crate) fn send_write(
    process: &process::Client,
    data: &OutgoingBytes,
    write_id: &str,
) -> capnp::capability::RemotePromise<process::write_results::Owned> {
    let mut request = process.write_request();
    // First, so that it lands in the message's first segment.
    request.get().set_write_id(write_id);
    // SAFETY: the request is sent as it is: nothing writes the field, or
    // re-initialises the root, again.
    unsafe { place_data(request.get(), data) };
    request.send()
}

/// Sets the data field of `params` to `data`: the segment `data` is laid
/// out as, if the message takes it (it lands right after the landing pad
/// it leaves room for), else a copy. Returns whether it was taken.
///
/// # Safety
///
/// The field's last write: while the message lives, nothing sets, clears
/// or initialises the field anew, nor the message's root (each zeroes the
/// old field, which may be `data`'s shared segment).
unsafe fn place_data(mut params: process::write_params::Builder<'_>, data: &OutgoingBytes) -> bool {
    let expected = data.as_slice().as_ptr() as usize;
    let made = match (data.offer(), u32::try_from(data.as_slice().len())) {
        (Some(segment), Ok(len)) => {
            // SAFETY: the field made here is the message's last write to
            // it (this function's contract), and the build makes no offer.
            let (field, _) = unsafe {
                capnp_rpc::with_offered_segment(segment, || {
                    params.reborrow().init_data(len).as_ptr() as usize
                })
            };
            Some(field)
        }
        _ => None,
    };
    // Where the field lies, not whether some allocation took the offer,
    // says whether the bytes are in it.
    if made == Some(expected) {
        return true;
    }
    // Otherwise copied in, as any other data: into the field made above,
    // zeroed in the message's own memory (where the message had room for
    // it), or a field made now.
    match params.reborrow().get_data() {
        Ok(field) if made.is_some() && field.len() == data.as_slice().len() => {
            field.copy_from_slice(data.as_slice())
        }
        _ => params.set_data(data.as_slice()),
    }
    false
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

    /// Sets the number of bytes read, as `Vec::set_len` does.
    ///
    /// # Safety
    ///
    /// The first `len` bytes (those read before, and the start of
    /// [`Self::spare_capacity_mut`]) must have been initialised.
    ///
    /// # Panics
    ///
    /// If `len` is more than the capacity.
    pub unsafe fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity(),
            "{len} bytes in a buffer of {}",
            self.capacity()
        );
        self.len = len;
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
        OutgoingBytes(Shape::Laid(Arc::new(Segment {
            // SAFETY: a boxed slice's pointer is never null.
            start: unsafe { NonNull::new_unchecked(raw.cast::<u64>()) },
            words: needed,
            allocated,
            len,
            offered: AtomicBool::new(false),
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capexec_capnp::process::write_params;
    use capnp_rpc::rpc_capnp::message as rpc_message;

    fn read_into(buffer: &mut SegmentBuffer, bytes: &[u8]) {
        let spare = buffer.spare_capacity_mut();
        for (to, from) in spare.iter_mut().zip(bytes) {
            to.write(*from);
        }
        // SAFETY: the loop initialised `bytes.len()` bytes after those
        // read before (the callers keep within the capacity).
        unsafe { buffer.set_len(buffer.len() + bytes.len()) };
    }

    fn laid_out(bytes: &[u8]) -> OutgoingBytes {
        let mut buffer = SegmentBuffer::with_capacity(bytes.len().max(256 * 1024));
        read_into(&mut buffer, bytes);
        buffer.freeze()
    }

    fn copied(bytes: &[u8]) -> OutgoingBytes {
        Bytes::copy_from_slice(bytes).into()
    }

    /// The message a `write` of `data` makes, as the connection writes it:
    /// a `Call` as capnp-rpc builds it, its target and capability table
    /// set at the send, after the parameters. With whether the segment was
    /// taken.
    fn on_the_wire(data: &OutgoingBytes, write_id: &str) -> (Vec<u8>, bool) {
        let mut message = capnp::message::Builder::new(capnp_rpc::MessageAllocator::new());
        let mut call = message.init_root::<rpc_message::Builder>().init_call();
        call.set_interface_id(1);
        call.set_method_id(1);
        let mut params: write_params::Builder = call
            .reborrow()
            .get_params()
            .expect("payload")
            .get_content()
            .init_as();
        params.set_write_id(write_id);
        // SAFETY: nothing writes the field or the root after this.
        let taken = unsafe { place_data(params, data) };
        call.reborrow()
            .get_target()
            .expect("target")
            .set_imported_cap(3);
        call.reborrow()
            .get_params()
            .expect("payload")
            .init_cap_table(0);
        call.set_question_id(7);
        let mut wire = Vec::new();
        capnp::serialize::write_message(&mut wire, &message).expect("write");
        (wire, taken)
    }

    /// The data and write id the message on `wire` carries.
    fn read_back(wire: &[u8]) -> (Vec<u8>, String) {
        let options = capnp::message::ReaderOptions {
            traversal_limit_in_words: None,
            nesting_limit: 64,
        };
        let message = capnp::serialize::read_message(&mut &wire[..], options).expect("read");
        let root = message.get_root::<rpc_message::Reader>().expect("root");
        let Ok(rpc_message::Call(call)) = root.which() else {
            panic!("not a call");
        };
        let params: write_params::Reader = call
            .expect("call")
            .get_params()
            .expect("payload")
            .get_content()
            .get_as()
            .expect("params");
        (
            params.get_data().expect("data").to_vec(),
            params
                .get_write_id()
                .expect("id")
                .to_string()
                .expect("utf-8"),
        )
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8 | 1).collect()
    }

    #[test]
    fn a_stdin_chunk_leaves_as_its_own_segment_byte_for_byte_as_a_copied_one() {
        // What `capexec run` lays out: 32 KiB to 256 KiB, ids `stdin-N`.
        let pattern = pattern(256 * 1024);
        for len in [
            32 * 1024,
            32 * 1024 + 1,
            100_001,
            131_075,
            256 * 1024 - 3,
            256 * 1024,
        ] {
            for id in ["stdin-1", "stdin-123456789"] {
                let data = laid_out(&pattern[..len]);
                let (adopted, taken) = on_the_wire(&data, id);
                assert!(taken, "{len} bytes were copied into the message");
                assert!(
                    adopted == on_the_wire(&copied(&pattern[..len]), id).0,
                    "{len} bytes with id {id} differ on the wire"
                );
                assert_eq!(
                    read_back(&adopted),
                    (pattern[..len].to_vec(), id.to_string())
                );
                assert_eq!(data.as_slice(), &pattern[..len], "the shared bytes changed");
            }
        }
    }

    #[test]
    fn any_field_and_id_read_back_as_sent_whether_the_segment_is_taken_or_not() {
        // Other layouts than stdin's: where the call's other fields land
        // may differ from a copy's (a write id of about 8 KiB leaves the
        // first segment too full for the target, which a copy would put
        // in the spare room of the data's heap segment), but the message
        // reads back the same.
        let pattern = pattern(300 * 1024);
        let mut lens = vec![0, 1, 7, 8, 9, 2048, 8000];
        for base in [8 * 1024, 32 * 1024, 256 * 1024] {
            lens.extend((base - 9)..=(base + 8));
        }
        let mut ids = vec![0, 7, 8, 9, 100, 10 * 1024, 16 * 1024 + 8];
        ids.extend((8040..=8100).step_by(3));
        let mut taken_count = 0;
        for &id_len in &ids {
            let id = "w".repeat(id_len);
            for &len in &lens {
                let data = laid_out(&pattern[..len]);
                let (wire, taken) = on_the_wire(&data, &id);
                taken_count += usize::from(taken);
                assert_eq!(read_back(&wire), (pattern[..len].to_vec(), id.clone()));
                assert_eq!(data.as_slice(), &pattern[..len], "the shared bytes changed");
            }
        }
        assert!(taken_count > 0);
    }

    #[test]
    fn bytes_are_offered_to_one_message_only_and_copied_into_the_next() {
        let pattern = vec![0x5a_u8; 40_000];
        let data = laid_out(&pattern);
        let kept = data.clone();
        let (first, taken) = on_the_wire(&data, "stdin-1");
        assert!(taken);
        let (again, taken) = on_the_wire(&kept, "stdin-1");
        assert!(!taken);
        assert!(first == again);
        assert_eq!(kept.as_slice(), &pattern[..]);
        assert!(!on_the_wire(&copied(b"not laid out"), "stdin-2").1);
    }

    #[test]
    fn a_field_that_fits_the_first_segment_leaves_the_offer_untaken_and_is_copied() {
        // 2 KiB fit the message's first segment, so no segment is
        // allocated while the offer stands, and the field is copied in.
        let pattern = vec![0xa5_u8; 2048];
        let (wire, taken) = on_the_wire(&laid_out(&pattern), "stdin-1");
        assert!(!taken);
        assert!(wire == on_the_wire(&copied(&pattern), "stdin-1").0);
    }

    #[test]
    #[should_panic(expected = "a segment offered while another stands")]
    fn an_offer_made_while_another_stands_is_refused() {
        let outer = laid_out(&[0x11_u8; 40_000]);
        let inner = laid_out(&[0x22_u8; 40_000]);
        let (outer, inner) = (
            outer.offer().expect("laid out"),
            inner.offer().expect("laid out"),
        );
        // SAFETY: neither build makes a field.
        unsafe {
            capnp_rpc::with_offered_segment(outer, || {
                capnp_rpc::with_offered_segment(inner, || ());
            })
        };
    }

    #[test]
    fn an_offer_is_withdrawn_when_the_build_it_stands_for_panics() {
        let data = laid_out(&[1_u8; 40_000]);
        let segment = data.offer().expect("laid out");
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: the build makes no field.
            unsafe { capnp_rpc::with_offered_segment(segment, || panic!("the build failed")) }
        }));
        assert!(built.is_err());
        // A field of the same size, built later with no offer standing,
        // lies in zeroed memory of the message's own, not in the bytes
        // offered before.
        let mut message = capnp::message::Builder::new(capnp_rpc::MessageAllocator::new());
        let mut params = message.init_root::<write_params::Builder>();
        let field = params.reborrow().init_data(40_000);
        assert!(field.iter().all(|&byte| byte == 0));
        assert!(!std::ptr::eq(field.as_ptr(), data.as_slice().as_ptr()));
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
        assert_eq!(buffer.freeze().as_slice(), b"again");
    }

    #[test]
    #[should_panic(expected = "65 bytes in a buffer of 64")]
    fn a_length_beyond_the_capacity_is_refused() {
        let mut buffer = SegmentBuffer::with_capacity(64);
        // SAFETY: refused before anything is read.
        unsafe { buffer.set_len(65) };
    }
}
