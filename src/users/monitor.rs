//! The privileged part of a server that runs logins as users, and what
//! the front receives from it (docs/design/logins-as-users.md).
//!
//! The monitor is the root process `capexec serve --user-map` stays as
//! after binding its listeners and starting the front (an unprivileged
//! user that parses and forwards every peer's bytes). The monitor accepts
//! each connection on its Unix listeners itself, asks the kernel who the
//! peer is (`SO_PEERCRED`), decides the account from that and the map,
//! starts that account's worker if it is not running, and hands the
//! connection to the front with its verdict, on a `SOCK_SEQPACKET`
//! socketpair, in fixed-size messages. It never reads a byte a peer sent
//! on a Unix socket. For a TCP login the front, which did the login,
//! asks on a second socketpair which worker a token logs in to: the
//! monitor compares the token with the map's token files (which only it
//! reads) and answers; a compromised front learns nothing from it it
//! could not from the listener, since a token that logs in is one it
//! already holds. It waits only in poll(2), on one thread; beside it, one
//! thread per process it started copies that process's log to its own
//! stderr (`relay_log`).

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

use nix::sys::socket::{
    ControlMessage, ControlMessageOwned, MsgFlags, getsockopt, recvmsg, sendmsg, sockopt,
};
use nix::unistd::{Gid, Pid, Uid};

use crate::users::account::Account;
use crate::users::map::UserMap;
use crate::users::worker::spawn_worker;

/// A request for a TCP login: its kind, the token's length (u16), the
/// token.
const TOKEN_LOGIN: u8 = 1;
/// A request: which worker the TLS client certificate with this SHA-256
/// (32 bytes) logs in to.
const CERTIFICATE_LOGIN: u8 = 2;
/// A request: upgrade the server (the admin's `upgrade`); the answer says
/// whether the new binary takes over, before the upgrade goes on.
const UPGRADE: u8 = 3;
const MAX_TOKEN_BYTES: usize = 1024;
const REQUEST_BYTES: usize = 4 + MAX_TOKEN_BYTES;

/// A handed-over connection's verdict: status, uid, generation, then a
/// length-prefixed text (the worker's socket, or why not); the connection
/// rides along (`SCM_RIGHTS`).
const REPLY_BYTES: usize = 512;
const TEXT_BYTES: usize = REPLY_BYTES - 18;

/// A worker the monitor granted a connection: the user's uid, which
/// worker of that user it is (a new one after the old one ended has a
/// higher generation), and its socket.
///
/// Beside it, [`worker_admin_socket`] serves the worker's `Admin`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Granted {
    pub uid: u32,
    pub generation: u64,
    pub socket: PathBuf,
}

/// The admin socket of the worker whose socket is `socket`: the front
/// asks it for the operator's view of the user's processes.
pub fn worker_admin_socket(socket: &Path) -> PathBuf {
    socket.with_extension("admin.sock")
}

fn encode(reply: &Result<Granted, String>) -> [u8; REPLY_BYTES] {
    let mut bytes = [0u8; REPLY_BYTES];
    let (ok, uid, generation, text) = match reply {
        Ok(granted) => (
            1,
            granted.uid,
            granted.generation,
            granted.socket.as_os_str().as_encoded_bytes(),
        ),
        Err(why) => (0, 0, 0, why.as_bytes()),
    };
    let text = &text[..text.len().min(TEXT_BYTES)];
    bytes[0] = ok;
    bytes[4..8].copy_from_slice(&uid.to_le_bytes());
    bytes[8..16].copy_from_slice(&generation.to_le_bytes());
    bytes[16..18].copy_from_slice(&(text.len() as u16).to_le_bytes());
    bytes[18..18 + text.len()].copy_from_slice(text);
    bytes
}

fn decode(bytes: &[u8]) -> Result<Granted, String> {
    if bytes.len() != REPLY_BYTES {
        return Err(format!(
            "the monitor answered {} bytes, not {REPLY_BYTES}",
            bytes.len()
        ));
    }
    let word = |range: std::ops::Range<usize>| -> [u8; 8] {
        let mut word = [0u8; 8];
        word[..range.len()].copy_from_slice(&bytes[range]);
        word
    };
    let uid = u64::from_le_bytes(word(4..8)) as u32;
    let generation = u64::from_le_bytes(word(8..16));
    let len = (u64::from_le_bytes(word(16..18)) as usize).min(TEXT_BYTES);
    let text = &bytes[18..18 + len];
    if bytes[0] == 1 {
        use std::os::unix::ffi::OsStrExt;
        Ok(Granted {
            uid,
            generation,
            socket: PathBuf::from(std::ffi::OsStr::from_bytes(text)),
        })
    } else {
        Err(String::from_utf8_lossy(text).into_owned())
    }
}

/// What came from the monitor on the front's end of its socket.
pub enum Handed {
    /// An accepted connection, and the worker that serves it (or why the
    /// login is refused).
    Connection(OwnedFd, Result<Granted, String>),
    /// Nothing waiting.
    Nothing,
    /// The monitor has gone.
    Closed,
}

/// Takes the next connection the monitor handed to the front on `socket`
/// (its end of the socketpair, non-blocking), if one is waiting.
pub fn receive_handed(socket: BorrowedFd<'_>) -> std::io::Result<Handed> {
    let mut reply = [0u8; REPLY_BYTES + 1];
    let mut space = nix::cmsg_space!([RawFd; 2]);
    let mut iov = [IoSliceMut::new(&mut reply)];
    let message = match recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    ) {
        Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => {
            return Ok(Handed::Nothing);
        }
        Err(errno) => return Err(errno.into()),
        Ok(message) => message,
    };
    let length = message.bytes;
    let mut passed = owned_descriptors(&message);
    if length == 0 && passed.is_empty() {
        return Ok(Handed::Closed);
    }
    let verdict = decode(&reply[..length]);
    match (passed.pop(), passed.is_empty()) {
        (Some(connection), true) => Ok(Handed::Connection(connection, verdict)),
        _ => Err(std::io::Error::other(
            "the monitor handed a message without its one connection",
        )),
    }
}

/// Every descriptor that came with `message`, owned, so none is left open.
fn owned_descriptors(message: &nix::sys::socket::RecvMsg<'_, '_, ()>) -> Vec<OwnedFd> {
    let mut passed = Vec::new();
    if let Ok(messages) = message.cmsgs() {
        for control in messages {
            if let ControlMessageOwned::ScmRights(fds) = control {
                // SAFETY: the kernel just installed these for us.
                passed.extend(
                    fds.into_iter()
                        .map(|fd| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }),
                );
            }
        }
    }
    passed
}

/// A worker as an upgrade hands it over to the next monitor: the same
/// process, still this one's child.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct WorkerRecord {
    pub uid: u32,
    pub pid: i32,
    pub generation: u64,
    pub socket: PathBuf,
    pub cgroup: Option<PathBuf>,
    /// The read end of its log's pipe, kept open across the exec.
    pub log: Option<RawFd>,
    /// Its log's label.
    pub label: String,
}

/// How the monitor upgrades the server in place (SIGUSR2, or the front's
/// request for the admin's `upgrade`).
pub struct MonitorUpgrade {
    /// Whether the binary now at the server's path takes the hand-over,
    /// or why not.
    pub check: Box<dyn Fn() -> Result<(), String>>,
    /// Re-executes this process into that binary, handing over the
    /// workers and how many were started; returns only if that failed,
    /// saying why.
    pub exec: ExecUpgrade,
}

/// Re-executes the monitor with the workers handed over (see
/// [`MonitorUpgrade::exec`]).
pub type ExecUpgrade = Box<dyn Fn(&[WorkerRecord], u64) -> String>;

/// How long the front may take to close its connections and end, at an
/// upgrade, before it is killed.
const FRONT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// What the monitor works with.
pub struct MonitorSetup {
    pub map: UserMap,
    /// The capexec binary the workers run.
    pub program: crate::users::Program,
    /// Where the workers' sockets go (made by the caller, mode 0711).
    pub socket_dir: PathBuf,
    /// The front's user: the only one that may connect to a worker.
    pub front_uid: Uid,
    pub front_gid: Gid,
    /// The map's token logins: whether a candidate is the token, and the
    /// account it logs in as.
    pub tokens: Vec<(TokenCheck, Account)>,
    /// How to upgrade in place.
    pub upgrade: MonitorUpgrade,
}

/// Compares a candidate with one token of the map, in constant time.
pub type TokenCheck = Box<dyn Fn(&str) -> bool>;

/// The signal the monitor has to pass on to the front (0: none).
static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Whether SIGUSR2 asked for an upgrade.
static PENDING_UPGRADE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The write end of the serving monitor's wake pipe (-1: none yet), which
/// the handler writes a byte to after noting a signal: the monitor polls
/// the read end, so a signal that comes after it last looked at the two
/// flags above, and before it blocks in poll(2), still wakes it.
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn note_signal(signal: libc::c_int) {
    if signal == libc::SIGUSR2 {
        PENDING_UPGRADE.store(true, Ordering::Relaxed);
    } else {
        PENDING_SIGNAL.store(signal, Ordering::Relaxed);
    }
    let wake = WAKE_FD.load(Ordering::Relaxed);
    if wake >= 0 {
        // SAFETY: write(2) is async-signal-safe; the pipe is non-blocking,
        // and a full one has woken the monitor already.
        unsafe { libc::write(wake, [1u8].as_ptr().cast(), 1) };
    }
}

/// The pipe a signal wakes the monitor's poll(2) through (see [`WAKE_FD`]).
/// Made once and open for the life of the process: a handler on another
/// thread (a log relay's) may be writing to it at any time.
struct SignalWake {
    read: OwnedFd,
    /// Only ever written to through [`WAKE_FD`].
    write: OwnedFd,
}

static SIGNAL_WAKE: std::sync::OnceLock<SignalWake> = std::sync::OnceLock::new();

impl SignalWake {
    /// The pipe, made on first use. Call before the monitor first looks at
    /// the flags: a signal noted earlier is seen there, any later one also
    /// writes to the pipe.
    fn get() -> std::io::Result<&'static SignalWake> {
        if let Some(wake) = SIGNAL_WAKE.get() {
            return Ok(wake);
        }
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two new descriptors into `fds`.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: both were just opened, and nothing else owns them.
        let made = unsafe {
            SignalWake {
                read: OwnedFd::from_raw_fd(fds[0]),
                write: OwnedFd::from_raw_fd(fds[1]),
            }
        };
        // The monitor is one thread: nothing else makes one meanwhile.
        let wake = SIGNAL_WAKE.get_or_init(|| made);
        WAKE_FD.store(wake.write.as_raw_fd(), Ordering::Relaxed);
        Ok(wake)
    }

    /// Empties the pipe (the flags say what came).
    fn drain(&self) {
        let mut bytes = [0u8; 64];
        while let Ok(1..) = rustix::io::read(&self.read, &mut bytes) {}
    }
}

/// The signals the monitor handles, blocked from just before an upgrade's
/// exec until the next monitor handles them (the mask survives the exec),
/// so that none takes its default action (ending the server) in between.
const MONITOR_SIGNALS: [libc::c_int; 4] =
    [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR2];

/// Blocks or unblocks them in the calling thread (async-signal-safe: also
/// called between a fork and its exec).
pub(super) fn mask_monitor_signals(how: libc::c_int) {
    // SAFETY: fills a set we own and changes this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in MONITOR_SIGNALS {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// Takes the signals the monitor handles (SIGTERM, SIGINT and SIGHUP for
/// the front, SIGUSR2 for an upgrade): call it first thing, so that one
/// that comes while the monitor starts waits for [`serve_monitor`] instead
/// of ending the server. (A child's exec resets them to their defaults.)
pub fn handle_monitor_signals() {
    for signal in MONITOR_SIGNALS {
        // SAFETY: the handler only stores to an atomic; no SA_RESTART, so
        // a signal interrupts the monitor's wait and is passed on at once.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = note_signal as *const () as usize;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// Accepts on `listeners` (non-blocking) and hands each connection with
/// its verdict to the front on `socket`, until the front closes its end
/// (it has ended), passing SIGTERM, SIGINT and SIGHUP on to the front;
/// SIGUSR2 upgrades the server (see [`MonitorUpgrade`]). `taken_over`:
/// the workers an upgrade handed over, and how many had been started.
/// Returns the front's exit code, as a shell would say it.
pub fn serve_monitor(
    socket: OwnedFd,
    requests: Option<OwnedFd>,
    listeners: &[&std::os::unix::net::UnixListener],
    setup: &MonitorSetup,
    front: Pid,
    taken_over: (Vec<WorkerRecord>, u64),
) -> i32 {
    use rustix::event::{PollFd, PollFlags, poll};
    handle_monitor_signals();
    // (Blocked by the monitor before, if it handed over to this one.)
    mask_monitor_signals(libc::SIG_UNBLOCK);
    let mut workers = Workers::default();
    workers.adopt(taken_over.0, taken_over.1);
    let front_pidfd = match pidfd(front) {
        Ok(pidfd) => pidfd,
        Err(error) => {
            tracing::error!(%error, "the monitor cannot watch the front");
            return wait_for(front);
        }
    };
    let wake = SignalWake::get()
        .inspect_err(|error| {
            tracing::warn!(%error, "no pipe for signals: the monitor looks for them every 100 ms")
        })
        .ok();
    let every = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    let timeout = wake.is_none().then_some(&every);
    let mut front_status = None;
    'serving: loop {
        pass_signal_on(front);
        if PENDING_UPGRADE.swap(false, Ordering::Relaxed)
            && let Upgraded::Failed(why) = upgrade(setup, &mut workers, front, &front_pidfd, None)
        {
            tracing::error!("the upgrade failed after the front had ended: {why}");
            break;
        }
        reap(front, &mut front_status);
        let mut fds: Vec<PollFd<'_>> = std::iter::once(&socket)
            .chain(wake.iter().map(|wake| &wake.read))
            .map(|fd| PollFd::new(fd, PollFlags::IN))
            .chain(requests.iter().map(|r| PollFd::new(r, PollFlags::IN)))
            .chain(listeners.iter().map(|l| PollFd::new(*l, PollFlags::IN)))
            .collect();
        match poll(&mut fds, timeout) {
            Err(rustix::io::Errno::INTR) => continue,
            Err(errno) => {
                tracing::error!(error = %errno, "the monitor cannot wait");
                break;
            }
            Ok(_) => {}
        }
        let ready: Vec<bool> = fds.iter().map(|fd| !fd.revents().is_empty()).collect();
        if ready[0] {
            // The front sends nothing there: readable means it closed its end.
            break;
        }
        let ready = match wake {
            Some(wake) => {
                if ready[1] {
                    // A signal: the top of the loop acts on it.
                    wake.drain();
                }
                &ready[2..]
            }
            None => &ready[1..],
        };
        let listening = match &requests {
            Some(requests) if ready[0] => {
                match answer_request(setup, &mut workers, requests.as_fd(), front) {
                    Answered::Closed => break,
                    Answered::Served => {}
                    Answered::Upgrade => {
                        let reply = Some(requests.as_fd());
                        if let Upgraded::Failed(why) =
                            upgrade(setup, &mut workers, front, &front_pidfd, reply)
                        {
                            tracing::error!("the upgrade failed after the front had ended: {why}");
                            break;
                        }
                    }
                }
                &ready[1..]
            }
            Some(_) => &ready[1..],
            None => ready,
        };
        for (listener, _) in listeners.iter().zip(listening).filter(|(_, ready)| **ready) {
            while let Ok((connection, _)) = listener.accept() {
                let connection = OwnedFd::from(connection);
                let verdict = grant(setup, &mut workers, connection.as_fd());
                if let Err(why) = &verdict {
                    tracing::warn!(%why, "refused a login");
                }
                let bytes = encode(&verdict);
                let fds = [connection.as_raw_fd()];
                // Waits while the front's side is full: the front takes
                // logins as fast as it can serve them.
                let handed = loop {
                    match sendmsg::<()>(
                        socket.as_raw_fd(),
                        &[IoSlice::new(&bytes)],
                        &[ControlMessage::ScmRights(&fds)],
                        MsgFlags::MSG_NOSIGNAL,
                        None,
                    ) {
                        Err(nix::errno::Errno::EINTR) => pass_signal_on(front),
                        other => break other,
                    }
                };
                if let Err(errno) = handed {
                    tracing::error!(
                        error = errno.desc(),
                        "the monitor cannot hand a login to the front"
                    );
                    break 'serving;
                }
            }
        }
    }
    workers.stop();
    let _ = std::fs::remove_dir_all(&setup.socket_dir);
    match front_status {
        Some(code) => code,
        None => wait_for(front),
    }
}

/// What came of a request of the front's.
enum Answered {
    Served,
    /// An upgrade, to be checked and answered by [`upgrade`].
    Upgrade,
    /// The front has closed its end.
    Closed,
}

/// Answers one request of the front's on `requests`.
fn answer_request(
    setup: &MonitorSetup,
    workers: &mut Workers,
    requests: BorrowedFd<'_>,
    front: Pid,
) -> Answered {
    let mut request = [0u8; REQUEST_BYTES + 1];
    let length =
        match nix::sys::socket::recv(requests.as_raw_fd(), &mut request, MsgFlags::MSG_DONTWAIT) {
            Ok(0) => return Answered::Closed,
            Ok(length) => length,
            Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => {
                return Answered::Served;
            }
            Err(errno) => {
                tracing::error!(
                    error = errno.desc(),
                    "the monitor cannot read the front's request"
                );
                return Answered::Closed;
            }
        };
    let request = &request[..length];
    if request == [UPGRADE, 0, 0, 0] {
        return Answered::Upgrade;
    }
    let verdict = match (token_of(request), certificate_of(request)) {
        (Some(token), _) => match setup.tokens.iter().find(|(matches, _)| matches(token)) {
            Some((_, account)) => {
                refuse_root(account).and_then(|()| workers.running(setup, account))
            }
            None => Err("login refused: wrong token".to_string()),
        },
        // Fingerprints are not secrets: no constant-time comparison.
        (None, Some(sha256)) => match setup.map.by_certificate(&sha256) {
            Some(account) => refuse_root(account).and_then(|()| workers.running(setup, account)),
            None => Err(format!(
                "login refused: no user is mapped to the client certificate {}",
                crate::model::show_fingerprint(&sha256)
            )),
        },
        (None, None) => Err("a malformed request to the monitor".to_string()),
    };
    if reply(requests, &verdict, front) {
        Answered::Served
    } else {
        Answered::Closed
    }
}

/// Sends the front `verdict` on `requests`; false if it cannot.
fn reply(requests: BorrowedFd<'_>, verdict: &Result<Granted, String>, front: Pid) -> bool {
    let bytes = encode(verdict);
    loop {
        match nix::sys::socket::send(requests.as_raw_fd(), &bytes, MsgFlags::MSG_NOSIGNAL) {
            Err(nix::errno::Errno::EINTR) => pass_signal_on(front),
            Ok(_) => return true,
            Err(errno) => {
                tracing::error!(error = errno.desc(), "the monitor cannot answer the front");
                return false;
            }
        }
    }
}

/// What came of an upgrade that did not replace this process.
enum Upgraded {
    /// The new binary refused: nothing was touched, the server serves on.
    Refused,
    /// The front has ended and the exec failed: the server cannot go on.
    Failed(String),
}

/// Upgrades the server in place: asks the new binary first (and answers
/// the front on `reply`, if it asked); if it takes over, tells every
/// worker to upgrade itself (SIGUSR2: each hands its own processes over
/// to the new binary, in its own process), ends the front (which closes
/// every connection saying the server is upgrading; resuming clients come
/// back), and re-executes this process with the workers handed over. The
/// new monitor starts a front of the new binary on the same listeners,
/// which held what connected meanwhile in their backlogs.
fn upgrade(
    setup: &MonitorSetup,
    workers: &mut Workers,
    front: Pid,
    front_pidfd: &OwnedFd,
    reply_on: Option<BorrowedFd<'_>>,
) -> Upgraded {
    tracing::info!("upgrade asked for: checking the new binary");
    let checked = (setup.upgrade.check)();
    if let Some(requests) = reply_on {
        let answer = checked.clone().map(|()| Granted {
            uid: 0,
            generation: 0,
            socket: PathBuf::new(),
        });
        reply(requests, &answer, front);
    }
    if let Err(why) = checked {
        tracing::warn!("upgrade refused, still serving: {why}");
        return Upgraded::Refused;
    }
    tracing::info!("upgrading: the workers upgrade themselves, the front ends");
    for worker in workers.by_uid.values() {
        if !ended(&worker.pidfd) {
            let _ = nix::sys::signal::kill(worker.pid, nix::sys::signal::Signal::SIGUSR2);
        }
    }
    let _ = nix::sys::signal::kill(front, nix::sys::signal::Signal::SIGUSR2);
    if !ended_within(front_pidfd, FRONT_PATIENCE) {
        tracing::warn!("the front did not end within {FRONT_PATIENCE:?}; killing it");
        let _ = nix::sys::signal::kill(front, nix::sys::signal::Signal::SIGKILL);
    }
    // Reaped without passing a signal on: the front has ended, and a
    // SIGTERM that came during the upgrade is for the next front.
    reap_ended(front);
    mask_monitor_signals(libc::SIG_BLOCK);
    // A signal noted meanwhile is made pending again, blocked: the exec
    // keeps it, and the next monitor passes it on once it serves.
    let noted = PENDING_SIGNAL.swap(0, Ordering::Relaxed);
    if noted != 0 {
        // SAFETY: raise(3) sends a signal to this thread, which blocks it.
        unsafe { libc::raise(noted) };
    }
    let error = (setup.upgrade.exec)(&workers.records(), workers.started);
    mask_monitor_signals(libc::SIG_UNBLOCK);
    Upgraded::Failed(error)
}

/// Whether the process behind `pidfd` ends within `patience`.
fn ended_within(pidfd: &OwnedFd, patience: std::time::Duration) -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    let deadline = std::time::Instant::now() + patience;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let timeout = rustix::event::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(n) if n > 0 => return true,
            Err(rustix::io::Errno::INTR) => continue,
            _ => return false,
        }
    }
}

/// The front's end of the request socket: upgrade the server. `Ok` once
/// the monitor has found that the new binary takes over (the upgrade then
/// goes on, and ends this front), else why not.
pub fn ask_for_upgrade(requests: BorrowedFd<'_>) -> Result<(), String> {
    ask(requests, &[UPGRADE, 0, 0, 0]).map(|_| ())
}

/// The token of a login request, if it is one.
fn token_of(request: &[u8]) -> Option<&str> {
    let (&[kind, _, low, high], token) = request.split_first_chunk::<4>()?;
    let length = usize::from(u16::from_le_bytes([low, high]));
    if kind != TOKEN_LOGIN || token.len() != length {
        return None;
    }
    std::str::from_utf8(token).ok()
}

/// The certificate of a login request, if it is one.
fn certificate_of(request: &[u8]) -> Option<[u8; 32]> {
    let (&[kind, _, _, _], sha256) = request.split_first_chunk::<4>()?;
    if kind != CERTIFICATE_LOGIN {
        return None;
    }
    sha256.try_into().ok()
}

/// The front's end of the request socket: which worker the TLS client
/// certificate with `sha256` logs in to. Blocks as [`ask_for_token`].
pub fn ask_for_certificate(requests: BorrowedFd<'_>, sha256: &[u8; 32]) -> Result<Granted, String> {
    let mut request = Vec::with_capacity(4 + 32);
    request.extend_from_slice(&[CERTIFICATE_LOGIN, 0, 32, 0]);
    request.extend_from_slice(sha256);
    ask(requests, &request)
}

/// The front's end of the request socket: which worker a TCP login's
/// token logs in to. Blocks until the monitor answers (it may start the
/// worker first): call it off the serving thread, one at a time.
pub fn ask_for_token(requests: BorrowedFd<'_>, token: &str) -> Result<Granted, String> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err("login refused: wrong token".to_string());
    }
    let mut request = Vec::with_capacity(4 + token.len());
    request.extend_from_slice(&[TOKEN_LOGIN, 0]);
    request.extend_from_slice(&(token.len() as u16).to_le_bytes());
    request.extend_from_slice(token.as_bytes());
    ask(requests, &request)
}

/// Sends one request and waits for its answer.
fn ask(requests: BorrowedFd<'_>, request: &[u8]) -> Result<Granted, String> {
    let failed =
        |what: &str, errno: nix::errno::Errno| format!("{what} the monitor: {}", errno.desc());
    loop {
        match nix::sys::socket::send(requests.as_raw_fd(), request, MsgFlags::MSG_NOSIGNAL) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(errno) => return Err(failed("cannot ask", errno)),
            Ok(_) => break,
        }
    }
    let mut reply = [0u8; REPLY_BYTES + 1];
    let length = loop {
        match nix::sys::socket::recv(requests.as_raw_fd(), &mut reply, MsgFlags::empty()) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(errno) => return Err(failed("no answer from", errno)),
            Ok(length) => break length,
        }
    };
    if length == 0 {
        return Err("the monitor has gone".to_string());
    }
    decode(&reply[..length])
}

/// The worker for the peer of `connection`, started if need be.
fn grant(
    setup: &MonitorSetup,
    workers: &mut Workers,
    connection: BorrowedFd<'_>,
) -> Result<Granted, String> {
    let credentials = getsockopt(&connection, sockopt::PeerCredentials)
        .map_err(|errno| format!("cannot tell who the peer is: {}", errno.desc()))?;
    let account = setup
        .map
        .by_unix_peer(credentials.uid())
        .map_err(|error| format!("this server runs logins as users, and {error}"))?;
    refuse_root(&account)?;
    workers.running(setup, &account)
}

/// No login runs as root: every worker's socket is the front's to
/// connect to, so a root worker would give a front taken over root. Root
/// runs its commands through a server of its own (or the admin socket).
fn refuse_root(account: &Account) -> Result<(), String> {
    if account.uid.is_root() {
        return Err(format!(
            "login refused: logins do not run as {} (uid 0) on a server that runs logins as \
             users; root uses a server of its own",
            account.name
        ));
    }
    Ok(())
}

#[derive(Default)]
struct Workers {
    by_uid: HashMap<u32, Running>,
    /// Numbers the workers started, so the front can tell a new one.
    started: u64,
}

struct Running {
    pid: Pid,
    /// Readable once the worker has ended.
    pidfd: OwnedFd,
    granted: Granted,
    /// The cgroup delegated to the worker's user, which the worker and
    /// every process it starts are in.
    cgroup: Option<PathBuf>,
    /// A second descriptor of its log's pipe, for an upgrade to hand over
    /// (a thread relays the first), and the log's label.
    log: Option<OwnedFd>,
    label: String,
}

impl Running {
    /// Forgets an ended worker: its cgroup goes with what is left in it.
    fn ended(self) {
        if let Some(dir) = self.cgroup {
            crate::sandbox::remove_delegated(&dir);
        }
    }
}

impl Workers {
    /// The workers to hand over at an upgrade.
    fn records(&self) -> Vec<WorkerRecord> {
        self.by_uid
            .values()
            .map(|worker| WorkerRecord {
                uid: worker.granted.uid,
                pid: worker.pid.as_raw(),
                generation: worker.granted.generation,
                socket: worker.granted.socket.clone(),
                cgroup: worker.cgroup.clone(),
                log: worker.log.as_ref().map(|log| log.as_raw_fd()),
                label: worker.label.clone(),
            })
            .collect()
    }

    /// Takes over the workers the monitor before handed over (this
    /// process's children still), relaying their logs again.
    fn adopt(&mut self, records: Vec<WorkerRecord>, started: u64) {
        self.started = started;
        for record in records {
            // SAFETY: kept open across the exec for us, taken once.
            let log = record
                .log
                .map(|fd| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
            let log = log.map(|log| {
                let _ = rustix::io::fcntl_setfd(&log, rustix::io::FdFlags::CLOEXEC);
                let kept = log.try_clone().ok();
                crate::users::worker::relay_from(log, record.label.clone());
                kept
            });
            let pid = Pid::from_raw(record.pid);
            let Ok(pidfd) = pidfd(pid) else {
                tracing::warn!(pid = record.pid, "a worker handed over is gone");
                continue;
            };
            self.by_uid.insert(
                record.uid,
                Running {
                    pid,
                    pidfd,
                    granted: Granted {
                        uid: record.uid,
                        generation: record.generation,
                        socket: record.socket,
                    },
                    cgroup: record.cgroup,
                    log: log.flatten(),
                    label: record.label,
                },
            );
        }
    }

    fn running(&mut self, setup: &MonitorSetup, account: &Account) -> Result<Granted, String> {
        let uid = account.uid.as_raw();
        if let Some(worker) = self.by_uid.get(&uid) {
            if !ended(&worker.pidfd) {
                return Ok(worker.granted.clone());
            }
            tracing::warn!(user = %account.name, "the user's worker had ended; starting another");
            if let Some(worker) = self.by_uid.remove(&uid) {
                worker.ended();
            }
        }
        let failed = |error: std::io::Error| {
            format!(
                "cannot start the worker of user {}: {}",
                account.name,
                crate::model::io_message(&error)
            )
        };
        let path = setup.socket_dir.join(format!("{uid}.sock"));
        // Its admin socket: the front's operator view of the user's
        // processes (`worker_admin_socket`).
        let admin_path = worker_admin_socket(&path);
        let listener = self.bind_for_front(setup, &path).map_err(failed)?;
        let admin = self.bind_for_front(setup, &admin_path).map_err(failed)?;
        // Numbered by the worker, so a new worker never meets what an
        // ended one left.
        let generation = self.started + 1;
        let cgroup = match crate::sandbox::delegate(
            &format!("u-{uid}-{generation}"),
            uid,
            account.gid.as_raw(),
        ) {
            Ok(group) => Some(group),
            Err(why) => {
                tracing::warn!(
                    user = %account.name,
                    %why,
                    "no cgroup for the user's worker: its processes get none"
                );
                None
            }
        };
        let spawned = spawn_worker(account, &setup.program, &listener, &admin, cgroup.as_ref());
        let cgroup = cgroup.map(|group| group.dir);
        let mut child = match spawned {
            Ok(child) => child,
            Err(error) => {
                if let Some(dir) = &cgroup {
                    crate::sandbox::remove_delegated(dir);
                }
                return Err(format!("user {}: {error}", account.name));
            }
        };
        drop((listener, admin));
        let label = crate::users::worker::log_label(account);
        let log = crate::users::worker::relay_stderr(&mut child, label.clone());
        let pid = Pid::from_raw(child.id() as i32);
        let pidfd = pidfd(pid).map_err(failed)?;
        self.started = generation;
        tracing::info!(user = %account.name, uid, pid = child.id(), "started the user's worker");
        let granted = Granted {
            uid,
            generation,
            socket: path,
        };
        self.by_uid.insert(
            uid,
            Running {
                pid,
                pidfd,
                granted: granted.clone(),
                cgroup,
                log,
                label,
            },
        );
        Ok(granted)
    }

    /// A socket at `path` (replacing one left there) that only the front
    /// may connect to: not the worker's user, not root's other daemons.
    fn bind_for_front(
        &self,
        setup: &MonitorSetup,
        path: &Path,
    ) -> std::io::Result<std::os::unix::net::UnixListener> {
        match std::fs::remove_file(path) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
        let listener = std::os::unix::net::UnixListener::bind(path)?;
        std::os::unix::fs::chown(
            path,
            Some(setup.front_uid.as_raw()),
            Some(setup.front_gid.as_raw()),
        )?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        Ok(listener)
    }

    /// Ends every worker (their processes end with them).
    fn stop(&mut self) {
        for worker in self.by_uid.values() {
            let _ = nix::sys::signal::kill(worker.pid, nix::sys::signal::Signal::SIGTERM);
        }
    }
}

fn pidfd(pid: Pid) -> std::io::Result<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid.as_raw())
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    Ok(rustix::process::pidfd_open(
        pid,
        rustix::process::PidfdFlags::empty(),
    )?)
}

/// Whether the process behind `pidfd` has ended (its pidfd is readable).
fn ended(pidfd: &OwnedFd) -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    matches!(poll(&mut fds, Some(&rustix::event::Timespec::default())), Ok(n) if n > 0)
}

/// Reaps every child that has ended, keeping the front's exit code.
fn reap(front: Pid, front_status: &mut Option<i32>) {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        match status {
            WaitStatus::StillAlive => break,
            WaitStatus::Exited(pid, code) if pid == front => *front_status = Some(code),
            WaitStatus::Signaled(pid, signal, _) if pid == front => {
                *front_status = Some(128 + signal as i32)
            }
            _ => {}
        }
    }
}

/// Passes the last signal the monitor got on to the front.
fn pass_signal_on(front: Pid) {
    let signal = PENDING_SIGNAL.swap(0, Ordering::Relaxed);
    if signal != 0
        && let Ok(signal) = nix::sys::signal::Signal::try_from(signal)
    {
        let _ = nix::sys::signal::kill(front, signal);
    }
}

/// Reaps the front, which has ended (or been killed).
fn reap_ended(front: Pid) {
    while let Err(nix::errno::Errno::EINTR) = nix::sys::wait::waitpid(front, None) {}
}

/// The front's exit code, once it has ended (signals still passed on).
fn wait_for(front: Pid) -> i32 {
    use nix::sys::wait::{WaitStatus, waitpid};
    loop {
        pass_signal_on(front);
        match waitpid(front, None) {
            Ok(WaitStatus::Exited(_, code)) => return code,
            Ok(WaitStatus::Signaled(_, signal, _)) => return 128 + signal as i32,
            Err(nix::errno::Errno::EINTR) | Ok(_) => continue,
            Err(_) => return 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_read_back_as_written() {
        let granted = Granted {
            uid: 1001,
            generation: 7,
            socket: PathBuf::from("/run/capexec/workers.1/1001.sock"),
        };
        assert_eq!(decode(&encode(&Ok(granted.clone()))), Ok(granted));
        let why = "this server runs logins as users, and no user with uid 7".to_string();
        assert_eq!(decode(&encode(&Err(why.clone()))), Err(why));
        // A reply of another size is no reply.
        assert!(decode(&[1u8; 16]).is_err());
        // Text beyond the room is cut, not overflowing.
        let long = "x".repeat(2 * REPLY_BYTES);
        assert_eq!(
            decode(&encode(&Err(long))).map(|_| ()).unwrap_err().len(),
            TEXT_BYTES
        );
    }

    #[test]
    fn a_login_request_carries_exactly_its_token() {
        let mut request = vec![TOKEN_LOGIN, 0, 5, 0];
        request.extend_from_slice(b"hello");
        assert_eq!(token_of(&request), Some("hello"));
        // A length that is not the token's, another kind, too short.
        assert_eq!(token_of(&request[..8]), None);
        request[0] = 2;
        assert_eq!(token_of(&request), None);
        assert_eq!(token_of(&[TOKEN_LOGIN, 0]), None);
        let mut certificate = vec![CERTIFICATE_LOGIN, 0, 32, 0];
        certificate.extend_from_slice(&[7; 32]);
        assert_eq!(certificate_of(&certificate), Some([7; 32]));
        assert_eq!(token_of(&certificate), None);
        assert_eq!(certificate_of(&certificate[..35]), None);
        assert_eq!(certificate_of(&request), None);
    }
}
