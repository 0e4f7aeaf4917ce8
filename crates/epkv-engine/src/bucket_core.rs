//! [`BucketCore`]: the vBuckets and what the bucket's services share: the configuration,
//! the clock, the memory tracker, the counters, the store (persistence), the collections
//! manifest, the item pager's waker and the executor the tasks run on.
//!
//! It is the narrow interface the services see instead of the [`crate::Bucket`]: the
//! background fetcher ([`crate::bg_fetcher`]), full eviction ([`crate::full_eviction`]),
//! the durability work ([`crate::durability`]), the item pager ([`crate::item_pager`]), DCP
//! ([`crate::dcp`]) and the scope and collection events ([`crate::system_events`]) are
//! methods of the core in their own modules. It holds no service: the core's own methods
//! are the primitives every write shares (routing, admission under the quota, waking the
//! flusher and the pager).
//!
//! Background work that must not keep the bucket alive holds its owner weakly, as a
//! `Weak<dyn CoreOwner>` ([`CoreOwner`], [`schedule_weak`]): a dynamic call per task run or
//! stream poll, never per operation.
//!
//! Level: above the vBucket and the leaf types and [`crate::persistence`]; below every
//! service. It imports none of them.

use crate::bg_fetch_queue::BgFetchTimes;
use crate::collections::Collections;
use crate::pager_waker::PagerWaker;
use crate::persistence::Persistence;
use crate::stats::{Counter, Counters};
use crate::vbucket::VBucket;
use crate::{BucketConfig, Result};
use epkv_engine_api::{EngineResult, EngineStatus};
use epkv_executor::Clock;
use epkv_hashtable::{Entry, MemoryTracker, StoredValue};
use epkv_types::{VBucketState, Vbid, vbucket_for_key};
use parking_lot::RwLockReadGuard;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

/// The vBuckets and the state the bucket's services share (see the module docs).
pub(crate) struct BucketCore {
    /// Immutable after creation.
    pub(crate) config: BucketConfig,
    /// The time source for expiry, lock timeouts and CAS.
    pub(crate) clock: Arc<dyn Clock>,
    /// Indexed by vbid. The slice never changes; each vBucket synchronises itself.
    pub(crate) vbuckets: Box<[VBucket]>,
    /// Item memory of every vBucket; its limit is the quota, and passing the high
    /// watermark wakes the item pager.
    pub(crate) memory: Arc<MemoryTracker>,
    /// Event counters (sharded per thread).
    pub(crate) counters: Counters,
    /// Shards, flushers and persisted seqnos; `None` for a memory-only bucket.
    pub(crate) persistence: Option<Persistence>,
    /// Scopes and collections.
    pub(crate) collections: Collections,
    /// Wakes the item pager (a write refused for lack of memory); the pager's own state
    /// is the bucket's.
    pub(crate) pager_waker: Arc<PagerWaker>,
    /// Background fetch wait and read times.
    pub(crate) bg_times: BgFetchTimes,
    /// The executor the bucket's tasks run on (its own, or the one it was given); set
    /// once the tasks are scheduled.
    pub(crate) task_executor: OnceLock<epkv_executor::ExecutorHandle>,
    /// The bucket owning this core, for background work that holds it weakly (persisted
    /// callbacks, the durability timeout tasks, DCP streams). Set at creation (the bucket
    /// is built with [`Arc::new_cyclic`]).
    pub(crate) owner: Weak<dyn CoreOwner>,
}

/// What owns a [`BucketCore`] (the bucket). Background work holds its owner as a
/// `Weak<dyn CoreOwner>`, so that it never keeps the bucket alive and never names the
/// bucket's type.
pub(crate) trait CoreOwner: Send + Sync {
    /// The core.
    fn core(&self) -> &BucketCore;
}

/// Schedules a task that holds `owner` only weakly: each run upgrades the reference and
/// calls `run`, and the task ends once the owner is gone.
pub(crate) fn schedule_weak<T: ?Sized + Send + Sync + 'static>(
    exec: &epkv_executor::ExecutorHandle,
    owner: Weak<T>,
    spec: epkv_executor::TaskSpec,
    run: impl Fn(&T) -> epkv_executor::Next + Send + 'static,
) -> Result<epkv_executor::TaskHandle> {
    Ok(
        exec.schedule(spec, move |_: &epkv_executor::TaskContext<'_>| {
            owner
                .upgrade()
                .map_or(epkv_executor::Next::Done, |b| run(&b))
        })?,
    )
}

impl BucketCore {
    /// The executor's time (the durability timeout task's clock).
    pub(crate) fn sync_now(&self) -> Option<Instant> {
        self.task_executor
            .get()
            .map(epkv_executor::ExecutorHandle::now)
    }

    /// Finds the vBucket for a client request and checks that it may serve it: the vbid
    /// must be in range, the key must map to it, and its state must be active (pending →
    /// WouldBlock: the caller parks the request with `Engine::when_fetched` until the
    /// state changes, then runs it again, see [`crate::parking`]; replica and dead →
    /// NotMyVbucket). The returned guard keeps the state from changing until the
    /// operation finishes.
    pub(crate) fn client_vbucket(
        &self,
        vbid: Vbid,
        key: &[u8],
    ) -> EngineResult<(&VBucket, RwLockReadGuard<'_, VBucketState>)> {
        let vb = self
            .vbuckets
            .get(usize::from(vbid.0))
            .ok_or(EngineStatus::NotMyVbucket)?;
        // Clients hash the key without its collection.
        let (_, raw) = epkv_types::doc_key::decode(key);
        if vbucket_for_key(raw, self.config.num_vbuckets) != vbid {
            return Err(EngineStatus::NotMyVbucket);
        }
        self.collections.check_key(key)?;
        vb.check_warm()?;
        let state = vb.state();
        match *state {
            VBucketState::Active => Ok((vb, state)),
            VBucketState::Pending => Err(EngineStatus::WouldBlock),
            VBucketState::Replica | VBucketState::Dead => Err(EngineStatus::NotMyVbucket),
        }
    }

    /// Stores `sv` in the entry, refusing when item memory would pass the quota: with
    /// TempFail (and a wake of the item pager, which makes room) while the pager can free
    /// memory, with NoMemory (ENOMEM) in a memory-only bucket whose full policy is
    /// `fail_new_data`, as Couchbase's ephemeral buckets answer. A prepare (see
    /// [`crate::durability`]) goes to the entry's prepared slot, a committed version to
    /// its committed one.
    pub(crate) fn insert_or_tempfail(
        &self,
        e: &mut Entry<'_>,
        sv: StoredValue,
    ) -> EngineResult<()> {
        let stored = if sv.is_prepared() {
            e.insert_prepared(sv)
        } else {
            e.insert(sv)
        };
        match stored {
            Ok(_) => Ok(()),
            Err(epkv_hashtable::Error::QuotaExceeded { .. }) => {
                if self.persistence.is_none()
                    && self.config.ephemeral_full_policy
                        == crate::config::EphemeralFullPolicy::FailNewData
                {
                    self.counters.incr(Counter::OomErrors);
                    return Err(EngineStatus::NoMemory);
                }
                self.counters.incr(Counter::TmpOomErrors);
                self.pager_waker.wake_urgent();
                Err(EngineStatus::TempFail)
            }
            Err(err) => {
                tracing::error!(error = %err, "hash table refused an insert");
                Err(EngineStatus::Internal)
            }
        }
    }

    /// Queue bookkeeping after a write: wakes the shard's flusher when the vBucket's
    /// queue went from empty to non-empty.
    pub(crate) fn queued(&self, vb: &VBucket, was_empty: bool) {
        if was_empty && let Some(p) = &self.persistence {
            p.wake(vb.id);
        }
    }

    /// TempFail while the disk is full (a flush failed with ENOSPC): the write could not
    /// be made durable. Reads are not affected.
    pub(crate) fn check_disk(&self) -> EngineResult<()> {
        match &self.persistence {
            Some(p) if p.disk_full.load(std::sync::atomic::Ordering::Relaxed) => {
                Err(EngineStatus::TempFail)
            }
            _ => Ok(()),
        }
    }

    /// Blocks until warmup has loaded (or failed) every stored vBucket, at most
    /// `timeout`; returns whether it has. True at once for a memory-only bucket.
    pub(crate) fn wait_warmup(&self, timeout: std::time::Duration) -> bool {
        self.persistence
            .as_ref()
            .is_none_or(|p| p.warmup.wait(timeout))
    }

    /// True once warmup has loaded (or failed) every stored vBucket; always true for a
    /// memory-only bucket.
    pub(crate) fn is_warmed_up(&self) -> bool {
        self.persistence.as_ref().is_none_or(|p| p.warmup.is_done())
    }
}
