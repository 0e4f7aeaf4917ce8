//! Warmup: each shard's stored vBuckets queued (active first) and loaded one per run on
//! the Reader group: documents into the hash table (values while memory allows), then the
//! state, seqnos and failover log; prepares found above the high completed seqno are
//! tracked again. See the parent module's docs.

use crate::durability_monitor::{PREPARE_DELETES, Passive, Tracked, prepared_key_of};
use crate::vb_persist::SyncSeqnos;
use crate::vbucket::{VBucket, WarmupPhase};
use epkv_hashtable::{CommittedState, ItemMeta, MemoryTracker, StoredValue};
use epkv_storage::{Document, KvStore, ScanControl, VbState};
use epkv_types::Vbid;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use super::{Persistence, Shard};

impl Persistence {
    /// Starts warmup: removes the clean-shutdown marker (remembering whether it was
    /// there), marks every stored vBucket [`WarmupPhase::Loading`] and queues it on its
    /// shard's warmup list, active vBuckets first. Returns how many were queued. Nothing
    /// is read from the data files yet: [`Persistence::warmup_next`] does that, one
    /// vBucket per call, on Reader tasks.
    pub(crate) fn prepare_warmup(
        &self,
        vbuckets: &[VBucket],
    ) -> Result<usize, epkv_storage::Error> {
        let marker = self.clean_marker();
        let clean = marker.exists();
        if clean {
            std::fs::remove_file(&marker).map_err(|e| epkv_storage::Error::Io {
                op: "remove",
                path: marker.clone(),
                source: e,
            })?;
        }
        self.unclean_restart.store(!clean, Relaxed);
        let mut total = 0;
        let n = self.shards.len();
        for (i, shard) in self.shards.iter().enumerate() {
            if let Some(d) = shard.store.damage() {
                tracing::error!(shard = i, path = %d.path.display(), offset = d.offset, error = %d.error, "storage log corrupt: every vBucket of the shard stays unavailable (NotMyVbucket) until FLUSH deletes its files; they are kept");
                for vb in vbuckets.iter().skip(i).step_by(n.max(1)) {
                    vb.set_warmup_phase(WarmupPhase::Failed);
                    self.warmup.failed.lock().push((vb.id, d.error.clone()));
                }
            }
            for q in shard.store.quarantined() {
                if let Some(vb) = vbuckets.get(usize::from(q.vbid.0)) {
                    vb.set_warmup_phase(WarmupPhase::Failed);
                    self.warmup.failed.lock().push((q.vbid, q.error));
                }
            }
            let mut list: Vec<(bool, Vbid)> = Vec::new();
            for vbid in shard.store.vbuckets() {
                let Some(vb) = vbuckets.get(usize::from(vbid.0)) else {
                    tracing::warn!(%vbid, "stored vBucket outside the bucket; ignored");
                    continue;
                };
                vb.set_warmup_phase(WarmupPhase::Loading);
                let active = matches!(
                    shard.store.vbucket_state(vbid),
                    Ok(Some(VbState {
                        state: epkv_types::VBucketState::Active,
                        ..
                    }))
                );
                list.push((!active, vbid));
            }
            list.sort_unstable();
            total += list.len();
            if let Some(q) = self.warmup.queues.get(i) {
                *q.lock() = list.into_iter().map(|(_, v)| v).collect();
            }
        }
        *self.warmup.remaining.lock() = total;
        self.warmup.vbuckets_total.store(total as u64, Relaxed);
        Ok(total)
    }

    /// Loads the next queued vBucket of `shard` (see [`Persistence::load_vbucket`]) and
    /// makes it Ready, or Failed if it cannot be read. Returns false when the shard's
    /// list was already empty.
    pub(crate) fn warmup_next(
        &self,
        shard: usize,
        vbuckets: &[VBucket],
        (mem, low_wat): (&MemoryTracker, usize),
        collections: &crate::collections::Collections,
        recommit: &dyn Fn(&VBucket),
    ) -> bool {
        let Some(vbid) = self
            .warmup
            .queues
            .get(shard)
            .and_then(|q| q.lock().pop_front())
        else {
            return false;
        };
        let Some((sh, vb)) = self
            .shards
            .get(shard)
            .zip(vbuckets.get(usize::from(vbid.0)))
        else {
            return true;
        };
        match self.load_vbucket(sh, vb, mem, low_wat, collections) {
            Ok(()) => {
                // SyncWrites restored in flight complete before anyone reads the key.
                recommit(vb);
                vb.set_warmup_phase(WarmupPhase::Ready);
                self.warmup.vbuckets_done.fetch_add(1, Relaxed);
            }
            Err(e) => {
                tracing::error!(%vbid, shard, error = %e, "warmup cannot load this vBucket: it stays unavailable (NotMyVbucket) until FLUSH deletes it, and its files are left as they are");
                // What was loaded before the error is dropped: nothing serves it.
                vb.table.clear();
                vb.set_warmup_phase(WarmupPhase::Failed);
                self.warmup.failed.lock().push((vbid, e.to_string()));
            }
        }
        let mut left = self.warmup.remaining.lock();
        *left = left.saturating_sub(1);
        if *left == 0 {
            self.warmup.done_cv.notify_all();
            tracing::info!(
                vbuckets = self.warmup.vbuckets_done.load(Relaxed),
                failed = self.warmup.failed.lock().len(),
                items = self.warmup_items.load(Relaxed),
                keys_only = self.warmup.keys_only.load(Relaxed),
                not_loaded = self.warmup.oom.load(Relaxed),
                "warmup complete"
            );
        }
        true
    }

    /// Loads one vBucket: state, failover log, seqnos, and its live documents, with their
    /// values while item memory is under the low watermark `low_wat` and as non-resident
    /// items (key and metadata) past it, up to the quota (the item pager, woken at the
    /// high watermark, ejects values loaded earlier meanwhile) (`ep_warmup_key_only_count`; values are read back
    /// by [`crate::Bucket`]'s `fetch_if_evicted` on access). A document whose metadata
    /// does not fit under the quota is not loaded (`ep_warmup_oom`) and not
    /// served until written again. After an unclean shutdown (no marker from the
    /// previous run) the vBucket starts a new failover branch at its persisted seqno.
    fn load_vbucket(
        &self,
        shard: &Shard,
        vb: &VBucket,
        mem: &MemoryTracker,
        low_wat: usize,
        collections: &crate::collections::Collections,
    ) -> Result<(), epkv_storage::Error> {
        let vbid = vb.id;
        let Some(state) = shard.store.vbucket_state(vbid)? else {
            return Ok(());
        };
        let mut max_deleted_rev = 0;
        let mut loaded = 0u64;
        let mut keys_only = 0u64;
        let mut skipped = 0u64;
        let mut not_loaded = 0u64;
        if let Some(full) = &vb.full {
            // Size the key filter for the live keys (an index-only pass).
            let mut live = 0usize;
            shard.store.scan_keys(vbid, &mut |m| {
                live += usize::from(!m.deleted);
                ScanControl::Continue
            })?;
            full.filter.reset_for(live.saturating_add(live / 4));
        }
        // SyncWrites not completed when the vBucket was last persisted, in seqno order.
        let mut pending = Vec::new();
        shard.store.scan_by_seqno(vbid, 0, u64::MAX, &mut |d| {
            if prepared_key_of(&d.key).is_some() {
                if !d.deleted && d.seqno > state.high_completed_seqno {
                    pending.push(d.clone());
                }
                return ScanControl::Continue;
            }
            vb.note_xattrs(epkv_types::Datatype(d.datatype));
            // A dropped collection's documents are not loaded (compaction removes them).
            if !collections.is_live(epkv_types::doc_key::collection_of(&d.key)) {
                return ScanControl::Continue;
            }
            if d.deleted {
                max_deleted_rev = max_deleted_rev.max(d.rev_seqno);
                return ScanControl::Continue;
            }
            if let Some(full) = &vb.full {
                // Full eviction: documents past the low watermark stay on disk, known
                // only to the key filter.
                full.filter.add(&d.key);
                if mem.used() >= low_wat {
                    full.add_evicted(1);
                    not_loaded += 1;
                    return ScanControl::Continue;
                }
            }
            let meta = epkv_hashtable::ItemMeta {
                cas: epkv_types::Cas(d.cas),
                rev_seqno: d.rev_seqno,
                by_seqno: epkv_types::Seqno(d.seqno),
                flags: d.flags,
                expiry: d.expiry,
                datatype: crate::vbucket::client_datatype(d.datatype),
                ..epkv_hashtable::ItemMeta::default()
            };
            // Under the low watermark: the whole document. Past it: key and metadata
            // only (a non-resident item whose value is read back on access).
            // Value eviction keeps every document's key and metadata in memory, so past
            // the low watermark warmup goes on loading them, up to the quota; the item
            // pager then ejects values loaded earlier (all clean) to get back under the
            // high watermark.
            let with_value = mem.used() < low_wat;
            let value: &[u8] = if with_value { &d.value } else { &[] };
            let Ok(sv) = epkv_hashtable::StoredValue::new(&d.key, value, meta) else {
                return ScanControl::Continue;
            };
            vb.table.with_entry(&d.key, |e| match e.insert(sv) {
                Err(_) if vb.full.is_some() => {
                    if let Some(full) = &vb.full {
                        full.add_evicted(1);
                    }
                    not_loaded += 1;
                }
                Ok(_) => {
                    e.mark_clean(epkv_types::Seqno(d.seqno));
                    if with_value {
                        loaded += 1;
                    } else if e.evict_value() {
                        keys_only += 1;
                    } else {
                        // Cannot happen for a clean committed item; never serve an empty
                        // value for it.
                        e.remove();
                        skipped += 1;
                    }
                }
                Err(_) => skipped += 1,
            });
            ScanControl::Continue
        })?;
        if not_loaded > 0 {
            tracing::info!(%vbid, not_loaded, "warmup reached the memory low watermark: later documents stay on disk (full eviction: read back on access)");
        }
        if keys_only > 0 {
            tracing::info!(%vbid, keys_only, "warmup reached the memory low watermark: later documents are loaded without their values (read back from disk on access)");
        }
        if skipped > 0 {
            tracing::warn!(%vbid, skipped, "warmup reached the memory quota: documents not loaded at all are not served until written again");
        }
        let failover = state
            .failover_log
            .iter()
            .map(|e| crate::vbucket::FailoverEntry {
                uuid: e.uuid,
                seqno: e.seqno,
            })
            .collect();
        vb.restore(
            state.state,
            failover,
            state.high_seqno,
            state.max_cas,
            max_deleted_rev,
        );
        let sync = SyncSeqnos {
            prepared: state.high_prepared_seqno,
            completed: state.high_completed_seqno,
        };
        vb.persist.restore_sync(sync);
        vb.durability.restore_seqnos(sync.prepared, sync.completed);
        if !pending.is_empty() {
            tracing::info!(%vbid, prepares = pending.len(), "warmup found SyncWrites in flight at the last shutdown: they are committed again before the vBucket serves");
        }
        for d in &pending {
            restore_prepare(vb, d);
        }
        if self.unclean_restart.load(Relaxed) {
            vb.start_failover_branch();
        }
        self.warmup_items.fetch_add(loaded, Relaxed);
        self.warmup.keys_only.fetch_add(keys_only, Relaxed);
        self.warmup.oom.fetch_add(skipped, Relaxed);
        Ok(())
    }
}

/// Restores a prepare warmup found above the high completed seqno: as
/// `PreparedMaybeVisible`, tracked with no deadline until it is committed again.
fn restore_prepare(vb: &VBucket, d: &Document) {
    let Some(key) = prepared_key_of(&d.key) else {
        return;
    };
    let meta = ItemMeta {
        cas: epkv_types::Cas(d.cas),
        rev_seqno: d.rev_seqno,
        by_seqno: epkv_types::Seqno(d.seqno),
        flags: d.flags,
        expiry: d.expiry,
        datatype: epkv_types::Datatype(d.datatype & !PREPARE_DELETES),
        ..ItemMeta::default()
    };
    let sv = if d.datatype & PREPARE_DELETES != 0 {
        StoredValue::new_tombstone(key, &d.value, meta)
    } else {
        StoredValue::new(key, &d.value, meta)
    };
    let Ok(sv) = sv else {
        tracing::error!(vbid = %vb.id, seqno = d.seqno, "cannot restore a pending prepare");
        return;
    };
    let stored = vb.table.with_entry(key, |e| {
        e.insert_prepared(sv.with_state(CommittedState::PreparedMaybeVisible))
    });
    if let Err(err) = stored {
        tracing::error!(vbid = %vb.id, seqno = d.seqno, error = %err, "cannot restore a pending prepare");
        return;
    }
    if matches!(
        vb.state_hint(),
        epkv_types::VBucketState::Replica | epkv_types::VBucketState::Pending
    ) {
        // A replica keeps it until the active's commit or abort arrives; so does a
        // pending vBucket (a takeover), which writes nothing, until it is active again.
        vb.durability.passive_prepare(Passive {
            seqno: d.seqno,
            key: key.to_vec(),
            persist: true,
        });
        return;
    }
    vb.durability.track(Tracked {
        seqno: d.seqno,
        key: key.to_vec(),
        persist: true,
        deadline: None,
        waiter: None,
        needs_acks: false,
    });
}

/// Warmup progress, shared by the Reader tasks and the stats.
#[derive(Debug, Default)]
pub(crate) struct WarmupProgress {
    /// Per shard, the vBuckets still to load, in order.
    pub(crate) queues: Vec<Mutex<VecDeque<Vbid>>>,
    /// vBuckets queued and not yet loaded (or failed); `done_cv` is notified at 0.
    pub(crate) remaining: Mutex<usize>,
    /// Notified when `remaining` reaches 0.
    pub(crate) done_cv: Condvar,
    /// vBuckets queued at start.
    pub(crate) vbuckets_total: AtomicU64,
    /// vBuckets loaded.
    pub(crate) vbuckets_done: AtomicU64,
    /// Documents loaded as keys and metadata only (memory at the low watermark).
    pub(crate) keys_only: AtomicU64,
    /// Documents not loaded at all (memory at the quota even for the key).
    pub(crate) oom: AtomicU64,
    /// vBuckets that could not be loaded, with the error.
    pub(crate) failed: Mutex<Vec<(Vbid, String)>>,
}

impl WarmupProgress {
    pub(super) fn new(shards: usize) -> Self {
        Self {
            queues: (0..shards).map(|_| Mutex::new(VecDeque::new())).collect(),
            ..Self::default()
        }
    }

    /// True once every queued vBucket is loaded or failed.
    pub(crate) fn is_done(&self) -> bool {
        *self.remaining.lock() == 0
    }

    /// Blocks until warmup is done or `timeout` passes; returns whether it is done.
    pub(crate) fn wait(&self, timeout: Duration) -> bool {
        let mut left = self.remaining.lock();
        if *left == 0 {
            return true;
        }
        let _ = self.done_cv.wait_while_for(&mut left, |l| *l > 0, timeout);
        *left == 0
    }
}
