//! What a server counts for monitoring, and the Prometheus text it is
//! served as (`capexec serve --metrics`). Counters are process-wide
//! atomics that the engine and the server bump where things happen (once
//! per start, exit, chunk, write, connection: never per byte); the text is
//! made by `prometheus-client`, the Prometheus project's Rust crate, at
//! each scrape.
//!
//! Never in a metric: output, input, tokens, arguments, paths, peers. The
//! only labels are fixed words (a refusal's tag, an exit's class).

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::model::{ExitStatus, RefusalKind};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TagLabel {
    tag: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabel {
    class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabel {
    limit: &'static str,
}

#[derive(Default)]
struct Metrics {
    started: Counter,
    failed: Family<TagLabel, Counter>,
    exits: Family<ClassLabel, Counter>,
    bytes_in: Counter,
    bytes_out: Counter,
    connections: Family<StateLabel, Gauge>,
    connections_opened: Counter,
    refused_logins: Counter,
    limit_hits: Family<LimitLabel, Counter>,
}

fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::default)
}

/// A start the engine made, or refused (by the refusal's tag).
pub fn start(outcome: Result<(), RefusalKind>) {
    match outcome {
        Ok(()) => {
            metrics().started.inc();
        }
        Err(kind) => refused_start(kind),
    }
}

/// A start refused before it reached the engine (a connection's quota, a
/// restricted executor's rules), or by it.
pub fn refused_start(kind: RefusalKind) {
    metrics()
        .failed
        .get_or_create(&TagLabel { tag: kind.code() })
        .inc();
    if kind == RefusalKind::LimitReached {
        limit_hit("processes");
    }
}

/// A process exited.
pub fn exit(status: ExitStatus) {
    let class = match status {
        ExitStatus::Code(0) => "0",
        ExitStatus::Code(1..=125) => "1-125",
        ExitStatus::Code(126) => "126",
        ExitStatus::Code(127) => "127",
        ExitStatus::Code(_) => "128-255",
        ExitStatus::Killed { .. } => "signal",
    };
    metrics().exits.get_or_create(&ClassLabel { class }).inc();
}

/// Bytes written to a child's stdin.
pub fn bytes_in(bytes: usize) {
    metrics().bytes_in.inc_by(bytes as u64);
}

/// Bytes a child wrote (stdout, stderr or its terminal).
pub fn bytes_out(bytes: usize) {
    metrics().bytes_out.inc_by(bytes as u64);
}

/// A connection was accepted; the guard counts it open until it drops.
pub fn connection_opened() -> OpenConnection {
    let metrics = metrics();
    metrics.connections_opened.inc();
    metrics.connections.get_or_create(&OPEN).inc();
    OpenConnection(())
}

const OPEN: StateLabel = StateLabel { state: "open" };

/// Counts one connection open while it lives.
pub struct OpenConnection(());

impl Drop for OpenConnection {
    fn drop(&mut self) {
        metrics().connections.get_or_create(&OPEN).dec();
    }
}

/// TCP connections that have not logged in yet: `delta` more.
pub fn awaiting_login(delta: i64) {
    metrics()
        .connections
        .get_or_create(&StateLabel {
            state: "awaiting-login",
        })
        .inc_by(delta);
}

/// A login refused for a wrong token.
pub fn refused_login() {
    metrics().refused_logins.inc();
}

/// A limit turned something away: "processes" (a start), "connections",
/// "connections-per-user", "pending-logins" (a connection), "calls", "call-memory", "login-calls", "login-memory"
/// (a connection closed by its guard), "file-transfers", "file-watches",
/// "port-connections", "port-listeners" (a call refused),
/// "descriptors-waiting-to-close" (a connection ended).
pub fn limit_hit(limit: &'static str) {
    metrics()
        .limit_hits
        .get_or_create(&LimitLabel { limit })
        .inc();
}

/// What the server holds now, counted where it is held.
#[derive(Clone, Copy, Debug, Default)]
pub struct Now {
    /// The engine's processes.
    pub processes: usize,
    /// Descriptors given to close and not closed yet (`sys`).
    pub descriptors_waiting_to_close: usize,
    /// Threads closing descriptors.
    pub closing_threads: usize,
    /// Closes in progress for over 200 ms.
    pub closes_asleep: usize,
}

/// The Prometheus text exposition of everything, with what the server
/// holds `now`.
pub fn render(now: &Now) -> String {
    let metrics = metrics();
    let mut registry = Registry::with_prefix("capexec");
    let running_gauge: Gauge = Gauge::default();
    running_gauge.set(i64::try_from(now.processes).unwrap_or(i64::MAX));
    registry.register(
        "processes",
        "Processes the server holds now (running, or finished and not yet released)",
        running_gauge,
    );
    registry.register(
        "processes_started",
        "Processes started",
        metrics.started.clone(),
    );
    registry.register(
        "processes_failed",
        "Starts refused or failed, by the refusal's tag",
        metrics.failed.clone(),
    );
    registry.register(
        "process_exits",
        "Processes that exited, by class of exit code (or signal)",
        metrics.exits.clone(),
    );
    registry.register(
        "stdin_bytes",
        "Bytes written to processes' stdin",
        metrics.bytes_in.clone(),
    );
    registry.register(
        "output_bytes",
        "Bytes processes wrote (stdout, stderr, terminal)",
        metrics.bytes_out.clone(),
    );
    registry.register(
        "connections",
        "Connections by state: open (all), awaiting-login (TCP, not logged in yet)",
        metrics.connections.clone(),
    );
    registry.register(
        "connections_opened",
        "Connections accepted",
        metrics.connections_opened.clone(),
    );
    registry.register(
        "refused_logins",
        "Logins refused for a wrong token",
        metrics.refused_logins.clone(),
    );
    registry.register(
        "limit_hits",
        "Requests or connections turned away by a limit",
        metrics.limit_hits.clone(),
    );
    let gauge = |value: usize| {
        let gauge: Gauge = Gauge::default();
        gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
        gauge
    };
    registry.register(
        "descriptors_waiting_to_close",
        "Descriptors given to close (most sent by clients) and not closed yet",
        gauge(now.descriptors_waiting_to_close),
    );
    registry.register(
        "closing_threads",
        "Threads closing descriptors now",
        gauge(now.closing_threads),
    );
    registry.register(
        "closes_asleep",
        "Closes in progress for over 200 ms (asleep on a lock someone else holds, a pipe's or a FUSE daemon's)",
        gauge(now.closes_asleep),
    );
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &registry).is_err() {
        text.clear();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_has_every_family_with_its_help() {
        exit(ExitStatus::Code(0));
        exit(ExitStatus::Code(127));
        refused_start(RefusalKind::ProgramNotFound);
        refused_start(RefusalKind::LimitReached);
        let text = render(&Now {
            processes: 3,
            ..Now::default()
        });
        for line in [
            "# HELP capexec_processes Processes the server holds now",
            "# TYPE capexec_processes gauge",
            "capexec_processes 3",
            "# TYPE capexec_processes_started counter",
            "capexec_process_exits_total{class=\"127\"}",
            "capexec_processes_failed_total{tag=\"program-not-found\"}",
            "# TYPE capexec_output_bytes counter",
            "capexec_processes_failed_total{tag=\"limit\"}",
            "capexec_limit_hits_total{limit=\"processes\"}",
            "# TYPE capexec_descriptors_waiting_to_close gauge",
            "# TYPE capexec_closing_threads gauge",
            "# TYPE capexec_closes_asleep gauge",
            "# EOF",
        ] {
            assert!(text.contains(line), "{line} not in {text}");
        }
    }
}
