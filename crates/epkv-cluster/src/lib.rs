//! epkv's cluster: which node holds which copy of each vBucket, and what keeps the copies
//! in step.
//!
//! What it is: the layer above the bucket engines that a node of a cluster needs and a
//! single node barely does. The cluster's state is one document ([`ClusterDoc`], `doc.rs`:
//! members, the vBucket maps, auto-failover), which comes from etcd (`etcd.rs`, the thin
//! client layer, and `coord.rs`: registration, watches, the orchestrator, fencing;
//! `failover.rs`: automatic, manual and graceful failover with durability-aware
//! promotion) or from a static cluster file. [`Topology`] is this node's view of it;
//! [`Cluster`] (`node.rs`) keeps the node's vBucket states and replication chains in line
//! with it, streams the node's replica vBuckets from their actives over DCP
//! (`replication.rs`), and writes the cluster map Couchbase clients route by
//! (`map_json.rs`). `epkv-server` creates it and calls [`Cluster::start`] before the node
//! serves. [`plan::target_chains`] (`plan.rs`) computes a rebalance's target map: each
//! rank balanced over the nodes kept, with the fewest copies moved.
//!
//! What it is not: a front end or an engine. The front end asks it narrow questions
//! through [`epkv_engine_api::ClusterView`] (which [`Cluster`] implements): the current map
//! and its version, and whether this node refuses writes (a graceful failover). Engines
//! are driven through the [`epkv_engine_api::Engine`] trait only (states, chains, the
//! replica consumer API). The management REST API calls [`Cluster`]'s failover, re-add,
//! add-node and auto-failover entry points; the cluster-wide metadata (buckets,
//! collections, users) lives in `epkv-server`, on the etcd connection [`Cluster::etcd`]
//! hands it.
//!
//! Key types: [`Cluster`], [`ClusterDoc`], [`Topology`], [`Coordinator`], [`ClusterFile`]
//! and [`NodeSpec`].
//!
//! Invariants:
//! - The map's revision only grows: every change of the topology, of the buckets served
//!   and every SET_VBUCKET moves it on; on an etcd cluster it is at least etcd's revision
//!   of the document, so every node reports the same revision for the same map.
//! - On an etcd cluster every change of the document is one compare-and-swap: two
//!   operators or orchestrators never interleave, and consensus is etcd's, never ours. A
//!   static cluster's nodes compute the same map from the same file and failovers.
//! - A failover's new states and chains are in place on the node that made it before it
//!   returns; the others follow the document's watch; replication restarts afterwards.
//!
//! Depends on `epkv-types`, `epkv-protocol` (the DCP consumer's wire format),
//! `epkv-engine-api` and `etcd-client`; never on `epkv-frontend`. See `ARCHITECTURE.md`
//! for where it sits.
#![forbid(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]

mod coord;
mod doc;
pub mod etcd;
mod failover;
mod map_json;
mod node;
pub mod plan;
mod rebalance;
mod rebalancer;
mod replication;
mod topology;

pub use coord::{ClusterError, CoordStats, Coordinator, EtcdJoin, FailoverKind, node_id};
pub use doc::{AUTO_FAILOVER_TIMEOUT, AutoFailover, Chains, ClusterDoc, Member, Membership};
pub use etcd::EtcdSettings;
pub use failover::GRACEFUL_PATIENCE;
pub use node::{BucketList, Cluster, NodeStatus};
pub use rebalance::{
    DEFAULT_MOVES_PER_NODE, MOVES_PER_NODE, Phase, Rebalance, RebalanceRefusal, VbMove,
};
pub use rebalancer::RebalanceProgress;
pub use topology::{ClusterFile, MAX_NODES, MAX_REPLICAS, NodeSpec, Topology};
