//! The local terminal for `capexec run -t`: its size, and raw mode while the
//! command runs.

use std::io::IsTerminal;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::termios::{self, SetArg, Termios};

use capexec::model::PtySize;

/// Size of the terminal on stdin, stdout or stderr (the first that is one).
pub fn local_size() -> Option<PtySize> {
    [0, 1, 2].into_iter().find_map(|fd| {
        // SAFETY: winsize is plain data, valid all zeroes.
        let mut size: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: TIOCGWINSZ fills a winsize; fails harmlessly on non-ttys.
        let ok = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut size) } == 0;
        (ok && size.ws_row > 0 && size.ws_col > 0).then_some(PtySize {
            rows: size.ws_row,
            cols: size.ws_col,
        })
    })
}

/// Parses `ROWSxCOLS`, e.g. `40x120`.
pub fn parse_size(text: &str) -> Result<PtySize, String> {
    let bad = || format!("--size expects ROWSxCOLS (for example 24x80), got {text:?}");
    let (rows, cols) = text.split_once(['x', 'X']).ok_or_else(bad)?;
    let rows: u16 = rows.trim().parse().map_err(|_| bad())?;
    let cols: u16 = cols.trim().parse().map_err(|_| bad())?;
    if rows == 0 || cols == 0 {
        return Err(bad());
    }
    Ok(PtySize { rows, cols })
}

/// Whether our terminal is in raw mode now: lines we print then end with
/// CR LF, as the terminal no longer adds the CR.
static RAW: AtomicBool = AtomicBool::new(false);

/// The end of a line we print on the terminal now.
pub fn line_end() -> &'static str {
    if RAW.load(Ordering::Relaxed) {
        "\r\n"
    } else {
        "\n"
    }
}

/// Our stdin terminal in raw mode; the previous settings come back on drop.
pub struct RawMode {
    saved: Termios,
}

impl RawMode {
    /// Puts stdin in raw mode if it is a terminal.
    pub fn enter_stdin() -> Option<RawMode> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let fd = stdin.as_fd();
        let saved = match termios::tcgetattr(fd) {
            Ok(saved) => saved,
            Err(error) => {
                tracing::warn!(%error, "cannot read the terminal settings");
                return None;
            }
        };
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        if let Err(error) = termios::tcsetattr(fd, SetArg::TCSADRAIN, &raw) {
            tracing::warn!(%error, "cannot put the terminal in raw mode");
            return None;
        }
        RAW.store(true, Ordering::Relaxed);
        Some(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: fd 0 stays open for the life of the process.
        let fd = unsafe { BorrowedFd::borrow_raw(0) };
        let _ = termios::tcsetattr(fd, SetArg::TCSADRAIN, &self.saved);
        RAW.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_strictly() {
        assert_eq!(
            parse_size("40x120"),
            Ok(PtySize {
                rows: 40,
                cols: 120
            })
        );
        assert_eq!(parse_size("24X80"), Ok(PtySize { rows: 24, cols: 80 }));
        for bad in ["", "40", "0x80", "40x0", "ax80", "40x", "99999x80"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
