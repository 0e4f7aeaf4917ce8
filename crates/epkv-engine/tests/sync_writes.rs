//! SyncWrites (durable writes) on a single node, driven step by step with a manual
//! executor and a manual flusher:
//! - a prepare is invisible to readers and keeps other writes of its key out
//!   (SyncWriteInProgress) until it commits;
//! - Majority commits at once unless an earlier persist-level prepare fences it;
//! - the persist levels commit once the prepare is persisted;
//! - the per-vBucket timeout task aborts an expired head (SyncWriteAmbiguous);
//! - a crash keeps what was committed and commits persisted prepares again at warmup.
//!
//! A property test checks all of that against a model.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions panic on failure"
)]
mod support;
use epkv_engine::{Bucket, BucketConfig, EvictionPolicy, FlusherMode};
use epkv_engine_api::{
    ArithmeticOp, ArithmeticRequest, DurabilityRequirements, Engine, EngineResult, EngineStatus,
    Expiry, RemoveRequest, StoreOp, StoreRequest,
};
use epkv_types::{Cas, Datatype, DurabilityLevel, Seqno, Vbid};
use proptest::prelude::*;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{ExecFixture as Fixture, keys_in_one_vbucket, open_configured};

const PERSIST: DurabilityLevel = DurabilityLevel::PersistToMajority;
const MAJORITY: DurabilityLevel = DurabilityLevel::Majority;

/// A persistent bucket flushed by hand, its background tasks on a manual executor.
fn open(dir: &Path) -> Fixture {
    let quota = BucketConfig::default().memory_quota_bytes;
    open_configured(dir, quota, EvictionPolicy::Value, |p| {
        p.flusher = FlusherMode::Manual;
    })
}

impl Fixture {
    /// Moves the clock on and runs what became due (the durability timeout tasks).
    fn advance(&self, d: Duration) {
        self.exec.advance(d);
        self.exec.run_until_idle(1000);
    }
}

fn vb(key: &str) -> Vbid {
    support::vb(key.as_bytes())
}

fn req(level: DurabilityLevel, timeout_ms: u64) -> Option<DurabilityRequirements> {
    Some(DurabilityRequirements {
        level,
        timeout: Some(Duration::from_millis(timeout_ms)),
    })
}

fn set(
    b: &Bucket,
    key: &str,
    value: &str,
    durability: Option<DurabilityRequirements>,
) -> EngineResult<epkv_engine_api::MutationInfo> {
    b.store(StoreRequest {
        op: StoreOp::Set,
        vbid: vb(key),
        key: key.as_bytes(),
        value: value.as_bytes(),
        flags: 0,
        expiry: Expiry::Never,
        preserve_ttl: false,
        datatype: Datatype::RAW,
        cas: Cas::ANY,
        durability,
    })
}

fn get(b: &Bucket, key: &str) -> Option<String> {
    match b.get(vb(key), key.as_bytes()) {
        Ok(item) => Some(String::from_utf8(item.value.to_vec()).unwrap()),
        Err(EngineStatus::KeyNotFound) => None,
        Err(e) => panic!("GET {key}: {e:?}"),
    }
}

/// The outcome of a SyncWrite, once the engine has told it.
#[derive(Clone, Default)]
struct Outcome(Arc<Mutex<Option<EngineResult<()>>>>);

impl Outcome {
    fn get(&self) -> Option<EngineResult<()>> {
        *self.0.lock().unwrap()
    }
}

/// Asks for the outcome of the SyncWrite whose prepare got `seqno`, as the front end does.
fn outcome_of(b: &Bucket, key: &str, seqno: Seqno) -> Outcome {
    let o = Outcome::default();
    let slot = Arc::clone(&o.0);
    b.when_sync_write_completed(
        vb(key),
        seqno.0,
        Box::new(move |r| *slot.lock().unwrap() = Some(r)),
    )
    .unwrap();
    o
}

/// A SyncWrite SET and its outcome.
fn durable_set(
    b: &Bucket,
    key: &str,
    value: &str,
    level: DurabilityLevel,
    timeout_ms: u64,
) -> (epkv_engine_api::MutationInfo, Outcome) {
    let info = set(b, key, value, req(level, timeout_ms)).unwrap();
    let o = outcome_of(b, key, info.seqno);
    (info, o)
}

fn stat(b: &Bucket, group: &str, name: &str) -> String {
    let mut found = None;
    b.stats(group, &mut |k, v| {
        if k == name {
            found = Some(v.to_owned());
        }
    })
    .unwrap();
    found.unwrap_or_else(|| panic!("no stat {name} in {group:?}"))
}

#[test]
fn a_prepare_is_invisible_and_exclusive_until_persisted() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir.path());
    let b = &f.bucket;
    set(b, "doc", "v0", None).unwrap();
    let (info, done) = durable_set(b, "doc", "v1", PERSIST, 30_000);
    assert_eq!(
        get(b, "doc").as_deref(),
        Some("v0"),
        "readers see the committed value"
    );
    assert_eq!(done.get(), None, "not persisted yet");
    assert_eq!(
        set(b, "doc", "other", None).unwrap_err(),
        EngineStatus::SyncWriteInProgress
    );
    assert_eq!(
        b.remove(RemoveRequest {
            vbid: vb("doc"),
            key: b"doc",
            cas: Cas::ANY,
            durability: None,
        })
        .unwrap_err(),
        EngineStatus::SyncWriteInProgress
    );
    assert_eq!(
        set(b, "doc", "other", req(MAJORITY, 1000)).unwrap_err(),
        EngineStatus::SyncWriteInProgress
    );
    let key = format!("vb_{}:high_prepared_seqno", vb("doc").0);
    assert_eq!(stat(b, "vbucket-seqno", &key), info.seqno.0.to_string());
    let visible = format!("vb_{}:max_visible_seqno", vb("doc").0);
    assert_eq!(
        stat(b, "vbucket-seqno", &visible),
        (info.seqno.0 - 1).to_string(),
        "a prepare is not visible"
    );

    b.flush_all().unwrap();
    assert_eq!(done.get(), Some(Ok(())), "committed once persisted");
    let item = b.get(vb("doc"), b"doc").unwrap();
    assert_eq!(&item.value[..], b"v1");
    assert_eq!(item.cas, info.cas, "the commit keeps the prepare's CAS");
    assert!(
        b.high_seqno(vb("doc")).unwrap() > info.seqno.0,
        "the commit's own seqno"
    );
    assert_eq!(
        stat(b, "vbucket-seqno", &visible),
        b.high_seqno(vb("doc")).unwrap().to_string(),
        "the commit is"
    );
    set(b, "doc", "v2", None).unwrap();
    assert_eq!(stat(b, "", "vb_active_sync_write_committed_count"), "1");
}

#[test]
fn majority_commits_at_once_unless_a_persist_level_prepare_fences_it() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir.path());
    let b = &f.bucket;
    let keys = keys_in_one_vbucket(3);
    let (_, first) = durable_set(b, &keys[0], "a", MAJORITY, 30_000);
    assert_eq!(first.get(), Some(Ok(())));
    assert_eq!(get(b, &keys[0]).as_deref(), Some("a"));

    let (_, fence) = durable_set(b, &keys[1], "b", PERSIST, 30_000);
    let (_, behind) = durable_set(b, &keys[2], "c", MAJORITY, 30_000);
    assert_eq!(
        behind.get(),
        None,
        "behind an unpersisted persist-level prepare"
    );
    assert_eq!(get(b, &keys[2]), None);
    b.flush_all().unwrap();
    assert_eq!(fence.get(), Some(Ok(())));
    assert_eq!(behind.get(), Some(Ok(())));
    assert_eq!(get(b, &keys[1]).as_deref(), Some("b"));
    assert_eq!(get(b, &keys[2]).as_deref(), Some("c"));
}

#[test]
fn the_timeout_task_aborts_an_expired_prepare_as_ambiguous() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir.path());
    let b = &f.bucket;
    let keys = keys_in_one_vbucket(2);
    set(b, &keys[0], "before", None).unwrap();
    let (_, short) = durable_set(b, &keys[0], "after", PERSIST, 100);
    let (_, long) = durable_set(b, &keys[1], "x", PERSIST, 5000);
    f.advance(Duration::from_millis(50));
    assert_eq!(short.get(), None);
    f.advance(Duration::from_millis(100));
    assert_eq!(short.get(), Some(Err(EngineStatus::SyncWriteAmbiguous)));
    assert_eq!(long.get(), None, "not expired yet");
    assert_eq!(get(b, &keys[0]).as_deref(), Some("before"));
    set(b, &keys[0], "free again", None).unwrap();
    assert_eq!(stat(b, "", "vb_active_sync_write_aborted_count"), "1");
    // The task was re-armed for the next head.
    f.advance(Duration::from_secs(5));
    assert_eq!(long.get(), Some(Err(EngineStatus::SyncWriteAmbiguous)));
    assert_eq!(get(b, &keys[1]), None);
    // An outcome asked for after it happened is still told.
    let info = set(b, &keys[1], "y", req(MAJORITY, 1000)).unwrap();
    assert_eq!(outcome_of(b, &keys[1], info.seqno).get(), Some(Ok(())));
}

#[test]
fn durable_delete_and_increment_are_sync_writes_too() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir.path());
    let b = &f.bucket;
    set(b, "gone", "here", None).unwrap();
    let info = b
        .remove(RemoveRequest {
            vbid: vb("gone"),
            key: b"gone",
            cas: Cas::ANY,
            durability: req(PERSIST, 30_000),
        })
        .unwrap();
    let done = outcome_of(b, "gone", info.seqno);
    assert_eq!(
        get(b, "gone").as_deref(),
        Some("here"),
        "not deleted before commit"
    );
    b.flush_all().unwrap();
    assert_eq!(done.get(), Some(Ok(())));
    assert_eq!(get(b, "gone"), None);

    let arith = |durability| {
        b.arithmetic(ArithmeticRequest {
            op: ArithmeticOp::Increment,
            vbid: vb("count"),
            key: b"count",
            delta: 5,
            initial: 10,
            expiry_raw: 0,
            cas: Cas::ANY,
            durability,
        })
    };
    let (v, info) = arith(req(PERSIST, 30_000)).unwrap();
    assert_eq!(v, 10);
    let done = outcome_of(b, "count", info.seqno);
    assert_eq!(arith(None).unwrap_err(), EngineStatus::SyncWriteInProgress);
    b.flush_all().unwrap();
    assert_eq!(done.get(), Some(Ok(())));
    assert_eq!(arith(None).unwrap().0, 15);
}

#[test]
fn a_crash_keeps_commits_and_commits_persisted_prepares_again() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_in_one_vbucket(4);
    {
        let f = open(dir.path());
        let b = &f.bucket;
        // Committed and persisted.
        let (_, a) = durable_set(b, &keys[0], "committed", PERSIST, 30_000);
        b.flush_all().unwrap();
        assert_eq!(a.get(), Some(Ok(())));
        // Prepare persisted, commit made in memory but not persisted.
        let (_, c) = durable_set(b, &keys[1], "prepared", PERSIST, 30_000);
        b.flush_all().unwrap();
        assert_eq!(c.get(), Some(Ok(())));
        // Aborted, and the abort persisted.
        set(b, &keys[2], "old", None).unwrap();
        let (_, ab) = durable_set(b, &keys[2], "aborted", PERSIST, 100);
        f.advance(Duration::from_millis(200));
        assert_eq!(ab.get(), Some(Err(EngineStatus::SyncWriteAmbiguous)));
        b.flush_all().unwrap();
        // Never persisted at all.
        let (_, lost) = durable_set(b, &keys[3], "never", PERSIST, 30_000);
        assert_eq!(lost.get(), None);
        // No shutdown: no final flush.
    }
    let f = open(dir.path());
    let b = &f.bucket;
    assert_eq!(get(b, &keys[0]).as_deref(), Some("committed"));
    assert_eq!(
        get(b, &keys[1]).as_deref(),
        Some("prepared"),
        "a persisted prepare is committed again at warmup"
    );
    assert_eq!(
        get(b, &keys[2]).as_deref(),
        Some("old"),
        "an abort is never undone"
    );
    assert_eq!(
        get(b, &keys[3]),
        None,
        "never acknowledged, never persisted"
    );
    // The key of the re-committed prepare takes writes again.
    set(b, &keys[1], "next", None).unwrap();
    b.flush_all().unwrap();
    drop(f);
    let f = open(dir.path());
    assert_eq!(get(&f.bucket, &keys[1]).as_deref(), Some("next"));
}

#[test]
fn compaction_drops_completed_prepares_and_keeps_pending_ones() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_in_one_vbucket(3);
    {
        let f = open(dir.path());
        let b = &f.bucket;
        for k in &keys[..2] {
            let (_, done) = durable_set(b, k, "committed", PERSIST, 30_000);
            b.flush_all().unwrap();
            assert_eq!(done.get(), Some(Ok(())));
        }
        // The commits are persisted by this flush; the third prepare is persisted and
        // stays pending (its commit is made in memory by the flush, not persisted).
        b.flush_all().unwrap();
        let out = b.compact_all().unwrap();
        assert_eq!(out.prepares_purged, 2, "{out:?}");
        let (_, pending) = durable_set(b, &keys[2], "pending", PERSIST, 30_000);
        b.flush_all().unwrap();
        assert_eq!(pending.get(), Some(Ok(())));
        // A crash: the third commit never reached the disk.
        let out = b.compact_all().unwrap();
        assert_eq!(out.prepares_purged, 0, "not completed on disk: {out:?}");
    }
    let f = open(dir.path());
    for k in &keys[..2] {
        assert_eq!(get(&f.bucket, k).as_deref(), Some("committed"));
    }
    assert_eq!(get(&f.bucket, &keys[2]).as_deref(), Some("pending"));
}

/// One step of the property test.
#[derive(Debug, Clone)]
enum Op {
    Set {
        key: usize,
        value: u8,
    },
    Durable {
        key: usize,
        value: u8,
        persist: bool,
        timeout_ms: u64,
    },
    Get {
        key: usize,
    },
    Flush,
    Advance {
        ms: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..4, any::<u8>()).prop_map(|(key, value)| Op::Set { key, value }),
        4 => (0usize..4, any::<u8>(), any::<bool>(), 1u64..300)
            .prop_map(|(key, value, persist, timeout_ms)| Op::Durable { key, value, persist, timeout_ms }),
        3 => (0usize..4).prop_map(|key| Op::Get { key }),
        2 => Just(Op::Flush),
        2 => (1u64..200).prop_map(|ms| Op::Advance { ms }),
    ]
}

/// A prepare in the model.
struct Pending {
    key: usize,
    value: String,
    persist: bool,
    persisted: bool,
    deadline: u64,
    outcome: Outcome,
}

#[derive(Default)]
struct Model {
    committed: HashMap<usize, String>,
    /// In seqno order.
    pending: Vec<Pending>,
    now_ms: u64,
    /// Outcomes the model expects, with what the engine told.
    told: Vec<(EngineResult<()>, Outcome)>,
}

impl Model {
    fn in_flight(&self, key: usize) -> bool {
        self.pending.iter().any(|p| p.key == key)
    }

    /// Completes the head while it is resolved: committed when its level is met, else
    /// aborted when its deadline has passed.
    fn resolve(&mut self) {
        while let Some(head) = self.pending.first() {
            if !head.persist || head.persisted {
                let p = self.pending.remove(0);
                self.committed.insert(p.key, p.value);
                self.told.push((Ok(()), p.outcome));
            } else if head.deadline <= self.now_ms {
                let p = self.pending.remove(0);
                self.told
                    .push((Err(EngineStatus::SyncWriteAmbiguous), p.outcome));
            } else {
                break;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn sync_writes_follow_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let f = open(dir.path());
        let b = &f.bucket;
        let keys = keys_in_one_vbucket(4);
        let mut m = Model::default();
        for op in ops {
            match op {
                Op::Set { key, value } => {
                    let v = value.to_string();
                    let r = set(b, &keys[key], &v, None);
                    if m.in_flight(key) {
                        prop_assert_eq!(r.unwrap_err(), EngineStatus::SyncWriteInProgress);
                    } else {
                        prop_assert!(r.is_ok());
                        m.committed.insert(key, v);
                    }
                }
                Op::Durable { key, value, persist, timeout_ms } => {
                    let v = value.to_string();
                    let level = if persist { PERSIST } else { MAJORITY };
                    let r = set(b, &keys[key], &v, req(level, timeout_ms));
                    if m.in_flight(key) {
                        prop_assert_eq!(r.unwrap_err(), EngineStatus::SyncWriteInProgress);
                    } else {
                        let info = r.unwrap();
                        let outcome = outcome_of(b, &keys[key], info.seqno);
                        m.pending.push(Pending {
                            key,
                            value: v,
                            persist,
                            persisted: false,
                            deadline: m.now_ms + timeout_ms,
                            outcome,
                        });
                        m.resolve();
                    }
                }
                Op::Get { key } => {
                    prop_assert_eq!(get(b, &keys[key]), m.committed.get(&key).cloned());
                }
                Op::Flush => {
                    b.flush_all().unwrap();
                    for p in &mut m.pending {
                        p.persisted = true;
                    }
                    m.resolve();
                }
                Op::Advance { ms } => {
                    f.advance(Duration::from_millis(ms));
                    m.now_ms += ms;
                    m.resolve();
                }
            }
            for (want, got) in &m.told {
                prop_assert_eq!(got.get(), Some(*want));
            }
            for p in &m.pending {
                prop_assert_eq!(p.outcome.get(), None);
            }
            for (key, k) in keys.iter().enumerate() {
                prop_assert_eq!(get(b, k), m.committed.get(&key).cloned());
            }
        }
        // What was committed survives a crash once flushed; what was pending and
        // persisted is committed again.
        b.flush_all().unwrap();
        for p in &mut m.pending {
            p.persisted = true;
        }
        m.resolve();
        b.flush_all().unwrap();
        drop(f);
        let f = open(dir.path());
        for (key, k) in keys.iter().enumerate() {
            prop_assert_eq!(get(&f.bucket, k), m.committed.get(&key).cloned());
        }
    }
}
