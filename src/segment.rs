//! Bytes laid out to leave as a Cap'n Proto segment of their own.
//!
//! A `Data` field is otherwise put in its message the way Cap'n Proto puts
//! any field: room for it is allocated zeroed, and the bytes are copied
//! in: two passes over every byte sent in bulk, a sixth of a client
//! relaying its stdin (docs/PROFILES.md, "Stdin into `wc -c`: the
//! client's copies") and of a server sending a command's output. A
//! [`SegmentBuffer`] is read into as the segment its field will land in
//! is laid out: one word of room for the landing pad the message writes
//! there, the bytes, zeros to the end of the last word. The message then
//! takes that memory as it is (`capnp_rpc::with_offered_segment`, through
//! [`place_data`]), and the connection writes it from there.
//!
//! Bytes laid out so travel either as [`OutgoingBytes`] (a client's stdin)
//! or as plain [`Bytes`] (a command's output, kept in the engine's log as
//! any other): those are recognised again where a message is built
//! ([`OutgoingBytes::from`]), by the address they start at, in a table of
//! every laid-out buffer alive (`LAID`).
//!
//! No `&mut` is ever made over bytes a message took: Cap'n Proto's own
//! `init_data` would make one, which (under Stacked Borrows) ends the
//! right of every `Bytes` made before it to read them, and the engine's
//! log keeps reading them (another subscriber, a hand-over). The field is
//! made as the plain byte list a `Data` field is on the wire instead
//! ([`data_field`], [`place_data`]), through Cap'n Proto's raw builders.
//!
//! Memory, layout and fields only: which messages take such bytes is for
//! the layers that build them (`net`, `rpc`); a message of one such field
//! is sent with `send_with_data`.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use bytes::Bytes;
use bytes::buf::UninitSlice;
use capnp::introspect::{Introspect, Type, TypeVariant};
use capnp::private::layout::{PointerBuilder, StructBuilder, StructReader, StructSize};
use capnp::schema_capnp::field;
use capnp::traits::{
    FromPointerBuilder, HasStructSize, IntoInternalStructReader, OwnedStruct, SetterInput,
};
use capnp::{dynamic_value, primitive_list};

/// The bytes of a Cap'n Proto word.
const WORD: usize = 8;

/// The fewest bytes a buffer handed out as plain [`Bytes`] is listed for
/// ([`SegmentBuffer::freeze_to_bytes`]), and `Bytes` looked up: a copy of
/// fewer costs little next to a message's other work (capnp-rpc's first
/// segment holds 8 KiB; fewer bytes than that are copied into it anyway).
pub const LISTED_MIN: usize = 16 * 1024;

/// Every laid-out buffer handed out as plain [`Bytes`] and alive, by the
/// address its bytes start at: a segment removes itself before its memory
/// goes, so an address found here is that segment's while the `Weak`
/// upgrades.
static LAID: Mutex<BTreeMap<usize, Weak<Segment>>> = Mutex::new(BTreeMap::new());

/// Memory laid out as a segment: `words` words at `start` (all of the
/// allocation), the first the landing pad's, then the bytes, then zeros.
struct Segment {
    start: NonNull<u64>,
    words: usize,
    len: usize,
    /// Offered to a message, until it lets go of it: a message writes its
    /// landing pad into the first word, and a second message must not
    /// write it while the first may still be reading it on its way out.
    offered: AtomicBool,
    /// In [`LAID`] (handed out as plain `Bytes`).
    listed: bool,
}

// SAFETY: the memory is owned by the segment and, once shared, only read,
// but for the landing pad word, which the one message it is offered to
// (`offered`) writes on the thread that builds it.
unsafe impl Send for Segment {}
// SAFETY: as above; shared readers see only the bytes after the first
// word, which nothing writes once the segment is shared.
unsafe impl Sync for Segment {}

impl Segment {
    /// The bytes, through a reference made afresh from `start` each time.
    /// (A message takes the segment through raw pointers only, see
    /// [`place_data`]: nothing ends a reference made before.)
    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes after the first word are initialised and lie
        // within the allocation (`words` is enough for them, see
        // `SegmentBuffer::lay_out`), and nothing writes them once shared.
        unsafe { std::slice::from_raw_parts(self.start.as_ptr().cast::<u8>().add(WORD), self.len) }
    }

    fn address(&self) -> usize {
        self.start.as_ptr() as usize + WORD
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.listed {
            // Before the memory goes: no lookup may find this address
            // once something else may be allocated there.
            let mut laid = LAID.lock().unwrap_or_else(PoisonError::into_inner);
            laid.remove(&self.address());
        }
        // SAFETY: a boxed slice of `words` words, given up in `lay_out`.
        drop(unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.start.as_ptr().cast::<MaybeUninit<u64>>(),
                self.words,
            ))
        });
    }
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Segment({} bytes)", self.len)
    }
}

/// What keeps a segment handed out as plain [`Bytes`] alive.
struct SharedSegment(Arc<Segment>);

/// What keeps a segment offered to a message alive, and lets another
/// message take it once this one has let go of it (its landing pad
/// written and sent).
struct Offered(Arc<Segment>);

impl Drop for Offered {
    fn drop(&mut self) {
        self.0.offered.store(false, Ordering::Release);
    }
}

impl AsRef<[u8]> for SharedSegment {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
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
    /// Laid out if `bytes` are exactly the bytes of a buffer handed out by
    /// [`SegmentBuffer::freeze_to_bytes`] (not a slice of them, which
    /// would take the rest along), shared as they are otherwise.
    fn from(bytes: Bytes) -> OutgoingBytes {
        OutgoingBytes(match laid_out(&bytes) {
            Some(segment) => Shape::Laid(segment),
            None => Shape::Shared(bytes),
        })
    }
}

/// The segment `bytes` are exactly the bytes of, if any.
fn laid_out(bytes: &Bytes) -> Option<Arc<Segment>> {
    if bytes.len() < LISTED_MIN {
        return None;
    }
    let segment = {
        let laid = LAID.lock().unwrap_or_else(PoisonError::into_inner);
        laid.get(&(bytes.as_ptr() as usize))?.upgrade()?
    };
    // Dropped outside the lock: were it the last reference, its drop
    // would take the lock.
    (segment.len == bytes.len()).then_some(segment)
}

impl OutgoingBytes {
    /// The bytes (made afresh from the segment each time, see
    /// `Segment::bytes`).
    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            Shape::Shared(bytes) => bytes,
            Shape::Laid(segment) => segment.bytes(),
        }
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether these bytes are laid out as a segment of their own.
    pub fn is_laid_out(&self) -> bool {
        matches!(self.0, Shape::Laid(_))
    }

    /// Whether these bytes are laid out as a segment that no message
    /// holds now (one message at a time may take it).
    pub fn is_offerable(&self) -> bool {
        match &self.0 {
            Shape::Laid(segment) => !segment.offered.load(Ordering::Acquire),
            Shape::Shared(_) => false,
        }
    }

    /// The segment to offer the message that carries these bytes: `None`
    /// while another message holds it, or for bytes not laid out as one.
    pub(crate) fn offer(&self) -> Option<capnp_rpc::OfferedSegment> {
        let Shape::Laid(segment) = &self.0 else {
            return None;
        };
        if segment.offered.swap(true, Ordering::AcqRel) {
            return None;
        }
        let held = Offered(Arc::clone(segment));
        let words = u32::try_from(segment.words).ok()?;
        // SAFETY: `start` is aligned to a word and valid for `words` words
        // while the owner given here (a reference to the segment) lives;
        // the bytes after the first word are the field's, zero-padded to a
        // word (`SegmentBuffer::lay_out`), and nothing else writes any of
        // it: shared readers only read, and the first word is offered to
        // one message at a time (`offered`, cleared when the owner goes).
        Some(unsafe {
            capnp_rpc::OfferedSegment::new(segment.start.cast::<u8>(), words, Box::new(held))
        })
    }
}

/// Makes the `Data` field `field` (see [`data_field`]) of `data`'s length
/// and puts `data` in it: as the segment `data` is laid out as, if the
/// message takes it (it lands right after the landing pad it leaves room
/// for), else a copy. Returns whether it was taken. The field is made as
/// the byte list it is on the wire, through raw builders: nothing makes a
/// `&mut` over a taken segment's bytes, which `Bytes` elsewhere may read.
///
/// # Safety
///
/// This is the field's last write: while the message lives, nothing sets,
/// clears or initialises the field anew, nor anything that holds it (each
/// zeroes the old field, which may be `data`'s shared segment); and the
/// message allocates nothing else meanwhile (which could take the offer).
///
/// # Panics
///
/// If `data` is 4 GiB or more, which no message could carry.
pub unsafe fn place_data(data: &OutgoingBytes, field: PointerBuilder<'_>) -> bool {
    let expected = data.as_slice().as_ptr() as usize;
    let len = u32::try_from(data.len()).expect("a field of less than 4 GiB");
    let mut list = match data.offer() {
        // SAFETY: the field made here is the message's last write to it,
        // and nothing else allocates meanwhile (this function's contract).
        Some(segment) => unsafe {
            capnp_rpc::with_offered_segment(segment, || {
                primitive_list::Builder::<u8>::init_pointer(field, len)
            })
            .0
        },
        None => primitive_list::Builder::<u8>::init_pointer(field, len),
    };
    // Where the field lies, not whether some allocation took the offer,
    // says whether the bytes are in it (looked at through a shared view).
    let lies_at = list
        .reborrow()
        .into_reader()
        .as_slice()
        .map(|bytes| bytes.as_ptr() as usize);
    if lies_at == Some(expected) {
        return true;
    }
    // Otherwise copied in, as any other data, into the field made zeroed
    // in the message's own memory.
    if let Some(room) = list.as_slice() {
        room.copy_from_slice(data.as_slice());
    }
    false
}

/// Sends `request` with its `Data` field `name` set to `data`, as
/// [`place_data`] does: made last (the other fields are set before), and
/// the request sent at once.
///
/// # Safety
///
/// `request` is one of capnp-rpc's (a call on a capability of its RPC
/// system, local or remote): those never write a request's parameters
/// once it is sent. A request of another hook could, and would write over
/// `data`'s shared bytes.
pub(crate) unsafe fn send_with_data<P, R>(
    mut request: capnp::capability::Request<P, R>,
    data: &OutgoingBytes,
    name: &str,
) -> capnp::Result<capnp::capability::RemotePromise<R>>
where
    P: capnp::traits::Owned + OwnedStruct,
    for<'a> <P as capnp::traits::Owned>::Builder<'a>: Into<dynamic_value::Builder<'a>>,
    R: capnp::traits::Pipelined + capnp::traits::Owned + 'static + Unpin,
    <R as capnp::traits::Pipelined>::Pipeline: capnp::capability::FromTypelessPipeline,
{
    let field = data_field::<P>(request.get(), name)?;
    // SAFETY: the field is made in this request's message alone, which is
    // sent as it is, and capnp-rpc writes nothing of it again (this
    // function's contract).
    unsafe { place_data(data, field) };
    Ok(request.send())
}

/// The pointer of `builder`'s `Data` field `name` (a struct of type `T`),
/// for [`place_data`]: found by name in the struct's schema, so no field's
/// place is written down twice.
pub fn data_field<'a, T: OwnedStruct>(
    builder: impl Into<dynamic_value::Builder<'a>>,
    name: &str,
) -> capnp::Result<PointerBuilder<'a>> {
    let dynamic_value::Builder::Struct(dynamic) = builder.into() else {
        return Err(capnp::Error::failed(format!("{name}: not in a struct")));
    };
    let TypeVariant::Struct(expected) = T::introspect().which() else {
        return Err(capnp::Error::failed(format!(
            "{name}: not asked of a struct"
        )));
    };
    let schema = dynamic.get_schema();
    if schema.get_proto().get_id()
        != capnp::schema::StructSchema::new(expected)
            .get_proto()
            .get_id()
    {
        return Err(capnp::Error::failed(format!(
            "{name}: a builder of another struct"
        )));
    }
    let field = schema.get_field_by_name(name)?;
    // A union's member would need its discriminant set too.
    if field.get_proto().get_discriminant_value() != field::NO_DISCRIMINANT {
        return Err(capnp::Error::failed(format!("{name}: a member of a union")));
    }
    let pointer = match (field.get_type().which(), field.get_proto().which()?) {
        (TypeVariant::Data, field::Slot(slot)) => u16::try_from(slot.get_offset())
            .map_err(|_| capnp::Error::failed(format!("{name}: no pointer field")))?,
        _ => return Err(capnp::Error::failed(format!("{name}: not a Data field"))),
    };
    let Plain(plain, _) = dynamic.downcast::<AsPlain<T>>();
    Ok(plain.get_pointer_field(pointer.into()))
}

/// The struct type `T` seen as the plain struct it is on the wire, to
/// reach its fields' pointers (`data_field`): Cap'n Proto hands a
/// dynamic struct over to the type whose schema it has, and this one has
/// `T`'s.
struct AsPlain<T>(PhantomData<T>);

/// A struct builder of [`AsPlain`].
struct Plain<'a, T>(StructBuilder<'a>, PhantomData<T>);

/// A struct reader of [`AsPlain`] (which nothing reads as one).
struct PlainReader<'a>(StructReader<'a>);

impl<T: Introspect> Introspect for AsPlain<T> {
    fn introspect() -> Type {
        T::introspect()
    }
}

impl<T: OwnedStruct> OwnedStruct for AsPlain<T> {
    type Reader<'a> = PlainReader<'a>;
    type Builder<'a> = Plain<'a, T>;
}

impl<'a, T> From<StructBuilder<'a>> for Plain<'a, T> {
    fn from(builder: StructBuilder<'a>) -> Self {
        Plain(builder, PhantomData)
    }
}

impl<'a, T: OwnedStruct> HasStructSize for Plain<'a, T> {
    const STRUCT_SIZE: StructSize = <T::Builder<'a> as HasStructSize>::STRUCT_SIZE;
}

impl<'a> From<StructReader<'a>> for PlainReader<'a> {
    fn from(reader: StructReader<'a>) -> Self {
        PlainReader(reader)
    }
}

impl<'a> IntoInternalStructReader<'a> for PlainReader<'a> {
    fn into_internal_struct_reader(self) -> StructReader<'a> {
        self.0
    }
}

impl<T: OwnedStruct> SetterInput<AsPlain<T>> for PlainReader<'_> {
    fn set_pointer_builder(
        mut builder: PointerBuilder<'_>,
        input: Self,
        canonicalize: bool,
    ) -> capnp::Result<()> {
        builder.set_struct(&input.0, canonicalize)
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

    /// The bytes read, laid out as their segment, to send as
    /// [`OutgoingBytes`].
    pub fn freeze(self) -> OutgoingBytes {
        OutgoingBytes(Shape::Laid(Arc::new(self.lay_out(false))))
    }

    /// The bytes read, laid out as their segment, as plain [`Bytes`] to
    /// keep and hand on as any others; [`OutgoingBytes::from`] finds the
    /// segment again while they live, if they are [`LISTED_MIN`] bytes or
    /// more.
    pub fn freeze_to_bytes(self) -> Bytes {
        let listed = self.len >= LISTED_MIN;
        let segment = Arc::new(self.lay_out(listed));
        if listed {
            let mut laid = LAID.lock().unwrap_or_else(PoisonError::into_inner);
            laid.insert(segment.address(), Arc::downgrade(&segment));
        }
        Bytes::from_owner(SharedSegment(segment))
    }

    /// The words the bytes take: the landing pad's, zeroed, then the
    /// bytes, the last word zero-padded. The segment offered is just those
    /// words (a message takes one only at the exact size it asks for), and
    /// the allocation is cut to them, so that what a chunk keeps alive is
    /// what it holds (glibc's `realloc` shrinks in place).
    fn lay_out(self, listed: bool) -> Segment {
        let SegmentBuffer { words, len } = self;
        let needed = 1 + len.div_ceil(WORD);
        let mut words = words.into_vec();
        // (`into_boxed_slice` below gives back what is cut off.)
        words.truncate(needed);
        words[0] = MaybeUninit::new(0);
        let pad = (needed - 1) * WORD - len;
        // SAFETY: bytes WORD + len .. WORD + len + pad lie within the
        // `needed` words `words` holds.
        unsafe {
            words
                .as_mut_ptr()
                .cast::<u8>()
                .add(WORD + len)
                .write_bytes(0, pad)
        };
        let raw = Box::into_raw(words.into_boxed_slice());
        Segment {
            // SAFETY: a boxed slice's pointer is never null.
            start: unsafe { NonNull::new_unchecked(raw.cast::<u64>()) },
            words: needed,
            len,
            offered: AtomicBool::new(false),
            listed,
        }
    }
}

// SAFETY: `chunk_mut` is the spare capacity, which `advance_mut` counts as
// read into, within the capacity (`set_len` panics beyond it).
unsafe impl bytes::BufMut for SegmentBuffer {
    fn remaining_mut(&self) -> usize {
        self.capacity() - self.len
    }

    unsafe fn advance_mut(&mut self, count: usize) {
        // SAFETY: the caller initialised `count` bytes of `chunk_mut`.
        unsafe { self.set_len(self.len + count) }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        UninitSlice::uninit(self.spare_capacity_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    fn read_into(buffer: &mut SegmentBuffer, bytes: &[u8]) {
        let spare = buffer.spare_capacity_mut();
        for (to, from) in spare.iter_mut().zip(bytes) {
            to.write(*from);
        }
        // SAFETY: the loop initialised `bytes.len()` bytes after those
        // read before (the callers keep within the capacity).
        unsafe { buffer.set_len(buffer.len() + bytes.len()) };
    }

    #[test]
    fn a_buffer_read_in_pieces_keeps_them_in_order_and_clears() {
        let mut buffer = SegmentBuffer::with_capacity(64);
        assert_eq!(buffer.capacity(), 64);
        read_into(&mut buffer, b"hello, ");
        buffer.put_slice(b"world");
        assert_eq!(buffer.as_slice(), b"hello, world");
        assert_eq!(buffer.spare_capacity_mut().len(), 64 - 12);
        assert_eq!(buffer.remaining_mut(), 64 - 12);
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

    #[test]
    fn bytes_handed_out_plain_are_found_again_whole_and_only_while_they_live() {
        let mut buffer = SegmentBuffer::with_capacity(64 * 1024);
        buffer.put_slice(&[7; 40_000]);
        let bytes = buffer.freeze_to_bytes();
        assert_eq!(&bytes[..], &[7; 40_000][..]);
        assert!(OutgoingBytes::from(bytes.clone()).is_laid_out());
        // A slice would take the rest of the segment along: not laid out,
        // whether it starts where the bytes do or not.
        assert!(!OutgoingBytes::from(bytes.slice(..39_999)).is_laid_out());
        assert!(!OutgoingBytes::from(bytes.slice(8..)).is_laid_out());
        // Nor an equal copy.
        assert!(!OutgoingBytes::from(Bytes::copy_from_slice(&bytes)).is_laid_out());
        let kept = OutgoingBytes::from(bytes.clone());
        let Shape::Laid(segment) = &kept.0 else {
            panic!("not laid out");
        };
        let (address, segment) = (segment.address(), Arc::downgrade(segment));
        let listed = || {
            let laid = LAID.lock().expect("table");
            laid.get(&address)
                .is_some_and(|entry| entry.ptr_eq(&segment))
        };
        drop(bytes);
        // Still listed while anything holds the segment, and gone with it.
        assert!(listed());
        drop(kept);
        assert!(!listed());
        assert!(segment.upgrade().is_none());
    }

    #[test]
    fn the_bytes_end_in_zeros_to_the_word_and_are_offered_to_one_message_at_a_time() {
        for len in [0, 1, 7, 8, 9, 4095, 16_383, 16_384, 16_385, 65_536] {
            let mut buffer = SegmentBuffer::with_capacity(65_536);
            buffer.put_slice(&vec![0xff; len]);
            let bytes = buffer.freeze_to_bytes();
            assert_eq!(
                OutgoingBytes::from(bytes.clone()).is_laid_out(),
                len >= LISTED_MIN
            );
            let mut buffer = SegmentBuffer::with_capacity(65_536);
            buffer.put_slice(&vec![0xff; len]);
            let data = buffer.freeze();
            let Shape::Laid(segment) = &data.0 else {
                panic!("{len} bytes not laid out");
            };
            assert_eq!(segment.words, 1 + len.div_ceil(WORD));
            // SAFETY: the segment's words are initialised, and nothing
            // writes them (never offered yet).
            let padded = unsafe {
                std::slice::from_raw_parts(
                    segment.start.as_ptr().cast::<u8>(),
                    segment.words * WORD,
                )
            };
            assert!(
                padded[..WORD].iter().all(|&byte| byte == 0),
                "the landing pad"
            );
            assert!(padded[WORD..WORD + len].iter().all(|&byte| byte == 0xff));
            assert!(padded[WORD + len..].iter().all(|&byte| byte == 0), "{len}");
            let offer = data.offer();
            assert!(offer.is_some());
            assert!(!data.is_offerable());
            assert!(data.clone().offer().is_none());
            drop(offer);
            assert!(data.is_offerable());
            assert!(data.offer().is_some());
        }
    }
}
