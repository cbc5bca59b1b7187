//! The file tools of `capexec mcp`: `read_file`, `write_file`,
//! `edit_file`, `list_directory`, `search_files`, `file_info`,
//! `move_path`, `remove_path` and `make_directory`, each a method of
//! [`FileTools`] taking its argument struct and answering its result
//! struct (both with JSON schemas, for the tool's input and output
//! schemas) or a [`FileToolError`].
//!
//! A front-end like the CLI and the Codex bridge: every call goes through
//! the root's `Directory` capability (`crate::client::Directory`), so
//! every path is resolved beneath the root by the executor's kernel, and
//! searches run on the executor's machine (`Directory.search`). Paths are
//! relative to the root or absolute beneath it (`paths.rs`); a path
//! outside is refused before any call. Every result is bounded (see the
//! constants here), and so is what a call holds in this process.
//! The handle is `!Send`: the tools run on the capnp `LocalSet` thread.

mod content;
mod dispatch;
mod edit;
mod error;
mod list;
mod manage;
mod paths;
mod read;
#[cfg(test)]
mod schema_tests;
mod search;
mod write;

use std::path::{Path, PathBuf};

use crate::client::Directory;

pub use self::content::Encoding;
pub use self::dispatch::{ToolSpec, tool_specs};
pub use self::edit::{Edit, EditFileArgs, EditFileResult};
pub use self::error::{FileToolError, FileToolErrorKind};
pub use self::list::{EntryType, ListDirectoryArgs, ListDirectoryResult, ListedEntry};
pub use self::manage::{
    FileInfoArgs, FileInfoResult, MakeDirectoryArgs, MakeDirectoryResult, MovePathArgs,
    MovePathResult, RemovePathArgs, RemovePathResult,
};
pub use self::read::{ReadFileArgs, ReadFileResult};
pub use self::search::{FoundLine, SearchFilesArgs, SearchFilesResult};
pub use self::write::{WriteFileArgs, WriteFileResult};

/// Most content one `read_file` answers (bytes, before any base64).
pub const READ_CAP_BYTES: usize = 256 * 1024;

/// Most bytes `read_file` reads to find a line `offset` (past it, a byte
/// range reaches further).
pub const LINE_SCAN_BYTES: u64 = 64 * 1024 * 1024;

/// Largest file `edit_file` edits, before and after its edits.
pub const EDIT_MAX_BYTES: u64 = 16 * 1024 * 1024;

/// Most edits one `edit_file` applies.
pub const EDIT_MAX_EDITS: usize = 1000;

/// Most bytes of the summary of changes `edit_file` answers.
pub const EDIT_DIFF_BYTES: usize = 8 * 1024;

/// Deepest `list_directory` goes, and its default.
pub const LIST_MAX_DEPTH: u32 = 16;
pub const LIST_DEFAULT_DEPTH: u32 = 1;

/// Most entries `list_directory` answers, and its default.
pub const LIST_MAX_ENTRIES: u32 = 5000;
pub const LIST_DEFAULT_ENTRIES: u32 = 1000;

/// Most matching lines `search_files` answers (the executor's limit), and
/// its default.
pub const SEARCH_MAX_MATCHES: u32 = crate::model::MAX_SEARCH_MATCHES;
pub const SEARCH_DEFAULT_MATCHES: u32 = 100;

/// Each tool's name and what it does, for the tool list.
pub const TOOL_DESCRIPTIONS: &[(&str, &str)] = &[
    (
        "read_file",
        "Read a file: all of it, `offset`/`limit` in lines, or a byte range. Answers the content \
         (UTF-8 text, or base64 when it is not), the file's `version` for `if_version`, and \
         whether and where the answer was cut (at most 256 KiB).",
    ),
    (
        "write_file",
        "Write a whole file atomically (readers see the old or the new content, never a mix), \
         creating missing parent directories. With `if_version`, only over the content of that \
         version (compare-and-swap).",
    ),
    (
        "edit_file",
        "Replace text in a file: a list of `old_text` -> `new_text` edits applied in order, each \
         expected to match `expected_count` times (default 1). Atomic, and refused whole when \
         any edit does not match its count.",
    ),
    (
        "list_directory",
        "List a directory's entries with their type and size, to `depth` levels (default 1), \
         optionally only those matching a `glob`.",
    ),
    (
        "search_files",
        "Search file contents beneath a path for a regular expression (Rust regex syntax), line \
         by line, on the machine where the files are; `glob` chooses the files.",
    ),
    (
        "file_info",
        "What a path is: type, size, permissions, modification time, and a file's version.",
    ),
    (
        "move_path",
        "Move or rename a file or directory (atomic; refused over an existing path unless \
         `overwrite`).",
    ),
    (
        "remove_path",
        "Remove a file, a symlink or an empty directory; a directory and everything in it only \
         with `recursive`.",
    ),
    (
        "make_directory",
        "Create a directory, with its missing parents unless `parents` is false.",
    ),
];

/// The file tools of one MCP session: the root's `Directory` and the
/// root's names, to place absolute paths beneath it.
pub struct FileTools {
    directory: Directory,
    /// The root as it was named (`--root`), absolute.
    root: PathBuf,
    /// The root as the executor's kernel names it (symlinks resolved).
    canonical: PathBuf,
}

impl FileTools {
    /// The tools over `directory`, which is `root` on the executor's
    /// machine (an absolute path: how the agent may name it). Asks the
    /// executor where the directory is, so a missing root fails here.
    pub async fn new(
        directory: Directory,
        root: impl Into<PathBuf>,
    ) -> Result<FileTools, FileToolError> {
        let root = root.into();
        if !root.is_absolute() {
            return Err(FileToolError::invalid(format!(
                "capexec: the root {:?} is not an absolute path",
                root.display().to_string()
            )));
        }
        let info = directory.info().await.map_err(FileToolError::from_client)?;
        Ok(FileTools {
            directory,
            root: paths::lexically_clean(&root),
            canonical: info.path,
        })
    }

    /// The root, as it was named.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The root's `Directory`.
    pub fn directory(&self) -> &Directory {
        &self.directory
    }
}
