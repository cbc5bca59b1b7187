//! Upgrades of `capexec serve` as the command line asks for them: SIGUSR2
//! re-executes the server into the binary now at the path it was started
//! from (see `net/server/upgrade.rs`), and the server started that way
//! takes over what was handed to it (`--handover FD`).

use std::ffi::OsString;
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::sync::Arc;

use capexec::net::activation::InheritedSocket;
use capexec::net::{HandedOver, Upgrades};
use capexec::sys::low_slots::KeepsItsSlot;
use tokio::signal::unix::{SignalKind, signal};

/// The binary and arguments an upgrade re-executes, taken at start-up:
/// later, `/proc/self/exe` names the old binary, even once replaced.
pub struct Upgrading {
    exe: Result<PathBuf, String>,
    args: Vec<OsString>,
    refused: Option<String>,
}

impl Upgrading {
    /// `refused`: why this server cannot be upgraded in place (a user's
    /// worker: its monitor starts it); SIGUSR2 is still taken, and
    /// answered with it.
    pub fn prepare(refused: Option<&str>) -> Upgrading {
        let exe = started_from();
        // The arguments as given, less the hand-over of an upgrade before.
        let args = args_without("--handover");
        Upgrading {
            exe,
            args,
            refused: refused.map(str::to_string),
        }
    }

    /// Upgrades asked for by SIGUSR2 from now on.
    pub fn start(self) -> Result<Upgrades, String> {
        let exe = self.exe?;
        let mut usr2 = signal(SignalKind::user_defined2())
            .map_err(|error| format!("cannot handle SIGUSR2: {error}"))?;
        let (sender, requests) = tokio::sync::mpsc::unbounded_channel();
        let signalled = sender.clone();
        tokio::task::spawn_local(async move {
            while usr2.recv().await.is_some() {
                tracing::info!("SIGUSR2 received: upgrading");
                if signalled.send(None).is_err() {
                    return;
                }
            }
        });
        Ok(Upgrades {
            requests,
            sender,
            refused: self.refused,
            exe,
            args: self.args,
        })
    }
}

/// This process's arguments as given, less `flag` and its value (an
/// upgrade's hand-over, which the next exec gives anew).
pub(crate) fn args_without(flag: &str) -> Vec<OsString> {
    let mut args = Vec::new();
    let mut given = std::env::args_os().skip(1);
    while let Some(arg) = given.next() {
        if arg == flag {
            given.next();
            continue;
        }
        args.push(arg);
    }
    args
}

/// The path this binary was started by, as given (`argv[0]`, made absolute,
/// or looked up on PATH), not resolved through symbolic links: an upgrade
/// runs what the path names now, so repointing a link upgrades too.
pub(crate) fn started_from() -> Result<PathBuf, String> {
    let given = std::env::args_os()
        .next()
        .map(PathBuf::from)
        .filter(|path| !path.as_os_str().is_empty());
    let found = given.and_then(|path| {
        if path.components().count() > 1 {
            return std::path::absolute(&path).ok();
        }
        let search = std::env::var_os("PATH")?;
        std::env::split_paths(&search)
            .map(|dir| dir.join(&path))
            .find(|candidate| candidate.is_file())
            .and_then(|found| std::path::absolute(found).ok())
    });
    match found {
        Some(path) => Ok(path),
        None => std::env::current_exe()
            .map_err(|error| format!("cannot tell which binary this is: {error}")),
    }
}

/// `--handover FD`: what the binary before left at FD.
pub fn handed_over(fd: i32) -> Result<HandedOver, String> {
    let fd = crate::cli::serve_users::inherited(fd, "--handover")?;
    HandedOver::read(fd)
}

/// The listeners of a hand-over, as inherited sockets (named `admin` and
/// `metrics` where they are those).
pub fn listeners(handover: &HandedOver) -> Vec<InheritedSocket> {
    handover
        .listeners()
        .map(|(name, fd, path)| {
            // Closed at the next exec unless that one hands it over again.
            // SAFETY: F_SETFD on a descriptor kept open for us.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
            InheritedSocket {
                // SAFETY: kept open across the exec for us, and taken once.
                fd: Arc::new(KeepsItsSlot::new(unsafe {
                    std::os::fd::OwnedFd::from_raw_fd(fd)
                })),
                name: name.to_string(),
                path,
            }
        })
        .collect()
}
