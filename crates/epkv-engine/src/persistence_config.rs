//! [`PersistenceConfig`] and [`FlusherMode`]: where and how a bucket persists (the
//! persistence itself is [`crate::persistence`]).
//!
//! Level: a leaf. It imports [`crate::shard_store`]'s [`StorageBackend`] only (itself a
//! leaf).

use crate::shard_store::StorageBackend;
use epkv_storage::JournalMode;
use std::path::PathBuf;
use std::time::Duration;

/// Where and how a bucket persists. `None` in [`crate::BucketConfig::persistence`] keeps
/// the bucket in memory only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersistenceConfig {
    /// Directory of the bucket's shards (`shard_N` below it). Created if missing.
    pub data_dir: PathBuf,
    /// Number of shards: each has its own journal, store and flusher task; vBucket `v`
    /// belongs to shard `v % shards`. Default 4 (KV-Engine's default is the Writer
    /// thread count); 1..=64.
    pub shards: u16,
    /// Journal on (one fdatasync per flush batch, the default) or off (one per vBucket
    /// file per batch, KV-Engine's behaviour).
    pub journal: JournalMode,
    /// Data files kept open across the bucket's shards; `None` derives it from
    /// RLIMIT_NOFILE minus a reserve ([`epkv_storage::default_fd_budget`]).
    pub fd_budget: Option<usize>,
    /// Writer threads running the flushers. Default 2; 1..=16.
    pub writer_threads: usize,
    /// Reader threads running the warmup tasks (one per shard). Default 2 (100,000
    /// documents of 512 B warmed up in 63-89 ms with 2, 118-185 ms with 1, measured on
    /// a shared 2-core machine); 1..=16.
    pub reader_threads: usize,
    /// Who runs the flushers: background tasks (the default) or the caller, through
    /// [`crate::Bucket::flush_all`] (deterministic tests).
    pub flusher: FlusherMode,
    /// Time between two background compactions of every vBucket (an AuxIO task), which
    /// purge the tombstones that were already on disk at the previous one and the expired
    /// documents. Default 1 hour; `Duration::ZERO` disables the task
    /// ([`crate::Bucket::compact_all`] still works). KV-Engine purges tombstones older
    /// than 3 days; epkv purges those that were on disk at the previous interval's
    /// compaction. Fragmentation is handled apart, by the fields below.
    pub compaction_interval: Duration,
    /// Fragmentation, in percent of a data file that is garbage (`1 - live / file`, see
    /// [`epkv_storage::FileUsage`]), past which the fragmentation compactor rewrites the
    /// file. Default 30 (KV-Engine's `compaction-fragmentation-percent`); 0 turns the
    /// fragmentation compactor off (the interval compactor still runs); 0..=100. The
    /// write-once log is cleaned past this share of garbage, or past 45% while the
    /// flushers commit faster than `compaction_bytes_per_sec`.
    pub compaction_fragmentation_percent: u8,
    /// Data files smaller than this are never compacted for fragmentation (a file of a
    /// few documents is mostly index and header, and each compaction pays a fixed cost: a
    /// new file, an fsync, an unlink). Default 256 KiB. A bucket has 1024 vBucket files, so
    /// up to 256 MiB can be left as garbage below it (5x the live data of 100,000 512-byte
    /// documents; 1 MiB would allow a gigabyte). 64 KiB cost a third more server CPU per
    /// SET at 10k-50k overwrites per second of 100,000 keys: every file was compacted about
    /// once a second, and ext4 slows down creating files while many were recently deleted.
    pub compaction_min_file_bytes: u64,
    /// Bytes per second the compactions' copies write at most (they sleep between 1 MiB
    /// chunks to stay under it), so that they do not take the disk from the flushers and
    /// background fetches; while the flushers commit more bytes per second than this, the
    /// fragmentation compactor may write as many as they do, so that it keeps up with the
    /// garbage overwrites leave (see `COMPACTION_INGEST_FACTOR`). Default 64 MiB/s; 0 is
    /// unlimited.
    pub compaction_bytes_per_sec: u64,
    /// How often the fragmentation compactor looks for files past the threshold (an
    /// AuxIO task; looking reads one counter per data file and takes no vBucket lock).
    /// Default 1 s; above zero.
    pub compaction_check_interval: Duration,
    /// Bytes of zeros each shard's journal is preallocated with, so that appends overwrite
    /// allocated blocks and a sync need not also write the inode. Default 0 (the journal
    /// grows); about 72 MiB (the 64 MiB checkpoint threshold plus a batch) gave ~30% lower
    /// persist latency in the storage benchmark (docs/benchmarks.md).
    pub journal_prealloc_bytes: u64,
    /// Document bytes of journaled commits a shard's applier lets accumulate before it
    /// writes them to the data files, so that each data file gets many commits in one
    /// append ([`epkv_storage::FileStoreConfig::apply_after_bytes`]), and a key overwritten meanwhile
    /// is written once. Default 16 MiB: against 8 MiB, the Writer threads' CPU per
    /// persisted item fell about 10% at 50k SETs/s and 25% at the highest rate (`cargo
    /// xtask bench flusher`); 30 MiB saved more (12%, 35%) but doubled the p99.9 of
    /// 2000 PersistToMajority writers (a checkpoint applies the backlog inside a commit).
    /// Those documents are held in memory outside the hash table, so a bucket caps it at
    /// an eighth of its quota over all shards (`apply_cap`). 0 writes each commit at
    /// once.
    pub apply_after_bytes: u64,
    /// At most how long a shard's flusher lets writes accumulate after the first one that
    /// nobody waits on, so that one flush (one append and fdatasync, one wake-up) carries
    /// many of them. The flush comes due at the next multiple of the delay on the
    /// executor's clock, the same point for every shard, so that one timer wake-up starts
    /// them all (TaskHandle::snooze_aligned; at 50k SETs/s the Writer threads' CPU per
    /// persisted item fell from 1.54 to 1.38 µs, `cargo xtask bench flusher`). A write whose client waits for persistence (a durable write, PersistTo
    /// through OBSERVE or OBSERVE_SEQNO, [`crate::Bucket::when_persisted`]) flushes its
    /// shard at once, so its latency does not include this delay; so does memory pressure
    /// (an item pager cycle starting), since only persisted items can be evicted. Default
    /// 50 ms: one commit carries ~700 items at 50,000 SETs/s (10 ms: ~180; none: a few),
    /// and the Writer threads' CPU per persisted item there is 0.75x that of 10 ms, the
    /// server's CPU per SET 0.83x (`cargo xtask bench flusher`, interleaved rounds). A
    /// write acknowledged without a persist level was never guaranteed to survive a crash;
    /// 50 ms is the window it may still be lost in after its acknowledgement, under
    /// MongoDB's 100 ms journal interval and Redis's one-second `appendfsync everysec`.
    /// Zero flushes as soon as a write comes (KV-Engine's behaviour).
    pub flush_delay: Duration,
    /// Journal bytes past which a shard checkpoints (syncs the data files its applier
    /// wrote and starts the journal over), which also bounds each journal file's size.
    /// Default 32 MiB: half of the storage's own default, so that four shards' journals
    /// take 128 MiB instead of 256 MiB of the data directory (space amplification,
    /// `cargo xtask bench space`); at least 1 MiB.
    pub checkpoint_bytes: u64,
    /// The shards' storage: `Auto` (default) opens what each shard's directory holds and
    /// starts the write-once log in a new one; `Log` or `Files` name one, and a directory
    /// holding the other's files is refused.
    pub storage: StorageBackend,
}

/// The most journaled document bytes a shard lets wait for its applier in a bucket of
/// `quota_bytes` with `shards` shards: all shards together at most an eighth of the
/// quota, and at least 1 MiB each.
pub(crate) fn apply_cap(quota_bytes: u64, shards: u16) -> u64 {
    (quota_bytes / 8 / u64::from(shards.max(1))).max(1 << 20)
}

/// Who flushes a persistent bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlusherMode {
    /// One flusher task per shard on the bucket's Writer threads.
    Tasks,
    /// Nothing flushes until [`crate::Bucket::flush_all`] is called (and at shutdown).
    Manual,
}

impl PersistenceConfig {
    /// Defaults for `data_dir`: 4 shards, journal on, descriptor budget from the rlimit,
    /// 2 writer and 2 reader threads.
    #[must_use]
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            shards: 4,
            journal: JournalMode::On,
            fd_budget: None,
            writer_threads: 2,
            reader_threads: 2,
            flusher: FlusherMode::Tasks,
            compaction_interval: Duration::from_secs(3600),
            compaction_fragmentation_percent: 30,
            compaction_min_file_bytes: 256 << 10,
            compaction_bytes_per_sec: 64 << 20,
            compaction_check_interval: Duration::from_secs(1),
            journal_prealloc_bytes: 0,
            apply_after_bytes: 16 << 20,
            flush_delay: Duration::from_millis(50),
            checkpoint_bytes: 32 << 20,
            storage: StorageBackend::Auto,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_applier_backlog_is_capped_by_the_quota() {
        // 1 GiB, four shards: 32 MiB each, so the 16 MiB default stands.
        assert_eq!(apply_cap(1 << 30, 4), 32 << 20);
        // 100 MiB: 12.5 MiB in all.
        assert_eq!(apply_cap(100 << 20, 4), (100 << 20) / 32);
        // Tiny quotas still batch a little.
        assert_eq!(apply_cap(1 << 20, 4), 1 << 20);
        assert_eq!(apply_cap(64 << 20, 0), 8 << 20);
    }
}
