//! Watching trees with inotify: one instance and one thread for every
//! watch of the process (the `Hub`), translating the kernel's events into
//! `WatchEvent`s relative to each watched directory, with renames paired,
//! capexec's own temporaries hidden (an atomic replace reads as
//! `modified`), new subdirectories of a recursive watch watched as they
//! appear, and an explicit `overflow` wherever events were lost: the
//! kernel's queue overflowed (IN_Q_OVERFLOW), the client let
//! [`MAX_PENDING_WATCH_EVENTS`] wait, or a directory could not be watched
//! because the server's share of inotify watches is used up.
//!
//! The server's user has a limit of inotify instances (128 by default) and
//! of watches (`fs.inotify.max_user_watches`) for all its programs: one
//! instance per watch let four clients take every instance, and ten
//! recursive watches every watch. So the process uses one instance, and
//! its watches together hold at most half the user's watches
//! ([`watch_budget`]); a directory watched by several watches is one
//! kernel watch, counted once.
//!
//! Watches are added through /proc/self/fd of a descriptor opened beneath
//! the directory, so inotify never resolves a path of its own.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use rustix::event::{PollFd, PollFlags};
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

static BUDGET: OnceLock<usize> = OnceLock::new();

/// The share of the user's inotify watches this process's watches may
/// hold together: half of `fs.inotify.max_user_watches`, so that the
/// user's other programs keep the rest, unless [`limit_watches`] said.
pub fn watch_budget() -> usize {
    *BUDGET.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
            .ok()
            .and_then(|text| text.trim().parse::<usize>().ok())
            .map_or(4096, |max| (max / 2).max(1))
    })
}

/// Sets [`watch_budget`] to `max` (before the first watch; later, it has
/// no effect).
pub fn limit_watches(max: usize) {
    let _ = BUDGET.set(max);
}

/// The process's one inotify instance, its thread, and every watch.
struct Hub {
    inotify: OwnedFd,
    state: Mutex<HubState>,
}

#[derive(Default)]
struct HubState {
    watches: HashMap<u64, Watch>,
    /// Which watches each kernel watch serves (a directory watched by
    /// several is one kernel watch).
    by_wd: HashMap<i32, Vec<u64>>,
    next_id: u64,
}

/// One watch: its tree and where its events go.
struct Watch {
    tree: Tree,
    root_wd: i32,
    shared: Arc<Shared>,
}

impl Hub {
    /// The hub, started on first use; `Err` if the kernel gives no
    /// instance (the user has none left) or no thread.
    fn get() -> Result<&'static Hub, Errno> {
        // Not a OnceLock of the outcome: a first watch refused for want of
        // an instance must not refuse every later one.
        static HUB: Mutex<Option<&'static Hub>> = Mutex::new(None);
        let mut hub = HUB.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(hub) = *hub {
            return Ok(hub);
        }
        let inotify =
            inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)?;
        let started: &'static Hub = Box::leak(Box::new(Hub {
            inotify,
            state: Mutex::new(HubState::default()),
        }));
        std::thread::Builder::new()
            .name("capexec-watch".to_string())
            .spawn(move || started.run())
            .map_err(|_| Errno::AGAIN)?;
        *hub = Some(started);
        Ok(started)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HubState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Reads and delivers events for ever.
    fn run(&self) {
        let mut buffer = vec![std::mem::MaybeUninit::<u8>::uninit(); 64 * 1024];
        loop {
            let mut fds = [PollFd::new(&self.inotify, PollFlags::IN)];
            // A watch's own descriptor of its directory keeps the inode, so
            // the kernel reports its removal (IN_DELETE_SELF) only once that
            // closes: a removed directory (no links left) is noticed here
            // instead, within a poll's timeout.
            let timeout = rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 250_000_000,
            };
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(_) | Err(Errno::INTR) => {}
                Err(_) => {
                    std::thread::sleep(std::time::Duration::from_millis(250));
                    continue;
                }
            }
            if fds[0].revents().is_empty() {
                self.notice_removed_roots();
                continue;
            }
            let raw = read_batch(
                || self.read_available(&mut buffer),
                |left| {
                    let mut fds = [PollFd::new(&self.inotify, PollFlags::IN)];
                    let timeout = rustix::event::Timespec {
                        tv_sec: left.as_secs() as i64,
                        tv_nsec: i64::from(left.subsec_nanos()),
                    };
                    matches!(rustix::event::poll(&mut fds, Some(&timeout)), Ok(n) if n > 0)
                },
            );
            self.deliver(raw);
        }
    }

    /// Every event the instance holds now (at most about 4096).
    fn read_available(&self, buffer: &mut [std::mem::MaybeUninit<u8>]) -> Vec<Raw> {
        let mut raw = Vec::new();
        let mut reader = inotify::Reader::new(&self.inotify, buffer);
        // Until the instance has nothing more (EAGAIN) or fails.
        while let Ok(event) = reader.next() {
            raw.push(Raw {
                wd: event.wd(),
                flags: event.events(),
                cookie: event.cookie(),
                name: event
                    .file_name()
                    .map(|name| name.to_bytes().to_vec())
                    .unwrap_or_default(),
            });
            if reader.is_buffer_empty() && raw.len() >= 4096 {
                break;
            }
        }
        raw
    }

    /// Hands each watch the events of its kernel watches (and every
    /// overflow), translated.
    fn deliver(&self, raw: Vec<Raw>) {
        let mut state = self.lock();
        let mut ended = Vec::new();
        // Each watch's events, in the kernel's order: those of its kernel
        // watches, and every overflow.
        let mut by_watch: HashMap<u64, Vec<Raw>> = HashMap::new();
        for event in &raw {
            if event.flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                for id in state.watches.keys() {
                    by_watch.entry(*id).or_default().push(event.clone());
                }
            } else if let Some(ids) = state.by_wd.get(&event.wd) {
                for id in ids {
                    by_watch.entry(*id).or_default().push(event.clone());
                }
            }
        }
        for (id, mine) in by_watch {
            let (events, gone) = {
                let HubState { watches, by_wd, .. } = &mut *state;
                let Some(watch) = watches.get_mut(&id) else {
                    continue;
                };
                let mut adder = Adder {
                    inotify: &self.inotify,
                    by_wd,
                    id,
                };
                translate(&mut watch.tree, watch.root_wd, mine, &mut adder)
            };
            if let Some(watch) = state.watches.get(&id) {
                watch.shared.deliver(events);
            }
            if gone {
                ended.push(id);
            }
        }
        // A kernel watch the kernel dropped (its directory removed) serves
        // nobody any more.
        for event in &raw {
            if event.flags.contains(ReadFlags::IGNORED) {
                state.by_wd.remove(&event.wd);
            }
        }
        for id in ended {
            self.end(&mut state, id);
        }
    }

    fn notice_removed_roots(&self) {
        let mut state = self.lock();
        let removed: Vec<u64> = state
            .watches
            .iter()
            .filter(|(_, watch)| {
                rustix::fs::fstat(&watch.tree.root).is_ok_and(|stat| stat.st_nlink == 0)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in removed {
            if let Some(watch) = state.watches.get(&id) {
                watch
                    .shared
                    .deliver(vec![event_of(WatchEventKind::Gone, Vec::new(), true)]);
            }
            self.end(&mut state, id);
        }
    }

    /// Ends watch `id`: its queue says so, and the kernel watches only it
    /// used are removed.
    fn end(&self, state: &mut HubState, id: u64) {
        let Some(watch) = state.watches.remove(&id) else {
            return;
        };
        watch.shared.end();
        for wd in watch.tree.paths.keys() {
            if let Some(ids) = state.by_wd.get_mut(wd) {
                ids.retain(|other| *other != id);
                if ids.is_empty() {
                    state.by_wd.remove(wd);
                    let _ = inotify::remove_watch(&self.inotify, *wd);
                }
            }
        }
    }
}

/// Adds kernel watches for one watch, within the process's budget.
struct Adder<'a> {
    inotify: &'a OwnedFd,
    by_wd: &'a mut HashMap<i32, Vec<u64>>,
    id: u64,
}

impl Adder<'_> {
    /// Watches `relative` beneath `root` for this watch; ENOSPC when the
    /// budget or the user's limit is reached.
    fn add(&mut self, root: &OwnedFd, relative: &Path) -> Result<i32, Errno> {
        let fd = open_beneath(
            root,
            relative,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS,
        )?;
        if self.by_wd.len() >= watch_budget() {
            // Perhaps the kernel already watches it (then it costs none),
            // but finding out would add it: refuse.
            return Err(Errno::NOSPC);
        }
        let wd = inotify::add_watch(self.inotify, proc_path(&fd).as_str(), MASK)?;
        let ids = self.by_wd.entry(wd).or_default();
        if !ids.contains(&self.id) {
            ids.push(self.id);
        }
        Ok(wd)
    }
}

/// A watch in place; dropping it ends it.
pub struct Watcher {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if let Ok(hub) = Hub::get() {
            let mut state = hub.lock();
            hub.end(&mut state, self.id);
        }
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
        let hub = Hub::get().map_err(|errno| match errno {
            Errno::MFILE => refused(
                RefusalKind::LimitReached,
                OP,
                path,
                "the server's user has no inotify instance left \
                 (fs.inotify.max_user_instances)",
            ),
            errno => fail(errno),
        })?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                events: VecDeque::new(),
                lost: false,
                ended: false,
            }),
            ready: tokio::sync::Notify::new(),
        });
        let mut state = hub.lock();
        let id = state.next_id;
        state.next_id += 1;
        let mut tree = Tree {
            root,
            recursive,
            paths: HashMap::new(),
        };
        let added = Adder {
            inotify: &hub.inotify,
            by_wd: &mut state.by_wd,
            id,
        }
        .add(&tree.root, Path::new("."));
        let root_wd = match added {
            Ok(wd) => wd,
            Err(Errno::NOSPC) => {
                return Err(refused(
                    RefusalKind::LimitReached,
                    OP,
                    path,
                    format!(
                        "the server's watches already hold its share of {} inotify watches \
                         (capexec serve --max-inotify-watches; by default half of \
                         fs.inotify.max_user_watches)",
                        watch_budget()
                    ),
                ));
            }
            Err(errno) => return Err(fail(errno)),
        };
        tree.paths.insert(root_wd, Vec::new());
        if recursive {
            let mut ignored = Vec::new();
            let mut adder = Adder {
                inotify: &hub.inotify,
                by_wd: &mut state.by_wd,
                id,
            };
            if tree.scan(Vec::new(), 1, &mut ignored, &mut adder) {
                // Some directories could not be watched: say so first.
                shared.deliver(vec![WatchEvent::overflow()]);
            }
        }
        state.watches.insert(
            id,
            Watch {
                tree,
                root_wd,
                shared: Arc::clone(&shared),
            },
        );
        Ok(Watcher { shared, id })
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
    root: OwnedFd,
    recursive: bool,
    paths: HashMap<i32, Vec<u8>>,
}

impl Tree {
    /// Watches the subdirectories of `prefix` (already watched), reporting
    /// their entries as `created` into `found` (for a directory that
    /// appeared after the watch began, its entries made before its own
    /// watch was in place). Whether some directory could not be watched
    /// for want of watches (its events will be missing).
    fn scan(
        &mut self,
        prefix: Vec<u8>,
        depth: u32,
        found: &mut Vec<WatchEvent>,
        adder: &mut Adder<'_>,
    ) -> bool {
        if depth > MAX_WALK_DEPTH {
            return false;
        }
        let dot: &[u8] = if prefix.is_empty() { b"." } else { &prefix };
        let Ok(fd) = open_beneath(
            &self.root,
            Path::new(OsStr::from_bytes(dot)),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS,
        ) else {
            return false;
        };
        let Ok(mut dir) = Dir::new(fd) else {
            return false;
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
        let mut missed = false;
        for path in subdirectories {
            match adder.add(&self.root, Path::new(OsStr::from_bytes(&path))) {
                Ok(wd) => {
                    self.paths.insert(wd, path.clone());
                    missed |= self.scan(path, depth + 1, found, adder);
                }
                Err(Errno::NOSPC) => missed = true,
                Err(_) => {}
            }
        }
        missed
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

/// How long a read that ends with the first half of a rename
/// (IN_MOVED_FROM) waits for the second (IN_MOVED_TO).
const MOVE_PAIRING_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// One batch of kernel events: what `read` gives, and, while it ends with
/// an IN_MOVED_FROM, what follows within [`MOVE_PAIRING_WAIT`] (`wait`
/// says whether more arrived within the time it is given).
///
/// The kernel queues a rename's two halves one after the other, not at
/// once: a read between them (the renaming thread preempted, which a
/// loaded machine makes likely) would see the first half alone, and
/// `translate` would report `removed` and `created` (or, for capexec's
/// own atomic replace, `created`) where the rename is one `renamed` (or a
/// `modified`), and a renamed directory's watched paths would go stale.
/// A move out of the tree has no second half: its `removed` comes after
/// the wait.
fn read_batch(
    mut read: impl FnMut() -> Vec<Raw>,
    mut wait: impl FnMut(std::time::Duration) -> bool,
) -> Vec<Raw> {
    let mut raw = read();
    let deadline = std::time::Instant::now() + MOVE_PAIRING_WAIT;
    while raw
        .last()
        .is_some_and(|event| event.flags.contains(ReadFlags::MOVED_FROM))
    {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || !wait(left) {
            break;
        }
        raw.extend(read());
    }
    raw
}

/// One kernel event, as read.
#[derive(Clone)]
struct Raw {
    wd: i32,
    flags: ReadFlags,
    cookie: u32,
    name: Vec<u8>,
}

/// The events `raw` means; `true` once the watched directory is gone.
fn translate(
    tree: &mut Tree,
    root_wd: i32,
    raw: Vec<Raw>,
    adder: &mut Adder<'_>,
) -> (Vec<WatchEvent>, bool) {
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
            let missed = match adder.add(&tree.root, relative) {
                Ok(wd) => {
                    tree.paths.insert(wd, path.clone());
                    tree.scan(path, depth_of(&dir_path) + 2, &mut out, adder)
                }
                Err(errno) => errno == Errno::NOSPC,
            };
            if missed {
                // Its events will not come: the client must look itself.
                out.push(WatchEvent::overflow());
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
            root,
            recursive: false,
            paths: HashMap::new(),
        };
        let mut by_wd = HashMap::new();
        let mut adder = Adder {
            inotify: &inotify,
            by_wd: &mut by_wd,
            id: 0,
        };
        let (events, gone) = translate(&mut tree, 1, raw, &mut adder);
        assert_eq!(events, vec![WatchEvent::overflow()]);
        assert!(!gone);
    }
    fn raw(flags: ReadFlags, cookie: u32, name: &str) -> Raw {
        Raw {
            wd: 1,
            flags,
            cookie,
            name: name.as_bytes().to_vec(),
        }
    }

    /// `translate` of `raw` in a tree whose root is kernel watch 1.
    fn translated(raw: Vec<Raw>) -> Vec<WatchEvent> {
        let inotify = inotify::init(inotify::CreateFlags::CLOEXEC).expect("inotify");
        let root = rustix::fs::open(".", OFlags::PATH, Mode::empty()).expect("open .");
        let mut tree = Tree {
            root,
            recursive: false,
            paths: HashMap::from([(1, Vec::new())]),
        };
        let mut by_wd = HashMap::new();
        let mut adder = Adder {
            inotify: &inotify,
            by_wd: &mut by_wd,
            id: 0,
        };
        translate(&mut tree, 1, raw, &mut adder).0
    }

    #[test]
    fn a_rename_read_in_two_halves_is_one_rename() {
        // The reader woke between the kernel's IN_MOVED_FROM and
        // IN_MOVED_TO of one rename: each read gives one half.
        let mut reads = vec![
            vec![raw(ReadFlags::MOVED_TO, 7, "c")],
            vec![raw(ReadFlags::MOVED_FROM, 7, "a")],
        ];
        let mut waits = 0;
        let batch = read_batch(
            || reads.pop().unwrap_or_default(),
            |_| {
                waits += 1;
                true
            },
        );
        assert_eq!(waits, 1);
        assert_eq!(
            translated(batch),
            vec![WatchEvent {
                kind: WatchEventKind::Renamed,
                path: b"a".to_vec(),
                to_path: b"c".to_vec(),
                is_directory: false,
            }]
        );
    }

    #[test]
    fn a_move_out_of_the_tree_is_a_removal_once_nothing_more_comes() {
        let mut reads = vec![vec![
            raw(ReadFlags::CREATE, 0, "x"),
            raw(ReadFlags::MOVED_FROM, 9, "a"),
        ]];
        let batch = read_batch(|| reads.pop().unwrap_or_default(), |_| false);
        assert_eq!(
            translated(batch),
            vec![
                event_of(WatchEventKind::Created, b"x".to_vec(), false),
                event_of(WatchEventKind::Removed, b"a".to_vec(), false),
            ]
        );
    }

    #[test]
    fn a_batch_not_ending_in_half_a_rename_waits_for_nothing() {
        let mut reads = vec![vec![raw(ReadFlags::CREATE, 0, "x")]];
        let batch = read_batch(
            || reads.pop().unwrap_or_default(),
            |_| panic!("waited although no rename was pending"),
        );
        assert_eq!(batch.len(), 1);
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
