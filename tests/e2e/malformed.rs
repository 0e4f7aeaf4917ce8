//! Malformed input (memcached's malicious-commands idea): each bad connection is answered
//! or closed, other connections keep being served, and memory stays bounded.

use crate::harness::{Server, key};
use epkv_client::{Client, StoreOptions};
use epkv_protocol::{Opcode, RequestBuilder, Status};
use tokio::io::AsyncWriteExt;

/// Sends raw bytes and expects the server to close the connection without answering.
async fn expect_closed(server: &Server, bytes: &[u8]) {
    let mut c = server.client().await;
    c.send_raw(bytes).await.unwrap();
    c.wait_closed()
        .await
        .unwrap_or_else(|e| panic!("expected a close after {bytes:02x?}: {e}"));
}

async fn bystander_ok(c: &mut Client) {
    c.noop().await.unwrap();
    let k = key("bystander");
    assert!(
        c.set(&k, b"still here", StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
    assert_eq!(c.get(&k).await.unwrap().value.as_ref(), b"still here");
}

#[tokio::test]
async fn untrusted_headers_close_only_their_connection() {
    let server = Server::start();
    let mut bystander = server.client().await;
    bystander_ok(&mut bystander).await;

    let noop = RequestBuilder::new(Opcode::Noop).to_vec().unwrap();
    let get = RequestBuilder::new(Opcode::Get).key(b"k").to_vec().unwrap();

    // Unknown magic.
    let mut p = noop.clone();
    p[0] = 0x42;
    expect_closed(&server, &p).await;
    // A response magic.
    let mut p = noop.clone();
    p[0] = 0x81;
    expect_closed(&server, &p).await;
    // A 4 GiB body length.
    let mut p = get.clone();
    p[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
    expect_closed(&server, &p).await;
    // A body larger than the default 20 MiB packet limit.
    let mut p = get.clone();
    p[8..12].copy_from_slice(&(21u32 << 20).to_be_bytes());
    expect_closed(&server, &p).await;
    // Lengths that contradict each other: key longer than the body.
    let mut p = get.clone();
    p[2..4].copy_from_slice(&1000u16.to_be_bytes());
    expect_closed(&server, &p).await;
    // Extras plus key longer than the body.
    let mut p = get.clone();
    p[4] = 200;
    expect_closed(&server, &p).await;
    // Framing extras (magic 0x08) longer than the body.
    let mut p = get.clone();
    p[0] = 0x08;
    p[2] = 100;
    p[3] = 1;
    expect_closed(&server, &p).await;
    // Not the binary protocol at all.
    expect_closed(&server, b"get foo\r\n\r\n\r\n\r\n\r\n\r\n").await;

    bystander_ok(&mut bystander).await;
}

#[tokio::test]
async fn a_truncated_header_is_closed_when_the_client_goes() {
    let server = Server::start();
    let mut c = server.client().await;
    let noop = RequestBuilder::new(Opcode::Noop).to_vec().unwrap();
    c.send_raw(&noop[..13]).await.unwrap();
    c.shutdown_write().await.unwrap();
    c.wait_closed().await.unwrap();
    // A truncated body too.
    let mut c = server.client().await;
    let set = RequestBuilder::new(Opcode::Set)
        .extras(&[0; 8])
        .key(b"k")
        .value(b"value")
        .to_vec()
        .unwrap();
    c.send_raw(&set[..set.len() - 2]).await.unwrap();
    c.shutdown_write().await.unwrap();
    c.wait_closed().await.unwrap();
    server.client().await.noop().await.unwrap();
}

#[tokio::test]
async fn invalid_requests_are_answered_and_the_connection_stays() {
    let server = Server::start();
    let mut c = server.client().await;
    let long_key = vec![b'k'; 251];
    let r = c
        .request(RequestBuilder::new(Opcode::Get).key(&long_key))
        .await
        .unwrap();
    assert_eq!(r.status(), Some(Status::Einval), "key too long");
    let r = c
        .request(
            RequestBuilder::new(Opcode::Set)
                .extras(&[0; 3])
                .key(b"k")
                .value(b"v"),
        )
        .await
        .unwrap();
    assert_eq!(r.status(), Some(Status::Einval), "wrong extras length");
    let r = c.request(RequestBuilder::new(Opcode::Get)).await.unwrap();
    assert_eq!(r.status(), Some(Status::Einval), "GET without a key");
    let r = c
        .request(RequestBuilder::new(Opcode::Noop).key(b"k"))
        .await
        .unwrap();
    assert_eq!(r.status(), Some(Status::Einval), "NOOP with a key");
    let r = c
        .request(RequestBuilder::new(Opcode::Hello).value(&[0, 3, 0]))
        .await
        .unwrap();
    assert_eq!(r.status(), Some(Status::Einval), "odd HELLO value");
    let r = c
        .request(
            RequestBuilder::new(Opcode::Get)
                .key(b"k")
                .datatype(epkv_types::Datatype(0x80)),
        )
        .await
        .unwrap();
    assert_eq!(r.status(), Some(Status::Einval), "unknown datatype bit");
    let r = c
        .request(
            RequestBuilder::new(Opcode::Get)
                .key(b"k")
                .raw_framing_extras(&[0xf0, 0x00]),
        )
        .await
        .unwrap();
    assert!(!r.is_success(), "bad frame info: {r:?}");
    let r = c.request(RequestBuilder::raw(0xf3)).await.unwrap();
    assert_eq!(r.status(), Some(Status::UnknownCommand));
    c.noop().await.unwrap();
}

#[tokio::test]
async fn garbage_is_answered_or_closed_and_memory_stays_bounded() {
    let server = Server::start();
    let baseline = server.rss_bytes();
    let mut bystander = server.client().await;
    bystander_ok(&mut bystander).await;
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..64 {
        let mut bytes: Vec<u8> = (0..8192).map(|_| next() as u8).collect();
        match round % 4 {
            // Looks like a request header with random lengths.
            0 => bytes[0] = 0x80,
            // A stream of plausible headers with random fields.
            1 => {
                for chunk in bytes.chunks_mut(64) {
                    chunk[0] = 0x80;
                }
            }
            _ => {}
        }
        let mut c = server.client().await;
        // The server may close while we are still writing; that is an allowed outcome.
        let _ = c.stream_mut().write_all(&bytes).await;
        let _ = c.stream_mut().shutdown().await;
        let mut answered = 0;
        loop {
            match c.recv().await {
                Ok(_) => answered += 1,
                Err(epkv_client::Error::Closed { .. } | epkv_client::Error::Io(_)) => break,
                Err(e) => panic!("round {round}: unexpected client error {e}"),
            }
            assert!(answered <= bytes.len() / 24, "more replies than requests");
        }
    }
    bystander_ok(&mut bystander).await;
    if let (Some(before), Some(after)) = (baseline, server.rss_bytes()) {
        assert!(
            after < before + 128 * 1024 * 1024,
            "RSS grew from {before} to {after}"
        );
    }
}
