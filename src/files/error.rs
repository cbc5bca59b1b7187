//! System call failures as the refusals a `Directory` call answers: one
//! line that says what, where and why, tagged by what went wrong.

use rustix::io::Errno;

use crate::model::{Refusal, RefusalKind, excerpt};

/// `path` as a message quotes it.
pub fn shown(path: &[u8]) -> String {
    let text = String::from_utf8_lossy(path);
    let text = if text.is_empty() { ".".into() } else { text };
    format!("{:?}", excerpt(&text))
}

/// The refusal for `op` on `path` failing with `errno`.
pub fn failed(op: &str, path: &[u8], errno: Errno) -> Refusal {
    let (kind, reason) = classify(errno);
    Refusal::new(kind, format!("{op} {}: {reason}", shown(path)))
}

/// A refusal of its own kind for `op` on `path`.
pub fn refused(kind: RefusalKind, op: &str, path: &[u8], reason: impl AsRef<str>) -> Refusal {
    Refusal::new(kind, format!("{op} {}: {}", shown(path), reason.as_ref()))
}

/// Why a path through a mount point beneath the directory is refused.
pub const CROSSES_MOUNT: &str = "crosses a mount point beneath the directory (another file system, \
     or a bind mount that may lead anywhere): calls stay on the directory's own mount; open the \
     mounted one as a directory of its own";

fn classify(errno: Errno) -> (RefusalKind, String) {
    let kind = match errno {
        Errno::NOENT => return (RefusalKind::NotFound, "not found".into()),
        Errno::NOTDIR => return (RefusalKind::NotADirectory, "not a directory".into()),
        Errno::ISDIR => return (RefusalKind::IsADirectory, "is a directory".into()),
        Errno::EXIST => return (RefusalKind::Exists, "exists".into()),
        Errno::NOTEMPTY => return (RefusalKind::NotEmpty, "directory not empty".into()),
        Errno::XDEV => {
            return (
                RefusalKind::OutsideDirectory,
                "leaves the directory (an absolute path, \"..\" past it, or a symlink \
                 pointing out)"
                    .into(),
            );
        }
        crate::files::resolve::CROSSES_MOUNT => {
            return (RefusalKind::OutsideDirectory, CROSSES_MOUNT.into());
        }
        Errno::LOOP => {
            return (
                RefusalKind::OutsideDirectory,
                "a symlink that cannot be followed here (a loop, or a magic link of /proc)".into(),
            );
        }
        Errno::ACCESS | Errno::PERM => RefusalKind::PermissionDenied,
        Errno::ROFS => {
            return (
                RefusalKind::PermissionDenied,
                "read-only file system".into(),
            );
        }
        Errno::NOSPC | Errno::DQUOT => RefusalKind::NoSpace,
        Errno::BUSY | Errno::TXTBSY => RefusalKind::Busy,
        Errno::NAMETOOLONG | Errno::INVAL => RefusalKind::InvalidArgument,
        Errno::NOSYS | Errno::OPNOTSUPP => RefusalKind::Unsupported,
        Errno::MFILE | Errno::NFILE => {
            return (
                RefusalKind::LimitReached,
                "the server has no file descriptor left".into(),
            );
        }
        _ => RefusalKind::Internal,
    };
    (
        kind,
        crate::model::io_message(&std::io::Error::from(errno)).to_lowercase(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_name_the_call_the_path_and_the_reason() {
        let refusal = failed("read", b"a/b", Errno::NOENT);
        assert_eq!(refusal.kind, RefusalKind::NotFound);
        assert_eq!(refusal.message, "read \"a/b\": not found");
        assert_eq!(
            failed("stat", b"", Errno::ACCESS).message,
            "stat \".\": permission denied"
        );
        assert_eq!(
            failed("open", b"/etc", Errno::XDEV).kind,
            RefusalKind::OutsideDirectory
        );
        let crossing = failed("read", b"mnt/f", crate::files::resolve::CROSSES_MOUNT);
        assert_eq!(crossing.kind, RefusalKind::OutsideDirectory);
        assert!(
            crossing
                .message
                .starts_with("read \"mnt/f\": crosses a mount point beneath the directory"),
            "{crossing}"
        );
    }
}
