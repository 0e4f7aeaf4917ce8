//! Failover: the orchestrator's and the operator's (hard, graceful), with the
//! durability-aware choice of the replica to promote (see `coord.rs`'s module docs for
//! when the orchestrator fails a node over).
//!
//! A failover is one compare-and-swap of the cluster's document: it happened or it did
//! not, so one interrupted (its node died) is made again by whoever asks next, and
//! asking twice changes nothing.

use crate::coord::{
    CAS_ATTEMPTS, ClusterError, Coordinator, FailoverKind, join_all, node_id, resolve,
};
use crate::doc::{ClusterDoc, Membership};
use crate::replication;
use epkv_types::Vbid;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;

/// How long a graceful failover waits for the node's replicas to catch up.
pub const GRACEFUL_PATIENCE: Duration = Duration::from_secs(60);
/// How long a replica is asked for its seqnos before it is left out of the choice.
const SEQNO_TIMEOUT: Duration = Duration::from_secs(2);

impl Coordinator {
    /// Fails node `i` over, promoting for each vBucket it held active the live replica
    /// holding the most (see the module docs). `allow_loss` lets a manual failover lose
    /// the last copy of vBuckets. Returns whether it was failed over now (false: it
    /// already was).
    ///
    /// # Errors
    /// Refused (auto-failover off or at its maximum count, the last copy of a vBucket,
    /// not an active member) or etcd unreachable.
    pub async fn fail_over(
        &self,
        i: usize,
        kind: FailoverKind,
        allow_loss: bool,
    ) -> Result<bool, ClusterError> {
        let cluster = self.node()?;
        let buckets = cluster.bucket_names();
        let credentials = self.join.credentials.clone();
        for _ in 0..CAS_ATTEMPTS {
            let (mut doc, rev) = self.current_doc().await?;
            let Some(member) = doc.nodes.get(i).cloned() else {
                return Err(ClusterError::Invalid(format!("no node {i} in the cluster")));
            };
            match member.membership {
                Membership::InactiveFailed => return Ok(false),
                Membership::InactiveAdded => {
                    return Err(ClusterError::Invalid(
                        "the node holds no vBuckets (it was added and not rebalanced in)".into(),
                    ));
                }
                Membership::Active => {}
            }
            if kind == FailoverKind::Auto {
                let a = doc.auto_failover;
                if !a.enabled {
                    return Err(ClusterError::Invalid("auto-failover is disabled".into()));
                }
                if a.count >= a.max_count {
                    return Err(ClusterError::Invalid(format!(
                        "auto-failover already failed over {} of at most {} nodes; reset the count (POST /settings/autoFailover/resetCount)",
                        a.count, a.max_count
                    )));
                }
            }
            let seqnos = gather_seqnos(&doc, i, &buckets, credentials.as_ref()).await;
            let mut reordered = 0u64;
            let mut promoted: BTreeMap<usize, u64> = BTreeMap::new();
            let pick = |bucket: &str, vb: Vbid, candidates: &[usize]| {
                let best = choose(bucket, vb, candidates, &seqnos);
                if best != 0 {
                    reordered += 1;
                }
                *promoted.entry(candidates[best]).or_default() += 1;
                best
            };
            let outcome = if allow_loss {
                let lost = doc.last_copies(i, &buckets);
                if !lost.is_empty() {
                    tracing::error!(node = %member.node.host, lost = lost.len(), "failing a node over loses the last copy of vBuckets (allowUnsafe)");
                }
                force_fail_over(&mut doc, i, &buckets, pick)
            } else {
                doc.fail_over(i, &buckets, pick)
                    .map_err(|e| ClusterError::Invalid(e.to_string()))
            };
            outcome?;
            if kind == FailoverKind::Auto {
                doc.auto_failover.count += 1;
            }
            let text =
                serde_json::to_vec(&doc).map_err(|e| ClusterError::Invalid(e.to_string()))?;
            if let Some(new_rev) = self.etcd.compare_and_put("topology", text, rev).await? {
                let counter = match kind {
                    FailoverKind::Auto => &self.stats.auto_failovers,
                    FailoverKind::Manual => &self.stats.manual_failovers,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .promotions_reordered
                    .fetch_add(reordered, Ordering::Relaxed);
                tracing::warn!(
                    node = %node_id(&member.node),
                    ?kind,
                    promoted = ?promoted,
                    not_first_in_chain = reordered,
                    seqnos_from = seqnos.len(),
                    revision = new_rev,
                    "node failed over"
                );
                self.offer(doc, new_rev);
                return Ok(true);
            }
        }
        Err(ClusterError::Unavailable(
            "the cluster's state kept changing under this failover; try again".into(),
        ))
    }

    /// A graceful failover of node `i`: it refuses client writes (the document lists
    /// it in `graceful`), its replicas catch up with it (every vBucket it holds active has
    /// a live replica at its high seqno), then it is failed over, the caught-up replicas
    /// promoted. Nothing it acknowledged is lost, durable or not. Returns whether it was
    /// failed over now (false: it already was).
    ///
    /// # Errors
    /// Not an active member, a vBucket with no replica to hand over to, the replicas did
    /// not catch up within `patience` (the node takes writes again; nothing changed), or
    /// etcd unreachable.
    pub async fn graceful_fail_over(
        &self,
        i: usize,
        patience: Duration,
    ) -> Result<bool, ClusterError> {
        let cluster = self.node()?;
        let buckets = cluster.bucket_names();
        let mut already = false;
        self.update_doc(|doc| {
            already = false;
            match doc.nodes.get(i).map(|m| m.membership) {
                None => return Err(ClusterError::Invalid(format!("no node {i} in the cluster"))),
                Some(Membership::InactiveFailed) => {
                    already = true;
                    return Ok(false);
                }
                Some(Membership::InactiveAdded) => {
                    return Err(ClusterError::Invalid(
                        "the node holds no vBuckets (it was added and not rebalanced in)".into(),
                    ));
                }
                Some(Membership::Active) => {}
            }
            let lost = doc.last_copies(i, &buckets);
            if let Some((bucket, vb)) = lost.first() {
                return Err(ClusterError::Invalid(format!(
                    "a graceful failover needs a replica of every vBucket the node holds; {} have none (the first: {vb} of bucket {bucket:?})",
                    lost.len()
                )));
            }
            if doc.graceful.contains(&i) {
                return Ok(false);
            }
            doc.graceful.push(i);
            Ok(true)
        })
        .await?;
        if already {
            return Ok(false);
        }
        let Some(doc) = cluster.doc() else {
            return Err(ClusterError::Unavailable("no cluster document".into()));
        };
        let member = doc.nodes[i].node.clone();
        tracing::warn!(node = %node_id(&member), "graceful failover: the node refuses writes while its replicas catch up");
        let deadline = Instant::now() + patience;
        let credentials = self.join.credentials.clone();
        loop {
            if self
                .caught_up(&doc, i, &buckets, credentials.as_ref())
                .await
                .unwrap_or(false)
            {
                break;
            }
            if Instant::now() >= deadline {
                self.update_doc(|doc| {
                    let before = doc.graceful.len();
                    doc.graceful.retain(|&n| n != i);
                    Ok(doc.graceful.len() != before)
                })
                .await?;
                return Err(ClusterError::Unavailable(format!(
                    "the replicas of {} did not catch up within {} s; it takes writes again and nothing changed",
                    node_id(&member),
                    patience.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.fail_over(i, FailoverKind::Manual, false).await
    }

    /// A graceful failover whose caller died (its node) would leave the node refusing
    /// writes: the orchestrator finishes one that has been pending longer than a caller
    /// waits ([`GRACEFUL_PATIENCE`] and a margin), by the same steps (idempotent).
    pub(crate) fn resume_graceful(self: &Arc<Self>, seen: &mut HashMap<usize, Instant>) {
        let Some(doc) = self.cluster.upgrade().and_then(|c| c.doc()) else {
            return;
        };
        seen.retain(|i, _| doc.graceful.contains(i));
        for &i in &doc.graceful {
            let since = *seen.entry(i).or_insert_with(Instant::now);
            if since.elapsed() < GRACEFUL_PATIENCE + Duration::from_secs(10) {
                continue;
            }
            seen.insert(i, Instant::now());
            tracing::warn!(node = i, "resuming a graceful failover its caller left");
            let me = Arc::clone(self);
            tokio::spawn(async move {
                if let Err(e) = me.graceful_fail_over(i, GRACEFUL_PATIENCE).await {
                    tracing::error!(node = i, error = %e, "a resumed graceful failover failed");
                }
            });
        }
    }

    /// Whether every vBucket node `i` holds active, in each of `buckets`, has a live
    /// replica at the active's high seqno.
    async fn caught_up(
        &self,
        doc: &ClusterDoc,
        i: usize,
        buckets: &[String],
        credentials: Option<&(String, String)>,
    ) -> Result<bool, String> {
        let replicas = gather_seqnos(doc, i, buckets, credentials).await;
        let addr = resolve(&doc.nodes[i].node)?;
        for bucket in buckets {
            let active = parse_seqnos(
                &replication::fetch_stats(addr, credentials, bucket, "vbucket-details").await?,
            );
            for (v, chain) in doc.chains_of(bucket).iter().enumerate() {
                if chain.first() != Some(&Some(i)) {
                    continue;
                }
                let vb = u16::try_from(v).unwrap_or(0);
                let want = active.get(&vb).map_or(0, |&(p, h)| p.max(h));
                let reached = chain.iter().skip(1).flatten().any(|&n| {
                    replicas
                        .get(&(bucket.clone(), n))
                        .and_then(|m| m.get(&vb))
                        .is_some_and(|&(p, h)| p.max(h) >= want)
                });
                if !reached {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }
}

/// A failover that may lose the last copy of vBuckets (an operator's `allowUnsafe`).
fn force_fail_over(
    doc: &mut ClusterDoc,
    i: usize,
    buckets: &[String],
    pick: impl FnMut(&str, Vbid, &[usize]) -> usize,
) -> Result<(), ClusterError> {
    match doc.fail_over(i, buckets, pick) {
        Ok(()) => Ok(()),
        Err(crate::doc::FailoverRefusal::LastCopy(_)) => {
            doc.nodes[i].membership = Membership::InactiveFailed;
            doc.graceful.retain(|&n| n != i);
            let maps = std::iter::once(&mut doc.chains).chain(doc.bucket_chains.values_mut());
            for chains in maps {
                for chain in chains.iter_mut() {
                    let len = chain.len();
                    chain.retain(|n| n.is_some_and(|n| n != i));
                    chain.resize(len, None);
                }
            }
            Ok(())
        }
        Err(e) => Err(ClusterError::Invalid(e.to_string())),
    }
}

/// Per (bucket, node): per vBucket, (high prepared seqno, high seqno).
type Seqnos = HashMap<(String, usize), HashMap<u16, (u64, u64)>>;

/// Asks every live node holding a replica of a vBucket node `failed` holds active, per
/// bucket, for its seqnos. Nodes that do not answer are left out (and so not preferred).
async fn gather_seqnos(
    doc: &ClusterDoc,
    failed: usize,
    buckets: &[String],
    credentials: Option<&(String, String)>,
) -> Seqnos {
    let mut asks = Vec::new();
    for bucket in buckets {
        let mut nodes: Vec<usize> = doc
            .chains_of(bucket)
            .iter()
            .filter(|c| c.first() == Some(&Some(failed)))
            .flat_map(|c| c.iter().skip(1).flatten().copied())
            .filter(|&n| !doc.is_failed(n))
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        for n in nodes {
            let spec = doc.nodes[n].node.clone();
            let bucket = bucket.clone();
            let credentials = credentials.cloned();
            asks.push(async move {
                let addr = resolve(&spec)?;
                let stats = tokio::time::timeout(
                    SEQNO_TIMEOUT,
                    replication::fetch_stats(
                        addr,
                        credentials.as_ref(),
                        &bucket,
                        "vbucket-details",
                    ),
                )
                .await
                .map_err(|_| "timed out".to_owned())??;
                Ok::<_, String>(((bucket, n), parse_seqnos(&stats)))
            });
        }
    }
    let mut out = Seqnos::new();
    for r in join_all(asks).await {
        match r {
            Ok((k, v)) => {
                out.insert(k, v);
            }
            Err(e) => {
                tracing::warn!(error = %e, "a replica did not say its seqnos; it is not preferred in the failover")
            }
        }
    }
    out
}

/// `vb_N:high_prepared_seqno` and `vb_N:high_seqno` out of `vbucket-details`.
fn parse_seqnos(stats: &[(String, String)]) -> HashMap<u16, (u64, u64)> {
    let mut out: HashMap<u16, (u64, u64)> = HashMap::new();
    for (k, v) in stats {
        let Some(rest) = k.strip_prefix("vb_") else {
            continue;
        };
        let Some((vb, field)) = rest.split_once(':') else {
            continue;
        };
        let (Ok(vb), Ok(v)) = (vb.parse::<u16>(), v.parse::<u64>()) else {
            continue;
        };
        let e = out.entry(vb).or_default();
        match field {
            "high_prepared_seqno" => e.0 = v,
            "high_seqno" => e.1 = v,
            _ => {}
        }
    }
    out
}

/// The candidate to promote: the one whose history goes furthest (the higher of its high
/// seqno and high prepared seqno, then the prepared seqno) among those that answered; the
/// first in the chain on a tie or when none answered.
fn choose(bucket: &str, vb: Vbid, candidates: &[usize], seqnos: &Seqnos) -> usize {
    let mut best = 0;
    let mut best_key: Option<(u64, u64)> = None;
    for (i, &n) in candidates.iter().enumerate() {
        // A prepare moves the high seqno too, so the higher of the two is how far the
        // copy's history goes; the prepared seqno breaks ties.
        let key = seqnos
            .get(&(bucket.to_owned(), n))
            .and_then(|m| m.get(&vb.0))
            .map(|&(prepared, high)| (prepared.max(high), prepared));
        if let Some(k) = key
            && best_key.is_none_or(|b| k > b)
        {
            best = i;
            best_key = Some(k);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replica_holding_the_most_is_chosen() {
        let mut seqnos = Seqnos::new();
        seqnos.insert(("b".into(), 1), HashMap::from([(7, (10, 10))]));
        seqnos.insert(("b".into(), 2), HashMap::from([(7, (12, 11))]));
        assert_eq!(choose("b", Vbid(7), &[1, 2], &seqnos), 1);
        // A copy that reports no prepared seqno but a higher seqno holds more.
        seqnos.insert(("b".into(), 1), HashMap::from([(7, (0, 13))]));
        assert_eq!(choose("b", Vbid(7), &[1, 2], &seqnos), 0);
        // A tie keeps the chain's order; an unknown vBucket or bucket too.
        seqnos.insert(("b".into(), 2), HashMap::from([(7, (10, 10))]));
        assert_eq!(choose("b", Vbid(7), &[1, 2], &seqnos), 0);
        assert_eq!(choose("b", Vbid(8), &[1, 2], &seqnos), 0);
        assert_eq!(choose("c", Vbid(7), &[1, 2], &seqnos), 0);
        // Only the second answered: it is preferred.
        let only = Seqnos::from([(("b".into(), 2), HashMap::from([(7, (0, 0))]))]);
        assert_eq!(choose("b", Vbid(7), &[1, 2], &only), 1);
    }

    #[test]
    fn seqnos_are_read_from_vbucket_details() {
        let stats: Vec<(String, String)> = [
            ("vb_3", "active"),
            ("vb_3:high_seqno", "40"),
            ("vb_3:high_prepared_seqno", "41"),
            ("vb_3:uuid", "99"),
            ("ep_junk", "1"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        assert_eq!(parse_seqnos(&stats), HashMap::from([(3, (41, 40))]));
    }
}
