//! `capexec cp`: files between this machine and an executor's, like scp.
//! Remote paths are written `:PATH` (relative ones from the server's
//! working directory); `-` is stdin or stdout. Many files travel at once
//! (up to [`IN_FLIGHT`] calls pipelined on one connection), small ones
//! in batches of many per call (`writeFiles`), large ones streamed; a failed file is one line on
//! stderr and the copy goes on (exit 1).

use std::cell::Cell;
use std::ffi::OsStr;
use std::future::Future;
use std::io::IsTerminal;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use capexec::client::{self, Directory, Error};
use capexec::model::{FileKind, MAX_ONE_SHOT_BYTES, RefusalKind, WalkOptions, WriteOptions};

use crate::cli::{CpArgs, EXIT_CAPEXEC_FAILURE, stdio, target};

/// Calls in flight at once (a file, or a batch of small ones): enough to
/// hide round trips, well within a connection's 64 transfers.
const IN_FLIGHT: usize = 32;

/// Files up to this size are uploaded in batches ...
const BATCHED_FILE_BYTES: usize = 64 * 1024;

/// ... of at most this many files ...
const BATCH_FILES: usize = 256;

/// ... and bytes (a quarter of what one call may carry, so that a file
/// grown since the scan still fits, and several batches are in flight
/// within a connection's call memory).
const BATCH_BYTES: usize = MAX_ONE_SHOT_BYTES / 4;

/// Batches in flight at once (at most 8 MiB of calls).
const BATCHES_IN_FLIGHT: usize = 8;

/// Exit status when some files failed (each said on its own line).
const EXIT_SOME_FAILED: i32 = 1;

enum Place {
    Local(PathBuf),
    Remote(PathBuf),
    Std,
}

fn place(arg: &OsStr) -> Place {
    let bytes = arg.as_bytes();
    if bytes == b"-" {
        Place::Std
    } else if let Some(remote) = bytes.strip_prefix(b":") {
        let path = if remote.is_empty() { b"." } else { remote };
        Place::Remote(PathBuf::from(OsStr::from_bytes(path)))
    } else {
        Place::Local(PathBuf::from(arg))
    }
}

/// `path`'s parent (".": a bare name) and last component.
/// How the run went: failures are counted as they are said, and every
/// file or link the copy set out to copy is counted when it is listed and
/// when it is copied, so that one lost on the way cannot go unsaid.
struct Run {
    failed: Cell<usize>,
    /// The exit status of a copy to our stdout that could not be written
    /// (see `stdio::unwritten`).
    stdout_failed: Cell<Option<i32>>,
    listed: Cell<u64>,
    copied: Cell<u64>,
    progress: ProgressBar,
}

impl Run {
    /// `count` more files or links to copy.
    fn list(&self, count: usize) {
        self.listed.set(self.listed.get() + count as u64);
    }

    /// One of them copied.
    fn copied(&self) {
        self.copied.set(self.copied.get() + 1);
        self.progress.inc(1);
    }

    /// Says, without failing, that the symlink `shown` (`relative` in the
    /// copied tree) leads out of the tree: it is copied as a link, and
    /// where it leads may not be where the copy is.
    fn say_if_outside(&self, shown: &Path, relative: &Path, target: &[u8]) {
        if leads_out(relative, target) {
            self.progress.suspend(|| {
                stdio::note(&format!(
                    "cp {}: a symlink to {} outside the copied tree; copied as a link",
                    shown.display(),
                    OsStr::from_bytes(target).to_string_lossy()
                ));
            });
        }
    }

    /// Listed files that were neither copied nor said to have failed.
    fn unaccounted(&self) -> u64 {
        self.listed
            .get()
            .saturating_sub(self.copied.get() + self.failed.get() as u64)
    }

    fn fail(&self, what: &Path, error: impl std::fmt::Display) {
        self.failed.set(self.failed.get() + 1);
        self.progress.suspend(|| {
            stdio::note(&format!("cp {}: {error}", what.display()));
        });
    }
}

/// A progress bar on stderr, shown only when stderr is a terminal and the
/// copy is still running after a second.
fn progress() -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template("{spinner} {pos} files copied ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    if std::io::stderr().is_terminal() {
        let shown = bar.clone();
        tokio::task::spawn_local(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            shown.set_draw_target(ProgressDrawTarget::stderr());
            shown.enable_steady_tick(Duration::from_millis(200));
        });
    }
    bar
}

pub fn main(args: CpArgs) -> i32 {
    crate::cli::run_local(async move {
        let Some((dest, sources)) = args.paths.split_last() else {
            return usage("cp needs a source and a destination (capexec cp [-r] [-p] SRC... DST)");
        };
        if sources.is_empty() {
            return usage("cp needs a source and a destination (capexec cp [-r] [-p] SRC... DST)");
        }
        let dest = place(dest);
        let sources: Vec<Place> = sources.iter().map(|arg| place(arg)).collect();
        let upload = match (&dest, sources.as_slice()) {
            (Place::Remote(_), sources)
                if sources
                    .iter()
                    .all(|s| matches!(s, Place::Local(_) | Place::Std)) =>
            {
                true
            }
            (Place::Local(_) | Place::Std, sources)
                if sources.iter().all(|s| matches!(s, Place::Remote(_))) =>
            {
                false
            }
            _ => {
                if let Some(hint) = crate::cli::habits::scp_paths(&args.paths) {
                    return usage(&hint);
                }
                return usage(
                    "cp copies between this machine and the executor's: the sources on one \
                     side, the destination on the other, remote paths written :PATH",
                );
            }
        };
        let streams = sources.iter().any(|s| matches!(s, Place::Std)) || matches!(dest, Place::Std);
        if streams && sources.len() > 1 {
            return usage("cp with - (stdin or stdout) copies exactly one file");
        }
        let target = match target::established_target(&args.connect).await {
            Ok(target) => target,
            Err(message) => return fail(&message),
        };
        let executor = match &args.environment {
            Some(path) => client::environment(&target.executor, path),
            None => target.executor.clone(),
        };
        let run = Rc::new(Run {
            failed: Cell::new(0),
            stdout_failed: Cell::new(None),
            listed: Cell::new(0),
            copied: Cell::new(0),
            progress: progress(),
        });
        let options = Options {
            recursive: args.recursive,
            preserve: args.preserve,
        };
        if upload {
            let Place::Remote(dest) = dest else {
                unreachable!("an upload's destination is remote")
            };
            upload_all(&executor, &sources, &dest, options, &run).await;
        } else {
            download_all(&executor, &sources, &dest, options, &run).await;
        }
        run.progress.finish_and_clear();
        if let Some(code) = run.stdout_failed.get() {
            return code;
        }
        let lost = run.unaccounted();
        if lost > 0 {
            stdio::note(&format!(
                "cp: {lost} of the {} files listed were not copied",
                run.listed.get()
            ));
            return EXIT_SOME_FAILED;
        }
        if run.failed.get() > 0 {
            EXIT_SOME_FAILED
        } else {
            0
        }
    })
}

fn usage(message: &str) -> i32 {
    stdio::note(message);
    EXIT_CAPEXEC_FAILURE
}

fn fail(message: &str) -> i32 {
    stdio::note(message);
    EXIT_CAPEXEC_FAILURE
}

#[derive(Clone, Copy)]
struct Options {
    recursive: bool,
    preserve: bool,
}

/// Whether `path` names an existing directory of `dir`.
async fn remote_is_dir(dir: &Directory, path: &Path) -> Result<bool, Error> {
    match dir.metadata(path).await {
        Ok(stat) => Ok(stat.is_dir()),
        Err(error)
            if matches!(
                error.refusal_kind(),
                Some(RefusalKind::NotFound | RefusalKind::NotADirectory)
            ) =>
        {
            Ok(false)
        }
        Err(error) => Err(error),
    }
}

/// The directory and name each source is copied to: into `dest` when it
/// is a directory (or there are several sources), else as `dest` itself.
async fn upload_all(
    executor: &capexec::capexec_capnp::executor::Client,
    sources: &[Place],
    dest: &Path,
    options: Options,
    run: &Rc<Run>,
) {
    let dest_dir = Directory::open(executor, dest);
    let into = match remote_is_dir(&dest_dir, Path::new("")).await {
        Ok(into) => into,
        Err(error) => return run.fail(dest, error),
    };
    if sources.len() > 1 && !into {
        return run.fail(dest, "not a directory (several sources need one)");
    }
    let (dir, single_name) = if into {
        (dest_dir, None)
    } else {
        let (parent, name) = capexec::client::parent_and_name(dest);
        (Directory::open(executor, parent), Some(name))
    };
    for source in sources {
        match source {
            Place::Std => {
                let name = single_name
                    .clone()
                    .unwrap_or_else(|| PathBuf::from("stdin"));
                let written = dir
                    .upload(&name, tokio::io::stdin(), &WriteOptions::default(), None)
                    .await;
                if let Err(error) = written {
                    run.fail(dest, error);
                }
            }
            Place::Local(path) => {
                let name = match &single_name {
                    Some(name) => name.clone(),
                    None => capexec::client::parent_and_name(path).1,
                };
                upload_tree(&dir, path, &name, options, run).await;
            }
            Place::Remote(_) => unreachable!("checked: uploads come from here"),
        }
    }
}

/// What a local tree holds, in the order it is to be made.
struct Scan {
    dirs: Vec<(PathBuf, PathBuf, std::fs::Metadata)>,
    files: Vec<(PathBuf, PathBuf, std::fs::Metadata)>,
    links: Vec<(PathBuf, PathBuf)>,
    /// FIFOs and character devices named as sources: read to their end.
    streams: Vec<Found>,
}

/// What `local` holds, put in `scan`. A source named on the command line
/// (`top`) is followed if it is a symlink, as `cp` and `scp` do, and read
/// as a stream if it is a FIFO or a character device (`<(command)`, as
/// `-`); symlinks beneath it are copied as links.
fn scan(local: &Path, remote: &Path, options: Options, scan: &mut Scan, run: &Run) {
    scan_at(local, remote, options, scan, run, true)
}

fn scan_at(local: &Path, remote: &Path, options: Options, scan: &mut Scan, run: &Run, top: bool) {
    let metadata = if top {
        std::fs::metadata(local)
    } else {
        std::fs::symlink_metadata(local)
    };
    let metadata = match metadata {
        Ok(metadata) => metadata,
        Err(error) => return run.fail(local, capexec::model::io_message(&error).to_lowercase()),
    };
    let kind = metadata.file_type();
    if top && (kind.is_fifo() || kind.is_char_device()) {
        scan.streams
            .push((local.to_path_buf(), remote.to_path_buf(), metadata));
    } else if kind.is_symlink() {
        scan.links.push((local.to_path_buf(), remote.to_path_buf()));
    } else if kind.is_dir() {
        if !options.recursive {
            return run.fail(local, "is a directory (use -r)");
        }
        let entries = match std::fs::read_dir(local) {
            Ok(entries) => entries,
            Err(error) => {
                return run.fail(local, capexec::model::io_message(&error).to_lowercase());
            }
        };
        scan.dirs
            .push((local.to_path_buf(), remote.to_path_buf(), metadata));
        for entry in entries {
            match entry {
                Ok(entry) => scan_entry(&entry, local, remote, options, scan, run),
                Err(error) => run.fail(local, capexec::model::io_message(&error).to_lowercase()),
            }
        }
    } else if kind.is_file() {
        scan.files
            .push((local.to_path_buf(), remote.to_path_buf(), metadata));
    } else {
        run.fail(local, "not a regular file, directory or symlink; skipped");
    }
}

fn scan_entry(
    entry: &std::fs::DirEntry,
    local: &Path,
    remote: &Path,
    options: Options,
    found: &mut Scan,
    run: &Run,
) {
    let name = entry.file_name();
    scan_at(
        &local.join(&name),
        &remote.join(&name),
        options,
        found,
        run,
        false,
    );
}

fn mtime_ns(metadata: &std::fs::Metadata) -> i64 {
    metadata
        .mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(metadata.mtime_nsec())
}

async fn upload_tree(dir: &Directory, local: &Path, remote: &Path, options: Options, run: &Run) {
    let mut found = Scan {
        dirs: Vec::new(),
        files: Vec::new(),
        links: Vec::new(),
        streams: Vec::new(),
    };
    scan(local, remote, options, &mut found, run);
    run.list(found.files.len() + found.links.len() + found.streams.len());
    for (link, _) in &found.links {
        if let (Ok(relative), Ok(target)) = (link.strip_prefix(local), std::fs::read_link(link)) {
            run.say_if_outside(link, relative, target.as_os_str().as_bytes());
        }
    }
    for (local, remote, metadata) in &found.streams {
        upload_stream(dir, local, remote, metadata, options, run).await;
    }
    // Directories first (each with its parents, so their order does not
    // matter), then everything in them, many at once.
    let mut made = FuturesUnordered::new();
    for (local, remote, _) in &found.dirs {
        made.push(async move { (local, dir.create_dir_all(remote).await) });
    }
    while let Some((local, outcome)) = made.next().await {
        if let Err(error) = outcome {
            run.fail(local, error);
        }
    }
    // Small files travel in batches (one call, and one trip to the disk
    // on each side, per batch), the others one by one.
    let (small, large): (Vec<_>, Vec<_>) = found
        .files
        .iter()
        .partition(|(_, _, metadata)| metadata.len() <= BATCHED_FILE_BYTES as u64);
    let mut batches = batches_of(small).into_iter();
    let mut files = large.into_iter();
    let mut links = found.links.iter();
    // Each yields whether it was a batch.
    let mut pending = FuturesUnordered::<Pin<Box<dyn Future<Output = bool> + '_>>>::new();
    let mut batches_pending = 0;
    loop {
        while pending.len() < IN_FLIGHT {
            if batches_pending < BATCHES_IN_FLIGHT
                && let Some(batch) = batches.next()
            {
                batches_pending += 1;
                pending.push(Box::pin(async move {
                    upload_batch(dir, batch, options, run).await;
                    true
                }));
            } else if let Some((local, remote, metadata)) = files.next() {
                pending.push(Box::pin(async move {
                    upload_file(dir, local, remote, metadata, options, run).await;
                    false
                }));
            } else if let Some((local, remote)) = links.next() {
                pending.push(Box::pin(async move {
                    upload_link(dir, local, remote, run).await;
                    false
                }));
            } else {
                break;
            }
        }
        match pending.next().await {
            None => break,
            Some(true) => batches_pending -= 1,
            Some(false) => {}
        }
    }
    if options.preserve {
        // Deepest first: setting a directory's time before its parent's.
        for (local, remote, metadata) in found.dirs.iter().rev() {
            let set = async {
                dir.set_permissions(remote, metadata.permissions().mode() & 0o7777)
                    .await?;
                let atime = metadata
                    .atime()
                    .saturating_mul(1_000_000_000)
                    .saturating_add(metadata.atime_nsec());
                dir.set_times(remote, atime, mtime_ns(metadata)).await
            };
            if let Err(error) = set.await {
                run.fail(local, error);
            }
        }
    }
}

type Found = (PathBuf, PathBuf, std::fs::Metadata);

/// `files` in batches of at most [`BATCH_FILES`] files and
/// [`BATCH_BYTES`] bytes (as their sizes were when scanned).
fn batches_of(files: Vec<&Found>) -> Vec<Vec<&Found>> {
    let mut batches: Vec<Vec<&Found>> = Vec::new();
    let mut bytes = 0;
    for file in files {
        let size = file.2.len() as usize;
        match batches.last_mut() {
            Some(batch) if batch.len() < BATCH_FILES && bytes + size <= BATCH_BYTES => {
                batch.push(file);
                bytes += size;
            }
            _ => {
                batches.push(vec![file]);
                bytes = size;
            }
        }
    }
    batches
}

/// What the server is asked to make of local file `local`: with `-p` its
/// mode and time; without, an existing file keeps its mode and a new one
/// gets the source's less the server's umask, as `cp` and `scp` do.
fn write_options(metadata: &std::fs::Metadata, options: Options) -> WriteOptions {
    let mode = metadata.permissions().mode();
    if options.preserve {
        WriteOptions {
            permissions: Some(mode & 0o7777),
            modified_ns: Some(mtime_ns(metadata)),
            ..WriteOptions::default()
        }
    } else {
        WriteOptions {
            new_file_permissions: Some(mode & 0o777),
            ..WriteOptions::default()
        }
    }
}

/// Uploads a batch of small files in one `writeFiles`, read here in one
/// trip to the blocking pool. A file that grew past what a batch carries
/// since it was scanned goes on its own.
async fn upload_batch(dir: &Directory, batch: Vec<&Found>, options: Options, run: &Run) {
    let paths: Vec<PathBuf> = batch.iter().map(|(local, _, _)| local.clone()).collect();
    let contents =
        tokio::task::spawn_blocking(move || paths.iter().map(std::fs::read).collect::<Vec<_>>())
            .await
            .unwrap_or_else(|error| {
                batch
                    .iter()
                    .map(|_| Err(std::io::Error::other(error.to_string())))
                    .collect()
            });
    let mut writes = Vec::with_capacity(batch.len());
    let mut sent = Vec::with_capacity(batch.len());
    let mut bytes = 0;
    for (found, content) in batch.iter().zip(contents) {
        let (local, remote, metadata) = found;
        match content {
            Err(error) => run.fail(local, local_error(error)),
            Ok(data) if bytes + data.len() > BATCH_BYTES || data.len() > BATCHED_FILE_BYTES => {
                upload_file(dir, local, remote, metadata, options, run).await;
            }
            Ok(data) => {
                bytes += data.len();
                writes.push((remote, data, write_options(metadata, options)));
                sent.push(local);
            }
        }
    }
    if writes.is_empty() {
        return;
    }
    match dir.write_batch(&writes).await {
        Ok(outcomes) => {
            for (local, outcome) in sent.iter().zip(outcomes) {
                match outcome {
                    Ok(_) => run.copied(),
                    Err(error) => run.fail(local, error),
                }
            }
        }
        Err(error) => {
            for local in sent {
                run.fail(local, &error);
            }
        }
    }
}

async fn upload_file(
    dir: &Directory,
    local: &Path,
    remote: &Path,
    metadata: &std::fs::Metadata,
    options: Options,
    run: &Run,
) {
    let write = write_options(metadata, options);
    let outcome = async {
        if metadata.len() <= MAX_ONE_SHOT_BYTES as u64 / 2 {
            let data = tokio::fs::read(local).await.map_err(local_error)?;
            dir.write_with(remote, &data, &write).await?;
        } else {
            let file = tokio::fs::File::open(local).await.map_err(local_error)?;
            let size = file.metadata().await.map_err(local_error)?.len();
            dir.upload(remote, file, &write, Some(size)).await?;
        }
        Ok::<_, Error>(())
    };
    match outcome.await {
        Ok(()) => {
            run.copied();
        }
        Err(error) => run.fail(local, error),
    }
}

/// Uploads what a FIFO or character device gives until its end, as `-`
/// is uploaded.
async fn upload_stream(
    dir: &Directory,
    local: &Path,
    remote: &Path,
    metadata: &std::fs::Metadata,
    options: Options,
    run: &Run,
) {
    let mut write = write_options(metadata, options);
    // The stream's own mode says nothing of the file it becomes.
    write.permissions = None;
    write.new_file_permissions = None;
    let outcome = async {
        let file = tokio::fs::File::open(local).await.map_err(local_error)?;
        dir.upload(remote, file, &write, None).await
    };
    match outcome.await {
        Ok(_) => run.copied(),
        Err(error) => run.fail(local, error),
    }
}

async fn upload_link(dir: &Directory, local: &Path, remote: &Path, run: &Run) {
    let outcome = async {
        let target = std::fs::read_link(local).map_err(local_error)?;
        match dir.symlink(&target, remote).await {
            Err(error) if error.refusal_kind() == Some(RefusalKind::Exists) => {
                // Only a link or a regular file is replaced, and in one
                // rename: nothing else is ever removed.
                let existing = dir.symlink_metadata(remote).await?;
                if !matches!(existing.kind, FileKind::Symlink | FileKind::File) {
                    return Err(not_replaced_by_a_link(existing.kind));
                }
                let (parent, name) = capexec::client::parent_and_name(remote);
                let temporary = parent.join(temporary_name(&name));
                dir.symlink(&target, &temporary).await?;
                let renamed = dir.rename(&temporary, remote, false).await;
                if renamed.is_err() {
                    let _ = dir.remove_file(&temporary).await;
                }
                renamed
            }
            other => other,
        }
    };
    match outcome.await {
        Ok(()) => run.copied(),
        Err(error) => run.fail(local, error),
    }
}

/// A name beside `name` for a link that is renamed over it.
fn temporary_name(name: &Path) -> PathBuf {
    PathBuf::from(format!(
        ".{}.capexec-link-{}",
        name.display(),
        std::process::id()
    ))
}

fn kind_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::File => "regular file",
        FileKind::Directory => "directory",
        FileKind::Symlink => "symlink",
        FileKind::Fifo => "FIFO",
        FileKind::Socket => "socket",
        FileKind::CharDevice => "character device",
        FileKind::BlockDevice => "block device",
        _ => "special file",
    }
}

fn not_replaced_by_a_link(kind: FileKind) -> Error {
    Error::Refused(capexec::model::Refusal::new(
        RefusalKind::Exists,
        format!("is a {}; not replaced by a symlink", kind_name(kind)),
    ))
}

fn local_error(error: std::io::Error) -> Error {
    Error::Refused(capexec::model::Refusal::new(
        RefusalKind::Internal,
        capexec::model::io_message(&error).to_lowercase(),
    ))
}

async fn download_all(
    executor: &capexec::capexec_capnp::executor::Client,
    sources: &[Place],
    dest: &Place,
    options: Options,
    run: &Rc<Run>,
) {
    let dest = match dest {
        Place::Std => {
            let Some(Place::Remote(source)) = sources.first() else {
                unreachable!("checked: one remote source")
            };
            let followed = match capexec::client::follow_links(executor, source).await {
                Ok(followed) => followed,
                Err(error) => return run.fail(source, error),
            };
            let (parent, name) = capexec::client::parent_and_name(&followed);
            let dir = Directory::open(executor, parent);
            let mut stdout = stdio::StreamedAnswer::new();
            if let Err(error) = dir.download(&name, &mut stdout).await {
                // Our stdout failing is no failed file: the rule of every
                // subcommand's stdout decides.
                match stdout.failed() {
                    Some(failed) => run.stdout_failed.set(Some(stdio::unwritten(
                        failed,
                        &format!(":{} to stdout", source.display()),
                    ))),
                    None => run.fail(source, error),
                }
            }
            return;
        }
        Place::Local(dest) => dest,
        Place::Remote(_) => unreachable!("checked: downloads go here"),
    };
    let into = std::fs::metadata(dest).is_ok_and(|m| m.is_dir());
    if sources.len() > 1 && !into {
        return run.fail(dest, "not a directory (several sources need one)");
    }
    for source in sources {
        let Place::Remote(source) = source else {
            unreachable!("checked: downloads come from there")
        };
        let local = if into {
            dest.join(capexec::client::parent_and_name(source).1)
        } else {
            dest.clone()
        };
        // A source named here is followed if it is a symlink; the copy
        // keeps the name it was given.
        let followed = match capexec::client::follow_links(executor, source).await {
            Ok(followed) => followed,
            Err(error) => {
                run.fail(&PathBuf::from(format!(":{}", source.display())), error);
                continue;
            }
        };
        let (parent, name) = capexec::client::parent_and_name(&followed);
        let dir = Directory::open(executor, &parent);
        let remote = Remote { dir, base: parent };
        download_tree(&remote, &name, &local, options, run).await;
    }
}

/// Whether a symlink at `relative` (in a copied tree) to `target` leads
/// out of the tree: an absolute target, or one whose `..` climb past the
/// tree's top.
fn leads_out(relative: &Path, target: &[u8]) -> bool {
    let target = Path::new(OsStr::from_bytes(target));
    if target.is_absolute() {
        return true;
    }
    let mut depth = relative
        .parent()
        .map_or(0, |parent| parent.components().count() as isize);
    for component in target.components() {
        match component {
            std::path::Component::ParentDir => depth -= 1,
            std::path::Component::Normal(_) => depth += 1,
            _ => {}
        }
        if depth < 0 {
            return true;
        }
    }
    false
}

/// A remote directory and where it is, for messages.
struct Remote {
    dir: Directory,
    base: PathBuf,
}

impl Remote {
    /// `path` of the directory as the user writes it (`:PATH`).
    fn shown(&self, path: &Path) -> PathBuf {
        let full = if self.base == Path::new(".") {
            path.to_path_buf()
        } else {
            self.base.join(path)
        };
        PathBuf::from(format!(":{}", full.display()))
    }
}

async fn download_tree(
    remote_dir: &Remote,
    remote: &Path,
    local: &Path,
    options: Options,
    run: &Run,
) {
    let dir = &remote_dir.dir;
    let shown = |path: &Path| remote_dir.shown(path);
    let stat = match dir.symlink_metadata(remote).await {
        Ok(stat) => stat,
        Err(error) => return run.fail(&shown(remote), error),
    };
    if stat.kind != FileKind::Directory {
        let entry = capexec::model::DirEntry {
            path: Vec::new(),
            stat: Some(stat),
            link_target: Vec::new(),
            error: None,
        };
        let target = if entry
            .stat
            .as_ref()
            .is_some_and(|s| s.kind == FileKind::Symlink)
        {
            match dir.read_link(remote).await {
                Ok(target) => target,
                Err(error) => return run.fail(&shown(remote), error),
            }
        } else {
            Vec::new()
        };
        let entry = capexec::model::DirEntry {
            link_target: target,
            ..entry
        };
        run.list(1);
        return download_entry(dir, remote, &shown(remote), local, &entry, options, run).await;
    }
    if !options.recursive {
        return run.fail(&shown(remote), "is a directory (use -r)");
    }
    if let Err(error) = std::fs::create_dir_all(local) {
        return run.fail(local, capexec::model::io_message(&error).to_lowercase());
    }
    let mut walk = dir.walk(remote, &WalkOptions::default()).await;
    let mut pending = FuturesUnordered::<Pin<Box<dyn Future<Output = ()> + '_>>>::new();
    let mut dirs = vec![(local.to_path_buf(), stat)];
    let mut walking = true;
    // Small files are read in batches, the others one by one.
    let mut batch = Vec::new();
    let mut batch_bytes = 0;
    // Until the walk is over, every fetch it led to is done, and the last
    // batch (however small) has gone too.
    while walking || !pending.is_empty() || !batch.is_empty() {
        if !batch.is_empty()
            && (!walking || batch.len() >= BATCH_FILES || batch_bytes >= BATCH_BYTES)
        {
            batch_bytes = 0;
            pending.push(Box::pin(download_batch(
                dir,
                std::mem::take(&mut batch),
                options,
                run,
            )));
        }
        if !walking && pending.is_empty() {
            break;
        }
        tokio::select! {
            entry = walk.next(), if walking && pending.len() < IN_FLIGHT => match entry {
                None => walking = false,
                Some(Err(error)) => { run.fail(&shown(remote), error); walking = false; }
                Some(Ok(entry)) => {
                    let relative = PathBuf::from(OsStr::from_bytes(&entry.path));
                    let here = local.join(&relative);
                    let there = remote.join(&relative);
                    if let Some(error) = &entry.error {
                        run.fail(&shown(&there), error);
                    }
                    match entry.stat.as_ref().map(|s| s.kind) {
                        Some(FileKind::Directory) => {
                            // Walks are depth first: parents come first.
                            if let Err(error) = std::fs::create_dir_all(&here) {
                                run.fail(&here, capexec::model::io_message(&error).to_lowercase());
                            } else if let Some(stat) = entry.stat.clone() {
                                dirs.push((here, stat));
                            }
                        }
                        Some(FileKind::File)
                            if entry
                                .stat
                                .as_ref()
                                .is_some_and(|s| s.size <= BATCHED_FILE_BYTES as u64) =>
                        {
                            batch_bytes += entry.stat.as_ref().map_or(0, |s| s.size as usize);
                            run.list(1);
                            let named = shown(&there);
                            batch.push(Fetch { there, here, named, entry });
                        }
                        Some(kind) => {
                            run.list(1);
                            if kind == FileKind::Symlink {
                                run.say_if_outside(&shown(&there), &relative, &entry.link_target);
                            }
                            let named = shown(&there);
                            pending.push(Box::pin(async move {
                                download_entry(dir, &there, &named, &here, &entry, options, run)
                                    .await
                            }));
                        }
                        None => {}
                    }
                }
            },
            Some(()) = pending.next(), if !pending.is_empty() => {}
        }
    }
    if options.preserve {
        for (path, stat) in dirs.iter().rev() {
            if let Err(error) = set_local_attributes(path, stat.permissions, stat.modified_ns) {
                run.fail(path, capexec::model::io_message(&error).to_lowercase());
            }
        }
    }
}

/// A remote file to fetch: its path in the directory, where it goes, its
/// name in messages and its entry of the walk.
struct Fetch {
    there: PathBuf,
    here: PathBuf,
    named: PathBuf,
    entry: capexec::model::DirEntry,
}

/// Downloads a batch of small files in one `readFiles`, writing them here
/// in one trip to the blocking pool; a file grown too large for the batch
/// since the walk is fetched on its own.
async fn download_batch(dir: &Directory, batch: Vec<Fetch>, options: Options, run: &Run) {
    let paths: Vec<&PathBuf> = batch.iter().map(|fetch| &fetch.there).collect();
    let outcomes = match dir.read_batch(&paths).await {
        Ok(outcomes) => outcomes,
        Err(error) => {
            for fetch in &batch {
                run.fail(&fetch.named, &error);
            }
            return;
        }
    };
    let mut writes = Vec::with_capacity(batch.len());
    let mut alone = Vec::new();
    for (fetch, outcome) in batch.into_iter().zip(outcomes) {
        match outcome {
            Ok((data, stat)) => writes.push((fetch, data, stat)),
            Err(error) if error.refusal_kind() == Some(RefusalKind::TooLarge) => alone.push(fetch),
            Err(error) => run.fail(&fetch.named, error),
        }
    }
    let names: Vec<PathBuf> = writes
        .iter()
        .map(|(fetch, _, _)| fetch.named.clone())
        .collect();
    let preserve = options.preserve;
    let written = tokio::task::spawn_blocking(move || {
        writes
            .into_iter()
            .map(|(fetch, data, stat)| {
                let outcome = write_local(&fetch.here, &data, &stat, preserve);
                (fetch.named, outcome)
            })
            .collect::<Vec<_>>()
    })
    .await;
    match written {
        Ok(written) => {
            for (named, outcome) in written {
                match outcome {
                    Ok(()) => run.copied(),
                    Err(error) => run.fail(&named, local_error(error)),
                }
            }
        }
        Err(error) => {
            for named in names {
                run.fail(&named, &error);
            }
        }
    }
    for fetch in alone {
        download_entry(
            dir,
            &fetch.there,
            &fetch.named,
            &fetch.here,
            &fetch.entry,
            options,
            run,
        )
        .await;
    }
}

/// A local destination opened for a downloaded file's content, and what
/// it was.
struct Destination {
    file: std::fs::File,
    /// A regular file, made now or truncated: its mode and time may be
    /// set (with `-p`). A FIFO or character device is only written.
    regular: bool,
}

/// Opens `path` for a file with `permissions` as `cp` does: a new file is
/// made with the source's mode less the umask, an existing one (through a
/// symlink too) is truncated and keeps its mode, a FIFO or character
/// device is written as it is (never chmodded, renamed over or removed),
/// and anything else is refused.
fn open_destination(path: &Path, permissions: u32) -> std::io::Result<Destination> {
    use std::io::{Error as IoError, ErrorKind};
    for _ in 0..2 {
        match std::fs::metadata(path) {
            Err(error) if error.kind() == ErrorKind::NotFound => {
                match std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(permissions & 0o777)
                    .open(path)
                {
                    Ok(file) => {
                        return Ok(Destination {
                            file,
                            regular: true,
                        });
                    }
                    // Made meanwhile, or a symlink to nowhere: look again.
                    Err(error) if error.kind() == ErrorKind::AlreadyExists => continue,
                    Err(error) => return Err(error),
                }
            }
            Err(error) => return Err(error),
            Ok(metadata) if metadata.is_file() => {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(path)?;
                return Ok(Destination {
                    file,
                    regular: true,
                });
            }
            Ok(metadata)
                if metadata.file_type().is_fifo() || metadata.file_type().is_char_device() =>
            {
                let file = std::fs::OpenOptions::new().write(true).open(path)?;
                return Ok(Destination {
                    file,
                    regular: false,
                });
            }
            Ok(metadata) if metadata.is_dir() => {
                return Err(IoError::new(ErrorKind::IsADirectory, "is a directory"));
            }
            Ok(metadata) => {
                let kind = if metadata.file_type().is_socket() {
                    "a socket"
                } else {
                    "a block device"
                };
                return Err(IoError::other(format!("is {kind}; not written")));
            }
        }
    }
    Err(IoError::other("a symlink to nowhere (not written through)"))
}

/// After a downloaded file's content is in `destination`: with `-p` its
/// mode (special bits too) and time, on a regular file only.
fn finish_destination(
    path: &Path,
    destination: &Destination,
    stat: &capexec::model::FileStat,
    preserve: bool,
) -> std::io::Result<()> {
    if preserve && destination.regular {
        set_local_attributes(path, stat.permissions, stat.modified_ns)?;
    }
    Ok(())
}

/// Writes a downloaded file here (see [`open_destination`]).
fn write_local(
    path: &Path,
    data: &[u8],
    stat: &capexec::model::FileStat,
    preserve: bool,
) -> std::io::Result<()> {
    use std::io::Write;
    let mut destination = open_destination(path, stat.permissions)?;
    destination.file.write_all(data)?;
    finish_destination(path, &destination, stat, preserve)
}

/// Makes `local` a symlink to `target`: in its place if nothing is there,
/// else only over a symlink or a regular file, and in one rename.
fn place_link(local: &Path, target: &[u8]) -> std::io::Result<()> {
    use std::io::ErrorKind;
    let target = OsStr::from_bytes(target);
    match std::fs::symlink_metadata(local) {
        Err(error) if error.kind() == ErrorKind::NotFound => {
            std::os::unix::fs::symlink(target, local)
        }
        Err(error) => Err(error),
        Ok(metadata) if metadata.file_type().is_symlink() || metadata.is_file() => {
            let (parent, name) = capexec::client::parent_and_name(local);
            let temporary = parent.join(temporary_name(&name));
            let _ = std::fs::remove_file(&temporary);
            std::os::unix::fs::symlink(target, &temporary)?;
            std::fs::rename(&temporary, local).inspect_err(|_| {
                let _ = std::fs::remove_file(&temporary);
            })
        }
        Ok(metadata) => {
            let kind = metadata.file_type();
            let what = if kind.is_dir() {
                "a directory"
            } else if kind.is_fifo() {
                "a FIFO"
            } else if kind.is_socket() {
                "a socket"
            } else if kind.is_char_device() {
                "a character device"
            } else {
                "a block device"
            };
            Err(std::io::Error::other(format!(
                "is {what}; not replaced by a symlink"
            )))
        }
    }
}

async fn download_entry(
    dir: &Directory,
    remote: &Path,
    shown: &Path,
    local: &Path,
    entry: &capexec::model::DirEntry,
    options: Options,
    run: &Run,
) {
    let Some(stat) = &entry.stat else { return };
    let outcome = async {
        match stat.kind {
            FileKind::Symlink => {
                return place_link(local, &entry.link_target).map_err(local_error);
            }
            FileKind::File => {}
            _ => {
                return Err(Error::Refused(capexec::model::Refusal::new(
                    RefusalKind::InvalidArgument,
                    "not a regular file, directory or symlink; skipped",
                )));
            }
        }
        if stat.size <= MAX_ONE_SHOT_BYTES as u64 / 2 {
            let data = dir.read(remote).await?;
            write_local(local, &data, stat, options.preserve).map_err(local_error)?;
        } else {
            let destination = open_destination(local, stat.permissions).map_err(local_error)?;
            let file =
                tokio::fs::File::from_std(destination.file.try_clone().map_err(local_error)?);
            dir.download(remote, file).await?;
            finish_destination(local, &destination, stat, options.preserve).map_err(local_error)?;
        }
        Ok::<_, Error>(())
    };
    match outcome.await {
        Ok(()) => run.copied(),
        Err(error) => run.fail(shown, error),
    }
}

fn set_local_attributes(path: &Path, permissions: u32, modified_ns: i64) -> std::io::Result<()> {
    let modified = if modified_ns >= 0 {
        std::time::UNIX_EPOCH + Duration::from_nanos(modified_ns as u64)
    } else {
        std::time::UNIX_EPOCH - Duration::from_nanos(modified_ns.unsigned_abs())
    };
    // The time first: the permissions may forbid opening it after.
    std::fs::File::open(path)?.set_modified(modified)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(permissions & 0o7777))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_file_neither_copied_nor_failed_is_accounted_as_lost() {
        let run = Run {
            failed: Cell::new(0),
            stdout_failed: Cell::new(None),
            listed: Cell::new(0),
            copied: Cell::new(0),
            progress: ProgressBar::hidden(),
        };
        run.list(3);
        run.copied();
        assert_eq!(run.unaccounted(), 2);
        run.fail(Path::new("x"), "said");
        assert_eq!(run.unaccounted(), 1);
        run.copied();
        assert_eq!(run.unaccounted(), 0);
    }

    #[test]
    fn a_link_leads_out_of_the_tree_when_absolute_or_climbing_past_its_top() {
        let out = |relative: &str, target: &str| leads_out(Path::new(relative), target.as_bytes());
        assert!(out("a/link", "/etc/passwd"));
        assert!(out("link", "../x"));
        assert!(out("a/link", "../../x"));
        assert!(out("a/link", "b/../../../x"));
        assert!(!out("a/link", "../x"));
        assert!(!out("a/b/link", "../../x"));
        assert!(!out("link", "x/./y"));
    }
}
