//! `file_info`, `move_path`, `remove_path` and `make_directory`: one
//! `Directory` call each.

use std::os::unix::ffi::OsStrExt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::content::version_text;
use super::list::EntryType;
use super::{FileToolError, FileTools};
use crate::model::FileKind;

/// Arguments of `file_info`.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileInfoArgs {
    /// The path: relative to the root, or absolute beneath it.
    pub path: String,
    /// Describe what a final symlink leads to (within the root) instead
    /// of the symlink itself (default false).
    #[serde(default)]
    pub follow_symlinks: Option<bool>,
}

/// What a path is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub struct FileInfoResult {
    /// Relative to the root.
    pub path: String,
    #[serde(rename = "type")]
    pub entry_type: EntryType,
    /// In bytes (a symlink: its target's length).
    pub size: u64,
    /// The permission bits in octal, as "0644".
    pub permissions: String,
    /// The modification time, in milliseconds since the Unix epoch.
    pub modified_unix_ms: i64,
    /// A file's version (as read_file answers it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// A symlink's target, as stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
}

/// Arguments of `move_path`.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MovePathArgs {
    /// What to move: relative to the root, or absolute beneath it.
    pub from: String,
    /// Its new path (not a directory to move it into).
    pub to: String,
    /// Replace what `to` names (a directory only if empty); default
    /// false: an existing `to` is refused.
    #[serde(default)]
    pub overwrite: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub struct MovePathResult {
    /// Relative to the root.
    pub from: String,
    pub to: String,
}

/// Arguments of `remove_path`.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RemovePathArgs {
    /// A file, symlink (not what it points to) or directory: relative to
    /// the root, or absolute beneath it. Not the root itself.
    pub path: String,
    /// Remove a directory and everything in it (default false: only an
    /// empty directory). Symlinks inside are removed, never followed.
    #[serde(default)]
    pub recursive: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub struct RemovePathResult {
    /// Relative to the root.
    pub path: String,
    /// Entries removed (the path itself included).
    pub removed: u64,
}

/// Arguments of `make_directory`.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MakeDirectoryArgs {
    /// The new directory: relative to the root, or absolute beneath it.
    pub path: String,
    /// Create missing parents too, and take an existing directory as
    /// success (default true, as `mkdir -p`); false: the parent must
    /// exist and the directory must not.
    #[serde(default)]
    pub parents: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub struct MakeDirectoryResult {
    /// Relative to the root.
    pub path: String,
}

fn entry_type(kind: FileKind) -> EntryType {
    match kind {
        FileKind::File => EntryType::File,
        FileKind::Directory => EntryType::Directory,
        FileKind::Symlink => EntryType::Symlink,
        _ => EntryType::Other,
    }
}

impl FileTools {
    pub async fn file_info(&self, args: FileInfoArgs) -> Result<FileInfoResult, FileToolError> {
        let place = self.place("path", &args.path)?;
        let stat = if args.follow_symlinks.unwrap_or(false) {
            self.directory.metadata(&place.relative).await
        } else {
            self.directory.symlink_metadata(&place.relative).await
        }
        .map_err(FileToolError::from_client)?;
        let link_target = if stat.kind == FileKind::Symlink {
            let target = self
                .directory
                .read_link(&place.relative)
                .await
                .map_err(FileToolError::from_client)?;
            Some(String::from_utf8_lossy(&target).into_owned())
        } else {
            None
        };
        Ok(FileInfoResult {
            path: place.shown(),
            entry_type: entry_type(stat.kind),
            size: stat.size,
            permissions: format!("{:04o}", stat.permissions & 0o7777),
            modified_unix_ms: stat.modified_ns.div_euclid(1_000_000),
            version: (stat.kind == FileKind::File).then(|| version_text(&stat)),
            link_target,
        })
    }

    pub async fn move_path(&self, args: MovePathArgs) -> Result<MovePathResult, FileToolError> {
        let from = self.place("from", &args.from)?;
        let to = self.place("to", &args.to)?;
        self.directory
            .rename(
                &from.relative,
                &to.relative,
                !args.overwrite.unwrap_or(false),
            )
            .await
            .map_err(FileToolError::from_client)?;
        Ok(MovePathResult {
            from: from.shown(),
            to: to.shown(),
        })
    }

    pub async fn remove_path(
        &self,
        args: RemovePathArgs,
    ) -> Result<RemovePathResult, FileToolError> {
        let place = self.place("path", &args.path)?;
        if place.relative.as_os_str().as_bytes() == b"." {
            return Err(FileToolError::invalid(
                "`path` names the root itself, which remove_path does not remove",
            ));
        }
        let removed = self
            .directory
            .remove(&place.relative, args.recursive.unwrap_or(false), false)
            .await
            .map_err(FileToolError::from_client)?;
        Ok(RemovePathResult {
            path: place.shown(),
            removed,
        })
    }

    pub async fn make_directory(
        &self,
        args: MakeDirectoryArgs,
    ) -> Result<MakeDirectoryResult, FileToolError> {
        let place = self.place("path", &args.path)?;
        self.directory
            .create_dir_with(&place.relative, args.parents.unwrap_or(true), 0o777)
            .await
            .map_err(FileToolError::from_client)?;
        Ok(MakeDirectoryResult {
            path: place.shown(),
        })
    }
}
