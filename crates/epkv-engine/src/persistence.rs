//! Persistence: per-vBucket dirty queues, the flusher (one task per shard on the
//! executor's Writer group), the persisted seqno with its waiters, warmup and the clean
//! shutdown flush. The storage itself is `epkv-storage` ([`FileStore`], one per shard).
//!
//! - **Dirty queue** ([`VbPersist`](crate::vb_persist::VbPersist)): every mutation is queued at the vBucket's ordering
//!   point (with its `order` mutex held), keyed by document key, so a key written many times
//!   between two flushes is flushed once (KV-Engine's checkpoint de-duplication). Because
//!   queueing and seqno assignment happen together, taking the queue yields every seqno up
//!   to its largest one: that largest seqno is what the vBucket has persisted once the
//!   commit returns.
//! - **Flusher**: a shard's task takes the queues of the shard's vBuckets, commits them as
//!   one batch (one journal fdatasync), then advances each vBucket's persisted seqno, marks
//!   the hash-table items clean and completes the waiters. A failed commit puts the items
//!   back (newer versions queued meanwhile win) and retries after [`RETRY_AFTER`]; while
//!   the disk is full, writes answer TMPFAIL.
//! - **Waiters**: [`crate::Bucket::when_persisted`] registers a callback run once the
//!   vBucket's persisted seqno reaches a seqno; no thread blocks per waiter.
//! - **Warmup**: [`crate::Bucket::new`] opens (recovers) the shards, marks every stored
//!   vBucket [`WarmupPhase::Loading`] and queues it on its shard's list, active vBuckets
//!   first ([`Persistence::prepare_warmup`]); one `warmup-N` task per shard on the Reader
//!   group then loads one vBucket per run ([`Persistence::warmup_next`]): its documents
//!   by seqno into the hash table, then its state, seqnos and failover log, then makes it
//!   Ready. Until then the vBucket answers TMPFAIL to data requests and state changes, so
//!   nothing can write to it (no mutation is lost or takes a seqno below the stored
//!   ones). A vBucket that cannot be read becomes [`WarmupPhase::Failed`] (NotMyVbucket,
//!   files untouched, the error logged and in `STAT warmup`). Values are loaded while
//!   item memory is below the low watermark; past it documents are loaded as keys and
//!   metadata (non-resident), and an operation that needs such a value reads it back
//!   from disk synchronously (no Reader-group background fetch yet). Documents whose
//!   metadata does not fit under the quota are counted (`ep_warmup_oom`) and
//!   not served until written again. A clean
//!   shutdown leaves a marker file; without it, every vBucket starts a new failover branch
//!   at its persisted seqno.
//! - **Appliers**: one task per shard writes journaled commits to the data files while the
//!   flusher goes on (woken after each flush).
//!
//! Level: the store, below the bucket core; it sees vBuckets (a slice of them) and its
//! shards, never the core or the bucket.

use crate::bg_fetch_queue::BgFetchQueue;
use crate::durability_monitor::{PREPARE_DELETES, Passive, Tracked, prepared_key_of};
use crate::persistence_config::PersistenceConfig;
use crate::shard_store::{ShardStore, StorageBackend};
use crate::vb_persist::{SyncSeqnos, Waiter};
use crate::vbucket::{VBucket, WarmupPhase};
use epkv_hashtable::{CommittedState, ItemMeta, MemoryTracker, StoredValue};
use epkv_storage::{
    Document, FdCache, FileStore, FileStoreConfig, KvStore, LogStore, LogStoreConfig, ScanControl,
    StoreStats, VbCommit, VbState,
};
use epkv_types::Vbid;
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::{AcqRel, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

/// File a clean shutdown leaves in the data directory (removed at start).
const CLEAN_SHUTDOWN_MARKER: &str = "clean_shutdown";

/// Wait before a flusher retries after a failed commit.
pub(crate) const RETRY_AFTER: Duration = Duration::from_millis(100);
/// vBuckets whose journaled commits an applier writes to their data files per run (it runs
/// again at once while some remain, so a long backlog does not hold a Writer thread).
const APPLY_PER_RUN: usize = 64;

/// Bytes a document adds to a data file besides its key and value (frame, fields, index
/// entry), for [`Persistence::flushed_bytes`].
const DOC_OVERHEAD: usize = 64;

/// Under a write load, the fragmentation compactor may write up to this many times the
/// bytes the flushers commit per second (when that is more than
/// [`PersistenceConfig::compaction_bytes_per_sec`]): a compaction that writes at rate `c`
/// while overwrites leave garbage at rate `w` settles with files at `1 + w / c` times their
/// live bytes, so a fixed cap lets full-speed overwrites outrun it. `cargo xtask bench
/// space` (1M keys overwritten at ~200k SETs/s for 60 s), peak / live (data files only),
/// ops/s vs compaction off: fixed 64 MiB/s cap 3.18x (2.86x), 0.93x; factor 1 2.44x
/// (2.14x), 0.87x; factor 2 2.11x (1.82x), 0.75x (below the 0.8x goal).
const COMPACTION_INGEST_FACTOR: u64 = 1;

/// Threads per shard the fragmentation compactor runs at once. Compacting a small file
/// costs two or three fdatasyncs, and the disk completes concurrent ones together: with
/// one per shard, full-speed overwrites of 1M keys peaked at 3.33x the live bytes (data
/// files 3.02x), with two 3.18x (2.86x), with four 3.32x (3.02x): the rate cap, not the
/// syncs, bounds it past two (see [`COMPACTION_INGEST_FACTOR`]).
const COMPACTORS_PER_SHARD: usize = 2;

/// [`Shard::armed`]: nothing queued since the last flush began.
const IDLE: u8 = 0;
/// A write is queued and the flusher is due after the batching delay.
const DELAYED: u8 = 1;
/// Someone waits for persistence: the flusher is due now.
const URGENT: u8 = 2;

/// One shard: its store and the lock that keeps one flush at a time.
#[derive(Debug)]
pub(crate) struct Shard {
    pub(crate) store: ShardStore,
    flush_lock: Mutex<()>,
    /// Whether the flusher has been scheduled since its last flush began ([`IDLE`],
    /// [`DELAYED`], [`URGENT`]): only the first write of a batch schedules it, and only a
    /// waiter makes it due before the delay is over.
    armed: std::sync::atomic::AtomicU8,
    /// The next flush looks at every vBucket of the shard, not only those marked dirty
    /// (at start, after warmup changed states, and for an explicit flush of everything).
    scan_all: AtomicBool,
}

/// Bits of [`Persistence::dirty`]: one per possible vBucket id.
const DIRTY_WORDS: usize = (u16::MAX as usize + 1) / 64;

/// A bucket's persistence: shards, flusher tasks and counters.
pub(crate) struct Persistence {
    /// One bit per vBucket id with something to persist ([`Self::mark_dirty`]).
    dirty: Box<[AtomicU64]>,
    pub(crate) config: PersistenceConfig,
    pub(crate) shards: Vec<Shard>,
    pub(crate) fds: Arc<FdCache>,
    /// The executor running the flushers (None until started, and after shutdown).
    pub(crate) executor: Mutex<Option<epkv_executor::Executor>>,
    /// One flusher task per shard (empty until started), then the compactor.
    pub(crate) flushers: Mutex<Vec<epkv_executor::TaskHandle>>,
    /// One applier task per shard (empty until started).
    pub(crate) appliers: Mutex<Vec<epkv_executor::TaskHandle>>,
    /// Set while the last commit failed with "no space": writes answer TMPFAIL.
    pub(crate) disk_full: AtomicBool,
    /// Set when shutdown begins: a compaction of every vBucket stops at the next one.
    pub(crate) stopping: AtomicBool,
    /// Items loaded by warmup.
    pub(crate) warmup_items: AtomicU64,
    /// The previous run did not shut down cleanly.
    pub(crate) unclean_restart: AtomicBool,
    /// Flusher runs that committed something.
    pub(crate) flushes: AtomicU64,
    /// Commits that failed.
    pub(crate) flush_failures: AtomicU64,
    /// Per vBucket, its persisted seqno when the previous interval compaction ran:
    /// tombstones at or below it are purged by the next one.
    pub(crate) purge_marks: Mutex<HashMap<u16, u64>>,
    /// Per vBucket, the purge seqno the previous interval compaction used: the
    /// fragmentation compactor purges tombstones up to it only, so that a tombstone stays
    /// on disk as long as with the interval compactor alone.
    pub(crate) purged_upto: Mutex<HashMap<u16, u64>>,
    /// vBucket files the fragmentation compactor rewrote.
    pub(crate) fragmentation_compactions: AtomicU64,
    /// CPU time of the compaction and cleaning threads, in µs (`ep_compaction_cpu_time`).
    pub(crate) compaction_cpu_us: AtomicU64,
    /// Bytes of documents the flushers committed (cumulative): the rate at which they
    /// grow is the rate at which overwrites leave garbage in the data files.
    pub(crate) flushed_bytes: AtomicU64,
    /// The fragmentation compactor's view of that rate: (when it was last sampled,
    /// `flushed_bytes` then, the rate in bytes per second).
    ingest: Mutex<Option<(std::time::Instant, u64, u64)>>,
    /// Warmup progress (queues per shard, counters, the done condition).
    pub(crate) warmup: WarmupProgress,
    /// One warmup task per shard on the Reader group (empty once shut down).
    pub(crate) warmers: Mutex<Vec<epkv_executor::TaskHandle>>,
    /// Per shard, the queued and in-flight background fetches.
    pub(crate) fetch_queues: Vec<BgFetchQueue>,
    /// One background fetcher task per shard on the Reader group (empty until started,
    /// and once shut down).
    pub(crate) fetchers: Mutex<Vec<epkv_executor::TaskHandle>>,
}

impl std::fmt::Debug for Persistence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Persistence")
            .field("config", &self.config)
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

/// What one flush of a shard did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlushOutcome {
    /// Documents committed.
    pub(crate) items: usize,
    /// vBuckets committed.
    pub(crate) vbuckets: usize,
}

impl Persistence {
    /// Opens every shard (recovering its files).
    pub(crate) fn open(config: PersistenceConfig) -> Result<Self, epkv_storage::Error> {
        let budget = config
            .fd_budget
            .unwrap_or_else(epkv_storage::default_fd_budget);
        let fds = Arc::new(FdCache::new(Arc::new(epkv_storage::RealFs), budget));
        let mut shards = Vec::with_capacity(usize::from(config.shards));
        for i in 0..config.shards {
            let dir = config.data_dir.join(format!("shard_{i}"));
            let store = match config.storage.resolve(&dir)? {
                StorageBackend::Files => {
                    let mut cfg = FileStoreConfig::new(dir);
                    cfg.journal = config.journal;
                    cfg.fd_cache = Some(Arc::clone(&fds));
                    cfg.journal_prealloc_bytes = config.journal_prealloc_bytes;
                    cfg.apply_after_bytes = config.apply_after_bytes;
                    cfg.checkpoint_bytes = config.checkpoint_bytes;
                    let store = FileStore::open(cfg)?;
                    let r = store.recovery_report();
                    if !r.torn_tails.is_empty() || r.journal_torn_bytes > 0 {
                        tracing::warn!(shard = i, torn_tails = ?r.torn_tails, journal_torn_bytes = r.journal_torn_bytes, "storage recovery cut off torn tails");
                    }
                    for q in &r.quarantined {
                        tracing::error!(shard = i, vbid = %q.vbid, path = %q.path.display(), offset = q.offset, error = %q.error, journal_commits_dropped = r.journal_commits_dropped, "vBucket data file corrupt: the vBucket stays unavailable (NotMyVbucket) until FLUSH deletes it; its files are kept");
                    }
                    ShardStore::Files(Box::new(store))
                }
                StorageBackend::Log | StorageBackend::Auto => {
                    let mut cfg = LogStoreConfig::new(dir);
                    cfg.fd_cache = Some(Arc::clone(&fds));
                    let store = LogStore::open(cfg)?;
                    let r = store.recovery_report();
                    if r.torn_bytes > 0 {
                        tracing::warn!(
                            shard = i,
                            torn_bytes = r.torn_bytes,
                            "storage recovery cut off the log's torn tail"
                        );
                    }
                    ShardStore::Log(Box::new(store))
                }
            };
            shards.push(Shard {
                store,
                flush_lock: Mutex::new(()),
                armed: std::sync::atomic::AtomicU8::new(IDLE),
                scan_all: AtomicBool::new(true),
            });
        }
        let warmup = WarmupProgress::new(shards.len());
        let fetch_queues = (0..shards.len()).map(|_| Default::default()).collect();
        Ok(Self {
            dirty: (0..DIRTY_WORDS).map(|_| AtomicU64::new(0)).collect(),
            fetch_queues,
            fetchers: Mutex::new(Vec::new()),
            config,
            shards,
            fds,
            executor: Mutex::new(None),
            flushers: Mutex::new(Vec::new()),
            appliers: Mutex::new(Vec::new()),
            disk_full: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            warmup_items: AtomicU64::new(0),
            unclean_restart: AtomicBool::new(false),
            flushes: AtomicU64::new(0),
            flush_failures: AtomicU64::new(0),
            purge_marks: Mutex::new(HashMap::new()),
            purged_upto: Mutex::new(HashMap::new()),
            fragmentation_compactions: AtomicU64::new(0),
            compaction_cpu_us: AtomicU64::new(0),
            flushed_bytes: AtomicU64::new(0),
            ingest: Mutex::new(None),
            warmup,
            warmers: Mutex::new(Vec::new()),
        })
    }

    /// The shard of a vBucket.
    pub(crate) fn shard_of(&self, vbid: Vbid) -> usize {
        usize::from(vbid.0) % self.shards.len().max(1)
    }

    /// The persisted state of `vbid`, if it has one (a read error counts as none).
    fn stored_state(&self, vbid: Vbid) -> Option<epkv_storage::VbState> {
        let shard = self.shards.get(self.shard_of(vbid))?;
        match shard.store.vbucket_state(vbid) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%vbid, error = %e, "cannot read the vBucket's persisted state");
                None
            }
        }
    }

    /// The seqno at or below which compaction may have purged `vbid`'s tombstones.
    pub(crate) fn purge_seqno(&self, vbid: Vbid) -> u64 {
        self.stored_state(vbid).map_or(0, |s| s.purge_seqno)
    }

    /// The high completed seqno `vbid` last persisted.
    pub(crate) fn high_completed_seqno(&self, vbid: Vbid) -> u64 {
        self.stored_state(vbid)
            .map_or(0, |s| s.high_completed_seqno)
    }

    /// Streams `vbid`'s stored documents with `start <= seqno <= end` in seqno order (a
    /// DCP backfill).
    pub(crate) fn scan_by_seqno(
        &self,
        vbid: Vbid,
        start: u64,
        end: u64,
        visit: &mut dyn FnMut(Document) -> ScanControl,
    ) -> Result<u64, epkv_storage::Error> {
        match self.shards.get(self.shard_of(vbid)) {
            Some(shard) => shard.store.scan_by_seqno(vbid, start, end, visit),
            None => Ok(0),
        }
    }

    /// Notes that `vbid` has something to persist: the next flush of its shard looks at
    /// it (a flush looks only at the vBuckets so marked, not at every vBucket of the
    /// shard).
    pub(crate) fn mark_dirty(&self, vbid: Vbid) {
        let i = usize::from(vbid.0);
        if let Some(w) = self.dirty.get(i / 64) {
            w.fetch_or(1 << (i % 64), AcqRel);
        }
    }

    /// Takes the marks of `shard`'s vBuckets (ids below `count`): their ids.
    fn take_dirty(&self, shard: usize, shards: usize, count: usize) -> Vec<usize> {
        let mut out = Vec::new();
        for (w, word) in self.dirty.iter().enumerate().take(count.div_ceil(64)) {
            let mut mask = 0u64;
            for b in 0..64 {
                let id = w * 64 + b;
                if id < count && id % shards == shard {
                    mask |= 1 << b;
                }
            }
            let mut bits = word.fetch_and(!mask, AcqRel) & mask;
            while bits != 0 {
                let b = bits.trailing_zeros() as usize;
                out.push(w * 64 + b);
                bits &= bits - 1;
            }
        }
        out
    }

    /// Makes the next flush of every shard look at all its vBuckets.
    pub(crate) fn scan_all(&self) {
        for sh in &self.shards {
            sh.scan_all.store(true, Release);
        }
    }

    /// Marks a vBucket dirty and schedules its shard's flusher after the batching delay
    /// ([`PersistenceConfig::flush_delay`]) unless it is already scheduled: the first
    /// write of a batch schedules the flush, the others only mark their vBucket.
    pub(crate) fn wake(&self, vbid: Vbid) {
        self.mark_dirty(vbid);
        let shard = self.shard_of(vbid);
        let Some(sh) = self.shards.get(shard) else {
            return;
        };
        if sh
            .armed
            .compare_exchange(IDLE, DELAYED, AcqRel, Relaxed)
            .is_ok()
            && let Some(h) = self.flushers.lock().get(shard)
        {
            let delay = self.config.flush_delay;
            if delay.is_zero() {
                h.wake();
            } else {
                // On a grid shared by the shards: their flushes come due together and
                // one timer wake-up starts them all. A write waits at most the delay.
                h.snooze_aligned(delay);
            }
        }
    }

    /// Makes a vBucket's shard flush now: someone waits for one of its writes to be
    /// persisted (the write itself scheduled the flush, perhaps after the delay).
    pub(crate) fn urgent(&self, vbid: Vbid) {
        self.urgent_shard(self.shard_of(vbid));
    }

    /// Makes every shard flush now (memory pressure: only persisted items can be evicted).
    pub(crate) fn urgent_all(&self) {
        for shard in 0..self.shards.len() {
            self.urgent_shard(shard);
        }
    }

    /// Makes a shard's flusher due now (once per batch: later calls find it due).
    fn urgent_shard(&self, shard: usize) {
        let Some(sh) = self.shards.get(shard) else {
            return;
        };
        if sh.armed.swap(URGENT, AcqRel) != URGENT
            && let Some(h) = self.flushers.lock().get(shard)
        {
            h.wake();
        }
    }

    /// Wakes a shard's flusher unconditionally (after warmup changed its vBuckets'
    /// states, which queues them without the empty-to-non-empty transition that wakes it
    /// on a write, and once its task is registered: a write or an urgent request before
    /// that found no task to schedule, and left the shard marked as scheduled).
    pub(crate) fn wake_shard(&self, shard: usize) {
        let Some(sh) = self.shards.get(shard) else {
            return;
        };
        sh.scan_all.store(true, Release);
        sh.armed.store(URGENT, Release);
        if let Some(h) = self.flushers.lock().get(shard) {
            h.wake();
        }
    }

    /// Wakes a shard's background fetcher.
    pub(crate) fn wake_fetcher(&self, shard: usize) {
        if let Some(h) = self.fetchers.lock().get(shard) {
            h.wake();
        }
    }

    /// Sums the shards' storage counters.
    pub(crate) fn store_stats(&self) -> StoreStats {
        let mut t = StoreStats::default();
        for s in &self.shards {
            let x = s.store.stats();
            t.batches += x.batches;
            t.items_flushed += x.items_flushed;
            t.syncs += x.syncs;
            t.bytes_written += x.bytes_written;
            t.journal_bytes += x.journal_bytes;
            t.checkpoints += x.checkpoints;
            t.file_opens += x.file_opens;
            t.compactions += x.compactions;
            t.commit_failures += x.commit_failures;
            t.data_file_bytes += x.data_file_bytes;
            t.live_bytes += x.live_bytes;
            t.bytes_reclaimed += x.bytes_reclaimed;
            t.index_bytes += x.index_bytes;
        }
        t.open_files = self.fds.open_files() as u64;
        t
    }

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

    /// Deletes every vBucket's data (FLUSH): queues are dropped and files deleted; a
    /// vBucket's state is written again with its next mutation.
    pub(crate) fn wipe(&self, vbuckets: &[VBucket]) -> Result<(), epkv_storage::Error> {
        let n = self.shards.len();
        for (shard, sh) in self.shards.iter().enumerate() {
            let _one_at_a_time = sh.flush_lock.lock();
            let mut ids = Vec::new();
            for (i, vb) in vbuckets.iter().enumerate() {
                if i % n == shard {
                    vb.persist.clear();
                    ids.push(vb.id);
                }
            }
            sh.store.wipe(&ids)?;
            // A vBucket warmup could not load had its files deleted with the rest.
            for vb in vbuckets.iter().skip(shard).step_by(n) {
                if vb.warmup_phase() == WarmupPhase::Failed {
                    vb.set_warmup_phase(WarmupPhase::Ready);
                }
            }
        }
        Ok(())
    }

    /// Deletes one vBucket's files and forgets what it had queued (a replica starting
    /// over); its state is written again by the next flush.
    pub(crate) fn wipe_one(&self, vb: &VBucket) -> Result<(), epkv_storage::Error> {
        let Some(sh) = self.shards.get(self.shard_of(vb.id)) else {
            return Ok(());
        };
        let _one_at_a_time = sh.flush_lock.lock();
        vb.persist.clear();
        sh.store.delete_vbucket(vb.id)?;
        vb.persist.mark_state_dirty();
        self.mark_dirty(vb.id);
        Ok(())
    }

    /// Compacts every stored vBucket: tombstones that were persisted before the previous
    /// compaction and documents expired at `now_secs` are dropped from disk. Returns the
    /// summed outcome.
    pub(crate) fn compact_all(
        &self,
        vbuckets: &[VBucket],
        now_secs: u32,
        clock: &Arc<dyn epkv_executor::Clock>,
        dropped: &[u32],
    ) -> Result<epkv_storage::CompactionOutcome, epkv_storage::Error> {
        let mut total = epkv_storage::CompactionOutcome::default();
        for sh in &self.shards {
            for vbid in sh.store.vbuckets() {
                if self.stopping.load(Relaxed) {
                    return Err(epkv_storage::Error::Cancelled);
                }
                let Some(vb) = vbuckets.get(usize::from(vbid.0)) else {
                    continue;
                };
                if vb.warmup_phase() != WarmupPhase::Ready {
                    continue;
                }
                let mark = self.purge_marks.lock().get(&vbid.0).copied().unwrap_or(0);
                let persisted = vb.persist.persisted();
                // Under full eviction expired documents on disk only are expired when
                // read (with a tombstone and a seqno, so the item count stays exact),
                // never silently dropped here.
                let out = sh.store.compact_paced(
                    vbid,
                    &epkv_storage::PurgeRule {
                        purge_before_seqno: mark,
                        now_secs: vb.full.is_none().then_some(now_secs),
                        dropped_collections: dropped.to_vec(),
                        completed_prepares: true,
                        ..epkv_storage::PurgeRule::default()
                    },
                    &mut self.pacer(clock, 1),
                )?;
                self.purge_marks.lock().insert(vbid.0, persisted);
                self.purged_upto.lock().insert(vbid.0, mark);
                total.kept += out.kept;
                total.tombstones_purged += out.tombstones_purged;
                total.collection_docs_dropped += out.collection_docs_dropped;
                total.prepares_purged += out.prepares_purged;
                total.expired += out.expired;
                total.bytes_before += out.bytes_before;
                total.bytes_after += out.bytes_after;
                total.caught_up += out.caught_up;
            }
        }
        Ok(total)
    }

    /// A pacing callback for [`FileStore::compact_paced`] that keeps a compaction's writes
    /// under [`PersistenceConfig::compaction_bytes_per_sec`]: after each chunk it sleeps
    /// until the bytes written so far are no longer ahead of the rate.
    /// `share` compactions run at once, each at 1/`share` of the rate.
    pub(crate) fn pacer(
        &self,
        clock: &Arc<dyn epkv_executor::Clock>,
        share: u64,
    ) -> impl FnMut(u64) + use<> {
        let rate = self.compaction_rate(clock, share);
        let clock = Arc::clone(clock);
        let start = clock.now();
        let mut written = 0u64;
        move |n| {
            if rate == 0 {
                return;
            }
            written += n;
            #[expect(clippy::cast_precision_loss, reason = "a duration from a byte count")]
            let due = Duration::from_secs_f64(written as f64 / rate as f64);
            let elapsed = clock.now().saturating_duration_since(start);
            if let Some(ahead) = due.checked_sub(elapsed) {
                std::thread::sleep(ahead.min(Duration::from_secs(1)));
            }
        }
    }

    /// The files past the fragmentation threshold and the minimum size, most fragmented
    /// first, as (shard, vbid, usage). Empty when the fragmentation compactor is off.
    pub(crate) fn fragmented_files(
        &self,
        vbuckets: &[VBucket],
    ) -> Vec<(usize, Vbid, epkv_storage::FileUsage)> {
        let threshold = f64::from(self.config.compaction_fragmentation_percent);
        if threshold <= 0.0 {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (i, sh) in self.shards.iter().enumerate() {
            for (vbid, u) in sh.store.file_usage() {
                if u.file_bytes >= self.config.compaction_min_file_bytes
                    && u.fragmentation_percent() >= threshold
                    && vbuckets
                        .get(usize::from(vbid.0))
                        .is_some_and(|vb| vb.warmup_phase() == WarmupPhase::Ready)
                {
                    out.push((i, vbid, u));
                }
            }
        }
        out.sort_by(|a, b| {
            b.2.fragmentation_percent()
                .total_cmp(&a.2.fragmentation_percent())
        });
        out
    }

    /// Bytes per second each of `share` compaction threads may write (0: unlimited): its
    /// share of [`PersistenceConfig::compaction_bytes_per_sec`] or, when more, of
    /// [`COMPACTION_INGEST_FACTOR`] times the rate the flushers commit bytes at.
    fn compaction_rate(&self, clock: &Arc<dyn epkv_executor::Clock>, share: u64) -> u64 {
        match self.config.compaction_bytes_per_sec {
            0 => 0,
            r => (r.max(
                self.ingest_rate(clock)
                    .saturating_mul(COMPACTION_INGEST_FACTOR),
            ) / share.max(1))
            .max(1),
        }
    }

    /// Bytes per second the flushers committed, measured over at least a second (0 until
    /// then).
    fn ingest_rate(&self, clock: &Arc<dyn epkv_executor::Clock>) -> u64 {
        let now = clock.now();
        let total = self.flushed_bytes.load(Relaxed);
        let mut g = self.ingest.lock();
        match *g {
            None => {
                *g = Some((now, total, 0));
                0
            }
            Some((at, before, rate)) => {
                let elapsed = now.saturating_duration_since(at);
                if elapsed < Duration::from_secs(1) {
                    return rate;
                }
                #[expect(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    clippy::cast_precision_loss,
                    reason = "a rate from a byte count"
                )]
                let rate = (total.saturating_sub(before) as f64 / elapsed.as_secs_f64()) as u64;
                *g = Some((now, total, rate));
                rate
            }
        }
    }

    /// Compacts the files [`Persistence::fragmented_files`] lists, [`COMPACTORS_PER_SHARD`]
    /// threads per shard with candidates (compactions overlap their syncs, which bound the
    /// rate at which small files can be compacted; most fragmented first), each thread
    /// writing at most its share of
    /// [`PersistenceConfig::compaction_bytes_per_sec`] and compacting about its share of
    /// `budget_bytes` of files. Returns how many files were compacted and whether
    /// candidates remain.
    pub(crate) fn compact_fragmented_files(
        &self,
        vbuckets: &[VBucket],
        now_secs: u32,
        clock: &Arc<dyn epkv_executor::Clock>,
        budget_bytes: u64,
        dropped: &[u32],
    ) -> Result<(usize, bool), epkv_storage::Error> {
        if self.shards.iter().any(|s| s.store.log_usage().is_some()) {
            return self.clean_logs(clock, budget_bytes);
        }
        let mut per_shard: Vec<Vec<(Vbid, epkv_storage::FileUsage)>> =
            vec![Vec::new(); self.shards.len()];
        for (shard, vbid, u) in self.fragmented_files(vbuckets) {
            if let Some(list) = per_shard.get_mut(shard) {
                list.push((vbid, u));
            }
        }
        // Each shard's candidates (most fragmented first) dealt to its threads in turn.
        let lists: Vec<(usize, Vec<(Vbid, epkv_storage::FileUsage)>)> = per_shard
            .into_iter()
            .enumerate()
            .flat_map(|(shard, list)| {
                let mut parts = vec![Vec::new(); COMPACTORS_PER_SHARD];
                for (i, c) in list.into_iter().enumerate() {
                    parts[i % COMPACTORS_PER_SHARD].push(c);
                }
                parts.into_iter().map(move |p| (shard, p))
            })
            .filter(|(_, p)| !p.is_empty())
            .collect();
        let busy = lists.len();
        if busy == 0 {
            return Ok((0, false));
        }
        let share = busy as u64;
        let budget = budget_bytes / share;
        let done = std::sync::atomic::AtomicUsize::new(0);
        let more = AtomicBool::new(false);
        let failed: Mutex<Option<epkv_storage::Error>> = Mutex::new(None);
        let work = |shard: usize, list: &[(Vbid, epkv_storage::FileUsage)]| {
            let mut spent = 0u64;
            for (vbid, usage) in list {
                if spent >= budget || failed.lock().is_some() {
                    more.store(true, Relaxed);
                    return;
                }
                let Some(vb) = vbuckets.get(usize::from(vbid.0)) else {
                    continue;
                };
                match self.compact_fragmented(shard, vb, now_secs, clock, share, dropped) {
                    Ok(out) => {
                        tracing::debug!(
                            vbid = vbid.0,
                            file_bytes = usage.file_bytes,
                            live_bytes = usage.live_bytes,
                            bytes_after = out.bytes_after,
                            "fragmentation compaction"
                        );
                        done.fetch_add(1, Relaxed);
                    }
                    Err(e) => {
                        failed.lock().get_or_insert(e);
                        return;
                    }
                }
                spent += usage.file_bytes;
            }
        };
        std::thread::scope(|sc| {
            for (shard, list) in &lists {
                let (shard, work) = (*shard, &work);
                let spawned = std::thread::Builder::new()
                    .name(format!("epkv-compact-{shard}"))
                    .spawn_scoped(sc, move || {
                        let cpu = ThreadCpu::start();
                        work(shard, list);
                        cpu.add_to(&self.compaction_cpu_us);
                    });
                if spawned.is_err() {
                    // Left for the next run.
                    more.store(true, Relaxed);
                }
            }
        });
        if let Some(e) = failed.into_inner() {
            return Err(e);
        }
        Ok((done.into_inner(), more.into_inner()))
    }

    /// The garbage share past which a shard's log is cleaned now: the setting, or at
    /// least [`LOG_BUSY_FRAGMENTATION_PERCENT`] while the flushers commit more bytes per
    /// second than the compaction rate. The oldest file then holds less live data, so
    /// each byte reclaimed costs fewer copies, index updates and reads (cleaning took 28%
    /// of the server's CPU under a full-speed overwrite load at 30%; `cargo xtask bench
    /// space`); once the load eases, cleaning goes on down to the setting.
    fn log_clean_threshold(&self, clock: &Arc<dyn epkv_executor::Clock>) -> u8 {
        let base = self.config.compaction_fragmentation_percent;
        let busy = self.ingest_rate(clock) > self.config.compaction_bytes_per_sec;
        if busy && base > 0 {
            base.max(LOG_BUSY_FRAGMENTATION_PERCENT)
        } else {
            base
        }
    }

    /// The log backend's share of the fragmentation compactor: each shard whose log files
    /// hold more than [`PersistenceConfig::compaction_fragmentation_percent`] garbage (and
    /// at least [`PersistenceConfig::compaction_min_file_bytes`] in all) cleans its oldest
    /// files ([`epkv_storage::LogStore::clean`]) on a thread of its own, at its share of
    /// the compaction rate, until about its share of `budget_bytes` is cleaned. Returns
    /// the files cleaned and whether a shard is still past the threshold.
    fn clean_logs(
        &self,
        clock: &Arc<dyn epkv_executor::Clock>,
        budget_bytes: u64,
    ) -> Result<(usize, bool), epkv_storage::Error> {
        let threshold = self.log_clean_threshold(clock);
        let min = self.config.compaction_min_file_bytes;
        let past = |sh: &Shard| {
            sh.store.log_usage().is_some_and(|(bytes, live)| {
                bytes >= min && bytes.saturating_sub(live) * 100 > bytes * u64::from(threshold)
            })
        };
        if threshold == 0 {
            return Ok((0, false));
        }
        let due: Vec<&Shard> = self.shards.iter().filter(|sh| past(sh)).collect();
        if due.is_empty() {
            return Ok((0, false));
        }
        let share = due.len() as u64;
        let files_each = usize::try_from(
            (budget_bytes / share / epkv_storage::LogStoreConfig::DEFAULT_FILE_BYTES).max(1),
        )
        .unwrap_or(usize::MAX);
        let done = std::sync::atomic::AtomicUsize::new(0);
        let failed: Mutex<Option<epkv_storage::Error>> = Mutex::new(None);
        std::thread::scope(|sc| {
            for (i, sh) in due.iter().enumerate() {
                let (done, failed) = (&done, &failed);
                let mut pace = self.pacer(clock, share);
                let _ = std::thread::Builder::new()
                    .name(format!("epkv-clean-{i}"))
                    .spawn_scoped(sc, move || {
                        let cpu = ThreadCpu::start();
                        let r = sh.store.clean(threshold, min, files_each, &mut pace);
                        cpu.add_to(&self.compaction_cpu_us);
                        match r {
                            Ok(out) => {
                                done.fetch_add(usize::try_from(out.files).unwrap_or(0), Relaxed);
                            }
                            Err(e) => {
                                failed.lock().get_or_insert(e);
                            }
                        }
                    });
            }
        });
        if let Some(e) = failed.into_inner() {
            return Err(e);
        }
        let more = self.shards.iter().any(past);
        let n = done.into_inner();
        self.fragmentation_compactions.fetch_add(n as u64, Relaxed);
        Ok((n, more))
    }

    /// Compacts one vBucket's file for fragmentation, purging what the interval
    /// compactor's last run purged (tombstones up to the same seqno, documents expired at
    /// `now_secs`); the purge marks are left to the interval compactor.
    pub(crate) fn compact_fragmented(
        &self,
        shard: usize,
        vb: &VBucket,
        now_secs: u32,
        clock: &Arc<dyn epkv_executor::Clock>,
        share: u64,
        dropped: &[u32],
    ) -> Result<epkv_storage::CompactionOutcome, epkv_storage::Error> {
        let Some(sh) = self.shards.get(shard) else {
            return Ok(epkv_storage::CompactionOutcome::default());
        };
        let upto = self.purged_upto.lock().get(&vb.id.0).copied().unwrap_or(0);
        let out = sh.store.compact_paced(
            vb.id,
            &epkv_storage::PurgeRule {
                purge_before_seqno: upto,
                now_secs: vb.full.is_none().then_some(now_secs),
                dropped_collections: dropped.to_vec(),
                completed_prepares: true,
                ..epkv_storage::PurgeRule::default()
            },
            &mut self.pacer(clock, share),
        )?;
        self.fragmentation_compactions.fetch_add(1, Relaxed);
        Ok(out)
    }

    /// Whether `shard`'s store has a second write for its applier task to do (the files
    /// backend's journaled commits; the write-once log has none, and waking the task for
    /// nothing costs a Writer thread a wake-up per flush).
    pub(crate) fn has_applier_work(&self, shard: usize) -> bool {
        self.shards
            .get(shard)
            .is_some_and(|s| s.store.backend() == StorageBackend::Files)
    }

    /// Writes journaled commits to data files (the background half of a commit).
    pub(crate) fn apply_pending(&self, shard: usize) -> Result<usize, epkv_storage::Error> {
        match self.shards.get(shard) {
            Some(s) => s.store.apply_pending(APPLY_PER_RUN),
            None => Ok(0),
        }
    }

    /// The marker a clean shutdown leaves in the data directory.
    fn clean_marker(&self) -> PathBuf {
        self.config.data_dir.join(CLEAN_SHUTDOWN_MARKER)
    }

    /// Records a clean shutdown (everything flushed and checkpointed).
    pub(crate) fn mark_clean_shutdown(&self) -> std::io::Result<()> {
        let p = self.clean_marker();
        std::fs::write(&p, b"clean\n")?;
        std::fs::File::open(&p)?.sync_all()?;
        std::fs::File::open(&self.config.data_dir)?.sync_all()
    }

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
    if vb.state_hint() == epkv_types::VBucketState::Replica {
        // A replica keeps it until the active's commit or abort arrives.
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
    fn new(shards: usize) -> Self {
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

/// The garbage share at least past which a shard's log is cleaned while the flushers
/// commit more bytes per second than `compaction_bytes_per_sec` (see
/// `Persistence::clean_logs`): a log at the limit is 1/(1-0.45) = 1.8 times its live
/// bytes, under the 2x the space goal allows after an idle spell.
const LOG_BUSY_FRAGMENTATION_PERCENT: u8 = 45;

/// The calling thread's CPU time from a start point, for `ep_compaction_cpu_time`.
/// Linux reports it in `/proc/thread-self/schedstat` (nanoseconds on the CPU, the first
/// field); elsewhere it reads 0.
struct ThreadCpu(Option<u64>);

impl ThreadCpu {
    fn now_ns() -> Option<u64> {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    fn start() -> Self {
        Self(Self::now_ns())
    }

    /// Adds the CPU time since [`Self::start`], in µs, to `total`.
    fn add_to(&self, total: &AtomicU64) {
        if let (Some(a), Some(b)) = (self.0, Self::now_ns()) {
            total.fetch_add(b.saturating_sub(a) / 1000, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_requested_before_the_flusher_exists_runs_once_it_is_registered() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = PersistenceConfig::new(dir.path());
        config.shards = 1;
        let p = Persistence::open(config).unwrap();
        // No flusher task yet (the item pager may start before it): requests mark the
        // shard as scheduled and schedule nothing.
        p.wake(Vbid(0));
        p.urgent(Vbid(0));
        assert_eq!(p.shards[0].armed.load(Relaxed), URGENT);
        let clock = Arc::new(epkv_executor::ManualClock::new(Duration::ZERO));
        let exec = epkv_executor::ManualExecutor::new(clock);
        let runs = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&runs);
        let spec = epkv_executor::TaskSpec::new("flusher-0", epkv_executor::Group::Writer)
            .start(epkv_executor::Start::Sleep);
        let h = exec
            .schedule(spec, move |_: &epkv_executor::TaskContext<'_>| {
                counted.fetch_add(1, Relaxed);
                epkv_executor::Next::Sleep
            })
            .unwrap();
        p.flushers.lock().push(h);
        // Another urgent request finds the shard marked and would not wake the task: the
        // registration's wake does, whatever the mark.
        p.urgent(Vbid(0));
        exec.run_until_idle(10);
        assert_eq!(
            runs.load(Relaxed),
            0,
            "a mark left from before the registration keeps requests from waking the task"
        );
        p.wake_shard(0);
        exec.run_until_idle(10);
        assert_eq!(runs.load(Relaxed), 1);
    }

    #[test]
    fn the_log_is_cleaned_at_a_higher_garbage_share_only_under_load() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = PersistenceConfig::new(dir.path());
        config.compaction_bytes_per_sec = 4 << 20;
        let p = Persistence::open(config.clone()).unwrap();
        let manual = Arc::new(epkv_executor::ManualClock::new(Duration::ZERO));
        let clock: Arc<dyn epkv_executor::Clock> = manual.clone();
        assert_eq!(p.log_clean_threshold(&clock), 30, "no load measured yet");
        p.flushed_bytes.fetch_add(40 << 20, Relaxed);
        manual.advance(Duration::from_secs(2));
        assert_eq!(
            p.log_clean_threshold(&clock),
            LOG_BUSY_FRAGMENTATION_PERCENT
        );
        manual.advance(Duration::from_millis(1100));
        assert_eq!(p.log_clean_threshold(&clock), 30, "a quiet second");
        // A setting above it stands; 0 (off) stays off.
        for (set, busy) in [(60, 60), (0, 0)] {
            let dir = tempfile::tempdir().unwrap();
            let mut c = PersistenceConfig::new(dir.path());
            c.compaction_bytes_per_sec = 4 << 20;
            c.compaction_fragmentation_percent = set;
            let p = Persistence::open(c).unwrap();
            p.ingest_rate(&clock);
            p.flushed_bytes.fetch_add(40 << 20, Relaxed);
            manual.advance(Duration::from_secs(2));
            assert_eq!(p.log_clean_threshold(&clock), busy);
        }
    }

    #[test]
    fn compaction_may_write_as_fast_as_the_flushers_persist() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = PersistenceConfig::new(dir.path());
        config.compaction_bytes_per_sec = 4 << 20;
        let p = Persistence::open(config).unwrap();
        let manual = Arc::new(epkv_executor::ManualClock::new(Duration::ZERO));
        let clock: Arc<dyn epkv_executor::Clock> = manual.clone();
        // No rate measured yet: the configured cap, shared by the threads.
        assert_eq!(p.compaction_rate(&clock, 2), 2 << 20);
        // 40 MiB persisted over 2 s: 20 MiB/s, above the cap, is what compaction may write.
        p.flushed_bytes.fetch_add(40 << 20, Relaxed);
        manual.advance(Duration::from_secs(2));
        assert_eq!(p.compaction_rate(&clock, 1), 20 << 20);
        assert_eq!(p.compaction_rate(&clock, 4), 5 << 20);
        // Within a second of the last sample the rate is kept; then it is measured again:
        // a quiet second falls back to the cap.
        manual.advance(Duration::from_millis(500));
        assert_eq!(p.compaction_rate(&clock, 1), 20 << 20);
        manual.advance(Duration::from_millis(600));
        assert_eq!(p.compaction_rate(&clock, 1), 4 << 20);
        // Unlimited stays unlimited.
        let dir = tempfile::tempdir().unwrap();
        let mut config = PersistenceConfig::new(dir.path());
        config.compaction_bytes_per_sec = 0;
        let p = Persistence::open(config).unwrap();
        assert_eq!(p.compaction_rate(&clock, 1), 0);
    }
}
