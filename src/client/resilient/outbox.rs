//! The ordered stdin outbox of a resilient process: every write and
//! end-of-file is kept until the server has answered it, and after a
//! recovery the unanswered ones are sent again, in order, with their write
//! ids, so that the child sees each exactly once and never a hole.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

use tokio::sync::oneshot;

use crate::client::resilient::ResilientProcess;
use crate::client::resilient::link::LinkState;
use crate::client::{Error, OutgoingBytes, Pending, RemoteProcess};
use crate::model::WriteStatus;

/// Most stdin calls that may wait for an answer at once. The server
/// remembers the last 4096 write ids of a process, so every call that is
/// sent again after a recovery is still recognised as a repeat.
pub const MAX_UNANSWERED_WRITES: usize = 1024;

/// A stdin write or end-of-file, kept until the server has answered it.
struct Outgoing {
    kind: OutgoingKind,
    reply: Option<oneshot::Sender<Result<WriteStatus, Error>>>,
    /// On which generation's capability it was last sent (`None`: not yet).
    sent_on: Option<u64>,
    /// That call's answer, until the outbox driver takes it to wait on.
    answer: Option<Pending<WriteStatus>>,
}

pub(super) enum OutgoingKind {
    Write {
        data: OutgoingBytes,
        write_id: String,
    },
    CloseStdin,
}

#[derive(Default)]
pub(super) struct Outbox {
    queue: RefCell<VecDeque<Outgoing>>,
    /// Why stdin refuses every further call: one was refused, and sending
    /// later ones would leave a hole in the child's input.
    refused: RefCell<Option<String>>,
    /// A task answers the calls in order while the queue is not empty.
    driving: Cell<bool>,
}

impl ResilientProcess {
    pub(super) fn enqueue(&self, kind: OutgoingKind) -> Pending<WriteStatus> {
        let outbox = &self.inner.outbox;
        if outbox.queue.borrow().len() >= MAX_UNANSWERED_WRITES {
            *outbox.refused.borrow_mut() = Some(format!(
                "{MAX_UNANSWERED_WRITES} stdin calls were waiting for an answer; wait for \
                 writes before sending more (stdin now refuses every call, so the child \
                 never sees a hole in its input)"
            ));
        }
        if let Some(reason) = outbox.refused.borrow().clone() {
            return Pending::spawn(
                async move { Err(Error::Rpc(capnp::Error::overloaded(reason))) },
            );
        }
        let (reply, outcome) = oneshot::channel();
        let mut outgoing = Outgoing {
            kind,
            reply: Some(reply),
            sent_on: None,
            answer: None,
        };
        // Sent now only if nothing before it waits to be sent again, so
        // the order of the calls is kept.
        let link = self.inner.link.borrow();
        if matches!(link.state, LinkState::Up) {
            let generation = link.attached.generation;
            let in_order = outbox
                .queue
                .borrow()
                .iter()
                .all(|earlier| earlier.sent_on == Some(generation));
            if in_order {
                outgoing.sent_on = Some(generation);
                outgoing.answer = Some(send(&link.attached.process, &outgoing.kind));
            }
        }
        drop(link);
        outbox.queue.borrow_mut().push_back(outgoing);
        if !outbox.driving.replace(true) {
            tokio::task::spawn_local(self.clone().drive_outbox());
        }
        Pending::spawn(async move {
            outcome.await.unwrap_or_else(|_| {
                Err(Error::Rpc(capnp::Error::failed(
                    "the process handle was dropped".to_string(),
                )))
            })
        })
    }

    /// Answers stdin calls in order; after a recovery, sends again (in
    /// order) every call not yet answered on the new capability.
    async fn drive_outbox(self) {
        loop {
            let head = {
                let mut queue = self.inner.outbox.queue.borrow_mut();
                match queue.front_mut() {
                    Some(head) => (head.sent_on, head.answer.take()),
                    None => {
                        self.inner.outbox.driving.set(false);
                        return;
                    }
                }
            };
            let (Some(generation), Some(answer)) = head else {
                // Held back behind a recovery: wait for it, then send.
                if let Err(error) = self.recovered().await {
                    self.fail_outbox(&error);
                    return;
                }
                self.send_again();
                continue;
            };
            match answer.outcome().await {
                Err(error) if error.is_transport_loss() && self.inner.resume.is_some() => {
                    if let Err(error) = self.recover(generation, &error).await {
                        self.fail_outbox(&error);
                        return;
                    }
                    self.send_again();
                }
                result => {
                    let reply = self
                        .inner
                        .outbox
                        .queue
                        .borrow_mut()
                        .pop_front()
                        .and_then(|mut head| head.reply.take());
                    if let Some(reply) = reply {
                        let _ = reply.send(result);
                    }
                }
            }
        }
    }

    /// Sends every unanswered stdin call again, in order, on the current
    /// capability.
    fn send_again(&self) {
        let Ok((process, generation)) = self.attached() else {
            return;
        };
        for outgoing in self.inner.outbox.queue.borrow_mut().iter_mut() {
            if outgoing.sent_on != Some(generation) {
                outgoing.sent_on = Some(generation);
                outgoing.answer = Some(send(&process, &outgoing.kind));
            }
        }
    }

    fn fail_outbox(&self, error: &Error) {
        let pending: Vec<Outgoing> = self.inner.outbox.queue.borrow_mut().drain(..).collect();
        self.inner.outbox.driving.set(false);
        for mut outgoing in pending {
            if let Some(reply) = outgoing.reply.take() {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}

fn send(process: &RemoteProcess, kind: &OutgoingKind) -> Pending<WriteStatus> {
    match kind {
        OutgoingKind::Write { data, write_id } => process.write_outgoing_in_order(data, write_id),
        OutgoingKind::CloseStdin => {
            let closing = process.close_stdin_in_order();
            Pending::spawn(async move {
                closing.outcome().await?;
                Ok(WriteStatus::Accepted)
            })
        }
    }
}
