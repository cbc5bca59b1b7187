// capexec: the allocator of every message capnp-rpc builds, which can take
// a buffer of the caller's, already filled, as a segment.
//
// A `Data` field is otherwise allocated zeroed in the message's arena and
// then copied into: two passes over every byte a caller sends in bulk.
// Offered through `with_offered_segment` around the call that makes the
// field (`init_data`, or `init_pointer` of a list of bytes, which takes
// no `&mut` over them), a buffer holding a word of room and then the bytes
// becomes the segment that field lands in (a field too big for the
// segment the message has goes to a new segment, behind one word of
// landing pad), and the bytes are written to the connection from where
// they are.

use std::any::Any;
use std::cell::RefCell;
use std::ptr::NonNull;

use capnp::message::{Allocator, HeapAllocator};

/// Memory offered to be the next segment allocated on this thread, and
/// what keeps it alive.
pub struct OfferedSegment {
    start: NonNull<u8>,
    words: u32,
    _owner: Box<dyn Any>,
}

impl OfferedSegment {
    /// `words` words at `start`, kept alive by `owner` until the message
    /// lets go of the segment.
    ///
    /// # Safety
    ///
    /// `start` must be aligned to 8 bytes and valid for reads and writes of
    /// `words * 8` bytes for as long as `owner` lives, and nothing else may
    /// write those bytes while the message holds them. The message writes
    /// its landing pad, the first word; the rest must be as the message is
    /// to carry it: the field's bytes, then zeros to the end of the last
    /// word.
    pub unsafe fn new(start: NonNull<u8>, words: u32, owner: Box<dyn Any>) -> OfferedSegment {
        OfferedSegment {
            start,
            words,
            _owner: owner,
        }
    }
}

thread_local! {
    static OFFERED: RefCell<Option<OfferedSegment>> = const { RefCell::new(None) };
}

/// Runs `build` with `segment` offered: the first segment allocated on
/// this thread meanwhile whose size is exactly `segment`'s is `segment`.
/// Returns what `build` returned and whether the segment was taken (by
/// whatever allocated: the caller checks that its field landed there).
///
/// # Safety
///
/// Once taken, the segment is memory its owner shares, and the message
/// must never write it again: while the message lives, the field made in
/// `build` is not set, initialised or cleared anew, nor the message's root
/// initialised anew (each zeroes the old object, in the segment). `build`
/// makes no offer of its own (one made while another stands panics) and
/// allocates in no other message, which could take the offer.
pub unsafe fn with_offered_segment<R>(
    segment: OfferedSegment,
    build: impl FnOnce() -> R,
) -> (R, bool) {
    /// Withdraws the offer however `build` ends, unwinding too: left
    /// standing, it would be taken by some later allocation of its size.
    struct Withdraw;
    impl Drop for Withdraw {
        fn drop(&mut self) {
            OFFERED.with(|offered| offered.borrow_mut().take());
        }
    }
    OFFERED.with(|offered| {
        let mut offered = offered.borrow_mut();
        assert!(offered.is_none(), "a segment offered while another stands");
        *offered = Some(segment);
    });
    let withdraw = Withdraw;
    let built = build();
    let taken = OFFERED.with(|offered| offered.borrow().is_none());
    drop(withdraw);
    (built, taken)
}

/// Takes the offered segment if it is `words` words long: no smaller, so
/// that it holds what asks for it, and no bigger, so that nothing else is
/// ever placed in it (the arena hands out what is left of a segment, and
/// expects it zeroed).
fn take_offered(words: u32) -> Option<OfferedSegment> {
    OFFERED.with(|offered| {
        let mut offered = offered.borrow_mut();
        match offered.as_ref() {
            Some(segment) if segment.words == words => offered.take(),
            _ => None,
        }
    })
}

/// A `HeapAllocator` that takes an offered segment when one fits.
pub struct MessageAllocator {
    heap: HeapAllocator,
    taken: Vec<OfferedSegment>,
}

impl MessageAllocator {
    pub fn new() -> MessageAllocator {
        MessageAllocator {
            heap: HeapAllocator::new(),
            taken: Vec::new(),
        }
    }

    /// As `HeapAllocator::first_segment_words`.
    pub fn first_segment_words(self, words: u32) -> MessageAllocator {
        MessageAllocator {
            heap: self.heap.first_segment_words(words),
            ..self
        }
    }
}

impl Default for MessageAllocator {
    fn default() -> Self {
        MessageAllocator::new()
    }
}

// SAFETY: a segment is either the heap allocator's (zeroed) or an offered
// one, which its offerer vouched for (`OfferedSegment::new`) and which is
// taken only at its exact size, so the arena places nothing in it beyond
// what asked for it; each is given back to whoever made it.
unsafe impl Allocator for MessageAllocator {
    fn allocate_segment(&mut self, minimum_size: u32) -> (NonNull<u8>, u32) {
        if let Some(segment) = take_offered(minimum_size) {
            let taken = (segment.start, segment.words);
            self.taken.push(segment);
            return taken;
        }
        self.heap.allocate_segment(minimum_size)
    }

    unsafe fn deallocate_segment(&mut self, ptr: NonNull<u8>, word_size: u32, words_used: u32) {
        if let Some(at) = self.taken.iter().position(|segment| segment.start == ptr) {
            drop(self.taken.swap_remove(at));
            return;
        }
        // SAFETY: not one of ours, so the heap allocator's, as the caller
        // promises.
        unsafe { self.heap.deallocate_segment(ptr, word_size, words_used) }
    }
}
