//! Subscriptions as a `futures::Stream` of events.

use std::collections::VecDeque;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use futures::Stream;
use tokio::sync::mpsc;

use crate::capexec_capnp::{event_sink, subscription};
use crate::client::Error;
use crate::model::{Event, EventBody};
use crate::wire;

/// Batches buffered between the sink and the consumer. Small on purpose: a
/// consumer that stops reading stops acknowledging pushes, which slows the
/// server's delivery (and, in lossless mode, the child).
const BUFFERED_BATCHES: usize = 4;

struct SinkImpl {
    batches: mpsc::Sender<Vec<Event>>,
}

impl event_sink::Server for SinkImpl {
    async fn push(self: Rc<Self>, params: event_sink::PushParams) -> Result<(), capnp::Error> {
        let events = wire::events_from_wire(params.get()?.get_events()?)?;
        self.batches
            .send(events)
            .await
            .map_err(|_| capnp::Error::failed("the subscriber dropped its event stream".into()))
    }
}

/// What a sink hands to the [`EventStream`] it feeds.
pub(crate) struct Feed {
    batches: mpsc::Receiver<Vec<Event>>,
}

/// Creates the sink to pass to `Process.subscribe` and the feed of its stream.
pub(crate) fn sink() -> (event_sink::Client, Feed) {
    let (batches, receiver) = mpsc::channel(BUFFERED_BATCHES);
    let feed = Feed { batches: receiver };
    (capnp_rpc::new_client(SinkImpl { batches }), feed)
}

/// The events of a process in seq order, ending after `closed`. Dropping it
/// ends the subscription.
pub struct EventStream {
    batches: mpsc::Receiver<Vec<Event>>,
    pending: VecDeque<Event>,
    saw_closed: bool,
    failed: bool,
    _subscription: subscription::Client,
}

impl EventStream {
    pub(crate) fn new(feed: Feed, subscription: subscription::Client) -> EventStream {
        EventStream {
            batches: feed.batches,
            pending: VecDeque::new(),
            saw_closed: false,
            failed: false,
            _subscription: subscription,
        }
    }
}

impl EventStream {
    /// The next batch of consecutive events as the server pushed it, for
    /// consumers that handle many small events at once; `None` after
    /// `closed`.
    pub async fn next_batch(&mut self) -> Option<Result<Vec<Event>, Error>> {
        if !self.pending.is_empty() {
            let batch: Vec<Event> = self.pending.drain(..).collect();
            self.note_closed(&batch);
            return Some(Ok(batch));
        }
        if self.saw_closed || self.failed {
            return None;
        }
        match self.batches.recv().await {
            Some(batch) => {
                self.note_closed(&batch);
                Some(Ok(batch))
            }
            None => {
                self.failed = true;
                Some(Err(Error::EventsEnded))
            }
        }
    }

    fn note_closed(&mut self, batch: &[Event]) {
        if batch
            .iter()
            .any(|event| matches!(event.body, EventBody::Closed))
        {
            self.saw_closed = true;
        }
    }
}

impl Stream for EventStream {
    type Item = Result<Event, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                if matches!(event.body, EventBody::Closed) {
                    self.saw_closed = true;
                }
                return Poll::Ready(Some(Ok(event)));
            }
            if self.saw_closed || self.failed {
                return Poll::Ready(None);
            }
            match self.batches.poll_recv(cx) {
                Poll::Ready(Some(batch)) => self.pending.extend(batch),
                Poll::Ready(None) => {
                    self.failed = true;
                    return Poll::Ready(Some(Err(Error::EventsEnded)));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
