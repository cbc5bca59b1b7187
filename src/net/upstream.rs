//! The link from this server to an upstream executor: connected on first
//! use, and after a failure connected again on a later use once a back-off
//! has passed, so a broken upstream costs its callers one clear error and
//! never a hang, and never affects the other environments.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{LocalBoxFuture, Shared};

use crate::capexec_capnp::executor;
use crate::model::{EnvironmentState, StartError, StartErrorKind};
use crate::net::address::Address;
use crate::net::connect::{Connection, connect};
use crate::net::token::Token;
use crate::rpc::{Upstream, convert};

/// First wait after a failed attempt; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// One `--upstream NAME=ADDR`, with its login token for TCP.
#[derive(Clone, Debug)]
pub struct UpstreamConfig {
    pub name: String,
    pub address: Address,
    pub token: Option<Token>,
}

type Attempt = Shared<LocalBoxFuture<'static, Result<executor::Client, String>>>;

enum LinkState {
    Idle,
    Connecting(Attempt),
    Connected(Connection),
    Failed {
        reason: String,
        /// The next use may try again from this moment.
        retry_at: Instant,
        /// The wait after the next failure.
        next_backoff: Duration,
    },
}

pub(crate) struct UpstreamLink {
    config: UpstreamConfig,
    state: RefCell<LinkState>,
}

impl UpstreamLink {
    pub(crate) fn new(config: UpstreamConfig) -> Rc<UpstreamLink> {
        Rc::new(UpstreamLink {
            config,
            state: RefCell::new(LinkState::Idle),
        })
    }

    fn unavailable(&self, reason: &str) -> capnp::Error {
        convert::start_error_to_wire(&StartError::new(
            StartErrorKind::UpstreamUnavailable,
            format!(
                "upstream {:?} ({}) is unavailable: {reason}",
                self.config.name, self.config.address
            ),
        ))
    }

    /// A connection that ended is a failure like any other, except that the
    /// first attempt after it may happen at once.
    fn notice_lost_connection(&self) {
        let mut state = self.state.borrow_mut();
        if matches!(&*state, LinkState::Connected(connection) if connection.is_closed()) {
            tracing::warn!(upstream = %self.config.name, "the upstream connection was lost");
            *state = LinkState::Failed {
                reason: "the connection was lost".to_string(),
                retry_at: Instant::now(),
                next_backoff: FIRST_BACKOFF,
            };
        }
    }

    fn attempt(self: &Rc<Self>, backoff: Duration) -> Attempt {
        let link = Rc::downgrade(self);
        let address = self.config.address.clone();
        let token = self.config.token.clone();
        let name = self.config.name.clone();
        async move {
            tracing::info!(upstream = %name, %address, "connecting to the upstream");
            let outcome = match connect(&address, token.as_ref()).await {
                Ok(connection) => match connection.ready().await {
                    Ok(()) => Ok(connection),
                    Err(error) => Err(convert::describe(&error)),
                },
                Err(error) => Err(error.to_string()),
            };
            let Some(link) = link.upgrade() else {
                return Err("the server is shutting down".to_string());
            };
            let mut state = link.state.borrow_mut();
            match outcome {
                Ok(connection) => {
                    tracing::info!(upstream = %name, "connected to the upstream");
                    let executor = connection.executor();
                    *state = LinkState::Connected(connection);
                    Ok(executor)
                }
                Err(reason) => {
                    tracing::warn!(upstream = %name, %reason, "cannot reach the upstream");
                    *state = LinkState::Failed {
                        reason: reason.clone(),
                        retry_at: Instant::now() + backoff,
                        next_backoff: (backoff * 2).min(MAX_BACKOFF),
                    };
                    Err(reason)
                }
            }
        }
        .boxed_local()
        .shared()
    }
}

impl Upstream for UpstreamLink {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn address(&self) -> String {
        self.config.address.to_string()
    }

    fn state(&self) -> EnvironmentState {
        self.notice_lost_connection();
        match &*self.state.borrow() {
            LinkState::Idle => EnvironmentState::Idle,
            LinkState::Connecting(_) => EnvironmentState::Connecting,
            LinkState::Connected(_) => EnvironmentState::Connected,
            LinkState::Failed {
                reason, retry_at, ..
            } => EnvironmentState::Failed {
                reason: reason.clone(),
                retry_in: retry_at.saturating_duration_since(Instant::now()),
            },
        }
    }

    fn executor(self: Rc<Self>) -> LocalBoxFuture<'static, Result<executor::Client, capnp::Error>> {
        self.notice_lost_connection();
        let (attempt, fresh) = {
            let mut state = self.state.borrow_mut();
            match &*state {
                LinkState::Connected(connection) => {
                    let executor = connection.executor();
                    return async move { Ok(executor) }.boxed_local();
                }
                LinkState::Connecting(attempt) => (attempt.clone(), false),
                LinkState::Failed {
                    reason, retry_at, ..
                } if Instant::now() < *retry_at => {
                    let wait = retry_at.saturating_duration_since(Instant::now());
                    let error = self.unavailable(&format!(
                        "{reason} (next attempt in {:.1}s)",
                        wait.as_secs_f64()
                    ));
                    return async move { Err(error) }.boxed_local();
                }
                LinkState::Failed { next_backoff, .. } => {
                    let attempt = self.attempt(*next_backoff);
                    *state = LinkState::Connecting(attempt.clone());
                    (attempt, true)
                }
                LinkState::Idle => {
                    let attempt = self.attempt(FIRST_BACKOFF);
                    *state = LinkState::Connecting(attempt.clone());
                    (attempt, true)
                }
            }
        };
        // Runs to its end even if every caller gives up waiting, so the
        // state never sticks at "connecting".
        if fresh {
            tokio::task::spawn_local(attempt.clone().map(drop));
        }
        async move { attempt.await.map_err(|reason| self.unavailable(&reason)) }.boxed_local()
    }

    fn close(&self) {
        *self.state.borrow_mut() = LinkState::Failed {
            reason: "the server is shutting down".to_string(),
            retry_at: Instant::now() + MAX_BACKOFF,
            next_backoff: MAX_BACKOFF,
        };
    }
}
