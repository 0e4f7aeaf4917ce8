//! Shared helpers for the engine's integration tests: a bucket on a manual clock and
//! `must_*` request helpers that panic on failure.
#![allow(
    dead_code,
    reason = "each test binary uses a different subset of the helpers"
)]
#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions may panic"
)]

use epkv_engine::{Bucket, BucketConfig, EngineClock};
use epkv_engine_api::{
    ArithmeticOp, ArithmeticRequest, DurabilityRequirements, Engine, EngineResult, Expiry, Item,
    MutationInfo, RemoveRequest, StoreOp, StoreRequest,
};
use epkv_executor::ManualClock;
use epkv_types::{Cas, Datatype, NUM_VBUCKETS, Vbid, vbucket_for_key};
use std::sync::Arc;
use std::time::Duration;

/// Wall-clock start of every manual clock: 2023-11-14T22:13:20Z.
pub(crate) const START_UNIX_SECS: u64 = 1_700_000_000;

/// The default configuration without the background pager thread, so that no pass can
/// run in the middle of a test however slow the machine; tests run passes themselves.
pub(crate) fn test_config() -> BucketConfig {
    BucketConfig {
        expiry_pager_interval: Duration::ZERO,
        ..BucketConfig::default()
    }
}

pub(crate) struct Fixture {
    pub(crate) bucket: Arc<Bucket>,
    pub(crate) clock: Arc<ManualClock>,
}

impl Fixture {
    pub(crate) fn new() -> Self {
        Self::with_config(test_config())
    }

    /// A bucket with `config` on a manual clock.
    pub(crate) fn with_config(config: BucketConfig) -> Self {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(START_UNIX_SECS)));
        let bucket = Bucket::new(config, EngineClock::Custom(clock.clone())).unwrap();
        Self { bucket, clock }
    }

    /// A bucket persisting to `dir` ([`manual_flush`]) on a manual clock, warmed up.
    pub(crate) fn manual_flush(dir: &std::path::Path) -> Self {
        let fx = Self::with_config(BucketConfig {
            persistence: Some(manual_flush(dir)),
            ..test_config()
        });
        assert!(
            fx.bucket.wait_warmup(Duration::from_secs(60)),
            "warmup finishes"
        );
        fx
    }

    pub(crate) fn advance(&self, secs: u64) {
        self.clock.advance(Duration::from_secs(secs));
    }

    pub(crate) fn now_secs(&self) -> u32 {
        use epkv_executor::Clock;
        u32::try_from(self.clock.unix_time().as_secs()).unwrap()
    }

    pub(crate) fn stat(&self, group: &str, name: &str) -> String {
        let mut found = None;
        self.bucket
            .stats(group, &mut |k, v| {
                if k == name {
                    found = Some(v.to_owned());
                }
            })
            .unwrap();
        found.unwrap_or_else(|| panic!("stat {name} missing from group {group:?}"))
    }

    pub(crate) fn stat_u64(&self, name: &str) -> u64 {
        self.stat("", name).parse().unwrap()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.bucket.shutdown();
    }
}

/// Persistence in `dir` (two shards) whose flusher runs only when the test calls
/// `flush_all`.
pub(crate) fn manual_flush(dir: &std::path::Path) -> epkv_engine::PersistenceConfig {
    let mut p = epkv_engine::PersistenceConfig::new(dir);
    p.flusher = epkv_engine::FlusherMode::Manual;
    p.shards = 2;
    p
}

/// A bucket on the system clock persisting to `dir` ([`manual_flush`]), FLUSH enabled,
/// warmed up.
pub(crate) fn open_manual_flush(dir: &std::path::Path) -> Arc<Bucket> {
    let b = Bucket::new(
        BucketConfig {
            flush_enabled: true,
            persistence: Some(manual_flush(dir)),
            ..test_config()
        },
        EngineClock::System,
    )
    .unwrap();
    assert!(b.wait_warmup(Duration::from_secs(60)), "warmup finishes");
    b
}

pub(crate) fn vb(key: &[u8]) -> Vbid {
    vbucket_for_key(key, NUM_VBUCKETS)
}

pub(crate) fn store_req<'a>(op: StoreOp, key: &'a str, value: &'a str) -> StoreRequest<'a> {
    let key = key.as_bytes();
    StoreRequest {
        op,
        vbid: vb(key),
        key,
        value: value.as_bytes(),
        flags: 0,
        expiry: Expiry::Never,
        preserve_ttl: false,
        datatype: Datatype::RAW,
        cas: Cas::ANY,
        durability: None,
    }
}

pub(crate) fn remove_req(key: &str, cas: Cas) -> RemoveRequest<'_> {
    let key = key.as_bytes();
    RemoveRequest {
        vbid: vb(key),
        key,
        cas,
        durability: None,
    }
}

pub(crate) fn arith_req(
    op: ArithmeticOp,
    key: &str,
    delta: u64,
    initial: u64,
    expiry_raw: u32,
) -> ArithmeticRequest<'_> {
    let key = key.as_bytes();
    ArithmeticRequest {
        op,
        vbid: vb(key),
        key,
        delta,
        initial,
        expiry_raw,
        cas: Cas::ANY,
        durability: None,
    }
}

pub(crate) fn durability(level: epkv_types::DurabilityLevel) -> Option<DurabilityRequirements> {
    Some(DurabilityRequirements {
        level,
        timeout: None,
    })
}

pub(crate) fn get(b: &Bucket, key: &str) -> EngineResult<Item> {
    b.get(vb(key.as_bytes()), key.as_bytes())
}

pub(crate) fn must_set(b: &Bucket, key: &str, value: &str) -> MutationInfo {
    b.store(store_req(StoreOp::Set, key, value)).unwrap()
}

pub(crate) fn must_get(b: &Bucket, key: &str) -> Item {
    get(b, key).unwrap()
}

/// The `i`th key (from 0) of the keys `key-N` that map to vBucket `vb`.
pub(crate) fn key_in(vb: Vbid, i: usize) -> String {
    (0..)
        .map(|n| format!("key-{n}"))
        .filter(|k| vbucket_for_key(k.as_bytes(), NUM_VBUCKETS) == vb)
        .nth(i)
        .unwrap()
}

/// Returns `n` distinct keys that all map to the same vBucket.
pub(crate) fn keys_in_one_vbucket(n: usize) -> Vec<String> {
    let target = vb(b"anchor");
    (0..)
        .map(|i| format!("k{i}"))
        .filter(|k| vb(k.as_bytes()) == target)
        .take(n)
        .collect()
}

/// A persistent bucket whose background tasks run on a manual executor, driven by hand.
pub(crate) struct ExecFixture {
    pub(crate) bucket: Arc<Bucket>,
    pub(crate) exec: epkv_executor::ManualExecutor,
}

/// One shard, no interval compaction, background tasks on a manual executor (warmed up
/// before it returns); `tune` adjusts the persistence settings.
pub(crate) fn open_configured(
    dir: &std::path::Path,
    quota: u64,
    eviction_policy: epkv_engine::EvictionPolicy,
    tune: impl FnOnce(&mut epkv_engine::PersistenceConfig),
) -> ExecFixture {
    let clock = Arc::new(ManualClock::new(Duration::from_secs(START_UNIX_SECS)));
    let exec = epkv_executor::ManualExecutor::new(Arc::clone(&clock));
    let mut p = epkv_engine::PersistenceConfig::new(dir);
    p.shards = 1;
    p.compaction_interval = Duration::ZERO;
    tune(&mut p);
    let bucket = Bucket::new_on_executor(
        BucketConfig {
            expiry_pager_interval: Duration::ZERO,
            item_pager_interval: Duration::ZERO,
            memory_quota_bytes: quota,
            persistence: Some(p),
            eviction_policy,
            ..BucketConfig::default()
        },
        EngineClock::Custom(clock),
        exec.handle(),
    )
    .unwrap();
    // Warmup loads one vBucket per task run.
    for _ in 0..100 {
        exec.run_until_idle(100);
        if bucket.is_warmed_up() {
            break;
        }
    }
    assert!(bucket.wait_warmup(Duration::from_secs(10)));
    ExecFixture { bucket, exec }
}
