//! After an unclean shutdown warmup starts a new failover branch in every vBucket, which
//! dirties its state: the flushers must still be woken, so writes made after such a
//! restart are persisted (regression: none were, until a clean shutdown).

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions panic on failure"
)]
use epkv_engine::{Bucket, BucketConfig, EngineClock, PersistenceConfig};
use epkv_engine_api::{Engine, Expiry, StoreOp, StoreRequest};
use epkv_types::{Cas, Datatype, NUM_VBUCKETS, vbucket_for_key};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn open(dir: &Path) -> Arc<Bucket> {
    let b = Bucket::new(
        BucketConfig {
            expiry_pager_interval: Duration::ZERO,
            persistence: Some(PersistenceConfig::new(dir)),
            ..BucketConfig::default()
        },
        EngineClock::System,
    )
    .unwrap();
    assert!(b.wait_warmup(Duration::from_secs(60)), "warmup finishes");
    b
}

/// Writes `key` and waits (bounded) until the bucket reports it persisted.
fn set_and_wait_persisted(b: &Bucket, key: &str) -> bool {
    let vbid = vbucket_for_key(key.as_bytes(), NUM_VBUCKETS);
    let info = b
        .store(StoreRequest {
            op: StoreOp::Set,
            vbid,
            key: key.as_bytes(),
            value: b"v",
            flags: 0,
            expiry: Expiry::Never,
            preserve_ttl: false,
            datatype: Datatype::RAW,
            cas: Cas::ANY,
            durability: None,
        })
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    b.when_persisted(vbid, info.seqno.0, move |s| {
        let _ = tx.send(s);
    })
    .unwrap();
    rx.recv_timeout(Duration::from_secs(30))
        .is_ok_and(|s| s >= info.seqno.0)
}

fn stat(b: &Bucket, group: &str, name: &str) -> String {
    let mut v = String::new();
    b.stats(group, &mut |k, val| {
        if k == name {
            v = val.to_owned();
        }
    })
    .unwrap();
    v
}

#[test]
fn writes_after_an_unclean_restart_are_flushed() {
    let dir = std::env::temp_dir().join(format!("epkv-unclean-flush-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let b = open(&dir);
    for i in 0..20 {
        assert!(set_and_wait_persisted(&b, &format!("key-{i}")));
    }
    // No shutdown: as after a crash, no clean-shutdown marker is left.
    drop(b);

    let b = open(&dir);
    assert_eq!(stat(&b, "warmup", "ep_warmup_unclean_shutdown"), "true");
    // The same keys, so the same (warmed-up, now state-dirty) vBuckets.
    for i in 0..20 {
        assert!(
            set_and_wait_persisted(&b, &format!("key-{i}")),
            "write {i} after the unclean restart was not persisted within 30 s"
        );
    }
    b.shutdown();
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}
