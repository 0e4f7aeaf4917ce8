//! [`MemoryTracker`]: bytes charged by items, shared by every table of a bucket, with a limit.

use crate::{Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts the bytes charged by items (see [`crate::StoredValue::footprint`]) across every
/// table that shares it, and refuses growth beyond a limit.
///
/// Charges go through a compare-and-swap loop, so the count never exceeds the limit, even
/// transiently, whatever the number of concurrent writers. Releases always succeed.
#[derive(Debug)]
pub struct MemoryTracker {
    /// Bytes currently charged.
    used: AtomicUsize,
    /// Bytes that may be charged at most; `usize::MAX` means unlimited.
    limit: AtomicUsize,
}

impl MemoryTracker {
    /// Creates a tracker with the given limit in bytes.
    #[must_use]
    pub fn new(limit_bytes: usize) -> Self {
        Self {
            used: AtomicUsize::new(0),
            limit: AtomicUsize::new(limit_bytes),
        }
    }

    /// Creates a tracker without a limit.
    #[must_use]
    pub fn unlimited() -> Self {
        Self::new(usize::MAX)
    }

    /// Returns the bytes currently charged.
    #[must_use]
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Returns the limit in bytes.
    #[must_use]
    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// Changes the limit. Bytes already charged stay charged even if above the new limit;
    /// only later growth is refused.
    pub fn set_limit(&self, limit_bytes: usize) {
        self.limit.store(limit_bytes, Ordering::Relaxed);
    }

    /// Charges `bytes` if that keeps the total within the limit.
    ///
    /// # Errors
    /// [`Error::QuotaExceeded`] when the charge would exceed the limit; nothing is charged.
    pub fn try_charge(&self, bytes: usize) -> Result<()> {
        let limit = self.limit();
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&total| total <= limit)
            })
            .map(|_| ())
            .map_err(|used| Error::QuotaExceeded {
                needed: bytes,
                used,
                limit,
            })
    }

    /// Returns `bytes` to the tracker.
    pub fn release(&self, bytes: usize) {
        let prev = self.used.fetch_sub(bytes, Ordering::Relaxed);
        debug_assert!(prev >= bytes, "released more memory than was charged");
    }
}

impl Default for MemoryTracker {
    fn default() -> Self {
        Self::unlimited()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charge_within_limit_succeeds_and_beyond_fails() {
        let t = MemoryTracker::new(100);
        t.try_charge(60).unwrap();
        assert!(matches!(
            t.try_charge(41),
            Err(Error::QuotaExceeded {
                needed: 41,
                used: 60,
                limit: 100
            })
        ));
        assert_eq!(t.used(), 60);
        t.try_charge(40).unwrap();
        assert_eq!(t.used(), 100);
        t.release(100);
        assert_eq!(t.used(), 0);
    }

    #[test]
    fn lowering_the_limit_refuses_only_growth() {
        let t = MemoryTracker::new(100);
        t.try_charge(80).unwrap();
        t.set_limit(50);
        assert!(t.try_charge(1).is_err());
        t.release(40);
        t.try_charge(10).unwrap();
        assert_eq!(t.used(), 50);
    }
}
