//! Upgrades that end nothing: `capexec serve` re-executes itself, in the
//! same process, into the binary now at its path, handing over its
//! listeners and every detachable process (see `engine/handover.rs` and
//! `rpc/handover.rs`).
//!
//! In order: the new binary is asked first whether it can take this
//! hand-over (`serve --handover-check` must print [`HANDOVER_VERSION`]);
//! if not, nothing else happens and the server says why. Then the
//! listeners stop accepting (the sockets stay open: a client that
//! connects meanwhile waits in the backlog), every connection is closed
//! with [`UPGRADE_REASON`] (a resuming client reconnects and restores), the
//! engine freezes, and the state is written to a memfd: a little-endian
//! u64 length, the JSON state, then the bytes it names (logs, queued
//! stdin). The exec keeps the descriptors the state names open; the same
//! process (pid, children, cgroups) goes on as the new binary.

use std::ffi::{CString, OsString};
use std::io::{Read, Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;

use crate::engine::{Engine, ProcessState};
use crate::model::StartSpec;
use crate::rpc::DetachedState;

/// What a binary that can take this hand-over prints for
/// `serve --handover-check`; a state format change changes it.
pub const HANDOVER_VERSION: &str = "capexec-handover-1";

/// The name a handed-over metrics listener goes by.
pub(crate) const METRICS_NAME: &str = "metrics";

/// The reason the connections of an upgrading server are closed with.
pub const UPGRADE_REASON: &str = "the server is upgrading";

/// How long the new binary may take to answer `--handover-check`.
const CHECK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// One listening socket handed over.
#[derive(serde::Serialize, serde::Deserialize, Debug)]
pub(crate) struct ListenerState {
    /// `admin`, `metrics`, or `listener`.
    pub name: String,
    pub fd: RawFd,
    /// A Unix socket's file and the lock that keeps its path ours.
    pub file: Option<(PathBuf, RawFd)>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct State {
    version: String,
    /// The server's cgroup root and its sentinel, if it made one.
    cgroup_root: Option<crate::sandbox::RootState>,
    listeners: Vec<ListenerState>,
    processes: Vec<ProcessState>,
    detached: Vec<DetachedState>,
    /// Set when the exec of the new binary failed and this hand-over goes
    /// back to the binary that wrote it: why the new one did not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    failed_upgrade: Option<String>,
    /// Descriptors the binary before was to close when it upgraded, left
    /// open for this one to close off its serving thread (a close may
    /// wait on a pipe's lock, and the exec would have waited with it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    to_close: Vec<RawFd>,
}

impl HandedOver {
    /// Whether a descriptor the binary before left to close (maybe a
    /// client's) has a number below `below`.
    pub fn closes_below(&self, below: RawFd) -> bool {
        let to_close = self
            .to_close
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        to_close.iter().any(|fd| fd.as_raw_fd() < below)
    }
}

/// The hand-over the binary before left, read at start-up.
pub struct HandedOver {
    pub(crate) listeners: Vec<ListenerState>,
    /// Descriptors to close (`State::to_close`), owned here.
    pub(crate) to_close: Mutex<Vec<OwnedFd>>,
    taken: Mutex<Option<Processes>>,
    /// Why the upgrade that handed this over did not execute the new
    /// binary (this binary, the one before, took it back), if it did not.
    pub(crate) failed_upgrade: Option<String>,
}

/// The processes of a hand-over, and the bytes their states name.
pub(crate) struct Processes {
    pub processes: Vec<ProcessState>,
    pub detached: Vec<DetachedState>,
    pub blob: Bytes,
}

/// A listener as an upgrade hands it over (see `Server::serve_until_or_upgraded`).
pub(crate) struct HandedListener {
    pub name: String,
    /// A duplicate, open while the accept loop owns the original.
    pub fd: OwnedFd,
    /// A Unix socket's file and its lock's descriptor.
    pub file: Option<(PathBuf, RawFd)>,
}

impl std::fmt::Debug for HandedOver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandedOver")
            .field("listeners", &self.listeners)
            .finish_non_exhaustive()
    }
}

impl HandedOver {
    /// Reads the state the binary before wrote to `fd` (a memfd), and
    /// closes it.
    pub fn read(fd: OwnedFd) -> Result<HandedOver, String> {
        let mut file = std::fs::File::from(fd);
        file.rewind().map_err(|e| format!("the hand-over: {e}"))?;
        let mut length = [0u8; 8];
        file.read_exact(&mut length)
            .map_err(|e| format!("the hand-over's length: {e}"))?;
        let size = file
            .metadata()
            .map_err(|e| format!("the hand-over: {e}"))?
            .len();
        let length = u64::from_le_bytes(length);
        let length = usize::try_from(length)
            .ok()
            .filter(|&length| (length as u64) <= size.saturating_sub(8))
            .ok_or_else(|| {
                format!("the hand-over says {length} bytes of state, its file holds {size}")
            })?;
        let mut text = vec![0u8; length];
        file.read_exact(&mut text)
            .map_err(|e| format!("the hand-over's state: {e}"))?;
        let state: State =
            serde_json::from_slice(&text).map_err(|e| format!("the hand-over's state: {e}"))?;
        if state.version != HANDOVER_VERSION {
            return Err(format!(
                "the hand-over is {:?}, this binary takes {HANDOVER_VERSION:?}",
                state.version
            ));
        }
        if let Some(root) = state.cgroup_root {
            crate::sandbox::take_over_root(root)?;
        }
        let mut blob = Vec::new();
        file.read_to_end(&mut blob)
            .map_err(|e| format!("the hand-over's bytes: {e}"))?;
        Ok(HandedOver {
            listeners: state.listeners,
            // SAFETY: the binary before kept these open for this one, and
            // nothing else here owns them.
            to_close: Mutex::new(
                state
                    .to_close
                    .into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
                    .collect(),
            ),
            failed_upgrade: state.failed_upgrade,
            taken: Mutex::new(Some(Processes {
                processes: state.processes,
                detached: state.detached,
                blob: Bytes::from(blob),
            })),
        })
    }

    /// The processes handed over, and the descriptors they hold here: a
    /// server taking them over counts both as its processes', not as
    /// what it had open before it started.
    pub fn processes_held(&self) -> (u64, u64) {
        let taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        let processes = taken.as_ref().map_or(&[][..], |taken| &taken.processes[..]);
        (
            processes.len() as u64,
            processes.iter().map(|p| p.descriptors() as u64).sum(),
        )
    }

    /// The listeners handed over: their names and descriptors.
    pub fn listeners(&self) -> impl Iterator<Item = (&str, RawFd, Option<PathBuf>)> {
        self.listeners.iter().map(|l| {
            let path = l.file.as_ref().map(|(path, _)| path.clone());
            (l.name.as_str(), l.fd, path)
        })
    }

    /// The processes and their bytes, once.
    pub(crate) fn take(&self) -> Option<Processes> {
        self.taken.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// Waits for the closes in progress (`sys::close_in_background`) to end,
/// for as long as a close asleep on a lock must be seen so to count
/// ([`crate::engine::LOCK_HELD_FOR`]); how many did not, if any did not:
/// the exec would wait for each for as long as whoever holds the lock
/// likes.
pub(crate) async fn closes_end() -> Result<(), usize> {
    let until = std::time::Instant::now() + crate::engine::LOCK_HELD_FOR;
    while !crate::sys::no_close_in_progress() {
        if std::time::Instant::now() >= until {
            return Err(crate::sys::closing_for(std::time::Duration::ZERO).len());
        }
        tokio::time::sleep(crate::engine::LOCK_HELD_FOR / 8).await;
    }
    Ok(())
}

/// Asks the binary at `exe` whether it can take this hand-over, running
/// it as a process of `engine` (the server reaps every child itself).
pub(crate) async fn check(engine: &Engine, exe: &Path, args: &[OsString]) -> Result<(), String> {
    // With this server's own arguments, in its directory: the new binary
    // reads them as it will after the exec (its flags, the TLS
    // certificate and key, the policy) before it says yes.
    let mut argv = vec![exe.as_os_str().to_owned()];
    argv.extend(args.iter().cloned());
    argv.push("--handover-check".into());
    let mut spec = StartSpec::new(argv);
    spec.cwd = std::env::current_dir().ok();
    spec.timeout = Some(CHECK_PATIENCE);
    let owner = engine
        .start(&spec)
        .map_err(|refusal| format!("cannot run {}: {}", exe.display(), refusal.message))?;
    let process = owner.handle();
    let mut output = Vec::new();
    let mut after = 0;
    loop {
        let batch = process
            .next_batch(after, 0)
            .await
            .map_err(|e| format!("reading {}: {e}", exe.display()))?;
        if batch.events.is_empty() {
            break;
        }
        for event in batch.events {
            if let crate::model::EventBody::Output { data, .. } = event.body
                && output.len() < 4096
            {
                output.extend_from_slice(&data);
            }
        }
        after = batch.next_seq - 1;
    }
    let exit = process.exit();
    // Until its tree has ended too, so that the hand-over that may follow
    // has nothing of it to hand over.
    let (ended, tree_ended) = tokio::sync::oneshot::channel::<()>();
    process.hold_while_running(ended);
    let _ = tokio::time::timeout(CHECK_PATIENCE, tree_ended).await;
    let said = String::from_utf8_lossy(&output).trim().to_string();
    match exit {
        Some(exit)
            if exit.status == crate::model::ExitStatus::Code(0) && said == HANDOVER_VERSION =>
        {
            Ok(())
        }
        Some(exit) => Err(format!(
            "{} cannot take the hand-over: `serve --handover-check` ended with {} and said {:?} \
             (expected {HANDOVER_VERSION:?})",
            exe.display(),
            exit.status,
            said
        )),
        None => Err(format!(
            "{} did not answer `serve --handover-check`",
            exe.display()
        )),
    }
}

/// Writes the state down and re-executes `exe` with `args` plus
/// `--handover FD`, keeping `keep` open. Returns only if the exec failed.
pub(crate) fn exec(
    exe: &Path,
    args: &[OsString],
    listeners: Vec<ListenerState>,
    processes: Vec<ProcessState>,
    detached: Vec<DetachedState>,
    blob: &[u8],
    mut keep: Vec<RawFd>,
) -> String {
    let cgroup_root = crate::sandbox::root_for_handover();
    if let Some(root) = &cgroup_root {
        keep.extend([root.lock_fd(), root.sentinel_fd()]);
    }
    let mut state = State {
        version: HANDOVER_VERSION.to_string(),
        cgroup_root,
        listeners,
        processes,
        detached,
        failed_upgrade: None,
        // What the connections' ends left to close
        // (`sys::keep_closes_for_the_next_binary`): open across the exec,
        // as what is kept, and owned by nobody here any more.
        to_close: crate::sys::kept_for_the_next_binary()
            .into_iter()
            .map(IntoRawFd::into_raw_fd)
            .collect(),
    };
    keep.extend(&state.to_close);
    for listener in &state.listeners {
        keep.push(listener.fd);
        if let Some((_, lock)) = &listener.file {
            keep.push(*lock);
        }
    }
    let memfd = match write_state(&state, blob) {
        Ok(memfd) => memfd,
        Err(error) => return format!("cannot write the hand-over: {error}"),
    };
    keep.push(memfd.as_raw_fd());
    for fd in &keep {
        keep_across_exec(*fd);
    }
    // Signals that arrive from here until the new binary handles them
    // again wait, blocked (the mask and what is pending survive the exec),
    // instead of taking their default action (ending the server) in
    // between; `unblock_serving_signals` lets them in.
    block_serving_signals();
    let mut argv: Vec<OsString> = vec![exe.as_os_str().to_owned()];
    argv.extend(args.iter().cloned());
    argv.push("--handover".into());
    argv.push(memfd.as_raw_fd().to_string().into());
    let error = execv(exe, &argv);
    let failed = format!("cannot execute {}: {error}", exe.display());
    // The new binary is not there any more (removed or replaced since its
    // check): this one takes its own processes back, the same way, and
    // its state says why, for `Admin.lastUpgrade` to tell. (Should that
    // not fit, the state goes back as it was, saying nothing.)
    state.failed_upgrade = Some(failed.clone());
    if rewrite_state(&memfd, &state).is_err() {
        state.failed_upgrade = Some(format!("cannot execute the new binary: {error}"));
        let _ = rewrite_state(&memfd, &state);
    }
    let _ = execv(Path::new("/proc/self/exe"), &argv);
    failed
}

/// Clears close-on-exec on `fd`, which the next binary is to inherit.
pub fn keep_across_exec(fd: RawFd) {
    // SAFETY: F_GETFD/F_SETFD on a descriptor this process holds open.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
        }
    }
}

/// The signals a server handles (stop, reload, upgrade).
const SERVING_SIGNALS: [libc::c_int; 4] =
    [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR2];

fn serving_signal_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset fill the set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in SERVING_SIGNALS {
            libc::sigaddset(&mut set, signal);
        }
        set
    }
}

fn block_serving_signals() {
    let set = serving_signal_set();
    // SAFETY: changes this thread's mask, which the exec keeps.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Lets in the signals an upgrade blocked before its exec (those that came
/// meanwhile are delivered now): call once the server handles them.
pub fn unblock_serving_signals() {
    let set = serving_signal_set();
    // SAFETY: changes this thread's mask.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
}

/// Room left after the state's JSON, as spaces (which JSON allows after
/// a value), for the reason a failed exec adds to it in place: the bytes
/// after it, maybe many (logs, queued stdin), are not written again.
const FAILURE_ROOM: usize = 8 * 1024;

fn write_state(state: &State, blob: &[u8]) -> std::io::Result<OwnedFd> {
    let mut text = serde_json::to_vec(state).map_err(std::io::Error::other)?;
    text.resize(text.len() + FAILURE_ROOM, b' ');
    let name = c"capexec-handover";
    // SAFETY: memfd_create with a valid name; the descriptor is ours.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just created, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(fd);
    file.write_all(&(text.len() as u64).to_le_bytes())?;
    file.write_all(&text)?;
    file.write_all(blob)?;
    file.rewind()?;
    Ok(OwnedFd::from(file))
}

/// Writes `state` over the one [`write_state`] put in `memfd`, within the
/// room that one left; an error if it does not fit.
fn rewrite_state(memfd: &OwnedFd, state: &State) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::from(memfd.try_clone()?);
    let mut length = [0u8; 8];
    file.read_exact_at(&mut length, 0)?;
    let room = usize::try_from(u64::from_le_bytes(length)).map_err(std::io::Error::other)?;
    let mut text = serde_json::to_vec(state).map_err(std::io::Error::other)?;
    if text.len() > room {
        return Err(std::io::Error::other("the state outgrew its room"));
    }
    text.resize(room, b' ');
    file.write_all_at(&text, 8)
}

fn execv(exe: &Path, argv: &[OsString]) -> std::io::Error {
    let path = match CString::new(exe.as_os_str().to_owned().into_vec()) {
        Ok(path) => path,
        Err(_) => return std::io::Error::other("the path has a NUL byte"),
    };
    let args: Result<Vec<CString>, _> = argv
        .iter()
        .map(|arg| CString::new(arg.clone().into_vec()))
        .collect();
    let Ok(args) = args else {
        return std::io::Error::other("an argument has a NUL byte");
    };
    let mut pointers: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    pointers.push(std::ptr::null());
    // SAFETY: NUL-terminated strings and a null-terminated array, alive
    // across the call; on success this never returns.
    unsafe { libc::execv(path.as_ptr(), pointers.as_ptr()) };
    std::io::Error::last_os_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty_state() -> State {
        State {
            version: HANDOVER_VERSION.to_string(),
            cgroup_root: None,
            listeners: Vec::new(),
            processes: Vec::new(),
            detached: Vec::new(),
            failed_upgrade: None,
            to_close: Vec::new(),
        }
    }

    #[test]
    fn a_failed_exec_is_written_in_place_and_read_with_the_bytes_after_it_intact() {
        let mut state = empty_state();
        let memfd = write_state(&state, b"logs and stdin").expect("write");
        state.failed_upgrade = Some("cannot execute /usr/bin/capexec: gone".to_string());
        rewrite_state(&memfd, &state).expect("rewrite");
        let read = HandedOver::read(memfd).expect("read");
        assert_eq!(
            read.failed_upgrade.as_deref(),
            Some("cannot execute /usr/bin/capexec: gone")
        );
        let processes = read.take().expect("the processes");
        assert_eq!(&processes.blob[..], b"logs and stdin");
    }

    #[test]
    fn a_reason_longer_than_its_room_is_refused_and_the_state_stays_as_written() {
        let mut state = empty_state();
        let memfd = write_state(&state, b"bytes").expect("write");
        state.failed_upgrade = Some("x".repeat(FAILURE_ROOM + 1));
        assert!(rewrite_state(&memfd, &state).is_err());
        let read = HandedOver::read(memfd).expect("read");
        assert_eq!(read.failed_upgrade, None);
        assert_eq!(&read.take().expect("the processes").blob[..], b"bytes");
    }
}
