//! What the admin capability says about a process (the schema's
//! `ProcessRecord`): what `ps` would show, never tokens, environment
//! values or output.

use std::time::SystemTime;

use crate::model::Exit;

/// One process a server holds, as its operator sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessRecord {
    pub pid: u32,
    /// As started, cut to [`MAX_RECORDED_ARGV_BYTES`] in all.
    pub argv: Vec<Vec<u8>>,
    /// The environment of the server it runs in ("local").
    pub environment: String,
    pub started: SystemTime,
    /// `None` while it runs.
    pub exit: Option<Exit>,
    /// The connection holding it ("7 unix", "8 10.0.0.2:51234"); `None`
    /// when it is parked after a detach.
    pub owner: Option<String>,
    /// User plus system CPU time so far, in milliseconds.
    pub cpu_ms: u64,
    /// Resident memory now.
    pub memory_bytes: u64,
}

/// Most argv bytes a record keeps (the bytes of its arguments, the mark
/// of a cut included), so that a table of every process stays small
/// whatever was started.
pub const MAX_RECORDED_ARGV_BYTES: usize = 4096;

/// What ends the last argument kept when something was cut.
const CUT_MARK: &[u8] = b"...";

/// `argv` cut to [`MAX_RECORDED_ARGV_BYTES`] in all: an argv that fits is
/// kept whole; else the arguments that fit in the bound less the mark,
/// then the part of the next one that fits followed by "...", so that the
/// record is exactly the bound.
pub fn recorded_argv<'a>(argv: impl IntoIterator<Item = &'a [u8]>) -> Vec<Vec<u8>> {
    let argv: Vec<&[u8]> = argv.into_iter().collect();
    let total: usize = argv.iter().map(|argument| argument.len()).sum();
    if total <= MAX_RECORDED_ARGV_BYTES {
        return argv.into_iter().map(<[u8]>::to_vec).collect();
    }
    let mut kept = Vec::new();
    let mut room = MAX_RECORDED_ARGV_BYTES - CUT_MARK.len();
    for argument in argv {
        if argument.len() > room {
            let mut cut = argument[..room].to_vec();
            cut.extend_from_slice(CUT_MARK);
            kept.push(cut);
            break;
        }
        room -= argument.len();
        kept.push(argument.to_vec());
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_argv_is_cut_with_a_mark() {
        let long = vec![b'x'; 5000];
        let argv = recorded_argv([&b"sh"[..], &long, b"more"]);
        assert_eq!(argv.len(), 2);
        assert_eq!(argv[0], b"sh");
        assert_eq!(argv[1].len(), MAX_RECORDED_ARGV_BYTES - 2);
        assert!(argv[1].ends_with(b"x..."));
        // Exactly the bound fits whole; one byte more is cut, mark included.
        let fits = vec![b'y'; MAX_RECORDED_ARGV_BYTES - 1];
        assert_eq!(
            recorded_argv([&b"a"[..], &fits]),
            vec![b"a".to_vec(), fits.clone()]
        );
        let argv = recorded_argv([&b"ab"[..], &fits]);
        let kept: usize = argv.iter().map(Vec::len).sum();
        assert_eq!(kept, MAX_RECORDED_ARGV_BYTES);
        assert!(argv[1].ends_with(b"y..."));
        assert_eq!(
            recorded_argv([&b"a"[..], b"b"]),
            vec![b"a".to_vec(), b"b".to_vec()]
        );
    }
}
