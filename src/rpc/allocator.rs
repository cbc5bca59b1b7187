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
//! the library gets the same data path without asking.
//!
//! The price is memory kept after a burst: up to 64 MiB of free heap in the
//! main arena, and each other arena (a thread's that allocated, such as the
//! blocking threads that read files) keeps its peak, since its heaps (64 MiB
//! at most) never hold 64 MiB free. Those peaks are small here (the chunks
//! in flight), and `MALLOC_ARENA_MAX` bounds how many arenas there are.
//!
//! It changes nothing where the environment sets these parameters
//! (`GLIBC_TUNABLES` with `glibc.malloc.trim_threshold`, `mmap_threshold`,
//! `top_pad` or `mmap_max`, or `MALLOC_TRIM_THRESHOLD_`,
//! `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TOP_PAD_`, `MALLOC_MMAP_MAX_`): the
//! operator's choice wins. A program that sets them with `mallopt` itself
//! calls [`keep_allocator_settings`] first.

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

/// Leaves glibc's malloc as the program set it: [`tune_allocator`] does
/// nothing from then on, whoever calls it. For a program that tunes malloc
/// itself; call it before the first connection or executor.
pub fn keep_allocator_settings() {
    TUNED.call_once(|| {});
}

/// The `GLIBC_TUNABLES` keys that set what [`tune_allocator`] sets (or
/// change what those settings mean).
const TUNABLES: [&str; 4] = [
    "glibc.malloc.trim_threshold",
    "glibc.malloc.mmap_threshold",
    "glibc.malloc.top_pad",
    "glibc.malloc.mmap_max",
];

/// The older environment variables for the same parameters.
const VARIABLES: [&str; 4] = [
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
];

/// Whether the environment sets the parameters [`tune_allocator`] would.
fn configured_by_environment(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> bool {
    // `name=value` pairs separated by colons.
    let tunables = var("GLIBC_TUNABLES").is_some_and(|value| {
        value.to_string_lossy().split(':').any(|tunable| {
            let name = tunable.split('=').next().unwrap_or_default();
            TUNABLES.contains(&name)
        })
    });
    tunables || VARIABLES.iter().any(|name| var(name).is_some())
}

#[cfg(target_env = "gnu")]
fn set_thresholds() {
    // SAFETY: mallopt takes no pointers and cannot corrupt the heap. glibc
    // calls it MT-unsafe: other threads' malloc and free read these words
    // without its lock, so a call racing them may see the old value (and a
    // free racing it may move the mmap threshold to its chunk's size, as
    // glibc's dynamic threshold does anyway). The binary calls this before
    // any thread; the library at its first connection, where the worst
    // outcome is the allocator's default behaviour. A value glibc refuses
    // (32-bit glibc caps the mmap threshold at 512 KiB) leaves its default.
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
        let cases: [(&[(&str, &str)], bool); 11] = [
            (&[], false),
            (&[("GLIBC_TUNABLES", "glibc.pthread.rseq=0")], false),
            (&[("MALLOC_ARENA_MAX", "2")], false),
            // Other malloc tunables leave these parameters to us.
            (&[("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")], false),
            (
                &[("GLIBC_TUNABLES", "glibc.malloc.trim_threshold_x=1")],
                false,
            ),
            (
                &[(
                    "GLIBC_TUNABLES",
                    "glibc.pthread.rseq=0:glibc.malloc.trim_threshold=1",
                )],
                true,
            ),
            (&[("GLIBC_TUNABLES", "glibc.malloc.mmap_max=0")], true),
            (&[("MALLOC_TRIM_THRESHOLD_", "0")], true),
            (&[("MALLOC_MMAP_THRESHOLD_", "0")], true),
            (&[("MALLOC_TOP_PAD_", "0")], true),
            (&[("MALLOC_MMAP_MAX_", "0")], true),
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
