//! Watching a tree with inotify: one instance and one thread per watch,
//! translating the kernel's events into `WatchEvent`s relative to the
//! watched directory, with renames paired, capexec's own temporaries
//! hidden (an atomic replace reads as `modified`), new subdirectories of a
//! recursive watch watched as they appear, and an explicit `overflow`
//! wherever events were lost: the kernel's queue overflowed
//! (IN_Q_OVERFLOW), or the client let [`MAX_PENDING_WATCH_EVENTS`] wait.
//!
//! Watches are added through /proc/self/fd of a descriptor opened beneath
//! the directory, so inotify never resolves a path of its own.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rustix::event::{EventfdFlags, PollFd, PollFlags};
use rustix::fs::inotify::{self, ReadFlags, WatchFlags};
use rustix::fs::{Dir, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::files::error::{failed, refused};
use crate::files::resolve::{checked, open_beneath, proc_path};
use crate::files::tree::joined;
use crate::files::write::TEMP_PREFIX;
use crate::model::{
    MAX_PENDING_WATCH_EVENTS, MAX_WALK_DEPTH, Refusal, RefusalKind, WatchEvent, WatchEventKind,
};

const MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::CLOSE_WRITE)
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::EXCL_UNLINK)
    .union(WatchFlags::ONLYDIR);

/// Events waiting for the client, shared by the watch thread and the
/// receiver.
struct Queue {
    events: VecDeque<WatchEvent>,
    /// Events were dropped since the last one queued: an `overflow` goes
    /// first when there is room again (or when the queue has drained).
    lost: bool,
    /// The thread has ended; after the queue, nothing more comes.
    ended: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: tokio::sync::Notify,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn deliver(&self, events: Vec<WatchEvent>) {
        if events.is_empty() {
            return;
        }
        {
            let mut queue = self.lock();
            for event in events {
                if queue.events.len() >= MAX_PENDING_WATCH_EVENTS {
                    queue.lost = true;
                    continue;
                }
                if queue.lost && event.kind != WatchEventKind::Overflow {
                    queue.lost = false;
                    queue.events.push_back(WatchEvent::overflow());
                }
                queue.events.push_back(event);
            }
        }
        self.ready.notify_one();
    }

    fn end(&self) {
        self.lock().ended = true;
        self.ready.notify_one();
    }
}

/// A watch in place; dropping it ends the watch thread.
pub struct Watcher {
    shared: Arc<Shared>,
    stop: Arc<OwnedFd>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = rustix::io::write(&*self.stop, &1u64.to_ne_bytes());
    }
}

impl Watcher {
    /// Watches directory `path` beneath `dir` (blocking: adding the watches
    /// of a recursive watch walks the tree).
    pub fn start(dir: impl AsFd, path: &[u8], recursive: bool) -> Result<Watcher, Refusal> {
        const OP: &str = "watch";
        let fail = |errno| failed(OP, path, errno);
        let root = open_beneath(
            dir,
            checked(OP, path)?,
            OFlags::PATH | OFlags::DIRECTORY,
            Mode::empty(),
            ResolveFlags::empty(),
        )
        .map_err(fail)?;
        let inotify = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)
            .map_err(|errno| match errno {
                Errno::MFILE => refused(
                    RefusalKind::LimitReached,
                    OP,
                    path,
                    "the server's user has no inotify instance left \
                     (fs.inotify.max_user_instances)",
                ),
                errno => fail(errno),
            })?;
        let stop = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(fail)?;
        let mut tree = Tree {
            inotify,
            root,
            recursive,
            paths: HashMap::new(),
        };
        let root_wd = tree.add(Path::new(".")).map_err(|errno| match errno {
            Errno::NOSPC => refused(
                RefusalKind::LimitReached,
                OP,
                path,
                "the server's user has no inotify watch left (fs.inotify.max_user_watches)",
            ),
            errno => fail(errno),
        })?;
        tree.paths.insert(root_wd, Vec::new());
        if recursive {
            let mut ignored = Vec::new();
            tree.scan(Vec::new(), 1, &mut ignored);
        }
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                events: VecDeque::new(),
                lost: false,
                ended: false,
            }),
            ready: tokio::sync::Notify::new(),
        });
        let stop = Arc::new(stop);
        let thread_shared = Arc::clone(&shared);
        let thread_stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("capexec-watch".to_string())
            .spawn(move || {
                run(tree, root_wd, &thread_shared, &thread_stop);
                thread_shared.end();
            })
            .map_err(|error| {
                refused(
                    RefusalKind::Internal,
                    OP,
                    path,
                    crate::model::io_message(&error),
                )
            })?;
        Ok(Watcher { shared, stop })
    }

    /// The next events (at most `max`), waiting for some; `None` once the
    /// watch has ended and everything was taken.
    pub async fn next(&self, max: usize) -> Option<Vec<WatchEvent>> {
        loop {
            let notified = self.shared.ready.notified();
            {
                let mut queue = self.shared.lock();
                if !queue.events.is_empty() {
                    let count = queue.events.len().min(max);
                    let batch: Vec<WatchEvent> = queue.events.drain(..count).collect();
                    return Some(coalesce(batch));
                }
                if queue.lost {
                    queue.lost = false;
                    return Some(vec![WatchEvent::overflow()]);
                }
                if queue.ended {
                    return None;
                }
            }
            notified.await;
        }
    }
}

/// Repeated `modified` events of one path with nothing about it between
/// them become one.
pub fn coalesce(events: Vec<WatchEvent>) -> Vec<WatchEvent> {
    let mut out: Vec<WatchEvent> = Vec::with_capacity(events.len());
    let mut last_modified: HashMap<Vec<u8>, usize> = HashMap::new();
    for event in events {
        if event.kind == WatchEventKind::Modified {
            if last_modified.contains_key(&event.path) {
                continue;
            }
            last_modified.insert(event.path.clone(), out.len());
        } else {
            last_modified.remove(&event.path);
            if event.kind == WatchEventKind::Renamed {
                last_modified.remove(&event.to_path);
            }
        }
        out.push(event);
    }
    out
}

/// The watched tree: which watch descriptor is which directory.
struct Tree {
    inotify: OwnedFd,
    root: OwnedFd,
    recursive: bool,
    paths: HashMap<i32, Vec<u8>>,
}

impl Tree {
    fn add(&self, relative: &Path) -> Result<i32, Errno> {
        let fd = open_beneath(
            &self.root,
            relative,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS,
        )?;
        inotify::add_watch(&self.inotify, proc_path(&fd).as_str(), MASK)
    }

    /// Watches the subdirectories of `prefix` (already watched), reporting
    /// their entries as `created` into `found` (for a directory that
    /// appeared after the watch began, its entries made before its own
    /// watch was in place).
    fn scan(&mut self, prefix: Vec<u8>, depth: u32, found: &mut Vec<WatchEvent>) {
        if depth > MAX_WALK_DEPTH {
            return;
        }
        let dot: &[u8] = if prefix.is_empty() { b"." } else { &prefix };
        let Ok(fd) = open_beneath(
            &self.root,
            Path::new(OsStr::from_bytes(dot)),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS,
        ) else {
            return;
        };
        let Ok(mut dir) = Dir::new(fd) else {
            return;
        };
        let mut subdirectories = Vec::new();
        while let Some(Ok(entry)) = dir.read() {
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." || hidden(name) {
                continue;
            }
            let path = joined(&prefix, name);
            let is_directory = entry.file_type() == rustix::fs::FileType::Directory;
            found.push(WatchEvent {
                kind: WatchEventKind::Created,
                path: path.clone(),
                to_path: Vec::new(),
                is_directory,
            });
            if is_directory {
                subdirectories.push(path);
            }
        }
        for path in subdirectories {
            if let Ok(wd) = self.add(Path::new(OsStr::from_bytes(&path))) {
                self.paths.insert(wd, path.clone());
                self.scan(path, depth + 1, found);
            }
        }
    }

    /// After a directory of the tree was renamed from `from` to `to`.
    fn moved(&mut self, from: &[u8], to: &[u8]) {
        for path in self.paths.values_mut() {
            if path.as_slice() == from {
                *path = to.to_vec();
            } else if path.starts_with(from) && path.get(from.len()) == Some(&b'/') {
                let mut renamed = to.to_vec();
                renamed.extend_from_slice(&path[from.len()..]);
                *path = renamed;
            }
        }
    }
}

/// capexec's own temporaries (see `write.rs`), whose events would only
/// confuse: their renames onto a target read as `modified`.
fn hidden(name: &[u8]) -> bool {
    name.starts_with(TEMP_PREFIX.as_bytes()) && name.ends_with(b".tmp")
}

/// The name the kernel gives a file without one (O_TMPFILE) while it is
/// linked into place ("#" and its inode number): its attribute change
/// is the link itself, reported as the creation or replacement it makes.
fn unnamed(name: &[u8]) -> bool {
    name.len() > 1 && name[0] == b'#' && name[1..].iter().all(u8::is_ascii_digit)
}

/// One kernel event, as read.
struct Raw {
    wd: i32,
    flags: ReadFlags,
    cookie: u32,
    name: Vec<u8>,
}

fn run(mut tree: Tree, root_wd: i32, shared: &Shared, stop: &OwnedFd) {
    let mut buffer = vec![std::mem::MaybeUninit::<u8>::uninit(); 64 * 1024];
    loop {
        let mut fds = [
            PollFd::new(&tree.inotify, PollFlags::IN),
            PollFd::new(stop, PollFlags::IN),
        ];
        // The watch's own descriptor of the directory keeps its inode,
        // so the kernel reports its removal (IN_DELETE_SELF) only once
        // that closes: a removed directory (no links left) is noticed
        // here instead, within a poll's timeout.
        let timeout = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 250_000_000,
        };
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(_) => return,
        }
        if !fds[1].revents().is_empty() {
            return;
        }
        if fds[0].revents().is_empty() {
            if rustix::fs::fstat(&tree.root).is_ok_and(|stat| stat.st_nlink == 0) {
                shared.deliver(vec![event_of(WatchEventKind::Gone, Vec::new(), true)]);
                return;
            }
            continue;
        }
        let mut raw = Vec::new();
        {
            let mut reader = inotify::Reader::new(&tree.inotify, &mut buffer);
            loop {
                match reader.next() {
                    Ok(event) => raw.push(Raw {
                        wd: event.wd(),
                        flags: event.events(),
                        cookie: event.cookie(),
                        name: event
                            .file_name()
                            .map(|name| name.to_bytes().to_vec())
                            .unwrap_or_default(),
                    }),
                    Err(Errno::AGAIN | Errno::INTR) => break,
                    Err(_) => return,
                }
                if reader.is_buffer_empty() && raw.len() >= 4096 {
                    break;
                }
            }
        }
        let (events, gone) = translate(&mut tree, root_wd, raw);
        shared.deliver(events);
        if gone {
            return;
        }
    }
}

/// The events `raw` means; `true` once the watched directory is gone.
fn translate(tree: &mut Tree, root_wd: i32, raw: Vec<Raw>) -> (Vec<WatchEvent>, bool) {
    let mut out = Vec::new();
    let mut pending_move: Option<(u32, Vec<u8>, bool, bool)> = None;
    for event in raw {
        let flags = event.flags;
        if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
            out.push(WatchEvent::overflow());
            continue;
        }
        let Some(dir_path) = tree.paths.get(&event.wd).cloned() else {
            continue;
        };
        let is_directory = flags.contains(ReadFlags::ISDIR);
        let path = if event.name.is_empty() {
            dir_path.clone()
        } else {
            joined(&dir_path, &event.name)
        };
        if flags.contains(ReadFlags::MOVED_TO)
            && let Some((cookie, from, from_hidden, _)) =
                pending_move.take_if(|m| m.0 == event.cookie)
        {
            let _ = cookie;
            if from_hidden {
                out.push(event_of(WatchEventKind::Modified, path, is_directory));
            } else {
                if is_directory && tree.recursive {
                    tree.moved(&from, &path);
                }
                out.push(WatchEvent {
                    kind: WatchEventKind::Renamed,
                    path: from,
                    to_path: path,
                    is_directory,
                });
            }
            continue;
        }
        if let Some((_, from, from_hidden, was_directory)) = pending_move.take()
            && !from_hidden
        {
            out.push(event_of(WatchEventKind::Removed, from, was_directory));
        }
        if flags.intersects(ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF) {
            if event.wd == root_wd {
                out.push(event_of(WatchEventKind::Gone, Vec::new(), true));
                return (out, true);
            }
            continue;
        }
        if flags.contains(ReadFlags::IGNORED) {
            tree.paths.remove(&event.wd);
            continue;
        }
        if unnamed(&event.name) && flags.contains(ReadFlags::ATTRIB) {
            continue;
        }
        if hidden(&event.name) {
            if flags.contains(ReadFlags::MOVED_FROM) {
                pending_move = Some((event.cookie, path, true, is_directory));
            }
            continue;
        }
        if flags.contains(ReadFlags::MOVED_FROM) {
            pending_move = Some((event.cookie, path, false, is_directory));
            continue;
        }
        let kind = if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
            WatchEventKind::Created
        } else if flags.contains(ReadFlags::DELETE) {
            WatchEventKind::Removed
        } else if flags.intersects(ReadFlags::MODIFY | ReadFlags::CLOSE_WRITE) {
            WatchEventKind::Modified
        } else if flags.contains(ReadFlags::ATTRIB) {
            WatchEventKind::Attributes
        } else {
            continue;
        };
        out.push(event_of(kind, path.clone(), is_directory));
        if kind == WatchEventKind::Created && is_directory && tree.recursive {
            let relative = Path::new(OsStr::from_bytes(&path));
            if let Ok(wd) = tree.add(relative) {
                tree.paths.insert(wd, path.clone());
                tree.scan(path, depth_of(&dir_path) + 2, &mut out);
            }
        }
    }
    if let Some((_, from, from_hidden, was_directory)) = pending_move.take()
        && !from_hidden
    {
        out.push(event_of(WatchEventKind::Removed, from, was_directory));
    }
    (out, false)
}

fn depth_of(path: &[u8]) -> u32 {
    if path.is_empty() {
        0
    } else {
        path.iter().filter(|&&b| b == b'/').count() as u32 + 1
    }
}

fn event_of(kind: WatchEventKind, path: Vec<u8>, is_directory: bool) -> WatchEvent {
    WatchEvent {
        kind,
        path,
        to_path: Vec::new(),
        is_directory,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modified(path: &str) -> WatchEvent {
        event_of(WatchEventKind::Modified, path.as_bytes().to_vec(), false)
    }

    #[test]
    fn repeated_modifications_coalesce_until_something_else_happens() {
        let removed = event_of(WatchEventKind::Removed, b"a".to_vec(), false);
        let events = vec![
            modified("a"),
            modified("b"),
            modified("a"),
            removed.clone(),
            modified("a"),
        ];
        assert_eq!(
            coalesce(events),
            vec![modified("a"), modified("b"), removed, modified("a")]
        );
    }

    #[test]
    fn a_kernel_overflow_reaches_the_client_and_so_does_a_slow_clients_loss() {
        let shared = Shared {
            queue: Mutex::new(Queue {
                events: VecDeque::new(),
                lost: false,
                ended: false,
            }),
            ready: tokio::sync::Notify::new(),
        };
        let events: Vec<WatchEvent> = (0..MAX_PENDING_WATCH_EVENTS + 10)
            .map(|i| modified(&i.to_string()))
            .collect();
        shared.deliver(events);
        shared.deliver(vec![modified("late")]);
        let queue = shared.lock();
        assert_eq!(queue.events.len(), MAX_PENDING_WATCH_EVENTS);
        assert!(queue.lost, "the loss is remembered");
        drop(queue);
        // The kernel's own overflow flag becomes an overflow event.
        let raw = vec![Raw {
            wd: -1,
            flags: ReadFlags::QUEUE_OVERFLOW,
            cookie: 0,
            name: Vec::new(),
        }];
        let inotify = inotify::init(inotify::CreateFlags::CLOEXEC).expect("inotify");
        let root = rustix::fs::open(".", OFlags::PATH, Mode::empty()).expect("open .");
        let mut tree = Tree {
            inotify,
            root,
            recursive: false,
            paths: HashMap::new(),
        };
        let (events, gone) = translate(&mut tree, 1, raw);
        assert_eq!(events, vec![WatchEvent::overflow()]);
        assert!(!gone);
    }
}

#[cfg(test)]
mod live_tests {
    use super::*;

    #[tokio::test]
    async fn a_file_created_is_reported() {
        let dir = std::env::temp_dir().join(format!("capexec-watch-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("mkdir");
        let fd =
            rustix::fs::open(&dir, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).expect("open");
        let watcher = Watcher::start(&fd, b"", true).expect("watch");
        std::fs::write(dir.join("a"), b"1").expect("write");
        let events = tokio::time::timeout(std::time::Duration::from_secs(10), watcher.next(100))
            .await
            .expect("in time")
            .expect("events");
        assert_eq!(events[0].kind, WatchEventKind::Created, "{events:?}");
        assert_eq!(events[0].path, b"a");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
