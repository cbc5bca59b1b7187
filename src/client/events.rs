//! Subscriptions as a `futures::Stream` of events.

use std::cell::Cell;
use std::collections::VecDeque;
use std::pin::Pin;
use std::rc::Rc as SharedCell;
use std::task::{Context, Poll};

use capnp::capability::Rc;
use futures::Stream;
use tokio::sync::mpsc;

use crate::capexec_capnp::{event, event_sink, subscription};
use crate::client::Error;
use crate::model::{Event, EventBody};
use crate::rpc::convert::{self, ExitDetails};

/// Batches buffered between the sink and the consumer. Small on purpose: a
/// consumer that stops reading stops acknowledging pushes, which slows the
/// server's delivery (and, in lossless mode, the child).
const BUFFERED_BATCHES: usize = 4;

struct SinkImpl {
    batches: mpsc::Sender<Vec<Event>>,
    exit_details: SharedCell<Cell<Option<ExitDetails>>>,
}

impl event_sink::Server for SinkImpl {
    async fn push(self: Rc<Self>, params: event_sink::PushParams) -> Result<(), capnp::Error> {
        let wire_events = params.get()?.get_events()?;
        for event in wire_events.iter() {
            if let event::Exited(status) = event.which()? {
                self.exit_details
                    .set(Some(convert::exit_details_from_wire(status?)?));
            }
        }
        let events = convert::events_from_wire(wire_events)?;
        self.batches
            .send(events)
            .await
            .map_err(|_| capnp::Error::failed("the subscriber dropped its event stream".into()))
    }
}

/// What a sink hands to the [`EventStream`] it feeds.
pub(crate) struct Feed {
    batches: mpsc::Receiver<Vec<Event>>,
    exit_details: SharedCell<Cell<Option<ExitDetails>>>,
}

/// Creates the sink to pass to `Process.subscribe` and the feed of its stream.
pub(crate) fn sink() -> (event_sink::Client, Feed) {
    let (batches, receiver) = mpsc::channel(BUFFERED_BATCHES);
    let exit_details = SharedCell::new(Cell::new(None));
    let sink = SinkImpl {
        batches,
        exit_details: exit_details.clone(),
    };
    let feed = Feed {
        batches: receiver,
        exit_details,
    };
    (capnp_rpc::new_client(sink), feed)
}

/// The events of a process in seq order, ending after `closed`. Dropping it
/// ends the subscription.
pub struct EventStream {
    batches: mpsc::Receiver<Vec<Event>>,
    exit_details: SharedCell<Cell<Option<ExitDetails>>>,
    pending: VecDeque<Event>,
    saw_closed: bool,
    failed: bool,
    _subscription: subscription::Client,
}

impl EventStream {
    pub(crate) fn new(feed: Feed, subscription: subscription::Client) -> EventStream {
        EventStream {
            batches: feed.batches,
            exit_details: feed.exit_details,
            pending: VecDeque::new(),
            saw_closed: false,
            failed: false,
            _subscription: subscription,
        }
    }
}

impl EventStream {
    /// What the `exited` event said beyond the status (timed out, resource
    /// usage), once that event has arrived.
    pub fn exit_details(&self) -> Option<ExitDetails> {
        self.exit_details.get()
    }

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
