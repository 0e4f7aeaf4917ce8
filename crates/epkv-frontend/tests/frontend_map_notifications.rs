//! Cluster map change notifications (HELLO ClustermapChangeNotification 0x0d, its brief
//! form 0x1f, both needing Duplex 0x0c) and DedupeNotMyVbucketClustermap 0x1e, over a
//! real socket: the server pushes a ClustermapChangeNotification request (magic 0x82,
//! server opcode 0x01, extras epoch and revision, key the bucket, value the map or
//! nothing) when the view's map moves on, and only to connections that asked.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failure is a test failure"
)]

mod common;

use common::{Client, Packet, TestServer};
use epkv_auth::{Roles, UserDirectory, UserStore};
use epkv_engine_api::{ClusterView, Engine, MapListener, NodePorts};
use epkv_frontend::FrontendConfig;
use epkv_protocol::{Feature, Opcode, RequestBuilder};
use epkv_types::{Datatype, Vbid};
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

const EPOCH: i64 = 7;

/// A view whose map is `{"rev":N,"name":...}`, which tells its listeners when
/// [`StubView::change`] moves it on (SET_VBUCKET's `map_changed` does not, so the front
/// end's own catch-up is exercised too).
struct StubView {
    rev: AtomicI64,
    listeners: Mutex<Vec<MapListener>>,
}

impl StubView {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            rev: AtomicI64::new(1),
            listeners: Mutex::default(),
        })
    }

    fn change(&self) -> i64 {
        let rev = self.rev.fetch_add(1, Ordering::SeqCst) + 1;
        for l in self.listeners.lock().iter() {
            l((EPOCH, rev));
        }
        rev
    }
}

impl ClusterView for StubView {
    fn version(&self) -> (i64, i64) {
        (EPOCH, self.rev.load(Ordering::SeqCst))
    }

    fn map_changed(&self) {
        self.rev.fetch_add(1, Ordering::SeqCst);
    }

    fn subscribe(&self, listener: MapListener) {
        self.listeners.lock().push(listener);
    }

    fn bucket_config(&self, name: &str, _: &dyn Engine, _: SocketAddr, _: NodePorts) -> String {
        format!(
            "{{\"rev\":{},\"name\":\"{name}\"}}",
            self.rev.load(Ordering::SeqCst)
        )
    }

    fn global_config(&self, _: SocketAddr, _: NodePorts) -> String {
        format!(
            "{{\"rev\":{},\"global\":true}}",
            self.rev.load(Ordering::SeqCst)
        )
    }
}

fn server_with(view: &Arc<StubView>, users: Option<UserDirectory>) -> TestServer {
    let mut config = FrontendConfig {
        cluster: Some(Arc::clone(view) as Arc<dyn ClusterView>),
        ..FrontendConfig::default()
    };
    if let Some(users) = users {
        config.users = users;
    }
    TestServer::with_config(config)
}

/// HELLO with `features`; returns the status and the agreed codes (or the value).
fn hello(c: &mut Client, features: &[Feature]) -> (u16, Vec<u16>, Vec<u8>) {
    let raw: Vec<u8> = features
        .iter()
        .flat_map(|f| f.as_u16().to_be_bytes())
        .collect();
    let r = c.request(RequestBuilder::new(Opcode::Hello).key(b"test").value(&raw));
    let agreed = r
        .value
        .chunks_exact(2)
        .map(|p| u16::from_be_bytes([p[0], p[1]]))
        .collect();
    (r.status, agreed, r.value)
}

fn subscribed(server: &TestServer, features: &[Feature]) -> Client {
    let mut c = server.client();
    let (status, agreed, _) = hello(&mut c, features);
    assert_eq!(status, 0);
    assert_eq!(
        agreed,
        features.iter().map(|f| f.as_u16()).collect::<Vec<_>>()
    );
    c
}

fn set_vbucket(c: &mut Client) {
    let r = c.request(
        RequestBuilder::new(Opcode::SetVbucket)
            .vbucket(Vbid(5))
            .extras(&2u32.to_be_bytes()),
    );
    assert_eq!(r.status, 0);
}

/// Checks `p` is a ClustermapChangeNotification of `bucket` at revision `rev`.
fn assert_notification(p: &Packet, bucket: &[u8], rev: i64) {
    assert_eq!((p.magic, p.opcode), (0x82, 0x01), "{p:?}");
    assert_eq!(p.extras.len(), 16);
    assert_eq!(&p.extras[..8], &EPOCH.to_be_bytes());
    assert_eq!(&p.extras[8..], &rev.to_be_bytes());
    assert_eq!(p.key, bucket);
    assert_eq!((p.specific, p.opaque), (0, 0));
}

fn nmvb(c: &mut Client) -> Packet {
    c.send_req(
        RequestBuilder::new(Opcode::Get)
            .key(b"k")
            .vbucket(Vbid(u16::MAX)),
    );
    let p = c.recv_packet();
    assert_eq!((p.magic, p.specific), (0x81, 0x07), "{p:?}");
    p
}

#[test]
fn a_subscribed_client_is_pushed_the_map_after_set_vbucket_and_view_changes() {
    let view = StubView::new();
    let server = server_with(&view, None);
    let mut c = subscribed(
        &server,
        &[
            Feature::Json,
            Feature::Duplex,
            Feature::ClustermapChangeNotification,
        ],
    );

    // SET_VBUCKET on another connection: the view is not told by listener, the front
    // end catches up itself.
    set_vbucket(&mut server.client());
    let p = c.recv_packet();
    assert_notification(&p, b"default", 2);
    assert_eq!(p.datatype, Datatype::JSON.0);
    assert_eq!(p.value, br#"{"rev":2,"name":"default"}"#);

    // A change the view announces.
    let rev = view.change();
    let p = c.recv_packet();
    assert_notification(&p, b"default", rev);
    assert_eq!(
        String::from_utf8(p.value).unwrap(),
        format!("{{\"rev\":{rev},\"name\":\"default\"}}")
    );

    // The client may answer (magic 0x83): the reply is dropped, and the connection goes on.
    let mut reply = vec![0u8; 24];
    reply[0] = 0x83;
    reply[1] = 0x01;
    c.send(&reply);
    let r = c.request(RequestBuilder::new(Opcode::Noop));
    assert_eq!((r.opcode, r.status), (Opcode::Noop.as_u8(), 0));
}

#[test]
fn the_brief_form_carries_no_map_and_wins_over_the_full_one() {
    let view = StubView::new();
    let server = server_with(&view, None);
    let mut c = server.client();
    let (status, agreed, _) = hello(
        &mut c,
        &[
            Feature::Duplex,
            Feature::ClustermapChangeNotification,
            Feature::ClustermapChangeNotificationBrief,
            Feature::Json,
        ],
    );
    assert_eq!(status, 0);
    assert_eq!(agreed, vec![0x0c, 0x1f, 0x0b]);
    let rev = view.change();
    let p = c.recv_packet();
    assert_notification(&p, b"default", rev);
    assert_eq!((p.datatype, p.value.len()), (0, 0));
}

#[test]
fn notifications_need_duplex_in_the_same_hello() {
    let view = StubView::new();
    let server = server_with(&view, None);
    let mut c = server.client();
    let (status, _, value) = hello(
        &mut c,
        &[Feature::Json, Feature::ClustermapChangeNotificationBrief],
    );
    assert_eq!(status, 0x04, "Einval, as kv_engine");
    assert_eq!(
        String::from_utf8(value).unwrap(),
        r#"{"error":{"context":"ClustermapChangeNotificationBrief needs Duplex"}}"#
    );
    // Nothing was enabled: no push comes, the next reply is the NOOP's.
    view.change();
    let mut witness = subscribed(
        &server,
        &[Feature::Duplex, Feature::ClustermapChangeNotificationBrief],
    );
    let rev = view.change();
    assert_notification(&witness.recv_packet(), b"default", rev);
    c.send_req(RequestBuilder::new(Opcode::Noop));
    let p = c.recv_packet();
    assert_eq!((p.magic, p.opcode), (0x81, Opcode::Noop.as_u8()));
}

#[test]
fn a_client_that_did_not_ask_is_not_pushed_anything() {
    let view = StubView::new();
    let server = server_with(&view, None);
    let mut plain = subscribed(&server, &[Feature::Json, Feature::Duplex]);
    let mut witness = subscribed(
        &server,
        &[Feature::Duplex, Feature::ClustermapChangeNotification],
    );
    let rev = view.change();
    assert_notification(&witness.recv_packet(), b"default", rev);
    set_vbucket(&mut server.client());
    assert_notification(&witness.recv_packet(), b"default", rev + 1);
    plain.send_req(RequestBuilder::new(Opcode::Noop));
    let p = plain.recv_packet();
    assert_eq!((p.magic, p.opcode), (0x81, Opcode::Noop.as_u8()));
}

#[test]
fn a_connection_without_a_bucket_is_pushed_the_global_config() {
    let mut store = UserStore::empty().with_iterations(1);
    store
        .insert_with_password(
            "app",
            "pw",
            Roles::parse_list("data_reader[default]").unwrap(),
        )
        .unwrap();
    let view = StubView::new();
    let server = server_with(&view, Some(UserDirectory::new(store)));
    let mut c = subscribed(
        &server,
        &[
            Feature::Json,
            Feature::Duplex,
            Feature::ClustermapChangeNotification,
        ],
    );
    let rev = view.change();
    let p = c.recv_packet();
    assert_notification(&p, b"", rev);
    assert_eq!(
        p.value,
        format!("{{\"rev\":{rev},\"global\":true}}").into_bytes()
    );
}

#[test]
fn dedupe_sends_each_map_version_once_in_not_my_vbucket_replies() {
    let view = StubView::new();
    let server = server_with(&view, None);
    let mut c = subscribed(
        &server,
        &[Feature::Json, Feature::DedupeNotMyVbucketClustermap],
    );
    assert_eq!(nmvb(&mut c).value, br#"{"rev":1,"name":"default"}"#);
    assert!(nmvb(&mut c).value.is_empty(), "this version was sent");
    view.change();
    assert_eq!(nmvb(&mut c).value, br#"{"rev":2,"name":"default"}"#);
    assert!(nmvb(&mut c).value.is_empty());

    // A client without dedupe gets the map every time.
    let mut plain = subscribed(&server, &[Feature::Json]);
    assert!(!nmvb(&mut plain).value.is_empty());
    assert!(!nmvb(&mut plain).value.is_empty());

    // A notified version counts as sent.
    let mut both = subscribed(
        &server,
        &[
            Feature::Json,
            Feature::Duplex,
            Feature::ClustermapChangeNotificationBrief,
            Feature::DedupeNotMyVbucketClustermap,
        ],
    );
    let rev = view.change();
    assert_notification(&both.recv_packet(), b"default", rev);
    assert!(nmvb(&mut both).value.is_empty());

    // So does a map fetched with GET_CLUSTER_CONFIG.
    let mut fetched = subscribed(
        &server,
        &[Feature::Json, Feature::DedupeNotMyVbucketClustermap],
    );
    let r = fetched.request(RequestBuilder::new(Opcode::GetClusterConfig));
    assert_eq!(r.status, 0);
    assert!(nmvb(&mut fetched).value.is_empty());
}
