//! `sandboxDenied` on `process/exited`: Codex's guess that a confined
//! command failed because the sandbox refused it something, decided by the
//! rule Codex's own exec-server applies (observed against it with each case
//! of `tests/codex/fixtures/sandbox-denied-observed.json`):
//!
//! - never for an unconfined process, nor for exit code 0;
//! - yes if the output says one of a few words of denial, in any case;
//! - otherwise no for exit codes 2, 126 and 127 (usage errors, a program
//!   not executable or not found);
//! - yes for 159, a process killed by SIGSYS (a seccomp filter's kill);
//! - otherwise no.
//!
//! Codex looks only at the output it still retains (its last MiB); the
//! bridge scans every byte as it passes, keeping only the few bytes a word
//! split between two chunks needs.

/// What Codex's rule looks for, lower-case.
const DENIAL_WORDS: [&[u8]; 7] = [
    b"operation not permitted",
    b"permission denied",
    b"read-only file system",
    b"seccomp",
    b"sandbox",
    b"landlock",
    b"failed to write file",
];

/// Exit codes that say something else went wrong.
const OTHER_FAILURES: [i32; 3] = [2, 126, 127];

/// 128 + SIGSYS: killed by a seccomp filter.
const KILLED_BY_SIGSYS: i32 = 128 + libc::SIGSYS;

/// The longest word, less one: what a word split across chunks can leave
/// at the end of one.
const CARRY: usize = 22;

/// Watches one stream's output for the words of denial.
#[derive(Debug, Default, Clone)]
pub struct DenialScan {
    /// The end of what was seen, lower-cased: the start of a word that
    /// the next chunk may finish.
    tail: Vec<u8>,
    found: bool,
}

impl DenialScan {
    pub fn new() -> DenialScan {
        DenialScan::default()
    }

    /// Looks at the next chunk of the stream.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.found || chunk.is_empty() {
            return;
        }
        let mut window = std::mem::take(&mut self.tail);
        window.extend(chunk.iter().map(u8::to_ascii_lowercase));
        self.found = DENIAL_WORDS
            .iter()
            .any(|word| window.windows(word.len()).any(|part| part == *word));
        let keep = window.len().min(CARRY);
        window.drain(..window.len() - keep);
        self.tail = window;
    }

    /// Whether a word of denial has passed.
    pub fn found(&self) -> bool {
        self.found
    }
}

/// Codex's `sandboxDenied` for a process that ran confined and exited with
/// `exit_code` (128 + N when killed by signal N), its output's words seen
/// by `scans` (one per stream).
pub fn sandbox_denied<'a>(exit_code: i32, scans: impl IntoIterator<Item = &'a DenialScan>) -> bool {
    if exit_code == 0 {
        return false;
    }
    if scans.into_iter().any(DenialScan::found) {
        return true;
    }
    if OTHER_FAILURES.contains(&exit_code) {
        return false;
    }
    exit_code == KILLED_BY_SIGSYS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(exit_code: i32, output: &str) -> bool {
        let mut scan = DenialScan::new();
        scan.feed(output.as_bytes());
        sandbox_denied(exit_code, [&scan])
    }

    #[test]
    fn words_of_denial_count_only_for_a_failure() {
        assert!(denied(1, "bash: x: Permission denied\n"));
        assert!(denied(1, "PERMISSION DENIED"));
        assert!(!denied(0, "permission denied"));
        assert!(!denied(1, ""));
        assert!(denied(2, "Operation not permitted"));
        for word in [
            "Landlock",
            "SANDBOX",
            "seccomp",
            "Read-only file system",
            "failed to write file",
        ] {
            assert!(denied(3, word), "{word}");
        }
        for other in ["EACCES", "access denied", "not permitted"] {
            assert!(!denied(3, other), "{other}");
        }
    }

    #[test]
    fn exit_codes_decide_without_words() {
        assert!(!denied(2, ""));
        assert!(!denied(126, ""));
        assert!(!denied(127, ""));
        assert!(denied(159, ""));
        assert!(!denied(139, ""));
    }

    #[test]
    fn a_word_split_between_chunks_is_found() {
        let text = b"xx: Read-only file system\n";
        for split in 0..text.len() {
            let mut scan = DenialScan::new();
            scan.feed(&text[..split]);
            scan.feed(&text[split..]);
            assert!(scan.found(), "split at {split}");
        }
        // Bytes at a time, after a long run of others.
        let mut scan = DenialScan::new();
        scan.feed(&[b'a'; 100_000]);
        for byte in b"LANDLOCK" {
            scan.feed(&[*byte]);
        }
        assert!(scan.found());
    }

    /// Every case observed against Codex's own exec-server (0.169.0): each
    /// command ran once with the workspace-write intent and once without a
    /// sandbox, and its exit code and `sandboxDenied` were recorded.
    #[test]
    fn agrees_with_codex_on_every_observed_case() {
        let observed: serde_json::Value = serde_json::from_str(include_str!(
            "../../tests/codex/fixtures/sandbox-denied-observed.json"
        ))
        .unwrap();
        let outputs = [
            ("perm-stderr-1", "Permission denied\n"),
            ("perm-stdout-1", "Permission DENIED\n"),
            ("perm-0", "permission denied\n"),
            ("plain-1", ""),
            ("opnp-2", "Operation not permitted\n"),
            ("plain-2", ""),
            ("plain-126", ""),
            ("plain-127", ""),
            ("sigsys", ""),
            ("exit159", ""),
            ("sigsegv", ""),
            ("landlock-3", "Landlock\n"),
            ("sandbox-3", "SANDBOX\n"),
            ("seccomp-3", "seccomp\n"),
            ("rofs-3", "Read-only file system\n"),
            ("fwf-3", "failed to write file\n"),
            ("eacces-3", "EACCES\n"),
            ("denied-3", "access denied\n"),
            ("notpermitted-3", "not permitted\n"),
            (
                "real-write-outside",
                "/bin/bash: line 1: /outside-probe.txt: Read-only file system\n",
            ),
            (
                "real-write-git",
                "/bin/bash: line 1: .git/probe: Read-only file system\n",
            ),
        ];
        let cases = observed.as_object().unwrap();
        assert_eq!(cases.len(), outputs.len() * 2);
        for (name, output) in outputs {
            for confined in [true, false] {
                let key = format!("{}-{name}", if confined { "sandbox" } else { "none" });
                let case = &cases[&key];
                let exit_code = case[1].as_i64().unwrap() as i32;
                let expected = case[2].as_bool().unwrap();
                // Unconfined: never (the bridge does not ask).
                let ours = confined && denied(exit_code, output);
                assert_eq!(ours, expected, "{key}: exit {exit_code}, {output:?}");
            }
        }
    }
}
