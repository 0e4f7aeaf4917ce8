//! The orchestrator's side of a rebalance: it computes the target map once
//! ([`crate::plan::target_chains`]), then moves vBuckets a few at a time by changing the
//! cluster document (`rebalance.rs` describes a move's phases), following each move's
//! copies by their seqnos.
//!
//! **A round** (every [`STEP`]): ask each node taking part in a move for the move's
//! vBucket (`STAT vbucket-seqno N`, on a connection kept per node and bucket); advance
//! the moves whose new copies caught up; start moves while each node takes part in fewer
//! than `moves_per_node` backfills (vBuckets with the fewest copies first, so a vBucket
//! short of a replica gets one soonest); and write all of it in one compare-and-swap.
//!
//! **When to advance** (in every bucket): Backfill → Synced once every new copy is within
//! [`BACKFILL_LAG`] seqnos of the active; Synced → Takeover once the new active is within
//! [`TAKEOVER_LAG`]; Takeover → done once the old active reports `pending` and the new
//! one holds its high seqno exactly: nothing the old active acknowledged is missing from
//! the new one. A move that keeps its active completes once its copies are within
//! [`BACKFILL_LAG`]; one whose new active is already within [`TAKEOVER_LAG`] at the end
//! of its backfill goes straight to its takeover (each round is a compare-and-swap that
//! every node installs: rounds, not bytes, bound a rebalance of small vBuckets). A node's
//! allowance counts its moves in backfill only.
//!
//! **Ending.** The task ends when every move is made (the ejected nodes leave the
//! document), when the document no longer has this rebalance (stopped by an operator or
//! a failover), when this node stops being the orchestrator (the next one stops the
//! rebalance: see `Coordinator::drive_rebalance`), or when a node taking part does not
//! answer for [`NODE_PATIENCE`]: then it stops the rebalance with that reason.

use crate::coord::{ClusterError, Coordinator, join_all, resolve};
use crate::doc::{Chains, ClusterDoc};
use crate::node::Cluster;
use crate::plan;
use crate::rebalance::{Phase, RebalanceRefusal, VbMove};
use crate::replication::StatClient;
use epkv_types::NUM_VBUCKETS;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;

/// The pause between two rounds.
pub(crate) const STEP: Duration = Duration::from_millis(50);
/// How far (in seqnos) a new copy may be behind its active to leave its backfill.
pub(crate) const BACKFILL_LAG: u64 = 2000;
/// How far the new active may be behind the old one when the takeover starts: what it
/// has to stream while the old active parks its clients.
pub(crate) const TAKEOVER_LAG: u64 = 50;
/// How long a node taking part in a move may fail to answer before the rebalance stops.
pub(crate) const NODE_PATIENCE: Duration = Duration::from_secs(10);
/// How long a takeover may wait for the new copy to hold all of the old one before the
/// move is undone (the old copy active again) and tried again later.
const TAKEOVER_STALL: Duration = Duration::from_secs(5);
/// How many times one vBucket's takeover is tried before the rebalance fails.
const TAKEOVER_TRIES: u32 = 3;
/// How long the orchestrator waits for the takeovers it just started before it goes
/// back to its ordinary rounds.
const TAKEOVER_WAIT: Duration = Duration::from_millis(500);
/// How long one node's answer may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// Why a rebalance task ended early.
enum End {
    /// This node is no longer the orchestrator: the document is left to the next one.
    Lost,
    /// The document no longer has this rebalance.
    Gone,
    /// Something went wrong: the rebalance is stopped with this reason.
    Failed(String),
}

/// Per (bucket, node): per vBucket, its state and high seqno.
type Observed = HashMap<(String, usize), HashMap<u16, (String, u64)>>;

impl Coordinator {
    /// Starts a rebalance over `known` (every node's index) ejecting `ejected`; the
    /// orchestrator takes it on at its next round. Returns its id.
    ///
    /// # Errors
    /// Refused ([`RebalanceRefusal`]), or etcd unreachable.
    pub async fn start_rebalance(
        &self,
        known: BTreeSet<usize>,
        ejected: BTreeSet<usize>,
    ) -> Result<i64, ClusterError> {
        // The document's revision now: a later rebalance starts at a later one.
        let (_, id) = self.current_doc().await?;
        self.update_doc(|doc| {
            doc.start_rebalance(id, &known, &ejected)
                .map_err(|e: RebalanceRefusal| ClusterError::Invalid(e.to_string()))?;
            Ok(true)
        })
        .await?;
        tracing::warn!(id, ?ejected, "rebalance requested");
        Ok(id)
    }

    /// Stops the rebalance in progress (`stopRebalance`), recording `why`. Returns
    /// whether one was in progress.
    ///
    /// # Errors
    /// etcd unreachable.
    pub async fn stop_rebalance(&self, why: &str) -> Result<bool, ClusterError> {
        let stopped = self.update_doc(|doc| Ok(doc.stop_rebalance(why))).await?;
        if stopped {
            self.stats
                .rebalances_stopped
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(why, "rebalance stopped");
        }
        Ok(stopped)
    }

    /// One orchestrator round's look at the rebalance in the document: take on one
    /// nobody drives yet; stop one another orchestrator was driving (it is gone, or
    /// this node lost and regained the leadership), since its target map went with it.
    pub(crate) fn drive_rebalance(
        self: &Arc<Self>,
        task: &mut Option<tokio::task::JoinHandle<()>>,
    ) {
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let Some(doc) = self.cluster.upgrade().and_then(|c| c.doc()) else {
            return;
        };
        let Some(r) = &doc.rebalance else {
            return;
        };
        let me = Arc::clone(self);
        let id = r.id;
        if r.orchestrator.is_none() {
            *task = Some(tokio::spawn(me.run_rebalance(id)));
        } else {
            *task = Some(tokio::spawn(async move {
                if let Err(e) = me
                    .stop_rebalance("stopped: the orchestrator changed during the rebalance")
                    .await
                {
                    tracing::error!(error = %e, "cannot stop the previous orchestrator's rebalance");
                }
            }));
        }
    }

    /// Drives rebalance `id` to its end.
    async fn run_rebalance(self: Arc<Self>, id: i64) {
        let started = Instant::now();
        match self.rebalance_steps(id).await {
            Ok(()) => {
                self.stats
                    .rebalances_completed
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    id,
                    seconds = started.elapsed().as_secs_f64(),
                    "rebalance completed"
                );
            }
            Err(End::Lost) => {
                tracing::warn!(
                    id,
                    "no longer the orchestrator: the next one stops the rebalance"
                );
            }
            Err(End::Gone) => tracing::warn!(id, "the rebalance was stopped"),
            Err(End::Failed(why)) => {
                tracing::error!(id, reason = %why, "rebalance failed");
                let still = self
                    .current_doc()
                    .await
                    .is_ok_and(|(d, _)| d.rebalance.as_ref().is_some_and(|r| r.id == id));
                if still && let Err(e) = self.stop_rebalance(&format!("failed: {why}")).await {
                    tracing::error!(error = %e, "cannot stop the failed rebalance");
                }
            }
        }
    }

    /// The rebalance's rounds (see the module docs).
    async fn rebalance_steps(&self, id: i64) -> Result<(), End> {
        let cluster = self.node().map_err(|_| End::Lost)?;
        let me = self.id().to_owned();
        self.commit_to(id, |r, _| {
            let free = r.orchestrator.is_none();
            if free {
                r.orchestrator = Some(me.clone());
            }
            free
        })
        .await?;
        let (doc, _) = self
            .current_doc()
            .await
            .map_err(|e| End::Failed(e.to_string()))?;
        let buckets = cluster.bucket_names();
        let nodes = doc.rebalance_nodes();
        let planning = Instant::now();
        let target = plan::target_chains(&doc.chains, &nodes, doc.replicas);
        let mut todo: Vec<u16> = (0..NUM_VBUCKETS)
            .filter(|&v| needs_move(&doc, &buckets, v, &target))
            .collect();
        // The vBuckets with the fewest copies first: they are the ones a failure now
        // would lose.
        todo.sort_by_key(|&v| {
            let copies = doc
                .chains
                .get(usize::from(v))
                .map_or(0, |c| c.iter().flatten().count());
            (copies, v)
        });
        let mut node_total: BTreeMap<usize, usize> = BTreeMap::new();
        for &v in &todo {
            for n in involved(&doc, v, &target[usize::from(v)]) {
                *node_total.entry(n).or_default() += 1;
            }
        }
        tracing::warn!(
            id,
            moves = todo.len(),
            nodes = ?nodes,
            plan_ms = planning.elapsed().as_secs_f64() * 1e3,
            "rebalance: target map computed"
        );
        let total = todo.len();
        self.commit_to(id, |r, _| {
            r.total = total;
            r.node_total.clone_from(&node_total);
            true
        })
        .await?;
        let mut todo: VecDeque<u16> = todo.into();
        let mut clients: HashMap<(String, usize), StatClient> = HashMap::new();
        let mut silent_since: HashMap<usize, Instant> = HashMap::new();
        let mut takeover_at: HashMap<u16, Instant> = HashMap::new();
        let mut undone: HashMap<u16, u32> = HashMap::new();
        loop {
            if !self.is_leader() {
                return Err(End::Lost);
            }
            let Some(doc) = cluster.doc() else {
                return Err(End::Lost);
            };
            let Some(r) = doc.rebalance.clone().filter(|r| r.id == id) else {
                return Err(End::Gone);
            };
            let observed = self
                .observe(&doc, &r.moves, &buckets, &mut clients, &mut silent_since)
                .await?;
            let mut advance: BTreeMap<u16, Option<Phase>> = BTreeMap::new();
            let mut undo: Vec<u16> = Vec::new();
            for (&v, m) in &r.moves {
                if let Some(step) = next_step(&doc, &buckets, v, m, &observed) {
                    advance.insert(v, step);
                } else if m.phase == Phase::Takeover
                    && takeover_at
                        .get(&v)
                        .is_some_and(|t| t.elapsed() >= TAKEOVER_STALL)
                {
                    // The new copy does not get the last of the old one: give the old
                    // active its clients back and try the move again later.
                    let tries = undone.entry(v).or_insert(0);
                    *tries += 1;
                    if *tries > TAKEOVER_TRIES {
                        return Err(End::Failed(format!(
                            "vBucket {v}'s takeover did not finish in {TAKEOVER_TRIES} tries"
                        )));
                    }
                    tracing::warn!(
                        vb = v,
                        tries = *tries,
                        "a takeover stalled: the move is undone and tried again later"
                    );
                    undo.push(v);
                }
            }
            // New moves, within each node's allowance.
            let mut busy: HashMap<usize, usize> = HashMap::new();
            for (&v, m) in r.moves.iter().filter(|(_, m)| m.phase == Phase::Backfill) {
                for n in backfilling(&doc, v, &m.to) {
                    *busy.entry(n).or_default() += 1;
                }
            }
            let mut starting = Vec::new();
            let mut later = VecDeque::new();
            while let Some(v) = todo.pop_front() {
                let to = &target[usize::from(v)];
                let nodes = backfilling(&doc, v, to);
                if nodes
                    .iter()
                    .all(|n| busy.get(n).copied().unwrap_or(0) < r.moves_per_node)
                {
                    for n in nodes {
                        *busy.entry(n).or_default() += 1;
                    }
                    starting.push(v);
                } else {
                    later.push_back(v);
                }
            }
            todo = later;
            if advance.is_empty() && starting.is_empty() && undo.is_empty() {
                if r.moves.is_empty() && todo.is_empty() {
                    break;
                }
                tokio::time::sleep(STEP).await;
                continue;
            }
            self.commit_to(id, |r, done| {
                for (&v, step) in &advance {
                    match (step, r.moves.get_mut(&v)) {
                        (Some(p), Some(m)) => m.phase = *p,
                        (None, Some(_)) => done.push(v),
                        _ => {}
                    }
                }
                for &v in &starting {
                    r.moves.insert(
                        v,
                        VbMove {
                            to: target[usize::from(v)].clone(),
                            phase: Phase::Backfill,
                        },
                    );
                }
                for v in &undo {
                    r.moves.remove(v);
                }
                true
            })
            .await?;
            for v in undo {
                takeover_at.remove(&v);
                todo.push_back(v);
            }
            let now = Instant::now();
            for (&v, step) in &advance {
                match step {
                    Some(Phase::Takeover) => {
                        takeover_at.insert(v, now);
                    }
                    None => {
                        self.stats.rebalance_moves.fetch_add(1, Ordering::Relaxed);
                        if let Some(t) = takeover_at.remove(&v) {
                            self.stats.record_takeover(now.duration_since(t));
                        }
                    }
                    _ => {}
                }
            }
            tracing::debug!(
                started = starting.len(),
                advanced = advance.len(),
                left = todo.len(),
                "rebalance round committed"
            );
            let taking: Vec<u16> = advance
                .iter()
                .filter(|(_, step)| **step == Some(Phase::Takeover))
                .map(|(v, _)| *v)
                .collect();
            if !taking.is_empty() {
                self.finish_takeovers(id, &buckets, taking, &mut clients, &mut silent_since)
                    .await?;
            }
            // At most one ordinary change of the document per step: etcd writes and
            // every node installs each version.
            tokio::time::sleep(STEP).await;
        }
        // Every move is made: the map becomes the target and the ejected nodes go.
        let mut ours = false;
        self.commit(|doc| {
            ours = doc
                .rebalance
                .as_ref()
                .is_some_and(|r| r.id == id && r.moves.is_empty());
            if ours {
                doc.finish_rebalance(&target);
            }
            Ok(ours)
        })
        .await?;
        if ours { Ok(()) } else { Err(End::Gone) }
    }

    /// Completes the takeovers just started (`taking`) as soon as each is ready, without
    /// waiting for the other moves' rounds: their clients are parked meanwhile. Polls
    /// only those vBuckets, every millisecond, for at most [`TAKEOVER_WAIT`]; the ones
    /// not ready by then are left to the ordinary rounds.
    async fn finish_takeovers(
        &self,
        id: i64,
        buckets: &[String],
        mut taking: Vec<u16>,
        clients: &mut HashMap<(String, usize), StatClient>,
        silent_since: &mut HashMap<usize, Instant>,
    ) -> Result<(), End> {
        let cluster = self.node().map_err(|_| End::Lost)?;
        let started = Instant::now();
        while !taking.is_empty() && started.elapsed() < TAKEOVER_WAIT {
            let Some(doc) = cluster.doc() else {
                return Err(End::Lost);
            };
            let Some(r) = doc.rebalance.as_ref().filter(|r| r.id == id) else {
                return Err(End::Gone);
            };
            let moves: BTreeMap<u16, VbMove> = taking
                .iter()
                .filter_map(|v| r.moves.get(v).map(|m| (*v, m.clone())))
                .filter(|(_, m)| m.phase == Phase::Takeover)
                .collect();
            let observed = self
                .observe(&doc, &moves, buckets, clients, silent_since)
                .await?;
            let ready: Vec<u16> = moves
                .iter()
                .filter(|(v, m)| next_step(&doc, buckets, **v, m, &observed) == Some(None))
                .map(|(v, _)| *v)
                .collect();
            if !ready.is_empty() {
                self.commit_to(id, |_, done| {
                    done.extend(&ready);
                    true
                })
                .await?;
                let took = started.elapsed();
                for _ in &ready {
                    self.stats.rebalance_moves.fetch_add(1, Ordering::Relaxed);
                    self.stats.record_takeover(took);
                }
                taking.retain(|v| !ready.contains(v));
            }
            taking.retain(|v| moves.contains_key(v));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }

    /// [`Self::commit`] of a change of rebalance `id`: `edit` gets the rebalance and a
    /// list to put the moves it completes in (they change the maps too:
    /// [`ClusterDoc::complete_move`]), and returns whether its change applies; `Gone`
    /// when the document no longer has this rebalance or `edit` found it not as it
    /// needs (it must then have changed nothing).
    async fn commit_to<F>(&self, id: i64, mut edit: F) -> Result<(), End>
    where
        F: FnMut(&mut crate::rebalance::Rebalance, &mut Vec<u16>) -> bool,
    {
        let mut gone = false;
        self.commit(|doc| {
            let mut done = Vec::new();
            gone = !doc
                .rebalance
                .as_mut()
                .filter(|r| r.id == id)
                .is_some_and(|r| edit(r, &mut done));
            for v in done {
                doc.complete_move(v);
            }
            Ok(!gone)
        })
        .await?;
        if gone { Err(End::Gone) } else { Ok(()) }
    }

    /// [`Coordinator::update_doc`] for the rebalance: etcd unreachable or too busy is
    /// tried again for [`NODE_PATIENCE`] before the rebalance fails (a loaded etcd
    /// answers late, it has not lost the state).
    async fn commit<F>(&self, mut edit: F) -> Result<bool, End>
    where
        F: FnMut(&mut ClusterDoc) -> Result<bool, ClusterError>,
    {
        let started = Instant::now();
        loop {
            match self.update_doc(&mut edit).await {
                Ok(changed) => return Ok(changed),
                Err(ClusterError::Unavailable(e)) if started.elapsed() < NODE_PATIENCE => {
                    tracing::info!(error = %e, "the rebalance's change waits for etcd");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(End::Failed(e.to_string())),
            }
            if !self.is_leader() {
                return Err(End::Lost);
            }
        }
    }

    /// Asks each node taking part in `moves` for those vBuckets' states and seqnos.
    ///
    /// # Errors
    /// `Failed` once a node has not answered for [`NODE_PATIENCE`].
    async fn observe(
        &self,
        doc: &ClusterDoc,
        moves: &BTreeMap<u16, VbMove>,
        buckets: &[String],
        clients: &mut HashMap<(String, usize), StatClient>,
        silent_since: &mut HashMap<usize, Instant>,
    ) -> Result<Observed, End> {
        let mut asks: BTreeMap<(String, usize), Vec<u16>> = BTreeMap::new();
        for (&v, m) in moves {
            for b in buckets {
                let chain = doc
                    .chains_of(b)
                    .get(usize::from(v))
                    .cloned()
                    .unwrap_or_default();
                for n in chain.iter().chain(m.to.iter()).flatten() {
                    asks.entry((b.clone(), *n)).or_default().push(v);
                }
            }
        }
        let credentials = self.join.credentials.clone();
        let mut jobs = Vec::new();
        for ((bucket, n), vbs) in asks {
            let client = clients.remove(&(bucket.clone(), n));
            let spec = doc.nodes.get(n).map(|m| m.node.clone());
            let credentials = credentials.clone();
            jobs.push(async move {
                let answer = tokio::time::timeout(ASK_TIMEOUT, async {
                    let mut client = match client {
                        Some(c) => c,
                        None => {
                            let spec = spec.ok_or("no such node")?;
                            let addr = resolve(&spec)?;
                            StatClient::connect(addr, credentials.as_ref(), &bucket).await?
                        }
                    };
                    let mut seen = HashMap::new();
                    for v in vbs {
                        let stats = client.stats(&format!("vbucket-seqno {v}")).await?;
                        seen.insert(v, parse_state_and_seqno(&stats, v));
                    }
                    Ok::<_, String>((client, seen))
                })
                .await
                .unwrap_or_else(|_| Err("timed out".to_owned()));
                (bucket, n, answer)
            });
        }
        let mut out = Observed::new();
        for (bucket, n, answer) in join_all(jobs).await {
            match answer {
                Ok((client, seen)) => {
                    silent_since.remove(&n);
                    clients.insert((bucket.clone(), n), client);
                    out.insert((bucket, n), seen);
                }
                Err(e) => {
                    let since = *silent_since.entry(n).or_insert_with(Instant::now);
                    tracing::info!(node = n, bucket, error = %e, "a node taking part in the rebalance did not answer");
                    if since.elapsed() >= NODE_PATIENCE {
                        return Err(End::Failed(format!(
                            "node {n} did not answer for {} s: {e}",
                            NODE_PATIENCE.as_secs()
                        )));
                    }
                }
            }
        }
        Ok(out)
    }
}

/// A rebalance's progress as `GET /pools/default/rebalanceProgress` reports it (the
/// default: none running, none before).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RebalanceProgress {
    /// Whether one is running.
    pub running: bool,
    /// Per node (`host:port`): the share of its moves made, 0 to 1.
    pub nodes: Vec<(String, f64)>,
    /// Moves planned, made and in flight.
    pub total: usize,
    /// Moves made.
    pub done: usize,
    /// Moves in flight.
    pub in_flight: usize,
    /// How the last rebalance ended, when none runs.
    pub last: Option<String>,
}

impl Cluster {
    /// `POST /controller/rebalance`: `known` must name every node, `ejected` the nodes
    /// to remove (ns_server's `ns_1@host:port`, `host:port` or an index).
    ///
    /// # Errors
    /// Not an etcd cluster, an unknown node, refused, or etcd unreachable.
    pub fn rebalance(&self, known: &[String], ejected: &[String]) -> Result<i64, ClusterError> {
        let coord = self.coord_for_change()?;
        let index = |names: &[String]| -> Result<BTreeSet<usize>, ClusterError> {
            names
                .iter()
                .filter(|n| !n.is_empty())
                .map(|n| self.node_index(n))
                .collect()
        };
        let (known, ejected) = (index(known)?, index(ejected)?);
        self.block_on(coord.start_rebalance(known, ejected))?
    }

    /// `POST /controller/stopRebalance`. Returns whether a rebalance was running.
    ///
    /// # Errors
    /// Not an etcd cluster, or etcd unreachable.
    pub fn stop_rebalance(&self) -> Result<bool, ClusterError> {
        let coord = self.coord_for_change()?;
        self.block_on(coord.stop_rebalance("stopped by the operator"))?
    }

    /// The rebalance's progress, from the document installed here (`None` outside an
    /// etcd cluster).
    #[must_use]
    pub fn rebalance_progress(&self) -> Option<RebalanceProgress> {
        let doc = self.doc()?;
        let Some(r) = &doc.rebalance else {
            return Some(RebalanceProgress {
                last: doc.last_rebalance.clone(),
                ..RebalanceProgress::default()
            });
        };
        let nodes = doc
            .nodes
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let total = r.node_total.get(&i).copied().unwrap_or(0);
                let done = r.node_done.get(&i).copied().unwrap_or(0);
                #[allow(clippy::cast_precision_loss, reason = "a share")]
                let share = if total == 0 {
                    if r.total == 0 { 0.0 } else { 1.0 }
                } else {
                    (done as f64 / total as f64).min(1.0)
                };
                (crate::coord::node_id(&m.node), share)
            })
            .collect();
        Some(RebalanceProgress {
            running: true,
            nodes,
            total: r.total,
            done: r.done,
            in_flight: r.moves.len(),
            last: None,
        })
    }

    /// Moves a node takes part in at once (`rebalanceMovesPerNode`).
    #[must_use]
    pub fn moves_per_node(&self) -> usize {
        self.doc()
            .map_or(crate::rebalance::DEFAULT_MOVES_PER_NODE, |d| {
                d.moves_per_node
            })
    }

    /// Sets [`Self::moves_per_node`] (for rebalances started afterwards).
    ///
    /// # Errors
    /// Out of [`crate::rebalance::MOVES_PER_NODE`], not an etcd cluster, or etcd
    /// unreachable.
    pub fn set_moves_per_node(&self, n: usize) -> Result<(), ClusterError> {
        if !crate::rebalance::MOVES_PER_NODE.contains(&n) {
            return Err(ClusterError::Invalid(format!(
                "rebalanceMovesPerNode must be between {} and {}",
                crate::rebalance::MOVES_PER_NODE.start(),
                crate::rebalance::MOVES_PER_NODE.end()
            )));
        }
        let coord = self.coord_for_change()?;
        self.block_on(coord.update_doc(|doc| {
            let changed = doc.moves_per_node != n;
            doc.moves_per_node = n;
            Ok(changed)
        }))?
        .map(|_| ())
    }
}

/// Whether vBucket `v` must move: some bucket's chain (or the default one) differs from
/// its target.
fn needs_move(doc: &ClusterDoc, buckets: &[String], v: u16, target: &Chains) -> bool {
    let i = usize::from(v);
    let want = target.get(i);
    doc.chains.get(i) != want || buckets.iter().any(|b| doc.chains_of(b).get(i) != want)
}

/// The nodes a move of `v` to `to` involves: every node of the old chain and the new.
fn involved(doc: &ClusterDoc, v: u16, to: &[Option<usize>]) -> BTreeSet<usize> {
    let mut out: BTreeSet<usize> = to.iter().flatten().copied().collect();
    if let Some(c) = doc.chains.get(usize::from(v)) {
        out.extend(c.iter().flatten().copied());
    }
    out
}

/// The nodes whose allowance a move of `v` to `to` uses: the nodes that build a copy
/// (in the new chain, not the old) and the active they stream from. A move that only
/// promotes or demotes copies uses none.
fn backfilling(doc: &ClusterDoc, v: u16, to: &[Option<usize>]) -> Vec<usize> {
    let chain = doc.chains.get(usize::from(v)).cloned().unwrap_or_default();
    let mut out: Vec<usize> = to
        .iter()
        .flatten()
        .copied()
        .filter(|n| !chain.contains(&Some(*n)))
        .collect();
    if !out.is_empty()
        && let Some(Some(a)) = chain.first()
    {
        out.push(*a);
    }
    out
}

/// What the move of `v` does next given what the nodes said: `Some(Some(phase))` to go
/// to `phase`, `Some(None)` to complete, `None` to wait.
#[allow(clippy::option_option, reason = "wait / advance / complete")]
fn next_step(
    doc: &ClusterDoc,
    buckets: &[String],
    v: u16,
    m: &VbMove,
    seen: &Observed,
) -> Option<Option<Phase>> {
    let keeps_active = buckets.iter().all(|b| {
        doc.chains_of(b)
            .get(usize::from(v))
            .and_then(|c| c.first().copied())
            == m.to.first().copied()
    }) && doc
        .chains
        .get(usize::from(v))
        .and_then(|c| c.first().copied())
        == m.to.first().copied();
    // Every bucket: how far behind its active each node of the new chain is.
    let lag_of = |b: &str, n: usize| -> Option<u64> {
        let active = doc.chains_of(b).get(usize::from(v))?.first().copied()??;
        let (_, a) = seen.get(&(b.to_owned(), active))?.get(&v)?;
        let (_, h) = seen.get(&(b.to_owned(), n))?.get(&v)?;
        Some(a.saturating_sub(*h))
    };
    let all_within = |lag: u64, only_active: bool| {
        buckets.iter().all(|b| {
            m.to.iter()
                .enumerate()
                .filter(|(i, _)| !only_active || *i == 0)
                .filter_map(|(_, n)| *n)
                .all(|n| lag_of(b, n).is_some_and(|l| l <= lag))
        })
    };
    match m.phase {
        // Copies that finish their backfill close enough skip the synced round.
        Phase::Backfill if keeps_active => all_within(BACKFILL_LAG, false).then_some(None),
        Phase::Backfill if all_within(BACKFILL_LAG, false) && all_within(TAKEOVER_LAG, true) => {
            Some(Some(Phase::Takeover))
        }
        Phase::Backfill => all_within(BACKFILL_LAG, false).then_some(Some(Phase::Synced)),
        Phase::Synced if keeps_active => all_within(BACKFILL_LAG, false).then_some(None),
        Phase::Synced => all_within(TAKEOVER_LAG, true).then_some(Some(Phase::Takeover)),
        Phase::Takeover => {
            let ready = buckets.iter().all(|b| {
                let Some(chain) = doc.chains_of(b).get(usize::from(v)) else {
                    return false;
                };
                let (Some(Some(old)), Some(Some(new))) = (chain.first(), m.to.first()) else {
                    return false;
                };
                if old == new {
                    return true;
                }
                let (Some((state, a)), Some((_, h))) = (
                    seen.get(&(b.clone(), *old)).and_then(|s| s.get(&v)),
                    seen.get(&(b.clone(), *new)).and_then(|s| s.get(&v)),
                ) else {
                    return false;
                };
                state == "pending" && h >= a
            });
            ready.then_some(None)
        }
    }
}

/// `vb_V:state` and `vb_V:high_seqno` out of `vbucket-seqno V`.
fn parse_state_and_seqno(stats: &[(String, String)], v: u16) -> (String, u64) {
    let prefix = format!("vb_{v}:");
    let mut state = String::new();
    let mut high = 0;
    for (k, val) in stats {
        match k.strip_prefix(&prefix) {
            Some("state") => state.clone_from(val),
            Some("high_seqno") => high = val.parse().unwrap_or(0),
            _ => {}
        }
    }
    (state, high)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    fn doc(n: u16, replicas: usize) -> ClusterDoc {
        crate::doc::file_doc(n, replicas)
    }

    fn seen(entries: &[(usize, &str, u64)]) -> Observed {
        let mut out = Observed::new();
        for &(n, state, high) in entries {
            out.entry(("b".to_owned(), n))
                .or_default()
                .insert(0, (state.to_owned(), high));
        }
        out
    }

    #[test]
    fn a_move_advances_as_its_copies_catch_up() {
        // vBucket 0 is [0, 1] and goes to [2, 1].
        let d = doc(3, 1);
        let buckets = vec!["b".to_owned()];
        let mut m = VbMove {
            to: vec![Some(2), Some(1)],
            phase: Phase::Backfill,
        };
        let far = seen(&[
            (0, "active", 10_000),
            (1, "replica", 10_000),
            (2, "replica", 10),
        ]);
        assert_eq!(next_step(&d, &buckets, 0, &m, &far), None);
        let near = seen(&[
            (0, "active", 10_000),
            (1, "replica", 9_990),
            (2, "replica", 9_000),
        ]);
        assert_eq!(
            next_step(&d, &buckets, 0, &m, &near),
            Some(Some(Phase::Synced))
        );
        m.phase = Phase::Synced;
        assert_eq!(next_step(&d, &buckets, 0, &m, &near), None);
        let close = seen(&[
            (0, "active", 10_000),
            (1, "replica", 9_990),
            (2, "replica", 9_990),
        ]);
        let backfilled = VbMove {
            to: m.to.clone(),
            phase: Phase::Backfill,
        };
        assert_eq!(
            next_step(&d, &buckets, 0, &backfilled, &close),
            Some(Some(Phase::Takeover)),
            "a copy close enough skips the synced round"
        );
        assert_eq!(
            next_step(&d, &buckets, 0, &m, &close),
            Some(Some(Phase::Takeover))
        );
        m.phase = Phase::Takeover;
        // The old active must be pending and the new one hold all of it.
        assert_eq!(next_step(&d, &buckets, 0, &m, &close), None);
        let parked = seen(&[
            (0, "pending", 10_000),
            (1, "replica", 9_990),
            (2, "replica", 9_999),
        ]);
        assert_eq!(next_step(&d, &buckets, 0, &m, &parked), None);
        let taken = seen(&[
            (0, "pending", 10_000),
            (1, "replica", 9_990),
            (2, "replica", 10_000),
        ]);
        assert_eq!(next_step(&d, &buckets, 0, &m, &taken), Some(None));
    }

    #[test]
    fn a_move_that_keeps_its_active_needs_no_takeover() {
        // vBucket 0 is [0, 1] and goes to [0, 2].
        let d = doc(3, 1);
        let buckets = vec!["b".to_owned()];
        let m = VbMove {
            to: vec![Some(0), Some(2)],
            phase: Phase::Synced,
        };
        let near = seen(&[(0, "active", 100), (2, "replica", 99)]);
        assert_eq!(next_step(&d, &buckets, 0, &m, &near), Some(None));
        let backfilled = VbMove {
            to: m.to.clone(),
            phase: Phase::Backfill,
        };
        assert_eq!(next_step(&d, &buckets, 0, &backfilled, &near), Some(None));
        assert_eq!(backfilling(&d, 0, &m.to), vec![2, 0]);
        assert!(backfilling(&d, 0, &[Some(1), Some(0)]).is_empty());
    }

    #[test]
    fn stats_are_parsed() {
        let stats = vec![
            ("vb_5:state".to_owned(), "pending".to_owned()),
            ("vb_5:high_seqno".to_owned(), "42".to_owned()),
            ("vb_5:uuid".to_owned(), "7".to_owned()),
        ];
        assert_eq!(parse_state_and_seqno(&stats, 5), ("pending".to_owned(), 42));
    }
}
