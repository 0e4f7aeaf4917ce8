//! Range scans over a real socket (issue 16): RANGE_SCAN_CREATE on every vBucket, the
//! continues' packed keys and documents across several responses ending in
//! RangeScanMore or RangeScanComplete, and the statuses of unknown scans, bad creates,
//! replica vBuckets, a user without the RangeScan privilege and a cancelled scan.

use crate::harness::{ADMIN, Server, admin_args, skip_if_external};
use epkv_client::{Client, StoreOptions};
use epkv_protocol::range_scan::{self as wire, ContinueRequest};
use epkv_protocol::{Feature, Opcode, RequestBuilder, Status};
use epkv_types::{Datatype, NUM_VBUCKETS, VBucketState, Vbid, vbucket_for_key};
use std::collections::BTreeMap;

/// Documents written for the full scan.
const DOCS: usize = 2000;

async fn scan_client(server: &Server) -> Client {
    let mut c = server.client().await;
    c.hello("e2e-range-scan", &[Feature::Xerror, Feature::Json])
        .await
        .unwrap();
    c.auth_plain(ADMIN.0, ADMIN.1).await.unwrap();
    assert!(c.select_bucket("default").await.unwrap().is_success());
    c
}

fn spec(start: &[u8], end: &[u8], key_only: bool) -> Vec<u8> {
    use base64::Engine as _;
    let b64 = |k: &[u8]| base64::engine::general_purpose::STANDARD.encode(k);
    format!(
        r#"{{"key_only":{key_only},"range":{{"start":"{}","end":"{}"}}}}"#,
        b64(start),
        b64(end)
    )
    .into_bytes()
}

fn limits(id: &[u8], items: u32) -> ContinueRequest {
    ContinueRequest {
        id: id.try_into().unwrap(),
        item_limit: items,
        time_limit_ms: 0,
        byte_limit: 0,
    }
}

/// Scans vBucket `vb` to the end (bounded); returns its documents (key → value) and
/// how many responses carried them.
async fn scan_vbucket(
    c: &mut Client,
    vb: Vbid,
    key_only: bool,
) -> (BTreeMap<Vec<u8>, Vec<u8>>, usize) {
    let mut found = BTreeMap::new();
    let r = c
        .range_scan_create(vb, &spec(b"\0", b"\xff", key_only))
        .await
        .unwrap();
    if r.status() == Some(Status::KeyEnoent) {
        return (found, 0);
    }
    assert!(r.is_success(), "create on {vb:?}: {:?}", r.status());
    let id = r.value.clone();
    let mut frames = 0;
    for _ in 0..10_000 {
        let responses = c.range_scan_continue(vb, limits(&id, 7)).await.unwrap();
        let last = responses.last().unwrap().status();
        for resp in &responses {
            frames += 1;
            let flags = u32::from_be_bytes(resp.extras[..4].try_into().unwrap());
            if key_only {
                assert_eq!(flags, wire::FLAGS_KEYS);
                for k in wire::keys(&resp.value) {
                    found.insert(k.unwrap().to_vec(), Vec::new());
                }
            } else {
                assert_eq!(flags, wire::FLAGS_DOCUMENTS);
                for d in wire::documents(&resp.value) {
                    let d = d.unwrap();
                    assert_eq!(d.meta.flags, 0xf1a9);
                    assert!(d.meta.seqno > 0 && d.meta.cas > 0);
                    found.insert(d.key.to_vec(), d.value.to_vec());
                }
            }
        }
        match last {
            Some(Status::RangeScanMore) => {}
            Some(Status::RangeScanComplete) => return (found, frames),
            other => panic!("continue on {vb:?} ended with {other:?}"),
        }
    }
    panic!("the scan of {vb:?} does not end");
}

#[tokio::test]
async fn a_scan_of_every_vbucket_returns_every_document_once() {
    if skip_if_external("a_scan_of_every_vbucket_returns_every_document_once") {
        return;
    }
    let server = Server::spawn(&admin_args());
    let mut c = scan_client(&server).await;
    let mut want = BTreeMap::new();
    for i in 0..DOCS {
        let key = format!("scan-{i:05}").into_bytes();
        let value = format!("{{\"i\":{i}}}").into_bytes();
        let opts = StoreOptions {
            flags: 0xf1a9,
            ..StoreOptions::default()
        };
        assert!(c.set(&key, &value, opts).await.unwrap().is_success());
        want.insert(key, value);
    }
    let (mut keys, mut docs) = (BTreeMap::new(), BTreeMap::new());
    for vb in 0..NUM_VBUCKETS {
        let (k, _) = scan_vbucket(&mut c, Vbid(vb), true).await;
        for key in k.keys() {
            assert_eq!(vbucket_for_key(key, NUM_VBUCKETS), Vbid(vb));
        }
        keys.extend(k);
        docs.extend(scan_vbucket(&mut c, Vbid(vb), false).await.0);
    }
    assert_eq!(
        keys.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    assert_eq!(docs, want);
}

#[tokio::test]
async fn a_long_continue_spans_several_responses() {
    if skip_if_external("a_long_continue_spans_several_responses") {
        return;
    }
    let server = Server::spawn(&admin_args());
    let mut c = scan_client(&server).await;
    // Keys of one vBucket, each 200 bytes of value: one continue is many frames.
    let vb = Vbid(5);
    let mut n = 0;
    for i in 0..1_000_000 {
        let key = format!("long-{i:06}").into_bytes();
        if vbucket_for_key(&key, NUM_VBUCKETS) != vb {
            continue;
        }
        assert!(
            c.set(&key, &[b'v'; 200], StoreOptions::default())
                .await
                .unwrap()
                .is_success()
        );
        n += 1;
        if n == 300 {
            break;
        }
    }
    let r = c
        .range_scan_create(vb, &spec(b"long-", b"long-\xff", false))
        .await
        .unwrap();
    let responses = c
        .range_scan_continue(vb, limits(&r.value, 0))
        .await
        .unwrap();
    assert!(
        responses.len() > 1,
        "300 documents of 200 bytes exceed one frame"
    );
    let (last, rest) = responses.split_last().unwrap();
    assert_eq!(last.status(), Some(Status::RangeScanComplete));
    assert!(rest.iter().all(|r| r.status() == Some(Status::Success)));
    let docs: usize = responses
        .iter()
        .map(|r| wire::documents(&r.value).count())
        .sum();
    assert_eq!(docs, 300);
}

#[tokio::test]
async fn scans_answer_kv_engines_statuses() {
    if skip_if_external("scans_answer_kv_engines_statuses") {
        return;
    }
    let server = Server::spawn(&admin_args());
    let mut c = scan_client(&server).await;
    let key = b"status-key";
    let vb = vbucket_for_key(key, NUM_VBUCKETS);
    assert!(
        c.set(key, b"1", StoreOptions::default())
            .await
            .unwrap()
            .is_success()
    );
    // An unknown scan.
    let r = c
        .range_scan_continue(vb, limits(&[9; 16], 0))
        .await
        .unwrap();
    assert_eq!(r.last().unwrap().status(), Some(Status::KeyEnoent));
    assert_eq!(
        c.range_scan_cancel(vb, [9; 16]).await.unwrap().status(),
        Some(Status::KeyEnoent)
    );
    // Bad JSON, a raw datatype, an empty range.
    let r = c.range_scan_create(vb, b"{\"range\":{}}").await.unwrap();
    assert_eq!(r.status(), Some(Status::Einval));
    assert!(String::from_utf8_lossy(&r.value).contains("range did not include start"));
    let raw = RequestBuilder::new(Opcode::RangeScanCreate)
        .vbucket(vb)
        .datatype(Datatype::RAW)
        .value(&spec(key, key, true))
        .to_vec()
        .unwrap();
    c.send_raw(&raw).await.unwrap();
    assert_eq!(c.recv().await.unwrap().status(), Some(Status::Einval));
    let r = c
        .range_scan_create(vb, &spec(b"zz", b"zzz", true))
        .await
        .unwrap();
    assert_eq!(r.status(), Some(Status::KeyEnoent));
    // A cancelled scan is gone.
    let r = c
        .range_scan_create(vb, &spec(key, key, true))
        .await
        .unwrap();
    assert!(r.is_success());
    let id: [u8; 16] = r.value[..].try_into().unwrap();
    assert!(c.range_scan_cancel(vb, id).await.unwrap().is_success());
    let r = c.range_scan_continue(vb, limits(&id, 0)).await.unwrap();
    assert_eq!(r.last().unwrap().status(), Some(Status::KeyEnoent));
    // A replica vBucket.
    assert!(
        c.set_vbucket(vb, VBucketState::Replica)
            .await
            .unwrap()
            .is_success()
    );
    let r = c
        .range_scan_create(vb, &spec(key, key, true))
        .await
        .unwrap();
    assert_eq!(r.status(), Some(Status::NotMyVbucket));
}

#[tokio::test]
async fn a_user_without_the_range_scan_privilege_gets_eaccess() {
    if skip_if_external("a_user_without_the_range_scan_privilege_gets_eaccess") {
        return;
    }
    let dir = crate::harness::TestDir::new();
    std::fs::create_dir_all(dir.path()).unwrap();
    let users = dir.path().join("users.toml");
    let out = std::process::Command::new(crate::harness::server_binary())
        .args(["user", "add", "--users-file"])
        .arg(&users)
        .args([
            "--name",
            "reader",
            "--password",
            "reader-pw",
            "--roles",
            "data_reader[default]",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut args = admin_args();
    let users_arg = users.to_string_lossy().into_owned();
    args.extend(["--users-file", users_arg.as_str()]);
    let server = Server::spawn(&args);
    let mut c = server.client().await;
    c.hello("e2e-range-scan", &[Feature::Xerror, Feature::Json])
        .await
        .unwrap();
    c.auth_plain("reader", "reader-pw").await.unwrap();
    assert!(c.select_bucket("default").await.unwrap().is_success());
    let r = c
        .range_scan_create(Vbid(0), &spec(b"a", b"z", true))
        .await
        .unwrap();
    assert_eq!(r.status(), Some(Status::Eaccess));
    assert!(String::from_utf8_lossy(&r.value).contains("RangeScan"));
}
