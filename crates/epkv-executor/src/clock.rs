//! Time sources. Components never read the system clock directly; they are handed a
//! [`Clock`] so tests can drive time by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of monotonic and wall-clock time.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic time, for measuring intervals and scheduling.
    fn now(&self) -> Instant;
    /// Wall-clock time since the Unix epoch, for expiry and CAS generation.
    fn unix_time(&self) -> Duration;
}

/// The real clocks of the machine.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[expect(
        clippy::disallowed_methods,
        reason = "this is the one place that reads the system clock"
    )]
    fn now(&self) -> Instant {
        Instant::now()
    }

    #[expect(
        clippy::disallowed_methods,
        reason = "this is the one place that reads the system clock"
    )]
    fn unix_time(&self) -> Duration {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
    }
}

/// The system clock shifted by an adjustable number of seconds: the server's testing mode
/// uses it so ADJUST_TIMEOFDAY can move time forward without sleeping.
#[derive(Debug, Default)]
pub struct OffsetClock {
    offset_secs: AtomicI64,
}

impl OffsetClock {
    /// Creates a clock with no offset.
    #[must_use]
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Sets the offset from real time, in seconds (may be negative).
    pub fn set_offset_secs(&self, secs: i64) {
        self.offset_secs.store(secs, Ordering::Relaxed);
    }

    fn offset(&self) -> (Duration, bool) {
        let s = self.offset_secs.load(Ordering::Relaxed);
        (Duration::from_secs(s.unsigned_abs()), s < 0)
    }
}

impl Clock for OffsetClock {
    fn now(&self) -> Instant {
        let base = SystemClock.now();
        match self.offset() {
            (d, false) => base.checked_add(d).unwrap_or(base),
            (d, true) => base.checked_sub(d).unwrap_or(base),
        }
    }

    fn unix_time(&self) -> Duration {
        let base = SystemClock.unix_time();
        match self.offset() {
            (d, false) => base.saturating_add(d),
            (d, true) => base.saturating_sub(d),
        }
    }
}

/// A clock that only moves when told to. Monotonic time starts at the instant of creation;
/// wall-clock time starts at the given Unix time.
#[derive(Debug)]
pub struct ManualClock {
    origin: Instant,
    start_unix: Duration,
    elapsed_nanos: AtomicU64,
}

impl ManualClock {
    /// Creates a manual clock whose wall-clock time is `start_unix` since the epoch.
    #[must_use]
    pub fn new(start_unix: Duration) -> Self {
        Self {
            origin: SystemClock.now(),
            start_unix,
            elapsed_nanos: AtomicU64::new(0),
        }
    }

    /// Moves both clocks forward by `d`.
    pub fn advance(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.elapsed_nanos.fetch_add(nanos, Ordering::SeqCst);
    }

    fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.elapsed_nanos.load(Ordering::SeqCst))
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.origin + self.elapsed()
    }

    fn unix_time(&self) -> Duration {
        self.start_unix + self.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let c = ManualClock::new(Duration::from_secs(100));
        let t0 = c.now();
        assert_eq!(c.now(), t0);
        c.advance(Duration::from_millis(1500));
        assert_eq!(c.now() - t0, Duration::from_millis(1500));
        assert_eq!(c.unix_time(), Duration::from_millis(101_500));
    }

    #[test]
    fn offset_clock_shifts_wall_time() {
        let c = OffsetClock::new();
        let before = SystemClock.unix_time();
        c.set_offset_secs(3600);
        assert!(c.unix_time() >= before + Duration::from_secs(3600));
        c.set_offset_secs(-3600);
        assert!(c.unix_time() < before);
    }
}
