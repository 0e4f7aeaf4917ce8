//! Scopes and collections on the wire (issue 21): HELLO Collections and LEB128 key
//! prefixes, GET_COLLECTIONS_MANIFEST / GET_COLLECTION_ID / GET_SCOPE_ID,
//! UnknownCollection with the manifest uid, the same key in different collections, a
//! classic client reaching the default collection, bad prefixes, and a SIGKILL with
//! several collections: every collection comes back with its documents and a dropped one
//! stays dropped. The SDK's collection manager is tested in tests/python.

use crate::harness::{Server, TestDir, http_request, skip_if_external};
use epkv_client::{Client, Response, StoreOptions};
use epkv_protocol::{Command, DurabilityRequirement, Feature, Opcode, RequestBuilder, Status};
use epkv_types::doc_key::DocKeyBuf;
use epkv_types::{DurabilityLevel, NUM_VBUCKETS, vbucket_for_key};
use std::time::Duration;

const ADMIN: (&str, &str) = ("Administrator", "password");

fn args() -> Vec<&'static str> {
    vec!["--admin-user", ADMIN.0, "--admin-password", ADMIN.1]
}

/// A client that negotiated collections, logged in with `default` selected.
async fn collections_client(server: &Server) -> Client {
    let mut c = server.client().await;
    let agreed = c
        .hello(
            "e2e-collections",
            &[
                Feature::Xerror,
                Feature::Json,
                Feature::Collections,
                Feature::MutationSeqno,
            ],
        )
        .await
        .unwrap();
    assert!(agreed.contains(&Feature::Collections.as_u16()));
    c.auth_plain(ADMIN.0, ADMIN.1).await.unwrap();
    assert!(c.select_bucket("default").await.unwrap().is_success());
    // Warmup (after the restart) answers TMPFAIL until done.
    for _ in 0..3000 {
        let stats = c.stat("warmup").await.unwrap();
        match stats.iter().find(|(k, _)| k == "ep_warmup_state") {
            Some((_, v)) if v != "done" => tokio::time::sleep(Duration::from_millis(10)).await,
            _ => break,
        }
    }
    c
}

/// The wire key of `key` in collection `cid`.
fn key_in(cid: u32, key: &[u8]) -> Vec<u8> {
    DocKeyBuf::new().put_wire(cid, key).to_vec()
}

/// Sends `req` for `raw` key (whose vBucket it goes to) with the wire key `wire`.
async fn send(c: &mut Client, op: Opcode, wire: &[u8], raw: &[u8], value: &[u8]) -> Response {
    let vb = vbucket_for_key(raw, NUM_VBUCKETS);
    let mut req = RequestBuilder::new(op).key(wire).vbucket(vb);
    if op == Opcode::Set {
        // Persisted before it is acknowledged, so that the SIGKILL below keeps it.
        req = req
            .extras(&[0; 8])
            .value(value)
            .durability(DurabilityRequirement {
                level: DurabilityLevel::PersistToMajority,
                timeout: Some(Duration::from_secs(20)),
            });
    }
    c.request(req).await.unwrap()
}

fn mgmt(server: &Server, method: &str, path: &str, form: Option<&str>) -> serde_json::Value {
    let r = http_request(server.mgmt_addr(), method, path, Some(ADMIN), form);
    assert_eq!(r.status, 200, "{method} {path}: {}", r.body);
    serde_json::from_str(&r.body).unwrap()
}

async fn collection_id(c: &mut Client, path: &str) -> (Option<Status>, u64, u32) {
    let cmd = Command::GetCollectionId {
        path: path.as_bytes(),
    };
    let r = c.request(RequestBuilder::from_command(&cmd)).await.unwrap();
    if r.extras.len() == 12 {
        let uid = u64::from_be_bytes(r.extras[..8].try_into().unwrap());
        let id = u32::from_be_bytes(r.extras[8..].try_into().unwrap());
        (r.status(), uid, id)
    } else {
        (r.status(), 0, 0)
    }
}

#[tokio::test]
async fn collections_keep_documents_apart_and_survive_sigkill() {
    if skip_if_external("collections") {
        return;
    }
    let dir = TestDir::new();
    let server = Server::spawn_in(dir.path(), &args());
    mgmt(
        &server,
        "POST",
        "/pools/default/buckets/default/scopes",
        Some("name=inventory"),
    );
    for name in ["airline", "hotel", "gone"] {
        mgmt(
            &server,
            "POST",
            "/pools/default/buckets/default/scopes/inventory/collections",
            Some(&format!("name={name}")),
        );
    }
    let mut c = collections_client(&server).await;
    let (status, uid, airline) = collection_id(&mut c, "inventory.airline").await;
    assert_eq!((status, uid), (Some(Status::Success), 4));
    let (_, _, hotel) = collection_id(&mut c, "inventory.hotel").await;
    let (_, _, gone) = collection_id(&mut c, "inventory.gone").await;
    assert_eq!(collection_id(&mut c, ".").await.2, 0);
    let (status, _, _) = collection_id(&mut c, "inventory.nope").await;
    assert_eq!(status, Some(Status::UnknownCollection));
    let (status, _, _) = collection_id(&mut c, "nope.x").await;
    assert_eq!(status, Some(Status::UnknownScope));
    let manifest = c
        .request(RequestBuilder::from_command(
            &Command::GetCollectionsManifest,
        ))
        .await
        .unwrap();
    let m: serde_json::Value = serde_json::from_slice(&manifest.value).unwrap();
    assert_eq!(m["uid"], "4");
    assert_eq!(m["scopes"][1]["name"], "inventory");

    // The same key in four collections.
    for (cid, value) in [
        (0, "default"),
        (airline, "airline"),
        (hotel, "hotel"),
        (gone, "gone"),
    ] {
        let r = send(
            &mut c,
            Opcode::Set,
            &key_in(cid, b"doc"),
            b"doc",
            value.as_bytes(),
        )
        .await;
        assert_eq!(r.status(), Some(Status::Success), "{cid}");
    }
    for (cid, value) in [(0, "default"), (airline, "airline"), (hotel, "hotel")] {
        let r = send(&mut c, Opcode::Get, &key_in(cid, b"doc"), b"doc", b"").await;
        assert_eq!(r.value.as_ref(), value.as_bytes(), "{cid}");
    }
    // STAT collections and scopes count each collection's documents and operations.
    let stats: std::collections::HashMap<String, String> =
        c.stat("collections").await.unwrap().into_iter().collect();
    let p = format!("0x8:{airline:#x}:");
    assert_eq!(stats[&format!("{p}name")], "airline");
    assert_eq!(stats[&format!("{p}items")], "1");
    assert_eq!(stats[&format!("{p}ops_store")], "1");
    assert_eq!(stats[&format!("{p}ops_get")], "1");
    assert_eq!(stats["manifest_uid"], "4");
    let scopes: std::collections::HashMap<String, String> =
        c.stat("scopes").await.unwrap().into_iter().collect();
    assert_eq!(scopes["0x8:collections"], "3");
    assert_eq!(scopes["0x8:items"], "3");
    // An unknown collection: 0x88 with the manifest uid.
    let r = send(&mut c, Opcode::Get, &key_in(77, b"doc"), b"doc", b"").await;
    assert_eq!(r.status(), Some(Status::UnknownCollection));
    let body: serde_json::Value = serde_json::from_slice(&r.value).unwrap();
    assert_eq!(body["manifest_uid"], "4");
    // Bad prefixes: non-canonical, six bytes, nothing after the id.
    for wire in [
        &[0x81u8, 0x00, b'k'][..],
        &[0x80, 0x80, 0x80, 0x80, 0x80, 0x00, b'k'],
        &[0x08],
    ] {
        let r = send(&mut c, Opcode::Get, wire, b"k", b"").await;
        assert_eq!(r.status(), Some(Status::Einval), "{wire:?}");
    }
    // A classic client (no HELLO) reaches the default collection.
    let mut classic = server.client().await;
    classic.auth_plain(ADMIN.0, ADMIN.1).await.unwrap();
    assert!(classic.select_bucket("default").await.unwrap().is_success());
    assert_eq!(
        classic.get(b"doc").await.unwrap().value.as_ref(),
        b"default"
    );
    // A key that starts with a zero byte stays in the default collection.
    let durable = StoreOptions::new().durability(DurabilityRequirement {
        level: DurabilityLevel::PersistToMajority,
        timeout: Some(Duration::from_secs(20)),
    });
    assert!(
        classic
            .set(b"\0\x08doc", b"zero", durable)
            .await
            .unwrap()
            .is_success()
    );
    let r = send(
        &mut c,
        Opcode::Get,
        &key_in(0, b"\0\x08doc"),
        b"\0\x08doc",
        b"",
    )
    .await;
    assert_eq!(r.value.as_ref(), b"zero");
    let r = send(&mut c, Opcode::Get, &key_in(8, b"doc"), b"doc", b"").await;
    assert_ne!(
        r.value.as_ref(),
        b"zero",
        "collection 8 is the scope's id, not a collection"
    );

    // Drop one collection: its document is gone at once.
    mgmt(
        &server,
        "DELETE",
        "/pools/default/buckets/default/scopes/inventory/collections/gone",
        None,
    );
    let r = send(&mut c, Opcode::Get, &key_in(gone, b"doc"), b"doc", b"").await;
    assert_eq!(r.status(), Some(Status::UnknownCollection));
    drop(c);
    drop(classic);
    let _log = server.kill();

    let server = Server::spawn_in(dir.path(), &args());
    let mut c = collections_client(&server).await;
    let (status, uid, id) = collection_id(&mut c, "inventory.airline").await;
    assert_eq!((status, id), (Some(Status::Success), airline));
    // 5 after the drop, whether or not the compaction the drop started had removed the
    // dropped collection from disk before the kill (forgetting it keeps the uid).
    assert_eq!(uid, 5);
    for (cid, value) in [(0, "default"), (airline, "airline"), (hotel, "hotel")] {
        let r = send(&mut c, Opcode::Get, &key_in(cid, b"doc"), b"doc", b"").await;
        assert_eq!(
            r.value.as_ref(),
            value.as_bytes(),
            "{cid} after the restart"
        );
    }
    let (status, _, _) = collection_id(&mut c, "inventory.gone").await;
    assert_eq!(status, Some(Status::UnknownCollection));
    // Created again, it is empty: the old documents stay dropped.
    mgmt(
        &server,
        "POST",
        "/pools/default/buckets/default/scopes/inventory/collections",
        Some("name=gone"),
    );
    let (_, _, again) = collection_id(&mut c, "inventory.gone").await;
    assert_ne!(again, gone);
    let r = send(&mut c, Opcode::Get, &key_in(again, b"doc"), b"doc", b"").await;
    assert_eq!(r.status(), Some(Status::KeyEnoent));
    // The zero-byte key of the default collection came back too.
    let r = send(
        &mut c,
        Opcode::Get,
        &key_in(0, b"\0\x08doc"),
        b"\0\x08doc",
        b"",
    )
    .await;
    assert_eq!(r.value.as_ref(), b"zero");
}

#[tokio::test]
async fn collections_declared_in_the_settings_exist_at_startup() {
    if skip_if_external("collections_setting") {
        return;
    }
    let mut a = args();
    a.extend([
        "--collections",
        "default:app.users=60,default:_default.extra",
    ]);
    let server = Server::spawn(&a);
    let mut c = collections_client(&server).await;
    let (status, _, users) = collection_id(&mut c, "app.users").await;
    assert_eq!(status, Some(Status::Success));
    assert!(users >= 8);
    let (status, _, _) = collection_id(&mut c, "_default.extra").await;
    assert_eq!(status, Some(Status::Success));
    let stats: std::collections::HashMap<String, String> =
        c.stat("collections").await.unwrap().into_iter().collect();
    assert_eq!(stats[&format!("0x8:{users:#x}:maxTTL")], "60");
}

#[tokio::test]
async fn get_random_key_answers_a_document_of_the_collection_with_its_key() {
    if skip_if_external("get_random_key") {
        return;
    }
    let mut a = args();
    a.extend(["--collections", "default:app.users"]);
    let server = Server::spawn(&a);
    let mut c = collections_client(&server).await;
    let (_, _, users) = collection_id(&mut c, "app.users").await;
    let random = |collection, xattrs| {
        RequestBuilder::from_command(&Command::GetRandomKey { collection, xattrs })
    };
    // An empty collection: KeyEnoent; an unknown one: UnknownCollection.
    let r = c.request(random(users, false)).await.unwrap();
    assert_eq!(r.status(), Some(Status::KeyEnoent));
    let r = c.request(random(0x7777, false)).await.unwrap();
    assert_eq!(r.status(), Some(Status::UnknownCollection));
    for i in 0..20 {
        let raw = format!("user-{i}");
        let wire = key_in(users, raw.as_bytes());
        let vb = vbucket_for_key(raw.as_bytes(), NUM_VBUCKETS);
        let set = RequestBuilder::new(Opcode::Set)
            .key(&wire)
            .vbucket(vb)
            .extras(&[0, 0, 0, 9, 0, 0, 0, 0])
            .value(br#"{"u":1}"#);
        assert!(c.request(set).await.unwrap().is_success());
    }
    // The key comes collection-prefixed on a collections connection, with the flags.
    let r = c.request(random(users, false)).await.unwrap();
    assert_eq!(r.status(), Some(Status::Success), "{r:?}");
    assert_eq!(r.extras.as_ref(), &[0, 0, 0, 9]);
    assert_eq!(r.value.as_ref(), br#"{"u":1}"#);
    let (cid, used) = epkv_types::doc_key::leb128_decode(&r.key).unwrap();
    assert_eq!(cid, users);
    assert!(r.key[used..].starts_with(b"user-"));
    // With the xattrs byte and no attributes stored, the same shape.
    let r = c.request(random(users, true)).await.unwrap();
    assert_eq!(r.status(), Some(Status::Success));
    // Without collections: the default collection only, a collection id is EINVAL.
    let mut plain = server.client().await;
    plain
        .hello("e2e-plain", &[Feature::Xerror, Feature::Xattr])
        .await
        .unwrap();
    plain.auth_plain(ADMIN.0, ADMIN.1).await.unwrap();
    assert!(plain.select_bucket("default").await.unwrap().is_success());
    let r = plain.request(random(users, false)).await.unwrap();
    assert_eq!(r.status(), Some(Status::Einval));
    let r = plain.request(random(0, false)).await.unwrap();
    assert_eq!(
        r.status(),
        Some(Status::KeyEnoent),
        "the default collection is empty"
    );
    // A document with an attribute: the body alone, or the value with its attribute
    // section when the extras ask for it.
    let mut specs = Vec::new();
    epkv_protocol::put_mutation_spec(&mut specs, Opcode::SubdocDictUpsert, 0x04, b"meta.v", b"1");
    epkv_protocol::put_mutation_spec(&mut specs, Opcode::Set, 0, b"", br#"{"b":2}"#);
    let mutate = Command::SubdocMultiMutation {
        key: b"with-xattr",
        doc_flags: 0x01,
        expiry: 0,
        user_flags: None,
        specs: &specs,
        cas: epkv_types::Cas::ANY,
        durability: None,
        preserve_ttl: false,
    };
    let vb = vbucket_for_key(b"with-xattr", NUM_VBUCKETS);
    let r = plain
        .request(RequestBuilder::from_command(&mutate).vbucket(vb))
        .await
        .unwrap();
    assert!(r.is_success(), "{r:?}");
    let body = plain.request(random(0, false)).await.unwrap();
    assert_eq!(body.value.as_ref(), br#"{"b":2}"#);
    assert!(!body.datatype.contains(epkv_types::Datatype::XATTR));
    let whole = plain.request(random(0, true)).await.unwrap();
    assert!(
        whole.datatype.contains(epkv_types::Datatype::XATTR),
        "{whole:?}"
    );
    assert!(whole.value.ends_with(br#"{"b":2}"#));
    assert!(whole.value.windows(4).any(|w| w == b"meta"));
}
