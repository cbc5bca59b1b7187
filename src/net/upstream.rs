//! The link from this server to an upstream executor: connected on first
//! use, and after a failure connected again on a later use once a back-off
//! has passed, so a broken upstream costs its callers one clear error, never
//! a hang, and never affects the other environments.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{LocalBoxFuture, Shared};

use crate::model::{EnvironmentState, Refusal, RefusalKind};
use crate::net::address::Address;
use crate::net::connect::{CONNECT_TIMEOUT, Connection, connect_with};
use crate::net::tls::TlsClient;
use crate::net::token::Token;
use crate::rpc::{Link, Upstream};

/// First wait after a failed attempt; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// One `--upstream NAME=ADDR`, with its login token for TCP.
#[derive(Clone, Debug)]
pub struct UpstreamConfig {
    pub name: String,
    pub address: Address,
    pub token: Option<Token>,
    /// TLS for a tcp: upstream.
    pub tls: Option<TlsClient>,
    /// How long connecting, logging in and the first answer may take
    /// together before the attempt counts as failed.
    pub connect_timeout: Duration,
}

impl UpstreamConfig {
    pub fn new(name: impl Into<String>, address: Address, token: Option<Token>) -> UpstreamConfig {
        UpstreamConfig {
            name: name.into(),
            address,
            token,
            tls: None,
            connect_timeout: CONNECT_TIMEOUT,
        }
    }
}

type Attempt = Shared<LocalBoxFuture<'static, Result<Link, String>>>;

enum LinkState {
    Idle,
    /// Attempt number `.0` is under way.
    Connecting(u64, Attempt),
    Connected(Connection, Link),
    Failed {
        reason: String,
        /// The next use may try again from this moment.
        retry_at: Instant,
        /// The wait after the next failure.
        next_backoff: Duration,
    },
    /// The server is shutting down: nothing goes upstream any more.
    Closed,
}

pub(crate) struct UpstreamLink {
    config: UpstreamConfig,
    state: RefCell<LinkState>,
    /// Numbers attempts; a connection's generation is its attempt's number.
    attempts: Cell<u64>,
}

impl UpstreamLink {
    pub(crate) fn new(config: UpstreamConfig) -> Rc<UpstreamLink> {
        Rc::new(UpstreamLink {
            config,
            state: RefCell::new(LinkState::Idle),
            attempts: Cell::new(0),
        })
    }

    fn unavailable(&self, reason: &str) -> capnp::Error {
        capnp::Error::from(Refusal::new(
            RefusalKind::UpstreamUnavailable,
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
        if matches!(&*state, LinkState::Connected(connection, _) if connection.is_closed()) {
            tracing::warn!(upstream = %self.config.name, "the upstream connection was lost");
            *state = LinkState::Failed {
                reason: "the connection was lost".to_string(),
                retry_at: Instant::now(),
                next_backoff: FIRST_BACKOFF,
            };
        }
    }

    /// Connects, logs in and checks that the server answers, all within
    /// the connect timeout; then records the outcome, unless the link was
    /// closed or moved on meanwhile.
    fn attempt(self: &Rc<Self>, number: u64, backoff: Duration) -> Attempt {
        let link = Rc::downgrade(self);
        let config = self.config.clone();
        async move {
            tracing::info!(upstream = %config.name, address = %config.address, "connecting to the upstream");
            let outcome = tokio::time::timeout(config.connect_timeout, establish(&config))
                .await
                .unwrap_or_else(|_| {
                    Err(format!(
                        "no answer within {:.1}s",
                        config.connect_timeout.as_secs_f64()
                    ))
                });
            let Some(link) = link.upgrade() else {
                return Err("the server is shutting down".to_string());
            };
            let mut state = link.state.borrow_mut();
            if !matches!(&*state, LinkState::Connecting(current, _) if *current == number) {
                // Closed meanwhile: the connection (if any) drops here.
                return Err("the server is shutting down".to_string());
            }
            match outcome {
                Ok(connection) => {
                    tracing::info!(upstream = %config.name, "connected to the upstream");
                    let ready = Link {
                        executor: connection.executor(),
                        generation: number,
                    };
                    *state = LinkState::Connected(connection, ready.clone());
                    Ok(ready)
                }
                Err(reason) => {
                    tracing::warn!(upstream = %config.name, %reason, "cannot reach the upstream");
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

impl UpstreamLink {
    fn await_attempt(
        self: Rc<Self>,
        attempt: Attempt,
    ) -> LocalBoxFuture<'static, Result<Link, capnp::Error>> {
        async move { attempt.await.map_err(|reason| self.unavailable(&reason)) }.boxed_local()
    }
}

/// A connection whose server has answered a call: a refused login, or a
/// socket that accepts but never speaks, fails here.
async fn establish(config: &UpstreamConfig) -> Result<Connection, String> {
    let connection = connect_with(&config.address, config.token.as_ref(), config.tls.as_ref())
        .await
        .map_err(|error| error.to_string())?;
    let answer = connection.executor().info_request().send().promise.await;
    match answer {
        // A server older than `info` still answers.
        Err(error) if error.kind != capnp::ErrorKind::Unimplemented => {
            Err(crate::wire::describe(&error))
        }
        _ => Ok(connection),
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
            LinkState::Connecting(..) => EnvironmentState::Connecting,
            LinkState::Connected(..) => EnvironmentState::Connected,
            LinkState::Failed {
                reason, retry_at, ..
            } => EnvironmentState::Failed {
                reason: reason.clone(),
                retry_in: retry_at.saturating_duration_since(Instant::now()),
            },
            LinkState::Closed => EnvironmentState::Failed {
                reason: "the server is shutting down".to_string(),
                retry_in: Duration::ZERO,
            },
        }
    }

    fn executor(self: Rc<Self>) -> LocalBoxFuture<'static, Result<Link, capnp::Error>> {
        self.notice_lost_connection();
        let attempt = {
            let mut state = self.state.borrow_mut();
            let backoff = match &*state {
                LinkState::Connected(_, link) => {
                    let link = link.clone();
                    return async move { Ok(link) }.boxed_local();
                }
                LinkState::Connecting(_, attempt) => {
                    let attempt = attempt.clone();
                    drop(state);
                    return self.await_attempt(attempt);
                }
                LinkState::Closed => {
                    let error = capnp::Error::from(Refusal::new(
                        RefusalKind::Unavailable,
                        "the server is shutting down",
                    ));
                    return async move { Err(error) }.boxed_local();
                }
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
                LinkState::Failed { next_backoff, .. } => *next_backoff,
                LinkState::Idle => FIRST_BACKOFF,
            };
            let number = self.attempts.get() + 1;
            self.attempts.set(number);
            let attempt = self.attempt(number, backoff);
            *state = LinkState::Connecting(number, attempt.clone());
            attempt
        };
        // Runs to its end even if every caller gives up waiting, so the
        // state never sticks at "connecting".
        tokio::task::spawn_local(attempt.clone().map(drop));
        self.await_attempt(attempt)
    }

    fn close(&self) {
        *self.state.borrow_mut() = LinkState::Closed;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::engine::Engine;
    use crate::net::{Server, ServerConfig};

    fn run(body: impl std::future::Future<Output = ()>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        tokio::task::LocalSet::new().block_on(&runtime, body);
    }

    /// A Unix socket that accepts connections and never says a word;
    /// returns how many it accepted.
    fn silent_listener(path: &std::path::Path) -> Arc<AtomicUsize> {
        let listener = tokio::net::UnixListener::bind(path).expect("bind");
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::task::spawn_local(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                held.push(stream);
            }
        });
        accepted
    }

    fn reason(link: &UpstreamLink) -> String {
        match link.state() {
            EnvironmentState::Failed { reason, .. } => reason,
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn a_silent_upstream_fails_in_bounded_time_with_one_attempt_for_all_callers() {
        run(async {
            let dir = tempfile::tempdir().expect("dir");
            let path = dir.path().join("silent.sock");
            let accepted = silent_listener(&path);
            let mut config = UpstreamConfig::new("silent", Address::Unix(path), None);
            config.connect_timeout = Duration::from_millis(200);
            let link = UpstreamLink::new(config);
            let (first, second) =
                futures::join!(Rc::clone(&link).executor(), Rc::clone(&link).executor());
            for outcome in [first, second] {
                let error = outcome.err().expect("no answer");
                assert!(
                    error
                        .extra
                        .contains("is unavailable: no answer within 0.2s"),
                    "{}",
                    error.extra
                );
            }
            assert_eq!(accepted.load(Ordering::SeqCst), 1);
            assert_eq!(reason(&link), "no answer within 0.2s");
        });
    }

    #[test]
    fn closing_during_an_attempt_is_final() {
        run(async {
            let dir = tempfile::tempdir().expect("dir");
            let config = ServerConfig {
                listen: vec![Address::Unix(dir.path().join("up.sock"))],
                ..ServerConfig::default()
            };
            let server = Server::bind(config, Engine::default()).await.expect("bind");
            let address = server.addresses().remove(0);
            tokio::task::spawn_local(server.serve_until(std::future::pending()));
            let link = UpstreamLink::new(UpstreamConfig::new("up", address, None));
            let pending = Rc::clone(&link).executor();
            link.close();
            let error = pending.await.err().expect("closed");
            assert!(
                error.extra.contains("the server is shutting down"),
                "{}",
                error.extra
            );
            assert_eq!(reason(&link), "the server is shutting down");
            let later = Rc::clone(&link).executor().await.err().expect("closed");
            assert!(
                later.extra.contains("[capexec:unavailable]"),
                "{}",
                later.extra
            );
        });
    }

    #[test]
    fn back_off_doubles_and_a_later_use_retries() {
        run(async {
            let dir = tempfile::tempdir().expect("dir");
            let path = dir.path().join("absent.sock");
            let link = UpstreamLink::new(UpstreamConfig::new("up", Address::Unix(path), None));
            assert!(Rc::clone(&link).executor().await.is_err());
            let retry_in = |link: &UpstreamLink| match link.state() {
                EnvironmentState::Failed { retry_in, .. } => retry_in,
                other => panic!("expected a failure, got {other:?}"),
            };
            assert!(retry_in(&link) <= FIRST_BACKOFF);
            // Pretend the back-off has passed: the next use tries again and
            // waits twice as long after failing again.
            if let LinkState::Failed { retry_at, .. } = &mut *link.state.borrow_mut() {
                *retry_at = Instant::now();
            }
            assert!(Rc::clone(&link).executor().await.is_err());
            assert!(retry_in(&link) > FIRST_BACKOFF);
            assert!(retry_in(&link) <= 2 * FIRST_BACKOFF);
            assert_eq!(link.attempts.get(), 2);
        });
    }
}
