//! Files as capabilities (`Executor.directory`, `Directory`): byte-exact
//! transfers, atomic writes, compare-and-swap, confinement against real
//! escape attempts, read-only facets, watches, streamed listings, limits
//! and errors. The same bodies run on every backend.

use crate::common;

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use capexec::capexec_capnp::upload_sink;
use capexec::client::{Directory, Error};
use capexec::model::{
    CopyOptions, DOWNLOAD_CHUNK_BYTES, FileKind, MAX_ONE_SHOT_BYTES, MAX_SEARCH_FILE_BYTES,
    MAX_TRANSFERS_PER_CONNECTION, Policy, RefusalKind, SearchMatch, SearchOptions, WalkOptions,
    WatchEvent, WatchEventKind, WriteOptions,
};
use common::Ctx;
use common::data::{Pattern, TempDir};
use futures::StreamExt;
use sha2::{Digest, Sha256};

fn open(ctx: &Ctx, dir: &TempDir) -> Directory {
    Directory::open(&ctx.executor, dir.path())
}

/// The error of a raw call that had to fail.
fn call_error<T>(outcome: Result<T, capnp::Error>) -> Error {
    match outcome {
        Ok(_) => panic!("the call succeeded"),
        Err(error) => Error::from(error),
    }
}

/// The refusal's kind and message.
fn refused<T: std::fmt::Debug>(outcome: Result<T, Error>) -> (RefusalKind, String) {
    match outcome.expect_err("the call succeeded") {
        Error::Refused(refusal) => (refusal.kind, refusal.message),
        other => panic!("not a tagged refusal: {other:?}"),
    }
}

fn kind<T: std::fmt::Debug>(outcome: Result<T, Error>) -> RefusalKind {
    refused(outcome).0
}

fn sha(data: &[u8]) -> Vec<u8> {
    Sha256::digest(data).to_vec()
}

/// Names in `dir` on this machine, sorted (temporaries would show here).
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

async fn binary_files_round_trip_byte_exact_small_and_large(ctx: Ctx) {
    let temp = TempDir::new("files-round-trip");
    let dir = open(&ctx, &temp);
    let small: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let stat = dir.write("small.bin", &small).await.expect("write small");
    assert_eq!(stat.size, small.len() as u64);
    assert_eq!(stat.kind, FileKind::File);
    assert_eq!(
        std::fs::read(temp.path().join("small.bin")).expect("read"),
        small
    );
    assert_eq!(dir.read("small.bin").await.expect("read small"), small);

    // Past one message: an upload, then a download.
    let large = Pattern::bytes(17, MAX_ONE_SHOT_BYTES * 3 + 12_345);
    dir.write("large.bin", &large).await.expect("write large");
    assert_eq!(
        sha(&std::fs::read(temp.path().join("large.bin")).expect("read")),
        sha(&large)
    );
    let read = dir.read("large.bin").await.expect("read large");
    assert_eq!(read.len(), large.len());
    assert_eq!(sha(&read), sha(&large));
    let mut downloaded = Vec::new();
    let (size, stat) = dir
        .download("large.bin", &mut downloaded)
        .await
        .expect("download");
    assert_eq!(size, large.len() as u64);
    assert_eq!(stat.size, large.len() as u64);
    assert_eq!(sha(&downloaded), sha(&large));
    assert_eq!(names(temp.path()), ["large.bin", "small.bin"]);

    // Uploads of whole chunks only (the end is found by a read of
    // nothing), of less than one, and of nothing.
    for (name, length) in [
        ("chunks.bin", DOWNLOAD_CHUNK_BYTES * 2),
        ("short.bin", DOWNLOAD_CHUNK_BYTES - 1),
        ("empty.bin", 0),
    ] {
        let data = Pattern::bytes(5, length);
        let stat = dir
            .upload(
                name,
                &data[..],
                &WriteOptions::default(),
                Some(length as u64),
            )
            .await
            .expect("upload");
        assert_eq!(stat.size, length as u64, "{name}");
        let written = std::fs::read(temp.path().join(name)).expect("read");
        assert_eq!(sha(&written), sha(&data), "{name}");
    }
}

async fn ranges_read_exactly_the_bytes_asked(ctx: Ctx) {
    let temp = TempDir::new("files-ranges");
    let data = Pattern::bytes(3, 1_000_000);
    std::fs::write(temp.path().join("f"), &data).expect("write");
    let dir = open(&ctx, &temp);
    let (part, _) = dir.read_range("f", 999_990, 100).await.expect("tail");
    assert_eq!(part, data[999_990..]);
    let (part, _) = dir.read_range("f", 12, 34).await.expect("middle");
    assert_eq!(part, data[12..46]);
    let (part, _) = dir
        .read_range("f", 2_000_000, 10)
        .await
        .expect("past the end");
    assert!(part.is_empty());
    let mut range = Vec::new();
    let (size, _) = dir
        .download_range("f", 300_000, 400_000, &mut range)
        .await
        .expect("download range");
    assert_eq!(size, 400_000);
    assert_eq!(range, data[300_000..700_000]);
    let (kind, message) = refused(dir.read_range("f", 0, MAX_ONE_SHOT_BYTES as u64 + 1).await);
    assert_eq!(kind, RefusalKind::LimitReached, "{message}");
}

async fn atomic_writes_are_never_torn_for_a_concurrent_reader(ctx: Ctx) {
    let temp = TempDir::new("files-atomic");
    let dir = open(&ctx, &temp);
    let size = 256 * 1024;
    let (a, b) = (vec![b'a'; size], vec![b'b'; size]);
    dir.write("f", &a).await.expect("first");
    let stop = Arc::new(AtomicBool::new(false));
    let path = temp.path().join("f");
    let reader = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let content = std::fs::read(&path).expect("the file always exists");
                assert_eq!(content.len(), size, "a torn read");
                assert!(
                    content.iter().all(|&byte| byte == content[0]),
                    "a read mixed old and new content"
                );
                reads += 1;
            }
            reads
        })
    };
    for round in 0..40 {
        let content = if round % 2 == 0 { &b } else { &a };
        dir.write("f", content).await.expect("write");
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().expect("reader") > 0);
    assert_eq!(names(temp.path()), ["f"]);
}

/// Starts an upload of `path` and writes `data` into it, without `done`.
async fn begin_upload(
    dir: &Directory,
    path: &str,
    size: Option<u64>,
    data: &[u8],
) -> upload_sink::Client {
    let mut request = dir.client().upload_request();
    request.get().set_path(path.as_bytes());
    request.get().init_options();
    request.get().set_size(size.unwrap_or(0));
    request.get().set_size_known(size.is_some());
    let response = request.send().promise.await.expect("upload");
    let sink = response.get().expect("results").get_sink().expect("sink");
    let mut write = sink.write_request();
    write.get().set_data(data);
    write.send().await.expect("write");
    sink
}

async fn aborted_uploads_leave_the_old_file_and_no_temporary(ctx: Ctx) {
    let temp = TempDir::new("files-aborted");
    let dir = open(&ctx, &temp);
    dir.write("f", b"old").await.expect("write");

    // A sink released without `done`.
    let sink = begin_upload(&dir, "f", None, b"new content").await;
    drop(sink);
    // A new file, released the same way, never appears.
    drop(begin_upload(&dir, "fresh", None, b"x").await);
    // Calls after the releases run after them: the server has let go.
    assert_eq!(dir.read("f").await.expect("read"), b"old");
    assert!(!dir.exists("fresh").await.expect("exists"));

    // Fewer bytes than announced.
    let sink = begin_upload(&dir, "f", Some(10), b"12345").await;
    let outcome = sink.done_request().send().promise.await;
    let error = call_error(outcome);
    assert_eq!(
        error.refusal_kind(),
        Some(RefusalKind::InvalidArgument),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("5 bytes arrived, 10 were announced"),
        "{error}"
    );
    // More than announced.
    let (kind, message) = refused(
        dir.upload("f", &b"123456"[..], &WriteOptions::default(), Some(3))
            .await,
    );
    assert_eq!(kind, RefusalKind::InvalidArgument, "{message}");
    assert_eq!(dir.read("f").await.expect("read"), b"old");
    assert_eq!(names(temp.path()), ["f"]);

    // A reader that fails midway uploads nothing.
    struct Failing(bool);
    impl tokio::io::AsyncRead for Failing {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            if self.0 {
                return std::task::Poll::Ready(Err(std::io::Error::other("disk on fire")));
            }
            self.0 = true;
            buf.put_slice(&[7; 1000]);
            std::task::Poll::Ready(Ok(()))
        }
    }
    let (_, message) = refused(
        dir.upload("f", Failing(false), &WriteOptions::default(), None)
            .await,
    );
    assert!(message.contains("disk on fire"), "{message}");
    assert_eq!(dir.read("f").await.expect("read"), b"old");
    assert_eq!(names(temp.path()), ["f"]);
}

async fn a_cut_connection_mid_upload_leaves_the_old_file(ctx: Ctx) {
    let temp = TempDir::new("files-cut");
    std::fs::write(temp.path().join("f"), b"old").expect("write");
    let connection = ctx.connect_again().await.expect("a network backend");
    let dir = Directory::open(&connection.executor(), temp.path());
    let sink = begin_upload(&dir, "f", None, &[1; 100_000]).await;
    drop(connection);
    drop(sink);
    drop(dir);
    // The server notices the cut and discards the upload; poll until the
    // file system shows nothing left.
    let dir = open(&ctx, &temp);
    common::eventually_async("the upload is discarded", async || {
        names(temp.path()) == ["f"] && dir.read("f").await.expect("read") == b"old"
    })
    .await;
}

async fn a_write_with_a_stale_version_conflicts(ctx: Ctx) {
    let temp = TempDir::new("files-cas");
    let dir = open(&ctx, &temp);
    let first = dir.write("f", b"one").await.expect("write");
    assert_eq!(
        dir.metadata("f").await.expect("stat").version,
        first.version
    );
    let only_if = |version: &[u8]| WriteOptions {
        if_version: version.to_vec(),
        ..WriteOptions::default()
    };
    let second = dir
        .write_with("f", b"two", &only_if(&first.version))
        .await
        .expect("the version matches");
    assert_ne!(second.version, first.version);
    let (conflict, message) = refused(
        dir.write_with("f", b"three", &only_if(&first.version))
            .await,
    );
    assert_eq!(conflict, RefusalKind::Conflict);
    assert_eq!(
        message,
        "write \"f\": the file changed since the version given (somebody else wrote it)"
    );
    assert_eq!(
        kind_of_upload(&dir, &only_if(&first.version)).await,
        RefusalKind::Conflict
    );
    assert_eq!(dir.read("f").await.expect("read"), b"two");
    // Exclusive creation: of the same name, only the first wins.
    let exclusive = WriteOptions {
        exclusive: true,
        ..WriteOptions::default()
    };
    dir.write_with("new", b"1", &exclusive)
        .await
        .expect("create");
    assert_eq!(
        kind(dir.write_with("new", b"2", &exclusive).await),
        RefusalKind::Exists
    );
    let must_exist = WriteOptions {
        must_exist: true,
        ..WriteOptions::default()
    };
    assert_eq!(
        kind(dir.write_with("none", b"2", &must_exist).await),
        RefusalKind::NotFound
    );
}

async fn kind_of_upload(dir: &Directory, options: &WriteOptions) -> RefusalKind {
    kind(dir.upload("f", &b"four"[..], options, None).await)
}

async fn every_escape_is_refused(ctx: Ctx) {
    let outside = TempDir::new("files-outside");
    std::fs::write(outside.path().join("secret"), b"secret").expect("write");
    let temp = TempDir::new("files-escape");
    std::fs::create_dir(temp.path().join("sub")).expect("mkdir");
    symlink(outside.path(), temp.path().join("out")).expect("symlink");
    symlink("../..", temp.path().join("sub/up")).expect("symlink");
    symlink("/proc/self/root", temp.path().join("root")).expect("symlink");
    symlink("/etc/passwd", temp.path().join("passwd")).expect("symlink");
    let dir = open(&ctx, &temp);
    let escapes = [
        "..",
        "../x",
        "sub/../../x",
        "/etc/passwd",
        "out/secret",
        "sub/up/x",
        "root/etc/passwd",
        "passwd",
        "/proc/self/root/etc/passwd",
    ];
    for path in escapes {
        let (kind, message) = refused(dir.read(path).await);
        assert_eq!(kind, RefusalKind::OutsideDirectory, "{path}: {message}");
        assert_eq!(
            kind_of(dir.write(Path::new(path).join("new"), b"x").await),
            RefusalKind::OutsideDirectory,
            "{path}"
        );
        assert_eq!(
            kind_of(dir.create_dir_all(Path::new(path).join("d")).await),
            RefusalKind::OutsideDirectory,
            "{path}"
        );
        assert_eq!(
            kind_of(dir.subdirectory(path).metadata("").await),
            RefusalKind::OutsideDirectory,
            "{path}"
        );
    }
    assert_eq!(
        kind(dir.rename("sub", "../moved", false).await),
        RefusalKind::OutsideDirectory
    );
    assert_eq!(
        kind(
            dir.copy("out/secret", "stolen", &CopyOptions::default())
                .await
        ),
        RefusalKind::OutsideDirectory
    );
    // A subdirectory cannot name its parent either.
    let sub = dir.subdirectory("sub");
    assert_eq!(
        kind(sub.read("../passwd").await),
        RefusalKind::OutsideDirectory
    );
    // Symlinks pointing out can be made and read, never followed.
    sub.symlink("/etc/shadow", "shadow").await.expect("symlink");
    assert_eq!(
        sub.read_link("shadow").await.expect("readlink"),
        b"/etc/shadow"
    );
    assert_eq!(
        kind(sub.read("shadow").await),
        RefusalKind::OutsideDirectory
    );
    // Removing a symlink removes the link, not what it points to.
    dir.remove_file("out").await.expect("remove the symlink");
    assert_eq!(
        std::fs::read(outside.path().join("secret")).expect("still there"),
        b"secret"
    );
    // A walk reports symlinks and never follows them.
    symlink(outside.path(), temp.path().join("out")).expect("symlink");
    let entries = dir
        .walk("", &WalkOptions::default())
        .await
        .collect_all()
        .await
        .expect("walk");
    assert!(entries.iter().all(|entry| !entry.path.ends_with(b"secret")));
    let out = entries
        .iter()
        .find(|entry| entry.path == b"out")
        .expect("out listed");
    assert_eq!(
        out.stat.as_ref().map(|stat| stat.kind),
        Some(FileKind::Symlink)
    );
    assert_eq!(
        out.link_target,
        outside.path().as_os_str().as_encoded_bytes()
    );
}

/// `source` bind-mounted at `target` (the tests run as root, as CI does),
/// detached again when dropped, whatever the test did.
struct BindMount(std::ffi::CString);

impl BindMount {
    fn new(source: &Path, target: &Path) -> BindMount {
        use std::os::unix::ffi::OsStrExt;
        let c = |path: &Path| std::ffi::CString::new(path.as_os_str().as_bytes()).expect("path");
        let (source, target) = (c(source), c(target));
        // SAFETY: mount(2) with NUL-terminated paths and no data.
        let mounted = unsafe {
            libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        assert_eq!(
            mounted,
            0,
            "bind mount (the tests need root): {}",
            std::io::Error::last_os_error()
        );
        BindMount(target)
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        // SAFETY: umount2(2) with a NUL-terminated path.
        unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
    }
}

async fn no_call_crosses_a_mount_point_beneath_the_directory(ctx: Ctx) {
    let outside = TempDir::new("files-mounted-outside");
    std::fs::create_dir(outside.path().join("sub")).expect("mkdir");
    std::fs::write(outside.path().join("secret"), b"secret").expect("write");
    std::fs::write(outside.path().join("sub/f"), b"f").expect("write");
    let temp = TempDir::new("files-mount");
    std::fs::create_dir_all(temp.path().join("a/mnt")).expect("mkdir");
    std::fs::write(temp.path().join("a/keep"), b"keep").expect("write");
    let mount = BindMount::new(outside.path(), &temp.path().join("a/mnt"));
    let dir = open(&ctx, &temp);
    let crossing = |(kind, message): (RefusalKind, String)| {
        assert_eq!(kind, RefusalKind::OutsideDirectory, "{message}");
        assert!(
            message.contains(": crosses a mount point beneath the directory"),
            "{message}"
        );
    };
    crossing(refused(dir.read("a/mnt/secret").await));
    crossing(refused(dir.metadata("a/mnt").await));
    crossing(refused(dir.subdirectory("a/mnt").metadata("").await));
    crossing(refused(dir.write("a/mnt/planted", b"x").await));
    crossing(refused(
        dir.copy("a/mnt/secret", "stolen", &CopyOptions::default())
            .await,
    ));
    // A walk reports the mount point and does not enter it.
    let entries = dir
        .walk("", &WalkOptions::default())
        .await
        .collect_all()
        .await
        .expect("walk");
    let mnt = entries
        .iter()
        .find(|entry| entry.path == b"a/mnt")
        .expect("the mount point listed");
    assert_eq!(
        mnt.error.as_deref(),
        Some(
            "a mount point (another file system, or a bind mount that may lead anywhere); not entered"
        )
    );
    assert!(
        entries
            .iter()
            .all(|entry| !entry.path.starts_with(b"a/mnt/")),
        "{entries:?}"
    );
    // A recursive remove of its parent stops at it, touching nothing out.
    crossing(refused(dir.remove_dir_all("a").await));
    assert_eq!(names(outside.path()), ["secret", "sub"]);
    assert_eq!(
        std::fs::read(outside.path().join("sub/f")).expect("still there"),
        b"f"
    );
    assert!(!outside.path().join("planted").exists());
    // Its own files go as usual once nothing is mounted there.
    drop(mount);
    dir.remove_dir_all("a").await.expect("remove");
    assert_eq!(names(temp.path()), Vec::<String>::new());
    assert_eq!(names(outside.path()), ["secret", "sub"]);
}

async fn a_symlink_swapped_in_while_calls_run_never_leads_out(ctx: Ctx) {
    let outside = TempDir::new("files-swap-outside");
    std::fs::write(outside.path().join("secret"), b"secret").expect("write");
    let temp = TempDir::new("files-swap");
    std::fs::create_dir(temp.path().join("d")).expect("mkdir");
    std::fs::write(temp.path().join("d/inner"), b"inner").expect("write");
    symlink(outside.path(), temp.path().join("x")).expect("symlink");
    // "d" is a directory and a symlink pointing out by turns, swapped
    // atomically (RENAME_EXCHANGE) as fast as the machine goes.
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, d, x) = (
            Arc::clone(&stop),
            temp.path().join("d"),
            temp.path().join("x"),
        );
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    &d,
                    rustix::fs::CWD,
                    &x,
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .expect("exchange");
                swaps += 1;
            }
            swaps
        })
    };
    let dir = open(&ctx, &temp);
    for _ in 0..100 {
        let entries = dir
            .walk("", &WalkOptions::default())
            .await
            .collect_all()
            .await
            .expect("walk");
        assert!(
            entries.iter().all(|entry| !entry.path.ends_with(b"secret")),
            "{entries:?}"
        );
        match dir.read("d/secret").await {
            Ok(data) => panic!("read through a swapped-in symlink: {data:?}"),
            Err(error) => assert!(
                matches!(
                    error.refusal_kind(),
                    Some(RefusalKind::OutsideDirectory | RefusalKind::NotFound)
                ),
                "{error}"
            ),
        }
        let written = dir.write("d/planted", b"x").await;
        assert!(
            !outside.path().join("planted").exists(),
            "a write went out: {written:?}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    assert!(swapper.join().expect("swapper") > 0);
}

fn kind_of<T: std::fmt::Debug>(outcome: Result<T, Error>) -> RefusalKind {
    kind(outcome)
}

async fn read_only_directories_refuse_every_mutation(ctx: Ctx) {
    let temp = TempDir::new("files-read-only");
    std::fs::create_dir(temp.path().join("sub")).expect("mkdir");
    std::fs::write(temp.path().join("sub/f"), b"content").expect("write");
    let writable = open(&ctx, &temp);
    for dir in [
        writable.read_only(),
        writable.read_only().subdirectory("sub").subdirectory(""),
    ] {
        assert!(dir.info().await.expect("info").read_only);
        // Reading works.
        let sub = if dir.info().await.expect("info").path.ends_with("sub") {
            dir.clone()
        } else {
            dir.subdirectory("sub")
        };
        assert_eq!(sub.read("f").await.expect("read"), b"content");
        assert_eq!(
            sub.read_dir("")
                .await
                .collect_all()
                .await
                .expect("list")
                .len(),
            1
        );
        let watch = sub.watch("", false).await.expect("watching is reading");
        drop(watch);
        let found = sub
            .search("", &search_for("cont"))
            .await
            .expect("searching is reading");
        assert_eq!(found.matches.len(), 1);
        let forbidden = |outcome: Result<(), Error>, call: &str| {
            let (kind, message) = refused(outcome);
            assert_eq!(kind, RefusalKind::Forbidden, "{call}: {message}");
            assert_eq!(
                message,
                format!("`{call}` is not allowed: this directory is read-only")
            );
        };
        forbidden(sub.write("f", b"x").await.map(drop), "writeFile");
        forbidden(
            sub.upload("f", &b"x"[..], &WriteOptions::default(), None)
                .await
                .map(drop),
            "upload",
        );
        forbidden(sub.create_dir("d").await, "mkdir");
        forbidden(sub.remove("f", false, false).await.map(drop), "remove");
        forbidden(sub.rename("f", "g", false).await, "rename");
        forbidden(
            sub.copy("f", "g", &CopyOptions::default()).await.map(drop),
            "copy",
        );
        forbidden(sub.symlink("f", "l").await, "symlink");
        forbidden(sub.set_permissions("f", 0o600).await, "setPermissions");
        forbidden(sub.set_times("f", 0, 0).await, "setTimes");
    }
    assert_eq!(
        std::fs::read(temp.path().join("sub/f")).expect("read"),
        b"content"
    );
    assert_eq!(names(&temp.path().join("sub")), ["f"]);
    // The writable one still writes.
    writable.write("sub/f", b"changed").await.expect("write");
}

/// Events until one matching `done` arrives (the deadline bounds it).
async fn events_until(
    stream: &mut capexec::client::WatchStream,
    done: impl Fn(&WatchEvent) -> bool,
) -> Vec<WatchEvent> {
    let mut seen = Vec::new();
    while let Some(event) = stream.next().await {
        let last = done(&event);
        seen.push(event);
        if last {
            return seen;
        }
    }
    panic!("the watch ended early: {seen:?}");
}

fn has(events: &[WatchEvent], kind: WatchEventKind, path: &str) -> bool {
    events
        .iter()
        .any(|event| event.kind == kind && event.path == path.as_bytes())
}

async fn a_watch_sees_creation_modification_removal_and_renames(ctx: Ctx) {
    let temp = TempDir::new("files-watch");
    std::fs::create_dir(temp.path().join("deep")).expect("mkdir");
    let dir = open(&ctx, &temp);
    let mut events = dir.watch("", true).await.expect("watch");
    // Through the directory itself and behind its back.
    dir.write("a", b"1").await.expect("write");
    let seen = events_until(&mut events, |e| e.path == b"a").await;
    assert!(has(&seen, WatchEventKind::Created, "a"), "{seen:?}");
    std::fs::write(temp.path().join("deep/b"), b"2").expect("write");
    let seen = events_until(&mut events, |e| {
        e.kind == WatchEventKind::Modified && e.path == b"deep/b"
    })
    .await;
    assert!(has(&seen, WatchEventKind::Created, "deep/b"), "{seen:?}");
    std::fs::rename(temp.path().join("a"), temp.path().join("c")).expect("rename");
    let seen = events_until(&mut events, |e| e.kind == WatchEventKind::Renamed).await;
    let renamed = seen.last().expect("renamed");
    assert_eq!(
        (renamed.path.as_slice(), renamed.to_path.as_slice()),
        (&b"a"[..], &b"c"[..])
    );
    // An atomic replacement reads as a modification, never a temporary.
    dir.write("c", b"3").await.expect("replace");
    let seen = events_until(&mut events, |e| e.path == b"c").await;
    assert!(
        seen.iter().all(|e| !e.path.starts_with(b".capexec")),
        "{seen:?}"
    );
    std::fs::remove_file(temp.path().join("c")).expect("remove");
    events_until(&mut events, |e| {
        e.kind == WatchEventKind::Removed && e.path == b"c"
    })
    .await;
    // A directory made after the watch began is watched too.
    std::fs::create_dir(temp.path().join("new")).expect("mkdir");
    events_until(&mut events, |e| {
        e.kind == WatchEventKind::Created && e.path == b"new"
    })
    .await;
    std::fs::write(temp.path().join("new/x"), b"4").expect("write");
    events_until(&mut events, |e| e.path == b"new/x").await;
    // The watched directory going away ends the watch with `gone`.
    let sub_temp = temp.path().join("deep");
    let mut sub_events = dir.watch("deep", false).await.expect("watch deep");
    std::fs::remove_file(sub_temp.join("b")).expect("remove");
    std::fs::remove_dir(&sub_temp).expect("rmdir");
    let seen = events_until(&mut sub_events, |e| e.kind == WatchEventKind::Gone).await;
    assert!(has(&seen, WatchEventKind::Removed, "b"), "{seen:?}");
}

async fn a_client_too_slow_for_its_watch_gets_an_overflow(ctx: Ctx) {
    let temp = TempDir::new("files-overflow");
    let dir = open(&ctx, &temp);
    let mut events = dir.watch("", false).await.expect("watch");
    // The client reads nothing while far more events happen than wait.
    let path = temp.path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        for round in 0..(capexec::model::MAX_PENDING_WATCH_EVENTS / 2 + 500) {
            let name = path.join(format!("f{}", round % 64));
            std::fs::write(&name, b"x").expect("write");
            std::fs::remove_file(&name).expect("remove");
        }
    })
    .await
    .expect("churn");
    events_until(&mut events, |e| e.kind == WatchEventKind::Overflow).await;
}

async fn a_huge_listing_is_streamed_in_batches(ctx: Ctx) {
    let temp = TempDir::new("files-huge");
    // Three full batches and a partial one.
    let count = 3 * capexec::model::ENTRY_BATCH + 17;
    // Off the runtime's thread: a slow disk must not hold back the
    // connection (its login travels pipelined with the first calls).
    let path = temp.path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        for index in 0..count {
            std::fs::write(path.join(format!("{index:05}")), b"").expect("write");
        }
    })
    .await
    .expect("make the files");
    let dir = open(&ctx, &temp);
    let mut stream = dir.read_dir("").await;
    let mut seen = std::collections::BTreeSet::new();
    while let Some(entry) = stream.next().await {
        let entry = entry.expect("entry");
        assert_eq!(
            entry.stat.as_ref().map(|stat| stat.kind),
            Some(FileKind::File)
        );
        assert!(seen.insert(entry.path), "listed twice");
    }
    assert_eq!(seen.len(), count);
    assert_eq!(stream.summary().map(|s| s.entries), Some(count as u64));
    // A walk, limited, says that it was cut short.
    let options = WalkOptions {
        max_entries: 100,
        ..WalkOptions::default()
    };
    let mut walk = dir.walk("", &options).await;
    let mut walked = 0;
    while let Some(entry) = walk.next().await {
        entry.expect("entry");
        walked += 1;
    }
    assert_eq!(walked, 100);
    assert_eq!(walk.summary().map(|s| s.truncated), Some(true));
}

async fn walks_filter_and_limit_depth(ctx: Ctx) {
    let temp = TempDir::new("files-walk");
    for path in [
        "src/a.rs",
        "src/b.txt",
        "src/deep/c.rs",
        "target/x.rs",
        "top.rs",
    ] {
        let path = temp.path().join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, b"").expect("write");
    }
    let dir = open(&ctx, &temp);
    let walked = |options: WalkOptions| {
        let dir = dir.clone();
        async move {
            let mut paths: Vec<String> = dir
                .walk("", &options)
                .await
                .collect_all()
                .await
                .expect("walk")
                .into_iter()
                .map(|entry| String::from_utf8(entry.path).expect("utf-8"))
                .collect();
            paths.sort();
            paths
        }
    };
    assert_eq!(
        walked(WalkOptions {
            include: vec![b"**/*.rs".to_vec()],
            exclude: vec![b"target".to_vec()],
            ..WalkOptions::default()
        })
        .await,
        ["src/a.rs", "src/deep/c.rs", "top.rs"]
    );
    assert_eq!(
        walked(WalkOptions {
            max_depth: 1,
            ..WalkOptions::default()
        })
        .await,
        ["src", "target", "top.rs"]
    );
    let (kind, message) = refused(
        dir.walk(
            "",
            &WalkOptions {
                include: vec![b"[".to_vec()],
                ..WalkOptions::default()
            },
        )
        .await
        .collect_all()
        .await,
    );
    assert_eq!(kind, RefusalKind::InvalidArgument, "{message}");
}

async fn tree_calls_do_what_std_fs_does(ctx: Ctx) {
    let temp = TempDir::new("files-tree");
    let dir = open(&ctx, &temp);
    dir.create_dir_all("a/b/c").await.expect("mkdir -p");
    dir.create_dir_all("a/b/c").await.expect("mkdir -p again");
    assert_eq!(kind(dir.create_dir("a").await), RefusalKind::Exists);
    assert_eq!(kind(dir.create_dir("x/y").await), RefusalKind::NotFound);
    dir.write("a/b/c/f", b"data").await.expect("write");
    dir.set_permissions("a/b/c/f", 0o640).await.expect("chmod");
    dir.set_times("a/b/c/f", 1_000_000_000, 2_000_000_007)
        .await
        .expect("times");
    let stat = dir.metadata("a/b/c/f").await.expect("stat");
    assert_eq!((stat.permissions, stat.modified_ns), (0o640, 2_000_000_007));
    assert_eq!(
        std::fs::metadata(temp.path().join("a/b/c/f"))
            .expect("stat")
            .permissions()
            .mode()
            & 0o7777,
        0o640
    );
    // A replaced file keeps its permission bits.
    dir.write("a/b/c/f", b"new").await.expect("replace");
    assert_eq!(
        dir.metadata("a/b/c/f").await.expect("stat").permissions,
        0o640
    );

    let copied = dir
        .copy(
            "a",
            "copy",
            &CopyOptions {
                recursive: true,
                preserve: true,
                ..CopyOptions::default()
            },
        )
        .await
        .expect("copy -r");
    assert_eq!(copied, 4);
    let stat = dir.metadata("copy/b/c/f").await.expect("stat");
    assert_eq!(stat.permissions, 0o640);
    assert_eq!(dir.read("copy/b/c/f").await.expect("read"), b"new");
    assert_eq!(
        kind(
            dir.copy(
                "a",
                "a/b/inside",
                &CopyOptions {
                    recursive: true,
                    ..CopyOptions::default()
                }
            )
            .await
        ),
        RefusalKind::InvalidArgument
    );
    assert_eq!(
        kind(dir.copy("a", "b", &CopyOptions::default()).await),
        RefusalKind::IsADirectory
    );

    dir.rename("copy", "moved", false).await.expect("rename");
    assert!(!dir.exists("copy").await.expect("exists"));
    dir.symlink("moved/b", "link").await.expect("symlink");
    assert_eq!(dir.read_link("link").await.expect("readlink"), b"moved/b");
    assert_eq!(
        dir.canonicalize("link/c/../c/f").await.expect("canonical"),
        b"moved/b/c/f"
    );
    assert_eq!(
        dir.symlink_metadata("link").await.expect("lstat").kind,
        FileKind::Symlink
    );
    assert_eq!(
        dir.metadata("link").await.expect("stat").kind,
        FileKind::Directory
    );
    assert_eq!(
        kind(dir.rename("moved", "a", true).await),
        RefusalKind::Exists
    );
    assert_eq!(
        kind(dir.remove("a", false, false).await),
        RefusalKind::NotEmpty
    );
    assert_eq!(dir.remove_dir_all("a").await.expect("rm -r"), 4);
    assert_eq!(dir.remove("a", true, true).await.expect("missing ok"), 0);
    assert_eq!(
        kind(dir.remove("", true, false).await),
        RefusalKind::InvalidArgument
    );
    let info = dir.info().await.expect("info");
    assert_eq!(
        info.path,
        std::fs::canonicalize(temp.path()).expect("canonical")
    );
    assert!(!info.read_only);
}

async fn errors_name_the_call_the_path_and_the_reason(ctx: Ctx) {
    let temp = TempDir::new("files-errors");
    std::fs::write(temp.path().join("file"), b"x").expect("write");
    let dir = open(&ctx, &temp);
    assert_eq!(
        refused(dir.read("missing/f").await),
        (
            RefusalKind::NotFound,
            "read \"missing/f\": not found".to_string()
        )
    );
    assert_eq!(
        refused(dir.read_dir("file").await.collect_all().await),
        (
            RefusalKind::NotADirectory,
            "list \"file\": not a directory".to_string()
        )
    );
    assert_eq!(
        refused(dir.read("").await),
        (
            RefusalKind::IsADirectory,
            "read \".\": is a directory".to_string()
        )
    );
    assert_eq!(
        kind(dir.read_link("file").await),
        RefusalKind::InvalidArgument
    );
    assert_eq!(kind(dir.read("a\0b").await), RefusalKind::InvalidArgument);
    let missing = Directory::open(&ctx.executor, temp.path().join("nope"));
    assert_eq!(kind(missing.metadata("").await), RefusalKind::NotFound);
    let not_dir = Directory::open(&ctx.executor, temp.path().join("file"));
    assert_eq!(kind(not_dir.metadata("").await), RefusalKind::NotADirectory);
    // The server is fine after all of these.
    assert_eq!(dir.read("file").await.expect("read"), b"x");
}

async fn limits_are_refused_with_limit(ctx: Ctx) {
    let temp = TempDir::new("files-limits");
    let dir = open(&ctx, &temp);
    let mut request = dir.client().write_file_request();
    request.get().set_path(b"big");
    request.get().set_data(&vec![0; MAX_ONE_SHOT_BYTES + 1]);
    request.get().init_options();
    let error = call_error(request.send().promise.await);
    assert_eq!(
        error.refusal_kind(),
        Some(RefusalKind::LimitReached),
        "{error}"
    );
    let mut held = Vec::new();
    for index in 0..MAX_TRANSFERS_PER_CONNECTION {
        held.push(begin_upload(&dir, &format!("u{index}"), None, b"x").await);
    }
    let mut request = dir.client().upload_request();
    request.get().set_path(b"one-too-many");
    request.get().init_options();
    let error = call_error(request.send().promise.await);
    assert_eq!(
        error.refusal_kind(),
        Some(RefusalKind::LimitReached),
        "{error}"
    );
    // A search is a transfer too.
    assert_eq!(
        kind_of(dir.search("", &search_for("x")).await),
        RefusalKind::LimitReached
    );
    drop(held);
    // Released uploads give their places back (and leave nothing).
    dir.upload("after", &b"ok"[..], &WriteOptions::default(), None)
        .await
        .expect("room again");
    assert_eq!(names(temp.path()), ["after"]);
    // So do uploads that are done, while their sinks are still held.
    let mut done = Vec::new();
    for index in 0..MAX_TRANSFERS_PER_CONNECTION {
        let sink = begin_upload(&dir, &format!("d{index}"), None, b"x").await;
        sink.done_request().send().promise.await.expect("done");
        done.push(sink);
    }
    let sink = begin_upload(&dir, "past-the-done", None, b"x").await;
    sink.done_request()
        .send()
        .promise
        .await
        .expect("room after done");
    drop(done);
}

/// `writeFiles`: every file written as `writeFile` writes it, each with
/// its own options and outcome, in order; a failure stops only its file;
/// over the limits nothing is written; read-only directories refuse it.
async fn a_batch_of_writes_has_an_outcome_per_file(ctx: Ctx) {
    let temp = TempDir::new("files-batch");
    let dir = open(&ctx, &temp);
    std::fs::create_dir(temp.path().join("a-directory")).expect("mkdir");
    std::fs::write(temp.path().join("old"), b"old").expect("write");
    std::fs::set_permissions(
        temp.path().join("old"),
        std::fs::Permissions::from_mode(0o640),
    )
    .expect("chmod");
    let binary = Pattern::bytes(3, 100_000);
    let exclusive = WriteOptions {
        exclusive: true,
        ..WriteOptions::default()
    };
    let mode = WriteOptions {
        permissions: Some(0o751),
        modified_ns: Some(1_000_000_000_123_456_789),
        ..WriteOptions::default()
    };
    let files = vec![
        ("binary", binary.clone(), WriteOptions::default()),
        ("old", b"new".to_vec(), WriteOptions::default()),
        ("a-directory", b"x".to_vec(), WriteOptions::default()),
        ("old", b"again".to_vec(), exclusive),
        ("sub/deeper", b"no parent".to_vec(), WriteOptions::default()),
        ("../escape", b"out".to_vec(), WriteOptions::default()),
        ("moded", b"m".to_vec(), mode),
        (
            "binary",
            b"second write of the same file".to_vec(),
            WriteOptions::default(),
        ),
    ];
    let outcomes = dir.write_batch(&files).await.expect("writeFiles");
    let kinds = outcome_kinds(&outcomes);
    assert_eq!(
        kinds,
        [
            None,
            None,
            Some(RefusalKind::IsADirectory),
            Some(RefusalKind::Exists),
            Some(RefusalKind::NotFound),
            Some(RefusalKind::OutsideDirectory),
            None,
            None,
        ]
    );
    assert_eq!(
        outcomes[2].as_ref().expect_err("a directory").to_string(),
        "write \"a-directory\": is a directory"
    );
    let stat = outcomes[0].as_ref().expect("written");
    assert_eq!(stat.size, binary.len() as u64);
    assert_eq!(
        std::fs::read(temp.path().join("binary")).expect("read"),
        b"second write of the same file"
    );
    assert_eq!(
        std::fs::read(temp.path().join("old")).expect("read"),
        b"new"
    );
    let kept = std::fs::metadata(temp.path().join("old")).expect("stat");
    assert_eq!(
        kept.permissions().mode() & 0o7777,
        0o640,
        "a replaced file keeps its mode"
    );
    let moded = outcomes[6].as_ref().expect("written");
    assert_eq!(
        (moded.permissions, moded.modified_ns),
        (0o751, 1_000_000_000_123_456_789)
    );
    assert_eq!(
        names(temp.path()),
        ["a-directory", "binary", "moded", "old"]
    );

    // Over the limits: refused whole, nothing written.
    let too_many: Vec<_> = (0..=capexec::model::MAX_BATCH_FILES)
        .map(|index| (format!("n{index}"), Vec::new(), WriteOptions::default()))
        .collect();
    let too_big = vec![
        (
            "big1",
            vec![0; MAX_ONE_SHOT_BYTES / 2 + 1],
            WriteOptions::default(),
        ),
        (
            "big2",
            vec![0; MAX_ONE_SHOT_BYTES / 2],
            WriteOptions::default(),
        ),
    ];
    assert_eq!(
        kind(dir.write_batch(&too_many).await.map(drop)),
        RefusalKind::LimitReached
    );
    let refusal = refused(dir.write_batch(&too_big).await.map(drop));
    assert_eq!(refusal.0, RefusalKind::LimitReached);
    assert!(refusal.1.contains("nothing was written"), "{}", refusal.1);
    assert_eq!(
        names(temp.path()),
        ["a-directory", "binary", "moded", "old"]
    );

    let read_only = dir.read_only();
    assert_eq!(
        refused(read_only.write_batch(&files[..1]).await.map(drop)),
        (
            RefusalKind::Forbidden,
            "`writeFiles` is not allowed: this directory is read-only".to_string()
        )
    );
}

/// `readFiles`: each file read whole as `readFile` reads it, with its own
/// outcome, in order; past 4 MiB in all a file fails alone as too large.
async fn a_batch_of_reads_has_an_outcome_per_file(ctx: Ctx) {
    let temp = TempDir::new("files-read-batch");
    let dir = open(&ctx, &temp);
    let binary = Pattern::bytes(4, 100_000);
    std::fs::write(temp.path().join("binary"), &binary).expect("write");
    std::fs::write(temp.path().join("empty"), b"").expect("write");
    std::fs::create_dir(temp.path().join("a-directory")).expect("mkdir");
    let three_mib = vec![7; 3 << 20];
    std::fs::write(temp.path().join("three-mib"), &three_mib).expect("write");
    let outcomes = dir
        .read_batch(&[
            "binary",
            "missing",
            "empty",
            "a-directory",
            "../escape",
            "three-mib",
            "three-mib",
            "binary",
        ])
        .await
        .expect("readFiles");
    let kinds = outcome_kinds(&outcomes);
    assert_eq!(
        kinds,
        [
            None,
            Some(RefusalKind::NotFound),
            None,
            Some(RefusalKind::IsADirectory),
            Some(RefusalKind::OutsideDirectory),
            None,
            Some(RefusalKind::TooLarge),
            None,
        ]
    );
    let (data, stat) = outcomes[0].as_ref().expect("read");
    assert_eq!((sha(data), stat.size), (sha(&binary), binary.len() as u64));
    assert_eq!(outcomes[2].as_ref().expect("read").0, b"");
    assert_eq!(sha(&outcomes[5].as_ref().expect("read").0), sha(&three_mib));
    assert_eq!(sha(&outcomes[7].as_ref().expect("read").0), sha(&binary));
    assert_eq!(
        outcomes[1].as_ref().expect_err("missing").to_string(),
        "read \"missing\": not found"
    );
    let too_many: Vec<String> = (0..=capexec::model::MAX_BATCH_FILES)
        .map(|index| format!("n{index}"))
        .collect();
    assert_eq!(
        kind(dir.read_batch(&too_many).await.map(drop)),
        RefusalKind::LimitReached
    );
    // Read-only directories read.
    let read_only = dir.read_only().read_batch(&["binary"]).await.expect("read");
    assert_eq!(sha(&read_only[0].as_ref().expect("read").0), sha(&binary));
}

/// Each outcome of a batch as its refusal's tag, `None` for a success.
fn outcome_kinds<T>(outcomes: &[Result<T, capexec::client::Error>]) -> Vec<Option<RefusalKind>> {
    outcomes
        .iter()
        .map(|outcome| {
            outcome
                .as_ref()
                .err()
                .map(|error| error.refusal_kind().expect("tagged"))
        })
        .collect()
}

async fn a_restricted_executor_hands_out_directories_only_in_its_roots(ctx: Ctx) {
    let root = TempDir::new("files-root");
    std::fs::create_dir(root.path().join("inside")).expect("mkdir");
    let other = TempDir::new("files-other");
    symlink(other.path(), root.path().join("inside/out")).expect("symlink");
    let executor = capexec::client::restrict(
        &ctx.executor,
        &Policy {
            cwd_roots: Some(vec![root.path().to_path_buf()]),
            ..Policy::default()
        },
    );
    let inside = Directory::open(&executor, root.path().join("inside"));
    inside.write("f", b"ok").await.expect("write inside");
    for path in [
        other.path().to_path_buf(),
        root.path().join("inside/out"),
        root.path().join(".."),
    ] {
        let (kind, message) = refused(Directory::open(&executor, &path).metadata("").await);
        assert_eq!(
            kind,
            RefusalKind::NotAllowed,
            "{}: {message}",
            path.display()
        );
    }
}

/// A `ByteSink` that never acknowledges a chunk.
struct NeverReads;

impl capexec::capexec_capnp::byte_sink::Server for NeverReads {
    async fn write(
        self: std::rc::Rc<Self>,
        _: capexec::capexec_capnp::byte_sink::WriteParams,
    ) -> Result<(), capnp::Error> {
        std::future::pending().await
    }
}

async fn a_download_to_a_sink_that_never_reads_holds_back_only_itself(ctx: Ctx) {
    let temp = TempDir::new("files-never-reads");
    let data = Pattern::bytes(11, 16 << 20);
    std::fs::write(temp.path().join("f"), &data).expect("write");
    let dir = open(&ctx, &temp);
    let mut request = dir.client().download_request();
    request.get().set_path(b"f");
    request.get().set_sink(capnp_rpc::new_client::<
        capexec::capexec_capnp::byte_sink::Client,
        _,
    >(NeverReads));
    let stuck = request.send().promise;
    // The stuck download holds back nothing else of the directory.
    assert_eq!(
        dir.metadata("f").await.expect("stat").size,
        data.len() as u64
    );
    let (part, _) = dir.read_range("f", 100, 10).await.expect("read");
    assert_eq!(part, data[100..110]);
    // Given up on, it frees its place: another download gets everything.
    drop(stuck);
    let mut copy = Vec::new();
    dir.download("f", &mut copy).await.expect("download");
    assert_eq!(sha(&copy), sha(&data));
}

/// A peer can make a tree of any depth: a copy goes as deep as
/// `MAX_COPY_DEPTH` (256) directories and refuses deeper, rather than
/// overflowing the stack of the thread that copies; a tree thousands of
/// levels deep and a path of thousands of parts are removed and made
/// without recursion; the server goes on.
async fn trees_of_any_depth_are_copied_to_a_bound_removed_and_made(ctx: Ctx) {
    let temp = TempDir::new("files-deep");
    let dir = open(&ctx, &temp);
    let recursive = CopyOptions {
        recursive: true,
        ..CopyOptions::default()
    };
    let deep = |levels: usize| {
        let mut path = temp.path().join(format!("deep{levels}"));
        std::fs::create_dir(&path).expect("mkdir");
        for _ in 0..levels {
            path.push("d");
            std::fs::create_dir(&path).expect("mkdir");
        }
    };
    deep(256);
    assert_eq!(
        dir.copy("deep256", "copy256", &recursive)
            .await
            .expect("copy"),
        257
    );
    deep(257);
    let refused = dir
        .copy("deep257", "copy257", &recursive)
        .await
        .expect_err("deeper than 256");
    assert_eq!(
        refused.refusal_kind(),
        Some(RefusalKind::LimitReached),
        "{refused}"
    );
    assert!(
        refused
            .to_string()
            .contains("the tree is deeper than 256 directories"),
        "{refused}"
    );
    // 5,000 levels (made by the kernel's *at calls: a path that long
    // cannot be named whole), removed in one call.
    common::data::make_tower(temp.path(), "tower", "t", 5000);
    assert_eq!(
        dir.remove("tower", true, false).await.expect("remove"),
        5001
    );
    assert!(!temp.path().join("tower").exists());
    // 2,000 parts in one path (4,000 bytes), made as `mkdir -p` would.
    let parts = "p/".repeat(2000);
    dir.create_dir_all(&parts).await.expect("mkdir -p");
    assert!(dir.metadata(&parts).await.expect("made").is_dir());
    assert_eq!(dir.remove("p", true, false).await.expect("remove"), 2000);
    // The server goes on.
    dir.write("alive", b"yes").await.expect("write");
}

/// `copy` answers how many entries it copied, the top one included.
async fn a_copy_counts_every_entry_it_copied_the_top_one_included(ctx: Ctx) {
    let temp = TempDir::new("files-copy-count");
    let dir = open(&ctx, &temp);
    let recursive = CopyOptions {
        recursive: true,
        ..CopyOptions::default()
    };
    dir.create_dir("empty").await.expect("mkdir");
    assert_eq!(
        dir.copy("empty", "empty2", &recursive).await.expect("copy"),
        1
    );
    dir.write("file", b"x").await.expect("write");
    assert_eq!(
        dir.copy("file", "file2", &CopyOptions::default())
            .await
            .expect("copy"),
        1
    );
    dir.symlink("file", "link").await.expect("symlink");
    assert_eq!(
        dir.copy("link", "link2", &CopyOptions::default())
            .await
            .expect("copy"),
        1
    );
    // tree, tree/f, tree/s, tree/d, tree/d/g.
    dir.create_dir_all("tree/d").await.expect("mkdir");
    dir.write("tree/f", b"f").await.expect("write");
    dir.write("tree/d/g", b"g").await.expect("write");
    dir.symlink("f", "tree/s").await.expect("symlink");
    assert_eq!(
        dir.copy("tree", "tree2", &recursive).await.expect("copy"),
        5
    );
    assert_eq!(dir.read("tree2/d/g").await.expect("read"), b"g");
}

/// Copying a directory without `recursive` is `is-a-directory`, and
/// leaves nothing behind.
async fn copying_a_directory_without_recursive_is_a_directory(ctx: Ctx) {
    let temp = TempDir::new("files-copy-dir");
    let dir = open(&ctx, &temp);
    dir.create_dir_all("tree/d").await.expect("mkdir");
    let (kind, message) = refused(dir.copy("tree", "copy", &CopyOptions::default()).await);
    assert_eq!(kind, RefusalKind::IsADirectory, "{message}");
    assert!(
        message.contains("is a directory (copy it with `recursive`)"),
        "{message}"
    );
    assert!(!dir.exists("copy").await.expect("exists"));
}

/// An upload whose total is not the size it announced is
/// `invalid-argument` and leaves the old file: fewer bytes fail `done`,
/// more fail by `done` at the latest.
async fn an_upload_whose_total_is_not_its_announced_size_is_invalid(ctx: Ctx) {
    let temp = TempDir::new("files-announced");
    let dir = open(&ctx, &temp);
    dir.write("f", b"old").await.expect("write");
    let sink = begin_upload(&dir, "f", Some(10), b"12345").await;
    let error = call_error(sink.done_request().send().promise.await);
    assert_eq!(
        error.refusal_kind(),
        Some(RefusalKind::InvalidArgument),
        "{error}"
    );
    assert!(
        error.to_string().contains(
            "upload \"f\": 5 bytes arrived, 10 were announced; the file was left as it was"
        ),
        "{error}"
    );
    let sink = begin_upload(&dir, "f", Some(3), b"123456").await;
    let error = call_error(sink.done_request().send().promise.await);
    assert_eq!(
        error.refusal_kind(),
        Some(RefusalKind::InvalidArgument),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("more than the 3 bytes announced; the file was left as it was"),
        "{error}"
    );
    assert_eq!(dir.read("f").await.expect("read"), b"old");
    assert_eq!(names(temp.path()), ["f"]);
}

/// `**` as a whole component of a walk's pattern matches zero or more
/// directories: `**/x` matches `x` at the top, `a/**/x` matches `a/x`;
/// `a/**` matches what is below `a`, not `a`.
async fn a_double_star_matches_zero_or_more_directories(ctx: Ctx) {
    let temp = TempDir::new("files-double-star");
    for path in ["x", "a/x", "a/b/x", "a/y"] {
        let path = temp.path().join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, b"").expect("write");
    }
    let dir = open(&ctx, &temp);
    let walked = |include: &[&str], exclude: &[&str]| {
        let dir = dir.clone();
        let options = WalkOptions {
            include: include.iter().map(|p| p.as_bytes().to_vec()).collect(),
            exclude: exclude.iter().map(|p| p.as_bytes().to_vec()).collect(),
            ..WalkOptions::default()
        };
        async move {
            let mut paths: Vec<String> = dir
                .walk("", &options)
                .await
                .collect_all()
                .await
                .expect("walk")
                .into_iter()
                .map(|entry| String::from_utf8(entry.path).expect("utf-8"))
                .collect();
            paths.sort();
            paths
        }
    };
    assert_eq!(walked(&["**/x"], &[]).await, ["a/b/x", "a/x", "x"]);
    assert_eq!(walked(&["a/**/x"], &[]).await, ["a/b/x", "a/x"]);
    assert_eq!(walked(&["a/**"], &[]).await, ["a/b", "a/b/x", "a/x", "a/y"]);
    assert_eq!(walked(&[], &["**/x"]).await, ["a", "a/b", "a/y"]);
}

fn search_for(pattern: &str) -> SearchOptions {
    SearchOptions {
        pattern: pattern.into(),
        ..SearchOptions::default()
    }
}

fn found(path: &str, line_number: u64, line: &[u8], start: u64, end: u64) -> SearchMatch {
    SearchMatch {
        path: path.as_bytes().to_vec(),
        line_number,
        line_bytes: line.len() as u64,
        text: line.to_vec(),
        text_offset: 0,
        match_start: start,
        match_end: end,
    }
}

/// Matches sorted by file and line (a search gives them in the file
/// system's order).
fn sorted(mut matches: Vec<SearchMatch>) -> Vec<SearchMatch> {
    matches.sort_by(|a, b| (&a.path, a.line_number).cmp(&(&b.path, b.line_number)));
    matches
}

async fn a_search_matches_lines_on_the_executor_and_skips_what_it_says(ctx: Ctx) {
    let temp = TempDir::new("files-search");
    let outside = TempDir::new("files-search-outside");
    std::fs::write(outside.path().join("secret"), b"alpha outside\n").expect("write");
    let root = temp.path();
    std::fs::create_dir_all(root.join("sub/deep")).expect("mkdir");
    std::fs::write(root.join("a.txt"), b"alpha\nbeta\nAlpha beta\n").expect("write");
    std::fs::write(root.join("sub/b.rs"), b"fn main() {}\nlet alpha = 1;").expect("write");
    std::fs::write(root.join("sub/deep/c.txt"), b"nothing\n").expect("write");
    std::fs::write(root.join("bin.dat"), b"alpha\0binary").expect("write");
    std::fs::write(root.join("latin.txt"), b"\xffalpha\n").expect("write");
    let big = "alpha\n".repeat(MAX_SEARCH_FILE_BYTES as usize / 6 + 1);
    std::fs::write(root.join("big.txt"), &big).expect("write");
    let long = format!("{}alpha{}", "x".repeat(1000), "y".repeat(1000));
    std::fs::write(root.join("long.txt"), &long).expect("write");
    symlink(outside.path().join("secret"), root.join("link")).expect("symlink");
    symlink(outside.path(), root.join("link-dir")).expect("symlink");
    let dir = open(&ctx, &temp);

    let result = dir.search("", &search_for("alpha")).await.expect("search");
    assert_eq!(
        sorted(result.matches),
        vec![
            found("a.txt", 1, b"alpha", 0, 5),
            found("latin.txt", 1, b"\xffalpha", 1, 6),
            SearchMatch {
                path: b"long.txt".to_vec(),
                line_number: 1,
                line_bytes: 2005,
                text: long.as_bytes()[872..1384].to_vec(),
                text_offset: 872,
                match_start: 1000,
                match_end: 1005,
            },
            found("sub/b.rs", 2, b"let alpha = 1;", 4, 9),
        ]
    );
    // Symlinks (to a file or a directory outside) are never followed.
    assert_eq!(result.files_searched, 5);
    assert_eq!(result.binary_skipped, 1);
    assert_eq!(result.too_large_skipped, 1);
    assert_eq!((result.unreadable, result.first_error), (0, None));
    assert!(!result.truncated);

    // Case, globs, a subdirectory, and the bound.
    let options = SearchOptions {
        case_insensitive: true,
        include: vec![b"*.txt".to_vec()],
        ..search_for("ALPHA b")
    };
    let result = dir.search("", &options).await.expect("search");
    assert_eq!(result.matches, vec![found("a.txt", 3, b"Alpha beta", 0, 7)]);
    let options = SearchOptions {
        include: vec![b"**/*.rs".to_vec()],
        ..search_for("a")
    };
    let result = dir.search("", &options).await.expect("search");
    assert_eq!(
        result.matches,
        vec![
            found("sub/b.rs", 1, b"fn main() {}", 4, 5),
            found("sub/b.rs", 2, b"let alpha = 1;", 4, 5),
        ]
    );
    let result = dir
        .search("sub", &search_for("^[a-z]+$"))
        .await
        .expect("search");
    assert_eq!(
        result.matches,
        vec![found("deep/c.txt", 1, b"nothing", 0, 7)]
    );
    let options = SearchOptions {
        exclude: vec![b"sub".to_vec(), b"big.txt".to_vec()],
        max_matches: 2,
        ..search_for(".")
    };
    let result = dir.search("", &options).await.expect("search");
    assert_eq!(result.matches.len(), 2);
    assert!(result.truncated);
    assert!(result.matches.iter().all(|m| !m.path.starts_with(b"sub")));

    // More files than one step of the executor's takes (256): every one
    // searched, every match found.
    std::fs::create_dir(root.join("many")).expect("mkdir");
    for n in 0..300 {
        std::fs::write(
            root.join(format!("many/{n:03}")),
            format!("x\nfile {n:03}\n"),
        )
        .expect("write");
    }
    let result = dir
        .search("many", &search_for("^file"))
        .await
        .expect("search");
    assert_eq!(result.files_searched, 300);
    let mut lines: Vec<_> = result
        .matches
        .iter()
        .map(|m| (m.path.clone(), m.line_number, m.text.clone()))
        .collect();
    lines.sort();
    let expected: Vec<_> = (0..300)
        .map(|n| {
            (
                format!("{n:03}").into_bytes(),
                2,
                format!("file {n:03}").into_bytes(),
            )
        })
        .collect();
    assert_eq!(lines, expected);

    // Refusals: a malformed pattern before anything is read, a path out.
    let (kind, message) = refused(dir.search("", &search_for("a(b")).await);
    assert_eq!(kind, RefusalKind::InvalidArgument);
    assert_eq!(message, "search \".\": pattern \"a(b\": unclosed group");
    let options = SearchOptions {
        include: vec![b"[".to_vec()],
        ..search_for("a")
    };
    let (kind, message) = refused(dir.search("sub", &options).await);
    assert_eq!(kind, RefusalKind::InvalidArgument);
    assert!(
        message.starts_with("search \"sub\": pattern \"[\": "),
        "{message}"
    );
    assert_eq!(
        kind_of(dir.search("..", &search_for("a")).await),
        RefusalKind::OutsideDirectory
    );
    assert_eq!(
        kind_of(dir.search("link-dir", &search_for("a")).await),
        RefusalKind::OutsideDirectory
    );
}

backend_tests!(
    a_search_matches_lines_on_the_executor_and_skips_what_it_says,
    a_download_to_a_sink_that_never_reads_holds_back_only_itself,
    binary_files_round_trip_byte_exact_small_and_large,
    ranges_read_exactly_the_bytes_asked,
    atomic_writes_are_never_torn_for_a_concurrent_reader,
    aborted_uploads_leave_the_old_file_and_no_temporary,
    a_write_with_a_stale_version_conflicts,
    every_escape_is_refused,
    no_call_crosses_a_mount_point_beneath_the_directory,
    a_symlink_swapped_in_while_calls_run_never_leads_out,
    read_only_directories_refuse_every_mutation,
    a_watch_sees_creation_modification_removal_and_renames,
    a_client_too_slow_for_its_watch_gets_an_overflow,
    a_huge_listing_is_streamed_in_batches,
    walks_filter_and_limit_depth,
    tree_calls_do_what_std_fs_does,
    errors_name_the_call_the_path_and_the_reason,
    limits_are_refused_with_limit,
    a_batch_of_writes_has_an_outcome_per_file,
    a_batch_of_reads_has_an_outcome_per_file,
    a_restricted_executor_hands_out_directories_only_in_its_roots,
    a_copy_counts_every_entry_it_copied_the_top_one_included,
    trees_of_any_depth_are_copied_to_a_bound_removed_and_made,
    copying_a_directory_without_recursive_is_a_directory,
    an_upload_whose_total_is_not_its_announced_size_is_invalid,
    a_double_star_matches_zero_or_more_directories,
);

mod network {
    backend_tests!(on [unix, tcp]: a_cut_connection_mid_upload_leaves_the_old_file);
    use super::a_cut_connection_mid_upload_leaves_the_old_file;
}
