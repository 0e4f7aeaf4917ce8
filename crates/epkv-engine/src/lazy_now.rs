//! [`LazyNow`]: the time of one operation, read from the clock at most once.
//!
//! Level: a leaf. It imports no module of this crate.

use epkv_executor::Clock;
use std::cell::Cell;

/// The time of one operation, read from the bucket clock at most once, and only if the
/// operation needs it (a GET of an item with no expiry and no lock never reads the clock).
pub(crate) struct LazyNow<'a> {
    clock: &'a dyn Clock,
    cached: Cell<Option<(u32, u64)>>,
}

impl<'a> LazyNow<'a> {
    pub(crate) fn new(clock: &'a dyn Clock) -> Self {
        Self {
            clock,
            cached: Cell::new(None),
        }
    }

    fn read(&self) -> (u32, u64) {
        if let Some(v) = self.cached.get() {
            return v;
        }
        let t = self.clock.unix_time();
        let v = (
            u32::try_from(t.as_secs()).unwrap_or(u32::MAX),
            u64::try_from(t.as_nanos()).unwrap_or(u64::MAX),
        );
        self.cached.set(Some(v));
        v
    }

    /// Unix time in whole seconds (expiry and lock times).
    pub(crate) fn secs(&self) -> u32 {
        self.read().0
    }

    /// Unix time in nanoseconds (HLC CAS).
    pub(crate) fn nanos(&self) -> u64 {
        self.read().1
    }
}
