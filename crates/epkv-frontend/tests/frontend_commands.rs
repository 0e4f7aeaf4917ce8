//! Command dispatch through a real front end over TCP, against the fake engine.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failure is a test failure"
)]

mod common;

use common::{Client, FAKE_VBUCKET_UUID, TestServer, set_req};
use epkv_frontend::FrontendConfig;
use epkv_protocol::{Feature, Opcode, RequestBuilder};
use epkv_types::{Cas, Datatype, NUM_VBUCKETS, Vbid, vbucket_for_key};
use std::collections::HashMap;
use std::sync::atomic::Ordering;

fn hello(c: &mut Client, features: &[u16]) -> Vec<u16> {
    let value: Vec<u8> = features.iter().flat_map(|f| f.to_be_bytes()).collect();
    let r = c.request(
        RequestBuilder::new(Opcode::Hello)
            .key(b"test-agent")
            .value(&value),
    );
    assert_eq!(r.status, 0);
    r.value
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect()
}

fn stats(c: &mut Client, group: &[u8]) -> Result<HashMap<String, String>, u16> {
    c.send_req(RequestBuilder::new(Opcode::Stat).key(group).opaque(77));
    let mut out = HashMap::new();
    for _ in 0..100_000 {
        let r = c.recv();
        assert_eq!(r.opaque, 77);
        if r.status != 0 {
            return Err(r.status);
        }
        if r.key.is_empty() {
            return Ok(out);
        }
        out.insert(
            String::from_utf8(r.key).unwrap(),
            String::from_utf8(r.value).unwrap(),
        );
    }
    panic!("STAT never terminated");
}

#[test]
fn set_then_get_and_getk_return_value_flags_and_cas() {
    let server = TestServer::start();
    let mut c = server.client();
    let miss = c.request(RequestBuilder::new(Opcode::Get).key(b"a").opaque(1));
    assert_eq!((miss.status, miss.opaque, miss.cas), (0x01, 1, 0));
    assert!(miss.key.is_empty());

    c.send(&set_req(b"a", b"hello", 0xdead_beef));
    let set = c.recv();
    assert_eq!(set.status, 0);
    assert_ne!(set.cas, 0);
    assert!(set.extras.is_empty(), "no MutationSeqno negotiated");

    let get = c.request(RequestBuilder::new(Opcode::Get).key(b"a"));
    assert_eq!(get.status, 0);
    assert_eq!(get.extras, 0xdead_beef_u32.to_be_bytes());
    assert_eq!(get.value, b"hello");
    assert_eq!(get.cas, set.cas);
    assert!(get.key.is_empty());

    let getk = c.request(RequestBuilder::new(Opcode::GetK).key(b"a"));
    assert_eq!((getk.status, getk.key.as_slice()), (0, &b"a"[..]));

    let getk_miss = c.request(RequestBuilder::new(Opcode::GetK).key(b"zz"));
    assert_eq!(
        (getk_miss.status, getk_miss.key.as_slice()),
        (0x01, &b"zz"[..])
    );
}

#[test]
fn quiet_variants_answer_only_when_they_must() {
    let server = TestServer::start();
    let mut c = server.client();
    c.send(&set_req(b"present", b"v", 0));
    assert_eq!(c.recv().status, 0);

    let mut batch = Vec::new();
    let mut push = |b: RequestBuilder<'_>| batch.extend(b.to_vec().unwrap());
    push(RequestBuilder::new(Opcode::GetQ).key(b"missing").opaque(1));
    push(RequestBuilder::new(Opcode::GetKQ).key(b"present").opaque(2));
    push(
        RequestBuilder::new(Opcode::SetQ)
            .extras(&[0; 8])
            .key(b"q")
            .value(b"1")
            .opaque(3),
    );
    push(
        RequestBuilder::new(Opcode::DeleteQ)
            .key(b"missing")
            .opaque(4),
    );
    push(
        RequestBuilder::new(Opcode::AddQ)
            .extras(&[0; 8])
            .key(b"present")
            .value(b"x")
            .opaque(5),
    );
    push(
        RequestBuilder::new(Opcode::IncrementQ)
            .extras(&[0; 20])
            .key(b"ctr")
            .opaque(6),
    );
    push(
        RequestBuilder::new(Opcode::GatQ)
            .extras(&[0; 4])
            .key(b"missing")
            .opaque(7),
    );
    push(
        RequestBuilder::new(Opcode::AppendQ)
            .key(b"missing")
            .value(b"x")
            .opaque(8),
    );
    push(
        RequestBuilder::new(Opcode::ReplaceQ)
            .extras(&[0; 8])
            .key(b"q")
            .value(b"2")
            .opaque(9),
    );
    push(RequestBuilder::new(Opcode::Noop).opaque(10));
    c.send(&batch);

    let got: Vec<(u32, u16)> = (0..5)
        .map(|_| c.recv())
        .map(|r| (r.opaque, r.status))
        .collect();
    assert_eq!(got, vec![(2, 0), (4, 0x01), (5, 0x02), (8, 0x05), (10, 0)]);
    let q = c.request(RequestBuilder::new(Opcode::Get).key(b"q"));
    assert_eq!(q.value, b"2");
}

#[test]
fn cas_mismatch_is_key_exists_and_cas_on_missing_key_is_not_found() {
    let server = TestServer::start();
    let mut c = server.client();
    c.send(&set_req(b"k", b"v1", 0));
    let cas = c.recv().cas;
    let stale = c.request(
        RequestBuilder::new(Opcode::Set)
            .extras(&[0; 8])
            .key(b"k")
            .value(b"v2")
            .cas(Cas(cas + 1)),
    );
    assert_eq!(stale.status, 0x02);
    let ok = c.request(
        RequestBuilder::new(Opcode::Set)
            .extras(&[0; 8])
            .key(b"k")
            .value(b"v2")
            .cas(Cas(cas)),
    );
    assert_eq!(ok.status, 0);
    let missing = c.request(
        RequestBuilder::new(Opcode::Set)
            .extras(&[0; 8])
            .key(b"nope")
            .value(b"v")
            .cas(Cas(5)),
    );
    assert_eq!(missing.status, 0x01);
}

#[test]
fn arithmetic_returns_the_counter_as_eight_bytes() {
    let server = TestServer::start();
    let mut c = server.client();
    let mut extras = [0u8; 20];
    extras[..8].copy_from_slice(&5u64.to_be_bytes());
    extras[8..16].copy_from_slice(&100u64.to_be_bytes());
    let created = c.request(
        RequestBuilder::new(Opcode::Increment)
            .extras(&extras)
            .key(b"n"),
    );
    assert_eq!(
        (created.status, created.value.as_slice()),
        (0, &100u64.to_be_bytes()[..])
    );
    let inc = c.request(
        RequestBuilder::new(Opcode::Increment)
            .extras(&extras)
            .key(b"n"),
    );
    assert_eq!(inc.value, 105u64.to_be_bytes());
    let dec = c.request(
        RequestBuilder::new(Opcode::Decrement)
            .extras(&extras)
            .key(b"n"),
    );
    assert_eq!(dec.value, 100u64.to_be_bytes());
    c.send(&set_req(b"text", b"abc", 0));
    c.recv();
    let bad = c.request(
        RequestBuilder::new(Opcode::Increment)
            .extras(&extras)
            .key(b"text"),
    );
    assert_eq!(bad.status, 0x06);
}

#[test]
fn hello_agrees_to_implemented_features_in_order_without_duplicates() {
    let server = TestServer::start();
    let mut c = server.client();
    let asked = [
        Feature::TcpNoDelay.as_u16(),
        Feature::Xerror.as_u16(),
        Feature::MutationSeqno.as_u16(),
        0xffff,
        Feature::Json.as_u16(),
        Feature::MutationSeqno.as_u16(),
        Feature::Tls.as_u16(),
        Feature::AltRequestSupport.as_u16(),
        Feature::SelectBucket.as_u16(),
    ];
    let agreed = hello(&mut c, &asked);
    assert_eq!(agreed, vec![0x03, 0x07, 0x04, 0x0b, 0x10, 0x08]);
    for f in &agreed {
        assert!(Feature::from_u16(*f).unwrap().is_implemented());
    }
}

#[test]
fn mutation_seqno_adds_uuid_and_seqno_extras_to_mutations() {
    let server = TestServer::start();
    let mut c = server.client();
    hello(&mut c, &[Feature::MutationSeqno.as_u16()]);
    let key = b"k1";
    let vb = vbucket_for_key(key, NUM_VBUCKETS);
    let set = c.request(
        RequestBuilder::new(Opcode::Set)
            .vbucket(vb)
            .extras(&[0; 8])
            .key(key)
            .value(b"v"),
    );
    assert_eq!(set.status, 0);
    assert_eq!(set.extras.len(), 16);
    assert_eq!(set.extras[..8], FAKE_VBUCKET_UUID.to_be_bytes());
    assert_ne!(set.extras[8..], [0; 8]);
    let del = c.request(RequestBuilder::new(Opcode::Delete).vbucket(vb).key(key));
    assert_eq!((del.status, del.extras.len()), (0, 16));
    assert_ne!(del.cas, 0, "HELLO clients get the tombstone's CAS");
    let mut extras = [0u8; 20];
    extras[..8].copy_from_slice(&1u64.to_be_bytes());
    let inc = c.request(
        RequestBuilder::new(Opcode::Increment)
            .vbucket(vb)
            .extras(&extras)
            .key(key),
    );
    assert_eq!((inc.status, inc.extras.len(), inc.value.len()), (0, 16, 8));
    // A new HELLO without the feature turns it off again.
    hello(&mut c, &[]);
    let set = c.request(
        RequestBuilder::new(Opcode::Set)
            .vbucket(vb)
            .extras(&[0; 8])
            .key(key)
            .value(b"v"),
    );
    assert!(set.extras.is_empty());
}

#[test]
fn json_datatype_is_returned_only_when_negotiated() {
    let server = TestServer::start();
    let key = b"doc";
    let vb = vbucket_for_key(key, NUM_VBUCKETS);
    let mut json = server.client();
    hello(&mut json, &[Feature::Json.as_u16()]);
    let set = json.request(
        RequestBuilder::new(Opcode::Set)
            .vbucket(vb)
            .datatype(Datatype::JSON)
            .extras(&[0; 8])
            .key(key)
            .value(b"{\"a\":1}"),
    );
    assert_eq!(set.status, 0);
    let r = json.request(RequestBuilder::new(Opcode::Get).vbucket(vb).key(key));
    assert_eq!(r.datatype, Datatype::JSON.0);
    let mut plain = server.client();
    let r = plain.request(RequestBuilder::new(Opcode::Get).key(key));
    assert_eq!((r.status, r.datatype), (0, 0));
}

#[test]
fn classic_clients_are_routed_to_the_keys_vbucket_and_hello_clients_are_not() {
    let server = TestServer::start();
    let key = b"k1";
    let vb = vbucket_for_key(key, NUM_VBUCKETS);
    assert_eq!(vb, Vbid(526));
    let mut classic = server.client();
    classic.send(&set_req(key, b"v", 0));
    assert_eq!(classic.recv().status, 0);
    assert_eq!(server.engine.vbids_for("store"), vec![vb]);

    let mut aware = server.client();
    hello(&mut aware, &[]);
    let wrong = aware.request(RequestBuilder::new(Opcode::Get).vbucket(Vbid(0)).key(key));
    assert_eq!(wrong.status, 0x07);
    let right = aware.request(RequestBuilder::new(Opcode::Get).vbucket(vb).key(key));
    assert_eq!((right.status, right.value.as_slice()), (0, &b"v"[..]));
}

#[test]
fn replica_and_dead_vbuckets_answer_not_my_vbucket() {
    let server = TestServer::start();
    let mut c = server.client();
    let key = b"k3";
    let vb = vbucket_for_key(key, NUM_VBUCKETS);
    c.send(&set_req(key, b"v", 0));
    assert_eq!(c.recv().status, 0);
    for (state, code) in [(2u32, 2u32), (4, 4)] {
        let r = c.request(
            RequestBuilder::new(Opcode::SetVbucket)
                .vbucket(vb)
                .extras(&state.to_be_bytes()),
        );
        assert_eq!(r.status, 0);
        let g = c.request(RequestBuilder::new(Opcode::GetVbucket).vbucket(vb));
        assert_eq!((g.status, g.value.as_slice()), (0, &code.to_be_bytes()[..]));
        assert_eq!(
            c.request(RequestBuilder::new(Opcode::Get).key(key)).status,
            0x07
        );
    }
    let r = c.request(
        RequestBuilder::new(Opcode::SetVbucket)
            .vbucket(vb)
            .extras(&1u32.to_be_bytes()),
    );
    assert_eq!(r.status, 0);
    assert_eq!(
        c.request(RequestBuilder::new(Opcode::Get).key(key)).status,
        0
    );
    let out_of_range = c.request(RequestBuilder::new(Opcode::GetVbucket).vbucket(Vbid(5000)));
    assert_eq!(out_of_range.status, 0x07);
}

#[test]
fn unknown_and_invalid_requests_get_an_error_and_the_connection_stays() {
    let server = TestServer::start();
    let mut c = server.client();
    let unknown = c.request(RequestBuilder::raw(0xee).opaque(9));
    assert_eq!(
        (unknown.status, unknown.opcode, unknown.opaque),
        (0x81, 0xee, 9)
    );
    assert!(
        !unknown.value.is_empty(),
        "error replies carry a short text"
    );
    let long_key = vec![b'x'; 251];
    let too_long = c.request(RequestBuilder::new(Opcode::Get).key(&long_key));
    assert_eq!(too_long.status, 0x04);
    let bad_extras = c.request(RequestBuilder::new(Opcode::Set).extras(&[0; 3]).key(b"k"));
    assert_eq!(bad_extras.status, 0x04);
    let not_implemented = c.request(RequestBuilder::new(Opcode::DelVbucket));
    assert_eq!(not_implemented.status, 0x81);
    assert_eq!(c.request(RequestBuilder::new(Opcode::Noop)).status, 0);
}

#[test]
fn stat_groups_default_timings_engine_and_unknown() {
    let server = TestServer::start();
    let mut c = server.client();
    for _ in 0..10 {
        c.request(RequestBuilder::new(Opcode::Get).key(b"x"));
    }
    let d = stats(&mut c, b"").unwrap();
    for k in [
        "pid",
        "uptime",
        "time",
        "version",
        "curr_connections",
        "total_connections",
        "rejected_conns",
        "max_connections",
        "threads",
        "fake_curr_items",
    ] {
        assert!(d.contains_key(k), "missing {k}");
    }
    assert_eq!(d["pid"], std::process::id().to_string());
    assert_eq!(d["curr_connections"], "1");
    assert_eq!(d["threads"], "2");

    let t = stats(&mut c, b"timings").unwrap();
    assert_eq!(t["cmd_get_count"], "10");
    for suffix in ["mean_us", "p50_us", "p90_us", "p99_us", "p999_us", "max_us"] {
        let v: f64 = t[&format!("cmd_get_{suffix}")].parse().unwrap();
        assert!(v >= 0.0);
    }
    assert!(stats(&mut c, b"vbucket").unwrap().contains_key("vb_0"));
    assert_eq!(stats(&mut c, b"no-such-group"), Err(0x01));
    assert_eq!(c.request(RequestBuilder::new(Opcode::Noop)).status, 0);
}

#[test]
fn version_noop_verbosity_and_flush_disabled() {
    let config = FrontendConfig {
        version: "9.9.9-test".into(),
        ..FrontendConfig::default()
    };
    let server = TestServer::with_config(config);
    let mut c = server.client();
    let v = c.request(RequestBuilder::new(Opcode::Version));
    assert_eq!((v.status, v.value.as_slice()), (0, &b"9.9.9-test"[..]));
    assert_eq!(c.request(RequestBuilder::new(Opcode::Noop)).status, 0);
    assert_eq!(
        c.request(RequestBuilder::new(Opcode::Verbosity).extras(&[0, 0, 0, 1]))
            .status,
        0
    );
    assert_eq!(c.request(RequestBuilder::new(Opcode::Flush)).status, 0x83);
    server.engine.flush_enabled.store(true, Ordering::Relaxed);
    c.send(&set_req(b"f", b"v", 0));
    c.recv();
    assert_eq!(c.request(RequestBuilder::new(Opcode::Flush)).status, 0);
    assert_eq!(
        c.request(RequestBuilder::new(Opcode::Get).key(b"f")).status,
        0x01
    );
    // FLUSHQ answers nothing on success.
    c.send_req(RequestBuilder::new(Opcode::FlushQ).opaque(1));
    assert_eq!(
        c.request(RequestBuilder::new(Opcode::Noop).opaque(2))
            .opaque,
        2
    );
}

#[test]
fn adjust_timeofday_needs_testing_mode() {
    let server = TestServer::start();
    let mut c = server.client();
    let r = c.request(RequestBuilder::new(Opcode::AdjustTimeofday).extras(&100i64.to_be_bytes()));
    assert_eq!(r.status, 0x83);
    assert_eq!(server.engine.time_offset.load(Ordering::Relaxed), 0);

    let testing = TestServer::with_config(FrontendConfig {
        testing: true,
        ..FrontendConfig::default()
    });
    let mut c = testing.client();
    let r = c.request(RequestBuilder::new(Opcode::AdjustTimeofday).extras(&100i64.to_be_bytes()));
    assert_eq!(r.status, 0);
    assert_eq!(testing.engine.time_offset.load(Ordering::Relaxed), 100);
}

#[test]
fn touch_gat_get_locked_and_unlock() {
    let server = TestServer::start();
    let mut c = server.client();
    c.send(&set_req(b"t", b"v", 7));
    c.recv();
    let touch = c.request(
        RequestBuilder::new(Opcode::Touch)
            .extras(&[0, 0, 0, 10])
            .key(b"t"),
    );
    assert_eq!(touch.status, 0);
    let gat = c.request(
        RequestBuilder::new(Opcode::Gat)
            .extras(&[0, 0, 0, 10])
            .key(b"t"),
    );
    assert_eq!(
        (gat.status, gat.value.as_slice(), gat.extras.as_slice()),
        (0, &b"v"[..], &7u32.to_be_bytes()[..])
    );
    let miss = c.request(
        RequestBuilder::new(Opcode::Gat)
            .extras(&[0, 0, 0, 10])
            .key(b"none"),
    );
    assert_eq!(miss.status, 0x01);

    // A classic client (no XERROR) gets the memcached codes kv_engine maps lock
    // outcomes to; a client that agreed to XERROR gets the precise ones.
    let mut x = server.client();
    hello(&mut x, &[Feature::Xerror.as_u16()]);
    // The HELLO client routes by vBucket itself.
    let vb = epkv_types::vbucket_for_key(b"t", epkv_types::NUM_VBUCKETS);
    for (xerror, c) in [(false, &mut c), (true, &mut x)] {
        let (locked_write, locked_getl, not_locked_code) = if xerror {
            (0x09, 0x09, 0x0e)
        } else {
            (0x02, 0x86, 0x86)
        };
        let locked = c.request(RequestBuilder::new(Opcode::GetLocked).key(b"t").vbucket(vb));
        assert_eq!(locked.status, 0);
        let write = c.request(
            RequestBuilder::new(Opcode::Set)
                .extras(&[0; 8])
                .key(b"t")
                .vbucket(vb)
                .value(b"w"),
        );
        assert_eq!(write.status, locked_write, "a locked key refuses writers");
        let again = c.request(RequestBuilder::new(Opcode::GetLocked).key(b"t").vbucket(vb));
        assert_eq!(again.status, locked_getl);
        let wrong = c.request(
            RequestBuilder::new(Opcode::UnlockKey)
                .key(b"t")
                .vbucket(vb)
                .cas(Cas(locked.cas + 1)),
        );
        assert_eq!(wrong.status, locked_getl);
        let unlock = c.request(
            RequestBuilder::new(Opcode::UnlockKey)
                .key(b"t")
                .vbucket(vb)
                .cas(Cas(locked.cas)),
        );
        assert_eq!(unlock.status, 0);
        let not_locked = c.request(
            RequestBuilder::new(Opcode::UnlockKey)
                .key(b"t")
                .vbucket(vb)
                .cas(Cas(locked.cas)),
        );
        assert_eq!(not_locked.status, not_locked_code, "xerror={xerror}");
    }
}

#[test]
fn append_prepend_add_replace_delete() {
    let server = TestServer::start();
    let mut c = server.client();
    assert_eq!(
        c.request(RequestBuilder::new(Opcode::Append).key(b"a").value(b"x"))
            .status,
        0x05
    );
    assert_eq!(
        c.request(
            RequestBuilder::new(Opcode::Replace)
                .extras(&[0; 8])
                .key(b"a")
                .value(b"x")
        )
        .status,
        0x01
    );
    assert_eq!(
        c.request(
            RequestBuilder::new(Opcode::Add)
                .extras(&[0; 8])
                .key(b"a")
                .value(b"mid")
        )
        .status,
        0
    );
    assert_eq!(
        c.request(
            RequestBuilder::new(Opcode::Add)
                .extras(&[0; 8])
                .key(b"a")
                .value(b"x")
        )
        .status,
        0x02
    );
    assert_eq!(
        c.request(RequestBuilder::new(Opcode::Append).key(b"a").value(b">"))
            .status,
        0
    );
    assert_eq!(
        c.request(RequestBuilder::new(Opcode::Prepend).key(b"a").value(b"<"))
            .status,
        0
    );
    assert_eq!(
        c.request(RequestBuilder::new(Opcode::Get).key(b"a")).value,
        b"<mid>"
    );
    assert_eq!(
        c.request(
            RequestBuilder::new(Opcode::Replace)
                .extras(&[0; 8])
                .key(b"a")
                .value(b"r")
        )
        .status,
        0
    );
    let del = c.request(RequestBuilder::new(Opcode::Delete).key(b"a"));
    assert_eq!(
        (del.status, del.cas),
        (0, 0),
        "classic clients get CAS 0, as from memcached"
    );
    assert_eq!(
        c.request(RequestBuilder::new(Opcode::Delete).key(b"a"))
            .status,
        0x01
    );
}

#[test]
fn quit_replies_then_closes_and_quitq_closes_silently() {
    let server = TestServer::start();
    let mut c = server.client();
    c.send_req(RequestBuilder::new(Opcode::Noop).opaque(1));
    c.send_req(RequestBuilder::new(Opcode::Quit).opaque(2));
    c.send_req(RequestBuilder::new(Opcode::Noop).opaque(3));
    let got: Vec<u32> = c.until_closed().iter().map(|r| r.opaque).collect();
    assert_eq!(got, vec![1, 2]);

    let mut c = server.client();
    c.send_req(RequestBuilder::new(Opcode::Noop).opaque(1));
    c.send_req(RequestBuilder::new(Opcode::QuitQ).opaque(2));
    let got: Vec<u32> = c.until_closed().iter().map(|r| r.opaque).collect();
    assert_eq!(got, vec![1]);
}
