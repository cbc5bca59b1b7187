//! Listings and walks, streamed: each is a state that gives its entries
//! a bounded batch at a time ([`Listing::next_batch`],
//! [`Walk::next_batch`]), so a directory of any size costs the server one
//! batch of memory, a walk one open directory per level, and while the
//! client is behind no thread at all (the caller runs one step at a time
//! on the blocking pool and waits for the client between steps).

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

/// Entries gathered into a batch of bounded count and size.
#[derive(Default)]
struct Batch {
    entries: Vec<DirEntry>,
    bytes: usize,
}

impl Batch {
    /// Adds `entry`; whether the batch is now full.
    fn push(&mut self, entry: DirEntry) -> bool {
        self.bytes += entry.path.len() + entry.link_target.len() + 128;
        self.entries.push(entry);
        self.entries.len() >= ENTRY_BATCH || self.bytes >= ENTRY_BATCH_BYTES
    }

    /// The batch so far, if it has anything.
    fn take(&mut self) -> Option<Vec<DirEntry>> {
        self.bytes = 0;
        (!self.entries.is_empty()).then(|| std::mem::take(&mut self.entries))
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
    open_listed_as(op, dir, raw, raw)
}

/// Opens directory `raw` to read it; failures name it `shown`.
fn open_listed_as(op: &str, dir: impl AsFd, raw: &[u8], shown: &[u8]) -> Result<Dir, Refusal> {
    let fd = open_beneath(
        dir,
        checked(op, raw)?,
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
        ResolveFlags::empty(),
    )
    .map_err(|errno| failed(op, shown, errno))?;
    Dir::new(fd).map_err(|errno| failed(op, shown, errno))
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

/// `list`: every entry of directory `path`, a batch at a time.
pub struct Listing {
    dir: Dir,
    path: Vec<u8>,
    sent: u64,
}

impl Listing {
    pub fn open(dir: impl AsFd, path: &[u8]) -> Result<Listing, Refusal> {
        Ok(Listing {
            dir: open_listed("list", dir, path)?,
            path: path.to_vec(),
            sent: 0,
        })
    }

    /// The next batch of entries; `None` once every entry was given.
    pub fn next_batch(&mut self) -> Result<Option<Vec<DirEntry>>, Refusal> {
        const OP: &str = "list";
        let mut batch = Batch::default();
        while let Some(name) = next_name(&mut self.dir) {
            let name = name.map_err(|errno| failed(OP, &self.path, errno))?;
            let fd = self
                .dir
                .fd()
                .map_err(|errno| failed(OP, &self.path, errno))?;
            if let Some(entry) = describe(fd, &name, name.as_bytes().to_vec()) {
                self.sent += 1;
                if batch.push(entry) {
                    break;
                }
            }
        }
        Ok(batch.take())
    }

    /// Entries given so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }
}

/// Compiled include and exclude patterns.
struct Filter {
    include: Option<GlobSet>,
    exclude: Option<GlobSet>,
}

impl Filter {
    fn new(op: &str, options: &WalkOptions, path: &[u8]) -> Result<Filter, Refusal> {
        let count = options.include.len() + options.exclude.len();
        if count > MAX_WALK_PATTERNS {
            return Err(refused(
                RefusalKind::InvalidArgument,
                op,
                path,
                format!("{count} patterns; at most {MAX_WALK_PATTERNS}"),
            ));
        }
        Ok(Filter {
            include: compile(op, &options.include, path)?,
            exclude: compile(op, &options.exclude, path)?,
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

fn compile(op: &str, patterns: &[Vec<u8>], path: &[u8]) -> Result<Option<GlobSet>, Refusal> {
    if patterns.is_empty() {
        return Ok(None);
    }
    let bad = |reason: String| refused(RefusalKind::InvalidArgument, op, path, reason);
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

/// `walk`: every entry beneath directory `path`, depth first, a batch at
/// a time.
pub struct Walk {
    filter: Filter,
    options: WalkOptions,
    max_depth: u32,
    stack: Vec<Level>,
    path: Vec<u8>,
    sent: u64,
    truncated: bool,
    /// The call it serves, as its messages name it.
    op: &'static str,
}

impl Walk {
    pub fn open(dir: impl AsFd, path: &[u8], options: &WalkOptions) -> Result<Walk, Refusal> {
        Walk::open_as("walk", dir, path, path, options)
    }

    /// A walk of `path` for call `op` (a search's), whose messages name
    /// the directory `shown`.
    pub fn open_as(
        op: &'static str,
        dir: impl AsFd,
        path: &[u8],
        shown: &[u8],
        options: &WalkOptions,
    ) -> Result<Walk, Refusal> {
        let filter = Filter::new(op, options, shown)?;
        let max_depth = match options.max_depth {
            0 => MAX_WALK_DEPTH,
            depth => depth.min(MAX_WALK_DEPTH),
        };
        Ok(Walk {
            filter,
            options: options.clone(),
            max_depth,
            stack: vec![Level {
                dir: open_listed_as(op, dir, path, shown)?,
                prefix: Vec::new(),
                depth: 1,
            }],
            path: shown.to_vec(),
            sent: 0,
            truncated: false,
            op,
        })
    }

    /// Directories it holds open now (one per level it is in).
    pub fn open_levels(&self) -> usize {
        self.stack.len()
    }

    /// What it gave: entries, and whether `maxEntries` cut it short.
    pub fn summary(&self) -> WalkSummary {
        WalkSummary {
            entries: self.sent,
            truncated: self.truncated,
        }
    }

    /// The next batch of entries; `None` once the walk is over.
    pub fn next_batch(&mut self) -> Result<Option<Vec<DirEntry>>, Refusal> {
        let op = self.op;
        let mut batch = Batch::default();
        while let Some(level) = self.stack.last_mut() {
            let name = match next_name(&mut level.dir) {
                None => {
                    self.stack.pop();
                    continue;
                }
                Some(Ok(name)) => name,
                Some(Err(errno)) => {
                    let prefix = level.prefix.clone();
                    self.stack.pop();
                    self.sent += 1;
                    let full = batch.push(error_entry(
                        prefix,
                        format!(
                            "reading the directory failed: {}",
                            crate::model::io_message(&std::io::Error::from(errno)).to_lowercase()
                        ),
                    ));
                    if full {
                        break;
                    }
                    continue;
                }
            };
            let relative = joined(&level.prefix, name.as_bytes());
            if self.filter.excluded(&relative) {
                continue;
            }
            let depth = level.depth;
            let fd = level
                .dir
                .fd()
                .map_err(|errno| failed(op, &self.path, errno))?;
            let Some(mut entry) = describe(fd, &name, relative.clone()) else {
                continue;
            };
            let mut child = None;
            if entry.stat.as_ref().is_some_and(|stat| stat.is_dir()) {
                if depth < self.max_depth {
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
                                "a mount point (another file system, or a bind mount that may \
                                 lead anywhere); not entered"
                                    .to_string(),
                            );
                        }
                        Err(errno) => {
                            entry.error = Some(format!(
                                "cannot be entered: {}",
                                crate::model::io_message(&std::io::Error::from(errno))
                                    .to_lowercase()
                            ));
                        }
                    }
                } else if self.options.max_depth == 0 || self.options.max_depth > MAX_WALK_DEPTH {
                    entry.error = Some(format!(
                        "deeper than the server's {MAX_WALK_DEPTH} levels; not entered"
                    ));
                }
            }
            let mut full = false;
            if self.filter.included(&relative) || entry.error.is_some() {
                if self.options.max_entries != 0 && self.sent >= self.options.max_entries {
                    self.truncated = true;
                    self.stack.clear();
                    break;
                }
                self.sent += 1;
                full = batch.push(entry);
            }
            if let Some(dir) = child {
                self.stack.push(Level {
                    dir,
                    prefix: relative,
                    depth: depth + 1,
                });
            }
            if full {
                break;
            }
        }
        Ok(batch.take())
    }
}

fn error_entry(path: Vec<u8>, error: String) -> DirEntry {
    DirEntry {
        path,
        stat: None,
        link_target: Vec::new(),
        error: Some(error),
    }
}
