//! A message body being read: word-aligned memory that is filled byte by
//! byte straight from the socket, without being zeroed first (a zeroed
//! buffer costs a pass over every byte of every big message, and the data
//! path moves hundreds of MiB a second through here).

use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use capnp::Word;

pub(crate) struct Body {
    /// `len` covers the whole words filled so far; a partly filled last
    /// word lies in the spare capacity.
    words: Vec<Word>,
    /// Bytes filled.
    filled: usize,
    /// Words there is room for (the allocation may be larger).
    size: usize,
}

/// Bodies of big frames are kept for the next big frame on the same
/// thread: memory the kernel has already given pages to. Without this a
/// stream of 256 KiB frames faulted in fresh pages for every frame (glibc
/// maps such allocations afresh, or gives the top of its heap back), each
/// fault zeroing a page the socket's bytes then overwrite: 15 % of the time
/// of a client receiving 1 GiB/s. Bodies of [`RECYCLED_MIN_BYTES`] to
/// [`RECYCLED_MAX_BYTES`] are kept, [`RECYCLED_TOTAL_BYTES`] at most, and
/// [`release_recycled`] gives them back. The total, not a count: output
/// handed on without a copy keeps its frames until it is written (the
/// pushes in flight, the batches queued, the output thread's), a dozen
/// 256 KiB bodies on a busy stream.
const RECYCLED_TOTAL_BYTES: usize = 8 << 20;
pub(crate) const RECYCLED_MIN_BYTES: usize = 64 * 1024;
const RECYCLED_MAX_BYTES: usize = 2 << 20;

/// One thread's kept bodies. Shared, because a body whose data was handed
/// on without a copy (`wire::received`) is done with wherever its last
/// slice is dropped (the client's output thread, a stdin writer), and
/// belongs back with the thread that reads frames.
#[derive(Clone, Default)]
pub(crate) struct Pool(Arc<Mutex<Kept>>);

#[derive(Default)]
struct Kept {
    bodies: Vec<Vec<Word>>,
    /// Set by [`release_recycled`], until the thread takes a body
    /// again: a slice dropped after the server gave its memory back (a
    /// closed connection's stdin, still draining) must not fill the pool
    /// of a thread that has stopped reading.
    closed: bool,
}

impl Pool {
    /// The calling thread's.
    pub fn home() -> Option<Pool> {
        RECYCLED.try_with(Pool::clone).ok()
    }

    /// Bodies kept now.
    #[cfg(test)]
    pub fn kept_count(&self) -> usize {
        self.kept().bodies.len()
    }

    fn kept(&self) -> MutexGuard<'_, Kept> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps the memory of a big frame's body that is done with, for the
    /// pool's thread's next.
    pub fn recycle(&self, mut words: Vec<Word>) {
        let bytes = words.capacity() * 8;
        if !(RECYCLED_MIN_BYTES..=RECYCLED_MAX_BYTES).contains(&bytes) {
            return;
        }
        words.clear();
        let mut kept = self.kept();
        let total: usize = kept.bodies.iter().map(|body| body.capacity() * 8).sum();
        if !kept.closed && total + bytes <= RECYCLED_TOTAL_BYTES {
            kept.bodies.push(words);
        }
    }
}

thread_local! {
    static RECYCLED: Pool = Pool::default();
}

/// Keeps the memory of a big frame's body that is done with, for the next
/// on this thread.
#[cfg(test)]
fn recycle(words: Vec<Word>) {
    // A thread being torn down drops it instead.
    if let Some(pool) = Pool::home() {
        pool.recycle(words);
    }
}

/// Gives the kept bodies' memory back to the allocator (before it returns
/// free memory to the system), and keeps none until the next big frame.
pub(crate) fn release_recycled() {
    if let Some(pool) = Pool::home() {
        let mut kept = pool.kept();
        kept.bodies.clear();
        kept.closed = true;
    }
}

/// A kept body with room for `words`, if there is one, for a frame of
/// `expected` words in all.
fn recycled(words: usize, expected: usize) -> Option<Vec<Word>> {
    if words * 8 < RECYCLED_MIN_BYTES {
        return None;
    }
    let pool = Pool::home()?;
    let mut kept = pool.kept();
    kept.closed = false;
    // The smallest that fits, and at most twice what the frame needs: a
    // slice of a received body holds the whole allocation, which the
    // holder's count of bytes (`wire::received`) must bound, and a 2 MiB
    // body kept for a 64 KiB frame would leave the next 2 MiB frame to
    // fault in fresh pages.
    let most = 2 * words.max(expected);
    let (index, _) = kept
        .bodies
        .iter()
        .enumerate()
        .filter(|(_, body)| (words..=most).contains(&body.capacity()))
        .min_by_key(|(_, body)| body.capacity())?;
    Some(kept.bodies.swap_remove(index))
}

impl Body {
    #[cfg(test)]
    pub fn with_capacity(words: usize) -> Body {
        Body::for_frame(words, words)
    }

    /// Room for `words` now, of a frame of `expected` words in all.
    pub fn for_frame(words: usize, expected: usize) -> Body {
        Body {
            words: recycled(words, expected).unwrap_or_else(|| Vec::with_capacity(words)),
            filled: 0,
            size: words,
        }
    }

    pub fn filled(&self) -> usize {
        self.filled
    }

    /// Room left, in bytes.
    pub fn room(&self) -> usize {
        self.size * 8 - self.filled
    }

    /// The unfilled bytes, to read into.
    pub fn unfilled(&mut self) -> &mut [MaybeUninit<u8>] {
        let start = self.filled % 8;
        let words = self.size - self.words.len();
        let spare = &mut self.words.spare_capacity_mut()[..words];
        let length = words * 8;
        // SAFETY: a `Word` is eight bytes (`repr(C, align(8))` over
        // `[u8; 8]`), so the spare words are `length` possibly
        // uninitialised bytes, which `MaybeUninit<u8>` may view in any way.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast::<MaybeUninit<u8>>(), length)
        };
        &mut bytes[start..]
    }

    /// Counts `count` more bytes as filled; they must have been written to
    /// the start of [`Body::unfilled`].
    pub fn filled_by(&mut self, count: usize) {
        assert!(count <= self.room(), "filled beyond the body");
        self.filled += count;
        // SAFETY: every byte of the first `filled / 8` words has been
        // written (through `unfilled` or `extend`), and the capacity holds
        // them (checked above).
        unsafe { self.words.set_len(self.filled / 8) };
    }

    /// Appends `bytes`, which must fit in [`Body::room`].
    pub fn extend(&mut self, bytes: &[u8]) {
        self.unfilled()[..bytes.len()].write_copy_of_slice(bytes);
        self.filled_by(bytes.len());
    }

    /// Makes room for `words` words in all, keeping what was filled (the
    /// partly filled last word included).
    pub fn grow_to(&mut self, words: usize) {
        let partial = self.filled % 8;
        let mut tail = [MaybeUninit::<u8>::uninit(); 8];
        if partial > 0 {
            // Beyond `len`, so not kept by the reallocation for certain.
            let start = self.filled - partial;
            self.filled = start;
            tail[..partial].copy_from_slice(&self.unfilled()[..partial]);
            self.filled = start + partial;
        }
        self.words.reserve_exact(words - self.words.len());
        self.size = words;
        if partial > 0 {
            self.filled -= partial;
            self.unfilled()[..partial].copy_from_slice(&tail[..partial]);
            self.filled += partial;
        }
    }

    /// The words, once every byte is filled.
    pub fn into_words(self) -> Vec<Word> {
        assert_eq!(self.filled, self.size * 8, "the body is not complete");
        self.words
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept_here() -> usize {
        Pool::home().map_or(0, |pool| pool.kept_count())
    }

    /// This thread's pool empty, and taking bodies as a reading thread's.
    fn fresh_pool() {
        release_recycled();
        if let Some(pool) = Pool::home() {
            pool.kept().closed = false;
        }
    }

    #[test]
    fn after_the_memory_is_given_back_nothing_is_kept_until_the_next_big_frame() {
        fresh_pool();
        let big = (256 * 1024) / 8;
        recycle(Vec::with_capacity(big));
        release_recycled();
        // A slice of an old frame, dropped after the trim.
        recycle(Vec::with_capacity(big));
        assert_eq!(kept_here(), 0);
        // The thread reads a big frame again: its body is kept after.
        let body = Body::with_capacity(big);
        recycle(body.words);
        assert_eq!(kept_here(), 1);
    }

    #[test]
    fn a_kept_body_more_than_twice_the_frame_is_not_taken() {
        fresh_pool();
        let kept = Vec::<Word>::with_capacity(RECYCLED_MAX_BYTES / 8);
        let at = kept.as_ptr();
        recycle(kept);
        // 64 KiB: a slice of it would hold 2 MiB.
        let small = Body::with_capacity((64 * 1024) / 8);
        assert_ne!(small.words.as_ptr(), at);
        // 256 KiB now, of a frame of 1 MiB: within twice the frame.
        let growing = Body::for_frame((256 * 1024) / 8, (1 << 20) / 8);
        assert_eq!(growing.words.as_ptr(), at);
    }

    #[test]
    fn big_bodies_are_reused_and_small_or_huge_ones_are_not() {
        fresh_pool();
        let big = (256 * 1024) / 8;
        let first = Body::with_capacity(big);
        let address = first.words.as_ptr();
        recycle(first.words);
        // The next big frame gets the same memory, a smaller big one too.
        let again = Body::with_capacity(big - 100);
        assert_eq!(again.words.as_ptr(), address);
        recycle(again.words);
        // Too big for what is kept: a new allocation, and not kept after.
        let bigger = Body::with_capacity(big * 2);
        assert_ne!(bigger.words.as_ptr(), address);
        let huge = Vec::<Word>::with_capacity(RECYCLED_MAX_BYTES / 8 + 1);
        recycle(huge);
        recycle(Vec::with_capacity(RECYCLED_MIN_BYTES / 8 - 1));
        assert_eq!(kept_here(), 1);
        for _ in 0..2 * RECYCLED_TOTAL_BYTES / (big * 8) {
            recycle(Vec::with_capacity(big));
        }
        assert_eq!(kept_here(), RECYCLED_TOTAL_BYTES / (big * 8));
        release_recycled();
        assert_eq!(kept_here(), 0);
        drop(bigger);
    }

    #[test]
    fn the_smallest_kept_body_that_fits_is_taken() {
        fresh_pool();
        let (small, large) = ((128 * 1024) / 8, (1 << 20) / 8);
        let kept_large = Vec::<Word>::with_capacity(large);
        let kept_small = Vec::<Word>::with_capacity(small);
        let (large_at, small_at) = (kept_large.as_ptr(), kept_small.as_ptr());
        // The large one first: a first fit would take it.
        recycle(kept_large);
        recycle(kept_small);
        let body = Body::with_capacity(small - 10);
        assert_eq!(body.words.as_ptr(), small_at);
        let body_large = Body::with_capacity(large / 2);
        assert_eq!(body_large.words.as_ptr(), large_at);
        assert_eq!(kept_here(), 0);
        drop((body, body_large));
    }

    #[test]
    fn bytes_written_in_uneven_pieces_survive_growth() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let mut body = Body::with_capacity(10);
        body.extend(&data[..13]);
        for (at, end) in [(13, 77), (77, 80)] {
            let piece = &data[at..end];
            body.unfilled()[..piece.len()].write_copy_of_slice(piece);
            body.filled_by(piece.len());
        }
        assert_eq!(body.room(), 0);
        body.grow_to(125);
        body.extend(&data[80..997]);
        body.grow_to(125);
        body.extend(&data[997..]);
        assert_eq!(body.filled(), 1000);
        let words = body.into_words();
        assert_eq!(Word::words_to_bytes(&words), &data[..]);
    }
}
