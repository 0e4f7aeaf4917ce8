//! GET_META (0xa0) and OBSERVE (0x92) on the wire (issue 20): what the SDKs' `exists`
//! and libcouchbase's `cbc observe` send, against a real server, for live documents,
//! deletions before and after they reach the disk, and absent keys.

use crate::harness::{Server, skip_if_external};
use epkv_client::{Client, StoreOptions};
use epkv_protocol::{DurabilityRequirement, Feature, ObserveKeys, Opcode, RequestBuilder, Status};
use epkv_types::{Cas, DurabilityLevel, NUM_VBUCKETS, vbucket_for_key};
use std::time::Duration;

/// GET_META with the version-2 extras the SDKs send: (status, deleted, flags, seqno,
/// datatype, cas).
async fn get_meta(c: &mut Client, key: &[u8]) -> (Option<Status>, u32, u32, u64, u8, Cas) {
    let req = RequestBuilder::new(Opcode::GetMeta)
        .key(key)
        .extras(&[2])
        .vbucket(vbucket_for_key(key, NUM_VBUCKETS));
    let r = c.request(req).await.unwrap();
    if r.status() != Some(Status::Success) {
        return (r.status(), 0, 0, 0, 0, Cas(0));
    }
    let e = &r.extras;
    assert_eq!(e.len(), 21, "deleted, flags, expiry, seqno, datatype");
    let be32 = |b: &[u8]| u32::from_be_bytes(b.try_into().unwrap());
    (
        r.status(),
        be32(&e[..4]),
        be32(&e[4..8]),
        u64::from_be_bytes(e[12..20].try_into().unwrap()),
        e[20],
        r.cas,
    )
}

/// OBSERVE of `keys`: each key's state byte and CAS.
async fn observe(c: &mut Client, keys: &[&[u8]]) -> Vec<(Vec<u8>, u8, u64)> {
    let mut body = Vec::new();
    for k in keys {
        body.extend_from_slice(&vbucket_for_key(k, NUM_VBUCKETS).0.to_be_bytes());
        body.extend_from_slice(&(k.len() as u16).to_be_bytes());
        body.extend_from_slice(k);
    }
    let r = c
        .request(RequestBuilder::new(Opcode::Observe).value(&body))
        .await
        .unwrap();
    assert_eq!(r.status(), Some(Status::Success), "{r:?}");
    // The reply's entries are the request's plus state and CAS: walk them by hand.
    let v = &r.value;
    let mut out = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let len = usize::from(u16::from_be_bytes([v[i + 2], v[i + 3]]));
        let key = v[i + 4..i + 4 + len].to_vec();
        let state = v[i + 4 + len];
        let cas = u64::from_be_bytes(v[i + 5 + len..i + 13 + len].try_into().unwrap());
        out.push((key, state, cas));
        i += 13 + len;
    }
    assert!(ObserveKeys::new(&body).all(|e| e.is_ok()));
    out
}

#[tokio::test]
async fn get_meta_and_observe_report_documents_tombstones_and_absent_keys() {
    if skip_if_external("meta") {
        return;
    }
    let server = Server::spawn(&[]);
    server.wait_warmed_up().await;
    let mut c = server.client().await;
    c.hello(
        "e2e-meta",
        &[Feature::Xerror, Feature::MutationSeqno, Feature::Json],
    )
    .await
    .unwrap();
    let persisted = StoreOptions::new().durability(DurabilityRequirement {
        level: DurabilityLevel::PersistToMajority,
        timeout: Some(Duration::from_secs(20)),
    });
    let set = c
        .set(b"meta-live", b"{\"a\":1}", persisted.flags(9))
        .await
        .unwrap();
    assert!(set.is_success());
    let (status, deleted, flags, seqno, datatype, cas) = get_meta(&mut c, b"meta-live").await;
    assert_eq!((status, deleted, flags), (Some(Status::Success), 0, 9));
    assert!(seqno > 0);
    assert_eq!(datatype, 0, "stored as sent (raw)");
    assert_eq!(cas, set.cas);
    assert_eq!(
        get_meta(&mut c, b"meta-never").await.0,
        Some(Status::KeyEnoent)
    );

    // Deleted and persisted: GET_META still reports the tombstone (read back from disk
    // once the server has dropped it from memory).
    let set2 = c.set(b"meta-gone", b"x", persisted).await.unwrap();
    let del = c.delete(b"meta-gone", Cas::ANY).await.unwrap();
    assert!(set2.is_success() && del.is_success());
    let (status, deleted, ..) = get_meta(&mut c, b"meta-gone").await;
    assert_eq!((status, deleted), (Some(Status::Success), 1));
    assert_eq!(
        c.get(b"meta-gone").await.unwrap().status(),
        Some(Status::KeyEnoent)
    );

    // OBSERVE: persisted, absent, and (if the flusher has not run yet) logically deleted.
    let unpersisted = c
        .set(b"meta-dirty", b"y", StoreOptions::new())
        .await
        .unwrap();
    // meta-live was a SyncWrite: its reply waited for the prepare's persistence, and its
    // commit is persisted by the next flush (poll, bounded).
    let mut got = Vec::new();
    for _ in 0..500 {
        got = observe(&mut c, &[b"meta-live", b"meta-never", b"meta-dirty"]).await;
        if got[0].1 == 0x01 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(got[0], (b"meta-live".to_vec(), 0x01, set.cas.0));
    assert_eq!((got[1].1, got[1].2), (0x80, 0));
    assert!(
        got[2] == (b"meta-dirty".to_vec(), 0x00, unpersisted.cas.0)
            || got[2] == (b"meta-dirty".to_vec(), 0x01, unpersisted.cas.0),
        "{:?}",
        got[2]
    );
    // A malformed key list is EINVAL and the connection stays usable.
    let bad = c
        .request(RequestBuilder::new(Opcode::Observe).value(&[0, 1, 0, 9, b'k']))
        .await
        .unwrap();
    assert_eq!(bad.status(), Some(Status::Einval));
    assert!(c.get(b"meta-live").await.unwrap().is_success());
}
