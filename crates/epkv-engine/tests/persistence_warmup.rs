//! Warmup on Reader tasks, driven step by step with a `ManualExecutor`: a vBucket still
//! loading answers TempFail (reads, writes, state changes), one loaded serves, and warmup
//! stops loading values at the memory low watermark.

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
    let mut p = PersistenceConfig::new(dir);
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

#[test]
fn warmup_stops_loading_values_at_the_memory_low_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let value = "v".repeat(1000);
    let n = 1200;
    {
        let b = Bucket::new(config(dir.path(), 64 << 20), EngineClock::System).unwrap();
        for i in 0..n {
            set(&b, &format!("doc-{i}"), &value).unwrap();
        }
        b.shutdown();
    }
    // A 1 MiB quota: the low watermark (75%) holds about 700 of these documents.
    let quota = 1 << 20;
    let cfg = config(dir.path(), quota);
    let low_wat = cfg.low_wat_bytes();
    let b = Bucket::new(cfg, EngineClock::System).unwrap();
    assert!(b.wait_warmup(Duration::from_secs(60)));
    let w = stats(&b, "warmup");
    let loaded: u64 = w["ep_warmup_value_count"].parse().unwrap();
    let skipped: u64 = w["ep_warmup_oom"].parse().unwrap();
    assert_eq!(loaded + skipped, n);
    assert!(
        loaded > 0 && skipped > 0,
        "loaded {loaded}, skipped {skipped}"
    );
    // Loading stops once item memory reaches the low watermark: at most one document
    // (of about 1.1 KB) above it.
    assert!(b.mem_used() >= low_wat, "{} < {low_wat}", b.mem_used());
    assert!(
        b.mem_used() < low_wat + 2048,
        "{} vs {low_wat}",
        b.mem_used()
    );
    assert_eq!(b.item_count() as u64, loaded);
    // Documents not loaded are not served (no fetch from disk yet): the documented
    // behaviour, so that a later change to it is a deliberate one.
    let mut hits = 0;
    for i in 0..n {
        let k = format!("doc-{i}");
        match b.get(vb(&k), k.as_bytes()) {
            Ok(item) => {
                assert_eq!(item.value.len(), value.len());
                hits += 1;
            }
            Err(e) => assert_eq!(e, EngineStatus::KeyNotFound),
        }
    }
    assert_eq!(hits, loaded);
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
        let b = Bucket::new(config(dir.path(), 64 << 20), EngineClock::System).unwrap();
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

    let b = Bucket::new(config(dir.path(), 64 << 20), EngineClock::System).unwrap();
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
    let b = Bucket::new(config(dir.path(), 64 << 20), EngineClock::System).unwrap();
    assert!(b.wait_warmup(Duration::from_secs(60)));
    assert_eq!(stats(&b, "warmup")["ep_warmup_vbuckets_failed"], "0");
    assert_eq!(
        b.get(vb(&a), a.as_bytes()).unwrap().value.as_ref(),
        b"again"
    );
    b.shutdown();
}
