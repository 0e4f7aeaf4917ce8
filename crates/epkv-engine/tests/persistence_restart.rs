//! Persistence through the engine: writes are queued per vBucket, flushed to
//! epkv-storage, reported persisted, and served again after a restart (warmup).

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions panic on failure"
)]
use epkv_engine::{
    Bucket, BucketConfig, EngineClock, FlusherMode, PersistenceConfig, STATS, StatGroup,
};
use epkv_engine_api::{
    ArithmeticOp, ArithmeticRequest, Engine, EngineStatus, Expiry, RemoveRequest, StoreOp,
    StoreRequest,
};
use epkv_types::{Cas, Datatype, NUM_VBUCKETS, Vbid, vbucket_for_key};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn open(dir: &Path, flusher: FlusherMode) -> Arc<Bucket> {
    let mut p = PersistenceConfig::new(dir);
    p.flusher = flusher;
    p.shards = 3;
    p.journal_prealloc_bytes = 64 * 1024;
    start(p, true)
}

/// A bucket persisting as `p` says (no expiry pager), once warmed up.
fn start(p: PersistenceConfig, flush_enabled: bool) -> Arc<Bucket> {
    let b = Bucket::new(
        BucketConfig {
            expiry_pager_interval: Duration::ZERO,
            flush_enabled,
            persistence: Some(p),
            ..BucketConfig::default()
        },
        EngineClock::System,
    )
    .unwrap();
    assert!(b.wait_warmup(Duration::from_secs(60)), "warmup finishes");
    b
}

fn vb(key: &str) -> Vbid {
    vbucket_for_key(key.as_bytes(), NUM_VBUCKETS)
}

fn must_set(b: &Bucket, key: &str, value: &str, flags: u32) -> epkv_engine_api::MutationInfo {
    b.store(StoreRequest {
        op: StoreOp::Set,
        vbid: vb(key),
        key: key.as_bytes(),
        value: value.as_bytes(),
        flags,
        expiry: Expiry::Never,
        preserve_ttl: false,
        datatype: Datatype::RAW,
        cas: Cas::ANY,
        durability: None,
    })
    .unwrap()
}

fn must_stats(b: &Bucket, group: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    b.stats(group, &mut |k, v| {
        m.insert(k.to_owned(), v.to_owned());
    })
    .unwrap();
    m
}

#[test]
fn clean_shutdown_flushes_everything_and_restart_serves_it() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), FlusherMode::Tasks);
    let mut want = BTreeMap::new();
    for i in 0..300 {
        let key = format!("key-{i}");
        let info = must_set(&b, &key, &format!("value-{i}"), i);
        want.insert(key, (format!("value-{i}"), info.cas, i));
    }
    // Overwrites, a delete, a counter.
    let info = must_set(&b, "key-7", "seven", 77);
    want.insert("key-7".into(), ("seven".into(), info.cas, 77));
    b.remove(RemoveRequest {
        vbid: vb("key-8"),
        key: b"key-8",
        cas: Cas::ANY,
        durability: None,
    })
    .unwrap();
    want.remove("key-8");
    let (_, info) = b
        .arithmetic(ArithmeticRequest {
            op: ArithmeticOp::Increment,
            vbid: vb("ctr"),
            key: b"ctr",
            delta: 1,
            initial: 41,
            expiry_raw: 0,
            cas: Cas::ANY,
            durability: None,
        })
        .unwrap();
    want.insert("ctr".into(), ("41".into(), info.cas, 0));
    let high_before = b.high_seqno(vb("key-7")).unwrap();
    b.shutdown();
    drop(b);

    let b = open(dir.path(), FlusherMode::Tasks);
    for (key, (value, cas, flags)) in &want {
        let item = b.get(vb(key), key.as_bytes()).unwrap();
        assert_eq!(item.value.as_ref(), value.as_bytes(), "{key}");
        assert_eq!(item.cas, *cas, "{key}");
        assert_eq!(item.flags, *flags, "{key}");
    }
    assert_eq!(b.get(vb("key-8"), b"key-8"), Err(EngineStatus::KeyNotFound));
    assert_eq!(b.high_seqno(vb("key-7")), Some(high_before));
    assert_eq!(b.persisted_seqno(vb("key-7")), Some(high_before));
    // New writes continue above the restored seqno and CAS.
    let again = must_set(&b, "key-7", "eight", 0);
    assert!(again.seqno.0 > high_before);
    assert!(again.cas > want["key-7"].1);
    let p = must_stats(&b, "persistence");
    assert_eq!(p["ep_persistence_enabled"], "true");
    assert_eq!(p["ep_warmup_value_count"], (want.len()).to_string());
    b.shutdown();
}

#[test]
fn repeated_writes_to_a_key_are_flushed_once() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), FlusherMode::Manual);
    for i in 0..100 {
        must_set(&b, "hot", &i.to_string(), 0);
    }
    must_set(&b, "cold", "x", 0);
    assert_eq!(must_stats(&b, "persistence")["ep_queue_size"], "2");
    assert_eq!(b.flush_all().unwrap(), 2);
    assert_eq!(b.persisted_seqno(vb("hot")), b.high_seqno(vb("hot")));
    let k = must_stats(&b, "persistence");
    assert_eq!(k["ep_total_persisted"], "2");
    assert_eq!(k["ep_queue_size"], "0");
    b.shutdown();
}

#[test]
fn waiters_complete_when_the_flusher_persists_their_seqno() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), FlusherMode::Manual);
    let info = must_set(&b, "k", "v", 0);
    let (tx, rx) = std::sync::mpsc::channel();
    b.when_persisted(vb("k"), info.seqno.0, move |p| tx.send(p).unwrap())
        .unwrap();
    let fut = b.wait_persisted(vb("k"), info.seqno.0).unwrap();
    assert!(rx.try_recv().is_err(), "completed before the flush");
    assert_eq!(fut.try_get(), None);
    b.flush_all().unwrap();
    assert_eq!(rx.try_recv().unwrap(), info.seqno.0);
    assert_eq!(fut.try_get(), Some(info.seqno.0));
    // Already persisted: completes at once.
    let (tx, rx) = std::sync::mpsc::channel();
    b.when_persisted(vb("k"), info.seqno.0, move |p| tx.send(p).unwrap())
        .unwrap();
    assert_eq!(rx.try_recv().unwrap(), info.seqno.0);
    let s = must_stats(&b, &format!("vbucket-seqno {}", vb("k").0));
    assert_eq!(
        s[&format!("vb_{}:last_persisted_seqno", vb("k").0)],
        info.seqno.0.to_string()
    );
    b.shutdown();
}

#[test]
fn background_flusher_persists_without_being_asked() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), FlusherMode::Tasks);
    let info = must_set(&b, "k", "v", 0);
    let (tx, rx) = std::sync::mpsc::channel();
    b.when_persisted(vb("k"), info.seqno.0, move |p| tx.send(p).unwrap())
        .unwrap();
    // Event-driven wait with a generous bound; the flusher normally answers in
    // milliseconds.
    let p = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    assert!(p >= info.seqno.0);
    let obs = b.vbucket_seqnos(vb("k")).unwrap();
    assert!(obs.persisted_seqno.0 >= info.seqno.0);
    b.shutdown();
}

fn open_with_delay(dir: &Path, delay: Duration) -> Arc<Bucket> {
    let mut p = PersistenceConfig::new(dir);
    p.shards = 2;
    p.flush_delay = delay;
    start(p, false)
}

/// Polls (bounded) until `vbid` has persisted `seqno`; whether it did.
fn persisted_within(b: &Bucket, vbid: Vbid, seqno: u64, bound: Duration) -> bool {
    let step = Duration::from_millis(5);
    for _ in 0..bound.as_millis() / step.as_millis() {
        if b.persisted_seqno(vbid).unwrap() >= seqno {
            return true;
        }
        std::thread::sleep(step);
    }
    false
}

#[test]
fn a_waiter_flushes_at_once_whatever_the_batching_delay() {
    // A 10 s delay, far longer than the bounds below: only the waiter's urgent flush can
    // persist these writes in time.
    let dir = tempfile::tempdir().unwrap();
    let b = open_with_delay(dir.path(), Duration::from_secs(10));
    let info = must_set(&b, "k", "v", 0);
    let (tx, rx) = std::sync::mpsc::channel();
    b.when_persisted(vb("k"), info.seqno.0, move |p| tx.send(p).unwrap())
        .unwrap();
    assert!(rx.recv_timeout(Duration::from_secs(5)).unwrap() >= info.seqno.0);
    // Polling OBSERVE_SEQNO is how PersistTo waits: it makes the flush urgent too.
    let info = must_set(&b, "polled", "v", 0);
    let vbid = vb("polled");
    assert!(b.vbucket_seqnos(vbid).unwrap().persisted_seqno.0 < info.seqno.0);
    assert!(persisted_within(
        &b,
        vbid,
        info.seqno.0,
        Duration::from_secs(5)
    ));
    // And so does polling OBSERVE: the key reads NotPersisted, then Persisted.
    let info = must_set(&b, "observed", "v", 0);
    let vbid = vb("observed");
    let (state, _) = b.observe(vbid, b"observed").unwrap();
    assert_eq!(state, epkv_engine_api::KeyState::NotPersisted);
    assert!(persisted_within(
        &b,
        vbid,
        info.seqno.0,
        Duration::from_secs(5)
    ));
    assert_eq!(
        b.observe(vbid, b"observed").unwrap().0,
        epkv_engine_api::KeyState::Persisted
    );
    b.shutdown();
}

#[test]
fn writes_nobody_waits_on_are_flushed_in_batches_after_the_delay() {
    let dir = tempfile::tempdir().unwrap();
    let b = open_with_delay(dir.path(), Duration::from_millis(50));
    let commits = |b: &Bucket| -> u64 {
        must_stats(b, "persistence")["ep_commit_num"]
            .parse()
            .unwrap()
    };
    let before = commits(&b);
    // Many writes to vBuckets of both shards within the delay: a few commits carry them.
    let infos: Vec<_> = (0..200)
        .map(|i| {
            let key = format!("batch-{i}");
            (vb(&key), must_set(&b, &key, "v", 0).seqno.0)
        })
        .collect();
    for (vbid, seqno) in &infos {
        assert!(persisted_within(&b, *vbid, *seqno, Duration::from_secs(30)));
    }
    let used = commits(&b) - before;
    assert!(used >= 1, "the writes were committed");
    assert!(
        used < 100,
        "200 writes within the delay took {used} commits: they were not batched"
    );
    b.shutdown();
}

#[test]
fn persisted_writes_survive_a_drop_without_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), FlusherMode::Manual);
    let info = must_set(&b, "durable", "yes", 0);
    b.flush_all().unwrap();
    assert_eq!(b.persisted_seqno(vb("durable")), Some(info.seqno.0));
    must_set(&b, "maybe", "unflushed", 0);
    // No shutdown: no final flush, no checkpoint (the journal holds what was persisted).
    drop(b);
    let b = open(dir.path(), FlusherMode::Manual);
    assert_eq!(
        b.get(vb("durable"), b"durable").unwrap().value.as_ref(),
        b"yes"
    );
    assert!(b.high_seqno(vb("durable")).unwrap() >= info.seqno.0);
    // Unclean shutdown: a new failover branch at the persisted seqno, as KV-Engine does.
    let seqnos = b.vbucket_seqnos(vb("durable")).unwrap();
    assert_eq!(seqnos.failover_log.len(), 2);
    assert_eq!(seqnos.failover_log[0].seqno.0, info.seqno.0);
    assert_eq!(
        must_stats(&b, "persistence")["ep_warmup_unclean_shutdown"],
        "true"
    );
    b.shutdown();
    drop(b);
    // That shutdown was clean: no new branch this time.
    let b = open(dir.path(), FlusherMode::Manual);
    assert_eq!(
        b.vbucket_seqnos(vb("durable")).unwrap().failover_log.len(),
        2
    );
    assert_eq!(
        must_stats(&b, "persistence")["ep_warmup_unclean_shutdown"],
        "false"
    );
    b.shutdown();
}

#[test]
fn flush_all_documents_is_persisted_too() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), FlusherMode::Manual);
    must_set(&b, "a", "1", 0);
    must_set(&b, "b", "2", 0);
    b.flush_all().unwrap();
    b.flush().unwrap();
    must_set(&b, "c", "3", 0);
    b.shutdown();
    drop(b);
    let b = open(dir.path(), FlusherMode::Manual);
    assert_eq!(b.get(vb("a"), b"a"), Err(EngineStatus::KeyNotFound));
    assert_eq!(b.get(vb("b"), b"b"), Err(EngineStatus::KeyNotFound));
    assert_eq!(b.get(vb("c"), b"c").unwrap().value.as_ref(), b"3");
    b.shutdown();
}

#[test]
fn a_memory_only_bucket_reports_no_persistence() {
    let b = Bucket::new(
        BucketConfig {
            expiry_pager_interval: Duration::ZERO,
            ..BucketConfig::default()
        },
        EngineClock::System,
    )
    .unwrap();
    must_set(&b, "k", "v", 0);
    assert_eq!(b.flush_all().unwrap(), 0);
    assert_eq!(b.persisted_seqno(vb("k")), Some(0));
    assert_eq!(
        b.when_persisted(vb("k"), 1, |_| {}),
        Err(EngineStatus::NotSupported)
    );
    assert_eq!(
        must_stats(&b, "persistence")["ep_persistence_enabled"],
        "false"
    );
    b.shutdown();
}

#[test]
fn compaction_purges_old_tombstones_and_expired_documents_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(epkv_executor::ManualClock::new(Duration::from_secs(
        1_700_000_000,
    )));
    let open_manual = || {
        let mut p = PersistenceConfig::new(dir.path());
        p.flusher = FlusherMode::Manual;
        p.shards = 2;
        p.compaction_interval = Duration::ZERO;
        let b = Bucket::new(
            BucketConfig {
                expiry_pager_interval: Duration::ZERO,
                persistence: Some(p),
                ..BucketConfig::default()
            },
            EngineClock::Custom(clock.clone()),
        )
        .unwrap();
        assert!(b.wait_warmup(Duration::from_secs(60)), "warmup finishes");
        b
    };
    let b = open_manual();
    for i in 0..20 {
        must_set(&b, &format!("k{i}"), "v", 0);
    }
    let mut later = Vec::new();
    for i in 0..5 {
        let key = format!("k{i}");
        b.remove(RemoveRequest {
            vbid: vb(&key),
            key: key.as_bytes(),
            cas: Cas::ANY,
            durability: None,
        })
        .unwrap();
        // A later write in the same vBucket, so the tombstone is not its newest document.
        let next = (0..)
            .map(|j| format!("later-{i}-{j}"))
            .find(|k| vb(k) == vb(&key))
            .unwrap();
        must_set(&b, &next, "v", 0);
        later.push(next);
    }
    b.store(StoreRequest {
        op: StoreOp::Set,
        vbid: vb("exp"),
        key: b"exp",
        value: b"soon gone",
        flags: 0,
        expiry: Expiry::from_wire(10),
        preserve_ttl: false,
        datatype: Datatype::RAW,
        cas: Cas::ANY,
        durability: None,
    })
    .unwrap();
    // Not the newest document of its vBucket: compaction never drops that one.
    let after = (0..)
        .map(|i| format!("after-{i}"))
        .find(|k| vb(k) == vb("exp"))
        .unwrap();
    must_set(&b, &after, "v", 0);
    b.flush_all().unwrap();
    clock.advance(Duration::from_secs(60));
    // First pass: the tombstones are newer than the (absent) previous compaction.
    let first = b.compact_all().unwrap();
    assert_eq!(first.tombstones_purged, 0);
    assert_eq!(first.expired, 1);
    // Second pass: they were on disk at the previous one, so they go.
    let second = b.compact_all().unwrap();
    assert_eq!(second.tombstones_purged, 5);
    assert_eq!(second.kept, 21);
    let p = must_stats(&b, "persistence");
    assert!(p["ep_compactions"].parse::<u64>().unwrap() >= 2);
    b.shutdown();
    drop(b);
    let b = open_manual();
    for i in 0..20 {
        let key = format!("k{i}");
        let got = b.get(vb(&key), key.as_bytes());
        if i < 5 {
            assert_eq!(got, Err(EngineStatus::KeyNotFound), "{key}");
        } else {
            assert_eq!(got.unwrap().value.as_ref(), b"v", "{key}");
        }
    }
    for k in &later {
        assert_eq!(b.get(vb(k), k.as_bytes()).unwrap().value.as_ref(), b"v");
    }
    assert_eq!(b.get(vb("exp"), b"exp"), Err(EngineStatus::KeyNotFound));
    b.shutdown();
}

#[test]
fn vbucket_states_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), FlusherMode::Manual);
    b.set_vbucket_state(Vbid(5), epkv_types::VBucketState::Replica)
        .unwrap();
    b.set_vbucket_state(Vbid(6), epkv_types::VBucketState::Dead)
        .unwrap();
    b.flush_all().unwrap();
    drop(b);
    // Even without a clean shutdown: the state changes were flushed.
    let b = open(dir.path(), FlusherMode::Manual);
    assert_eq!(
        b.vbucket_state(Vbid(5)),
        Some(epkv_types::VBucketState::Replica)
    );
    assert_eq!(
        b.vbucket_state(Vbid(6)),
        Some(epkv_types::VBucketState::Dead)
    );
    assert_eq!(
        b.vbucket_state(Vbid(7)),
        Some(epkv_types::VBucketState::Active)
    );
    b.shutdown();
}

/// Compactions while writers and the background flushers run: every write survives a
/// restart (the store catches up what was committed during each copy).
#[test]
fn compactions_during_writes_and_flushes_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), FlusherMode::Tasks);
    // A base to compact: a few hundred keys, some deleted.
    for i in 0..300 {
        must_set(&b, &format!("base-{i}"), &format!("v{i}"), 0);
    }
    for i in 0..50 {
        let key = format!("base-{i}");
        b.remove(RemoveRequest {
            vbid: vb(&key),
            key: key.as_bytes(),
            cas: Cas::ANY,
            durability: None,
        })
        .unwrap();
    }
    b.flush_all().unwrap();
    let writer = {
        let b = Arc::clone(&b);
        std::thread::spawn(move || {
            for round in 0..4 {
                for i in 0..300 {
                    must_set(&b, &format!("w-{i}"), &format!("r{round}"), round);
                }
            }
        })
    };
    let mut compactions = 0;
    while !writer.is_finished() && compactions < 5 {
        b.compact_all().unwrap();
        compactions += 1;
    }
    writer.join().unwrap();
    b.compact_all().unwrap();
    b.shutdown();
    drop(b);

    let b = open(dir.path(), FlusherMode::Tasks);
    for i in 0..300 {
        let key = format!("w-{i}");
        let item = b.get(vb(&key), key.as_bytes()).unwrap();
        assert_eq!(item.value.as_ref(), b"r3", "{key}");
        assert_eq!(item.flags, 3);
    }
    for i in 0..300 {
        let key = format!("base-{i}");
        match b.get(vb(&key), key.as_bytes()) {
            Ok(item) => {
                assert!(i >= 50, "{key} was deleted");
                assert_eq!(item.value.as_ref(), format!("v{i}").as_bytes());
            }
            Err(e) => {
                assert!(i < 50, "{key}: {e:?}");
                assert_eq!(e, EngineStatus::KeyNotFound);
            }
        }
    }
    assert!(compactions >= 1);
    b.shutdown();
}

#[test]
fn persistence_group_emits_exactly_the_stat_table_and_lists_the_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), FlusherMode::Tasks);
    must_set(&b, "k", "v", 0);
    let emitted = must_stats(&b, "persistence");
    let defined: Vec<_> = STATS
        .iter()
        .filter(|d| d.group == StatGroup::Persistence)
        .map(|d| d.name)
        .collect();
    assert_eq!(
        emitted.keys().map(String::as_str).collect::<Vec<_>>().len(),
        defined.len()
    );
    for name in &defined {
        assert!(emitted.contains_key(*name), "{name} missing");
    }
    // The flushers, appliers and background fetchers of the 3 shards, among others.
    let tasks = b.tasks();
    for prefix in ["flusher-", "bgfetcher-"] {
        assert_eq!(
            tasks.iter().filter(|t| t.name.starts_with(prefix)).count(),
            3,
            "{prefix}: {:?}",
            tasks.iter().map(|t| &t.name).collect::<Vec<_>>()
        );
    }
    b.shutdown();
}

/// A data directory written by the files backend (an earlier version's default) opens
/// with the default setting (`Auto`) as the files backend, with its data; a new one gets
/// the log.
#[test]
fn the_default_storage_follows_an_existing_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = PersistenceConfig::new(dir.path());
    p.flusher = FlusherMode::Manual;
    p.storage = epkv_engine::StorageBackend::Files;
    let b = start(p, false);
    must_set(&b, "old-key", "old", 0);
    b.flush_all().unwrap();
    b.shutdown();
    drop(b);
    let mut p = PersistenceConfig::new(dir.path());
    p.flusher = FlusherMode::Manual;
    assert_eq!(p.storage, epkv_engine::StorageBackend::Auto);
    let b = start(p, false);
    assert_eq!(
        b.get(vb("old-key"), b"old-key").unwrap().value.as_ref(),
        b"old"
    );
    assert_eq!(
        must_stats(&b, "persistence")["ep_persistence_storage"],
        "files"
    );
    b.shutdown();
    let fresh = tempfile::tempdir().unwrap();
    let mut p = PersistenceConfig::new(fresh.path());
    p.flusher = FlusherMode::Manual;
    let b = start(p, false);
    assert_eq!(
        must_stats(&b, "persistence")["ep_persistence_storage"],
        "log"
    );
    b.shutdown();
}

/// `n` keys that all map to vBucket 7.
fn keys_of_vb7(n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("frag-{i}"))
        .filter(|k| vb(k) == Vbid(7))
        .take(n)
        .collect()
}

#[test]
fn the_fragmentation_compactor_rewrites_overwritten_files_and_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = PersistenceConfig::new(dir.path());
    p.flusher = FlusherMode::Manual;
    p.shards = 2;
    p.compaction_interval = Duration::ZERO;
    p.compaction_min_file_bytes = 0;
    p.compaction_bytes_per_sec = 0;
    // Each commit reaches its data file at once, so the files fragment as they are written.
    p.storage = epkv_engine::StorageBackend::Files;
    p.journal = epkv_engine::JournalMode::Off;
    let b = start(p, false);
    // 20 keys of one vBucket, each written 10 times, one flush per round: nine tenths of
    // its file is old versions.
    let keys = keys_of_vb7(20);
    let value = "x".repeat(400);
    for _round in 0..10 {
        for k in &keys {
            must_set(&b, k, &value, 0);
        }
        b.flush_all().unwrap();
    }
    let before = must_stats(&b, "persistence");
    let num = |m: &BTreeMap<String, String>, k: &str| m[k].parse::<u64>().unwrap();
    assert!(num(&before, "ep_db_fragmentation") > 50, "{before:?}");
    assert!(num(&before, "ep_db_data_size") < num(&before, "ep_db_file_size"));
    let details = must_stats(&b, "vbucket-details 7");
    assert_eq!(
        details["vb_7:db_file_size"], before["ep_db_file_size"],
        "the only file"
    );

    assert_eq!(b.compact_fragmented().unwrap(), 1);
    let after = must_stats(&b, "persistence");
    assert_eq!(num(&after, "ep_fragmentation_compactions"), 1);
    assert_eq!(num(&after, "ep_db_fragmentation"), 0, "{after:?}");
    assert_eq!(
        num(&after, "ep_compaction_bytes_reclaimed"),
        num(&before, "ep_db_file_size") - num(&after, "ep_db_file_size")
    );
    // Nothing left past the threshold; the data is intact.
    assert_eq!(b.compact_fragmented().unwrap(), 0);
    for k in &keys {
        assert_eq!(
            b.get(vb(k), k.as_bytes()).unwrap().value.as_ref(),
            value.as_bytes()
        );
    }
}

/// The log backend: overwrites leave garbage in the log; the fragmentation compactor
/// cleans the log (oldest file first, here the only one), the statistics say so, and the
/// data is intact, also after a restart.
#[test]
fn the_fragmentation_compactor_cleans_an_overwritten_log_and_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = PersistenceConfig::new(dir.path());
    p.storage = epkv_engine::StorageBackend::Log;
    p.flusher = FlusherMode::Manual;
    p.shards = 2;
    p.compaction_interval = Duration::ZERO;
    p.compaction_min_file_bytes = 0;
    p.compaction_bytes_per_sec = 0;
    let b = start(p.clone(), false);
    let keys = keys_of_vb7(20);
    let value = "x".repeat(400);
    for round in 0..10 {
        for k in &keys {
            must_set(&b, k, &format!("{round}{value}"), 0);
        }
        b.flush_all().unwrap();
    }
    let before = must_stats(&b, "persistence");
    let num = |m: &BTreeMap<String, String>, k: &str| m[k].parse::<u64>().unwrap();
    assert!(num(&before, "ep_db_fragmentation") > 50, "{before:?}");
    assert!(num(&before, "ep_db_data_size") < num(&before, "ep_db_file_size"));

    assert!(b.compact_fragmented().unwrap() >= 1);
    let after = must_stats(&b, "persistence");
    assert!(num(&after, "ep_fragmentation_compactions") >= 1);
    // Reported, and never going back (the amount depends on the kernel's accounting).
    assert!(num(&after, "ep_compaction_cpu_time") >= num(&before, "ep_compaction_cpu_time"));
    assert!(num(&after, "ep_db_fragmentation") < 30, "{after:?}");
    assert_eq!(
        num(&after, "ep_db_data_size"),
        num(&before, "ep_db_data_size")
    );
    assert!(
        num(&after, "ep_compaction_bytes_reclaimed") >= num(&before, "ep_db_file_size") / 2,
        "{after:?}"
    );
    assert_eq!(b.compact_fragmented().unwrap(), 0);
    for k in &keys {
        assert_eq!(
            b.get(vb(k), k.as_bytes()).unwrap().value.as_ref(),
            format!("9{value}").as_bytes()
        );
    }
    b.shutdown();
    drop(b);
    let b = start(p, false);
    for k in &keys {
        assert_eq!(
            b.get(vb(k), k.as_bytes()).unwrap().value.as_ref(),
            format!("9{value}").as_bytes()
        );
    }
}

/// A dropped collection's documents leave memory and then, by the compaction the drop
/// starts, the data files; after a restart they are not loaded and the collection's id is
/// forgotten as dropped (nothing of it is left to remove).
#[test]
fn a_dropped_collection_leaves_memory_and_disk() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), FlusherMode::Manual);
    b.create_scope("s").unwrap();
    b.create_collection("s", "c", 0).unwrap();
    let (_, cid) = b.collection_id("s.c").unwrap();
    let mut keys = Vec::new();
    for i in 0..200 {
        let raw = format!("k{i}");
        let mut buf = epkv_types::doc_key::DocKeyBuf::new();
        let key = epkv_types::doc_key::encode(cid, raw.as_bytes(), &mut buf).to_vec();
        b.store(StoreRequest {
            op: StoreOp::Set,
            vbid: vb(&raw),
            key: &key,
            value: b"v",
            flags: 0,
            expiry: Expiry::Never,
            preserve_ttl: false,
            datatype: Datatype::RAW,
            cas: Cas::ANY,
            durability: None,
        })
        .unwrap();
        keys.push((raw, key));
    }
    must_set(&b, "kept", "default", 0);
    b.flush_all().unwrap();
    assert_eq!(b.item_count(), 201);
    b.drop_collection("s", "c").unwrap();
    // The purge runs on a thread of its own: wait (bounded) for memory, then for the
    // compaction that removes the documents from disk, after which the manifest forgets
    // the collection. Forgetting does not move the uid (3: scope, collection, drop), so
    // every node of a cluster keeps the same one whenever its purge finishes.
    for _ in 0..1000 {
        if b.item_count() == 1 && b.manifest().dropped.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(b.item_count(), 1, "the documents left memory");
    assert!(
        b.manifest().dropped.is_empty(),
        "the drop was compacted away and forgotten"
    );
    assert_eq!(b.manifest_uid(), 3);
    assert_eq!(
        b.get(vb(&keys[0].0), &keys[0].1),
        Err(EngineStatus::UnknownCollection)
    );
    let again = b.compact_all().unwrap();
    assert_eq!(
        again.collection_docs_dropped, 0,
        "already removed from disk"
    );
    drop(b);
    let b = open(dir.path(), FlusherMode::Manual);
    assert_eq!(b.item_count(), 1);
    assert_eq!(must_get_value(&b, "kept"), b"default");
}

fn must_get_value(b: &Bucket, key: &str) -> Vec<u8> {
    b.get(vb(key), key.as_bytes()).unwrap().value.to_vec()
}
