//! A bound on what a peer may have the other side work on at once.
//!
//! capnp-rpc reads and dispatches every call as it arrives and keeps no
//! limit, so a peer that sends calls faster than they are answered (or
//! that never lets them finish) could make this process hold an unbounded
//! number of them, with their parameters. The guard sits between capnp-rpc
//! and the two-party network and keeps a ledger of the peer's questions
//! (calls and bootstraps) from their arrival until they are answered (or
//! the peer finishes them): past [`CallLimits`] the connection is closed
//! with an `overloaded` error that names the limit. Honest clients stay far
//! below it: the client library keeps its own windows.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use capnp::capability::Promise;
use capnp_rpc::rpc_capnp::message;
use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::{Connection, IncomingMessage, OutgoingMessage, VatNetwork};

/// How much a peer may have outstanding on one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallLimits {
    /// Calls received and not yet answered.
    pub max_calls: usize,
    /// Their total size, parameters included, in bytes.
    pub max_bytes: usize,
}

impl CallLimits {
    /// No bound: for the client side of a connection, whose peer is the
    /// server the user chose, and whose "calls" are that server's pushes of
    /// output, held open by the client's own flow control.
    pub fn unlimited() -> CallLimits {
        CallLimits {
            max_calls: usize::MAX,
            max_bytes: usize::MAX,
        }
    }
}

impl Default for CallLimits {
    fn default() -> Self {
        CallLimits {
            max_calls: 8192,
            max_bytes: 64 << 20,
        }
    }
}

/// What a received call holds while it is outstanding. A stdin write's
/// data is copied into the process's own stdin queue (bounded per process)
/// as the call is dispatched, so only the rest of it counts here.
fn payload_bytes(
    call: &capnp_rpc::rpc_capnp::call::Reader<'_>,
    body: capnp::any_pointer::Reader<'_>,
) -> capnp::Result<usize> {
    use capnp::traits::HasTypeId;
    let is_write = call.get_interface_id()
        == <crate::capexec_capnp::process::Client as HasTypeId>::TYPE_ID
        && call.get_method_id() == WRITE_METHOD;
    if is_write {
        return Ok(0);
    }
    Ok(body.target_size()?.word_count as usize * 8)
}

/// `Process.write`'s ordinal in the schema.
const WRITE_METHOD: u16 = 1;

struct Ledger {
    limits: CallLimits,
    /// Size in bytes of each outstanding question, by its id.
    outstanding: HashMap<u32, usize>,
    bytes: usize,
}

impl Ledger {
    fn received(&mut self, incoming: &dyn IncomingMessage) -> capnp::Result<()> {
        let body = incoming.get_body()?;
        let (question, size) = match body.get_as::<message::Reader>()?.which() {
            Ok(message::Call(call)) => {
                let call = call?;
                (call.get_question_id(), payload_bytes(&call, body)?)
            }
            Ok(message::Bootstrap(bootstrap)) => (bootstrap?.get_question_id(), 0),
            Ok(message::Finish(finish)) => {
                self.answered(finish?.get_question_id());
                return Ok(());
            }
            // Other messages, and kinds this version does not know (which
            // capnp-rpc answers as unimplemented), are not questions.
            Ok(_) | Err(capnp::NotInSchema(_)) => return Ok(()),
        };
        if let Some(previous) = self.outstanding.insert(question, size) {
            self.bytes -= previous;
        }
        self.bytes += size;
        if self.outstanding.len() > self.limits.max_calls {
            return Err(capnp::Error::overloaded(format!(
                "more than {} calls outstanding on one connection; closing it",
                self.limits.max_calls
            )));
        }
        if self.bytes > self.limits.max_bytes {
            return Err(capnp::Error::overloaded(format!(
                "calls outstanding on one connection hold more than {} MiB; closing it",
                self.limits.max_bytes >> 20
            )));
        }
        Ok(())
    }

    fn sending(&mut self, outgoing: &dyn OutgoingMessage) {
        let answer = outgoing
            .get_body_as_reader()
            .and_then(|body| body.get_as::<message::Reader>())
            .ok()
            .and_then(|message| match message.which() {
                Ok(message::Return(Ok(answer))) => Some(answer.get_answer_id()),
                _ => None,
            });
        if let Some(answer) = answer {
            self.answered(answer);
        }
    }

    fn answered(&mut self, question: u32) {
        if let Some(size) = self.outstanding.remove(&question) {
            self.bytes -= size;
        }
    }
}

/// A two-party network whose connection is watched by a [`Ledger`].
pub(crate) struct GuardedNetwork<N> {
    inner: N,
    ledger: Rc<RefCell<Ledger>>,
}

impl<N> GuardedNetwork<N> {
    pub(crate) fn new(inner: N, limits: CallLimits) -> GuardedNetwork<N> {
        GuardedNetwork {
            inner,
            ledger: Rc::new(RefCell::new(Ledger {
                limits,
                outstanding: HashMap::new(),
                bytes: 0,
            })),
        }
    }
}

impl<N: VatNetwork<Side>> VatNetwork<Side> for GuardedNetwork<N> {
    fn connect(&mut self, host_id: Side) -> Option<Box<dyn Connection<Side>>> {
        let inner = self.inner.connect(host_id)?;
        Some(Box::new(GuardedConnection {
            inner,
            ledger: Rc::clone(&self.ledger),
        }))
    }

    fn accept(&mut self) -> Promise<Box<dyn Connection<Side>>, capnp::Error> {
        let accepted = self.inner.accept();
        let ledger = Rc::clone(&self.ledger);
        Promise::from_future(async move {
            let inner = accepted.await?;
            Ok(Box::new(GuardedConnection { inner, ledger }) as Box<dyn Connection<Side>>)
        })
    }

    fn drive_until_shutdown(&mut self) -> Promise<(), capnp::Error> {
        self.inner.drive_until_shutdown()
    }
}

struct GuardedConnection {
    inner: Box<dyn Connection<Side>>,
    ledger: Rc<RefCell<Ledger>>,
}

impl Connection<Side> for GuardedConnection {
    fn get_peer_vat_id(&self) -> Side {
        self.inner.get_peer_vat_id()
    }

    fn new_outgoing_message(&mut self, first_segment_word_size: u32) -> Box<dyn OutgoingMessage> {
        Box::new(GuardedOutgoing {
            inner: self.inner.new_outgoing_message(first_segment_word_size),
            ledger: Rc::clone(&self.ledger),
        })
    }

    fn receive_incoming_message(
        &mut self,
    ) -> Promise<Option<Box<dyn IncomingMessage>>, capnp::Error> {
        let receiving = self.inner.receive_incoming_message();
        let ledger = Rc::clone(&self.ledger);
        Promise::from_future(async move {
            let incoming = receiving.await?;
            if let Some(incoming) = &incoming {
                ledger.borrow_mut().received(incoming.as_ref())?;
            }
            Ok(incoming)
        })
    }

    fn new_stream(
        &mut self,
    ) -> (
        Box<dyn capnp_rpc::FlowController>,
        Promise<(), capnp::Error>,
    ) {
        self.inner.new_stream()
    }

    fn shutdown(&mut self, result: capnp::Result<()>) -> Promise<(), capnp::Error> {
        self.inner.shutdown(result)
    }
}

struct GuardedOutgoing {
    inner: Box<dyn OutgoingMessage>,
    ledger: Rc<RefCell<Ledger>>,
}

impl OutgoingMessage for GuardedOutgoing {
    fn get_body(&mut self) -> capnp::Result<capnp::any_pointer::Builder<'_>> {
        self.inner.get_body()
    }

    fn get_body_as_reader(&self) -> capnp::Result<capnp::any_pointer::Reader<'_>> {
        self.inner.get_body_as_reader()
    }

    fn send(
        self: Box<Self>,
    ) -> (
        Promise<(), capnp::Error>,
        Rc<capnp::message::Builder<capnp::message::HeapAllocator>>,
    ) {
        self.ledger.borrow_mut().sending(self.inner.as_ref());
        self.inner.send()
    }

    fn take(self: Box<Self>) -> capnp::message::Builder<capnp::message::HeapAllocator> {
        self.inner.take()
    }

    fn size_in_words(&self) -> usize {
        self.inner.size_in_words()
    }
}
