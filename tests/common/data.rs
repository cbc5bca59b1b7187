//! Deterministic test data that detects loss, duplication and reordering.

use std::io::Write;
use std::path::Path;

/// An endless pseudo-random byte stream (xorshift64*), cheap to regenerate
/// for comparison.
pub struct Pattern {
    state: u64,
    word: [u8; 8],
    used: usize,
}

impl Pattern {
    pub fn new(seed: u64) -> Pattern {
        Pattern {
            state: seed | 1,
            word: [0; 8],
            used: 8,
        }
    }

    pub fn fill(&mut self, out: &mut [u8]) {
        for byte in out.iter_mut() {
            if self.used == 8 {
                self.state ^= self.state >> 12;
                self.state ^= self.state << 25;
                self.state ^= self.state >> 27;
                self.word = self.state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
                self.used = 0;
            }
            *byte = self.word[self.used];
            self.used += 1;
        }
    }

    pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        Pattern::new(seed).fill(&mut out);
        out
    }
}

/// Writes `len` pattern bytes to `path`.
pub fn write_pattern_file(path: &Path, seed: u64, len: usize) {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).expect("create"));
    let mut pattern = Pattern::new(seed);
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len());
        pattern.fill(&mut buf[..n]);
        file.write_all(&buf[..n]).expect("write");
        left -= n;
    }
    file.flush().expect("flush");
}

/// Checks a stream against the pattern as it arrives.
pub struct PatternChecker {
    pattern: Pattern,
    expected: Vec<u8>,
    pub checked: u64,
}

impl PatternChecker {
    pub fn new(seed: u64) -> PatternChecker {
        PatternChecker {
            pattern: Pattern::new(seed),
            expected: Vec::new(),
            checked: 0,
        }
    }

    pub fn check(&mut self, data: &[u8]) {
        self.expected.resize(data.len(), 0);
        self.pattern.fill(&mut self.expected);
        if let Some(at) = data.iter().zip(&self.expected).position(|(a, b)| a != b) {
            panic!("stream differs at byte {}", self.checked + at as u64);
        }
        self.checked += data.len() as u64;
    }
}

/// A fresh directory under the target dir, removed when dropped.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    /// A fresh directory of its own: names carry a counter, and an existing
    /// directory is never reused (two tests may ask in the same clock tick).
    pub fn new(name: &str) -> TempDir {
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        loop {
            let path = std::env::temp_dir().join(format!(
                "capexec-test-{}-{}-{}-{}",
                name,
                std::process::id(),
                MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0)
            ));
            match std::fs::create_dir(&path) {
                Ok(()) => return TempDir(path),
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(error) => panic!("create temp dir {}: {error}", path.display()),
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A directory for trees that must lie outside every directory Codex's
/// `workspace-write` intent makes writable (`/tmp` and `$TMPDIR`): the
/// build's own temporary directory unless the checkout itself is under one
/// of them (a clone in /tmp, as CI's check makes), else `/var/tmp`, else
/// the home directory's cache. Fails loudly when none is outside.
pub fn outside_temporary_directories() -> std::path::PathBuf {
    let canonical =
        |path: &Path| std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut temporary = vec![canonical(Path::new("/tmp"))];
    if let Some(tmpdir) = std::env::var_os("TMPDIR") {
        temporary.push(canonical(Path::new(&tmpdir)));
    }
    let mut candidates = vec![
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
        "/var/tmp".into(),
    ];
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(Path::new(&home).join(".cache"));
    }
    candidates
        .into_iter()
        .find(|candidate| {
            let candidate = canonical(candidate);
            candidate.is_dir()
                && !temporary
                    .iter()
                    .any(|temporary| candidate.starts_with(temporary))
        })
        .unwrap_or_else(|| panic!("no directory outside {temporary:?} to test the sandbox with"))
}

/// Makes a chain of `depth` directories named `child` under `parent/top`
/// (`top/child/child/...`), one level at a time with the kernel's *at
/// calls: a path that deep cannot be named whole, and a command making it
/// under Landlock checks every level above each mkdir (minutes at 20,000).
pub fn make_tower(parent: &Path, top: &str, child: &str, depth: usize) {
    use rustix::fs::{Mode, OFlags, mkdirat, openat};
    let open_flags = OFlags::RDONLY | OFlags::DIRECTORY;
    let mut at =
        openat(rustix::fs::CWD, parent, open_flags, Mode::empty()).expect("open the parent");
    for name in std::iter::once(top).chain(std::iter::repeat_n(child, depth)) {
        mkdirat(&at, name, Mode::from_raw_mode(0o755)).expect("mkdirat");
        at = openat(&at, name, open_flags, Mode::empty()).expect("openat");
    }
}
