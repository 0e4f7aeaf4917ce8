//! A static cluster of epkv-server processes on loopback: each node holds the vBuckets the
//! cluster file gives it, replicates its replicas over DCP from their actives, serves them
//! with GET_REPLICA, and after a manual failover serves the failed node's vBuckets from
//! the replicas it promoted.

use crate::harness::{Server, TestDir, free_ports, http_request, key};
use epkv_client::{Client, StoreOptions};
use epkv_protocol::{Opcode, RequestBuilder, Status};
use epkv_types::Vbid;
use std::time::Duration;

/// A cluster of `ports.len()` nodes with `replicas` replicas, each node with its own data
/// directory.
pub(crate) struct Cluster {
    pub(crate) nodes: Vec<Option<Server>>,
    ports: Vec<u16>,
    dir: TestDir,
    /// Extra server flags (users).
    extra: Vec<String>,
}

/// The administrator of [`Cluster::start_with_admin`]'s nodes.
const ADMIN: (&str, &str) = ("Administrator", "password");

impl Cluster {
    pub(crate) fn start(n: usize, replicas: usize) -> Cluster {
        Cluster::start_as(n, replicas, false)
    }

    /// As [`Cluster::start`], the nodes with an administrator ([`ADMIN`]) they also
    /// replicate as.
    pub(crate) fn start_with_admin(n: usize, replicas: usize) -> Cluster {
        Cluster::start_as(n, replicas, true)
    }

    fn start_as(n: usize, replicas: usize, admin: bool) -> Cluster {
        let dir = TestDir::new();
        std::fs::create_dir_all(dir.path()).unwrap();
        let ports = free_ports(n);
        let mut file = format!("replicas = {replicas}\n");
        let mut extra = Vec::new();
        if admin {
            file.push_str(&format!(
                "user = \"{}\"\npassword = \"{}\"\n",
                ADMIN.0, ADMIN.1
            ));
            extra = ["--admin-user", ADMIN.0, "--admin-password", ADMIN.1]
                .map(String::from)
                .to_vec();
        }
        for p in &ports {
            file.push_str(&format!("[[nodes]]\nhost = \"127.0.0.1\"\nport = {p}\n"));
        }
        let path = dir.path().join("cluster.toml");
        std::fs::write(&path, file).unwrap();
        let mut cluster = Cluster {
            nodes: Vec::new(),
            ports,
            dir,
            extra,
        };
        for i in 0..n {
            let node = cluster.spawn(i);
            cluster.nodes.push(Some(node));
        }
        cluster
    }

    /// Starts node `i` on its port and data directory.
    fn spawn(&self, i: usize) -> Server {
        let data = self.dir.path().join(format!("node{i}"));
        let path = self.dir.path().join("cluster.toml");
        let port = self.ports[i].to_string();
        let index = i.to_string();
        let mut args = vec![
            "--port",
            &port,
            "--testing",
            "--cluster",
            path.to_str().unwrap(),
            "--cluster-node",
            &index,
        ];
        args.extend(self.extra.iter().map(String::as_str));
        Server::spawn_in_exact(&data, &args)
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

/// `POST /controller/failOver` of the node at `dead` to `server`; the HTTP status.
fn fail_over(server: &Server, dead: std::net::SocketAddr) -> u16 {
    post(server, "/controller/failOver", dead)
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
    let r = fail_over(cluster.node(1), dead_addr);
    assert_eq!(r, 200);
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
    // The failed node leaves the map's server list: node 1 is its first entry now.
    assert_eq!(
        map["vBucketServerMap"]["serverList"],
        serde_json::json!([cluster.node(1).addr.to_string()])
    );
    assert_eq!(
        map["vBucketServerMap"]["vBucketMap"][0],
        serde_json::json!([0, -1])
    );
    // A second failover of the same node changes nothing; an unknown node is an error.
    let again = fail_over(cluster.node(1), dead_addr);
    assert_eq!(again, 200);
    let unknown = fail_over(cluster.node(1), "10.9.9.9:1".parse().unwrap());
    assert_eq!(unknown, 400);
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

async fn wait_for<F>(what: &str, mut check: F)
where
    F: AsyncFnMut() -> bool,
{
    for _ in 0..400 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// `POST path` with `otpNode` = `node` to `server`'s management port; the HTTP status.
fn post(server: &Server, path: &str, node: std::net::SocketAddr) -> u16 {
    http_request(
        server.mgmt_addr(),
        "POST",
        path,
        None,
        Some(&format!("otpNode={node}")),
    )
    .status
}

#[tokio::test]
async fn a_failed_node_rejoins_as_a_replica_and_rolls_back_what_the_new_active_never_had() {
    let mut cluster = Cluster::start(2, 1);
    let mut c0 = cluster.client(0).await;
    let mut c1 = cluster.client(1).await;
    // Keys whose vBucket is active on node 0 (even vBuckets) and on node 1 (odd).
    let on = |node: usize, prefix: &str, n: usize, c: &Client| -> Vec<Vec<u8>> {
        (0..)
            .map(|i| key(&format!("{prefix}-{i}")))
            .filter(|k| active_of(c.vbucket_for(k), 2) == node)
            .take(n)
            .collect()
    };
    let a0 = on(0, "a", 50, &c0);
    let a1 = on(1, "a", 50, &c0);
    for k in &a0 {
        assert!(
            c0.set(k, b"a", StoreOptions::new())
                .await
                .unwrap()
                .is_success()
        );
    }
    for k in &a1 {
        assert!(
            c1.set(k, b"a", StoreOptions::new())
                .await
                .unwrap()
                .is_success()
        );
    }
    for k in &a0 {
        wait_for("A on node 1's replicas", async || {
            get_replica(&mut c1, k).await == (0, b"a".to_vec())
        })
        .await;
    }
    // Node 1 stops (cleanly); node 0 takes writes it cannot replicate, then dies; node
    // 1 comes back and is told node 0 is gone.
    let (status, _) = cluster.nodes[1].take().unwrap().terminate();
    assert!(status.success());
    let unreplicated = on(0, "u", 20, &c0);
    for k in &unreplicated {
        assert!(
            c0.set(k, b"u", StoreOptions::new())
                .await
                .unwrap()
                .is_success()
        );
    }
    let dead = cluster.nodes[0].take().unwrap();
    let dead_addr = dead.addr;
    let _ = dead.kill();
    let node1 = cluster.spawn(1);
    cluster.nodes[1] = Some(node1);
    assert_eq!(fail_over(cluster.node(1), dead_addr), 200);
    let mut c1 = cluster.client(1).await;
    let b0 = on(0, "b", 30, &c1);
    for k in &b0 {
        // The promotion is applied right after the failover call returns.
        wait_for("the promoted vBuckets to take writes", async || {
            c1.set(k, b"b", StoreOptions::new())
                .await
                .unwrap()
                .is_success()
        })
        .await;
    }
    for k in &unreplicated {
        assert_eq!(
            c1.get(k).await.unwrap().status_raw,
            Status::KeyEnoent as u16
        );
    }
    // Node 0 comes back: it learns it was failed over and holds nothing.
    let node0 = cluster.spawn(0);
    cluster.nodes[0] = Some(node0);
    let mut c0 = cluster.client(0).await;
    let r = c0.get(&a0[0]).await.unwrap();
    assert_eq!(
        r.status_raw,
        Status::NotMyVbucket as u16,
        "a failed node serves nothing"
    );
    // Added back on both nodes, it replicates again: its vBuckets that diverged roll back.
    assert_eq!(
        post(
            cluster.node(1),
            "/controller/reAddNode",
            cluster.node(0).addr
        ),
        200
    );
    assert_eq!(
        post(
            cluster.node(0),
            "/controller/reAddNode",
            cluster.node(0).addr
        ),
        200
    );
    for k in a0.iter().chain(&a1).chain(&b0) {
        let want = if b0.contains(k) {
            b"b".to_vec()
        } else {
            b"a".to_vec()
        };
        wait_for("every write of node 1 on node 0's replicas", async || {
            get_replica(&mut c0, k).await == (0, want.clone())
        })
        .await;
    }
    for k in &unreplicated {
        assert_eq!(
            get_replica(&mut c0, k).await.0,
            Status::KeyEnoent as u16,
            "node 0 rolled back the writes the new active never had"
        );
    }
    // Node 1 stays the active of everything.
    let map = c1.get_cluster_config(None).await.unwrap();
    let map: serde_json::Value = serde_json::from_slice(&map.value).unwrap();
    assert_eq!(
        map["vBucketServerMap"]["vBucketMap"][0],
        serde_json::json!([1, 0])
    );
}

/// Writers at Majority and PersistToMajority against node 0's active vBuckets while node
/// 0 is SIGKILLed: after the failover, every write that was acknowledged is on node 1
/// with its value (or a later one of the same writer).
#[tokio::test]
async fn every_acknowledged_durable_write_survives_a_failover() {
    use epkv_protocol::DurabilityRequirement;
    use epkv_types::DurabilityLevel;
    let mut cluster = Cluster::start(2, 1);
    let c = cluster.client(0).await;
    let keys: Vec<Vec<u8>> = (0..)
        .map(|i| key(&format!("d-{i}")))
        .filter(|k| active_of(c.vbucket_for(k), 2) == 0)
        .take(16)
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for (w, k) in keys.iter().enumerate() {
        let mut c = cluster.client(0).await;
        let (k, stop) = (k.clone(), std::sync::Arc::clone(&stop));
        let level = if w % 2 == 0 {
            DurabilityLevel::Majority
        } else {
            DurabilityLevel::PersistToMajority
        };
        writers.push(tokio::spawn(async move {
            let opts = StoreOptions {
                durability: Some(DurabilityRequirement {
                    level,
                    timeout: Some(Duration::from_secs(5)),
                }),
                ..StoreOptions::new()
            };
            // The last value acknowledged.
            let mut acked: Option<u64> = None;
            for n in 0u64..100_000 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                match c.set(&k, n.to_string().as_bytes(), opts).await {
                    Ok(r) if r.is_success() => acked = Some(n),
                    Ok(_) => {}
                    // Node 0 died.
                    Err(_) => break,
                }
            }
            (k, acked)
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let dead = cluster.nodes[0].take().unwrap();
    let dead_addr = dead.addr;
    let _ = dead.kill();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acked = Vec::new();
    for w in writers {
        acked.push(w.await.unwrap());
    }
    assert!(
        acked.iter().any(|(_, a)| a.is_some()),
        "some durable writes were acknowledged before the kill"
    );
    assert_eq!(fail_over(cluster.node(1), dead_addr), 200);
    let mut c1 = cluster.client(1).await;
    for (k, last) in acked {
        let Some(last) = last else { continue };
        let mut found = None;
        wait_for("the promoted copy of an acknowledged write", async || {
            let r = c1.get(&k).await.unwrap();
            if r.is_success() {
                found = std::str::from_utf8(&r.value)
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok());
                true
            } else {
                false
            }
        })
        .await;
        let found = found.expect("a value");
        // The acknowledged value, or the one after it (prepared on the replica when node
        // 0 died, committed by the promotion).
        assert!(
            found == last || found == last + 1,
            "{}: acknowledged {last}, found {found}",
            String::from_utf8_lossy(&k)
        );
    }
}

/// Three nodes, one replica: each vBucket's replica is on the node after its active's,
/// and a failover of one node promotes its vBuckets' replicas on the next node while the
/// third keeps its own.
#[tokio::test]
async fn three_nodes_replicate_to_the_next_node_and_fail_over_one() {
    let mut cluster = Cluster::start(3, 1);
    let mut clients = Vec::new();
    for i in 0..3 {
        clients.push(cluster.client(i).await);
    }
    let keys: Vec<Vec<u8>> = (0..90).map(|i| key(&format!("t-{i}"))).collect();
    for k in &keys {
        let node = active_of(clients[0].vbucket_for(k), 3);
        assert!(
            clients[node]
                .set(k, b"3", StoreOptions::new())
                .await
                .unwrap()
                .is_success()
        );
    }
    for k in &keys {
        let replica = (active_of(clients[0].vbucket_for(k), 3) + 1) % 3;
        wait_for("a write on the next node's replica", async || {
            get_replica(&mut clients[replica], k).await == (0, b"3".to_vec())
        })
        .await;
    }
    let dead = cluster.nodes[2].take().unwrap();
    let dead_addr = dead.addr;
    let _ = dead.kill();
    for i in 0..2 {
        assert_eq!(fail_over(cluster.node(i), dead_addr), 200);
    }
    for k in &keys {
        let vb = clients[0].vbucket_for(k);
        // Node 2's vBuckets now live on node 0 (its replica); the others stay.
        let node = match active_of(vb, 3) {
            2 => 0,
            n => n,
        };
        let mut c = cluster.client(node).await;
        wait_for("every key on its (possibly promoted) active", async || {
            let r = c.get(k).await.unwrap();
            r.is_success() && r.value.as_ref() == b"3"
        })
        .await;
    }
}

/// A survivor that restarts while the failed node is still down keeps the map it had
/// (its state file), so it still serves the promoted vBuckets.
#[tokio::test]
async fn a_restarted_survivor_keeps_its_failovers() {
    let mut cluster = Cluster::start(2, 1);
    let mut c0 = cluster.client(0).await;
    let k = (0..)
        .map(|i| key(&format!("s-{i}")))
        .find(|k| active_of(c0.vbucket_for(k), 2) == 0)
        .unwrap();
    assert!(
        c0.set(&k, b"kept", StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
    let mut c1 = cluster.client(1).await;
    wait_for("the replica", async || {
        get_replica(&mut c1, &k).await == (0, b"kept".to_vec())
    })
    .await;
    let dead = cluster.nodes[0].take().unwrap();
    let dead_addr = dead.addr;
    let _ = dead.kill();
    assert_eq!(fail_over(cluster.node(1), dead_addr), 200);
    let (status, _) = cluster.nodes[1].take().unwrap().terminate();
    assert!(status.success());
    cluster.nodes[1] = Some(cluster.spawn(1));
    let mut c1 = cluster.client(1).await;
    wait_for(
        "the restarted survivor to serve the promoted vBucket",
        async || {
            let r = c1.get(&k).await.unwrap();
            r.is_success() && r.value.as_ref() == b"kept"
        },
    )
    .await;
    let map = c1.get_cluster_config(None).await.unwrap();
    let map: serde_json::Value = serde_json::from_slice(&map.value).unwrap();
    assert_eq!(map["epkvFailedNodes"], serde_json::json!([0]));
}

/// A bucket created at run time on every node of a cluster takes the map's states and
/// replicates like the others.
#[tokio::test]
async fn a_bucket_created_on_every_node_follows_the_map() {
    let cluster = Cluster::start_with_admin(2, 1);
    for i in 0..2 {
        let r = http_request(
            cluster.node(i).mgmt_addr(),
            "POST",
            "/pools/default/buckets",
            Some(ADMIN),
            Some("name=rt&ramQuotaMB=16"),
        );
        assert!(
            r.status == 202 || r.status == 200,
            "{} {}",
            r.status,
            r.body
        );
    }
    let mut c = [cluster.client(0).await, cluster.client(1).await];
    for x in &mut c {
        x.auth_plain(ADMIN.0, ADMIN.1).await.unwrap();
        // The bucket is there once the creation (202 Accepted) has finished.
        wait_for("the new bucket", async || {
            x.select_bucket("rt").await.unwrap().is_success()
        })
        .await;
    }
    let k = key("rt-key");
    let active = active_of(c[0].vbucket_for(&k), 2);
    wait_for("the other node to refuse the key", async || {
        c[1 - active]
            .set(&k, b"x", StoreOptions::new())
            .await
            .unwrap()
            .status_raw
            == Status::NotMyVbucket as u16
    })
    .await;
    assert!(
        c[active]
            .set(&k, b"rt", StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
    let mut replica = cluster.client(1 - active).await;
    replica.auth_plain(ADMIN.0, ADMIN.1).await.unwrap();
    assert!(replica.select_bucket("rt").await.unwrap().is_success());
    wait_for("the new bucket's replica", async || {
        get_replica(&mut replica, &k).await == (0, b"rt".to_vec())
    })
    .await;
}
