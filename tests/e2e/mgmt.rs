//! The management REST API (`--mgmt-port`) of a real server process: buckets created and
//! dropped at run time (and across restarts), users created over REST used on the KV
//! port, the `bucket` subcommands, the `mgmt` entry of the cluster map, and each role's
//! privileges on each endpoint family (a table generated from `epkv_auth::rbac::ROLES`).

use crate::harness::{
    ADMIN, Server, TestDir, admin_args, http_request, server_binary, skip_if_external,
};
use epkv_auth::rbac::{Qualifier, ROLES};
use epkv_auth::{Privilege, Roles};
use epkv_client::{Client, StoreOptions};
use epkv_protocol::{Feature, Status};

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
        Some(Status::KeyEnoent)
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
        Some(Status::KeyEnoent)
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
async fn a_role_revoked_over_rest_refuses_the_open_connections_next_write() {
    if skip_if_external("mgmt_role_revoked") {
        return;
    }
    let dir = TestDir::new();
    let audit = dir.path().join("audit.log");
    let audit_arg = audit.to_str().unwrap().to_owned();
    let mut args = admin_args();
    args.extend(["--audit-log", &audit_arg]);
    let server = Server::spawn_in(dir.path(), &args);
    let m = server.mgmt_addr();
    let put_roles = |roles: &str| {
        let body = format!("password=app-secret&roles={roles}");
        let r = http_request(
            m,
            "PUT",
            "/settings/rbac/users/local/app",
            Some(ADMIN),
            Some(&body),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    };
    put_roles("data_reader%5Bdefault%5D,data_writer%5Bdefault%5D");
    let mut c = server.client().await;
    c.hello("e2e-rbac", &[Feature::Xerror, Feature::Json])
        .await
        .unwrap();
    c.auth_plain("app", "app-secret").await.unwrap();
    assert!(c.select_bucket("default").await.unwrap().is_success());
    let write = StoreOptions::default();
    assert!(c.set(b"k", b"v1", write).await.unwrap().is_success());

    put_roles("data_reader%5Bdefault%5D");
    let refused = c.set(b"k", b"v2", write).await.unwrap();
    assert_eq!(refused.status(), Some(Status::Eaccess));
    let context = json(std::str::from_utf8(&refused.value).unwrap());
    assert_eq!(
        context["error"]["context"],
        "Authorization failure: can't execute SET operation without the Upsert privilege"
    );
    // The connection stays, with what the user still holds.
    assert_eq!(&c.get(b"k").await.unwrap().value[..], b"v1");

    let r = http_request(
        m,
        "DELETE",
        "/settings/rbac/users/local/app",
        Some(ADMIN),
        None,
    );
    assert_eq!(r.status, 200);
    assert_eq!(c.get(b"k").await.unwrap().status(), Some(Status::Eaccess));
    let mut stranger = server.client().await;
    assert!(stranger.auth_plain("app", "app-secret").await.is_err());

    // The KV port's logins, the failed one and the refusals were audited.
    let text = std::fs::read_to_string(&audit).unwrap();
    let events: Vec<serde_json::Value> = text.lines().map(json).collect();
    let kv = |kind: &str| -> Vec<&serde_json::Value> {
        events
            .iter()
            .filter(|e| e["kind"] == kind && e["interface"] == "kv")
            .collect()
    };
    assert!(
        kv("auth_success")
            .iter()
            .any(|e| e["user"] == "app" && e["detail"] == "PLAIN"),
        "{text}"
    );
    assert!(!kv("auth_failure").is_empty(), "{text}");
    let denied = kv("access_denied");
    assert!(
        denied.iter().any(|e| e["user"] == "app"
            && e["bucket"] == "default"
            && e["detail"] == "SET needs Upsert"),
        "{text}"
    );
    assert!(denied.iter().all(|e| e["source"].is_string()), "{text}");
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

/// One endpoint family: a request that changes nothing lasting, the privilege it needs
/// (on `default` when bucket-level) and what it answers when allowed.
struct Family {
    method: &'static str,
    path: &'static str,
    form: Option<&'static str>,
    privilege: Privilege,
    bucket: Option<&'static str>,
    allowed: u16,
}

const FAMILIES: &[Family] = &[
    Family {
        method: "GET",
        path: "/pools",
        form: None,
        privilege: Privilege::SystemSettings,
        bucket: None,
        allowed: 200,
    },
    Family {
        method: "GET",
        path: "/pools/default",
        form: None,
        privilege: Privilege::SystemSettings,
        bucket: None,
        allowed: 200,
    },
    Family {
        method: "GET",
        path: "/pools/nodes",
        form: None,
        privilege: Privilege::SystemSettings,
        bucket: None,
        allowed: 200,
    },
    Family {
        method: "GET",
        path: "/pools/default/buckets/default",
        form: None,
        privilege: Privilege::SettingsRead,
        bucket: Some("default"),
        allowed: 200,
    },
    Family {
        method: "GET",
        path: "/pools/default/b/default",
        form: None,
        privilege: Privilege::SettingsRead,
        bucket: Some("default"),
        allowed: 200,
    },
    Family {
        method: "GET",
        path: "/pools/default/buckets/default/scopes",
        form: None,
        privilege: Privilege::SettingsRead,
        bucket: Some("default"),
        allowed: 200,
    },
    // `_x` is not a valid scope name: allowed requests reach the engine and fail there.
    Family {
        method: "POST",
        path: "/pools/default/buckets/default/scopes",
        form: Some("name=_x"),
        privilege: Privilege::CollectionManagement,
        bucket: Some("default"),
        allowed: 400,
    },
    Family {
        method: "DELETE",
        path: "/pools/default/buckets/default/scopes/nosuch",
        form: None,
        privilege: Privilege::CollectionManagement,
        bucket: Some("default"),
        allowed: 404,
    },
    Family {
        method: "POST",
        path: "/pools/default/buckets/default/controller/doFlush",
        form: Some(""),
        privilege: Privilege::Flush,
        bucket: Some("default"),
        allowed: 200,
    },
    // An empty name: allowed requests fail validation, so no bucket is created.
    Family {
        method: "POST",
        path: "/pools/default/buckets",
        form: Some("name="),
        privilege: Privilege::BucketCreate,
        bucket: None,
        allowed: 400,
    },
    Family {
        method: "DELETE",
        path: "/pools/default/buckets/nosuch",
        form: None,
        privilege: Privilege::BucketCreate,
        bucket: None,
        allowed: 404,
    },
    Family {
        method: "GET",
        path: "/settings/rbac/users",
        form: None,
        privilege: Privilege::SecurityRead,
        bucket: None,
        allowed: 200,
    },
    Family {
        method: "GET",
        path: "/settings/rbac/users/local/Administrator",
        form: None,
        privilege: Privilege::SecurityRead,
        bucket: None,
        allowed: 200,
    },
    // No password for a new user: allowed requests are refused by validation.
    Family {
        method: "PUT",
        path: "/settings/rbac/users/local/probe",
        form: Some("roles=data_reader%5Bdefault%5D"),
        privilege: Privilege::SecurityManagement,
        bucket: None,
        allowed: 400,
    },
    Family {
        method: "DELETE",
        path: "/settings/rbac/users/local/nosuch",
        form: None,
        privilege: Privilege::SecurityManagement,
        bucket: None,
        allowed: 404,
    },
    Family {
        method: "POST",
        path: "/controller/failOver",
        form: Some(""),
        privilege: Privilege::ClusterManagement,
        bucket: None,
        allowed: 400,
    },
    Family {
        method: "POST",
        path: "/controller/reAddNode",
        form: Some(""),
        privilege: Privilege::ClusterManagement,
        bucket: None,
        allowed: 400,
    },
];

/// Every role of `epkv_auth::rbac::ROLES`, qualified with `default` where it takes a
/// bucket, plus collection- and scope-qualified data roles and a role on another bucket.
fn every_role() -> Vec<String> {
    let mut roles: Vec<String> = ROLES
        .iter()
        .map(|d| match d.qualifier {
            Qualifier::None => d.name.to_owned(),
            Qualifier::Bucket | Qualifier::Collection => format!("{}[default]", d.name),
        })
        .collect();
    roles.extend(
        [
            "data_reader[default:s1:c1]",
            "data_monitoring[default:s1]",
            "bucket_admin[other]",
            "bucket_full_access[*]",
        ]
        .map(str::to_owned),
    );
    roles
}

fn percent(s: &str) -> String {
    s.replace('[', "%5B")
        .replace(']', "%5D")
        .replace(':', "%3A")
        .replace('*', "%2A")
}

#[tokio::test]
async fn every_role_gets_what_the_role_table_grants_on_every_endpoint_family() {
    if skip_if_external("mgmt_rbac_table") {
        return;
    }
    let dir = TestDir::new();
    let audit = dir.path().join("audit.log");
    let audit_arg = audit.to_str().unwrap().to_owned();
    let mut args = admin_args();
    args.extend(["--metrics-port", "0", "--audit-log", &audit_arg]);
    let server = Server::spawn_in(dir.path(), &args);
    let m = server.mgmt_addr();
    let metrics = crate::metrics::metrics_addr(&server);
    let password = "role-secret";
    let roles = every_role();
    for (i, role) in roles.iter().enumerate() {
        let r = http_request(
            m,
            "PUT",
            &format!("/settings/rbac/users/local/u{i}"),
            Some(ADMIN),
            Some(&format!("password={password}&roles={}", percent(role))),
        );
        assert_eq!(r.status, 200, "{role}: {}", r.body);
    }
    let mut failures = Vec::new();
    for (i, role) in roles.iter().enumerate() {
        let granted = Roles::parse_list(role).unwrap();
        let user = format!("u{i}");
        let creds = Some((user.as_str(), password));
        for f in FAMILIES {
            let want = if granted.allows(f.privilege, f.bucket, None, None) {
                f.allowed
            } else {
                403
            };
            let r = http_request(m, f.method, f.path, creds, f.form);
            if r.status != want {
                failures.push(format!(
                    "{role}: {} {} answered {} (want {want}): {}",
                    f.method, f.path, r.status, r.body
                ));
            } else if want == 403 {
                assert!(
                    json(&r.body)["permissions"][0].is_string(),
                    "{role} {}: {}",
                    f.path,
                    r.body
                );
            }
        }
        // The bucket list shows the buckets the user holds SettingsRead on.
        let list = json(&http_request(m, "GET", "/pools/default/buckets", creds, None).body);
        let lists_default = list
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["name"] == "default");
        if lists_default != granted.allows(Privilege::SettingsRead, Some("default"), None, None) {
            failures.push(format!("{role}: bucket list {list}"));
        }
        // /metrics: Stats sees everything, SimpleStats on a bucket that bucket's series.
        let r = http_request(metrics, "GET", "/metrics", creds, None);
        let stats = granted.allows(Privilege::Stats, None, None, None);
        let simple = granted.allows(Privilege::SimpleStats, Some("default"), None, None);
        let want = if stats || simple { 200 } else { 403 };
        if r.status != want
            || (want == 200 && !r.body.contains(r#"kv_curr_items{bucket="default"}"#))
            || (want == 200 && r.body.contains("kv_curr_connections") != stats)
        {
            failures.push(format!("{role}: /metrics {} {}", r.status, r.head));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // The refusals and the users created were audited, as JSON lines.
    let text = std::fs::read_to_string(&audit).unwrap();
    let events: Vec<serde_json::Value> = text.lines().map(json).collect();
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "user_created" && e["user"] == "Administrator")
    );
    assert!(events.iter().any(|e| {
        e["kind"] == "access_denied"
            && e["interface"] == "rest"
            && e["user"] == "u6"
            && e["source"]
                .as_str()
                .is_some_and(|s| s.starts_with("127.0.0.1:"))
    }));
    assert!(
        events
            .iter()
            .all(|e| e["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')))
    );
    let r = http_request(m, "GET", "/pools", Some(("u0", "wrong-password")), None);
    assert_eq!(r.status, 401);
    let text = std::fs::read_to_string(&audit).unwrap();
    assert!(
        text.lines()
            .map(json)
            .any(|e| e["kind"] == "auth_failure" && e["user"] == "u0")
    );
}

#[tokio::test]
async fn a_security_admin_manages_users_but_not_admins_or_themselves() {
    if skip_if_external("mgmt_security_admin") {
        return;
    }
    let server = Server::spawn(&admin_args());
    let m = server.mgmt_addr();
    let put = |who, name: &str, form: &str| {
        http_request(
            m,
            "PUT",
            &format!("/settings/rbac/users/local/{name}"),
            Some(who),
            Some(form),
        )
        .status
    };
    assert_eq!(
        put(ADMIN, "sec", "password=sec-secret&roles=security_admin"),
        200
    );
    assert_eq!(put(ADMIN, "boss", "password=boss-secret&roles=admin"), 200);
    let sec = ("sec", "sec-secret");
    assert_eq!(
        put(
            sec,
            "app",
            "password=app-secret&roles=data_reader%5Bdefault%5D"
        ),
        200,
        "a security admin creates ordinary users"
    );
    assert_eq!(put(sec, "app", "roles=data_writer%5Bdefault%5D"), 200);
    for (name, form) in [
        ("x", "password=x-secret&roles=admin"),
        ("x", "password=x-secret&roles=security_admin"),
        ("boss", "roles=ro_admin"),
        ("sec", "roles=security_admin%2Cro_admin"),
    ] {
        assert_eq!(put(sec, name, form), 403, "{name} {form}");
    }
    let delete = |who, name: &str| {
        http_request(
            m,
            "DELETE",
            &format!("/settings/rbac/users/local/{name}"),
            Some(who),
            None,
        )
        .status
    };
    assert_eq!(delete(sec, "boss"), 403);
    assert_eq!(delete(sec, "sec"), 403);
    assert_eq!(delete(sec, "app"), 200);
    // Only admin grants admin roles.
    assert_eq!(
        put(ADMIN, "x", "password=x-secret&roles=security_admin"),
        200
    );
    assert_eq!(delete(ADMIN, "x"), 200);
}
