//! The bucket's statistics: one table naming every stat the engine emits ([`STATS`]),
//! and the sharded event counters behind the counting ones.
//!
//! Counters are sharded: each thread adds to its own cache-line-aligned shard (picked
//! round-robin the first time the thread counts), so the GET path never writes a cache
//! line another core is writing. Reading a counter sums the shards.

use std::sync::atomic::{AtomicU64, Ordering};

/// The STAT group a stat belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatGroup {
    /// The default group (`STAT` with no key).
    Default,
    /// `STAT memory`.
    Memory,
    /// `STAT persistence`: the flusher's and the storage's totals (only
    /// `ep_persistence_enabled` for a memory-only bucket).
    Persistence,
}

/// The unit of a stat's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatUnit {
    /// A number of events since the bucket started.
    Count,
    /// A current number of things (items, vBuckets).
    Items,
    /// Bytes.
    Bytes,
    /// A number of bytes since the bucket started (a counter of bytes).
    ByteCount,
    /// Seconds.
    Seconds,
    /// Microseconds.
    Micros,
    /// A number of microseconds since the bucket started (a counter of time).
    MicrosCount,
    /// A percentage (0-100).
    Percent,
    /// `true` or `false`.
    Flag,
    /// Text.
    Text,
}

/// One stat the engine emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatDefinition {
    /// The stat key as emitted.
    pub name: &'static str,
    /// The group that emits it.
    pub group: StatGroup,
    /// Its unit.
    pub unit: StatUnit,
    /// What it means.
    pub description: &'static str,
}

macro_rules! counters {
    ($($variant:ident => $name:literal, $desc:literal;)*) => {
        /// An event counter (one per counting stat of the default group).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub(crate) enum Counter { $($variant),* }

        impl Counter {
            /// Every counter, in declaration order.
            pub(crate) const ALL: &'static [Counter] = &[$(Counter::$variant),*];

            /// The stat key of this counter.
            pub(crate) fn name(self) -> &'static str {
                match self { $(Counter::$variant => $name),* }
            }
        }

        const COUNTER_DEFS: &[StatDefinition] = &[$(StatDefinition {
            name: $name,
            group: StatGroup::Default,
            unit: StatUnit::Count,
            description: $desc,
        }),*];
    };
}

counters! {
    CmdGet => "cmd_get", "GET, GETK, GAT and their quiet variants received";
    GetHits => "get_hits", "reads that found a live document";
    GetMisses => "get_misses", "reads that found no live document";
    CmdSet => "cmd_set", "SET, ADD, REPLACE, APPEND and PREPEND received";
    DeleteHits => "delete_hits", "DELETEs that removed a document";
    DeleteMisses => "delete_misses", "DELETEs of a missing key";
    IncrHits => "incr_hits", "INCREMENTs that updated or created a counter";
    IncrMisses => "incr_misses", "INCREMENTs of a missing key that may not create it";
    DecrHits => "decr_hits", "DECREMENTs that updated or created a counter";
    DecrMisses => "decr_misses", "DECREMENTs of a missing key that may not create it";
    CasHits => "cas_hits", "CAS-conditional mutations that succeeded";
    CasMisses => "cas_misses", "CAS-conditional mutations of a missing key";
    CasBadval => "cas_badval", "CAS-conditional mutations whose CAS did not match";
    TouchHits => "touch_hits", "TOUCH and GAT that found a live document";
    TouchMisses => "touch_misses", "TOUCH and GAT of a missing key";
    LockHits => "getl_hits", "GET_LOCKED that locked a document";
    LockMisses => "getl_misses", "GET_LOCKED of a missing key";
    ExpiredAccess => "ep_expired_access", "expired documents removed when accessed";
    ExpiredPager => "ep_expired_pager", "expired documents removed by the expiry pager";
    ExpiryPagerRuns => "ep_num_expiry_pager_runs", "completed expiry pager passes";
    TmpOomErrors => "ep_tmp_oom_errors", "writes refused with TMPFAIL for lack of memory (the item pager was woken to make room)";
    OomErrors => "ep_oom_errors", "writes refused with ENOMEM: a memory-only bucket at its quota with ephemeral_full_policy fail_new_data";
    TooBig => "ep_item_too_big", "writes refused because the value was too large";
    BgFetched => "ep_bg_fetched", "values of non-resident documents read back from disk by background fetches";
    BgMetaFetched => "ep_bg_meta_fetched", "documents whose metadata only was read back from disk (full eviction: an operation needed to know whether the key exists)";
    BloomNegatives => "ep_bloom_filter_negatives", "lookups of a key not in memory that its vBucket's key filter answered as certainly absent, with no disk read (full eviction)";
    BloomFalsePositives => "ep_bloom_filter_false_positives", "disk lookups of a key the key filter may have contained that found no live document (full eviction)";
    ReplicaItems => "ep_dcp_replica_items_received", "changes (mutations, deletions, prepares, commits, aborts, system events) replication applied to this node's replica vBuckets";
    BloomRebuilds => "ep_bloom_filter_rebuilds", "key filters rebuilt at the size of their vBucket (after compaction, or when a filter held twice the keys it was sized for)";
    ValueEjects => "ep_num_value_ejects", "documents the item pager took out of memory: values (value eviction: the key and metadata stay) or whole documents (full eviction), read back from disk when needed";
    PagerRuns => "ep_num_pager_runs", "item pager cycles started (memory above the high watermark, or a wake)";
    PagerVisited => "ep_pager_items_visited", "items the item pager has visited";
    SyncWriteAccepted => "vb_active_sync_write_accepted_count", "SyncWrites (durable writes) accepted as prepares";
    SyncWriteCommitted => "vb_active_sync_write_committed_count", "SyncWrites committed (their durability level was met)";
    SyncWriteAborted => "vb_active_sync_write_aborted_count", "SyncWrites aborted: their timeout passed before their durability level was met (the client got SyncWriteAmbiguous)";
    PagerDeletes => "ep_pager_auto_deletes", "documents deleted by the item pager of a memory-only bucket (ephemeral_full_policy auto_delete)";
}

/// Every stat of the default, `memory` and `persistence` groups, counters first. The
/// `vbucket` and `vbucket-details` groups emit per-vBucket keys (`vb_N`,
/// `vb_N:high_seqno`, ...) and `kvstore` per-shard keys (`rw_N:...`, whose totals are in
/// `persistence`); they are described in the crate docs instead.
pub static STATS: std::sync::LazyLock<Vec<StatDefinition>> = std::sync::LazyLock::new(|| {
    COUNTER_DEFS
        .iter()
        .chain(GAUGE_DEFS)
        .chain(PERSISTENCE_DEFS)
        .copied()
        .collect()
});

/// The `persistence` group, in emission order.
const PERSISTENCE_DEFS: &[StatDefinition] = &[
    gauge(
        "ep_persistence_enabled",
        StatGroup::Persistence,
        StatUnit::Flag,
        "`true` for a persistent bucket, `false` for a memory-only one",
    ),
    gauge(
        "ep_persistence_shards",
        StatGroup::Persistence,
        StatUnit::Items,
        "shards of the bucket, each with its journal, flusher and applier",
    ),
    gauge(
        "ep_persistence_journal",
        StatGroup::Persistence,
        StatUnit::Text,
        "journal mode: `on` (one journal sync per flush batch) or `off` (a sync per data file)",
    ),
    gauge(
        "ep_persistence_storage",
        StatGroup::Persistence,
        StatUnit::Text,
        "storage backend: `log` (the write-once log) or `files` (per-vBucket data files behind a journal)",
    ),
    gauge(
        "ep_queue_size",
        StatGroup::Persistence,
        StatUnit::Items,
        "documents waiting for the flusher",
    ),
    gauge(
        "ep_persistence_waiters",
        StatGroup::Persistence,
        StatUnit::Items,
        "requests waiting until their seqno is persisted (durable writes, OBSERVE_SEQNO waits)",
    ),
    gauge(
        "ep_flusher_commits",
        StatGroup::Persistence,
        StatUnit::Count,
        "flush batches the flushers committed",
    ),
    gauge(
        "ep_item_commit_failed",
        StatGroup::Persistence,
        StatUnit::Count,
        "flush batches that failed to commit (storage errors)",
    ),
    gauge(
        "ep_total_persisted",
        StatGroup::Persistence,
        StatUnit::Count,
        "documents and deletions written to disk",
    ),
    gauge(
        "ep_commit_num",
        StatGroup::Persistence,
        StatUnit::Count,
        "storage commits (batches made durable)",
    ),
    gauge(
        "ep_fsync_num",
        StatGroup::Persistence,
        StatUnit::Count,
        "fsync/fdatasync calls by the storage",
    ),
    gauge(
        "ep_io_bytes_written",
        StatGroup::Persistence,
        StatUnit::ByteCount,
        "bytes written to data files",
    ),
    gauge(
        "ep_journal_bytes",
        StatGroup::Persistence,
        StatUnit::ByteCount,
        "bytes appended to the shards' journals",
    ),
    gauge(
        "ep_journal_checkpoints",
        StatGroup::Persistence,
        StatUnit::Count,
        "journal checkpoints (data files synced, journal truncated)",
    ),
    gauge(
        "ep_open_files",
        StatGroup::Persistence,
        StatUnit::Items,
        "data files open now",
    ),
    gauge(
        "ep_file_opens",
        StatGroup::Persistence,
        StatUnit::Count,
        "data file opens (reopens after the file-descriptor budget closed one included)",
    ),
    gauge(
        "ep_compactions",
        StatGroup::Persistence,
        StatUnit::Count,
        "vBucket file compactions (by the interval compactor, the fragmentation compactor and on request)",
    ),
    gauge(
        "ep_fragmentation_compactions",
        StatGroup::Persistence,
        StatUnit::Count,
        "vBucket file compactions started because the file's fragmentation passed the threshold",
    ),
    gauge(
        "ep_compaction_bytes_reclaimed",
        StatGroup::Persistence,
        StatUnit::ByteCount,
        "disk bytes compactions gave back (old file size minus new, summed)",
    ),
    gauge(
        "ep_compaction_cpu_time",
        StatGroup::Persistence,
        StatUnit::MicrosCount,
        "CPU time the compaction threads took (file compactions and log cleaning; 0 where the OS does not report a thread's CPU time)",
    ),
    gauge(
        "ep_storage_index_bytes",
        StatGroup::Persistence,
        StatUnit::Bytes,
        "memory of the write-once log's in-memory key index (about 100 bytes per stored key; outside the bucket's quota; 0 with the files backend)",
    ),
    gauge(
        "ep_db_file_size",
        StatGroup::Persistence,
        StatUnit::Bytes,
        "bytes of the vBucket data files (journals not included)",
    ),
    gauge(
        "ep_db_data_size",
        StatGroup::Persistence,
        StatUnit::Bytes,
        "live bytes of the vBucket data files: what compacting them all would keep",
    ),
    gauge(
        "ep_db_fragmentation",
        StatGroup::Persistence,
        StatUnit::Percent,
        "garbage share of the vBucket data files, 1 - live / file size, in percent",
    ),
    gauge(
        "ep_disk_full",
        StatGroup::Persistence,
        StatUnit::Flag,
        "`true` while the last flush failed for lack of disk space",
    ),
    gauge(
        "ep_warmup_value_count",
        StatGroup::Persistence,
        StatUnit::Count,
        "documents warmup loaded with their values",
    ),
    gauge(
        "ep_warmup_unclean_shutdown",
        StatGroup::Persistence,
        StatUnit::Flag,
        "`true` when warmup found that the previous run did not shut down cleanly",
    ),
];

const fn gauge(
    name: &'static str,
    group: StatGroup,
    unit: StatUnit,
    description: &'static str,
) -> StatDefinition {
    StatDefinition {
        name,
        group,
        unit,
        description,
    }
}

const GAUGE_DEFS: &[StatDefinition] = &[
    gauge(
        "ep_range_scans_open",
        StatGroup::Default,
        StatUnit::Count,
        "range scans open (created, not yet completed, cancelled or expired)",
    ),
    gauge(
        "ep_range_scans_key_bytes",
        StatGroup::Default,
        StatUnit::Bytes,
        "bytes of keys the open range scans hold",
    ),
    gauge(
        "ep_bucket_name",
        StatGroup::Default,
        StatUnit::Text,
        "the bucket's name",
    ),
    gauge(
        "ep_bucket_type",
        StatGroup::Default,
        StatUnit::Text,
        "`ephemeral`: items live in memory only",
    ),
    gauge(
        "curr_items",
        StatGroup::Default,
        StatUnit::Items,
        "live documents in active vBuckets",
    ),
    gauge(
        "curr_items_tot",
        StatGroup::Default,
        StatUnit::Items,
        "live documents in all vBuckets",
    ),
    gauge(
        "vb_active_curr_items",
        StatGroup::Default,
        StatUnit::Items,
        "live documents in active vBuckets",
    ),
    gauge(
        "vb_replica_curr_items",
        StatGroup::Default,
        StatUnit::Items,
        "live documents in replica vBuckets",
    ),
    gauge(
        "vb_pending_curr_items",
        StatGroup::Default,
        StatUnit::Items,
        "live documents in pending vBuckets",
    ),
    gauge(
        "vb_active_num",
        StatGroup::Default,
        StatUnit::Items,
        "vBuckets in state active",
    ),
    gauge(
        "vb_replica_num",
        StatGroup::Default,
        StatUnit::Items,
        "vBuckets in state replica",
    ),
    gauge(
        "vb_pending_num",
        StatGroup::Default,
        StatUnit::Items,
        "vBuckets in state pending",
    ),
    gauge(
        "vb_dead_num",
        StatGroup::Default,
        StatUnit::Items,
        "vBuckets in state dead",
    ),
    gauge(
        "ep_max_vbuckets",
        StatGroup::Default,
        StatUnit::Items,
        "number of vBuckets of the bucket",
    ),
    gauge(
        "ep_max_size",
        StatGroup::Default,
        StatUnit::Bytes,
        "memory quota",
    ),
    gauge(
        "mem_used",
        StatGroup::Default,
        StatUnit::Bytes,
        "item memory in use (key + value + per-item overhead)",
    ),
    gauge(
        "ep_mem_high_wat",
        StatGroup::Default,
        StatUnit::Bytes,
        "high watermark: past it the item pager frees memory",
    ),
    gauge(
        "ep_mem_low_wat",
        StatGroup::Default,
        StatUnit::Bytes,
        "low watermark: where the item pager stops",
    ),
    gauge(
        "ep_num_non_resident",
        StatGroup::Default,
        StatUnit::Items,
        "live documents whose value is not in memory (ejected, or loaded by warmup as key and metadata only; with full eviction also those wholly out of memory)",
    ),
    gauge(
        "vb_active_perc_mem_resident",
        StatGroup::Default,
        StatUnit::Percent,
        "percentage of active vBuckets' live documents whose value is in memory (100 when empty)",
    ),
    gauge(
        "ep_item_pager_interval",
        StatGroup::Default,
        StatUnit::Seconds,
        "seconds between item pager checks of memory (it is also woken at the high watermark)",
    ),
    gauge(
        "ep_item_eviction_policy",
        StatGroup::Default,
        StatUnit::Text,
        "what the item pager of a persistent bucket evicts: value_only or full_eviction",
    ),
    gauge(
        "ep_ephemeral_full_policy",
        StatGroup::Default,
        StatUnit::Text,
        "what a memory-only bucket does at its quota: auto_delete or fail_new_data",
    ),
    gauge(
        "ep_bg_num_samples",
        StatGroup::Default,
        StatUnit::Count,
        "background fetches timed (ep_bg_wait_* and ep_bg_load_* summarise them)",
    ),
    gauge(
        "ep_bg_wait_avg",
        StatGroup::Default,
        StatUnit::Micros,
        "background fetches: mean time from queueing to the start of the disk read",
    ),
    gauge(
        "ep_bg_wait_p99",
        StatGroup::Default,
        StatUnit::Micros,
        "background fetches: 99th percentile of the wait before the disk read",
    ),
    gauge(
        "ep_bg_max_wait",
        StatGroup::Default,
        StatUnit::Micros,
        "background fetches: longest wait before the disk read",
    ),
    gauge(
        "ep_bg_load_avg",
        StatGroup::Default,
        StatUnit::Micros,
        "background fetches: mean time of the disk read and restore",
    ),
    gauge(
        "ep_bg_load_p99",
        StatGroup::Default,
        StatUnit::Micros,
        "background fetches: 99th percentile of the disk read and restore",
    ),
    gauge(
        "ep_bg_max_load",
        StatGroup::Default,
        StatUnit::Micros,
        "background fetches: longest disk read and restore",
    ),
    gauge(
        "ep_max_item_size",
        StatGroup::Default,
        StatUnit::Bytes,
        "largest value a document may have",
    ),
    gauge(
        "ep_flushall_enabled",
        StatGroup::Default,
        StatUnit::Flag,
        "`true` when FLUSH is allowed",
    ),
    gauge(
        "ep_exp_pager_stime",
        StatGroup::Default,
        StatUnit::Seconds,
        "seconds between expiry pager runs (0 = pager disabled)",
    ),
    gauge(
        "mem_used",
        StatGroup::Memory,
        StatUnit::Bytes,
        "item memory in use (key + value + per-item overhead)",
    ),
    gauge(
        "ep_kv_size",
        StatGroup::Memory,
        StatUnit::Bytes,
        "memory charged by keys, values and metadata (equal to mem_used for now)",
    ),
    gauge(
        "ep_max_size",
        StatGroup::Memory,
        StatUnit::Bytes,
        "memory quota",
    ),
    gauge(
        "ep_mem_high_wat",
        StatGroup::Memory,
        StatUnit::Bytes,
        "high watermark",
    ),
    gauge(
        "ep_mem_low_wat",
        StatGroup::Memory,
        StatUnit::Bytes,
        "low watermark",
    ),
    gauge(
        "ep_mem_high_wat_percent",
        StatGroup::Memory,
        StatUnit::Items,
        "high watermark as a percentage of the quota",
    ),
    gauge(
        "ep_mem_low_wat_percent",
        StatGroup::Memory,
        StatUnit::Items,
        "low watermark as a percentage of the quota",
    ),
    gauge(
        "ep_item_overhead_bytes",
        StatGroup::Memory,
        StatUnit::Bytes,
        "fixed bytes charged per item on top of key and value",
    ),
    gauge(
        "ep_tmp_oom_errors",
        StatGroup::Memory,
        StatUnit::Count,
        "writes refused with TMPFAIL for lack of memory",
    ),
];

/// Number of counter shards: enough that the front end's worker threads rarely share one.
const SHARDS: usize = 16;

/// One shard of every counter, alone on its cache lines.
#[repr(align(128))]
struct Shard {
    counts: [AtomicU64; Counter::ALL.len()],
}

/// Sharded event counters.
pub(crate) struct Counters {
    shards: Box<[Shard]>,
}

impl Counters {
    /// Creates zeroed counters.
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| Shard {
                    counts: std::array::from_fn(|_| AtomicU64::new(0)),
                })
                .collect(),
        }
    }

    /// Adds `n` to `c`.
    pub(crate) fn add(&self, c: Counter, n: u64) {
        self.shards[epkv_types::thread_shard(SHARDS)].counts[c as usize]
            .fetch_add(n, Ordering::Relaxed);
    }

    /// Adds one to `c`.
    pub(crate) fn incr(&self, c: Counter) {
        self.add(c, 1);
    }

    /// Returns the sum of `c` over all shards.
    pub(crate) fn get(&self, c: Counter) -> u64 {
        self.shards
            .iter()
            .map(|s| s.counts[c as usize].load(Ordering::Relaxed))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn counters_sum_across_threads() {
        let c = std::sync::Arc::new(Counters::new());
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        c.incr(Counter::GetHits);
                    }
                    c.add(Counter::CmdSet, 5);
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(c.get(Counter::GetHits), 4000);
        assert_eq!(c.get(Counter::CmdSet), 20);
        assert_eq!(c.get(Counter::GetMisses), 0);
    }

    #[test]
    fn stat_names_are_unique_within_a_group_and_snake_case() {
        let mut seen = HashSet::new();
        for d in STATS.iter() {
            assert!(
                seen.insert((d.name, d.group as u8)),
                "duplicate stat {}",
                d.name
            );
            assert!(
                d.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            );
            assert!(!d.description.is_empty());
        }
        for c in Counter::ALL {
            assert!(STATS.iter().any(|d| d.name == c.name()));
        }
    }
}
