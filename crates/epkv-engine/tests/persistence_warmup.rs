//! Warmup on Reader tasks, driven step by step with a `ManualExecutor`: a vBucket still
//! loading answers TempFail (reads, writes, state changes), one loaded serves, warmup
//! loads keys only past the memory low watermark (values read back on access), and a
//! corrupt file makes only its vBucket unavailable.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions panic on failure"
)]
use epkv_engine::{Bucket, BucketConfig, EngineClock, FlusherMode, PersistenceConfig};
use epkv_engine_api::{Engine, EngineStatus, Expiry, StoreOp, StoreRequest};
use epkv_executor::{ManualClock, ManualExecutor};
use epkv_types::{Cas, Datatype, NUM_VBUCKETS, VBucketState, Vbid, vbucket_for_key};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn config(dir: &Path, quota: u64) -> BucketConfig {
    config_with(dir, quota, PersistenceConfig::new(dir).storage)
}

fn config_with(dir: &Path, quota: u64, storage: epkv_engine::StorageBackend) -> BucketConfig {
    let mut p = PersistenceConfig::new(dir);
    p.storage = storage;
    p.flusher = FlusherMode::Manual;
    p.shards = 1;
    p.compaction_interval = Duration::ZERO;
    BucketConfig {
        expiry_pager_interval: Duration::ZERO,
        flush_enabled: true,
        memory_quota_bytes: quota,
        persistence: Some(p),
        ..BucketConfig::default()
    }
}

fn vb(key: &str) -> Vbid {
    vbucket_for_key(key.as_bytes(), NUM_VBUCKETS)
}

fn set(b: &Bucket, key: &str, value: &str) -> Result<u64, EngineStatus> {
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
        durability: None,
    })
    .map(|i| i.seqno.0)
}

fn stats(b: &Bucket, group: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    b.stats(group, &mut |k, v| {
        m.insert(k.to_owned(), v.to_owned());
    })
    .unwrap();
    m
}

/// Two keys in different vBuckets, the first with the lower vbid.
fn two_keys() -> (String, String) {
    let mut found: Vec<String> = Vec::new();
    for i in 0.. {
        let k = format!("key-{i}");
        if found.iter().all(|f| vb(f) != vb(&k)) {
            found.push(k);
        }
        if found.len() == 2 {
            break;
        }
    }
    found.sort_by_key(|k| vb(k).0);
    (found[0].clone(), found[1].clone())
}

#[test]
fn a_vbucket_answers_tmpfail_until_its_warmup_task_has_loaded_it() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b_key) = two_keys();
    let (high_a, high_b) = {
        let b = Bucket::new(config(dir.path(), 64 << 20), EngineClock::System).unwrap();
        set(&b, &a, "old-a").unwrap();
        let high_a = set(&b, &a, "value-a").unwrap();
        let high_b = set(&b, &b_key, "value-b").unwrap();
        b.set_vbucket_state(vb(&b_key), VBucketState::Replica)
            .unwrap();
        b.shutdown();
        (high_a, high_b)
    };

    let exec = ManualExecutor::new(Arc::new(ManualClock::new(Duration::from_secs(1_000))));
    let b = Bucket::new_on_executor(
        config(dir.path(), 64 << 20),
        EngineClock::System,
        exec.handle(),
    )
    .unwrap();
    // Nothing has run: both stored vBuckets are still loading.
    assert!(!b.is_warmed_up());
    assert!(!b.wait_warmup(Duration::ZERO));
    assert_eq!(b.get(vb(&a), a.as_bytes()), Err(EngineStatus::TempFail));
    assert_eq!(set(&b, &a, "too early"), Err(EngineStatus::TempFail));
    assert_eq!(
        b.set_vbucket_state(vb(&a), VBucketState::Replica),
        Err(EngineStatus::TempFail)
    );
    assert_eq!(b.vbucket_seqnos(vb(&a)).err(), Some(EngineStatus::TempFail));
    assert_eq!(b.flush(), Err(EngineStatus::TempFail));
    let w = stats(&b, "warmup");
    assert_eq!(w["ep_warmup_state"], "loading data");
    assert_eq!(w["ep_warmup_vbuckets"], "2");
    assert_eq!(w["ep_warmup_vbuckets_loaded"], "0");
    // A vBucket with nothing stored serves at once.
    let fresh = (0..)
        .map(|i| format!("fresh-{i}"))
        .find(|k| vb(k) != vb(&a) && vb(k) != vb(&b_key))
        .unwrap();
    assert_eq!(set(&b, &fresh, "new"), Ok(1));

    // One run loads one vBucket: the active one first.
    exec.must_run_next("warmup-0");
    assert_eq!(
        b.get(vb(&a), a.as_bytes()).unwrap().value.as_ref(),
        b"value-a"
    );
    assert_eq!(b.high_seqno(vb(&a)), Some(high_a));
    assert_eq!(b.persisted_seqno(vb(&a)), Some(high_a));
    assert_eq!(
        b.vbucket_state(vb(&b_key)),
        Some(VBucketState::Active),
        "not restored yet"
    );
    assert_eq!(
        b.set_vbucket_state(vb(&b_key), VBucketState::Active),
        Err(EngineStatus::TempFail)
    );
    assert!(!b.is_warmed_up());
    assert_eq!(stats(&b, "warmup")["ep_warmup_vbuckets_loaded"], "1");
    // The first write after warmup continues above the stored seqno.
    assert_eq!(set(&b, &a, "newer"), Ok(high_a + 1));

    exec.must_run_next("warmup-0");
    assert!(b.is_warmed_up());
    assert!(b.wait_warmup(Duration::ZERO));
    assert_eq!(b.vbucket_state(vb(&b_key)), Some(VBucketState::Replica));
    assert_eq!(b.high_seqno(vb(&b_key)), Some(high_b));
    b.set_vbucket_state(vb(&b_key), VBucketState::Active)
        .unwrap();
    assert_eq!(
        b.get(vb(&b_key), b_key.as_bytes()).unwrap().value.as_ref(),
        b"value-b"
    );
    // The task has nothing left and is done.
    assert_eq!(exec.run_next().map(|h| h.name().to_owned()), None);
    let w = stats(&b, "warmup");
    assert_eq!(w["ep_warmup_state"], "done");
    assert_eq!(w["ep_warmup_thread"], "complete");
    assert_eq!(w["ep_warmup_vbuckets_loaded"], "2");
    assert_eq!(w["ep_warmup_vbuckets_failed"], "0");
    assert_eq!(w["ep_warmup_value_count"], "2");
    assert_eq!(w["ep_warmup_unclean_shutdown"], "false");
    b.shutdown();
    drop(b);

    // Everything written after warmup survives the next restart.
    let b = Bucket::new(config(dir.path(), 64 << 20), EngineClock::System).unwrap();
    assert!(b.wait_warmup(Duration::from_secs(60)));
    assert_eq!(
        b.get(vb(&a), a.as_bytes()).unwrap().value.as_ref(),
        b"newer"
    );
    assert_eq!(
        b.get(vb(&fresh), fresh.as_bytes()).unwrap().value.as_ref(),
        b"new"
    );
    b.shutdown();
}

/// Runs `op` on `key` as the front end would: after WouldBlock it waits for the key's
/// background fetch and runs it again; after TempFail (memory full until the item pager
/// makes room) it retries after a pause, a bounded number of times.
fn retry<T>(
    b: &Bucket,
    key: &str,
    mut op: impl FnMut() -> Result<T, EngineStatus>,
) -> Result<T, EngineStatus> {
    for _ in 0..500 {
        match op() {
            Err(EngineStatus::WouldBlock) => {
                match b.wait_fetched(vb(key), key.as_bytes(), Duration::from_secs(30)) {
                    Ok(()) => {}
                    Err(EngineStatus::TempFail) => std::thread::sleep(Duration::from_millis(10)),
                    Err(e) => return Err(e),
                }
            }
            Err(EngineStatus::TempFail) => std::thread::sleep(Duration::from_millis(10)),
            other => return other,
        }
    }
    op()
}

fn must_get(b: &Bucket, key: &str) -> Result<Vec<u8>, EngineStatus> {
    retry(b, key, || {
        b.get(vb(key), key.as_bytes()).map(|i| i.value.to_vec())
    })
}

#[test]
fn past_the_low_watermark_warmup_loads_keys_only_and_values_are_read_back_on_access() {
    let dir = tempfile::tempdir().unwrap();
    let value = |i: usize| format!("{i:04}-{}", "v".repeat(995));
    let n = 1200;
    {
        let b = Bucket::new(config(dir.path(), 64 << 20), EngineClock::System).unwrap();
        for i in 0..n {
            set(&b, &format!("doc-{i}"), &value(i)).unwrap();
        }
        b.shutdown();
    }
    // A 1 MiB quota: the low watermark (75%) holds about 700 of these documents.
    let cfg = config(dir.path(), 1 << 20);
    let low_wat = cfg.low_wat_bytes();
    let b = Bucket::new(cfg, EngineClock::System).unwrap();
    assert!(b.wait_warmup(Duration::from_secs(60)));
    let w = stats(&b, "warmup");
    let loaded: usize = w["ep_warmup_value_count"].parse().unwrap();
    let keys_only: usize = w["ep_warmup_key_only_count"].parse().unwrap();
    assert_eq!(w["ep_warmup_oom"], "0");
    assert_eq!(loaded + keys_only, n);
    assert!(
        loaded > 0 && keys_only > 0,
        "loaded {loaded}, keys only {keys_only}"
    );
    // Values are loaded until item memory reaches the low watermark, keys after.
    assert!(b.mem_used() >= low_wat, "{} < {low_wat}", b.mem_used());
    assert_eq!(b.item_count(), n);
    let ht: u64 = (0..NUM_VBUCKETS)
        .map(|v| b.hash_table_stats(Vbid(v)).unwrap().non_resident as u64)
        .sum();
    assert_eq!(ht, keys_only as u64, "{:?}", stats(&b, ""));
    // Warmup loads vBucket by vBucket: the documents of the last vBuckets loaded are
    // non-resident. Pick four such documents.
    let cold: Vec<usize> = (0..n)
        .filter(|i| {
            let st = b.hash_table_stats(vb(&format!("doc-{i}"))).unwrap();
            st.items > 0 && st.non_resident == st.items
        })
        .take(4)
        .collect();
    assert_eq!(cold.len(), 4);
    let last = format!("doc-{}", cold[0]);
    let fetched_before: u64 = stats(&b, "")["ep_bg_fetched"].parse().unwrap();
    assert_eq!(must_get(&b, &last).unwrap(), value(cold[0]).as_bytes());
    assert_eq!(must_get(&b, &last).unwrap(), value(cold[0]).as_bytes());
    let fetched: u64 = stats(&b, "")["ep_bg_fetched"].parse().unwrap();
    assert_eq!(
        fetched,
        fetched_before + 1,
        "read from disk once, then resident"
    );
    // Writes that keep the value, to non-resident documents: APPEND, TOUCH, INCREMENT
    // on a counter-like value are persisted whole.
    let app = format!("doc-{}", cold[1]);
    retry(&b, &app, || {
        b.store(StoreRequest {
            op: StoreOp::Append,
            vbid: vb(&app),
            key: app.as_bytes(),
            value: b"+tail",
            flags: 0,
            expiry: Expiry::Never,
            preserve_ttl: false,
            datatype: Datatype::RAW,
            cas: Cas::ANY,
            durability: None,
        })
    })
    .unwrap();
    let touched = format!("doc-{}", cold[2]);
    retry(&b, &touched, || {
        b.touch(vb(&touched), touched.as_bytes(), 100_000)
    })
    .unwrap();
    // A SET does not need the old value (no disk read).
    let replaced = format!("doc-{}", cold[3]);
    set(&b, &replaced, "new").unwrap();
    assert_eq!(
        stats(&b, "")["ep_bg_fetched"].parse::<u64>().unwrap(),
        fetched + 2,
        "APPEND and TOUCH read back, SET did not"
    );
    // The quota cannot hold every value: reading them all back fills memory, and the
    // item pager ejects the clean values read earlier to make room for the later ones.
    b.flush_all().unwrap();
    for i in 0..n {
        let k = format!("doc-{i}");
        let v = must_get(&b, &k).unwrap();
        if i == cold[1] {
            assert_eq!(v, format!("{}+tail", value(i)).as_bytes());
        } else if i == cold[3] {
            assert_eq!(v, b"new");
        } else {
            assert_eq!(v, value(i).as_bytes(), "{k}");
        }
    }
    let ejects: u64 = stats(&b, "")["ep_num_value_ejects"].parse().unwrap();
    assert!(ejects > 0, "the pager made room");
    assert!(b.mem_used() <= b.config().quota_bytes());
    b.shutdown();
    drop(b);
    // The writes to non-resident documents kept their whole values on disk.
    let b = Bucket::new(config(dir.path(), 64 << 20), EngineClock::System).unwrap();
    assert!(b.wait_warmup(Duration::from_secs(60)));
    assert_eq!(
        must_get(&b, &app).unwrap(),
        format!("{}+tail", value(cold[1])).as_bytes()
    );
    let t = retry(&b, &touched, || b.get(vb(&touched), touched.as_bytes())).unwrap();
    assert_eq!(t.value.as_ref(), value(cold[2]).as_bytes());
    assert_ne!(t.expiry_unix_secs, 0);
    assert_eq!(must_get(&b, &replaced).unwrap(), b"new");
    b.shutdown();
}

/// The data file of vBucket `v` in shard 0.
fn data_file(dir: &Path, v: Vbid) -> std::path::PathBuf {
    std::fs::read_dir(dir.join("shard_0"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let n = p.file_name().unwrap().to_str().unwrap();
            n.starts_with(&format!("vb_{}.", v.0)) && n.ends_with(".data")
        })
        .unwrap()
}

#[test]
fn a_corrupt_vbucket_file_makes_only_that_vbucket_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b_key) = two_keys();
    let c_key = (0..)
        .map(|i| format!("third-{i}"))
        .find(|k| vb(k) != vb(&a) && vb(k) != vb(&b_key))
        .unwrap();
    {
        let b = Bucket::new(
            config_with(dir.path(), 64 << 20, epkv_engine::StorageBackend::Files),
            EngineClock::System,
        )
        .unwrap();
        for k in [&a, &b_key, &c_key] {
            set(&b, k, "one").unwrap();
            b.flush_all().unwrap();
            if k != &b_key {
                set(&b, k, "two").unwrap();
            }
        }
        b.shutdown();
    }
    // vBucket of `a`: damage in the middle (found at open: the shard opens without it).
    let pa = data_file(dir.path(), vb(&a));
    let mut bytes = std::fs::read(&pa).unwrap();
    bytes[29 + 20] ^= 0xff;
    bytes.push(1);
    std::fs::write(&pa, &bytes).unwrap();
    // vBucket of `b_key`: a damaged document in a file that ends in a valid header (found
    // when warmup reads it).
    let pb = data_file(dir.path(), vb(&b_key));
    let mut bytes = std::fs::read(&pb).unwrap();
    bytes[29 + 12] ^= 0x01;
    std::fs::write(&pb, &bytes).unwrap();

    let b = Bucket::new(
        config_with(dir.path(), 64 << 20, epkv_engine::StorageBackend::Files),
        EngineClock::System,
    )
    .unwrap();
    assert!(b.wait_warmup(Duration::from_secs(60)));
    for k in [&a, &b_key] {
        assert_eq!(
            b.get(vb(k), k.as_bytes()),
            Err(EngineStatus::NotMyVbucket),
            "{k}"
        );
        assert_eq!(set(&b, k, "x"), Err(EngineStatus::NotMyVbucket), "{k}");
        assert_eq!(
            b.set_vbucket_state(vb(k), VBucketState::Active),
            Err(EngineStatus::NotMyVbucket)
        );
    }
    assert_eq!(
        b.get(vb(&c_key), c_key.as_bytes()).unwrap().value.as_ref(),
        b"two"
    );
    let w = stats(&b, "warmup");
    assert_eq!(w["ep_warmup_state"], "done");
    assert_eq!(w["ep_warmup_vbuckets_failed"], "2");
    let ea = &w[&format!("vb_{}:warmup_error", vb(&a).0)];
    assert!(
        ea.contains("offset 29") && ea.contains(pa.to_str().unwrap()),
        "{ea}"
    );
    let eb = &w[&format!("vb_{}:warmup_error", vb(&b_key).0)];
    assert!(
        eb.contains("offset 29") && eb.contains(pb.to_str().unwrap()),
        "{eb}"
    );
    assert_eq!(
        b.item_count(),
        1,
        "nothing of the failed vBuckets stays loaded"
    );
    assert!(pa.exists() && pb.exists(), "damaged files are kept");
    // FLUSH deletes every file, the damaged ones too: the vBuckets serve again.
    b.flush().unwrap();
    set(&b, &a, "again").unwrap();
    assert_eq!(
        b.get(vb(&a), a.as_bytes()).unwrap().value.as_ref(),
        b"again"
    );
    b.shutdown();
    drop(b);
    let b = Bucket::new(
        config_with(dir.path(), 64 << 20, epkv_engine::StorageBackend::Files),
        EngineClock::System,
    )
    .unwrap();
    assert!(b.wait_warmup(Duration::from_secs(60)));
    assert_eq!(stats(&b, "warmup")["ep_warmup_vbuckets_failed"], "0");
    assert_eq!(
        b.get(vb(&a), a.as_bytes()).unwrap().value.as_ref(),
        b"again"
    );
    b.shutdown();
}

/// The log backend: damage in the middle of a shard's log (a sealed file) sets the whole
/// shard aside, since which vBuckets the damaged records held is unknown: its vBuckets
/// answer NotMyVbucket and warmup names the file and offset; the files are kept until
/// FLUSH deletes them, after which the vBuckets serve again.
#[test]
fn a_corrupt_log_makes_its_shard_unavailable_until_flush() {
    let dir = tempfile::tempdir().unwrap();
    let storage = epkv_engine::StorageBackend::Log;
    let key = "damaged-log-key";
    {
        let b = Bucket::new(
            config_with(dir.path(), 64 << 20, storage),
            EngineClock::System,
        )
        .unwrap();
        set(&b, key, "one").unwrap();
        b.flush_all().unwrap();
        b.shutdown();
    }
    // A second file, so that the first is sealed: damage there is not a torn tail.
    let shard = dir.path().join("shard_0");
    let first = shard.join("log-00000001.epkv");
    std::fs::write(shard.join("log-00000002.epkv"), b"").unwrap();
    let mut bytes = std::fs::read(&first).unwrap();
    bytes[29 + 12] ^= 0x01;
    std::fs::write(&first, &bytes).unwrap();

    let b = Bucket::new(
        config_with(dir.path(), 64 << 20, storage),
        EngineClock::System,
    )
    .unwrap();
    assert!(b.wait_warmup(Duration::from_secs(60)));
    assert_eq!(
        b.get(vb(key), key.as_bytes()),
        Err(EngineStatus::NotMyVbucket)
    );
    assert_eq!(set(&b, key, "x"), Err(EngineStatus::NotMyVbucket));
    let w = stats(&b, "warmup");
    assert_eq!(w["ep_warmup_state"], "done");
    assert_eq!(
        w["ep_warmup_vbuckets_failed"], "1024",
        "one shard: every vBucket"
    );
    let e = &w[&format!("vb_{}:warmup_error", vb(key).0)];
    assert!(
        e.contains(first.to_str().unwrap()) && e.contains("offset 29"),
        "{e}"
    );
    assert!(first.exists(), "damaged files are kept");
    b.flush().unwrap();
    assert!(!first.exists());
    set(&b, key, "again").unwrap();
    b.flush_all().unwrap();
    b.shutdown();
    drop(b);
    let b = Bucket::new(
        config_with(dir.path(), 64 << 20, storage),
        EngineClock::System,
    )
    .unwrap();
    assert!(b.wait_warmup(Duration::from_secs(60)));
    assert_eq!(stats(&b, "warmup")["ep_warmup_vbuckets_failed"], "0");
    assert_eq!(
        b.get(vb(key), key.as_bytes()).unwrap().value.as_ref(),
        b"again"
    );
    b.shutdown();
}
