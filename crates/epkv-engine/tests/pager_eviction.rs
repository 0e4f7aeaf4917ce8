//! Value and full eviction and background fetches, driven step by step with a manual
//! executor: a write always wins over a fetch that raced it, waiters see the fetch's
//! outcome, full eviction's key filter spares disk reads of absent keys, deletes,
//! expiry, counters and CAS work on documents out of memory, and (property test against
//! a model, both policies) the item pager never evicts a document that is not yet
//! persisted and item counts stay exact.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions panic on failure"
)]
mod support;
use epkv_engine::{Bucket, EvictionPolicy, FlusherMode};
use epkv_engine_api::{
    ArithmeticOp, ArithmeticRequest, Engine, EngineStatus, Expiry, RemoveRequest, StoreOp,
    StoreRequest,
};
use epkv_types::{Cas, Datatype, NUM_VBUCKETS, Vbid, vbucket_for_key};
use proptest::prelude::*;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use support::{ExecFixture as Fixture, open_configured};

fn open(dir: &Path, quota: u64) -> Fixture {
    open_with(dir, quota, EvictionPolicy::Value)
}

fn open_with(dir: &Path, quota: u64, eviction_policy: EvictionPolicy) -> Fixture {
    open_configured(dir, quota, eviction_policy, |p| {
        p.flusher = FlusherMode::Manual
    })
}

/// As [`open`], with the flushers as background tasks (on the manual executor) that wait
/// `flush_delay` before a batch nobody waits on.
fn open_batching(dir: &Path, quota: u64, flush_delay: Duration) -> Fixture {
    open_configured(dir, quota, EvictionPolicy::Value, |p| {
        p.compaction_fragmentation_percent = 0;
        p.flush_delay = flush_delay;
    })
}

fn vb(key: &str) -> Vbid {
    vbucket_for_key(key.as_bytes(), NUM_VBUCKETS)
}

fn set(b: &Bucket, key: &str, value: &[u8]) -> Result<(), EngineStatus> {
    b.store(StoreRequest {
        op: StoreOp::Set,
        vbid: vb(key),
        key: key.as_bytes(),
        value,
        flags: 0,
        expiry: Expiry::Never,
        preserve_ttl: false,
        datatype: Datatype::RAW,
        cas: Cas::ANY,
        durability: None,
    })
    .map(|_| ())
}

fn get(b: &Bucket, key: &str) -> Result<Vec<u8>, EngineStatus> {
    b.get(vb(key), key.as_bytes()).map(|i| i.value.to_vec())
}

/// Runs every ready background task: the fetcher, and the item pager if a write woke it.
fn run_fetcher(f: &Fixture) {
    f.exec.run_until_idle(100);
}

/// The flusher does not clear the dirty bits of what it persisted: raising the persisted
/// seqno makes those items clean, and eviction, OBSERVE and the table statistics see them
/// so; a write after the flush is dirty again.
#[test]
fn a_flush_makes_its_items_clean_without_looking_them_up() {
    use epkv_engine_api::KeyState;
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir.path(), 64 << 20);
    let b = &f.bucket;
    for k in ["a", "b"] {
        set(b, k, b"v").unwrap();
    }
    let dirty = |k: &str| b.hash_table_stats(vb(k)).unwrap().dirty;
    assert_eq!(
        b.observe(vb("a"), b"a").map(|r| r.0),
        Ok(KeyState::NotPersisted)
    );
    assert_eq!(b.evict_key(vb("a"), b"a"), Err(EngineStatus::KeyExists));
    assert!(dirty("a") >= 1);
    b.flush_all().unwrap();
    assert_eq!((dirty("a"), dirty("b")), (0, 0));
    assert_eq!(
        b.observe(vb("a"), b"a").map(|r| r.0),
        Ok(KeyState::Persisted)
    );
    assert_eq!(b.evict_key(vb("b"), b"b"), Ok(true));
    // Written again: dirty until the next flush, whatever the persisted seqno was.
    set(b, "b", b"w").unwrap();
    assert_eq!(
        b.observe(vb("b"), b"b").map(|r| r.0),
        Ok(KeyState::NotPersisted)
    );
    assert_eq!(b.evict_key(vb("b"), b"b"), Err(EngineStatus::KeyExists));
    assert_eq!(dirty("b"), 1);
    b.flush_all().unwrap();
    assert_eq!(b.evict_key(vb("b"), b"b"), Ok(true));
    assert_eq!(get(b, "a").unwrap(), b"v");
}

#[test]
fn a_write_racing_a_background_fetch_wins() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir.path(), 64 << 20);
    let b = &f.bucket;
    set(b, "k", b"old").unwrap();
    b.flush_all().unwrap();
    assert_eq!(b.evict_key(vb("k"), b"k"), Ok(true));
    // The GET queues a fetch; a waiter registers as the front end's would.
    assert_eq!(get(b, "k"), Err(EngineStatus::WouldBlock));
    let outcome = Arc::new(std::sync::Mutex::new(None));
    let o = Arc::clone(&outcome);
    b.when_fetched(
        vb("k"),
        b"k",
        Box::new(move |r| *o.lock().unwrap() = Some(r)),
    );
    // A SET lands while the fetch is queued.
    set(b, "k", b"new").unwrap();
    run_fetcher(&f);
    assert_eq!(*outcome.lock().unwrap(), Some(Ok(())));
    assert_eq!(
        get(b, "k").unwrap(),
        b"new",
        "the fetched value never overwrites"
    );

    // The same with the new version persisted and ejected before the fetch reads the
    // disk: the fetch restores the newest version.
    b.flush_all().unwrap();
    assert_eq!(b.evict_key(vb("k"), b"k"), Ok(true));
    assert_eq!(get(b, "k"), Err(EngineStatus::WouldBlock));
    set(b, "k", b"newer").unwrap();
    b.flush_all().unwrap();
    assert_eq!(b.evict_key(vb("k"), b"k"), Ok(true));
    run_fetcher(&f);
    assert_eq!(get(b, "k").unwrap(), b"newer");

    // A delete while the fetch is queued: the key stays deleted.
    assert_eq!(b.evict_key(vb("k"), b"k"), Ok(true));
    assert_eq!(get(b, "k"), Err(EngineStatus::WouldBlock));
    b.remove(epkv_engine_api::RemoveRequest {
        vbid: vb("k"),
        key: b"k",
        cas: Cas::ANY,
        durability: None,
    })
    .unwrap();
    run_fetcher(&f);
    assert_eq!(get(b, "k"), Err(EngineStatus::KeyNotFound));
}

#[test]
fn fetches_are_coalesced_and_every_waiter_is_told() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir.path(), 64 << 20);
    let b = &f.bucket;
    for i in 0..10 {
        set(b, &format!("key-{i}"), format!("value-{i}").as_bytes()).unwrap();
    }
    b.flush_all().unwrap();
    for i in 0..10 {
        let k = format!("key-{i}");
        assert_eq!(b.evict_key(vb(&k), k.as_bytes()), Ok(true));
    }
    assert_eq!(b.evict_key(vb("key-0"), b"key-0"), Ok(false), "already out");
    let told = Arc::new(AtomicUsize::new(0));
    for i in 0..10 {
        let k = format!("key-{i}");
        for _ in 0..3 {
            assert_eq!(get(b, &k), Err(EngineStatus::WouldBlock));
            let t = Arc::clone(&told);
            b.when_fetched(
                vb(&k),
                k.as_bytes(),
                Box::new(move |r| {
                    assert_eq!(r, Ok(()));
                    t.fetch_add(1, Ordering::Relaxed);
                }),
            );
        }
    }
    let stat = |name: &str| -> u64 {
        let mut v = 0;
        b.stats("", &mut |k, s| {
            if k == name {
                v = s.parse().unwrap();
            }
        })
        .unwrap();
        v
    };
    assert_eq!(stat("ep_bg_fetched"), 0);
    run_fetcher(&f);
    assert_eq!(told.load(Ordering::Relaxed), 30);
    assert_eq!(stat("ep_bg_fetched"), 10, "one disk read per key");
    for i in 0..10 {
        assert_eq!(
            get(b, &format!("key-{i}")).unwrap(),
            format!("value-{i}").as_bytes()
        );
    }
    // A dirty document cannot be ejected.
    set(b, "key-0", b"dirty").unwrap();
    assert_eq!(
        b.evict_key(vb("key-0"), b"key-0"),
        Err(EngineStatus::KeyExists)
    );
}

fn stat(b: &Bucket, name: &str) -> u64 {
    let mut v = None;
    b.stats("", &mut |k, s| {
        if k == name {
            v = s.parse().ok();
        }
    })
    .unwrap();
    v.unwrap_or_else(|| panic!("no stat {name}"))
}

fn remove(b: &Bucket, key: &str) -> Result<(), EngineStatus> {
    b.remove(RemoveRequest {
        vbid: vb(key),
        key: key.as_bytes(),
        cas: Cas::ANY,
        durability: None,
    })
    .map(|_| ())
}

fn store(
    b: &Bucket,
    op: StoreOp,
    key: &str,
    value: &[u8],
    cas: Cas,
    expiry: Expiry,
) -> Result<Cas, EngineStatus> {
    b.store(StoreRequest {
        op,
        vbid: vb(key),
        key: key.as_bytes(),
        value,
        flags: 7,
        expiry,
        preserve_ttl: false,
        datatype: Datatype::RAW,
        cas,
        durability: None,
    })
    .map(|m| m.cas)
}

/// A full-eviction bucket holding `keys` (value `v-<key>`), persisted and evicted whole.
fn full_with_evicted(dir: &Path, keys: &[&str]) -> Fixture {
    let f = open_with(dir, 64 << 20, EvictionPolicy::Full);
    for k in keys {
        set(&f.bucket, k, format!("v-{k}").as_bytes()).unwrap();
    }
    f.bucket.flush_all().unwrap();
    for k in keys {
        assert_eq!(f.bucket.evict_key(vb(k), k.as_bytes()), Ok(true), "{k}");
    }
    assert_eq!(
        f.bucket.item_count(),
        keys.len(),
        "evicted documents still count"
    );
    f
}

#[test]
fn full_eviction_answers_absent_keys_from_the_key_filter_without_reading_the_disk() {
    let dir = tempfile::tempdir().unwrap();
    let f = full_with_evicted(dir.path(), &["here"]);
    let b = &f.bucket;
    let before = stat(b, "ep_bloom_filter_negatives");
    // Never written: certainly absent, answered at once (no fetch, so no disk read).
    for i in 0..100 {
        assert_eq!(
            get(b, &format!("never-{i}")),
            Err(EngineStatus::KeyNotFound)
        );
    }
    let negatives = stat(b, "ep_bloom_filter_negatives") - before;
    assert!(
        negatives >= 95,
        "about 1% false positives, got {negatives} negatives of 100"
    );
    // An evicted document is read back, whole.
    assert_eq!(get(b, "here"), Err(EngineStatus::WouldBlock));
    assert_eq!(read_through(&f, "here").unwrap(), b"v-here");
    assert_eq!(stat(b, "ep_bg_fetched"), 1);
    assert_eq!(b.item_count(), 1);
    assert_eq!(stat(b, "curr_items"), 1);
}

#[test]
fn full_eviction_a_write_racing_a_lookup_wins() {
    let dir = tempfile::tempdir().unwrap();
    let f = full_with_evicted(dir.path(), &["k"]);
    let b = &f.bucket;
    // A GET puts a placeholder and queues a fetch; a SET replaces the placeholder.
    assert_eq!(get(b, "k"), Err(EngineStatus::WouldBlock));
    set(b, "k", b"new").unwrap();
    run_fetcher(&f);
    assert_eq!(
        get(b, "k").unwrap(),
        b"new",
        "the fetched document never overwrites"
    );

    // The write persisted and evicted, and a new lookup begun, before the first lookup's
    // read restores: the old read must not be restored over the new placeholder.
    b.flush_all().unwrap();
    assert_eq!(b.evict_key(vb("k"), b"k"), Ok(true));
    assert_eq!(get(b, "k"), Err(EngineStatus::WouldBlock));
    set(b, "k", b"newer").unwrap();
    b.flush_all().unwrap();
    assert_eq!(b.evict_key(vb("k"), b"k"), Ok(true));
    assert_eq!(
        get(b, "k"),
        Err(EngineStatus::WouldBlock),
        "a new placeholder"
    );
    assert_eq!(read_through(&f, "k").unwrap(), b"newer");

    // A delete of a document out of memory looks it up first, then leaves a tombstone
    // that answers without the disk until it is persisted.
    assert_eq!(b.evict_key(vb("k"), b"k"), Ok(true));
    assert_eq!(remove(b, "k"), Err(EngineStatus::WouldBlock));
    assert_eq!(through(&f, "k", || remove(b, "k")), Ok(()));
    assert_eq!(get(b, "k"), Err(EngineStatus::KeyNotFound));
    assert_eq!(b.item_count(), 0);
    b.flush_all().unwrap();
    // The persisted tombstone leaves memory; the key filter still has the key, so the
    // disk is read once, finds the tombstone, and remembers the key as absent.
    b.run_expiry_pass();
    let fp = stat(b, "ep_bloom_filter_false_positives");
    assert_eq!(get(b, "k"), Err(EngineStatus::WouldBlock));
    assert_eq!(read_through(&f, "k"), Err(EngineStatus::KeyNotFound));
    assert_eq!(
        remove(b, "k"),
        Err(EngineStatus::KeyNotFound),
        "no second lookup"
    );
    assert_eq!(stat(b, "ep_bloom_filter_false_positives"), fp + 1);
    assert_eq!(b.item_count(), 0);
}

#[test]
fn full_eviction_counters_cas_add_and_expiry_work_on_documents_out_of_memory() {
    let dir = tempfile::tempdir().unwrap();
    let f = open_with(dir.path(), 64 << 20, EvictionPolicy::Full);
    let b = &f.bucket;
    let incr = |key: &str| {
        b.arithmetic(ArithmeticRequest {
            op: ArithmeticOp::Increment,
            vbid: vb(key),
            key: key.as_bytes(),
            delta: 5,
            initial: 100,
            expiry_raw: 0,
            cas: Cas::ANY,
            durability: None,
        })
        .map(|(v, _)| v)
    };
    assert_eq!(through(&f, "ctr", || incr("ctr")), Ok(100));
    let cas = store(b, StoreOp::Set, "doc", b"body", Cas::ANY, Expiry::Never).unwrap();
    store(
        b,
        StoreOp::Set,
        "ttl",
        b"short",
        Cas::ANY,
        Expiry::from_wire(10),
    )
    .unwrap();
    b.flush_all().unwrap();
    for k in ["ctr", "doc", "ttl"] {
        assert_eq!(b.evict_key(vb(k), k.as_bytes()), Ok(true));
    }
    assert_eq!(b.item_count(), 3);
    // The counter goes on from its value on disk.
    assert_eq!(through(&f, "ctr", || incr("ctr")), Ok(105));
    // ADD of an existing document out of memory: its metadata is read back, no value.
    let meta_before = stat(b, "ep_bg_meta_fetched");
    assert_eq!(
        through(&f, "doc", || store(
            b,
            StoreOp::Add,
            "doc",
            b"x",
            Cas::ANY,
            Expiry::Never
        )),
        Err(EngineStatus::KeyExists)
    );
    assert_eq!(stat(b, "ep_bg_meta_fetched"), meta_before + 1);
    // The CAS from before the eviction still matches.
    assert_eq!(
        through(&f, "doc", || store(
            b,
            StoreOp::Replace,
            "doc",
            b"2",
            Cas(cas.0 + 1),
            Expiry::Never
        )),
        Err(EngineStatus::KeyExists)
    );
    let cas2 = through(&f, "doc", || {
        store(b, StoreOp::Replace, "doc", b"2", cas, Expiry::Never)
    })
    .unwrap();
    assert!(cas2 > cas);
    assert_eq!(read_through(&f, "doc").unwrap(), b"2");
    // Expired while out of memory: read back, expired on access, gone for good.
    f.exec.advance(Duration::from_secs(11));
    assert_eq!(read_through(&f, "ttl"), Err(EngineStatus::KeyNotFound));
    assert_eq!(b.item_count(), 2);
    b.flush_all().unwrap();
    while b.run_item_pager().more {}
    assert_eq!(read_through(&f, "ttl"), Err(EngineStatus::KeyNotFound));
    // ADD of an absent key is answered from the filter or after one lookup.
    assert_eq!(
        through(&f, "fresh", || store(
            b,
            StoreOp::Add,
            "fresh",
            b"1",
            Cas::ANY,
            Expiry::Never
        ))
        .map(|_| ()),
        Ok(())
    );
    assert_eq!(b.item_count(), 3);
}

#[test]
fn full_eviction_a_blind_set_of_an_evicted_key_is_counted_once_after_the_flush() {
    let dir = tempfile::tempdir().unwrap();
    let f = full_with_evicted(dir.path(), &["a", "b"]);
    let b = &f.bucket;
    // SET without CAS does not read the disk: until the flush the count may be high.
    set(b, "a", b"again").unwrap();
    set(b, "brand-new", b"1").unwrap();
    b.flush_all().unwrap();
    assert_eq!(b.item_count(), 3);
    assert_eq!(stat(b, "curr_items"), 3);
    assert_eq!(read_through(&f, "a").unwrap(), b"again");
    assert_eq!(read_through(&f, "b").unwrap(), b"v-b");
}

#[test]
fn full_eviction_restarts_with_documents_left_on_disk_and_compaction_rebuilds_the_filter() {
    let dir = tempfile::tempdir().unwrap();
    {
        let f = open_with(dir.path(), 64 << 20, EvictionPolicy::Full);
        for i in 0..600 {
            set(&f.bucket, &format!("w-{i}"), &[b'x'; 2000]).unwrap();
        }
        f.bucket.flush_all().unwrap();
        f.bucket.shutdown();
    }
    // 600 x 2 KB do not fit under the low watermark of a 1 MiB quota: warmup leaves the
    // rest on disk, known to the key filter.
    let f = open_with(dir.path(), 1 << 20, EvictionPolicy::Full);
    let b = &f.bucket;
    assert_eq!(b.item_count(), 600);
    assert!(stat(b, "ep_num_non_resident") > 0 || stat(b, "vb_active_perc_mem_resident") < 100);
    for i in 0..600 {
        assert_eq!(
            read_through(&f, &format!("w-{i}")).unwrap().len(),
            2000,
            "w-{i}"
        );
    }
    assert_eq!(b.item_count(), 600);
    for i in 0..600 {
        let k = format!("w-{i}");
        assert_eq!(through(&f, &k, || remove(b, &k)), Ok(()));
    }
    b.flush_all().unwrap();
    let rebuilds = stat(b, "ep_bloom_filter_rebuilds");
    b.compact_all().unwrap();
    assert!(stat(b, "ep_bloom_filter_rebuilds") > rebuilds);
    // The expiry pass drops the persisted tombstones from memory.
    b.run_expiry_pass();
    // Rebuilt without the deleted keys: absent without a disk read.
    let negatives = stat(b, "ep_bloom_filter_negatives");
    for i in 0..600 {
        assert_eq!(
            get(b, &format!("w-{i}")).err(),
            Some(EngineStatus::KeyNotFound)
        );
    }
    assert!(stat(b, "ep_bloom_filter_negatives") - negatives >= 580);
    assert_eq!(b.item_count(), 0);
}

#[derive(Debug, Clone)]
enum Op {
    Set(u8, u16),
    Flush,
    Page,
    Get(u8),
    Del(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..96, 1u16..60_000).prop_map(|(k, len)| Op::Set(k, len)),
        2 => Just(Op::Flush),
        2 => Just(Op::Page),
        3 => (0u8..96).prop_map(Op::Get),
        1 => (0u8..96).prop_map(Op::Del),
    ]
}

/// Reads `key` as the front end would (see [`through`]).
fn read_through(f: &Fixture, key: &str) -> Result<Vec<u8>, EngineStatus> {
    through(f, key, || get(&f.bucket, key))
}

/// Runs `op` on `key` as the front end would: on WouldBlock, runs the background tasks
/// (moving the manual clock on, for a fetch retried while memory is full) and runs it
/// again.
fn through<T>(
    f: &Fixture,
    key: &str,
    op: impl Fn() -> Result<T, EngineStatus>,
) -> Result<T, EngineStatus> {
    let told = Arc::new(std::sync::Mutex::new(None));
    for _ in 0..200 {
        match op() {
            Err(EngineStatus::WouldBlock) => {
                let t = Arc::clone(&told);
                f.bucket.when_fetched(
                    vb(key),
                    key.as_bytes(),
                    Box::new(move |r| *t.lock().unwrap() = Some(r)),
                );
                while told.lock().unwrap().is_none() {
                    run_fetcher(f);
                    f.exec.advance(Duration::from_millis(2));
                }
                if let Some(Err(e)) = told.lock().unwrap().take() {
                    return Err(e);
                }
            }
            other => return other,
        }
    }
    op()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Against a model of which keys are dirty, with value or full eviction: a document
    /// written since the last flush is always resident (a GET answers at once, never
    /// WouldBlock), whatever the pager does; every document reads back with its model
    /// value, through a fetch if need be; deletes stick; after each flush the item count
    /// is the model's.
    #[test]
    fn the_pager_never_ejects_an_unpersisted_value(
        ops in prop::collection::vec(op(), 1..120),
        full in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        // Small enough that a few dozen values of up to 60 KB pass the high watermark.
        let policy = if full { EvictionPolicy::Full } else { EvictionPolicy::Value };
        let f = open_with(dir.path(), 1 << 20, policy);
        let mut model: HashMap<String, (Vec<u8>, bool)> = HashMap::new();
        for op in ops {
            match op {
                Op::Set(k, len) => {
                    let key = format!("p-{k}");
                    let value = vec![k; usize::from(len)];
                    match set(&f.bucket, &key, &value) {
                        Ok(()) => {
                            model.insert(key, (value, true));
                        }
                        // Memory full of dirty items: refused, nothing changed.
                        Err(EngineStatus::TempFail) => {}
                        Err(e) => prop_assert!(false, "SET {key}: {e}"),
                    }
                }
                Op::Flush => {
                    f.bucket.flush_all().unwrap();
                    for v in model.values_mut() {
                        v.1 = false;
                    }
                    prop_assert_eq!(f.bucket.item_count(), model.len());
                }
                Op::Del(k) => {
                    let key = format!("p-{k}");
                    match through(&f, &key, || remove(&f.bucket, &key)) {
                        Ok(()) => prop_assert!(model.remove(&key).is_some(), "deleted {}", key),
                        Err(EngineStatus::KeyNotFound) => prop_assert!(!model.contains_key(&key)),
                        // No room for the lookup's placeholder: nothing changed.
                        Err(EngineStatus::TempFail) => {}
                        Err(e) => prop_assert!(false, "DELETE {key}: {e}"),
                    }
                }
                Op::Page => while f.bucket.run_item_pager().more {},
                Op::Get(k) => {
                    let key = format!("p-{k}");
                    let got = read_through(&f, &key);
                    if got == Err(EngineStatus::TempFail) {
                        // A value read back that never found room: memory is full of
                        // documents not yet persisted, which nothing may eject.
                        prop_assert!(f.bucket.mem_used() > (1 << 20) / 100 * 85);
                        continue;
                    }
                    match model.get(&key) {
                        Some((v, _)) => prop_assert_eq!(got, Ok(v.clone())),
                        None => prop_assert_eq!(got, Err(EngineStatus::KeyNotFound)),
                    }
                }
            }
            for (key, (value, dirty)) in &model {
                if *dirty {
                    prop_assert_eq!(get(&f.bucket, key), Ok(value.clone()), "{} is dirty", key);
                }
            }
            prop_assert!(f.bucket.mem_used() <= 1 << 20);
        }
    }
}

/// GET_META and OBSERVE under both policies: live documents, deletions before and after
/// they are persisted (the tombstone stays in memory until persisted, then is read back
/// from disk), keys that never existed, and documents out of memory.
#[test]
fn get_meta_and_observe_see_tombstones_and_documents_on_disk_only() {
    use epkv_engine_api::KeyState;
    for policy in [EvictionPolicy::Value, EvictionPolicy::Full] {
        let dir = tempfile::tempdir().unwrap();
        let f = open_with(dir.path(), 64 << 20, policy);
        let b = &f.bucket;
        let meta = |k: &str| through(&f, k, || b.get_meta(vb(k), k.as_bytes()));
        let observe = |k: &str| through(&f, k, || b.observe(vb(k), k.as_bytes()));
        let cas = store(b, StoreOp::Set, "m", b"v", Cas::ANY, Expiry::from_wire(0)).unwrap();
        let m = meta("m").unwrap();
        assert!(
            !m.deleted && m.cas == cas && m.flags == 7,
            "{policy:?}: {m:?}"
        );
        assert_eq!(observe("m").unwrap(), (KeyState::NotPersisted, cas));
        b.flush_all().unwrap();
        assert_eq!(observe("m").unwrap(), (KeyState::Persisted, cas));
        // Deleted, not yet persisted: the tombstone answers.
        remove(b, "m").unwrap();
        let dm = meta("m").unwrap();
        assert!(dm.deleted && dm.seqno > m.seqno && dm.rev_seqno == m.rev_seqno + 1);
        assert_eq!(observe("m").unwrap().0, KeyState::LogicallyDeleted);
        // Persisted, and dropped from memory: read back from disk, still deleted.
        b.flush_all().unwrap();
        b.run_expiry_pass();
        assert_eq!(
            b.get_meta(vb("m"), b"m"),
            Err(EngineStatus::WouldBlock),
            "{policy:?}"
        );
        assert_eq!(meta("m").unwrap(), dm, "{policy:?}");
        assert_eq!(read_through(&f, "m"), Err(EngineStatus::KeyNotFound));
        assert_eq!(observe("m").unwrap().0, KeyState::NotFound);
        // Never written: one lookup (or none, with the key filter), then known absent.
        assert_eq!(meta("never"), Err(EngineStatus::KeyNotFound));
        assert_eq!(
            b.get_meta(vb("never"), b"never"),
            Err(EngineStatus::KeyNotFound)
        );
        assert_eq!(observe("never").unwrap(), (KeyState::NotFound, Cas(0)));
        // A document out of memory (full eviction: wholly) keeps its metadata.
        let cas2 = store(b, StoreOp::Set, "n", b"w", Cas::ANY, Expiry::from_wire(0)).unwrap();
        b.flush_all().unwrap();
        assert_eq!(b.evict_key(vb("n"), b"n"), Ok(true));
        let n = meta("n").unwrap();
        assert!(!n.deleted && n.cas == cas2);
        assert_eq!(observe("n").unwrap(), (KeyState::Persisted, cas2));
        // Writing over a key known absent works as for any new key.
        set(b, "never", b"now").unwrap();
        assert!(!meta("never").unwrap().deleted);
        assert_eq!(b.item_count(), 2, "{policy:?}");
    }
}

#[test]
fn memory_pressure_flushes_without_waiting_for_the_batching_delay() {
    // The manual clock never reaches the 10 s delay: only the item pager's urgent flush can
    // persist (and so let it evict) these writes.
    let dir = tempfile::tempdir().unwrap();
    let f = open_batching(dir.path(), 4 << 20, Duration::from_secs(10));
    let b = &f.bucket;
    let value = vec![b'x'; 2048];
    let mut written = Vec::new();
    for i in 0..4000 {
        let key = format!("pressure-{i}");
        if set(b, &key, &value).is_err() {
            break;
        }
        written.push(key);
        if stat(b, "mem_used") > stat(b, "ep_mem_high_wat") {
            break;
        }
    }
    assert!(
        stat(b, "mem_used") > stat(b, "ep_mem_high_wat"),
        "the quota was not reached"
    );
    let queued = |b: &Bucket| {
        let mut n = None;
        b.stats("persistence", &mut |k, v| {
            if k == "ep_queue_size" {
                n = v.parse::<u64>().ok();
            }
        })
        .unwrap();
        n.expect("ep_queue_size")
    };
    assert!(queued(b) > 0, "nothing flushed before the pager ran");
    // The high watermark woke the item pager; its cycle makes the flush urgent.
    for _ in 0..20 {
        f.exec.run_until_idle(1000);
        if queued(b) == 0 && stat(b, "mem_used") <= stat(b, "ep_mem_low_wat") {
            break;
        }
        b.run_item_pager();
    }
    assert_eq!(queued(b), 0, "the writes were not flushed");
    assert!(
        stat(b, "mem_used") <= stat(b, "ep_mem_high_wat"),
        "the pager could not evict the flushed values"
    );
    for key in written.iter().step_by(97) {
        assert_eq!(read_through(&f, key).map(|v| v.len()), Ok(2048), "{key}");
    }
}
