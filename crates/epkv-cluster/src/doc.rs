//! [`ClusterDoc`]: the cluster's state as one value (members, the vBucket maps, the
//! auto-failover settings), and the pure edits made to it: failover with a choice of the
//! replica to promote, re-adding a node, adding a node.
//!
//! A static cluster derives it from the cluster file; an etcd cluster keeps it in etcd
//! under `topology` and changes it only by compare-and-swap (`coord.rs`), so every node
//! applies the same document in the same order.
//!
//! **Maps.** `chains` is the map every bucket uses unless `bucket_chains` has its own:
//! a failover chooses the replica to promote per bucket (the one holding the most of that
//! bucket's vBucket), so two buckets' maps may differ afterwards. A chain lists node
//! indexes, active first then replicas, `None` for a copy with no node; its length is
//! always `replicas + 1`.

use crate::rebalance::{DEFAULT_MOVES_PER_NODE, Rebalance};
use crate::topology::{ClusterFile, NodeSpec};
use epkv_types::{NUM_VBUCKETS, Vbid};
use std::collections::BTreeMap;

/// A node's standing in the cluster, as ns_server names it in `clusterMembership`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Membership {
    /// Holds vBuckets (or may).
    Active,
    /// Added by an operator; holds nothing until a rebalance gives it vBuckets.
    InactiveAdded,
    /// Failed over: holds nothing until it is added back.
    InactiveFailed,
}

impl Membership {
    /// The name ns_server gives it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Membership::Active => "active",
            Membership::InactiveAdded => "inactiveAdded",
            Membership::InactiveFailed => "inactiveFailed",
        }
    }
}

/// One node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    /// Where it is.
    pub node: NodeSpec,
    /// Its standing.
    pub membership: Membership,
}

/// The auto-failover settings and count (`/settings/autoFailover`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct AutoFailover {
    /// Whether the orchestrator fails unreachable nodes over.
    pub enabled: bool,
    /// Seconds a node must be unreachable (and its lease expired) first: 1-3600.
    pub timeout: u64,
    /// Most nodes failed over automatically before an operator resets the count.
    pub max_count: u32,
    /// Nodes failed over automatically since the last reset.
    pub count: u32,
}

impl Default for AutoFailover {
    /// Couchbase Server 7's defaults.
    fn default() -> Self {
        AutoFailover {
            enabled: true,
            timeout: 120,
            max_count: 1,
            count: 0,
        }
    }
}

/// The range `timeout` must be in.
pub const AUTO_FAILOVER_TIMEOUT: std::ops::RangeInclusive<u64> = 1..=3600;

/// One chain per vBucket.
pub type Chains = Vec<Vec<Option<usize>>>;

/// The cluster's state.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClusterDoc {
    /// Replicas of each vBucket.
    pub replicas: usize,
    /// The nodes; a node's index here is its number in the maps.
    pub nodes: Vec<Member>,
    /// The map of every bucket without its own.
    pub chains: Chains,
    /// Buckets whose map differs from `chains`.
    #[serde(default)]
    pub bucket_chains: BTreeMap<String, Chains>,
    /// Auto-failover.
    #[serde(default)]
    pub auto_failover: AutoFailover,
    /// Nodes being failed over gracefully: they refuse client writes while their
    /// replicas catch up, then the failover promotes those replicas.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub graceful: Vec<usize>,
    /// Nodes added back with full recovery that have not yet dropped what they held:
    /// each empties its replica vBuckets before streaming them afresh, then leaves the
    /// list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub full_recovery: Vec<usize>,
    /// The rebalance in progress (`rebalance.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebalance: Option<Rebalance>,
    /// How the last rebalance ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rebalance: Option<String>,
    /// Moves a node takes part in at once during a rebalance (`rebalanceMovesPerNode`).
    #[serde(default = "default_moves_per_node")]
    pub moves_per_node: usize,
}

fn default_moves_per_node() -> usize {
    DEFAULT_MOVES_PER_NODE
}

/// What a failover would do wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailoverRefusal {
    /// No such node, or it is not an active member.
    NotActive,
    /// Some vBuckets have their only copy there (bucket, vBucket).
    LastCopy(Vec<(String, Vbid)>),
}

impl std::fmt::Display for FailoverRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FailoverRefusal::NotActive => write!(f, "the node is not an active member"),
            FailoverRefusal::LastCopy(lost) => {
                let (bucket, vb) = &lost[0];
                write!(
                    f,
                    "failing it over would lose the last copy of {} vBuckets (the first: {vb} of bucket {bucket:?})",
                    lost.len()
                )
            }
        }
    }
}

impl ClusterDoc {
    /// The nodes of `file`, all active, with the file's map: vBucket `v`'s `i`th copy on
    /// node `(v + i) mod n`.
    #[must_use]
    pub fn from_file(file: &ClusterFile) -> ClusterDoc {
        let nodes: Vec<Member> = file
            .nodes
            .iter()
            .map(|n| Member {
                node: n.clone(),
                membership: Membership::Active,
            })
            .collect();
        let n = nodes.len().max(1);
        let chains = (0..usize::from(NUM_VBUCKETS))
            .map(|v| (0..=file.replicas).map(|i| Some((v + i) % n)).collect())
            .collect();
        ClusterDoc {
            replicas: file.replicas,
            nodes,
            chains,
            bucket_chains: BTreeMap::new(),
            auto_failover: AutoFailover::default(),
            graceful: Vec::new(),
            full_recovery: Vec::new(),
            rebalance: None,
            last_rebalance: None,
            moves_per_node: DEFAULT_MOVES_PER_NODE,
        }
    }

    /// A cluster of one node holding every vBucket active, with room for `replicas`.
    #[must_use]
    pub fn single(node: NodeSpec, replicas: usize) -> ClusterDoc {
        let mut chain = vec![None; replicas + 1];
        chain[0] = Some(0);
        ClusterDoc {
            replicas,
            nodes: vec![Member {
                node,
                membership: Membership::Active,
            }],
            chains: vec![chain; usize::from(NUM_VBUCKETS)],
            bucket_chains: BTreeMap::new(),
            auto_failover: AutoFailover::default(),
            graceful: Vec::new(),
            full_recovery: Vec::new(),
            rebalance: None,
            last_rebalance: None,
            moves_per_node: DEFAULT_MOVES_PER_NODE,
        }
    }

    /// The map of `bucket`.
    #[must_use]
    pub fn chains_of(&self, bucket: &str) -> &Chains {
        self.bucket_chains.get(bucket).unwrap_or(&self.chains)
    }

    /// The node at `host:port` (KV port).
    #[must_use]
    pub fn index_of(&self, host: &str, port: u16) -> Option<usize> {
        self.nodes
            .iter()
            .position(|m| m.node.host == host && m.node.port == port)
    }

    /// Whether node `i` is failed over (or unknown).
    #[must_use]
    pub fn is_failed(&self, i: usize) -> bool {
        self.nodes
            .get(i)
            .is_none_or(|m| m.membership == Membership::InactiveFailed)
    }

    /// Every map: the default one (named `""`) and the buckets' own.
    fn maps_mut(&mut self) -> impl Iterator<Item = (&str, &mut Chains)> {
        std::iter::once(("", &mut self.chains))
            .chain(self.bucket_chains.iter_mut().map(|(b, c)| (b.as_str(), c)))
    }

    /// The vBuckets (by bucket; `""` for the default map) whose only live copy is on
    /// node `node`, for `buckets` (the buckets that exist).
    #[must_use]
    pub fn last_copies(&self, node: usize, buckets: &[String]) -> Vec<(String, Vbid)> {
        let mut lost = Vec::new();
        let mut check = |bucket: &str, chains: &Chains| {
            for (v, chain) in chains.iter().enumerate() {
                let holds = chain.contains(&Some(node));
                let others = chain
                    .iter()
                    .flatten()
                    .any(|&n| n != node && !self.is_failed(n));
                if holds && !others {
                    lost.push((bucket.to_owned(), Vbid(u16::try_from(v).unwrap_or(0))));
                }
            }
        };
        if buckets.is_empty() {
            check("", &self.chains);
        }
        for b in buckets {
            check(b, self.chains_of(b));
        }
        lost
    }

    /// Fails node `node` over: for each vBucket whose active copy was there, in each of
    /// `buckets`' maps (and the default one), `pick(bucket, vb, candidates)` chooses
    /// which live replica becomes active (an index into `candidates`, which are in chain
    /// order; out of range picks the first). The node leaves every chain and becomes
    /// `inactiveFailed`.
    ///
    /// # Errors
    /// The node is not active, or holds the last copy of a vBucket.
    pub fn fail_over(
        &mut self,
        node: usize,
        buckets: &[String],
        mut pick: impl FnMut(&str, Vbid, &[usize]) -> usize,
    ) -> Result<(), FailoverRefusal> {
        if self.nodes.get(node).map(|m| m.membership) != Some(Membership::Active) {
            return Err(FailoverRefusal::NotActive);
        }
        let lost = self.last_copies(node, buckets);
        if !lost.is_empty() {
            return Err(FailoverRefusal::LastCopy(lost));
        }
        // Every existing bucket gets its own map, so that its promotions are its own.
        for b in buckets {
            if !self.bucket_chains.contains_key(b) {
                self.bucket_chains.insert(b.clone(), self.chains.clone());
            }
        }
        self.bucket_chains.retain(|b, _| buckets.contains(b));
        self.stop_rebalance(&format!("stopped: node {node} was failed over"));
        self.nodes[node].membership = Membership::InactiveFailed;
        self.graceful.retain(|&n| n != node);
        self.full_recovery.retain(|&n| n != node);
        let failed: Vec<bool> = (0..self.nodes.len()).map(|i| self.is_failed(i)).collect();
        for (bucket, chains) in self.maps_mut() {
            for (v, chain) in chains.iter_mut().enumerate() {
                let len = chain.len();
                let live: Vec<usize> = chain
                    .iter()
                    .flatten()
                    .copied()
                    .filter(|&n| !failed.get(n).copied().unwrap_or(true))
                    .collect();
                if chain.first() == Some(&Some(node)) && !live.is_empty() {
                    let vb = Vbid(u16::try_from(v).unwrap_or(0));
                    let chosen = pick(bucket, vb, &live);
                    let chosen = if chosen < live.len() { chosen } else { 0 };
                    let mut next = vec![Some(live[chosen])];
                    next.extend(
                        live.iter()
                            .enumerate()
                            .filter(|(i, _)| *i != chosen)
                            .map(|(_, n)| Some(*n)),
                    );
                    *chain = next;
                } else {
                    *chain = chain
                        .iter()
                        .copied()
                        .filter(|n| n.is_some_and(|n| n != node))
                        .collect();
                }
                chain.resize(len, None);
            }
        }
        Ok(())
    }

    /// Adds failed-over node `node` back: it becomes `active` again and a replica of
    /// the vBuckets the file's formula gives it, in their empty replica slots (the
    /// actives stay where the failover put them). Returns whether anything changed.
    pub fn re_add(&mut self, node: usize) -> bool {
        if self.nodes.get(node).map(|m| m.membership) != Some(Membership::InactiveFailed) {
            return false;
        }
        self.nodes[node].membership = Membership::Active;
        let n = self.nodes.len();
        let replicas = self.replicas;
        for (_, chains) in self.maps_mut() {
            for (v, chain) in chains.iter_mut().enumerate() {
                let home = (0..=replicas).any(|i| (v + i) % n == node);
                if home
                    && !chain.contains(&Some(node))
                    && let Some(slot) = chain.iter_mut().skip(1).find(|s| s.is_none())
                {
                    *slot = Some(node);
                }
            }
        }
        true
    }

    /// Adds a node that holds nothing yet (`inactiveAdded`). Returns whether anything
    /// changed.
    ///
    /// # Errors
    /// The node is already a member in another standing.
    pub fn add_node(&mut self, node: NodeSpec) -> Result<bool, String> {
        match self.index_of(&node.host, node.port) {
            Some(i) if self.nodes[i].membership == Membership::InactiveAdded => Ok(false),
            Some(i) => Err(format!(
                "{}:{} is already in the cluster ({})",
                node.host,
                node.port,
                self.nodes[i].membership.as_str()
            )),
            None if self.nodes.len() >= crate::topology::MAX_NODES => Err(format!(
                "the cluster has the most nodes it may have ({})",
                crate::topology::MAX_NODES
            )),
            None => {
                self.nodes.push(Member {
                    node,
                    membership: Membership::InactiveAdded,
                });
                Ok(true)
            }
        }
    }
}

/// Testing: the cluster of `n` nodes on 127.0.0.1 (ports 12000 + i) that a cluster file
/// with `replicas` gives.
#[cfg(test)]
pub(crate) fn file_doc(n: u16, replicas: usize) -> ClusterDoc {
    ClusterDoc::from_file(&ClusterFile {
        replicas,
        nodes: (0..n)
            .map(|i| NodeSpec {
                host: "127.0.0.1".into(),
                port: 12000 + i,
                mgmt_port: None,
            })
            .collect(),
        user: None,
        password: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: u16, replicas: usize) -> ClusterDoc {
        file_doc(n, replicas)
    }

    #[test]
    fn failover_promotes_the_replica_the_picker_chooses_per_bucket() {
        let mut doc = nodes(3, 2);
        let buckets = vec!["a".to_owned(), "b".to_owned()];
        // vBucket 0: [0, 1, 2]. Bucket a promotes the second candidate (node 2), b the
        // first (node 1).
        doc.fail_over(0, &buckets, |bucket, vb, candidates| {
            assert!(!candidates.contains(&0));
            usize::from(bucket == "a" && vb == Vbid(0))
        })
        .unwrap();
        assert_eq!(doc.chains_of("a")[0], vec![Some(2), Some(1), None]);
        assert_eq!(doc.chains_of("b")[0], vec![Some(1), Some(2), None]);
        assert_eq!(doc.chains[0], vec![Some(1), Some(2), None]);
        // Where it was a replica, it leaves the chain: [2, 0, 1] becomes [2, 1, -].
        assert_eq!(doc.chains_of("a")[2], vec![Some(2), Some(1), None]);
        assert_eq!(doc.nodes[0].membership, Membership::InactiveFailed);
        assert_eq!(
            doc.fail_over(0, &buckets, |_, _, _| 0),
            Err(FailoverRefusal::NotActive)
        );
        // JSON round trip keeps everything.
        let text = serde_json::to_string(&doc).unwrap();
        assert_eq!(serde_json::from_str::<ClusterDoc>(&text).unwrap(), doc);
    }

    #[test]
    fn failover_that_would_lose_the_last_copy_is_refused() {
        let mut doc = nodes(2, 1);
        doc.fail_over(1, &[], |_, _, _| 0).unwrap();
        let before = doc.clone();
        match doc.fail_over(0, &[], |_, _, _| 0) {
            Err(FailoverRefusal::LastCopy(lost)) => assert_eq!(lost.len(), 1024),
            other => panic!("{other:?}"),
        }
        assert_eq!(doc, before, "a refused failover changes nothing");
        let mut none = nodes(2, 0);
        assert!(matches!(
            none.fail_over(0, &[], |_, _, _| 0),
            Err(FailoverRefusal::LastCopy(_))
        ));
    }

    #[test]
    fn re_add_and_add_node() {
        let mut doc = nodes(2, 1);
        doc.fail_over(0, &[], |_, _, _| 0).unwrap();
        assert!(doc.re_add(0));
        assert!(!doc.re_add(0));
        assert_eq!(doc.chains[0], vec![Some(1), Some(0)]);
        let new = NodeSpec {
            host: "127.0.0.1".into(),
            port: 13000,
            mgmt_port: Some(13001),
        };
        assert_eq!(doc.add_node(new.clone()), Ok(true));
        assert_eq!(doc.add_node(new), Ok(false));
        assert_eq!(doc.nodes[2].membership, Membership::InactiveAdded);
        assert!(doc.chains.iter().all(|c| !c.contains(&Some(2))));
        let existing = doc.nodes[0].node.clone();
        assert!(doc.add_node(existing).is_err());
    }

    #[test]
    fn a_single_node_holds_everything_with_room_for_replicas() {
        let doc = ClusterDoc::single(
            NodeSpec {
                host: "h".into(),
                port: 1,
                mgmt_port: None,
            },
            1,
        );
        assert!(doc.chains.iter().all(|c| c == &vec![Some(0), None]));
        assert_eq!(doc.chains.len(), usize::from(NUM_VBUCKETS));
    }
}
