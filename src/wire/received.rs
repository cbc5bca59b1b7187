//! Data fields of received messages handed on without a copy.
//!
//! A frame read from a connection (`net/frame.rs`) is one buffer, and the
//! data fields of its message (a command's output on the client, a write
//! to stdin on the server) are slices of it. [`bytes_of`] gives such a
//! slice as [`Bytes`] that share the frame's buffer, where a copy would
//! cost a pass over every byte of the stream (a tenth of a client's time
//! receiving output over TCP, see docs/PROFILES.md).
//!
//! The frame reader registers each big frame's buffer for as long as its
//! message is read ([`Received`]). Messages never leave the thread that
//! read them (capnp-rpc is `!Send`), so the register is the thread's own.
//! A slice that is not in a registered frame (a message built in this
//! process, a small frame) is copied, as before.

use std::cell::RefCell;
use std::collections::BTreeMap;

use bytes::Bytes;

/// Data shorter than this is copied: sharing saves little, and a small
/// slice should not keep a big frame's memory.
pub const SHARED_MIN_BYTES: usize = 16 * 1024;

/// The bound for data whose holder counts it by its bytes (a process's
/// stdin queue, an upload's waiting chunks): a shared slice keeps at most
/// twice its length alive.
pub const COUNTED_HELD_PER_BYTE: usize = 2;

thread_local! {
    /// The registered frames' buffers, by address, with the memory each
    /// keeps alive (its allocation, which may be larger than the frame).
    static RECEIVED: RefCell<BTreeMap<usize, (Bytes, usize)>> =
        const { RefCell::new(BTreeMap::new()) };
}

/// A frame's buffer, registered until this is dropped (with its message).
pub struct Received {
    start: usize,
}

impl Received {
    /// Registers `buffer`, whose allocation is `held` bytes (a slice of it
    /// keeps all of them); `None` for one too small to share from.
    pub fn register(buffer: &Bytes, held: usize) -> Option<Received> {
        if buffer.len() < SHARED_MIN_BYTES {
            return None;
        }
        let start = buffer.as_ptr() as usize;
        let held = held.max(buffer.len());
        RECEIVED
            .try_with(|received| received.borrow_mut().insert(start, (buffer.clone(), held)))
            .ok()?;
        Some(Received { start })
    }
}

impl Drop for Received {
    fn drop(&mut self) {
        let _ = RECEIVED.try_with(|received| received.borrow_mut().remove(&self.start));
    }
}

/// `data` as [`Bytes`]: sharing its frame's buffer if it lies in a
/// registered one and is at least `1 / most_held_per_byte` of the memory
/// that buffer keeps alive (so what the result holds is at most that many
/// times its own length, for whoever counts the bytes held), else a copy.
pub fn bytes_of(data: &[u8], most_held_per_byte: usize) -> Bytes {
    if data.len() >= SHARED_MIN_BYTES
        && let Some(shared) = shared(data, most_held_per_byte)
    {
        return shared;
    }
    Bytes::copy_from_slice(data)
}

fn shared(data: &[u8], most_held_per_byte: usize) -> Option<Bytes> {
    let at = data.as_ptr() as usize;
    RECEIVED
        .try_with(|received| {
            let received = received.borrow();
            let (&start, (buffer, held)) = received.range(..=at).next_back()?;
            let from = at - start;
            let to = from.checked_add(data.len())?;
            let held_enough = data.len().saturating_mul(most_held_per_byte) >= *held;
            (to <= buffer.len() && held_enough).then(|| buffer.slice(from..to))
        })
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer(len: usize) -> Bytes {
        Bytes::from((0..len).map(|i| (i % 251) as u8).collect::<Vec<u8>>())
    }

    #[test]
    fn a_slice_of_a_registered_buffer_shares_it_and_others_are_copied() {
        let frame = buffer(64 * 1024);
        let registered = Received::register(&frame, frame.len()).expect("big enough to register");
        let data = &frame[1000..1000 + 32 * 1024];
        let shared = bytes_of(data, 2);
        assert_eq!(shared.as_ptr(), data.as_ptr());
        assert_eq!(&shared[..], data);
        // Too small a part of its frame for the holder's bound: a copy.
        let quarter = &frame[..16 * 1024];
        let copied = bytes_of(quarter, 2);
        assert_ne!(copied.as_ptr(), quarter.as_ptr());
        assert_eq!(&copied[..], quarter);
        assert_eq!(bytes_of(quarter, 4).as_ptr(), quarter.as_ptr());
        // Short data is always copied.
        let short = &frame[..100];
        assert_ne!(bytes_of(short, 1000).as_ptr(), short.as_ptr());
        // Data from elsewhere: copied.
        let other = buffer(64 * 1024);
        assert_ne!(bytes_of(&other, 2).as_ptr(), other.as_ptr());
        // Once the frame is done with, its slices are copies.
        drop(registered);
        assert_ne!(bytes_of(data, 2).as_ptr(), data.as_ptr());
        // The shared slice outlives the register's hold on the buffer.
        drop(frame);
        assert_eq!(shared[5], ((1000 + 5) % 251) as u8);
    }

    #[test]
    fn data_reaching_past_its_frame_is_copied() {
        let whole = buffer(96 * 1024);
        let frame = whole.slice(..48 * 1024);
        let _registered = Received::register(&frame, frame.len()).expect("big enough to register");
        // Starts inside the registered frame, ends beyond it.
        let across = &whole[40 * 1024..72 * 1024];
        let copied = bytes_of(across, 2);
        assert_ne!(copied.as_ptr(), across.as_ptr());
        assert_eq!(&copied[..], across);
    }

    #[test]
    fn what_a_slice_may_keep_alive_is_the_buffers_whole_allocation() {
        // A 64 KiB frame read into a kept 2 MiB body: half of the frame is
        // a thirty-second of what a slice of it would hold.
        let frame = buffer(64 * 1024);
        let _registered = Received::register(&frame, 2 << 20).expect("big enough to register");
        let half = &frame[..32 * 1024];
        assert_ne!(bytes_of(half, 2).as_ptr(), half.as_ptr());
        assert_eq!(bytes_of(half, 64).as_ptr(), half.as_ptr());
    }

    #[test]
    fn small_buffers_are_not_registered() {
        assert!(Received::register(&buffer(SHARED_MIN_BYTES - 1), 1 << 20).is_none());
    }
}
