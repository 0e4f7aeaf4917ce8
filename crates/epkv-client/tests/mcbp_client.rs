//! The client against in-process fake servers on 127.0.0.1:0: a small well-behaved one
//! that records what it receives, and hostile ones that break the protocol.
#![expect(clippy::unwrap_used, reason = "test code panics on failure")]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use epkv_client::{Client, ClientConfig, Error, StoreOptions};
use epkv_protocol::{
    Command, DurabilityRequirement, Feature, HeaderError, Limits, Magic, Opcode, Request,
    RequestBuilder, Response, Status, StoreOp, frame_len,
};
use epkv_types::{Cas, DurabilityLevel, NUM_VBUCKETS, VBucketState, Vbid, vbucket_for_key};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the fake server saw of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    magic: Magic,
    opcode: u8,
    vbucket: Vbid,
    durability: Option<DurabilityRequirement>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// Starts a fake server that answers one connection; returns its address and log.
async fn fake_server() -> (std::net::SocketAddr, Log) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log: Log = Arc::default();
    let log2 = Arc::clone(&log);
    tokio::spawn(async move {
        let (sock, _) = listener.accept().await.unwrap();
        serve(sock, log2).await;
    });
    (addr, log)
}

async fn serve(mut sock: TcpStream, log: Log) {
    let limits = Limits::default();
    let mut store: HashMap<Vec<u8>, (Vec<u8>, u32, u64)> = HashMap::new();
    let mut next_cas = 100u64;
    let mut buf = BytesMut::new();
    loop {
        while let Some(n) = frame_len(&buf, &limits).unwrap() {
            let packet = buf.split_to(n);
            let req = Request::parse(&packet, &limits).unwrap();
            let mut out = BytesMut::new();
            let durability = req.frame_info().ok().and_then(|f| f.durability);
            log.lock().unwrap().push(Seen {
                magic: req.header.magic,
                opcode: req.header.opcode,
                vbucket: req.header.vbucket,
                durability,
            });
            let ok = Response::for_request(&req, Status::Success);
            let mut close = false;
            match Command::decode(&req) {
                Err(status) => Response::error(&req, status).encode(&mut out).unwrap(),
                Ok(Command::Get { key, with_key, .. }) => match store.get(key) {
                    Some((value, flags, cas)) => {
                        let flags = flags.to_be_bytes();
                        let r = ok.with_extras(&flags).with_value(value).with_cas(Cas(*cas));
                        let r = if with_key { r.with_key(key) } else { r };
                        r.encode(&mut out).unwrap();
                    }
                    None => Response::error(&req, Status::KeyEnoent)
                        .encode(&mut out)
                        .unwrap(),
                },
                Ok(Command::Store {
                    op,
                    key,
                    value,
                    flags,
                    ..
                }) => {
                    let exists = store.contains_key(key);
                    if op == StoreOp::Add && exists {
                        Response::error(&req, Status::KeyEexists)
                            .encode(&mut out)
                            .unwrap();
                    } else {
                        next_cas += 1;
                        store.insert(key.to_vec(), (value.to_vec(), flags, next_cas));
                        ok.with_cas(Cas(next_cas)).encode(&mut out).unwrap();
                    }
                }
                Ok(Command::Arithmetic { initial, .. }) => {
                    ok.with_value(&initial.to_be_bytes())
                        .encode(&mut out)
                        .unwrap();
                }
                Ok(Command::Hello { features, .. }) => {
                    let agreed: Vec<u8> = features
                        .known()
                        .filter(|f| f.is_implemented())
                        .flat_map(|f| f.as_u16().to_be_bytes())
                        .collect();
                    ok.with_value(&agreed).encode(&mut out).unwrap();
                }
                Ok(Command::Version) => ok.with_value(b"fake-1.0").encode(&mut out).unwrap(),
                Ok(Command::Stat { group }) => {
                    ok.with_key(b"group")
                        .with_value(group)
                        .encode(&mut out)
                        .unwrap();
                    ok.with_key(b"curr_items")
                        .with_value(b"3")
                        .encode(&mut out)
                        .unwrap();
                    ok.encode(&mut out).unwrap();
                }
                Ok(Command::GetVbucket) => {
                    ok.with_value(&1u32.to_be_bytes()).encode(&mut out).unwrap();
                }
                Ok(Command::Quit { .. }) => {
                    ok.encode(&mut out).unwrap();
                    close = true;
                }
                Ok(_) => ok.encode(&mut out).unwrap(),
            }
            sock.write_all(&out).await.unwrap();
            if close {
                return;
            }
        }
        if sock.read_buf(&mut buf).await.unwrap_or(0) == 0 {
            return;
        }
    }
}

/// Starts a server that reads the first request and answers with `reply` bytes, then
/// optionally closes.
async fn scripted_server(reply: Vec<u8>, close_after: bool) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 1024];
        let _ = sock.read(&mut buf).await.unwrap();
        sock.write_all(&reply).await.unwrap();
        if close_after {
            drop(sock);
        } else {
            // Keep the connection open until the client goes away.
            let _ = sock.read(&mut buf).await;
        }
    });
    addr
}

#[tokio::test]
async fn set_then_get_round_trips_value_flags_and_cas() {
    let (addr, log) = fake_server().await;
    let mut c = Client::connect(addr).await.unwrap();
    let stored = c
        .set(b"k1", b"hello", StoreOptions::new().flags(7).expiry(60))
        .await
        .unwrap();
    assert_eq!(stored.status(), Some(Status::Success));
    assert_ne!(stored.cas, Cas::ANY);
    let got = c.get(b"k1").await.unwrap();
    assert!(got.is_success());
    assert_eq!(&got.value[..], b"hello");
    assert_eq!(got.flags(), Some(7));
    assert_eq!(got.cas, stored.cas);
    assert!(got.key.is_empty());
    let got = c.getk(b"k1").await.unwrap();
    assert_eq!(&got.key[..], b"k1");
    let miss = c.get(b"nope").await.unwrap();
    assert_eq!(miss.status(), Some(Status::KeyEnoent));
    let err = miss.clone().into_result().unwrap_err().to_string();
    assert!(err.contains("0x0001"), "{err}");
    let dup = c.add(b"k1", b"x", StoreOptions::new()).await.unwrap();
    assert_eq!(dup.status(), Some(Status::KeyEexists));
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen[0].opcode, Opcode::Set.as_u8());
    assert_eq!(seen[0].vbucket, Vbid(526), "k1 routes to vBucket 526");
    assert!(seen.iter().all(|s| s.magic == Magic::ClientRequest));
}

#[tokio::test]
async fn keys_route_to_their_vbucket_unless_overridden() {
    let (addr, log) = fake_server().await;
    let mut c = Client::connect(addr).await.unwrap();
    for key in [&b"a"[..], b"k3", b"some-longer-key"] {
        c.get(key).await.unwrap();
    }
    c.set_vbucket_override(Some(Vbid(5)));
    c.get(b"a").await.unwrap();
    c.set_vbucket_override(None);
    c.set(b"a", b"v", StoreOptions::new().vbucket(Vbid(77)))
        .await
        .unwrap();
    let vbs: Vec<Vbid> = log.lock().unwrap().iter().map(|s| s.vbucket).collect();
    assert_eq!(
        vbs,
        vec![
            vbucket_for_key(b"a", NUM_VBUCKETS),
            Vbid(0),
            vbucket_for_key(b"some-longer-key", NUM_VBUCKETS),
            Vbid(5),
            Vbid(77),
        ]
    );
}

#[tokio::test]
async fn thousand_pipelined_requests_in_one_write() {
    let (addr, _log) = fake_server().await;
    let mut c = Client::connect(addr).await.unwrap();
    let keys: Vec<Vec<u8>> = (0..1000).map(|i| format!("key-{i}").into_bytes()).collect();
    let mut opaques = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let req = if i % 2 == 0 {
            RequestBuilder::new(Opcode::Set)
                .key(key)
                .value(key)
                .extras(&[0; 8])
        } else {
            RequestBuilder::new(Opcode::GetK).key(&keys[i - 1])
        };
        opaques.push(c.queue(req).unwrap());
    }
    c.flush().await.unwrap();
    for (i, opaque) in opaques.iter().enumerate() {
        let r = c.recv().await.unwrap();
        assert_eq!(r.opaque, *opaque);
        assert!(r.is_success(), "response {i}");
        if i % 2 == 1 {
            assert_eq!(r.key, r.value);
        }
    }
}

#[tokio::test]
async fn session_commands() {
    let (addr, log) = fake_server().await;
    let mut c = Client::connect(addr).await.unwrap();
    let agreed = c
        .hello(
            "epkv-test",
            &[Feature::Json, Feature::Tracing, Feature::TcpNoDelay],
        )
        .await;
    assert_eq!(
        agreed.unwrap(),
        vec![Feature::Json.as_u16(), Feature::TcpNoDelay.as_u16()]
    );
    assert_eq!(c.version().await.unwrap(), "fake-1.0");
    c.noop().await.unwrap();
    let stats = c.stat("vbucket").await.unwrap();
    assert_eq!(
        stats,
        vec![
            ("group".into(), "vbucket".into()),
            ("curr_items".into(), "3".into())
        ]
    );
    let r = c.incr(b"ctr", 1, 41, 0).await.unwrap();
    assert_eq!(r.counter(), Some(41));
    assert_eq!(
        c.get_vbucket(Vbid(3)).await.unwrap().vbucket_state(),
        Some(VBucketState::Active)
    );
    assert!(
        c.set_vbucket(Vbid(3), VBucketState::Replica)
            .await
            .unwrap()
            .is_success()
    );
    assert!(c.adjust_timeofday(3600).await.unwrap().is_success());
    assert!(c.touch(b"k", 5).await.unwrap().is_success());
    assert!(c.unlock(b"k", Cas(9)).await.unwrap().is_success());
    let seen = log.lock().unwrap().clone();
    let gv = seen
        .iter()
        .find(|s| s.opcode == Opcode::GetVbucket.as_u8())
        .unwrap();
    assert_eq!(gv.vbucket, Vbid(3));
    c.quit().await.unwrap();
}

#[tokio::test]
async fn durable_writes_use_alt_magic() {
    let (addr, log) = fake_server().await;
    let mut c = Client::connect(addr).await.unwrap();
    let d = DurabilityRequirement {
        level: DurabilityLevel::Majority,
        timeout: Some(Duration::from_millis(9000)),
    };
    assert!(
        c.set(b"k", b"v", StoreOptions::new().durability(d))
            .await
            .unwrap()
            .is_success()
    );
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen[0].magic, Magic::AltClientRequest);
    assert_eq!(seen[0].durability, Some(d));
}

#[tokio::test]
async fn errors_from_the_server_are_answers_not_failures() {
    let (addr, _log) = fake_server().await;
    let mut c = Client::connect(addr).await.unwrap();
    // Raw bytes: an unknown opcode is answered by the server's decoder.
    c.send_raw(&RequestBuilder::raw(0xee).opaque(42).to_vec().unwrap())
        .await
        .unwrap();
    let r = c.recv().await.unwrap();
    assert_eq!(r.opaque, 42);
    assert_eq!(r.status(), Some(Status::UnknownCommand));
    assert_eq!(r.opcode, 0xee);
    let err = c
        .request(RequestBuilder::new(Opcode::Get))
        .await
        .unwrap()
        .into_result();
    assert!(matches!(err, Err(Error::Status { status: 0x04, .. })));
}

#[tokio::test]
async fn a_huge_body_length_is_refused_without_allocating() {
    let mut header = [0u8; 24];
    header[0] = 0x81;
    header[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
    let addr = scripted_server(header.to_vec(), false).await;
    let mut c = Client::connect(addr).await.unwrap();
    let err = c.get(b"k").await.unwrap_err();
    assert!(
        matches!(err, Error::Header(HeaderError::PacketTooLarge { .. })),
        "{err}"
    );
}

#[tokio::test]
async fn a_request_magic_from_the_server_is_refused() {
    let reply = RequestBuilder::new(Opcode::Noop).to_vec().unwrap();
    let addr = scripted_server(reply, false).await;
    let mut c = Client::connect(addr).await.unwrap();
    let err = c.noop().await.unwrap_err();
    assert!(
        matches!(err, Error::Header(HeaderError::UnexpectedMagic(0x80))),
        "{err}"
    );
}

#[tokio::test]
async fn a_truncated_response_then_close_is_reported() {
    let mut reply = Vec::new();
    Response::new(0, Status::Success, 1)
        .with_value(b"0123456789")
        .encode(&mut reply)
        .unwrap();
    reply.truncate(30);
    let addr = scripted_server(reply, true).await;
    let mut c = Client::connect(addr).await.unwrap();
    let err = c.get(b"k").await.unwrap_err();
    assert!(matches!(err, Error::Closed { buffered: 30 }), "{err}");
}

#[tokio::test]
async fn a_response_to_another_request_is_reported() {
    let mut reply = Vec::new();
    Response::new(0, Status::Success, 999)
        .encode(&mut reply)
        .unwrap();
    let addr = scripted_server(reply, false).await;
    let mut c = Client::connect(addr).await.unwrap();
    let err = c.get(b"k").await.unwrap_err();
    assert!(
        matches!(err, Error::UnexpectedOpaque { got: 999, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn a_silent_server_times_out() {
    let addr = scripted_server(Vec::new(), false).await;
    let config = ClientConfig {
        timeout: Some(Duration::from_millis(50)),
        ..ClientConfig::default()
    };
    let mut c = Client::connect_with(addr, config).await.unwrap();
    let err = c.noop().await.unwrap_err();
    assert!(matches!(err, Error::Timeout), "{err}");
}

#[tokio::test]
async fn quit_fails_when_the_server_keeps_talking() {
    let mut reply = Vec::new();
    let quit = Opcode::Quit.as_u8();
    Response::new(quit, Status::Success, 1)
        .encode(&mut reply)
        .unwrap();
    Response::new(quit, Status::Success, 2)
        .encode(&mut reply)
        .unwrap();
    let addr = scripted_server(reply, false).await;
    let c = Client::connect(addr).await.unwrap();
    assert!(matches!(c.quit().await, Err(Error::Malformed(_))));
}

/// Starts a server that answers every request with Success and echoes its value, so
/// replies are as large as requests.
async fn echo_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let limits = Limits::default();
        let mut buf = BytesMut::new();
        loop {
            while let Some(n) = frame_len(&buf, &limits).unwrap() {
                let packet = buf.split_to(n);
                let req = Request::parse(&packet, &limits).unwrap();
                let mut out = Vec::new();
                Response::for_request(&req, Status::Success)
                    .with_value(req.value)
                    .encode(&mut out)
                    .unwrap();
                // Blocks while the client does not read: the server stops reading too.
                sock.write_all(&out).await.unwrap();
            }
            if sock.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                return;
            }
        }
    });
    addr
}

#[tokio::test]
async fn a_pipeline_larger_than_socket_buffers_completes() {
    let addr = echo_server().await;
    let mut c = Client::connect(addr).await.unwrap();
    let value = vec![0x5a; 64 * 1024];
    let count = 300; // about 19 MiB each way, far beyond loopback socket buffers
    let mut opaques = Vec::new();
    for _ in 0..count {
        let req = RequestBuilder::new(Opcode::Set)
            .key(b"big")
            .value(&value)
            .extras(&[0; 8]);
        opaques.push(c.queue(req).unwrap());
    }
    let responses = c.flush_and_recv(count).await.unwrap();
    assert_eq!(responses.len(), count);
    for (r, opaque) in responses.iter().zip(opaques) {
        assert_eq!(r.opaque, opaque);
        assert_eq!(r.value.len(), value.len());
    }
    // The connection is still in step afterwards.
    c.noop().await.unwrap();
}
