//! Full eviction (`--eviction-policy full`, KV-Engine's `full_eviction`): the item pager
//! takes whole documents out of memory, not just their values, so memory holds only what
//! was used recently, and a key that is not in memory may still exist on disk.
//!
//! - **Key filter.** Each vBucket has a bloom filter of the keys that may have a live
//!   version on disk or in memory ([`KeyFilter`]; 1% false positives at its sized key
//!   count). A key not in memory that the filter does not contain is certainly absent:
//!   GET answers KeyNotFound, ADD stores, with no disk read
//!   (`ep_bloom_filter_negatives`). Every write adds its key; warmup fills the filter
//!   from the data file's keys; compaction, and the item pager when the filter holds
//!   twice the keys it was sized for, rebuild it at the right size
//!   ([`Bucket::rebuild_key_filter`]).
//! - **Placeholders.** A key not in memory that the filter may contain is looked up on
//!   disk by a background fetch: the operation puts a placeholder (KV-Engine's temp
//!   item, [`epkv_hashtable::StoredValue::new_placeholder`]) in the hash table and waits.
//!   The fetch replaces the placeholder with the document (its value too when the
//!   operation needs it, else its metadata only: `ep_bg_meta_fetched`), or with a clean
//!   tombstone when the disk has none (`ep_bloom_filter_false_positives`), which later
//!   operations read as absent and the pager removes. A write that replaces the
//!   placeholder first wins: the fetch restores only over its own placeholder.
//! - **Deletes keep a tombstone in memory until it is persisted:** the disk still holds
//!   the live version until then, and a read of an absent key goes to the disk.
//! - **Item counts.** `curr_items` is the live items in memory plus the items the pager
//!   took out ([`FullState::evicted`]). A plain SET of a key that is not in memory does
//!   not read the disk (as in KV-Engine, so writes stay as fast as with value eviction):
//!   the flusher finds out, from the data file's index, whether the key existed before,
//!   and corrects the count then.

use crate::bucket::Bucket;
use crate::stats::Counter;
use crate::vbucket::{Assigned, VBucket};
use epkv_engine_api::{EngineResult, EngineStatus};
use epkv_hashtable::{Entry, ItemMeta, StoredValue};
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
    fn begin_rebuild(&self, keys: usize) {
        self.filters.write().pending = Some(Filter::new(keys));
    }

    /// Adds `key` to the filter being rebuilt only.
    fn add_rebuilt(&self, key: &[u8]) {
        if let Some(p) = &self.filters.read().pending {
            p.add(key);
        }
    }

    /// Replaces the filter with the rebuilt one.
    fn finish_rebuild(&self) {
        let mut f = self.filters.write();
        if let Some(p) = f.pending.take() {
            f.current = p;
        }
    }

    /// Drops a rebuild that failed (the old filter stays; it is never wrong, only full).
    fn cancel_rebuild(&self) {
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

impl Bucket {
    /// Live documents of `vb`: in memory, plus (full eviction) those only on disk.
    pub(crate) fn vb_items(vb: &VBucket) -> usize {
        let on_disk = vb.full.as_ref().map_or(0, |f| f.evicted());
        vb.table
            .len()
            .saturating_add(usize::try_from(on_disk).unwrap_or(usize::MAX))
    }

    /// Makes sure the entry shows what the operation needs: the document's metadata (its
    /// existence, CAS, lock, expiry), and with `value` its value. When memory does not
    /// have it (value evicted; under full eviction, a key not in memory that the key
    /// filter may contain), queues a background fetch and answers WouldBlock: the
    /// operation runs again once the fetch is over (see [`crate::bg_fetcher`]).
    pub(crate) fn fetch_for(
        &self,
        vb: &VBucket,
        e: &mut Entry<'_>,
        value: bool,
    ) -> EngineResult<()> {
        match e.committed() {
            Some(sv) if sv.is_placeholder() => Err(self.queue_bg_fetch(vb, e.key(), value)),
            Some(sv) if value && !sv.is_deleted() && !sv.is_resident() => {
                Err(self.queue_bg_fetch(vb, e.key(), true))
            }
            Some(_) => Ok(()),
            None => match &vb.full {
                Some(full) if full.filter.may_contain(e.key()) => {
                    Err(self.look_up_on_disk(vb, e, value))
                }
                Some(_) => {
                    self.counters.incr(Counter::BloomNegatives);
                    Ok(())
                }
                None => Ok(()),
            },
        }
    }

    /// Puts a placeholder for the entry's key and queues a background fetch of what the
    /// disk has for it (the document, or a tombstone); answers WouldBlock (TempFail when
    /// the placeholder does not fit).
    pub(crate) fn look_up_on_disk(
        &self,
        vb: &VBucket,
        e: &mut Entry<'_>,
        value: bool,
    ) -> EngineStatus {
        let placeholder = match vb.new_placeholder(e.key()) {
            Ok(p) => p,
            Err(_) => return EngineStatus::Invalid,
        };
        match self.insert_or_tempfail(e, placeholder) {
            Ok(()) => self.queue_bg_fetch(vb, e.key(), value),
            Err(s) => s,
        }
    }

    /// For a write that replaces the document whatever it was (a SET without CAS): true
    /// when it cannot know, without a disk read, whether the key exists (full eviction,
    /// not in memory, and the key filter may contain it). The write does not wait for
    /// that read; the flusher settles the item count instead
    /// ([`crate::persistence::VbPersist::mark_unknown`]).
    pub(crate) fn existence_unknown(vb: &VBucket, e: &Entry<'_>) -> bool {
        match (&vb.full, e.committed()) {
            (Some(_), Some(sv)) => sv.is_placeholder(),
            (Some(full), None) => full.filter.may_contain(e.key()),
            (None, _) => false,
        }
    }

    /// Notes a live version of `key` written in `vb` (full eviction: the key filter must
    /// contain every key that may exist).
    pub(crate) fn note_written(vb: &VBucket, key: &[u8]) {
        if let Some(full) = &vb.full {
            full.filter.add(key);
        }
    }

    /// Takes a deleted document out of the entry: in a memory-only bucket it goes; in a
    /// persistent one a dirty tombstone (the deletion `a`, revision `rev`) stays in its
    /// place until the flusher has persisted it, since the disk holds the live version
    /// until then and a key missing from memory may be looked up there (full eviction,
    /// GET_META). Persisted tombstones leave memory through the item pager and the
    /// expiry pass.
    pub(crate) fn remove_deleted(vb: &VBucket, e: &mut Entry<'_>, a: &Assigned, rev: u64) {
        if !vb.is_persistent() {
            e.remove();
            return;
        }
        let meta = ItemMeta {
            by_seqno: a.seqno,
            cas: a.cas,
            rev_seqno: rev,
            ..ItemMeta::default()
        };
        // The tombstone (header and key) is never larger than what it replaces, so the
        // quota cannot refuse it.
        let stored = StoredValue::new_deleted(e.key(), meta)
            .map_err(|err| err.to_string())
            .and_then(|t| e.insert(t).map_err(|err| err.to_string()));
        if let Err(err) = stored {
            tracing::error!(vbid = %vb.id, error = %err, "cannot keep a tombstone in memory; the key is removed");
            e.remove();
        }
    }

    /// Rebuilds `vb`'s key filter, sized for its current item count: every live key in
    /// memory, then every live key of its data file. Keys written meanwhile go to both
    /// filters. Memory is walked before the disk so that a key evicted during the
    /// rebuild (which must have been persisted first) is found on disk.
    ///
    /// # Errors
    /// A read error of the data file; the old filter stays.
    pub(crate) fn rebuild_key_filter(&self, vb: &VBucket) -> Result<(), epkv_storage::Error> {
        let (Some(full), Some(p)) = (&vb.full, &self.persistence) else {
            return Ok(());
        };
        let Some(shard) = p.shards.get(p.shard_of(vb.id)) else {
            return Ok(());
        };
        let keys = Self::vb_items(vb).saturating_add(Self::vb_items(vb) / 4);
        full.filter.begin_rebuild(keys);
        vb.table.for_each(|sv| {
            if !sv.is_deleted() {
                full.filter.add_rebuilt(sv.key());
            }
        });
        let scanned = epkv_storage::KvStore::scan_keys(&shard.store, vb.id, &mut |m| {
            if !m.deleted {
                full.filter.add_rebuilt(&m.key);
            }
            epkv_storage::ScanControl::Continue
        });
        match scanned {
            Ok(_) => {
                full.filter.finish_rebuild();
                self.counters.incr(Counter::BloomRebuilds);
                Ok(())
            }
            Err(e) => {
                full.filter.cancel_rebuild();
                Err(e)
            }
        }
    }

    /// Rebuilds the filters of up to [`REBUILDS_PER_RUN`] vBuckets whose filter holds
    /// more than twice the keys it was sized for (the item pager calls this each run).
    pub(crate) fn rebuild_overfull_filters(&self) {
        let overfull = self
            .vbuckets
            .iter()
            .filter(|vb| {
                vb.warmup_phase() == crate::vbucket::WarmupPhase::Ready
                    && vb.full.as_ref().is_some_and(|f| f.filter.is_overfull())
            })
            .take(REBUILDS_PER_RUN);
        for vb in overfull {
            if let Err(err) = self.rebuild_key_filter(vb) {
                tracing::warn!(vbid = %vb.id, error = %err, "cannot rebuild the key filter; the old one stays");
                return;
            }
        }
    }
}

/// Filters the item pager rebuilds in one run at most (each reads its vBucket's keys
/// from the data file's index, a few milliseconds for 10,000 keys).
const REBUILDS_PER_RUN: usize = 64;

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
