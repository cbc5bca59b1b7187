//! `dial`, and a direct connection's relay: both directions moved kernel
//! to kernel through the client's direct channel.

use std::io;
use std::rc::{Rc, Weak};

use capnp::Error;
use tokio::task::spawn_local;

use super::connection::{
    Connection, Direct, Queued, capabilities, open, reading_failure, start_reading, write_queue,
};
use super::tied::{Tied, tied_to};
use super::{DialParams, DialResults, text_param};
use crate::model::{PortUse, Refusal, RefusalKind, io_message, port_address};
use crate::ports::{PortRules, PumpError, Socket, socket_failure};
use crate::rpc::DIRECT_CLAIM_WITHIN;
use crate::rpc::direct::{CHANNEL_CLAIMED, Claim};
use crate::rpc::port_quota::PortQuota;
use crate::wire::{self};

/// `Executor.dial` on this machine under `rules`, or `Process.dial` with
/// the process's capability's forwards as `tie`.
pub(crate) async fn dial(
    rules: &PortRules,
    quota: &PortQuota,
    params: DialParams,
    mut results: DialResults,
    tie: Option<Weak<Tied>>,
) -> Result<(), Error> {
    let params = params.get()?;
    let asked = text_param(params.get_address())?;
    let from_socket = params.get_from_socket()?;
    let asks_direct = params.get_direct();
    let address = port_address(&asked, PortUse::Dial)?;
    tied_to(tie.as_ref())?;
    let ticket = quota.take_stream()?;
    let socket = crate::ports::dial(&address, &asked, rules).await?;
    // Released while connecting: the peer that just accepted sees a
    // reset, as every other connection of that capability did, not a
    // clean end of file.
    let tied = tied_to(tie.as_ref()).inspect_err(|_| socket.prepare_reset())?;
    let info = socket.info();
    let direct = if asks_direct {
        quota.issue_direct()
    } else {
        None
    };
    // A direct connection's relay, not the sinks' writer, moves its bytes.
    let (connection, handle, to_socket) = if direct.is_some() {
        capabilities(socket, ticket)
    } else {
        open(socket, ticket)
    };
    if let Some(tied) = tied {
        tied.add_connection(&connection);
    }
    let mut results = results.get();
    match direct {
        Some((direct_ticket, claim, hold)) => {
            *connection.direct_hold.borrow_mut() = Some(hold);
            connection.direct.set(Direct::Offered);
            *connection.from_socket.borrow_mut() = Some(from_socket);
            let relay = spawn_local(relay_direct(Rc::clone(&connection), claim, quota.clone()));
            connection.track(relay.abort_handle());
            results.set_direct_ticket(&direct_ticket);
        }
        None => start_reading(&connection, from_socket, quota),
    }
    results.set_connection(handle);
    results.set_to_socket(to_socket);
    wire::port_info_to_wire(&info, results.init_info());
    Ok(())
}

/// A direct connection's relay: waits for its channel, then moves both
/// directions kernel to kernel, and says on the sinks how each ended.
async fn relay_direct(connection: Rc<Connection>, claim: Claim, quota: PortQuota) {
    let claimed = tokio::select! {
        // A decline seen in the same poll as a claim wins: its write may
        // have been queued (and answered) already.
        biased;
        () = connection.declined.notified() => {
            // The sinks carry the bytes from here (the write that declined
            // is queued already).
            let writer = spawn_local(write_queue(Rc::clone(&connection)));
            connection.track(writer.abort_handle());
            let from_socket = connection.from_socket.borrow_mut().take();
            if let Some(from_socket) = from_socket {
                start_reading(&connection, from_socket, &quota);
            }
            return;
        }
        channel = claim.channel() => channel,
    };
    let Some(channel) = claimed else {
        connection.reset(&format!(
            "its direct channel was not opened within {} s",
            DIRECT_CLAIM_WITHIN.as_secs()
        ));
        return;
    };
    let channel = Rc::new(channel);
    let Some(socket) = connection.socket() else {
        channel.prepare_reset();
        return;
    };
    connection.direct.set(Direct::Claimed);
    // Tells the client its channel is the connection's (a channel that
    // reached a server that did not grant it is closed unanswered).
    if let Err(error) = channel.write_all(&[CHANNEL_CLAIMED]).await {
        connection.reset(&channel_failed(&error));
        return;
    }
    *connection.channel.borrow_mut() = Some(Rc::clone(&channel));
    futures::join!(
        relay_to_socket(&connection, &channel, &socket),
        relay_from_socket(&connection, &socket, &channel),
    );
}

/// Moves one direction of a direct connection to its end of file; false
/// (the connection reset, saying why in the words given) if it failed.
async fn pumped(
    connection: &Connection,
    from: &Socket,
    to: &Socket,
    reading: fn(&io::Error) -> String,
    writing: fn(&io::Error) -> String,
) -> bool {
    let reason = match crate::ports::pump(from, to).await {
        Ok(_) => return true,
        Err(PumpError::Reading(error)) => reading(&error),
        Err(PumpError::Writing(error)) => writing(&error),
        Err(PumpError::Pipe(error)) => no_pipe(&error),
    };
    connection.reset(&reason);
    false
}

/// Client to socket: the channel's end of file is the client's end once
/// `end` has come too (a failure or a release resets instead).
async fn relay_to_socket(connection: &Rc<Connection>, channel: &Socket, socket: &Socket) {
    let writing = |error: &io::Error| socket_failure("writing to the connection", error).message;
    if !pumped(connection, channel, socket, channel_failed, writing).await {
        return;
    }
    loop {
        let next = connection.queue.borrow_mut().pop_front();
        match next {
            Some(Queued::End(done)) => {
                let result = socket.shutdown_write().map_err(|error| {
                    socket_failure("shutting the connection down for writing", &error)
                });
                match result {
                    Ok(()) => {
                        connection.to_ended.set(true);
                        let _ = done.send(Ok(()));
                        connection.close_if_done();
                    }
                    Err(refusal) => {
                        let _ = done.send(Err(refusal.clone()));
                        connection.reset(&refusal.message);
                    }
                }
                return;
            }
            // Refused when they came (`ToSocket::queue_write`).
            Some(Queued::Write(_, done)) => {
                let _ = done.send(Err(Refusal::new(
                    RefusalKind::InvalidArgument,
                    "a write on a direct connection",
                )));
            }
            None => connection.queue_changed.notified().await,
        }
    }
}

/// Socket to client: the peer's end of file is passed on as the
/// channel's, then `end` on the client's sink.
async fn relay_from_socket(connection: &Rc<Connection>, socket: &Socket, channel: &Socket) {
    if !pumped(connection, socket, channel, reading_failure, channel_failed).await {
        return;
    }
    if let Err(error) = channel.shutdown_write() {
        connection.reset(&channel_failed(&error));
        return;
    }
    let Some(sink) = connection.from_socket.borrow().clone() else {
        return;
    };
    match sink.end_request().send().promise.await {
        Ok(_) => {
            connection.from_ended.set(true);
            connection.from_socket.borrow_mut().take();
            connection.close_if_done();
        }
        Err(error) => connection.reset(&format!(
            "the client's end of the connection failed: {}",
            wire::describe(&error)
        )),
    }
}

/// Why a direct connection ended when its channel failed.
fn channel_failed(error: &io::Error) -> String {
    format!("the client's direct channel failed: {}", io_message(error))
}

/// Why a direct connection's relay could not go on without a pipe.
fn no_pipe(error: &io::Error) -> String {
    format!(
        "the server has no pipe for the relay: {}",
        io_message(error)
    )
}
