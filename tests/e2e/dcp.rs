//! DCP producer over a real socket: a raw consumer streams a vBucket with flow control,
//! bad DCP requests get clear errors on a connection that stays usable, and a consumer
//! that never answers NOOPs is disconnected while the server keeps serving.

use crate::harness::{Server, key};
use epkv_client::StoreOptions;
use epkv_protocol::dcp::{self, DcpMessage, StreamReq};
use epkv_protocol::{Limits, Request, ResponseHeader, Status};
use epkv_types::{VBucketState, Vbid};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A packet the server sent: a response (to our request) or a request (a DCP message).
enum Packet {
    Response { status: u16, value: Vec<u8> },
    Message(Vec<u8>),
}

/// A raw DCP consumer connection.
struct Consumer {
    sock: TcpStream,
    /// Bytes read and not yet framed (reads are cancel-safe: a timeout loses nothing).
    buf: Vec<u8>,
    /// The server closed the connection.
    closed: bool,
}

impl Consumer {
    async fn connect(server: &Server) -> Consumer {
        Consumer {
            sock: TcpStream::connect(server.addr).await.unwrap(),
            buf: Vec::new(),
            closed: false,
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).await.unwrap();
    }

    /// The next packet, or `None` when nothing comes within `wait` (or the server closed:
    /// then `closed` is set).
    async fn next(&mut self, wait: Duration) -> Option<Packet> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if self.buf.len() >= 24 {
                let body_len = u32::from_be_bytes(self.buf[8..12].try_into().unwrap()) as usize;
                if self.buf.len() >= 24 + body_len {
                    let packet: Vec<u8> = self.buf.drain(..24 + body_len).collect();
                    return Some(Self::packet(packet));
                }
            }
            if self.closed {
                return None;
            }
            let mut chunk = [0u8; 4096];
            match tokio::time::timeout_at(deadline, self.sock.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => self.closed = true,
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
                Err(_) => return None,
            }
        }
    }

    fn packet(packet: Vec<u8>) -> Packet {
        if packet[0] == 0x81 {
            let head: [u8; 24] = packet[..24].try_into().unwrap();
            let h = ResponseHeader::decode(&head, &Limits::default()).unwrap();
            let value_at = 24 + usize::from(h.extras_len) + usize::from(h.key_len);
            Packet::Response {
                status: h.status,
                value: packet[value_at..].to_vec(),
            }
        } else {
            Packet::Message(packet)
        }
    }

    /// Sends `bytes` and returns the response's status and value.
    async fn call(&mut self, bytes: &[u8]) -> (u16, Vec<u8>) {
        self.send(bytes).await;
        loop {
            match self.next(Duration::from_secs(10)).await {
                Some(Packet::Response { status, value, .. }) => return (status, value),
                Some(Packet::Message(_)) => continue,
                None => panic!("no response"),
            }
        }
    }

    async fn open(&mut self, name: &str, flags: u32) -> u16 {
        let mut b = Vec::new();
        dcp::encode_open(&mut b, 1, name.as_bytes(), flags).unwrap();
        self.call(&b).await.0
    }

    async fn control(&mut self, k: &str, v: &str) -> u16 {
        let mut b = Vec::new();
        dcp::encode_control(&mut b, 2, k.as_bytes(), v.as_bytes()).unwrap();
        self.call(&b).await.0
    }

    async fn stream_req(&mut self, vbid: Vbid, req: &StreamReq) -> (u16, Vec<u8>) {
        let mut b = Vec::new();
        dcp::encode_stream_req(&mut b, 7, vbid, req).unwrap();
        self.call(&b).await
    }
}

fn from_zero() -> StreamReq {
    StreamReq {
        flags: 0,
        reserved: 0,
        start_seqno: 0,
        end_seqno: u64::MAX,
        vbucket_uuid: 0,
        snap_start_seqno: 0,
        snap_end_seqno: 0,
    }
}

/// Keys that all land in one vBucket, and that vBucket.
async fn keys_in_one_vbucket(server: &Server, n: usize) -> (Vbid, Vec<Vec<u8>>) {
    let c = server.client().await;
    let target = c.vbucket_for(&key("dcp-0"));
    let keys = (0..)
        .map(|i| key(&format!("dcp-{i}")))
        .filter(|k| c.vbucket_for(k) == target)
        .take(n)
        .collect();
    (target, keys)
}

#[tokio::test]
async fn a_raw_consumer_streams_a_vbucket_and_flow_control_holds_it_back() {
    let server = Server::start();
    let (vbid, keys) = keys_in_one_vbucket(&server, 60).await;
    let mut c = server.client().await;
    let value = vec![b'x'; 400];
    for k in &keys {
        assert!(
            c.set(k, &value, StoreOptions::new())
                .await
                .unwrap()
                .is_success()
        );
    }
    for k in &keys[..10] {
        assert!(c.delete(k, epkv_types::Cas(0)).await.unwrap().is_success());
    }
    let mut d = Consumer::connect(&server).await;
    assert_eq!(d.open("e2e-flow", dcp::OPEN_PRODUCER).await, 0);
    assert_eq!(d.control("connection_buffer_size", "4096").await, 0);
    let (status, log) = d.stream_req(vbid, &from_zero()).await;
    assert_eq!(status, 0);
    assert_eq!(log.len() % 16, 0);
    assert!(!log.is_empty(), "the reply carries the failover log");

    // Without acknowledgements the producer stops near the window.
    let mut unacked = 0usize;
    let mut mutations = 0;
    let mut deletions = 0;
    let mut last_seqno = 0;
    let mut ended = false;
    for round in 0..200 {
        let mut got_any = false;
        while let Some(p) = d.next(Duration::from_millis(300)).await {
            let Packet::Message(bytes) = p else { continue };
            got_any = true;
            unacked += bytes.len();
            let req = Request::parse(&bytes, &Limits::default()).unwrap();
            match DcpMessage::decode(&req).unwrap() {
                DcpMessage::Mutation { meta, .. } => {
                    assert!(meta.by_seqno > last_seqno);
                    last_seqno = meta.by_seqno;
                    mutations += 1;
                }
                DcpMessage::Deletion { meta, .. } => {
                    assert!(meta.by_seqno > last_seqno);
                    last_seqno = meta.by_seqno;
                    deletions += 1;
                }
                DcpMessage::StreamEnd { .. } => ended = true,
                _ => {}
            }
        }
        if mutations + deletions == keys.len() {
            break;
        }
        assert!(
            got_any || round == 0 || unacked > 0,
            "the stream stalled with nothing unacknowledged"
        );
        // Bounded by the window (plus the one message that crossed it).
        assert!(unacked < 4096 + 600, "{unacked} bytes sent unacknowledged");
        let mut ack = Vec::new();
        dcp::encode_buffer_ack(&mut ack, 9, u32::try_from(unacked).unwrap()).unwrap();
        d.send(&ack).await;
        unacked = 0;
    }
    assert_eq!((mutations, deletions), (50, 10));
    assert!(!ended, "an open-ended stream does not end");
    // The STAT group shows the producer.
    let stats = c.stat("dcp").await.unwrap();
    assert!(
        stats
            .iter()
            .any(|(k, v)| k == "eq_dcpq:e2e-flow:type" && v == "producer")
    );
    // Closing the stream; then the vBucket has none.
    let mut close = Vec::new();
    dcp::encode_close_stream(&mut close, 11, vbid).unwrap();
    assert_eq!(d.call(&close).await.0, 0);
    assert_eq!(d.call(&close).await.0, Status::KeyEnoent as u16);
}

#[tokio::test]
async fn bad_dcp_requests_get_clear_errors_and_the_connection_stays() {
    let server = Server::start();
    let (vbid, keys) = keys_in_one_vbucket(&server, 1).await;
    let mut c = server.client().await;
    assert!(
        c.set(&keys[0], b"v", StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
    let mut d = Consumer::connect(&server).await;
    // Before DCP_OPEN.
    assert_eq!(
        d.stream_req(vbid, &from_zero()).await.0,
        Status::Einval as u16
    );
    assert_eq!(
        d.control("enable_noop", "true").await,
        Status::Einval as u16
    );
    // A consumer (no producer flag): epkv has no DCP consumer yet.
    assert_eq!(d.open("c", 0).await, Status::NotSupported as u16);
    assert_eq!(d.open("p", dcp::OPEN_PRODUCER).await, 0);
    assert_eq!(d.open("p", dcp::OPEN_PRODUCER).await, Status::Einval as u16);
    assert_eq!(
        d.control("no_such_control", "1").await,
        Status::Einval as u16
    );
    assert_eq!(
        d.control("enable_noop", "maybe").await,
        Status::Einval as u16
    );
    // History the vBucket never had: roll back to zero.
    let stranger = StreamReq {
        start_seqno: 1,
        snap_start_seqno: 1,
        snap_end_seqno: 1,
        vbucket_uuid: 0xdead,
        ..from_zero()
    };
    let (status, body) = d.stream_req(vbid, &stranger).await;
    assert_eq!(status, Status::Rollback as u16);
    assert_eq!(body, 0u64.to_be_bytes());
    // Start past end.
    let backwards = StreamReq {
        start_seqno: 5,
        end_seqno: 2,
        snap_start_seqno: 5,
        snap_end_seqno: 5,
        ..from_zero()
    };
    assert_eq!(
        d.stream_req(vbid, &backwards).await.0,
        Status::Erange as u16
    );
    // Not an active vBucket.
    let other = Vbid((vbid.0 + 1) % 1024);
    assert!(
        c.set_vbucket(other, VBucketState::Replica)
            .await
            .unwrap()
            .is_success()
    );
    assert_eq!(
        d.stream_req(other, &from_zero()).await.0,
        Status::NotMyVbucket as u16
    );
    // Short extras.
    let mut bad = Vec::new();
    dcp::encode_stream_req(&mut bad, 3, vbid, &from_zero()).unwrap();
    bad[4] = 40; // extras length 48 -> 40: key and value shift, lengths still add up
    assert_ne!(d.call(&bad).await.0, 0);
    // A stream, then the same vBucket again.
    assert_eq!(d.stream_req(vbid, &from_zero()).await.0, 0);
    assert_eq!(
        d.stream_req(vbid, &from_zero()).await.0,
        Status::KeyEexists as u16
    );
    // Messages only a consumer takes.
    let mut m = Vec::new();
    dcp::encode_mutation(&mut m, 5, vbid, &dcp::DcpDocMeta::default(), b"k", b"v").unwrap();
    assert_eq!(d.call(&m).await.0, Status::NotSupported as u16);
    // Still a working connection, and the server still serves others.
    let mut noop = Vec::new();
    epkv_protocol::RequestBuilder::new(epkv_protocol::Opcode::Noop)
        .encode(&mut noop)
        .unwrap();
    assert_eq!(d.call(&noop).await.0, 0);
    c.noop().await.unwrap();
}

#[tokio::test]
async fn a_consumer_that_never_answers_noops_is_disconnected() {
    let server = Server::start();
    let mut d = Consumer::connect(&server).await;
    assert_eq!(d.open("deaf", dcp::OPEN_PRODUCER).await, 0);
    assert_eq!(d.control("set_noop_interval", "1").await, 0);
    assert_eq!(d.control("enable_noop", "true").await, 0);
    let mut noops = 0;
    let mut closed = false;
    for _ in 0..20 {
        match d.next(Duration::from_secs(1)).await {
            Some(Packet::Message(bytes)) => {
                let req = Request::parse(&bytes, &Limits::default()).unwrap();
                if matches!(DcpMessage::decode(&req), Ok(DcpMessage::Noop)) {
                    noops += 1;
                }
            }
            Some(Packet::Response { .. }) => {}
            None if d.closed => {
                closed = true;
                break;
            }
            None => {}
        }
    }
    assert_eq!(noops, 1, "one NOOP, then the close");
    assert!(closed, "the server closed the deaf consumer");
    // A consumer that answers stays.
    let mut ok = Consumer::connect(&server).await;
    assert_eq!(ok.open("polite", dcp::OPEN_PRODUCER).await, 0);
    assert_eq!(ok.control("set_noop_interval", "1").await, 0);
    assert_eq!(ok.control("enable_noop", "true").await, 0);
    let mut answered = 0;
    for _ in 0..40 {
        if let Some(Packet::Message(bytes)) = ok.next(Duration::from_millis(500)).await {
            let opaque = u32::from_be_bytes(bytes[12..16].try_into().unwrap());
            let mut resp = Vec::new();
            epkv_protocol::Response::new(0x5c, Status::Success, opaque)
                .encode(&mut resp)
                .unwrap();
            ok.send(&resp).await;
            answered += 1;
            if answered == 3 {
                break;
            }
        }
    }
    assert_eq!(answered, 3, "NOOPs keep coming to a consumer that answers");
    server.client().await.noop().await.unwrap();
}

#[tokio::test]
async fn stream_flags_end_at_the_latest_seqno_or_start_there() {
    let server = Server::start();
    let (vbid, keys) = keys_in_one_vbucket(&server, 12).await;
    let mut c = server.client().await;
    for k in &keys[..10] {
        assert!(
            c.set(k, b"v", StoreOptions::new())
                .await
                .unwrap()
                .is_success()
        );
    }
    let mut d = Consumer::connect(&server).await;
    assert_eq!(d.open("flags", dcp::OPEN_PRODUCER).await, 0);
    // TO_LATEST: everything up to now, then STREAM_END.
    let to_latest = StreamReq {
        flags: dcp::STREAM_TO_LATEST,
        ..from_zero()
    };
    assert_eq!(d.stream_req(vbid, &to_latest).await.0, 0);
    let (mut mutations, mut ended) = (0, false);
    while let Some(p) = d.next(Duration::from_secs(5)).await {
        let Packet::Message(bytes) = p else { continue };
        let req = Request::parse(&bytes, &Limits::default()).unwrap();
        match DcpMessage::decode(&req).unwrap() {
            DcpMessage::Mutation { .. } => mutations += 1,
            DcpMessage::StreamEnd { reason } => {
                assert_eq!(reason, 0);
                ended = true;
                break;
            }
            _ => {}
        }
    }
    assert_eq!((mutations, ended), (10, true));
    // FROM_LATEST: nothing old, only what comes next.
    let from_latest = StreamReq {
        flags: dcp::STREAM_FROM_LATEST,
        ..from_zero()
    };
    assert_eq!(d.stream_req(vbid, &from_latest).await.0, 0);
    assert!(
        c.set(&keys[10], b"new", StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
    let mut got = Vec::new();
    while let Some(p) = d.next(Duration::from_millis(500)).await {
        let Packet::Message(bytes) = p else { continue };
        let req = Request::parse(&bytes, &Limits::default()).unwrap();
        if let DcpMessage::Mutation { key, .. } = DcpMessage::decode(&req).unwrap() {
            got.push(key.to_vec());
        }
    }
    assert_eq!(got, vec![keys[10].clone()]);
    // TAKEOVER needs rebalance.
    let takeover = StreamReq {
        flags: dcp::STREAM_TAKEOVER,
        ..from_zero()
    };
    assert_eq!(
        d.stream_req(Vbid((vbid.0 + 1) % 1024), &takeover).await.0,
        Status::NotSupported as u16
    );
}

impl Consumer {
    /// HELLO (Collections when `collections`), SASL PLAIN and SELECT_BUCKET `default`.
    async fn login(&mut self, user: &str, password: &str, collections: bool) {
        use epkv_protocol::{Feature, Opcode, RequestBuilder};
        let features: Vec<u8> = if collections {
            Feature::Collections.as_u16().to_be_bytes().to_vec()
        } else {
            Vec::new()
        };
        let mut b = Vec::new();
        RequestBuilder::new(Opcode::Hello)
            .key(b"e2e-dcp")
            .value(&features)
            .encode(&mut b)
            .unwrap();
        assert_eq!(self.call(&b).await.0, Status::Success as u16);
        let plain = format!("\0{user}\0{password}");
        let mut b = Vec::new();
        RequestBuilder::new(Opcode::SaslAuth)
            .key(b"PLAIN")
            .value(plain.as_bytes())
            .encode(&mut b)
            .unwrap();
        assert_eq!(self.call(&b).await.0, Status::Success as u16);
        let mut b = Vec::new();
        RequestBuilder::new(Opcode::SelectBucket)
            .key(b"default")
            .encode(&mut b)
            .unwrap();
        assert_eq!(self.call(&b).await.0, Status::Success as u16);
    }

    /// STREAM_REQ with a JSON filter value.
    async fn stream_req_filtered(&mut self, vbid: Vbid, req: &StreamReq, filter: &str) -> u16 {
        use epkv_protocol::{Opcode, RequestBuilder};
        let extras = req.to_extras();
        let mut b = Vec::new();
        RequestBuilder::new(Opcode::DcpStreamReq)
            .vbucket(vbid)
            .opaque(9)
            .extras(&extras)
            .value(filter.as_bytes())
            .encode(&mut b)
            .unwrap();
        self.call(&b).await.0
    }

    /// The DCP messages that arrive within `wait`, as (vBucket, message opcode, extras,
    /// key) of the system events and stream ends, and the opcodes of the others.
    async fn messages(&mut self, wait: Duration) -> Vec<(Vbid, u8, Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some(p) = self.next(wait).await {
            if let Packet::Message(bytes) = p {
                let req = Request::parse(&bytes, &Limits::default()).unwrap();
                out.push((
                    req.header.vbucket,
                    bytes[1],
                    req.extras.to_vec(),
                    req.key.to_vec(),
                ));
            }
        }
        out
    }
}

#[tokio::test]
async fn collection_events_reach_collection_aware_consumers_and_a_dropped_filter_ends_the_stream() {
    use crate::harness::http_request;
    const ADMIN: (&str, &str) = ("Administrator", "password");
    if crate::harness::skip_if_external("collection events") {
        return;
    }
    let server = Server::spawn(&["--admin-user", ADMIN.0, "--admin-password", ADMIN.1]);
    let (aware_vb, filtered_vb) = (Vbid(3), Vbid(4));
    let mut aware = Consumer::connect(&server).await;
    aware.login(ADMIN.0, ADMIN.1, true).await;
    assert_eq!(aware.open("e2e-aware", dcp::OPEN_PRODUCER).await, 0);
    assert_eq!(aware.control("enable_expiry_opcode", "true").await, 0);
    let mut legacy = Consumer::connect(&server).await;
    legacy.login(ADMIN.0, ADMIN.1, false).await;
    assert_eq!(legacy.open("e2e-legacy", dcp::OPEN_PRODUCER).await, 0);
    let latest = StreamReq {
        flags: dcp::STREAM_FROM_LATEST,
        ..from_zero()
    };
    assert_eq!(aware.stream_req(aware_vb, &latest).await.0, 0);
    assert_eq!(legacy.stream_req(aware_vb, &latest).await.0, 0);

    let rest = |method: &str, path: &str, form: Option<&str>| {
        let r = http_request(server.mgmt_addr(), method, path, Some(ADMIN), form);
        assert_eq!(r.status, 200, "{method} {path}: {}", r.body);
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        u64::from_str_radix(v["uid"].as_str().unwrap(), 16).unwrap()
    };
    let scopes = "/pools/default/buckets/default/scopes";
    let scope_uid = rest("POST", scopes, Some("name=shop"));
    let collection_uid = rest(
        "POST",
        &format!("{scopes}/shop/collections"),
        Some("name=orders"),
    );
    assert_eq!(collection_uid, scope_uid + 1);

    // The collection-aware consumer gets both creations (ids 3 then 0, with their
    // names and the uid each made); the other one gets nothing.
    let events: Vec<_> = aware
        .messages(Duration::from_secs(2))
        .await
        .into_iter()
        .filter(|m| m.1 == 0x5f)
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    let event_id =
        |m: &(Vbid, u8, Vec<u8>, Vec<u8>)| u32::from_be_bytes(m.2[8..12].try_into().unwrap());
    assert_eq!(
        events
            .iter()
            .map(|m| (m.0, event_id(m), m.3.clone()))
            .collect::<Vec<_>>(),
        vec![
            (aware_vb, 3, b"shop".to_vec()),
            (aware_vb, 0, b"orders".to_vec())
        ]
    );
    assert!(
        legacy
            .messages(Duration::from_millis(500))
            .await
            .iter()
            .all(|m| m.1 != 0x5f),
        "a consumer without collections gets no system events"
    );

    // A stream filtered to the collection ends, with reason 7, after its drop.
    let mut c = server.client().await;
    c.auth_plain(ADMIN.0, ADMIN.1).await.unwrap();
    assert!(c.select_bucket("default").await.unwrap().is_success());
    let manifest: serde_json::Value = serde_json::from_str(
        &http_request(server.mgmt_addr(), "GET", scopes, Some(ADMIN), None).body,
    )
    .unwrap();
    let cid = manifest["scopes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["collections"].as_array().unwrap())
        .find(|c| c["name"] == "orders")
        .and_then(|c| c["uid"].as_str())
        .unwrap()
        .to_owned();
    let filter = format!(r#"{{"collections":["{cid}"]}}"#);
    assert_eq!(
        aware
            .stream_req_filtered(filtered_vb, &from_zero(), &filter)
            .await,
        0
    );
    rest("DELETE", &format!("{scopes}/shop/collections/orders"), None);
    let got = aware.messages(Duration::from_secs(2)).await;
    let on_filtered: Vec<_> = got.iter().filter(|m| m.0 == filtered_vb).collect();
    let drop_at = on_filtered
        .iter()
        .position(|m| m.1 == 0x5f && event_id(m) == 1)
        .unwrap_or_else(|| panic!("no drop event on the filtered stream: {got:?}"));
    let end = on_filtered
        .iter()
        .position(|m| m.1 == 0x55)
        .unwrap_or_else(|| panic!("the filtered stream did not end: {got:?}"));
    assert!(drop_at < end);
    assert_eq!(
        on_filtered[end].2,
        7u32.to_be_bytes(),
        "reason filter empty"
    );
    // The unfiltered stream goes on, and so does the server.
    assert!(
        got.iter()
            .any(|m| m.0 == aware_vb && m.1 == 0x5f && event_id(m) == 1)
    );
    c.noop().await.unwrap();
}
