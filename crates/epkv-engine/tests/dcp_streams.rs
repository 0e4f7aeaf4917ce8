//! DCP streams through the engine: from the in-memory log, backfilled from disk, with and
//! without sync replication, ending and refusing as KV-Engine's do; and a property test
//! that a stream from zero rebuilds the bucket's documents.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions panic on failure"
)]
mod support;

use epkv_engine::{Bucket, BucketConfig, EngineClock};
use epkv_engine_api::dcp::{CollectionEventKind, DcpEndReason, SNAPSHOT_DISK, SNAPSHOT_MEMORY};
use epkv_engine_api::{
    DcpEvent, DcpStream, DcpStreamError, DcpStreamRequest, DurabilityRequirements, Engine,
    EngineStatus, Expiry, RemoveRequest, StoreOp, StoreRequest,
};
use epkv_types::{
    Cas, Datatype, DurabilityLevel, NUM_VBUCKETS, VBucketState, Vbid, doc_key, vbucket_for_key,
};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use support::key_in;

/// A waker that counts its wakes.
#[derive(Default)]
struct Counter(AtomicUsize);

impl Wake for Counter {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

struct Poller {
    counter: Arc<Counter>,
    waker: Waker,
}

impl Poller {
    fn new() -> Self {
        let counter = Arc::new(Counter::default());
        let waker = Waker::from(Arc::clone(&counter));
        Self { counter, waker }
    }

    fn wakes(&self) -> usize {
        self.counter.0.load(Ordering::SeqCst)
    }

    /// Polls until the stream has nothing more to give now (at most `rounds` polls).
    fn drain(&self, s: &mut dyn DcpStream, rounds: usize) -> Vec<DcpEvent> {
        let mut out = Vec::new();
        let mut cx = Context::from_waker(&self.waker);
        for _ in 0..rounds {
            let before = self.wakes();
            match s.poll_events(&mut cx, 4096, &mut out) {
                Poll::Ready(()) => {
                    if matches!(out.last(), Some(DcpEvent::End(_))) {
                        break;
                    }
                }
                // Pending with a self-wake means "poll again"; without, it is waiting.
                Poll::Pending if self.wakes() == before => break,
                Poll::Pending => {}
            }
        }
        out
    }
}

/// A persistent bucket flushed by hand, or a memory-only one.
fn open(dir: &Path, persistent: bool) -> Arc<Bucket> {
    if persistent {
        return support::open_manual_flush(dir);
    }
    Bucket::new(
        BucketConfig {
            flush_enabled: true,
            ..support::test_config()
        },
        EngineClock::System,
    )
    .unwrap()
}

const VB: Vbid = Vbid(5);

fn set(b: &Bucket, key: &str, value: &str) -> u64 {
    set_durable(b, key, value, None).unwrap()
}

fn set_durable(
    b: &Bucket,
    key: &str,
    value: &str,
    durability: Option<DurabilityRequirements>,
) -> Result<u64, EngineStatus> {
    b.store(StoreRequest {
        op: StoreOp::Set,
        vbid: vbucket_for_key(key.as_bytes(), NUM_VBUCKETS),
        key: key.as_bytes(),
        value: value.as_bytes(),
        flags: 3,
        expiry: Expiry::Never,
        cas: Cas(0),
        datatype: Datatype::RAW,
        durability,
        preserve_ttl: false,
    })
    .map(|m| m.seqno.0)
}

fn delete(b: &Bucket, key: &str) -> u64 {
    b.remove(RemoveRequest {
        vbid: vbucket_for_key(key.as_bytes(), NUM_VBUCKETS),
        key: key.as_bytes(),
        cas: Cas(0),
        durability: None,
    })
    .unwrap()
    .seqno
    .0
}

fn high_seqno(b: &Bucket, vb: Vbid) -> u64 {
    b.vbucket_seqnos(vb).unwrap().high_seqno.0
}

fn uuid(b: &Bucket, vb: Vbid) -> u64 {
    b.vbucket_seqnos(vb).unwrap().failover_log[0].uuid
}

fn from(start: u64) -> DcpStreamRequest {
    DcpStreamRequest {
        start_seqno: start,
        end_seqno: u64::MAX,
        snap_start_seqno: start,
        snap_end_seqno: start,
        ..DcpStreamRequest::default()
    }
}

fn stream(b: &Bucket, vb: Vbid, mut req: DcpStreamRequest) -> Box<dyn DcpStream> {
    if req.start_seqno > 0 {
        req.vbucket_uuid = uuid(b, vb);
    }
    b.dcp_stream(vb, req).unwrap()
}

/// (kind, key, seqno) of the document events.
fn docs(events: &[DcpEvent]) -> Vec<(&'static str, String, u64)> {
    events
        .iter()
        .filter_map(|e| match e {
            DcpEvent::Mutation(d) => Some(("mutation", d.key.clone(), d.seqno)),
            DcpEvent::Deletion(d) => Some(("deletion", d.key.clone(), d.seqno)),
            DcpEvent::Prepare { doc, .. } => Some(("prepare", doc.key.clone(), doc.seqno)),
            DcpEvent::Commit {
                key, commit_seqno, ..
            } => Some(("commit", key.clone(), *commit_seqno)),
            DcpEvent::Abort {
                key, abort_seqno, ..
            } => Some(("abort", key.clone(), *abort_seqno)),
            _ => None,
        })
        .map(|(k, key, s)| (k, String::from_utf8(key).unwrap(), s))
        .collect()
}

fn markers(events: &[DcpEvent]) -> Vec<(u64, u64, u32)> {
    events
        .iter()
        .filter_map(|e| match e {
            DcpEvent::SnapshotMarker {
                start, end, flags, ..
            } => Some((*start, *end, *flags)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_stream_from_the_high_seqno_sends_new_changes_from_memory_and_wakes_its_task() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), true);
    let (k1, k2) = (key_in(VB, 1), key_in(VB, 2));
    set(&b, &k1, "old");
    let mut s = stream(&b, VB, from(high_seqno(&b, VB)));
    let p = Poller::new();
    assert!(p.drain(s.as_mut(), 5).is_empty(), "nothing new yet");
    let s1 = set(&b, &k1, "new");
    assert_eq!(p.wakes(), 1, "the write woke the waiting stream");
    let s2 = set(&b, &k2, "v");
    let s3 = delete(&b, &k1);
    let events = p.drain(s.as_mut(), 5);
    assert_eq!(
        docs(&events),
        vec![
            ("mutation", k1.clone(), s1),
            ("mutation", k2.clone(), s2),
            ("deletion", k1.clone(), s3)
        ]
    );
    let m = markers(&events);
    assert_eq!(m.len(), 1);
    assert_eq!((m[0].0, m[0].1), (s1, s3));
    assert!(m[0].2 & SNAPSHOT_MEMORY != 0);
    assert_eq!(s.last_seqno(), s3);
    b.shutdown();
}

#[test]
fn a_stream_from_zero_backfills_the_newest_versions_from_disk_then_follows_memory() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), true);
    let keys: Vec<String> = (0..20).map(|i| key_in(VB, i)).collect();
    for k in &keys {
        set(&b, k, "v1");
    }
    for k in &keys[..5] {
        set(&b, k, "v2");
    }
    for k in &keys[5..8] {
        delete(&b, k);
    }
    b.flush_all().unwrap();
    let persisted = high_seqno(&b, VB);
    let mut s = stream(&b, VB, from(0));
    let p = Poller::new();
    let events = p.drain(s.as_mut(), 100);
    let got = docs(&events);
    // Each key once, at its newest seqno, in seqno order.
    assert_eq!(got.len(), 20);
    assert!(got.windows(2).all(|w| w[0].2 < w[1].2));
    assert_eq!(got.iter().filter(|d| d.0 == "deletion").count(), 3);
    let m = markers(&events);
    assert_eq!(m, vec![(1, persisted, m[0].2)]);
    assert!(m[0].2 & SNAPSHOT_DISK != 0);
    assert!(!s.backfilling());
    // Then new writes come from memory.
    let next = set(&b, &keys[0], "v3");
    let events = p.drain(s.as_mut(), 5);
    assert_eq!(docs(&events), vec![("mutation", keys[0].clone(), next)]);
    assert!(markers(&events)[0].2 & SNAPSHOT_MEMORY != 0);
    b.shutdown();
}

#[test]
fn a_backfill_waits_for_the_flusher_and_a_stream_ends_at_its_end_seqno() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), true);
    let keys: Vec<String> = (0..5).map(|i| key_in(VB, i)).collect();
    let seqnos: Vec<u64> = keys.iter().map(|k| set(&b, k, "v")).collect();
    let mut req = from(0);
    req.end_seqno = seqnos[3];
    let mut s = stream(&b, VB, req);
    let p = Poller::new();
    assert!(p.drain(s.as_mut(), 5).is_empty(), "nothing on disk yet");
    b.flush_all().unwrap();
    assert!(p.wakes() > 0, "the flush woke the stream");
    let events = p.drain(s.as_mut(), 100);
    assert_eq!(docs(&events).len(), 4);
    assert_eq!(events.last(), Some(&DcpEvent::End(DcpEndReason::Ok)));
    assert_eq!(s.last_seqno(), seqnos[3]);
    b.shutdown();
}

#[test]
fn sync_replication_streams_get_prepares_and_commits_the_others_the_mutation() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), true);
    let k = key_in(VB, 1);
    let start = high_seqno(&b, VB);
    let mut plain = stream(&b, VB, from(start));
    let mut sync = stream(
        &b,
        VB,
        DcpStreamRequest {
            sync_replication: true,
            ..from(start)
        },
    );
    let prepared = set_durable(
        &b,
        &k,
        "durable",
        Some(DurabilityRequirements {
            level: DurabilityLevel::Majority,
            timeout: None,
        }),
    )
    .unwrap();
    let p = Poller::new();
    let got = docs(&p.drain(sync.as_mut(), 5));
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0], ("prepare", k.clone(), prepared));
    assert_eq!((got[1].0, &got[1].1), ("commit", &k));
    assert!(got[1].2 > prepared);
    let events = p.drain(plain.as_mut(), 5);
    assert_eq!(docs(&events), vec![("mutation", k.clone(), got[1].2)]);
    if let Some(DcpEvent::Mutation(d)) = events.iter().find(|e| matches!(e, DcpEvent::Mutation(_)))
    {
        assert_eq!(&d.value[..], b"durable");
    }
    b.shutdown();
}

#[test]
fn stream_requests_are_checked_against_the_history() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), true);
    let k = key_in(VB, 1);
    set(&b, &k, "v");
    let high = high_seqno(&b, VB);
    // An unknown branch rolls back to zero.
    let mut r = from(high);
    r.vbucket_uuid = 12345;
    assert_eq!(b.dcp_stream(VB, r).err(), Some(DcpStreamError::Rollback(0)));
    // Ahead of the vBucket: back to its high seqno.
    let mut r = from(high + 10);
    r.vbucket_uuid = uuid(&b, VB);
    assert_eq!(
        b.dcp_stream(VB, r).err(),
        Some(DcpStreamError::Rollback(high))
    );
    // Not active here.
    b.set_vbucket_state(Vbid(6), VBucketState::Replica).unwrap();
    assert_eq!(
        b.dcp_stream(Vbid(6), from(0)).err(),
        Some(DcpStreamError::Status(EngineStatus::NotMyVbucket))
    );
    b.shutdown();
}

#[test]
fn a_state_change_ends_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), true);
    let mut s = stream(&b, VB, from(high_seqno(&b, VB)));
    let p = Poller::new();
    assert!(p.drain(s.as_mut(), 5).is_empty());
    b.set_vbucket_state(VB, VBucketState::Replica).unwrap();
    assert!(p.wakes() > 0, "the state change woke the stream");
    assert_eq!(
        p.drain(s.as_mut(), 5),
        vec![DcpEvent::End(DcpEndReason::StateChanged)]
    );
    b.shutdown();
}

#[test]
fn a_pending_vbucket_streams_like_an_active_one_until_it_goes_dead() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), true);
    let keys: Vec<String> = (0..4).map(|i| key_in(VB, i)).collect();
    let before: Vec<u64> = keys[..3].iter().map(|k| set(&b, k, "v")).collect();
    b.flush_all().unwrap();
    // A stream open before the takeover, caught up.
    let mut open_before = stream(&b, VB, from(high_seqno(&b, VB)));
    let p = Poller::new();
    assert!(p.drain(open_before.as_mut(), 5).is_empty());
    let last = set(&b, &keys[3], "v");
    b.set_vbucket_state(VB, VBucketState::Pending).unwrap();
    // It goes on: the write made before the vBucket went pending, and no end.
    let events = p.drain(open_before.as_mut(), 5);
    assert_eq!(docs(&events), vec![("mutation", keys[3].clone(), last)]);
    assert!(!events.iter().any(|e| matches!(e, DcpEvent::End(_))));
    // A stream asked for on the pending vBucket gets everything it had.
    let mut opened_pending = stream(&b, VB, from(0));
    let q = Poller::new();
    let events = q.drain(opened_pending.as_mut(), 100);
    let mut want: Vec<(&str, String, u64)> = keys[..3]
        .iter()
        .zip(&before)
        .map(|(k, s)| ("mutation", k.clone(), *s))
        .collect();
    want.push(("mutation", keys[3].clone(), last));
    assert_eq!(docs(&events), want);
    assert!(!events.iter().any(|e| matches!(e, DcpEvent::End(_))));
    // The takeover done: dead ends both.
    b.set_vbucket_state(VB, VBucketState::Dead).unwrap();
    for (poller, s) in [(&p, &mut open_before), (&q, &mut opened_pending)] {
        assert_eq!(
            poller.drain(s.as_mut(), 5),
            vec![DcpEvent::End(DcpEndReason::StateChanged)]
        );
    }
    assert_eq!(
        b.dcp_stream(VB, from(0)).err(),
        Some(DcpStreamError::Status(EngineStatus::NotMyVbucket))
    );
    b.shutdown();
}

#[test]
fn a_move_rolled_back_ends_the_streams_of_the_pending_vbucket() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), true);
    set(&b, &key_in(VB, 0), "v");
    b.set_vbucket_state(VB, VBucketState::Pending).unwrap();
    let mut s = stream(&b, VB, from(high_seqno(&b, VB)));
    let p = Poller::new();
    assert!(p.drain(s.as_mut(), 5).is_empty());
    // Active again: a new failover branch, which the consumer asks for again.
    b.set_vbucket_state(VB, VBucketState::Active).unwrap();
    assert_eq!(
        p.drain(s.as_mut(), 5),
        vec![DcpEvent::End(DcpEndReason::StateChanged)]
    );
    b.shutdown();
}

#[test]
fn a_memory_only_bucket_streams_from_its_high_seqno_only() {
    let b = open(Path::new("/nonexistent"), false);
    let k = key_in(VB, 1);
    set(&b, &k, "v");
    assert_eq!(
        b.dcp_stream(VB, from(0)).err(),
        Some(DcpStreamError::Status(EngineStatus::NotSupported))
    );
    let mut s = stream(&b, VB, from(high_seqno(&b, VB)));
    let seqno = set(&b, &k, "w");
    let p = Poller::new();
    assert_eq!(
        docs(&p.drain(s.as_mut(), 5)),
        vec![("mutation", k.clone(), seqno)]
    );
    b.shutdown();
}

/// (kind, manifest uid, scope, collection, name, seqno) of the system events.
fn system_events(events: &[DcpEvent]) -> Vec<(CollectionEventKind, u64, u32, u32, String, u64)> {
    events
        .iter()
        .filter_map(|e| match e {
            DcpEvent::System { seqno, event } => Some((
                event.kind,
                event.manifest_uid,
                event.scope_id,
                event.collection_id,
                event.name.clone(),
                *seqno,
            )),
            _ => None,
        })
        .collect()
}

/// Stores `value` under `key` of collection `cid` (in the vBucket the raw key maps to,
/// as SDKs place collection keys); returns (vBucket, seqno).
fn set_in(b: &Bucket, cid: u32, key: &str, value: &str) -> (Vbid, u64) {
    let vbid = vbucket_for_key(key.as_bytes(), NUM_VBUCKETS);
    let mut buf = doc_key::DocKeyBuf::new();
    let stored = doc_key::encode(cid, key.as_bytes(), &mut buf).to_vec();
    let m = b
        .store(StoreRequest {
            vbid,
            key: &stored,
            ..support::store_req(StoreOp::Set, key, value)
        })
        .unwrap();
    (vbid, m.seqno.0)
}

#[test]
fn scope_and_collection_changes_are_events_in_every_active_vbucket_from_memory_and_disk() {
    use CollectionEventKind::*;
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), true);
    b.set_vbucket_state(Vbid(6), VBucketState::Replica).unwrap();
    let mut live = stream(&b, VB, from(high_seqno(&b, VB)));
    let replica_high = high_seqno(&b, Vbid(6));
    let base_uid = b.create_scope("shop").unwrap() - 1;
    b.create_collection("shop", "orders", 60).unwrap();
    let sid = b.scope_id("shop").unwrap().1;
    let cid = b.collection_id("shop.orders").unwrap().1;
    let key = key_in(VB, 3);
    let (vbid, seqno) = set_in(&b, cid, &key, "order-1");
    assert_eq!(vbid, VB, "key_in picks the raw key's vBucket");
    let p = Poller::new();
    let mut events = p.drain(live.as_mut(), 10);
    b.drop_scope("shop").unwrap();
    events.extend(p.drain(live.as_mut(), 10));
    let got = system_events(&events);
    // The drop of a scope drops its collection first; only the last event of a change
    // carries the new manifest uid.
    assert_eq!(
        got.iter()
            .map(|e| (e.0, e.1, e.2, e.3, e.4.as_str()))
            .collect::<Vec<_>>(),
        vec![
            (CreateScope, base_uid + 1, sid, 0, "shop"),
            (CreateCollection, base_uid + 2, sid, cid, "orders"),
            (DropCollection, base_uid + 2, sid, cid, ""),
            (DropScope, base_uid + 3, sid, 0, ""),
        ]
    );
    let created = events.iter().find_map(|e| match e {
        DcpEvent::System { event, .. } if event.kind == CreateCollection => Some(event.max_ttl),
        _ => None,
    });
    assert_eq!(
        created,
        Some(Some(60)),
        "the maxTTL travels with the creation"
    );
    // The document sits between the creation and the drop, in seqno order.
    let seqnos: Vec<u64> = events.iter().filter_map(DcpEvent::seqno).collect();
    assert!(seqnos.windows(2).all(|w| w[0] < w[1]));
    assert!(got[1].5 < seqno && seqno < got[2].5);
    assert_eq!(docs(&events).len(), 1);
    // A replica vBucket records nothing of its own.
    assert_eq!(high_seqno(&b, Vbid(6)), replica_high);
    // From disk (the log goes with the last stream): each scope and collection once, at
    // its newest event; the dropped collection's document is not sent.
    drop(live);
    b.flush_all().unwrap();
    let mut s = stream(&b, VB, from(0));
    let events = p.drain(s.as_mut(), 100);
    assert_eq!(
        system_events(&events)
            .iter()
            .map(|e| (e.0, e.5))
            .collect::<Vec<_>>(),
        vec![(DropCollection, got[2].5), (DropScope, got[3].5)]
    );
    assert!(docs(&events).is_empty());
    assert!(markers(&events)[0].2 & SNAPSHOT_DISK != 0);
    // The events survive a restart (and are not loaded as documents).
    let items = b.item_count();
    b.shutdown();
    drop(b);
    let b = open(dir.path(), true);
    assert_eq!(b.item_count(), items);
    let mut s = stream(&b, VB, from(0));
    assert_eq!(system_events(&p.drain(s.as_mut(), 100)).len(), 2);
    b.shutdown();
}

#[test]
fn a_manifest_set_whole_keeps_its_ids_and_uid_and_records_the_differences_as_events() {
    use CollectionEventKind::*;
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), true);
    let mut live = stream(&b, VB, from(high_seqno(&b, VB)));
    // As a cluster's metadata store decides it: ids 20 and 21, uid 40.
    let target = serde_json::json!({
        "uid": "28", "next_id": 22,
        "scopes": [
            {"name": "_default", "uid": "0", "collections": [{"name": "_default", "uid": "0"}]},
            {"name": "shop", "uid": "14", "collections": [{"name": "orders", "uid": "15", "maxTTL": 9}]}
        ]
    })
    .to_string();
    assert_eq!(b.set_collections_manifest(&target), Ok(40));
    assert_eq!(b.collection_id("shop.orders"), Ok((40, 21)));
    assert_eq!(
        b.set_collections_manifest(&target),
        Ok(40),
        "again: no change"
    );
    let (_, seqno) = set_in(&b, 21, &key_in(VB, 3), "order-1");
    assert!(seqno > 0);
    // The next manifest drops the scope.
    let next = serde_json::json!({
        "uid": "29", "next_id": 22,
        "scopes": [{"name": "_default", "uid": "0", "collections": [{"name": "_default", "uid": "0"}]}]
    })
    .to_string();
    assert_eq!(b.set_collections_manifest(&next), Ok(41));
    assert_eq!(
        b.collection_id("shop.orders"),
        Err(EngineStatus::UnknownScope)
    );
    let p = Poller::new();
    let events = p.drain(live.as_mut(), 10);
    assert_eq!(
        system_events(&events)
            .iter()
            .map(|e| (e.0, e.1, e.2, e.3))
            .collect::<Vec<_>>(),
        vec![
            (CreateScope, 0, 20, 0),
            (CreateCollection, 40, 20, 21),
            (DropCollection, 40, 20, 21),
            (DropScope, 41, 20, 0),
        ]
    );
    assert_eq!(
        b.set_collections_manifest("{\"uid\": \"1\"}"),
        Err(EngineStatus::Invalid)
    );
}

#[test]
fn a_filtered_stream_gets_its_collections_events_and_ends_when_they_are_dropped() {
    use CollectionEventKind::*;
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), true);
    b.create_scope("s").unwrap();
    b.create_collection("s", "a", 0).unwrap();
    b.create_collection("s", "b", 0).unwrap();
    let sid = b.scope_id("s").unwrap().1;
    let a = b.collection_id("s.a").unwrap().1;
    let bb = b.collection_id("s.b").unwrap().1;
    let key = key_in(VB, 1);
    set_in(&b, a, &key, "in a");
    set_in(&b, bb, &key, "in b");
    let p = Poller::new();
    // Collection filter, from zero (backfilled before the flush: waits, so flush).
    b.flush_all().unwrap();
    let mut by_collection = stream(
        &b,
        VB,
        DcpStreamRequest {
            collections: Some(vec![a]),
            ..from(0)
        },
    );
    let mut by_scope = stream(
        &b,
        VB,
        DcpStreamRequest {
            scope: Some(sid),
            ..from(high_seqno(&b, VB))
        },
    );
    let events = p.drain(by_collection.as_mut(), 100);
    assert_eq!(
        system_events(&events)
            .iter()
            .map(|e| (e.0, e.3))
            .collect::<Vec<_>>(),
        vec![(CreateCollection, a)]
    );
    assert_eq!(docs(&events).len(), 1, "only collection a's document");
    // A collection created later in the scope is in the scope's stream.
    b.create_collection("s", "c", 0).unwrap();
    let c = b.collection_id("s.c").unwrap().1;
    set_in(&b, c, &key, "in c");
    b.drop_collection("s", "b").unwrap();
    b.drop_collection("s", "a").unwrap();
    let events = p.drain(by_collection.as_mut(), 10);
    assert_eq!(
        system_events(&events)
            .iter()
            .map(|e| (e.0, e.3))
            .collect::<Vec<_>>(),
        vec![(DropCollection, a)]
    );
    assert_eq!(
        events.last(),
        Some(&DcpEvent::End(DcpEndReason::FilterEmpty))
    );
    let events = p.drain(by_scope.as_mut(), 10);
    assert_eq!(
        system_events(&events)
            .iter()
            .map(|e| (e.0, e.3))
            .collect::<Vec<_>>(),
        vec![
            (CreateCollection, c),
            (DropCollection, bb),
            (DropCollection, a)
        ]
    );
    assert_eq!(docs(&events).len(), 1, "collection c's document");
    assert!(!matches!(events.last(), Some(DcpEvent::End(_))));
    b.drop_scope("s").unwrap();
    let events = p.drain(by_scope.as_mut(), 10);
    assert_eq!(
        system_events(&events)
            .iter()
            .map(|e| (e.0, e.3))
            .collect::<Vec<_>>(),
        vec![(DropCollection, c), (DropScope, 0)]
    );
    assert_eq!(
        events.last(),
        Some(&DcpEvent::End(DcpEndReason::FilterEmpty))
    );
    b.shutdown();
}

#[test]
fn expiries_are_expirations_from_memory_and_from_disk_and_deletions_stay_deletions() {
    let dir = tempfile::tempdir().unwrap();
    let fx = support::Fixture::manual_flush(dir.path());
    let b = &fx.bucket;
    let (short, gone) = (key_in(VB, 1), key_in(VB, 2));
    let vbid = vbucket_for_key(short.as_bytes(), NUM_VBUCKETS);
    b.store(StoreRequest {
        expiry: Expiry::Relative(10),
        ..support::store_req(StoreOp::Set, &short, "soon gone")
    })
    .unwrap();
    set(b, &gone, "v");
    let mut s = stream(b, VB, from(high_seqno(b, VB)));
    fx.advance(11);
    assert_eq!(
        b.get(vbid, short.as_bytes()).err(),
        Some(EngineStatus::KeyNotFound)
    );
    delete(b, &gone);
    let kinds = |events: &[DcpEvent]| -> Vec<(&'static str, String)> {
        events
            .iter()
            .filter_map(|e| match e {
                DcpEvent::Expiration(d) => Some(("expiration", d.key.clone())),
                DcpEvent::Deletion(d) => Some(("deletion", d.key.clone())),
                DcpEvent::Mutation(d) => Some(("mutation", d.key.clone())),
                _ => None,
            })
            .map(|(k, key)| (k, String::from_utf8(key).unwrap()))
            .collect()
    };
    let poller = Poller::new();
    let expected = vec![("expiration", short.clone()), ("deletion", gone.clone())];
    assert_eq!(kinds(&poller.drain(s.as_mut(), 10)), expected);
    b.flush_all().unwrap();
    let mut s = stream(b, VB, from(0));
    let events = poller.drain(s.as_mut(), 100);
    assert_eq!(kinds(&events), expected);
    // The mark is not a datatype bit clients see.
    assert!(events.iter().all(|e| match e {
        DcpEvent::Expiration(d) | DcpEvent::Deletion(d) => d.datatype & !0x07 == 0,
        _ => true,
    }));
}

#[derive(Debug, Clone)]
enum Op {
    Set(usize, u8),
    Delete(usize),
    Flush,
    /// Poll the live stream.
    Poll,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..12usize, any::<u8>()).prop_map(|(k, v)| Op::Set(k, v)),
        2 => (0..12usize).prop_map(Op::Delete),
        1 => Just(Op::Flush),
        2 => Just(Op::Poll),
    ]
}

/// Applies stream events to a replica model: key → value (deletions remove).
fn apply(model: &mut BTreeMap<String, Vec<u8>>, events: &[DcpEvent], last: &mut u64) {
    for e in events {
        if let Some(s) = e.seqno() {
            assert!(s > *last, "seqnos increase: {s} after {last}");
            *last = s;
        }
        match e {
            DcpEvent::Mutation(d) => {
                model.insert(String::from_utf8(d.key.clone()).unwrap(), d.value.to_vec());
            }
            DcpEvent::Deletion(d) => {
                model.remove(&String::from_utf8(d.key.clone()).unwrap());
            }
            _ => {}
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// A stream opened at the start, polled now and then while writes and flushes go on,
    /// and a second stream opened from zero at the end, both leave a consumer with exactly
    /// the bucket's documents, their seqnos increasing.
    #[test]
    fn streams_rebuild_the_bucket(ops in proptest::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path(), true);
        let keys: Vec<String> = (0..12).map(|i| key_in(VB, i)).collect();
        let mut truth: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        let p = Poller::new();
        let mut live = stream(&b, VB, from(0));
        let mut replica = BTreeMap::new();
        let mut last = 0;
        for op in &ops {
            match op {
                Op::Set(k, v) => {
                    let value = format!("v{v}");
                    set(&b, &keys[*k], &value);
                    truth.insert(keys[*k].clone(), value.into_bytes());
                }
                Op::Delete(k) => {
                    if truth.remove(&keys[*k]).is_some() {
                        delete(&b, &keys[*k]);
                    }
                }
                Op::Flush => {
                    b.flush_all().unwrap();
                }
                Op::Poll => apply(&mut replica, &p.drain(live.as_mut(), 50), &mut last),
            }
        }
        b.flush_all().unwrap();
        apply(&mut replica, &p.drain(live.as_mut(), 200), &mut last);
        prop_assert_eq!(&replica, &truth);
        prop_assert_eq!(last, high_seqno(&b, VB));
        let mut fresh = stream(&b, VB, from(0));
        let mut rebuilt = BTreeMap::new();
        let mut last = 0;
        apply(&mut rebuilt, &p.drain(fresh.as_mut(), 200), &mut last);
        prop_assert_eq!(&rebuilt, &truth);
        b.shutdown();
    }
}
