//! `write_file`: a whole file written atomically by the executor (a new
//! file linked into place, or renamed over the old one: readers see the
//! old content or the new, never a mix), with compare-and-swap on the
//! version the executor checks under its commit lock.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::content::{Encoding, decode, version_bytes, version_text};
use super::{FileToolError, FileTools};
use crate::model::{RefusalKind, WriteOptions};

/// Arguments of `write_file`.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// The file: relative to the root, or absolute beneath it. A symlink
    /// there is followed (within the root): the file it leads to is
    /// written, and the link stays.
    pub path: String,
    /// The whole new content.
    pub content: String,
    /// How `content` is written: "utf-8" (the default) or "base64".
    #[serde(default)]
    pub encoding: Option<Encoding>,
    /// Write only if the file is still at this version (from read_file,
    /// write_file or edit_file); else nothing is written and the error
    /// says the current version. A missing file is a conflict too.
    #[serde(default)]
    pub if_version: Option<String>,
    /// Create missing parent directories (default true).
    #[serde(default)]
    pub create_parents: Option<bool>,
}

/// What `write_file` wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub struct WriteFileResult {
    /// The file, relative to the root.
    pub path: String,
    /// The new content's version.
    pub version: String,
    /// Bytes written.
    pub size: u64,
}

impl FileTools {
    pub async fn write_file(&self, args: WriteFileArgs) -> Result<WriteFileResult, FileToolError> {
        let named = self.place("path", &args.path)?;
        let file = self.followed(&named).await?;
        let data = decode(args.content, args.encoding.unwrap_or_default())?;
        let if_version = match &args.if_version {
            Some(text) => version_bytes("if_version", text)?,
            None => Vec::new(),
        };
        let options = WriteOptions {
            if_version: if_version.clone(),
            create_parents: args.create_parents.unwrap_or(true),
            ..WriteOptions::default()
        };
        match self
            .directory
            .write_with(&file.relative, &data, &options)
            .await
        {
            Ok(stat) => Ok(WriteFileResult {
                path: named.shown(),
                version: version_text(&stat),
                size: stat.size,
            }),
            Err(error) if error.refusal_kind() == Some(RefusalKind::Conflict) => Err(self
                .conflict(
                    &file,
                    &format!(
                        "not written: it is not at version {}",
                        args.if_version.as_deref().unwrap_or_default()
                    ),
                )
                .await),
            Err(error) => Err(FileToolError::from_client(error)),
        }
    }
}
