//! Conversions between the model types and the Cap'n Proto wire types, for
//! both directions (the server reads params and writes results; the client
//! does the opposite).

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use bytes::Bytes;
use capnp::Error;

use crate::capexec_capnp as wire;
use crate::engine::{Process, ProcessSnapshot, StartSpec};
use crate::model::{
    Event, EventBody, ExitStatus, Flow, OutputStream, PtySize, ResourceUsage, Signal, StartError,
    StartErrorKind, WriteStatus,
};

/// A start failure as an exception whose description carries its tag.
pub fn start_error_to_wire(error: &StartError) -> Error {
    Error::failed(error.to_string())
}

/// Recovers the structured start failure from an exception, wherever it was
/// raised along a chain of executors.
pub fn start_error_from_wire(error: &Error) -> StartError {
    match StartErrorKind::from_description(&error.extra) {
        Some(kind) => {
            let tag = kind.tag();
            let message = error.extra.replace(&tag, "");
            let message = message.trim();
            let message = message
                .rsplit("remote exception: ")
                .next()
                .unwrap_or(message)
                .trim()
                .to_string();
            StartError::new(kind, message)
        }
        None => StartError::new(StartErrorKind::SpawnFailed, error.to_string()),
    }
}

/// How [`describe`] begins the description of a lost connection.
pub const LOST_CONNECTION_PREFIX: &str = "the connection was lost: ";

/// A capnp error as one line for people: the peer's own words, without the
/// "remote exception:" prefixes each hop adds or capexec's machine tags.
pub fn describe(error: &capnp::Error) -> String {
    let mut text = error.extra.trim();
    while let Some(rest) = text.strip_prefix("remote exception:") {
        text = rest.trim_start();
    }
    let mut text = text.to_string();
    while let Some(start) = text.find("[capexec:") {
        let Some(len) = text[start..].find(']') else {
            break;
        };
        text.replace_range(start..start + len + 1, "");
    }
    let text = text.trim();
    let text = match text.find(" (os error ") {
        Some(at) if text.ends_with(')') => &text[..at],
        _ => text,
    };
    match error.kind {
        capnp::ErrorKind::Disconnected if text.is_empty() => "the connection was lost".to_string(),
        // What capnp-rpc and the kernel say when the peer closed the
        // connection, cleanly or not (a process killed with unread data
        // resets it).
        capnp::ErrorKind::Disconnected
            if matches!(
                text,
                "Peer disconnected." | "Connection reset by peer" | "Broken pipe"
            ) =>
        {
            "the server closed the connection".to_string()
        }
        capnp::ErrorKind::Disconnected => format!("{LOST_CONNECTION_PREFIX}{text}"),
        _ if text.is_empty() => error.kind.to_string(),
        _ => text.to_string(),
    }
}

fn invalid(what: &str, error: impl std::fmt::Display) -> StartError {
    StartError::new(
        StartErrorKind::InvalidArgument,
        format!("malformed start parameters ({what}): {error}"),
    )
}

fn os_string(bytes: &[u8]) -> OsString {
    OsString::from_vec(bytes.to_vec())
}

pub fn start_spec_from_wire(
    params: wire::start_params::Reader<'_>,
) -> Result<StartSpec, StartError> {
    let argv = params
        .get_argv()
        .map_err(|e| invalid("argv", e))?
        .iter()
        .map(|arg| arg.map(os_string))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid("argv", e))?;
    let cwd = if params.has_cwd() {
        let cwd = params.get_cwd().map_err(|e| invalid("cwd", e))?;
        (!cwd.is_empty()).then(|| PathBuf::from(os_string(cwd)))
    } else {
        None
    };
    let unset = params
        .get_unset_env()
        .map_err(|e| invalid("unsetEnv", e))?
        .iter()
        .map(|name| name.map(os_string))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid("unsetEnv", e))?;
    let mut set = Vec::new();
    for var in params.get_set_env().map_err(|e| invalid("setEnv", e))? {
        let name = var.get_name().map_err(|e| invalid("setEnv", e))?;
        let value = var.get_value().map_err(|e| invalid("setEnv", e))?;
        set.push((os_string(name), os_string(value)));
    }
    let arg0 = if params.has_arg0() {
        Some(os_string(
            params.get_arg0().map_err(|e| invalid("arg0", e))?,
        ))
    } else {
        None
    };
    let pty_size = if params.has_pty_size() {
        let size = params.get_pty_size().map_err(|e| invalid("ptySize", e))?;
        PtySize {
            rows: size.get_rows(),
            cols: size.get_cols(),
        }
    } else {
        PtySize::default()
    };
    let term = if params.has_term() {
        let term = params.get_term().map_err(|e| invalid("term", e))?;
        (!term.is_empty()).then(|| os_string(term))
    } else {
        None
    };
    let flow = match params.get_flow() {
        Ok(wire::OutputFlow::Retain) => Flow::Retain,
        Ok(wire::OutputFlow::Lossless) => Flow::Lossless,
        Err(e) => return Err(invalid("flow", e)),
    };
    Ok(StartSpec {
        argv,
        cwd,
        env: crate::engine::EnvSpec {
            clear: params.get_clear_env(),
            unset,
            set,
        },
        arg0,
        tty: params.get_tty(),
        term,
        pipe_stdin: params.get_pipe_stdin(),
        pty_size,
        flow,
        timeout: match params.get_timeout_ms() {
            0 => None,
            ms => Some(std::time::Duration::from_millis(ms)),
        },
    })
}

pub fn start_spec_to_wire(spec: &StartSpec, mut params: wire::start_params::Builder<'_>) {
    {
        let mut argv = params.reborrow().init_argv(spec.argv.len() as u32);
        for (index, arg) in spec.argv.iter().enumerate() {
            argv.set(index as u32, arg.as_bytes());
        }
    }
    if let Some(cwd) = &spec.cwd {
        params.set_cwd(cwd.as_os_str().as_bytes());
    }
    params.set_clear_env(spec.env.clear);
    {
        let mut unset = params
            .reborrow()
            .init_unset_env(spec.env.unset.len() as u32);
        for (index, name) in spec.env.unset.iter().enumerate() {
            unset.set(index as u32, name.as_bytes());
        }
    }
    {
        let mut set = params.reborrow().init_set_env(spec.env.set.len() as u32);
        for (index, (name, value)) in spec.env.set.iter().enumerate() {
            let mut var = set.reborrow().get(index as u32);
            var.set_name(name.as_bytes());
            var.set_value(value.as_bytes());
        }
    }
    if let Some(arg0) = &spec.arg0 {
        params.set_arg0(arg0.as_bytes());
    }
    params.set_tty(spec.tty);
    if let Some(term) = &spec.term {
        params.set_term(term.as_bytes());
    }
    params.set_pipe_stdin(spec.pipe_stdin);
    {
        let mut size = params.reborrow().init_pty_size();
        size.set_rows(spec.pty_size.rows);
        size.set_cols(spec.pty_size.cols);
    }
    params.set_flow(flow_to_wire(spec.flow));
    params.set_timeout_ms(
        spec.timeout
            .map_or(0, |t| t.as_millis().clamp(1, u128::from(u64::MAX)) as u64),
    );
}

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

pub fn signal_to_wire(signal: Signal) -> wire::Signal {
    match signal {
        Signal::Hup => wire::Signal::Hup,
        Signal::Int => wire::Signal::Int,
        Signal::Quit => wire::Signal::Quit,
        Signal::Ill => wire::Signal::Ill,
        Signal::Trap => wire::Signal::Trap,
        Signal::Abrt => wire::Signal::Abrt,
        Signal::Bus => wire::Signal::Bus,
        Signal::Fpe => wire::Signal::Fpe,
        Signal::Kill => wire::Signal::Kill,
        Signal::Usr1 => wire::Signal::Usr1,
        Signal::Segv => wire::Signal::Segv,
        Signal::Usr2 => wire::Signal::Usr2,
        Signal::Pipe => wire::Signal::Pipe,
        Signal::Alrm => wire::Signal::Alrm,
        Signal::Term => wire::Signal::Term,
        Signal::Chld => wire::Signal::Chld,
        Signal::Cont => wire::Signal::Cont,
        Signal::Stop => wire::Signal::Stop,
        Signal::Tstp => wire::Signal::Tstp,
        Signal::Ttin => wire::Signal::Ttin,
        Signal::Ttou => wire::Signal::Ttou,
        Signal::Urg => wire::Signal::Urg,
        Signal::Xcpu => wire::Signal::Xcpu,
        Signal::Xfsz => wire::Signal::Xfsz,
        Signal::Vtalrm => wire::Signal::Vtalrm,
        Signal::Prof => wire::Signal::Prof,
        Signal::Winch => wire::Signal::Winch,
        Signal::Io => wire::Signal::Io,
        Signal::Sys => wire::Signal::Sys,
    }
}

/// `None` for `unknown`.
pub fn signal_from_wire(signal: wire::Signal) -> Option<Signal> {
    Some(match signal {
        wire::Signal::Unknown => return None,
        wire::Signal::Hup => Signal::Hup,
        wire::Signal::Int => Signal::Int,
        wire::Signal::Quit => Signal::Quit,
        wire::Signal::Ill => Signal::Ill,
        wire::Signal::Trap => Signal::Trap,
        wire::Signal::Abrt => Signal::Abrt,
        wire::Signal::Bus => Signal::Bus,
        wire::Signal::Fpe => Signal::Fpe,
        wire::Signal::Kill => Signal::Kill,
        wire::Signal::Usr1 => Signal::Usr1,
        wire::Signal::Segv => Signal::Segv,
        wire::Signal::Usr2 => Signal::Usr2,
        wire::Signal::Pipe => Signal::Pipe,
        wire::Signal::Alrm => Signal::Alrm,
        wire::Signal::Term => Signal::Term,
        wire::Signal::Chld => Signal::Chld,
        wire::Signal::Cont => Signal::Cont,
        wire::Signal::Stop => Signal::Stop,
        wire::Signal::Tstp => Signal::Tstp,
        wire::Signal::Ttin => Signal::Ttin,
        wire::Signal::Ttou => Signal::Ttou,
        wire::Signal::Urg => Signal::Urg,
        wire::Signal::Xcpu => Signal::Xcpu,
        wire::Signal::Xfsz => Signal::Xfsz,
        wire::Signal::Vtalrm => Signal::Vtalrm,
        wire::Signal::Prof => Signal::Prof,
        wire::Signal::Winch => Signal::Winch,
        wire::Signal::Io => Signal::Io,
        wire::Signal::Sys => Signal::Sys,
    })
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

fn stream_to_wire(stream: OutputStream) -> wire::OutputStream {
    match stream {
        OutputStream::Stdout => wire::OutputStream::Stdout,
        OutputStream::Stderr => wire::OutputStream::Stderr,
        OutputStream::Pty => wire::OutputStream::Pty,
    }
}

fn stream_from_wire(stream: wire::OutputStream) -> OutputStream {
    match stream {
        wire::OutputStream::Stdout => OutputStream::Stdout,
        wire::OutputStream::Stderr => OutputStream::Stderr,
        wire::OutputStream::Pty => OutputStream::Pty,
    }
}

/// What an exit status says beyond how the child ended.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExitDetails {
    /// The process's timeout ended it.
    pub timed_out: bool,
    pub usage: Option<ResourceUsage>,
}

impl ExitDetails {
    pub fn of(process: &Process) -> Self {
        ExitDetails {
            timed_out: process.timed_out(),
            usage: process.resource_usage(),
        }
    }
}

/// An exit status with its details.
pub fn exit_to_wire(
    status: &ExitStatus,
    details: ExitDetails,
    mut builder: wire::exit_status::Builder<'_>,
) {
    exit_status_to_wire(status, builder.reborrow());
    builder.set_timed_out(details.timed_out);
    if let Some(usage) = details.usage {
        usage_to_wire(&usage, builder.init_usage());
    }
}

fn usage_to_wire(usage: &ResourceUsage, mut builder: wire::resource_usage::Builder<'_>) {
    builder.set_user_cpu_micros(usage.user_cpu.as_micros() as u64);
    builder.set_system_cpu_micros(usage.system_cpu.as_micros() as u64);
    builder.set_peak_rss_bytes(usage.peak_rss_bytes);
}

/// The details an exit status carries.
pub fn exit_details_from_wire(status: wire::exit_status::Reader<'_>) -> capnp::Result<ExitDetails> {
    Ok(ExitDetails {
        timed_out: status.get_timed_out(),
        usage: usage_from_wire(status)?,
    })
}

/// The resource usage an exit status carries, if any.
pub fn usage_from_wire(
    status: wire::exit_status::Reader<'_>,
) -> capnp::Result<Option<ResourceUsage>> {
    if !status.has_usage() {
        return Ok(None);
    }
    let usage = status.get_usage()?;
    Ok(Some(ResourceUsage {
        user_cpu: std::time::Duration::from_micros(usage.get_user_cpu_micros()),
        system_cpu: std::time::Duration::from_micros(usage.get_system_cpu_micros()),
        peak_rss_bytes: usage.get_peak_rss_bytes(),
    }))
}

fn exit_status_to_wire(status: &ExitStatus, mut builder: wire::exit_status::Builder<'_>) {
    match *status {
        ExitStatus::Code(code) => builder.set_code(code),
        ExitStatus::Killed {
            signal,
            number,
            core_dumped,
        } => {
            let mut killed = builder.init_killed();
            killed.set_signal(signal.map(signal_to_wire).unwrap_or(wire::Signal::Unknown));
            killed.set_number(number);
            killed.set_core_dumped(core_dumped);
        }
    }
}

pub fn exit_status_from_wire(reader: wire::exit_status::Reader<'_>) -> capnp::Result<ExitStatus> {
    Ok(match reader.which()? {
        wire::exit_status::Code(code) => ExitStatus::Code(code),
        wire::exit_status::Killed(killed) => {
            // Name first: the number is the server's and may differ here.
            let signal = killed.get_signal().ok().and_then(signal_from_wire);
            ExitStatus::Killed {
                signal,
                number: signal.map(Signal::number).unwrap_or(killed.get_number()),
                core_dumped: killed.get_core_dumped(),
            }
        }
    })
}

/// `details`: said on the exit event.
pub fn event_to_wire(event: &Event, mut builder: wire::event::Builder<'_>, details: ExitDetails) {
    builder.set_seq(event.seq);
    match &event.body {
        EventBody::Output { stream, data } => {
            let mut output = builder.init_output();
            output.set_stream(stream_to_wire(*stream));
            output.set_data(data);
        }
        EventBody::Exited(status) => {
            exit_to_wire(status, details, builder.init_exited());
        }
        EventBody::Closed => builder.set_closed(()),
        EventBody::Gap { from_seq } => builder.init_gap().set_from_seq(*from_seq),
    }
}

/// Room for `events` in one message, so it is built in a single segment:
/// one allocation, one write. Generous per-event overhead; the payload
/// dominates.
pub fn events_message_size(events: &[Event]) -> capnp::MessageSize {
    let words: usize = events
        .iter()
        .map(|event| match &event.body {
            EventBody::Output { data, .. } => 8 + data.len().div_ceil(8),
            _ => 8,
        })
        .sum();
    capnp::MessageSize {
        word_count: (16 + words) as u64,
        cap_count: 0,
    }
}

pub fn events_to_wire(
    events: &[Event],
    mut list: capnp::struct_list::Builder<'_, wire::event::Owned>,
    details: ExitDetails,
) {
    for (index, event) in events.iter().enumerate() {
        event_to_wire(event, list.reborrow().get(index as u32), details);
    }
}

pub fn event_from_wire(reader: wire::event::Reader<'_>) -> capnp::Result<Event> {
    let body = match reader.which()? {
        wire::event::Output(output) => {
            let output = output?;
            EventBody::Output {
                stream: stream_from_wire(output.get_stream()?),
                data: Bytes::copy_from_slice(output.get_data()?),
            }
        }
        wire::event::Exited(status) => EventBody::Exited(exit_status_from_wire(status?)?),
        wire::event::Closed(()) => EventBody::Closed,
        wire::event::Gap(gap) => EventBody::Gap {
            from_seq: gap?.get_from_seq(),
        },
    };
    Ok(Event {
        seq: reader.get_seq(),
        body,
    })
}

pub fn events_from_wire(
    list: capnp::struct_list::Reader<'_, wire::event::Owned>,
) -> capnp::Result<Vec<Event>> {
    list.iter().map(event_from_wire).collect()
}

pub fn snapshot_to_wire(snapshot: &ProcessSnapshot, mut info: wire::process_info::Builder<'_>) {
    info.set_pid(snapshot.pid);
    info.set_tty(snapshot.tty);
    info.set_flow(flow_to_wire(snapshot.flow));
    info.set_stdin_open(snapshot.stdin_open);
    info.set_next_seq(snapshot.next_seq);
    info.set_closed(snapshot.closed);
    match &snapshot.exit {
        Some(status) => exit_to_wire(
            status,
            ExitDetails {
                timed_out: snapshot.timed_out,
                usage: snapshot.usage,
            },
            info.reborrow().get_exit().init_exited(),
        ),
        None => info.reborrow().get_exit().set_running(()),
    }
    info.set_retained_bytes(snapshot.retained_bytes);
    info.set_retained_chunks(snapshot.retained_chunks);
    info.set_peak_retained_bytes(snapshot.peak_retained_bytes);
    info.set_evicted_through_seq(snapshot.evicted_through_seq);
    info.set_unconsumed_bytes(snapshot.unconsumed_bytes);
    info.set_uptime_ms(snapshot.uptime.as_millis() as u64);
    info.set_timed_out(snapshot.timed_out);
}

pub fn snapshot_from_wire(info: wire::process_info::Reader<'_>) -> capnp::Result<ProcessSnapshot> {
    let (exit, usage) = match info.get_exit().which()? {
        wire::process_info::exit::Running(()) => (None, None),
        wire::process_info::exit::Exited(status) => {
            let status = status?;
            (
                Some(exit_status_from_wire(status)?),
                usage_from_wire(status)?,
            )
        }
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
        uptime: std::time::Duration::from_millis(info.get_uptime_ms()),
        timed_out: info.get_timed_out(),
        usage,
    })
}
