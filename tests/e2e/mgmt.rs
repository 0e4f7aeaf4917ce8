//! The management REST API (`--mgmt-port`) of a real server process: buckets created and
//! dropped at run time (and across restarts), users created over REST used on the KV
//! port, the `bucket` subcommands, the `mgmt` entry of the cluster map, access rules.

use crate::harness::{Server, TestDir, http_request, server_binary, skip_if_external};
use epkv_client::{Client, StoreOptions};
use epkv_protocol::Status;

const ADMIN: (&str, &str) = ("Administrator", "password");

fn admin_args() -> Vec<&'static str> {
    vec![
        "--admin-user",
        ADMIN.0,
        "--admin-password",
        ADMIN.1,
        "--memory-quota",
        "32MiB",
    ]
}

async fn login(server: &Server, (user, password): (&str, &str)) -> Client {
    let mut c = server.client().await;
    c.auth_plain(user, password).await.unwrap();
    c
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body:?}"))
}

#[tokio::test]
async fn a_runtime_bucket_survives_a_restart_and_dropping_it_closes_its_connections() {
    if skip_if_external("mgmt_bucket_lifecycle") {
        return;
    }
    let dir = TestDir::new();
    let args = admin_args();
    let server = Server::spawn_in(dir.path(), &args);
    let m = server.mgmt_addr();
    let r = http_request(
        m,
        "POST",
        "/pools/default/buckets",
        Some(ADMIN),
        Some("name=rt&ramQuotaMB=16&flushEnabled=1&replicaNumber=0"),
    );
    assert_eq!(r.status, 202, "{}", r.body);
    let mut c = login(&server, ADMIN).await;
    assert!(c.select_bucket("rt").await.unwrap().is_success());
    assert!(
        c.set(b"k", b"v", StoreOptions::default())
            .await
            .unwrap()
            .is_success()
    );
    drop(c);
    let (status, _) = server.terminate();
    assert!(status.success());

    // The restarted server serves the bucket again, with its document.
    let server = Server::spawn_in(dir.path(), &args);
    let m = server.mgmt_addr();
    let mut c = login(&server, ADMIN).await;
    assert!(c.select_bucket("rt").await.unwrap().is_success());
    assert_eq!(&c.get(b"k").await.unwrap().value[..], b"v");
    let list = json(&http_request(m, "GET", "/pools/default/buckets", Some(ADMIN), None).body);
    let names: Vec<_> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["default", "rt"]);

    // Dropping it closes the connection that selected it, and nobody can select it.
    let r = http_request(m, "DELETE", "/pools/default/buckets/rt", Some(ADMIN), None);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(c.get(b"k").await.is_err(), "the connection is closed");
    let mut other = login(&server, ADMIN).await;
    assert_eq!(
        other.select_bucket("rt").await.unwrap().status(),
        Some(Status::Eaccess)
    );
    assert!(
        !dir.path().join("rt").exists(),
        "its data directory is gone"
    );
    let r = http_request(m, "DELETE", "/pools/default/buckets/rt", Some(ADMIN), None);
    assert_eq!(r.status, 404);
    // `default` comes from the settings: it cannot be dropped.
    let r = http_request(
        m,
        "DELETE",
        "/pools/default/buckets/default",
        Some(ADMIN),
        None,
    );
    assert_eq!(r.status, 400, "{}", r.body);
    drop(other);
    let (status, _) = server.terminate();
    assert!(status.success());

    // Dropped stays dropped.
    let server = Server::spawn_in(dir.path(), &args);
    let mut c = login(&server, ADMIN).await;
    assert_eq!(
        c.select_bucket("rt").await.unwrap().status(),
        Some(Status::Eaccess)
    );
}

#[tokio::test]
async fn users_created_over_rest_log_in_on_the_kv_port_after_a_restart() {
    if skip_if_external("mgmt_users") {
        return;
    }
    let dir = TestDir::new();
    let args = admin_args();
    let server = Server::spawn_in(dir.path(), &args);
    let m = server.mgmt_addr();
    let r = http_request(
        m,
        "PUT",
        "/settings/rbac/users/local/app",
        Some(ADMIN),
        Some("password=app-secret&roles=data_writer%5Bdefault%5D"),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // A user with a bucket role is not an administrator.
    let r = http_request(
        m,
        "GET",
        "/settings/rbac/users",
        Some(("app", "app-secret")),
        None,
    );
    assert_eq!(r.status, 403);
    assert!(json(&r.body)["permissions"].is_array());
    let text = std::fs::read_to_string(dir.path().join("users.toml")).unwrap();
    assert!(text.contains("app") && !text.contains("app-secret"));
    let (status, _) = server.terminate();
    assert!(status.success());

    let server = Server::spawn_in(dir.path(), &args);
    let mut c = login(&server, ("app", "app-secret")).await;
    assert!(c.select_bucket("default").await.unwrap().is_success());
    let r = http_request(
        server.mgmt_addr(),
        "DELETE",
        "/settings/rbac/users/local/app",
        Some(ADMIN),
        None,
    );
    assert_eq!(r.status, 200);
    let mut c = server.client().await;
    assert!(c.auth_plain("app", "app-secret").await.is_err());
    // The HTTP side forgets the removed user at once too.
    let r = http_request(
        server.mgmt_addr(),
        "GET",
        "/pools",
        Some(("app", "app-secret")),
        None,
    );
    assert_eq!(r.status, 401);
}

#[tokio::test]
async fn the_cluster_map_advertises_the_management_port_and_rest_serves_it() {
    if skip_if_external("mgmt_nodes_ext") {
        return;
    }
    let server = Server::spawn(&admin_args());
    let m = server.mgmt_addr();
    let mut c = login(&server, ADMIN).await;
    assert!(c.select_bucket("default").await.unwrap().is_success());
    let kv = json(std::str::from_utf8(&c.get_cluster_config(None).await.unwrap().value).unwrap());
    assert_eq!(kv["nodesExt"][0]["services"]["mgmt"], m.port());
    assert!(kv["nodesExt"][0]["services"].get("mgmtSSL").is_none());
    let terse = http_request(m, "GET", "/pools/default/b/default", Some(ADMIN), None);
    assert_eq!(terse.status, 200);
    assert!(
        terse
            .head
            .to_ascii_lowercase()
            .contains("content-type: application/json")
    );
    let terse = json(&terse.body);
    assert_eq!(terse["name"], "default");
    assert_eq!(
        terse["vBucketServerMap"]["vBucketMap"]
            .as_array()
            .unwrap()
            .len(),
        1024
    );
    let nodes = json(&http_request(m, "GET", "/pools/nodes", Some(ADMIN), None).body);
    assert_eq!(nodes["nodes"][0]["configuredHostname"], m.to_string());
    let pools = json(&http_request(m, "GET", "/pools", Some(ADMIN), None).body);
    assert!(
        pools["implementationVersion"]
            .as_str()
            .unwrap()
            .contains("epkv")
    );
    let r = http_request(m, "GET", "/pools", None, None);
    assert_eq!(r.status, 401);
    assert!(
        r.head
            .to_ascii_lowercase()
            .contains("www-authenticate: basic")
    );
    let r = http_request(m, "GET", "/no/such/thing", Some(ADMIN), None);
    assert_eq!(r.status, 404);
    assert!(json(&r.body)["error"].is_string());
    let r = http_request(
        m,
        "POST",
        "/pools/default/buckets",
        Some(ADMIN),
        Some("name=x&ramQuotaMB=12abc"),
    );
    assert_eq!(r.status, 400);
    assert!(json(&r.body)["errors"]["ramQuota"].is_string());
}

#[tokio::test]
async fn the_bucket_subcommands_create_and_drop_on_a_running_server() {
    if skip_if_external("mgmt_cli") {
        return;
    }
    let server = Server::spawn(&admin_args());
    let port = server.mgmt_addr().port().to_string();
    let cli = |args: &[&str]| {
        std::process::Command::new(server_binary())
            .arg("bucket")
            .args(args)
            .args(["--port", &port, "--user", ADMIN.0, "--password", ADMIN.1])
            .output()
            .unwrap()
    };
    let out = cli(&["create", "cli-b", "--quota", "16"]);
    assert!(out.status.success(), "{out:?}");
    let mut c = login(&server, ADMIN).await;
    assert!(c.select_bucket("cli-b").await.unwrap().is_success());
    let out = cli(&["create", "cli-b"]);
    assert!(!out.status.success(), "a second create fails");
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    let out = cli(&["drop", "cli-b"]);
    assert!(out.status.success(), "{out:?}");
    // The connection that had selected it is closed at its next data request.
    assert!(c.get(b"k").await.is_err());
    let out = cli(&["drop", "cli-b"]);
    assert!(!out.status.success());
}

#[tokio::test]
async fn the_scope_and_collection_subcommands_change_the_manifest() {
    if skip_if_external("mgmt_collection_cli") {
        return;
    }
    let server = Server::spawn(&admin_args());
    let port = server.mgmt_addr().port().to_string();
    let cli = |args: &[&str]| {
        std::process::Command::new(server_binary())
            .args(args)
            .args(["--port", &port, "--user", ADMIN.0, "--password", ADMIN.1])
            .output()
            .unwrap()
    };
    let out = cli(&["scope", "create", "default", "app"]);
    assert!(out.status.success(), "{out:?}");
    let out = cli(&[
        "collection",
        "create",
        "default",
        "app.users",
        "--max-ttl",
        "60",
    ]);
    assert!(out.status.success(), "{out:?}");
    let out = cli(&["collection", "create", "default", "app.users"]);
    assert!(!out.status.success(), "a second create fails");
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    let out = cli(&["collection", "create", "default", "no-dot"]);
    assert!(!out.status.success());
    let m = json(
        &http_request(
            server.mgmt_addr(),
            "GET",
            "/pools/default/buckets/default/scopes",
            Some(ADMIN),
            None,
        )
        .body,
    );
    assert_eq!(m["scopes"][1]["name"], "app");
    assert_eq!(m["scopes"][1]["collections"][0]["name"], "users");
    assert_eq!(m["scopes"][1]["collections"][0]["maxTTL"], 60);
    let out = cli(&["collection", "drop", "default", "app.users"]);
    assert!(out.status.success(), "{out:?}");
    let out = cli(&["collection", "drop", "default", "app.users"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
    let out = cli(&["scope", "drop", "default", "app"]);
    assert!(out.status.success(), "{out:?}");
}

/// `vb_N:high_seqno` and `vb_N:last_persisted_seqno` of the key's vBucket.
async fn seqnos(c: &mut Client, key: &[u8]) -> (u64, u64) {
    let vb = c.vbucket_for(key).0;
    let stats = c.stat(&format!("vbucket-seqno {vb}")).await.unwrap();
    let get = |name: &str| -> u64 {
        let k = format!("vb_{vb}:{name}");
        stats
            .iter()
            .find(|(s, _)| *s == k)
            .unwrap_or_else(|| panic!("no {k}"))
            .1
            .parse()
            .unwrap()
    };
    (get("high_seqno"), get("last_persisted_seqno"))
}

#[tokio::test]
async fn a_bucket_minimum_durability_level_makes_plain_writes_wait_for_persistence() {
    if skip_if_external("mgmt_durability_min_level") {
        return;
    }
    // A 10 s batching delay: a write nobody waits on stays unpersisted for the whole test.
    let mut args = admin_args();
    args.extend(["--flush-delay", "10000"]);
    let server = Server::spawn(&args);
    let m = server.mgmt_addr();
    for form in [
        "name=strict&ramQuotaMB=16&durabilityMinLevel=persistToMajority",
        "name=lax&ramQuotaMB=16",
    ] {
        let r = http_request(m, "POST", "/pools/default/buckets", Some(ADMIN), Some(form));
        assert_eq!(r.status, 202, "{}", r.body);
    }
    let r = http_request(m, "GET", "/pools/default/buckets/strict", Some(ADMIN), None);
    assert_eq!(json(&r.body)["durabilityMinLevel"], "persistToMajority");
    let r = http_request(
        m,
        "POST",
        "/pools/default/buckets",
        Some(ADMIN),
        Some("name=eph&bucketType=ephemeral&durabilityMinLevel=persistToMajority"),
    );
    assert_eq!(r.status, 400, "{}", r.body);

    let mut c = login(&server, ADMIN).await;
    // A SET without a durability frame is answered once it is on disk.
    assert!(c.select_bucket("strict").await.unwrap().is_success());
    for i in 0..20 {
        let key = format!("k{i}");
        let r = c
            .set(key.as_bytes(), b"v", StoreOptions::default())
            .await
            .unwrap();
        assert!(r.is_success());
        // A SyncWrite: its prepare took seqno high - 1 and was persisted before the
        // commit (seqno high, persisted later, as in KV-Engine) answered the client.
        let (high, persisted) = seqnos(&mut c, key.as_bytes()).await;
        assert!(
            persisted + 1 >= high,
            "{key}: persisted {persisted}, high {high}"
        );
        assert_eq!(&c.get(key.as_bytes()).await.unwrap().value[..], b"v");
    }
    // Without the minimum, the same write is answered before the (delayed) flush.
    assert!(c.select_bucket("lax").await.unwrap().is_success());
    let r = c.set(b"k0", b"v", StoreOptions::default()).await.unwrap();
    assert!(r.is_success());
    let (high, persisted) = seqnos(&mut c, b"k0").await;
    assert!(persisted < high, "persisted {persisted}, high {high}");
}
