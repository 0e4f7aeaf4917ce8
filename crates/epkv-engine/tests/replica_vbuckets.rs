//! Replica vBuckets through the engine: a DCP stream from an active bucket applied to a
//! replica bucket gives the same documents with the same seqnos and CAS, served by
//! GET_REPLICA and again after a restart; out-of-order changes are refused; a reset
//! starts the replica over. SyncWrites: a replica acknowledges what it may; prepares and
//! their aborts reach it from memory and from a backfill, so that it catches up with
//! the active's high seqno and never commits an aborted write once promoted.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions panic on failure"
)]
mod support;

use epkv_engine::Bucket;
use epkv_engine_api::dcp::DcpDocument;
use epkv_engine_api::{
    DcpEvent, DcpStreamRequest, Engine, EngineStatus, Expiry, RemoveRequest, StoreOp, StoreRequest,
};
use epkv_types::{Cas, Datatype, VBucketState, Vbid};
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;
use support::key_in;

const VB: Vbid = Vbid(9);

fn open(dir: &Path) -> Arc<Bucket> {
    support::open_manual_flush(dir)
}

fn set(b: &Bucket, key: &str, value: &str) {
    b.store(StoreRequest {
        op: StoreOp::Set,
        vbid: VB,
        key: key.as_bytes(),
        value: value.as_bytes(),
        flags: 7,
        expiry: Expiry::Never,
        cas: Cas(0),
        datatype: Datatype::RAW,
        durability: None,
        preserve_ttl: false,
    })
    .unwrap();
}

/// Everything `active`'s stream of VB from `start` has now.
fn stream_all(active: &Bucket, start: u64) -> Vec<DcpEvent> {
    let uuid = active.vbucket_seqnos(VB).unwrap().failover_log[0].uuid;
    let mut s = active
        .dcp_stream(
            VB,
            DcpStreamRequest {
                start_seqno: start,
                end_seqno: active.vbucket_seqnos(VB).unwrap().high_seqno.0,
                vbucket_uuid: uuid,
                snap_start_seqno: start,
                snap_end_seqno: start,
                ..DcpStreamRequest::default()
            },
        )
        .unwrap();
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = Vec::new();
    for _ in 0..1000 {
        let _ = s.as_mut().poll_events(&mut cx, 1 << 20, &mut out);
        if matches!(out.last(), Some(DcpEvent::End(_))) {
            break;
        }
    }
    assert!(
        matches!(out.last(), Some(DcpEvent::End(_))),
        "the stream ended"
    );
    out
}

#[test]
fn a_replica_applies_a_stream_and_serves_it_with_the_actives_metadata() {
    let (da, dr) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let active = open(da.path());
    let replica = open(dr.path());
    replica
        .set_vbucket_state(VB, VBucketState::Replica)
        .unwrap();
    let keys: Vec<String> = (0..10).map(|i| key_in(VB, i)).collect();
    for k in &keys {
        set(&active, k, "v1");
    }
    set(&active, &keys[0], "v2");
    active
        .remove(RemoveRequest {
            vbid: VB,
            key: keys[1].as_bytes(),
            cas: Cas(0),
            durability: None,
        })
        .unwrap();
    active.flush_all().unwrap();
    let events = stream_all(&active, 0);
    for e in events {
        replica.replicate(VB, e).unwrap();
    }
    let log: Vec<(u64, u64)> = active
        .vbucket_seqnos(VB)
        .unwrap()
        .failover_log
        .iter()
        .map(|e| (e.uuid, e.seqno.0))
        .collect();
    replica.adopt_failover_log(VB, &log).unwrap();
    // Same documents, seqnos, CAS and flags.
    for k in &keys[2..] {
        let a = active.get(VB, k.as_bytes()).unwrap();
        let r = replica.get_replica(VB, k.as_bytes()).unwrap();
        assert_eq!((r.value, r.cas, r.flags), (a.value, a.cas, a.flags));
    }
    assert_eq!(
        &replica.get_replica(VB, keys[0].as_bytes()).unwrap().value[..],
        b"v2"
    );
    assert_eq!(
        replica.get_replica(VB, keys[1].as_bytes()).err(),
        Some(EngineStatus::KeyNotFound)
    );
    // Not readable as active data, and no client writes.
    assert_eq!(
        replica.get(VB, keys[0].as_bytes()).err(),
        Some(EngineStatus::NotMyVbucket)
    );
    let rs = replica.vbucket_seqnos(VB).unwrap();
    let as_ = active.vbucket_seqnos(VB).unwrap();
    assert_eq!(rs.high_seqno, as_.high_seqno);
    assert_eq!(rs.failover_log, as_.failover_log);
    // A change at or below the high seqno is refused.
    let stale = DcpEvent::Mutation(DcpDocument {
        key: keys[2].clone().into_bytes(),
        value: bytes::Bytes::from_static(b"old"),
        seqno: 1,
        rev_seqno: 1,
        cas: 1,
        flags: 0,
        expiry: 0,
        datatype: 0,
    });
    assert_eq!(replica.replicate(VB, stale), Err(EngineStatus::Invalid));
    // An active vBucket takes no replicated changes.
    let mut fresh = stream_all(&active, 0);
    assert_eq!(
        active.replicate(VB, fresh.remove(1)),
        Err(EngineStatus::NotMyVbucket)
    );
    // Persisted and served again after a restart.
    replica.flush_all().unwrap();
    replica.shutdown();
    drop(replica);
    let replica = open(dr.path());
    assert_eq!(replica.vbucket_state(VB), Some(VBucketState::Replica));
    assert_eq!(
        &replica.get_replica(VB, keys[0].as_bytes()).unwrap().value[..],
        b"v2"
    );
    assert_eq!(
        replica.vbucket_seqnos(VB).unwrap().high_seqno,
        as_.high_seqno
    );
    // Starting over empties it and restarts its seqnos; the stream fills it again.
    replica.reset_replica(VB).unwrap();
    assert_eq!(replica.vbucket_seqnos(VB).unwrap().high_seqno.0, 0);
    assert_eq!(
        replica.get_replica(VB, keys[0].as_bytes()).err(),
        Some(EngineStatus::KeyNotFound)
    );
    for e in stream_all(&active, 0) {
        replica.replicate(VB, e).unwrap();
    }
    assert_eq!(
        &replica.get_replica(VB, keys[0].as_bytes()).unwrap().value[..],
        b"v2"
    );
    replica.flush_all().unwrap();
    replica.shutdown();
    active.shutdown();
}

#[test]
fn sub_document_lookups_read_a_replica_with_replica_read_and_only_then() {
    use epkv_engine_api::{LookupFlags, SubdocOp, SubdocSpec};
    let (da, dr) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let active = open(da.path());
    let replica = open(dr.path());
    replica
        .set_vbucket_state(VB, VBucketState::Replica)
        .unwrap();
    let (doc, gone) = (key_in(VB, 0), key_in(VB, 1));
    for k in [&doc, &gone] {
        active
            .store(StoreRequest {
                op: StoreOp::Set,
                vbid: VB,
                key: k.as_bytes(),
                value: br#"{"a":{"b":[1,2,3]}}"#,
                flags: 0,
                expiry: Expiry::Never,
                cas: Cas(0),
                datatype: Datatype::JSON,
                durability: None,
                preserve_ttl: false,
            })
            .unwrap();
    }
    active
        .remove(RemoveRequest {
            vbid: VB,
            key: gone.as_bytes(),
            cas: Cas(0),
            durability: None,
        })
        .unwrap();
    active.flush_all().unwrap();
    for e in stream_all(&active, 0) {
        replica.replicate(VB, e).unwrap();
    }
    let spec = |op, path: &'static str, xattr| SubdocSpec {
        op,
        mkdir_p: false,
        xattr,
        expand_macros: false,
        binary: false,
        path: path.as_bytes(),
        value: b"",
    };
    let specs = [
        spec(SubdocOp::Get, "a.b[1]", false),
        spec(SubdocOp::GetCount, "a.b", false),
        spec(SubdocOp::Get, "$document.seqno", true),
    ];
    let replica_read = LookupFlags {
        replica_read: true,
        ..LookupFlags::default()
    };
    let on_replica = replica
        .subdoc_lookup(VB, doc.as_bytes(), &specs, replica_read)
        .unwrap();
    let on_active = active
        .subdoc_lookup(VB, doc.as_bytes(), &specs, LookupFlags::default())
        .unwrap();
    assert_eq!(on_replica, on_active, "same CAS and paths, seqno included");
    assert_eq!(on_replica.results[0], Ok(b"2".to_vec()));
    // A deleted document is not found; its tombstone is, with ACCESS_DELETED.
    assert_eq!(
        replica
            .subdoc_lookup(VB, gone.as_bytes(), &specs[..1], replica_read)
            .err(),
        Some(EngineStatus::KeyNotFound)
    );
    let tombstone = replica
        .subdoc_lookup(
            VB,
            gone.as_bytes(),
            &specs[2..],
            LookupFlags {
                access_deleted: true,
                replica_read: true,
            },
        )
        .unwrap();
    assert!(tombstone.deleted);
    // Without the flag a replica refuses, and with it an active does: NOT_MY_VBUCKET, as
    // GET and GET_REPLICA.
    assert_eq!(
        replica
            .subdoc_lookup(VB, doc.as_bytes(), &specs, LookupFlags::default())
            .err(),
        Some(EngineStatus::NotMyVbucket)
    );
    assert_eq!(
        active
            .subdoc_lookup(VB, doc.as_bytes(), &specs, replica_read)
            .err(),
        Some(EngineStatus::NotMyVbucket)
    );
    replica.shutdown();
    active.shutdown();
}

#[test]
fn a_replica_keeps_the_actives_collection_events_and_expirations_for_when_it_is_promoted() {
    let (da, dr) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let active = support::Fixture::manual_flush(da.path());
    let a = &active.bucket;
    let replica = open(dr.path());
    replica
        .set_vbucket_state(VB, VBucketState::Replica)
        .unwrap();
    let k = key_in(VB, 1);
    a.store(StoreRequest {
        expiry: Expiry::Relative(5),
        ..support::store_req(StoreOp::Set, &k, "brief")
    })
    .unwrap();
    a.create_scope("s").unwrap();
    a.create_collection("s", "c", 0).unwrap();
    active.advance(6);
    assert_eq!(
        a.get(VB, k.as_bytes()).err(),
        Some(EngineStatus::KeyNotFound)
    );
    a.flush_all().unwrap();
    let events = stream_all(a, 0);
    let shape = |events: &[DcpEvent]| -> Vec<(&'static str, u64)> {
        events
            .iter()
            .filter_map(|e| match e {
                DcpEvent::System { seqno, .. } => Some(("system", *seqno)),
                DcpEvent::Expiration(d) => Some(("expiration", d.seqno)),
                DcpEvent::Mutation(d) => Some(("mutation", d.seqno)),
                DcpEvent::Deletion(d) => Some(("deletion", d.seqno)),
                _ => None,
            })
            .collect()
    };
    let sent = shape(&events);
    assert_eq!(
        sent.iter().map(|e| e.0).collect::<Vec<_>>(),
        vec!["system", "system", "expiration"]
    );
    for e in events {
        replica.replicate(VB, e).unwrap();
    }
    let high = a.vbucket_seqnos(VB).unwrap().high_seqno.0;
    assert_eq!(replica.vbucket_seqnos(VB).unwrap().high_seqno.0, high);
    // Promoted, it streams what it was given, from disk.
    replica.flush_all().unwrap();
    replica.set_vbucket_state(VB, VBucketState::Active).unwrap();
    assert_eq!(shape(&stream_all(&replica, 0)), sent);
    replica.shutdown();
}

/// The events of a sync-replication stream of `active`'s VB after `start`, polled now.
fn sync_events(s: &mut dyn epkv_engine_api::DcpStream) -> Vec<DcpEvent> {
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = Vec::new();
    for _ in 0..100 {
        if s.poll_events(&mut cx, 1 << 20, &mut out).is_pending() {
            break;
        }
    }
    out
}

fn durable(level: epkv_types::DurabilityLevel) -> StoreRequest<'static> {
    StoreRequest {
        op: StoreOp::Set,
        vbid: VB,
        key: b"",
        value: b"durable",
        flags: 0,
        expiry: Expiry::Never,
        cas: Cas(0),
        datatype: Datatype::RAW,
        durability: Some(epkv_engine_api::DurabilityRequirements {
            level,
            timeout: Some(Duration::from_secs(30)),
        }),
        preserve_ttl: false,
    }
}

#[test]
fn sync_writes_commit_only_once_the_replica_acknowledges_them() {
    use epkv_types::DurabilityLevel;
    use std::sync::Mutex;
    let (da, dr) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let active = open(da.path());
    let replica = open(dr.path());
    replica
        .set_vbucket_state(VB, VBucketState::Replica)
        .unwrap();
    active.set_replication_chain(VB, 1, 1).unwrap();
    let mut stream = active
        .dcp_stream(
            VB,
            DcpStreamRequest {
                start_seqno: 0,
                end_seqno: u64::MAX,
                sync_replication: true,
                ..DcpStreamRequest::default()
            },
        )
        .unwrap();
    let k = key_in(VB, 0);
    let outcome = Arc::new(Mutex::new(None));
    for (i, level) in [
        DurabilityLevel::Majority,
        DurabilityLevel::PersistToMajority,
    ]
    .into_iter()
    .enumerate()
    {
        let value = format!("durable-{i}");
        let mut req = durable(level);
        req.key = k.as_bytes();
        req.value = value.as_bytes();
        let info = active.store(req).unwrap();
        let seen = Arc::clone(&outcome);
        active
            .when_sync_write_completed(
                VB,
                info.seqno.0,
                Box::new(move |r| *seen.lock().unwrap() = Some(r)),
            )
            .unwrap();
        // A majority of two needs the replica: still pending, and readers see the old.
        assert!(
            outcome.lock().unwrap().is_none(),
            "{level:?} waits for the replica"
        );
        assert_ne!(
            active
                .get(VB, k.as_bytes())
                .ok()
                .map(|it| it.value.to_vec()),
            Some(value.clone().into_bytes())
        );
        active.flush_all().unwrap();
        // The prepare reaches the replica; it acknowledges what it may.
        for e in sync_events(stream.as_mut()) {
            replica.replicate(VB, e).unwrap();
        }
        let hps = replica.replica_prepared_seqno(VB).unwrap();
        if level == DurabilityLevel::PersistToMajority {
            // Not on the replica's disk yet: not acknowledgeable.
            assert!(hps < info.seqno.0, "hps {hps} before the replica persisted");
            active.seqno_acknowledged(VB, "replica", hps).unwrap();
            assert!(outcome.lock().unwrap().is_none());
            replica.flush_all().unwrap();
        }
        let hps = replica.replica_prepared_seqno(VB).unwrap();
        assert_eq!(hps, info.seqno.0);
        active.seqno_acknowledged(VB, "replica", hps).unwrap();
        assert_eq!(
            *outcome.lock().unwrap(),
            Some(Ok(())),
            "{level:?} committed"
        );
        *outcome.lock().unwrap() = None;
        assert_eq!(
            active.get(VB, k.as_bytes()).unwrap().value.to_vec(),
            value.clone().into_bytes()
        );
        // The commit reaches the replica too.
        for e in sync_events(stream.as_mut()) {
            replica.replicate(VB, e).unwrap();
        }
        assert_eq!(
            replica
                .get_replica(VB, k.as_bytes())
                .unwrap()
                .value
                .to_vec(),
            value.into_bytes()
        );
    }
    // Without a live replica a majority cannot be had.
    active.set_replication_chain(VB, 1, 0).unwrap();
    let mut req = durable(DurabilityLevel::Majority);
    req.key = k.as_bytes();
    assert_eq!(
        active.store(req).err(),
        Some(EngineStatus::DurabilityImpossible)
    );
    // A replica promoted with a prepare in flight commits it.
    active.set_replication_chain(VB, 1, 1).unwrap();
    let mut req = durable(DurabilityLevel::Majority);
    req.key = k.as_bytes();
    req.value = b"in flight";
    active.store(req).unwrap();
    for e in sync_events(stream.as_mut()) {
        replica.replicate(VB, e).unwrap();
    }
    assert_ne!(
        replica
            .get_replica(VB, k.as_bytes())
            .unwrap()
            .value
            .to_vec(),
        b"in flight".to_vec()
    );
    replica.set_vbucket_state(VB, VBucketState::Active).unwrap();
    replica.flush_all().unwrap();
    let mut committed = false;
    for _ in 0..100 {
        if replica
            .get(VB, k.as_bytes())
            .is_ok_and(|it| &it.value[..] == b"in flight")
        {
            committed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        replica.flush_all().unwrap();
    }
    assert!(
        committed,
        "the promoted replica committed the prepare it held"
    );
    drop(stream);
    replica.shutdown();
    active.shutdown();
}

/// `slots` as a chain of the topology (`None`: an empty slot).
fn chain(slots: &[Option<&str>]) -> Vec<Option<String>> {
    slots.iter().map(|s| s.map(str::to_owned)).collect()
}

#[test]
fn during_a_move_sync_writes_need_a_majority_of_both_chains() {
    use epkv_types::DurabilityLevel;
    use std::sync::Mutex;
    let dir = tempfile::tempdir().unwrap();
    let active = open(dir.path());
    // This node is "a"; "b" and "c" are the replicas' DCP connection names. The vBucket
    // moves from chain [a, c] to [b, c].
    let moving = [
        chain(&[Some("a"), Some("c")]),
        chain(&[Some("b"), Some("c")]),
    ];
    active.set_replication_topology(VB, "a", &moving).unwrap();
    let outcome = Arc::new(Mutex::new(None));
    let write = |value: &'static [u8]| {
        let mut req = durable(DurabilityLevel::Majority);
        let k = key_in(VB, 0);
        req.key = k.as_bytes();
        req.value = value;
        let seqno = active.store(req).unwrap().seqno.0;
        let seen = Arc::clone(&outcome);
        active
            .when_sync_write_completed(
                VB,
                seqno,
                Box::new(move |r| *seen.lock().unwrap() = Some(r)),
            )
            .unwrap();
        seqno
    };
    let outcome_now = || outcome.lock().unwrap().take();
    // C's acknowledgement is a majority of the first chain only.
    let s1 = write(b"one");
    active.seqno_acknowledged(VB, "c", s1).unwrap();
    assert_eq!(outcome_now(), None, "the second chain has no majority yet");
    // A name in no chain counts for nothing.
    active.seqno_acknowledged(VB, "stranger", s1).unwrap();
    assert_eq!(outcome_now(), None);
    // B's makes the second chain's.
    active.seqno_acknowledged(VB, "b", s1).unwrap();
    assert_eq!(outcome_now(), Some(Ok(())));
    // Acknowledged by C only, then the move ends (the second chain goes): the prepare
    // waiting for it commits at once.
    let s2 = write(b"two");
    active.seqno_acknowledged(VB, "c", s2).unwrap();
    assert_eq!(outcome_now(), None);
    active
        .set_replication_topology(VB, "a", &moving[..1])
        .unwrap();
    assert_eq!(outcome_now(), Some(Ok(())));
    // The first chain only: C's acknowledgement is enough.
    let s3 = write(b"three");
    assert_eq!(outcome_now(), None);
    active.seqno_acknowledged(VB, "c", s3).unwrap();
    assert_eq!(outcome_now(), Some(Ok(())));
    assert_eq!(
        &active.get(VB, key_in(VB, 0).as_bytes()).unwrap().value[..],
        b"three"
    );
    // A second chain with an empty slot cannot have its majority.
    active
        .set_replication_topology(
            VB,
            "a",
            &[chain(&[Some("a"), Some("c")]), chain(&[Some("b"), None])],
        )
        .unwrap();
    let mut req = durable(DurabilityLevel::Majority);
    let k = key_in(VB, 0);
    req.key = k.as_bytes();
    assert_eq!(
        active.store(req).err(),
        Some(EngineStatus::DurabilityImpossible)
    );
    active.shutdown();
}

const MAJORITY: epkv_types::DurabilityLevel = epkv_types::DurabilityLevel::Majority;
const PERSIST_TO_MAJORITY: epkv_types::DurabilityLevel =
    epkv_types::DurabilityLevel::PersistToMajority;

/// An active bucket whose flusher and durability timeouts run by hand.
fn open_active(dir: &Path) -> support::ExecFixture {
    let quota = epkv_engine::BucketConfig::default().memory_quota_bytes;
    support::open_configured(dir, quota, epkv_engine::EvictionPolicy::Value, |p| {
        p.flusher = epkv_engine::FlusherMode::Manual;
    })
}

/// A sync-replication stream of `active`'s VB from `start` (the replica's position).
fn sync_stream(active: &Bucket, start: u64) -> Box<dyn epkv_engine_api::DcpStream> {
    let uuid = active.vbucket_seqnos(VB).unwrap().failover_log[0].uuid;
    active
        .dcp_stream(
            VB,
            DcpStreamRequest {
                start_seqno: start,
                end_seqno: u64::MAX,
                vbucket_uuid: if start == 0 { 0 } else { uuid },
                snap_start_seqno: start,
                snap_end_seqno: start,
                sync_replication: true,
                ..DcpStreamRequest::default()
            },
        )
        .unwrap()
}

/// Applies what `stream` has now to `replica`; returns the events.
fn pump(stream: &mut dyn epkv_engine_api::DcpStream, replica: &Bucket) -> Vec<DcpEvent> {
    // Polled a few times whatever it answers: a stream moving to its backfill answers
    // Pending once with a wake.
    let mut cx = Context::from_waker(Waker::noop());
    let mut events = Vec::new();
    for _ in 0..50 {
        let _ = stream.poll_events(&mut cx, 1 << 20, &mut events);
    }
    for e in &events {
        replica.replicate(VB, e.clone()).unwrap();
    }
    events
}

/// `b`'s high seqno of VB.
fn high(b: &Bucket) -> u64 {
    b.vbucket_seqnos(VB).unwrap().high_seqno.0
}

/// A SyncWrite of `key` at `level` that nobody acknowledges, aborted once its 100 ms
/// timeout passes ([`abort_expired`]). Returns the prepare's seqno.
fn unacknowledged_write(active: &Bucket, key: &str, level: epkv_types::DurabilityLevel) -> u64 {
    let mut req = durable(level);
    req.key = key.as_bytes();
    req.durability = Some(epkv_engine_api::DurabilityRequirements {
        level,
        timeout: Some(Duration::from_millis(100)),
    });
    active.store(req).unwrap().seqno.0
}

/// Moves the active's clock past the writes' timeouts and runs its timeout tasks.
fn abort_expired(f: &support::ExecFixture) {
    f.exec.advance(Duration::from_millis(200));
    f.exec.run_until_idle(1000);
}

/// The document events: kind, seqno, and for an abort the prepare it names.
fn kinds(events: &[DcpEvent]) -> Vec<(&'static str, u64, u64)> {
    events
        .iter()
        .filter_map(|e| match e {
            DcpEvent::Mutation(d) => Some(("mutation", d.seqno, 0)),
            DcpEvent::Prepare { doc, .. } => Some(("prepare", doc.seqno, 0)),
            DcpEvent::Abort {
                prepared_seqno,
                abort_seqno,
                ..
            } => Some(("abort", *abort_seqno, *prepared_seqno)),
            _ => None,
        })
        .collect()
}

/// Active and replica buckets for VB, the active's chain holding one replica.
fn active_and_replica(da: &Path, dr: &Path) -> (support::ExecFixture, Arc<Bucket>) {
    let f = open_active(da);
    f.bucket.set_replication_chain(VB, 1, 1).unwrap();
    let replica = open(dr);
    replica
        .set_vbucket_state(VB, VBucketState::Replica)
        .unwrap();
    (f, replica)
}

#[test]
fn a_prepare_aborted_while_streamed_reaches_the_replica_with_its_abort() {
    let (da, dr) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (f, replica) = active_and_replica(da.path(), dr.path());
    let active = &f.bucket;
    // Streamed from an empty vBucket.
    let mut s = sync_stream(active, 0);
    assert!(pump(s.as_mut(), &replica).is_empty());
    let k = key_in(VB, 0);
    let prepared = unacknowledged_write(active, &k, MAJORITY);
    assert_eq!(
        kinds(&pump(s.as_mut(), &replica)),
        [("prepare", prepared, 0)]
    );
    abort_expired(&f);
    assert_eq!(
        kinds(&pump(s.as_mut(), &replica)),
        [("abort", prepared + 1, prepared)]
    );
    assert_eq!((high(&replica), high(active)), (2, 2));
    drop(s);
    replica.shutdown();
    active.shutdown();
}

#[test]
fn a_backfill_sends_the_aborts_on_disk_so_the_replica_reaches_the_high_seqno() {
    let (da, dr) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (f, replica) = active_and_replica(da.path(), dr.path());
    let active = &f.bucket;
    // Nothing but a prepare and its abort, before any stream.
    let k = key_in(VB, 0);
    let prepared = unacknowledged_write(active, &k, MAJORITY);
    abort_expired(&f);
    active.flush_all().unwrap();
    assert_eq!(high(active), 2);
    let mut s = sync_stream(active, 0);
    let events = pump(s.as_mut(), &replica);
    assert_eq!(kinds(&events), [("abort", 2, prepared)], "{events:?}");
    assert_eq!(high(&replica), 2);
    drop(s);
    // Mutations streamed, then a prepare and its abort while no stream is open, the
    // vBucket pending (a takeover) by the time the replica asks again.
    let mut s = sync_stream(active, high(&replica));
    for i in 1..=8 {
        set(active, &key_in(VB, i), "v");
    }
    pump(s.as_mut(), &replica);
    assert_eq!(high(&replica), 10);
    drop(s);
    let prepared = unacknowledged_write(active, &key_in(VB, 9), MAJORITY);
    abort_expired(&f);
    active.flush_all().unwrap();
    active.set_vbucket_state(VB, VBucketState::Pending).unwrap();
    let mut s = sync_stream(active, high(&replica));
    let events = pump(s.as_mut(), &replica);
    assert_eq!(kinds(&events), [("abort", 12, prepared)], "{events:?}");
    assert_eq!((high(&replica), high(active)), (12, 12));
    drop(s);
    replica.shutdown();
    active.shutdown();
}

#[test]
fn a_stream_opened_with_a_prepare_in_flight_sends_its_abort_from_disk() {
    let (da, dr) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (f, replica) = active_and_replica(da.path(), dr.path());
    let active = &f.bucket;
    let k = key_in(VB, 0);
    set(active, &k, "committed");
    let prepared = unacknowledged_write(active, &k, MAJORITY);
    // The stream starts behind the log: it backfills once the flusher gets there, by
    // which time the prepare was aborted.
    let mut s = sync_stream(active, 0);
    assert!(pump(s.as_mut(), &replica).is_empty());
    abort_expired(&f);
    active.flush_all().unwrap();
    let events = pump(s.as_mut(), &replica);
    assert_eq!(
        kinds(&events),
        [("mutation", 1, 0), ("abort", 3, prepared)],
        "{events:?}"
    );
    assert_eq!((high(&replica), high(active)), (3, 3));
    drop(s);
    replica.shutdown();
    active.shutdown();
}

/// Promotes `replica` and lets it commit the prepares it held.
fn promote(replica: &Bucket) {
    replica.set_vbucket_state(VB, VBucketState::Active).unwrap();
    for _ in 0..10 {
        replica.flush_all().unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_replica_holding_a_prepare_drops_it_for_its_abort_from_a_backfill() {
    let (da, dr) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (f, replica) = active_and_replica(da.path(), dr.path());
    let active = &f.bucket;
    let k = key_in(VB, 0);
    set(active, &k, "committed");
    let mut s = sync_stream(active, 0);
    let prepared = unacknowledged_write(active, &k, MAJORITY);
    active.flush_all().unwrap();
    let events = pump(s.as_mut(), &replica);
    assert_eq!(
        kinds(&events),
        [("mutation", 1, 0), ("prepare", prepared, 0)]
    );
    // The stream drops; the prepare is aborted meanwhile.
    drop(s);
    abort_expired(&f);
    active.flush_all().unwrap();
    let mut s = sync_stream(active, high(&replica));
    let events = pump(s.as_mut(), &replica);
    assert_eq!(kinds(&events), [("abort", 3, prepared)], "{events:?}");
    assert_eq!(high(&replica), 3);
    // Promoted, the replica does not commit the aborted write.
    drop(s);
    promote(&replica);
    assert_eq!(
        &replica.get(VB, k.as_bytes()).unwrap().value[..],
        b"committed"
    );
    replica.shutdown();
    active.shutdown();
}

#[test]
fn an_abort_from_a_backfill_drops_the_prepare_held_for_its_key_whatever_its_seqno() {
    let (da, dr) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (f, replica) = active_and_replica(da.path(), dr.path());
    let active = &f.bucket;
    let (k, other) = (key_in(VB, 0), key_in(VB, 1));
    let mut s = sync_stream(active, 0);
    set(active, &k, "committed");
    // The replica holds a PersistToMajority prepare, not on its disk: it fences the
    // replica's acknowledgements.
    let first = unacknowledged_write(active, &k, PERSIST_TO_MAJORITY);
    active.flush_all().unwrap();
    let events = pump(s.as_mut(), &replica);
    assert_eq!(kinds(&events), [("mutation", 1, 0), ("prepare", first, 0)]);
    assert_eq!(replica.replica_prepared_seqno(VB).unwrap(), 0);
    // The stream drops; that prepare is aborted, and a second one of the same key too
    // (the disk keeps the second abort only), then a write of another key is prepared.
    drop(s);
    abort_expired(&f);
    let second = unacknowledged_write(active, &k, MAJORITY);
    abort_expired(&f);
    let mut req = durable(MAJORITY);
    req.key = other.as_bytes();
    let pending = active.store(req).unwrap().seqno.0;
    active.flush_all().unwrap();
    assert_eq!(high(active), 6);
    let mut s = sync_stream(active, high(&replica));
    let events = pump(s.as_mut(), &replica);
    assert_eq!(
        kinds(&events),
        [("abort", 5, second), ("prepare", pending, 0)],
        "{events:?}"
    );
    assert_eq!(high(&replica), 6);
    // The first prepare is gone with the second's abort: no fence any more.
    assert_eq!(replica.replica_prepared_seqno(VB).unwrap(), pending);
    // Promoted, the replica commits the prepare it holds, not the aborted ones.
    drop(s);
    promote(&replica);
    assert_eq!(
        &replica.get(VB, k.as_bytes()).unwrap().value[..],
        b"committed"
    );
    assert_eq!(
        &replica.get(VB, other.as_bytes()).unwrap().value[..],
        b"durable"
    );
    replica.shutdown();
    active.shutdown();
}

/// The replica holds a Majority prepare of `k` ("durable"); while its stream is down the
/// active commits it and writes `k` again ("newer"), then the replica streams again: the
/// backfill carries the newest version of `k` only, not the commit (its document was
/// replaced on disk).
fn held_prepare_committed_then_overwritten(
    f: &support::ExecFixture,
    replica: &Bucket,
    k: &str,
) -> u64 {
    let active = &f.bucket;
    let mut s = sync_stream(active, 0);
    let mut req = durable(MAJORITY);
    req.key = k.as_bytes();
    let prepared = active.store(req).unwrap().seqno.0;
    active.flush_all().unwrap();
    assert_eq!(
        kinds(&pump(s.as_mut(), replica)),
        [("prepare", prepared, 0)]
    );
    drop(s);
    active.seqno_acknowledged(VB, "replica", prepared).unwrap();
    set(active, k, "newer");
    active.flush_all().unwrap();
    assert_eq!(high(active), 3);
    let mut s = sync_stream(active, high(replica));
    let events = pump(s.as_mut(), replica);
    assert_eq!(kinds(&events), [("mutation", 3, 0)], "{events:?}");
    assert!(
        matches!(
            events.first(),
            Some(DcpEvent::SnapshotMarker {
                end: 3,
                high_completed: Some(hcs),
                ..
            }) if *hcs == prepared
        ),
        "{events:?}"
    );
    assert_eq!(high(replica), 3);
    prepared
}

#[test]
fn a_replica_completes_the_prepares_a_disk_snapshot_completed_at_its_end() {
    let (da, dr) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (f, replica) = active_and_replica(da.path(), dr.path());
    let k = key_in(VB, 0);
    held_prepare_committed_then_overwritten(&f, &replica, &k);
    assert_eq!(
        &replica.get_replica(VB, k.as_bytes()).unwrap().value[..],
        b"newer"
    );
    // Promoted, the replica has no prepare of the key left to commit over the newer
    // value.
    promote(&replica);
    assert_eq!(&replica.get(VB, k.as_bytes()).unwrap().value[..], b"newer");
    replica.shutdown();
    f.bucket.shutdown();
}

#[test]
fn a_replica_persists_the_high_completed_seqno_of_a_disk_snapshot_it_completed() {
    let (da, dr) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (f, replica) = active_and_replica(da.path(), dr.path());
    let k = key_in(VB, 0);
    held_prepare_committed_then_overwritten(&f, &replica, &k);
    // Restarted, warmup finds the prepare on the replica's disk at or below the high
    // completed seqno it persisted: completed, not restored.
    replica.flush_all().unwrap();
    replica.shutdown();
    drop(replica);
    let replica = open(dr.path());
    assert_eq!(high(&replica), 3);
    promote(&replica);
    assert_eq!(&replica.get(VB, k.as_bytes()).unwrap().value[..], b"newer");
    replica.shutdown();
    f.bucket.shutdown();
}
