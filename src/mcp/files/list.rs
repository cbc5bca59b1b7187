//! `list_directory`: a directory's entries to a bounded depth, walked by
//! the executor (`Directory.walk`: symlinks reported, never followed),
//! at most a bounded number, sorted by path.

use futures::StreamExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    FileToolError, FileTools, LIST_DEFAULT_DEPTH, LIST_DEFAULT_ENTRIES, LIST_MAX_DEPTH,
    LIST_MAX_ENTRIES,
};
use crate::model::{FileKind, WalkOptions};

/// Arguments of `list_directory`.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListDirectoryArgs {
    /// The directory: relative to the root, or absolute beneath it
    /// (default: the root).
    #[serde(default)]
    pub path: Option<String>,
    /// Levels to list: 1 (the default) lists the directory's own entries,
    /// 2 theirs too, and so on, up to 16.
    #[serde(default)]
    pub depth: Option<u32>,
    /// Only entries matching this glob (`*`, `?`, `[...]`, `{a,b}`, `**`
    /// for any number of directories). Without "/" it is matched against
    /// each entry's name at any depth ("*.rs"); with "/", against its path
    /// relative to the listed directory ("src/**/*.rs"). Directories are
    /// entered whether or not they match.
    #[serde(default)]
    pub glob: Option<String>,
    /// Most entries to return (default 1000, at most 5000).
    #[serde(default)]
    pub max_entries: Option<u32>,
}

/// What an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EntryType {
    File,
    Directory,
    Symlink,
    /// A FIFO, socket or device, or an entry whose type could not be
    /// read (its `error` says why).
    Other,
}

/// One entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub struct ListedEntry {
    /// Relative to the root (not to the listed directory), so that it
    /// names the entry to every other tool.
    pub path: String,
    #[serde(rename = "type")]
    pub entry_type: EntryType,
    /// A file's size in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// A symlink's target, as stored (not followed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
    /// Why the entry is incomplete (a directory that could not be
    /// entered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The name is not UTF-8: `path` shows it with replacement
    /// characters and cannot name it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub path_not_utf8: bool,
}

/// What `list_directory` found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub struct ListDirectoryResult {
    /// The listed directory, relative to the root.
    pub path: String,
    /// Sorted by path.
    pub entries: Vec<ListedEntry>,
    /// Whether `max_entries` cut the listing (which entries were kept is
    /// the executor's walk order, not alphabetical).
    pub truncated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncation: Option<String>,
}

/// A glob as the executor's walk matches it: one without "/" is a name
/// at any depth.
pub(super) fn walk_glob(glob: &str) -> Vec<u8> {
    if glob.contains('/') {
        glob.as_bytes().to_vec()
    } else {
        format!("**/{glob}").into_bytes()
    }
}

impl FileTools {
    pub async fn list_directory(
        &self,
        args: ListDirectoryArgs,
    ) -> Result<ListDirectoryResult, FileToolError> {
        let directory = self.place("path", args.path.as_deref().unwrap_or("."))?;
        let depth = args.depth.unwrap_or(LIST_DEFAULT_DEPTH);
        if depth == 0 || depth > LIST_MAX_DEPTH {
            return Err(FileToolError::invalid(format!(
                "`depth` is {depth}: from 1 to {LIST_MAX_DEPTH}"
            )));
        }
        let max_entries = args.max_entries.unwrap_or(LIST_DEFAULT_ENTRIES);
        if max_entries == 0 || max_entries > LIST_MAX_ENTRIES {
            return Err(FileToolError::invalid(format!(
                "`max_entries` is {max_entries}: from 1 to {LIST_MAX_ENTRIES}"
            )));
        }
        let options = WalkOptions {
            max_depth: depth,
            max_entries: u64::from(max_entries),
            include: args.glob.as_deref().map(walk_glob).into_iter().collect(),
            exclude: Vec::new(),
        };
        let mut walk = self.directory.walk(&directory.relative, &options).await;
        let mut entries = Vec::new();
        while let Some(entry) = walk.next().await {
            let entry = entry.map_err(FileToolError::from_client)?;
            let (path, path_not_utf8) = directory.child(&entry.path);
            let kind = entry.stat.as_ref().map(|stat| stat.kind);
            entries.push(ListedEntry {
                path,
                entry_type: match kind {
                    Some(FileKind::File) => EntryType::File,
                    Some(FileKind::Directory) => EntryType::Directory,
                    Some(FileKind::Symlink) => EntryType::Symlink,
                    _ => EntryType::Other,
                },
                size: entry
                    .stat
                    .as_ref()
                    .filter(|stat| stat.kind == FileKind::File)
                    .map(|stat| stat.size),
                link_target: (!entry.link_target.is_empty())
                    .then(|| String::from_utf8_lossy(&entry.link_target).into_owned()),
                error: entry.error,
                path_not_utf8,
            });
        }
        let truncated = walk.summary().is_some_and(|summary| summary.truncated);
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(ListDirectoryResult {
            path: directory.shown(),
            entries,
            truncated,
            truncation: truncated.then(|| {
                format!(
                    "cut at {max_entries} entries (max_entries): list a subdirectory, less depth, \
                     or a glob"
                )
            }),
        })
    }
}
