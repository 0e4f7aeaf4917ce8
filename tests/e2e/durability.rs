//! Durable writes on a single node: Majority commits at once; the persist levels
//! (MajorityAndPersistOnMaster, PersistToMajority) are acknowledged only once the write's
//! seqno is persisted, and answer 0xa3 SyncWriteAmbiguous when their timeout passes first;
//! a memory-only server refuses them with 0xa0 DurabilityInvalidLevel (as an ephemeral
//! bucket).

use crate::harness::{Server, key, skip_if_external};
use epkv_client::{Client, Response, StoreOptions};
use epkv_protocol::{Command, DurabilityRequirement, Feature, RequestBuilder, Status};
use epkv_types::{ArithmeticOp, Cas, DurabilityLevel, NUM_VBUCKETS, Vbid, vbucket_for_key};
use std::time::Duration;

const PERSIST_LEVELS: [DurabilityLevel; 2] = [
    DurabilityLevel::MajorityAndPersistOnMaster,
    DurabilityLevel::PersistToMajority,
];

fn level(level: DurabilityLevel, timeout: Option<Duration>) -> DurabilityRequirement {
    DurabilityRequirement { level, timeout }
}

/// A client that sees durability statuses (XERROR) and mutation seqnos.
async fn sdk_like_client(server: &Server) -> Client {
    let mut c = server.client().await;
    c.hello("e2e-durability", &[Feature::Xerror, Feature::MutationSeqno])
        .await
        .unwrap();
    c
}

fn be_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b.try_into().unwrap())
}

/// TOUCH `key` (expiry one hour) with durability `d`.
async fn touch_durable(c: &mut Client, key: &[u8], d: DurabilityRequirement) -> Response {
    let touch = Command::Touch {
        key,
        expiry: 3600,
        durability: Some(d),
    };
    let vb = vbucket_for_key(key, NUM_VBUCKETS);
    c.request(RequestBuilder::from_command(&touch).vbucket(vb))
        .await
        .unwrap()
}

/// SET `key` = `value` at durability `lvl` with the server's default timeout.
async fn set_at(c: &mut Client, key: &[u8], value: &[u8], lvl: DurabilityLevel) -> Response {
    c.set(key, value, StoreOptions::new().durability(level(lvl, None)))
        .await
        .unwrap()
}

/// The (vBucket UUID, seqno) a mutation reply carries.
fn token(r: &Response) -> (u64, u64) {
    assert_eq!(r.extras.len(), 16, "MutationSeqno extras: {r:?}");
    (be_u64(&r.extras[..8]), be_u64(&r.extras[8..]))
}

/// OBSERVE_SEQNO: (last persisted seqno, current seqno).
async fn observe(c: &mut Client, vb: Vbid, uuid: u64) -> (u64, u64) {
    let r = c.observe_seqno(vb, uuid).await.unwrap();
    assert!(r.is_success(), "{r:?}");
    assert_eq!(r.value.len(), 27, "format 0: {r:?}");
    (be_u64(&r.value[11..19]), be_u64(&r.value[19..27]))
}

/// Asserts a durable mutation reply succeeded and that the server reports its seqno
/// persisted right after acknowledging it.
async fn assert_acknowledged_persisted(c: &mut Client, vb: Vbid, r: &Response, what: &str) {
    assert!(r.is_success(), "{what}: {r:?}");
    let (uuid, seqno) = token(r);
    let (persisted, current) = observe(c, vb, uuid).await;
    assert!(
        persisted >= seqno,
        "{what}: acknowledged at seqno {seqno} but persisted only up to {persisted}"
    );
    assert!(current >= seqno);
}

#[tokio::test]
async fn persist_levels_are_acknowledged_only_once_persisted() {
    if skip_if_external("durability_persist_levels") {
        return;
    }
    let server = Server::spawn(&[]);
    let mut c = sdk_like_client(&server).await;
    for lvl in PERSIST_LEVELS {
        let d = level(lvl, Some(Duration::from_secs(20)));
        let k = key(&format!("persist-{lvl:?}"));
        let vb = vbucket_for_key(&k, NUM_VBUCKETS);

        let r = c
            .set(&k, b"on disk", StoreOptions::new().durability(d))
            .await
            .unwrap();
        assert_acknowledged_persisted(&mut c, vb, &r, "SET").await;
        assert_eq!(&c.get(&k).await.unwrap().value[..], b"on disk");

        // The default timeout (none given) works too.
        let r = set_at(&mut c, &k, b"again", lvl).await;
        assert_acknowledged_persisted(&mut c, vb, &r, "SET, default timeout").await;

        // TOUCH carries no seqno in its reply: once it is acknowledged, everything the
        // vBucket holds (the touch is its latest mutation) must be persisted.
        let uuid = token(&r).0;
        let r = touch_durable(&mut c, &k, d).await;
        assert!(r.is_success(), "TOUCH: {r:?}");
        assert!(r.extras.is_empty(), "TOUCH replies carry no extras: {r:?}");
        let (persisted, current) = observe(&mut c, vb, uuid).await;
        assert_eq!(
            persisted, current,
            "TOUCH acknowledged before it was persisted"
        );

        let counter = key(&format!("persist-counter-{lvl:?}"));
        let cvb = vbucket_for_key(&counter, NUM_VBUCKETS);
        let incr = Command::Arithmetic {
            op: ArithmeticOp::Increment,
            key: &counter,
            delta: 1,
            initial: 41,
            expiry: 0,
            durability: Some(d),
            preserve_ttl: false,
            quiet: false,
        };
        let r = c
            .request(RequestBuilder::from_command(&incr).vbucket(cvb))
            .await
            .unwrap();
        assert_acknowledged_persisted(&mut c, cvb, &r, "INCREMENT").await;
        assert_eq!(r.counter(), Some(41), "created with the initial value");

        let del = Command::Delete {
            key: &k,
            cas: Cas::ANY,
            durability: Some(d),
            quiet: false,
        };
        let r = c
            .request(RequestBuilder::from_command(&del).vbucket(vb))
            .await
            .unwrap();
        assert_acknowledged_persisted(&mut c, vb, &r, "DELETE").await;
        assert_eq!(c.get(&k).await.unwrap().status(), Some(Status::KeyEnoent));
    }
}

#[tokio::test]
async fn requests_pipelined_behind_a_durable_write_are_answered_in_order() {
    if skip_if_external("durability_pipelined") {
        return;
    }
    let server = Server::spawn(&[]);
    let mut c = sdk_like_client(&server).await;
    let k = key("persist-pipelined");
    let vb = vbucket_for_key(&k, NUM_VBUCKETS);
    let set = Command::Store {
        op: epkv_types::StoreOp::Set,
        key: &k,
        value: b"durable",
        flags: 7,
        expiry: 0,
        datatype: epkv_types::Datatype::RAW,
        cas: Cas::ANY,
        durability: Some(level(DurabilityLevel::PersistToMajority, None)),
        preserve_ttl: false,
        quiet: false,
    };
    let get = Command::Get {
        key: &k,
        with_key: false,
        quiet: false,
    };
    let o1 = c
        .queue(RequestBuilder::from_command(&set).vbucket(vb))
        .unwrap();
    let o2 = c
        .queue(RequestBuilder::from_command(&get).vbucket(vb))
        .unwrap();
    let o3 = c
        .queue(RequestBuilder::new(epkv_protocol::Opcode::Noop))
        .unwrap();
    let replies = c.flush_and_recv(3).await.unwrap();
    let opaques: Vec<u32> = replies.iter().map(|r| r.opaque).collect();
    assert_eq!(opaques, vec![o1, o2, o3], "replies in request order");
    assert!(replies[0].is_success(), "{:?}", replies[0]);
    assert_eq!(&replies[1].value[..], b"durable");
    let (uuid, seqno) = token(&replies[0]);
    let (persisted, _) = observe(&mut c, vb, uuid).await;
    assert!(persisted >= seqno);
}

#[tokio::test]
async fn a_sync_write_not_persisted_in_time_is_aborted_and_ambiguous() {
    if skip_if_external("durability_timeout") {
        return;
    }
    // No flusher: nothing reaches the disk before shutdown, so every persist-level write
    // outlives its timeout.
    let server = Server::spawn(&["--testing-manual-flush"]);
    let mut c = sdk_like_client(&server).await;
    for lvl in PERSIST_LEVELS {
        let k = key(&format!("ambiguous-{lvl:?}"));
        let vb = vbucket_for_key(&k, NUM_VBUCKETS);
        let before = c.set(&k, b"before", StoreOptions::new()).await.unwrap();
        assert!(before.is_success());
        let d = level(lvl, Some(Duration::from_millis(200)));
        let r = c
            .set(&k, b"maybe", StoreOptions::new().durability(d))
            .await
            .unwrap();
        assert_eq!(r.status(), Some(Status::SyncWriteAmbiguous), "{r:?}");
        // The prepare was aborted when its timeout passed: readers never saw it, and the
        // key takes writes again.
        assert_eq!(&c.get(&k).await.unwrap().value[..], b"before");
        let r = touch_durable(&mut c, &k, d).await;
        assert_eq!(r.status(), Some(Status::SyncWriteAmbiguous), "TOUCH: {r:?}");
        let r = c.get_cluster_config(None).await.unwrap();
        assert!(r.is_success());
        let uuid = {
            let set = c.set(&k, b"plain", StoreOptions::new()).await.unwrap();
            assert!(set.is_success(), "{set:?}");
            token(&set).0
        };
        let (persisted, current) = observe(&mut c, vb, uuid).await;
        assert!(persisted < current, "nothing was persisted");
    }
    // Majority does not wait for the disk.
    let k = key("ambiguous-majority");
    let r = set_at(&mut c, &k, b"v", DurabilityLevel::Majority).await;
    assert!(r.is_success(), "{r:?}");
}

#[tokio::test]
async fn a_memory_only_server_refuses_the_persist_levels() {
    if skip_if_external("durability_memory_only") {
        return;
    }
    let server = Server::spawn(&["--persistence", "false"]);
    let mut c = sdk_like_client(&server).await;
    let k = key("memory-only-durable");
    let r = set_at(&mut c, &k, b"v", DurabilityLevel::Majority).await;
    assert!(r.is_success(), "Majority commits at once: {r:?}");
    for lvl in PERSIST_LEVELS {
        let r = set_at(&mut c, &k, b"v", lvl).await;
        assert_eq!(r.status(), Some(Status::DurabilityInvalidLevel), "{lvl:?}");
        let r = touch_durable(&mut c, &k, level(lvl, None)).await;
        assert_eq!(
            r.status(),
            Some(Status::DurabilityInvalidLevel),
            "TOUCH {lvl:?}"
        );
        let got = c.get(&k).await.unwrap();
        assert!(
            got.is_success(),
            "the refused TOUCH left the document alone"
        );
    }
}

#[tokio::test]
async fn a_waiting_durable_write_does_not_block_its_worker_thread() {
    if skip_if_external("durability_worker_free") {
        return;
    }
    // One worker thread, and no flusher: a persist-level write waits its whole timeout
    // (65 s, longer than the client's 30 s read timeout).
    let server = Server::spawn(&["--threads", "1", "--testing-manual-flush"]);
    let mut waiting = sdk_like_client(&server).await;
    let k = key("worker-free");
    let vb = vbucket_for_key(&k, NUM_VBUCKETS);
    let set = Command::Store {
        op: epkv_types::StoreOp::Set,
        key: &k,
        value: b"pending",
        flags: 0,
        expiry: 0,
        datatype: epkv_types::Datatype::RAW,
        cas: Cas::ANY,
        durability: Some(level(
            DurabilityLevel::PersistToMajority,
            Some(Duration::from_millis(u64::from(
                DurabilityRequirement::MAX_TIMEOUT_MS,
            ))),
        )),
        preserve_ttl: false,
        quiet: false,
    };
    waiting
        .queue(RequestBuilder::from_command(&set).vbucket(vb))
        .unwrap();
    waiting.flush().await.unwrap();
    // Other connections, on the same (only) worker, are served meanwhile: were the worker
    // blocked, these would time out.
    let mut other = sdk_like_client(&server).await;
    // The write is a prepare: invisible to readers, and it keeps other writes of the key
    // out (the other connection may get there first: poll, bounded).
    let mut in_progress = false;
    for _ in 0..1000 {
        let r = other.set(&k, b"other", StoreOptions::new()).await.unwrap();
        if r.status() == Some(Status::SyncWriteInProgress) {
            in_progress = true;
            break;
        }
        assert!(r.is_success(), "{r:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        in_progress,
        "a pending SyncWrite refuses other writes of its key"
    );
    let r = other.get(&k).await.unwrap();
    assert_ne!(
        &r.value[..],
        b"pending",
        "readers never see a pending prepare"
    );
    let r = other
        .set(&key("worker-free-2"), b"v", StoreOptions::new())
        .await
        .unwrap();
    assert!(r.is_success());
    drop(waiting);
}
