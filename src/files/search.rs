//! `search`: a regular expression over the content of the files beneath
//! a directory, on this machine, so that only matching lines travel. The
//! files are a [`Walk`]'s (symlinks never followed, mount points not
//! entered); each is opened beneath the searched directory without
//! following a final symlink, read whole (it is at most
//! [`MAX_SEARCH_FILE_BYTES`]) and matched line by line. A search is a
//! state stepped on the blocking pool ([`Search::step`]: at most
//! [`STEP_FILES`] files or [`STEP_BYTES`] of content per step), so a tree
//! of any size holds a thread only a step at a time, and a caller that
//! stops waiting stops it between steps.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};

use regex::bytes::{Regex, RegexBuilder};
use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::files::error::{failed, refused, shown};
use crate::files::read::{kind_name, read_at};
use crate::files::resolve::{checked, open_beneath};
use crate::files::stat;
use crate::files::walk::Walk;
use crate::model::{
    DirEntry, FileKind, MAX_PATH_BYTES, MAX_SEARCH_FILE_BYTES, MAX_SEARCH_MATCHES, Refusal,
    RefusalKind, SEARCH_TEXT_BEFORE, SEARCH_TEXT_BYTES, SearchMatch, SearchOptions, SearchResult,
    WalkOptions,
};

/// Most files one step reads.
pub const STEP_FILES: usize = 256;

/// Most bytes of content one step reads (a step may pass it by one file).
pub const STEP_BYTES: usize = 4 * 1024 * 1024;

/// Most memory a compiled pattern may take, and its matching cache.
const PATTERN_SIZE_LIMIT: usize = 1024 * 1024;

const OP: &str = "search";

/// A search in progress.
pub struct Search {
    /// The searched directory, which every file is opened beneath.
    base: OwnedFd,
    walk: Walk,
    pending: VecDeque<DirEntry>,
    walked: bool,
    regex: Regex,
    max_matches: usize,
    max_file_bytes: u64,
    result: SearchResult,
}

impl Search {
    /// Compiles the pattern and opens directory `path` beneath `dir`.
    pub fn open(dir: impl AsFd, path: &[u8], options: &SearchOptions) -> Result<Search, Refusal> {
        let regex = compile(path, options)?;
        let base = open_beneath(
            dir,
            checked(OP, path)?,
            OFlags::PATH | OFlags::DIRECTORY,
            Mode::empty(),
            ResolveFlags::empty(),
        )
        .map_err(|errno| failed(OP, path, errno))?;
        let walk_options = WalkOptions {
            max_depth: options.max_depth,
            max_entries: 0,
            include: options.include.clone(),
            exclude: options.exclude.clone(),
        };
        let walk = Walk::open_as(OP, &base, b"", path, &walk_options)?;
        let max_matches = match options.max_matches {
            0 => MAX_SEARCH_MATCHES,
            asked => asked.min(MAX_SEARCH_MATCHES),
        } as usize;
        let max_file_bytes = match options.max_file_bytes {
            0 => MAX_SEARCH_FILE_BYTES,
            asked => asked.min(MAX_SEARCH_FILE_BYTES),
        };
        Ok(Search {
            base,
            walk,
            pending: VecDeque::new(),
            walked: false,
            regex,
            max_matches,
            max_file_bytes,
            result: SearchResult::default(),
        })
    }

    /// Directories the walk holds open now.
    pub fn open_levels(&self) -> usize {
        self.walk.open_levels()
    }

    /// What it found.
    pub fn finish(self) -> SearchResult {
        self.result
    }

    /// Searches the next files, a bounded step; whether the search is over.
    pub fn step(&mut self) -> Result<bool, Refusal> {
        let (mut files, mut bytes) = (0, 0);
        loop {
            if self.result.matches.len() >= self.max_matches {
                self.result.truncated = true;
                return Ok(true);
            }
            if files >= STEP_FILES || bytes >= STEP_BYTES {
                return Ok(false);
            }
            let Some(entry) = self.pending.pop_front() else {
                if self.walked {
                    return Ok(true);
                }
                match self.walk.next_batch()? {
                    Some(batch) => self.pending.extend(batch),
                    None => self.walked = true,
                }
                continue;
            };
            if let Some(error) = &entry.error {
                self.unreadable(format!("{} {}: {error}", OP, shown(&entry.path)));
                continue;
            }
            let Some(stat) = &entry.stat else { continue };
            if stat.kind != FileKind::File {
                continue;
            }
            if stat.size > self.max_file_bytes {
                self.result.too_large_skipped += 1;
                continue;
            }
            files += 1;
            match self.search_file(&entry.path) {
                Ok(read) => bytes += read,
                Err(refusal) => self.unreadable(refusal.message),
            }
        }
    }

    fn unreadable(&mut self, why: String) {
        self.result.unreadable += 1;
        self.result.first_error.get_or_insert(why);
    }

    /// Reads file `path` and adds its matching lines; answers the bytes
    /// read.
    fn search_file(&mut self, path: &[u8]) -> Result<usize, Refusal> {
        let fd = open_beneath(
            &self.base,
            checked(OP, path)?,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW,
            Mode::empty(),
            ResolveFlags::empty(),
        )
        .map_err(|errno| failed(OP, path, errno))?;
        let stat = stat::of_fd(&fd).map_err(|errno| failed(OP, path, errno))?;
        if stat.kind != FileKind::File {
            return Err(refused(
                RefusalKind::InvalidArgument,
                OP,
                path,
                format!("not a regular file (a {})", kind_name(stat.kind)),
            ));
        }
        // It may have grown since the walk saw it.
        if stat.size > self.max_file_bytes {
            self.result.too_large_skipped += 1;
            return Ok(0);
        }
        let mut data = vec![0; stat.size as usize];
        let got = read_at(&fd, &mut data, 0).map_err(|errno| failed(OP, path, errno))?;
        data.truncate(got);
        if data.contains(&0) {
            self.result.binary_skipped += 1;
            return Ok(got);
        }
        self.result.files_searched += 1;
        let mut start = 0;
        let mut line_number = 0u64;
        while start < data.len() && self.result.matches.len() < self.max_matches {
            let end = data[start..]
                .iter()
                .position(|&byte| byte == b'\n')
                .map_or(data.len(), |at| start + at);
            line_number += 1;
            let line = &data[start..end];
            if let Some(found) = self.regex.find(line) {
                self.result
                    .matches
                    .push(matched(path, line_number, line, found.range()));
            }
            start = end + 1;
        }
        Ok(got)
    }
}

/// The match of `range` in `line`, with a window of the line around it.
fn matched(
    path: &[u8],
    line_number: u64,
    line: &[u8],
    range: std::ops::Range<usize>,
) -> SearchMatch {
    let text_offset = if line.len() <= SEARCH_TEXT_BYTES {
        0
    } else {
        range
            .start
            .saturating_sub(SEARCH_TEXT_BEFORE)
            .min(line.len() - SEARCH_TEXT_BYTES)
    };
    let text_end = (text_offset + SEARCH_TEXT_BYTES).min(line.len());
    SearchMatch {
        path: path.to_vec(),
        line_number,
        line_bytes: line.len() as u64,
        text: line[text_offset..text_end].to_vec(),
        text_offset: text_offset as u64,
        match_start: range.start as u64,
        match_end: range.end as u64,
    }
}

/// The pattern compiled, or why it cannot be.
fn compile(path: &[u8], options: &SearchOptions) -> Result<Regex, Refusal> {
    let bad = |reason: String| refused(RefusalKind::InvalidArgument, OP, path, reason);
    if options.pattern.len() > MAX_PATH_BYTES {
        return Err(bad(format!(
            "a pattern of {} bytes; at most {MAX_PATH_BYTES}",
            options.pattern.len()
        )));
    }
    RegexBuilder::new(&options.pattern)
        .case_insensitive(options.case_insensitive)
        .size_limit(PATTERN_SIZE_LIMIT)
        // The lazy DFA's cache, which grows while it matches: bounded too.
        .dfa_size_limit(PATTERN_SIZE_LIMIT)
        .build()
        .map_err(|error| {
            bad(format!(
                "pattern {:?}: {}",
                crate::model::excerpt(&options.pattern),
                regex_reason(&error)
            ))
        })
}

/// A regex error in one line: the parser's own "error: ..." line (its
/// message draws the pattern over several lines), or the size limit.
fn regex_reason(error: &regex::Error) -> String {
    match error {
        regex::Error::CompiledTooBig(_) => {
            format!("compiles to more than the {PATTERN_SIZE_LIMIT} bytes a pattern may take")
        }
        other => {
            let text = other.to_string();
            text.lines()
                .find_map(|line| line.trim().strip_prefix("error: "))
                .map_or_else(
                    || text.split_whitespace().collect::<Vec<_>>().join(" "),
                    str::to_string,
                )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(pattern: &str) -> SearchOptions {
        SearchOptions {
            pattern: pattern.into(),
            ..SearchOptions::default()
        }
    }

    #[test]
    fn a_malformed_pattern_is_said_in_one_line() {
        let refusal = compile(b"src", &options("a(b")).expect_err("malformed");
        assert_eq!(refusal.kind, RefusalKind::InvalidArgument);
        assert_eq!(
            refusal.message,
            format!("search {}: pattern \"a(b\": unclosed group", shown(b"src"))
        );
        let huge = compile(b"", &options("\\w{1000}\\w{1000}")).expect_err("too big");
        assert!(
            huge.message
                .ends_with("compiles to more than the 1048576 bytes a pattern may take"),
            "{huge}"
        );
    }

    #[test]
    fn a_long_line_is_cut_around_its_match() {
        let line: Vec<u8> = (0..2000).map(|i| b'a' + (i % 26) as u8).collect();
        let found = matched(b"f", 3, &line, 1000..1004);
        assert_eq!(found.text_offset, 872);
        assert_eq!(found.text, &line[872..1384]);
        assert_eq!((found.match_start, found.match_end), (1000, 1004));
        assert_eq!(found.line_bytes, 2000);
        // Near the end: the window ends at the line's end.
        let found = matched(b"f", 3, &line, 1990..1995);
        assert_eq!(found.text_offset, 2000 - 512);
        // Near the start, and a short line whole.
        assert_eq!(matched(b"f", 1, &line, 5..6).text_offset, 0);
        let short = matched(b"f", 1, b"short", 1..2);
        assert_eq!(
            (short.text.as_slice(), short.text_offset),
            (&b"short"[..], 0)
        );
    }
}
