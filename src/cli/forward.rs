//! What `capexec run` forwards to the command: stdin, signals and terminal
//! size changes.

use std::collections::VecDeque;

use futures::StreamExt;
use tokio::signal::unix::{SignalKind, signal};

use capexec::client::{PendingWrite, ResilientProcess};
use capexec::model::{Signal, WriteStatus};

use crate::cli::stdio;
use crate::cli::terminal;

/// Stdin writes in flight at once: enough to keep the pipe busy across a
/// round trip, few enough to bound memory.
const STDIN_WINDOW: usize = 8;

/// Relays our stdin to the command until end-of-file, then closes its stdin.
pub async fn stdin(process: ResilientProcess) {
    let mut chunks = stdio::read_stdin();
    let mut in_flight = VecDeque::new();
    let mut count: u64 = 0;
    while let Some(Some(chunk)) = chunks.recv().await {
        if in_flight.len() >= STDIN_WINDOW
            && let Some(write) = in_flight.pop_front()
            && !accepted(write).await
        {
            return;
        }
        count += 1;
        in_flight.push_back(process.write_in_order(&chunk, &format!("stdin-{count}")));
    }
    for write in in_flight {
        if !accepted(write).await {
            return;
        }
    }
    let _ = process.close_stdin().await;
}

async fn accepted(write: PendingWrite) -> bool {
    matches!(write.outcome().await, Ok(WriteStatus::Accepted))
}

/// SIGINT, SIGTERM and SIGHUP, caught from the moment this is created (so
/// none of them kills capexec while the command starts) and then forwarded
/// to the command by [`Signals::forward`].
pub struct Signals {
    received: futures::stream::SelectAll<std::pin::Pin<Box<dyn futures::Stream<Item = Signal>>>>,
}

impl Signals {
    pub fn catch() -> Signals {
        let kinds = [
            (SignalKind::interrupt(), Signal::Int),
            (SignalKind::terminate(), Signal::Term),
            (SignalKind::hangup(), Signal::Hup),
        ];
        let mut streams: Vec<std::pin::Pin<Box<dyn futures::Stream<Item = Signal>>>> = Vec::new();
        for (kind, name) in kinds {
            match signal(kind) {
                Ok(stream) => streams.push(Box::pin(signal_stream(stream).map(move |()| name))),
                Err(error) => tracing::warn!(%error, %name, "cannot catch signal"),
            }
        }
        Signals {
            received: futures::stream::select_all(streams),
        }
    }

    /// Forwards every signal caught (including any caught before) to the
    /// command.
    pub async fn forward(mut self, process: ResilientProcess) {
        while let Some(name) = self.received.next().await {
            if let Err(error) = process.signal(name).await {
                tracing::warn!(%error, %name, "cannot forward signal");
            }
        }
    }
}

/// Follows our terminal's size (SIGWINCH) on the command's terminal.
pub async fn resizes(process: ResilientProcess) {
    let mut changes = match signal(SignalKind::window_change()) {
        Ok(changes) => changes,
        Err(error) => {
            tracing::warn!(%error, "cannot follow terminal size changes");
            return;
        }
    };
    while changes.recv().await.is_some() {
        if let Some(size) = terminal::local_size()
            && let Err(error) = process.resize(size).await
        {
            tracing::warn!(%error, "cannot resize the remote terminal");
        }
    }
}

fn signal_stream(
    mut stream: tokio::signal::unix::Signal,
) -> impl futures::Stream<Item = ()> + Unpin {
    Box::pin(futures::stream::poll_fn(move |cx| stream.poll_recv(cx)))
}
