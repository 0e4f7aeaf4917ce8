//! The pausable visitor: walks the committed items stripe by stripe, bucket by bucket,
//! and can stop at any item and later resume from a [`Position`] without holding any lock
//! in between (what the item pager and expiry pager need).

use crate::StoredValue;
use crate::hash_table::{HashTable, Inner, Shared, Slot, bump_mfu, evict, set_mfu};
use crate::stats::StripeCounts;

/// Where a paused visit resumes: a stripe, a bucket inside it, and the stripe's resize
/// count when the visit paused.
///
/// If the stripe was resized in between, its buckets have moved and the visit restarts
/// that stripe from its first bucket: every item present for the whole visit is seen at
/// least once, and an item of a stripe resized during a pause may be seen twice. A stripe
/// with a paused visit inside does not shrink (until a visit walks it to its end) and,
/// when full, doubles (instead of growing by half or a third, or clearing out tombstones at the
/// same size), so only growth that doubles the stripe can restart a visit, and the visit
/// ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    stripe: usize,
    bucket: usize,
    resizes: usize,
}

impl Position {
    /// The start of the table.
    pub const START: Position = Position {
        stripe: 0,
        bucket: 0,
        resizes: 0,
    };

    /// The start of stripe `stripe` (a visit from there goes on to the table's end; past
    /// the last stripe it visits nothing).
    #[must_use]
    pub fn stripe_start(stripe: usize) -> Position {
        Position {
            stripe,
            bucket: 0,
            resizes: 0,
        }
    }

    /// The stripe the visit will resume in.
    #[must_use]
    pub fn stripe(&self) -> usize {
        self.stripe
    }
}

/// What the visitor's callback wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    /// Go on with the next item.
    Continue,
    /// Stop after this item; [`HashTable::visit`] returns where to resume.
    Pause,
}

/// The item the visitor's callback is shown, with what a pager may do to it.
pub struct VisitedItem<'a> {
    inner: &'a mut Inner,
    counts: &'a StripeCounts,
    shared: &'a Shared,
    bucket: usize,
    removed: bool,
}

impl VisitedItem<'_> {
    /// The item (always committed; prepares are not visited), or `None` once
    /// [`Self::remove`] has removed it.
    #[must_use]
    pub fn item(&self) -> Option<&StoredValue> {
        if self.removed {
            return None;
        }
        self.inner.committed.get(self.bucket).map(|b| &**b)
    }

    /// The item's MFU counter, or `None` once [`Self::remove`] has removed it. The table
    /// keeps the counter beside the item, not in it.
    #[must_use]
    pub fn mfu(&self) -> Option<u8> {
        if self.removed {
            return None;
        }
        self.inner.committed.get(self.bucket).map(Slot::mfu)
    }

    /// Removes the item from the table.
    pub fn remove(&mut self) {
        if self.removed {
            return;
        }
        if let Some(sv) = self.inner.committed.remove(self.bucket) {
            let p = sv.props();
            self.shared.tracker.release(p.footprint());
            self.counts.apply(Some(&p), None);
            self.inner.mfu.apply(p.evictable_mfu, None);
            self.removed = true;
        }
    }

    /// As [`crate::Entry::mark_clean_upto`]: clears the item's dirty bit if `persisted`
    /// covers it; returns whether it did.
    pub fn mark_clean_upto(&mut self, persisted: epkv_types::Seqno) -> bool {
        if self.removed {
            return false;
        }
        match self.inner.committed.get_mut(self.bucket) {
            Some(sv) => crate::hash_table::clean_upto(sv, self.counts, persisted),
            None => false,
        }
    }

    /// Evicts the item's value if it is live, clean and resident; returns whether it did.
    pub fn evict_value(&mut self) -> bool {
        if self.removed {
            return false;
        }
        let inner = &mut *self.inner;
        match inner.committed.get_mut(self.bucket) {
            Some(sv) => evict(sv, self.counts, self.shared, &mut inner.mfu),
            None => false,
        }
    }

    /// Sets the item's MFU counter (the pager decays counters of items it keeps).
    pub fn set_mfu(&mut self, mfu: u8) {
        if self.removed {
            return;
        }
        let inner = &mut *self.inner;
        if let Some(sv) = inner.committed.get_mut(self.bucket) {
            set_mfu(sv, &mut inner.mfu, mfu);
        }
    }

    /// Counts an access to the item (MFU bump), as a client read would.
    pub fn track_reference(&mut self) {
        if self.removed {
            return;
        }
        let inner = &mut *self.inner;
        if let Some(sv) = inner.committed.get_mut(self.bucket)
            && !sv.is_deleted()
        {
            bump_mfu(sv, &mut inner.mfu);
        }
    }
}

impl HashTable {
    /// Visits the committed items from `from` (use [`Position::START`]) in bucket order,
    /// calling `f` on each under its stripe's lock, which is held for at most one stripe
    /// at a time and released between stripes and at a pause. Returns `None` when the
    /// whole table has been visited, or the position to resume from when `f` returned
    /// [`Visit::Pause`].
    ///
    /// Shrinking is deferred while a stripe is being visited (removals do not move other
    /// items); items inserted into a stripe during its visit may or may not be seen.
    pub fn visit(
        &self,
        from: Position,
        mut f: impl FnMut(&mut VisitedItem<'_>) -> Visit,
    ) -> Option<Position> {
        let stripes = self.stripes();
        let mut stripe_idx = from.stripe;
        let mut start_bucket = from.bucket;
        let mut expected_resizes = Some(from.resizes);
        while let Some(stripe) = stripes.get(stripe_idx) {
            let mut guard = stripe.inner.lock();
            let resizes = stripe
                .counts
                .resizes
                .load(std::sync::atomic::Ordering::Relaxed);
            if expected_resizes.is_some_and(|r| r != resizes) {
                start_bucket = 0;
            }
            let mut paused_at = None;
            let mut any_removed = false;
            let buckets = guard.committed.num_buckets();
            for bucket in start_bucket..buckets {
                if guard.committed.get(bucket).is_none() {
                    continue;
                }
                let mut item = VisitedItem {
                    inner: &mut guard,
                    counts: &stripe.counts,
                    shared: self.shared(),
                    bucket,
                    removed: false,
                };
                let v = f(&mut item);
                any_removed |= item.removed;
                if v == Visit::Pause {
                    paused_at = Some(bucket + 1);
                    break;
                }
            }
            if let Some(bucket) = paused_at {
                stripe
                    .visit_paused
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                return Some(Position {
                    stripe: stripe_idx,
                    bucket,
                    resizes,
                });
            }
            stripe
                .visit_paused
                .store(false, std::sync::atomic::Ordering::Relaxed);
            if any_removed && crate::hash_table::shrink_if_sparse(&mut guard) {
                stripe.counts.count_resize();
                self.refresh_bucket_hint(stripe_idx, &guard);
            }
            drop(guard);
            stripe_idx += 1;
            start_bucket = 0;
            expected_resizes = None;
        }
        None
    }
}
