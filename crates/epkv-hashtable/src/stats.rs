//! Table statistics: per-stripe counters kept incrementally (KV-Engine's prologue /
//! epilogue: every mutation subtracts the item's properties before and adds them after),
//! and [`TableStats`], a snapshot summed over the stripes.

use crate::StoredValue;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counters of one stripe. Written only under the stripe's lock (a load and a store, no
/// read-modify-write), read without it.
#[derive(Debug, Default)]
pub(crate) struct StripeCounts {
    pub(crate) items: AtomicUsize,
    pub(crate) deleted: AtomicUsize,
    pub(crate) prepared: AtomicUsize,
    pub(crate) non_resident: AtomicUsize,
    pub(crate) dirty: AtomicUsize,
    pub(crate) mem: AtomicUsize,
    pub(crate) resizes: AtomicUsize,
    /// Prepares in state `PreparedMaybeVisible` (reads probe the prepared table only
    /// when this is non-zero).
    pub(crate) maybe_visible: AtomicUsize,
}

#[inline]
fn add(c: &AtomicUsize, d: usize) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(d), Ordering::Relaxed);
}

#[inline]
fn sub(c: &AtomicUsize, d: usize) {
    c.store(c.load(Ordering::Relaxed).wrapping_sub(d), Ordering::Relaxed);
}

/// The properties of one item that the statistics count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Props {
    /// Committed and not deleted.
    live: bool,
    /// Committed tombstone.
    deleted: bool,
    prepared: bool,
    maybe_visible: bool,
    /// Live but its value evicted.
    non_resident: bool,
    dirty: bool,
    footprint: usize,
    /// `Some(mfu)` when the item is in the MFU histogram (committed, live, resident).
    pub(crate) evictable_mfu: Option<u8>,
}

impl Props {
    /// The properties of `sv` whose MFU counter is `mfu` (the table keeps the counter in
    /// the item's slot; see [`crate::hash_table::Slot::props`]).
    pub(crate) fn of(sv: &StoredValue, mfu: u8) -> Self {
        let committed = sv.is_committed();
        let live = committed && !sv.is_deleted();
        Self {
            live,
            deleted: committed && sv.is_deleted(),
            prepared: !committed,
            maybe_visible: sv.committed_state() == crate::CommittedState::PreparedMaybeVisible,
            non_resident: live && !sv.is_resident(),
            dirty: sv.is_dirty(),
            footprint: sv.footprint(),
            evictable_mfu: (live && sv.is_resident()).then_some(mfu),
        }
    }

    pub(crate) fn footprint(&self) -> usize {
        self.footprint
    }
}

impl StripeCounts {
    /// Moves the counters from `before` to `after` (either may be absent: insert/remove).
    pub(crate) fn apply(&self, before: Option<&Props>, after: Option<&Props>) {
        if let Some(b) = before {
            sub(&self.items, usize::from(b.live));
            sub(&self.deleted, usize::from(b.deleted));
            sub(&self.prepared, usize::from(b.prepared));
            sub(&self.maybe_visible, usize::from(b.maybe_visible));
            sub(&self.non_resident, usize::from(b.non_resident));
            sub(&self.dirty, usize::from(b.dirty));
            sub(&self.mem, b.footprint);
        }
        if let Some(a) = after {
            add(&self.items, usize::from(a.live));
            add(&self.deleted, usize::from(a.deleted));
            add(&self.prepared, usize::from(a.prepared));
            add(&self.maybe_visible, usize::from(a.maybe_visible));
            add(&self.non_resident, usize::from(a.non_resident));
            add(&self.dirty, usize::from(a.dirty));
            add(&self.mem, a.footprint);
        }
    }

    pub(crate) fn count_resize(&self) {
        add(&self.resizes, 1);
    }
}

/// MFU values whose counts live inline in [`MfuHistogram`]: new items start at
/// [`crate::mfu::INITIAL`] and stay below 16 for their first few dozen reads.
pub(crate) const MFU_INLINE: usize = 16;

/// The MFU histogram of one stripe, protected by the stripe's lock.
///
/// The counts of the low MFU values are inline, laid out (see [`crate::hash_table`]'s
/// `Inner`) in the stripe's first cache line next to its lock and committed table, so
/// that an insert (and most MFU bumps) updates a line the lookup already brought in: with
/// all 256 counts boxed, that one increment was a cache miss costing 70% of an insert's
/// own time under memaslap. Higher values are counted in a box allocated on first use.
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct MfuHistogram {
    pub(crate) low: [u32; MFU_INLINE],
    high: Option<Box<[u32; 256 - MFU_INLINE]>>,
}

impl MfuHistogram {
    #[inline]
    fn slot(&mut self, mfu: u8) -> &mut u32 {
        let i = usize::from(mfu);
        if i < MFU_INLINE {
            &mut self.low[i]
        } else {
            let high = self
                .high
                .get_or_insert_with(|| Box::new([0; 256 - MFU_INLINE]));
            &mut high[i - MFU_INLINE]
        }
    }

    #[inline]
    pub(crate) fn apply(&mut self, before: Option<u8>, after: Option<u8>) {
        if before == after {
            return;
        }
        if let Some(b) = before {
            let c = self.slot(b);
            *c = c.wrapping_sub(1);
        }
        if let Some(a) = after {
            let c = self.slot(a);
            *c = c.wrapping_add(1);
        }
    }

    /// Moves one item from MFU value `before` to `after` (equal when a bump did not
    /// increment), without branching on whether they differ: the read path's bump is a
    /// coin toss the CPU cannot predict.
    #[inline]
    pub(crate) fn shift(&mut self, before: u8, after: u8) {
        debug_assert!(after >= before, "a bump never lowers the counter");
        let (b, a) = (usize::from(before), usize::from(after));
        if a < MFU_INLINE {
            self.low[b] = self.low[b].wrapping_sub(1);
            self.low[a] = self.low[a].wrapping_add(1);
        } else {
            self.apply(Some(before), Some(after));
        }
    }

    pub(crate) fn add_to(&self, out: &mut [u64; 256]) {
        let high = self.high.as_deref().map_or(&[][..], |h| &h[..]);
        for (o, v) in out.iter_mut().zip(self.low.iter().chain(high)) {
            *o += u64::from(*v);
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        if self.high.is_some() {
            std::mem::size_of::<[u32; 256 - MFU_INLINE]>()
        } else {
            0
        }
    }
}

/// A snapshot of a table's statistics, summed over its stripes one stripe at a time
/// (concurrent writers may make it slightly inconsistent across stripes, never within
/// one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableStats {
    /// Committed, non-deleted items.
    pub items: usize,
    /// Committed tombstones.
    pub deleted: usize,
    /// Prepared SyncWrites (in flight or completed).
    pub prepared: usize,
    /// Live items whose value has been evicted.
    pub non_resident: usize,
    /// Items (committed or prepared) not yet marked clean.
    pub dirty: usize,
    /// Bytes charged by the items ([`StoredValue::footprint`] summed).
    pub mem_bytes: usize,
    /// Bytes of the table's own arrays: slots (8 bytes), control bytes, stripes and MFU
    /// histograms.
    pub table_bytes: usize,
    /// Resizes (growths and shrinks of one stripe) since the table was created.
    pub resizes: usize,
    /// Live resident committed items by MFU counter value.
    pub mfu_histogram: Box<[u64; 256]>,
}

impl TableStats {
    /// Fraction of live items whose value is resident (1.0 for an empty table).
    #[must_use]
    pub fn resident_ratio(&self) -> f64 {
        if self.items == 0 {
            return 1.0;
        }
        #[expect(clippy::cast_precision_loss, reason = "a ratio")]
        let r = (self.items - self.non_resident) as f64 / self.items as f64;
        r
    }

    /// Item and table bytes divided by live items (0 for an empty table).
    #[must_use]
    pub fn bytes_per_item(&self) -> f64 {
        if self.items == 0 {
            return 0.0;
        }
        #[expect(clippy::cast_precision_loss, reason = "a ratio")]
        let r = (self.mem_bytes + self.table_bytes) as f64 / self.items as f64;
        r
    }

    /// The MFU value at `percentile` (0-100) of the histogram, or `None` when it is empty.
    #[must_use]
    pub fn mfu_percentile(&self, percentile: f64) -> Option<u8> {
        mfu_percentile(&self.mfu_histogram, percentile)
    }
}

/// The MFU value at `percentile` (0-100) of an MFU histogram (items by counter value), or
/// `None` when it is empty. The item pager uses it on the histograms of many tables
/// summed ([`crate::HashTable::add_mfu_histogram`]).
#[must_use]
pub fn mfu_percentile(hist: &[u64; 256], percentile: f64) -> Option<u8> {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return None;
    }
    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a rank within u64"
    )]
    let rank = ((percentile.clamp(0.0, 100.0) / 100.0) * total as f64).ceil() as u64;
    let rank = rank.max(1);
    let mut seen = 0;
    for (i, n) in hist.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return u8::try_from(i).ok();
        }
    }
    Some(u8::MAX)
}
