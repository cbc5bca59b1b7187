//! Reading files: one-shot ranges and downloads in bounded chunks.

use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::files::error::{failed, refused};
use crate::files::resolve::{checked, open_beneath};
use crate::files::stat;
use crate::model::{FileKind, FileStat, MAX_ONE_SHOT_BYTES, Refusal, RefusalKind};

/// An open regular file and what it was when opened.
pub struct OpenFile {
    pub fd: OwnedFd,
    pub stat: FileStat,
}

/// Opens regular file `path` for reading. O_NONBLOCK so that a FIFO named
/// by mistake cannot block the call in open(2); it is refused after.
pub fn open_for_reading(op: &str, dir: impl AsFd, raw: &[u8]) -> Result<OpenFile, Refusal> {
    let path = checked(op, raw)?;
    let fd = open_beneath(
        dir,
        path,
        OFlags::RDONLY | OFlags::NONBLOCK,
        Mode::empty(),
        ResolveFlags::empty(),
    )
    .map_err(|errno| failed(op, raw, errno))?;
    let stat = stat::of_fd(&fd).map_err(|errno| failed(op, raw, errno))?;
    match stat.kind {
        FileKind::File => Ok(OpenFile { fd, stat }),
        FileKind::Directory => Err(failed(op, raw, rustix::io::Errno::ISDIR)),
        kind => Err(refused(
            RefusalKind::InvalidArgument,
            op,
            raw,
            format!("not a regular file (a {})", kind_name(kind)),
        )),
    }
}

pub fn kind_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::File => "file",
        FileKind::Directory => "directory",
        FileKind::Symlink => "symlink",
        FileKind::Fifo => "FIFO",
        FileKind::Socket => "socket",
        FileKind::CharDevice => "character device",
        FileKind::BlockDevice => "block device",
        FileKind::Unknown => "file of unknown kind",
    }
}

/// Reads up to `buf.len()` bytes at `offset`, retrying short reads until
/// the buffer is full or the file ends.
pub fn read_at(fd: impl AsFd, buf: &mut [u8], offset: u64) -> Result<usize, rustix::io::Errno> {
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::io::pread(fd.as_fd(), &mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(errno) => return Err(errno),
        }
    }
    Ok(filled)
}

/// `readFile`: bytes `offset..offset+length` (0: to the end) of `path`.
pub fn read_file(
    dir: impl AsFd,
    raw: &[u8],
    offset: u64,
    length: u64,
) -> Result<(Vec<u8>, FileStat), Refusal> {
    const OP: &str = "read";
    if length > MAX_ONE_SHOT_BYTES as u64 {
        return Err(refused(
            RefusalKind::LimitReached,
            OP,
            raw,
            format!(
                "{length} bytes asked; one readFile carries at most {MAX_ONE_SHOT_BYTES} (use download)"
            ),
        ));
    }
    let file = open_for_reading(OP, dir, raw)?;
    read_opened(file, raw, offset, length)
}

/// [`read_file`] of a file already opened (and stat'ed) for reading.
pub fn read_opened(
    file: OpenFile,
    raw: &[u8],
    offset: u64,
    length: u64,
) -> Result<(Vec<u8>, FileStat), Refusal> {
    const OP: &str = "read";
    let remaining = file.stat.size.saturating_sub(offset);
    let wanted = if length == 0 {
        if remaining > MAX_ONE_SHOT_BYTES as u64 {
            return Err(refused(
                RefusalKind::TooLarge,
                OP,
                raw,
                format!(
                    "{remaining} bytes; one readFile carries at most {MAX_ONE_SHOT_BYTES} (use \
                     download, or a range)"
                ),
            ));
        }
        remaining
    } else {
        remaining.min(length)
    };
    let mut data = vec![0; wanted as usize];
    let got = read_at(&file.fd, &mut data, offset).map_err(|errno| failed(OP, raw, errno))?;
    data.truncate(got);
    Ok((data, file.stat))
}
