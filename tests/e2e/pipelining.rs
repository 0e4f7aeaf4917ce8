//! Pipelining and backpressure.

use crate::harness::{Server, key, skip_if_external};
use epkv_client::StoreOptions;
use epkv_protocol::{Opcode, RequestBuilder, Status};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

#[tokio::test]
async fn a_thousand_pipelined_requests_in_one_write_are_answered_in_order() {
    let server = Server::start();
    let mut c = server.client().await;
    let present = key("pipe-present");
    let missing = key("pipe-missing");
    c.set(&present, b"value", StoreOptions::new())
        .await
        .unwrap();
    let (vp, vm) = (c.vbucket_for(&present), c.vbucket_for(&missing));
    let mut opaques = Vec::with_capacity(1000);
    for i in 0..1000 {
        let req = match i % 4 {
            0 => RequestBuilder::new(Opcode::Get).vbucket(vp).key(&present),
            1 => RequestBuilder::new(Opcode::GetK).vbucket(vm).key(&missing),
            2 => RequestBuilder::new(Opcode::Set)
                .vbucket(vp)
                .extras(&[0; 8])
                .key(&present)
                .value(b"value"),
            _ => RequestBuilder::new(Opcode::Noop),
        };
        opaques.push(c.queue(req).unwrap());
    }
    // One write of all 1000 requests, replies read concurrently.
    let replies = c.flush_and_recv(1000).await.unwrap();
    for (i, (r, opaque)) in replies.iter().zip(&opaques).enumerate() {
        assert_eq!(r.opaque, *opaque, "reply {i} out of order");
        let want = if i % 4 == 1 {
            Status::KeyEnoent
        } else {
            Status::Success
        };
        assert_eq!(r.status(), Some(want), "reply {i}");
    }
}

#[tokio::test]
async fn a_client_that_stops_reading_cannot_make_the_server_buffer_without_bound() {
    if skip_if_external("stops_reading") {
        return;
    }
    let server = Server::spawn(&[]);
    let mut writer = server.client().await;
    let k = key("big");
    let value = vec![b'v'; 1024 * 1024];
    assert!(
        writer
            .set(&k, &value, StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
    let baseline = server.rss_bytes().unwrap();

    // 1000 GETs of a 1 MiB value: 1 GiB of replies the client does not read for now.
    let mut slow = server.client().await;
    let vb = slow.vbucket_for(&k);
    let requests = 1000usize;
    let mut opaques = Vec::with_capacity(requests);
    for _ in 0..requests {
        opaques.push(
            slow.queue(RequestBuilder::new(Opcode::Get).vbucket(vb).key(&k))
                .unwrap(),
        );
    }
    slow.flush().await.unwrap();

    // Other connections keep being served meanwhile.
    for _ in 0..10 {
        let mut other = server.client().await;
        other.noop().await.unwrap();
        assert_eq!(other.get(&k).await.unwrap().value.len(), value.len());
    }
    // Give the server every chance to buffer more, then check its memory. The bound is
    // generous (the server should use a few MiB for this); without backpressure it
    // would hold the whole 1 GiB.
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(25)).await;
        let rss = server.rss_bytes().unwrap();
        assert!(
            rss < baseline + 256 * 1024 * 1024,
            "server RSS grew from {baseline} to {rss} bytes for a client that does not read"
        );
    }

    // Now the client reads: everything arrives, in order.
    for (i, opaque) in opaques.iter().enumerate() {
        let r = slow.recv().await.unwrap();
        assert_eq!(
            (r.opaque, r.value.len()),
            (*opaque, value.len()),
            "reply {i}"
        );
    }
    slow.noop().await.unwrap();
}

#[tokio::test]
async fn a_client_that_never_reads_does_not_stop_others_and_can_disconnect() {
    if skip_if_external("never_reads") {
        return;
    }
    let server = Server::spawn(&[]);
    let k = key("big2");
    let mut writer = server.client().await;
    writer
        .set(&k, &vec![0u8; 512 * 1024], StoreOptions::new())
        .await
        .unwrap();
    let mut slow = server.client().await;
    let vb = slow.vbucket_for(&k);
    let get = RequestBuilder::new(Opcode::Get)
        .vbucket(vb)
        .key(&k)
        .to_vec()
        .unwrap();
    let mut batch = Vec::new();
    for _ in 0..2000 {
        batch.extend_from_slice(&get);
    }
    slow.stream_mut().write_all(&batch).await.unwrap();
    writer.noop().await.unwrap();
    drop(slow);
    // The server notices the disconnect and keeps serving.
    for _ in 0..5 {
        let mut c = server.client().await;
        c.noop().await.unwrap();
    }
}
