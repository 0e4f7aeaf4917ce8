//! A shard's flush: its vBuckets' queued documents committed as one batch, then each
//! vBucket's persisted seqno raised and its waiters completed; and the future a caller
//! waits on for a seqno to be persisted.

use crate::vb_persist::{SyncSeqnos, Waiter};
use crate::vbucket::VBucket;
use epkv_storage::{KvStore, VbCommit, VbState};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::Ordering::{AcqRel, Relaxed, Release};

use super::{DOC_OVERHEAD, IDLE, Persistence};

/// What one flush of a shard did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlushOutcome {
    /// Documents committed.
    pub(crate) items: usize,
    /// vBuckets committed.
    pub(crate) vbuckets: usize,
}

impl Persistence {
    /// Flushes one shard: commits every queued document of its vBuckets as one batch.
    pub(crate) fn flush_shard(
        &self,
        shard: usize,
        vbuckets: &[VBucket],
    ) -> Result<FlushOutcome, epkv_storage::Error> {
        let Some(sh) = self.shards.get(shard) else {
            return Ok(FlushOutcome::default());
        };
        let _one_at_a_time = sh.flush_lock.lock();
        // Writes queued from here on schedule the next flush (before the marks are taken,
        // so that a write this flush misses always schedules another).
        sh.armed.store(IDLE, Release);
        let n = self.shards.len();
        let mut commits: Vec<VbCommit> = Vec::new();
        let mut highs: Vec<(usize, u64)> = Vec::new();
        let mut unknowns: Vec<Vec<Vec<u8>>> = Vec::new();
        // Only the vBuckets marked dirty (a write queued on an empty queue, a state
        // change) are looked at, unless told to look at all: a flush does no per-vBucket
        // work the batch does not need. The marks are taken before the queues, so a write
        // queued after its vBucket's take marks it again.
        let ids: Vec<usize> = if sh.scan_all.swap(false, AcqRel) {
            self.take_dirty(shard, n, vbuckets.len());
            (0..vbuckets.len()).filter(|i| i % n == shard).collect()
        } else {
            self.take_dirty(shard, n, vbuckets.len())
        };
        for i in ids {
            let Some(vb) = vbuckets.get(i) else {
                continue;
            };
            let (docs, state_dirty, unknown, sync) = vb.persist.take();
            if docs.is_empty() && !state_dirty {
                continue;
            }
            unknowns.push(unknown);
            let high = docs
                .last()
                .map_or_else(|| vb.persist.persisted(), |d| d.seqno)
                .max(vb.persist.persisted());
            let state = vb_state(vb, high, sync);
            highs.push((i, high));
            commits.push(VbCommit {
                vbid: vb.id,
                docs: Arc::new(docs),
                // The queue holds one version per key, and `take` sorts them by seqno.
                keys_unique: true,
                state,
            });
        }
        if commits.is_empty() {
            return Ok(FlushOutcome::default());
        }
        // Full eviction: which keys written without a lookup were live on disk before
        // this batch (their evicted count is corrected once the batch is durable).
        let mut live_before = vec![0u64; commits.len()];
        for ((c, keys), live) in commits.iter().zip(&unknowns).zip(&mut live_before) {
            for k in keys {
                match sh.store.key_meta(c.vbid, k) {
                    Ok(Some(m)) if !m.deleted => *live += 1,
                    Ok(_) => {}
                    Err(e) => {
                        // The count stays one too high for this key; the data is fine.
                        tracing::warn!(vbid = %c.vbid, error = %e, "cannot look up a key to settle the item count");
                    }
                }
            }
        }
        match sh.store.commit(&commits) {
            Ok(()) => {
                self.disk_full.store(false, Relaxed);
                self.flushes.fetch_add(1, Relaxed);
                let mut out = FlushOutcome::default();
                for ((c, (i, high)), live) in commits.iter().zip(&highs).zip(live_before) {
                    let vb = &vbuckets[*i];
                    // Raising the persisted seqno makes every item at or below it clean:
                    // the dirty queue held every seqno up to `high` (the ordering point
                    // queues each change under the vBucket's ordering lock) and this
                    // commit made them durable. The items are not looked up to clear
                    // their dirty bits (a hash-table lookup, mostly cache misses, per
                    // persisted item: ~15% of the Writer threads' CPU at 50k SETs/s);
                    // whoever needs a bit exact settles it against the persisted seqno
                    // (`Entry::mark_clean_upto`). Tombstones stay in memory until
                    // persisted; then the item pager and the expiry pass remove them.
                    let bytes: usize = c
                        .docs
                        .iter()
                        .map(|d| d.key.len() + d.value.len() + DOC_OVERHEAD)
                        .sum();
                    if let Some(full) = &vb.full {
                        full.sub_evicted(live);
                    }
                    out.items += c.docs.len();
                    out.vbuckets += 1;
                    self.flushed_bytes.fetch_add(bytes as u64, Relaxed);
                    vb.persist.set_persisted(*high);
                }
                Ok(out)
            }
            Err(e) => {
                self.flush_failures.fetch_add(1, Relaxed);
                if matches!(e, epkv_storage::Error::NoSpace { .. }) {
                    self.disk_full.store(true, Relaxed);
                }
                for ((c, (i, _)), unknown) in commits.into_iter().zip(highs).zip(unknowns) {
                    // The store keeps nothing of a failed batch, so the list is ours
                    // again (copied only if it somehow is not).
                    let docs = Arc::try_unwrap(c.docs).unwrap_or_else(|shared| (*shared).clone());
                    vbuckets[i].persist.put_back(docs, unknown);
                    self.mark_dirty(vbuckets[i].id);
                }
                Err(e)
            }
        }
    }
}

/// The state committed with a vBucket's documents.
fn vb_state(vb: &VBucket, high: u64, sync: SyncSeqnos) -> VbState {
    let state = *vb.state();
    let (_, max_cas, _) = vb.ordering_snapshot();
    let failover_log = vb.with_failover_log(|log| {
        log.iter()
            .map(|e| epkv_storage::FailoverEntry {
                uuid: e.uuid,
                seqno: e.seqno,
            })
            .collect()
    });
    VbState {
        high_seqno: high,
        persisted_seqno: high,
        max_cas,
        high_prepared_seqno: sync.prepared,
        high_completed_seqno: sync.completed,
        failover_log,
        ..VbState::new(state)
    }
}

/// Resolves to the vBucket's persisted seqno once it reaches the seqno asked for
/// ([`crate::Bucket::wait_persisted`]); no thread blocks while it is pending.
#[derive(Debug, Clone)]
pub struct PersistedFuture {
    shared: Arc<Mutex<(Option<u64>, Option<std::task::Waker>)>>,
}

impl PersistedFuture {
    pub(crate) fn pending() -> (Self, Waiter) {
        let shared: Arc<Mutex<(Option<u64>, Option<std::task::Waker>)>> = Arc::default();
        let s2 = Arc::clone(&shared);
        let complete: Waiter = Box::new(move |persisted| {
            let waker = {
                let mut g = s2.lock();
                g.0 = Some(persisted);
                g.1.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
        });
        (Self { shared }, complete)
    }

    /// The persisted seqno, if the wait is over.
    #[must_use]
    pub fn try_get(&self) -> Option<u64> {
        self.shared.lock().0
    }
}

impl std::future::Future for PersistedFuture {
    type Output = u64;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<u64> {
        let mut g = self.shared.lock();
        match g.0 {
            Some(v) => std::task::Poll::Ready(v),
            None => {
                g.1 = Some(cx.waker().clone());
                std::task::Poll::Pending
            }
        }
    }
}
