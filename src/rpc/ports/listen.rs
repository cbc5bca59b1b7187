//! `listen`: a listening socket's accept loop, handing each connection to
//! the client's acceptor.

use std::cell::RefCell;
use std::rc::{Rc, Weak};

use capnp::Error;
use tokio::sync::Semaphore;
use tokio::task::{AbortHandle, spawn_local};

use super::connection::{Connection, open, start_reading};
use super::tied::{Tied, tied_to};
use super::{ListenParams, ListenResults, MAX_PENDING_ACCEPTS, text_param};
use crate::capexec_capnp::{port_acceptor, port_listener};
use crate::model::{PortUse, io_message, port_address};
use crate::ports::{Listening, PortRules};
use crate::rpc::port_quota::{PortQuota, PortTicket};
use crate::wire::{self};

/// A listening socket's accept loop and the connections it accepted.
pub(super) struct Listener {
    accepting: AbortHandle,
    accepted: Rc<RefCell<Vec<Weak<Connection>>>>,
}

impl Listener {
    /// Stops listening (the loop owns the socket) and resets every
    /// accepted connection still open.
    pub(super) fn close(&self, reason: &str) {
        self.accepting.abort();
        for connection in self.accepted.borrow_mut().drain(..) {
            if let Some(connection) = connection.upgrade() {
                connection.reset(reason);
            }
        }
    }
}

/// `PortListener`: holding it keeps the socket listening.
struct ListenerHandle {
    listener: Rc<Listener>,
    _ticket: PortTicket,
}

impl port_listener::Server for ListenerHandle {}

impl Drop for ListenerHandle {
    fn drop(&mut self) {
        self.listener.close("the listener was released");
    }
}

/// `Executor.listen` on this machine under `rules`, or `Process.listen`
/// with the process's capability's forwards as `tie`.
pub(crate) async fn listen(
    rules: &PortRules,
    quota: &PortQuota,
    params: ListenParams,
    mut results: ListenResults,
    tie: Option<Weak<Tied>>,
) -> Result<(), Error> {
    let params = params.get()?;
    let asked = text_param(params.get_address())?;
    let acceptor = params.get_acceptor()?;
    let address = port_address(&asked, PortUse::Listen)?;
    tied_to(tie.as_ref())?;
    let ticket = quota.take_listener()?;
    let listening = crate::ports::listen(&address, &asked, rules).await?;
    // Dropped (a Unix socket's file removed) if the process went meanwhile.
    let tied = tied_to(tie.as_ref())?;
    let bound = listening.address().to_string();
    let accepted = Rc::new(RefCell::new(Vec::new()));
    let accepting = spawn_local(accept_loop(
        listening,
        acceptor,
        quota.clone(),
        Rc::clone(&accepted),
    ))
    .abort_handle();
    let listener = Rc::new(Listener {
        accepting,
        accepted,
    });
    if let Some(tied) = tied {
        tied.add_listener(&listener);
    }
    let mut results = results.get();
    results.set_listener(capnp_rpc::new_client(ListenerHandle {
        listener,
        _ticket: ticket,
    }));
    results.set_address(bound.as_str());
    Ok(())
}

async fn accept_loop(
    listening: Listening,
    acceptor: port_acceptor::Client,
    quota: PortQuota,
    accepted: Rc<RefCell<Vec<Weak<Connection>>>>,
) {
    let pending = std::sync::Arc::new(Semaphore::new(MAX_PENDING_ACCEPTS));
    loop {
        // Until there is room, connections wait in the kernel's backlog.
        let Ok(slot) = std::sync::Arc::clone(&pending).acquire_owned().await else {
            return;
        };
        // Until the connection may hold one more, connections wait in the
        // kernel's backlog; a listener that waits holds no place itself.
        quota.wait_for_room().await;
        let (socket, info) = match listening.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors, or a connection that died in the
                // backlog: the listener goes on, a moment later.
                tracing::warn!(
                    "accepting on {}: {}",
                    listening.address(),
                    io_message(&error)
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        // Taken by a dial meanwhile: this one waits for the next place.
        let ticket = quota.wait_for_stream().await;
        let (connection, handle, to_socket) = open(socket, ticket);
        {
            let mut list = accepted.borrow_mut();
            list.retain(|weak| weak.strong_count() > 0);
            list.push(Rc::downgrade(&connection));
        }
        let mut request = acceptor.accept_request();
        {
            let mut params = request.get();
            params.set_connection(handle);
            params.set_to_socket(to_socket);
            wire::port_info_to_wire(&info, params.init_info());
        }
        let answer = request.send().promise;
        let quota = quota.clone();
        spawn_local(async move {
            let result = answer
                .await
                .and_then(|response| response.get()?.get_from_socket());
            drop(slot);
            match result {
                Ok(from_socket) => start_reading(&connection, from_socket, &quota),
                Err(error) => connection.reset(&format!(
                    "the acceptor refused the connection: {}",
                    wire::describe(&error)
                )),
            }
        });
    }
}
