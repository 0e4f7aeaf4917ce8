//! epkv's cluster: which node holds which copy of each vBucket, and what keeps the copies
//! in step.
//!
//! What it is: the layer above the bucket engines that a node of a cluster needs and a
//! single node barely does. It reads the cluster file and derives the vBucket map
//! (`topology.rs`), keeps this node's vBucket states and replication chains in line with
//! the map, streams this node's replica vBuckets from the nodes holding their active
//! copies over DCP (`replication.rs`), applies manual failovers and re-adds, and writes the
//! cluster-map JSON Couchbase clients route by (`map_json.rs`). [`Cluster`] ties these
//! together; `epkv-server` creates it and calls [`Cluster::start`] before the node serves.
//!
//! What it is not: a front end or an engine. The front end asks it one narrow question,
//! through [`epkv_engine_api::ClusterView`] (which [`Cluster`] implements): the current map
//! and its version, for GET_CLUSTER_CONFIG and NOT_MY_VBUCKET replies. Engines are driven
//! through the [`epkv_engine_api::Engine`] trait only (states, chains, the replica
//! consumer API). The management REST API calls [`Cluster::fail_over`],
//! [`Cluster::re_add`] and [`Cluster::buckets_changed`].
//!
//! Key types: [`Cluster`], [`Topology`], [`ClusterFile`] and [`NodeSpec`].
//!
//! Invariants:
//! - The map's revision only grows: every change of the topology, of the buckets served
//!   and every SET_VBUCKET moves it on.
//! - Every node computes the same map from the same file and the same failovers; there is
//!   no consensus here (see `docs/cluster.md`).
//! - A failover's new states and chains are in place before [`Cluster::fail_over`]
//!   returns; replication restarts afterwards.
//!
//! Depends on `epkv-types`, `epkv-protocol` (the DCP consumer's wire format) and
//! `epkv-engine-api`; never on `epkv-frontend`. See `ARCHITECTURE.md` for where it sits.
#![forbid(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]

mod coord;
mod doc;
pub mod etcd;
mod map_json;
mod node;
mod replication;
mod topology;

pub use coord::{
    ClusterError, CoordStats, Coordinator, EtcdJoin, FailoverKind, GRACEFUL_PATIENCE, node_id,
};
pub use doc::{AUTO_FAILOVER_TIMEOUT, AutoFailover, Chains, ClusterDoc, Member, Membership};
pub use etcd::EtcdSettings;
pub use node::{BucketList, Cluster, NodeStatus};
pub use topology::{ClusterFile, MAX_NODES, MAX_REPLICAS, NodeSpec, Topology};
