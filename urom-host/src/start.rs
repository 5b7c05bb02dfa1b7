//! Where a context that is starting stands, and the loop that waits for it: one shape for
//! workers and domains.

use std::fmt;
use std::time::{Duration, Instant};

use super::ProgressEngine;

/// Where a starting context is: `S` is it still starting, `I` it idle again, `E` why it failed.
pub enum Progress<S, I, E> {
    /// Still starting: progress, then ask again.
    Starting(S),
    /// It failed; the idle context (its configuration kept) comes back, to be started again.
    Failed(I, E),
}

impl<S, I, E: fmt::Display> fmt::Debug for Progress<S, I, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Starting(_) => f.write_str("Starting"),
            Self::Failed(_, e) => write!(f, "Failed({e})"),
        }
    }
}

/// Progresses `engine` and asks `try_running` until `starting` runs or fails; still starting
/// after `timeout`, it is handed back as [`Progress::Starting`].
pub(crate) fn wait_running<S, I, E, R>(
    mut starting: S,
    engine: &mut ProgressEngine,
    timeout: Duration,
    try_running: impl Fn(S) -> Result<R, Progress<S, I, E>>,
) -> Result<R, Progress<S, I, E>> {
    let deadline = Instant::now().checked_add(timeout);
    loop {
        engine.progress();
        match try_running(starting) {
            Err(Progress::Starting(again))
                if deadline.is_none_or(|deadline| Instant::now() < deadline) =>
            {
                starting = again;
            }
            outcome => return outcome,
        }
    }
}
