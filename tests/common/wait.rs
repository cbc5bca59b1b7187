//! Waiting for something to become so: the one polling helper.
//!
//! The tests run on loaded machines, so nothing waits by sleeping a fixed
//! time: it polls a check, first every few milliseconds and then every
//! [`LONGEST_PAUSE`], until the check passes or [`PATIENCE`] runs out, and
//! then fails naming what it waited for, how long, and the last reason
//! the check gave.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// How long a check may take to pass: far above what a loaded machine
/// needs, well below the whole test's deadline.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The first pause between checks, doubled after each up to the longest.
const FIRST_PAUSE: Duration = Duration::from_millis(2);
const LONGEST_PAUSE: Duration = Duration::from_millis(50);

/// What a check returns: `true`, `Some` or `Ok` once it passes (with the
/// value found, for the latter two); otherwise, for `Err`, why not yet.
pub trait Check {
    type Found;
    fn passed(self) -> Result<Self::Found, Option<String>>;
}

impl Check for bool {
    type Found = ();
    fn passed(self) -> Result<(), Option<String>> {
        if self { Ok(()) } else { Err(None) }
    }
}

impl<T> Check for Option<T> {
    type Found = T;
    fn passed(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: Display> Check for Result<T, E> {
    type Found = T;
    fn passed(self) -> Result<T, Option<String>> {
        self.map_err(|why| Some(why.to_string()))
    }
}

/// Tracks the time waited and the pause before the next check.
struct Patience {
    started: Instant,
    pause: Duration,
}

impl Patience {
    fn new() -> Patience {
        Patience {
            started: Instant::now(),
            pause: FIRST_PAUSE,
        }
    }

    /// The pause before the next check, or, once patience has run out,
    /// what to fail with.
    fn next_pause(&mut self, what: &str, why: Option<String>) -> Result<Duration, String> {
        let waited = self.started.elapsed();
        if waited >= PATIENCE {
            return Err(match why {
                Some(why) => format!("{what}: still not so after {waited:?}: {why}"),
                None => format!("{what}: still not so after {waited:?}"),
            });
        }
        let pause = self.pause;
        self.pause = (pause * 2).min(LONGEST_PAUSE);
        Ok(pause)
    }
}

/// Polls `check` (blocking this thread between checks) until it passes,
/// and returns what it found; panics with `what` after [`PATIENCE`].
/// For async tests, whose checks may need the runtime to make progress,
/// use [`eventually_async`].
#[track_caller]
pub fn eventually<C: Check>(what: &str, mut check: impl FnMut() -> C) -> C::Found {
    let mut patience = Patience::new();
    loop {
        match check().passed() {
            Ok(found) => return found,
            Err(why) => match patience.next_pause(what, why) {
                Ok(pause) => std::thread::sleep(pause),
                Err(failure) => panic!("{failure}"),
            },
        }
    }
}

/// [`eventually`] for async tests: the runtime runs on between checks,
/// and the check itself may await. A failure names the caller's line.
#[track_caller]
pub fn eventually_async<C: Check>(
    what: &str,
    mut check: impl AsyncFnMut() -> C,
) -> impl Future<Output = C::Found> {
    let caller = std::panic::Location::caller();
    async move {
        let mut patience = Patience::new();
        loop {
            match check().await.passed() {
                Ok(found) => return found,
                Err(why) => match patience.next_pause(what, why) {
                    Ok(pause) => tokio::time::sleep(pause).await,
                    Err(failure) => panic!("{failure} (waiting at {caller})"),
                },
            }
        }
    }
}
