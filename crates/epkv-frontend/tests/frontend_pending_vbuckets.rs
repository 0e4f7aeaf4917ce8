//! The front end over the real bucket while a vBucket is pending (a takeover): a request
//! is parked, not answered, until the vBucket's state changes, then runs again there.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failure is a test failure"
)]

mod common;

use common::{Client, READ_TIMEOUT, set_req};
use epkv_engine::{Bucket, BucketConfig, EngineClock};
use epkv_engine_api::Engine;
use epkv_frontend::{Frontend, FrontendConfig};
use epkv_protocol::{Opcode, RequestBuilder};
use epkv_types::{NUM_VBUCKETS, VBucketState, Vbid, vbucket_for_key};
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

/// A front end serving a memory-only bucket on a background thread.
struct Server {
    bucket: Arc<Bucket>,
    client: Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<epkv_frontend::Result<()>>>,
}

impl Server {
    fn start() -> Self {
        let bucket = Bucket::new(
            BucketConfig {
                expiry_pager_interval: Duration::ZERO,
                ..BucketConfig::default()
            },
            EngineClock::System,
        )
        .unwrap();
        let frontend = Frontend::bind(FrontendConfig::default(), bucket.clone()).unwrap();
        let addr = frontend.local_addr();
        let (tx, thread) = common::run_in_background(frontend);
        Self {
            bucket,
            client: Client::connect(addr),
            stop: Some(tx),
            thread: Some(thread),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.bucket.shutdown();
    }
}

/// Asserts that nothing arrives on `c` for a while.
fn nothing_for(c: &mut Client, wait: Duration) {
    c.stream.set_read_timeout(Some(wait)).unwrap();
    let mut byte = [0u8; 1];
    match c.stream.read(&mut byte) {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) => {}
        other => panic!("expected no reply yet, got {other:?}"),
    }
    c.stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
}

fn vb(key: &[u8]) -> Vbid {
    vbucket_for_key(key, NUM_VBUCKETS)
}

#[test]
fn a_set_on_a_pending_vbucket_is_answered_once_the_vbucket_is_active_again() {
    let mut s = Server::start();
    let key = b"parked";
    s.bucket
        .set_vbucket_state(vb(key), VBucketState::Pending)
        .unwrap();
    s.client.send(&set_req(key, b"value", 0));
    // A GET behind it waits too: replies stay in request order.
    s.client
        .send_req(RequestBuilder::new(Opcode::Get).key(key).opaque(7));
    nothing_for(&mut s.client, Duration::from_millis(300));
    s.bucket
        .set_vbucket_state(vb(key), VBucketState::Active)
        .unwrap();
    let set = s.client.recv();
    assert_eq!((set.opcode, set.status), (Opcode::Set.as_u8(), 0));
    let get = s.client.recv();
    assert_eq!((get.status, get.opaque), (0, 7));
    assert_eq!(get.value, b"value");
}

#[test]
fn a_set_parked_through_a_takeover_is_answered_not_my_vbucket() {
    let mut s = Server::start();
    let key = b"moved";
    s.bucket
        .set_vbucket_state(vb(key), VBucketState::Pending)
        .unwrap();
    s.client.send(&set_req(key, b"value", 0));
    nothing_for(&mut s.client, Duration::from_millis(200));
    s.bucket
        .set_vbucket_state(vb(key), VBucketState::Dead)
        .unwrap();
    assert_eq!(s.client.recv().status, 0x07);
}
