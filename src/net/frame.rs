//! Reading Cap'n Proto frames from a socket with memory that follows the
//! bytes that actually arrive.
//!
//! capnp's own reader allocates (and zero-fills) the whole size a frame's
//! 8-byte header announces before a byte of the message is there, so a
//! peer could make this process hold any amount of memory up to the limit
//! with a few bytes per connection. Here a header is checked against a
//! limit the caller chooses per frame (small before login), and the body
//! grows only as its bytes come in: a frame that announces 16 MiB and sends
//! nothing costs at most [`FIRST_BODY_BYTES`] of new memory (it may be
//! given a kept body of up to 2 MiB, which the thread holds anyway: see
//! `body`).
//!
//! Small frames are read through a staging buffer, several per read(2),
//! and copied once into a buffer of their own (as a buffered reader would);
//! big bodies are read straight into their buffer.

use capnp::Word;
use capnp::message::{Reader, ReaderOptions, ReaderSegments};
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

use bytes::Bytes;

use crate::net::body::{Body, Pool};
use crate::wire::received::{self, Received};

/// capnp's own bound on the segments of one message.
pub(crate) const MAX_SEGMENTS: usize = 512;

/// How much of a big body is allocated before its bytes arrive; it then
/// grows fourfold whenever it is full, up to the size the header announced.
/// A data path's chunk (256 KiB: a download's, a port connection's) and
/// its message's envelope fit, so the bulk of the traffic is read into one
/// allocation, never moved to a bigger one. (Before login a message is at
/// most 4 KiB; after, a connection's calls may hold 64 MiB anyway.)
pub(crate) const FIRST_BODY_BYTES: usize = (256 + 4) * 1024;

/// The staging buffer's first size: a login and its bootstrap fit. It
/// doubles (up to the caller's limit) whenever a read fills it, so only a
/// busy connection pays for a big one.
const FIRST_STAGING_BYTES: usize = 1024;

/// A frame's segment table, read and checked, its body not yet read.
#[derive(Debug)]
pub(crate) struct Header {
    /// Length of the first segment, in words.
    first: u32,
    /// Lengths of the others (none, and no allocation, for most frames).
    more: Vec<u32>,
    total_words: usize,
}

impl Header {
    /// The whole message, in bytes (the table excluded).
    pub fn body_bytes(&self) -> usize {
        self.total_words * 8
    }
}

/// The segments of a received frame: one buffer, split at the segment
/// boundaries.
pub(crate) struct FrameSegments {
    words: Words,
    /// End of each segment but the last, in words; empty for the usual
    /// single-segment message, which then needs no allocation of its own.
    ends: Box<[usize]>,
}

/// A frame's buffer: its own, or, for a big frame, shared with the data
/// slices handed on from it without a copy (`wire::received`).
enum Words {
    Owned(Vec<Word>),
    Shared {
        bytes: Bytes,
        _registered: Option<Received>,
    },
}

impl Words {
    fn new(words: Vec<Word>) -> Words {
        if words.len() * 8 < received::SHARED_MIN_BYTES {
            return Words::Owned(words);
        }
        let held = words.capacity() * 8;
        let bytes = Bytes::from_owner(SharedWords {
            home: Pool::home(),
            words,
        });
        Words::Shared {
            _registered: Received::register(&bytes, held),
            bytes,
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Words::Owned(words) => Word::words_to_bytes(words),
            Words::Shared { bytes, .. } => bytes,
        }
    }
}

/// A big frame's words behind [`Bytes`]: given back to the pool of the
/// thread that read them when the last slice is dropped, wherever that is.
struct SharedWords {
    home: Option<Pool>,
    words: Vec<Word>,
}

impl AsRef<[u8]> for SharedWords {
    fn as_ref(&self) -> &[u8] {
        Word::words_to_bytes(&self.words)
    }
}

impl Drop for SharedWords {
    fn drop(&mut self) {
        if let Some(home) = &self.home {
            home.recycle(std::mem::take(&mut self.words));
        }
    }
}

// A body small enough to stay `Owned` is too small to be kept for reuse;
// every body worth keeping goes back to its pool as `SharedWords`.
const _: () = assert!(received::SHARED_MIN_BYTES <= crate::net::body::RECYCLED_MIN_BYTES);

impl ReaderSegments for FrameSegments {
    fn get_segment(&self, index: u32) -> Option<&[u8]> {
        let index = index as usize;
        if index > self.ends.len() {
            return None;
        }
        let bytes = self.words.as_bytes();
        let start = if index == 0 {
            0
        } else {
            self.ends[index - 1] * 8
        };
        let end = self.ends.get(index).map_or(bytes.len(), |end| end * 8);
        Some(&bytes[start..end])
    }

    fn len(&self) -> usize {
        self.ends.len() + 1
    }
}

/// A received message, ready for capnp-rpc.
pub(crate) struct Frame {
    message: Reader<FrameSegments>,
}

impl capnp_rpc::IncomingMessage for Frame {
    fn get_body(&self) -> capnp::Result<capnp::any_pointer::Reader<'_>> {
        self.message.get_root()
    }
}

/// Reads frames from `input`.
pub(crate) struct FrameReader<R> {
    input: R,
    /// Bytes read from `input` and not yet used: `staging[start..end]`.
    staging: Vec<u8>,
    start: usize,
    end: usize,
    /// The last read filled the staging buffer: more was waiting.
    busy: bool,
    /// The last frame's body was read straight into its buffer and
    /// nothing after it is staged: the next header is read alone (see
    /// [`FrameReader::read_header`]).
    after_big: bool,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Allocates nothing until the first read.
    pub fn new(input: R) -> FrameReader<R> {
        FrameReader {
            input,
            staging: Vec::new(),
            start: 0,
            end: 0,
            busy: false,
            after_big: false,
        }
    }

    /// Bytes the staging buffer holds (its allocation).
    #[cfg(test)]
    fn staging_capacity(&self) -> usize {
        self.staging.len()
    }

    /// Reads the next frame's segment table, with a staging buffer of at
    /// most `staging_limit` bytes (more only if a segment table needs it).
    /// `None` at end of input between frames.
    pub async fn read_header(&mut self, staging_limit: usize) -> capnp::Result<Option<Header>> {
        let size = self.staging.len();
        let wanted = if size == 0 {
            FIRST_STAGING_BYTES.min(staging_limit)
        } else if self.busy {
            (size * 2).min(staging_limit)
        } else {
            size
        };
        self.busy = false;
        self.grow_staging(wanted);
        // After a big body, the next is likely big too: a read into the
        // staging buffer would take up to its whole size of that body,
        // to be copied again into the body's buffer (a quarter of every
        // 256 KiB frame of a stream). One more read(2) of 8 bytes costs
        // less than that copy.
        let header_alone = std::mem::take(&mut self.after_big) && self.available() == 0;
        let filled = if header_alone {
            self.fill_at_most(8, 8).await?
        } else {
            self.fill(8).await?
        };
        if !filled {
            if self.available() == 0 {
                return Ok(None);
            }
            return Err(premature_end());
        }
        let first = &self.staging[self.start..self.start + 8];
        let count = u32::from_le_bytes([first[0], first[1], first[2], first[3]]) as usize + 1;
        if count > MAX_SEGMENTS {
            return Err(capnp::Error::failed(format!(
                "a frame announces {count} segments; at most {MAX_SEGMENTS} are accepted"
            )));
        }
        // Four bytes for the count, four per segment, padded to a word.
        let table_bytes = (4 * (count + 1)).next_multiple_of(8);
        let most = if header_alone {
            table_bytes.saturating_sub(self.available())
        } else {
            usize::MAX
        };
        if !self.fill_at_most(table_bytes, most).await? {
            return Err(premature_end());
        }
        let table = &self.staging[self.start + 4..self.start + 4 + 4 * count];
        let mut lengths = table
            .chunks_exact(4)
            .map(|length| u32::from_le_bytes([length[0], length[1], length[2], length[3]]));
        let first = lengths.next().unwrap_or(0);
        let more: Vec<u32> = lengths.collect();
        self.start += table_bytes;
        let total_words = more
            .iter()
            .fold(first as usize, |total, &length| total + length as usize);
        Ok(Some(Header {
            first,
            more,
            total_words,
        }))
    }

    /// Reads the body `header` announced.
    pub async fn read_body(
        &mut self,
        header: Header,
        options: ReaderOptions,
    ) -> capnp::Result<Frame> {
        let total_bytes = header.body_bytes();
        let buffered = self.available().min(total_bytes);
        let first_words = if buffered == total_bytes {
            // The common case: the whole frame is here already.
            header.total_words
        } else {
            let at_least = (FIRST_BODY_BYTES / 8).max(buffered.div_ceil(8));
            header.total_words.min(at_least)
        };
        let mut body = Body::for_frame(first_words, header.total_words);
        self.take_staged(&mut body, buffered);
        while body.filled() < total_bytes {
            if body.room() == 0 {
                let size = body.filled() / 8;
                body.grow_to(grown(size, header.total_words));
            }
            if total_bytes - body.filled() < self.staging.len() / 2 {
                // A short remainder: read it together with what follows.
                if !self.fill(1).await? {
                    return Err(premature_end());
                }
                let take = self.available().min(body.room());
                self.take_staged(&mut body, take);
                continue;
            }
            let read = {
                let mut into = ReadBuf::uninit(body.unfilled());
                std::future::poll_fn(|cx| Pin::new(&mut self.input).poll_read(cx, &mut into))
                    .await?;
                into.filled().len()
            };
            if read == 0 {
                return Err(premature_end());
            }
            body.filled_by(read);
        }
        self.after_big = total_bytes > self.staging.len() && self.available() == 0;
        let words = body.into_words();
        let mut ends = Vec::with_capacity(header.more.len());
        let mut end = header.first as usize;
        for &length in &header.more {
            ends.push(end);
            end += length as usize;
        }
        let segments = FrameSegments {
            words: Words::new(words),
            ends: ends.into_boxed_slice(),
        };
        Ok(Frame {
            message: Reader::new(segments, options),
        })
    }

    /// Reads and drops input until its end (or an error), or until
    /// `at_most` bytes were dropped.
    pub async fn discard_input(&mut self, at_most: usize) {
        self.start = 0;
        self.end = 0;
        self.grow_staging(FIRST_STAGING_BYTES);
        let mut dropped = 0;
        while dropped < at_most {
            match self.input.read(&mut self.staging).await {
                Ok(read) if read > 0 => dropped += read,
                _ => return,
            }
        }
    }

    fn available(&self) -> usize {
        self.end - self.start
    }

    /// Moves `count` staged bytes into `body`.
    fn take_staged(&mut self, body: &mut Body, count: usize) {
        body.extend(&self.staging[self.start..self.start + count]);
        self.start += count;
    }

    /// Makes the staging buffer at least `size` bytes.
    fn grow_staging(&mut self, size: usize) {
        if self.staging.len() >= size {
            return;
        }
        let mut bigger = vec![0; size];
        let unread = self.available();
        bigger[..unread].copy_from_slice(&self.staging[self.start..self.end]);
        self.staging = bigger;
        (self.start, self.end) = (0, unread);
    }

    /// Moves the unused bytes to the front of the staging buffer.
    fn compact(&mut self) {
        if self.start > 0 {
            self.staging.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// Reads until at least `wanted` bytes are staged; false at end of
    /// input before that.
    async fn fill(&mut self, wanted: usize) -> std::io::Result<bool> {
        self.fill_at_most(wanted, usize::MAX).await
    }

    /// [`FrameReader::fill`], reading at most `most` bytes more than are
    /// staged (at least the `wanted` bytes not staged yet).
    async fn fill_at_most(&mut self, wanted: usize, most: usize) -> std::io::Result<bool> {
        if self.available() >= wanted {
            return Ok(true);
        }
        if self.start + wanted > self.staging.len() {
            self.compact();
        }
        // A segment table may need more than the buffer has (512
        // segments: about 2 KiB).
        self.grow_staging(wanted);
        debug_assert!(
            most >= wanted - self.available(),
            "a read too short to fill"
        );
        let limit = self.end.saturating_add(most).min(self.staging.len());
        while self.available() < wanted {
            let read = self.input.read(&mut self.staging[self.end..limit]).await?;
            if read == 0 {
                return Ok(false);
            }
            self.end += read;
            // A read we limited says nothing of what was waiting.
            self.busy = most == usize::MAX && self.end == self.staging.len();
        }
        Ok(true)
    }
}

/// The next size of a full body buffer of `words` of `total` words: four
/// times what arrived, up to the announced size (a 256 KiB write grows
/// once, a 1 MiB read result twice).
fn grown(words: usize, total: usize) -> usize {
    (words * 4).clamp(FIRST_BODY_BYTES / 8, total)
}

fn premature_end() -> capnp::Error {
    capnp::Error::disconnected("the peer closed the connection in the middle of a message".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use capnp_rpc::IncomingMessage;
    use tokio::io::AsyncWriteExt;

    fn message_bytes(text_len: usize, segments: u32) -> Vec<u8> {
        let mut builder = capnp::message::Builder::new(
            capnp::message::HeapAllocator::new()
                .first_segment_words(8)
                .allocation_strategy(capnp::message::AllocationStrategy::FixedSize),
        );
        let mut root = builder.initn_root::<capnp::text_list::Builder>(segments);
        for index in 0..segments {
            root.set(index, "x".repeat(text_len));
        }
        capnp::serialize::write_message_to_words(&builder)
    }

    fn texts(frame: &Frame) -> Vec<String> {
        let list: capnp::text_list::Reader = frame.get_body().unwrap().get_as().unwrap();
        list.iter()
            .map(|text| text.unwrap().to_string().unwrap())
            .collect()
    }

    async fn read_all(bytes: Vec<u8>, staging: usize) -> Vec<capnp::Result<Frame>> {
        let (mut writer, reader) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            // Dribbled in uneven pieces, as a socket may deliver them.
            for piece in bytes.chunks(777) {
                writer.write_all(piece).await.unwrap();
            }
        });
        let mut frames = FrameReader::new(reader);
        let mut out = Vec::new();
        loop {
            match frames.read_header(staging).await {
                Ok(Some(header)) => {
                    out.push(frames.read_body(header, ReaderOptions::new()).await);
                }
                Ok(None) => break,
                Err(error) => {
                    out.push(Err(error));
                    break;
                }
            }
        }
        out
    }

    #[tokio::test]
    async fn frames_of_every_size_and_shape_read_back_exactly() {
        let shapes = [(3, 1), (10, 3), (5000, 2), (200_000, 1), (70_000, 5)];
        let mut stream = Vec::new();
        for (len, segments) in shapes {
            stream.extend(message_bytes(len, segments));
        }
        for staging in [64, 4096, 65536] {
            let frames = read_all(stream.clone(), staging).await;
            assert_eq!(frames.len(), shapes.len(), "staging {staging}");
            for (frame, (len, segments)) in frames.iter().zip(shapes) {
                let frame = frame.as_ref().expect("frame");
                assert_eq!(texts(frame), vec!["x".repeat(len); segments as usize]);
            }
        }
    }

    #[tokio::test]
    async fn data_of_a_big_frame_is_handed_on_without_a_copy_and_its_body_comes_home() {
        let data: Vec<u8> = (0..64 * 1024).map(|i| (i % 253) as u8).collect();
        let mut builder = capnp::message::Builder::new_default();
        builder
            .initn_root::<capnp::data::Builder>(data.len() as u32)
            .copy_from_slice(&data);
        let bytes = capnp::serialize::write_message_to_words(&builder);
        crate::net::body::release_recycled();
        let home = Pool::home().expect("a pool");
        let mut frames = read_all(bytes, 4096).await;
        let frame = frames.remove(0).expect("frame");
        let field: capnp::data::Reader = frame.get_body().unwrap().get_as().unwrap();
        let shared = received::bytes_of(field, 2);
        assert_eq!(shared.as_ptr(), field.as_ptr(), "a slice of the frame");
        drop(frame);
        assert_eq!(&shared[..], &data[..]);
        // Done with on another thread (the client's output thread), the
        // body is kept for this thread's next frame.
        assert_eq!(home.kept_count(), 0);
        std::thread::spawn(move || drop(shared)).join().unwrap();
        assert_eq!(home.kept_count(), 1);
    }

    #[tokio::test]
    async fn after_a_big_body_the_next_header_is_read_alone_so_its_body_is_not_copied_twice() {
        // Single-segment and multi-segment big frames.
        let big = message_bytes(200_000, 1);
        let mut one_segment = capnp::message::Builder::new(
            capnp::message::HeapAllocator::new().first_segment_words(200_000 / 8 + 16),
        );
        one_segment
            .initn_root::<capnp::text_list::Builder>(1)
            .set(0, "y".repeat(200_000));
        let single = capnp::serialize::write_message_to_words(&one_segment);
        let stream = [
            big.clone(),
            single.clone(),
            big,
            single,
            message_bytes(10, 1),
        ]
        .concat();
        let (mut writer, reader) = tokio::io::duplex(1 << 20);
        writer.write_all(&stream).await.unwrap();
        drop(writer);
        let mut frames = FrameReader::new(reader);
        let mut staged_after_header = Vec::new();
        while let Some(header) = frames.read_header(65536).await.unwrap() {
            staged_after_header.push(frames.available());
            let frame = frames
                .read_body(header, ReaderOptions::new())
                .await
                .unwrap();
            assert!(!texts(&frame).is_empty());
        }
        // The first header's read takes what the staging buffer holds;
        // after each big body, only the next header (and its segment
        // table) was read.
        assert_eq!(staged_after_header.len(), 5);
        assert!(staged_after_header[0] > 0);
        assert_eq!(staged_after_header[1..], [0, 0, 0, 0]);
    }

    #[test]
    fn a_body_buffer_grows_fourfold_up_to_the_announced_size() {
        let total = (15 << 20) / 8;
        let mut words = FIRST_BODY_BYTES / 8;
        let mut steps = vec![words * 8];
        while words < total {
            words = grown(words, total);
            steps.push(words * 8);
        }
        assert_eq!(steps[1], 4 * FIRST_BODY_BYTES);
        assert_eq!(steps.last(), Some(&(15 << 20)));
        assert_eq!(steps.len(), 4);
    }

    #[tokio::test]
    async fn a_body_grows_with_what_arrives_not_with_what_is_announced() {
        let (mut writer, reader) = tokio::io::duplex(1 << 20);
        // 15 MiB announced, 100 KiB sent, then silence.
        let mut header = vec![0u8; 8];
        header[4..8].copy_from_slice(&((15u32 << 20) / 8).to_le_bytes());
        writer.write_all(&header).await.unwrap();
        writer.write_all(&vec![0; 100 << 10]).await.unwrap();
        let mut frames = FrameReader::new(reader);
        let header = frames.read_header(4096).await.unwrap().unwrap();
        assert_eq!(header.body_bytes(), 15 << 20);
        let body = frames.read_body(header, ReaderOptions::new());
        tokio::pin!(body);
        // Everything sent has been taken in; the read waits for the rest.
        let waited = tokio::time::timeout(std::time::Duration::from_millis(100), &mut body).await;
        assert!(waited.is_err());
        drop(writer);
        let error = body.await.err().expect("cut short");
        assert!(error.extra.contains("middle of a message"), "{error}");
    }

    #[tokio::test]
    async fn the_staging_buffer_starts_small_and_grows_only_for_a_busy_peer() {
        let (mut writer, reader) = tokio::io::duplex(1 << 20);
        let mut frames = FrameReader::new(reader);
        assert_eq!(frames.staging_capacity(), 0);
        // One small message at a time: the buffer stays at its first size.
        for _ in 0..3 {
            writer.write_all(&message_bytes(10, 1)).await.unwrap();
            let header = frames.read_header(65536).await.unwrap().unwrap();
            frames
                .read_body(header, ReaderOptions::new())
                .await
                .unwrap();
            assert_eq!(frames.staging_capacity(), FIRST_STAGING_BYTES);
        }
        // A burst: it doubles up to the limit given, and no further.
        let burst: Vec<u8> = (0..2000).flat_map(|_| message_bytes(100, 1)).collect();
        writer.write_all(&burst).await.unwrap();
        for _ in 0..2000 {
            let header = frames.read_header(8192).await.unwrap().unwrap();
            frames
                .read_body(header, ReaderOptions::new())
                .await
                .unwrap();
        }
        assert_eq!(frames.staging_capacity(), 8192);
    }

    #[tokio::test]
    async fn end_of_input_between_frames_is_clean_and_inside_one_is_an_error() {
        let whole = message_bytes(10, 1);
        let frames = read_all(whole.clone(), 4096).await;
        assert_eq!(frames.len(), 1);
        assert!(frames[0].is_ok());
        for cut in [3, 8, whole.len() - 1] {
            let frames = read_all(whole[..cut].to_vec(), 4096).await;
            assert_eq!(frames.len(), 1, "cut at {cut}");
            assert!(frames[0].is_err(), "cut at {cut}");
        }
        let mut too_many = vec![0u8; 8];
        too_many[0..4].copy_from_slice(&600u32.to_le_bytes());
        let frames = read_all(too_many, 4096).await;
        let error = frames[0].as_ref().err().expect("refused");
        assert!(error.extra.contains("601 segments"), "{error}");
    }
}
