//! Rebalance on an etcd cluster: real etcd and epkv-server processes. vBuckets move
//! while a client keeps writing (plain and Majority writes, routed by the map and
//! following NOT_MY_VBUCKET as SDKs do); every acknowledged write is read back after
//! each step, and the final maps are balanced.

use crate::etcd_cluster::{EtcdCluster, majority, no_etcd, vbucket_of, wait_until};
use crate::harness::key;

const ADMIN: (&str, &str) = ("Administrator", "password");
use epkv_client::{Client, StoreOptions};
use epkv_protocol::Status;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tokio::time::Instant;

/// A client of the whole cluster: routes each key by the map it last read, and reads it
/// again on NOT_MY_VBUCKET, TMPFAIL or a lost connection.
struct Router {
    actives: Vec<usize>,
    clients: HashMap<usize, Client>,
    /// What each key was last acknowledged with.
    acked: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Operations retried (not failed: every write here ends acknowledged).
    retries: u64,
}

impl Router {
    fn new(c: &EtcdCluster) -> Router {
        Router {
            actives: c.actives(0),
            clients: HashMap::new(),
            acked: BTreeMap::new(),
            retries: 0,
        }
    }

    fn refresh(&mut self, c: &EtcdCluster) {
        let via = (0..c.nodes.len())
            .find(|&i| c.nodes[i].is_some())
            .expect("a live node");
        self.actives = c.actives(via);
    }

    /// Sets `k` to `v` (Majority when `durable`), retrying until acknowledged (bounded).
    async fn set(&mut self, c: &EtcdCluster, k: &[u8], v: &[u8], durable: bool) {
        self.write(c, k, v, durable, false).await;
    }

    /// [`Router::set`]; with `give_up_on_ambiguous`, returns false as soon as the write
    /// was answered ambiguous or its connection was lost with it in flight (it may or
    /// may not have happened), true once acknowledged. Answers that leave nothing behind
    /// (NOT_MY_VBUCKET, TMPFAIL, a SyncWrite in progress) are retried either way.
    async fn write(
        &mut self,
        c: &EtcdCluster,
        k: &[u8],
        v: &[u8],
        durable: bool,
        give_up_on_ambiguous: bool,
    ) -> bool {
        let opts = if durable {
            majority()
        } else {
            StoreOptions::new()
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(Instant::now() < deadline, "a write was never acknowledged");
            let n = self.actives[usize::from(vbucket_of(k).0)];
            if c.nodes[n].is_none() {
                // Killed, and not failed over yet.
                self.retries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
                self.refresh(c);
                continue;
            }
            if let std::collections::hash_map::Entry::Vacant(e) = self.clients.entry(n) {
                e.insert(c.client(n).await);
            }
            let answer = self.clients.get_mut(&n).unwrap().set(k, v, opts).await;
            match answer {
                Ok(r) if r.is_success() => {
                    self.acked.insert(k.to_vec(), v.to_vec());
                    return true;
                }
                Ok(r)
                    if give_up_on_ambiguous
                        && r.status_raw == Status::SyncWriteAmbiguous as u16 =>
                {
                    return false;
                }
                Ok(r)
                    if [
                        Status::NotMyVbucket as u16,
                        Status::Etmpfail as u16,
                        Status::SyncWriteAmbiguous as u16,
                        Status::SyncWriteInProgress as u16,
                        Status::SyncWriteReCommitInProgress as u16,
                    ]
                    .contains(&r.status_raw) => {}
                Ok(r) => panic!("a write answered {:#x}", r.status_raw),
                Err(_) => {
                    self.clients.remove(&n);
                    if give_up_on_ambiguous {
                        return false;
                    }
                }
            }
            self.retries += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
            self.refresh(c);
        }
    }

    /// Reads every acknowledged key back from its active copy by a fresh map.
    async fn read_back(&mut self, c: &EtcdCluster) {
        self.refresh(c);
        self.clients.clear();
        let acked = std::mem::take(&mut self.acked);
        for (k, v) in &acked {
            let n = self.actives[usize::from(vbucket_of(k).0)];
            if let std::collections::hash_map::Entry::Vacant(e) = self.clients.entry(n) {
                e.insert(c.client(n).await);
            }
            let r = self.clients.get_mut(&n).unwrap().get(k).await.unwrap();
            assert_eq!(
                r.status_raw,
                Status::Success as u16,
                "an acknowledged write in {} is missing on node {n}",
                vbucket_of(k)
            );
            assert_eq!(r.value.as_ref(), v.as_slice(), "{}", vbucket_of(k));
        }
        self.acked = acked;
    }
}

/// Starts a rebalance through node `via` with every node known and `ejected` ejected.
fn rebalance(c: &EtcdCluster, via: usize, known: &[usize], ejected: &[usize]) {
    let names = |nodes: &[usize]| {
        nodes
            .iter()
            .map(|&i| c.otp(i))
            .collect::<Vec<_>>()
            .join(",")
    };
    let form = format!(
        "knownNodes={}&ejectedNodes={}",
        names(known),
        names(ejected)
    );
    let (status, body) = c.rest(via, "POST", "/controller/rebalance", Some(&form));
    assert_eq!(status, 200, "{body}");
}

/// The status of the rebalance as node `via` reports it.
fn progress(c: &EtcdCluster, via: usize) -> serde_json::Value {
    c.json(via, "/pools/default/rebalanceProgress")
}

/// Whether a rebalance that ended as `how` (`lastRebalance`) was stopped by something
/// the test did not do (the orchestrator lost its etcd lease, or etcd stayed too slow,
/// as a loaded CI machine can make it): an operator starts it again, and so does the
/// test, a few times at most.
fn worth_restarting(how: &str) -> bool {
    how.starts_with("stopped: the orchestrator changed") || how.starts_with("failed")
}

/// How many times a test starts a rebalance again after [`worth_restarting`].
const RESTARTS: usize = 3;

/// Rebalances over `known` ejecting `ejected` (through node `via`), writing through `r`
/// meanwhile (every third write Majority) when given, until it completes or ends
/// otherwise; returns how it ended (`lastRebalance`).
async fn rebalance_under_load(
    c: &EtcdCluster,
    via: usize,
    known: &[usize],
    ejected: &[usize],
    mut r: Option<&mut Router>,
    round: &str,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut i = 0u64;
    let mut restarts = 0;
    rebalance(c, via, known, ejected);
    loop {
        match r.as_deref_mut() {
            Some(r) => {
                for _ in 0..20 {
                    let k = key(&format!("load-{}", i % 3000));
                    let v = format!("{round}-{i}");
                    r.set(c, &k, v.as_bytes(), i.is_multiple_of(3)).await;
                    i += 1;
                }
            }
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
        let p = progress(c, via);
        if p["status"] == "none" {
            let how = p["lastRebalance"].as_str().unwrap_or_default().to_owned();
            if worth_restarting(&how) && restarts < RESTARTS {
                restarts += 1;
                eprintln!("{round}: the rebalance ended as {how:?}; starting it again");
                rebalance(c, via, known, ejected);
                continue;
            }
            return how;
        }
        assert!(Instant::now() < deadline, "the rebalance did not end: {p}");
    }
}

/// Prints the orchestrator's rebalance series (`kv_rebalance_*`): how many vBuckets it
/// moved and how long its takeovers parked clients. Figures, not assertions.
fn report_takeovers(c: &EtcdCluster, via: usize, step: &str) {
    let boss = c.orchestrator(via);
    let addr = crate::metrics::metrics_addr(c.node(boss));
    let page = crate::harness::http_request(addr, "GET", "/metrics", Some(ADMIN), None);
    assert_eq!(page.status, 200, "{}", page.body);
    let body = page.body;
    let series: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("kv_rebalance_"))
        .collect();
    for name in [
        "moves_total",
        "takeovers_total",
        "takeover_seconds_total",
        "takeover_seconds_max",
    ] {
        let line = series
            .iter()
            .find(|l| l.starts_with(&format!("kv_rebalance_{name} ")))
            .unwrap_or_else(|| panic!("no kv_rebalance_{name} in {series:?}"));
        eprintln!("{step}: {line}");
    }
}

/// Per node index, its active and total copies in `default`'s map as node `via` sees it.
fn copies(c: &EtcdCluster, via: usize) -> (BTreeMap<usize, usize>, BTreeMap<usize, usize>) {
    let (mut actives, mut all) = (BTreeMap::new(), BTreeMap::new());
    for chain in c.chains(via) {
        let mut seen = Vec::new();
        for (rank, n) in chain.iter().enumerate() {
            let n = n.unwrap_or_else(|| panic!("a copy without a node: {chain:?}"));
            assert!(!seen.contains(&n), "two copies on one node: {chain:?}");
            seen.push(n);
            if rank == 0 {
                *actives.entry(n).or_default() += 1;
            }
            *all.entry(n).or_default() += 1;
        }
    }
    (actives, all)
}

/// Asserts the map is balanced over exactly `nodes`: actives and copies within one.
fn assert_balanced(c: &EtcdCluster, via: usize, nodes: &[usize]) {
    let (actives, all) = copies(c, via);
    assert_eq!(
        actives.keys().copied().collect::<Vec<_>>(),
        nodes,
        "{actives:?}"
    );
    assert_eq!(all.keys().copied().collect::<Vec<_>>(), nodes, "{all:?}");
    for counts in [&actives, &all] {
        let (min, max) = (
            counts.values().min().unwrap(),
            counts.values().max().unwrap(),
        );
        assert!(max - min <= 1, "unbalanced: {counts:?}");
    }
    assert_eq!(c.json(via, "/pools/default")["balanced"], true);
}

/// 2 → 3 nodes, then 3 → 2 ejecting node 0 (the first orchestrator), then a swap (add
/// node 3, eject node 1), each under a load of plain and Majority writes: every
/// acknowledged write is read back after each step, and each map is balanced.
#[tokio::test]
async fn nodes_are_added_removed_and_swapped_under_load_and_nothing_is_lost() {
    if no_etcd("rebalance") {
        return;
    }
    let mut c = EtcdCluster::start(2, 1, 1);
    let (status, body) = c.rest(
        0,
        "POST",
        "/internalSettings",
        Some("rebalanceMovesPerNode=16"),
    );
    assert_eq!(status, 200, "{body}");
    let mut r = Router::new(&c);
    for i in 0..3000 {
        let k = key(&format!("load-{i}"));
        r.set(&c, &k, b"seed", false).await;
    }

    // 2 -> 3.
    let n2 = c.add_new_node(0);
    let how = rebalance_under_load(&c, 1, &[0, 1, n2], &[], Some(&mut r), "add").await;
    assert!(how.starts_with("completed"), "{how}");
    assert_balanced(&c, 0, &[0, 1, n2]);
    r.read_back(&c).await;
    report_takeovers(&c, 1, "2 -> 3");

    // 3 -> 2: eject node 0.
    let how = rebalance_under_load(&c, 1, &[0, 1, n2], &[0], Some(&mut r), "remove").await;
    assert!(how.starts_with("completed"), "{how}");
    assert_balanced(&c, 1, &[1, n2]);
    r.read_back(&c).await;
    // The ejected node serves nothing any more.
    let mut x = c.client(0).await;
    let k = key("load-1");
    assert_eq!(
        x.get(&k).await.unwrap().status_raw,
        Status::NotMyVbucket as u16
    );

    // Swap: add node 3, eject node 1.
    let (status, body) = c.rest(
        0,
        "POST",
        "/internalSettings",
        Some("rebalanceMovesPerNode=2"),
    );
    assert_eq!(status, 200, "{body}");
    let n3 = c.add_new_node(1);
    let how = rebalance_under_load(&c, n2, &[1, n2, n3], &[1], Some(&mut r), "swap").await;
    assert!(how.starts_with("completed"), "{how}");
    assert_balanced(&c, n2, &[n2, n3]);
    r.read_back(&c).await;
    report_takeovers(&c, n2, "swap");
    eprintln!("writes retried across the three rebalances: {}", r.retries);
}

/// Waits until the rebalance node `via` reports has made at least `moves` moves.
fn wait_moves(c: &EtcdCluster, via: usize, moves: u64) {
    wait_until(
        "the rebalance's first moves",
        Duration::from_secs(60),
        || {
            let p = progress(c, via);
            assert_eq!(p["status"], "running", "the rebalance ended early: {p}");
            (p["vbucketMovesDone"].as_u64().unwrap_or(0) >= moves).then_some(())
        },
    );
}

/// Waits until no rebalance runs; returns how the last one ended.
fn wait_ended(c: &EtcdCluster, via: usize, limit: Duration) -> String {
    wait_until("the rebalance to end", limit, || {
        let p = progress(c, via);
        (p["status"] == "none").then(|| p["lastRebalance"].as_str().unwrap_or("").to_owned())
    })
}

/// Waits until node `via` sees node `dead` failed over.
fn wait_failed_over(c: &EtcdCluster, via: usize, dead: usize) {
    wait_until("the failover", Duration::from_secs(30), || {
        (c.membership(via, dead) == "inactiveFailed").then_some(())
    });
}

/// `stopRebalance`, a node killed mid-rebalance and the orchestrator killed
/// mid-rebalance: each leaves a map with every vBucket active exactly once and every
/// Majority write readable, and a new rebalance then finishes balanced.
#[tokio::test]
async fn a_stopped_or_failed_rebalance_leaves_a_consistent_map_and_a_new_one_finishes() {
    if no_etcd("rebalance failures") {
        return;
    }
    let mut c = EtcdCluster::start(2, 1, 1);
    for (form, what) in [
        ("rebalanceMovesPerNode=2", "/internalSettings"),
        ("enabled=true&timeout=3", "/settings/autoFailover"),
    ] {
        let (status, body) = c.rest(0, "POST", what, Some(form));
        assert_eq!(status, 200, "{what}: {body}");
    }
    let mut r = Router::new(&c);
    for i in 0..2000 {
        let k = key(&format!("f-{i}"));
        r.set(&c, &k, b"v", true).await;
    }

    // Stopped by the operator.
    let n2 = c.add_new_node(0);
    rebalance(&c, 0, &[0, 1, n2], &[]);
    wait_moves(&c, 0, 4);
    let (status, body) = c.rest(1, "POST", "/controller/stopRebalance", None);
    assert_eq!(status, 200, "{body}");
    let how = wait_ended(&c, 0, Duration::from_secs(10));
    assert!(how.starts_with("stopped by the operator"), "{how}");
    r.read_back(&c).await;

    // A node taking part killed: auto-failover stops the rebalance.
    rebalance(&c, 0, &[0, 1, n2], &[]);
    wait_moves(&c, 0, 4);
    c.kill(n2);
    let how = wait_ended(&c, 0, Duration::from_secs(30));
    assert!(
        how.starts_with("stopped") || how.starts_with("failed"),
        "{how}"
    );
    wait_failed_over(&c, 0, n2);
    let (status, body) = c.rest(0, "POST", "/settings/autoFailover/resetCount", None);
    assert_eq!(status, 200, "{body}");
    r.read_back(&c).await;
    // The failed node is ejected by the next rebalance, which finishes.
    // The moves were slowed down to stop the rebalance midway; no longer.
    let (status, body) = c.rest(
        0,
        "POST",
        "/internalSettings",
        Some("rebalanceMovesPerNode=16"),
    );
    assert_eq!(status, 200, "{body}");
    let how = rebalance_under_load(&c, 0, &[0, 1, n2], &[], None, "after a node died").await;
    assert!(how.starts_with("completed"), "{how}");
    assert_balanced(&c, 0, &[0, 1]);
    r.read_back(&c).await;

    // The orchestrator killed: it is failed over, the next one stops the rebalance.
    let (status, body) = c.rest(
        0,
        "POST",
        "/internalSettings",
        Some("rebalanceMovesPerNode=2"),
    );
    assert_eq!(status, 200, "{body}");
    let n3 = c.add_new_node(1);
    let boss = c.orchestrator(1);
    let other = if boss == 0 { 1 } else { 0 };
    rebalance(&c, other, &[0, 1, n3], &[]);
    wait_moves(&c, other, 4);
    c.kill(boss);
    let how = wait_ended(&c, other, Duration::from_secs(30));
    assert!(how.starts_with("stopped"), "{how}");
    wait_failed_over(&c, other, boss);
    r.read_back(&c).await;
    let (status, body) = c.rest(
        other,
        "POST",
        "/internalSettings",
        Some("rebalanceMovesPerNode=16"),
    );
    assert_eq!(status, 200, "{body}");
    let how = rebalance_under_load(
        &c,
        other,
        &[0, 1, n3],
        &[],
        None,
        "after the orchestrator died",
    )
    .await;
    assert!(how.starts_with("completed"), "{how}");
    assert_balanced(&c, other, &[other.min(n3), other.max(n3)]);
    r.read_back(&c).await;
}

/// Majority writes kept in flight (four writers, each on its own keys) while the
/// actives move: each write the clients saw acknowledged is read back from the new
/// active and from its replica with its value; a write answered ambiguous left either
/// its value or an earlier one (committed or aborted, once); and no prepare is left
/// behind blocking its key (a new Majority write to every key is acknowledged).
#[tokio::test]
async fn prepares_in_flight_at_the_takeovers_complete_once_on_the_new_actives() {
    use std::sync::atomic::{AtomicBool, Ordering};
    if no_etcd("prepares at takeover") {
        return;
    }
    let mut c = EtcdCluster::start(2, 1, 1);
    let (status, body) = c.rest(
        0,
        "POST",
        "/internalSettings",
        Some("rebalanceMovesPerNode=16"),
    );
    assert_eq!(status, 200, "{body}");
    let n2 = c.add_new_node(0);
    let c = &c;
    let stop = &AtomicBool::new(false);
    let writer = |w: usize| async move {
        let mut r = Router::new(c);
        // Per key: the values of the writes answered ambiguous since the last one
        // acknowledged.
        let mut maybe: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
        let mut i = 0u64;
        while !stop.load(Ordering::SeqCst) && i < 100_000 {
            let k = key(&format!("p{w}-{}", i % 200));
            let v = format!("w{w}-{i}").into_bytes();
            if r.write(c, &k, &v, true, true).await {
                maybe.remove(&k);
            } else {
                maybe.entry(k).or_default().push(v);
            }
            i += 1;
        }
        (r, maybe)
    };
    let watcher = async {
        rebalance(c, 0, &[0, 1, n2], &[]);
        let deadline = Instant::now() + Duration::from_secs(120);
        let how = loop {
            let p = progress(c, 0);
            if p["status"] == "none" {
                break p["lastRebalance"].as_str().unwrap_or_default().to_owned();
            }
            assert!(Instant::now() < deadline, "the rebalance did not end: {p}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        stop.store(true, Ordering::SeqCst);
        how
    };
    let (how, a, b, d, e) = tokio::join!(watcher, writer(0), writer(1), writer(2), writer(3));
    assert!(how.starts_with("completed"), "{how}");
    assert_balanced(c, 0, &[0, 1, n2]);
    let replicas: Vec<usize> = c
        .chains(0)
        .iter()
        .map(|chain| chain[1].expect("a replica"))
        .collect();
    let mut clients: HashMap<usize, Client> = HashMap::new();
    let mut checked = 0;
    for (mut r, maybe) in [a, b, d, e] {
        r.refresh(c);
        for (k, v) in std::mem::take(&mut r.acked) {
            let vb = vbucket_of(&k);
            let n = r.actives[usize::from(vb.0)];
            if let std::collections::hash_map::Entry::Vacant(e) = clients.entry(n) {
                e.insert(c.client(n).await);
            }
            let got = clients.get_mut(&n).unwrap().get(&k).await.unwrap();
            assert_eq!(got.status_raw, Status::Success as u16, "{vb} on node {n}");
            let allowed: Vec<&[u8]> = std::iter::once(v.as_slice())
                .chain(maybe.get(&k).into_iter().flatten().map(Vec::as_slice))
                .collect();
            assert!(
                allowed.contains(&got.value.as_ref()),
                "{vb}: {:?} is neither the acknowledged value nor an ambiguous one",
                String::from_utf8_lossy(&got.value)
            );
            // The replica holds the same once replication caught up.
            let rep = replicas[usize::from(vb.0)];
            if let std::collections::hash_map::Entry::Vacant(e) = clients.entry(rep) {
                e.insert(c.client(rep).await);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let resp = clients
                    .get_mut(&rep)
                    .unwrap()
                    .request(
                        epkv_protocol::RequestBuilder::new(epkv_protocol::Opcode::GetReplica)
                            .vbucket(vb)
                            .key(&k),
                    )
                    .await
                    .unwrap();
                if resp.status_raw == Status::Success as u16 && resp.value == got.value {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{vb}: the replica on node {rep} answered {:#x} {:?}",
                    resp.status_raw,
                    String::from_utf8_lossy(&resp.value)
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Nothing left blocks the key.
            r.set(c, &k, b"after", true).await;
            checked += 1;
        }
    }
    assert!(checked > 0, "no write was acknowledged");
}
