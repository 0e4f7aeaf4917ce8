//! [`KeyFilter`] and [`FullState`]: a vBucket's full-eviction state, the bloom filter of
//! the keys that may exist and the count of documents only on disk (see
//! [`crate::full_eviction`] for how operations use them).
//!
//! Level: a leaf, below the vBucket that owns one. It imports no module of this crate.

use fastbloom::AtomicBloomFilter;
use parking_lot::RwLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// False-positive rate a filter is sized for (KV-Engine's `bfilter_fp_prob`).
const FALSE_POSITIVE_RATE: f64 = 0.01;

/// Fewest keys a filter is sized for: 1024 keys take 1.2 KiB, so 1.2 MiB for a bucket of
/// 1024 vBuckets. (KV-Engine sizes for 10,000 keys, 12 MiB a bucket.)
pub(crate) const MIN_FILTER_KEYS: usize = 1024;

/// One bloom filter with the key count it was sized for and the keys added since.
#[derive(Debug)]
struct Filter {
    bits: AtomicBloomFilter,
    sized_for: usize,
    added: AtomicU64,
}

impl Filter {
    fn new(keys: usize) -> Self {
        let sized_for = keys.max(MIN_FILTER_KEYS);
        Self {
            bits: AtomicBloomFilter::with_false_pos(FALSE_POSITIVE_RATE).expected_items(sized_for),
            sized_for,
            added: AtomicU64::new(0),
        }
    }

    fn add(&self, key: &[u8]) {
        self.bits.insert(key);
        self.added.fetch_add(1, Relaxed);
    }
}

#[derive(Debug)]
struct Filters {
    current: Filter,
    /// The filter a rebuild is filling; every key added meanwhile goes to both.
    pending: Option<Filter>,
}

/// A vBucket's filter of the keys that may exist, with the rebuild that replaces it.
/// Adds and lookups take the lock shared (the bits are atomic); only the start and end
/// of a rebuild take it exclusively.
#[derive(Debug)]
pub(crate) struct KeyFilter {
    filters: RwLock<Filters>,
}

impl KeyFilter {
    pub(crate) fn new(keys: usize) -> Self {
        Self {
            filters: RwLock::new(Filters {
                current: Filter::new(keys),
                pending: None,
            }),
        }
    }

    /// Notes that `key` may exist.
    pub(crate) fn add(&self, key: &[u8]) {
        let f = self.filters.read();
        f.current.add(key);
        if let Some(p) = &f.pending {
            p.add(key);
        }
    }

    /// False when `key` certainly has no live version.
    pub(crate) fn may_contain(&self, key: &[u8]) -> bool {
        self.filters.read().current.bits.contains(key)
    }

    /// Starts a rebuild sized for `keys` keys: from now on keys go to the new filter too.
    pub(crate) fn begin_rebuild(&self, keys: usize) {
        self.filters.write().pending = Some(Filter::new(keys));
    }

    /// Adds `key` to the filter being rebuilt only.
    pub(crate) fn add_rebuilt(&self, key: &[u8]) {
        if let Some(p) = &self.filters.read().pending {
            p.add(key);
        }
    }

    /// Replaces the filter with the rebuilt one.
    pub(crate) fn finish_rebuild(&self) {
        let mut f = self.filters.write();
        if let Some(p) = f.pending.take() {
            f.current = p;
        }
    }

    /// Drops a rebuild that failed (the old filter stays; it is never wrong, only full).
    pub(crate) fn cancel_rebuild(&self) {
        self.filters.write().pending = None;
    }

    /// Replaces the filter with an empty one (FLUSH deleted every document).
    pub(crate) fn reset(&self) {
        self.reset_for(MIN_FILTER_KEYS);
    }

    /// Replaces the filter with an empty one sized for `keys` keys (warmup, before it
    /// adds the keys it finds).
    pub(crate) fn reset_for(&self, keys: usize) {
        let mut f = self.filters.write();
        f.current = Filter::new(keys);
        f.pending = None;
    }

    /// True when more keys were added than twice the count the filter was sized for
    /// (its false-positive rate is then several times the target).
    pub(crate) fn is_overfull(&self) -> bool {
        let f = self.filters.read();
        f.pending.is_none() && f.current.added.load(Relaxed) > 2 * f.current.sized_for as u64
    }

    /// The filter's size in bits and the key count it was sized for (stats).
    pub(crate) fn size(&self) -> (usize, usize) {
        let f = self.filters.read();
        (f.current.bits.num_bits(), f.current.sized_for)
    }
}

/// A vBucket's full-eviction state.
#[derive(Debug)]
pub(crate) struct FullState {
    pub(crate) filter: KeyFilter,
    /// Live documents the pager took out of memory (and not read back since).
    evicted: AtomicU64,
}

impl FullState {
    pub(crate) fn new() -> Self {
        Self {
            filter: KeyFilter::new(MIN_FILTER_KEYS),
            evicted: AtomicU64::new(0),
        }
    }

    /// Live documents on disk only.
    pub(crate) fn evicted(&self) -> u64 {
        self.evicted.load(Relaxed)
    }

    pub(crate) fn add_evicted(&self, n: u64) {
        self.evicted.fetch_add(n, Relaxed);
    }

    /// `n` evicted documents are in memory again, or were found to be the older versions
    /// of keys written since without a lookup.
    pub(crate) fn sub_evicted(&self, n: u64) {
        let _ = self
            .evicted
            .fetch_update(Relaxed, Relaxed, |e| Some(e.saturating_sub(n)));
    }

    /// FLUSH: nothing is on disk any more.
    pub(crate) fn reset(&self) {
        self.evicted.store(0, Relaxed);
        self.filter.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_contains_what_was_added_and_a_rebuild_keeps_keys_added_meanwhile() {
        let f = KeyFilter::new(10);
        assert!(!f.may_contain(b"a"));
        f.add(b"a");
        assert!(f.may_contain(b"a"));
        f.begin_rebuild(100);
        f.add_rebuilt(b"b");
        // Written during the rebuild: in both.
        f.add(b"c");
        f.finish_rebuild();
        assert!(f.may_contain(b"b") && f.may_contain(b"c"));
        // "a" was not re-added by the rebuild: gone (barring a false positive).
        let absent = (0..1000)
            .filter(|i| !f.may_contain(format!("x{i}").as_bytes()))
            .count();
        assert!(
            absent > 900,
            "false positives near 1%: {absent} of 1000 absent"
        );
        f.begin_rebuild(10);
        f.cancel_rebuild();
        assert!(
            f.may_contain(b"b"),
            "a cancelled rebuild keeps the old filter"
        );
    }

    #[test]
    fn a_filter_is_overfull_past_twice_its_size() {
        let f = KeyFilter::new(0);
        let (bits, sized) = f.size();
        assert_eq!(sized, MIN_FILTER_KEYS);
        assert!(bits >= MIN_FILTER_KEYS * 9, "about 9.6 bits per key at 1%");
        for i in 0..2 * MIN_FILTER_KEYS {
            f.add(format!("k{i}").as_bytes());
        }
        assert!(!f.is_overfull());
        f.add(b"one more");
        assert!(f.is_overfull());
        f.reset();
        assert!(!f.is_overfull());
    }

    #[test]
    fn evicted_count_never_goes_below_zero() {
        let s = FullState::new();
        s.sub_evicted(1);
        assert_eq!(s.evicted(), 0);
        s.add_evicted(2);
        s.sub_evicted(1);
        assert_eq!(s.evicted(), 1);
        s.reset();
        assert_eq!(s.evicted(), 0);
    }
}
