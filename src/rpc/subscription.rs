//! `Subscription`: delivers a process's events to a client's `EventSink`.

use capnp::any_pointer;
use futures::StreamExt;
use futures::stream::FuturesOrdered;
use tokio::task::AbortHandle;

use crate::capexec_capnp::{event_sink, subscription};
use crate::engine::Process;
use crate::model::EventBody;
use crate::rpc::{PUSH_BUDGET_BYTES, SUBSCRIPTION_WINDOW_BYTES};
use crate::wire;

thread_local! {
    /// How many deliveries run on this thread: a server's connections all
    /// run on its one thread, and its shutdown waits (within a bound) for
    /// them to deliver what their processes logged, exits included.
    static DELIVERING: tokio::sync::watch::Sender<usize> = tokio::sync::watch::channel(0).0;
}

/// Counts one delivery while it runs (see [`DELIVERING`]).
struct Delivering;

impl Delivering {
    fn new() -> Delivering {
        DELIVERING.with(|count| count.send_modify(|count| *count += 1));
        Delivering
    }
}

impl Drop for Delivering {
    fn drop(&mut self) {
        DELIVERING.with(|count| count.send_modify(|count| *count -= 1));
    }
}

/// Completes once no subscription of this thread is delivering any more:
/// each has delivered its process's `closed` event (and had it
/// acknowledged), or has ended otherwise (released, its sink failed).
pub async fn deliveries_finished() {
    let mut count = DELIVERING.with(|count| count.subscribe());
    let _ = count.wait_for(|count| *count == 0).await;
}

/// Delivery stops when the client releases this capability.
pub struct SubscriptionImpl {
    delivery: AbortHandle,
}

impl SubscriptionImpl {
    /// Pushes the events of `process` after `after_seq` to `sink`; an
    /// owner's subscription consumes what it delivers (lossless mode), an
    /// observer's does not. Must run inside a `LocalSet`.
    pub fn start(
        process: Process,
        sink: event_sink::Client,
        after_seq: u64,
        owner: bool,
    ) -> SubscriptionImpl {
        let delivery = tokio::task::spawn_local(deliver(process, sink, after_seq, owner));
        SubscriptionImpl {
            delivery: delivery.abort_handle(),
        }
    }
}

impl Drop for SubscriptionImpl {
    fn drop(&mut self) {
        self.delivery.abort();
    }
}

impl subscription::Server for SubscriptionImpl {}

/// Reads batches from the retained log at the subscriber's own cursor, so a
/// slow sink delays only itself, and pushes them with at most
/// [`SUBSCRIPTION_WINDOW_BYTES`] unacknowledged. (The sink's own `-> stream`
/// flow control would pace it the same way, but would not say which pushes
/// arrived: here each acknowledgement tells the engine that the events it
/// carried are safe with the owner, so lossless output that a lost
/// connection swallowed is still retained for a resumed subscription.)
async fn deliver(process: Process, sink: event_sink::Client, mut after_seq: u64, owner: bool) {
    let _delivering = Delivering::new();
    let mut in_flight = FuturesOrdered::new();
    let mut in_flight_bytes = 0usize;
    let mut finished = false;
    loop {
        if finished && in_flight.is_empty() {
            return;
        }
        let room = !finished && in_flight_bytes < SUBSCRIPTION_WINDOW_BYTES;
        tokio::select! {
            biased;
            acknowledged = in_flight.next(), if !in_flight.is_empty() => {
                match acknowledged {
                    Some(Ok((seq, bytes))) => {
                        if owner {
                            process.consume_through(seq);
                        }
                        in_flight_bytes -= bytes;
                    }
                    Some(Err(error)) => {
                        tracing::debug!(%error, "event sink failed; subscription ends");
                        return;
                    }
                    None => {}
                }
            }
            batch = process.next_batch(after_seq, PUSH_BUDGET_BYTES), if room => {
                let batch = match batch {
                    Ok(batch) => batch,
                    Err(error) => {
                        tracing::debug!(%error, "subscription cursor is invalid");
                        return;
                    }
                };
                let Some(last) = batch.events.last() else {
                    return;
                };
                let last_seq = last.seq;
                finished = matches!(last.body, EventBody::Closed);
                let size = wire::events_message_size(&batch.events);
                let mut request = sink.client.new_call::<event_sink::push_params::Owned, any_pointer::Owned>(
                    <event_sink::Client as capnp::traits::HasTypeId>::TYPE_ID,
                    0,
                    Some(size),
                );
                wire::events_to_wire(
                    &batch.events,
                    request.get().init_events(batch.events.len() as u32),
                );
                let bytes = (size.word_count as usize) * 8;
                let answer = request.send().promise;
                in_flight.push_back(async move { answer.await.map(|_| (last_seq, bytes)) });
                in_flight_bytes += bytes;
                if owner {
                    process.deliver_through(last_seq);
                }
                after_seq = last_seq;
            }
        }
    }
}
