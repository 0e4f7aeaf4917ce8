//! Couchbase SDK compatibility over real sockets: HELLO, SASL, users and buckets,
//! SELECT_BUCKET, the error map, the cluster map and OBSERVE_SEQNO (issue 6; what the
//! clients send is recorded in `../shared/design/protocol-compat.md`).

use crate::harness::{Server, TestDir, key, server_binary, skip_if_external};
use crate::scram::{ScramOutcome, scram_sha512};
use epkv_client::{Client, StoreOptions};
use epkv_protocol::{Feature, Opcode, RequestBuilder, Status};
use epkv_types::{Datatype, NUM_VBUCKETS, VBucketState, Vbid, vbucket_for_key};
use std::path::PathBuf;

const ADMIN: (&str, &str) = ("Administrator", "password");
const APP: (&str, &str) = ("app", "app-pw");

/// A users file with `app` (bucket `travel` only), written by `epkv-server user add`, in
/// a directory removed when the returned guard drops.
fn users_file() -> (TestDir, PathBuf) {
    let dir = TestDir::new();
    std::fs::create_dir_all(dir.path()).unwrap();
    let path = dir.path().join("users.toml");
    let out = std::process::Command::new(server_binary())
        .args(["user", "add", "--users-file"])
        .arg(&path)
        .args(["--name", APP.0, "--password", APP.1, "--buckets", "travel"])
        .output()
        .unwrap();
    assert!(out.status.success(), "user add: {out:?}");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        !text.contains(APP.1),
        "the users file never holds the password"
    );
    (dir, path)
}

/// A server with users (the admin from the flags, `app` from the file) and the buckets
/// `default`, `travel` and `beer`.
fn secured_server() -> (Server, TestDir) {
    let (dir, users) = users_file();
    let server = Server::spawn(&[
        "--buckets",
        "travel,beer=64MiB",
        "--users-file",
        users.to_str().unwrap(),
        "--admin-user",
        ADMIN.0,
        "--admin-password",
        ADMIN.1,
    ]);
    (server, dir)
}

/// HELLO as the Couchbase SDKs send it (XERROR, JSON, MutationSeqno, SelectBucket).
async fn sdk_hello(c: &mut Client) {
    c.hello(
        "e2e-sdk",
        &[
            Feature::Xerror,
            Feature::Json,
            Feature::MutationSeqno,
            Feature::SelectBucket,
        ],
    )
    .await
    .unwrap();
}

async fn login(server: &Server, (user, password): (&str, &str), bucket: Option<&str>) -> Client {
    let mut c = server.client().await;
    sdk_hello(&mut c).await;
    c.auth_plain(user, password).await.unwrap();
    if let Some(b) = bucket {
        assert!(c.select_bucket(b).await.unwrap().is_success(), "select {b}");
    }
    c
}

fn json(r: &epkv_client::Response) -> serde_json::Value {
    serde_json::from_slice(&r.value).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", r.value))
}

#[tokio::test]
async fn hello_agrees_to_exactly_the_implemented_features() {
    let server = Server::start();
    let mut c = server.client().await;
    // The Python SDK's request, in its order.
    let asked: Vec<Feature> = [
        0x03u16, 0x06, 0x07, 0x08, 0x0b, 0x0c, 0x10, 0x0f, 0x11, 0x15, 0x12, 0x17, 0x14, 0x1c,
        0x21, 0x0e, 0x0d, 0x1e, 0x0a, 0x04,
    ]
    .iter()
    .map(|&v| Feature::from_u16(v).unwrap())
    .collect();
    let agreed = c.hello("e2e", &asked).await.unwrap();
    assert_eq!(
        agreed,
        [
            0x03, 0x06, 0x07, 0x08, 0x0b, 0x0c, 0x10, 0x11, 0x15, 0x12, 0x17, 0x14, 0x1c, 0x21,
            0x0d, 0x1e, 0x0a, 0x04
        ]
    );
}

#[tokio::test]
async fn the_sdk_bootstrap_may_be_pipelined_before_any_reply() {
    if skip_if_external("pipelined_bootstrap") {
        return;
    }
    let (server, _users) = secured_server();
    let mut c = server.client().await;
    let mut plain = vec![0u8];
    plain.extend_from_slice(ADMIN.0.as_bytes());
    plain.push(0);
    plain.extend_from_slice(ADMIN.1.as_bytes());
    let features: Vec<u8> = [0x07u16, 0x0b, 0x04, 0x08]
        .iter()
        .flat_map(|f| f.to_be_bytes())
        .collect();
    c.queue(
        RequestBuilder::new(Opcode::Hello)
            .key(b"{\"a\":\"e2e\"}")
            .value(&features),
    )
    .unwrap();
    c.queue(RequestBuilder::new(Opcode::SaslListMechs)).unwrap();
    c.queue(
        RequestBuilder::new(Opcode::SaslAuth)
            .key(b"PLAIN")
            .value(&plain),
    )
    .unwrap();
    c.queue(RequestBuilder::new(Opcode::GetErrorMap).value(&[0, 2]))
        .unwrap();
    c.queue(RequestBuilder::new(Opcode::SelectBucket).key(b"default"))
        .unwrap();
    c.queue(RequestBuilder::new(Opcode::GetClusterConfig))
        .unwrap();
    let replies = c.flush_and_recv(6).await.unwrap();
    let statuses: Vec<_> = replies.iter().map(|r| r.status()).collect();
    assert_eq!(statuses, vec![Some(Status::Success); 6]);
    assert_eq!(
        replies[1].value.as_ref(),
        b"SCRAM-SHA512 SCRAM-SHA256 SCRAM-SHA1 PLAIN"
    );
    assert_eq!(json(&replies[3])["version"], 2);
    assert_eq!(json(&replies[5])["name"], "default");
    assert_eq!(replies[5].datatype, Datatype::JSON);
}

#[tokio::test]
async fn sasl_scram_and_plain_accept_the_password_and_refuse_others() {
    if skip_if_external("sasl") {
        return;
    }
    let (server, _users) = secured_server();
    let mut c = server.client().await;
    sdk_hello(&mut c).await;
    assert_eq!(
        scram_sha512(&mut c, ADMIN.0, ADMIN.1).await,
        ScramOutcome::Authenticated
    );
    assert!(c.select_bucket("beer").await.unwrap().is_success());

    let mut bad = server.client().await;
    sdk_hello(&mut bad).await;
    assert_eq!(
        scram_sha512(&mut bad, ADMIN.0, "wrong").await,
        ScramOutcome::Refused(Some(Status::AuthError))
    );
    assert_eq!(
        scram_sha512(&mut bad, "nobody", "x").await,
        ScramOutcome::Refused(Some(Status::AuthError))
    );
    let plain = bad.sasl_auth("PLAIN", b"\0app\0wrong").await.unwrap();
    assert_eq!(plain.status(), Some(Status::AuthError));
    let unknown = bad.sasl_auth("CRAM-MD5", b"x").await.unwrap();
    assert_eq!(unknown.status(), Some(Status::AuthError));
    let step = bad.sasl_step("SCRAM-SHA512", b"c=biws").await.unwrap();
    assert_eq!(
        step.status(),
        Some(Status::Einval),
        "a step with no exchange in progress"
    );
    // Still usable, still unauthenticated.
    assert_eq!(
        bad.select_bucket("default").await.unwrap().status(),
        Some(Status::Eaccess)
    );
    bad.auth_plain(APP.0, APP.1).await.unwrap();
    assert!(bad.select_bucket("travel").await.unwrap().is_success());

    let (_, stderr) = server.terminate();
    assert!(stderr.contains("authentication failed"), "{stderr}");
    for secret in ["wrong", ADMIN.1, APP.1] {
        assert!(
            !stderr.contains(secret),
            "the log must not contain a password ({secret:?})"
        );
    }
}

#[tokio::test]
async fn buckets_need_authentication_and_access_and_are_separate() {
    if skip_if_external("buckets") {
        return;
    }
    let (server, _users) = secured_server();
    let k = key("bucket-doc");

    // Unauthenticated: no bucket, and none may be selected.
    let mut anon = server.client().await;
    sdk_hello(&mut anon).await;
    assert_eq!(anon.get(&k).await.unwrap().status(), Some(Status::NoBucket));
    assert_eq!(
        anon.select_bucket("default").await.unwrap().status(),
        Some(Status::Eaccess)
    );
    // A classic client without XERROR cannot be told NoBucket: it is disconnected.
    let mut classic = server.client().await;
    classic
        .send(RequestBuilder::new(Opcode::Get).key(&k))
        .await
        .unwrap();
    assert!(classic.wait_closed().await.is_ok());

    let mut app = login(&server, APP, None).await;
    assert_eq!(app.get(&k).await.unwrap().status(), Some(Status::NoBucket));
    // A bucket the user has no role on looks absent, as one that does not exist (as
    // KV-Engine answers, so bucket names cannot be probed).
    for refused in ["beer", "default", "no-such-bucket"] {
        assert_eq!(
            app.select_bucket(refused).await.unwrap().status(),
            Some(Status::KeyEnoent),
            "{refused}"
        );
    }
    assert!(app.select_bucket("travel").await.unwrap().is_success());
    assert!(
        app.set(&k, b"in travel", StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );

    let mut admin = login(&server, ADMIN, Some("beer")).await;
    assert_eq!(
        admin.get(&k).await.unwrap().status(),
        Some(Status::KeyEnoent)
    );
    assert!(admin.select_bucket("travel").await.unwrap().is_success());
    assert_eq!(admin.get(&k).await.unwrap().value.as_ref(), b"in travel");
    let stats: Vec<(String, String)> = admin.stat("").await.unwrap();
    assert!(stats.contains(&("ep_bucket_name".into(), "travel".into())));
    let quota = |s: &[(String, String)]| {
        s.iter()
            .find(|(k, _)| k == "ep_max_size")
            .map(|(_, v)| v.clone())
    };
    assert!(admin.select_bucket("beer").await.unwrap().is_success());
    let beer = admin.stat("").await.unwrap();
    assert_eq!(
        quota(&beer),
        Some((64u64 << 20).to_string()),
        "beer has its own quota"
    );
}

#[tokio::test]
async fn the_admin_user_may_come_from_the_environment_and_needs_a_password() {
    if skip_if_external("admin_env") {
        return;
    }
    let server = Server::spawn_env(
        &[],
        &[
            ("EPKV_ADMIN_USER", "envadmin"),
            ("EPKV_ADMIN_PASSWORD", "env-pw"),
        ],
    );
    let mut c = login(&server, ("envadmin", "env-pw"), Some("default")).await;
    assert!(
        c.set(&key("env"), b"v", StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
    let mut anon = server.client().await;
    sdk_hello(&mut anon).await;
    assert_eq!(
        anon.get(&key("env")).await.unwrap().status(),
        Some(Status::NoBucket),
        "with a user configured, the open mode is off"
    );
    let (status, stderr) =
        Server::spawn_exact_expecting_failure(&["--port", "0", "--admin-user", "root"]);
    assert!(!status.success());
    assert!(stderr.contains("admin-password"), "{stderr}");
}

#[tokio::test]
async fn the_open_loopback_mode_serves_every_bucket_with_or_without_authentication() {
    if skip_if_external("open_mode") {
        return;
    }
    let server = Server::spawn(&["--buckets", "travel"]);
    let mut c = server.client().await;
    let k = key("open");
    assert!(
        c.set(&k, b"v", StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
    assert!(c.select_bucket("default").await.unwrap().is_success());
    assert!(c.select_bucket("travel").await.unwrap().is_success());
    // Any credentials are taken (Couchbase SDKs always authenticate), and change nothing.
    assert_eq!(
        c.sasl_auth("PLAIN", b"\0a\0b").await.unwrap().status(),
        Some(Status::Success)
    );
    assert!(c.select_bucket("default").await.unwrap().is_success());
    assert_eq!(c.get(&k).await.unwrap().value.as_ref(), b"v");
}

#[tokio::test]
async fn the_error_map_honours_the_requested_version() {
    let server = Server::start();
    let mut c = server.client().await;
    let v1 = c.get_error_map(1).await.unwrap();
    let v2 = c.get_error_map(2).await.unwrap();
    let v9 = c.get_error_map(9).await.unwrap();
    assert_eq!(json(&v1)["version"], 1);
    assert_eq!(json(&v2)["version"], 2);
    assert_eq!(json(&v9)["version"], 2);
    assert_ne!(json(&v1)["revision"], json(&v2)["revision"]);
    assert_eq!(json(&v2)["errors"]["7"]["name"], "NOT_MY_VBUCKET");
    assert_eq!(json(&v2)["errors"]["86"]["attrs"][0], "temp");
    let bad = c
        .request(RequestBuilder::new(Opcode::GetErrorMap).value(&[0, 0]))
        .await
        .unwrap();
    assert_eq!(bad.status(), Some(Status::Einval));
}

#[tokio::test]
async fn the_cluster_map_describes_this_node_and_changes_revision() {
    if skip_if_external("cluster_map") {
        return;
    }
    let (server, _users) = secured_server();
    let port = server.addr.port();
    let mut c = login(&server, ADMIN, None).await;

    let global = c.get_cluster_config(None).await.unwrap();
    assert!(global.is_success());
    let g = json(&global);
    assert!(
        g.get("name").is_none(),
        "no bucket selected: the global config"
    );
    assert_eq!(g["nodesExt"][0]["services"]["kv"], port);
    assert_eq!(g["nodesExt"][0]["hostname"], "127.0.0.1");

    assert!(c.select_bucket("travel").await.unwrap().is_success());
    let b = json(&c.get_cluster_config(None).await.unwrap());
    assert_eq!(b["name"], "travel");
    assert_eq!(b["nodeLocator"], "vbucket");
    assert_eq!(b["vBucketServerMap"]["numReplicas"], 0);
    assert_eq!(
        b["vBucketServerMap"]["serverList"][0],
        format!("127.0.0.1:{port}")
    );
    let map = b["vBucketServerMap"]["vBucketMap"].as_array().unwrap();
    assert_eq!(map.len(), usize::from(NUM_VBUCKETS));
    assert!(map.iter().all(|e| e[0] == 0));
    let caps = b["bucketCapabilities"].as_array().unwrap();
    assert!(caps.contains(&"durableWrite".into()));
    assert!(
        caps.contains(&"collections".into()),
        "collections are agreed in HELLO, so advertised"
    );
    assert_eq!(b["collectionsManifestUid"], "0");
    let rev = b["rev"].as_i64().unwrap();
    let epoch = b["revEpoch"].as_i64().unwrap();
    let same = c.get_cluster_config(Some((epoch, rev))).await.unwrap();
    assert!(same.is_success() && same.value.is_empty(), "nothing newer");

    // A vBucket leaves: the map changes and the revision grows.
    let k = key("nmvb");
    let vb = vbucket_for_key(&k, NUM_VBUCKETS);
    assert!(
        c.set_vbucket(vb, VBucketState::Replica)
            .await
            .unwrap()
            .is_success()
    );
    let after = json(&c.get_cluster_config(Some((epoch, rev))).await.unwrap());
    assert!(after["rev"].as_i64().unwrap() > rev);
    assert_eq!(
        after["vBucketServerMap"]["vBucketMap"][usize::from(vb.0)][0],
        -1
    );
    // NOT_MY_VBUCKET carries the current map, as JSON.
    let nmvb = c.get(&k).await.unwrap();
    assert_eq!(nmvb.status(), Some(Status::NotMyVbucket));
    assert_eq!(nmvb.datatype, Datatype::JSON);
    assert_eq!(json(&nmvb)["rev"], after["rev"]);
    assert!(
        c.set_vbucket(vb, VBucketState::Active)
            .await
            .unwrap()
            .is_success()
    );
    assert!(
        c.set(&k, b"v", StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
}

fn be_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b.try_into().unwrap())
}

#[tokio::test]
async fn observe_seqno_reports_the_vbucket_uuid_and_seqnos_and_failovers() {
    if skip_if_external("observe_seqno") {
        return;
    }
    let server = Server::spawn(&[]);
    let mut c = server.client().await;
    sdk_hello(&mut c).await;
    let k = key("observe");
    let vb = vbucket_for_key(&k, NUM_VBUCKETS);
    let set = c.set(&k, b"v", StoreOptions::new()).await.unwrap();
    assert_eq!(
        set.extras.len(),
        16,
        "MutationSeqno: vBucket UUID and seqno"
    );
    let uuid = be_u64(&set.extras[..8]);
    let seqno = be_u64(&set.extras[8..]);

    let r = c.observe_seqno(vb, uuid).await.unwrap();
    assert!(r.is_success());
    let v = &r.value;
    assert_eq!(v.len(), 27, "format 0");
    assert_eq!(v[0], 0);
    assert_eq!(u16::from_be_bytes([v[1], v[2]]), vb.0);
    assert_eq!(be_u64(&v[3..11]), uuid);
    let persisted = be_u64(&v[11..19]);
    let current = be_u64(&v[19..27]);
    assert_eq!(current, seqno);
    assert!(persisted <= current, "never more persisted than written");

    // A failover: replica, then active again, starts a new branch.
    assert!(
        c.set_vbucket(vb, VBucketState::Replica)
            .await
            .unwrap()
            .is_success()
    );
    assert!(
        c.set_vbucket(vb, VBucketState::Active)
            .await
            .unwrap()
            .is_success()
    );
    let r = c.observe_seqno(vb, uuid).await.unwrap();
    let v = &r.value;
    assert_eq!(
        (r.status(), v.len(), v[0]),
        (Some(Status::Success), 43, 1),
        "format 1"
    );
    let new_uuid = be_u64(&v[3..11]);
    assert_ne!(new_uuid, uuid);
    assert_eq!(be_u64(&v[27..35]), uuid, "the old UUID");
    assert_eq!(
        be_u64(&v[35..43]),
        seqno,
        "the last seqno of the old branch"
    );

    let unknown = c.observe_seqno(vb, uuid ^ 0x5555).await.unwrap();
    assert_eq!(unknown.status(), Some(Status::KeyEnoent));
    let dead = Vbid(vb.0 ^ 1);
    assert!(
        c.set_vbucket(dead, VBucketState::Dead)
            .await
            .unwrap()
            .is_success()
    );
    let r = c.observe_seqno(dead, 1).await.unwrap();
    assert_eq!(r.status(), Some(Status::NotMyVbucket));
}
