//! Cluster map change notifications on a real server process: a client that agreed to
//! Duplex and ClustermapChangeNotification is pushed the new map (magic 0x82) when a
//! bucket created over REST moves the map's revision on.

use crate::harness::{Server, http_request, skip_if_external};
use epkv_protocol::{Feature, Opcode, RequestBuilder};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const ADMIN: (&str, &str) = ("Administrator", "password");

/// One packet off `s`: (magic, opcode, status or vbucket, extras, key, value).
type Packet = (u8, u8, u16, Vec<u8>, Vec<u8>, Vec<u8>);

fn read_packet(s: &mut TcpStream) -> Packet {
    let mut h = [0u8; 24];
    s.read_exact(&mut h).unwrap();
    let key_len = usize::from(u16::from_be_bytes([h[2], h[3]]));
    let extras_len = usize::from(h[4]);
    let body_len = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
    let mut body = vec![0u8; body_len];
    s.read_exact(&mut body).unwrap();
    let value = body.split_off(extras_len + key_len);
    let key = body.split_off(extras_len);
    (
        h[0],
        h[1],
        u16::from_be_bytes([h[6], h[7]]),
        body,
        key,
        value,
    )
}

fn request(s: &mut TcpStream, b: RequestBuilder<'_>) -> Packet {
    s.write_all(&b.to_vec().unwrap()).unwrap();
    read_packet(s)
}

#[tokio::test]
async fn a_bucket_created_over_rest_is_pushed_to_a_subscribed_client() {
    if skip_if_external("map_notification_rest") {
        return;
    }
    let server = Server::spawn(&[
        "--admin-user",
        ADMIN.0,
        "--admin-password",
        ADMIN.1,
        "--memory-quota",
        "32MiB",
    ]);
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let features: Vec<u8> = [
        Feature::Json,
        Feature::Duplex,
        Feature::ClustermapChangeNotification,
    ]
    .iter()
    .flat_map(|f| f.as_u16().to_be_bytes())
    .collect();
    let r = request(
        &mut s,
        RequestBuilder::new(Opcode::Hello)
            .key(b"e2e")
            .value(&features),
    );
    assert_eq!((r.2, r.5), (0, features.clone()));
    let plain = format!("\0{}\0{}", ADMIN.0, ADMIN.1);
    let r = request(
        &mut s,
        RequestBuilder::new(Opcode::SaslAuth)
            .key(b"PLAIN")
            .value(plain.as_bytes()),
    );
    assert_eq!(r.2, 0);
    let r = request(
        &mut s,
        RequestBuilder::new(Opcode::SelectBucket).key(b"default"),
    );
    assert_eq!(r.2, 0);
    let r = request(&mut s, RequestBuilder::new(Opcode::GetClusterConfig));
    assert_eq!(r.2, 0);
    let before: serde_json::Value = serde_json::from_slice(&r.5).unwrap();
    let before = before["rev"].as_i64().unwrap();

    let created = http_request(
        server.mgmt_addr(),
        "POST",
        "/pools/default/buckets",
        Some(ADMIN),
        Some("name=pushed&ramQuotaMB=16&replicaNumber=0"),
    );
    assert_eq!(created.status, 202, "{}", created.body);

    let (magic, opcode, _, extras, key, value) = read_packet(&mut s);
    assert_eq!((magic, opcode), (0x82, 0x01));
    assert_eq!(key, b"default");
    assert_eq!(extras.len(), 16);
    let rev = i64::from_be_bytes(extras[8..].try_into().unwrap());
    assert!(rev > before, "{rev} after {before}");
    let map: serde_json::Value = serde_json::from_slice(&value).unwrap();
    assert_eq!(map["name"], "default");
    assert_eq!(map["rev"].as_i64(), Some(rev));
    assert_eq!(
        i64::from_be_bytes(extras[..8].try_into().unwrap()),
        map["revEpoch"].as_i64().unwrap()
    );
}
