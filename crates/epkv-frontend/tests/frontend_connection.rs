//! Connection handling through a real front end: pipelining, backpressure, malformed
//! input, connection limit, idle timeout and graceful shutdown.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failure is a test failure"
)]

mod common;

use common::{Client, TestServer, set_req};
use epkv_frontend::{Frontend, FrontendConfig, FrontendError};
use epkv_protocol::{Opcode, RequestBuilder};
use epkv_types::{NUM_VBUCKETS, Vbid, vbucket_for_key};
use std::io::{Read, Write};
use std::net::Shutdown;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

fn noop_round_trip(c: &mut Client) {
    let r = c.request(RequestBuilder::new(Opcode::Noop).opaque(0xabc));
    assert_eq!((r.status, r.opaque), (0, 0xabc));
}

#[test]
fn a_thousand_pipelined_requests_in_one_write_are_answered_in_order() {
    let server = TestServer::start();
    let mut c = server.client();
    c.send(&set_req(b"present", b"value", 0));
    c.recv();
    let mut batch = Vec::new();
    for i in 0..1000u32 {
        let key: &[u8] = if i % 3 == 0 { b"missing" } else { b"present" };
        let op = if i % 2 == 0 {
            Opcode::Get
        } else {
            Opcode::GetK
        };
        batch.extend(RequestBuilder::new(op).key(key).opaque(i).to_vec().unwrap());
    }
    c.send(&batch);
    for i in 0..1000u32 {
        let r = c.recv();
        assert_eq!(r.opaque, i);
        assert_eq!(r.status, if i % 3 == 0 { 0x01 } else { 0 });
    }
}

/// While it runs a request, the front end hints the engine about the next ones in its
/// buffer: the key of the next key-value request (as the engine key) and the vBucket of
/// the one after. Other requests, vBuckets out of range
/// and answers are unaffected.
#[test]
fn pipelined_requests_hint_the_engine_about_the_next_keys() {
    let server = TestServer::start();
    let mut c = server.client();
    // A HELLO makes the connection vBucket-aware: the vBuckets given are used.
    c.send(
        &RequestBuilder::new(Opcode::Hello)
            .key(b"test")
            .to_vec()
            .unwrap(),
    );
    assert_eq!(c.recv().status, 0);
    let key = |i: u32| format!("key-{i}").into_bytes();
    let mut batch = Vec::new();
    for i in 0..300u32 {
        let k = key(i);
        let req = match i % 3 {
            0 => RequestBuilder::new(Opcode::Get)
                .key(&k)
                .vbucket(vbucket_for_key(&k, NUM_VBUCKETS)),
            // A vBucket out of range: NotMyVbucket, and no harm from its hints.
            1 => RequestBuilder::new(Opcode::Get)
                .key(&k)
                .vbucket(Vbid(u16::MAX)),
            _ => RequestBuilder::new(Opcode::Noop),
        };
        batch.extend(req.opaque(i).to_vec().unwrap());
    }
    c.send(&batch);
    for i in 0..300u32 {
        let r = c.recv();
        assert_eq!(r.opaque, i);
        let want = [0x01, 0x07, 0][i as usize % 3];
        assert_eq!(r.status, want, "request {i}");
    }
    let hints = server.engine.prefetched.lock().clone();
    // Every key hint is a GET of the batch, in the default collection, with its vBucket;
    // NOOPs give none.
    let mut keys = 0;
    for (vbid, k) in &hints {
        if let Some(k) = k {
            // A default-collection engine key is the key itself.
            let raw = &k[..];
            let i: u32 = std::str::from_utf8(&raw[4..]).unwrap().parse().unwrap();
            assert_ne!(i % 3, 2, "a NOOP has no key");
            let want = if i.is_multiple_of(3) {
                vbucket_for_key(raw, NUM_VBUCKETS)
            } else {
                Vbid(u16::MAX)
            };
            assert_eq!(*vbid, want);
            keys += 1;
        }
    }
    // Nearly all of them arrive with a request before them in the same read.
    assert!(keys > 100, "{keys} key hints of 200 keyed requests");
    assert!(hints.len() > keys, "vBucket hints too");

    // A client that never said HELLO sends vBucket 0 and gets the key's vBucket: so do
    // the hints.
    server.engine.prefetched.lock().clear();
    let mut plain = server.client();
    let mut batch = Vec::new();
    for i in 0..100u32 {
        batch.extend(
            RequestBuilder::new(Opcode::Get)
                .key(&key(i))
                .opaque(i)
                .to_vec()
                .unwrap(),
        );
    }
    plain.send(&batch);
    for i in 0..100u32 {
        assert_eq!((plain.recv().opaque, i), (i, i));
    }
    let hints = server.engine.prefetched.lock().clone();
    assert!(hints.len() > 100, "{} hints", hints.len());
    for (vbid, k) in hints {
        if let Some(k) = k {
            assert_eq!(vbid, vbucket_for_key(&k, NUM_VBUCKETS));
        }
    }
}

#[test]
fn hello_pipelined_with_other_requests_is_answered_in_order() {
    let server = TestServer::start();
    let mut c = server.client();
    let mut batch = RequestBuilder::new(Opcode::Hello)
        .value(&[0, 4])
        .opaque(1)
        .to_vec()
        .unwrap();
    batch.extend(RequestBuilder::raw(0x20).opaque(2).to_vec().unwrap());
    // libcouchbase's order: the error map (v1) before any reply.
    batch.extend(
        RequestBuilder::new(Opcode::GetErrorMap)
            .value(&[0, 1])
            .opaque(3)
            .to_vec()
            .unwrap(),
    );
    batch.extend(
        RequestBuilder::new(Opcode::Noop)
            .opaque(4)
            .to_vec()
            .unwrap(),
    );
    c.send(&batch);
    let replies: Vec<_> = (0..4).map(|_| c.recv()).collect();
    let got: Vec<(u32, u16)> = replies.iter().map(|r| (r.opaque, r.status)).collect();
    assert_eq!(got, vec![(1, 0), (2, 0), (3, 0), (4, 0)]);
    assert_eq!(
        replies[1].value,
        b"SCRAM-SHA512 SCRAM-SHA256 SCRAM-SHA1 PLAIN"
    );
    assert!(replies[2].value.starts_with(b"{\"version\":1,"));
}

#[test]
fn a_client_that_stops_reading_is_throttled_and_others_keep_being_served() {
    let config = FrontendConfig {
        output_buffer_limit: 64 * 1024,
        ..FrontendConfig::default()
    };
    let server = TestServer::with_config(config);
    let value = vec![b'v'; 256 * 1024];
    let mut writer = server.client();
    writer.send(&set_req(b"big", &value, 0));
    assert_eq!(writer.recv().status, 0);

    // 400 GETs of a 256 KiB value: 100 MiB of replies that the client does not read.
    let mut slow = server.client();
    let get = RequestBuilder::new(Opcode::Get)
        .key(b"big")
        .to_vec()
        .unwrap();
    let requests = 400u32;
    let mut batch = Vec::new();
    for i in 0..requests {
        let mut g = get.clone();
        g[12..16].copy_from_slice(&i.to_be_bytes());
        batch.extend(g);
    }
    slow.send(&batch);

    // Other connections are served while the slow one is stuck.
    for _ in 0..20 {
        let mut other = server.client();
        noop_round_trip(&mut other);
        let r = other.request(RequestBuilder::new(Opcode::Get).key(b"big"));
        assert_eq!(r.value.len(), value.len());
    }

    // When the client reads, everything arrives, in order.
    for i in 0..requests {
        let r = slow.recv();
        assert_eq!((r.opaque, r.status, r.value.len()), (i, 0, value.len()));
    }
    noop_round_trip(&mut slow);
}

#[test]
fn untrusted_headers_close_only_their_connection() {
    let server = TestServer::start();
    let mut bystander = server.client();
    noop_round_trip(&mut bystander);

    // Unknown magic.
    let mut c = server.client();
    noop_round_trip(&mut c);
    let mut pkt = RequestBuilder::new(Opcode::Noop).to_vec().unwrap();
    pkt[0] = 0x42;
    c.send(&pkt);
    assert!(c.until_closed().is_empty());

    // A body length of 4 GiB - 1.
    let mut c = server.client();
    let mut pkt = RequestBuilder::new(Opcode::Get).key(b"k").to_vec().unwrap();
    pkt[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
    c.send(&pkt);
    assert!(c.until_closed().is_empty());

    // Key length larger than the body length.
    let mut c = server.client();
    let mut pkt = RequestBuilder::new(Opcode::Get).key(b"k").to_vec().unwrap();
    pkt[2..4].copy_from_slice(&200u16.to_be_bytes());
    c.send(&pkt);
    assert!(c.until_closed().is_empty());

    // The text protocol, shorter than a header: told apart by its first byte.
    let mut c = server.client();
    c.send(b"get foo\r\n");
    assert!(c.until_closed().is_empty());

    // A response magic sent to the server.
    let mut c = server.client();
    let mut pkt = RequestBuilder::new(Opcode::Noop).to_vec().unwrap();
    pkt[0] = 0x81;
    c.send(&pkt);
    assert!(c.until_closed().is_empty());

    // Replies queued before the bad packet are still delivered.
    let mut c = server.client();
    let mut pkt = RequestBuilder::new(Opcode::Noop)
        .opaque(5)
        .to_vec()
        .unwrap();
    pkt.extend(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    c.send(&pkt);
    let got = c.until_closed();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].opaque, 5);

    noop_round_trip(&mut bystander);
}

#[test]
fn a_truncated_header_waits_and_closes_when_the_client_does() {
    let server = TestServer::start();
    let mut c = server.client();
    let pkt = RequestBuilder::new(Opcode::Noop).to_vec().unwrap();
    c.send(&pkt[..10]);
    c.stream.shutdown(Shutdown::Write).unwrap();
    assert!(c.until_closed().is_empty());
    noop_round_trip(&mut server.client());
}

#[test]
fn garbage_bytes_are_answered_or_closed_and_others_are_unaffected() {
    let server = TestServer::start();
    let mut bystander = server.client();
    // A deterministic pseudo-random byte stream (xorshift), in several flavours.
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for round in 0..50 {
        let mut c = server.client();
        let mut bytes = Vec::with_capacity(4096);
        for _ in 0..4096 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            bytes.push(seed as u8);
        }
        if round % 2 == 0 {
            bytes[0] = 0x80; // starts like a request
        }
        c.send(&bytes);
        c.stream.shutdown(Shutdown::Write).unwrap();
        let replies = c.until_closed();
        assert!(replies.len() <= bytes.len() / 24);
    }
    noop_round_trip(&mut bystander);
}

#[test]
fn connections_over_the_limit_are_closed_and_counted() {
    let config = FrontendConfig {
        max_connections: 2,
        ..FrontendConfig::default()
    };
    let server = TestServer::with_config(config);
    let mut a = server.client();
    let mut b = server.client();
    noop_round_trip(&mut a);
    noop_round_trip(&mut b);
    let mut c = server.client();
    c.send(&RequestBuilder::new(Opcode::Noop).to_vec().unwrap());
    assert!(c.until_closed().is_empty());

    c = server.client();
    assert!(c.until_closed().is_empty());
    drop(b);
    // A freed slot becomes usable again (the close is seen by the worker asynchronously).
    let mut served = false;
    for _ in 0..200 {
        let mut d = server.client();
        d.send(&RequestBuilder::new(Opcode::Noop).to_vec().unwrap());
        if d.try_recv().is_some() {
            served = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(served, "a slot never became free");
    a.send(&RequestBuilder::new(Opcode::Stat).to_vec().unwrap());
    let mut rejected = None;
    for _ in 0..100 {
        let r = a.recv();
        if r.key.is_empty() {
            break;
        }
        if r.key == b"rejected_conns" {
            rejected = Some(String::from_utf8(r.value).unwrap().parse::<u64>().unwrap());
        }
    }
    assert!(rejected.unwrap() >= 2);
}

#[test]
fn idle_connections_are_closed_when_configured() {
    let config = FrontendConfig {
        idle_timeout: Some(Duration::from_millis(200)),
        ..FrontendConfig::default()
    };
    let server = TestServer::with_config(config);
    let mut c = server.client();
    noop_round_trip(&mut c);
    // No request: the server closes it (the client's read waits at most READ_TIMEOUT).
    assert!(c.until_closed().is_empty());
}

#[test]
fn shutdown_flushes_closes_connections_and_shuts_the_engine_down() {
    let server = TestServer::start();
    let engine = Arc::clone(&server.engine);
    let mut c = server.client();
    noop_round_trip(&mut c);
    server.stop().unwrap();
    assert!(engine.shutdown_called.load(Ordering::Relaxed));
    let mut buf = [0u8; 16];
    let n = c.stream.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the connection is closed after shutdown");
}

#[test]
fn shutdown_does_not_wait_forever_for_a_client_that_does_not_read() {
    let config = FrontendConfig {
        output_buffer_limit: 16 * 1024,
        shutdown_timeout: Duration::from_millis(200),
        ..FrontendConfig::default()
    };
    let server = TestServer::with_config(config);
    let mut c = server.client();
    c.send(&set_req(b"big", &vec![0u8; 512 * 1024], 0));
    c.recv();
    let get = RequestBuilder::new(Opcode::Get)
        .key(b"big")
        .to_vec()
        .unwrap();
    for _ in 0..100 {
        c.stream.write_all(&get).unwrap();
    }
    server.stop().unwrap();
}

#[test]
fn binding_a_port_in_use_is_a_bind_error() {
    let server = TestServer::start();
    let config = FrontendConfig {
        bind: server.addr,
        ..FrontendConfig::default()
    };
    let err = Frontend::bind(config, Arc::new(common::FakeEngine::default())).unwrap_err();
    match err {
        FrontendError::Bind { source, .. } => {
            assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse);
        }
        other => panic!("expected a bind error, got {other:?}"),
    }
}

#[test]
fn invalid_config_is_rejected() {
    for config in [
        FrontendConfig {
            threads: 0,
            ..FrontendConfig::default()
        },
        FrontendConfig {
            max_connections: 0,
            ..FrontendConfig::default()
        },
        FrontendConfig {
            max_packet_size: 10,
            ..FrontendConfig::default()
        },
    ] {
        let err = Frontend::bind(config, Arc::new(common::FakeEngine::default())).unwrap_err();
        assert!(matches!(err, FrontendError::InvalidConfig(_)), "{err:?}");
    }
}
