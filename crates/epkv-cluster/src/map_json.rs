//! The cluster map (GET_CLUSTER_CONFIG, and the body of NOT_MY_VBUCKET replies): the JSON
//! Couchbase clients bootstrap from, for a single node serving every vBucket it has
//! active.
//!
//! Fields are the ones the real clients require (`../shared/design/protocol-compat.md`
//! §2): `rev`, `revEpoch`, `name`, `nodeLocator: "vbucket"`, `nodesExt[].services.kv`,
//! `vBucketServerMap` with `numReplicas` and a non-empty `vBucketMap`, and
//! `bucketCapabilities` from [`epkv_protocol::BUCKET_CAPABILITIES`] (the one list the REST
//! bucket JSON writes too; `durableWrite`, without which libcouchbase refuses SyncWrites,
//! and `collections`, which must match HELLO 0x12), and
//! `collectionsManifestUid`, the uid of the bucket's collections manifest. The node's
//! address is the one the client connected to, so a client that reached the server
//! through one interface is never sent another.
//!
//! `nodesExt[].services` names the plain KV port as `kv` and, when TLS is on, the TLS
//! port as `kvSSL`: Couchbase SDKs connecting with `couchbases://` read `kvSSL`
//! (couchbase-cxx-client's `services_tls.key_value`) and open their data connections
//! there. `serverList` keeps the plain port, as Couchbase Server's does. The management
//! REST port, when served, is `mgmt`: the SDKs send bucket and user management there.
//! There is no TLS management port, so `mgmtSSL` is never advertised.

use epkv_engine_api::{Engine, NodePorts};
use epkv_protocol::bucket_capabilities_json;
use epkv_types::{NUM_VBUCKETS, VBucketState, Vbid};
use std::fmt::Write as _;
use std::net::SocketAddr;

/// The config epoch; configs are compared by (epoch, rev). It would change only if the
/// revision counter restarted, which it does not within one process.
pub(crate) const REV_EPOCH: i64 = 1;

/// `hostname` and `serverList` forms of the address a client connected to, with the
/// plain KV port.
fn host_and_server(local: SocketAddr, kv: u16) -> (String, String) {
    let host = local.ip().to_string();
    let server = match local {
        SocketAddr::V4(a) => format!("{}:{kv}", a.ip()),
        SocketAddr::V6(a) => format!("[{}]:{kv}", a.ip()),
    };
    (host, server)
}

/// The `nodesExt` array for this single node.
fn nodes_ext(local: SocketAddr, ports: NodePorts) -> String {
    let (host, _) = host_and_server(local, ports.kv);
    let mut tls = match ports.kv_ssl {
        Some(p) => format!(",\"kvSSL\":{p}"),
        None => String::new(),
    };
    if let Some(p) = ports.mgmt {
        let _ = write!(tls, ",\"mgmt\":{p}");
    }
    format!(
        "[{{\"hostname\":\"{host}\",\"services\":{{\"kv\":{}{tls}}},\"thisNode\":true}}]",
        ports.kv
    )
}

/// The legacy `nodes` array: Go clients (gocbcore) keep a `nodesExt` entry only when
/// `nodes` has one at the same position, named `host:mgmt port` with the KV port as
/// `ports.direct` (the KV port stands in for the management port when none is served).
fn nodes(local: SocketAddr, ports: NodePorts) -> String {
    let (_, server) = host_and_server(local, ports.mgmt.unwrap_or(ports.kv));
    format!(
        "[{{\"hostname\":\"{server}\",\"ports\":{{\"direct\":{}}},\"thisNode\":true}}]",
        ports.kv
    )
}

/// The bucket config for `name` (a valid bucket name: no characters that need JSON
/// escaping), for a client that connected to `local`. A vBucket maps to this node (0)
/// while it is active here, else to no node (-1).
pub(crate) fn bucket_config(
    name: &str,
    rev: i64,
    local: SocketAddr,
    ports: NodePorts,
    engine: &dyn Engine,
    cluster: Option<&crate::topology::Topology>,
) -> String {
    if let Some(t) = cluster {
        return clustered_bucket_config(name, rev, ports, engine, t);
    }
    let (_, server) = host_and_server(local, ports.kv);
    let mut map = String::with_capacity(usize::from(NUM_VBUCKETS) * 5);
    for vb in 0..NUM_VBUCKETS {
        if vb > 0 {
            map.push(',');
        }
        let active = engine.vbucket_state(Vbid(vb)) == Some(VBucketState::Active);
        map.push_str(if active { "[0]" } else { "[-1]" });
    }
    let uid = engine.manifest_uid();
    let mut s = String::with_capacity(map.len() + 512);
    // Writing to a String cannot fail.
    let _ = write!(
        s,
        "{{\"rev\":{rev},\"revEpoch\":{REV_EPOCH},\"name\":\"{name}\",\
         \"nodeLocator\":\"vbucket\",\"nodes\":{},\"nodesExt\":{},\
         \"collectionsManifestUid\":\"{uid:x}\",\
         \"vBucketServerMap\":{{\"hashAlgorithm\":\"CRC\",\"numReplicas\":0,\
         \"serverList\":[\"{server}\"],\"vBucketMap\":[{map}]}},\
         \"bucketCapabilities\":{caps},\
         \"clusterCapabilitiesVer\":[1,0],\"clusterCapabilities\":{{}}}}",
        nodes(local, ports),
        nodes_ext(local, ports),
        caps = bucket_capabilities_json(),
    );
    s
}

/// The bucket config of a node in a cluster ([`crate::topology`]): every node, named as
/// the cluster file names it (this node with its TLS and management ports), and the
/// vBucket map with its replicas.
fn clustered_bucket_config(
    name: &str,
    rev: i64,
    ports: NodePorts,
    engine: &dyn Engine,
    t: &crate::topology::Topology,
) -> String {
    let mut nodes = String::new();
    let mut nodes_ext = String::new();
    for (pos, &i) in t.listed().iter().enumerate() {
        let n = &t.members()[i].node;
        let this = Some(i) == t.this();
        let mgmt = if this { ports.mgmt } else { n.mgmt_port };
        if pos > 0 {
            nodes.push(',');
            nodes_ext.push(',');
        }
        let _ = write!(
            nodes,
            "{{\"hostname\":\"{}\",\"ports\":{{\"direct\":{}}}{}}}",
            crate::topology::host_port(&n.host, mgmt.unwrap_or(n.port)),
            n.port,
            if this { ",\"thisNode\":true" } else { "" }
        );
        let mut services = format!("\"kv\":{}", n.port);
        if this && let Some(p) = ports.kv_ssl {
            let _ = write!(services, ",\"kvSSL\":{p}");
        }
        if let Some(p) = mgmt {
            let _ = write!(services, ",\"mgmt\":{p}");
        }
        let _ = write!(
            nodes_ext,
            "{{\"hostname\":\"{}\",\"services\":{{{services}}}{}}}",
            n.host,
            if this { ",\"thisNode\":true" } else { "" }
        );
    }
    let (servers, map) = t.map_json(name);
    let failed: Vec<String> = t.failed_nodes().iter().map(ToString::to_string).collect();
    let uid = engine.manifest_uid();
    format!(
        "{{\"rev\":{rev},\"revEpoch\":{REV_EPOCH},\"name\":\"{name}\",\
         \"nodeLocator\":\"vbucket\",\"nodes\":[{nodes}],\"nodesExt\":[{nodes_ext}],\
         \"epkvFailedNodes\":[{}],\
         \"collectionsManifestUid\":\"{uid:x}\",\
         \"vBucketServerMap\":{{\"hashAlgorithm\":\"CRC\",\"numReplicas\":{},\
         \"serverList\":[{servers}],\"vBucketMap\":[{map}]}},\
         \"bucketCapabilities\":{caps},\
         \"clusterCapabilitiesVer\":[1,0],\"clusterCapabilities\":{{}}}}",
        failed.join(","),
        t.replicas(),
        caps = bucket_capabilities_json(),
    )
}

/// The global (no bucket selected) config.
pub(crate) fn global_config(rev: i64, local: SocketAddr, ports: NodePorts) -> String {
    format!(
        "{{\"rev\":{rev},\"revEpoch\":{REV_EPOCH},\"nodesExt\":{},\
         \"clusterCapabilitiesVer\":[1,0],\"clusterCapabilities\":{{}}}}",
        nodes_ext(local, ports)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: NodePorts = NodePorts {
        kv: 4000,
        kv_ssl: None,
        mgmt: None,
    };

    #[test]
    fn host_is_the_local_address_in_both_families() {
        let v4: SocketAddr = "10.1.2.3:11210".parse().unwrap();
        assert_eq!(
            host_and_server(v4, 11210),
            ("10.1.2.3".to_owned(), "10.1.2.3:11210".to_owned())
        );
        let v6: SocketAddr = "[::1]:9000".parse().unwrap();
        assert_eq!(
            host_and_server(v6, 9000),
            ("::1".to_owned(), "[::1]:9000".to_owned())
        );
    }

    #[test]
    fn global_config_names_this_node() {
        let a: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let g = global_config(7, a, PLAIN);
        assert!(g.starts_with("{\"rev\":7,"));
        assert!(g.contains("\"services\":{\"kv\":4000}"));
        assert!(g.contains("\"thisNode\":true"));
        assert!(!g.contains("kvSSL"));
        assert!(!g.contains("mgmt"));
    }

    #[test]
    fn the_management_port_is_advertised_as_mgmt() {
        let ports = NodePorts {
            mgmt: Some(8091),
            ..PLAIN
        };
        let g = global_config(1, "127.0.0.1:4000".parse().unwrap(), ports);
        assert!(
            g.contains("\"services\":{\"kv\":4000,\"mgmt\":8091}"),
            "{g}"
        );
        assert!(!g.contains("mgmtSSL"));
    }

    #[test]
    fn the_legacy_nodes_array_pairs_the_management_and_kv_ports() {
        let a: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let with_mgmt = NodePorts {
            mgmt: Some(8091),
            ..PLAIN
        };
        assert_eq!(
            nodes(a, with_mgmt),
            "[{\"hostname\":\"127.0.0.1:8091\",\"ports\":{\"direct\":4000},\"thisNode\":true}]"
        );
        let v6: SocketAddr = "[::1]:4000".parse().unwrap();
        assert!(nodes(v6, PLAIN).contains("\"hostname\":\"[::1]:4000\""));
    }

    #[test]
    fn tls_port_is_advertised_as_kv_ssl_whichever_port_the_client_used() {
        let ports = NodePorts {
            kv: 4000,
            kv_ssl: Some(4001),
            mgmt: None,
        };
        // A client on the TLS port gets the same ports as one on the plain port.
        for local in ["127.0.0.1:4000", "127.0.0.1:4001"] {
            let g = global_config(1, local.parse().unwrap(), ports);
            assert!(
                g.contains("\"services\":{\"kv\":4000,\"kvSSL\":4001}"),
                "{g}"
            );
        }
        let (_, server) = host_and_server("127.0.0.1:4001".parse().unwrap(), ports.kv);
        assert_eq!(server, "127.0.0.1:4000");
    }
}
