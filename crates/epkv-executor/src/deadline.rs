//! [`Deadline`]: a point in one executor's time, the executor's native deadline type.

use crate::state::NEVER;
use std::ops::Add;
use std::time::Duration;

/// A point in time on one executor's clock, in nanoseconds since that executor's epoch.
///
/// Obtained from [`ExecutorHandle::deadline`](crate::ExecutorHandle::deadline) or
/// [`ExecutorHandle::now_deadline`](crate::ExecutorHandle::now_deadline) and moved with
/// `+ Duration`, it is what [`TaskHandle::snooze_to`](crate::TaskHandle::snooze_to)
/// takes. A component that re-arms the same timeout many times a second (the durability
/// timeout every durable write pushes back) reads `now_deadline()` once and adds
/// durations to it: each re-arm then costs one add and the state-word update, with no
/// `Instant` subtraction. [`TaskHandle::snooze_until`](crate::TaskHandle::snooze_until)
/// does that conversion on every call.
///
/// A deadline only means something to the executor that made it (executors have
/// different epochs); passing one to another executor's task moves that task to an
/// unrelated time. Arithmetic saturates just below "never", so adding a huge duration
/// gives the latest representable deadline rather than wrapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline(pub(crate) u64);

impl Deadline {
    /// Nanoseconds since the executor's epoch.
    #[must_use]
    pub fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self + d`, saturating below the "never" sentinel.
    #[inline]
    #[must_use]
    pub fn saturating_add(self, d: Duration) -> Self {
        // u64 arithmetic, not `as_nanos()`'s u128: this is on the re-arm path.
        let ns = d
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(d.subsec_nanos()));
        Self(self.0.saturating_add(ns).min(NEVER - 1))
    }
}

impl Add<Duration> for Deadline {
    type Output = Self;

    #[inline]
    fn add(self, d: Duration) -> Self {
        self.saturating_add(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_nanoseconds_and_saturates_below_never() {
        let d = Deadline(5) + Duration::from_nanos(7);
        assert_eq!(d.as_nanos(), 12);
        assert_eq!(
            (Deadline(1) + Duration::from_secs(2)).as_nanos(),
            2_000_000_001
        );
        assert_eq!((Deadline(0) + Duration::MAX).as_nanos(), NEVER - 1);
        assert_eq!(
            (Deadline(NEVER - 2) + Duration::from_secs(1)).as_nanos(),
            NEVER - 1
        );
        assert!(Deadline(1) < Deadline(2));
    }
}
