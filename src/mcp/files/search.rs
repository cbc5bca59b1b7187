//! `search_files`: a regular expression over the files beneath a path,
//! searched by the executor on its own machine (`Directory.search`): no
//! file is pulled here, only the matching lines come, at most
//! [`SEARCH_MAX_MATCHES`] of them, each at most 512 bytes of its line.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::list::walk_glob;
use super::{FileToolError, FileTools, SEARCH_DEFAULT_MATCHES, SEARCH_MAX_MATCHES};
use crate::model::SearchOptions;

/// Arguments of `search_files`.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchFilesArgs {
    /// A regular expression in Rust `regex` syntax (https://docs.rs/regex),
    /// matched against each line on its own.
    // The text is the schema's description, which the agent reads: the
    // URL stays bare there rather than in rustdoc's angle brackets.
    #[allow(rustdoc::bare_urls)]
    pub pattern: String,
    /// Where to search: a directory, relative to the root or absolute
    /// beneath it (default: the root).
    #[serde(default)]
    pub path: Option<String>,
    /// Only files matching this glob: without "/" against each file's
    /// name ("*.rs"), with "/" against its path relative to `path`.
    #[serde(default)]
    pub glob: Option<String>,
    /// Globs of files and directories to leave out (e.g. ".git",
    /// "target"), matched as `glob` is.
    #[serde(default)]
    pub exclude: Option<Vec<String>>,
    /// Letters match either case.
    #[serde(default)]
    pub case_insensitive: Option<bool>,
    /// Most matching lines to return (default 100, at most 1000).
    #[serde(default)]
    pub max_matches: Option<u32>,
}

/// A line with a match.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub struct FoundLine {
    /// The file, relative to the root.
    pub path: String,
    /// 1 for the file's first line.
    pub line: u64,
    /// The line, or for a line longer than 512 bytes a window of it
    /// around the match.
    pub text: String,
    /// Where `text` begins in the line, in bytes (0 unless cut).
    #[serde(skip_serializing_if = "is_zero")]
    pub text_offset: u64,
    /// The line's whole length in bytes.
    pub line_bytes: u64,
    /// The first match on the line: bytes `match_start .. match_end` of
    /// the line.
    pub match_start: u64,
    pub match_end: u64,
    /// The text or the path is not UTF-8: shown with replacement
    /// characters.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub lossy: bool,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// What `search_files` found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub struct SearchFilesResult {
    /// In the order the executor found them (directory order, depth
    /// first), each file's lines in order.
    pub matches: Vec<FoundLine>,
    /// Text files searched.
    pub files_searched: u64,
    /// Files skipped as binary (they hold a NUL byte).
    pub binary_files_skipped: u64,
    /// Files skipped as larger than 4 MiB.
    pub large_files_skipped: u64,
    /// Files and directories that could not be read.
    pub unreadable: u64,
    /// Why the first of them could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// Whether `max_matches` ended the search (there may be more).
    pub truncated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncation: Option<String>,
}

impl FileTools {
    pub async fn search_files(
        &self,
        args: SearchFilesArgs,
    ) -> Result<SearchFilesResult, FileToolError> {
        let directory = self.place("path", args.path.as_deref().unwrap_or("."))?;
        if args.pattern.is_empty() {
            return Err(FileToolError::invalid("`pattern` is empty"));
        }
        let max_matches = args.max_matches.unwrap_or(SEARCH_DEFAULT_MATCHES);
        if max_matches == 0 || max_matches > SEARCH_MAX_MATCHES {
            return Err(FileToolError::invalid(format!(
                "`max_matches` is {max_matches}: from 1 to {SEARCH_MAX_MATCHES}"
            )));
        }
        let options = SearchOptions {
            pattern: args.pattern,
            case_insensitive: args.case_insensitive.unwrap_or(false),
            max_depth: 0,
            include: args.glob.as_deref().map(walk_glob).into_iter().collect(),
            exclude: args
                .exclude
                .iter()
                .flatten()
                .map(|glob| walk_glob(glob))
                .collect(),
            max_matches,
            max_file_bytes: 0,
        };
        let found = self
            .directory
            .search(&directory.relative, &options)
            .await
            .map_err(FileToolError::from_client)?;
        let matches = found
            .matches
            .into_iter()
            .map(|found| {
                let (path, path_lossy) = directory.child(&found.path);
                let cut_end = found.text_offset + (found.text.len() as u64) < found.line_bytes;
                let (text, text_offset, text_lossy) =
                    whole_characters(&found.text, found.text_offset, cut_end);
                FoundLine {
                    path,
                    line: found.line_number,
                    text,
                    text_offset,
                    line_bytes: found.line_bytes,
                    match_start: found.match_start,
                    match_end: found.match_end,
                    lossy: path_lossy || text_lossy,
                }
            })
            .collect();
        Ok(SearchFilesResult {
            matches,
            files_searched: found.files_searched,
            binary_files_skipped: found.binary_skipped,
            large_files_skipped: found.too_large_skipped,
            unreadable: found.unreadable,
            first_error: found.first_error,
            truncated: found.truncated,
            truncation: found.truncated.then(|| {
                format!(
                    "stopped at {max_matches} matching lines (max_matches): narrow the path, \
                     glob or pattern"
                )
            }),
        })
    }
}

/// A window of a line as text: a window cut inside a character at either
/// end (`offset` > 0, `cut_end`) loses those bytes (and its offset moves
/// past them at the start), so a UTF-8 line stays exact text; other bytes
/// are replaced (`lossy`).
fn whole_characters(text: &[u8], offset: u64, cut_end: bool) -> (String, u64, bool) {
    let leading = if offset > 0 {
        text.iter()
            .take(3)
            .take_while(|&&byte| byte & 0xC0 == 0x80)
            .count()
    } else {
        0
    };
    let rest = &text[leading..];
    let end = match std::str::from_utf8(rest) {
        Err(error) if cut_end && error.error_len().is_none() => error.valid_up_to(),
        _ => rest.len(),
    };
    match std::str::from_utf8(&rest[..end]) {
        Ok(text) => (text.to_string(), offset + leading as u64, false),
        Err(_) => (String::from_utf8_lossy(text).into_owned(), offset, true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_cut_inside_characters_keeps_whole_ones() {
        let line = "ééé".as_bytes();
        // Cut one byte into the first character and one before the end.
        assert_eq!(
            whole_characters(&line[1..5], 10, true),
            ("é".to_string(), 11, false)
        );
        assert_eq!(
            whole_characters(b"plain", 0, false),
            ("plain".to_string(), 0, false)
        );
        assert_eq!(
            whole_characters(b"a\xffb", 0, false),
            ("a\u{fffd}b".to_string(), 0, true)
        );
    }
}
