//! What `Process` calls answer: flows, write statuses, read results and
//! process info, both directions.

use std::time::Duration;

use crate::capexec_capnp::{self as wire, process_info, read_result};
use crate::model::{Flow, ProcessSnapshot, ReadOutcome, WriteStatus};
use crate::wire::event::{events_from_wire, events_to_wire, exit_from_wire, exit_to_wire};
use crate::wire::sandbox::{confinement_from_wire, confinement_to_wire};

pub fn flow_to_wire(flow: Flow) -> wire::OutputFlow {
    match flow {
        Flow::Retain => wire::OutputFlow::Retain,
        Flow::Lossless => wire::OutputFlow::Lossless,
    }
}

pub fn flow_from_wire(flow: wire::OutputFlow) -> Flow {
    match flow {
        wire::OutputFlow::Retain => Flow::Retain,
        wire::OutputFlow::Lossless => Flow::Lossless,
    }
}

pub fn write_status_to_wire(status: WriteStatus) -> wire::WriteStatus {
    match status {
        WriteStatus::Accepted => wire::WriteStatus::Accepted,
        WriteStatus::StdinClosed => wire::WriteStatus::StdinClosed,
        WriteStatus::Starting => wire::WriteStatus::Starting,
        WriteStatus::Exited => wire::WriteStatus::Exited,
    }
}

pub fn write_status_from_wire(status: wire::WriteStatus) -> WriteStatus {
    match status {
        wire::WriteStatus::Accepted => WriteStatus::Accepted,
        wire::WriteStatus::StdinClosed => WriteStatus::StdinClosed,
        wire::WriteStatus::Starting => WriteStatus::Starting,
        wire::WriteStatus::Exited => WriteStatus::Exited,
    }
}

pub fn read_outcome_to_wire(outcome: &ReadOutcome, mut result: read_result::Builder<'_>) {
    events_to_wire(
        &outcome.events,
        result.reborrow().init_events(outcome.events.len() as u32),
    );
    result.set_next_seq(outcome.next_seq);
    result.set_closed(outcome.closed);
    match &outcome.exit {
        Some(exit) => exit_to_wire(exit, result.get_exit().init_exited()),
        None => result.get_exit().set_running(()),
    }
}

pub fn read_outcome_from_wire(result: read_result::Reader<'_>) -> capnp::Result<ReadOutcome> {
    let exit = match result.get_exit().which()? {
        read_result::exit::Running(()) => None,
        read_result::exit::Exited(exit) => Some(exit_from_wire(exit?)?),
    };
    Ok(ReadOutcome {
        events: events_from_wire(result.get_events()?)?,
        next_seq: result.get_next_seq(),
        exit,
        closed: result.get_closed(),
    })
}

pub fn snapshot_to_wire(snapshot: &ProcessSnapshot, mut info: process_info::Builder<'_>) {
    info.set_pid(snapshot.pid);
    info.set_tty(snapshot.tty);
    info.set_flow(flow_to_wire(snapshot.flow));
    info.set_stdin_open(snapshot.stdin_open);
    info.set_next_seq(snapshot.next_seq);
    info.set_closed(snapshot.closed);
    match &snapshot.exit {
        Some(exit) => exit_to_wire(exit, info.reborrow().get_exit().init_exited()),
        None => info.reborrow().get_exit().set_running(()),
    }
    info.set_retained_bytes(snapshot.retained_bytes);
    info.set_retained_chunks(snapshot.retained_chunks);
    info.set_peak_retained_bytes(snapshot.peak_retained_bytes);
    info.set_evicted_through_seq(snapshot.evicted_through_seq);
    info.set_unconsumed_bytes(snapshot.unconsumed_bytes);
    info.set_uptime_ms(snapshot.uptime.as_millis() as u64);
    info.set_timed_out(snapshot.timed_out);
    confinement_to_wire(&snapshot.confinement, info.reborrow().init_confinement());
    info.set_tree_running(snapshot.tree_running);
}

pub fn snapshot_from_wire(info: process_info::Reader<'_>) -> capnp::Result<ProcessSnapshot> {
    let exit = match info.get_exit().which()? {
        process_info::exit::Running(()) => None,
        process_info::exit::Exited(exit) => Some(exit_from_wire(exit?)?),
    };
    Ok(ProcessSnapshot {
        pid: info.get_pid(),
        tty: info.get_tty(),
        flow: flow_from_wire(info.get_flow()?),
        stdin_open: info.get_stdin_open(),
        next_seq: info.get_next_seq(),
        closed: info.get_closed(),
        exit,
        retained_bytes: info.get_retained_bytes(),
        retained_chunks: info.get_retained_chunks(),
        peak_retained_bytes: info.get_peak_retained_bytes(),
        evicted_through_seq: info.get_evicted_through_seq(),
        unconsumed_bytes: info.get_unconsumed_bytes(),
        uptime: Duration::from_millis(info.get_uptime_ms()),
        timed_out: info.get_timed_out(),
        confinement: if info.has_confinement() {
            confinement_from_wire(info.get_confinement()?)?
        } else {
            Default::default()
        },
        tree_running: info.get_tree_running(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Event, EventBody, Exit, ExitStatus, OutputStream, ResourceUsage};

    fn exit() -> Exit {
        Exit {
            status: ExitStatus::Code(7),
            timed_out: true,
            usage: Some(ResourceUsage {
                user_cpu: Duration::from_micros(1),
                system_cpu: Duration::from_micros(2),
                peak_rss_bytes: 3,
            }),
            killed_by_memory_limit: true,
            server_shutdown: true,
        }
    }

    #[test]
    fn a_read_result_survives_the_wire() {
        for exit in [None, Some(exit())] {
            let outcome = ReadOutcome {
                events: vec![Event {
                    seq: 4,
                    body: EventBody::Output {
                        stream: OutputStream::Stdout,
                        data: bytes::Bytes::from_static(b"x"),
                    },
                }],
                next_seq: 5,
                exit,
                closed: exit.is_some(),
            };
            let mut message = capnp::message::Builder::new_default();
            read_outcome_to_wire(&outcome, message.init_root());
            let reader = message
                .get_root_as_reader::<read_result::Reader<'_>>()
                .expect("root");
            assert_eq!(read_outcome_from_wire(reader).expect("decode"), outcome);
        }
    }

    #[test]
    fn process_info_survives_the_wire() {
        for exit in [None, Some(exit())] {
            let snapshot = ProcessSnapshot {
                pid: 4242,
                tty: true,
                flow: Flow::Lossless,
                stdin_open: true,
                next_seq: 17,
                closed: true,
                exit,
                retained_bytes: 1000,
                retained_chunks: 3,
                peak_retained_bytes: 2000,
                evicted_through_seq: 9,
                unconsumed_bytes: 500,
                uptime: Duration::from_millis(1234),
                timed_out: true,
                confinement: crate::model::Confinement {
                    tracking: crate::model::Tracking::Cgroup,
                    sandbox: None,
                    limits: crate::model::Limits::default(),
                    enforced: vec!["cgroup".into()],
                    not_enforced: Vec::new(),
                },
                tree_running: true,
            };
            let mut message = capnp::message::Builder::new_default();
            snapshot_to_wire(&snapshot, message.init_root());
            let reader = message
                .get_root_as_reader::<process_info::Reader<'_>>()
                .expect("root");
            assert_eq!(snapshot_from_wire(reader).expect("decode"), snapshot);
        }
    }

    #[test]
    fn write_statuses_and_flows_round_trip() {
        for status in [
            WriteStatus::Accepted,
            WriteStatus::StdinClosed,
            WriteStatus::Starting,
            WriteStatus::Exited,
        ] {
            assert_eq!(write_status_from_wire(write_status_to_wire(status)), status);
        }
        for flow in [Flow::Retain, Flow::Lossless] {
            assert_eq!(flow_from_wire(flow_to_wire(flow)), flow);
        }
    }
}
