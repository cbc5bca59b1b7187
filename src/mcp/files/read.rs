//! `read_file`: a file, or lines of it, or a byte range of it, at most
//! [`READ_CAP_BYTES`] of content, with its version and where a cut one
//! goes on. Every chunk read belongs to the same version of the file.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::content::{CHUNK_BYTES, Encoding, encode, version_text};
use super::paths::Placed;
use super::{FileToolError, FileTools, LINE_SCAN_BYTES, READ_CAP_BYTES};
use crate::model::FileStat;

/// Arguments of `read_file`. Without `offset`, `limit`, `byte_offset` and
/// `byte_length`: the whole file (up to the cap).
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// The file: relative to the root, or absolute beneath it.
    pub path: String,
    /// Lines to skip before the first line returned (0: from the first
    /// line). Lines end at "\n".
    #[serde(default)]
    pub offset: Option<u64>,
    /// Most lines to return (default: up to the end, within the cap).
    #[serde(default)]
    pub limit: Option<u64>,
    /// A byte range instead of lines: its first byte (default 0).
    #[serde(default)]
    pub byte_offset: Option<u64>,
    /// A byte range instead of lines: its length (default: to the end,
    /// within the cap).
    #[serde(default)]
    pub byte_length: Option<u64>,
}

/// What `read_file` read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub struct ReadFileResult {
    /// The file, relative to the root.
    pub path: String,
    /// The bytes read: as text when they are UTF-8, else in base64
    /// (`encoding` says which).
    pub content: String,
    pub encoding: Encoding,
    /// The file's version: give it as `if_version` to write_file or
    /// edit_file to change only this very content.
    pub version: String,
    /// The file's size in bytes.
    pub size: u64,
    /// Where `content` begins in the file, in bytes.
    pub byte_offset: u64,
    /// How many bytes `content` holds (decoded).
    pub byte_length: u64,
    /// Reading lines: the number of the first line returned (1 for the
    /// file's first line).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_line: Option<u64>,
    /// Reading lines: how many lines `content` holds (a last line without
    /// "\n", or one cut by the cap, counts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lines: Option<u64>,
    /// Reading lines, when the read reached the end of the file: how many
    /// lines the file has.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_lines: Option<u64>,
    /// Whether the cap (256 KiB) cut the content short of what was asked.
    pub truncated: bool,
    /// Why and where the content was cut, when it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncation: Option<String>,
    /// Reading lines and more remain: the `offset` that reads on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
    /// More bytes remain where lines cannot say it (a line longer than
    /// the cap, or a byte range): the `byte_offset` that reads on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_byte_offset: Option<u64>,
}

impl FileTools {
    pub async fn read_file(&self, args: ReadFileArgs) -> Result<ReadFileResult, FileToolError> {
        let file = self.place("path", &args.path)?;
        let lines = args.offset.is_some() || args.limit.is_some();
        let bytes = args.byte_offset.is_some() || args.byte_length.is_some();
        if lines && bytes {
            return Err(FileToolError::invalid(
                "give either `offset`/`limit` (lines) or `byte_offset`/`byte_length` (bytes), \
                 not both",
            ));
        }
        if args.limit == Some(0) {
            return Err(FileToolError::invalid(
                "`limit` is 0: ask for 1 line or more",
            ));
        }
        if bytes {
            return self
                .read_bytes(file, args.byte_offset.unwrap_or(0), args.byte_length)
                .await;
        }
        self.read_lines(file, args.offset.unwrap_or(0), args.limit)
            .await
    }

    async fn read_bytes(
        &self,
        file: Placed,
        offset: u64,
        length: Option<u64>,
    ) -> Result<ReadFileResult, FileToolError> {
        let cap = READ_CAP_BYTES as u64;
        let asked = length.unwrap_or(u64::MAX);
        if asked == 0 {
            return Err(FileToolError::invalid(
                "`byte_length` is 0: ask for 1 byte or more",
            ));
        }
        let (mut data, stat) = self.read_range(&file, offset, asked.min(cap)).await?;
        let wanted_end = offset.saturating_add(asked).min(stat.size);
        let mut truncated = offset.saturating_add(data.len() as u64) < wanted_end;
        if truncated {
            // Cut by the cap: not inside a character, when it is text.
            let kept = utf8_cut(&data);
            data.truncate(kept);
        }
        let end = offset.saturating_add(data.len() as u64);
        truncated &= end < wanted_end;
        let next = (end < stat.size).then_some(end);
        let (content, encoding) = encode(data);
        Ok(ReadFileResult {
            path: file.shown(),
            byte_length: end.saturating_sub(offset),
            content,
            encoding,
            version: version_text(&stat),
            size: stat.size,
            byte_offset: offset,
            first_line: None,
            lines: None,
            total_lines: None,
            truncation: truncated.then(|| cap_sentence(Some(end), None)),
            truncated,
            next_offset: None,
            next_byte_offset: next,
        })
    }

    async fn read_lines(
        &self,
        file: Placed,
        offset: u64,
        limit: Option<u64>,
    ) -> Result<ReadFileResult, FileToolError> {
        let (first, stat) = self.read_range(&file, 0, CHUNK_BYTES).await?;
        let mut lines = Lines::new(offset, limit);
        let mut at = 0u64;
        let mut chunk = first;
        loop {
            let more = lines.feed(&chunk, at);
            at += chunk.len() as u64;
            if !more || chunk.is_empty() || at >= stat.size {
                break;
            }
            if lines.skipping() && at >= LINE_SCAN_BYTES {
                return Err(FileToolError::failed(format!(
                    "capexec: line {} of {:?} lies past its first {LINE_SCAN_BYTES} bytes, as far \
                     as read_file counts lines: read on with `byte_offset`",
                    offset + 1,
                    file.shown()
                )));
            }
            chunk = self.read_chunk_of(&file, at, &stat.version).await?;
        }
        Ok(lines.result(file, &stat, at))
    }
}

/// Lines gathered from chunks: the first `offset` skipped, then at most
/// `limit` kept, within the cap.
struct Lines {
    offset: u64,
    limit: Option<u64>,
    /// Lines ended so far ("\n" seen), skipped ones included.
    ended: u64,
    kept: Vec<u8>,
    /// Where `kept` begins in the file.
    start: Option<u64>,
    /// Where the line being kept begins in `kept`.
    line_start: usize,
    /// Lines kept whole.
    lines_kept: u64,
    /// The cap cut the content: where the file goes on, by line or byte.
    cut: Option<Cut>,
    /// The limit was reached.
    limited: bool,
    /// The last byte read: a file that ends without "\n" has one more line.
    last_byte: Option<u8>,
}

enum Cut {
    AtLine,
    InLine,
}

impl Lines {
    fn new(offset: u64, limit: Option<u64>) -> Lines {
        Lines {
            offset,
            limit,
            ended: 0,
            kept: Vec::new(),
            start: None,
            line_start: 0,
            lines_kept: 0,
            cut: None,
            limited: false,
            last_byte: None,
        }
    }

    fn skipping(&self) -> bool {
        self.ended < self.offset
    }

    /// Takes in `chunk`, which begins at byte `at` of the file; whether
    /// it wants more.
    fn feed(&mut self, chunk: &[u8], at: u64) -> bool {
        if let Some(&last) = chunk.last() {
            self.last_byte = Some(last);
        }
        let mut from = 0;
        while from < chunk.len() {
            let newline = chunk[from..].iter().position(|&byte| byte == b'\n');
            let end = newline.map_or(chunk.len(), |found| from + found + 1);
            if self.skipping() {
                if newline.is_some() {
                    self.ended += 1;
                }
                from = end;
                continue;
            }
            if self.limit.is_some_and(|limit| self.lines_kept >= limit) {
                self.limited = true;
                return false;
            }
            self.start.get_or_insert(at + from as u64);
            let piece = &chunk[from..end];
            let room = READ_CAP_BYTES - self.kept.len();
            if piece.len() > room {
                if self.line_start == 0 {
                    // One line longer than the cap: as much of it as fits.
                    self.kept.extend_from_slice(&piece[..room]);
                    let kept = utf8_cut(&self.kept);
                    self.kept.truncate(kept);
                    self.cut = Some(Cut::InLine);
                } else {
                    self.kept.truncate(self.line_start);
                    self.cut = Some(Cut::AtLine);
                }
                return false;
            }
            self.kept.extend_from_slice(piece);
            if newline.is_some() {
                self.ended += 1;
                self.lines_kept += 1;
                self.line_start = self.kept.len();
            }
            from = end;
        }
        true
    }

    /// The result, `read` bytes of the file having been read.
    fn result(self, file: Placed, stat: &FileStat, read: u64) -> ReadFileResult {
        let start = self.start.unwrap_or(read.min(stat.size));
        let end = start + self.kept.len() as u64;
        // A last line without "\n", or a line cut in two, counts.
        let partial = self.line_start < self.kept.len();
        let lines = self.lines_kept + u64::from(partial);
        let more = end < stat.size;
        let (next_offset, next_byte_offset) = match (&self.cut, more) {
            (_, false) => (None, None),
            (Some(Cut::InLine), true) => (None, Some(end)),
            (_, true) => (Some(self.offset + lines), None),
        };
        let total_lines = (!more && self.cut.is_none() && !self.limited)
            .then(|| self.ended + u64::from(self.last_byte.is_some_and(|byte| byte != b'\n')));
        let truncation = self.cut.as_ref().map(|cut| match cut {
            Cut::InLine => cap_sentence(Some(end), None),
            Cut::AtLine => cap_sentence(None, Some(self.offset + lines)),
        });
        let (content, encoding) = encode(self.kept);
        ReadFileResult {
            path: file.shown(),
            content,
            encoding,
            version: version_text(stat),
            size: stat.size,
            byte_offset: start,
            byte_length: end - start,
            first_line: Some(self.offset + 1),
            lines: Some(lines),
            total_lines,
            truncated: self.cut.is_some(),
            truncation,
            next_offset,
            next_byte_offset,
        }
    }
}

/// What a cut by the cap says, and where to read on.
fn cap_sentence(byte: Option<u64>, line: Option<u64>) -> String {
    let on = match (line, byte) {
        (Some(line), _) => format!("read on with offset {line}"),
        (None, Some(byte)) => format!("read on with byte_offset {byte}"),
        (None, None) => String::new(),
    };
    format!("cut at the {READ_CAP_BYTES}-byte cap of one read_file; {on}")
}

/// How much of `data` to keep when it was cut at its end: all of it,
/// unless it is UTF-8 up to an incomplete character there.
fn utf8_cut(data: &[u8]) -> usize {
    match std::str::from_utf8(data) {
        Err(error) if error.error_len().is_none() => error.valid_up_to(),
        _ => data.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_keeps_whole_characters_of_text_and_every_byte_of_the_rest() {
        assert_eq!(utf8_cut("aé".as_bytes()), 3);
        assert_eq!(utf8_cut(&"aé".as_bytes()[..2]), 1);
        assert_eq!(utf8_cut(&[0xff, 0xfe]), 2);
    }

    fn lines_of(chunks: &[&[u8]], offset: u64, limit: Option<u64>) -> (Vec<u8>, u64, u64, bool) {
        let mut lines = Lines::new(offset, limit);
        let mut at = 0;
        for chunk in chunks {
            if !lines.feed(chunk, at) {
                break;
            }
            at += chunk.len() as u64;
        }
        let partial = lines.line_start < lines.kept.len();
        (
            lines.kept,
            lines.start.unwrap_or(at),
            lines.lines_kept + u64::from(partial),
            lines.limited,
        )
    }

    #[test]
    fn lines_are_found_across_chunks() {
        let chunks: &[&[u8]] = &[b"one\ntw", b"o\nthree\nfo", b"ur"];
        assert_eq!(
            lines_of(chunks, 1, Some(2)),
            (b"two\nthree\n".to_vec(), 4, 2, true)
        );
        assert_eq!(lines_of(chunks, 3, None), (b"four".to_vec(), 14, 1, false));
        assert_eq!(lines_of(chunks, 9, None), (Vec::new(), 18, 0, false));
    }
}
