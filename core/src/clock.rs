//! The one time base: Unix epoch time from an injected [`Clock`].
//!
//! Every crate reads time through this seam, never ambiently (clippy's `disallowed-methods`
//! bans `SystemTime::now` and `Instant::now` outside it), so a decision's timestamp means the
//! same thing after a restart and on another control node. The pure code of this crate takes
//! `now` as an argument and never holds a clock; the seam is defined here only because every
//! other crate depends on `core`.

use std::sync::Mutex;
use std::time::Duration;

use crate::ledger::Millis;

/// 2026-01-01T00:00:00Z: where a [`ManualClock`] starts unless told otherwise.
pub const DEFAULT_EPOCH: Duration = Duration::from_secs(1_767_225_600);

/// Time since the Unix epoch (virtual in simulations and tests).
pub trait Clock: Send + Sync {
    fn now(&self) -> Duration;

    /// [`Clock::now`] in milliseconds, as the ledger carries time.
    fn now_millis(&self) -> Millis {
        to_millis(self.now())
    }
}

/// A duration in milliseconds, saturating.
pub fn to_millis(d: Duration) -> Millis {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the Unix epoch.
pub fn rfc3339(unix_seconds: u64) -> String {
    let days = (unix_seconds / 86_400) as i64;
    let secs = unix_seconds % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs / 60 % 60, secs % 60)
}

/// A clock that moves only when told to.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<Duration>,
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::at(DEFAULT_EPOCH)
    }
}

impl ManualClock {
    /// A clock at [`DEFAULT_EPOCH`].
    pub fn new() -> Self {
        ManualClock::default()
    }

    /// A clock at `epoch` (time since the Unix epoch).
    pub fn at(epoch: Duration) -> Self {
        ManualClock { now: Mutex::new(epoch) }
    }

    /// Moves time forward.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *now = now.saturating_add(by);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        *self.now.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The wall clock. Made by the composition root (the binary) and by tests and examples that
/// run in real time; library code gets a `Clock` handed in.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl SystemClock {
    pub fn new() -> Self {
        SystemClock
    }
}

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods, reason = "the wall-clock implementation of the Clock seam")]
    fn now(&self) -> Duration {
        // A system clock set before 1970 reads as the epoch rather than failing.
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_civil() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_767_225_600), "2026-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400 + 3661), "2000-02-29T01:01:01Z");
    }

    #[test]
    fn a_manual_clock_starts_at_its_epoch_and_moves_when_told() {
        let c = ManualClock::new();
        assert_eq!(c.now(), DEFAULT_EPOCH);
        c.advance(Duration::from_millis(1500));
        assert_eq!(c.now_millis(), 1_767_225_601_500);
        assert_eq!(ManualClock::at(Duration::from_secs(7)).now_millis(), 7000);
    }

    #[test]
    fn the_system_clock_reads_unix_time() {
        // After 2025-01-01 and before 2100: Unix time, not time since the process started.
        let s = SystemClock.now().as_secs();
        assert!((1_735_689_600..4_102_444_800).contains(&s), "{s}");
    }
}
