//! Range and sampling scans through the `Engine` trait, on a persistent bucket whose
//! tasks run on a manual executor: the keys are fixed at the create, deleted documents
//! are skipped, evicted values are read from disk without becoming resident, full
//! eviction's keys on disk only are found, the snapshot requirements wait for their
//! seqno, idle scans expire, owners are bounded, and (property test against a model,
//! both eviction policies) a scan returns exactly the model's keys and values in range.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions panic on failure"
)]
mod support;
use epkv_engine::{Bucket, BucketConfig, EngineClock, EvictionPolicy, FlusherMode};
use epkv_engine_api::{
    Engine, EngineStatus, Expiry, RangeScanCreate, RangeScanCreated, RangeScanId, RangeScanKind,
    RangeScanLimits, RangeScanProgress, RemoveRequest, ScanBound, ScanContent, ScanItem,
    SnapshotRequirements, StoreOp, StoreRequest,
};
use epkv_executor::{ManualClock, ManualExecutor};
use epkv_types::{Cas, Datatype, VBucketState, Vbid};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Every test uses one vBucket; keys go there whatever they hash to (the engine checks
/// the key's vBucket for key operations, so the tests write with a one-vBucket bucket).
const VB: Vbid = Vbid(0);

struct Fx {
    bucket: Arc<Bucket>,
    exec: ManualExecutor,
}

fn open(dir: &Path, eviction_policy: EvictionPolicy, tune: impl FnOnce(&mut BucketConfig)) -> Fx {
    let clock = Arc::new(ManualClock::new(Duration::from_secs(
        support::START_UNIX_SECS,
    )));
    let exec = ManualExecutor::new(Arc::clone(&clock));
    let mut p = epkv_engine::PersistenceConfig::new(dir);
    p.shards = 1;
    p.compaction_interval = Duration::ZERO;
    p.flusher = FlusherMode::Manual;
    let mut config = BucketConfig {
        expiry_pager_interval: Duration::ZERO,
        item_pager_interval: Duration::ZERO,
        num_vbuckets: 1,
        persistence: Some(p),
        eviction_policy,
        ..BucketConfig::default()
    };
    tune(&mut config);
    let bucket =
        Bucket::new_on_executor(config, EngineClock::Custom(clock), exec.handle()).unwrap();
    for _ in 0..100 {
        exec.run_until_idle(100);
        if bucket.is_warmed_up() {
            break;
        }
    }
    assert!(bucket.wait_warmup(Duration::from_secs(10)));
    Fx { bucket, exec }
}

fn set(b: &Bucket, key: &str, value: &str) {
    b.store(StoreRequest {
        op: StoreOp::Set,
        vbid: VB,
        key: key.as_bytes(),
        value: value.as_bytes(),
        flags: 7,
        expiry: Expiry::Never,
        preserve_ttl: false,
        datatype: Datatype::RAW,
        cas: Cas::ANY,
        durability: None,
    })
    .unwrap();
}

fn delete(f: &Fx, key: &str) {
    for _ in 0..10 {
        let r = f.bucket.remove(RemoveRequest {
            vbid: VB,
            key: key.as_bytes(),
            cas: Cas::ANY,
            durability: None,
        });
        if r == Err(EngineStatus::WouldBlock) {
            // Under full eviction the document is read back first.
            f.exec.run_until_idle(100);
            continue;
        }
        r.unwrap();
        return;
    }
    panic!("the delete keeps blocking");
}

fn range(start: &str, end: &str, content: ScanContent) -> RangeScanCreate {
    RangeScanCreate {
        collection: 0,
        kind: RangeScanKind::Range {
            start: ScanBound::Inclusive(start.as_bytes().to_vec()),
            end: ScanBound::Inclusive(end.as_bytes().to_vec()),
        },
        content,
        snapshot: None,
        owner: 1,
    }
}

/// Creates a scan, running the tasks it waits for (a bounded number of rounds).
fn create(f: &Fx, req: &RangeScanCreate) -> Result<RangeScanId, EngineStatus> {
    let mut resume = None;
    for _ in 0..10 {
        match f.bucket.range_scan_create(VB, req, resume)? {
            RangeScanCreated::Ready(id) => return Ok(id),
            RangeScanCreated::Pending(id) => {
                resume = Some(id);
                f.exec.run_until_idle(100);
            }
        }
    }
    panic!("the create stays pending");
}

/// What one continue returned.
#[derive(Debug, Default, PartialEq, Eq)]
struct Batch {
    keys: Vec<String>,
    values: Vec<String>,
}

/// Continues once, running the disk reads it waits for (bounded).
fn next(
    f: &Fx,
    id: RangeScanId,
    limits: RangeScanLimits,
) -> (Batch, Result<RangeScanProgress, EngineStatus>) {
    for _ in 0..10 {
        let mut batch = Batch::default();
        let r = f
            .bucket
            .range_scan_continue(VB, id, limits, &mut |item| match item {
                ScanItem::Key(k) => batch.keys.push(String::from_utf8_lossy(k).into()),
                ScanItem::Document(d) => {
                    batch.keys.push(String::from_utf8_lossy(d.key).into());
                    batch.values.push(String::from_utf8_lossy(d.value).into());
                }
            });
        if r == Err(EngineStatus::WouldBlock) {
            assert!(
                batch.keys.is_empty(),
                "nothing is emitted before WouldBlock"
            );
            let (tx, rx) = std::sync::mpsc::channel();
            f.bucket
                .when_range_scan_ready(VB, id, Box::new(move |o| tx.send(o).unwrap()));
            f.exec.run_until_idle(100);
            assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), Ok(()));
            continue;
        }
        return (batch, r);
    }
    panic!("the continue keeps blocking");
}

/// Continues to the end (at most `rounds` continues); returns everything.
fn drain(f: &Fx, id: RangeScanId, limits: RangeScanLimits, rounds: usize) -> Batch {
    let mut all = Batch::default();
    for _ in 0..rounds {
        let (b, r) = next(f, id, limits);
        all.keys.extend(b.keys);
        all.values.extend(b.values);
        match r.unwrap() {
            RangeScanProgress::Complete => return all,
            RangeScanProgress::More => {}
        }
    }
    panic!("the scan does not end");
}

fn items(n: u32) -> RangeScanLimits {
    RangeScanLimits {
        items: n,
        ..RangeScanLimits::default()
    }
}

#[test]
fn a_range_scan_returns_the_keys_of_its_create_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir.path(), EvictionPolicy::Value, |_| {});
    for k in ["a", "b1", "b2", "b3", "c"] {
        set(&f.bucket, k, k);
    }
    let id = create(&f, &range("b", "b\u{7f}", ScanContent::Keys)).unwrap();
    // Written and deleted after the create: a keys scan returns the snapshot.
    set(&f.bucket, "b0", "new");
    delete(&f, "b2");
    let (b, r) = next(&f, id, items(2));
    assert_eq!(
        (b.keys, r),
        (vec!["b1".into(), "b2".into()], Ok(RangeScanProgress::More))
    );
    let (b, r) = next(&f, id, items(2));
    assert_eq!(
        (b.keys, r),
        (vec!["b3".into()], Ok(RangeScanProgress::Complete))
    );
    // Complete closes the scan.
    assert_eq!(next(&f, id, items(2)).1, Err(EngineStatus::KeyNotFound));
    assert_eq!(
        f.bucket.range_scan_cancel(VB, id),
        Err(EngineStatus::KeyNotFound)
    );
}

#[test]
fn a_documents_scan_skips_what_was_deleted_since_and_reads_the_current_version() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir.path(), EvictionPolicy::Value, |_| {});
    for k in ["k1", "k2", "k3"] {
        set(&f.bucket, k, "v1");
    }
    let id = create(&f, &range("k", "l", ScanContent::Documents)).unwrap();
    delete(&f, "k2");
    set(&f.bucket, "k3", "v2");
    let all = drain(&f, id, items(0), 3);
    assert_eq!(all.keys, vec!["k1", "k3"]);
    assert_eq!(all.values, vec!["v1", "v2"]);
}

#[test]
fn creates_are_refused_as_kv_engine_refuses_them() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir.path(), EvictionPolicy::Value, |_| {});
    set(&f.bucket, "a", "1");
    // An empty range, an unknown collection, a vBucket that is not active.
    assert_eq!(
        create(&f, &range("x", "z", ScanContent::Keys)),
        Err(EngineStatus::KeyNotFound)
    );
    let mut other = range("a", "z", ScanContent::Keys);
    other.collection = 99;
    assert_eq!(create(&f, &other), Err(EngineStatus::UnknownCollection));
    f.bucket
        .set_vbucket_state(VB, VBucketState::Replica)
        .unwrap();
    assert_eq!(
        create(&f, &range("a", "z", ScanContent::Keys)),
        Err(EngineStatus::NotMyVbucket)
    );
}

#[test]
fn a_scan_closes_when_its_vbucket_stops_being_active() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir.path(), EvictionPolicy::Value, |_| {});
    set(&f.bucket, "a", "1");
    let id = create(&f, &range("a", "z", ScanContent::Keys)).unwrap();
    f.bucket
        .set_vbucket_state(VB, VBucketState::Replica)
        .unwrap();
    assert_eq!(next(&f, id, items(0)).1, Err(EngineStatus::KeyNotFound));
}

#[test]
fn a_sample_is_min_of_samples_and_items_and_repeatable() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir.path(), EvictionPolicy::Value, |_| {});
    for i in 0..50 {
        set(&f.bucket, &format!("k{i:02}"), "v");
    }
    let sample = |samples, seed| RangeScanCreate {
        collection: 0,
        kind: RangeScanKind::Sampling { samples, seed },
        content: ScanContent::Keys,
        snapshot: None,
        owner: 1,
    };
    let ten = drain(&f, create(&f, &sample(10, 3)).unwrap(), items(0), 2).keys;
    assert_eq!(ten.len(), 10);
    assert_eq!(
        ten,
        drain(&f, create(&f, &sample(10, 3)).unwrap(), items(0), 2).keys
    );
    assert_eq!(
        drain(&f, create(&f, &sample(500, 3)).unwrap(), items(0), 2)
            .keys
            .len(),
        50
    );
}

#[test]
fn evicted_values_are_read_from_disk_without_becoming_resident() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir.path(), EvictionPolicy::Value, |_| {});
    let keys: Vec<String> = (0..20).map(|i| format!("k{i:02}")).collect();
    for k in &keys {
        set(&f.bucket, k, &format!("value of {k}"));
    }
    f.bucket.flush_all().unwrap();
    for k in keys.iter().step_by(2) {
        assert_eq!(f.bucket.evict_key(VB, k.as_bytes()), Ok(true));
    }
    let id = create(&f, &range("k", "l", ScanContent::Documents)).unwrap();
    let all = drain(&f, id, items(7), 20);
    assert_eq!(all.keys, keys);
    let want: Vec<String> = keys.iter().map(|k| format!("value of {k}")).collect();
    assert_eq!(all.values, want);
    for k in keys.iter().step_by(2) {
        // Still not resident: nothing to evict.
        assert_eq!(f.bucket.evict_key(VB, k.as_bytes()), Ok(false), "{k}");
    }
}

#[test]
fn full_eviction_scans_find_keys_only_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir.path(), EvictionPolicy::Full, |_| {});
    for k in ["a", "b", "c", "d"] {
        set(&f.bucket, k, k);
    }
    f.bucket.flush_all().unwrap();
    for k in ["a", "c"] {
        assert_eq!(f.bucket.evict_key(VB, k.as_bytes()), Ok(true));
    }
    delete(&f, "d");
    let keys = drain(
        &f,
        create(&f, &range("a", "z", ScanContent::Keys)).unwrap(),
        items(0),
        2,
    );
    assert_eq!(keys.keys, vec!["a", "b", "c"]);
    let docs = drain(
        &f,
        create(&f, &range("a", "z", ScanContent::Documents)).unwrap(),
        items(1),
        10,
    );
    assert_eq!(
        (docs.keys.clone(), docs.values),
        (vec!["a".into(), "b".into(), "c".into()], docs.keys)
    );
}

#[test]
fn snapshot_requirements_check_the_uuid_and_wait_for_the_seqno() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir.path(), EvictionPolicy::Value, |_| {});
    set(&f.bucket, "a", "1");
    let seqnos = f.bucket.vbucket_seqnos(VB).unwrap();
    let uuid = seqnos.failover_log[0].uuid;
    let high = seqnos.high_seqno.0;
    let with = |vb_uuid, seqno, timeout| RangeScanCreate {
        snapshot: Some(SnapshotRequirements {
            vb_uuid,
            seqno,
            seqno_exists: false,
            timeout,
        }),
        ..range("a", "z", ScanContent::Keys)
    };
    assert_eq!(
        f.bucket
            .range_scan_create(VB, &with(uuid + 1, 0, None), None),
        Err(EngineStatus::VbUuidNotEqual)
    );
    // Not persisted, no timeout: TempFail at once.
    assert_eq!(
        f.bucket
            .range_scan_create(VB, &with(uuid, high, None), None),
        Err(EngineStatus::TempFail)
    );
    // With a timeout: pending until the flush.
    let req = with(uuid, high, Some(Duration::from_secs(5)));
    let Ok(RangeScanCreated::Pending(id)) = f.bucket.range_scan_create(VB, &req, None) else {
        panic!("pending");
    };
    let (tx, rx) = std::sync::mpsc::channel();
    f.bucket
        .when_range_scan_ready(VB, id, Box::new(move |o| tx.send(o).unwrap()));
    assert!(rx.try_recv().is_err());
    f.bucket.flush_all().unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), Ok(()));
    assert_eq!(
        f.bucket.range_scan_create(VB, &req, Some(id)),
        Ok(RangeScanCreated::Ready(id))
    );
    // A seqno never reached: TempFail once the timeout passed.
    let req = with(uuid, high + 10, Some(Duration::from_secs(5)));
    let Ok(RangeScanCreated::Pending(id)) = f.bucket.range_scan_create(VB, &req, None) else {
        panic!("pending");
    };
    f.exec.advance(Duration::from_secs(6));
    f.exec.fire_timers();
    f.exec.run_until_idle(100);
    assert_eq!(
        f.bucket.range_scan_create(VB, &req, Some(id)),
        Err(EngineStatus::TempFail)
    );
}

#[test]
fn an_idle_scan_expires_and_a_cancelled_one_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir.path(), EvictionPolicy::Value, |c| {
        c.range_scan_idle_timeout = Duration::from_secs(2);
    });
    for k in ["a", "b", "c", "d", "e"] {
        set(&f.bucket, k, "1");
    }
    let idle = create(&f, &range("a", "z", ScanContent::Keys)).unwrap();
    let used = create(&f, &range("a", "z", ScanContent::Keys)).unwrap();
    let cancelled = create(&f, &range("a", "z", ScanContent::Keys)).unwrap();
    assert_eq!(f.bucket.range_scan_cancel(VB, cancelled), Ok(()));
    assert_eq!(
        next(&f, cancelled, items(1)).1,
        Err(EngineStatus::KeyNotFound)
    );
    for _ in 0..3 {
        f.exec.advance(Duration::from_millis(900));
        f.exec.fire_timers();
        f.exec.run_until_idle(100);
        assert_eq!(next(&f, used, items(1)).1, Ok(RangeScanProgress::More));
    }
    assert_eq!(next(&f, idle, items(1)).1, Err(EngineStatus::KeyNotFound));
}

#[test]
fn an_owner_is_bounded_and_its_scans_close_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir.path(), EvictionPolicy::Value, |c| {
        c.range_scan_max_per_owner = 2;
    });
    set(&f.bucket, "a", "1");
    let req = range("a", "z", ScanContent::Keys);
    let first = create(&f, &req).unwrap();
    create(&f, &req).unwrap();
    assert_eq!(create(&f, &req), Err(EngineStatus::TooBusy));
    let mut other = req.clone();
    other.owner = 2;
    let theirs = create(&f, &other).unwrap();
    f.bucket.range_scan_release(1);
    assert_eq!(next(&f, first, items(1)).1, Err(EngineStatus::KeyNotFound));
    assert!(next(&f, theirs, items(1)).1.is_ok());
    create(&f, &req).unwrap();
}

#[test]
fn a_scan_past_its_key_bytes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir.path(), EvictionPolicy::Value, |c| {
        c.range_scan_max_key_bytes = 100;
    });
    for i in 0..50 {
        set(&f.bucket, &format!("key{i:03}"), "v");
    }
    assert_eq!(
        create(&f, &range("key", "key999", ScanContent::Keys)),
        Err(EngineStatus::TooBusy)
    );
    assert!(create(&f, &range("key000", "key002", ScanContent::Keys)).is_ok());
}

/// One step of the model test.
#[derive(Debug, Clone)]
enum Op {
    Set(u8, u8),
    Delete(u8),
    Evict(u8),
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..40, any::<u8>()).prop_map(|(k, v)| Op::Set(k, v)),
        1 => (0u8..40).prop_map(Op::Delete),
        2 => (0u8..40).prop_map(Op::Evict),
        1 => Just(Op::Flush),
    ]
}

fn key(k: u8) -> String {
    format!("key{k:02}")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Whatever was written, deleted, flushed and evicted, a scan returns the model's
    /// keys in range, in order, with their values.
    #[test]
    fn a_scan_equals_the_model(
        ops in proptest::collection::vec(op(), 1..80),
        full in any::<bool>(),
        lo in 0u8..40,
        len in 0u8..40,
        limit in 0u32..6,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let policy = if full { EvictionPolicy::Full } else { EvictionPolicy::Value };
        let f = open(dir.path(), policy, |_| {});
        let mut model = BTreeMap::new();
        for op in &ops {
            match op {
                Op::Set(k, v) => {
                    set(&f.bucket, &key(*k), &v.to_string());
                    model.insert(key(*k), v.to_string());
                }
                Op::Delete(k) => {
                    if model.remove(&key(*k)).is_some() {
                        delete(&f, &key(*k));
                    }
                }
                Op::Evict(k) => {
                    // Refused for a dirty document; the model does not care.
                    let _ = f.bucket.evict_key(VB, key(*k).as_bytes());
                }
                Op::Flush => {
                    f.bucket.flush_all().unwrap();
                }
            }
        }
        let (start, end) = (key(lo), key(lo.saturating_add(len)));
        let want: Vec<(String, String)> = model
            .range(start.clone()..=end.clone())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let keys = create(&f, &range(&start, &end, ScanContent::Keys));
        let docs = create(&f, &range(&start, &end, ScanContent::Documents));
        if want.is_empty() {
            prop_assert_eq!(keys, Err(EngineStatus::KeyNotFound));
            prop_assert_eq!(docs, Err(EngineStatus::KeyNotFound));
        } else {
            let got = drain(&f, keys.unwrap(), items(limit), 100);
            let want_keys: Vec<String> = want.iter().map(|(k, _)| k.clone()).collect();
            prop_assert_eq!(&got.keys, &want_keys);
            let got = drain(&f, docs.unwrap(), items(limit), 100);
            prop_assert_eq!(got.keys, want_keys);
            prop_assert_eq!(got.values, want.iter().map(|(_, v)| v.clone()).collect::<Vec<_>>());
        }
    }
}
