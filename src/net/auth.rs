//! The TCP bootstrap: a per-connection `Gatekeeper`.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use capnp::capability::Rc as CapRc;
use capnp_rpc::Disconnector;
use capnp_rpc::rpc_twoparty_capnp::Side;

use crate::capexec_capnp::{executor, gatekeeper};
use crate::net::token::Token;

/// Refusals after which the connection is closed.
pub(crate) const MAX_LOGIN_FAILURES: u32 = 3;

/// How long a TCP connection may stay without a successful login by
/// default: a peer that never logs in may not hold a connection open.
pub(crate) const LOGIN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Suffix of every login refusal (see the schema).
pub const UNAUTHENTICATED_TAG: &str = "[capexec:unauthenticated]";

pub(crate) struct GatekeeperImpl {
    executor: executor::Client,
    token: Arc<Token>,
    failures: Cell<u32>,
    /// Set by the first successful login.
    logged_in: Rc<Cell<bool>>,
    /// Filled once the connection's RpcSystem exists.
    disconnector: Rc<RefCell<Option<Disconnector<Side>>>>,
}

impl GatekeeperImpl {
    pub fn new(
        executor: executor::Client,
        token: Arc<Token>,
        disconnector: Rc<RefCell<Option<Disconnector<Side>>>>,
        login_deadline: std::time::Duration,
    ) -> GatekeeperImpl {
        let logged_in = Rc::new(Cell::new(false));
        // Closes the connection if nobody logs in within the deadline.
        let deadline = {
            let (logged_in, disconnector) = (Rc::clone(&logged_in), Rc::clone(&disconnector));
            async move {
                tokio::time::sleep(login_deadline).await;
                let taken = if logged_in.get() {
                    None
                } else {
                    disconnector.borrow_mut().take()
                };
                if let Some(disconnector) = taken {
                    tracing::warn!(
                        "closing a connection that did not log in within {:?}",
                        login_deadline
                    );
                    let _ = disconnector.await;
                }
            }
        };
        tokio::task::spawn_local(deadline);
        GatekeeperImpl {
            executor,
            token,
            failures: Cell::new(0),
            logged_in,
            disconnector,
        }
    }
}

impl gatekeeper::Server for GatekeeperImpl {
    async fn login(
        self: CapRc<Self>,
        params: gatekeeper::LoginParams,
        mut results: gatekeeper::LoginResults,
    ) -> Result<(), capnp::Error> {
        let candidate = params.get()?.get_token()?.to_str().unwrap_or("");
        if self.token.matches(candidate) {
            self.logged_in.set(true);
            results.get().set_executor(self.executor.clone());
            return Ok(());
        }
        let failures = self.failures.get() + 1;
        self.failures.set(failures);
        tracing::warn!(failures, "login refused");
        if failures >= MAX_LOGIN_FAILURES
            && let Some(disconnector) = self.disconnector.borrow_mut().take()
        {
            tracing::warn!("closing the connection after {failures} refused logins");
            tokio::task::spawn_local(async move {
                let _ = disconnector.await;
            });
        }
        Err(capnp::Error::failed(format!(
            "login refused: wrong token {UNAUTHENTICATED_TAG}"
        )))
    }
}
