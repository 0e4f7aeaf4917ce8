//! The bucket capabilities a bucket advertises (`bucketCapabilities` in the cluster map
//! and in the REST bucket JSON), declared once.
//!
//! Couchbase Server's list is ns_server's `ns_bucket:build_bucket_capabilities` (a
//! Couchbase bucket has `collections`, `durableWrite`, `tombstonedUserXAttrs`,
//! `couchapi` (only while the bucket can have views), the `subdoc.*` ones,
//! `dcp.IgnorePurgedTombstones`, `preserveExpiry`, `rangeScan`, `dcp`, `cbhello`, `touch`,
//! `cccp`, `xdcrCheckpointing`, `nodesExt` and `xattr`). Clients
//! gate features on them before sending anything: the Couchbase SDKs refuse
//! CREATE_AS_DELETED (and so transactions) without `tombstonedUserXAttrs`, libcouchbase
//! refuses SyncWrites without `durableWrite`. So an entry is listed only when the
//! feature it names works; each is checked over a real socket by the e2e test
//! `bucket_capabilities`.

/// Every bucket capability a Couchbase bucket of epkv has, in ns_server's order, each
/// as (name as ns_server writes it, what works that makes the claim true). One line per
/// capability; the e2e test `bucket_capabilities` must have a check for each.
///
/// CREATE_AS_DELETED has no name of its own: `tombstonedUserXAttrs` stands for it (the
/// Java SDK's `CREATE_AS_DELETED` capability is that string; ns_server has no
/// `subdoc.CreateAsDeleted`). Left out: `xdcrCheckpointing` (no XDCR checkpoint opcodes),
/// `preserveExpiry`,
/// `dcp.IgnorePurgedTombstones` (a DCP stream behind the purge seqno rolls back whatever
/// its flags say), and those of features not built.
// One line per capability, so that adding one is one line (rustfmt would split them).
#[rustfmt::skip]
pub const BUCKET_CAPABILITIES: &[(&str, &str)] = &[
    ("collections", "HELLO Collections is agreed (the two must match)"),
    ("durableWrite", "SyncWrites (libcouchbase sends none without it)"),
    ("tombstonedUserXAttrs", "CREATE_AS_DELETED; user attributes on tombstones"),
    ("couchapi", "a vBucket bucket (libcouchbase: else an ephemeral one)"),
    ("subdoc.ReplaceBodyWithXattr", "SUBDOC_REPLACE_BODY_WITH_XATTR"),
    ("subdoc.DocumentMacroSupport", "the ${$document...} macros expand"),
    ("subdoc.ReviveDocument", "the REVIVE doc flag"),
    ("subdoc.ReplicaRead", "the REPLICA_READ doc flag reads a replica vBucket"),
    ("subdoc.AccessDeleted", "the ACCESS_DELETED doc flag"),
    ("subdoc.BinaryXattr", "the BINARY_VALUE path flag: binary attribute values"),
    ("rangeScan", "RANGE_SCAN_CREATE, CONTINUE and CANCEL (docs/range-scans.md)"),
    ("dcp", "DCP producers"),
    ("cbhello", "HELLO"),
    ("touch", "TOUCH and GAT"),
    ("cccp", "GET_CLUSTER_CONFIG over KV"),
    ("nodesExt", "the cluster map has nodesExt"),
    ("xattr", "extended attributes"),
];

/// The capability names as a JSON array of strings, as the cluster map and the REST
/// bucket JSON write `bucketCapabilities`.
#[must_use]
pub fn bucket_capabilities_json() -> String {
    let names: Vec<String> = BUCKET_CAPABILITIES
        .iter()
        .map(|(name, _)| format!("\"{name}\""))
        .collect();
    format!("[{}]", names.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_plain_json_strings() {
        let mut names: Vec<&str> = BUCKET_CAPABILITIES.iter().map(|c| c.0).collect();
        assert!(
            names
                .iter()
                .all(|n| n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'))
        );
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), BUCKET_CAPABILITIES.len());
        let json = bucket_capabilities_json();
        assert!(json.starts_with("[\"collections\",\"durableWrite\","));
        assert!(json.ends_with(",\"xattr\"]"));
    }
}
