//! Couchbase RBAC on the KV port, over a real socket: each opcode's privilege checked
//! against the user's roles (bucket-wide and collection-qualified), KV-Engine's refusal
//! (0x24 with an error context naming the privilege, the connection kept), SELECT_BUCKET
//! hiding buckets the user has no role on, DCP_OPEN and STAT groups, and roles changed or
//! users deleted while a connection is open.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "integration tests"
)]

mod common;

use common::{Client, Resp, TestServer};
use epkv_auth::{Roles, UserDirectory, UserStore};
use epkv_frontend::FrontendConfig;
use epkv_protocol::{Feature, Opcode, RequestBuilder, Status};
use epkv_types::doc_key::{self, DocKeyBuf};
use epkv_types::{NUM_VBUCKETS, vbucket_for_key};

const PASSWORD: &str = "pw";

/// Users named after their roles, each with password [`PASSWORD`].
fn users(list: &[(&str, &str)]) -> UserDirectory {
    let mut store = UserStore::empty().with_iterations(1);
    for (name, roles) in list {
        store
            .insert_with_password(name, PASSWORD, Roles::parse_list(roles).unwrap())
            .unwrap();
    }
    UserDirectory::new(store)
}

fn server(list: &[(&str, &str)]) -> (TestServer, UserDirectory) {
    let users = users(list);
    let config = FrontendConfig {
        users: users.clone(),
        ..FrontendConfig::default()
    };
    (TestServer::with_config(config), users)
}

/// HELLO with XERROR and JSON (and collections when asked), then SASL PLAIN as `user`.
fn login(s: &TestServer, user: &str, collections: bool) -> Client {
    let mut c = s.client();
    let mut features = vec![Feature::Xerror, Feature::Json];
    if collections {
        features.push(Feature::Collections);
    }
    let value: Vec<u8> = features
        .iter()
        .flat_map(|f| f.as_u16().to_be_bytes())
        .collect();
    let r = c.request(
        RequestBuilder::new(Opcode::Hello)
            .key(b"rbac")
            .value(&value),
    );
    assert_eq!(r.status, 0, "HELLO");
    let plain = format!("\0{user}\0{PASSWORD}");
    let r = c.request(
        RequestBuilder::new(Opcode::SaslAuth)
            .key(b"PLAIN")
            .value(plain.as_bytes()),
    );
    assert_eq!(r.status, 0, "SASL as {user}");
    c
}

fn select(c: &mut Client, bucket: &str) -> u16 {
    c.request(RequestBuilder::new(Opcode::SelectBucket).key(bucket.as_bytes()))
        .status
}

/// A request on `key` (a wire key), sent to the vBucket the fake engine expects.
fn on_key<'a>(op: Opcode, wire: &'a [u8], engine_key: &[u8]) -> RequestBuilder<'a> {
    RequestBuilder::new(op)
        .key(wire)
        .vbucket(vbucket_for_key(engine_key, NUM_VBUCKETS))
}

fn get(c: &mut Client, key: &[u8]) -> Resp {
    c.request(on_key(Opcode::Get, key, key))
}

fn set(c: &mut Client, key: &[u8]) -> Resp {
    c.request(on_key(Opcode::Set, key, key).extras(&[0; 8]).value(b"v"))
}

/// A GET of `key` in collection `cid` on a collection-aware connection.
fn get_in(c: &mut Client, cid: u32, key: &[u8]) -> Resp {
    let mut wire = DocKeyBuf::new();
    let wire = wire.put_wire(cid, key).to_vec();
    let mut engine = DocKeyBuf::new();
    let engine = doc_key::encode(cid, key, &mut engine).to_vec();
    c.request(on_key(Opcode::Get, &wire, &engine))
}

/// Asserts KV-Engine's refusal: 0x24 with the error context naming `op` and `privilege`.
fn assert_refused(r: &Resp, op: &str, privilege: &str) {
    assert_eq!(r.status, Status::Eaccess.as_u16(), "{r:?}");
    let context: serde_json::Value = serde_json::from_slice(&r.value).unwrap();
    assert_eq!(
        context["error"]["context"],
        format!(
            "Authorization failure: can't execute {op} operation without the {privilege} privilege"
        ),
    );
}

fn assert_allowed(r: &Resp) {
    assert_ne!(r.status, Status::Eaccess.as_u16(), "{r:?}");
}

#[test]
fn a_reader_reads_and_is_refused_writes_with_the_privilege_named() {
    let (s, _users) = server(&[
        ("writer", "data_writer[default]"),
        ("reader", "data_reader[default]"),
    ]);
    let mut w = login(&s, "writer", false);
    assert_eq!(select(&mut w, "default"), 0);
    assert_eq!(set(&mut w, b"doc").status, 0);

    let mut r = login(&s, "reader", false);
    assert_eq!(select(&mut r, "default"), 0);
    let got = get(&mut r, b"doc");
    assert_eq!((got.status, &got.value[..]), (0, &b"v"[..]));
    assert_refused(&set(&mut r, b"doc"), "SET", "Upsert");
    assert_refused(
        &r.request(on_key(Opcode::Delete, b"doc", b"doc")),
        "DELETE",
        "Delete",
    );
    assert_refused(
        &r.request(
            on_key(Opcode::Add, b"new", b"new")
                .extras(&[0; 8])
                .value(b"v"),
        ),
        "ADD",
        "Insert",
    );
    assert_refused(
        &r.request(on_key(Opcode::Increment, b"n", b"n").extras(&[0; 20])),
        "INCREMENT",
        "Upsert",
    );
    assert_refused(
        &r.request(RequestBuilder::new(Opcode::Flush)),
        "FLUSH",
        "BucketManagement",
    );
    // The connection stays open and usable.
    assert_eq!(r.request(RequestBuilder::new(Opcode::Noop)).status, 0);
    assert_eq!(get(&mut r, b"doc").status, 0);
}

#[test]
fn a_writer_writes_and_is_refused_reads() {
    let (s, _users) = server(&[("writer", "data_writer[default]")]);
    let mut w = login(&s, "writer", false);
    assert_eq!(select(&mut w, "default"), 0);
    assert_eq!(set(&mut w, b"doc").status, 0);
    let add = w.request(
        on_key(Opcode::Add, b"new", b"new")
            .extras(&[0; 8])
            .value(b"v"),
    );
    assert_eq!(add.status, 0, "ADD needs Insert or Upsert");
    assert_refused(&get(&mut w, b"doc"), "GET", "Read");
    assert_refused(
        &w.request(on_key(Opcode::Increment, b"n", b"n").extras(&[0; 20])),
        "INCREMENT",
        "Read",
    );
    assert_eq!(w.request(on_key(Opcode::Delete, b"doc", b"doc")).status, 0);
}

#[test]
fn select_bucket_hides_buckets_the_user_has_no_role_on() {
    let (s, _users) = server(&[
        ("elsewhere", "data_reader[travel]"),
        ("reader", "data_reader[default]"),
    ]);
    let mut c = login(&s, "elsewhere", false);
    assert_eq!(select(&mut c, "default"), Status::KeyEnoent.as_u16());
    assert_eq!(select(&mut c, "no-such-bucket"), Status::KeyEnoent.as_u16());
    let mut r = login(&s, "reader", false);
    assert_eq!(select(&mut r, "default"), 0);
    // Not authenticated: Eaccess, as before.
    let mut anon = s.client();
    let r = anon.request(RequestBuilder::new(Opcode::SelectBucket).key(b"default"));
    assert_eq!(r.status, Status::Eaccess.as_u16());
}

#[test]
fn a_role_revoked_or_a_user_deleted_takes_effect_at_the_next_request() {
    let (s, users) = server(&[("app", "data_reader[default],data_writer[default]")]);
    let mut c = login(&s, "app", false);
    assert_eq!(select(&mut c, "default"), 0);
    assert_eq!(set(&mut c, b"doc").status, 0);
    users
        .update(|u| u.set_roles("app", Roles::parse_list("data_reader[default]").unwrap()))
        .unwrap();
    assert_refused(&set(&mut c, b"doc"), "SET", "Upsert");
    assert_eq!(get(&mut c, b"doc").status, 0, "reading is still granted");
    users
        .update(|u| {
            u.set_roles(
                "app",
                Roles::parse_list("bucket_full_access[default]").unwrap(),
            )
        })
        .unwrap();
    assert_eq!(
        set(&mut c, b"doc").status,
        0,
        "a role granted back counts at once"
    );
    users.update(|u| Ok::<_, ()>(u.remove("app"))).unwrap();
    assert_refused(&get(&mut c, b"doc"), "GET", "Read");
    assert_refused(&set(&mut c, b"doc"), "SET", "Upsert");
}

#[test]
fn a_collection_qualified_reader_reads_its_collection_only() {
    let (s, _users) = server(&[("c1reader", "data_reader[default:s1:c1]")]);
    let mut c = login(&s, "c1reader", true);
    assert_eq!(select(&mut c, "default"), 0);
    // The fake engine's collection 8 is s1.c1 and 9 is s1.c2.
    assert_allowed(&get_in(&mut c, 8, b"doc"));
    assert_allowed(&get_in(&mut c, 8, b"other"));
    assert_refused(&get_in(&mut c, 9, b"doc"), "GET", "Read");
    assert_refused(&get_in(&mut c, 0, b"doc"), "GET", "Read");
    assert_allowed(&get_in(&mut c, 8, b"again"));
    let unknown = get_in(&mut c, 0x77, b"doc");
    assert_eq!(unknown.status, Status::UnknownCollection.as_u16());
}

#[test]
fn a_client_without_xerror_is_disconnected_instead_of_told_eaccess() {
    let (s, _users) = server(&[("reader", "data_reader[default]")]);
    let mut c = s.client();
    let r = c.request(
        RequestBuilder::new(Opcode::SaslAuth)
            .key(b"PLAIN")
            .value(b"\0reader\0pw"),
    );
    assert_eq!(r.status, 0);
    assert_eq!(select(&mut c, "default"), 0);
    c.send_req(
        on_key(Opcode::Set, b"doc", b"doc")
            .extras(&[0; 8])
            .value(b"v"),
    );
    assert!(c.until_closed().is_empty());
}

#[test]
fn stats_need_simple_stats_and_the_node_wide_group_needs_stats() {
    let (s, _users) = server(&[
        ("mon", "data_monitoring[default]"),
        ("reader", "data_reader[default]"),
        ("admin", "admin"),
    ]);
    let stat = |c: &mut Client, group: &[u8]| {
        c.send_req(RequestBuilder::new(Opcode::Stat).key(group));
        loop {
            let r = c.recv();
            if r.status != 0 || r.key.is_empty() {
                return r;
            }
        }
    };
    let mut mon = login(&s, "mon", false);
    assert_eq!(select(&mut mon, "default"), 0);
    assert_eq!(stat(&mut mon, b"").status, 0);
    assert_refused(&stat(&mut mon, b"timings"), "STAT", "Stats");
    assert_refused(&get(&mut mon, b"doc"), "GET", "Read");
    let mut reader = login(&s, "reader", false);
    assert_eq!(select(&mut reader, "default"), 0);
    assert_refused(&stat(&mut reader, b""), "STAT", "SimpleStats");
    let mut admin = login(&s, "admin", false);
    assert_eq!(stat(&mut admin, b"timings").status, 0, "no bucket needed");
}

#[test]
fn dcp_open_needs_the_producer_or_consumer_privilege() {
    let (s, _users) = server(&[
        ("reader", "data_reader[default]"),
        ("dcp", "data_dcp_reader[default]"),
    ]);
    let open = |c: &mut Client, flags: u32| {
        let mut extras = [0u8; 8];
        extras[4..].copy_from_slice(&flags.to_be_bytes());
        c.request(
            RequestBuilder::new(Opcode::DcpOpen)
                .key(b"conn")
                .extras(&extras),
        )
    };
    let mut r = login(&s, "reader", false);
    assert_eq!(select(&mut r, "default"), 0);
    assert_refused(&open(&mut r, 1), "DCP_OPEN", "DcpProducer");
    assert_refused(&open(&mut r, 0), "DCP_OPEN", "DcpConsumer");
    let mut d = login(&s, "dcp", false);
    assert_eq!(select(&mut d, "default"), 0);
    assert_refused(&open(&mut d, 0), "DCP_OPEN", "DcpConsumer");
    assert_eq!(open(&mut d, 1).status, 0);
}

#[test]
fn open_mode_accepts_any_credentials_and_a_configured_server_does_not() {
    // No users, loopback: every mechanism's first message succeeds at once, whatever
    // the name and password, and the connection keeps every privilege.
    let open = TestServer::start();
    for (mechanism, data) in [
        (&b"PLAIN"[..], &b"\0anyone\0anything"[..]),
        (
            b"SCRAM-SHA512",
            b"n,,n=Administrator,r=fyko+d2lbbFgONRv9qkxdawL",
        ),
        (b"SCRAM-SHA256", b"n,,n=app,r=abc"),
        (b"SCRAM-SHA1", b"n,,n=app,r=abc"),
    ] {
        let mut c = open.client();
        let r = c.request(
            RequestBuilder::new(Opcode::SaslAuth)
                .key(mechanism)
                .value(data),
        );
        assert_eq!(r.status, 0, "{}", String::from_utf8_lossy(mechanism));
        assert!(r.value.is_empty(), "no SCRAM exchange: {r:?}");
        assert_eq!(select(&mut c, "default"), 0);
        assert_eq!(set(&mut c, b"open").status, 0);
        assert_eq!(get(&mut c, b"open").status, 0);
    }
    // A message of no known shape is still refused, and the connection stays usable.
    let mut c = open.client();
    let r = c.request(
        RequestBuilder::new(Opcode::SaslAuth)
            .key(b"PLAIN")
            .value(b"no separators"),
    );
    assert_eq!(r.status, Status::Einval.as_u16());
    let r = c.request(
        RequestBuilder::new(Opcode::SaslAuth)
            .key(b"GSSAPI")
            .value(b"x"),
    );
    assert_ne!(r.status, 0);
    assert_eq!(select(&mut c, "default"), 0);

    // With users configured, an unknown user or a wrong password is refused as before.
    let (s, _users) = server(&[("reader", "data_reader[default]")]);
    for plain in [&b"\0anyone\0anything"[..], b"\0reader\0wrong"] {
        let mut c = s.client();
        let r = c.request(
            RequestBuilder::new(Opcode::SaslAuth)
                .key(b"PLAIN")
                .value(plain),
        );
        assert_eq!(r.status, Status::AuthError.as_u16());
    }
}
