//! What the RPC layer adds to the engine's hand-over (see
//! `engine/handover.rs`): which processes are detachable, under which
//! restore token and grace, and how the operator's view listed them.
//! Every process is handed over, but only detachable ones can be reached
//! after an upgrade (every connection is lost): the next binary ends the
//! rest as on any lost connection.

use std::rc::Rc;
use std::time::{Duration, SystemTime};

use crate::engine::{Handover, ProcessOwner};
use crate::rpc::ServerContext;
use crate::rpc::detach::Held;
use crate::rpc::quota::Quota;

/// One detachable process as the RPC layer hands it over.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct DetachedState {
    /// The engine's id of it in the binary before.
    pub engine_id: u64,
    pub token: String,
    pub grace_secs: u64,
    pub argv: Vec<Vec<u8>>,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_ms: u64,
}

/// The connection name the operator's view shows for a process handed
/// over while nobody has restored it.
const HANDED_OVER: &str = "handed over by an upgrade";

impl ServerContext {
    /// Writes the frozen engine down (see `Engine::freeze`, then
    /// `Engine::write_down`) once every connection is gone, and says which
    /// of its processes are detachable and how: the next binary keeps
    /// those under their restore tokens and ends the rest. Only an exec
    /// may follow.
    pub fn write_down_for_handover(&self) -> (Handover, Vec<DetachedState>) {
        let detached: Vec<DetachedState> = self
            .detachments()
            .held()
            .iter()
            .filter_map(|held| self.detached_state(held))
            .collect();
        // Kept to the exec: dropping one would end its process.
        std::mem::forget(self.detachments().held());
        (self.engine().write_down(), detached)
    }

    fn detached_state(&self, held: &Rc<Held>) -> Option<DetachedState> {
        let (token, grace) = held.detached()?;
        let (argv, started) = self
            .processes()
            .described(held)
            .unwrap_or_else(|| (Vec::new(), SystemTime::now()));
        Some(DetachedState {
            engine_id: held.owner().engine_id(),
            token,
            grace_secs: grace.as_secs(),
            argv,
            started_ms: started
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|since| since.as_millis() as u64)
                .unwrap_or(0),
        })
    }

    /// Parks the processes the binary before handed over, each under its
    /// restore token, listed in the operator's view as before.
    pub fn take_over_detached(
        &self,
        owners: Vec<(u64, ProcessOwner)>,
        detached: Vec<DetachedState>,
    ) {
        let mut owners: std::collections::HashMap<u64, ProcessOwner> = owners.into_iter().collect();
        let quota = Quota::builder(None, Default::default())
            .owned_by(HANDED_OVER)
            .build();
        for state in detached {
            let Some(owner) = owners.remove(&state.engine_id) else {
                continue;
            };
            let Ok(ticket) = quota.take() else { continue };
            let held = Held::take_over_parked(
                owner,
                self.detachments(),
                ticket,
                state.token,
                Duration::from_secs(state.grace_secs.max(1)),
            );
            let started = SystemTime::UNIX_EPOCH + Duration::from_millis(state.started_ms);
            self.processes().add_described(&held, state.argv, started);
        }
        // The owners left are of processes nobody can reach after the
        // upgrade: they end here, as on any lost connection.
        drop(owners);
    }
}
