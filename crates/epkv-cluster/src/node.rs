//! [`Cluster`]: this node's view of the cluster, and what keeps the node in line with it.
//!
//! It owns the topology (or none, on a single node), the map's revision, and the
//! replication tasks. It brings every bucket's vBucket states and replication chains in
//! line with the topology, restarts replication whenever the topology changes, applies
//! manual failovers and re-adds, and answers the front end's questions through
//! [`ClusterView`] (the cluster-map JSON, [`crate::map_json`]).

use crate::map_json::{self, REV_EPOCH};
use crate::replication;
use crate::topology::Topology;
use epkv_engine_api::{ClusterView, Engine, EngineStatus, MapListener, NodePorts};
use epkv_types::{NUM_VBUCKETS, VBucketState, Vbid};
use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::watch;

/// The buckets this node serves, by name, as the cluster sees them: read each time the
/// topology is applied, so buckets created or dropped at run time are included.
pub type BucketList = Arc<dyn Fn() -> Vec<(String, Arc<dyn Engine>)> + Send + Sync>;

/// How long a vBucket state change is retried while the vBucket warms up (TempFail).
const STATE_RETRIES: u32 = 600;
/// The pause between two of those retries.
const STATE_RETRY_PAUSE: Duration = Duration::from_millis(100);
/// How long a node is asked for the failovers it knows of before it is skipped.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// This node's part in the cluster: the topology, the map's revision and replication.
pub struct Cluster {
    /// The buckets to keep in line with the topology.
    buckets: BucketList,
    /// The map's revision: starts at 1 and grows on every change of the map.
    rev: AtomicI64,
    /// The cluster this node is in; `None` on a single node, which holds every vBucket
    /// its engines have active.
    topology: parking_lot::RwLock<Option<Topology>>,
    /// Stops the current replication tasks (replaced on every topology change).
    replication_stop: parking_lot::Mutex<Option<watch::Sender<bool>>>,
    /// The runtime replication tasks run on, once [`Cluster::start`] ran.
    runtime: OnceLock<tokio::runtime::Handle>,
    /// Serializes topology applications, so that the last one applied is the newest
    /// topology (a failover may arrive while the first one waits for warmup).
    apply_lock: tokio::sync::Mutex<()>,
    /// Told the new version after every change of the map ([`ClusterView::subscribe`]);
    /// the lock is held only to call them (they must not call back into the cluster).
    listeners: parking_lot::Mutex<Vec<MapListener>>,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("rev", &self.rev.load(Ordering::Relaxed))
            .field("topology", &*self.topology.read())
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// A node in `topology` (`None`: a single node), serving `buckets`.
    #[must_use]
    pub fn new(topology: Option<Topology>, buckets: BucketList) -> Arc<Cluster> {
        Arc::new(Cluster {
            buckets,
            rev: AtomicI64::new(1),
            topology: parking_lot::RwLock::new(topology),
            replication_stop: parking_lot::Mutex::new(None),
            runtime: OnceLock::new(),
            apply_lock: tokio::sync::Mutex::new(()),
            listeners: parking_lot::Mutex::new(Vec::new()),
        })
    }

    /// Whether this node is in a cluster (a cluster file was given).
    #[must_use]
    pub fn is_clustered(&self) -> bool {
        self.topology.read().is_some()
    }

    /// Before the node serves: remembers the runtime replication runs on, and, in a
    /// cluster, learns the failovers the other nodes know of, sets the vBuckets' states
    /// from the map and starts replication (clients wait in the listen backlog
    /// meanwhile). Must be awaited inside the Tokio runtime that serves the node.
    pub async fn start(self: &Arc<Self>) {
        let _ = self.runtime.set(tokio::runtime::Handle::current());
        if self.is_clustered() {
            self.learn_failovers().await;
            Arc::clone(self).apply_topology_now().await;
        }
    }

    /// The current map's revision.
    #[must_use]
    pub fn rev(&self) -> i64 {
        self.rev.load(Ordering::Acquire)
    }

    /// Records a change of the map and tells the listeners (the front end, which
    /// notifies the connections that asked for it).
    fn bump_rev(&self) {
        let rev = self.rev.fetch_add(1, Ordering::AcqRel) + 1;
        for listener in self.listeners.lock().iter() {
            listener((REV_EPOCH, rev));
        }
    }

    /// Brings every bucket's vBucket states in line with the topology, and restarts
    /// replication from the nodes holding the active copies of this node's replicas.
    /// Runs on the serving runtime (a state change waits for warmup: TempFail is retried
    /// for up to a minute).
    fn apply_topology(self: &Arc<Self>) {
        let Some(rt) = self.runtime.get() else {
            return;
        };
        rt.spawn(Arc::clone(self).apply_topology_now());
    }

    /// The state and replication-chain part of [`Self::apply_topology`], at once, so that
    /// a failover's promotions and chains are in place when the REST call returns (a
    /// vBucket still warming up is left to the asynchronous pass).
    fn apply_states_now(&self) {
        let Some(t) = self.topology.read().clone() else {
            return;
        };
        for (name, engine) in (self.buckets)() {
            for v in 0..NUM_VBUCKETS {
                let vb = Vbid(v);
                let want = t.state_of(vb);
                if engine.vbucket_state(vb) != Some(want)
                    && let Err(e) = engine.set_vbucket_state(vb, want)
                {
                    tracing::debug!(bucket = %name, %vb, error = %e, "state change left to the asynchronous pass");
                }
            }
            set_chains(&name, &*engine, &t);
        }
    }

    /// [`Self::apply_topology`], awaited (the first time, before the node serves).
    async fn apply_topology_now(self: Arc<Self>) {
        let _one_at_a_time = self.apply_lock.lock().await;
        let Some(t) = self.topology.read().clone() else {
            return;
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        if let Some(old) = self.replication_stop.lock().replace(stop_tx) {
            let _ = old.send(true);
        }
        for (name, engine) in (self.buckets)() {
            set_states(&name, &*engine, &t).await;
            for (node, vbuckets) in t.sources() {
                let addr = match t.kv_addr(node) {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::error!(bucket = %name, node, error = %e, "cannot replicate from a node");
                        continue;
                    }
                };
                let source = replication::Source {
                    bucket: name.clone(),
                    engine: Arc::clone(&engine),
                    addr,
                    vbuckets,
                    credentials: t.credentials(),
                    name: format!("replication:{}->{}:{name}", node, t.this()),
                };
                tokio::spawn(replication::run(source, stop_rx.clone()));
            }
        }
    }

    /// Before serving: asks the other nodes which nodes they failed over (a node that
    /// was failed over while it was down must not take its old vBuckets back) and
    /// applies those failovers. Nodes that do not answer within a few seconds are
    /// skipped (a whole cluster starting together has none to learn).
    async fn learn_failovers(&self) {
        let Some(t) = self.topology.read().clone() else {
            return;
        };
        let Some((bucket, _)) = (self.buckets)().into_iter().next() else {
            return;
        };
        let mut failed = BTreeSet::new();
        for i in 0..t.nodes().len() {
            if i == t.this() {
                continue;
            }
            let Ok(addr) = t.kv_addr(i) else { continue };
            let credentials = t.credentials();
            let asked = tokio::time::timeout(
                ASK_TIMEOUT,
                replication::fetch_map(addr, credentials.as_ref(), &bucket),
            )
            .await;
            match asked {
                Ok(Ok(map)) => {
                    for f in map["epkvFailedNodes"].as_array().into_iter().flatten() {
                        if let Some(f) = f.as_u64().and_then(|f| usize::try_from(f).ok()) {
                            failed.insert(f);
                        }
                    }
                }
                Ok(Err(e)) => {
                    tracing::info!(node = i, error = %e, "cannot ask a node for its cluster map")
                }
                Err(_) => tracing::info!(node = i, "a node did not answer for its cluster map"),
            }
        }
        if failed.is_empty() {
            return;
        }
        let mut t = self.topology.write();
        if let Some(t) = t.as_mut() {
            for f in failed {
                if t.mark_failed(f) {
                    if f == t.this() {
                        tracing::warn!(
                            "this node was failed over while it was down: it holds no vBuckets until it is added back (POST /controller/reAddNode)"
                        );
                    } else {
                        tracing::warn!(node = f, "learned a failover from the other nodes");
                    }
                }
            }
        }
        drop(t);
        self.bump_rev();
    }

    /// Adds failed-over node `node` back ([`Topology::re_add`]): it becomes a replica
    /// again of the vBuckets the cluster file gave it. Sent to every node, the re-added
    /// one included. Returns whether anything changed.
    ///
    /// # Errors
    /// No cluster is configured, or no such node.
    pub fn re_add(self: &Arc<Self>, node: &str) -> Result<bool, String> {
        self.change_topology(node, "node added back as a replica", |t, i| Ok(t.re_add(i)))
    }

    /// Fails node `node` (`host:port` as the cluster file names it, or its index) over
    /// ([`Topology::fail_over`]): this node promotes the replicas it holds of that node's
    /// active vBuckets, replicates from the new actives, and the map's revision moves
    /// on. Returns whether anything changed.
    ///
    /// # Errors
    /// No cluster is configured, no such node, or `node` is this node.
    pub fn fail_over(self: &Arc<Self>, node: &str) -> Result<bool, String> {
        self.change_topology(node, "node failed over", |t, i| {
            if i == t.this() {
                return Err("a node cannot fail itself over".into());
            }
            Ok(t.fail_over(i))
        })
    }

    /// Applies `change` to the topology for node `node`; when it changed anything, the
    /// new states and chains take effect before this returns, the map's revision moves
    /// on, and replication restarts.
    fn change_topology(
        self: &Arc<Self>,
        node: &str,
        what: &str,
        change: impl FnOnce(&mut Topology, usize) -> Result<bool, String>,
    ) -> Result<bool, String> {
        let changed = {
            let mut t = self.topology.write();
            let t = t.as_mut().ok_or("this node is not in a cluster")?;
            let i = t
                .node_named(node)
                .ok_or_else(|| format!("no node {node} in the cluster"))?;
            change(t, i)?
        };
        if changed {
            tracing::warn!(node, "{what}");
            self.apply_states_now();
            self.bump_rev();
            self.apply_topology();
        }
        Ok(changed)
    }

    /// Records that a bucket was created or dropped, so clients that poll the map see a
    /// new revision. In a cluster, a new bucket's vBuckets then take the states the map
    /// gives them (at once where they can, the rest once warm), and replication restarts
    /// for every bucket.
    pub fn buckets_changed(self: &Arc<Self>) {
        if self.is_clustered() {
            self.apply_states_now();
            self.apply_topology();
        }
        self.bump_rev();
    }
}

impl ClusterView for Cluster {
    fn version(&self) -> (i64, i64) {
        (REV_EPOCH, self.rev())
    }

    fn map_changed(&self) {
        self.bump_rev();
    }

    fn subscribe(&self, listener: MapListener) {
        self.listeners.lock().push(listener);
    }

    fn bucket_config(
        &self,
        name: &str,
        engine: &dyn Engine,
        local: SocketAddr,
        ports: NodePorts,
    ) -> String {
        map_json::bucket_config(
            name,
            self.rev(),
            local,
            ports,
            engine,
            self.topology.read().as_ref(),
        )
    }

    fn global_config(&self, local: SocketAddr, ports: NodePorts) -> String {
        map_json::global_config(self.rev(), local, ports)
    }
}

/// Tells each active vBucket of `engine` its replication chain.
fn set_chains(bucket: &str, engine: &dyn Engine, t: &Topology) {
    for v in 0..NUM_VBUCKETS {
        let vb = Vbid(v);
        if t.state_of(vb) == VBucketState::Active {
            let chain = t.chain(vb);
            let replicas = chain.len().saturating_sub(1);
            let live = chain.iter().skip(1).filter(|n| n.is_some()).count();
            if let Err(e) = engine.set_replication_chain(vb, replicas, live) {
                tracing::error!(bucket, %vb, error = %e, "cannot set a vBucket's replication chain");
            }
        }
    }
}

/// Sets each vBucket of `engine` to the state the topology gives it.
async fn set_states(bucket: &str, engine: &dyn Engine, t: &Topology) {
    let mut changed = 0;
    for v in 0..NUM_VBUCKETS {
        let vb = Vbid(v);
        let want = t.state_of(vb);
        for attempt in 0..STATE_RETRIES {
            if engine.vbucket_state(vb) == Some(want) {
                break;
            }
            match engine.set_vbucket_state(vb, want) {
                Ok(()) => {
                    changed += 1;
                    break;
                }
                Err(EngineStatus::TempFail) if attempt + 1 < STATE_RETRIES => {
                    tokio::time::sleep(STATE_RETRY_PAUSE).await;
                }
                Err(e) => {
                    tracing::error!(bucket, %vb, state = want.as_str(), error = %e, "cannot set a vBucket's state from the cluster map");
                    break;
                }
            }
        }
    }
    set_chains(bucket, engine, t);
    tracing::info!(
        bucket,
        changed,
        node = t.this(),
        "vBucket states follow the cluster map"
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;
    use crate::topology::{ClusterFile, NodeSpec};
    use epkv_engine::{Bucket, BucketConfig, EngineClock};

    const PORTS: NodePorts = NodePorts {
        kv: 12000,
        kv_ssl: None,
        mgmt: None,
    };

    fn bucket() -> Arc<dyn Engine> {
        Bucket::new(BucketConfig::default(), EngineClock::System).unwrap()
    }

    fn serving(engine: &Arc<dyn Engine>) -> BucketList {
        let engine = Arc::clone(engine);
        Arc::new(move || vec![("default".to_owned(), Arc::clone(&engine))])
    }

    fn two_nodes() -> Topology {
        let file = ClusterFile {
            replicas: 1,
            nodes: (0..2)
                .map(|i| NodeSpec {
                    host: "127.0.0.1".into(),
                    port: 12000 + i * 100,
                    mgmt_port: None,
                })
                .collect(),
            user: None,
            password: None,
        };
        Topology::new(file, 0).unwrap()
    }

    fn map_of(cluster: &Cluster, engine: &Arc<dyn Engine>) -> serde_json::Value {
        let local: SocketAddr = "127.0.0.1:12000".parse().unwrap();
        let json = cluster.bucket_config("default", &**engine, local, PORTS);
        serde_json::from_str(&json).unwrap()
    }

    #[test]
    fn a_single_node_serves_the_vbuckets_its_engine_has_active() {
        let engine = bucket();
        let cluster = Cluster::new(None, serving(&engine));
        assert!(!cluster.is_clustered());
        engine
            .set_vbucket_state(Vbid(5), VBucketState::Replica)
            .unwrap();
        let map = map_of(&cluster, &engine);
        let rows = map["vBucketServerMap"]["vBucketMap"].as_array().unwrap();
        assert_eq!(rows.len(), usize::from(NUM_VBUCKETS));
        assert_eq!(rows[0], serde_json::json!([0]));
        assert_eq!(rows[5], serde_json::json!([-1]));
        assert_eq!(map["rev"], 1);
    }

    #[test]
    fn every_change_moves_the_version_on() {
        let engine = bucket();
        let cluster = Cluster::new(None, serving(&engine));
        assert_eq!(cluster.version(), (REV_EPOCH, 1));
        cluster.map_changed();
        assert_eq!(cluster.version(), (REV_EPOCH, 2));
        cluster.buckets_changed();
        assert_eq!(cluster.version(), (REV_EPOCH, 3));
        let global = cluster.global_config("127.0.0.1:12000".parse().unwrap(), PORTS);
        assert!(global.starts_with("{\"rev\":3,"), "{global}");
    }

    #[test]
    fn listeners_hear_every_change_with_its_version() {
        let engine = bucket();
        let cluster = Cluster::new(Some(two_nodes()), serving(&engine));
        let heard = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let sink = Arc::clone(&heard);
        cluster.subscribe(Box::new(move |v| sink.lock().push(v)));
        cluster.map_changed();
        cluster.buckets_changed();
        assert!(cluster.fail_over("1").unwrap());
        assert!(cluster.re_add("1").unwrap());
        assert_eq!(
            *heard.lock(),
            vec![
                (REV_EPOCH, 2),
                (REV_EPOCH, 3),
                (REV_EPOCH, 4),
                (REV_EPOCH, 5)
            ]
        );
        assert_eq!(cluster.version(), (REV_EPOCH, 5));
    }

    #[test]
    fn a_single_node_refuses_failover() {
        let cluster = Cluster::new(None, serving(&bucket()));
        assert_eq!(
            cluster.fail_over("1").unwrap_err(),
            "this node is not in a cluster"
        );
        assert!(cluster.re_add("1").is_err());
    }

    #[test]
    fn failover_promotes_this_nodes_replicas_before_it_returns() {
        let engine = bucket();
        let cluster = Cluster::new(Some(two_nodes()), serving(&engine));
        // What the first application would do (no runtime: nothing is spawned).
        cluster.apply_states_now();
        assert_eq!(engine.vbucket_state(Vbid(0)), Some(VBucketState::Active));
        assert_eq!(engine.vbucket_state(Vbid(1)), Some(VBucketState::Replica));
        let before = cluster.version();

        assert!(
            cluster.fail_over("0").is_err(),
            "a node cannot fail itself over"
        );
        assert!(cluster.fail_over("127.0.0.1:12100").unwrap());
        assert_eq!(engine.vbucket_state(Vbid(1)), Some(VBucketState::Active));
        assert!(cluster.version() > before);
        let map = map_of(&cluster, &engine);
        assert_eq!(map["epkvFailedNodes"], serde_json::json!([1]));
        assert_eq!(
            map["vBucketServerMap"]["vBucketMap"][1],
            serde_json::json!([0, -1])
        );
        // Failing it over again changes nothing. Adding it back returns it as a replica;
        // the promoted active stays here.
        assert!(!cluster.fail_over("1").unwrap());
        assert!(cluster.re_add("1").unwrap());
        let map = map_of(&cluster, &engine);
        assert_eq!(map["epkvFailedNodes"], serde_json::json!([]));
        assert_eq!(
            map["vBucketServerMap"]["vBucketMap"][1],
            serde_json::json!([0, 1])
        );
        assert_eq!(engine.vbucket_state(Vbid(1)), Some(VBucketState::Active));
    }
}
