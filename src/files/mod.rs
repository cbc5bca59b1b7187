//! The file engine: directories as confined trees, plain Rust over the
//! kernel's *at calls, knowing nothing of capnp. A [`Directory`] holds a
//! descriptor of its directory; every path it is given is resolved
//! beneath that descriptor by the kernel (`resolve.rs`), never as a string
//! joined to a prefix. File system calls block, so each runs on tokio's
//! blocking pool, within its connection's share of it (`work.rs`), in
//! bounded chunks: reads of 256 KiB, writes as they come, listings in
//! batches; memory stays bounded whatever the sizes, and a transfer whose
//! client is behind waits between chunks without a thread. Read-only
//! directories, and everything derived from them, refuse every mutation.

mod error;
mod read;
mod resolve;
mod search;
mod stat;
mod tree;
mod walk;
mod watch;
pub mod within;
mod work;
mod writable;
mod write;

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use tokio::sync::mpsc;

pub use self::writable::Writable;

use crate::model::{
    CopyOptions, DOWNLOAD_CHUNK_BYTES, DirEntry, DirectoryInfo, FileStat, MAX_UPLOAD_CHUNK_BYTES,
    Refusal, RefusalKind, SearchOptions, SearchResult, WalkOptions, WalkSummary, WriteOptions,
    excerpt,
};
use crate::sys::{HostConfig, KernelFeature};

pub(crate) use self::resolve::path_of;
pub use self::watch::{Watcher, coalesce, limit_watches, watch_budget};
pub use self::work::{
    MAX_FILE_WORK, MAX_FILE_WORK_PER_CONNECTION, MAX_FILE_WORK_QUEUED_PER_CONNECTION, Work,
};
pub use self::write::TEMP_PREFIX;

/// A directory and everything beneath it, and nothing else.
#[derive(Clone)]
pub struct Directory {
    fd: Arc<OwnedFd>,
    read_only: bool,
    /// The share of the blocking pool its calls run in.
    work: Work,
    /// Whether its writes may stage in unnamed files (O_TMPFILE), which
    /// the host it was opened on may hide.
    tmpfile: bool,
}

/// Whether the kernel confines resolution (openat2, Linux 5.6), unless
/// `host` hides it: without it no directory is handed out.
fn confinement_available(probe: &OwnedFd, host: &HostConfig) -> Result<(), Refusal> {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    let available = !host.hides(KernelFeature::Openat2)
        && *AVAILABLE.get_or_init(|| {
            !matches!(
                resolve::locate(probe, Path::new("."), false),
                Err(Errno::NOSYS)
            )
        });
    if available {
        Ok(())
    } else {
        Err(Refusal::new(
            RefusalKind::Unsupported,
            "this kernel has no openat2 (Linux 5.6 or later), so paths could not be confined \
             beneath a directory; directories are not offered",
        ))
    }
}

fn shown_host(path: &Path) -> String {
    format!("{:?}", excerpt(&path.display().to_string()))
}

impl Directory {
    /// The directory at `path` on this machine (relative: from the working
    /// directory; symlinks followed, as the server's user would), on a
    /// kernel with what `host` leaves of it.
    pub fn open(path: &Path, host: &HostConfig) -> Result<Directory, Refusal> {
        if path.as_os_str().is_empty() {
            return Err(Refusal::new(
                RefusalKind::InvalidArgument,
                "an empty directory path",
            ));
        }
        let fd = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|errno| host_failure(path, errno))?;
        confinement_available(&fd, host)?;
        Ok(Directory {
            fd: Arc::new(fd),
            read_only: false,
            work: Work::default(),
            tmpfile: !host.hides(KernelFeature::TmpFile),
        })
    }

    /// The directory at `path` if it is one of `roots` or beneath one
    /// (resolved beneath that root by the kernel, so a symlink changed
    /// meanwhile cannot lead out of it); else `None`.
    /// A path that does not resolve is `None` too unless it lies within a
    /// root (see `within.rs`): what exists outside is not the caller's to
    /// learn.
    pub fn open_within(
        path: &Path,
        roots: &[PathBuf],
        host: &HostConfig,
    ) -> Result<Option<Directory>, Refusal> {
        let canonical = match std::fs::canonicalize(path) {
            Ok(canonical) => canonical,
            Err(_)
                if !within::failure_is_inside(
                    path,
                    roots.iter().map(|root| within::Root::directory(root)),
                ) =>
            {
                return Ok(None);
            }
            Err(error) => {
                let errno = error
                    .raw_os_error()
                    .map_or(Errno::IO, Errno::from_raw_os_error);
                return Err(host_failure(path, errno));
            }
        };
        let Some(root) = roots.iter().find(|root| canonical.starts_with(root)) else {
            return Ok(None);
        };
        let base = Directory::open(root, host)?;
        let relative = canonical.strip_prefix(root).unwrap_or(Path::new(""));
        let relative = if relative.as_os_str().is_empty() {
            Path::new(".")
        } else {
            relative
        };
        let fd = resolve::open_beneath(
            &*base.fd,
            relative,
            OFlags::PATH | OFlags::DIRECTORY,
            Mode::empty(),
            ResolveFlags::empty(),
        )
        .map_err(|errno| host_failure(path, errno))?;
        Ok(Some(Directory {
            fd: Arc::new(fd),
            ..base
        }))
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The same directory, its calls run in `work` (its connection's share
    /// of the blocking pool), as every directory derived from it.
    pub fn with_work(self, work: Work) -> Directory {
        Directory { work, ..self }
    }

    /// The same directory, read-only.
    pub fn read_only(&self) -> Directory {
        Directory {
            read_only: true,
            ..self.clone()
        }
    }

    /// Refuses `call` at once on a read-only directory (before any work;
    /// [`Directory::write`] checks again where the descriptor is handed out).
    fn writable(&self, call: &str) -> Result<(), Refusal> {
        if self.read_only {
            return Err(writable::refusal(call));
        }
        Ok(())
    }

    /// Runs `work`, which only reads, with the directory's descriptor on
    /// the blocking pool.
    async fn read<T: Send + 'static>(
        &self,
        work: impl FnOnce(&OwnedFd) -> Result<T, Refusal> + Send + 'static,
    ) -> Result<T, Refusal> {
        let fd = Arc::clone(&self.fd);
        self.work.run(move || work(&fd)).await
    }

    /// Runs `work`, which changes what is beneath the directory (call
    /// `call`), on the blocking pool; refused on a read-only directory.
    /// The only way to a [`Writable`] descriptor, which every function that
    /// writes takes.
    async fn write<T: Send + 'static>(
        &self,
        call: &'static str,
        work: impl FnOnce(Writable<'_>) -> Result<T, Refusal> + Send + 'static,
    ) -> Result<T, Refusal> {
        self.writable(call)?;
        let fd = Arc::clone(&self.fd);
        let read_only = self.read_only;
        let tmpfile = self.tmpfile;
        self.work
            .run(move || work(Writable::checked(fd.as_fd(), read_only, tmpfile, call)?))
            .await
    }

    pub async fn info(&self) -> Result<DirectoryInfo, Refusal> {
        let read_only = self.read_only;
        self.read(move |fd| {
            let path =
                resolve::path_of(fd).map_err(|errno| error::failed("info of", b"", errno))?;
            Ok(DirectoryInfo { path, read_only })
        })
        .await
    }

    /// Directory `path` beneath this one, as a directory of its own.
    pub async fn subdirectory(&self, path: Vec<u8>) -> Result<Directory, Refusal> {
        let read_only = self.read_only;
        let work = self.work.clone();
        let tmpfile = self.tmpfile;
        self.read(move |fd| {
            const OP: &str = "open directory";
            let fd = resolve::open_beneath(
                fd,
                resolve::checked(OP, &path)?,
                OFlags::PATH | OFlags::DIRECTORY,
                Mode::empty(),
                ResolveFlags::empty(),
            )
            .map_err(|errno| error::failed(OP, &path, errno))?;
            Ok(Directory {
                fd: Arc::new(fd),
                read_only,
                work,
                tmpfile,
            })
        })
        .await
    }

    pub async fn stat(&self, path: Vec<u8>, no_follow: bool) -> Result<FileStat, Refusal> {
        self.read(move |fd| {
            const OP: &str = "stat";
            let target = resolve::locate(fd, resolve::checked(OP, &path)?, no_follow)
                .map_err(|errno| error::failed(OP, &path, errno))?;
            stat::of_fd(&target).map_err(|errno| error::failed(OP, &path, errno))
        })
        .await
    }

    /// Lists directory `path` into `batches`; answers once every batch is
    /// in the channel (a full channel holds the listing back, with no
    /// thread waiting).
    pub async fn list(
        &self,
        path: Vec<u8>,
        batches: mpsc::Sender<Vec<DirEntry>>,
    ) -> Result<u64, Refusal> {
        let listing = self.read(move |fd| walk::Listing::open(fd, &path)).await?;
        let listing = self
            .send_batches(listing, walk::Listing::next_batch, &batches, |_| Ok(()))
            .await?;
        Ok(listing.sent())
    }

    /// Walks directory `path` into `batches`, like [`Directory::list`];
    /// `levels` hears how many directories the walk holds open after each
    /// batch (its caller counts them), and may stop it.
    pub async fn walk(
        &self,
        path: Vec<u8>,
        options: WalkOptions,
        batches: mpsc::Sender<Vec<DirEntry>>,
        levels: impl FnMut(usize) -> Result<(), Refusal>,
    ) -> Result<WalkSummary, Refusal> {
        let walk = self
            .read(move |fd| walk::Walk::open(fd, &path, &options))
            .await?;
        let mut levels = levels;
        let walk = self
            .send_batches(walk, walk::Walk::next_batch, &batches, |walk| {
                levels(walk.open_levels())
            })
            .await?;
        Ok(walk.summary())
    }

    /// Searches the files beneath directory `path` (see `search.rs`), a
    /// bounded step at a time on the blocking pool; `levels` hears how
    /// many directories the search holds open after each step, as
    /// [`Directory::walk`]'s does. A read: allowed when read-only.
    pub async fn search(
        &self,
        path: Vec<u8>,
        options: SearchOptions,
        mut levels: impl FnMut(usize) -> Result<(), Refusal>,
    ) -> Result<SearchResult, Refusal> {
        let mut search = self
            .read(move |fd| search::Search::open(fd, &path, &options))
            .await?;
        loop {
            let (back, over) = self
                .work
                .run(move || {
                    let over = search.step();
                    Ok((search, over))
                })
                .await?;
            search = back;
            levels(search.open_levels())?;
            if over? {
                return Ok(search.finish());
            }
        }
    }

    /// Runs `next` on `state` one step at a time on the blocking pool,
    /// sending each batch before the next step: while the receiver is
    /// behind, the state waits here, holding no thread. Stops when the
    /// batches end or the receiver is gone.
    async fn send_batches<S: Send + 'static>(
        &self,
        mut state: S,
        next: fn(&mut S) -> Result<Option<Vec<DirEntry>>, Refusal>,
        batches: &mpsc::Sender<Vec<DirEntry>>,
        mut after: impl FnMut(&S) -> Result<(), Refusal>,
    ) -> Result<S, Refusal> {
        loop {
            let (back, batch) = self
                .work
                .run(move || {
                    let batch = next(&mut state);
                    Ok((state, batch))
                })
                .await?;
            state = back;
            after(&state)?;
            let Some(batch) = batch? else {
                return Ok(state);
            };
            if batches.send(batch).await.is_err() {
                return Ok(state);
            }
        }
    }

    pub async fn read_file(
        &self,
        path: Vec<u8>,
        offset: u64,
        length: u64,
    ) -> Result<(Vec<u8>, FileStat), Refusal> {
        self.read(move |fd| read::read_file(fd, &path, offset, length))
            .await
    }

    pub async fn write_file(
        &self,
        path: Vec<u8>,
        data: Vec<u8>,
        options: WriteOptions,
    ) -> Result<FileStat, Refusal> {
        if data.len() > crate::model::MAX_ONE_SHOT_BYTES {
            return Err(error::refused(
                RefusalKind::LimitReached,
                "write",
                &path,
                format!(
                    "{} bytes; one writeFile carries at most {} (use upload)",
                    data.len(),
                    crate::model::MAX_ONE_SHOT_BYTES
                ),
            ));
        }
        self.write("writeFile", move |fd| {
            write::write_file(fd, &path, &data, &options)
        })
        .await
    }

    /// `writeFiles`: each `(path, data, options)` written as
    /// [`Directory::write_file`] would, in order, in one trip to the
    /// blocking pool; one outcome per file.
    pub async fn write_files(
        &self,
        files: Vec<(Vec<u8>, Vec<u8>, WriteOptions)>,
    ) -> Result<Vec<Result<FileStat, Refusal>>, Refusal> {
        self.writable("writeFiles")?;
        let bytes: usize = files.iter().map(|(_, data, _)| data.len()).sum();
        check_batch("writeFiles", files.len(), bytes)?;
        self.write("writeFiles", move |fd| {
            Ok(files
                .iter()
                .map(|(path, data, options)| write::write_file(fd, path, data, options))
                .collect())
        })
        .await
    }

    /// `readFiles`: each of `paths` read whole as [`Directory::read_file`]
    /// would, in order, in one trip to the blocking pool; a file that
    /// would take the answer past [`crate::model::MAX_ONE_SHOT_BYTES`]
    /// fails alone as too large.
    pub async fn read_files(
        &self,
        paths: Vec<Vec<u8>>,
    ) -> Result<Vec<Result<(Vec<u8>, FileStat), Refusal>>, Refusal> {
        check_batch("readFiles", paths.len(), 0)?;
        self.read(move |fd| {
            let mut room = crate::model::MAX_ONE_SHOT_BYTES;
            Ok(paths
                .iter()
                .map(|path| {
                    // Sized before it is read: past the budget, a file
                    // costs no read at all.
                    let file = read::open_for_reading("read", fd, path)?;
                    if file.stat.size > room as u64 {
                        return Err(error::refused(
                            RefusalKind::TooLarge,
                            "read",
                            path,
                            format!(
                                "{} bytes would take this readFiles past its {} (read it on \
                                 its own)",
                                file.stat.size,
                                crate::model::MAX_ONE_SHOT_BYTES
                            ),
                        ));
                    }
                    let (data, stat) = read::read_opened(file, path, 0, 0)?;
                    room = room.saturating_sub(data.len());
                    Ok((data, stat))
                })
                .collect())
        })
        .await
    }

    /// Begins an upload of `path` (`expected`: the announced size).
    pub async fn upload(
        &self,
        path: Vec<u8>,
        options: WriteOptions,
        expected: Option<u64>,
    ) -> Result<Upload, Refusal> {
        let pending = self
            .write("upload", move |fd| {
                write::PendingFile::begin("upload", fd, &path, &options).map(|p| (p, path))
            })
            .await?;
        Ok(Upload::start(
            pending.0,
            pending.1,
            expected,
            self.work.clone(),
        ))
    }

    /// Opens file `path` and streams bytes `offset..offset+length` (0: to
    /// the end) into the returned channel, in chunks of 256 KiB, reading
    /// ahead at most a few chunks.
    pub async fn download(
        &self,
        path: Vec<u8>,
        offset: u64,
        length: u64,
    ) -> Result<Download, Refusal> {
        let (file, path) = self
            .read(move |fd| read::open_for_reading("download", fd, &path).map(|f| (f, path)))
            .await?;
        let end = match length {
            0 => file.stat.size,
            length => file.stat.size.min(offset.saturating_add(length)),
        };
        let size = end.saturating_sub(offset);
        let stat = file.stat.clone();
        // One chunk read ahead: read while the one before is on its way.
        let (sender, chunks) = mpsc::channel(1);
        let work = self.work.clone();
        let file = Arc::new(file.fd);
        tokio::spawn(async move {
            let mut at = offset;
            while at < end {
                let want = ((end - at) as usize).min(DOWNLOAD_CHUNK_BYTES);
                let (file, path) = (Arc::clone(&file), path.clone());
                // Allocated here, not on the blocking thread: freed memory
                // of a thread's own arena is kept at its top by glibc,
                // where malloc_trim does not reach (a burst of downloads
                // left tens of MiB behind).
                let mut chunk = vec![0; want];
                let sent = work
                    .run(move || match read::read_at(&file, &mut chunk, at) {
                        Ok(0) => Err(error::refused(
                            RefusalKind::Internal,
                            "download",
                            &path,
                            "the file shrank while it was read",
                        )),
                        Ok(n) => {
                            chunk.truncate(n);
                            Ok(chunk)
                        }
                        Err(errno) => Err(error::failed("download", &path, errno)),
                    })
                    .await;
                if let Ok(chunk) = &sent {
                    at += chunk.len() as u64;
                }
                let failed = sent.is_err();
                // Waiting for the client holds no thread.
                if sender.send(sent).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Download { stat, size, chunks })
    }

    pub async fn mkdir(&self, path: Vec<u8>, recursive: bool, mode: u32) -> Result<(), Refusal> {
        self.write("mkdir", move |fd| tree::mkdir(fd, &path, recursive, mode))
            .await
    }

    pub async fn remove(
        &self,
        path: Vec<u8>,
        recursive: bool,
        missing_ok: bool,
    ) -> Result<u64, Refusal> {
        self.write("remove", move |fd| {
            tree::remove(fd, &path, recursive, missing_ok)
        })
        .await
    }

    pub async fn rename(
        &self,
        from: Vec<u8>,
        to: Vec<u8>,
        no_replace: bool,
    ) -> Result<(), Refusal> {
        self.write("rename", move |fd| tree::rename(fd, &from, &to, no_replace))
            .await
    }

    pub async fn copy(
        &self,
        from: Vec<u8>,
        to: Vec<u8>,
        options: CopyOptions,
    ) -> Result<u64, Refusal> {
        self.write("copy", move |fd| tree::copy(fd, &from, &to, options))
            .await
    }

    pub async fn symlink(&self, target: Vec<u8>, path: Vec<u8>) -> Result<(), Refusal> {
        self.write("symlink", move |fd| tree::symlink(fd, &target, &path))
            .await
    }

    pub async fn readlink(&self, path: Vec<u8>) -> Result<Vec<u8>, Refusal> {
        self.read(move |fd| tree::readlink(fd, &path)).await
    }

    pub async fn set_permissions(&self, path: Vec<u8>, mode: u32) -> Result<(), Refusal> {
        self.write("setPermissions", move |fd| {
            tree::set_permissions(fd, &path, mode)
        })
        .await
    }

    pub async fn set_times(
        &self,
        path: Vec<u8>,
        accessed_ns: i64,
        modified_ns: i64,
    ) -> Result<(), Refusal> {
        self.write("setTimes", move |fd| {
            tree::set_times(fd, &path, accessed_ns, modified_ns)
        })
        .await
    }

    pub async fn canonicalize(&self, path: Vec<u8>) -> Result<Vec<u8>, Refusal> {
        self.read(move |fd| tree::canonicalize(fd, &path)).await
    }

    pub async fn watch(&self, path: Vec<u8>, recursive: bool) -> Result<Watcher, Refusal> {
        self.read(move |fd| Watcher::start(fd, &path, recursive))
            .await
    }
}

fn host_failure(path: &Path, errno: Errno) -> Refusal {
    let refusal = error::failed("open directory", b"", errno);
    Refusal::new(
        refusal.kind,
        refusal.message.replacen("\".\"", &shown_host(path), 1),
    )
}

/// A download in progress: the file as opened, how many bytes will come,
/// and the chunks as they are read.
pub struct Download {
    pub stat: FileStat,
    pub size: u64,
    pub chunks: mpsc::Receiver<Result<Vec<u8>, Refusal>>,
}

enum UploadStep {
    Data(Bytes),
    Commit,
}

/// An upload in progress: chunks go to a writer task, one at most
/// waiting, which writes each on the blocking pool (and holds no thread
/// while it waits for the next); [`Upload::commit`] makes the file
/// visible, and dropping it uncommitted leaves the target as it was.
pub struct Upload {
    steps: Option<mpsc::Sender<UploadStep>>,
    writer: Option<tokio::task::JoinHandle<Result<Option<FileStat>, Refusal>>>,
    failure: Option<Refusal>,
    path: Vec<u8>,
}

impl Upload {
    fn start(
        pending: write::PendingFile,
        path: Vec<u8>,
        expected: Option<u64>,
        work: Work,
    ) -> Upload {
        // One chunk queued while the one before is written.
        let (steps, mut received) = mpsc::channel::<UploadStep>(1);
        let shown_path = path.clone();
        let writer = tokio::spawn(async move {
            let mut pending = pending;
            while let Some(step) = received.recv().await {
                match step {
                    UploadStep::Data(data) => {
                        if let Some(expected) = expected
                            && pending.written() + data.len() as u64 > expected
                        {
                            return Err(error::refused(
                                RefusalKind::InvalidArgument,
                                "upload",
                                &shown_path,
                                format!(
                                    "more than the {expected} bytes announced; the file was left \
                                     as it was"
                                ),
                            ));
                        }
                        let (back, written) = work
                            .run(move || {
                                let written = pending.write_all(&data);
                                Ok((pending, written))
                            })
                            .await?;
                        pending = back;
                        written?;
                    }
                    UploadStep::Commit => {
                        return work.run(move || pending.commit(expected).map(Some)).await;
                    }
                }
            }
            // Released without a commit: `pending` drops, nothing stays.
            Ok(None)
        });
        Upload {
            steps: Some(steps),
            writer: Some(writer),
            failure: None,
            path,
        }
    }

    fn finished(&self) -> Refusal {
        self.failure.clone().unwrap_or_else(|| {
            error::refused(
                RefusalKind::InvalidArgument,
                "upload",
                &self.path,
                "the upload is over (done, or failed)",
            )
        })
    }

    /// The writer's outcome once it has stopped.
    async fn outcome(&mut self) -> Result<Option<FileStat>, Refusal> {
        self.steps = None;
        let Some(writer) = self.writer.take() else {
            return Err(self.finished());
        };
        let outcome = writer.await.unwrap_or_else(|error| {
            Err(Refusal::new(
                RefusalKind::Internal,
                format!("the upload's writer failed: {error}"),
            ))
        });
        if let Err(refusal) = &outcome {
            self.failure = Some(refusal.clone());
        }
        outcome
    }

    /// Queues `data` (waiting while the writer is a few chunks behind).
    pub async fn write(&mut self, data: Bytes) -> Result<(), Refusal> {
        if data.len() > MAX_UPLOAD_CHUNK_BYTES {
            let refusal = error::refused(
                RefusalKind::LimitReached,
                "upload",
                &self.path,
                format!(
                    "a write of {} bytes; at most {MAX_UPLOAD_CHUNK_BYTES} each",
                    data.len()
                ),
            );
            self.failure = Some(refusal.clone());
            self.steps = None;
            return Err(refusal);
        }
        let Some(steps) = &self.steps else {
            return Err(self.finished());
        };
        if steps.send(UploadStep::Data(data)).await.is_ok() {
            return Ok(());
        }
        match self.outcome().await {
            Err(refusal) => Err(refusal),
            Ok(_) => Err(self.finished()),
        }
    }

    /// Commits: the target becomes the uploaded content.
    pub async fn commit(&mut self) -> Result<FileStat, Refusal> {
        let Some(steps) = self.steps.take() else {
            return Err(self.finished());
        };
        let _ = steps.send(UploadStep::Commit).await;
        drop(steps);
        match self.outcome().await? {
            Some(stat) => {
                self.failure = None;
                Ok(stat)
            }
            None => Err(self.finished()),
        }
    }
}

/// Refuses a batch (`writeFiles`, `readFiles`) of more than
/// [`crate::model::MAX_BATCH_FILES`] files or, to write, more than
/// [`crate::model::MAX_ONE_SHOT_BYTES`] bytes, before anything is done.
/// The RPC layer calls it too, before it copies a batch out of its message.
pub fn check_batch(op: &str, files: usize, bytes: usize) -> Result<(), Refusal> {
    let undone = if op == "readFiles" { "read" } else { "written" };
    if files <= crate::model::MAX_BATCH_FILES && bytes <= crate::model::MAX_ONE_SHOT_BYTES {
        return Ok(());
    }
    Err(Refusal::new(
        RefusalKind::LimitReached,
        format!(
            "{op} of {files} files and {bytes} bytes; one call carries at most {} files and {} \
             bytes (nothing was {undone})",
            crate::model::MAX_BATCH_FILES,
            crate::model::MAX_ONE_SHOT_BYTES
        ),
    ))
}
