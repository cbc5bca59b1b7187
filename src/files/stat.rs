//! `FileStat`s from the kernel's stat, and the version that tells whether
//! content may have changed.

use std::os::fd::AsFd;

use rustix::fs::{FileType, Stat};
use rustix::io::Errno;

use crate::model::{FileKind, FileStat};

pub fn kind_of(file_type: FileType) -> FileKind {
    match file_type {
        FileType::RegularFile => FileKind::File,
        FileType::Directory => FileKind::Directory,
        FileType::Symlink => FileKind::Symlink,
        FileType::Fifo => FileKind::Fifo,
        FileType::Socket => FileKind::Socket,
        FileType::CharacterDevice => FileKind::CharDevice,
        FileType::BlockDevice => FileKind::BlockDevice,
        _ => FileKind::Unknown,
    }
}

fn nanos(secs: i64, nsec: i64) -> i64 {
    secs.saturating_mul(1_000_000_000).saturating_add(nsec)
}

/// What the kernel's `stat` says, as the wire describes it.
#[allow(clippy::unnecessary_cast)] // the field types differ between targets
pub fn from_stat(stat: &Stat) -> FileStat {
    let modified_ns = nanos(stat.st_mtime as i64, stat.st_mtime_nsec as i64);
    let changed_ns = nanos(stat.st_ctime as i64, stat.st_ctime_nsec as i64);
    let device = stat.st_dev as u64;
    let inode = stat.st_ino as u64;
    let size = stat.st_size as u64;
    FileStat {
        kind: kind_of(FileType::from_raw_mode(stat.st_mode as _)),
        size,
        permissions: (stat.st_mode as u32) & 0o7777,
        modified_ns,
        accessed_ns: nanos(stat.st_atime as i64, stat.st_atime_nsec as i64),
        changed_ns,
        uid: stat.st_uid as u32,
        gid: stat.st_gid as u32,
        links: stat.st_nlink as u64,
        inode,
        device,
        version: version(device, inode, size, modified_ns, changed_ns),
    }
}

/// The version: every field whose change can mean new content. A write
/// moves mtime and ctime; an atomic replacement changes the inode; a
/// chmod moves ctime (a false alarm, never a missed change).
fn version(device: u64, inode: u64, size: u64, modified_ns: i64, changed_ns: i64) -> Vec<u8> {
    let mut version = Vec::with_capacity(40);
    for part in [device, inode, size, modified_ns as u64, changed_ns as u64] {
        version.extend_from_slice(&part.to_le_bytes());
    }
    version
}

pub fn of_fd(fd: impl AsFd) -> Result<FileStat, Errno> {
    rustix::fs::fstat(fd).map(|stat| from_stat(&stat))
}
