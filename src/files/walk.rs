//! Listings and walks, streamed: entries go out in bounded batches
//! through a callback (which blocks while the client is behind), so a
//! directory of any size costs the server one batch of memory, and a walk
//! one open directory per level.

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use rustix::fs::{AtFlags, Dir, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::files::error::{failed, refused};
use crate::files::resolve::{CROSSES_MOUNT, checked, open_beneath};
use crate::files::stat::from_stat;
use crate::files::tree::{joined, open_dir_entry};
use crate::model::{
    DirEntry, ENTRY_BATCH, ENTRY_BATCH_BYTES, MAX_PATH_BYTES, MAX_WALK_DEPTH, MAX_WALK_PATTERNS,
    Refusal, RefusalKind, WalkOptions, WalkSummary,
};

/// Takes a batch; `false` when nobody wants more (the call was dropped).
pub type Send<'a> = &'a mut dyn FnMut(Vec<DirEntry>) -> bool;

/// Entries gathered into batches of bounded count and size.
struct Batcher<'a> {
    send: Send<'a>,
    batch: Vec<DirEntry>,
    bytes: usize,
    sent: u64,
    /// The receiver went away: stop.
    closed: bool,
}

impl<'a> Batcher<'a> {
    fn new(send: Send<'a>) -> Batcher<'a> {
        Batcher {
            send,
            batch: Vec::new(),
            bytes: 0,
            sent: 0,
            closed: false,
        }
    }

    fn push(&mut self, entry: DirEntry) {
        self.bytes += entry.path.len() + entry.link_target.len() + 128;
        self.batch.push(entry);
        self.sent += 1;
        if self.batch.len() >= ENTRY_BATCH || self.bytes >= ENTRY_BATCH_BYTES {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if !self.batch.is_empty() && !self.closed {
            self.closed = !(self.send)(std::mem::take(&mut self.batch));
        }
        self.batch.clear();
        self.bytes = 0;
    }
}

/// The entry `name` of the directory `dir` is, with `path` as its name in
/// the result; `None` if it vanished meanwhile.
fn describe(dir: impl AsFd, name: &OsStr, path: Vec<u8>) -> Option<DirEntry> {
    let stat = match rustix::fs::statat(dir.as_fd(), name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => from_stat(&stat),
        Err(Errno::NOENT) => return None,
        Err(errno) => {
            return Some(DirEntry {
                path,
                stat: None,
                link_target: Vec::new(),
                error: Some(crate::model::io_message(&std::io::Error::from(errno)).to_lowercase()),
            });
        }
    };
    let link_target = if stat.is_symlink() {
        rustix::fs::readlinkat(dir.as_fd(), name, Vec::new())
            .map(|target| target.into_bytes())
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    Some(DirEntry {
        path,
        stat: Some(stat),
        link_target,
        error: None,
    })
}

fn open_listed(op: &str, dir: impl AsFd, raw: &[u8]) -> Result<Dir, Refusal> {
    let fd = open_beneath(
        dir,
        checked(op, raw)?,
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
        ResolveFlags::empty(),
    )
    .map_err(|errno| failed(op, raw, errno))?;
    Dir::new(fd).map_err(|errno| failed(op, raw, errno))
}

/// Reads the next entry's name, skipping "." and "..".
fn next_name(dir: &mut Dir) -> Option<Result<std::ffi::OsString, Errno>> {
    loop {
        match dir.read()? {
            Err(errno) => return Some(Err(errno)),
            Ok(entry) => {
                let name = entry.file_name().to_bytes();
                if name != b"." && name != b".." {
                    return Some(Ok(OsStr::from_bytes(name).to_os_string()));
                }
            }
        }
    }
}

/// `list`: every entry of directory `path`.
pub fn list(dir: impl AsFd, path: &[u8], send: Send<'_>) -> Result<u64, Refusal> {
    const OP: &str = "list";
    let mut listed = open_listed(OP, dir, path)?;
    let mut out = Batcher::new(send);
    while let Some(name) = next_name(&mut listed) {
        let name = name.map_err(|errno| failed(OP, path, errno))?;
        let fd = listed.fd().map_err(|errno| failed(OP, path, errno))?;
        if let Some(entry) = describe(fd, &name, name.as_bytes().to_vec()) {
            out.push(entry);
        }
        if out.closed {
            break;
        }
    }
    out.flush();
    Ok(out.sent)
}

/// Compiled include and exclude patterns.
struct Filter {
    include: Option<GlobSet>,
    exclude: Option<GlobSet>,
}

impl Filter {
    fn new(options: &WalkOptions, path: &[u8]) -> Result<Filter, Refusal> {
        let count = options.include.len() + options.exclude.len();
        if count > MAX_WALK_PATTERNS {
            return Err(refused(
                RefusalKind::InvalidArgument,
                "walk",
                path,
                format!("{count} patterns; at most {MAX_WALK_PATTERNS}"),
            ));
        }
        Ok(Filter {
            include: compile(&options.include, path)?,
            exclude: compile(&options.exclude, path)?,
        })
    }

    fn excluded(&self, path: &[u8]) -> bool {
        self.exclude
            .as_ref()
            .is_some_and(|set| set.is_match(OsStr::from_bytes(path)))
    }

    fn included(&self, path: &[u8]) -> bool {
        self.include
            .as_ref()
            .is_none_or(|set| set.is_match(OsStr::from_bytes(path)))
    }
}

fn compile(patterns: &[Vec<u8>], path: &[u8]) -> Result<Option<GlobSet>, Refusal> {
    if patterns.is_empty() {
        return Ok(None);
    }
    let bad = |reason: String| refused(RefusalKind::InvalidArgument, "walk", path, reason);
    let mut set = GlobSetBuilder::new();
    for pattern in patterns {
        if pattern.len() > MAX_PATH_BYTES {
            return Err(bad(format!("a pattern longer than {MAX_PATH_BYTES} bytes")));
        }
        let text = std::str::from_utf8(pattern)
            .map_err(|_| bad("a pattern that is not UTF-8".to_string()))?;
        let glob = GlobBuilder::new(text)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|error| bad(format!("pattern {text:?}: {}", error.kind())))?;
        set.add(glob);
    }
    set.build()
        .map(Some)
        .map_err(|error| bad(format!("patterns: {error}")))
}

/// One directory being read by a walk.
struct Level {
    dir: Dir,
    /// Its path relative to the walked directory ("" for that one).
    prefix: Vec<u8>,
    depth: u32,
}

/// `walk`: every entry beneath directory `path`, depth first.
pub fn walk(
    dir: impl AsFd,
    path: &[u8],
    options: &WalkOptions,
    send: Send<'_>,
) -> Result<WalkSummary, Refusal> {
    const OP: &str = "walk";
    let filter = Filter::new(options, path)?;
    let max_depth = match options.max_depth {
        0 => MAX_WALK_DEPTH,
        depth => depth.min(MAX_WALK_DEPTH),
    };
    let mut out = Batcher::new(send);
    let mut truncated = false;
    let mut stack = vec![Level {
        dir: open_listed(OP, dir, path)?,
        prefix: Vec::new(),
        depth: 1,
    }];
    while let Some(level) = stack.last_mut() {
        let name = match next_name(&mut level.dir) {
            None => {
                stack.pop();
                continue;
            }
            Some(Ok(name)) => name,
            Some(Err(errno)) => {
                let prefix = level.prefix.clone();
                stack.pop();
                out.push(error_entry(
                    prefix,
                    format!(
                        "reading the directory failed: {}",
                        crate::model::io_message(&std::io::Error::from(errno)).to_lowercase()
                    ),
                ));
                continue;
            }
        };
        let relative = joined(&level.prefix, name.as_bytes());
        if filter.excluded(&relative) {
            continue;
        }
        let depth = level.depth;
        let fd = level.dir.fd().map_err(|errno| failed(OP, path, errno))?;
        let Some(mut entry) = describe(fd, &name, relative.clone()) else {
            continue;
        };
        let mut child = None;
        if entry.stat.as_ref().is_some_and(|stat| stat.is_dir()) {
            if depth < max_depth {
                match open_dir_entry(fd, &name).and_then(Dir::new) {
                    Ok(dir) => child = Some(dir),
                    Err(Errno::LOOP | Errno::NOTDIR) => {
                        entry.error = Some(
                            "replaced while the walk ran (no longer a directory); not entered"
                                .to_string(),
                        );
                    }
                    Err(Errno::NOENT) => continue,
                    Err(CROSSES_MOUNT) => {
                        entry.error = Some(
                            "a mount point (another file system, or a bind mount that may lead \
                             anywhere); not entered"
                                .to_string(),
                        );
                    }
                    Err(errno) => {
                        entry.error = Some(format!(
                            "cannot be entered: {}",
                            crate::model::io_message(&std::io::Error::from(errno)).to_lowercase()
                        ));
                    }
                }
            } else if options.max_depth == 0 || options.max_depth > MAX_WALK_DEPTH {
                entry.error = Some(format!(
                    "deeper than the server's {MAX_WALK_DEPTH} levels; not entered"
                ));
            }
        }
        if filter.included(&relative) || entry.error.is_some() {
            if options.max_entries != 0 && out.sent >= options.max_entries {
                truncated = true;
                break;
            }
            out.push(entry);
            if out.closed {
                break;
            }
        }
        if let Some(dir) = child {
            stack.push(Level {
                dir,
                prefix: relative,
                depth: depth + 1,
            });
        }
    }
    out.flush();
    Ok(WalkSummary {
        entries: out.sent,
        truncated,
    })
}

fn error_entry(path: Vec<u8>, error: String) -> DirEntry {
    DirEntry {
        path,
        stat: None,
        link_target: Vec::new(),
        error: Some(error),
    }
}
