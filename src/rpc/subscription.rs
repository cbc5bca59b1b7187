//! `Subscription`: delivers a process's events to a client's `EventSink`.

use capnp::any_pointer;
use futures::StreamExt;
use futures::stream::FuturesOrdered;
use tokio::task::AbortHandle;

use crate::capexec_capnp::{event, event_sink, output, subscription};
use crate::engine::Process;
use crate::model::{Event, EventBody};
use crate::rpc::{PUSH_BUDGET_BYTES, SUBSCRIPTION_WINDOW_BYTES};
use crate::segment::{self, OutgoingBytes};
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
                let (request, bytes) = push_request(&sink, &batch.events);
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

type PushRequest = capnp::capability::Request<event_sink::push_params::Owned, any_pointer::Owned>;

/// `push(events)` to `sink`, and the bytes it counts against the window.
fn push_request(sink: &event_sink::Client, events: &[Event]) -> (PushRequest, usize) {
    let apart = data_apart(events);
    // What the window counts: the message (capnp-rpc sizes its first
    // segment by its own rule, not by this) and the data apart.
    let size = wire::events_message_size_but_data(events, |index| apart[index].is_some());
    let mut request: PushRequest = sink.client.new_call(
        <event_sink::Client as capnp::traits::HasTypeId>::TYPE_ID,
        0,
        Some(size),
    );
    // SAFETY: the request is returned to be sent as it is (`deliver`
    // sends it at once): nothing writes the events again.
    let apart_bytes = unsafe { push_params(request.get(), events, &apart) };
    (request, (size.word_count as usize) * 8 + apart_bytes)
}

/// The data of the output events that the engine read into memory laid
/// out as a segment (`segment.rs`), by index: each goes as that segment,
/// neither copied nor zeroed in the message, unless another message holds
/// it now (another subscriber's push on its way), when it is copied in as
/// any other.
fn data_apart(events: &[Event]) -> Vec<Option<OutgoingBytes>> {
    events
        .iter()
        .map(|event| match &event.body {
            EventBody::Output { data, .. } => {
                Some(OutgoingBytes::from(data.clone())).filter(OutgoingBytes::is_offerable)
            }
            _ => None,
        })
        .collect()
}

/// Sets `params` to `events`. Returns the bytes of the data `apart`
/// names, each placed in a segment of its own.
///
/// The outputs' data go in after the rest of the events: first the data
/// that goes apart, each a new segment of exactly its size, then the data
/// copied in. The other way round, copied data that did not fit the first
/// segment would go to a heap segment with room to spare, and a chunk
/// placed after it would be copied into that room instead of taken.
/// (A chunk another thread's message took between `data_apart` and here
/// would be copied in the first pass, and could leave such room: pushes
/// are all built on the serving thread, so none can.)
///
/// # Safety
///
/// The events' last write: while the message lives, nothing sets or
/// initialises the events, or the root, anew (each would zero the old
/// data, which may be a shared segment).
unsafe fn push_params(
    params: event_sink::push_params::Builder<'_>,
    events: &[Event],
    apart: &[Option<OutgoingBytes>],
) -> usize {
    let mut list = params.init_events(events.len() as u32);
    wire::events_to_wire_without_data(events, list.reborrow());
    let mut apart_bytes = 0;
    for (index, data) in apart.iter().enumerate() {
        let Some(data) = data else { continue };
        let output = output_of(list.reborrow(), index);
        let Ok(field) = segment::data_field::<output::Owned>(output, "data") else {
            unreachable!("`Output` has a Data field `data`");
        };
        // SAFETY: the field is made in this message alone, and nothing
        // writes it again (this function's contract).
        unsafe { segment::place_data(data, field) };
        apart_bytes += data.len();
    }
    for (index, event) in events.iter().enumerate() {
        if let EventBody::Output { data, .. } = &event.body
            && apart[index].is_none()
        {
            output_of(list.reborrow(), index).set_data(data);
        }
    }
    apart_bytes
}

/// The output of the event at `index` of `list`, which is one.
fn output_of(
    list: capnp::struct_list::Builder<'_, event::Owned>,
    index: usize,
) -> output::Builder<'_> {
    match list.get(index as u32).which() {
        Ok(event::Output(Ok(output))) => output,
        _ => unreachable!("an output event is written as one"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Exit, ExitStatus, OutputStream};
    use bytes::{BufMut, Bytes};

    fn laid_out(bytes: &[u8]) -> Bytes {
        let mut buffer = segment::SegmentBuffer::with_capacity(64 * 1024);
        buffer.put_slice(bytes);
        buffer.freeze_to_bytes()
    }

    fn output(seq: u64, stream: OutputStream, data: Bytes) -> Event {
        Event {
            seq,
            body: EventBody::Output { stream, data },
        }
    }

    /// The message `push_params` builds, its first segment the 1024 words
    /// capnp-rpc gives every call, whatever its size hint.
    fn built(events: &[Event]) -> capnp::message::Builder<capnp_rpc::MessageAllocator> {
        let apart = data_apart(events);
        let mut message = capnp::message::Builder::new(
            capnp_rpc::MessageAllocator::new().first_segment_words(1024),
        );
        let params = message.init_root::<event_sink::push_params::Builder>();
        // SAFETY: nothing writes the message after this.
        unsafe { push_params(params, events, &apart) };
        message
    }

    /// How many of `chunks` are segments of `message`, taken whole.
    fn taken(
        message: &capnp::message::Builder<capnp_rpc::MessageAllocator>,
        chunks: &[&Bytes],
    ) -> usize {
        let segments = message.get_segments_for_output();
        chunks
            .iter()
            .filter(|chunk| {
                segments
                    .iter()
                    .any(|segment| segment.as_ptr() as usize + 8 == chunk.as_ptr() as usize)
            })
            .count()
    }

    /// `message` as the connection writes it.
    fn on_the_wire(message: &capnp::message::Builder<capnp_rpc::MessageAllocator>) -> Vec<u8> {
        let mut wire = Vec::new();
        capnp::serialize::write_message(&mut wire, message).expect("write");
        wire
    }

    fn read_back(wire: &[u8]) -> Vec<Event> {
        let options = capnp::message::ReaderOptions {
            traversal_limit_in_words: None,
            nesting_limit: 64,
        };
        let message = capnp::serialize::read_message(&mut &wire[..], options).expect("read");
        let params: event_sink::push_params::Reader = message.get_root().expect("root");
        wire::events_from_wire(params.get_events().expect("events")).expect("events")
    }

    #[test]
    fn output_read_as_segments_leaves_in_them_and_reads_back_as_sent() {
        let pattern: Vec<u8> = (0..64 * 1024)
            .map(|i| (i * 7 + i / 251) as u8 | 1)
            .collect();
        let offered = laid_out(&pattern[..20_000]);
        // Offered to a message that still holds it: copied into this one.
        let mut holding = capnp::message::Builder::new(capnp_rpc::MessageAllocator::new());
        let holding_output = holding.init_root::<output::Builder>();
        let field = segment::data_field::<output::Owned>(holding_output, "data").expect("data");
        // SAFETY: nothing writes the message after this.
        assert!(unsafe { segment::place_data(&OutgoingBytes::from(offered.clone()), field) });
        let (whole, odd, last) = (
            laid_out(&pattern),
            laid_out(&pattern[..16_385]),
            laid_out(&pattern[1..65_535]),
        );
        let events = vec![
            output(1, OutputStream::Stdout, whole.clone()),
            output(2, OutputStream::Stderr, Bytes::from_static(b"a line\n")),
            output(3, OutputStream::Stdout, odd.clone()),
            output(4, OutputStream::Stdout, offered.clone()),
            // A slice: all but the first byte of a chunk, copied.
            output(
                5,
                OutputStream::Stdout,
                laid_out(&pattern[..30_000]).slice(1..),
            ),
            output(6, OutputStream::Stdout, last.clone()),
            Event {
                seq: 7,
                body: EventBody::Exited(Exit {
                    status: ExitStatus::Code(3),
                    timed_out: false,
                    usage: None,
                    killed_by_memory_limit: false,
                    server_shutdown: false,
                }),
            },
            Event {
                seq: 8,
                body: EventBody::Closed,
            },
        ];
        let message = built(&events);
        assert_eq!(taken(&message, &[&whole, &odd, &last, &offered]), 3);
        let wire = on_the_wire(&message);
        assert_eq!(read_back(&wire), events);
        // While a message holds them, the next copies them in; once it is
        // gone, the next takes them again.
        let copied = built(&events);
        assert_eq!(taken(&copied, &[&whole, &odd, &last]), 0);
        assert_eq!(read_back(&on_the_wire(&copied)), events);
        drop((message, copied));
        assert_eq!(taken(&built(&events), &[&whole, &odd, &last]), 3);
        drop(holding);
        assert_eq!(taken(&built(&events), &[&offered]), 1);
    }

    #[test]
    fn output_copied_before_a_chunk_leaves_no_room_that_takes_the_chunk() {
        // Copied data beyond the first segment goes to a heap segment with
        // room to spare, where a chunk placed after it would be copied.
        let stderr = |seq, len| output(seq, OutputStream::Stderr, Bytes::from(vec![b'e'; len]));
        let chunk = laid_out(&[b'o'; 16 * 1024]);
        let events = vec![
            stderr(1, 15 * 1024),
            stderr(2, 1024),
            stderr(3, 15 * 1024),
            output(4, OutputStream::Stdout, chunk.clone()),
        ];
        let message = built(&events);
        assert_eq!(taken(&message, &[&chunk]), 1);
        assert_eq!(read_back(&on_the_wire(&message)), events);
    }
}
