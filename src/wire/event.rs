//! Events and exits, both directions.

use std::time::Duration;

use crate::capexec_capnp::{self as wire, event, exit_status, resource_usage};
use crate::model::{Event, EventBody, Exit, ExitStatus, OutputStream, ResourceUsage, Signal};
use crate::wire::received;
use crate::wire::signal::{signal_from_wire, signal_to_wire};

/// Received output shares its message's buffer if it is at least an
/// eighth of it: a push carries up to 256 KiB in a few events, and what a
/// subscriber keeps is bounded by the pushes it holds (four batches).
const OUTPUT_HELD_PER_BYTE: usize = 8;

pub fn stream_to_wire(stream: OutputStream) -> wire::OutputStream {
    match stream {
        OutputStream::Stdout => wire::OutputStream::Stdout,
        OutputStream::Stderr => wire::OutputStream::Stderr,
        OutputStream::Pty => wire::OutputStream::Pty,
    }
}

pub fn stream_from_wire(stream: wire::OutputStream) -> OutputStream {
    match stream {
        wire::OutputStream::Stdout => OutputStream::Stdout,
        wire::OutputStream::Stderr => OutputStream::Stderr,
        wire::OutputStream::Pty => OutputStream::Pty,
    }
}

pub fn exit_to_wire(exit: &Exit, mut builder: exit_status::Builder<'_>) {
    match exit.status {
        ExitStatus::Code(code) => builder.set_code(code),
        ExitStatus::Killed {
            signal,
            number,
            core_dumped,
        } => {
            let mut killed = builder.reborrow().init_killed();
            killed.set_signal(signal.map(signal_to_wire).unwrap_or(wire::Signal::Unknown));
            killed.set_number(number);
            killed.set_core_dumped(core_dumped);
        }
    }
    builder.set_timed_out(exit.timed_out);
    builder.set_killed_by_memory_limit(exit.killed_by_memory_limit);
    builder.set_server_shutdown(exit.server_shutdown);
    if let Some(usage) = &exit.usage {
        usage_to_wire(usage, builder.init_usage());
    }
}

pub fn exit_from_wire(reader: exit_status::Reader<'_>) -> capnp::Result<Exit> {
    let status = match reader.which()? {
        exit_status::Code(code) => ExitStatus::Code(code),
        exit_status::Killed(killed) => {
            // Name first: the number is the server's and may differ here.
            let signal = killed.get_signal().ok().and_then(signal_from_wire);
            ExitStatus::Killed {
                signal,
                number: signal.map(Signal::number).unwrap_or(killed.get_number()),
                core_dumped: killed.get_core_dumped(),
            }
        }
    };
    let usage = if reader.has_usage() {
        Some(usage_from_wire(reader.get_usage()?))
    } else {
        None
    };
    Ok(Exit {
        status,
        timed_out: reader.get_timed_out(),
        usage,
        killed_by_memory_limit: reader.get_killed_by_memory_limit(),
        server_shutdown: reader.get_server_shutdown(),
    })
}

fn usage_to_wire(usage: &ResourceUsage, mut builder: resource_usage::Builder<'_>) {
    builder.set_user_cpu_micros(usage.user_cpu.as_micros() as u64);
    builder.set_system_cpu_micros(usage.system_cpu.as_micros() as u64);
    builder.set_peak_rss_bytes(usage.peak_rss_bytes);
}

fn usage_from_wire(usage: resource_usage::Reader<'_>) -> ResourceUsage {
    ResourceUsage {
        user_cpu: Duration::from_micros(usage.get_user_cpu_micros()),
        system_cpu: Duration::from_micros(usage.get_system_cpu_micros()),
        peak_rss_bytes: usage.get_peak_rss_bytes(),
    }
}

pub fn event_to_wire(event: &Event, builder: event::Builder<'_>) {
    event_to_wire_but_data(event, builder, false);
}

/// As [`event_to_wire`], leaving an output's data unset if `leave_data`
/// (for the caller to place, see [`events_to_wire_without_data`]).
fn event_to_wire_but_data(event: &Event, mut builder: event::Builder<'_>, leave_data: bool) {
    builder.set_seq(event.seq);
    match &event.body {
        EventBody::Output { stream, data } => {
            let mut output = builder.init_output();
            output.set_stream(stream_to_wire(*stream));
            if !leave_data {
                output.set_data(data);
            }
        }
        EventBody::Exited(exit) => exit_to_wire(exit, builder.init_exited()),
        EventBody::Closed => builder.set_closed(()),
        EventBody::Gap { from_seq } => builder.init_gap().set_from_seq(*from_seq),
    }
}

pub fn event_from_wire(reader: event::Reader<'_>) -> capnp::Result<Event> {
    let body = match reader.which()? {
        event::Output(output) => {
            let output = output?;
            EventBody::Output {
                stream: stream_from_wire(output.get_stream()?),
                data: received::bytes_of(output.get_data()?, OUTPUT_HELD_PER_BYTE),
            }
        }
        event::Exited(exit) => EventBody::Exited(exit_from_wire(exit?)?),
        event::Closed(()) => EventBody::Closed,
        event::Gap(gap) => EventBody::Gap {
            from_seq: gap?.get_from_seq(),
        },
    };
    Ok(Event {
        seq: reader.get_seq(),
        body,
    })
}

/// Room for `events` in one message, but for the data of the events
/// `data_apart` names (by index), which go to segments of their own: what
/// a push counts against its subscription's window with those data's
/// bytes. Generous per-event overhead; the payload dominates.
pub fn events_message_size_but_data(
    events: &[Event],
    data_apart: impl Fn(usize) -> bool,
) -> capnp::MessageSize {
    let words: usize = events
        .iter()
        .enumerate()
        .map(|(index, event)| match &event.body {
            EventBody::Output { data, .. } if !data_apart(index) => 8 + data.len().div_ceil(8),
            _ => 8,
        })
        .sum();
    capnp::MessageSize {
        word_count: (16 + words) as u64,
        cap_count: 0,
    }
}

pub fn events_to_wire(events: &[Event], mut list: capnp::struct_list::Builder<'_, event::Owned>) {
    for (index, event) in events.iter().enumerate() {
        event_to_wire(event, list.reborrow().get(index as u32));
    }
}

/// As [`events_to_wire`], leaving every output's data unset, for the
/// caller to place after the rest of the message is built (as segments of
/// their own, `rpc/subscription.rs`).
pub fn events_to_wire_without_data(
    events: &[Event],
    mut list: capnp::struct_list::Builder<'_, event::Owned>,
) {
    for (index, event) in events.iter().enumerate() {
        event_to_wire_but_data(event, list.reborrow().get(index as u32), true);
    }
}

pub fn events_from_wire(
    list: capnp::struct_list::Reader<'_, event::Owned>,
) -> capnp::Result<Vec<Event>> {
    list.iter().map(event_from_wire).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// One event of every kind, with every field set.
    pub(crate) fn every_kind_of_event() -> Vec<Event> {
        let usage = ResourceUsage {
            user_cpu: Duration::from_micros(340_123),
            system_cpu: Duration::from_micros(23_456),
            peak_rss_bytes: 9_232_384,
        };
        vec![
            Event {
                seq: 1,
                body: EventBody::Output {
                    stream: OutputStream::Stdout,
                    data: Bytes::from_static(b"out\0\xff"),
                },
            },
            Event {
                seq: 2,
                body: EventBody::Output {
                    stream: OutputStream::Stderr,
                    data: Bytes::from_static(b"err"),
                },
            },
            Event {
                seq: 3,
                body: EventBody::Output {
                    stream: OutputStream::Pty,
                    data: Bytes::new(),
                },
            },
            Event {
                seq: 9,
                body: EventBody::Gap { from_seq: 4 },
            },
            Event {
                seq: 10,
                body: EventBody::Exited(Exit {
                    status: ExitStatus::Killed {
                        signal: Some(Signal::Term),
                        number: libc::SIGTERM,
                        core_dumped: true,
                    },
                    timed_out: true,
                    usage: Some(usage),
                    killed_by_memory_limit: true,
                    server_shutdown: true,
                }),
            },
            Event {
                seq: 11,
                body: EventBody::Exited(Exit::status(ExitStatus::Code(3))),
            },
            Event {
                seq: 12,
                body: EventBody::Closed,
            },
        ]
    }

    #[test]
    fn every_kind_of_event_survives_the_wire() {
        let events = every_kind_of_event();
        let mut message = capnp::message::Builder::new_default();
        let list = message
            .initn_root::<capnp::struct_list::Builder<'_, event::Owned>>(events.len() as u32);
        events_to_wire(&events, list);
        let reader = message
            .get_root_as_reader::<capnp::struct_list::Reader<'_, event::Owned>>()
            .expect("root");
        assert_eq!(events_from_wire(reader).expect("decode"), events);
    }

    #[test]
    fn an_unnamed_signal_keeps_the_servers_number() {
        let exit = Exit::status(ExitStatus::Killed {
            signal: None,
            number: 40,
            core_dumped: false,
        });
        let mut message = capnp::message::Builder::new_default();
        exit_to_wire(&exit, message.init_root());
        let reader = message
            .get_root_as_reader::<exit_status::Reader<'_>>()
            .expect("root");
        assert_eq!(exit_from_wire(reader).expect("decode"), exit);
    }
}
