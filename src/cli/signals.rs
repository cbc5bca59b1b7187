//! Signals to `capexec run`, and when they make it end on its own.
//!
//! SIGINT, SIGTERM and SIGHUP are forwarded to the command, as if it ran
//! here, while the way to it works. Whatever the server or the network
//! does, a signal always ends capexec within about a second: when a
//! forwarded signal is not answered within [`FORWARD_WAIT`], when the
//! connection is already being recovered, or when a second signal comes,
//! capexec stops waiting for the command and ends with 128 + the signal's
//! number. Under `-t`, SIGTERM and SIGHUP end the session at once (a
//! remote interactive shell ignores SIGTERM, as a local one does): as with
//! `ssh -t`, the terminal going away ends what runs on it.
//!
//! Ctrl-Z (SIGTSTP) without `-t` stops the command's process group too,
//! then capexec itself; `fg` continues both.

use std::cell::OnceCell;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::SelectAll;
use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinHandle;

use capexec::client::ResilientProcess;
use capexec::model::Signal;

/// How long a forwarded signal may wait for the server's answer before
/// capexec stops relying on the server.
pub const FORWARD_WAIT: Duration = Duration::from_secs(1);

type Caught = Pin<Box<dyn futures::Stream<Item = Signal>>>;

/// Why capexec must end without the command's exit status.
pub struct Interrupted {
    pub signal: Signal,
    /// What happened, for the note: "SIGINT again", ...
    pub why: String,
    /// Whether the way to the command is known to be broken (no point in
    /// asking the server to terminate it).
    pub unreachable: bool,
}

impl Interrupted {
    /// The exit status, as a shell reports death by the signal.
    pub fn exit_code(&self) -> i32 {
        128 + self.signal.number()
    }
}

/// SIGINT, SIGTERM and SIGHUP (and SIGTSTP without a terminal), caught
/// from the moment this is created (so none of them kills capexec while
/// the command starts).
pub struct Signals {
    received: SelectAll<Caught>,
    tty: bool,
}

impl Signals {
    pub fn catch(tty: bool) -> Signals {
        let mut kinds = vec![
            (SignalKind::interrupt(), Signal::Int),
            (SignalKind::terminate(), Signal::Term),
            (SignalKind::hangup(), Signal::Hup),
        ];
        // With -t, Ctrl-Z is a keystroke for the remote terminal.
        if !tty {
            kinds.push((SignalKind::from_raw(libc::SIGTSTP), Signal::Tstp));
        }
        let mut streams: Vec<Caught> = Vec::new();
        for (kind, name) in kinds {
            match signal(kind) {
                Ok(mut stream) => streams.push(Box::pin(
                    futures::stream::poll_fn(move |cx| stream.poll_recv(cx)).map(move |()| name),
                )),
                Err(error) => tracing::warn!(%error, %name, "cannot catch signal"),
            }
        }
        Signals {
            received: futures::stream::select_all(streams),
            tty,
        }
    }

    /// Watches for signals from now on, on a task of its own: until the
    /// command is started (`process` is set), any of them ends capexec; then
    /// they are forwarded to it until capexec must end on its own. The task
    /// says why; it never ends if that never happens.
    pub fn watch(self) -> (Rc<OnceCell<ResilientProcess>>, JoinHandle<Interrupted>) {
        let process = Rc::new(OnceCell::new());
        let task = tokio::task::spawn_local(self.relay(Rc::clone(&process)));
        (process, task)
    }

    async fn relay(mut self, process: Rc<OnceCell<ResilientProcess>>) -> Interrupted {
        let mut forwarded: Option<Signal> = None;
        loop {
            let Some(name) = self.received.next().await else {
                return std::future::pending().await;
            };
            let Some(process) = process.get() else {
                if name == Signal::Tstp {
                    // SAFETY: raise(3) on ourselves: nothing runs yet.
                    unsafe { libc::raise(libc::SIGSTOP) };
                    continue;
                }
                return Interrupted {
                    signal: name,
                    why: name.to_string(),
                    unreachable: true,
                };
            };
            if name == Signal::Tstp {
                suspend_with(process).await;
                continue;
            }
            if self.tty && matches!(name, Signal::Term | Signal::Hup) {
                return Interrupted {
                    signal: name,
                    why: format!("{name} received"),
                    unreachable: false,
                };
            }
            if let Some(first) = forwarded {
                let why = if first == name {
                    format!("{name} again")
                } else {
                    format!("{name} after {first}")
                };
                return Interrupted {
                    signal: name,
                    why,
                    unreachable: false,
                };
            }
            if process.is_recovering() {
                return Interrupted {
                    signal: name,
                    why: format!("{name} while the connection is lost"),
                    unreachable: true,
                };
            }
            // Not through the recovering handle: a signal must not wait
            // for a reconnection.
            let current = process.current();
            let sent = current.signal(name);
            match tokio::time::timeout(FORWARD_WAIT, sent).await {
                Ok(Ok(())) => {
                    tracing::debug!("{name} forwarded to the command");
                    forwarded = Some(name);
                }
                Ok(Err(error)) if !error.is_transport_loss() => {
                    tracing::warn!(%error, %name, "cannot forward signal");
                    forwarded = Some(name);
                }
                Ok(Err(_)) | Err(_) => {
                    return Interrupted {
                        signal: name,
                        why: format!(
                            "{name} not answered by the server within {}",
                            capexec::model::show_duration(FORWARD_WAIT)
                        ),
                        unreachable: true,
                    };
                }
            }
        }
    }
}

/// Ctrl-Z: stops the command's process group, then capexec; once capexec
/// is continued (`fg`, `bg`), continues the command.
async fn suspend_with(process: &ResilientProcess) {
    // SIGSTOP, not SIGTSTP: the command leads its own session, so the
    // kernel drops a SIGTSTP sent to its (orphaned) process group.
    if !signal_briefly(process, Signal::Stop).await {
        tracing::warn!("cannot stop the command; stopping capexec only");
    }
    // SAFETY: raise(3) on ourselves; SIGSTOP cannot be caught, so this
    // returns when we are continued.
    unsafe { libc::raise(libc::SIGSTOP) };
    if !signal_briefly(process, Signal::Cont).await {
        tracing::warn!("cannot continue the command");
    }
}

/// Sends `signal` to the command, waiting at most [`FORWARD_WAIT`] for the
/// server; whether it was delivered.
async fn signal_briefly(process: &ResilientProcess, signal: Signal) -> bool {
    let current = process.current();
    let sent = current.signal(signal);
    matches!(tokio::time::timeout(FORWARD_WAIT, sent).await, Ok(Ok(())))
}
