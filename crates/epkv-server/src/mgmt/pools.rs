//! The JSON documents of `/pools`, `/pools/default`, `/pools/nodes` and the bucket
//! resources, with the fields the Couchbase SDKs (couchbase-cxx-client, under the Python
//! SDK) and tools read. This node is the whole cluster: one node, every service it has is
//! `kv`.

use crate::bucket_manager::{BucketParams, BucketType};
use epkv_cluster::NodeStatus;
use epkv_engine::Bucket;
use epkv_engine_api::Engine;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::net::SocketAddr;

/// What the documents say about this node and cluster.
pub(crate) struct NodeFacts {
    /// The version reported (`7.6.0-epkv-X`, as the KV port's VERSION).
    pub(crate) version: String,
    /// The cluster UUID (random per process).
    pub(crate) uuid: String,
    /// The plain KV port.
    pub(crate) kv_port: u16,
    /// The TLS KV port, if any.
    pub(crate) kv_ssl_port: Option<u16>,
    /// The server's start, in seconds of its own clock, for `uptime`.
    pub(crate) uptime_secs: u64,
}

/// `HOST:PORT` of the address a client reached (IPv6 in brackets).
pub(crate) fn host_port(local: SocketAddr) -> String {
    match local {
        SocketAddr::V4(a) => format!("{}:{}", a.ip(), a.port()),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    }
}

/// This node, as `/pools/default` and the bucket documents list it.
pub(crate) fn node(facts: &NodeFacts, local: SocketAddr) -> Value {
    let hostname = host_port(local);
    let mut ports = json!({ "direct": facts.kv_port });
    if let Some(p) = facts.kv_ssl_port {
        ports["sslDirect"] = json!(p);
    }
    json!({
        "hostname": hostname,
        "configuredHostname": hostname,
        "thisNode": true,
        "clusterMembership": "active",
        "recoveryType": "none",
        "status": "healthy",
        "otpNode": format!("ns_1@{}", local.ip()),
        "version": facts.version,
        "os": std::env::consts::OS,
        "uptime": facts.uptime_secs.to_string(),
        "services": ["kv"],
        "nodeEncryption": false,
        "addressFamily": if local.is_ipv6() { "inet6" } else { "inet" },
        "ports": ports,
        "interestingStats": {},
        "systemStats": {},
    })
}

/// `GET /pools`: `isAdminCreds` for an administrator, `isROAdminCreds` for a user who
/// may read the cluster's security settings without being one (`ro_admin`,
/// `security_admin`), as the web console and tools read them.
pub(crate) fn pools(facts: &NodeFacts, is_admin: bool, is_ro_admin: bool) -> Value {
    json!({
        "isAdminCreds": is_admin,
        "isROAdminCreds": is_ro_admin && !is_admin,
        "isEnterprise": false,
        "isDeveloperPreview": false,
        "allowedServices": ["kv"],
        "packageVariant": "epkv",
        "pools": [{
            "name": "default",
            "uri": format!("/pools/default?uuid={}", facts.uuid),
            "streamingUri": format!("/poolsStreaming/default?uuid={}", facts.uuid),
        }],
        "settings": {
            "maxParallelIndexers": "/settings/maxParallelIndexers?uuid=",
            "viewUpdateDaemon": "/settings/viewUpdateDaemon?uuid=",
        },
        "uuid": facts.uuid,
        "implementationVersion": facts.version,
        "componentsVersion": { "ns_server": facts.version, "epkv": env!("CARGO_PKG_VERSION") },
    })
}

/// The cluster's nodes as `/pools/default` lists them: this node as [`node`] says, the
/// others from the cluster's view (`hostname` is the management address when the node
/// has one, `otpNode` names the KV address, which `/controller/failOver` accepts).
fn cluster_nodes(facts: &NodeFacts, local: SocketAddr, cluster: &[NodeStatus]) -> Vec<Value> {
    if cluster.is_empty() {
        return vec![node(facts, local)];
    }
    cluster
        .iter()
        .map(|n| {
            let spec = &n.node;
            let mut v = if n.this {
                node(facts, local)
            } else {
                let hostname = epkv_cluster::node_id(&epkv_cluster::NodeSpec {
                    port: spec.mgmt_port.unwrap_or(spec.port),
                    ..spec.clone()
                });
                json!({
                    "hostname": hostname,
                    "configuredHostname": hostname,
                    "version": facts.version,
                    "services": ["kv"],
                    "ports": { "direct": spec.port },
                })
            };
            v["clusterMembership"] = json!(n.membership.as_str());
            v["status"] = json!(if n.healthy { "healthy" } else { "unhealthy" });
            v["otpNode"] = json!(format!("ns_1@{}", epkv_cluster::node_id(spec)));
            v["epkvOrchestrator"] = json!(n.orchestrator);
            v
        })
        .collect()
}

/// `GET /pools/default`.
pub(crate) fn pools_default(
    facts: &NodeFacts,
    local: SocketAddr,
    buckets: &[(BucketParams, std::sync::Arc<Bucket>)],
    cluster: &[NodeStatus],
    rebalancing: bool,
) -> Value {
    let quota: u64 = buckets.iter().map(|(p, _)| p.quota_bytes).sum();
    let balanced = !rebalancing
        && cluster
            .iter()
            .all(|n| n.membership == epkv_cluster::Membership::Active);
    json!({
        "name": "default",
        "clusterName": "epkv",
        "nodes": cluster_nodes(facts, local, cluster),
        "buckets": {
            "uri": format!("/pools/default/buckets?uuid={}", facts.uuid),
            "terseBucketsBase": "/pools/default/b/",
            "terseStreamingBucketsBase": "/pools/default/bs/",
        },
        "balanced": balanced,
        "rebalanceStatus": if rebalancing { "running" } else { "none" },
        "rebalanceProgressUri": "/pools/default/rebalanceProgress",
        "stopRebalanceUri": "/controller/stopRebalance",
        "nodeStatusesUri": "/nodeStatuses",
        "memoryQuota": quota >> 20,
        "storageTotals": { "ram": { "quotaTotal": quota, "quotaUsed": quota } },
    })
}

/// `GET /pools/nodes`.
pub(crate) fn pools_nodes(facts: &NodeFacts, local: SocketAddr) -> Value {
    json!({ "name": "nodes", "nodes": [node(facts, local)] })
}

/// Reads the engine's default STAT group.
fn engine_stats(bucket: &Bucket) -> HashMap<String, String> {
    let mut stats = HashMap::new();
    let _ = bucket.stats("", &mut |k, v| {
        stats.insert(k.to_owned(), v.to_owned());
    });
    stats
}

/// One bucket, as `GET /pools/default/buckets[/NAME]` lists it.
pub(crate) fn bucket(
    facts: &NodeFacts,
    local: SocketAddr,
    params: &BucketParams,
    engine: &Bucket,
) -> Value {
    let stats = engine_stats(engine);
    let stat = |k: &str| -> u64 { stats.get(k).and_then(|v| v.parse().ok()).unwrap_or(0) };
    let name = &params.name;
    let mut controllers = json!({});
    if params.flush_enabled {
        controllers["flush"] = json!(format!("/pools/default/buckets/{name}/controller/doFlush"));
    }
    let mem_used = stat("mem_used");
    let quota = params.quota_bytes;
    json!({
        "name": name,
        "uuid": bucket_uuid(&facts.uuid, name),
        "bucketType": match params.bucket_type {
            BucketType::Membase => "membase",
            BucketType::Ephemeral => "ephemeral",
        },
        "storageBackend": "couchstore",
        "authType": "sasl",
        "uri": format!("/pools/default/buckets/{name}?bucket_uuid={}", bucket_uuid(&facts.uuid, name)),
        "streamingUri": format!("/pools/default/bucketsStreaming/{name}"),
        "nodeLocator": "vbucket",
        "numVBuckets": epkv_types::NUM_VBUCKETS,
        "replicaNumber": 0,
        "replicaIndex": false,
        "threadsNumber": 3,
        "evictionPolicy": params.eviction_policy.as_str(),
        "durabilityMinLevel": params.durability_min_level.as_str(),
        "maxTTL": 0,
        "compressionMode": "passive",
        "conflictResolutionType": "seqno",
        "quota": { "ram": quota, "rawRAM": quota },
        "basicStats": {
            "quotaPercentUsed": if quota == 0 { 0.0 } else { mem_used as f64 * 100.0 / quota as f64 },
            "opsPerSec": 0,
            "diskFetches": stat("ep_bg_fetched"),
            "itemCount": stat("curr_items"),
            "diskUsed": 0,
            "dataUsed": 0,
            "memUsed": mem_used,
        },
        "controllers": controllers,
        "nodes": [node(facts, local)],
        "bucketCapabilitiesVer": "",
        "bucketCapabilities": epkv_protocol::BUCKET_CAPABILITIES
            .iter()
            .map(|(name, _)| *name)
            .collect::<Vec<_>>(),
    })
}

/// A stable UUID-like id for a bucket of this cluster: hex of a hash of both names.
fn bucket_uuid(cluster_uuid: &str, name: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{cluster_uuid}/{name}").as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> NodeFacts {
        NodeFacts {
            version: "7.6.0-epkv-0.1.0".into(),
            uuid: "abc".into(),
            kv_port: 11210,
            kv_ssl_port: None,
            uptime_secs: 5,
        }
    }

    #[test]
    fn nodes_name_the_address_the_client_reached_and_the_kv_port() {
        let n = node(&facts(), "127.0.0.1:8091".parse().unwrap());
        assert_eq!(n["hostname"], "127.0.0.1:8091");
        assert_eq!(n["configuredHostname"], "127.0.0.1:8091");
        assert_eq!(n["status"], "healthy");
        assert_eq!(n["services"], json!(["kv"]));
        assert_eq!(n["ports"]["direct"], 11210);
        let v6 = node(&facts(), "[::1]:8091".parse().unwrap());
        assert_eq!(v6["hostname"], "[::1]:8091");
    }

    #[test]
    fn pools_reports_the_version_and_admin_credentials() {
        let p = pools(&facts(), true, true);
        assert_eq!(p["implementationVersion"], "7.6.0-epkv-0.1.0");
        assert_eq!(p["isAdminCreds"], true);
        assert_eq!(
            p["isROAdminCreds"], false,
            "an administrator is not read-only"
        );
        let ro = pools(&facts(), false, true);
        assert_eq!(
            (ro["isAdminCreds"].clone(), ro["isROAdminCreds"].clone()),
            (json!(false), json!(true))
        );
        assert_eq!(p["pools"][0]["name"], "default");
    }

    #[test]
    fn bucket_uuids_are_stable_and_distinct() {
        assert_eq!(bucket_uuid("c", "a"), bucket_uuid("c", "a"));
        assert_ne!(bucket_uuid("c", "a"), bucket_uuid("c", "b"));
        assert_eq!(bucket_uuid("c", "a").len(), 32);
    }
}
