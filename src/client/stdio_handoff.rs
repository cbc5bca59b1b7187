//! Handing the caller's own descriptors to a start on the same machine, to
//! be its child's stdin, stdout or stderr as they are (see
//! `StartParams.passedStdio`): the child then reads and writes them itself
//! and nothing is relayed.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::os::fd::OwnedFd;
use std::rc::Rc;

use crate::conn::StdioRoute;
use crate::model::PassedStdio;

/// Descriptors for one start's stdio, and whether the start took them.
/// Clones share them; they are handed over once, by the first start of a
/// [`crate::client::Command`] that carries them.
#[derive(Clone)]
pub struct StdioHandoff(Rc<Handoff>);

struct Handoff {
    route: StdioRoute,
    /// stdin, stdout, stderr; taken when they are handed over.
    descriptors: RefCell<Option<[Option<OwnedFd>; 3]>>,
    has_stdin: bool,
    taken: Cell<bool>,
}

impl StdioHandoff {
    /// `stdin`, `stdout` and `stderr` (those given) to go over `route` (a
    /// Unix connection's, `net::Connection::stdio_route`, or an in-process
    /// executor's).
    pub fn new(
        route: StdioRoute,
        stdin: Option<OwnedFd>,
        stdout: Option<OwnedFd>,
        stderr: Option<OwnedFd>,
    ) -> StdioHandoff {
        StdioHandoff(Rc::new(Handoff {
            route,
            has_stdin: stdin.is_some(),
            descriptors: RefCell::new(Some([stdin, stdout, stderr])),
            taken: Cell::new(false),
        }))
    }

    /// Whether the child has them: known once the start has answered.
    /// When false the start has pipes as usual (an older server, one that
    /// forwarded the start, a restricted executor), and its output comes
    /// as events, its stdin through `write`.
    pub fn taken(&self) -> bool {
        self.0.taken.get()
    }

    /// Whether a stdin is among them (when taken, the child reads it
    /// itself, and nothing is to be written to the process).
    pub fn has_stdin(&self) -> bool {
        self.0.has_stdin
    }

    /// Sends the descriptors (the first time only) and says where they are.
    pub(crate) fn hand_over(&self) -> Option<PassedStdio> {
        let [stdin, stdout, stderr] = self.0.descriptors.borrow_mut().take()?;
        let passed = PassedStdio {
            first: 0,
            stdin: stdin.is_some(),
            stdout: stdout.is_some(),
            stderr: stderr.is_some(),
        };
        if passed.count() == 0 {
            return None;
        }
        let first = self
            .0
            .route
            .hand_over([stdin, stdout, stderr].into_iter().flatten().collect());
        Some(PassedStdio { first, ..passed })
    }

    pub(crate) fn answered(&self, taken: bool) {
        self.0.taken.set(taken);
    }
}

impl fmt::Debug for StdioHandoff {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("StdioHandoff")
            .field("taken", &self.taken())
            .finish_non_exhaustive()
    }
}
