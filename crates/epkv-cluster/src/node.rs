//! [`Cluster`]: this node's view of the cluster, and what keeps the node in line with it.
//!
//! It owns the topology (or none, on a single node), the map's revision, and the
//! replication tasks. It brings every bucket's vBucket states and replication chains in
//! line with the topology, restarts replication whenever the topology changes, applies
//! manual failovers and re-adds, and answers the front end's questions through
//! [`ClusterView`] (the cluster-map JSON, [`crate::map_json`]).

use crate::coord::{ClusterError, Coordinator, EtcdJoin, FailoverKind};
use crate::doc::{AUTO_FAILOVER_TIMEOUT, AutoFailover, ClusterDoc, Membership};
use crate::map_json::{self, REV_EPOCH};
use crate::replication;
use crate::topology::{NodeSpec, Topology};
use epkv_engine_api::{ClusterView, Engine, EngineStatus, MapListener, NodePorts};
use epkv_types::{NUM_VBUCKETS, VBucketState, Vbid};
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
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
/// One replication task: bucket, the engine serving it here (by address: a bucket
/// dropped and made again is another), source address, DCP connection name.
type SessionKey = (String, usize, SocketAddr, String);

/// A replication task's handles: what stops it, and the set of vBuckets it streams.
struct Session {
    stop: watch::Sender<bool>,
    vbuckets: watch::Sender<Vec<Vbid>>,
}

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
    /// The replication tasks running, each with what stops it: a topology change stops
    /// only the ones whose source or vBuckets changed, so a rebalance's many small
    /// changes do not restart every stream.
    sessions: parking_lot::Mutex<HashMap<SessionKey, Session>>,
    /// vBuckets whose rebalance move ended with this node holding no copy: emptied by
    /// the next topology application (after the map that moved them is installed).
    moved_away: parking_lot::Mutex<BTreeSet<u16>>,
    /// The runtime replication tasks run on, once [`Cluster::start`] ran.
    runtime: OnceLock<tokio::runtime::Handle>,
    /// Serializes topology applications, so that the last one applied is the newest
    /// topology (a failover may arrive while the first one waits for warmup).
    apply_lock: tokio::sync::Mutex<()>,
    /// Told the new version after every change of the map ([`ClusterView::subscribe`]);
    /// the lock is held only to call them (they must not call back into the cluster).
    listeners: parking_lot::Mutex<Vec<MapListener>>,
    /// How to join an etcd cluster, when this node is in one.
    join: Option<EtcdJoin>,
    /// This node in the etcd cluster, once started.
    coord: OnceLock<Arc<Coordinator>>,
    /// Testing: replication stays stopped ([`Cluster::pause_replication`]).
    replication_paused: AtomicBool,
    /// This node is being failed over gracefully: it refuses client writes
    /// ([`ClusterView::refuses_writes`]).
    draining: AtomicBool,
}

/// One node as `GET /pools/default` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// Where it is.
    pub node: NodeSpec,
    /// Its standing.
    pub membership: Membership,
    /// Whether it is up: its etcd lease is alive (in a static cluster: not failed over).
    pub healthy: bool,
    /// Whether it is this node.
    pub this: bool,
    /// Whether it is the orchestrator.
    pub orchestrator: bool,
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
            sessions: parking_lot::Mutex::new(HashMap::new()),
            moved_away: parking_lot::Mutex::new(BTreeSet::new()),
            runtime: OnceLock::new(),
            apply_lock: tokio::sync::Mutex::new(()),
            listeners: parking_lot::Mutex::new(Vec::new()),
            join: None,
            coord: OnceLock::new(),
            replication_paused: AtomicBool::new(false),
            draining: AtomicBool::new(false),
        })
    }

    /// A node of the etcd cluster `join` describes, serving `buckets`; it joins in
    /// [`Cluster::start`].
    #[must_use]
    pub fn with_etcd(join: EtcdJoin, buckets: BucketList) -> Arc<Cluster> {
        Arc::new(Cluster {
            buckets,
            rev: AtomicI64::new(1),
            topology: parking_lot::RwLock::new(None),
            sessions: parking_lot::Mutex::new(HashMap::new()),
            moved_away: parking_lot::Mutex::new(BTreeSet::new()),
            runtime: OnceLock::new(),
            apply_lock: tokio::sync::Mutex::new(()),
            listeners: parking_lot::Mutex::new(Vec::new()),
            join: Some(join),
            coord: OnceLock::new(),
            replication_paused: AtomicBool::new(false),
            draining: AtomicBool::new(false),
        })
    }

    /// Whether this node is in a cluster (a cluster file or etcd).
    #[must_use]
    pub fn is_clustered(&self) -> bool {
        self.join.is_some() || self.topology.read().is_some()
    }

    /// This node in the etcd cluster, once started.
    #[must_use]
    pub fn coordinator(&self) -> Option<&Arc<Coordinator>> {
        self.coord.get()
    }

    /// The etcd connection of an etcd cluster node, once started.
    #[must_use]
    pub fn etcd(&self) -> Option<crate::etcd::Etcd> {
        self.coord.get().map(|c| c.etcd().clone())
    }

    /// This node's id in the etcd cluster (`host:port`), once started.
    #[must_use]
    pub fn node_id(&self) -> Option<String> {
        self.coord.get().map(|c| c.id().to_owned())
    }

    /// The cluster's state as this node last applied it.
    #[must_use]
    pub fn doc(&self) -> Option<ClusterDoc> {
        self.topology.read().as_ref().map(|t| t.doc().clone())
    }

    /// The names of the buckets this node serves.
    #[must_use]
    pub fn bucket_names(&self) -> Vec<String> {
        (self.buckets)().into_iter().map(|(n, _)| n).collect()
    }

    /// Before the node serves: remembers the runtime replication runs on, and, in a
    /// cluster, learns the failovers the other nodes know of, sets the vBuckets' states
    /// from the map and starts replication (clients wait in the listen backlog
    /// meanwhile). Must be awaited inside the Tokio runtime that serves the node.
    ///
    /// An etcd cluster node joins first (`me` says where it is): it connects (waiting up
    /// to 30 s for etcd), creates the cluster's document if it is the first, installs it
    /// and starts its registration, watches, orchestrator and fence.
    ///
    /// # Errors
    /// An etcd cluster node could not reach etcd, or `me` is missing.
    pub async fn start(self: &Arc<Self>, me: Option<NodeSpec>) -> Result<(), String> {
        let _ = self.runtime.set(tokio::runtime::Handle::current());
        if let Some(join) = &self.join {
            let me = join
                .this
                .clone()
                .or(me)
                .ok_or("an etcd cluster node needs its address")?;
            let (coord, doc, rev) = Coordinator::connect(
                join.clone(),
                me,
                Arc::downgrade(self),
                Duration::from_secs(30),
            )
            .await?;
            let _ = self.coord.set(Arc::clone(&coord));
            coord.spawn_tasks(doc, rev);
            Arc::clone(self).apply_topology_now().await;
        } else if self.is_clustered() {
            self.learn_failovers().await;
            Arc::clone(self).apply_topology_now().await;
        }
        Ok(())
    }

    /// Installs a new version of the cluster's document (etcd clusters): states and
    /// chains at once, the map's revision (at least `rev`, etcd's revision of it), and
    /// replication afterwards.
    pub(crate) fn install_doc(self: &Arc<Self>, doc: ClusterDoc, rev: i64) {
        let Some((join, coord)) = self.join.as_ref().zip(self.coord.get()) else {
            return;
        };
        let me = coord.me();
        let t = Topology::from_doc(doc, &me.host, me.port, join.credentials.clone());
        let member = t.this().is_some();
        if let Some(old) = self.topology.read().as_ref() {
            self.moved_away.lock().extend(moves_ended_here(old, &t));
        }
        let draining = t.this().is_some_and(|i| t.doc().graceful.contains(&i));
        if self.draining.swap(draining, Ordering::AcqRel) != draining {
            tracing::warn!(
                draining,
                "graceful failover: this node {} client writes",
                if draining { "refuses" } else { "takes" }
            );
        }
        *self.topology.write() = Some(t);
        tracing::info!(revision = rev, member, "cluster document installed");
        self.apply_states_now();
        self.bump_rev_to(rev);
        self.apply_topology();
    }

    /// Called when this node fences itself off or stops being fenced: its actives
    /// become replicas or active again.
    pub(crate) fn fence_changed(self: &Arc<Self>) {
        self.apply_states_now();
        self.bump_rev();
        self.apply_topology();
    }

    /// Fails node `node` over gracefully ([`Coordinator::graceful_fail_over`]): it
    /// refuses writes until its replicas caught up (at most a minute), then they are
    /// promoted.
    ///
    /// # Errors
    /// Not an etcd cluster, no such node, refused, the replicas did not catch up, or
    /// etcd unreachable.
    pub fn graceful_fail_over(self: &Arc<Self>, node: &str) -> Result<bool, ClusterError> {
        let coord = self.coord_for_change()?;
        let i = self.node_index(node)?;
        self.block_on(coord.graceful_fail_over(i, crate::failover::GRACEFUL_PATIENCE))?
    }

    /// Testing: stops replication into this node (or lets it start again), to make a
    /// replica fall behind.
    pub fn pause_replication(self: &Arc<Self>, paused: bool) {
        self.replication_paused.store(paused, Ordering::Release);
        if paused {
            self.stop_sessions(|_| true);
        } else {
            self.apply_topology();
        }
    }

    /// Runs `f` to completion from a thread outside the runtime (the REST handlers run
    /// on blocking threads).
    pub(crate) fn block_on<T>(
        &self,
        f: impl std::future::Future<Output = T>,
    ) -> Result<T, ClusterError> {
        let rt = self
            .runtime
            .get()
            .ok_or_else(|| ClusterError::Unavailable("the node is starting".into()))?;
        Ok(rt.block_on(f))
    }

    /// The coordinator, for changes that need one.
    pub(crate) fn coord_for_change(&self) -> Result<&Arc<Coordinator>, ClusterError> {
        match (self.coord.get(), &self.join) {
            (Some(c), _) => Ok(c),
            (None, Some(_)) => Err(ClusterError::Unavailable(
                "this node is still joining the cluster (reaching etcd)".into(),
            )),
            (None, None) => Err(ClusterError::Invalid(
                "this node is not in an etcd cluster (start it with --etcd)".into(),
            )),
        }
    }

    /// Adds the node registered at `hostname` (`HOST:PORT`, its management or KV port;
    /// `HOST` alone means port 8091) as `inactiveAdded`. Returns its id.
    ///
    /// # Errors
    /// Not an etcd cluster, no such node registered, already a member, etcd unreachable.
    pub fn add_node(&self, hostname: &str) -> Result<String, ClusterError> {
        let coord = self.coord_for_change()?;
        let (host, port) = match hostname.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(':') => (
                h.trim_start_matches('[').trim_end_matches(']'),
                p.parse::<u16>()
                    .map_err(|_| ClusterError::Invalid(format!("bad port in {hostname:?}")))?,
            ),
            _ => (hostname, 8091),
        };
        let host = host
            .trim_start_matches("http://")
            .trim_start_matches("https://");
        let found = coord
            .live_nodes()
            .into_values()
            .find(|n| n.host == host && (n.port == port || n.mgmt_port == Some(port)))
            .ok_or_else(|| {
                ClusterError::Invalid(format!(
                    "no epkv node is registered at {host}:{port} in this cluster's etcd (start it with the same --etcd and --cluster-name)"
                ))
            })?;
        let id = crate::coord::node_id(&found);
        self.block_on(
            coord.update_doc(|doc| doc.add_node(found.clone()).map_err(ClusterError::Invalid)),
        )??;
        tracing::warn!(node = %id, "node added to the cluster (it holds no vBuckets until a rebalance)");
        Ok(id)
    }

    /// The auto-failover settings and count.
    #[must_use]
    pub fn auto_failover(&self) -> AutoFailover {
        self.topology
            .read()
            .as_ref()
            .map(|t| t.doc().auto_failover)
            .unwrap_or_default()
    }

    /// Changes the auto-failover settings (`None` keeps one as it is); `reset` sets the
    /// count back to 0.
    ///
    /// # Errors
    /// Not an etcd cluster, a value out of range, etcd unreachable.
    pub fn set_auto_failover(
        &self,
        enabled: Option<bool>,
        timeout: Option<u64>,
        max_count: Option<u32>,
        reset: bool,
    ) -> Result<AutoFailover, ClusterError> {
        let coord = self.coord_for_change()?;
        if let Some(t) = timeout
            && !AUTO_FAILOVER_TIMEOUT.contains(&t)
        {
            return Err(ClusterError::Invalid(format!(
                "timeout must be an integer between {} and {} seconds",
                AUTO_FAILOVER_TIMEOUT.start(),
                AUTO_FAILOVER_TIMEOUT.end()
            )));
        }
        if max_count.is_some_and(|m| !(1..=100).contains(&m)) {
            return Err(ClusterError::Invalid(
                "maxCount must be an integer between 1 and 100".into(),
            ));
        }
        self.block_on(coord.update_doc(|doc| {
            let before = doc.auto_failover;
            let a = &mut doc.auto_failover;
            a.enabled = enabled.unwrap_or(a.enabled);
            a.timeout = timeout.unwrap_or(a.timeout);
            a.max_count = max_count.unwrap_or(a.max_count);
            if reset {
                a.count = 0;
            }
            Ok(*a != before)
        }))??;
        Ok(self.auto_failover())
    }

    /// Every node with its standing and health, for `GET /pools/default`.
    #[must_use]
    pub fn node_statuses(&self) -> Vec<NodeStatus> {
        let t = self.topology.read();
        let Some(t) = t.as_ref() else {
            return Vec::new();
        };
        let coord = self.coord.get();
        let leader_id = coord.map(|c| c.leader_id());
        t.members()
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let id = crate::coord::node_id(&m.node);
                NodeStatus {
                    node: m.node.clone(),
                    membership: m.membership,
                    healthy: match coord {
                        Some(c) => c.is_live(&id),
                        None => m.membership != Membership::InactiveFailed,
                    },
                    this: t.this() == Some(i),
                    orchestrator: leader_id.as_deref() == Some(id.as_str()),
                }
            })
            .collect()
    }

    /// The current map's revision.
    #[must_use]
    pub fn rev(&self) -> i64 {
        self.rev.load(Ordering::Acquire)
    }

    /// Records a change of the map and tells the listeners (the front end, which
    /// notifies the connections that asked for it).
    fn bump_rev(&self) {
        self.bump_rev_to(0);
    }

    /// Moves the map's revision on to at least `at_least` (and by one at least), and
    /// tells the listeners.
    fn bump_rev_to(&self, at_least: i64) {
        let mut rev = 0;
        let _ = self
            .rev
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                rev = (cur + 1).max(at_least);
                Some(rev)
            });
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
                let want = wanted(&t, &name, vb, self.fenced());
                if engine.vbucket_state(vb) != Some(want)
                    && let Err(e) = engine.set_vbucket_state(vb, want)
                {
                    tracing::debug!(bucket = %name, %vb, error = %e, "state change left to the asynchronous pass");
                }
            }
            set_chains(&name, &*engine, &t, self.fenced());
        }
    }

    /// Whether this node fenced itself off.
    fn fenced(&self) -> bool {
        self.coord.get().is_some_and(|c| c.is_fenced())
    }

    /// Stops the replication tasks `which` selects.
    fn stop_sessions(&self, which: impl Fn(&SessionKey) -> bool) {
        self.sessions.lock().retain(|k, session| {
            if which(k) {
                let _ = session.stop.send(true);
                false
            } else {
                true
            }
        });
    }

    /// [`Self::apply_topology`], awaited (the first time, before the node serves).
    async fn apply_topology_now(self: Arc<Self>) {
        let _one_at_a_time = self.apply_lock.lock().await;
        let Some(t) = self.topology.read().clone() else {
            return;
        };
        let paused = self.replication_paused.load(Ordering::Acquire);
        let full = t.this().is_some_and(|i| t.doc().full_recovery.contains(&i));
        if full {
            // Emptied replicas stream from 0: every stream starts again.
            self.stop_sessions(|_| true);
        }
        let moved_away: Vec<u16> = std::mem::take(&mut *self.moved_away.lock())
            .into_iter()
            .collect();
        let mut wanted: HashMap<SessionKey, ()> = HashMap::new();
        for (name, engine) in (self.buckets)() {
            set_states(&name, &*engine, &t, self.fenced()).await;
            drop_moved_away(&name, &*engine, &moved_away);
            if full {
                empty_replicas(&name, &*engine, &t);
            }
            if paused {
                tracing::warn!(bucket = %name, "replication paused (testing)");
                continue;
            }
            for (node, vbuckets) in t.sources(&name) {
                let addr = match t.kv_addr(node) {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::error!(bucket = %name, node, error = %e, "cannot replicate from a node");
                        continue;
                    }
                };
                let conn = t.this().map_or_else(
                    || format!("replication:{node}->-:{name}"),
                    |this| crate::topology::replication_name(node, this, &name),
                );
                // One connection per source: a rebalance's changes open and close
                // streams on it (replication.rs), they do not reconnect.
                let engine_id = Arc::as_ptr(&engine).cast::<()>() as usize;
                let key = (name.clone(), engine_id, addr, conn.clone());
                let mut sessions = self.sessions.lock();
                match sessions.get(&key) {
                    Some(session) => {
                        session.vbuckets.send_if_modified(|set| {
                            let changed = *set != vbuckets;
                            if changed {
                                set.clone_from(&vbuckets);
                            }
                            changed
                        });
                    }
                    None => {
                        let (stop, stop_rx) = watch::channel(false);
                        let (set_tx, set_rx) = watch::channel(vbuckets);
                        let source = replication::Source {
                            bucket: name.clone(),
                            engine: Arc::clone(&engine),
                            addr,
                            vbuckets: set_rx,
                            credentials: t.credentials(),
                            name: conn.clone(),
                        };
                        tokio::spawn(replication::run(source, stop_rx));
                        sessions.insert(
                            key.clone(),
                            Session {
                                stop,
                                vbuckets: set_tx,
                            },
                        );
                    }
                }
                drop(sessions);
                wanted.insert(key, ());
            }
        }
        self.stop_sessions(|k| !wanted.contains_key(k));
        if full && let (Some(coord), Some(i)) = (self.coord.get().cloned(), t.this()) {
            // Emptied: leave the list (a later document must not empty them again).
            tokio::spawn(async move {
                let left = coord
                    .update_doc(|doc| {
                        let before = doc.full_recovery.len();
                        doc.full_recovery.retain(|&n| n != i);
                        Ok(doc.full_recovery.len() != before)
                    })
                    .await;
                if let Err(e) = left {
                    tracing::error!(error = %e, "full recovery: cannot record that this node emptied its replicas");
                }
            });
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
        for i in 0..t.members().len() {
            if Some(i) == t.this() {
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
                    if Some(f) == t.this() {
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

    /// Adds failed-over node `node` back: it becomes a replica again of the vBuckets the
    /// file's formula gives it ([`ClusterDoc::re_add`]). In a static cluster, sent to
    /// every node, the re-added one included; in an etcd cluster, to any node once.
    /// Returns whether anything changed.
    ///
    /// # Errors
    /// No cluster, no such node, or etcd unreachable.
    pub fn re_add(self: &Arc<Self>, node: &str) -> Result<bool, ClusterError> {
        self.re_add_with(node, false)
    }

    /// [`Self::re_add`] with the recovery type: `full` makes the node drop what it
    /// holds of its replica vBuckets and stream them afresh (etcd clusters only); else
    /// it streams the difference (delta).
    ///
    /// # Errors
    /// No cluster, no such node, full recovery without etcd, or etcd unreachable.
    pub fn re_add_with(self: &Arc<Self>, node: &str, full: bool) -> Result<bool, ClusterError> {
        if let Some(coord) = self.coord.get() {
            let i = self.node_index(node)?;
            let changed = self.block_on(coord.update_doc(|doc| {
                let changed = doc.re_add(i);
                if changed && full {
                    doc.full_recovery.push(i);
                }
                Ok(changed)
            }))??;
            if changed {
                tracing::warn!(node, full, "node added back as a replica");
            }
            return Ok(changed);
        }
        if full {
            return Err(ClusterError::Invalid(
                "full recovery needs an etcd cluster; add the node back with delta recovery".into(),
            ));
        }
        self.change_topology(node, "node added back as a replica", |t, i| Ok(t.re_add(i)))
    }

    /// Fails node `node` (`host:port`, `ns_1@host` or its index) over. In an etcd
    /// cluster the replica holding the most of each vBucket is promoted, and a failover
    /// that would lose the last copy of a vBucket is refused unless `allow_unsafe`; in a
    /// static cluster (sent to every surviving node) the first live replica is. The
    /// promotions take effect on this node before this returns. Returns whether
    /// anything changed.
    ///
    /// # Errors
    /// No cluster, no such node, `node` is this node (static cluster), refused, or etcd
    /// unreachable.
    pub fn fail_over(
        self: &Arc<Self>,
        node: &str,
        allow_unsafe: bool,
    ) -> Result<bool, ClusterError> {
        if let Some(coord) = self.coord.get() {
            let i = self.node_index(node)?;
            return self.block_on(coord.fail_over(i, FailoverKind::Manual, allow_unsafe))?;
        }
        self.change_topology(node, "node failed over", |t, i| {
            if Some(i) == t.this() {
                return Err(ClusterError::Invalid(
                    "a node cannot fail itself over".into(),
                ));
            }
            Ok(t.fail_over(i))
        })
    }

    /// The index of node `node` in the current topology.
    pub(crate) fn node_index(&self, node: &str) -> Result<usize, ClusterError> {
        let t = self.topology.read();
        let t = t
            .as_ref()
            .ok_or_else(|| ClusterError::Invalid("this node is not in a cluster".into()))?;
        t.node_named(node)
            .ok_or_else(|| ClusterError::Invalid(format!("no node {node} in the cluster")))
    }

    /// Applies `change` to the topology for node `node`; when it changed anything, the
    /// new states and chains take effect before this returns, the map's revision moves
    /// on, and replication restarts.
    fn change_topology(
        self: &Arc<Self>,
        node: &str,
        what: &str,
        change: impl FnOnce(&mut Topology, usize) -> Result<bool, ClusterError>,
    ) -> Result<bool, ClusterError> {
        let changed = {
            let mut t = self.topology.write();
            let t = t
                .as_mut()
                .ok_or_else(|| ClusterError::Invalid("this node is not in a cluster".into()))?;
            let i = t
                .node_named(node)
                .ok_or_else(|| ClusterError::Invalid(format!("no node {node} in the cluster")))?;
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

    fn refuses_writes(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
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

/// The state this node's copy of `vb` of `bucket` should be in: the topology's, except
/// that a fenced node holds its actives as replicas.
fn wanted(t: &Topology, bucket: &str, vb: Vbid, fenced: bool) -> VBucketState {
    match t.state_of(bucket, vb) {
        VBucketState::Active if fenced => VBucketState::Replica,
        want => want,
    }
}

/// The vBuckets whose rebalance move `old` had in flight and `new` no longer has, where
/// this node holds no copy in `new`: the move ended (completed or stopped) and this
/// node's copy, if any, is to go.
fn moves_ended_here(old: &Topology, new: &Topology) -> Vec<u16> {
    let Some(r) = old.doc().rebalance.as_ref() else {
        return Vec::new();
    };
    let Some(this) = new.this().or(old.this()) else {
        return Vec::new();
    };
    r.moves
        .keys()
        .copied()
        .filter(|&v| {
            new.doc().moving(usize::from(v)).is_none()
                && !new
                    .doc()
                    .chains
                    .get(usize::from(v))
                    .is_some_and(|c| c.contains(&Some(this)))
                && !new.doc().bucket_chains.values().any(|b| {
                    b.get(usize::from(v))
                        .is_some_and(|c| c.contains(&Some(this)))
                })
        })
        .collect()
}

/// Empties this node's copies of `vbuckets` of `bucket` that are dead now: a rebalance
/// moved them away, and the map saying so is committed (it was installed first).
fn drop_moved_away(bucket: &str, engine: &dyn Engine, vbuckets: &[u16]) {
    let mut dropped = 0;
    for &v in vbuckets {
        let vb = Vbid(v);
        if engine.vbucket_state(vb) != Some(VBucketState::Dead) {
            continue;
        }
        match engine.reset_replica(vb) {
            Ok(()) => dropped += 1,
            Err(e) => {
                tracing::error!(bucket, %vb, error = %e, "cannot drop a vBucket copy a rebalance moved away");
            }
        }
    }
    if dropped > 0 {
        tracing::info!(
            bucket,
            dropped,
            "vBucket copies moved away by the rebalance dropped"
        );
    }
}

/// Full recovery: drops what this node holds of its replica vBuckets of `bucket`, so
/// replication streams them from 0.
fn empty_replicas(bucket: &str, engine: &dyn Engine, t: &Topology) {
    let mut emptied = 0;
    for v in 0..NUM_VBUCKETS {
        let vb = Vbid(v);
        if t.state_of(bucket, vb) == VBucketState::Replica {
            match engine.reset_replica(vb) {
                Ok(()) => emptied += 1,
                Err(e) => {
                    tracing::error!(bucket, %vb, error = %e, "full recovery: cannot empty a replica vBucket");
                }
            }
        }
    }
    tracing::warn!(bucket, emptied, "full recovery: replica vBuckets emptied");
}

/// Tells each active vBucket of `engine` its replication chain.
fn set_chains(bucket: &str, engine: &dyn Engine, t: &Topology, fenced: bool) {
    if fenced {
        return;
    }
    for v in 0..NUM_VBUCKETS {
        let vb = Vbid(v);
        if t.state_of(bucket, vb) == VBucketState::Active {
            let chains = t.durability_chains(bucket, vb);
            let me = t.this().map(|i| i.to_string()).unwrap_or_default();
            if let Err(e) = engine.set_replication_topology(vb, &me, &chains) {
                tracing::error!(bucket, %vb, error = %e, "cannot set a vBucket's replication chain");
            }
        }
    }
}

/// Sets each vBucket of `engine` to the state the topology gives it.
async fn set_states(bucket: &str, engine: &dyn Engine, t: &Topology, fenced: bool) {
    let mut changed = 0;
    for v in 0..NUM_VBUCKETS {
        let vb = Vbid(v);
        let want = wanted(t, bucket, vb, fenced);
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
    set_chains(bucket, engine, t, fenced);
    tracing::info!(
        bucket,
        changed,
        node = ?t.this(),
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
        assert!(cluster.fail_over("1", false).unwrap());
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
            cluster.fail_over("1", false).unwrap_err(),
            ClusterError::Invalid("this node is not in a cluster".into())
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
            cluster.fail_over("0", false).is_err(),
            "a node cannot fail itself over"
        );
        assert!(cluster.fail_over("127.0.0.1:12100", false).unwrap());
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
        assert!(!cluster.fail_over("1", false).unwrap());
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
