//! `bucketCapabilities` against what the server does: every capability in
//! `epkv_protocol::BUCKET_CAPABILITIES` has a check here, over a real socket, that the
//! feature it names works (a capability without a check fails the test), and the cluster
//! map over KV, the REST bucket JSON and the terse REST map all carry exactly the list.

use crate::harness::{ADMIN, Server, admin_args, http_request, skip_if_external};
use epkv_client::{Client, Response, StoreOptions};
use epkv_protocol::dcp::{self, StreamReq};
use epkv_protocol::{
    BUCKET_CAPABILITIES, Command, DurabilityRequirement, Feature, Opcode, RequestBuilder, Status,
    put_lookup_spec, put_mutation_spec,
};
use epkv_types::{
    Cas, Datatype, DurabilityLevel, NUM_VBUCKETS, VBucketState, Vbid, vbucket_for_key,
};

const XATTR: u8 = 0x04;
const MACROS: u8 = 0x10;
const BINARY_VALUE: u8 = 0x20;
const MKDOC: u8 = 0x01;
const ADD: u8 = 0x02;
const ACCESS_DELETED: u8 = 0x04;
const CREATE_AS_DELETED: u8 = 0x08;
const REVIVE: u8 = 0x10;
const REPLICA_READ: u8 = 0x20;

fn json(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(body)))
}

async fn mutate(c: &mut Client, key: &[u8], doc_flags: u8, specs: &[u8]) -> Response {
    let cmd = Command::SubdocMultiMutation {
        key,
        doc_flags,
        expiry: 0,
        user_flags: None,
        specs,
        cas: Cas::ANY,
        durability: None,
        preserve_ttl: false,
    };
    let req = RequestBuilder::from_command(&cmd).vbucket(vbucket_for_key(key, NUM_VBUCKETS));
    c.request(req).await.unwrap()
}

/// A MULTI_LOOKUP of attribute paths; returns the status and each path's value.
async fn lookup(
    c: &mut Client,
    key: &[u8],
    doc_flags: u8,
    paths: &[&[u8]],
) -> (Status, Vec<Vec<u8>>) {
    let mut specs = Vec::new();
    for p in paths {
        put_lookup_spec(&mut specs, Opcode::SubdocGet, XATTR, p);
    }
    let cmd = Command::SubdocMultiLookup {
        key,
        doc_flags,
        specs: &specs,
    };
    let req = RequestBuilder::from_command(&cmd).vbucket(vbucket_for_key(key, NUM_VBUCKETS));
    let r = c.request(req).await.unwrap();
    let mut out = Vec::new();
    let mut rest = &r.value[..];
    while rest.len() >= 6 {
        let len = u32::from_be_bytes([rest[2], rest[3], rest[4], rest[5]]) as usize;
        out.push(rest[6..6 + len].to_vec());
        rest = &rest[6 + len..];
    }
    (r.status().unwrap(), out)
}

fn upsert_attr(path: &[u8], value: &[u8], flags: u8) -> Vec<u8> {
    let mut specs = Vec::new();
    put_mutation_spec(
        &mut specs,
        Opcode::SubdocDictUpsert,
        XATTR | flags,
        path,
        value,
    );
    specs
}

async fn must_set_json(c: &mut Client, key: &[u8], value: &[u8]) -> Response {
    let r = c
        .set(key, value, StoreOptions::new().datatype(Datatype::JSON))
        .await
        .unwrap();
    assert!(r.is_success(), "{r:?}");
    r
}

/// A document created as a tombstone with a user attribute (what a transaction's staged
/// insert is).
async fn must_create_as_deleted(c: &mut Client, key: &[u8]) {
    let specs = upsert_attr(b"txn", br#"{"staged":{"v":1}}"#, 0);
    let r = mutate(c, key, ADD | CREATE_AS_DELETED, &specs).await;
    assert_eq!(r.status(), Some(Status::SubdocSuccessDeleted), "{r:?}");
}

/// Checks that the feature `capability` names works on `c` (authenticated, bucket
/// selected, HELLO Xattr and JSON agreed), with `config` the bucket's cluster map.
async fn check(name: &str, server: &Server, c: &mut Client, config: &serde_json::Value) {
    let key = format!("cap-{name}").into_bytes();
    let key = &key[..];
    match name {
        "collections" => {
            let mut other = login(server).await;
            let agreed = other.hello("cap", &[Feature::Collections]).await.unwrap();
            assert_eq!(agreed, [Feature::Collections.as_u16()]);
            assert_eq!(config["collectionsManifestUid"], "0");
        }
        "durableWrite" => {
            let d = DurabilityRequirement {
                level: DurabilityLevel::Majority,
                timeout: None,
            };
            let r = c
                .set(key, b"1", StoreOptions::new().durability(d))
                .await
                .unwrap();
            assert!(r.is_success(), "{r:?}");
        }
        "tombstonedUserXAttrs" => {
            must_create_as_deleted(c, key).await;
            assert_eq!(c.get(key).await.unwrap().status(), Some(Status::KeyEnoent));
            let (status, values) = lookup(c, key, ACCESS_DELETED, &[b"txn.staged"]).await;
            assert_eq!(status, Status::SubdocSuccessDeleted);
            assert_eq!(values[0], br#"{"v":1}"#);
        }
        "couchapi" => {
            assert_eq!(config["nodeLocator"], "vbucket");
            let map = config["vBucketServerMap"]["vBucketMap"].as_array().unwrap();
            assert_eq!(map.len(), usize::from(NUM_VBUCKETS));
        }
        "subdoc.ReplaceBodyWithXattr" => {
            must_set_json(c, key, br#"{"v":"old"}"#).await;
            let staged = upsert_attr(b"txn.staged", br#"{"v":"new"}"#, 0x01);
            assert!(mutate(c, key, 0, &staged).await.is_success());
            let mut specs = Vec::new();
            put_mutation_spec(
                &mut specs,
                Opcode::SubdocReplaceBodyWithXattr,
                XATTR,
                b"txn.staged",
                b"",
            );
            put_mutation_spec(&mut specs, Opcode::SubdocDelete, XATTR, b"txn", b"");
            let r = mutate(c, key, 0, &specs).await;
            assert!(r.is_success(), "{r:?}");
            assert_eq!(c.get(key).await.unwrap().value.as_ref(), br#"{"v":"new"}"#);
        }
        "subdoc.BinaryXattr" => {
            // Any bytes as an attribute's value, read back as they were written; without
            // the flag the value reads as KV-Engine's base64 string, and a BINARY_VALUE
            // read of a JSON attribute is 0xd8. REPLACE_BODY_WITH_XATTR decodes it.
            must_set_json(c, key, b"{}").await;
            let bytes: &[u8] = b"\x00\xffbin\"ary";
            let specs = upsert_attr(b"blob", bytes, BINARY_VALUE);
            assert!(mutate(c, key, 0, &specs).await.is_success());
            let specs = upsert_attr(b"plain", b"1", 0);
            assert!(mutate(c, key, 0, &specs).await.is_success());
            let mut specs = Vec::new();
            put_lookup_spec(&mut specs, Opcode::SubdocGet, XATTR | BINARY_VALUE, b"blob");
            put_lookup_spec(&mut specs, Opcode::SubdocGet, XATTR, b"blob");
            put_lookup_spec(
                &mut specs,
                Opcode::SubdocGet,
                XATTR | BINARY_VALUE,
                b"plain",
            );
            let cmd = Command::SubdocMultiLookup {
                key,
                doc_flags: 0,
                specs: &specs,
            };
            let req =
                RequestBuilder::from_command(&cmd).vbucket(vbucket_for_key(key, NUM_VBUCKETS));
            let r = c.request(req).await.unwrap();
            let v = &r.value[..];
            let first = u32::from_be_bytes([v[2], v[3], v[4], v[5]]) as usize;
            assert_eq!(&v[6..6 + first], bytes);
            let rest = &v[6 + first..];
            let second = u32::from_be_bytes([rest[2], rest[3], rest[4], rest[5]]) as usize;
            let text = std::str::from_utf8(&rest[6..6 + second]).unwrap();
            assert!(text.starts_with("\"cb-content-base64-encoded:"), "{text}");
            let third = &rest[6 + second..];
            assert_eq!(u16::from_be_bytes([third[0], third[1]]), 0xd8);
            let mut specs = Vec::new();
            put_mutation_spec(
                &mut specs,
                Opcode::SubdocReplaceBodyWithXattr,
                XATTR | BINARY_VALUE,
                b"blob",
                b"",
            );
            assert!(mutate(c, key, 0, &specs).await.is_success());
            let got = c.get(key).await.unwrap();
            assert_eq!(got.value.as_ref(), bytes);
            assert!(!got.datatype.contains(Datatype::JSON));
        }
        "subdoc.DocumentMacroSupport" => {
            must_set_json(c, key, b"{}").await;
            let (_, before) = lookup(c, key, 0, &[b"$document"]).await;
            let before = json(&before[0]);
            let specs = upsert_attr(
                b"txn.restore",
                br#"{"CAS":"${$document.CAS}","revid":"${$document.revid}","exptime":"${$document.exptime}","doc":"${$document}"}"#,
                MACROS | 0x01,
            );
            let r = mutate(c, key, 0, &specs).await;
            assert!(r.is_success(), "{r:?}");
            let (_, got) = lookup(c, key, 0, &[b"txn.restore", b"$document.CAS"]).await;
            let restore = json(&got[0]);
            assert_eq!(restore["CAS"], before["CAS"], "the old version's CAS");
            assert_ne!(json(&got[1]), before["CAS"], "the document changed since");
            assert_eq!(restore["revid"], before["revid"]);
            assert_eq!(restore["exptime"], before["exptime"]);
            assert_eq!(restore["doc"], before);
            let bad = upsert_attr(b"x", br#""${$document.nope}""#, MACROS);
            let r = mutate(c, key, 0, &bad).await;
            assert_eq!(r.status(), Some(Status::SubdocMultiPathFailure), "{r:?}");
            let status = Status::SubdocXattrUnknownVattrMacro.as_u16().to_be_bytes();
            assert_eq!(&r.value[1..3], &status[..]);
        }
        "subdoc.ReviveDocument" => {
            must_create_as_deleted(c, key).await;
            let mut specs = Vec::new();
            put_mutation_spec(
                &mut specs,
                Opcode::SubdocReplaceBodyWithXattr,
                XATTR,
                b"txn.staged",
                b"",
            );
            put_mutation_spec(&mut specs, Opcode::SubdocDelete, XATTR, b"txn", b"");
            let r = mutate(c, key, ACCESS_DELETED | REVIVE, &specs).await;
            assert!(r.is_success(), "{r:?}");
            assert_eq!(c.get(key).await.unwrap().value.as_ref(), br#"{"v":1}"#);
        }
        "subdoc.ReplicaRead" => {
            must_set_json(c, key, br#"{"on":"replica"}"#).await;
            let vb = vbucket_for_key(key, NUM_VBUCKETS);
            let demoted = c.set_vbucket(vb, VBucketState::Replica).await.unwrap();
            assert!(demoted.is_success(), "{demoted:?}");
            let mut specs = Vec::new();
            put_lookup_spec(&mut specs, Opcode::Get, 0, b"");
            let cmd = Command::SubdocMultiLookup {
                key,
                doc_flags: REPLICA_READ,
                specs: &specs,
            };
            let r = c
                .request(RequestBuilder::from_command(&cmd).vbucket(vb))
                .await
                .unwrap();
            let promoted = c.set_vbucket(vb, VBucketState::Active).await.unwrap();
            assert!(promoted.is_success(), "{promoted:?}");
            assert_eq!(r.status(), Some(Status::Success), "{r:?}");
            assert!(r.value.ends_with(br#"{"on":"replica"}"#), "{r:?}");
        }
        "subdoc.AccessDeleted" => {
            must_set_json(c, key, b"{}").await;
            let sys = upsert_attr(b"_sys", b"1", 0);
            assert!(mutate(c, key, 0, &sys).await.is_success());
            assert!(c.delete(key, Cas::ANY).await.unwrap().is_success());
            let (status, _) = lookup(c, key, 0, &[b"_sys"]).await;
            assert_eq!(status, Status::KeyEnoent);
            let (status, values) =
                lookup(c, key, ACCESS_DELETED, &[b"_sys", b"$document.deleted"]).await;
            assert_eq!(status, Status::SubdocSuccessDeleted);
            assert_eq!(values, [b"1".to_vec(), b"true".to_vec()]);
            // And changes it, the document staying deleted.
            let more = upsert_attr(b"_sys", b"2", 0);
            let r = mutate(c, key, ACCESS_DELETED, &more).await;
            assert_eq!(r.status(), Some(Status::SubdocSuccessDeleted), "{r:?}");
            let r = mutate(c, key, MKDOC | ACCESS_DELETED, &more).await;
            assert_eq!(r.status(), Some(Status::SubdocSuccessDeleted), "{r:?}");
        }
        "dcp" => {
            let mut d = login(server).await;
            let mut b = Vec::new();
            dcp::encode_open(&mut b, 1, b"cap-dcp", dcp::OPEN_PRODUCER).unwrap();
            d.send_raw(&b).await.unwrap();
            assert!(d.recv().await.unwrap().is_success());
            let req = StreamReq {
                flags: 0,
                reserved: 0,
                start_seqno: 0,
                end_seqno: u64::MAX,
                vbucket_uuid: 0,
                snap_start_seqno: 0,
                snap_end_seqno: 0,
            };
            let mut b = Vec::new();
            dcp::encode_stream_req(&mut b, 2, Vbid(0), &req).unwrap();
            d.send_raw(&b).await.unwrap();
            let r = d.recv().await.unwrap();
            assert!(
                r.is_success() && !r.value.is_empty(),
                "a failover log: {r:?}"
            );
        }
        "cbhello" => {
            let mut other = login(server).await;
            let agreed = other
                .hello("cap", &[Feature::Xattr, Feature::Json])
                .await
                .unwrap();
            assert_eq!(agreed, [Feature::Xattr.as_u16(), Feature::Json.as_u16()]);
        }
        "touch" => {
            must_set_json(c, key, b"{}").await;
            assert!(c.touch(key, 3600).await.unwrap().is_success());
            let g = c.gat(key, 7200).await.unwrap();
            assert_eq!(g.value.as_ref(), b"{}");
            let (_, v) = lookup(c, key, 0, &[b"$document.exptime"]).await;
            assert_ne!(v[0], b"0", "the expiry was set");
        }
        "rangeScan" => {
            use base64::Engine as _;
            must_set_json(c, key, b"{}").await;
            let vb = vbucket_for_key(key, NUM_VBUCKETS);
            let k = base64::engine::general_purpose::STANDARD.encode(key);
            let spec = format!(r#"{{"key_only":true,"range":{{"start":"{k}","end":"{k}"}}}}"#);
            let r = c.range_scan_create(vb, spec.as_bytes()).await.unwrap();
            assert!(r.is_success(), "{r:?}");
            let req = epkv_protocol::range_scan::ContinueRequest {
                id: r.value[..].try_into().unwrap(),
                item_limit: 0,
                time_limit_ms: 0,
                byte_limit: 0,
            };
            let last = c.range_scan_continue(vb, req).await.unwrap().pop().unwrap();
            assert_eq!(last.status(), Some(Status::RangeScanComplete));
            let keys: Vec<&[u8]> = epkv_protocol::range_scan::keys(&last.value)
                .map(Result::unwrap)
                .collect();
            assert_eq!(keys, [key]);
        }
        "cccp" => assert_eq!(config["name"], "default"),
        "nodesExt" => {
            assert_eq!(config["nodesExt"][0]["services"]["kv"], server.addr.port());
        }
        "xattr" => {
            must_set_json(c, key, b"{}").await;
            assert!(
                mutate(c, key, 0, &upsert_attr(b"u", b"[1]", 0))
                    .await
                    .is_success()
            );
            assert_eq!(lookup(c, key, 0, &[b"u"]).await.1[0], b"[1]");
            assert_eq!(c.get(key).await.unwrap().value.as_ref(), b"{}");
        }
        other => panic!("bucketCapabilities lists {other:?}, and this test has no check for it"),
    }
}

async fn login(server: &Server) -> Client {
    let mut c = server.client().await;
    c.auth_plain(ADMIN.0, ADMIN.1).await.unwrap();
    assert!(c.select_bucket("default").await.unwrap().is_success());
    c
}

fn capabilities(v: &serde_json::Value) -> Vec<String> {
    v["bucketCapabilities"]
        .as_array()
        .unwrap_or_else(|| panic!("no bucketCapabilities in {v}"))
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn every_bucket_capability_works_and_every_writer_lists_exactly_them() {
    if skip_if_external("bucket_capabilities") {
        return;
    }
    let server = Server::spawn(&admin_args());
    let mut c = login(&server).await;
    let agreed = c
        .hello("cap", &[Feature::Xerror, Feature::Json, Feature::Xattr])
        .await
        .unwrap();
    assert_eq!(agreed.len(), 3);
    let config = json(&c.get_cluster_config(None).await.unwrap().value);
    let listed: Vec<String> = BUCKET_CAPABILITIES
        .iter()
        .map(|(n, _)| (*n).to_owned())
        .collect();
    assert_eq!(capabilities(&config), listed, "GET_CLUSTER_CONFIG");
    for path in ["/pools/default/buckets/default", "/pools/default/b/default"] {
        let r = http_request(server.mgmt_addr(), "GET", path, Some(ADMIN), None);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert_eq!(capabilities(&json(r.body.as_bytes())), listed, "{path}");
    }
    for (name, _) in BUCKET_CAPABILITIES {
        check(name, &server, &mut c, &config).await;
    }
}
