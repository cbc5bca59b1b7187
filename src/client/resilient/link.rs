//! The way to a resilient process: the capability calls go to now, and
//! whether it works, is being restored, or could not be restored.

use std::rc::Weak;
use std::time::Duration;

use futures::FutureExt;
use futures::future::{LocalBoxFuture, Shared};
use tokio::time::Instant;

use crate::client::error::RecoveryFailure;
use crate::client::resilient::{Connect, Inner, RecoveryNote, Session};
use crate::client::{Error, RemoteProcess, restore};

/// Shortest and longest wait between recovery attempts.
const FIRST_RETRY: Duration = Duration::from_millis(50);
const MAX_RETRY: Duration = Duration::from_secs(1);

/// A recovery in progress, shared by every call that waits for it.
pub(super) type Recovery = Shared<LocalBoxFuture<'static, Result<(), RecoveryFailure>>>;

/// The capability calls go to, and how it was obtained.
pub(super) struct Attached {
    pub(super) process: RemoteProcess,
    /// Keeps the connection of `process` alive.
    pub(super) _session: Option<Session>,
    /// Counts the connections the process was reached through (one more
    /// with every restore), so a call can tell whether a recovery happened
    /// since it failed.
    pub(super) generation: u64,
}

/// Where the way to the process stands.
pub(super) enum LinkState {
    /// Calls go to the attached capability.
    Up,
    /// It broke; this recovery is restoring it.
    Recovering(Recovery),
    /// The recovery gave up after `cause`: every call fails with that.
    Failed {
        failure: RecoveryFailure,
        cause: Error,
    },
}

pub(super) struct Link {
    pub(super) attached: Attached,
    pub(super) state: LinkState,
}

impl Link {
    pub(super) fn new(process: RemoteProcess, session: Session) -> Link {
        Link {
            attached: Attached {
                process,
                _session: Some(session),
                generation: 0,
            },
            state: LinkState::Up,
        }
    }

    /// The error every call gets once the recovery has given up.
    pub(super) fn failure(&self) -> Option<Error> {
        match &self.state {
            LinkState::Failed { failure, cause } => Some(Error::Recovery {
                failure: failure.clone(),
                cause: Box::new(cause.clone()),
            }),
            _ => None,
        }
    }
}

/// What a recovery needs: the way to reconnect, the token and the grace.
pub(super) struct Plan {
    pub(super) connect: Connect,
    pub(super) token: String,
    pub(super) grace: Duration,
}

/// Restores the process through `plan` (or fails at once without one) and
/// records the outcome in the handle, which it holds weakly: the recovery
/// is stored in the handle, and a handle dropped during a recovery must
/// still be freed.
pub(super) fn recovery(
    inner: Weak<Inner>,
    plan: Result<Plan, RecoveryFailure>,
    cause: Error,
) -> Recovery {
    async move {
        let outcome = match plan {
            Ok(plan) => {
                super::note(
                    &inner,
                    &RecoveryNote::Lost {
                        cause: cause.loss_reason(),
                        grace: plan.grace,
                    },
                );
                reattach(&plan).await
            }
            Err(failure) => Err(failure),
        };
        let Some(inner) = inner.upgrade() else {
            return Err(RecoveryFailure::HandleDropped);
        };
        let mut link = inner.link.borrow_mut();
        match outcome {
            Ok((process, session)) => {
                link.attached = Attached {
                    process,
                    _session: Some(session),
                    generation: link.attached.generation + 1,
                };
                link.state = LinkState::Up;
                drop(link);
                inner.note(&RecoveryNote::Restored);
                Ok(())
            }
            Err(failure) => {
                link.state = LinkState::Failed {
                    failure: failure.clone(),
                    cause,
                };
                drop(link);
                inner.note(&RecoveryNote::Failed {
                    reason: failure.to_string(),
                });
                Err(failure)
            }
        }
    }
    .boxed_local()
    .shared()
}

/// Reconnects and restores until it works or the grace is over; each
/// attempt is bounded by what is left of the grace, so a peer that accepts
/// but never answers cannot hold the recovery past it.
async fn reattach(plan: &Plan) -> Result<(RemoteProcess, Session), RecoveryFailure> {
    let deadline = Instant::now() + plan.grace;
    let gave_up = |last: Error| RecoveryFailure::GaveUp {
        grace: plan.grace,
        last: Box::new(last),
    };
    let mut wait = FIRST_RETRY;
    loop {
        let attempt = async {
            let session = (plan.connect)().await?;
            let (process, restored) = restore(session.executor(), &plan.token);
            restored.await?;
            Ok::<_, Error>((process, session))
        };
        match tokio::time::timeout_at(deadline, attempt).await {
            Ok(Ok(reattached)) => return Ok(reattached),
            Ok(Err(error)) if error.is_transport_loss() && Instant::now() + wait < deadline => {
                tracing::debug!(%error, "cannot restore the process yet");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_RETRY);
            }
            Ok(Err(error)) if error.is_transport_loss() => return Err(gave_up(error)),
            Ok(Err(error)) => return Err(RecoveryFailure::Refused(Box::new(error))),
            Err(_elapsed) => {
                return Err(gave_up(Error::Connect("no answer from the server".into())));
            }
        }
    }
}
