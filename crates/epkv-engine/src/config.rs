//! [`BucketConfig`]: every setting of a bucket, declared once with its default and unit.

use crate::{Error, Result};
use std::time::Duration;

/// Default memory quota: 1 GiB. The server's `--memory-quota` overrides it; 1 GiB is small
/// enough for a laptop and large enough that a benchmark does not hit TMPFAIL.
pub const DEFAULT_MEMORY_QUOTA_BYTES: u64 = 1024 * 1024 * 1024;
/// Smallest quota [`BucketConfig::validate`] accepts: 1 MiB.
pub const MIN_MEMORY_QUOTA_BYTES: u64 = 1024 * 1024;
/// Default high watermark, percent of the quota (KV-Engine `mem_high_wat_percent` 0.85).
pub const DEFAULT_MEM_HIGH_WAT_PERCENT: u8 = 85;
/// Default low watermark, percent of the quota (KV-Engine `mem_low_wat_percent` 0.75).
pub const DEFAULT_MEM_LOW_WAT_PERCENT: u8 = 75;
/// Default largest value: 20 MiB (KV-Engine `max_item_size`).
pub const DEFAULT_MAX_ITEM_SIZE_BYTES: usize = 20 * 1024 * 1024;
/// Default lock stripes per vBucket hash table.
pub const DEFAULT_HT_LOCKS: usize = 8;
/// Default expiry pager interval: 60 s.
pub const DEFAULT_EXPIRY_PAGER_INTERVAL: Duration = Duration::from_secs(60);
/// Default time between two item pager checks of memory: 5 s (KV-Engine
/// `pager_sleep_time_ms`). Crossing the high watermark wakes the pager at once anyway.
pub const DEFAULT_ITEM_PAGER_INTERVAL: Duration = Duration::from_secs(5);
/// Default time a range scan may stay unused before it is closed: 60 s (KV-Engine's
/// range scan watchdog; 7.6 bounds a scan's whole life at 180 s instead).
pub const DEFAULT_RANGE_SCAN_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default most key bytes one range scan may hold: 64 MiB (about a million keys of 60
/// bytes in one vBucket's collection).
pub const DEFAULT_RANGE_SCAN_MAX_KEY_BYTES: usize = 64 * 1024 * 1024;
/// Default most range scans one owner (a connection) may have open: 1024, one per
/// vBucket.
pub const DEFAULT_RANGE_SCAN_MAX_PER_OWNER: usize = 1024;
/// Default most key bytes the range scans of one owner may hold: 256 MiB.
pub const DEFAULT_RANGE_SCAN_MAX_OWNER_KEY_BYTES: usize = 256 * 1024 * 1024;
/// Default GET_LOCKED timeout: 15 s (KV-Engine `getl_default_timeout`).
pub const DEFAULT_GETL_DEFAULT_TIMEOUT_SECS: u32 = 15;
/// Default longest GET_LOCKED timeout: 30 s (KV-Engine `getl_max_timeout`).
pub const DEFAULT_GETL_MAX_TIMEOUT_SECS: u32 = 30;

/// The configuration of one bucket. Build it with `BucketConfig { field: .., ..Default::default() }`
/// and check it with [`BucketConfig::validate`] ([`crate::Bucket::new`] does so too).
/// No field can change after the bucket is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketConfig {
    /// Bucket name, shown in stats and logs. Default `default`. 1..=100 characters from
    /// `A-Z a-z 0-9 _ . % -` (Couchbase's bucket-name rule).
    pub name: String,
    /// Memory quota in bytes for item memory (the exact allocation sizes of each item; see
    /// `epkv_hashtable::StoredValue::footprint`). Default 1 GiB
    /// ([`DEFAULT_MEMORY_QUOTA_BYTES`]); at least 1 MiB. Reported as `ep_max_size`.
    pub memory_quota_bytes: u64,
    /// High watermark, percent of the quota (1..=100, above the low watermark). Default 85.
    /// When item memory passes it the item pager runs and frees memory down to the low
    /// watermark. Item memory never exceeds the quota: a write that does not fit fails
    /// with TMPFAIL (and wakes the pager). Reported as `ep_mem_high_wat` (bytes).
    pub mem_high_wat_percent: u8,
    /// Low watermark, percent of the quota (0..high). Default 75. Where the item pager
    /// stops. Reported as `ep_mem_low_wat` (bytes).
    pub mem_low_wat_percent: u8,
    /// Time between two item pager checks of memory (it is also woken when memory passes
    /// the high watermark). Default 5 s ([`DEFAULT_ITEM_PAGER_INTERVAL`]);
    /// `Duration::ZERO` leaves only the wake-ups.
    pub item_pager_interval: Duration,
    /// What a memory-only bucket does at its quota (a persistent bucket evicts values
    /// instead). Default [`EphemeralFullPolicy::AutoDelete`].
    pub ephemeral_full_policy: EphemeralFullPolicy,
    /// What the item pager of a persistent bucket takes out of memory. Default
    /// [`EvictionPolicy::Value`]; [`EvictionPolicy::Full`] needs `persistence`.
    pub eviction_policy: EvictionPolicy,
    /// Whether FLUSH is allowed. Default false (as in Couchbase); when false FLUSH answers
    /// NotSupported.
    pub flush_enabled: bool,
    /// The bucket's minimum durability level (Couchbase's `durabilityMinLevel`): every
    /// write the front end receives is made at least this durable (a write asking for
    /// less, or for none, is upgraded; its timeout stays the client's or the default).
    /// Default `None`. A memory-only bucket accepts `Majority` at most.
    pub durability_min_level: Option<epkv_types::DurabilityLevel>,
    /// Abort SyncWrites whose timeout passes (the per-vBucket durability timeout task).
    /// Default true; false tracks no deadlines at all, so a SyncWrite that cannot meet its
    /// level waits for ever: only for the durability benchmark's peer, which measures what
    /// the timeout tracking costs.
    pub sync_write_timeouts: bool,
    /// Largest value in bytes a document may have, also after APPEND/PREPEND. Default
    /// 20 MiB ([`DEFAULT_MAX_ITEM_SIZE_BYTES`]); must be at least 1. Larger → TooBig.
    pub max_item_size_bytes: usize,
    /// Number of vBuckets. Default 1024 (`epkv_types::NUM_VBUCKETS`); 1..=1024. Keys map
    /// to vBuckets with `epkv_types::vbucket_for_key(key, num_vbuckets)`.
    pub num_vbuckets: u16,
    /// Lock stripes in each vBucket's hash table. Default 8 ([`DEFAULT_HT_LOCKS`]);
    /// 1..=1024. KV-Engine uses 47 per vBucket; with 1024 vBuckets already spreading keys,
    /// 8 keeps contention negligible at 1 MiB of stripe memory per bucket.
    pub ht_locks: usize,
    /// Time between two runs of the background expiry pager. Default 60 s
    /// ([`DEFAULT_EXPIRY_PAGER_INTERVAL`]; KV-Engine's `exp_pager_stime` is 600 s, but
    /// with no disk to reclaim a shorter period frees memory sooner at little cost).
    /// `Duration::ZERO` disables the pager thread; expired items then vanish only on
    /// access or through [`crate::Bucket::run_expiry_pass`].
    pub expiry_pager_interval: Duration,
    /// GET_LOCKED timeout in seconds used when the request asks for 0 or for more than
    /// `getl_max_timeout_secs`. Default 15; 1..=`getl_max_timeout_secs`.
    pub getl_default_timeout_secs: u32,
    /// Longest GET_LOCKED timeout in seconds a request may ask for. Default 30; at least
    /// `getl_default_timeout_secs`.
    pub getl_max_timeout_secs: u32,
    /// Time a range scan may stay unused (no create or continue) before the reaper closes
    /// it; a continue then answers KeyNotFound. Default 60 s
    /// ([`DEFAULT_RANGE_SCAN_IDLE_TIMEOUT`]); must not be zero.
    pub range_scan_idle_timeout: Duration,
    /// Most bytes of keys (plus 4 per key) one range scan may hold; a create past it
    /// answers TooBusy. Default 64 MiB ([`DEFAULT_RANGE_SCAN_MAX_KEY_BYTES`]).
    pub range_scan_max_key_bytes: usize,
    /// Most range scans one owner (a connection) may have open; a create past it answers
    /// TooBusy. Default 1024 ([`DEFAULT_RANGE_SCAN_MAX_PER_OWNER`]); at least 1.
    pub range_scan_max_per_owner: usize,
    /// Most key bytes the open range scans of one owner may hold together; a create past
    /// it answers TooBusy. Default 256 MiB ([`DEFAULT_RANGE_SCAN_MAX_OWNER_KEY_BYTES`]).
    pub range_scan_max_owner_key_bytes: usize,
    /// Where and how the bucket persists; `None` (the default) keeps it in memory only.
    pub persistence: Option<crate::PersistenceConfig>,
}

impl Default for BucketConfig {
    fn default() -> Self {
        Self {
            name: "default".to_owned(),
            memory_quota_bytes: DEFAULT_MEMORY_QUOTA_BYTES,
            mem_high_wat_percent: DEFAULT_MEM_HIGH_WAT_PERCENT,
            mem_low_wat_percent: DEFAULT_MEM_LOW_WAT_PERCENT,
            item_pager_interval: DEFAULT_ITEM_PAGER_INTERVAL,
            ephemeral_full_policy: EphemeralFullPolicy::AutoDelete,
            eviction_policy: EvictionPolicy::Value,
            flush_enabled: false,
            durability_min_level: None,
            sync_write_timeouts: true,
            max_item_size_bytes: DEFAULT_MAX_ITEM_SIZE_BYTES,
            num_vbuckets: epkv_types::NUM_VBUCKETS,
            ht_locks: DEFAULT_HT_LOCKS,
            expiry_pager_interval: DEFAULT_EXPIRY_PAGER_INTERVAL,
            getl_default_timeout_secs: DEFAULT_GETL_DEFAULT_TIMEOUT_SECS,
            getl_max_timeout_secs: DEFAULT_GETL_MAX_TIMEOUT_SECS,
            range_scan_idle_timeout: DEFAULT_RANGE_SCAN_IDLE_TIMEOUT,
            range_scan_max_key_bytes: DEFAULT_RANGE_SCAN_MAX_KEY_BYTES,
            range_scan_max_per_owner: DEFAULT_RANGE_SCAN_MAX_PER_OWNER,
            range_scan_max_owner_key_bytes: DEFAULT_RANGE_SCAN_MAX_OWNER_KEY_BYTES,
            persistence: None,
        }
    }
}

/// What a memory-only bucket does when its memory passes the high watermark (Couchbase's
/// ephemeral bucket setting `ephemeral_full_policy`): nothing it holds can be read back
/// from disk, so it either deletes or refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EphemeralFullPolicy {
    /// The item pager deletes the least used documents (by MFU counter) down to the low
    /// watermark, each deletion with its own seqno like any delete (`auto_delete`).
    #[default]
    AutoDelete,
    /// Nothing is deleted: writes that do not fit answer ENOMEM (`fail_new_data`).
    FailNewData,
}

impl EphemeralFullPolicy {
    /// The name used in settings and stats (`auto_delete`, `fail_new_data`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AutoDelete => "auto_delete",
            Self::FailNewData => "fail_new_data",
        }
    }
}

/// What the item pager of a persistent bucket evicts (Couchbase's `eviction_policy`,
/// KV-Engine's `item_eviction_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EvictionPolicy {
    /// Values only: every document's key and metadata stay in memory, so a missing key
    /// is known absent without a disk read (`value_only`).
    #[default]
    Value,
    /// Whole documents: memory holds only what was used recently, and a key that is not
    /// in memory is looked up on disk unless the vBucket's bloom filter says it is
    /// certainly absent (`full_eviction`).
    Full,
}

impl EvictionPolicy {
    /// The name used in stats (`value_only`, `full_eviction`, as KV-Engine's
    /// `ep_item_eviction_policy`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Value => "value_only",
            Self::Full => "full_eviction",
        }
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidConfig {
        field,
        reason: reason.into(),
    }
}

impl BucketConfig {
    /// Checks every field against its documented range.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first field out of range.
    pub fn validate(&self) -> Result<()> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 100
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'%' | b'-'));
        if !name_ok {
            return Err(invalid(
                "name",
                "must be 1..=100 characters from A-Z a-z 0-9 _ . % -",
            ));
        }
        if self.memory_quota_bytes < MIN_MEMORY_QUOTA_BYTES {
            return Err(invalid(
                "memory_quota_bytes",
                format!("must be at least {MIN_MEMORY_QUOTA_BYTES}"),
            ));
        }
        if !(1..=100).contains(&self.mem_high_wat_percent) {
            return Err(invalid("mem_high_wat_percent", "must be 1..=100"));
        }
        if self.mem_low_wat_percent >= self.mem_high_wat_percent {
            return Err(invalid(
                "mem_low_wat_percent",
                "must be below mem_high_wat_percent",
            ));
        }
        if self.max_item_size_bytes == 0 {
            return Err(invalid("max_item_size_bytes", "must be at least 1"));
        }
        if !(1..=epkv_types::NUM_VBUCKETS).contains(&self.num_vbuckets) {
            return Err(invalid("num_vbuckets", "must be 1..=1024"));
        }
        if !(1..=1024).contains(&self.ht_locks) {
            return Err(invalid("ht_locks", "must be 1..=1024"));
        }
        if self.range_scan_idle_timeout.is_zero() {
            return Err(invalid("range_scan_idle_timeout", "must not be zero"));
        }
        if self.range_scan_max_per_owner == 0 {
            return Err(invalid("range_scan_max_per_owner", "must be at least 1"));
        }
        if self.eviction_policy == EvictionPolicy::Full && self.persistence.is_none() {
            return Err(invalid(
                "eviction_policy",
                "full eviction needs persistence (a memory-only bucket cannot read documents back)",
            ));
        }
        if self.persistence.is_none()
            && self
                .durability_min_level
                .is_some_and(|l| l != epkv_types::DurabilityLevel::Majority)
        {
            return Err(invalid(
                "durability_min_level",
                "a memory-only bucket cannot persist: none or majority only",
            ));
        }
        if let Some(p) = &self.persistence {
            if !(1..=64).contains(&p.shards) {
                return Err(invalid("persistence.shards", "must be 1..=64"));
            }
            if !(1..=16).contains(&p.writer_threads) {
                return Err(invalid("persistence.writer_threads", "must be 1..=16"));
            }
            if !(1..=16).contains(&p.reader_threads) {
                return Err(invalid("persistence.reader_threads", "must be 1..=16"));
            }
            if p.compaction_fragmentation_percent > 100 {
                return Err(invalid(
                    "persistence.compaction_fragmentation_percent",
                    "must be 0..=100 (0 turns the fragmentation compactor off)",
                ));
            }
            if p.flush_delay > std::time::Duration::from_secs(10) {
                return Err(invalid(
                    "persistence.flush_delay",
                    "must be at most 10 s (0 flushes as soon as a write comes)",
                ));
            }
            if p.checkpoint_bytes < 1 << 20 {
                return Err(invalid(
                    "persistence.checkpoint_bytes",
                    "must be at least 1 MiB",
                ));
            }
            if p.compaction_check_interval.is_zero() {
                return Err(invalid(
                    "persistence.compaction_check_interval",
                    "must be above zero",
                ));
            }
        }
        if self.getl_default_timeout_secs == 0 {
            return Err(invalid("getl_default_timeout_secs", "must be at least 1"));
        }
        if self.getl_max_timeout_secs < self.getl_default_timeout_secs {
            return Err(invalid(
                "getl_max_timeout_secs",
                "must be at least getl_default_timeout_secs",
            ));
        }
        Ok(())
    }

    /// Returns the quota in bytes as a `usize` (saturating on 32-bit targets).
    #[must_use]
    pub fn quota_bytes(&self) -> usize {
        usize::try_from(self.memory_quota_bytes).unwrap_or(usize::MAX)
    }

    /// Returns the high watermark in bytes: where the item pager starts.
    #[must_use]
    pub fn high_wat_bytes(&self) -> usize {
        percent_of(self.quota_bytes(), self.mem_high_wat_percent)
    }

    /// Returns the low watermark in bytes.
    #[must_use]
    pub fn low_wat_bytes(&self) -> usize {
        percent_of(self.quota_bytes(), self.mem_low_wat_percent)
    }
}

fn percent_of(bytes: usize, percent: u8) -> usize {
    // Divide first so the product cannot overflow; the error is below 100 bytes.
    (bytes / 100).saturating_mul(usize::from(percent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        BucketConfig::default().validate().unwrap();
    }

    #[test]
    fn a_memory_only_bucket_takes_a_minimum_durability_of_majority_at_most() {
        use epkv_types::DurabilityLevel as L;
        let memory_only = |level| BucketConfig {
            durability_min_level: Some(level),
            ..BucketConfig::default()
        };
        memory_only(L::Majority).validate().unwrap();
        for level in [L::MajorityAndPersistOnMaster, L::PersistToMajority] {
            assert!(memory_only(level).validate().is_err(), "{level:?}");
            BucketConfig {
                persistence: Some(crate::PersistenceConfig::new("/nonexistent")),
                ..memory_only(level)
            }
            .validate()
            .unwrap();
        }
    }

    #[test]
    fn watermarks_are_percentages_of_the_quota() {
        let c = BucketConfig {
            memory_quota_bytes: 100 * 1024 * 1024,
            ..BucketConfig::default()
        };
        assert_eq!(c.high_wat_bytes(), 85 * 1024 * 1024);
        assert_eq!(c.low_wat_bytes(), 75 * 1024 * 1024);
        assert!(c.high_wat_bytes() <= c.quota_bytes());
    }

    fn field_of(c: BucketConfig) -> &'static str {
        match c.validate() {
            Err(Error::InvalidConfig { field, .. }) => field,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn each_bad_field_is_named() {
        let d = BucketConfig::default;
        assert_eq!(
            field_of(BucketConfig {
                name: String::new(),
                ..d()
            }),
            "name"
        );
        assert_eq!(
            field_of(BucketConfig {
                name: "a b".into(),
                ..d()
            }),
            "name"
        );
        assert_eq!(
            field_of(BucketConfig {
                memory_quota_bytes: 1000,
                ..d()
            }),
            "memory_quota_bytes"
        );
        assert_eq!(
            field_of(BucketConfig {
                mem_high_wat_percent: 101,
                ..d()
            }),
            "mem_high_wat_percent"
        );
        assert_eq!(
            field_of(BucketConfig {
                mem_low_wat_percent: 85,
                ..d()
            }),
            "mem_low_wat_percent"
        );
        assert_eq!(
            field_of(BucketConfig {
                max_item_size_bytes: 0,
                ..d()
            }),
            "max_item_size_bytes"
        );
        assert_eq!(
            field_of(BucketConfig {
                num_vbuckets: 0,
                ..d()
            }),
            "num_vbuckets"
        );
        assert_eq!(
            field_of(BucketConfig {
                num_vbuckets: 1025,
                ..d()
            }),
            "num_vbuckets"
        );
        assert_eq!(field_of(BucketConfig { ht_locks: 0, ..d() }), "ht_locks");
        assert_eq!(
            field_of(BucketConfig {
                getl_default_timeout_secs: 0,
                ..d()
            }),
            "getl_default_timeout_secs"
        );
        assert_eq!(
            field_of(BucketConfig {
                getl_max_timeout_secs: 10,
                ..d()
            }),
            "getl_max_timeout_secs"
        );
    }
}
