//! A static cluster of a few nodes: the cluster file, the vBucket map that follows from
//! it, and manual failover.
//!
//! **The file** (TOML, given to every node with `--cluster FILE --cluster-node N`) names
//! the nodes in order and the number of replicas:
//!
//! ```toml
//! replicas = 1
//! # Optional: the credentials nodes replicate with (SASL PLAIN), when users are on.
//! user = "replicator"
//! password = "secret"
//!
//! [[nodes]]
//! host = "127.0.0.1"
//! port = 12000        # KV
//! mgmt_port = 12001   # optional
//!
//! [[nodes]]
//! host = "127.0.0.1"
//! port = 12100
//! ```
//!
//! **The map.** vBucket `v`'s active copy is on node `v mod n`, its `i`th replica on node
//! `(v + i + 1) mod n`, so each node holds an equal share of actives and replicas and no
//! node holds two copies of one vBucket. Every node computes the same map from the same
//! file, sets its vBuckets' states from it (active, replica, or dead for the ones it does
//! not hold), and serves it in the cluster map so that SDKs route by it.
//!
//! **State.** The failovers and re-adds a node applied are kept, in order, in its state
//! file (`DATA_DIR/cluster-state.json`, written atomically before the change takes
//! effect) and replayed at start, so a node that restarts keeps the map it had, even if
//! every node restarts at once.
//!
//! **Failover** ([`Topology::fail_over`]) is manual: an operator tells every surviving
//! node that a node is gone (`POST /controller/failOver`). Each vBucket whose active copy
//! was there gets its first live replica promoted; copies on the failed node leave every
//! chain. The map's revision moves on, and clients refetch it. Nodes agree because they
//! apply the same failovers to the same file; there is no consensus protocol here
//! (automatic failover and rebalance need one and come later).

use crate::doc::{ClusterDoc, Member, Membership};
use crate::rebalance::Phase;
use epkv_types::{VBucketState, Vbid};
use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

/// A change of the map after the file's: what the state file records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Change {
    Failed { node: usize },
    ReAdded { node: usize },
}

/// The state file's content.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct StateFile {
    changes: Vec<Change>,
}

/// Most nodes a cluster file may name.
pub const MAX_NODES: usize = 16;
/// Most replicas (Couchbase's limit).
pub const MAX_REPLICAS: usize = 3;

/// One node of the cluster file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// Host name or IP address clients and other nodes reach the node at.
    pub host: String,
    /// Its KV port.
    pub port: u16,
    /// Its management REST port, if it serves one.
    #[serde(default)]
    pub mgmt_port: Option<u16>,
}

/// The cluster file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// Replicas of each vBucket (0-3, fewer than the nodes).
    pub replicas: usize,
    /// The nodes, in order; a node's index is its place here.
    pub nodes: Vec<NodeSpec>,
    /// The user nodes replicate as (SASL PLAIN), when the nodes have users.
    #[serde(default)]
    pub user: Option<String>,
    /// That user's password.
    #[serde(default)]
    pub password: Option<String>,
}

impl ClusterFile {
    /// Parses and checks a cluster file.
    ///
    /// # Errors
    /// A message naming what is wrong.
    pub fn parse(text: &str) -> Result<ClusterFile, String> {
        let f: ClusterFile = toml::from_str(text).map_err(|e| format!("cluster file: {e}"))?;
        if f.nodes.is_empty() || f.nodes.len() > MAX_NODES {
            return Err(format!(
                "cluster file: 1 to {MAX_NODES} nodes, not {}",
                f.nodes.len()
            ));
        }
        if f.replicas > MAX_REPLICAS || f.replicas >= f.nodes.len() {
            return Err(format!(
                "cluster file: replicas must be at most {MAX_REPLICAS} and fewer than the {} nodes",
                f.nodes.len()
            ));
        }
        if f.user.is_some() != f.password.is_some() {
            return Err("cluster file: give both user and password, or neither".into());
        }
        for (i, a) in f.nodes.iter().enumerate() {
            if f.nodes[..i]
                .iter()
                .any(|b| b.host == a.host && b.port == a.port)
            {
                return Err(format!(
                    "cluster file: {}:{} is named twice",
                    a.host, a.port
                ));
            }
        }
        Ok(f)
    }
}

/// The cluster as this node sees it: the cluster's state ([`ClusterDoc`]), which node it
/// is, and the credentials nodes replicate with.
#[derive(Debug, Clone)]
pub struct Topology {
    doc: ClusterDoc,
    /// This node's index; `None` when it is not a member (a node registered in etcd
    /// that no one has added yet).
    this: Option<usize>,
    credentials: Option<(String, String)>,
    /// The changes applied after the file's map, in order (static clusters only).
    changes: Vec<Change>,
    /// Where they are kept, if anywhere.
    state_path: Option<PathBuf>,
}

impl Topology {
    /// The topology of node `this` of `file`, before any failover.
    ///
    /// # Errors
    /// `this` names no node of the file.
    pub fn new(file: ClusterFile, this: usize) -> Result<Topology, String> {
        let n = file.nodes.len();
        if this >= n {
            return Err(format!(
                "--cluster-node {this}: the cluster file names nodes 0 to {}",
                n.saturating_sub(1)
            ));
        }
        Ok(Topology {
            doc: ClusterDoc::from_file(&file),
            this: Some(this),
            credentials: file.user.clone().zip(file.password.clone()),
            changes: Vec::new(),
            state_path: None,
        })
    }

    /// The topology `doc` gives the node at `host:port`, replicating with
    /// `credentials`.
    #[must_use]
    pub fn from_doc(
        doc: ClusterDoc,
        host: &str,
        port: u16,
        credentials: Option<(String, String)>,
    ) -> Topology {
        Topology {
            this: doc.index_of(host, port),
            doc,
            credentials,
            changes: Vec::new(),
            state_path: None,
        }
    }

    /// Replays the changes kept in the state file at `path` (if it exists) and keeps
    /// recording there.
    ///
    /// # Errors
    /// The file exists but cannot be read or parsed.
    pub fn with_state_file(mut self, path: impl Into<PathBuf>) -> Result<Topology, String> {
        let path = path.into();
        match std::fs::read(&path) {
            Ok(bytes) => {
                let state: StateFile = serde_json::from_slice(&bytes)
                    .map_err(|e| format!("cluster state {}: {e}", path.display()))?;
                for c in state.changes {
                    match c {
                        Change::Failed { node } => self.mark_failed(node),
                        Change::ReAdded { node } => self.re_add(node),
                    };
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cluster state {}: {e}", path.display())),
        }
        self.state_path = Some(path);
        Ok(self)
    }

    /// Records a change in the state file (atomically: the old file or the new one).
    fn record(&mut self, change: Change) {
        self.changes.push(change);
        let Some(path) = &self.state_path else {
            return;
        };
        let state = StateFile {
            changes: self.changes.clone(),
        };
        let written = serde_json::to_vec_pretty(&state)
            .map_err(std::io::Error::other)
            .and_then(|bytes| epkv_types::fs::write_atomically(path, &bytes));
        if let Err(e) = written {
            tracing::error!(path = %path.display(), error = %e, "cannot write the cluster state file; a restart will not know this change");
        }
    }

    /// This node's index, if it is a member.
    #[must_use]
    pub fn this(&self) -> Option<usize> {
        self.this
    }

    /// The cluster's state.
    #[must_use]
    pub fn doc(&self) -> &ClusterDoc {
        &self.doc
    }

    /// The nodes, in order.
    #[must_use]
    pub fn members(&self) -> &[Member] {
        &self.doc.nodes
    }

    /// Replicas of each vBucket.
    #[must_use]
    pub fn replicas(&self) -> usize {
        self.doc.replicas
    }

    /// Whether node `i` was failed over (or does not exist).
    #[must_use]
    pub fn is_failed(&self, i: usize) -> bool {
        self.doc.is_failed(i)
    }

    /// The credentials nodes replicate with, if any.
    #[must_use]
    pub fn credentials(&self) -> Option<(String, String)> {
        self.credentials.clone()
    }

    /// The nodes holding `vb` of `bucket`: active first, then replicas.
    #[must_use]
    pub fn chain(&self, bucket: &str, vb: Vbid) -> &[Option<usize>] {
        self.doc
            .chains_of(bucket)
            .get(usize::from(vb.0))
            .map_or(&[][..], Vec::as_slice)
    }

    /// The state this node's copy of `vb` of `bucket` should be in.
    #[must_use]
    pub fn state_of(&self, bucket: &str, vb: Vbid) -> VBucketState {
        let Some(this) = self.this else {
            return VBucketState::Dead;
        };
        let at = self.chain(bucket, vb).iter().position(|n| *n == Some(this));
        if let Some(m) = self.doc.moving(usize::from(vb.0)) {
            // A rebalance moves it (see `rebalance.rs`): the old active parks its clients
            // while the new one takes over; a node of the new chain only builds a copy.
            match at {
                Some(0) if m.phase == Phase::Takeover && m.to.first() != Some(&Some(this)) => {
                    return VBucketState::Pending;
                }
                None if m.to.contains(&Some(this)) => return VBucketState::Replica,
                _ => {}
            }
        }
        match at {
            Some(0) => VBucketState::Active,
            Some(_) => VBucketState::Replica,
            None => VBucketState::Dead,
        }
    }

    /// The chains SyncWrites of this node's active `vb` of `bucket` wait for, each
    /// node named as this node's DCP producer knows its replica stream
    /// (`replication:SRC->DST:BUCKET`; this node by its index): the chain, and while a rebalance
    /// moves the vBucket past its backfill, the chain it moves to (KV-Engine's second
    /// chain).
    #[must_use]
    pub fn durability_chains(&self, bucket: &str, vb: Vbid) -> Vec<Vec<Option<String>>> {
        let Some(this) = self.this else {
            return Vec::new();
        };
        let name = |n: &Option<usize>| {
            n.map(|n| {
                if n == this {
                    this.to_string()
                } else {
                    replication_name(this, n, bucket)
                }
            })
        };
        let chain = self.chain(bucket, vb);
        let mut out = vec![chain.iter().map(name).collect::<Vec<_>>()];
        if let Some(m) = self.doc.moving(usize::from(vb.0))
            && m.phase >= Phase::Synced
            && m.to.as_slice() != chain
        {
            out.push(m.to.iter().map(name).collect());
        }
        out
    }

    /// For each node holding active copies of this node's replica vBuckets of `bucket`,
    /// those vBuckets: where replication streams from.
    #[must_use]
    pub fn sources(&self, bucket: &str) -> BTreeMap<usize, Vec<Vbid>> {
        let mut out: BTreeMap<usize, Vec<Vbid>> = BTreeMap::new();
        for (v, chain) in self.doc.chains_of(bucket).iter().enumerate() {
            let vb = Vbid(u16::try_from(v).unwrap_or(u16::MAX));
            if self.state_of(bucket, vb) == VBucketState::Replica
                && let Some(Some(active)) = chain.first()
            {
                out.entry(*active).or_default().push(vb);
            }
        }
        out
    }

    /// Node `i`'s KV address, resolved.
    ///
    /// # Errors
    /// No such node, or its host does not resolve.
    pub fn kv_addr(&self, i: usize) -> Result<SocketAddr, String> {
        let n = &self.doc.nodes.get(i).ok_or("no such node")?.node;
        (n.host.as_str(), n.port)
            .to_socket_addrs()
            .map_err(|e| format!("{}:{}: {e}", n.host, n.port))?
            .next()
            .ok_or_else(|| format!("{}:{} does not resolve", n.host, n.port))
    }

    /// The node named `name`: its index, `host:port` (KV or management port), or
    /// `host` alone when one node has that host; ns_server's `ns_1@` prefix is allowed.
    #[must_use]
    pub fn node_named(&self, name: &str) -> Option<usize> {
        let nodes = &self.doc.nodes;
        if let Ok(i) = name.parse::<usize>() {
            return (i < nodes.len()).then_some(i);
        }
        let name = name.strip_prefix("ns_1@").unwrap_or(name);
        if !name.contains(':') || name.starts_with('[') && name.ends_with(']') {
            let host = name.trim_start_matches('[').trim_end_matches(']');
            let mut on_host = (0..nodes.len()).filter(|&i| nodes[i].node.host == host);
            return match (on_host.next(), on_host.next()) {
                (Some(i), None) => Some(i),
                _ => None,
            };
        }
        nodes.iter().position(|m| {
            let n = &m.node;
            name == host_port(&n.host, n.port)
                || n.mgmt_port.is_some_and(|p| name == host_port(&n.host, p))
        })
    }

    /// A manual failover in a static cluster: node `node` leaves every chain and each
    /// vBucket whose active copy was there gets its first live replica promoted (even
    /// when that loses the last copy: the operator said the node is gone). Returns
    /// whether anything changed; never fails this node over.
    pub fn fail_over(&mut self, node: usize) -> bool {
        if Some(node) == self.this {
            return false;
        }
        self.mark_failed(node)
    }

    /// [`Self::fail_over`], this node included (learned from the other nodes).
    pub fn mark_failed(&mut self, node: usize) -> bool {
        if self.doc.nodes.get(node).map(|m| m.membership) != Some(Membership::Active) {
            return false;
        }
        if self.doc.fail_over(node, &[], |_, _, _| 0).is_err() {
            // The last copy goes too: keep the node out of every chain anyway.
            self.doc.nodes[node].membership = Membership::InactiveFailed;
            for chain in &mut self.doc.chains {
                let len = chain.len();
                chain.retain(|n| n.is_some_and(|n| n != node));
                chain.resize(len, None);
            }
        }
        self.record(Change::Failed { node });
        true
    }

    /// The failed-over nodes.
    #[must_use]
    pub fn failed_nodes(&self) -> Vec<usize> {
        (0..self.doc.nodes.len())
            .filter(|&i| self.doc.is_failed(i))
            .collect()
    }

    /// Adds failed-over node `node` back ([`ClusterDoc::re_add`]). Returns whether
    /// anything changed.
    pub fn re_add(&mut self, node: usize) -> bool {
        if !self.doc.re_add(node) {
            return false;
        }
        self.record(Change::ReAdded { node });
        true
    }

    /// The nodes clients are told of (the active members) and `bucket`'s map rows
    /// indexing them, as JSON fragments: (`"host:port",...`, `[0,1],[1,0],...`).
    #[must_use]
    pub fn map_json(&self, bucket: &str) -> (String, String) {
        let listed = self.listed();
        let servers: Vec<String> = listed
            .iter()
            .map(|&i| {
                let n = &self.doc.nodes[i].node;
                format!("\"{}\"", host_port(&n.host, n.port))
            })
            .collect();
        let position = |n: usize| listed.iter().position(|&l| l == n);
        let chains = self.doc.chains_of(bucket);
        let mut rows = String::with_capacity(chains.len() * 8);
        for (i, chain) in chains.iter().enumerate() {
            if i > 0 {
                rows.push(',');
            }
            rows.push('[');
            for (j, n) in chain.iter().enumerate() {
                if j > 0 {
                    rows.push(',');
                }
                match n.and_then(position) {
                    Some(p) => rows.push_str(&p.to_string()),
                    None => rows.push_str("-1"),
                }
            }
            rows.push(']');
        }
        (servers.join(","), rows)
    }

    /// The indexes of the nodes the cluster map lists: the active members.
    #[must_use]
    pub fn listed(&self) -> Vec<usize> {
        (0..self.doc.nodes.len())
            .filter(|&i| self.doc.nodes[i].membership == Membership::Active)
            .collect()
    }
}

/// The DCP connection name of node `dst`'s replica stream of `bucket` from node `src`:
/// the name `src`'s durability monitors know `dst`'s acknowledgements by.
#[must_use]
pub(crate) fn replication_name(src: usize, dst: usize, bucket: &str) -> String {
    format!("replication:{src}->{dst}:{bucket}")
}

pub(crate) fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use epkv_types::NUM_VBUCKETS;

    fn file(nodes: usize, replicas: usize) -> ClusterFile {
        ClusterFile {
            replicas,
            nodes: (0..nodes)
                .map(|i| NodeSpec {
                    host: "127.0.0.1".into(),
                    port: 12000 + u16::try_from(i).unwrap(),
                    mgmt_port: None,
                })
                .collect(),
            user: None,
            password: None,
        }
    }

    #[test]
    fn the_state_file_replays_failovers_and_re_adds_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster-state.json");
        let mut t = Topology::new(file(3, 1), 1)
            .unwrap()
            .with_state_file(&path)
            .unwrap();
        assert!(t.fail_over(0));
        assert!(t.fail_over(2));
        assert!(t.re_add(0));
        let chains: Vec<Vec<Option<usize>>> = (0..NUM_VBUCKETS)
            .map(|v| t.chain("b", Vbid(v)).to_vec())
            .collect();
        let again = Topology::new(file(3, 1), 1)
            .unwrap()
            .with_state_file(&path)
            .unwrap();
        assert_eq!(again.failed_nodes(), vec![2]);
        for v in 0..NUM_VBUCKETS {
            assert_eq!(again.chain("b", Vbid(v)), &chains[usize::from(v)][..]);
        }
        std::fs::write(&path, b"not json").unwrap();
        assert!(
            Topology::new(file(3, 1), 1)
                .unwrap()
                .with_state_file(&path)
                .is_err()
        );
    }

    #[test]
    fn the_file_is_checked() {
        let ok =
            "replicas = 1\n[[nodes]]\nhost = \"a\"\nport = 1\n[[nodes]]\nhost = \"b\"\nport = 2\n";
        assert_eq!(ClusterFile::parse(ok).unwrap().nodes.len(), 2);
        assert!(ClusterFile::parse("replicas = 1\n[[nodes]]\nhost = \"a\"\nport = 1\n").is_err());
        assert!(ClusterFile::parse("replicas = 0\nnodes = []\n").is_err());
        let twice =
            "replicas = 0\n[[nodes]]\nhost = \"a\"\nport = 1\n[[nodes]]\nhost = \"a\"\nport = 1\n";
        assert!(ClusterFile::parse(twice).is_err());
        assert!(
            ClusterFile::parse("replicas = 0\nspeed = 3\n[[nodes]]\nhost = \"a\"\nport = 1\n")
                .is_err()
        );
    }

    #[test]
    fn every_vbucket_has_one_active_and_its_replicas_on_other_nodes() {
        for (n, r) in [(2, 1), (3, 1), (3, 2)] {
            let t: Vec<Topology> = (0..n)
                .map(|i| Topology::new(file(n, r), i).unwrap())
                .collect();
            for v in 0..NUM_VBUCKETS {
                let vb = Vbid(v);
                let states: Vec<VBucketState> = t.iter().map(|t| t.state_of("b", vb)).collect();
                assert_eq!(
                    states
                        .iter()
                        .filter(|s| **s == VBucketState::Active)
                        .count(),
                    1
                );
                assert_eq!(
                    states
                        .iter()
                        .filter(|s| **s == VBucketState::Replica)
                        .count(),
                    r
                );
            }
            // Actives are spread evenly.
            let actives = (0..NUM_VBUCKETS)
                .filter(|v| t[0].state_of("b", Vbid(*v)) == VBucketState::Active)
                .count();
            assert!(actives.abs_diff(usize::from(NUM_VBUCKETS) / n) <= 1);
        }
    }

    #[test]
    fn sources_name_the_active_of_each_replica() {
        let t = Topology::new(file(3, 1), 1).unwrap();
        let sources = t.sources("b");
        for (node, vbs) in &sources {
            for vb in vbs {
                assert_eq!(t.chain("b", *vb)[0], Some(*node));
                assert_eq!(t.state_of("b", *vb), VBucketState::Replica);
            }
        }
        let total: usize = sources.values().map(Vec::len).sum();
        assert_eq!(total, usize::from(NUM_VBUCKETS).div_ceil(3));
    }

    #[test]
    fn failover_promotes_the_replicas_and_drops_the_failed_node() {
        let mut t = Topology::new(file(2, 1), 1).unwrap();
        let was_active_on_0 = Vbid(0);
        assert_eq!(t.state_of("b", was_active_on_0), VBucketState::Replica);
        assert!(t.fail_over(0));
        assert!(!t.fail_over(0), "only once");
        assert!(!t.fail_over(1), "not itself");
        for v in 0..NUM_VBUCKETS {
            assert_eq!(t.state_of("b", Vbid(v)), VBucketState::Active);
            assert_eq!(t.chain("b", Vbid(v)), &[Some(1), None]);
        }
        assert!(t.sources("b").is_empty());
        let (servers, rows) = t.map_json("b");
        assert_eq!(
            servers, "\"127.0.0.1:12001\"",
            "a failed node is not listed"
        );
        assert!(rows.starts_with("[0,-1],[0,-1]"));
        assert_eq!(t.node_named("127.0.0.1:12000"), Some(0));
        assert_eq!(t.node_named("1"), Some(1));
        assert_eq!(t.node_named("9"), None);
        // Back as the replica of what it held; the actives stay.
        assert!(t.re_add(0));
        assert!(!t.re_add(0));
        assert_eq!(t.chain("b", Vbid(0)), &[Some(1), Some(0)]);
        assert_eq!(t.chain("b", Vbid(1)), &[Some(1), Some(0)]);
        let mut zero = Topology::new(file(2, 1), 0).unwrap();
        assert!(zero.mark_failed(0));
        for v in 0..NUM_VBUCKETS {
            assert_eq!(zero.state_of("b", Vbid(v)), VBucketState::Dead);
        }
        assert!(zero.re_add(0));
        assert_eq!(zero.state_of("b", Vbid(0)), VBucketState::Replica);
        assert_eq!(zero.sources("b").get(&1).map(Vec::len), Some(1024));
    }
}
