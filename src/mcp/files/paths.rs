//! The paths an agent names: relative to the root, or absolute beneath
//! it (as it was named, or as the executor's kernel names it). They are
//! cleaned lexically here and refused if they leave the root that way;
//! what they lead to (symlinks, `..` through them) is resolved beneath the
//! root by the executor's kernel, which refuses every way out again.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use super::{FileToolError, FileTools};
use crate::model::{FileKind, RefusalKind};

/// A path beneath the root: what the `Directory` is given (`.` for the
/// root itself) and what results show (the same, as text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Placed {
    pub relative: PathBuf,
}

impl Placed {
    /// As results name it: relative to the root, `.` for the root.
    pub fn shown(&self) -> String {
        self.relative.display().to_string()
    }

    /// `name` (relative to this directory, as a walk gives it) as a path
    /// relative to the root, and whether its name was not UTF-8 (then
    /// the text has replacement characters and cannot name it again).
    pub fn child(&self, name: &[u8]) -> (String, bool) {
        let joined = if self.relative == Path::new(".") {
            PathBuf::from(OsStr::from_bytes(name))
        } else {
            self.relative.join(OsStr::from_bytes(name))
        };
        let bytes = joined.as_os_str().as_bytes();
        match std::str::from_utf8(bytes) {
            Ok(text) => (text.to_string(), false),
            Err(_) => (String::from_utf8_lossy(bytes).into_owned(), true),
        }
    }
}

/// `path` with `.` and `..` applied lexically (`..` at `/` stays there).
pub(super) fn lexically_clean(path: &Path) -> PathBuf {
    let mut clean = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::Normal(name) => clean.push(name),
            Component::ParentDir => {
                clean.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    clean
}

impl FileTools {
    /// Where `path` (an argument named `field`) is beneath the root, or
    /// why it is refused: empty, NUL, or outside the root.
    pub(super) fn place(&self, field: &str, path: &str) -> Result<Placed, FileToolError> {
        if path.is_empty() {
            return Err(FileToolError::invalid(format!(
                "`{field}` is empty: name a path relative to the root `{}`, or `.` for the root \
                 itself",
                self.root.display()
            )));
        }
        if path.contains('\0') {
            return Err(FileToolError::invalid(format!(
                "`{field}` contains a NUL byte"
            )));
        }
        let given = Path::new(path);
        let relative = if given.is_absolute() {
            let clean = lexically_clean(given);
            let beneath = clean
                .strip_prefix(&self.root)
                .or_else(|_| clean.strip_prefix(&self.canonical))
                .map_err(|_| self.outside(path))?;
            beneath.to_path_buf()
        } else {
            let mut relative = PathBuf::new();
            for component in given.components() {
                match component {
                    Component::Normal(name) => relative.push(name),
                    Component::ParentDir => {
                        if !relative.pop() {
                            return Err(self.outside(path));
                        }
                    }
                    Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
                }
            }
            relative
        };
        Ok(Placed {
            relative: if relative.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                relative
            },
        })
    }

    /// The file `file` names with a final symlink followed (within the
    /// root: the executor resolves it), so that a write changes the file
    /// a link leads to and the link stays, as an editor's save does.
    /// Anything but an existing symlink is `file` itself.
    pub(super) async fn followed(&self, file: &Placed) -> Result<Placed, FileToolError> {
        match self.directory.symlink_metadata(&file.relative).await {
            Ok(stat) if stat.kind == FileKind::Symlink => {}
            _ => return Ok(file.clone()),
        }
        match self.directory.canonicalize(&file.relative).await {
            Ok(resolved) if !resolved.is_empty() => Ok(Placed {
                relative: PathBuf::from(OsStr::from_bytes(&resolved)),
            }),
            // A dangling link is replaced by the file.
            Err(error) if error.refusal_kind() == Some(RefusalKind::NotFound) => Ok(file.clone()),
            Ok(_) => Err(FileToolError::refused(
                RefusalKind::IsADirectory,
                format!("{:?} leads to the root itself", file.shown()),
            )),
            Err(error) => Err(FileToolError::from_client(error)),
        }
    }

    fn outside(&self, path: &str) -> FileToolError {
        FileToolError::refused(
            RefusalKind::OutsideDirectory,
            format!(
                "{path:?} is outside the root {:?}, the directory these tools are confined to",
                self.root.display().to_string()
            ),
        )
    }
}
