//! The rebalance calls, as ns_server serves them: `POST /controller/rebalance`,
//! `POST /controller/stopRebalance`, `GET /pools/default/rebalanceProgress`, and
//! `rebalanceMovesPerNode` in `/internalSettings`. The work is `epkv-cluster`'s
//! (`rebalancer.rs`); these only read forms and write answers.

use super::form::Form;
use super::{Mgmt, Reply, cluster_error};
use epkv_cluster::{ClusterError, RebalanceProgress};
use hyper::StatusCode;
use serde_json::{Map, Value, json};

/// A comma-separated list of node names, as ns_server's forms send them.
fn names(form: &Form, field: &str) -> Vec<String> {
    form.get(field)
        .unwrap_or("")
        .split(',')
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .collect()
}

/// `POST /controller/rebalance` (`knownNodes`: every node; `ejectedNodes`: the ones to
/// remove). Answered once the rebalance is recorded; it runs in the background.
pub(super) fn start(m: &Mgmt, form: &Form) -> Reply {
    let known = names(form, "knownNodes");
    if known.is_empty() {
        return Reply::invalid(
            "knownNodes",
            "name every node of the cluster (otpNode values, comma-separated)",
        );
    }
    match m.cluster.rebalance(&known, &names(form, "ejectedNodes")) {
        Ok(_) => Reply::empty(StatusCode::OK),
        Err(e) => cluster_error(e),
    }
}

/// `POST /controller/stopRebalance`.
pub(super) fn stop(m: &Mgmt) -> Reply {
    match m.cluster.stop_rebalance() {
        Ok(_) => Reply::empty(StatusCode::OK),
        Err(e) => cluster_error(e),
    }
}

/// `GET /pools/default/rebalanceProgress`: `{"status":"running", "ns_1@HOST:PORT":
/// {"progress": 0..1}, ...}` or `{"status":"none"}`, with epkv's counts beside.
pub(super) fn progress(m: &Mgmt) -> Reply {
    Reply::json(progress_json(m.cluster.rebalance_progress()))
}

/// [`progress`]'s document.
pub(super) fn progress_json(p: Option<RebalanceProgress>) -> Value {
    let Some(p) = p else {
        return json!({ "status": "none" });
    };
    let mut out = Map::new();
    out.insert(
        "status".into(),
        json!(if p.running { "running" } else { "none" }),
    );
    if p.running {
        for (node, share) in &p.nodes {
            out.insert(format!("ns_1@{node}"), json!({ "progress": share }));
        }
        out.insert("vbucketMovesTotal".into(), json!(p.total));
        out.insert("vbucketMovesDone".into(), json!(p.done));
        out.insert("vbucketMovesInFlight".into(), json!(p.in_flight));
        out.insert("vbucketsLeft".into(), json!(p.total.saturating_sub(p.done)));
    } else if let Some(last) = &p.last {
        out.insert("lastRebalance".into(), json!(last));
        if !last.starts_with("completed") {
            out.insert("errorMessage".into(), json!(last));
        }
    }
    Value::Object(out)
}

/// `GET /internalSettings`: the settings epkv has of ns_server's list.
pub(super) fn internal_settings(m: &Mgmt) -> Reply {
    Reply::json(json!({ "rebalanceMovesPerNode": m.cluster.moves_per_node() }))
}

/// `POST /internalSettings` (`rebalanceMovesPerNode`, 1 to 64).
pub(super) fn set_internal_settings(m: &Mgmt, form: &Form) -> Reply {
    let Some(v) = form.get("rebalanceMovesPerNode") else {
        return internal_settings(m);
    };
    let Ok(n) = v.trim().parse::<usize>() else {
        return Reply::invalid("rebalanceMovesPerNode", "The value must be an integer");
    };
    match m.cluster.set_moves_per_node(n) {
        Ok(()) => internal_settings(m),
        Err(ClusterError::Invalid(msg)) => Reply::invalid("rebalanceMovesPerNode", msg),
        Err(e) => cluster_error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_reads_as_ns_server_writes_it() {
        assert_eq!(progress_json(None), json!({ "status": "none" }));
        let running = progress_json(Some(RebalanceProgress {
            running: true,
            nodes: vec![("127.0.0.1:9000".into(), 0.5)],
            total: 10,
            done: 4,
            in_flight: 2,
            last: None,
        }));
        assert_eq!(running["status"], "running");
        assert_eq!(running["ns_1@127.0.0.1:9000"]["progress"], 0.5);
        assert_eq!(running["vbucketsLeft"], 6);
        let failed = progress_json(Some(RebalanceProgress {
            running: false,
            nodes: Vec::new(),
            total: 0,
            done: 0,
            in_flight: 0,
            last: Some("failed: node 2 did not answer".into()),
        }));
        assert_eq!(failed["status"], "none");
        assert_eq!(failed["errorMessage"], "failed: node 2 did not answer");
    }
}
