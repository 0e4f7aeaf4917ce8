//! A rebalance as the cluster document records it ([`Rebalance`], [`VbMove`]), and the
//! pure edits of the document that start, advance, stop and finish one.
//!
//! **What the document holds.** Only what every node must act on: the vBuckets being
//! moved now, each with its chain after the move and its phase, the nodes that leave at
//! the end, and counters for progress. The target map itself stays in the orchestrator
//! (`rebalancer.rs`): a new orchestrator does not carry on with it, it stops the
//! rebalance, and a new one computes a target from the map as it then is.
//!
//! **One move of vBucket `v`** (in every bucket at once) from its chain `[A, C]` to
//! `[B, C']`:
//! - [`Phase::Backfill`]: nodes of the new chain that hold no copy create `v` as a
//!   replica and stream it from `A` (`Topology::state_of`). The old chain serves.
//! - [`Phase::Synced`]: the new copies are close behind `A`; `A`'s SyncWrites now need a
//!   majority in both chains (KV-Engine's second chain).
//! - [`Phase::Takeover`] (only when the active changes): `A`'s copy goes `pending`, so
//!   client operations on it are parked, not refused; `B` streams the last of it.
//! - Done ([`ClusterDoc::complete_move`]): the new chain replaces the old one in every
//!   bucket's map in the same compare-and-swap that ends the move. `B` becomes active
//!   (committing the prepares it holds), `A` drops its copy: only once the new map is
//!   committed in etcd, since each node acts on the document it installs.
//!
//! **Stopping** ([`ClusterDoc::stop_rebalance`]) forgets the moves in flight: their
//! vBuckets keep their old chains (a pending `A` becomes active again), the partial new
//! copies are dropped, and the moves completed stay. The map is consistent after every
//! compare-and-swap, so whatever stops a rebalance (an operator, a failover, a dying
//! node or orchestrator) leaves each vBucket active exactly once.

use crate::doc::{Chains, ClusterDoc, Membership};
use std::collections::{BTreeMap, BTreeSet};

/// The rebalance in progress.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rebalance {
    /// Tells one rebalance from the next (the document's revision when it started).
    pub id: i64,
    /// The orchestrator driving it (its node id), once one took it on.
    #[serde(default)]
    pub orchestrator: Option<String>,
    /// Nodes (indexes) that leave the cluster once their vBuckets moved away.
    #[serde(default)]
    pub ejected: Vec<usize>,
    /// The vBuckets being moved, by number.
    #[serde(default)]
    pub moves: BTreeMap<u16, VbMove>,
    /// Moves planned.
    #[serde(default)]
    pub total: usize,
    /// Moves made.
    #[serde(default)]
    pub done: usize,
    /// Per node (index): moves planned that it takes part in.
    #[serde(default)]
    pub node_total: BTreeMap<usize, usize>,
    /// Per node (index): moves made that it took part in.
    #[serde(default)]
    pub node_done: BTreeMap<usize, usize>,
    /// Moves each node takes part in at once (incoming or outgoing backfills).
    pub moves_per_node: usize,
}

/// One vBucket's move.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VbMove {
    /// Its chain once moved.
    pub to: Vec<Option<usize>>,
    /// How far it got.
    pub phase: Phase,
}

/// How far a move got (see the module docs).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    /// The new copies are being built.
    Backfill,
    /// The new copies are close behind; SyncWrites need both chains.
    Synced,
    /// The old active is pending; the new one takes the last of it.
    Takeover,
}

/// Couchbase's default for moves per node at once (`rebalanceMovesPerNode`).
pub const DEFAULT_MOVES_PER_NODE: usize = 4;
/// The range `rebalanceMovesPerNode` must be in.
pub const MOVES_PER_NODE: std::ops::RangeInclusive<usize> = 1..=64;

/// Why a rebalance cannot start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebalanceRefusal {
    /// One is running already.
    Running,
    /// `knownNodes` does not name exactly the cluster's nodes (ns_server's check that the
    /// operator saw the cluster as it is).
    NodesMismatch,
    /// Every node would be ejected.
    NoNodesLeft,
    /// A node is being failed over gracefully.
    Busy(String),
}

impl std::fmt::Display for RebalanceRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RebalanceRefusal::Running => write!(f, "a rebalance is running already"),
            RebalanceRefusal::NodesMismatch => write!(
                f,
                "knownNodes must name every node of the cluster (GET /pools/default lists them)"
            ),
            RebalanceRefusal::NoNodesLeft => write!(f, "a rebalance cannot eject every node"),
            RebalanceRefusal::Busy(why) => f.write_str(why),
        }
    }
}

impl ClusterDoc {
    /// The vBucket move in flight for `v`, if any.
    #[must_use]
    pub fn moving(&self, v: usize) -> Option<&VbMove> {
        let v = u16::try_from(v).ok()?;
        self.rebalance.as_ref()?.moves.get(&v)
    }

    /// The nodes that hold vBuckets after the rebalance in progress: the active
    /// members that are not ejected.
    #[must_use]
    pub fn rebalance_nodes(&self) -> Vec<usize> {
        let ejected = self
            .rebalance
            .as_ref()
            .map(|r| r.ejected.clone())
            .unwrap_or_default();
        (0..self.nodes.len())
            .filter(|i| self.nodes[*i].membership == Membership::Active && !ejected.contains(i))
            .collect()
    }

    /// Starts a rebalance as `id`: `known` must be every node, `ejected` leave at the
    /// end. Nodes added and not ejected become active members now (they hold nothing
    /// until moves give them vBuckets); failed-over nodes not added back are ejected, as
    /// ns_server does.
    ///
    /// # Errors
    /// See [`RebalanceRefusal`].
    pub fn start_rebalance(
        &mut self,
        id: i64,
        known: &BTreeSet<usize>,
        ejected: &BTreeSet<usize>,
    ) -> Result<(), RebalanceRefusal> {
        if self.rebalance.is_some() {
            return Err(RebalanceRefusal::Running);
        }
        if !self.graceful.is_empty() {
            return Err(RebalanceRefusal::Busy(
                "a graceful failover is in progress".into(),
            ));
        }
        let all: BTreeSet<usize> = (0..self.nodes.len()).collect();
        if *known != all || !ejected.is_subset(&all) {
            return Err(RebalanceRefusal::NodesMismatch);
        }
        let mut leaving: Vec<usize> = ejected.iter().copied().collect();
        for (i, m) in self.nodes.iter().enumerate() {
            if m.membership == Membership::InactiveFailed && !leaving.contains(&i) {
                leaving.push(i);
            }
        }
        leaving.sort_unstable();
        if leaving.len() == self.nodes.len() {
            return Err(RebalanceRefusal::NoNodesLeft);
        }
        for (i, m) in self.nodes.iter_mut().enumerate() {
            if m.membership == Membership::InactiveAdded && !leaving.contains(&i) {
                m.membership = Membership::Active;
            }
        }
        self.rebalance = Some(Rebalance {
            id,
            orchestrator: None,
            ejected: leaving,
            moves: BTreeMap::new(),
            total: 0,
            done: 0,
            node_total: BTreeMap::new(),
            node_done: BTreeMap::new(),
            moves_per_node: self.moves_per_node,
        });
        Ok(())
    }

    /// Stops the rebalance in progress (see the module docs), recording `why`. Returns
    /// whether one was in progress.
    pub fn stop_rebalance(&mut self, why: &str) -> bool {
        let Some(r) = self.rebalance.take() else {
            return false;
        };
        self.last_rebalance = Some(format!(
            "{why} ({} of {} vBucket moves made)",
            r.done, r.total
        ));
        true
    }

    /// Ends the move of `v`: its chain becomes the move's `to` in every map (the
    /// default one and each bucket's own), and the move leaves the list. Returns whether
    /// there was such a move.
    pub fn complete_move(&mut self, v: u16) -> bool {
        let Some(r) = self.rebalance.as_mut() else {
            return false;
        };
        let Some(m) = r.moves.remove(&v) else {
            return false;
        };
        r.done += 1;
        let i = usize::from(v);
        let mut involved: BTreeSet<usize> = m.to.iter().flatten().copied().collect();
        if let Some(chain) = self.chains.get(i) {
            involved.extend(chain.iter().flatten().copied());
        }
        for n in involved {
            *r.node_done.entry(n).or_default() += 1;
        }
        if let Some(c) = self.chains.get_mut(i) {
            c.clone_from(&m.to);
        }
        for chains in self.bucket_chains.values_mut() {
            if let Some(c) = chains.get_mut(i) {
                c.clone_from(&m.to);
            }
        }
        true
    }

    /// Finishes the rebalance: the map becomes `target` everywhere, the ejected nodes
    /// leave the document (the others are numbered afresh, the maps with them), and the
    /// outcome is recorded. Every move must have been completed.
    pub fn finish_rebalance(&mut self, target: &Chains) {
        let Some(r) = self.rebalance.take() else {
            return;
        };
        self.chains.clone_from(target);
        self.bucket_chains.clear();
        let keep: Vec<usize> = (0..self.nodes.len())
            .filter(|i| !r.ejected.contains(i))
            .collect();
        let renumber = |n: usize| keep.iter().position(|&k| k == n);
        for chain in &mut self.chains {
            for slot in chain.iter_mut() {
                *slot = slot.and_then(renumber);
            }
        }
        self.graceful = self.graceful.iter().filter_map(|&n| renumber(n)).collect();
        self.full_recovery = self
            .full_recovery
            .iter()
            .filter_map(|&n| renumber(n))
            .collect();
        self.nodes = keep.iter().map(|&k| self.nodes[k].clone()).collect();
        self.last_rebalance = Some(format!(
            "completed: {} vBucket moves, {} nodes ejected",
            r.done,
            r.ejected.len()
        ));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;
    use crate::topology::NodeSpec;

    fn nodes(n: u16, replicas: usize) -> ClusterDoc {
        crate::doc::file_doc(n, replicas)
    }

    fn spec(port: u16) -> NodeSpec {
        NodeSpec {
            host: "127.0.0.1".into(),
            port,
            mgmt_port: None,
        }
    }

    #[test]
    fn a_start_checks_the_known_nodes_and_activates_the_added_ones() {
        let mut doc = nodes(2, 1);
        doc.add_node(spec(13000)).unwrap();
        let two: BTreeSet<usize> = [0, 1].into();
        let all: BTreeSet<usize> = [0, 1, 2].into();
        assert_eq!(
            doc.start_rebalance(1, &two, &BTreeSet::new()),
            Err(RebalanceRefusal::NodesMismatch)
        );
        assert_eq!(
            doc.start_rebalance(1, &all, &all),
            Err(RebalanceRefusal::NoNodesLeft)
        );
        doc.start_rebalance(7, &all, &[0].into()).unwrap();
        assert_eq!(doc.nodes[2].membership, Membership::Active);
        assert_eq!(doc.rebalance_nodes(), vec![1, 2]);
        assert_eq!(
            doc.start_rebalance(8, &all, &BTreeSet::new()),
            Err(RebalanceRefusal::Running)
        );
        assert!(doc.stop_rebalance("stopped"));
        assert!(
            doc.last_rebalance
                .as_deref()
                .unwrap()
                .starts_with("stopped")
        );
        assert!(doc.rebalance.is_none());
    }

    #[test]
    fn a_completed_move_changes_every_map_and_finishing_renumbers() {
        let mut doc = nodes(3, 1);
        doc.bucket_chains.insert("b".into(), doc.chains.clone());
        let all: BTreeSet<usize> = [0, 1, 2].into();
        doc.start_rebalance(1, &all, &[0].into()).unwrap();
        // vBucket 0 is [0, 1]: it goes to [2, 1].
        doc.rebalance.as_mut().unwrap().moves.insert(
            0,
            VbMove {
                to: vec![Some(2), Some(1)],
                phase: Phase::Takeover,
            },
        );
        assert_eq!(doc.moving(0).unwrap().phase, Phase::Takeover);
        assert!(doc.complete_move(0));
        assert!(!doc.complete_move(0));
        assert_eq!(doc.chains[0], vec![Some(2), Some(1)]);
        assert_eq!(doc.chains_of("b")[0], vec![Some(2), Some(1)]);
        let r = doc.rebalance.as_ref().unwrap();
        assert_eq!((r.done, r.node_done[&0], r.node_done[&2]), (1, 1, 1));
        let target: Chains = (0..doc.chains.len())
            .map(|v| {
                if v % 2 == 0 {
                    vec![Some(2), Some(1)]
                } else {
                    vec![Some(1), Some(2)]
                }
            })
            .collect();
        doc.finish_rebalance(&target);
        assert_eq!(doc.nodes.len(), 2);
        assert_eq!(doc.nodes[0].node.port, 12001);
        assert_eq!(doc.chains[0], vec![Some(1), Some(0)]);
        assert_eq!(doc.chains[1], vec![Some(0), Some(1)]);
        assert!(doc.bucket_chains.is_empty());
        assert!(doc.rebalance.is_none());
        let text = serde_json::to_string(&doc).unwrap();
        assert_eq!(serde_json::from_str::<ClusterDoc>(&text).unwrap(), doc);
    }
}
