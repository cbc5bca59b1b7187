//! The TCP bootstrap: a per-connection `Gatekeeper`, and the deadline for
//! its login.

use std::cell::OnceCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures::future::LocalBoxFuture;

use crate::capexec_capnp::{executor, gatekeeper};
use crate::net::session::Session;
use crate::net::token::Token;

/// Refusals after which the connection is closed; later logins on it, even
/// ones already on their way, are not checked.
pub(crate) const MAX_LOGIN_FAILURES: u32 = 3;

/// How long a TCP connection may stay without a successful login by
/// default: a peer that never logs in may not hold a connection open.
pub(crate) const LOGIN_DEADLINE: Duration = Duration::from_secs(30);

/// Suffix of every login refusal (see the schema).
pub const UNAUTHENTICATED_TAG: &str = "[capexec:unauthenticated]";

/// On a server that runs logins as users: the executor a token logs in
/// to (its user's worker's), or why it does not.
pub(crate) type UsersLogin =
    Rc<dyn Fn(String) -> LocalBoxFuture<'static, Result<executor::Client, String>>>;

/// How a login is checked.
enum Check {
    /// Against the server's token; every login gets an executor of its own.
    Token {
        token: Arc<Token>,
        new_executor: Rc<dyn Fn() -> executor::Client>,
    },
    /// By the monitor of a server that runs logins as users.
    Users(UsersLogin),
}

pub(crate) struct GatekeeperImpl {
    check: Check,
    /// Made at the first successful login: one root (and so one process
    /// quota) per connection, however often it logs in.
    executor: OnceCell<executor::Client>,
    session: Rc<Session>,
}

impl GatekeeperImpl {
    pub fn new(
        new_executor: Rc<dyn Fn() -> executor::Client>,
        token: Arc<Token>,
        session: Rc<Session>,
    ) -> GatekeeperImpl {
        GatekeeperImpl {
            check: Check::Token {
                token,
                new_executor,
            },
            executor: OnceCell::new(),
            session,
        }
    }

    /// A gatekeeper whose logins run as the user their token maps to.
    pub fn for_users(users: UsersLogin, session: Rc<Session>) -> GatekeeperImpl {
        GatekeeperImpl {
            check: Check::Users(users),
            executor: OnceCell::new(),
            session,
        }
    }
}

/// Why a connection is closed after its refused logins.
fn too_many_refusals() -> capnp::Error {
    capnp::Error::failed(format!(
        "{MAX_LOGIN_FAILURES} logins were refused on this connection; closing it \
         {UNAUTHENTICATED_TAG}"
    ))
}

impl gatekeeper::Server for GatekeeperImpl {
    async fn login(
        self: Rc<Self>,
        params: gatekeeper::LoginParams,
        mut results: gatekeeper::LoginResults,
    ) -> Result<(), capnp::Error> {
        if self.session.refusals() >= MAX_LOGIN_FAILURES {
            return Err(too_many_refusals());
        }
        let candidate = params.get()?.get_token()?.to_str().unwrap_or("");
        let refusal = match &self.check {
            Check::Token {
                token,
                new_executor,
            } => {
                if token.matches(candidate) {
                    self.session.log_in();
                    let executor = self.executor.get_or_init(|| new_executor());
                    results.get().set_executor(executor.clone());
                    return Ok(());
                }
                "login refused: wrong token".to_string()
            }
            // One user per connection: a token cannot change it.
            Check::Users(_) if self.executor.get().is_some() => {
                return Err(capnp::Error::failed(format!(
                    "this connection has logged in already; a new login needs a new \
                     connection {UNAUTHENTICATED_TAG}"
                )));
            }
            Check::Users(users) => match users(candidate.to_string()).await {
                Ok(executor) => {
                    self.session.log_in();
                    let executor = self.executor.get_or_init(|| executor);
                    results.get().set_executor(executor.clone());
                    return Ok(());
                }
                Err(why) => why,
            },
        };
        crate::metrics::refused_login();
        let failures = self.session.refused();
        tracing::warn!(failures, "login refused");
        if failures >= MAX_LOGIN_FAILURES {
            tracing::warn!("closing the connection after {failures} refused logins");
            self.session.close(too_many_refusals());
        }
        Err(capnp::Error::failed(format!(
            "{refusal} {UNAUTHENTICATED_TAG}"
        )))
    }
}

/// Closes the connection of `session` if it has not logged in within
/// `deadline`. Runs as part of the connection, so it ends with it.
pub(crate) async fn enforce_login_deadline(session: Rc<Session>, deadline: Duration) {
    tokio::time::sleep(deadline).await;
    if !session.is_logged_in() {
        tracing::warn!("closing a connection that did not log in within {deadline:?}");
        session.close(capnp::Error::failed(format!(
            "no login within {}s; closing the connection {UNAUTHENTICATED_TAG}",
            deadline.as_secs_f64()
        )));
    }
}
