//! A clean shutdown's last words to its connections: once every process
//! has been terminated, the subscriptions deliver what their processes
//! logged (exits included), then every connection is closed with an abort
//! message that says why, so a client can tell an operator's stop from a
//! crash (see the schema's conventions).

use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The reason a clean shutdown's abort message gives.
pub const SHUTDOWN_REASON: &str = "the server is shutting down";

/// How long subscriptions may take to deliver what their processes
/// logged before the connections close anyway (a client that does not
/// read must not hold the shutdown).
const DELIVERY_WAIT: Duration = Duration::from_secs(2);

/// How long the abort messages may take to leave.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// The served connections of a server, and the signal that closes them.
pub(crate) struct Closing {
    signal: CancellationToken,
    open: watch::Sender<usize>,
    /// What the abort messages say: a shutdown, or an upgrade.
    reason: std::cell::Cell<&'static str>,
}

/// Counts a served connection while it lives.
pub(crate) struct Open(watch::Sender<usize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.send_modify(|open| *open -= 1);
    }
}

impl Closing {
    pub fn new() -> Closing {
        Closing {
            signal: CancellationToken::new(),
            open: watch::channel(0).0,
            reason: std::cell::Cell::new(SHUTDOWN_REASON),
        }
    }

    /// Counts a connection until the guard is dropped.
    pub fn opened(&self) -> Open {
        self.open.send_modify(|open| *open += 1);
        Open(self.open.clone())
    }

    /// Completes when the connections are to close with
    /// [`SHUTDOWN_REASON`].
    pub async fn closing(&self) {
        self.signal.cancelled().await;
    }

    /// The error every connection is closed with.
    pub fn reason(&self) -> capnp::Error {
        capnp::Error::disconnected(self.reason.get().to_string())
    }

    /// Closes every connection now with `reason` (an upgrade: nothing is
    /// terminated first, and no delivery is waited for, since a resuming
    /// client reads on where it was) and waits (within a bound) for them
    /// to be closed.
    pub async fn close_all_now(&self, reason: &'static str) {
        self.reason.set(reason);
        self.signal.cancel();
        let mut open = self.open.subscribe();
        let closed = open.wait_for(|open| *open == 0);
        if tokio::time::timeout(CLOSE_WAIT, closed).await.is_err() {
            tracing::warn!("some connections were still closing at the upgrade");
        }
    }

    /// Called once the processes have been terminated: waits (within a
    /// bound) for the subscriptions to deliver, then closes every
    /// connection with the reason and waits (within a bound) for them to
    /// be closed.
    pub async fn close_all(&self) {
        let delivered = crate::rpc::deliveries_finished();
        if tokio::time::timeout(DELIVERY_WAIT, delivered)
            .await
            .is_err()
        {
            tracing::warn!(
                "some subscriptions had not delivered their events within {} of the shutdown",
                crate::model::show_duration(DELIVERY_WAIT)
            );
        }
        self.signal.cancel();
        let mut open = self.open.subscribe();
        let closed = open.wait_for(|open| *open == 0);
        if tokio::time::timeout(CLOSE_WAIT, closed).await.is_err() {
            tracing::warn!("some connections were still closing at shutdown");
        }
    }
}
