//! What a file tool answers when it cannot do what it was asked: a
//! sentence for the agent (capexec's tag included where the executor
//! gave one) and whether the arguments were at fault.

use std::fmt;

use crate::client;
use crate::model::{Refusal, RefusalKind};

/// Whose fault a failure is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileToolErrorKind {
    /// The arguments are malformed or contradictory (the same call can
    /// never succeed): an MCP server may answer it as invalid params.
    InvalidArgument,
    /// The operation was tried and did not succeed (a missing file, a
    /// version conflict, an edit that did not match, a path outside the
    /// root...): a tool result with `isError`, for the agent to read.
    Failed,
}

/// A file tool's failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileToolError {
    pub kind: FileToolErrorKind,
    /// One line for the agent; ends with `[capexec:<code>]` when the
    /// executor (or the path check) refused with one.
    pub message: String,
    /// The executor's refusal kind, when there was one.
    pub refusal: Option<RefusalKind>,
}

impl FileToolError {
    pub(super) fn invalid(message: impl Into<String>) -> FileToolError {
        FileToolError {
            kind: FileToolErrorKind::InvalidArgument,
            message: message.into(),
            refusal: None,
        }
    }

    pub(super) fn failed(message: impl Into<String>) -> FileToolError {
        FileToolError {
            kind: FileToolErrorKind::Failed,
            message: message.into(),
            refusal: None,
        }
    }

    /// A refusal of this process's own, tagged as the executor's are.
    pub(super) fn refused(kind: RefusalKind, message: impl Into<String>) -> FileToolError {
        let refusal = Refusal::new(kind, message);
        FileToolError {
            kind: FileToolErrorKind::Failed,
            message: refusal.to_string(),
            refusal: Some(kind),
        }
    }

    /// A failed call on the root's `Directory`: a tagged refusal keeps
    /// its tag; an executor's `invalid-argument` is the arguments' fault.
    pub fn from_client(error: client::Error) -> FileToolError {
        match error {
            client::Error::Refused(refusal) => FileToolError {
                kind: if refusal.kind == RefusalKind::InvalidArgument {
                    FileToolErrorKind::InvalidArgument
                } else {
                    FileToolErrorKind::Failed
                },
                message: refusal.to_string(),
                refusal: Some(refusal.kind),
            },
            other => FileToolError::failed(format!("capexec: {other}")),
        }
    }
}

impl fmt::Display for FileToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FileToolError {}
