//! Memory past the quota, against the real server: the item pager ejects persisted values,
//! background fetches read them back, and nothing acknowledged is lost or changed
//! (issue 6).

use crate::harness::{Server, TestDir, skip_if_external};
use epkv_client::Client;
use epkv_protocol::{Opcode, RequestBuilder, Status};
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::collections::HashMap;
use std::time::Duration;

/// The bucket's quota in the tests below.
const QUOTA_BYTES: usize = 8 << 20;
/// Bytes of each value.
const VALUE_LEN: usize = 512;
/// Writes of 512-byte values totalling 4x the quota.
const ITEMS: usize = 4 * QUOTA_BYTES / VALUE_LEN;
/// Writing connections.
const WRITERS: usize = 4;
/// Requests pipelined per round trip.
const BATCH: usize = 64;

async fn stats(c: &mut Client, group: &str) -> HashMap<String, String> {
    c.stat(group).await.unwrap().into_iter().collect()
}

fn key_of(i: usize) -> Vec<u8> {
    format!("evict-{i:07}").into_bytes()
}

/// The value of item `i`: random bytes from a seed derived from `i`, so any reader can
/// recompute it.
fn value_of(i: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(0x5eed_0000 + i as u64);
    (0..VALUE_LEN).map(|_| rng.r#gen()).collect()
}

/// SETs the items `ids` with pipelined requests, retrying those answered TMPFAIL (the
/// only refusal allowed) after a short pause, a bounded number of times. Returns how
/// many TMPFAIL answers it saw.
async fn write_all(mut c: Client, ids: Vec<usize>) -> usize {
    let extras = [0u8; 8];
    let mut tmpfails = 0;
    let mut todo = ids;
    for round in 0..2000 {
        if todo.is_empty() {
            return tmpfails;
        }
        let mut again = Vec::new();
        for chunk in todo.chunks(BATCH) {
            let keys: Vec<Vec<u8>> = chunk.iter().map(|&i| key_of(i)).collect();
            let values: Vec<Vec<u8>> = chunk.iter().map(|&i| value_of(i)).collect();
            for (k, v) in keys.iter().zip(&values) {
                c.queue(
                    RequestBuilder::new(Opcode::Set)
                        .key(k)
                        .value(v)
                        .extras(&extras),
                )
                .unwrap();
            }
            for (r, &i) in c
                .flush_and_recv(chunk.len())
                .await
                .unwrap()
                .iter()
                .zip(chunk)
            {
                match r.status() {
                    Some(Status::Success) => {}
                    Some(Status::Etmpfail) => {
                        tmpfails += 1;
                        again.push(i);
                    }
                    other => panic!("SET evict-{i} refused with {other:?} (round {round})"),
                }
            }
        }
        if !again.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        todo = again;
    }
    panic!("{} writes still refused after 2000 rounds", todo.len());
}

/// Reads every item back with pipelined GETs and checks each value.
async fn read_all_back(c: &mut Client, what: &str) {
    for start in (0..ITEMS).step_by(BATCH) {
        let ids: Vec<usize> = (start..(start + BATCH).min(ITEMS)).collect();
        let keys: Vec<Vec<u8>> = ids.iter().map(|&i| key_of(i)).collect();
        for k in &keys {
            c.queue(RequestBuilder::new(Opcode::Get).key(k)).unwrap();
        }
        let replies = c.flush_and_recv(ids.len()).await.unwrap();
        for (r, &i) in replies.iter().zip(&ids) {
            if r.status() != Some(Status::Success) {
                let s = stats(c, "").await;
                panic!("{what}: GET evict-{i}: {:?}; stats {s:?}", r.status());
            }
            assert!(
                r.value.as_ref() == value_of(i).as_slice(),
                "{what}: evict-{i} came back with another value"
            );
        }
    }
}

async fn write_past_the_quota_and_read_back(extra: &[&str]) {
    let dir = TestDir::new();
    let quota = format!("{}", QUOTA_BYTES);
    let mut args = vec!["--memory-quota", quota.as_str()];
    args.extend_from_slice(extra);
    let server = Server::spawn_in(dir.path(), &args);
    server.wait_warmed_up().await;

    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let c = server.client().await;
        let ids: Vec<usize> = (w..ITEMS).step_by(WRITERS).collect();
        tasks.push(tokio::spawn(write_all(c, ids)));
    }
    let mut tmpfails = 0;
    for t in tasks {
        tmpfails += t.await.unwrap();
    }
    let mut c = server.client().await;
    let s = stats(&mut c, "").await;
    eprintln!(
        "{ITEMS} writes of {VALUE_LEN} bytes into {QUOTA_BYTES} bytes: {tmpfails} TMPFAIL answers retried, {} values ejected, mem_used {}",
        s["ep_num_value_ejects"], s["mem_used"]
    );
    assert_eq!(s["curr_items"], ITEMS.to_string());
    assert!(s["ep_num_value_ejects"].parse::<u64>().unwrap() > 0);
    let used: usize = s["mem_used"].parse().unwrap();
    assert!(used <= QUOTA_BYTES, "mem_used {used}");
    let resident: u32 = s["vb_active_perc_mem_resident"].parse().unwrap();
    assert!(resident < 40, "resident ratio {resident}%");

    // Every value read back, most through background fetches.
    read_all_back(&mut c, "after the load").await;
    let s = stats(&mut c, "").await;
    let fetched: u64 = s["ep_bg_fetched"].parse().unwrap();
    eprintln!(
        "read back: resident {resident}% before, {fetched} bg fetches, wait avg/p99 {}/{} us, load avg/p99 {}/{} us",
        s["ep_bg_wait_avg"], s["ep_bg_wait_p99"], s["ep_bg_load_avg"], s["ep_bg_load_p99"]
    );
    assert!(fetched > (ITEMS / 2) as u64, "bg fetches {fetched}");
    assert!(s["ep_bg_num_samples"].parse::<u64>().unwrap() >= fetched);
    drop(c);

    // And again after a restart.
    let (status, _) = server.terminate();
    assert!(status.success());
    let server = Server::spawn_in(dir.path(), &args);
    server.wait_warmed_up().await;
    let mut c = server.client().await;
    let s = stats(&mut c, "").await;
    assert_eq!(s["curr_items"], ITEMS.to_string());
    read_all_back(&mut c, "after the restart").await;
    if extra.contains(&"full") {
        // Keys never written are answered from the key filter, with no disk read.
        let before: u64 = stats(&mut c, "").await["ep_bloom_filter_negatives"]
            .parse()
            .unwrap();
        for i in 0..1000 {
            c.queue(RequestBuilder::new(Opcode::Get).key(format!("never-{i}").as_bytes()))
                .unwrap();
        }
        let replies = c.flush_and_recv(1000).await.unwrap();
        assert!(
            replies
                .iter()
                .all(|r| r.status() == Some(Status::KeyEnoent))
        );
        let s = stats(&mut c, "").await;
        let negatives = s["ep_bloom_filter_negatives"].parse::<u64>().unwrap() - before;
        eprintln!(
            "full eviction: 1000 GETs of absent keys, {negatives} answered by the key filter, {} false positives in all",
            s["ep_bloom_filter_false_positives"]
        );
        assert!(
            negatives >= 950,
            "{negatives} of 1000 answered without the disk"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_of_four_times_the_quota_are_all_taken_and_read_back_through_bg_fetches() {
    if skip_if_external("eviction") {
        return;
    }
    write_past_the_quota_and_read_back(&[]).await;
}

/// The same with full eviction: whole documents leave memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_eviction_takes_four_times_the_quota_and_reads_it_back() {
    if skip_if_external("eviction") {
        return;
    }
    write_past_the_quota_and_read_back(&["--eviction-policy", "full"]).await;
}

/// A memory-only server at its quota: `fail-new-data` refuses with ENOMEM (and keeps
/// serving), `auto-delete` keeps taking writes while the pager deletes the least used
/// documents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_only_server_with_fail_new_data_answers_enomem_and_auto_delete_keeps_taking_writes()
 {
    if skip_if_external("ephemeral_full") {
        return;
    }
    let value = vec![b'v'; 4096];
    for (policy, expect_refusal) in [("fail-new-data", true), ("auto-delete", false)] {
        let server = Server::spawn(&[
            "--persistence",
            "false",
            "--memory-quota",
            "2MiB",
            "--ephemeral-full-policy",
            policy,
        ]);
        let mut c = server.client().await;
        let mut enomem = 0;
        for i in 0..2000 {
            let key = format!("eph-{i}").into_bytes();
            let mut stored = false;
            for _ in 0..200 {
                let r = c
                    .set(&key, &value, epkv_client::StoreOptions::new())
                    .await
                    .unwrap();
                match r.status() {
                    Some(Status::Success) => {
                        stored = true;
                        break;
                    }
                    Some(Status::Etmpfail) => tokio::time::sleep(Duration::from_millis(2)).await,
                    Some(Status::Enomem) if expect_refusal => {
                        enomem += 1;
                        break;
                    }
                    other => panic!("{policy}: SET eph-{i}: {other:?}"),
                }
            }
            assert!(stored || expect_refusal, "{policy}: eph-{i} never stored");
        }
        let s = stats(&mut c, "").await;
        assert_eq!(s["ep_ephemeral_full_policy"], policy.replace('-', "_"));
        if expect_refusal {
            assert!(enomem > 0, "{policy}: 8 MiB into 2 MiB must be refused");
            assert_eq!(s["ep_oom_errors"], enomem.to_string());
            assert_eq!(s["ep_pager_auto_deletes"], "0");
        } else {
            // The item pager may still be running its pass: its deletion count and the
            // item count are read at slightly different moments, so wait (bounded) for
            // them to agree.
            let mut s = s;
            for _ in 0..100 {
                let deleted: usize = s["ep_pager_auto_deletes"].parse().unwrap();
                let items: usize = s["curr_items"].parse().unwrap();
                if items + deleted == 2000 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                s = stats(&mut c, "").await;
            }
            let deleted: usize = s["ep_pager_auto_deletes"].parse().unwrap();
            assert!(deleted > 0);
            let items: usize = s["curr_items"].parse().unwrap();
            assert_eq!(items + deleted, 2000, "{s:?}");
        }
        // The server is healthy: a NOOP round trip and a read.
        c.noop().await.unwrap();
        let (status, _) = server.terminate();
        assert!(status.success(), "{policy}");
    }
}

/// EVICT_KEY (0x93) on the wire, with KV-Engine's answers, under both policies: a
/// persisted document is ejected and read back; a second eviction finds nothing to
/// eject; a missing key is KeyEnoent (value eviction) or "already ejected" (full
/// eviction, where a key out of memory may still be on disk).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evict_key_ejects_a_persisted_document_and_the_next_get_reads_it_back() {
    if skip_if_external("evict_key") {
        return;
    }
    for policy in ["value", "full"] {
        let dir = TestDir::new();
        let server = Server::spawn_in(dir.path(), &["--eviction-policy", policy]);
        server.wait_warmed_up().await;
        let mut c = server.client().await;
        let persisted =
            epkv_client::StoreOptions::new().durability(epkv_protocol::DurabilityRequirement {
                level: epkv_types::DurabilityLevel::PersistToMajority,
                timeout: Some(Duration::from_secs(20)),
            });
        let r = c.set(b"ek", b"the value", persisted).await.unwrap();
        assert!(r.is_success(), "{policy}: {r:?}");
        let mut evict = async |key: &[u8]| {
            c.queue(RequestBuilder::new(Opcode::EvictKey).key(key))
                .unwrap();
            let r = c.flush_and_recv(1).await.unwrap().remove(0);
            (r.status(), String::from_utf8_lossy(&r.value).into_owned())
        };
        // The SyncWrite's reply waited for its prepare's persistence; its commit is
        // persisted by the next flush (retry, bounded).
        let mut ejected = evict(b"ek").await;
        for _ in 0..500 {
            if ejected.0 == Some(Status::Success) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            ejected = evict(b"ek").await;
        }
        assert_eq!(
            ejected,
            (Some(Status::Success), "Ejected.".to_owned()),
            "{policy}"
        );
        assert_eq!(
            evict(b"ek").await,
            (Some(Status::Success), "Already ejected.".to_owned()),
            "{policy}"
        );
        let missing = evict(b"never-written").await;
        if policy == "value" {
            assert_eq!(missing.0, Some(Status::KeyEnoent));
        } else {
            assert_eq!(
                missing,
                (Some(Status::Success), "Already ejected.".to_owned())
            );
        }
        let got = c.get(b"ek").await.unwrap();
        assert_eq!(got.value.as_ref(), b"the value", "{policy}: read back");
        let s = stats(&mut c, "").await;
        assert!(s["ep_bg_fetched"].parse::<u64>().unwrap() >= 1, "{policy}");
    }
}
