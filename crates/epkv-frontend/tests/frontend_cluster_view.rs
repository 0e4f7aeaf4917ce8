//! The front end's one question to the cluster, `epkv_engine_api::ClusterView`: the map
//! it serves in GET_CLUSTER_CONFIG and NOT_MY_VBUCKET replies comes from the view it is
//! given, with the ports it listens on, and without a view it serves none.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failure is a test failure"
)]

mod common;

use common::{Client, TestServer};
use epkv_engine_api::{ClusterView, Engine, NodePorts};
use epkv_frontend::FrontendConfig;
use epkv_protocol::{Opcode, RequestBuilder};
use epkv_types::{Datatype, Vbid};
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// A view that names what it was asked with, so the test sees what the front end passed.
#[derive(Default)]
struct StubView {
    rev: AtomicI64,
    /// The ports of the last question.
    ports: Mutex<Option<NodePorts>>,
}

impl ClusterView for StubView {
    fn version(&self) -> (i64, i64) {
        (1, self.rev.load(Ordering::SeqCst))
    }

    fn map_changed(&self) {
        self.rev.fetch_add(1, Ordering::SeqCst);
    }

    fn bucket_config(
        &self,
        name: &str,
        _engine: &dyn Engine,
        local: SocketAddr,
        ports: NodePorts,
    ) -> String {
        *self.ports.lock() = Some(ports);
        format!(
            "{{\"rev\":{},\"name\":\"{name}\",\"local\":\"{local}\"}}",
            self.rev.load(Ordering::SeqCst)
        )
    }

    fn global_config(&self, local: SocketAddr, ports: NodePorts) -> String {
        *self.ports.lock() = Some(ports);
        format!("{{\"global\":\"{local}\"}}")
    }
}

fn config_req(known: Option<(i64, i64)>) -> Vec<u8> {
    let mut extras = Vec::new();
    if let Some((epoch, rev)) = known {
        extras.extend_from_slice(&epoch.to_be_bytes());
        extras.extend_from_slice(&rev.to_be_bytes());
    }
    RequestBuilder::new(Opcode::GetClusterConfig)
        .extras(&extras)
        .to_vec()
        .unwrap()
}

fn ask(c: &mut Client, known: Option<(i64, i64)>) -> common::Resp {
    c.send(&config_req(known));
    c.recv()
}

#[test]
fn the_map_comes_from_the_view_with_the_listening_ports() {
    let view = Arc::new(StubView::default());
    view.rev.store(3, Ordering::SeqCst);
    let server = TestServer::with_config(FrontendConfig {
        mgmt_port: Some(8091),
        cluster: Some(Arc::clone(&view) as Arc<dyn ClusterView>),
        ..FrontendConfig::default()
    });
    let mut c = server.client();
    let r = ask(&mut c, None);
    assert_eq!(r.status, 0);
    let local = c.stream.peer_addr().unwrap();
    assert_eq!(
        String::from_utf8(r.value).unwrap(),
        format!("{{\"rev\":3,\"name\":\"default\",\"local\":\"{local}\"}}")
    );
    assert_eq!(
        *view.ports.lock(),
        Some(NodePorts {
            kv: server.addr.port(),
            kv_ssl: None,
            mgmt: Some(8091),
        })
    );

    // A client that has this version gets an empty answer; an older one the map.
    let r = ask(&mut c, Some((1, 3)));
    assert_eq!((r.status, r.value.len()), (0, 0));
    let r = ask(&mut c, Some((1, 2)));
    assert_eq!(r.status, 0);
    assert!(!r.value.is_empty());

    // SET_VBUCKET tells the view the map changed.
    let r = c.request(
        RequestBuilder::new(Opcode::SetVbucket)
            .vbucket(Vbid(5))
            .extras(&2u32.to_be_bytes()),
    );
    assert_eq!(r.status, 0);
    assert_eq!(view.version(), (1, 4));

    // NOT_MY_VBUCKET carries the current map, as JSON.
    let r = c.request(
        RequestBuilder::new(Opcode::Hello)
            .key(b"test")
            .value(&0x0bu16.to_be_bytes()),
    );
    assert_eq!(r.status, 0);
    let r = c.request(
        RequestBuilder::new(Opcode::Get)
            .key(b"k")
            .vbucket(Vbid(u16::MAX)),
    );
    assert_eq!(r.status, 0x07);
    assert!(Datatype(r.datatype).contains(Datatype::JSON));
    assert!(String::from_utf8(r.value).unwrap().contains("\"rev\":4"));
}

#[test]
fn without_a_view_no_map_is_served() {
    let server = TestServer::start();
    let mut c = server.client();
    let r = ask(&mut c, None);
    assert_eq!(
        r.status, 0x01,
        "KeyNotFound, as KV-Engine with no config set"
    );
    let r = c.request(
        RequestBuilder::new(Opcode::Hello)
            .key(b"test")
            .value(&0x0bu16.to_be_bytes()),
    );
    assert_eq!(r.status, 0);
    let r = c.request(
        RequestBuilder::new(Opcode::Get)
            .key(b"k")
            .vbucket(Vbid(u16::MAX)),
    );
    assert_eq!((r.status, r.value.len()), (0x07, 0));
    // SET_VBUCKET still works.
    let r = c.request(
        RequestBuilder::new(Opcode::SetVbucket)
            .vbucket(Vbid(5))
            .extras(&2u32.to_be_bytes()),
    );
    assert_eq!(r.status, 0);
}
