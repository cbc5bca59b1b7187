//! The capability thread's state: the executor and root every session
//! works on, and each MCP session's processes. Everything here is `!Send`
//! and lives inside the `LocalSet` (see `seam`).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::files::FileTools;
use super::seam::Jobs;
use crate::capexec_capnp::executor;
use crate::client::{Directory, RemoteProcess};
use crate::model::Exit;

/// Processes one session holds at once, running or ended.
pub const PROCESSES_PER_SESSION: usize = 64;

/// How long a session's end waits for its processes to be gone (their
/// termination's grace is 2 s).
const END_WAIT: Duration = Duration::from_secs(10);

/// How long processes of an ended session are kept on the executor with
/// --keep-processes (the longest a capexec executor keeps one).
const KEPT_FOR: Duration = Duration::from_secs(86_400);

/// What every session of one `capexec mcp` works on.
pub struct Local {
    /// Where commands start: the root's confined executor, or the plain
    /// one with --unconfined.
    pub executor: executor::Client,
    /// The root, for file tools: every path of theirs is resolved beneath
    /// it by the executor.
    pub directory: Directory,
    /// The root's absolute path on the executor's machine.
    pub root: PathBuf,
    pub keep_processes: bool,
    sessions: RefCell<HashMap<u64, Rc<Session>>>,
    /// The file tools, once the executor said where the root is.
    files: RefCell<Option<Rc<FileTools>>>,
}

impl Local {
    pub fn new(
        executor: executor::Client,
        directory: Directory,
        root: PathBuf,
        keep_processes: bool,
    ) -> Rc<Local> {
        Rc::new(Local {
            executor,
            directory,
            root,
            keep_processes,
            sessions: RefCell::new(HashMap::new()),
            files: RefCell::new(None),
        })
    }

    /// The file tools over the root, made at the first file call (they
    /// ask the executor where the root is; every session shares them).
    pub async fn files(&self) -> Result<Rc<FileTools>, String> {
        if let Some(files) = self.files.borrow().clone() {
            return Ok(files);
        }
        let files = Rc::new(
            FileTools::new(self.directory.clone(), self.root.clone())
                .await
                .map_err(|error| error.message)?,
        );
        self.files.replace(Some(files.clone()));
        Ok(files)
    }

    /// Session `key`, made at its first call.
    pub fn session(&self, key: u64) -> Rc<Session> {
        self.sessions.borrow_mut().entry(key).or_default().clone()
    }

    /// Runs the seam's jobs and ends each session whose key comes on
    /// `ends`, until both are closed and every session's end is done.
    pub async fn serve(self: Rc<Local>, jobs: Jobs<Local>, mut ends: mpsc::UnboundedReceiver<u64>) {
        let mut ending = tokio::task::JoinSet::new();
        let jobs = jobs.serve(self.clone());
        futures::pin_mut!(jobs);
        let mut jobs_done = false;
        loop {
            tokio::select! {
                () = &mut jobs, if !jobs_done => jobs_done = true,
                key = ends.recv() => match key {
                    Some(key) => {
                        let session = self.sessions.borrow_mut().remove(&key);
                        if let Some(session) = session {
                            ending.spawn_local(session.end(self.keep_processes));
                        }
                    }
                    None if jobs_done => break,
                    None => {
                        (&mut jobs).await;
                        jobs_done = true;
                    }
                },
            }
        }
        // Sessions never ended by their handler (capexec is ending).
        let left: Vec<Rc<Session>> = self.sessions.borrow_mut().drain().map(|(_, s)| s).collect();
        for session in left {
            ending.spawn_local(session.end(self.keep_processes));
        }
        while ending.join_next().await.is_some() {}
    }
}

/// One MCP session's processes, oldest first.
#[derive(Default)]
pub struct Session {
    pub processes: RefCell<VecDeque<Rc<Entry>>>,
    next_id: Cell<u64>,
}

/// A process a session started.
pub struct Entry {
    pub id: String,
    pub process: RemoteProcess,
    pub argv: Vec<String>,
    pub started_at_ms: u64,
    /// `exec` answered with it still running: a cancelled call no longer
    /// ends it.
    pub handed_back: Cell<bool>,
    /// Its exit, once seen.
    pub exit: Cell<Option<Exit>>,
    writes: Cell<u64>,
}

impl Entry {
    /// A write id for a write the caller gave none.
    pub fn next_write_id(&self) -> String {
        let n = self.writes.get() + 1;
        self.writes.set(n);
        format!("capexec-mcp-{n}")
    }

    /// Its exit, asking the executor if it is not known yet.
    pub async fn refresh_exit(&self) -> Result<Option<Exit>, crate::client::Error> {
        if let Some(exit) = self.exit.get() {
            return Ok(Some(exit));
        }
        let info = self.process.info().await?;
        if info.exit.is_some() {
            self.exit.set(info.exit);
        }
        Ok(info.exit)
    }
}

impl Session {
    pub fn find(&self, id: &str) -> Option<Rc<Entry>> {
        self.processes.borrow().iter().find(|e| e.id == id).cloned()
    }

    /// Makes room for one more process: forgets the oldest ended one if
    /// the session is full; an error if every one is running.
    pub async fn make_room(&self) -> Result<(), String> {
        if self.processes.borrow().len() < PROCESSES_PER_SESSION {
            return Ok(());
        }
        let entries: Vec<Rc<Entry>> = self.processes.borrow().iter().cloned().collect();
        for entry in entries {
            if matches!(entry.refresh_exit().await, Ok(Some(_)) | Err(_)) {
                self.forget(&entry);
                return Ok(());
            }
        }
        Err(format!(
            "capexec: exec: this session holds {PROCESSES_PER_SESSION} processes and every one \
             is running: end one first (process_terminate)"
        ))
    }

    /// Records a started process under a new id.
    pub fn add(&self, process: RemoteProcess, argv: Vec<String>) -> Rc<Entry> {
        let n = self.next_id.get() + 1;
        self.next_id.set(n);
        let started_at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64);
        let entry = Rc::new(Entry {
            id: format!("p{n}"),
            process,
            argv,
            started_at_ms,
            handed_back: Cell::new(false),
            exit: Cell::new(None),
            writes: Cell::new(0),
        });
        self.processes.borrow_mut().push_back(entry.clone());
        entry
    }

    /// Forgets a process whose start failed.
    pub fn forget(&self, entry: &Rc<Entry>) {
        self.processes
            .borrow_mut()
            .retain(|kept| !Rc::ptr_eq(kept, entry));
    }

    /// The session is over: its processes end (terminated, then waited
    /// for, briefly), or with `keep` are left on the executor for a day,
    /// detached.
    async fn end(self: Rc<Session>, keep: bool) {
        let entries: Vec<Rc<Entry>> = self.processes.borrow_mut().drain(..).collect();
        if keep {
            for entry in &entries {
                if let Err(error) = entry.process.detachable(KEPT_FOR).await {
                    tracing::warn!(process = %entry.id, %error, "cannot keep the process");
                }
            }
            return;
        }
        for entry in &entries {
            if let Err(error) = entry.process.terminate().await {
                tracing::debug!(process = %entry.id, %error, "cannot terminate the process");
            }
        }
        let deadline = Instant::now() + END_WAIT;
        for entry in &entries {
            wait_ended(&entry.process, deadline).await;
        }
    }
}

/// Waits until `process` has exited, or `deadline`.
async fn wait_ended(process: &RemoteProcess, deadline: Instant) {
    let mut after = 0;
    loop {
        let wait = deadline.saturating_duration_since(Instant::now());
        if wait.is_zero() {
            return;
        }
        match process.read(after, 1, wait).await {
            Ok(outcome) if outcome.exit.is_some() => return,
            Ok(outcome) => after = outcome.next_seq.saturating_sub(1),
            Err(_) => return,
        }
    }
}
