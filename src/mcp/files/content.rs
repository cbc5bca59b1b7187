//! Content as JSON carries it (UTF-8 text as is, anything else as base64,
//! said explicitly), versions as text, and reading a file in chunks that
//! all belong to one version of it.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::paths::Placed;
use super::{FileToolError, FileTools};
use crate::model::{FileStat, RefusalKind};

/// How `content` is written in a request or a result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Encoding {
    /// The content is the text itself.
    #[default]
    #[serde(rename = "utf-8")]
    Utf8,
    /// The content is the bytes in standard base64 (with padding).
    #[serde(rename = "base64")]
    Base64,
}

/// `bytes` as text when they are UTF-8, else as base64.
pub(super) fn encode(bytes: Vec<u8>) -> (String, Encoding) {
    match String::from_utf8(bytes) {
        Ok(text) => (text, Encoding::Utf8),
        Err(error) => (BASE64.encode(error.as_bytes()), Encoding::Base64),
    }
}

/// The bytes `content` stands for.
pub(super) fn decode(content: String, encoding: Encoding) -> Result<Vec<u8>, FileToolError> {
    match encoding {
        Encoding::Utf8 => Ok(content.into_bytes()),
        Encoding::Base64 => BASE64.decode(content.as_bytes()).map_err(|error| {
            FileToolError::invalid(format!("`content` is not valid base64: {error}"))
        }),
    }
}

/// A file's version as results show it: the executor's opaque version
/// (`FileStat.version`: device, inode, size and times; it changes
/// whenever the content could have) in lowercase hex.
pub(super) fn version_text(stat: &FileStat) -> String {
    stat.version
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// The bytes of a version an agent gives back.
pub(super) fn version_bytes(field: &str, text: &str) -> Result<Vec<u8>, FileToolError> {
    let bad = || {
        FileToolError::invalid(format!(
            "`{field}` {text:?} is not a version read_file, write_file or edit_file answered"
        ))
    };
    if text.is_empty() || !text.len().is_multiple_of(2) || text.len() > 128 {
        return Err(bad());
    }
    (0..text.len())
        .step_by(2)
        .map(|at| {
            text.get(at..at + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(bad)
        })
        .collect()
}

/// Bytes one read of a chunked whole-file read asks for.
pub(super) const CHUNK_BYTES: u64 = 1024 * 1024;

impl FileTools {
    /// Bytes `offset .. offset + length` of `file` (one call: `length` at
    /// most 4 MiB) and its stat.
    pub(super) async fn read_range(
        &self,
        file: &Placed,
        offset: u64,
        length: u64,
    ) -> Result<(Vec<u8>, FileStat), FileToolError> {
        self.directory
            .read_range(&file.relative, offset, length)
            .await
            .map_err(FileToolError::from_client)
    }

    /// The chunk at `offset` of `file`, refused unless the file is still
    /// at `version` (a file replaced or written between two chunks would
    /// give a mix of two contents).
    pub(super) async fn read_chunk_of(
        &self,
        file: &Placed,
        offset: u64,
        version: &[u8],
    ) -> Result<Vec<u8>, FileToolError> {
        let (data, stat) = self.read_range(file, offset, CHUNK_BYTES).await?;
        if stat.version != version {
            return Err(FileToolError::refused(
                RefusalKind::Conflict,
                format!(
                    "{:?} changed while it was read (its version is now {}): read it again",
                    file.shown(),
                    version_text(&stat)
                ),
            ));
        }
        Ok(data)
    }

    /// The whole of `file`, refused past `limit` bytes before it is read
    /// (and if it grows past it meanwhile), with its stat.
    pub(super) async fn read_whole(
        &self,
        file: &Placed,
        limit: u64,
        tool: &str,
    ) -> Result<(Vec<u8>, FileStat), FileToolError> {
        let (mut data, stat) = self.read_range(file, 0, CHUNK_BYTES).await?;
        if stat.size > limit {
            return Err(FileToolError::refused(
                RefusalKind::TooLarge,
                format!(
                    "{:?} is {} bytes; {tool} takes files of at most {limit}",
                    file.shown(),
                    stat.size
                ),
            ));
        }
        while (data.len() as u64) < stat.size {
            let chunk = self
                .read_chunk_of(file, data.len() as u64, &stat.version)
                .await?;
            if chunk.is_empty() {
                break;
            }
            data.extend_from_slice(&chunk);
        }
        Ok((data, stat))
    }

    /// What a conflict on `file` says: its version now, or that it is gone.
    pub(super) async fn conflict(&self, file: &Placed, what: &str) -> FileToolError {
        let now = match self.directory.metadata(&file.relative).await {
            Ok(stat) => format!("its version is now {}", version_text(&stat)),
            Err(error) if error.refusal_kind() == Some(RefusalKind::NotFound) => {
                "it does not exist now".to_string()
            }
            Err(error) => format!("its version could not be read: {error}"),
        };
        FileToolError::refused(
            RefusalKind::Conflict,
            format!("{:?}: {what}; {now}", file.shown()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_is_text_when_it_can_be_and_base64_otherwise() {
        assert_eq!(
            encode("héllo\n".as_bytes().to_vec()),
            ("héllo\n".to_string(), Encoding::Utf8)
        );
        assert_eq!(
            encode(vec![0xff, 0x00, b'a']),
            ("/wBh".to_string(), Encoding::Base64)
        );
        assert_eq!(
            decode("/wBh".into(), Encoding::Base64).expect("base64"),
            vec![0xff, 0x00, b'a']
        );
        assert_eq!(
            decode("%%".into(), Encoding::Base64)
                .expect_err("not base64")
                .kind,
            super::super::FileToolErrorKind::InvalidArgument
        );
    }

    #[test]
    fn versions_round_trip_through_hex_and_junk_is_refused() {
        let stat = FileStat {
            kind: crate::model::FileKind::File,
            size: 0,
            permissions: 0,
            modified_ns: 0,
            accessed_ns: 0,
            changed_ns: 0,
            uid: 0,
            gid: 0,
            links: 1,
            inode: 0,
            device: 0,
            version: vec![0x00, 0xab, 0x10],
        };
        assert_eq!(version_text(&stat), "00ab10");
        assert_eq!(
            version_bytes("if_version", "00ab10").expect("hex"),
            stat.version
        );
        for junk in ["", "abc", "zz", "é1"] {
            let error = version_bytes("if_version", junk).expect_err(junk);
            assert_eq!(
                error.message,
                format!(
                    "`if_version` {junk:?} is not a version read_file, write_file or edit_file \
                     answered"
                )
            );
        }
    }
}
