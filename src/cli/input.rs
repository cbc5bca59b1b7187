//! What `capexec run` forwards to the command: stdin and terminal size
//! changes (signals: see `signals.rs`).

use std::collections::VecDeque;

use bytes::Bytes;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::oneshot;

use capexec::client::{PendingWrite, ResilientProcess};
use capexec::model::WriteStatus;

use crate::cli::local_terminal;
use crate::cli::stdin_chunks;
use crate::cli::stdio;

/// Stdin writes in flight at once: enough to keep the pipe busy across a
/// round trip, few enough to bound memory.
const STDIN_WINDOW: usize = 8;

/// Relays our stdin to the command until end-of-file, then closes its stdin.
/// With `escape` (under `-t`), watches the keystrokes for ssh's escapes:
/// `~.` after a newline ends the session (`escape` is told), `~~` sends one
/// `~`, `~?` lists them.
pub async fn stdin(process: ResilientProcess, escape: Option<oneshot::Sender<()>>) {
    let mut chunks = stdin_chunks::read_stdin();
    let mut in_flight = VecDeque::new();
    let mut count: u64 = 0;
    let mut escapes = escape.map(|escape| (Escapes::default(), escape));
    while let Some(Some(chunk)) = chunks.recv().await {
        let chunk = match &mut escapes {
            None => chunk,
            Some((scanner, _)) => match scanner.scan(chunk.as_slice()) {
                Scanned::Send(keys) => keys.into(),
                Scanned::End => {
                    if let Some((_, escape)) = escapes.take() {
                        let _ = escape.send(());
                    }
                    return;
                }
            },
        };
        if chunk.as_slice().is_empty() {
            continue;
        }
        if in_flight.len() >= STDIN_WINDOW
            && let Some(write) = in_flight.pop_front()
            && !accepted(write).await
        {
            return;
        }
        count += 1;
        in_flight.push_back(process.write_outgoing_in_order(chunk, &format!("stdin-{count}")));
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

/// What the keystrokes of one read come to.
#[derive(Debug, PartialEq, Eq)]
enum Scanned {
    /// Send these to the command (escapes taken out).
    Send(Bytes),
    /// `~.`: end the session.
    End,
}

/// ssh's escape sequences, recognised right after a newline (or at the
/// start), across reads.
struct Escapes {
    after_newline: bool,
    /// A `~` after a newline, waiting for the next key.
    tilde: bool,
}

impl Default for Escapes {
    fn default() -> Self {
        Escapes {
            after_newline: true,
            tilde: false,
        }
    }
}

impl Escapes {
    fn scan(&mut self, keys: &[u8]) -> Scanned {
        // Keystrokes rarely hold a `~`: pass them through untouched.
        if !self.tilde && !keys.contains(&b'~') {
            if let Some(&last) = keys.last() {
                self.after_newline = matches!(last, b'\r' | b'\n');
            }
            return Scanned::Send(Bytes::copy_from_slice(keys));
        }
        let mut out = Vec::with_capacity(keys.len() + 1);
        for &key in keys {
            if self.tilde {
                self.tilde = false;
                match key {
                    b'.' => return Scanned::End,
                    b'~' => out.push(b'~'),
                    b'?' => {
                        stdio::note("escapes: ~. end the session, ~~ send ~, ~? this help");
                        self.after_newline = true;
                        continue;
                    }
                    other => out.extend_from_slice(&[b'~', other]),
                }
                self.after_newline = matches!(key, b'\r' | b'\n');
                continue;
            }
            if self.after_newline && key == b'~' {
                self.tilde = true;
                continue;
            }
            out.push(key);
            self.after_newline = matches!(key, b'\r' | b'\n');
        }
        Scanned::Send(Bytes::from(out))
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
        if let Some(size) = local_terminal::local_size()
            && let Err(error) = process.resize(size).await
        {
            tracing::warn!(%error, "cannot resize the remote terminal");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(scanned: Scanned) -> Vec<u8> {
        match scanned {
            Scanned::Send(keys) => keys.to_vec(),
            Scanned::End => panic!("ended"),
        }
    }

    #[test]
    fn tilde_dot_after_a_newline_ends_the_session() {
        let mut escapes = Escapes::default();
        assert_eq!(sent(escapes.scan(b"ls\r")), b"ls\r");
        assert_eq!(escapes.scan(b"~."), Scanned::End);
        // At the very start, and split across reads.
        let mut escapes = Escapes::default();
        assert_eq!(sent(escapes.scan(b"~")), b"");
        assert_eq!(escapes.scan(b"."), Scanned::End);
    }

    #[test]
    fn other_tildes_reach_the_command() {
        let mut escapes = Escapes::default();
        assert_eq!(sent(escapes.scan(b"a~.b")), b"a~.b");
        assert_eq!(sent(escapes.scan(b"\r~~x")), b"\r~x");
        assert_eq!(sent(escapes.scan(b"\r~/dir\r")), b"\r~/dir\r");
        assert_eq!(sent(escapes.scan(b"~")), b"");
        assert_eq!(sent(escapes.scan(b"x")), b"~x");
    }
}
