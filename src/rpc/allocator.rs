//! The process's allocator, set up for a stream of big messages.
//!
//! A connection carrying bulk bytes (a port's, a file's, output) allocates
//! and frees a message of 256 KiB to 1 MiB per call on each side. With
//! glibc's defaults those sizes come from the top of the heap, and freeing
//! a few of them in a row crosses the trim threshold: the heap shrinks and
//! grows again for the next message, so every page of every message is
//! faulted in, zeroed by the kernel and unmapped. That churn cost a client
//! sending 1 GiB through `dial` half its CPU (0.9 s of system time against
//! 0.4 s with it gone) and halved the rate.
//!
//! [`tune_allocator`] raises the thresholds once per process: allocations
//! under 8 MiB (every message capexec makes) come from the heap, and up to
//! 64 MiB freed at its top is kept for the next ones. The `capexec`
//! binary calls it first thing; the library calls it too when it sets up
//! a Cap'n Proto connection or an in-process executor, so a program using
//! the library gets the same data path. It does nothing where the environment configures glibc's
//! malloc itself (`GLIBC_TUNABLES` naming `glibc.malloc`, or one of the
//! `MALLOC_*_` variables): the operator's choice wins.

use std::sync::Once;

/// Below this, allocations come from the heap, not a mapping of their own.
const MMAP_THRESHOLD_BYTES: i32 = 8 << 20;

/// Free memory at the heap's top kept for later allocations.
const TRIM_THRESHOLD_BYTES: i32 = 64 << 20;

static TUNED: Once = Once::new();

/// Keeps freed message buffers for the next messages (see the module's
/// documentation). Once per process; later calls do nothing.
pub fn tune_allocator() {
    TUNED.call_once(|| {
        if configured_by_environment(|name| std::env::var_os(name)) {
            return;
        }
        set_thresholds();
    });
}

/// Whether the environment sets glibc's malloc parameters itself.
fn configured_by_environment(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> bool {
    let tunables = var("GLIBC_TUNABLES").is_some_and(|value| {
        value
            .to_string_lossy()
            .split(':')
            .any(|tunable| tunable.starts_with("glibc.malloc."))
    });
    tunables
        || [
            "MALLOC_TRIM_THRESHOLD_",
            "MALLOC_MMAP_THRESHOLD_",
            "MALLOC_TOP_PAD_",
        ]
        .iter()
        .any(|name| var(name).is_some())
}

#[cfg(target_env = "gnu")]
fn set_thresholds() {
    // SAFETY: mallopt only changes the parameters of glibc's allocator; it
    // takes the allocator's own locks and is safe with threads running.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES);
    }
}

/// Other C libraries have no such parameters (or none that churn alike).
#[cfg(not(target_env = "gnu"))]
fn set_thresholds() {}

#[cfg(test)]
mod tests {
    use super::configured_by_environment;
    use std::ffi::OsString;

    fn with(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let pairs: Vec<(String, OsString)> = pairs
            .iter()
            .map(|(name, value)| (name.to_string(), OsString::from(value)))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.clone())
        }
    }

    #[test]
    fn the_environment_decides_only_when_it_sets_malloc_parameters() {
        let cases: [(&[(&str, &str)], bool); 6] = [
            (&[], false),
            (&[("GLIBC_TUNABLES", "glibc.pthread.rseq=0")], false),
            (&[("MALLOC_ARENA_MAX", "2")], false),
            (
                &[(
                    "GLIBC_TUNABLES",
                    "glibc.pthread.rseq=0:glibc.malloc.trim_threshold=1",
                )],
                true,
            ),
            (&[("MALLOC_TRIM_THRESHOLD_", "0")], true),
            (&[("MALLOC_MMAP_THRESHOLD_", "0")], true),
        ];
        for (environment, configured) in cases {
            assert_eq!(
                configured_by_environment(with(environment)),
                configured,
                "{environment:?}"
            );
        }
    }
}
