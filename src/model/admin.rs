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

/// Most argv bytes a record keeps, so that a table of every process stays
/// small whatever was started.
pub const MAX_RECORDED_ARGV_BYTES: usize = 4096;

/// `argv` cut to [`MAX_RECORDED_ARGV_BYTES`]: the last argument kept ends
/// with "..." when something was cut.
pub fn recorded_argv<'a>(argv: impl IntoIterator<Item = &'a [u8]>) -> Vec<Vec<u8>> {
    let mut kept = Vec::new();
    let mut room = MAX_RECORDED_ARGV_BYTES;
    for argument in argv {
        if argument.len() > room {
            let mut cut = argument[..room].to_vec();
            cut.extend_from_slice(b"...");
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
        assert_eq!(argv[1].len(), MAX_RECORDED_ARGV_BYTES - 2 + 3);
        assert!(argv[1].ends_with(b"x..."));
        assert_eq!(
            recorded_argv([&b"a"[..], b"b"]),
            vec![b"a".to_vec(), b"b".to_vec()]
        );
    }
}
