//! The persistence stats over the wire: `STAT persistence`, `STAT kvstore` and
//! `STAT vbucket-seqno [N]` on a persistent server (the default) and a memory-only one.

use crate::harness::{Server, key, skip_if_external};
use epkv_client::{Client, StoreOptions};
use epkv_protocol::{DurabilityRequirement, Feature};
use epkv_types::{DurabilityLevel, NUM_VBUCKETS, vbucket_for_key};
use std::collections::HashMap;

async fn stats(c: &mut Client, group: &str) -> HashMap<String, String> {
    c.stat(group).await.unwrap().into_iter().collect()
}

fn num(stats: &HashMap<String, String>, name: &str) -> u64 {
    stats
        .get(name)
        .unwrap_or_else(|| panic!("no stat {name}: {stats:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("stat {name}={:?}: {e}", stats[name]))
}

#[tokio::test]
async fn persistence_kvstore_and_vbucket_seqno_stats_report_what_was_flushed() {
    if skip_if_external("persistence_stats") {
        return;
    }
    let server = Server::spawn(&[]);
    server.wait_warmed_up().await;
    let mut c = server.client().await;
    c.hello("e2e-stats", &[Feature::MutationSeqno, Feature::Xerror])
        .await
        .unwrap();
    let before = stats(&mut c, "persistence").await;
    assert_eq!(before["ep_persistence_enabled"], "true");
    assert!(num(&before, "ep_persistence_shards") >= 1);
    let flushed_before = num(&before, "ep_total_persisted");

    // Durable writes: each is acknowledged once persisted, so the stats must show them.
    let durable = DurabilityRequirement {
        level: DurabilityLevel::PersistToMajority,
        timeout: None,
    };
    const N: u64 = 60;
    let mut tokens = Vec::new();
    for i in 0..N {
        let k = key(&format!("stats-{i}"));
        let r = c
            .set(&k, b"flushed", StoreOptions::new().durability(durable))
            .await
            .unwrap();
        assert!(r.is_success(), "{r:?}");
        let uuid = u64::from_be_bytes(r.extras[..8].try_into().unwrap());
        let seqno = u64::from_be_bytes(r.extras[8..].try_into().unwrap());
        tokens.push((vbucket_for_key(&k, NUM_VBUCKETS).0, uuid, seqno));
    }

    let p = stats(&mut c, "persistence").await;
    assert!(
        num(&p, "ep_total_persisted") >= flushed_before + N,
        "every durable write was flushed: {p:?}"
    );
    assert!(num(&p, "ep_commit_num") >= 1, "{p:?}");
    assert!(num(&p, "ep_fsync_num") >= 1, "{p:?}");
    assert!(num(&p, "ep_io_bytes_written") >= N * 7, "{p:?}");
    assert!(num(&p, "ep_flusher_commits") >= 1, "{p:?}");
    assert_eq!(p["ep_disk_full"], "false");

    let kv = stats(&mut c, "kvstore").await;
    let shards = num(&p, "ep_persistence_shards");
    let items: u64 = (0..shards)
        .map(|i| num(&kv, &format!("rw_{i}:items_flushed")))
        .sum();
    assert!(items >= N, "kvstore items_flushed over the shards: {kv:?}");
    let batches: u64 = (0..shards)
        .map(|i| num(&kv, &format!("rw_{i}:batches")))
        .sum();
    assert!(batches >= 1 && batches <= items, "{kv:?}");
    assert!(num(&kv, "fd_budget") >= 1, "{kv:?}");
    assert!(kv.contains_key("open_files"), "{kv:?}");

    let all = stats(&mut c, "vbucket-seqno").await;
    assert_eq!(
        all.keys().filter(|k| k.ends_with(":uuid")).count(),
        usize::from(NUM_VBUCKETS),
        "one entry per vBucket"
    );
    for (vb, uuid, seqno) in &tokens {
        let p = format!("vb_{vb}");
        assert_eq!(num(&all, &format!("{p}:uuid")), *uuid);
        assert!(num(&all, &format!("{p}:high_seqno")) >= *seqno);
        assert!(
            num(&all, &format!("{p}:last_persisted_seqno")) >= *seqno,
            "acknowledged durable write persisted: {p}"
        );
    }
    // One vBucket alone.
    let (vb, uuid, seqno) = tokens[0];
    let one = stats(&mut c, &format!("vbucket-seqno {vb}")).await;
    assert!(
        one.keys().all(|k| k.starts_with(&format!("vb_{vb}:"))),
        "{one:?}"
    );
    assert_eq!(num(&one, &format!("vb_{vb}:uuid")), uuid);
    assert!(num(&one, &format!("vb_{vb}:last_persisted_seqno")) >= seqno);
}

#[tokio::test]
async fn a_memory_only_server_reports_no_persistence() {
    if skip_if_external("memory_only_stats") {
        return;
    }
    let server = Server::spawn(&["--persistence", "false"]);
    let mut c = server.client().await;
    c.set(&key("mem-stats"), b"v", StoreOptions::new())
        .await
        .unwrap();
    let p = stats(&mut c, "persistence").await;
    assert_eq!(p["ep_persistence_enabled"], "false", "{p:?}");
    let kv = stats(&mut c, "kvstore").await;
    assert!(kv.is_empty(), "no storage: {kv:?}");
    let vbs = stats(&mut c, "vbucket-seqno").await;
    assert!(
        vbs.iter()
            .filter(|(k, _)| k.ends_with(":last_persisted_seqno"))
            .all(|(_, v)| v == "0"),
        "nothing is ever persisted"
    );
}
