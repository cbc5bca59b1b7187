//! Output as the tools answer it: each stream's bytes kept whole up to a
//! bound, else its head and tail with the cut said; exit statuses as
//! JSON.

use std::collections::VecDeque;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::types::{ExitInfo, StreamText};
use crate::model::{Exit, ExitStatus};

/// One stream's bytes, at most `limit` kept: the first half and the last
/// half; what falls between is counted.
pub struct Keeper {
    limit: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl Keeper {
    pub fn new(limit: usize) -> Keeper {
        Keeper {
            limit,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
        }
    }

    pub fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        let head_room = self.limit.div_ceil(2).saturating_sub(self.head.len());
        if head_room > 0 && self.tail.is_empty() {
            let taken = head_room.min(data.len());
            self.head.extend_from_slice(&data[..taken]);
            data = &data[taken..];
        }
        let tail_limit = self.limit / 2;
        if data.len() >= tail_limit {
            self.tail.clear();
            self.tail.extend(&data[data.len() - tail_limit..]);
            return;
        }
        let over = (self.tail.len() + data.len()).saturating_sub(tail_limit);
        self.tail.drain(..over);
        self.tail.extend(data);
    }

    /// Every byte pushed, cut ones included.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The stream as answered.
    pub fn finish(self) -> StreamText {
        let kept = (self.head.len() + self.tail.len()) as u64;
        let mut head = self.head;
        let mut tail: Vec<u8> = self.tail.into();
        let mut cut = self.total - kept;
        if cut == 0 {
            // Nothing was cut: one piece.
            head.append(&mut tail);
        } else {
            // A cut may split a character: its pieces are cut with it.
            let broken_end = incomplete_end(&head);
            head.truncate(head.len() - broken_end);
            let broken_start = tail
                .iter()
                .take(3)
                .take_while(|&&byte| byte & 0xC0 == 0x80)
                .count();
            tail.drain(..broken_start);
            cut += (broken_end + broken_start) as u64;
        }
        match (std::str::from_utf8(&head), std::str::from_utf8(&tail)) {
            (Ok(head), Ok(tail)) => StreamText {
                text: head.to_string(),
                tail: tail.to_string(),
                encoding: "utf-8".into(),
                bytes: self.total,
                cut_bytes: cut,
            },
            _ => StreamText {
                text: BASE64.encode(&head),
                tail: BASE64.encode(&tail),
                encoding: "base64".into(),
                bytes: self.total,
                cut_bytes: cut,
            },
        }
    }
}

/// The bytes at the end of `data` that begin a UTF-8 character without
/// finishing it.
fn incomplete_end(data: &[u8]) -> usize {
    for back in 1..=data.len().min(3) {
        let byte = data[data.len() - back];
        if byte & 0xC0 == 0x80 {
            continue;
        }
        let needed = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => return 0,
        };
        return if needed > back { back } else { 0 };
    }
    0
}

pub fn exit_info(exit: &Exit) -> ExitInfo {
    let (code, signal, signal_number, core_dumped) = match exit.status {
        ExitStatus::Code(code) => (Some(code), None, None, false),
        ExitStatus::Killed {
            signal,
            number,
            core_dumped,
        } => (
            None,
            Some(signal.map_or_else(|| format!("signal {number}"), |s| s.name().to_string())),
            Some(signal.map_or(number, crate::model::Signal::number)),
            core_dumped,
        ),
    };
    ExitInfo {
        code,
        signal,
        signal_number,
        core_dumped,
        shell_code: exit.status.shell_code(),
        timed_out: exit.timed_out,
        killed_by_memory_limit: exit.killed_by_memory_limit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(limit: usize, pieces: &[&[u8]]) -> StreamText {
        let mut keeper = Keeper::new(limit);
        for piece in pieces {
            keeper.push(piece);
        }
        keeper.finish()
    }

    #[test]
    fn output_within_the_limit_is_kept_whole() {
        let text = kept(10, &[b"hello", b" you"]);
        assert_eq!(
            text,
            StreamText {
                text: "hello you".into(),
                tail: String::new(),
                encoding: "utf-8".into(),
                bytes: 9,
                cut_bytes: 0,
            }
        );
    }

    #[test]
    fn longer_output_keeps_its_head_and_tail_and_counts_the_cut() {
        let text = kept(6, &[b"abcd", b"efgh", b"ijklm"]);
        assert_eq!((text.text.as_str(), text.tail.as_str()), ("abc", "klm"));
        assert_eq!((text.bytes, text.cut_bytes), (13, 7));
        let text = kept(6, &[b"abcdefghijklm"]);
        assert_eq!((text.text.as_str(), text.tail.as_str()), ("abc", "klm"));
        assert_eq!(text.cut_bytes, 7);
    }

    #[test]
    fn a_cut_through_a_character_takes_its_pieces_with_it() {
        // "é" is two bytes: the head's end and the tail's start fall
        // inside one.
        let text = kept(6, &["abé".as_bytes(), "0123456789éyz".as_bytes()]);
        assert_eq!((text.text.as_str(), text.tail.as_str()), ("ab", "yz"));
        assert_eq!(text.encoding, "utf-8");
        assert_eq!(text.bytes, 18);
        assert_eq!(text.cut_bytes, 18 - 4);
    }

    #[test]
    fn bytes_that_are_not_utf8_come_in_base64() {
        let text = kept(10, &[b"\xff\x00a"]);
        assert_eq!(text.encoding, "base64");
        assert_eq!(text.text, BASE64.encode(b"\xff\x00a"));
        assert_eq!(text.bytes, 3);
    }
}
