//! Every command, including the quiet variants, against the real engine.

use crate::harness::{Server, key, skip_if_external};
use epkv_client::{Client, StoreOptions};
use epkv_protocol::{Feature, Opcode, RequestBuilder, Status};
use epkv_types::{Cas, Datatype};
use std::collections::HashMap;

fn status(r: &epkv_client::Response) -> Option<Status> {
    r.status()
}

async fn stats(c: &mut Client, group: &str) -> HashMap<String, String> {
    c.stat(group).await.unwrap().into_iter().collect()
}

#[tokio::test]
async fn get_set_getk_keep_value_flags_and_cas() {
    let server = Server::start();
    let mut c = server.client().await;
    let k = key("basic");
    assert_eq!(status(&c.get(&k).await.unwrap()), Some(Status::KeyEnoent));
    let set = c
        .set(&k, b"hello", StoreOptions::new().flags(0xcafe_f00d))
        .await
        .unwrap();
    assert!(set.is_success());
    assert_ne!(set.cas, Cas(0));
    let get = c.get(&k).await.unwrap();
    assert_eq!(
        (get.value.as_ref(), get.flags(), get.cas),
        (&b"hello"[..], Some(0xcafe_f00d), set.cas)
    );
    assert!(get.key.is_empty());
    let getk = c.getk(&k).await.unwrap();
    assert_eq!(getk.key.as_ref(), &k[..]);
    let big = vec![b'x'; 1024 * 1024];
    assert!(
        c.set(&k, &big, StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
    assert_eq!(c.get(&k).await.unwrap().value.len(), big.len());
}

#[tokio::test]
async fn add_replace_append_prepend_delete() {
    let server = Server::start();
    let mut c = server.client().await;
    let k = key("arapd");
    let o = StoreOptions::new;
    assert_eq!(
        status(&c.replace(&k, b"x", o()).await.unwrap()),
        Some(Status::KeyEnoent)
    );
    assert_eq!(
        status(&c.append(&k, b"x", o()).await.unwrap()),
        Some(Status::NotStored)
    );
    assert_eq!(
        status(&c.prepend(&k, b"x", o()).await.unwrap()),
        Some(Status::NotStored)
    );
    assert!(c.add(&k, b"mid", o().flags(3)).await.unwrap().is_success());
    assert_eq!(
        status(&c.add(&k, b"again", o()).await.unwrap()),
        Some(Status::KeyEexists)
    );
    assert!(c.append(&k, b">", o()).await.unwrap().is_success());
    assert!(c.prepend(&k, b"<", o()).await.unwrap().is_success());
    let g = c.get(&k).await.unwrap();
    assert_eq!((g.value.as_ref(), g.flags()), (&b"<mid>"[..], Some(3)));
    assert!(c.replace(&k, b"r", o()).await.unwrap().is_success());
    assert_eq!(c.get(&k).await.unwrap().value.as_ref(), b"r");
    let del = c.delete(&k, Cas::ANY).await.unwrap();
    assert!(del.is_success());
    assert_eq!(
        status(&c.delete(&k, Cas::ANY).await.unwrap()),
        Some(Status::KeyEnoent)
    );
    assert_eq!(status(&c.get(&k).await.unwrap()), Some(Status::KeyEnoent));
}

#[tokio::test]
async fn cas_conflicts() {
    let server = Server::start();
    let mut c = server.client().await;
    let k = key("cas");
    let first = c.set(&k, b"1", StoreOptions::new()).await.unwrap();
    let stale = Cas(first.cas.0.wrapping_add(1));
    let r = c
        .set(&k, b"2", StoreOptions::new().cas(stale))
        .await
        .unwrap();
    assert_eq!(status(&r), Some(Status::KeyEexists));
    let r = c
        .replace(&k, b"2", StoreOptions::new().cas(stale))
        .await
        .unwrap();
    assert_eq!(status(&r), Some(Status::KeyEexists));
    assert_eq!(
        status(&c.delete(&k, stale).await.unwrap()),
        Some(Status::KeyEexists)
    );
    let second = c
        .set(&k, b"2", StoreOptions::new().cas(first.cas))
        .await
        .unwrap();
    assert!(second.is_success());
    assert_ne!(second.cas, first.cas);
    // The old CAS is stale now.
    let r = c
        .set(&k, b"3", StoreOptions::new().cas(first.cas))
        .await
        .unwrap();
    assert_eq!(status(&r), Some(Status::KeyEexists));
    // A CAS on a missing key is "not found".
    let missing = key("cas-missing");
    let r = c
        .set(&missing, b"v", StoreOptions::new().cas(first.cas))
        .await
        .unwrap();
    assert_eq!(status(&r), Some(Status::KeyEnoent));
    assert_eq!(c.get(&k).await.unwrap().value.as_ref(), b"2");
}

#[tokio::test]
async fn increment_and_decrement() {
    let server = Server::start();
    let mut c = server.client().await;
    let k = key("ctr");
    let r = c.incr(&k, 1, 10, 0).await.unwrap();
    assert_eq!(
        r.counter(),
        Some(10),
        "a missing key is created with the initial value"
    );
    assert_eq!(c.incr(&k, 5, 0, 0).await.unwrap().counter(), Some(15));
    assert_eq!(
        c.decr(&k, 20, 0, 0).await.unwrap().counter(),
        Some(0),
        "decrement stops at 0"
    );
    assert_eq!(c.get(&k).await.unwrap().value.as_ref(), b"0");
    c.set(&k, b"18446744073709551615", StoreOptions::new())
        .await
        .unwrap();
    assert_eq!(
        c.incr(&k, 2, 0, 0).await.unwrap().counter(),
        Some(1),
        "increment wraps at 2^64"
    );
    let none = key("ctr-none");
    let r = c.incr(&none, 1, 0, 0xffff_ffff).await.unwrap();
    assert_eq!(
        status(&r),
        Some(Status::KeyEnoent),
        "expiry 0xffffffff means do not create"
    );
    let text = key("ctr-text");
    c.set(&text, b"abc", StoreOptions::new()).await.unwrap();
    assert_eq!(
        status(&c.incr(&text, 1, 0, 0).await.unwrap()),
        Some(Status::DeltaBadval)
    );
}

#[tokio::test]
async fn quiet_variants_answer_only_failures_or_hits() {
    let server = Server::start();
    let mut c = server.client().await;
    let present = key("q-present");
    let missing = key("q-missing");
    let q = key("q-set");
    let ctr = key("q-ctr");
    c.set(&present, b"v", StoreOptions::new()).await.unwrap();
    let extras8 = [0u8; 8];
    let mut arith = [0u8; 20];
    arith[..8].copy_from_slice(&1u64.to_be_bytes());
    let vb = |k: &[u8]| c.vbucket_for(k);
    let (vp, vm, vq, vc) = (vb(&present), vb(&missing), vb(&q), vb(&ctr));
    let reqs = [
        RequestBuilder::new(Opcode::GetQ).vbucket(vm).key(&missing),
        RequestBuilder::new(Opcode::GetKQ).vbucket(vp).key(&present),
        RequestBuilder::new(Opcode::GetKQ).vbucket(vm).key(&missing),
        RequestBuilder::new(Opcode::SetQ)
            .vbucket(vq)
            .extras(&extras8)
            .key(&q)
            .value(b"1"),
        RequestBuilder::new(Opcode::AddQ)
            .vbucket(vp)
            .extras(&extras8)
            .key(&present)
            .value(b"x"),
        RequestBuilder::new(Opcode::ReplaceQ)
            .vbucket(vq)
            .extras(&extras8)
            .key(&q)
            .value(b"2"),
        RequestBuilder::new(Opcode::AppendQ)
            .vbucket(vq)
            .key(&q)
            .value(b"3"),
        RequestBuilder::new(Opcode::PrependQ)
            .vbucket(vm)
            .key(&missing)
            .value(b"0"),
        RequestBuilder::new(Opcode::IncrementQ)
            .vbucket(vc)
            .extras(&arith)
            .key(&ctr),
        RequestBuilder::new(Opcode::DecrementQ)
            .vbucket(vc)
            .extras(&arith)
            .key(&ctr),
        RequestBuilder::new(Opcode::DeleteQ)
            .vbucket(vm)
            .key(&missing),
        RequestBuilder::new(Opcode::GatQ)
            .vbucket(vm)
            .extras(&[0; 4])
            .key(&missing),
        RequestBuilder::new(Opcode::GatQ)
            .vbucket(vp)
            .extras(&[0; 4])
            .key(&present),
        RequestBuilder::new(Opcode::Noop),
    ];
    let mut opaques = Vec::new();
    for r in reqs {
        opaques.push(c.queue(r).unwrap());
    }
    let expected = [
        (opaques[1], Status::Success),    // GETKQ hit
        (opaques[4], Status::KeyEexists), // ADDQ on an existing key
        (opaques[7], Status::NotStored),  // PREPENDQ on a missing key
        (opaques[10], Status::KeyEnoent), // DELETEQ on a missing key
        (opaques[12], Status::Success),   // GATQ hit
        (opaques[13], Status::Success),   // NOOP
    ];
    let got = c.flush_and_recv(expected.len()).await.unwrap();
    let got: Vec<(u32, Option<Status>)> = got.iter().map(|r| (r.opaque, r.status())).collect();
    let expected: Vec<(u32, Option<Status>)> =
        expected.iter().map(|(o, s)| (*o, Some(*s))).collect();
    assert_eq!(got, expected);
    assert_eq!(c.get(&q).await.unwrap().value.as_ref(), b"23");
    assert_eq!(c.get(&ctr).await.unwrap().value.as_ref(), b"0");
}

#[tokio::test]
async fn touch_gat_and_gatq() {
    let server = Server::start();
    let mut c = server.client().await;
    let k = key("touch");
    assert_eq!(
        status(&c.touch(&k, 100).await.unwrap()),
        Some(Status::KeyEnoent)
    );
    assert_eq!(
        status(&c.gat(&k, 100).await.unwrap()),
        Some(Status::KeyEnoent)
    );
    c.set(&k, b"v", StoreOptions::new().flags(9)).await.unwrap();
    let t = c.touch(&k, 100).await.unwrap();
    assert!(t.is_success());
    let g = c.gat(&k, 200).await.unwrap();
    assert_eq!((g.value.as_ref(), g.flags()), (&b"v"[..], Some(9)));
}

#[tokio::test]
async fn get_locked_and_unlock() {
    let server = Server::start();
    let mut c = server.client().await;
    let k = key("lock");
    // Clients that agreed to XERROR get the precise lock codes (0x09, 0x0e).
    c.hello("e2e", &[Feature::Xerror]).await.unwrap();
    assert_eq!(
        status(&c.get_locked(&k, 5).await.unwrap()),
        Some(Status::KeyEnoent)
    );
    c.set(&k, b"v", StoreOptions::new()).await.unwrap();
    let locked = c.get_locked(&k, 5).await.unwrap();
    assert!(locked.is_success());
    assert_eq!(locked.value.as_ref(), b"v");
    let mut other = server.client().await;
    other.hello("e2e", &[Feature::Xerror]).await.unwrap();
    let w = other.set(&k, b"w", StoreOptions::new()).await.unwrap();
    assert_eq!(
        status(&w),
        Some(Status::Locked),
        "a locked key answers 0x09 to writers"
    );
    assert_eq!(
        status(&other.get_locked(&k, 5).await.unwrap()),
        Some(Status::Locked)
    );
    let g = other.get(&k).await.unwrap();
    assert_eq!(g.value.as_ref(), b"v", "reads still work");
    assert_ne!(g.cas, locked.cas, "readers do not see the lock CAS");
    let wrong = c.unlock(&k, Cas(locked.cas.0 ^ 1)).await.unwrap();
    assert_eq!(status(&wrong), Some(Status::Locked));
    assert!(c.unlock(&k, locked.cas).await.unwrap().is_success());
    assert_eq!(
        status(&c.unlock(&k, locked.cas).await.unwrap()),
        Some(Status::NotLocked)
    );
    assert!(
        other
            .set(&k, b"w", StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
    // A CAS write with the lock's CAS is allowed and releases the lock.
    let locked = c.get_locked(&k, 5).await.unwrap();
    let w = c
        .set(&k, b"x", StoreOptions::new().cas(locked.cas))
        .await
        .unwrap();
    assert!(w.is_success());
    assert!(
        other
            .set(&k, b"y", StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
}

#[tokio::test]
async fn noop_version_verbosity_and_unknown_opcodes() {
    let server = Server::start();
    let mut c = server.client().await;
    c.noop().await.unwrap();
    let v = c.version().await.unwrap();
    // Clients parse a leading major.minor.micro and libmemcached refuses major 0.
    let mut parts = v.splitn(3, '.');
    let major: u32 = parts.next().unwrap().parse().unwrap();
    let minor: u32 = parts.next().unwrap().parse().unwrap();
    let micro = parts.next().unwrap();
    assert!(major >= 1 && minor < 256, "{v}");
    assert!(micro.starts_with(|c: char| c.is_ascii_digit()), "{v}");
    assert!(v.contains("-epkv-"), "{v}");
    let verbosity = c
        .request(RequestBuilder::new(Opcode::Verbosity).extras(&[0, 0, 0, 2]))
        .await
        .unwrap();
    assert!(verbosity.is_success());
    let unknown = c.request(RequestBuilder::raw(0xee)).await.unwrap();
    assert_eq!(
        (status(&unknown), unknown.opcode),
        (Some(Status::UnknownCommand), 0xee)
    );
    let replica = c
        .request(RequestBuilder::new(Opcode::GetReplica).key(b"k"))
        .await
        .unwrap();
    assert_eq!(
        status(&replica),
        Some(Status::NotMyVbucket),
        "a single node holds no replica vBuckets"
    );
    c.noop().await.unwrap();
}

#[tokio::test]
async fn stat_groups() {
    let server = Server::start();
    let mut c = server.client().await;
    let k = key("stat");
    c.set(&k, b"v", StoreOptions::new()).await.unwrap();
    for _ in 0..5 {
        c.get(&k).await.unwrap();
    }
    let d = stats(&mut c, "").await;
    for name in [
        "pid",
        "uptime",
        "time",
        "version",
        "curr_connections",
        "total_connections",
        "rejected_conns",
        "threads",
        "curr_items",
    ] {
        assert!(d.contains_key(name), "default group lacks {name}: {d:?}");
    }
    if let Some(pid) = server.pid() {
        assert_eq!(d["pid"], pid.to_string());
    }
    let t = stats(&mut c, "timings").await;
    assert!(t["cmd_get_count"].parse::<u64>().unwrap() >= 5);
    assert!(t.contains_key("cmd_get_p99_us") && t.contains_key("cmd_set_max_us"));
    assert!(stats(&mut c, "memory").await.contains_key("mem_used"));
    let vb = stats(&mut c, "vbucket").await;
    assert_eq!(vb["vb_0"], "active");
    assert_eq!(vb.len(), 1024);
    let err = c.stat("no-such-group").await.unwrap_err();
    assert!(
        matches!(err, epkv_client::Error::Status { status: 0x01, .. }),
        "{err:?}"
    );
    c.noop().await.unwrap();
}

#[tokio::test]
async fn hello_negotiates_implemented_features() {
    let server = Server::start();
    let mut c = server.client().await;
    let asked = [
        Feature::TcpNoDelay,
        Feature::MutationSeqno,
        Feature::Xerror,
        Feature::SelectBucket,
        Feature::Json,
        Feature::Snappy,
        // Not implemented: left out of the answer.
        Feature::Tracing,
        Feature::AltRequestSupport,
        Feature::PreserveTtl,
        Feature::TcpNoDelay,
    ];
    let agreed = c.hello("e2e", &asked).await.unwrap();
    assert_eq!(agreed, vec![0x03, 0x04, 0x07, 0x08, 0x0b, 0x0a, 0x10, 0x14]);
    let k = key("hello");
    let set = c
        .set(
            &k,
            b"{\"a\":1}",
            StoreOptions::new().datatype(Datatype::JSON),
        )
        .await
        .unwrap();
    let (uuid, seqno) = set
        .mutation_token()
        .expect("MutationSeqno gives 16 bytes of extras");
    assert!(seqno.0 > 0);
    let del = c.delete(&k, Cas::ANY).await.unwrap();
    let (uuid2, seqno2) = del.mutation_token().unwrap();
    assert_eq!(uuid, uuid2);
    assert!(seqno2 > seqno);
}

#[tokio::test]
async fn json_datatype_is_stripped_unless_negotiated() {
    let server = Server::start();
    let k = key("json");
    let mut json = server.client().await;
    json.hello("e2e", &[Feature::Json]).await.unwrap();
    let r = json
        .set(
            &k,
            b"{\"a\":1}",
            StoreOptions::new().datatype(Datatype::JSON),
        )
        .await
        .unwrap();
    assert!(r.is_success());
    assert_eq!(json.get(&k).await.unwrap().datatype, Datatype::JSON);
    let mut plain = server.client().await;
    assert_eq!(plain.get(&k).await.unwrap().datatype, Datatype::RAW);
}

#[tokio::test]
async fn durability_majority_commits_at_once() {
    use epkv_protocol::DurabilityRequirement;
    use epkv_types::DurabilityLevel;
    let server = Server::start();
    let mut c = server.client().await;
    // Durability outcomes are XERROR codes: a client must agree to XERROR to see them
    // (without it, kv_engine and epkv close the connection instead).
    c.hello("e2e", &[Feature::Xerror]).await.unwrap();
    let k = key("durable");
    let majority = DurabilityRequirement {
        level: DurabilityLevel::Majority,
        timeout: None,
    };
    let r = c
        .set(&k, b"v", StoreOptions::new().durability(majority))
        .await
        .unwrap();
    assert!(r.is_success(), "{r:?}");
    assert_eq!(&c.get(&k).await.unwrap().value[..], b"v");
    // The persist levels: durability.rs.
}

#[tokio::test]
async fn quit_replies_then_closes_and_quitq_closes_silently() {
    let server = Server::start();
    let c = server.client().await;
    c.quit().await.unwrap();
    let mut c = server.client().await;
    c.queue(RequestBuilder::new(Opcode::Noop)).unwrap();
    c.queue(RequestBuilder::new(Opcode::QuitQ)).unwrap();
    let got = c.flush_and_recv(1).await.unwrap();
    assert!(got[0].is_success());
    c.wait_closed().await.unwrap();
}

#[tokio::test]
async fn flush_empties_the_bucket_when_enabled_and_is_refused_otherwise() {
    if skip_if_external("flush") {
        return;
    }
    let server = Server::spawn(&[]);
    let mut c = server.client().await;
    let k = key("flush");
    c.set(&k, b"v", StoreOptions::new()).await.unwrap();
    assert!(c.flush_all().await.unwrap().is_success());
    assert_eq!(status(&c.get(&k).await.unwrap()), Some(Status::KeyEnoent));
    let flushq = c.queue(RequestBuilder::new(Opcode::FlushQ)).unwrap();
    let noop = c.queue(RequestBuilder::new(Opcode::Noop)).unwrap();
    let got = c.flush_and_recv(1).await.unwrap();
    assert_eq!(
        got[0].opaque, noop,
        "FLUSHQ is silent on success (opaque {flushq})"
    );

    let disabled = Server::spawn_exact(&["--port", "0"]);
    let mut c = disabled.client().await;
    c.set(&k, b"v", StoreOptions::new()).await.unwrap();
    assert_eq!(
        status(&c.flush_all().await.unwrap()),
        Some(Status::NotSupported)
    );
    assert!(c.get(&k).await.unwrap().is_success());
}
