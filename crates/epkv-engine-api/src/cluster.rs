//! The narrow interface between the front end and the cluster manager: what a connection
//! asks about the cluster, and nothing else.
//!
//! The front end answers GET_CLUSTER_CONFIG and puts the current map into
//! NOT_MY_VBUCKET replies; both come from a [`ClusterView`]. It also tells the view when
//! a client changed a vBucket's state (SET_VBUCKET), because the map's revision moves
//! on then. Which node holds which vBucket, replication and failover stay behind the
//! trait, in the `epkv-cluster` crate that implements it; the front end never sees a
//! topology. A vBucket's state on this node is the engine's
//! ([`crate::Engine::vbucket_state`]).
//!
//! The view also tells the front end when the map changes ([`ClusterView::subscribe`]),
//! so connections that asked for it (HELLO ClustermapChangeNotification) are sent the
//! new map at once instead of polling for it.

use crate::Engine;
use std::net::SocketAddr;

/// The ports this node serves the data service on, as the cluster map advertises them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodePorts {
    /// The plain KV port (`kv`).
    pub kv: u16,
    /// The TLS KV port (`kvSSL`), when TLS is on.
    pub kv_ssl: Option<u16>,
    /// The management REST port (`mgmt`), when served.
    pub mgmt: Option<u16>,
}

/// Called with the map's new version, `(epoch, revision)`, each time it moves on. Runs on
/// whichever thread changed the map, so it must be quick and must not block.
pub type MapListener = Box<dyn Fn((i64, i64)) + Send + Sync>;

/// What the front end asks of the cluster: the current map and its version.
///
/// Implementations are shared by every connection of every worker thread, so each call
/// must be cheap and must not block (a read lock at most).
pub trait ClusterView: Send + Sync {
    /// The version of the current map, `(epoch, revision)`: clients compare versions as
    /// pairs and fetch the map again only when it is newer than theirs.
    fn version(&self) -> (i64, i64);

    /// Records that the map changed outside the view's own knowledge (a client set a
    /// vBucket's state), so its revision moves on.
    fn map_changed(&self);

    /// Whether this node refuses client writes now, to every vBucket (answered
    /// NOT_MY_VBUCKET with the map): it is being failed over gracefully and its replicas
    /// are catching up with it. Checked on every write, so it must be cheap.
    fn refuses_writes(&self) -> bool {
        false
    }

    /// Registers `listener`, called with the new version after every change of the map
    /// (a view that never changes by itself may ignore it: the default does).
    fn subscribe(&self, listener: MapListener) {
        let _ = listener;
    }

    /// The bucket config (the GET_CLUSTER_CONFIG JSON) of bucket `name`, served here by
    /// `engine`, for a client that reached this node at `local` on one of `ports`.
    fn bucket_config(
        &self,
        name: &str,
        engine: &dyn Engine,
        local: SocketAddr,
        ports: NodePorts,
    ) -> String;

    /// The global config (no bucket selected) for a client that reached this node at
    /// `local`.
    fn global_config(&self, local: SocketAddr, ports: NodePorts) -> String;
}
