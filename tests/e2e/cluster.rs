//! A static cluster of epkv-server processes on loopback: each node holds the vBuckets the
//! cluster file gives it, replicates its replicas over DCP from their actives, serves them
//! with GET_REPLICA, and after a manual failover serves the failed node's vBuckets from
//! the replicas it promoted.

use crate::harness::{Server, TestDir, http_request, key};
use epkv_client::{Client, StoreOptions};
use epkv_protocol::{Opcode, RequestBuilder, Status};
use epkv_types::Vbid;
use std::time::Duration;

/// Free loopback ports (bound then released; a clash with another process is possible
/// but unlikely in the moment between).
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// A cluster of `ports.len()` nodes with `replicas` replicas, each node with its own data
/// directory.
pub(crate) struct Cluster {
    pub(crate) nodes: Vec<Option<Server>>,
    _dir: TestDir,
}

impl Cluster {
    pub(crate) fn start(n: usize, replicas: usize) -> Cluster {
        let dir = TestDir::new();
        std::fs::create_dir_all(dir.path()).unwrap();
        let ports = free_ports(n);
        let mut file = format!("replicas = {replicas}\n");
        for p in &ports {
            file.push_str(&format!("[[nodes]]\nhost = \"127.0.0.1\"\nport = {p}\n"));
        }
        let path = dir.path().join("cluster.toml");
        std::fs::write(&path, file).unwrap();
        let nodes = ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let data = dir.path().join(format!("node{i}"));
                let port = p.to_string();
                let index = i.to_string();
                Some(Server::spawn_in_exact(
                    &data,
                    &[
                        "--port",
                        &port,
                        "--testing",
                        "--cluster",
                        path.to_str().unwrap(),
                        "--cluster-node",
                        &index,
                    ],
                ))
            })
            .collect();
        Cluster { nodes, _dir: dir }
    }

    pub(crate) fn node(&self, i: usize) -> &Server {
        self.nodes[i].as_ref().expect("a live node")
    }

    /// A vBucket-aware client of node `i`.
    pub(crate) async fn client(&self, i: usize) -> Client {
        let mut c = self.node(i).client().await;
        c.hello("cluster-test", &[epkv_protocol::Feature::Xerror])
            .await
            .unwrap();
        c
    }
}

/// The node holding `vb`'s active copy before any failover: `vb mod n`.
fn active_of(vb: Vbid, n: usize) -> usize {
    usize::from(vb.0) % n
}

async fn get_replica(c: &mut Client, k: &[u8]) -> (u16, Vec<u8>) {
    let vb = c.vbucket_for(k);
    let r = c
        .request(RequestBuilder::new(Opcode::GetReplica).key(k).vbucket(vb))
        .await
        .unwrap();
    (r.status_raw, r.value.to_vec())
}

#[tokio::test]
async fn two_nodes_replicate_and_a_failover_serves_the_replicas() {
    let mut cluster = Cluster::start(2, 1);
    let mut clients = [cluster.client(0).await, cluster.client(1).await];
    let keys: Vec<Vec<u8>> = (0..200).map(|i| key(&format!("cl-{i}"))).collect();
    for (i, k) in keys.iter().enumerate() {
        let vb = clients[0].vbucket_for(k);
        let node = active_of(vb, 2);
        // The other node answers NotMyVbucket.
        let other = &mut clients[1 - node];
        let r = other.set(k, b"x", StoreOptions::new()).await.unwrap();
        assert_eq!(r.status_raw, Status::NotMyVbucket as u16);
        let v = format!("value-{i}");
        let r = clients[node]
            .set(k, v.as_bytes(), StoreOptions::new())
            .await
            .unwrap();
        assert!(r.is_success(), "{:?}", r.status());
    }
    // Every document reaches its replica (bounded wait).
    for (i, k) in keys.iter().enumerate() {
        let vb = clients[0].vbucket_for(k);
        let replica = 1 - active_of(vb, 2);
        let want = format!("value-{i}").into_bytes();
        let mut got = (0, Vec::new());
        for _ in 0..200 {
            got = get_replica(&mut clients[replica], k).await;
            if got.0 == 0 && got.1 == want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            got,
            (0, want),
            "{} on its replica",
            String::from_utf8_lossy(k)
        );
        // The active does not serve GET_REPLICA.
        let on_active = get_replica(&mut clients[1 - replica], k).await;
        assert_eq!(on_active.0, Status::NotMyVbucket as u16);
    }
    // The cluster map names both nodes and each vBucket's replica.
    let map = clients[1].get_cluster_config(None).await.unwrap();
    let map: serde_json::Value = serde_json::from_slice(&map.value).unwrap();
    assert_eq!(map["vBucketServerMap"]["numReplicas"], 1);
    assert_eq!(
        map["vBucketServerMap"]["serverList"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        map["vBucketServerMap"]["vBucketMap"][0],
        serde_json::json!([0, 1])
    );
    assert_eq!(
        map["vBucketServerMap"]["vBucketMap"][1],
        serde_json::json!([1, 0])
    );

    // Node 0 dies; node 1 is told; it serves everything.
    let dead = cluster.nodes[0].take().unwrap();
    let dead_addr = dead.addr;
    let _ = dead.kill();
    let r = http_request(
        cluster.node(1).mgmt_addr(),
        "POST",
        "/controller/failOver",
        None,
        Some(&format!("otpNode={dead_addr}")),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let mut c = cluster.client(1).await;
    for (i, k) in keys.iter().enumerate() {
        let want = format!("value-{i}").into_bytes();
        let mut got = None;
        for _ in 0..100 {
            let r = c.get(k).await.unwrap();
            if r.is_success() {
                got = Some(r.value.to_vec());
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(got, Some(want));
    }
    let map = c.get_cluster_config(None).await.unwrap();
    let map: serde_json::Value = serde_json::from_slice(&map.value).unwrap();
    assert_eq!(
        map["vBucketServerMap"]["vBucketMap"][0],
        serde_json::json!([1, -1])
    );
    // A second failover of the same node changes nothing; an unknown node is an error.
    let again = http_request(
        cluster.node(1).mgmt_addr(),
        "POST",
        "/controller/failOver",
        None,
        Some(&format!("otpNode={dead_addr}")),
    );
    assert_eq!(again.status, 200);
    let unknown = http_request(
        cluster.node(1).mgmt_addr(),
        "POST",
        "/controller/failOver",
        None,
        Some("otpNode=10.9.9.9:1"),
    );
    assert_eq!(unknown.status, 400);
    // New writes go to the promoted vBuckets.
    let k = &keys[0];
    assert!(
        c.set(k, b"after", StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
    assert_eq!(c.get(k).await.unwrap().value.as_ref(), b"after");
}
