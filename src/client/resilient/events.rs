//! The event stream of a resilient process: resubscribed after every
//! recovery just after the last event it delivered, so that each event
//! arrives exactly once, or an explicit [`Error::OutputLost`] says what the
//! server no longer had.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::LocalBoxFuture;
use futures::{FutureExt, Stream};

use crate::client::resilient::ResilientProcess;
use crate::client::{Error, EventStream};
use crate::model::{Event, EventBody};

/// The events of a [`ResilientProcess`] in seq order, each exactly once,
/// across recoveries; ends after `closed`. Read them by batch
/// ([`ResilientEvents::next_batch`], cancel-safe) or one by one as a
/// `futures::Stream` (not both on one stream).
pub struct ResilientEvents {
    /// The cursor; `None` while a poll of the `Stream` has lent it out.
    cursor: Option<Cursor>,
    /// The `Stream`'s batch being fetched, with the cursor it borrowed.
    fetching: Option<Fetch>,
    /// Events of a fetched batch the `Stream` has not handed out yet.
    pending: VecDeque<Event>,
}

/// A batch on its way, holding the cursor it was fetched with.
type Fetch = LocalBoxFuture<'static, (Cursor, Option<Result<Vec<Event>, Error>>)>;

/// Where the stream stands: the subscription on the current capability
/// (with the generation it was made on) and the last seq delivered.
struct Cursor {
    process: ResilientProcess,
    stream: Option<(EventStream, u64)>,
    last_seq: u64,
    /// The stream was just resubscribed after a recovery.
    resumed: bool,
    done: bool,
}

impl ResilientEvents {
    pub(super) fn new(process: ResilientProcess, after_seq: u64) -> ResilientEvents {
        ResilientEvents {
            cursor: Some(Cursor {
                process,
                stream: None,
                last_seq: after_seq,
                resumed: false,
                done: false,
            }),
            fetching: None,
            pending: VecDeque::new(),
        }
    }

    /// The next batch of consecutive events; `None` after `closed`. If the
    /// server no longer retains events that were missed while the
    /// connection was broken, [`Error::OutputLost`] says exactly which.
    pub async fn next_batch(&mut self) -> Option<Result<Vec<Event>, Error>> {
        if !self.pending.is_empty() {
            return Some(Ok(self.pending.drain(..).collect()));
        }
        if let Some(fetching) = self.fetching.take() {
            let (cursor, batch) = fetching.await;
            self.cursor = Some(cursor);
            return batch;
        }
        self.cursor.as_mut()?.next_batch().await
    }

    /// Subscribes now rather than at the first [`Self::next_batch`], so the
    /// subscription can travel with other pipelined calls (such as the
    /// start).
    pub async fn subscribe_now(&mut self) -> Result<(), Error> {
        match self.cursor.as_mut() {
            Some(cursor) => cursor.subscribe_now().await,
            None => Ok(()),
        }
    }
}

impl Stream for ResilientEvents {
    type Item = Result<Event, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Poll::Ready(Some(Ok(event)));
            }
            if self.fetching.is_none() {
                let Some(mut cursor) = self.cursor.take() else {
                    return Poll::Ready(None);
                };
                self.fetching = Some(
                    async move {
                        let batch = cursor.next_batch().await;
                        (cursor, batch)
                    }
                    .boxed_local(),
                );
            }
            let Some(fetching) = self.fetching.as_mut() else {
                return Poll::Ready(None);
            };
            let (cursor, batch) = match fetching.as_mut().poll(cx) {
                Poll::Ready(done) => done,
                Poll::Pending => return Poll::Pending,
            };
            self.fetching = None;
            self.cursor = Some(cursor);
            match batch {
                Some(Ok(batch)) => self.pending.extend(batch),
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                None => return Poll::Ready(None),
            }
        }
    }
}

impl Cursor {
    /// Cancel-safe: the stream stays in `self` while it is awaited, and
    /// `last_seq` and `resumed` change only with what is returned.
    async fn next_batch(&mut self) -> Option<Result<Vec<Event>, Error>> {
        loop {
            if self.done {
                return None;
            }
            let Some((stream, generation)) = self.stream.as_mut() else {
                let (process, generation) = match self.process.attached() {
                    Ok(attached) => attached,
                    Err(error) => return Some(Err(error)),
                };
                match process.events(self.last_seq).await {
                    Ok(stream) => self.stream = Some((stream, generation)),
                    Err(error) => {
                        if let Err(error) = self.recover_from(generation, error).await {
                            self.done = true;
                            return Some(Err(error));
                        }
                    }
                }
                continue;
            };
            let generation = *generation;
            match stream.next_batch().await {
                Some(Ok(batch)) => {
                    let fresh: Vec<Event> = batch
                        .into_iter()
                        .filter(|e| e.seq > self.last_seq)
                        .collect();
                    if fresh.is_empty() {
                        continue;
                    }
                    if self.resumed
                        && let Some(lost) = missed_while_away(self.last_seq, &fresh)
                    {
                        self.done = true;
                        return Some(Err(lost));
                    }
                    self.resumed = false;
                    if let Some(last) = fresh.last() {
                        self.last_seq = last.seq;
                        self.done = matches!(last.body, EventBody::Closed);
                    }
                    return Some(Ok(fresh));
                }
                Some(Err(error)) => {
                    self.stream = None;
                    let error = match error {
                        Error::EventsEnded => self.why_events_ended(generation).await,
                        other => other,
                    };
                    if let Err(error) = self.recover_from(generation, error).await {
                        self.done = true;
                        return Some(Err(error));
                    }
                }
                None => return None,
            }
        }
    }

    async fn subscribe_now(&mut self) -> Result<(), Error> {
        if self.stream.is_some() {
            return Ok(());
        }
        let (process, generation) = self.process.attached()?;
        let stream = process.events(self.last_seq).await?;
        self.stream = Some((stream, generation));
        Ok(())
    }

    /// Why a subscription ended early (`RemoteProcess::why_events_ended`),
    /// if the capability that made it is still the one attached.
    async fn why_events_ended(&self, generation: u64) -> Error {
        match self.process.attached() {
            Ok((process, current)) if current == generation => process.why_events_ended().await,
            _ => Error::EventsEnded,
        }
    }

    async fn recover_from(&mut self, generation: u64, error: Error) -> Result<(), Error> {
        if !error.is_transport_loss() || !self.process.resumes() {
            return Err(error);
        }
        // Set first: if this call is cancelled during the recovery, the
        // next one still checks what it resubscribes to.
        self.resumed = true;
        self.process.recover(generation, &error).await
    }
}

/// What the first batch after a resubscription says was lost, if anything:
/// a `gap` anywhere in it (the exit event may precede one), or (from a
/// server that did not say so) a jump in seqs.
fn missed_while_away(last_seq: u64, fresh: &[Event]) -> Option<Error> {
    let mut expected = last_seq + 1;
    for event in fresh {
        if let EventBody::Gap { from_seq } = event.body {
            return Some(Error::OutputLost {
                from_seq,
                to_seq: event.seq,
            });
        }
        if event.seq != expected {
            return Some(Error::OutputLost {
                from_seq: expected,
                to_seq: event.seq - 1,
            });
        }
        expected = event.seq + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ExitStatus;

    fn event(seq: u64, body: EventBody) -> Event {
        Event { seq, body }
    }

    #[test]
    fn a_resumed_batch_reports_a_gap_behind_the_exit_event() {
        let batch = [
            event(5, EventBody::Exited(ExitStatus::Code(0).into())),
            event(9, EventBody::Gap { from_seq: 6 }),
            event(10, EventBody::Closed),
        ];
        assert!(matches!(
            missed_while_away(4, &batch),
            Some(Error::OutputLost {
                from_seq: 6,
                to_seq: 9
            })
        ));
    }

    #[test]
    fn a_resumed_batch_reports_a_jump_in_seqs() {
        let batch = [event(7, EventBody::Closed)];
        assert!(matches!(
            missed_while_away(4, &batch),
            Some(Error::OutputLost {
                from_seq: 5,
                to_seq: 6
            })
        ));
        assert!(missed_while_away(6, &batch).is_none());
    }
}
