//! `Subscription`: delivers a process's events to a client's `EventSink`.

use tokio::task::AbortHandle;

use crate::capexec_capnp::{event_sink, subscription};
use crate::engine::Process;
use crate::model::EventBody;
use crate::rpc::{PUSH_BUDGET_BYTES, convert};

/// Delivery stops when the client releases this capability.
pub struct SubscriptionImpl {
    delivery: AbortHandle,
}

impl SubscriptionImpl {
    /// Starts delivering events after `after_seq` to `sink`. Must run inside
    /// a `LocalSet`.
    pub fn start(process: Process, sink: event_sink::Client, after_seq: u64) -> SubscriptionImpl {
        let delivery = tokio::task::spawn_local(deliver(process, sink, after_seq));
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
/// slow sink delays only itself. `send` waits for room in the stream's flow
/// control window, which paces delivery to the sink.
async fn deliver(process: Process, sink: event_sink::Client, mut after_seq: u64) {
    loop {
        let batch = match process.next_batch(after_seq, PUSH_BUDGET_BYTES).await {
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
        let finished = matches!(last.body, EventBody::Closed);
        let mut request: capnp::capability::StreamingRequest<event_sink::push_params::Owned> =
            sink.client.new_streaming_call(
                <event_sink::Client as capnp::traits::HasTypeId>::TYPE_ID,
                0,
                Some(convert::events_message_size(&batch.events)),
            );
        convert::events_to_wire(
            &batch.events,
            request.get().init_events(batch.events.len() as u32),
        );
        if let Err(error) = request.send().await {
            tracing::debug!(%error, "event sink failed; subscription ends");
            return;
        }
        process.consume_through(last_seq);
        after_seq = last_seq;
        if finished {
            return;
        }
    }
}
