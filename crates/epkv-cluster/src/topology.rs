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

use epkv_types::{NUM_VBUCKETS, VBucketState, Vbid};
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
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

/// The cluster as this node sees it: the file, which node it is, and the current map.
#[derive(Debug, Clone)]
pub struct Topology {
    file: ClusterFile,
    this: usize,
    /// Per vBucket, the nodes holding it: active first, then replicas; `None` for a copy
    /// with no node (after a failover).
    chains: Vec<Vec<Option<usize>>>,
    /// Nodes failed over.
    failed: Vec<bool>,
    /// The changes applied after the file's map, in order.
    changes: Vec<Change>,
    /// Where they are kept, if anywhere.
    state_path: Option<PathBuf>,
}

impl Topology {
    /// The topology of node `this` of `file`, before any failover.
    ///
    /// # Errors
    /// `this` is not a node of the file.
    pub fn new(file: ClusterFile, this: usize) -> Result<Topology, String> {
        let n = file.nodes.len();
        if this >= n {
            return Err(format!(
                "--cluster-node {this}: the cluster file names nodes 0 to {}",
                n - 1
            ));
        }
        let chains = (0..usize::from(NUM_VBUCKETS))
            .map(|v| {
                (0..=file.replicas)
                    .map(|i| Some((v + i) % n))
                    .collect::<Vec<_>>()
            })
            .collect();
        Ok(Topology {
            failed: vec![false; n],
            file,
            this,
            chains,
            changes: Vec::new(),
            state_path: None,
        })
    }

    /// Keeps the changes in the state file `path` from now on, after replaying the ones it
    /// holds (a node that restarts keeps the map it had).
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

    /// Records `change` (and writes the state file).
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

    /// This node's index.
    #[must_use]
    pub fn this(&self) -> usize {
        self.this
    }

    /// The nodes.
    #[must_use]
    pub fn nodes(&self) -> &[NodeSpec] {
        &self.file.nodes
    }

    /// Replicas per vBucket.
    #[must_use]
    pub fn replicas(&self) -> usize {
        self.file.replicas
    }

    /// Whether node `i` was failed over.
    #[must_use]
    pub fn is_failed(&self, i: usize) -> bool {
        self.failed.get(i).copied().unwrap_or(true)
    }

    /// The replication credentials.
    #[must_use]
    pub fn credentials(&self) -> Option<(String, String)> {
        self.file.user.clone().zip(self.file.password.clone())
    }

    /// vBucket `vb`'s chain: active first.
    #[must_use]
    pub fn chain(&self, vb: Vbid) -> &[Option<usize>] {
        self.chains
            .get(usize::from(vb.0))
            .map_or(&[][..], Vec::as_slice)
    }

    /// The state this node's copy of `vb` should be in.
    #[must_use]
    pub fn state_of(&self, vb: Vbid) -> VBucketState {
        match self.chain(vb).iter().position(|n| *n == Some(self.this)) {
            Some(0) => VBucketState::Active,
            Some(_) => VBucketState::Replica,
            None => VBucketState::Dead,
        }
    }

    /// For this node's replica vBuckets: the node holding each one's active copy, with
    /// the vBuckets it serves this node.
    #[must_use]
    pub fn sources(&self) -> BTreeMap<usize, Vec<Vbid>> {
        let mut out: BTreeMap<usize, Vec<Vbid>> = BTreeMap::new();
        for (v, chain) in self.chains.iter().enumerate() {
            let vb = Vbid(u16::try_from(v).unwrap_or(u16::MAX));
            if self.state_of(vb) == VBucketState::Replica
                && let Some(Some(active)) = chain.first()
            {
                out.entry(*active).or_default().push(vb);
            }
        }
        out
    }

    /// The KV address of node `i`.
    ///
    /// # Errors
    /// The host does not resolve.
    pub fn kv_addr(&self, i: usize) -> Result<SocketAddr, String> {
        let n = self.file.nodes.get(i).ok_or("no such node")?;
        (n.host.as_str(), n.port)
            .to_socket_addrs()
            .map_err(|e| format!("{}:{}: {e}", n.host, n.port))?
            .next()
            .ok_or_else(|| format!("{}:{} does not resolve", n.host, n.port))
    }

    /// The index of the node named `name` (`host:port`, or its index).
    #[must_use]
    pub fn node_named(&self, name: &str) -> Option<usize> {
        if let Ok(i) = name.parse::<usize>() {
            return (i < self.file.nodes.len()).then_some(i);
        }
        self.file
            .nodes
            .iter()
            .position(|n| format!("{}:{}", n.host, n.port) == name)
    }

    /// Fails node `node` over: promotes the first live replica of every vBucket it held
    /// active, and takes it out of every chain. Returns false when it already was (or is
    /// this node, which cannot fail itself over).
    pub fn fail_over(&mut self, node: usize) -> bool {
        if node == self.this {
            return false;
        }
        self.mark_failed(node)
    }

    /// Applies a failover of `node` that other nodes made (this node included: a node
    /// that restarts after being failed over learns it from its peers, and holds nothing
    /// until it is added back).
    pub fn mark_failed(&mut self, node: usize) -> bool {
        if node >= self.failed.len() || self.failed[node] {
            return false;
        }
        self.failed[node] = true;
        self.record(Change::Failed { node });
        for chain in &mut self.chains {
            let live: Vec<Option<usize>> = chain
                .iter()
                .copied()
                .filter(|n| n.is_some_and(|n| n != node))
                .collect();
            let len = chain.len();
            *chain = live;
            chain.resize(len, None);
        }
        true
    }

    /// The nodes failed over.
    #[must_use]
    pub fn failed_nodes(&self) -> Vec<usize> {
        (0..self.failed.len()).filter(|&i| self.failed[i]).collect()
    }

    /// Adds failed-over node `node` back (`POST /controller/reAddNode`): it becomes a
    /// replica again of the vBuckets the file gave it, in their empty replica slots; the
    /// actives stay where the failover put them. Returns whether it was failed.
    pub fn re_add(&mut self, node: usize) -> bool {
        if node >= self.failed.len() || !self.failed[node] {
            return false;
        }
        self.failed[node] = false;
        self.record(Change::ReAdded { node });
        let n = self.file.nodes.len();
        for (v, chain) in self.chains.iter_mut().enumerate() {
            let held = (0..=self.file.replicas).any(|i| (v + i) % n == node);
            if held
                && !chain.contains(&Some(node))
                && let Some(slot) = chain.iter_mut().skip(1).find(|s| s.is_none())
            {
                *slot = Some(node);
            }
        }
        true
    }

    /// `serverList` (KV `host:port` of every node) and `vBucketMap` rows as JSON text.
    #[must_use]
    pub fn map_json(&self) -> (String, String) {
        let servers: Vec<String> = self
            .file
            .nodes
            .iter()
            .map(|n| format!("\"{}\"", host_port(&n.host, n.port)))
            .collect();
        let mut rows = String::with_capacity(self.chains.len() * 8);
        for (i, chain) in self.chains.iter().enumerate() {
            if i > 0 {
                rows.push(',');
            }
            rows.push('[');
            for (j, n) in chain.iter().enumerate() {
                if j > 0 {
                    rows.push(',');
                }
                match n {
                    Some(n) => rows.push_str(&n.to_string()),
                    None => rows.push_str("-1"),
                }
            }
            rows.push(']');
        }
        (servers.join(","), rows)
    }
}

/// `host:port`, bracketing an IPv6 address.
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
            .map(|v| t.chain(Vbid(v)).to_vec())
            .collect();
        let again = Topology::new(file(3, 1), 1)
            .unwrap()
            .with_state_file(&path)
            .unwrap();
        assert_eq!(again.failed_nodes(), vec![2]);
        for v in 0..NUM_VBUCKETS {
            assert_eq!(again.chain(Vbid(v)), &chains[usize::from(v)][..]);
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
                let states: Vec<VBucketState> = t.iter().map(|t| t.state_of(vb)).collect();
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
                .filter(|v| t[0].state_of(Vbid(*v)) == VBucketState::Active)
                .count();
            assert!(actives.abs_diff(usize::from(NUM_VBUCKETS) / n) <= 1);
        }
    }

    #[test]
    fn sources_name_the_active_of_each_replica() {
        let t = Topology::new(file(3, 1), 1).unwrap();
        let sources = t.sources();
        for (node, vbs) in &sources {
            for vb in vbs {
                assert_eq!(t.chain(*vb)[0], Some(*node));
                assert_eq!(t.state_of(*vb), VBucketState::Replica);
            }
        }
        let total: usize = sources.values().map(Vec::len).sum();
        assert_eq!(total, usize::from(NUM_VBUCKETS).div_ceil(3));
    }

    #[test]
    fn failover_promotes_the_replicas_and_drops_the_failed_node() {
        let mut t = Topology::new(file(2, 1), 1).unwrap();
        let was_active_on_0 = Vbid(0);
        assert_eq!(t.state_of(was_active_on_0), VBucketState::Replica);
        assert!(t.fail_over(0));
        assert!(!t.fail_over(0), "only once");
        assert!(!t.fail_over(1), "not itself");
        for v in 0..NUM_VBUCKETS {
            assert_eq!(t.state_of(Vbid(v)), VBucketState::Active);
            assert_eq!(t.chain(Vbid(v)), &[Some(1), None]);
        }
        assert!(t.sources().is_empty());
        let (servers, rows) = t.map_json();
        assert_eq!(servers, "\"127.0.0.1:12000\",\"127.0.0.1:12001\"");
        assert!(rows.starts_with("[1,-1],[1,-1]"));
        assert_eq!(t.node_named("127.0.0.1:12000"), Some(0));
        assert_eq!(t.node_named("1"), Some(1));
        assert_eq!(t.node_named("9"), None);
        // Back as the replica of what it held; the actives stay.
        assert!(t.re_add(0));
        assert!(!t.re_add(0));
        assert_eq!(t.chain(Vbid(0)), &[Some(1), Some(0)]);
        assert_eq!(t.chain(Vbid(1)), &[Some(1), Some(0)]);
        let mut zero = Topology::new(file(2, 1), 0).unwrap();
        assert!(zero.mark_failed(0));
        for v in 0..NUM_VBUCKETS {
            assert_eq!(zero.state_of(Vbid(v)), VBucketState::Dead);
        }
        assert!(zero.re_add(0));
        assert_eq!(zero.state_of(Vbid(0)), VBucketState::Replica);
        assert_eq!(zero.sources().get(&1).map(Vec::len), Some(1024));
    }
}
