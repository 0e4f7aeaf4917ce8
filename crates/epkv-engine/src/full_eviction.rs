//! Full eviction (`--eviction-policy full`, KV-Engine's `full_eviction`): the item pager
//! takes whole documents out of memory, not just their values, so memory holds only what
//! was used recently, and a key that is not in memory may still exist on disk.
//!
//! - **Key filter.** Each vBucket has a bloom filter of the keys that may have a live
//!   version on disk or in memory ([`KeyFilter`](crate::key_filter::KeyFilter); 1% false positives at its sized key
//!   count). A key not in memory that the filter does not contain is certainly absent:
//!   GET answers KeyNotFound, ADD stores, with no disk read
//!   (`ep_bloom_filter_negatives`). Every write adds its key; warmup fills the filter
//!   from the data file's keys; compaction, and the item pager when the filter holds
//!   twice the keys it was sized for, rebuild it at the right size
//!   ([`BucketCore::rebuild_key_filter`]).
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
//!   took out ([`FullState::evicted`](crate::key_filter::FullState::evicted)). A plain SET of a key that is not in memory does
//!   not read the disk (as in KV-Engine, so writes stay as fast as with value eviction):
//!   the flusher finds out, from the data file's index, whether the key existed before,
//!   and corrects the count then.
//!
//! Level: a service over [`crate::bucket_core::BucketCore`]; it never names the bucket.

use crate::bucket_core::BucketCore;
use crate::stats::Counter;
use crate::vbucket::{Assigned, VBucket};
use epkv_engine_api::{EngineResult, EngineStatus};
use epkv_hashtable::{Entry, ItemMeta, StoredValue};

impl BucketCore {
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
        let items = vb.item_count();
        let keys = items.saturating_add(items / 4);
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

/// For a write that replaces the document whatever it was (a SET without CAS): true
/// when it cannot know, without a disk read, whether the key exists (full eviction,
/// not in memory, and the key filter may contain it). The write does not wait for
/// that read; the flusher settles the item count instead
/// ([`crate::vb_persist::VbPersist::mark_unknown`]).
pub(crate) fn existence_unknown(vb: &VBucket, e: &Entry<'_>) -> bool {
    match (&vb.full, e.committed()) {
        (Some(_), Some(sv)) => sv.is_placeholder(),
        (Some(full), None) => full.filter.may_contain(e.key()),
        (None, _) => false,
    }
}
