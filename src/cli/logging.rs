//! Logs on stderr, filtered by `RUST_LOG` (or `-v`). The server keeps the usual
//! timestamped lines of a daemon; the client commands (`run`, `shell`,
//! `environments`, `info`) print what they log in their own one-line
//! style, `capexec: warning: ...`, like every other message of theirs.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Who is logging: a long-running server, or a command someone just typed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Server,
    Client,
}

/// Logs go to stderr only, filtered by `RUST_LOG` (else `default`, or
/// with `verbose` capexec's own debug lines too), so stdout stays the
/// child's (or the listener addresses).
pub fn init(default: Level, style: Style, verbose: bool) {
    init_with(default, style, verbose, None);
}

/// [`init`], with `quieter` (directives such as `rmcp=error`) added to the
/// default filter: a library whose warnings are no news to the user.
/// `RUST_LOG` and `-v` still show everything they ask for.
pub fn init_with(default: Level, style: Style, verbose: bool, quieter: Option<&str>) {
    let builder = tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    // A plain level filter unless RUST_LOG or -v asks for more: cheaper to
    // set up, which short commands notice. -v is capexec's own debug lines,
    // not those of every library it uses (TLS, RPC).
    let directives = std::env::var("RUST_LOG")
        .ok()
        .filter(|directives| !directives.is_empty())
        .or_else(|| verbose.then(|| format!("{},capexec=debug", default.as_str().to_lowercase())))
        .or_else(|| {
            quieter.map(|quieter| format!("{},{quieter}", default.as_str().to_lowercase()))
        });
    match (style, directives) {
        (Style::Server, Some(directives)) => builder
            .with_env_filter(tracing_subscriber::EnvFilter::new(directives))
            .init(),
        (Style::Server, None) => builder.with_max_level(default).init(),
        (Style::Client, Some(directives)) => builder
            .with_ansi(false)
            .event_format(OneLine)
            .with_env_filter(tracing_subscriber::EnvFilter::new(directives))
            .init(),
        (Style::Client, None) => builder
            .with_ansi(false)
            .event_format(OneLine)
            .with_max_level(default)
            .init(),
    }
}

/// `capexec: warning: the token file is readable by other users; chmod 600
/// it (path=/home/me/.config/capexec/token)`: the level in words, the
/// message, then its fields and those of its spans.
struct OneLine;

impl<S, N> FormatEvent<S, N> for OneLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let level = match *event.metadata().level() {
            Level::ERROR => "error",
            Level::WARN => "warning",
            Level::INFO => "note",
            Level::DEBUG => "debug",
            Level::TRACE => "trace",
        };
        let mut visitor = Fields::default();
        event.record(&mut visitor);
        let mut fields = visitor.others;
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                if let Some(span_fields) = span.extensions().get::<FormattedFields<N>>()
                    && !span_fields.is_empty()
                {
                    fields.push(span_fields.to_string());
                }
            }
        }
        write!(writer, "capexec: {level}: {}", visitor.message)?;
        if !fields.is_empty() {
            write!(writer, " ({})", fields.join(" "))?;
        }
        writer.write_str(crate::cli::local_terminal::line_end())
    }
}

/// An event's message, and its other fields as `name=value`.
#[derive(Default)]
struct Fields {
    message: String,
    others: Vec<String>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.others.push(format!("{}={value}", field.name()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.others.push(format!("{}={value:?}", field.name()));
        }
    }
}
