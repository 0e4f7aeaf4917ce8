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
//!
//! The files: this one holds the shards, the dirty marks and the flusher's scheduling
//! (`wake`, `urgent`), FLUSH's wipe, the appliers and the clean-shutdown marker;
//! `flush.rs` commits a shard's batch and holds what waits for persistence;
//! `warmup.rs` loads the vBuckets at start; `compaction.rs` compacts the files and
//! cleans the log, paced against the flushers.
//!
//! Level: the store, below the bucket core; it sees vBuckets (a slice of them) and its
//! shards, never the core or the bucket.

use crate::bg_fetch_queue::BgFetchQueue;
use crate::persistence_config::PersistenceConfig;
use crate::shard_store::{ShardStore, StorageBackend};
use crate::vbucket::{VBucket, WarmupPhase};
use epkv_storage::{
    Document, FdCache, FileStore, FileStoreConfig, KvStore, LogStore, LogStoreConfig, ScanControl,
    StoreStats,
};
use epkv_types::Vbid;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::{AcqRel, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

mod compaction;
mod flush;
mod warmup;

pub use flush::PersistedFuture;
pub(crate) use warmup::WarmupProgress;

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
}
