//! [`Bucket`]: the [`BucketCore`] composed with the item and expiry pagers, the task
//! wiring (flushers, appliers, warmup, fetchers, compactors, the item pager), and the write
//! path every operation shares (expiry on access, commit of a stored version, deletion).
//!
//! Level: the top but one: it imports the core and the services; only the operations
//! (`ops`, `subdoc_ops`, `replica`, `stat_groups`, `bucket_collections`, `engine_impl`)
//! import it.

use crate::bucket_core::{BucketCore, CoreOwner, schedule_weak};
use crate::document::{document_of, expired, system_section};
use crate::expiry_pager::ExpiryPager;
use crate::item_pager::PagerRun;
use crate::lazy_now::LazyNow;
use crate::persistence::{PersistedFuture, Persistence, RETRY_AFTER};
use crate::persistence_config::FlusherMode;
use crate::stats::{Counter, Counters};
use crate::vbucket::{Assigned, DeleteSource, VBucket, WarmupPhase};
use crate::{BucketConfig, EngineClock, Result};
use epkv_engine_api::{
    DurabilityRequirements, EngineResult, EngineStatus, MutationInfo, SyncWriteCallback,
};
use epkv_executor::OffsetClock;
use epkv_hashtable::{Entry, ItemMeta, MemoryTracker, StoredValue};
use epkv_types::{Datatype, VBucketState, Vbid};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// File bytes one run of the fragmentation compactor rewrites at most before it yields
/// its AuxIO thread (it runs again at once while files past the threshold remain): about
/// one second of writes at the default compaction rate.
const FRAGMENTATION_RUN_BYTES: u64 = 64 << 20;

/// An in-memory bucket of `num_vbuckets` vBuckets; implements
/// [`epkv_engine_api::Engine`].
///
/// Created by [`Bucket::new`], which also starts the expiry pager thread (unless its
/// interval is zero); [`epkv_engine_api::Engine::shutdown`] stops and joins it.
///
/// The bucket is the top of the crate's layering: it composes the `BucketCore` (the
/// vBuckets and what the background services share) with the item and expiry pagers,
/// and its operations and the `Engine` implementation run over them. Nothing below it
/// names it.
pub struct Bucket {
    /// The vBuckets, the store and the services' shared state.
    pub(crate) core: BucketCore,
    /// Set in testing mode only; ADJUST_TIMEOFDAY moves it.
    pub(crate) testing_clock: Option<Arc<OffsetClock>>,
    /// The background expiry pager.
    pub(crate) pager: ExpiryPager,
    /// The item pager's task and cycle state.
    pub(crate) item_pager: crate::item_pager::ItemPager,
    /// Operation counts per collection.
    pub(crate) collection_ops: crate::collections::CollectionOps,
    /// The bucket itself, for background work started by a request (the purge of a
    /// dropped collection). Set at creation ([`Arc::new_cyclic`]).
    pub(crate) self_ref: std::sync::Weak<Bucket>,
    /// Threads purging dropped collections ([`Bucket::start_purge`]), joined at shutdown.
    pub(crate) purges: parking_lot::Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// The open range scans ([`crate::scan_registry`]).
    pub(crate) range_scans: crate::scan_registry::RangeScans,
}

impl CoreOwner for Bucket {
    fn core(&self) -> &BucketCore {
        &self.core
    }
}

impl fmt::Debug for Bucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bucket")
            .field("name", &self.core.config.name)
            .field("vbuckets", &self.core.vbuckets.len())
            .field("mem_used", &self.core.memory.used())
            .finish_non_exhaustive()
    }
}

impl Bucket {
    /// Creates a bucket with every vBucket active and empty, and starts its expiry pager
    /// (a thread named `epkv-expiry-pager`) unless `config.expiry_pager_interval` is zero.
    ///
    /// With persistence, it opens (recovers) the shards and returns at once: the stored
    /// vBuckets are loaded by warmup tasks on the Reader group of the bucket's own
    /// executor, and each answers data requests with TempFail until it is loaded
    /// ([`Bucket::wait_warmup`], the `warmup` STAT group).
    ///
    /// # Errors
    /// [`crate::Error::InvalidConfig`] for a configuration [`BucketConfig::validate`]
    /// rejects; [`crate::Error::SpawnPager`] if the pager thread cannot start; a storage
    /// error if a shard cannot be opened.
    pub fn new(config: BucketConfig, clock: EngineClock) -> Result<Arc<Bucket>> {
        Self::build(config, clock, None)
    }

    /// As [`Bucket::new`], but every background task of the bucket's persistence (warmup,
    /// flushers, appliers, compactor) is scheduled on `executor`, which the bucket does
    /// not own or stop: with an [`epkv_executor::ManualExecutor`]'s handle a test decides
    /// when each runs. Warmup tasks are named `warmup-N` (one per shard, Reader group).
    ///
    /// # Errors
    /// As [`Bucket::new`].
    pub fn new_on_executor(
        config: BucketConfig,
        clock: EngineClock,
        executor: epkv_executor::ExecutorHandle,
    ) -> Result<Arc<Bucket>> {
        Self::build(config, clock, Some(executor))
    }

    fn build(
        config: BucketConfig,
        clock: EngineClock,
        executor: Option<epkv_executor::ExecutorHandle>,
    ) -> Result<Arc<Bucket>> {
        config.validate()?;
        let memory = Arc::new(MemoryTracker::new(config.quota_bytes()));
        let item_pager = crate::item_pager::ItemPager::default();
        let waker = Arc::clone(&item_pager.waker);
        memory.set_high_watermark(config.high_wat_bytes(), move || waker.wake());
        let persistent = config.persistence.is_some();
        let vbuckets = (0..config.num_vbuckets)
            .map(|i| {
                VBucket::new(
                    Vbid(i),
                    VBucketState::Active,
                    config.ht_locks,
                    Arc::clone(&memory),
                )
                .map(|vb| match (persistent, config.eviction_policy) {
                    (false, _) => vb,
                    (true, crate::EvictionPolicy::Value) => vb.with_persistence(),
                    (true, crate::EvictionPolicy::Full) => {
                        vb.with_persistence().with_full_eviction()
                    }
                })
            })
            .collect::<epkv_hashtable::Result<Vec<_>>>()?
            .into_boxed_slice();
        let persistence = match &config.persistence {
            Some(p) => {
                let mut p = p.clone();
                p.apply_after_bytes =
                    p.apply_after_bytes
                        .min(crate::persistence_config::apply_cap(
                            config.memory_quota_bytes,
                            p.shards,
                        ));
                let p = Persistence::open(p)?;
                let queued = p.prepare_warmup(&vbuckets)?;
                tracing::info!(bucket = %config.name, vbuckets = queued, "warmup started");
                Some(p)
            }
            None => None,
        };
        let collections = crate::collections::Collections::open(
            config.persistence.as_ref().map(|p| p.data_dir.clone()),
        )
        .map_err(crate::Error::Collections)?;
        let interval = config.expiry_pager_interval;
        let bucket = Arc::new_cyclic(|weak: &std::sync::Weak<Bucket>| Bucket {
            core: BucketCore {
                config,
                clock: clock.clock(),
                vbuckets,
                memory,
                counters: Counters::new(),
                persistence,
                collections,
                pager_waker: Arc::clone(&item_pager.waker),
                bg_times: crate::bg_fetch_queue::BgFetchTimes::default(),
                task_executor: std::sync::OnceLock::new(),
                owner: weak.clone(),
            },
            testing_clock: clock.testing().cloned(),
            pager: ExpiryPager::new(),
            item_pager,
            collection_ops: crate::collections::CollectionOps::default(),
            self_ref: weak.clone(),
            purges: parking_lot::Mutex::new(Vec::new()),
            range_scans: crate::scan_registry::RangeScans::default(),
        });
        let weak = Arc::downgrade(&bucket);
        bucket
            .core
            .collections
            .set_on_change(Box::new(move |events| {
                if let Some(b) = weak.upgrade() {
                    b.core.record_collection_events(events);
                }
            }));
        Self::start_tasks(&bucket, executor)?;
        if !interval.is_zero() {
            bucket
                .pager
                .start(Arc::downgrade(&bucket), interval, Bucket::run_expiry_pass)?;
        }
        tracing::info!(
            bucket = %bucket.core.config.name,
            vbuckets = bucket.core.vbuckets.len(),
            quota_bytes = bucket.core.config.memory_quota_bytes,
            flush_enabled = bucket.core.config.flush_enabled,
            "bucket created"
        );
        Ok(bucket)
    }

    /// Blocks until warmup has loaded (or failed) every stored vBucket, at most
    /// `timeout`; returns whether it has. True at once for a memory-only bucket.
    pub fn wait_warmup(&self, timeout: std::time::Duration) -> bool {
        self.core.wait_warmup(timeout)
    }

    /// Blocks the calling thread until the background fetch of `key` in `vbid` is over
    /// (at once if none is in flight), at most `timeout`: for callers outside the front
    /// end (tests, tools) that got WouldBlock and want to run the operation again.
    ///
    /// # Errors
    /// The fetch's error (TempFail, Internal), or TempFail if `timeout` passed first.
    pub fn wait_fetched(&self, vbid: Vbid, key: &[u8], timeout: Duration) -> EngineResult<()> {
        self.core.wait_fetched(vbid, key, timeout)
    }

    /// Runs a shard's queued background fetches now (the fetcher task's run; tests with
    /// a manual executor call it through the task). Returns how many keys it read and how
    /// many of those it queued again because their values did not fit in memory.
    pub fn run_bg_fetches(&self, shard: usize) -> (usize, usize) {
        self.core.run_bg_fetches(shard)
    }

    /// The order in which the item pager visits vBuckets (KV-Engine's `VBCBAdaptor` with
    /// the paging visitor's comparator): replicas first, then by pageable memory, largest
    /// first. Dead vBuckets and vBuckets not warmed up are left out.
    #[must_use]
    pub fn pager_vbucket_order(&self) -> Vec<Vbid> {
        self.core.pager_vbucket_order()
    }

    /// Runs the item pager for at most 10,000 items: starts a cycle if memory
    /// is above the high watermark (or above the low one after a wake), continues the
    /// cycle in progress, and ends it once memory is at the low watermark or nothing more
    /// can be freed. The pager task calls this; tests call it directly.
    pub fn run_item_pager(&self) -> PagerRun {
        self.core.run_item_pager(&self.item_pager)
    }

    /// Ejects one document's value now, as KV-Engine's EVICT_KEY (0x93): `Ok(true)` when
    /// it ejected it, `Ok(false)` when it was not resident already.
    ///
    /// # Errors
    /// `KeyNotFound` for a missing document; `KeyExists` for one not yet persisted
    /// (KV-Engine answers "Can't eject: Dirty object." with the same status);
    /// `NotSupported` for a memory-only bucket, which cannot read a value back;
    /// `NotMyVbucket` / `TempFail` as for any operation on the key.
    pub fn evict_key(&self, vbid: Vbid, key: &[u8]) -> epkv_engine_api::EngineResult<bool> {
        self.core.evict_key(vbid, key)
    }

    /// Calls `done` with the outcome of the SyncWrite whose prepare has `seqno` in
    /// `vbid`: success once committed, SyncWriteAmbiguous once aborted (at once if it has
    /// completed already).
    ///
    /// # Errors
    /// NotMyVbucket for a vBucket outside the bucket.
    pub fn when_sync_write_completed(
        &self,
        vbid: Vbid,
        seqno: u64,
        done: SyncWriteCallback,
    ) -> EngineResult<()> {
        self.core.when_sync_write_completed(vbid, seqno, done)
    }

    /// One row per live task of the executor the bucket's background work runs on
    /// (flushers, appliers, background fetchers, warmup, compactor, item pager), ordered
    /// by task id, with each task's run-time and lateness histograms. A bucket given an
    /// executor with [`Bucket::new_on_executor`] lists every task of that executor.
    #[must_use]
    pub fn tasks(&self) -> Vec<epkv_executor::TaskInfo> {
        self.core
            .task_executor
            .get()
            .map(epkv_executor::ExecutorHandle::tasks)
            .unwrap_or_default()
    }

    /// True once warmup has loaded (or failed) every stored vBucket (see
    /// [`Bucket::wait_warmup`]); always true for a memory-only bucket.
    #[must_use]
    pub fn is_warmed_up(&self) -> bool {
        self.core.is_warmed_up()
    }

    /// One run of a shard's warmup task: loads one vBucket.
    fn warmup_run(&self, shard: usize) -> epkv_executor::Next {
        let Some(p) = &self.core.persistence else {
            return epkv_executor::Next::Done;
        };
        p.warmup_next(
            shard,
            &self.core.vbuckets,
            (&self.core.memory, self.core.config.low_wat_bytes()),
            &self.core.collections,
            &|vb| self.core.complete_sync_writes(vb),
        );
        // Loading may have dirtied the vBucket's state (a new failover branch after an
        // unclean shutdown). A write to a vBucket whose queue is already non-empty does
        // not wake the flusher, so without this nothing would be flushed after a crash.
        p.wake_shard(shard);
        if p.warmup
            .queues
            .get(shard)
            .is_some_and(|q| !q.lock().is_empty())
        {
            epkv_executor::Next::After(std::time::Duration::ZERO)
        } else {
            epkv_executor::Next::Done
        }
    }

    /// Starts the persistence tasks on `executor`, or on an executor of the bucket's own
    /// (`reader_threads` Reader threads, one AuxIO and NonIO thread, `writer_threads`
    /// Writer threads): one warmup
    /// task per shard with vBuckets to load, and, unless the flusher is manual, one
    /// flusher and one applier per shard and the compactor.
    fn start_tasks(
        bucket: &Arc<Bucket>,
        executor: Option<epkv_executor::ExecutorHandle>,
    ) -> Result<()> {
        let Some(p) = &bucket.core.persistence else {
            let exec = match executor {
                Some(h) => h,
                None => {
                    // Every group needs a thread; only NonIO has work here.
                    let cfg = epkv_executor::ExecutorConfig::new()
                        .with_threads(epkv_executor::Group::Reader, 1)
                        .with_threads(epkv_executor::Group::Writer, 1)
                        .with_threads(epkv_executor::Group::AuxIo, 1)
                        .with_threads(epkv_executor::Group::NonIo, 1);
                    let owned = epkv_executor::Executor::new(cfg)?;
                    let h = owned.handle();
                    *bucket.item_pager.executor.lock() = Some(owned);
                    h
                }
            };
            let _ = bucket.core.task_executor.set(exec.clone());
            return Self::start_item_pager(bucket, &exec);
        };
        let exec = match executor {
            Some(h) => h,
            None => {
                let cfg = epkv_executor::ExecutorConfig::new()
                    .with_threads(epkv_executor::Group::Reader, p.config.reader_threads)
                    .with_threads(epkv_executor::Group::AuxIo, 1)
                    .with_threads(epkv_executor::Group::NonIo, 1)
                    .with_threads(epkv_executor::Group::Writer, p.config.writer_threads)
                    // A flusher runs every few milliseconds at most (`flush_delay`) and
                    // its applier after it: a Writer thread that spins and yields for
                    // work after each run burns the CPU the persistence path is
                    // measured by, for nothing. It parks; a wake is a futex.
                    .with_group_idle_rounds(epkv_executor::Group::Writer, 0, 0);
                let owned = epkv_executor::Executor::new(cfg)?;
                let h = owned.handle();
                *p.executor.lock() = Some(owned);
                h
            }
        };
        let _ = bucket.core.task_executor.set(exec.clone());
        let mut warmers = Vec::new();
        for shard in 0..p.shards.len() {
            if p.warmup
                .queues
                .get(shard)
                .is_none_or(|q| q.lock().is_empty())
            {
                continue;
            }
            let spec = epkv_executor::TaskSpec::new(
                format!("warmup-{shard}"),
                epkv_executor::Group::Reader,
            );
            warmers.push(schedule_weak(
                &exec,
                Arc::downgrade(bucket),
                spec,
                move |b: &Bucket| b.warmup_run(shard),
            )?);
        }
        *p.warmers.lock() = warmers;
        let mut fetchers = Vec::with_capacity(p.shards.len());
        for shard in 0..p.shards.len() {
            let spec = epkv_executor::TaskSpec::new(
                format!("bgfetcher-{shard}"),
                epkv_executor::Group::Reader,
            )
            .start(epkv_executor::Start::Sleep);
            fetchers.push(schedule_weak(
                &exec,
                Arc::downgrade(bucket),
                spec,
                move |b: &Bucket| b.core.bg_fetcher_run(shard),
            )?);
        }
        *p.fetchers.lock() = fetchers;
        Self::start_item_pager(bucket, &exec)?;
        if p.config.flusher == FlusherMode::Manual {
            return Ok(());
        }
        let mut handles = Vec::with_capacity(p.shards.len());
        for shard in 0..p.shards.len() {
            let spec = epkv_executor::TaskSpec::new(
                format!("flusher-{shard}"),
                epkv_executor::Group::Writer,
            );
            handles.push(schedule_weak(
                &exec,
                Arc::downgrade(bucket),
                spec,
                move |b: &Bucket| b.flusher_run(shard),
            )?);
        }
        // One applier per shard writes journaled commits to the data files while the
        // flusher goes on with the next batch (the background half of a journal commit).
        let mut appliers = Vec::with_capacity(p.shards.len());
        for shard in 0..p.shards.len() {
            let spec = epkv_executor::TaskSpec::new(
                format!("applier-{shard}"),
                epkv_executor::Group::Writer,
            )
            .start(epkv_executor::Start::Sleep);
            appliers.push(schedule_weak(
                &exec,
                Arc::downgrade(bucket),
                spec,
                move |b: &Bucket| b.applier_run(shard),
            )?);
        }
        *p.appliers.lock() = appliers;
        if !p.config.compaction_interval.is_zero() {
            let every = p.config.compaction_interval;
            let spec = epkv_executor::TaskSpec::new("compactor", epkv_executor::Group::AuxIo)
                .start(epkv_executor::Start::After(every));
            handles.push(schedule_weak(&exec, Arc::downgrade(bucket), spec, move |b: &Bucket| {
                if let Err(e) = b.compact_all() {
                    tracing::warn!(bucket = %b.core.config.name, error = %e, "background compaction failed; retried at the next interval");
                }
                epkv_executor::Next::After(every)
            })?);
        }
        if p.config.compaction_fragmentation_percent > 0 {
            let every = p.config.compaction_check_interval;
            let spec = epkv_executor::TaskSpec::new(
                "fragmentation-compactor",
                epkv_executor::Group::AuxIo,
            )
            .start(epkv_executor::Start::After(every));
            handles.push(schedule_weak(&exec, Arc::downgrade(bucket), spec, move |b: &Bucket| {
                match b.compact_fragmented_upto(FRAGMENTATION_RUN_BYTES) {
                    Ok((_, true)) => epkv_executor::Next::After(std::time::Duration::ZERO),
                    Ok((_, false)) => epkv_executor::Next::After(every),
                    Err(e) => {
                        tracing::warn!(bucket = %b.core.config.name, error = %e, "fragmentation compaction failed; retried at the next check");
                        epkv_executor::Next::After(every)
                    }
                }
            })?);
        }
        *p.flushers.lock() = handles;
        // Warmup may have dirtied states before the handles were registered.
        for shard in 0..p.shards.len() {
            p.wake_shard(shard);
        }
        Ok(())
    }

    /// Schedules the item pager task on `exec`'s NonIO group: it first runs after
    /// `item_pager_interval` (or when woken).
    fn start_item_pager(bucket: &Arc<Bucket>, exec: &epkv_executor::ExecutorHandle) -> Result<()> {
        let every = bucket.core.config.item_pager_interval;
        let start = if every.is_zero() {
            epkv_executor::Start::Sleep
        } else {
            epkv_executor::Start::After(every)
        };
        let spec =
            epkv_executor::TaskSpec::new("item-pager", epkv_executor::Group::NonIo).start(start);
        let handle = schedule_weak(exec, Arc::downgrade(bucket), spec, |b: &Bucket| {
            b.core.item_pager_task_run(&b.item_pager)
        })?;
        bucket.item_pager.set_task(handle);
        // Memory may have passed the high watermark before the task existed (warmup).
        if bucket.core.memory.used() > bucket.core.config.high_wat_bytes() {
            bucket.item_pager.waker.wake();
        }
        Ok(())
    }

    /// Compacts every stored vBucket now (the background compactor calls this every
    /// `compaction_interval`): purges tombstones persisted before the previous compaction
    /// and documents already expired. Writes and flushes continue meanwhile: the store
    /// copies each vBucket with no lock held, then catches up what was committed during
    /// the copy under the vBucket's lock (the interlock is inside the store).
    ///
    /// # Errors
    /// The first storage error; vBuckets compacted before it keep their new files.
    pub fn compact_all(
        &self,
    ) -> std::result::Result<epkv_storage::CompactionOutcome, epkv_storage::Error> {
        let Some(p) = &self.core.persistence else {
            return Ok(epkv_storage::CompactionOutcome::default());
        };
        let now = u32::try_from(self.core.clock.unix_time().as_secs()).unwrap_or(u32::MAX);
        // Dropped collections' documents go too; once every file was compacted the
        // manifest forgets those collections.
        let dropped = self.core.collections.dropped();
        let every_file = self.is_warmed_up();
        let out = p.compact_all(&self.core.vbuckets, now, &self.core.clock, &dropped)?;
        if every_file {
            self.core.collections.forget_dropped(&dropped);
        }
        // Full eviction: each key filter is rebuilt at its vBucket's size, without the
        // keys deleted since it was last built.
        for vb in self.core.vbuckets.iter().filter(|vb| vb.full.is_some()) {
            if vb.warmup_phase() == WarmupPhase::Ready {
                self.core.rebuild_key_filter(vb)?;
            }
        }
        tracing::info!(bucket = %self.core.config.name, kept = out.kept, tombstones_purged = out.tombstones_purged, collection_docs_dropped = out.collection_docs_dropped, prepares_purged = out.prepares_purged, expired = out.expired, bytes_before = out.bytes_before, bytes_after = out.bytes_after, caught_up = out.caught_up, "compaction done");
        Ok(out)
    }

    /// Compacts every data file whose fragmentation is past
    /// [`crate::PersistenceConfig::compaction_fragmentation_percent`] and whose size is at
    /// least `compaction_min_file_bytes`, most fragmented first (the fragmentation
    /// compactor task does this every `compaction_check_interval`, a bounded number of
    /// bytes per run). Tombstones are purged only up to where the interval compactor's
    /// last run purged them. Returns how many files were compacted; 0 when the
    /// fragmentation compactor is off or the bucket is memory-only.
    ///
    /// # Errors
    /// The first storage error; files compacted before it keep their new revision.
    pub fn compact_fragmented(&self) -> std::result::Result<usize, epkv_storage::Error> {
        self.compact_fragmented_upto(u64::MAX).map(|(n, _)| n)
    }

    /// As [`Bucket::compact_fragmented`], stopping once the files compacted add up to
    /// `budget_bytes`; also returns whether files past the threshold remain.
    fn compact_fragmented_upto(
        &self,
        budget_bytes: u64,
    ) -> std::result::Result<(usize, bool), epkv_storage::Error> {
        let Some(p) = &self.core.persistence else {
            return Ok((0, false));
        };
        let now = u32::try_from(self.core.clock.unix_time().as_secs()).unwrap_or(u32::MAX);
        p.compact_fragmented_files(
            &self.core.vbuckets,
            now,
            &self.core.clock,
            budget_bytes,
            &self.core.collections.dropped(),
        )
    }

    /// One run of a shard's flusher task.
    fn flusher_run(&self, shard: usize) -> epkv_executor::Next {
        use epkv_executor::Next;
        let Some(p) = &self.core.persistence else {
            return Next::Done;
        };
        match p.flush_shard(shard, &self.core.vbuckets) {
            Ok(o) => {
                if o.vbuckets > 0
                    && p.has_applier_work(shard)
                    && let Some(h) = p.appliers.lock().get(shard)
                {
                    h.wake();
                }
                // Writes queued during the flush scheduled the next one.
                Next::Sleep
            }
            Err(e) => {
                tracing::warn!(bucket = %self.core.config.name, shard, error = %e, "flush failed; items stay queued and are retried");
                Next::After(RETRY_AFTER)
            }
        }
    }

    /// One run of a shard's applier task: writes its journaled commits to data files.
    fn applier_run(&self, shard: usize) -> epkv_executor::Next {
        use epkv_executor::Next;
        let Some(p) = &self.core.persistence else {
            return Next::Done;
        };
        match p.apply_pending(shard) {
            Ok(0) => Next::Sleep,
            Ok(_) => Next::After(std::time::Duration::ZERO),
            Err(e) => {
                tracing::warn!(bucket = %self.core.config.name, shard, error = %e, "writing journaled commits to data files failed; retrying");
                Next::After(RETRY_AFTER)
            }
        }
    }

    /// Flushes every shard now, on the calling thread (tests, and clean shutdown).
    /// Returns the number of documents committed.
    ///
    /// # Errors
    /// The first storage error (the items stay queued).
    pub fn flush_all(&self) -> std::result::Result<usize, epkv_storage::Error> {
        let Some(p) = &self.core.persistence else {
            return Ok(0);
        };
        // Everything, whatever is marked dirty.
        p.scan_all();
        let mut n = 0;
        for shard in 0..p.shards.len() {
            n += p.flush_shard(shard, &self.core.vbuckets)?.items;
        }
        Ok(n)
    }

    /// Returns a vBucket's persisted seqno (`None` for a vbid outside the bucket; 0 for a
    /// memory-only bucket).
    #[must_use]
    pub fn persisted_seqno(&self, vbid: Vbid) -> Option<u64> {
        self.core
            .vbuckets
            .get(usize::from(vbid.0))
            .map(|vb| vb.persist.persisted())
    }

    /// Runs `f(persisted_seqno)` once vBucket `vbid` has persisted `seqno` (at once if it
    /// has). Nothing blocks; `f` runs on the flusher's thread, so it must be quick.
    ///
    /// # Errors
    /// `NotMyVbucket` for a vbid outside the bucket; `NotSupported` for a memory-only
    /// bucket.
    pub fn when_persisted(
        &self,
        vbid: Vbid,
        seqno: u64,
        f: impl FnOnce(u64) + Send + 'static,
    ) -> EngineResult<()> {
        if self.core.persistence.is_none() {
            return Err(EngineStatus::NotSupported);
        }
        let vb = self
            .core
            .vbuckets
            .get(usize::from(vbid.0))
            .ok_or(EngineStatus::NotMyVbucket)?;
        if vb.persist.when_persisted(seqno, Box::new(f))
            && let Some(p) = &self.core.persistence
        {
            p.urgent(vbid);
        }
        Ok(())
    }

    /// A future resolving once vBucket `vbid` has persisted `seqno`.
    ///
    /// # Errors
    /// As [`Bucket::when_persisted`].
    pub fn wait_persisted(&self, vbid: Vbid, seqno: u64) -> EngineResult<PersistedFuture> {
        let (fut, complete) = PersistedFuture::pending();
        self.when_persisted(vbid, seqno, complete)?;
        Ok(fut)
    }

    /// Stops the flushers, flushes everything queued and checkpoints every shard (data
    /// files synced, journals emptied). Called by `Engine::shutdown`.
    pub(crate) fn shutdown_persistence(&self) {
        self.item_pager.stop();
        if let Some(p) = &self.core.persistence {
            p.stopping.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        // A purge of dropped collections stops at its next vBucket; nothing writes the
        // files once shutdown returns.
        for t in std::mem::take(&mut *self.purges.lock()) {
            if t.join().is_err() {
                tracing::error!(bucket = %self.core.config.name, "the purge of dropped collections panicked");
            }
        }
        let Some(p) = &self.core.persistence else {
            return;
        };
        for h in p
            .warmers
            .lock()
            .drain(..)
            .chain(p.fetchers.lock().drain(..))
        {
            h.cancel();
        }
        for q in &p.fetch_queues {
            q.fail_all(EngineStatus::TempFail);
        }
        for h in p.flushers.lock().drain(..) {
            h.cancel();
        }
        for h in p.appliers.lock().drain(..) {
            h.cancel();
        }
        if let Some(exec) = p.executor.lock().take()
            && let Err(e) = exec.shutdown(std::time::Duration::from_secs(30))
        {
            tracing::error!(bucket = %self.core.config.name, error = %e, "flusher executor did not stop");
        }
        match self.flush_all() {
            Ok(n) => tracing::info!(bucket = %self.core.config.name, items = n, "final flush done"),
            Err(e) => {
                tracing::error!(bucket = %self.core.config.name, error = %e, "final flush failed; queued items not persisted")
            }
        }
        // A vBucket warmup never loaded missed its new failover branch (after an
        // unclean start): the next start must not take this shutdown as clean.
        let mut clean = self.flush_all().is_ok()
            && (p.warmup.is_done()
                || !p.unclean_restart.load(std::sync::atomic::Ordering::Relaxed));
        for (i, s) in p.shards.iter().enumerate() {
            if let Err(e) = epkv_storage::KvStore::checkpoint(&s.store) {
                clean = false;
                tracing::error!(bucket = %self.core.config.name, shard = i, error = %e, "final checkpoint failed; the journal is kept and replayed at next start");
            }
        }
        if clean && let Err(e) = p.mark_clean_shutdown() {
            tracing::error!(bucket = %self.core.config.name, error = %e, "cannot record the clean shutdown; the next start creates new failover entries");
        }
    }

    /// Returns the configuration the bucket was created with.
    #[must_use]
    pub fn config(&self) -> &BucketConfig {
        &self.core.config
    }

    /// Returns the item memory in use, in bytes (the `mem_used` stat).
    #[must_use]
    pub fn mem_used(&self) -> usize {
        self.core.memory.used()
    }

    /// Returns the number of documents in all vBuckets (the `curr_items_tot` stat).
    #[must_use]
    pub fn item_count(&self) -> usize {
        self.core.vbuckets.iter().map(VBucket::item_count).sum()
    }

    /// Returns a vBucket's high seqno (the seqno of its latest mutation; 0 if none), or
    /// `None` for a vbid outside the bucket.
    #[must_use]
    pub fn high_seqno(&self, vbid: Vbid) -> Option<u64> {
        self.core
            .vbuckets
            .get(usize::from(vbid.0))
            .map(|vb| vb.ordering_snapshot().0)
    }

    /// Returns a snapshot of one vBucket's hash-table statistics (items, tombstones,
    /// prepares, non-resident and dirty items, bytes, MFU histogram), or `None` for a
    /// vbid outside the bucket. Every item also exposes its dirty bit and by-seqno
    /// ([`epkv_hashtable::StoredValue::is_dirty`], `meta().by_seqno`). The flusher does
    /// not clear the bits of what it persisted (an item at or below the vBucket's
    /// persisted seqno is clean whatever its bit says; eviction and OBSERVE settle the
    /// bit with [`epkv_hashtable::Entry::mark_clean_upto`]): `dirty` here counts the
    /// items that really are not persisted yet, walking the vBucket's items to do so.
    #[must_use]
    pub fn hash_table_stats(&self, vbid: Vbid) -> Option<epkv_hashtable::TableStats> {
        self.core.vbuckets.get(usize::from(vbid.0)).map(|vb| {
            let mut stats = vb.table.stats();
            let persisted = vb.persisted_seqno();
            let mut settled = 0;
            vb.table.for_each(|sv| {
                if sv.is_dirty() && !sv.is_unpersisted(persisted) {
                    settled += 1;
                }
            });
            stats.dirty -= settled.min(stats.dirty);
            stats
        })
    }

    /// Returns true while the background expiry pager thread runs (it does not when the
    /// interval is zero, and stops at [`epkv_engine_api::Engine::shutdown`]).
    #[must_use]
    pub fn is_expiry_pager_running(&self) -> bool {
        self.pager.is_running()
    }

    /// Removes every expired document from every active vBucket, one hash-table stripe at
    /// a time; each removal gets a seqno like a delete. Returns how many were removed.
    /// The background pager calls this every `expiry_pager_interval`; tests call it
    /// directly. Replica, pending and dead vBuckets are skipped (only an active vBucket
    /// expires items, as in KV-Engine).
    pub fn run_expiry_pass(&self) -> usize {
        let mut removed = 0;
        for vb in self.core.vbuckets.iter() {
            if vb.warmup_phase() != WarmupPhase::Ready {
                continue;
            }
            let state = vb.state();
            if *state != VBucketState::Active {
                continue;
            }
            let now = LazyNow::new(&*self.core.clock);
            // A memory-only vBucket whose documents may have extended attributes takes
            // this path too: its deletions may leave tombstones (system attributes),
            // which the next pass drops.
            if vb.is_persistent() || vb.may_contain_xattrs() {
                // A deletion leaves a tombstone in its place (see `remove_deleted`),
                // which `retain` cannot: find the expired keys, then expire each one.
                // Persisted tombstones (and keys found absent on disk) go, as
                // KV-Engine's expiry pager removes temporary items.
                let mut keys = Vec::new();
                let mut clean_tombstones = Vec::new();
                let persisted = vb.persisted_seqno();
                vb.table.for_each(|sv| {
                    if !sv.is_deleted() && expired(sv.meta(), &now) {
                        keys.push(sv.key_bytes());
                    } else if sv.is_deleted()
                        && !sv.is_unpersisted(persisted)
                        && !sv.is_placeholder()
                    {
                        clean_tombstones.push(sv.key_bytes());
                    }
                });
                for key in keys {
                    removed += usize::from(
                        vb.table
                            .with_entry(&key, |e| self.expire_entry(vb, e, &now)),
                    );
                }
                for key in clean_tombstones {
                    vb.table.with_entry(&key, |e| {
                        e.mark_clean_upto(persisted);
                        if e.committed().is_some_and(|sv| {
                            sv.is_deleted() && !sv.is_dirty() && !sv.is_placeholder()
                        }) {
                            e.remove();
                        }
                    });
                }
                continue;
            }
            removed += vb.table.retain(|sv| {
                if expired(sv.meta(), &now) {
                    let (_, woke) = vb.assign_deletion_queued(
                        now.nanos(),
                        sv.meta().rev_seqno + 1,
                        sv.key(),
                        DeleteSource::Expiry,
                    );
                    self.core.queued(vb, woke);
                    false
                } else {
                    true
                }
            });
        }
        self.core
            .counters
            .add(Counter::ExpiredPager, removed as u64);
        self.core.counters.incr(Counter::ExpiryPagerRuns);
        removed
    }

    /// Removes the entry's item if it has expired, giving the removal a seqno, as KV-Engine
    /// does when a client touches an expired document. Afterwards the entry is either
    /// live or empty.
    ///
    /// An expired document with extended attributes is read back first (WouldBlock), so
    /// that its tombstone keeps the system attributes.
    pub(crate) fn expire_on_access(
        &self,
        vb: &VBucket,
        e: &mut Entry<'_>,
        now: &LazyNow<'_>,
    ) -> EngineResult<()> {
        if e.get().is_some_and(|sv| {
            expired(sv.meta(), now)
                && sv.meta().datatype.contains(Datatype::XATTR)
                && !sv.is_resident()
        }) {
            self.fetch_if_evicted(vb, e)?;
        }
        if self.expire_entry(vb, e, now) {
            self.core.counters.incr(Counter::ExpiredAccess);
        }
        Ok(())
    }

    /// Removes the entry's item if it has expired (a deletion with a seqno); returns
    /// whether it did.
    ///
    /// A document with extended attributes whose value is not in memory is left for an
    /// access to expire (which reads the value back first): its system attributes must
    /// stay in the tombstone.
    fn expire_entry(&self, vb: &VBucket, e: &mut Entry<'_>, now: &LazyNow<'_>) -> bool {
        match e.get() {
            Some(sv) if expired(sv.meta(), now) => {
                if sv.meta().datatype.contains(Datatype::XATTR) && !sv.is_resident() {
                    return false;
                }
            }
            _ => return false,
        }
        self.delete_entry(vb, e, now, DeleteSource::Expiry);
        true
    }

    /// Deletes the entry's live document (whose value, when it has extended attributes,
    /// is resident): a tombstone with its system attributes if it has any (kept in
    /// memory until persisted, or in a memory-only bucket until the next expiry pass),
    /// else as [`crate::full_eviction::remove_deleted`].
    pub(crate) fn delete_entry(
        &self,
        vb: &VBucket,
        e: &mut Entry<'_>,
        now: &LazyNow<'_>,
        source: DeleteSource,
    ) -> Assigned {
        let (meta, kept) = match e.get() {
            Some(sv) => (*sv.meta(), system_section(sv)),
            None => (ItemMeta::default(), Vec::new()),
        };
        if !kept.is_empty() {
            let tomb = ItemMeta {
                datatype: Datatype::XATTR,
                ..ItemMeta::default()
            };
            // Never larger than the document it replaces.
            let stored = StoredValue::new_tombstone(e.key(), &kept, tomb)
                .ok()
                .and_then(|t| e.insert(t).ok());
            if stored.is_some() {
                let none = crate::xattrs::Patches::default();
                let a = self.commit_stored(vb, e, now, Some(meta.rev_seqno), &none, source);
                if !vb.is_persistent() {
                    e.mark_clean(a.seqno);
                }
                return a;
            }
            tracing::error!(vbid = %vb.id, "cannot keep a deleted document's system attributes in memory; they are dropped");
        }
        let (a, woke) = vb.assign_deletion_queued(now.nanos(), meta.rev_seqno + 1, e.key(), source);
        crate::full_eviction::remove_deleted(vb, e, &a, meta.rev_seqno + 1);
        self.core.queued(vb, woke);
        a
    }

    /// Makes sure the entry's item has its value in memory (see [`BucketCore::fetch_for`]):
    /// if it is not resident (the item pager evicted it, or warmup loaded only its key
    /// and metadata), or, under full eviction, not in memory at all, queues a background
    /// fetch and answers WouldBlock (see [`crate::bg_fetcher`]); the operation runs again
    /// once the fetch is over.
    pub(crate) fn fetch_if_evicted(&self, vb: &VBucket, e: &mut Entry<'_>) -> EngineResult<()> {
        self.core.fetch_for(vb, e, true)
    }

    /// As [`Self::fetch_if_evicted`] for an operation that needs only to know whether
    /// the document exists, with its metadata (ADD, REPLACE, DELETE, CAS-conditioned
    /// writes, UNLOCK): only full eviction ever fetches for it.
    pub(crate) fn fetch_meta_if_evicted(
        &self,
        vb: &VBucket,
        e: &mut Entry<'_>,
    ) -> EngineResult<()> {
        self.core.fetch_for(vb, e, false)
    }

    /// The ordering point of a write: gives the entry's (just stored) item its seqno, CAS
    /// and revision (`old_rev + 1`, or the vBucket's max deleted revision + 1 for a new
    /// key), with the stripe lock held. The version may be a tombstone (a deleted
    /// document that keeps extended attributes), and its value may have macros to write
    /// (`patches`) once its CAS and seqno are known, before the flusher's copy is taken.
    pub(crate) fn commit_stored(
        &self,
        vb: &VBucket,
        e: &mut Entry<'_>,
        now: &LazyNow<'_>,
        old_rev: Option<u64>,
        patches: &crate::xattrs::Patches,
        source: DeleteSource,
    ) -> Assigned {
        let deleted = e.committed().is_some_and(StoredValue::is_deleted);
        if let Some(sv) = e.committed() {
            vb.note_xattrs(sv.meta().datatype);
        }
        if !deleted {
            vb.note_written(e.key());
        }
        let patch = |e: &mut Entry<'_>, a: &Assigned| {
            if !patches.is_empty()
                && let Some(v) = e.value_mut()
            {
                patches.apply(v, a);
            }
        };
        let mut patched = false;
        let deleted_rev = old_rev.map(|r| r + 1).filter(|_| deleted);
        let (a, woke) = vb.assign_queued(now.nanos(), deleted_rev, |a| {
            patch(e, a);
            patched = true;
            let mut doc = document_of(e, a, old_rev.map_or(a.new_key_rev, |r| r + 1), None);
            if doc.deleted {
                doc.datatype |= source.tombstone_bits();
            }
            doc
        });
        if !patched {
            patch(e, &a);
        }
        if let Some(m) = e.meta_mut() {
            m.by_seqno = a.seqno;
            m.cas = a.cas;
            m.rev_seqno = old_rev.map_or(a.new_key_rev, |r| r + 1);
        }
        self.core.queued(vb, woke);
        a
    }

    /// Stores `sv` as the key's next version: committed at once (see
    /// [`Self::commit_stored`]), or, for a write with durability requirements `d`, as a
    /// prepare (see [`crate::durability`]).
    #[expect(
        clippy::too_many_arguments,
        reason = "the parts of one versioned write"
    )]
    pub(crate) fn write_version(
        &self,
        vb: &VBucket,
        e: &mut Entry<'_>,
        sv: StoredValue,
        now: &LazyNow<'_>,
        old_rev: Option<u64>,
        patches: &crate::xattrs::Patches,
        d: Option<&DurabilityRequirements>,
    ) -> EngineResult<Assigned> {
        match d {
            Some(d) => self
                .core
                .prepare_version(vb, e, sv, now, old_rev, patches, d),
            None => {
                self.core.insert_or_tempfail(e, sv)?;
                Ok(self.commit_stored(vb, e, now, old_rev, patches, DeleteSource::Explicit))
            }
        }
    }

    /// After a write ran and released its stripe lock: a SyncWrite (`d`) that made a
    /// prepare is handed to the durability monitor.
    pub(crate) fn after_write(
        &self,
        vb: &VBucket,
        d: Option<&DurabilityRequirements>,
        result: &EngineResult<MutationInfo>,
    ) {
        if let (Some(d), Ok(info)) = (d, result) {
            self.core.sync_write_added(vb, info.seqno, d.level);
        }
    }

    /// What a mutation reports back.
    pub(crate) fn mutation_info(vb: &VBucket, a: Assigned) -> MutationInfo {
        MutationInfo {
            cas: a.cas,
            vbucket_uuid: vb.uuid(),
            seqno: a.seqno,
        }
    }
}

impl Drop for Bucket {
    fn drop(&mut self) {
        // Never joins here: the last reference may be dropped on the pager thread itself.
        self.pager.signal_stop();
        // Nor on the item pager's own executor thread (a memory-only bucket's).
        self.item_pager.stop_detached();
        // Nor on a flusher thread: stop the executor from a thread of its own. (A clean
        // shutdown has already flushed and stopped it; this only handles a bucket dropped
        // without one, whose unflushed writes were never reported persisted.)
        if let Some(p) = &self.core.persistence {
            for h in p
                .flushers
                .lock()
                .drain(..)
                .chain(p.appliers.lock().drain(..))
                .chain(p.warmers.lock().drain(..))
            {
                h.cancel();
            }
            if let Some(exec) = p.executor.lock().take()
                && let Err(e) = epkv_executor::spawn_named("epkv-flusher-stop", move || drop(exec))
            {
                tracing::error!(error = %e, "cannot stop the flusher executor");
            }
        }
    }
}
