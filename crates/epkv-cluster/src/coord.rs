//! The etcd-backed cluster: this node's registration, the shared [`ClusterDoc`], the
//! orchestrator (one leader) and automatic, durability-aware failover, and fencing.
//!
//! **Registration.** A node keeps `live/<host:port>` (its [`NodeSpec`]) attached to its
//! lease. The first node of an empty cluster writes the document (from the cluster file
//! when one was given, else itself holding every vBucket); a later one is a bystander
//! holding nothing until an operator adds it (`/controller/addNode`) and a rebalance
//! gives it vBuckets.
//!
//! **The document** is read at start and watched; each newer version is installed
//! ([`Cluster::install_doc`]): vBucket states, chains and replication follow it and the
//! map's revision moves on. Every change is a compare-and-swap on the document's
//! `mod_revision` ([`Coordinator::update_doc`]), so concurrent changes never interleave;
//! a node that cannot reach etcd refuses changes ([`ClusterError::Unavailable`]) and keeps
//! serving the last document it had.
//!
//! **The orchestrator** is whichever node holds the `leader` key (attached to its
//! lease; taken when free, checked every [`LEADER_POLL`]). It probes every active member's
//! KV port every [`PROBE_EVERY`]; a member whose `live` key is gone (its lease expired)
//! *and* that has been unreachable for the auto-failover timeout is failed over
//! ([`Coordinator::fail_over`]). A new leader starts its timers afresh, and a failover is
//! one compare-and-swap, so one interrupted by the leader's death is simply done again.
//!
//! **Durability-aware promotion.** Before failing a node over, the orchestrator asks each
//! live replica of the vBuckets it held active for its `vbucket-details` (STAT) and
//! promotes, per bucket and vBucket, the one whose history goes furthest (the higher of
//! its high seqno and high prepared seqno; the first in the chain on a tie): a write acknowledged at Majority is
//! on a majority of the chain, so on at least one live replica, and that replica wins.
//!
//! **Fencing.** A node that can no longer renew its lease *and* reaches none of its peers
//! holds its active vBuckets as replicas (refusing writes) until it has a lease again:
//! the orchestrator may have failed it over and promoted another copy, and two actives
//! must never both accept writes. A node that loses only etcd, or only its peers, keeps
//! serving.

use crate::doc::{AUTO_FAILOVER_TIMEOUT, ClusterDoc, Membership};
use crate::etcd::{Change, Etcd, EtcdError};
use crate::node::Cluster;
use crate::topology::{ClusterFile, NodeSpec, host_port};
use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// How often the orchestrator probes the members.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(250);
/// How long a probe (a TCP connect to the KV port) may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);
/// How often a node that is not the leader tries to become it (besides at once when a
/// lease ends, which is when the leader's may have).
pub(crate) const LEADER_POLL: Duration = Duration::from_secs(2);
/// Attempts at a compare-and-swap that others keep winning.
pub(crate) const CAS_ATTEMPTS: u32 = 8;
/// The pause between two reads of etcd after an error.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Why a cluster change was not made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterError {
    /// The request is wrong or not allowed now (HTTP 400).
    Invalid(String),
    /// The cluster's state cannot be changed now: etcd is unreachable, or others kept
    /// changing it (HTTP 503).
    Unavailable(String),
}

impl std::fmt::Display for ClusterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClusterError::Invalid(m) | ClusterError::Unavailable(m) => f.write_str(m),
        }
    }
}

impl From<EtcdError> for ClusterError {
    fn from(e: EtcdError) -> Self {
        ClusterError::Unavailable(format!(
            "the cluster's state store (etcd) is unreachable: {}",
            e.0
        ))
    }
}

/// Who asked for a failover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailoverKind {
    /// The orchestrator, after the auto-failover timeout.
    Auto,
    /// An operator (`/controller/failOver`).
    Manual,
}

/// How an etcd cluster node joins.
#[derive(Debug, Clone)]
pub struct EtcdJoin {
    /// Where etcd is and the cluster's name.
    pub settings: crate::etcd::EtcdSettings,
    /// A cluster file whose topology an empty cluster starts with (its nodes all active).
    pub seed: Option<ClusterFile>,
    /// This node as the seed file names it (its `--cluster-node` entry), if there is one;
    /// else where it listens ([`crate::Cluster::start`]'s `me`).
    pub this: Option<NodeSpec>,
    /// Replicas of a cluster this node starts alone.
    pub replicas: usize,
    /// The credentials nodes replicate and ask each other with.
    pub credentials: Option<(String, String)>,
}

/// Counters for Prometheus and the logs.
#[derive(Debug, Default)]
pub struct CoordStats {
    /// Failovers made by the orchestrator.
    pub auto_failovers: AtomicU64,
    /// Failovers asked by an operator.
    pub manual_failovers: AtomicU64,
    /// Automatic failovers not made (disabled, maxCount, last copy).
    pub failovers_refused: AtomicU64,
    /// vBuckets whose promoted replica was not the first in its chain (it held more).
    pub promotions_reordered: AtomicU64,
    /// Times this node became the orchestrator.
    pub leader_terms: AtomicU64,
    /// Documents installed.
    pub docs_installed: AtomicU64,
    /// Times this node fenced itself off.
    pub fences: AtomicU64,
    /// vBucket moves this node made as the orchestrator of a rebalance.
    pub rebalance_moves: AtomicU64,
    /// Rebalances this node completed as the orchestrator.
    pub rebalances_completed: AtomicU64,
    /// Rebalances stopped through this node (by an operator, a failover or a failure).
    pub rebalances_stopped: AtomicU64,
    /// Takeovers timed: from the map that makes the old active pending to the one that
    /// makes the new one active (how long a client's operation on that vBucket can stay
    /// parked, less the maps' installation).
    pub takeovers: AtomicU64,
    /// Their total time (µs).
    pub takeover_micros: AtomicU64,
    /// The longest (µs).
    pub takeover_micros_max: AtomicU64,
}

impl CoordStats {
    /// Records a takeover that took `d`.
    pub(crate) fn record_takeover(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.takeovers.fetch_add(1, Ordering::Relaxed);
        self.takeover_micros.fetch_add(us, Ordering::Relaxed);
        self.takeover_micros_max.fetch_max(us, Ordering::Relaxed);
    }
}

/// One node's part in the etcd cluster.
pub struct Coordinator {
    pub(crate) etcd: Etcd,
    me: NodeSpec,
    id: String,
    pub(crate) join: EtcdJoin,
    pub(crate) cluster: Weak<Cluster>,
    /// The nodes whose `live` key exists, by id.
    live: parking_lot::Mutex<BTreeMap<String, NodeSpec>>,
    /// Whether `live` reflects etcd (false until the first read, and after errors).
    live_known: AtomicBool,
    /// The `mod_revision` of the document installed.
    doc_rev: AtomicI64,
    /// The newest document offered and its revision, kept together: a change tries a
    /// compare-and-swap on it before reading etcd (the orchestrator of a rebalance
    /// changes the document many times a second).
    newest: parking_lot::Mutex<Option<(ClusterDoc, i64)>>,
    /// The lease this node holds the `leader` key with; 0 when it is not the leader.
    leader_lease: AtomicI64,
    /// The orchestrator's id, as last seen.
    leader_id: parking_lot::Mutex<String>,
    /// Raised when a node's lease ends (the leader's may have): campaign at once.
    lease_ended: tokio::sync::Notify,
    /// When each node's lease was last seen ending, by id.
    lease_gone_at: parking_lot::Mutex<HashMap<String, Instant>>,
    /// Whether this node holds its active vBuckets as replicas (see the module docs).
    fenced: AtomicBool,
    /// Counts this node's registrations (a new lease): others that keep leased keys
    /// write them again when it moves ([`Coordinator::registrations`]).
    registered: tokio::sync::watch::Sender<u64>,
    /// The counters.
    pub stats: CoordStats,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field("id", &self.id)
            .field("doc_rev", &self.doc_rev.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A node's id: `host:port` of its KV port.
#[must_use]
pub fn node_id(n: &NodeSpec) -> String {
    host_port(&n.host, n.port)
}

impl Coordinator {
    /// Connects to etcd (retrying for up to `patience`), makes sure the cluster's
    /// document exists, and returns the coordinator with that document.
    ///
    /// # Errors
    /// etcd could not be reached in time, or holds a document that cannot be read.
    pub(crate) async fn connect(
        join: EtcdJoin,
        me: NodeSpec,
        cluster: Weak<Cluster>,
        patience: Duration,
    ) -> Result<(Arc<Coordinator>, ClusterDoc, i64), String> {
        let deadline = Instant::now() + patience;
        let etcd = loop {
            match Etcd::connect(&join.settings).await {
                Ok(e) => break e,
                Err(e) if Instant::now() < deadline => {
                    tracing::warn!(error = %e, endpoints = ?join.settings.endpoints, "cannot reach etcd yet; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => {
                    return Err(format!(
                        "cannot reach etcd at {:?}: {e}",
                        join.settings.endpoints
                    ));
                }
            }
        };
        let coord = Arc::new(Coordinator {
            etcd,
            id: node_id(&me),
            me,
            join,
            cluster,
            live: parking_lot::Mutex::new(BTreeMap::new()),
            live_known: AtomicBool::new(false),
            doc_rev: AtomicI64::new(0),
            newest: parking_lot::Mutex::new(None),
            leader_lease: AtomicI64::new(0),
            leader_id: parking_lot::Mutex::new(String::new()),
            lease_ended: tokio::sync::Notify::new(),
            lease_gone_at: parking_lot::Mutex::new(HashMap::new()),
            fenced: AtomicBool::new(false),
            registered: tokio::sync::watch::Sender::new(0),
            stats: CoordStats::default(),
        });
        let (doc, rev) = loop {
            match coord.init_doc().await {
                Ok(d) => break d,
                Err(e) if Instant::now() < deadline => {
                    tracing::warn!(error = %e, "cannot read the cluster's state from etcd yet; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e.to_string()),
            }
        };
        Ok((coord, doc, rev))
    }

    /// The etcd connection.
    #[must_use]
    pub fn etcd(&self) -> &Etcd {
        &self.etcd
    }

    /// Where this node is.
    #[must_use]
    pub fn me(&self) -> &NodeSpec {
        &self.me
    }

    /// This node's id (`host:port`).
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether this node is the orchestrator now.
    #[must_use]
    pub fn is_leader(&self) -> bool {
        let lease = self.leader_lease.load(Ordering::Acquire);
        lease != 0 && lease == self.etcd.lease_id() && self.etcd.lease_held()
    }

    /// The orchestrator's id, as this node last saw it (empty: unknown).
    #[must_use]
    pub fn leader_id(&self) -> String {
        if self.is_leader() {
            return self.id.clone();
        }
        self.leader_id.lock().clone()
    }

    /// Times this node's lease expired and it registered again (every registration
    /// after the first).
    #[must_use]
    pub fn lease_losses(&self) -> u64 {
        self.registered.borrow().saturating_sub(1)
    }

    /// Moves on each time this node registers with a new lease: keys attached to the
    /// old lease are gone and must be written again.
    #[must_use]
    pub fn registrations(&self) -> tokio::sync::watch::Receiver<u64> {
        self.registered.subscribe()
    }

    /// Whether this node has fenced itself off.
    #[must_use]
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// Whether node `id` holds a live lease (as last seen).
    #[must_use]
    pub fn is_live(&self, id: &str) -> bool {
        self.live.lock().contains_key(id)
    }

    /// The registered nodes (live leases), by id.
    #[must_use]
    pub fn live_nodes(&self) -> BTreeMap<String, NodeSpec> {
        self.live.lock().clone()
    }

    /// Whether etcd answered this node recently (its lease renewal).
    #[must_use]
    pub fn etcd_reachable(&self) -> bool {
        self.etcd.lease_held()
    }

    /// Reads the document, writing the first one if the cluster is new.
    async fn init_doc(&self) -> Result<(ClusterDoc, i64), ClusterError> {
        if let Some(found) = self.read_doc().await? {
            return Ok(found);
        }
        let first = match &self.join.seed {
            Some(file) => ClusterDoc::from_file(file),
            None => ClusterDoc::single(self.me.clone(), self.join.replicas),
        };
        let text = serde_json::to_vec(&first).map_err(|e| ClusterError::Invalid(e.to_string()))?;
        if self
            .etcd
            .compare_and_put("topology", text, 0)
            .await?
            .is_some()
        {
            tracing::warn!(
                nodes = first.nodes.len(),
                replicas = first.replicas,
                "initialized a new cluster in etcd"
            );
        }
        self.read_doc()
            .await?
            .ok_or_else(|| ClusterError::Unavailable("the cluster's document vanished".into()))
    }

    /// The document in etcd and its `mod_revision`.
    pub(crate) async fn read_doc(&self) -> Result<Option<(ClusterDoc, i64)>, ClusterError> {
        let Some(v) = self.etcd.get("topology").await? else {
            return Ok(None);
        };
        let doc: ClusterDoc = serde_json::from_slice(&v.value).map_err(|e| {
            ClusterError::Invalid(format!("the cluster's document in etcd is invalid: {e}"))
        })?;
        Ok(Some((doc, v.mod_revision)))
    }

    /// The document in etcd and its `mod_revision`, which must exist (a started node
    /// made sure of it).
    pub(crate) async fn current_doc(&self) -> Result<(ClusterDoc, i64), ClusterError> {
        self.read_doc()
            .await?
            .ok_or_else(|| ClusterError::Unavailable("the cluster has no document".into()))
    }

    /// The node this coordinator serves, unless it is shutting down.
    pub(crate) fn node(&self) -> Result<Arc<Cluster>, ClusterError> {
        self.cluster
            .upgrade()
            .ok_or_else(|| ClusterError::Unavailable("shutting down".into()))
    }

    /// Installs `doc` (at `rev`) if it is newer than the one installed.
    pub(crate) fn offer(&self, doc: ClusterDoc, rev: i64) {
        {
            let mut newest = self.newest.lock();
            if newest.as_ref().is_none_or(|(_, r)| *r < rev) {
                *newest = Some((doc.clone(), rev));
            }
        }
        if self.doc_rev.fetch_max(rev, Ordering::AcqRel) >= rev {
            return;
        }
        if let Some(c) = self.cluster.upgrade() {
            self.stats.docs_installed.fetch_add(1, Ordering::Relaxed);
            c.install_doc(doc, rev);
        }
    }

    /// Starts the node's background tasks: the lease, the watches, the orchestrator and
    /// the fence.
    pub(crate) fn spawn_tasks(self: &Arc<Self>, first: ClusterDoc, rev: i64) {
        self.offer(first, rev);
        let me = Arc::clone(self);
        tokio::spawn(self.etcd.clone().run_lease(move |etcd| {
            let me = Arc::clone(&me);
            async move {
                let spec = serde_json::to_vec(&me.me).unwrap_or_default();
                etcd.put_leased(&format!("live/{}", me.id), spec).await?;
                tracing::info!(node = %me.id, lease = etcd.lease_id(), "registered in etcd");
                me.registered.send_modify(|n| *n += 1);
                Ok(())
            }
        }));
        tokio::spawn(Arc::clone(self).watch_doc());
        tokio::spawn(Arc::clone(self).watch_live());
        tokio::spawn(Arc::clone(self).orchestrate());
        tokio::spawn(Arc::clone(self).fence());
    }

    /// Follows the document: a fresh read, then a watch from the next revision, again
    /// after any error.
    async fn watch_doc(self: Arc<Self>) {
        loop {
            let from = match self.read_doc().await {
                Ok(Some((doc, rev))) => {
                    self.offer(doc, rev);
                    rev + 1
                }
                Ok(None) => 1,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot read the cluster document");
                    tokio::time::sleep(RETRY_PAUSE).await;
                    continue;
                }
            };
            let mut watch = match self.etcd.watch_prefix("topology", from).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot watch the cluster document");
                    tokio::time::sleep(RETRY_PAUSE).await;
                    continue;
                }
            };
            loop {
                match watch.next().await {
                    Ok((changes, _)) => {
                        for c in changes {
                            if let Change::Put(v) = c
                                && v.key == "topology"
                            {
                                match serde_json::from_slice::<ClusterDoc>(&v.value) {
                                    Ok(doc) => self.offer(doc, v.mod_revision),
                                    Err(e) => {
                                        tracing::error!(error = %e, "ignoring an invalid cluster document in etcd")
                                    }
                                }
                            }
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "the cluster document's watch ended");
                        break;
                    }
                }
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// Follows the `live/` keys.
    async fn watch_live(self: Arc<Self>) {
        loop {
            let from = match self.etcd.get_prefix("live/").await {
                Ok((kvs, rev)) => {
                    let mut live = BTreeMap::new();
                    for v in kvs {
                        if let Ok(spec) = serde_json::from_slice::<NodeSpec>(&v.value) {
                            live.insert(v.key.trim_start_matches("live/").to_owned(), spec);
                        }
                    }
                    *self.live.lock() = live;
                    self.live_known.store(true, Ordering::Release);
                    rev + 1
                }
                Err(e) => {
                    self.live_known.store(false, Ordering::Release);
                    tracing::debug!(error = %e, "cannot read the live nodes");
                    tokio::time::sleep(RETRY_PAUSE).await;
                    continue;
                }
            };
            let Ok(mut watch) = self.etcd.watch_prefix("live/", from).await else {
                self.live_known.store(false, Ordering::Release);
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            };
            while let Ok((changes, _)) = watch.next().await {
                let mut live = self.live.lock();
                for c in changes {
                    match c {
                        Change::Put(v) => {
                            if let Ok(spec) = serde_json::from_slice::<NodeSpec>(&v.value) {
                                let id = v.key.trim_start_matches("live/").to_owned();
                                if !live.contains_key(&id) {
                                    tracing::info!(node = %id, "a node registered");
                                }
                                live.insert(id, spec);
                            }
                        }
                        Change::Delete { key, .. } => {
                            let id = key.trim_start_matches("live/");
                            tracing::warn!(node = %id, "a node's lease ended");
                            live.remove(id);
                            self.lease_gone_at
                                .lock()
                                .insert(id.to_owned(), Instant::now());
                            self.lease_ended.notify_one();
                        }
                    }
                }
            }
            self.live_known.store(false, Ordering::Release);
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// The orchestrator's loop: take the leadership when free (every [`LEADER_POLL`],
    /// and at once when a lease ends); as the leader, probe the members and fail over
    /// the ones that are gone.
    async fn orchestrate(self: Arc<Self>) {
        let mut down_since: HashMap<String, Instant> = HashMap::new();
        let mut refused_until: HashMap<String, Instant> = HashMap::new();
        let mut graceful_seen: HashMap<usize, Instant> = HashMap::new();
        let mut was_leader = false;
        let mut last_try: Option<Instant> = None;
        let mut rebalance: Option<tokio::task::JoinHandle<()>> = None;
        loop {
            let woken = tokio::select! {
                () = tokio::time::sleep(PROBE_EVERY) => false,
                () = self.lease_ended.notified() => true,
            };
            let due = woken || last_try.is_none_or(|t| t.elapsed() >= LEADER_POLL);
            let member = self.is_active_member();
            if self.is_leader() && !member {
                // Ejected by a rebalance (or failed over): the orchestrator must be a
                // member.
                match self.etcd.release("leader").await {
                    Ok(()) => {
                        self.leader_lease.store(0, Ordering::Release);
                        tracing::warn!(
                            "this node left the cluster: it gives up the orchestrator's role"
                        );
                    }
                    Err(e) => tracing::debug!(error = %e, "cannot give up the leadership"),
                }
            }
            if !self.is_leader() && member && due && self.etcd.lease_held() {
                last_try = Some(Instant::now());
                let lease = self.etcd.lease_id();
                match self.etcd.hold("leader", self.id.clone()).await {
                    Ok((mine, holder)) => {
                        self.leader_lease
                            .store(if mine { lease } else { 0 }, Ordering::Release);
                        *self.leader_id.lock() = String::from_utf8_lossy(&holder).into_owned();
                    }
                    Err(e) => tracing::debug!(error = %e, "cannot campaign for the leadership"),
                }
            }
            let leader = self.is_leader();
            if leader != was_leader {
                was_leader = leader;
                down_since.clear();
                refused_until.clear();
                if leader {
                    self.stats.leader_terms.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(node = %self.id, "this node is the cluster's orchestrator");
                } else {
                    tracing::warn!(node = %self.id, "this node is no longer the orchestrator");
                }
            }
            if leader && self.live_known.load(Ordering::Acquire) {
                self.check_members(&mut down_since, &mut refused_until)
                    .await;
                self.resume_graceful(&mut graceful_seen);
                self.drive_rebalance(&mut rebalance);
            }
        }
    }

    /// Whether this node is an active member of the installed document (before the
    /// first one, it counts as one: it may have to write it).
    fn is_active_member(&self) -> bool {
        let Some(doc) = self.cluster.upgrade().and_then(|c| c.doc()) else {
            return true;
        };
        doc.index_of(&self.me.host, self.me.port)
            .is_some_and(|i| doc.nodes[i].membership == Membership::Active)
    }

    /// One round of the orchestrator's probes.
    async fn check_members(
        &self,
        down_since: &mut HashMap<String, Instant>,
        refused_until: &mut HashMap<String, Instant>,
    ) {
        let Some(cluster) = self.cluster.upgrade() else {
            return;
        };
        let Some(doc) = cluster.doc() else { return };
        let settings = doc.auto_failover;
        let mut probes = Vec::new();
        for (i, m) in doc.nodes.iter().enumerate() {
            let id = node_id(&m.node);
            if m.membership != Membership::Active || id == self.id {
                down_since.remove(&id);
                continue;
            }
            probes.push((i, id, m.node.clone()));
        }
        let reach = join_all(probes.iter().map(|(_, _, n)| probe(n.clone()))).await;
        for ((i, id, _), reachable) in probes.into_iter().zip(reach) {
            if reachable {
                if down_since.remove(&id).is_some() {
                    tracing::info!(node = %id, "a node is reachable again");
                }
                continue;
            }
            // A node whose lease ended has not renewed it for the lease's time: it has
            // been gone at least that long, whoever was the orchestrator then.
            let gone = self
                .lease_gone_at
                .lock()
                .get(&id)
                .and_then(|t| t.checked_sub(crate::etcd::LEASE_TTL));
            let since = *down_since.entry(id.clone()).or_insert_with(|| {
                tracing::warn!(node = %id, "a node is unreachable");
                Instant::now()
            });
            let since = match gone {
                Some(g) if !self.is_live(&id) => since.min(g),
                _ => since,
            };
            let timeout = Duration::from_secs(settings.timeout.max(*AUTO_FAILOVER_TIMEOUT.start()));
            if !settings.enabled
                || since.elapsed() < timeout
                || self.is_live(&id)
                || refused_until.get(&id).is_some_and(|t| Instant::now() < *t)
            {
                continue;
            }
            match self.fail_over(i, FailoverKind::Auto, false).await {
                Ok(true) => {
                    down_since.remove(&id);
                }
                Ok(false) => {}
                Err(e) => {
                    // Tried again (and logged) once per timeout period, not every probe.
                    refused_until.insert(
                        id.clone(),
                        Instant::now() + timeout.max(Duration::from_secs(5)),
                    );
                    self.stats.failovers_refused.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(node = %id, error = %e, "automatic failover not made");
                }
            }
        }
    }

    /// Changes the document with `edit` (given the current one; it returns whether it
    /// changed anything), by compare-and-swap, and installs the result before
    /// returning. Returns whether anything changed. The first try edits the newest
    /// version this node has seen (one etcd request instead of two when it is current);
    /// a refusal or "nothing to change" on it is checked again on etcd's version, so
    /// `edit` may run more than once and must not keep state between runs.
    ///
    /// # Errors
    /// `edit`'s error, or etcd unreachable / too busy.
    pub async fn update_doc<F>(&self, mut edit: F) -> Result<bool, ClusterError>
    where
        F: FnMut(&mut ClusterDoc) -> Result<bool, ClusterError>,
    {
        for attempt in 0..CAS_ATTEMPTS {
            let cached = if attempt == 0 {
                self.newest.lock().clone()
            } else {
                None
            };
            let from_cache = cached.is_some();
            let (mut doc, rev) = match cached {
                Some(known) => known,
                None => self.current_doc().await?,
            };
            let edited = edit(&mut doc);
            if from_cache && !matches!(edited, Ok(true)) {
                // Nothing to change, or refused, on what may be an old version: ask etcd.
                continue;
            }
            if !edited? {
                self.offer(doc, rev);
                return Ok(false);
            }
            let text =
                serde_json::to_vec(&doc).map_err(|e| ClusterError::Invalid(e.to_string()))?;
            if let Some(new_rev) = self.etcd.compare_and_put("topology", text, rev).await? {
                self.offer(doc, new_rev);
                return Ok(true);
            }
        }
        Err(ClusterError::Unavailable(
            "the cluster's state kept changing under this request; try again".into(),
        ))
    }

    /// Watches over this node's own lease (see "Fencing" in the module docs).
    async fn fence(self: Arc<Self>) {
        let mut peers_seen = Instant::now();
        loop {
            tokio::time::sleep(PROBE_EVERY).await;
            let held = self.etcd.lease_held();
            let mut fenced = false;
            if held {
                peers_seen = Instant::now();
            } else if let Some(cluster) = self.cluster.upgrade()
                && let Some(doc) = cluster.doc()
            {
                let peers: Vec<NodeSpec> = doc
                    .nodes
                    .iter()
                    .filter(|m| m.membership == Membership::Active && node_id(&m.node) != self.id)
                    .map(|m| m.node.clone())
                    .collect();
                let reached = join_all(peers.into_iter().map(probe)).await;
                if reached.is_empty() || reached.iter().any(|r| *r) {
                    peers_seen = Instant::now();
                }
                fenced = peers_seen.elapsed() >= crate::etcd::LEASE_TTL;
            }
            if self.fenced.swap(fenced, Ordering::AcqRel) != fenced {
                if fenced {
                    self.stats.fences.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(
                        "fenced: this node can renew its etcd lease no more and reaches none of its peers; its active vBuckets refuse writes until it can"
                    );
                } else {
                    tracing::warn!("no longer fenced: this node reaches etcd again");
                }
                if let Some(c) = self.cluster.upgrade() {
                    c.fence_changed();
                }
            }
        }
    }
}

pub(crate) fn resolve(n: &NodeSpec) -> Result<SocketAddr, String> {
    (n.host.as_str(), n.port)
        .to_socket_addrs()
        .map_err(|e| format!("{}:{}: {e}", n.host, n.port))?
        .next()
        .ok_or_else(|| format!("{}:{} does not resolve", n.host, n.port))
}

/// Whether `n`'s KV port accepts a connection within [`PROBE_TIMEOUT`].
pub(crate) async fn probe(n: NodeSpec) -> bool {
    let Ok(addr) = resolve(&n) else { return false };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

/// Runs futures concurrently (as tasks) and returns their outputs in order.
pub(crate) async fn join_all<T, F>(futs: impl IntoIterator<Item = F>) -> Vec<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = T> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    let mut n = 0;
    for (i, f) in futs.into_iter().enumerate() {
        set.spawn(async move { (i, f.await) });
        n += 1;
    }
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    while let Some(r) = set.join_next().await {
        if let Ok((i, v)) = r {
            out[i] = Some(v);
        }
    }
    out.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn joined_futures_keep_their_order() {
        let out = join_all([1u64, 3, 2].map(|d| async move {
            tokio::time::sleep(Duration::from_millis(d)).await;
            d
        }))
        .await;
        assert_eq!(out, vec![1, 3, 2]);
    }
}
