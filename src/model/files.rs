//! Files as the `Directory` capability speaks of them: what a path is
//! (`FileStat`), the entries of listings and walks, how a write treats its
//! target, what a watch reports, and the limits every layer agrees on.

/// Most data a one-shot `readFile` or `writeFile` carries (messages are
/// refused past 16 MiB, and capnp-rpc reads a call's data more than once
/// against that limit: this leaves room for both).
pub const MAX_ONE_SHOT_BYTES: usize = 4 * 1024 * 1024;

/// Most files one `writeFiles` carries (their data together at most
/// [`MAX_ONE_SHOT_BYTES`]).
pub const MAX_BATCH_FILES: usize = 1024;

/// Most data one `UploadSink.write` carries.
pub const MAX_UPLOAD_CHUNK_BYTES: usize = 1024 * 1024;

/// The chunks a download pushes: large enough that per-message costs
/// vanish, small enough that a window holds several.
pub const DOWNLOAD_CHUNK_BYTES: usize = 256 * 1024;

/// Most entries in one push of a listing or walk.
pub const ENTRY_BATCH: usize = 1024;

/// Most bytes of path in one push of a listing or walk (entries are
/// counted by their path and link target, plus a fixed cost each).
pub const ENTRY_BATCH_BYTES: usize = 256 * 1024;

/// Transfers (uploads, downloads, lists, walks) one connection may have in
/// progress.
pub const MAX_TRANSFERS_PER_CONNECTION: usize = 64;

/// Watches one connection may hold.
pub const MAX_WATCHES_PER_CONNECTION: usize = 32;

/// Deepest level a walk enters (it holds a descriptor per level).
pub const MAX_WALK_DEPTH: u32 = 256;

/// Most glob patterns of a walk, include and exclude together.
pub const MAX_WALK_PATTERNS: usize = 256;

/// Longest path (and glob pattern, and symlink target) a call may name.
pub const MAX_PATH_BYTES: usize = 4096;

/// Watch events that may wait for a slow client before an `overflow`.
pub const MAX_PENDING_WATCH_EVENTS: usize = 16_384;

/// What kind of file a path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    Unknown,
    File,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

/// What a path is (see the schema's `FileStat`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileStat {
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits (07777).
    pub permissions: u32,
    /// Nanoseconds since the Unix epoch.
    pub modified_ns: i64,
    pub accessed_ns: i64,
    pub changed_ns: i64,
    pub uid: u32,
    pub gid: u32,
    pub links: u64,
    pub inode: u64,
    pub device: u64,
    /// Opaque; equal exactly when the content cannot have changed.
    pub version: Vec<u8>,
}

impl FileStat {
    pub fn is_dir(&self) -> bool {
        self.kind == FileKind::Directory
    }

    pub fn is_file(&self) -> bool {
        self.kind == FileKind::File
    }

    pub fn is_symlink(&self) -> bool {
        self.kind == FileKind::Symlink
    }
}

/// One entry of a listing or a walk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// A listing: the name; a walk: the path relative to the walked
    /// directory.
    pub path: Vec<u8>,
    /// Of the entry itself (symlinks not followed); `None` with `error`.
    pub stat: Option<FileStat>,
    /// A symlink's target, as stored; empty otherwise.
    pub link_target: Vec<u8>,
    /// Why the entry is incomplete (a directory that could not be entered).
    pub error: Option<String>,
}

/// How far a walk goes and what it reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WalkOptions {
    /// 0: up to [`MAX_WALK_DEPTH`].
    pub max_depth: u32,
    /// 0: no limit.
    pub max_entries: u64,
    pub include: Vec<Vec<u8>>,
    pub exclude: Vec<Vec<u8>>,
}

/// What a walk found, besides its entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkSummary {
    pub entries: u64,
    /// `max_entries` ended it.
    pub truncated: bool,
}

/// How `writeFile` and `upload` treat their target (see the schema's
/// `WriteOptions`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteOptions {
    pub exclusive: bool,
    pub must_exist: bool,
    pub in_place: bool,
    /// `None`: keep a replaced file's bits; new files get
    /// `new_file_permissions`, else 0666, less the umask.
    pub permissions: Option<u32>,
    /// A new file's permission bits (the low nine), less the umask, when
    /// `permissions` is `None`.
    pub new_file_permissions: Option<u32>,
    /// Non-empty: the target must have this version.
    pub if_version: Vec<u8>,
    pub create_parents: bool,
    /// The new file's modification time, ns since the epoch.
    pub modified_ns: Option<i64>,
    pub sync: bool,
}

/// How `copy` copies (see the schema's `CopyOptions`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyOptions {
    pub recursive: bool,
    pub no_replace: bool,
    pub preserve: bool,
}

/// What a watch reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WatchEventKind {
    Created,
    Modified,
    Removed,
    Renamed,
    Attributes,
    Overflow,
    Gone,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    pub kind: WatchEventKind,
    /// Relative to the watched directory.
    pub path: Vec<u8>,
    /// `Renamed`: the new path.
    pub to_path: Vec<u8>,
    pub is_directory: bool,
}

impl WatchEvent {
    pub fn overflow() -> WatchEvent {
        WatchEvent {
            kind: WatchEventKind::Overflow,
            path: Vec::new(),
            to_path: Vec::new(),
            is_directory: false,
        }
    }
}

/// Where a directory capability is and what it allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectoryInfo {
    pub path: std::path::PathBuf,
    pub read_only: bool,
}

/// Most matching lines one `search` answers (and its default).
pub const MAX_SEARCH_MATCHES: u32 = 1000;

/// Largest file `search` reads (and its default); larger ones are skipped.
pub const MAX_SEARCH_FILE_BYTES: u64 = MAX_ONE_SHOT_BYTES as u64;

/// Most bytes of a line a search match carries.
pub const SEARCH_TEXT_BYTES: usize = 512;

/// Bytes of a long line a search match keeps before the match.
pub const SEARCH_TEXT_BEFORE: usize = 128;

/// What `search` looks for, and where (see the schema's `SearchOptions`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SearchOptions {
    /// Rust `regex` syntax.
    pub pattern: String,
    pub case_insensitive: bool,
    /// Which files: `max_depth`, `include` and `exclude` as a walk's
    /// (`max_entries` is not used).
    pub max_depth: u32,
    pub include: Vec<Vec<u8>>,
    pub exclude: Vec<Vec<u8>>,
    /// 0: [`MAX_SEARCH_MATCHES`].
    pub max_matches: u32,
    /// 0: [`MAX_SEARCH_FILE_BYTES`].
    pub max_file_bytes: u64,
}

/// A line with a match (see the schema's `SearchMatch`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SearchMatch {
    /// Relative to the searched directory.
    pub path: Vec<u8>,
    /// 1-based.
    pub line_number: u64,
    pub line_bytes: u64,
    /// The line, or a window of [`SEARCH_TEXT_BYTES`] of it.
    pub text: Vec<u8>,
    /// Where `text` begins in the line.
    pub text_offset: u64,
    /// The match, in bytes of the line.
    pub match_start: u64,
    pub match_end: u64,
}

/// What a search found (see the schema's `SearchResult`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SearchResult {
    pub matches: Vec<SearchMatch>,
    pub files_searched: u64,
    pub binary_skipped: u64,
    pub too_large_skipped: u64,
    pub unreadable: u64,
    pub first_error: Option<String>,
    /// `max_matches` ended it.
    pub truncated: bool,
}
