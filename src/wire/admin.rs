//! `ProcessRecord` (the admin capability's list), both directions.

use std::time::{Duration, SystemTime};

use crate::capexec_capnp::process_record;
use crate::model::ProcessRecord;
use crate::wire::event::{exit_from_wire, exit_to_wire};

pub fn process_record_to_wire(record: &ProcessRecord, mut builder: process_record::Builder<'_>) {
    builder.set_pid(record.pid);
    let mut argv = builder.reborrow().init_argv(record.argv.len() as u32);
    for (index, argument) in record.argv.iter().enumerate() {
        argv.set(index as u32, argument);
    }
    builder.set_environment(record.environment.as_str());
    let started = record
        .started
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    builder.set_started_ms(started.as_millis() as u64);
    match &record.exit {
        None => builder.reborrow().init_state().set_running(()),
        Some(exit) => exit_to_wire(exit, builder.reborrow().init_state().init_exited()),
    }
    match &record.owner {
        Some(connection) => builder
            .reborrow()
            .init_owner()
            .set_connection(connection.as_str()),
        None => builder.reborrow().init_owner().set_detached(()),
    }
    builder.set_cpu_ms(record.cpu_ms);
    builder.set_memory_bytes(record.memory_bytes);
}

pub fn process_record_from_wire(
    reader: process_record::Reader<'_>,
) -> capnp::Result<ProcessRecord> {
    let argv = reader
        .get_argv()?
        .iter()
        .map(|argument| argument.map(<[u8]>::to_vec))
        .collect::<capnp::Result<Vec<_>>>()?;
    let exit = match reader.get_state().which()? {
        process_record::state::Running(()) => None,
        process_record::state::Exited(exit) => Some(exit_from_wire(exit?)?),
    };
    let owner = match reader.get_owner().which()? {
        process_record::owner::Connection(connection) => Some(connection?.to_string()?),
        process_record::owner::Detached(()) => None,
    };
    Ok(ProcessRecord {
        pid: reader.get_pid(),
        argv,
        environment: reader.get_environment()?.to_string()?,
        started: SystemTime::UNIX_EPOCH + Duration::from_millis(reader.get_started_ms()),
        exit,
        owner,
        cpu_ms: reader.get_cpu_ms(),
        memory_bytes: reader.get_memory_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Exit, ExitStatus};

    fn round_trip(record: &ProcessRecord) -> ProcessRecord {
        let mut message = capnp::message::Builder::new_default();
        process_record_to_wire(record, message.init_root());
        let reader = message
            .get_root_as_reader::<process_record::Reader<'_>>()
            .expect("reader");
        process_record_from_wire(reader).expect("from wire")
    }

    #[test]
    fn records_survive_the_wire_with_every_field() {
        let running = ProcessRecord {
            pid: 4242,
            argv: vec![b"sleep".to_vec(), b"\xff30".to_vec()],
            environment: "local".to_string(),
            started: SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
            exit: None,
            owner: Some("7 127.0.0.1:5000".to_string()),
            cpu_ms: 1234,
            memory_bytes: 5 << 20,
        };
        assert_eq!(round_trip(&running), running);
        let exited = ProcessRecord {
            exit: Some(Exit::status(ExitStatus::Code(3))),
            owner: None,
            ..running
        };
        assert_eq!(round_trip(&exited), exited);
    }
}
