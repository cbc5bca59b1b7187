//! Trust on first use, as ssh's known_hosts: the TLS certificates accepted
//! for each server, one line each (`ADDRESS SHA256`), in
//! `$XDG_CONFIG_HOME/capexec/known-servers` (else
//! `~/.config/capexec/known-servers`). An unknown certificate is shown and
//! asked about on the terminal (or accepted with `--tls-accept-new`); a
//! changed one is refused, naming the file and line to edit.

use std::io::{BufRead, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use capexec::net::{Address, parse_fingerprint};

/// The largest known-servers file read (some 100,000 servers).
const MAX_KNOWN_SERVERS_BYTES: u64 = 16 * 1024 * 1024;

/// One remembered certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Known {
    pub fingerprint: [u8; 32],
    /// Its line in the file.
    pub line: usize,
}

/// Where certificates are remembered.
pub fn path() -> Option<PathBuf> {
    crate::cli::config::config_dir().map(|dir| dir.join("known-servers"))
}

/// What the file remembers for `address`: the first line for it.
pub fn lookup(file: &Path, address: &Address) -> Result<Option<Known>, String> {
    let text = match capexec::local_file::read_regular_text(file, MAX_KNOWN_SERVERS_BYTES) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(format!(
                "{}: {}",
                file.display(),
                capexec::model::io_message(&error)
            ));
        }
    };
    let wanted = address.to_string();
    for (index, line) in text.lines().enumerate() {
        let mut fields = line.split_whitespace();
        if fields.next() != Some(wanted.as_str()) {
            continue;
        }
        let fingerprint = fields
            .next()
            .ok_or_else(|| "no fingerprint".to_string())
            .and_then(parse_fingerprint)
            .map_err(|why| {
                format!(
                    "{}:{}: the line for {wanted} is not ADDRESS SHA256 ({why}): fix or delete it",
                    file.display(),
                    index + 1
                )
            })?;
        return Ok(Some(Known {
            fingerprint,
            line: index + 1,
        }));
    }
    Ok(None)
}

/// Adds `address` with `fingerprint` (hex) to the file, creating it
/// (and its directory, mode 0700) if needed.
pub fn remember(file: &Path, address: &Address, fingerprint: &str) -> Result<(), String> {
    let failed = |error: std::io::Error| {
        format!(
            "cannot remember the certificate in {}: {}",
            file.display(),
            capexec::model::io_message(&error)
        )
    };
    if let Some(dir) = file.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(failed)?;
    }
    let existing = match capexec::local_file::read_regular_file(file, MAX_KNOWN_SERVERS_BYTES) {
        Ok(existing) => existing,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(error) => return Err(failed(error)),
    };
    // Not blocking on a FIFO put there since it was read.
    let mut out = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(file)
        .map_err(failed)?;
    capexec::local_file::ensure_regular(&out).map_err(failed)?;
    let mut line = String::new();
    if existing.is_empty() {
        line.push_str(
            "# TLS certificates trusted by capexec: ADDRESS SHA256 (see capexec --help)\n",
        );
    } else if !existing.ends_with(b"\n") {
        line.push('\n');
    }
    line.push_str(&format!("{address} {fingerprint}\n"));
    out.write_all(line.as_bytes()).map_err(failed)
}

/// A certificate seen for the first time: accepted (and remembered) if
/// `accept` (`--tls-accept-new`) or the user says yes on the terminal;
/// refused, with what to do, when there is no terminal to ask on.
pub async fn accept_new(
    address: &Address,
    fingerprint: &str,
    file: &Path,
    accept: bool,
) -> Result<(), String> {
    use std::io::IsTerminal;
    if !accept {
        let asked = if std::io::stdin().is_terminal() {
            ask(address, fingerprint, file).await.ok()
        } else {
            None
        };
        match asked {
            Some(true) => {}
            Some(false) => {
                return Err(format!(
                    "the TLS certificate of {address} (SHA-256 {fingerprint}) was not \
                     trusted; nothing was sent to it"
                ));
            }
            None => {
                return Err(format!(
                    "the server at {address} offers a TLS certificate that is not known here \
                     (SHA-256 {fingerprint}); nothing was sent to it. Compare it with the \
                     fingerprint `capexec serve` printed, then connect again with \
                     --tls-accept-new to remember it in {} (or give --tls-pin {fingerprint})",
                    file.display()
                ));
            }
        }
    }
    remember(file, address, fingerprint)?;
    eprintln!(
        "capexec: trusting the TLS certificate of {address} (SHA-256 {fingerprint}), \
         remembered in {}",
        file.display()
    );
    Ok(())
}

/// Asks on the controlling terminal whether to trust the certificate
/// `fingerprint` of `address`; `Err` if there is no terminal to ask on.
///
/// The answer is read on a thread of its own, so the runtime goes on
/// while the question waits: a signal (Ctrl-C) ends capexec at once, as
/// its caller decides, instead of after the next Enter. Dropped
/// unanswered, the question ends its line on the terminal, so that what
/// capexec says next starts on a line of its own.
pub async fn ask(address: &Address, fingerprint: &str, file: &Path) -> Result<bool, ()> {
    let terminal = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .map_err(drop)?;
    let question = format!(
        "The TLS certificate of {address} is not known here.\r\n\
         Its SHA-256 fingerprint is {fingerprint}.\r\n\
         Compare it with the one `capexec serve` printed on the server.\r\n\
         Trust it and remember it in {}? (yes/no) ",
        file.display()
    );
    (&terminal).write_all(question.as_bytes()).map_err(drop)?;
    let reader = terminal.try_clone().map_err(drop)?;
    let (answered, answer) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("capexec-question".into())
        .spawn(move || {
            let mut line = String::new();
            let read = std::io::BufReader::new(reader)
                .read_line(&mut line)
                .map(|_| line);
            let _ = answered.send(read);
        })
        .map_err(drop)?;
    let mut pending = Unanswered(Some(terminal));
    let answer = answer.await.map_err(drop)?.map_err(drop);
    // Answered: the line ended with the answer's Enter.
    pending.0 = None;
    Ok(matches!(
        answer?.trim().to_ascii_lowercase().as_str(),
        "yes" | "y"
    ))
}

/// A question on the terminal that is still waiting for its answer.
struct Unanswered(Option<std::fs::File>);

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(terminal) = self.0.take() {
            let _ = (&terminal).write_all(b"\r\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_lines_are_found_by_address() {
        let dir = std::env::temp_dir().join(format!("capexec-known-{}", std::process::id()));
        let file = dir.join("nested").join("known-servers");
        let a: Address = "tcp:a:1".parse().expect("address");
        let b: Address = "tcp:b:2".parse().expect("address");
        assert_eq!(lookup(&file, &a), Ok(None));
        remember(&file, &a, &"ab".repeat(32)).expect("remember a");
        remember(&file, &b, &"cd".repeat(32)).expect("remember b");
        assert_eq!(
            lookup(&file, &b),
            Ok(Some(Known {
                fingerprint: [0xcd; 32],
                line: 3
            }))
        );
        assert_eq!(lookup(&file, &a).map(|k| k.map(|k| k.line)), Ok(Some(2)));
        std::fs::write(&file, "tcp:a:1 nonsense\n").expect("write");
        let error = lookup(&file, &a).expect_err("malformed");
        assert!(
            error.contains("known-servers:1: the line for tcp:a:1"),
            "{error}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
