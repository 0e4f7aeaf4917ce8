//! `cargo xtask bench rebalance`: adding a node to an etcd cluster (issue 15), on
//! loopback with a real etcd and release builds of epkv-server (the cluster plumbing of
//! `bench elastic`).
//!
//! Each run starts etcd and two persistent nodes with one replica, sets
//! `rebalanceMovesPerNode`, loads `--items` keys of 512 bytes, and waits until the
//! replicas and the disk queues caught up. Then:
//! - **The floor**: a raw DCP backfill of node 0's active vBuckets (the same data, from
//!   the same node) to a consumer that discards it: DCP_OPEN as a producer's client with
//!   the 4 MiB flow-control window the nodes' own consumers ask for, one STREAM_REQ
//!   (`TO_LATEST`) per vBucket, bytes counted until every stream ended.
//! - **Capacity**: the cluster client's 90/10 GET/SET load closed-loop (`--threads`, one
//!   operation in flight each) for `--secs`; then the **quiet** run: the same load paced
//!   at half that rate for `--secs`.
//! - **The rebalance**: a third node registers and is added, the paced load starts, and
//!   2 s later `POST /controller/rebalance`; the clock runs until
//!   `rebalanceProgress` says it ended. Bytes moved: the new node's items (`vb_N:num_items`
//!   of `vbucket-details`) × 512. The client follows NOT_MY_VBUCKET and retries TMPFAIL;
//!   an operation's latency runs from its first send to its success.
//! - **Takeover pause**: per vBucket whose active moved, the longest operation on it
//!   during the rebalance (client side), and the orchestrator's
//!   `kv_rebalance_takeover_seconds_{total,max}` and `kv_rebalance_takeovers_total`.
//!
//! Goals: bytes/s ≥ 0.5x the floor; p99 during the rebalance ≤ 3x the quiet p99; no
//! operation over 2 s; takeover pause p99 ≤ 50 ms. Writes `target/bench/rebalance.json`
//! (rows as docs/benchmarks.md describes) and prints a table (also
//! `target/bench/rebalance.md`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use epkv_protocol::dcp::{self, StreamReq};
use epkv_types::{NUM_VBUCKETS, Vbid};
use serde_json::{Value, json};

use crate::bench_elastic::{EtcdProcess, Nodes, http, kv_connect, read_response};
use crate::bench_metrics::metrics_port;
use crate::cluster_client::{self, Load, LoadSpec, Router, Sample, quantile, stats};
use crate::process;
use crate::util::{self, Stopwatch};

/// The value size the issue fixes.
const VALUE_BYTES: usize = 512;
/// The flow-control window of the floor's consumer: the one replication asks for.
const DCP_WINDOW: usize = 4 << 20;

/// Options of `cargo xtask bench rebalance`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RebalanceOptions {
    /// 100,000 items and 10 s load phases (the full run: 1,000,000 and 20 s).
    #[arg(long)]
    pub(crate) quick: bool,
    /// Items of 512 bytes loaded before the rebalance.
    #[arg(long)]
    pub(crate) items: Option<u64>,
    /// Seconds of the closed-loop capacity run and of the quiet paced run.
    #[arg(long)]
    pub(crate) secs: Option<u64>,
    /// `rebalanceMovesPerNode` of each run, one fresh cluster each (repeatable; 4, the
    /// default, is the headline).
    #[arg(long = "moves-per-node")]
    pub(crate) moves_per_node: Vec<u32>,
    /// Load threads (one operation in flight each, connections to every node).
    #[arg(long, default_value_t = 16)]
    pub(crate) threads: usize,
    /// Use this epkv-server binary instead of building target/release/epkv-server.
    #[arg(long, env = "EPKV_BIN")]
    pub(crate) epkv_bin: Option<PathBuf>,
}

/// What the floor's DCP consumer received.
#[derive(Debug, Clone, Copy)]
struct Floor {
    vbuckets: usize,
    secs: f64,
    mutations: u64,
    value_bytes: u64,
    wire_bytes: u64,
}

impl Floor {
    fn bytes_per_sec(&self) -> f64 {
        self.value_bytes as f64 / self.secs
    }
}

/// Streams `vbs` from the node at `port` to their high seqnos and discards them.
fn dcp_floor(port: u16, vbs: &[u16]) -> Result<Floor> {
    let mut s = kv_connect(port)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut req = Vec::new();
    dcp::encode_open(&mut req, 0, b"bench-rebalance-floor", dcp::OPEN_PRODUCER)?;
    let window = DCP_WINDOW.to_string();
    dcp::encode_control(&mut req, 0, b"connection_buffer_size", window.as_bytes())?;
    s.write_all(&req)?;
    let mut r = BufReader::with_capacity(1 << 20, s.try_clone()?);
    for what in ["DCP_OPEN", "DCP_CONTROL"] {
        let (status, body) = read_response(&mut r)?;
        if status != 0 {
            bail!("{what}: {status:#x} {}", String::from_utf8_lossy(&body));
        }
    }
    let mut reqs = Vec::new();
    for &vb in vbs {
        let stream = StreamReq {
            flags: dcp::STREAM_TO_LATEST,
            end_seqno: u64::MAX,
            ..StreamReq::default()
        };
        dcp::encode_stream_req(&mut reqs, u32::from(vb) + 1, Vbid(vb), &stream)?;
    }
    let clock = Stopwatch::start();
    s.write_all(&reqs)?;
    let mut f = Floor {
        vbuckets: vbs.len(),
        secs: 0.0,
        mutations: 0,
        value_bytes: 0,
        wire_bytes: 0,
    };
    let (mut ended, mut unacked) = (0, 0);
    let mut body = Vec::new();
    while ended < vbs.len() {
        let mut head = [0u8; 24];
        r.read_exact(&mut head)?;
        let key = usize::from(u16::from_be_bytes([head[2], head[3]]));
        let extras = usize::from(head[4]);
        let len = u32::from_be_bytes([head[8], head[9], head[10], head[11]]) as usize;
        body.resize(len, 0);
        r.read_exact(&mut body)?;
        f.wire_bytes += 24 + len as u64;
        let (magic, opcode) = (head[0], head[1]);
        if magic == 0x81 {
            let status = u16::from_be_bytes([head[6], head[7]]);
            if status != 0 {
                bail!("DCP response {opcode:#x}: {status:#x}");
            }
            continue;
        }
        match opcode {
            0x57 => {
                f.mutations += 1;
                f.value_bytes += (len - key - extras) as u64;
            }
            0x55 => ended += 1,
            _ => {}
        }
        unacked += 24 + len;
        if unacked >= DCP_WINDOW / 2 {
            let mut ack = Vec::new();
            dcp::encode_buffer_ack(&mut ack, 0, u32::try_from(unacked)?)?;
            s.write_all(&ack)?;
            unacked = 0;
        }
    }
    f.secs = clock.elapsed().as_secs_f64();
    Ok(f)
}

/// Latency figures of some operations, µs.
#[derive(Debug, Clone, Copy)]
struct Latency {
    ops: usize,
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
    /// p99 counted from when the pacing schedule wanted each operation sent.
    scheduled_p99: f64,
}

impl Latency {
    fn of<'a>(samples: impl Iterator<Item = &'a Sample>) -> Latency {
        let (mut lat, mut sched): (Vec<f64>, Vec<f64>) = samples
            .map(|s| (s.latency_us as f64, s.scheduled_us as f64))
            .unzip();
        lat.sort_by(f64::total_cmp);
        sched.sort_by(f64::total_cmp);
        Latency {
            ops: lat.len(),
            p50: quantile(&lat, 0.5),
            p99: quantile(&lat, 0.99),
            p999: quantile(&lat, 0.999),
            max: lat.last().copied().unwrap_or(f64::NAN),
            scheduled_p99: quantile(&sched, 0.99),
        }
    }

    fn json(&self) -> Value {
        json!({ "ops": self.ops, "p50_us": self.p50, "p99_us": self.p99,
                "p999_us": self.p999, "max_us": self.max,
                "scheduled_p99_us": self.scheduled_p99 })
    }
}

/// CPU time of the processes sharing the machine over a stretch of wall time.
#[derive(Debug, Clone, Default)]
struct Cpu {
    /// (process, CPU seconds) in the order measured.
    used: Vec<(String, f64)>,
    wall: f64,
}

impl Cpu {
    /// Runs `f`, measuring the CPU time each of `procs` (name, pid) used meanwhile.
    fn during<T>(procs: &[(String, u32)], f: impl FnOnce() -> Result<T>) -> Result<(T, Cpu)> {
        let hz = process::clock_ticks_per_sec() as f64;
        let ticks = || -> Result<Vec<u64>> {
            procs
                .iter()
                .map(|(_, pid)| process::cpu_ticks(*pid))
                .collect()
        };
        let before = ticks()?;
        let watch = Stopwatch::start();
        let out = f()?;
        let wall = watch.elapsed().as_secs_f64();
        let used = procs
            .iter()
            .zip(ticks()?.into_iter().zip(before))
            .map(|((name, _), (a, b))| (name.clone(), a.saturating_sub(b) as f64 / hz))
            .collect();
        Ok((out, Cpu { used, wall }))
    }

    /// `node0 0.61, ... cores` over the wall time.
    fn describe(&self) -> String {
        let cores: Vec<String> = self
            .used
            .iter()
            .map(|(n, s)| format!("{n} {:.2}", s / self.wall))
            .collect();
        let total: f64 = self.used.iter().map(|(_, s)| s).sum();
        format!(
            "{} (total {:.2} cores)",
            cores.join(", "),
            total / self.wall
        )
    }

    fn json(&self) -> Value {
        let mut o = serde_json::Map::new();
        for (n, s) in &self.used {
            o.insert(n.clone(), json!(s / self.wall));
        }
        json!({ "wall_secs": self.wall, "cores_used": o })
    }
}

/// The machine's processes of a run: its nodes, etcd and this client.
fn procs(nodes: &Nodes, n: usize, etcd: &EtcdProcess) -> Result<Vec<(String, u32)>> {
    let mut v = (0..n)
        .map(|i| Ok((format!("node{i}"), nodes.server(i)?.pid())))
        .collect::<Result<Vec<_>>>()?;
    v.push(("etcd".to_owned(), etcd.pid()));
    v.push(("client".to_owned(), std::process::id()));
    Ok(v)
}

/// Everything one run measured.
struct Run {
    moves_per_node: u32,
    threads: usize,
    items: u64,
    load_secs: f64,
    floor: Floor,
    capacity: f64,
    rate: f64,
    quiet: Latency,
    during: Latency,
    quiet_cpu: Cpu,
    rebalance_cpu: Cpu,
    rebalance_secs: f64,
    /// Operations per second the paced load completed during the rebalance.
    achieved: f64,
    how: String,
    moves: u64,
    new_node_items: u64,
    new_node_vbuckets: usize,
    redirected_ops: usize,
    retried_ops: usize,
    /// Per vBucket whose active moved, the longest operation on it (µs), sorted.
    pauses: Vec<f64>,
    /// Of those vBuckets, how many had an operation that followed NOT_MY_VBUCKET.
    pauses_redirected: usize,
    takeovers: f64,
    takeover_total: f64,
    takeover_max: f64,
}

impl Run {
    fn bytes_moved(&self) -> f64 {
        (self.new_node_items * VALUE_BYTES as u64) as f64
    }

    fn bytes_per_sec(&self) -> f64 {
        self.bytes_moved() / self.rebalance_secs
    }
}

/// The value of the unlabelled series `name` in a Prometheus exposition.
fn series(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

/// Waits until, on every node, the replicas hold what the actives have and nothing waits
/// for the disk.
fn settle(nodes: &Nodes, n: usize) -> Result<()> {
    nodes.wait(
        "replicas and disk queues to settle",
        Duration::from_secs(600),
        || {
            let (mut active, mut replica) = (0u64, 0u64);
            for i in 0..n {
                for (k, v) in stats(nodes.kv[i], "replication")? {
                    match k.as_str() {
                        "vb_active_high_seqno_sum" => active += v.parse::<u64>()?,
                        "vb_replica_high_seqno_sum" => replica += v.parse::<u64>()?,
                        _ => {}
                    }
                }
                let queued = stats(nodes.kv[i], "")?
                    .into_iter()
                    .find(|(k, _)| k == "ep_queue_size")
                    .map_or(0, |(_, v)| v.parse::<u64>().unwrap_or(0));
                if queued > 0 {
                    return Ok(false);
                }
            }
            Ok(active > 0 && active == replica)
        },
    )
}

/// The new node's items over its vBuckets (`vb_N:num_items`), and how many it holds.
fn node_items(port: u16) -> Result<(u64, usize)> {
    let mut items = 0;
    let mut vbs = 0;
    for (k, v) in stats(port, "vbucket-details")? {
        if k.ends_with(":num_items") {
            items += v.parse::<u64>()?;
        } else if k.starts_with("vb_") && !k.contains(':') && (v == "active" || v == "replica") {
            vbs += 1;
        }
    }
    Ok((items, vbs))
}

/// Polls `rebalanceProgress` on node `via` every 50 ms until no rebalance runs and one
/// has ended; returns how it ended and the moves it made.
fn wait_rebalance(nodes: &Nodes, via: usize) -> Result<(String, u64)> {
    let mut moves = 0;
    let watch = Stopwatch::start();
    loop {
        let p = nodes.json(via, "/pools/default/rebalanceProgress")?;
        if let Some(done) = p["vbucketMovesTotal"].as_u64() {
            moves = done;
        }
        if p["status"] == "none"
            && let Some(how) = p["lastRebalance"].as_str()
        {
            return Ok((how.to_owned(), moves));
        }
        if watch.elapsed() > Duration::from_secs(3600) {
            bail!("the rebalance did not end within an hour: {p}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One run on a fresh cluster with `rebalanceMovesPerNode` = `m`.
fn run(bin: &Path, opts: &RebalanceOptions, items: u64, secs: u64, m: u32) -> Result<Run> {
    let tag = format!("rebalance-m{m}");
    let etcd = EtcdProcess::start()?;
    // Every copy resident: the quota holds a node's share before and after with room.
    let quota = format!("{}MiB", ((items * 2048) >> 20).max(1024));
    let extra = ["--metrics-port", "0", "--memory-quota", &quota];
    let mut nodes = Nodes::start_with(bin, &extra, 2, 1, Some(&etcd), &tag)?;
    let (status, body) = nodes.rest(
        0,
        "POST",
        "/internalSettings",
        &format!("rebalanceMovesPerNode={m}"),
    )?;
    if status != 200 {
        bail!("internalSettings: {status} {body}");
    }
    let router = Arc::new(Router::new(vec![nodes.mgmt_addr(0), nodes.mgmt_addr(1)])?);
    let value = Arc::new(cluster_client::value(VALUE_BYTES));

    let watch = Stopwatch::start();
    cluster_client::populate(&router, items, &value, 4)?;
    let load_secs = watch.elapsed().as_secs_f64();
    eprintln!(
        "rebalance m={m}: loaded {items} items in {load_secs:.1} s ({:.0}/s)",
        items as f64 / load_secs
    );
    settle(&nodes, 2)?;

    let before = router.map();
    let node0: Vec<u16> = (0..NUM_VBUCKETS)
        .filter(|&v| before.port(v) == nodes.kv[0])
        .collect();
    let floor = dcp_floor(nodes.kv[0], &node0)?;
    eprintln!(
        "rebalance m={m}: DCP floor {} vBuckets, {} mutations in {:.2} s = {:.1} MB/s",
        floor.vbuckets,
        floor.mutations,
        floor.secs,
        floor.bytes_per_sec() / 1e6
    );

    let mut spec = LoadSpec {
        items,
        value,
        get_fraction: 0.9,
        threads: opts.threads,
        rate: None,
    };
    let load = Load::start(&router, &spec);
    std::thread::sleep(Duration::from_secs(secs));
    let closed = load.finish()?;
    let capacity = closed.iter().filter(|s| s.at >= 1.0).count() as f64 / (secs as f64 - 1.0);
    let rate = capacity / 2.0;
    spec.rate = Some(rate);
    eprintln!("rebalance m={m}: capacity {capacity:.0} ops/s; paced load at {rate:.0}");
    let (quiet_samples, quiet_cpu) = Cpu::during(&procs(&nodes, 2, &etcd)?, || {
        let load = Load::start(&router, &spec);
        std::thread::sleep(Duration::from_secs(secs));
        load.finish()
    })?;
    let quiet = Latency::of(quiet_samples.iter().filter(|s| s.at >= 1.0));

    let new = nodes.add_node(&etcd, 0, &tag)?;
    let load = Load::start(&router, &spec);
    std::thread::sleep(Duration::from_secs(2));
    let known: Vec<String> = (0..=new).map(|i| nodes.otp(i)).collect();
    let t0 = load.now();
    let (ended, rebalance_cpu) = Cpu::during(&procs(&nodes, 3, &etcd)?, || {
        let (status, body) = nodes.rest(
            0,
            "POST",
            "/controller/rebalance",
            &format!("knownNodes={}&ejectedNodes=", known.join(",")),
        )?;
        if status != 200 {
            bail!("rebalance: {status} {body}");
        }
        Ok(wait_rebalance(&nodes, 0))
    })?;
    let rebalance_secs = rebalance_cpu.wall;
    let t1 = load.now();
    std::thread::sleep(Duration::from_secs(2));
    let samples = load.finish()?;
    let (how, moves) = ended?;
    eprintln!("rebalance m={m}: {how} in {rebalance_secs:.1} s ({moves} moves)");
    if !how.starts_with("completed") {
        bail!("the rebalance did not complete: {how}");
    }
    router.refresh();
    let after = router.map();
    let window: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at >= t0 && s.at <= t1)
        .collect();
    let during = Latency::of(window.iter().copied());
    let mut longest: BTreeMap<u16, (f64, bool)> = (0..NUM_VBUCKETS)
        .filter(|&v| before.port(v) != after.port(v))
        .map(|v| (v, (0.0, false)))
        .collect();
    for s in &window {
        if let Some((max, redirected)) = longest.get_mut(&s.vb) {
            *max = f64::max(*max, s.latency_us as f64);
            *redirected |= s.redirected;
        }
    }
    let mut pauses: Vec<f64> = longest.values().map(|(m, _)| *m).collect();
    pauses.sort_by(f64::total_cmp);
    let (new_node_items, new_node_vbuckets) = node_items(nodes.kv[new])?;

    let boss = nodes.orchestrator()?.context("no orchestrator")?;
    let metrics = metrics_port(&nodes.server(boss)?.listening_line)
        .context("no metrics address in the orchestrator's listening line")?;
    let (status, page) = http(&format!("127.0.0.1:{metrics}"), "GET", "/metrics", "", true)?;
    if status != 200 {
        bail!("metrics: {status}");
    }
    let run = Run {
        moves_per_node: m,
        threads: opts.threads,
        items,
        load_secs,
        floor,
        capacity,
        rate,
        quiet,
        during,
        quiet_cpu,
        rebalance_cpu,
        rebalance_secs,
        achieved: window.len() as f64 / (t1 - t0),
        how,
        moves,
        new_node_items,
        new_node_vbuckets,
        redirected_ops: window.iter().filter(|s| s.redirected).count(),
        retried_ops: window.iter().filter(|s| s.retries > 0).count(),
        pauses_redirected: longest.values().filter(|(_, r)| *r).count(),
        pauses,
        takeovers: series(&page, "kv_rebalance_takeovers_total"),
        takeover_total: series(&page, "kv_rebalance_takeover_seconds_total"),
        takeover_max: series(&page, "kv_rebalance_takeover_seconds_max"),
    };
    nodes.stop();
    drop(etcd);
    Ok(run)
}

fn rows(r: &Run) -> Vec<Value> {
    let params = json!({
        "items": r.items, "value_bytes": VALUE_BYTES, "nodes_before": 2, "nodes_after": 3,
        "replicas": 1, "persistent": true, "rebalance_moves_per_node": r.moves_per_node,
    });
    let floor_bps = r.floor.bytes_per_sec();
    let mean_takeover = r.takeover_total / r.takeovers;
    vec![
        json!({
            "bench": "rebalance/speed", "impl": "epkv", "params": params,
            "rebalance_secs": r.rebalance_secs, "how": r.how, "moves": r.moves,
            "new_node_items": r.new_node_items, "new_node_vbuckets": r.new_node_vbuckets,
            "bytes_moved": r.bytes_moved(), "bytes_per_sec": r.bytes_per_sec(),
            "floor_bytes_per_sec": floor_bps, "ratio_vs_floor": r.bytes_per_sec() / floor_bps,
            "goal_ratio": 0.5, "load_secs": r.load_secs,
        }),
        json!({
            "bench": "rebalance/dcp_backfill_floor", "impl": "raw-dcp", "params": {
                "items": r.items, "value_bytes": VALUE_BYTES,
                "vbuckets": r.floor.vbuckets, "source": "node 0's active vBuckets",
                "flow_control_window": DCP_WINDOW },
            "secs": r.floor.secs, "mutations": r.floor.mutations,
            "value_bytes": r.floor.value_bytes, "wire_bytes": r.floor.wire_bytes,
            "bytes_per_sec": floor_bps,
        }),
        json!({
            "bench": "rebalance/client_impact", "impl": "epkv", "params": {
                "items": r.items, "get_fraction": 0.9, "value_bytes": VALUE_BYTES,
                "client_threads": r.threads, "rebalance_moves_per_node": r.moves_per_node },
            "capacity_ops_per_sec": r.capacity, "items_per_sec": r.rate,
            "achieved_during_rebalance_ops_per_sec": r.achieved,
            "quiet": r.quiet.json(), "during_rebalance": r.during.json(),
            "p99_ratio": r.during.p99 / r.quiet.p99, "goal_p99_ratio": 3.0,
            "max_us": r.during.max, "goal_max_us": 2e6,
            "redirected_ops": r.redirected_ops, "retried_ops": r.retried_ops,
            "quiet_cpu": r.quiet_cpu.json(), "rebalance_cpu": r.rebalance_cpu.json(),
        }),
        json!({
            "bench": "rebalance/takeover_pause", "impl": "epkv", "params": {
                "rebalance_moves_per_node": r.moves_per_node, "paced_ops_per_sec": r.rate },
            "moved_actives": r.pauses.len(), "with_a_redirected_op": r.pauses_redirected,
            "client_p50_us": quantile(&r.pauses, 0.5), "client_p99_us": quantile(&r.pauses, 0.99),
            "client_max_us": r.pauses.last().copied().unwrap_or(f64::NAN),
            "server_takeovers": r.takeovers, "server_mean_us": mean_takeover * 1e6,
            "server_max_us": r.takeover_max * 1e6, "goal_p99_us": 50_000,
        }),
    ]
}

fn markdown(md: &mut String, r: &Run) -> Result<()> {
    let floor = r.floor.bytes_per_sec();
    let mb = |b: f64| b / 1e6;
    let ms = |us: f64| us / 1e3;
    writeln!(
        md,
        "\n### Rebalance 2 → 3 nodes, {} items × {VALUE_BYTES} B, rebalanceMovesPerNode {}\n",
        r.items, r.moves_per_node
    )?;
    writeln!(md, "| figure | epkv | floor / goal | ratio |")?;
    writeln!(md, "|---|---:|---:|---:|")?;
    writeln!(
        md,
        "| rebalance time ({} moves; new node: {} vBuckets, {} items) | {:.1} s | | |",
        r.moves, r.new_node_vbuckets, r.new_node_items, r.rebalance_secs
    )?;
    writeln!(
        md,
        "| bytes moved per second (new node's items × {VALUE_BYTES} B) | {:.1} MB/s | floor {:.1} MB/s (raw DCP backfill of node 0's {} actives); goal ≥ 0.5x | **{:.3}x** |",
        mb(r.bytes_per_sec()),
        mb(floor),
        r.floor.vbuckets,
        r.bytes_per_sec() / floor
    )?;
    writeln!(
        md,
        "| 90/10 p99 during the rebalance vs quiet, paced at {:.0} ops/s (half of {:.0}) | {:.2} ms vs {:.2} ms | goal ≤ 3x | **{:.2}x** |",
        r.rate,
        r.capacity,
        ms(r.during.p99),
        ms(r.quiet.p99),
        r.during.p99 / r.quiet.p99
    )?;
    writeln!(
        md,
        "| longest operation during the rebalance ({} ops, {} followed NOT_MY_VBUCKET) | {:.1} ms | goal ≤ 2 s | {:.3}x |",
        r.during.ops,
        r.redirected_ops,
        ms(r.during.max),
        r.during.max / 2e6
    )?;
    writeln!(
        md,
        "| takeover pause, client side: longest op per moved active ({} vBuckets, {} saw a redirect), p50 / p99 / max | {:.1} / {:.1} / {:.1} ms | goal p99 ≤ 50 ms | {:.2}x |",
        r.pauses.len(),
        r.pauses_redirected,
        ms(quantile(&r.pauses, 0.5)),
        ms(quantile(&r.pauses, 0.99)),
        ms(r.pauses.last().copied().unwrap_or(f64::NAN)),
        ms(quantile(&r.pauses, 0.99)) / 50.0
    )?;
    writeln!(
        md,
        "| takeover pause, orchestrator (`kv_rebalance_takeover_seconds`), mean / max of {} | {:.1} / {:.1} ms | goal ≤ 50 ms | {:.2}x (max) |",
        r.takeovers,
        r.takeover_total / r.takeovers * 1e3,
        r.takeover_max * 1e3,
        r.takeover_max * 1e3 / 50.0
    )?;
    writeln!(
        md,
        "\nQuiet: p50 {:.2} ms, p99.9 {:.2} ms, max {:.1} ms. During: p50 {:.2} ms, p99.9 {:.2} ms, {:.0} ops/s completed; p99 counted from the schedule {:.2} ms (quiet {:.2} ms). Load of {} items: {:.1} s. Floor: {} mutations, {:.1} MB on the wire in {:.2} s.",
        ms(r.quiet.p50),
        ms(r.quiet.p999),
        ms(r.quiet.max),
        ms(r.during.p50),
        ms(r.during.p999),
        r.achieved,
        ms(r.during.scheduled_p99),
        ms(r.quiet.scheduled_p99),
        r.items,
        r.load_secs,
        r.floor.mutations,
        mb(r.floor.wire_bytes as f64),
        r.floor.secs
    )?;
    writeln!(
        md,
        "\nCores used, quiet run: {}. During the rebalance: {}.",
        r.quiet_cpu.describe(),
        r.rebalance_cpu.describe()
    )?;
    Ok(())
}

/// Runs the benchmark and writes the report.
pub(crate) fn bench_rebalance(opts: &RebalanceOptions) -> Result<()> {
    let bin = process::release_server_bin(opts.epkv_bin.as_ref())?;
    let items = opts
        .items
        .unwrap_or(if opts.quick { 100_000 } else { 1_000_000 });
    let secs = opts.secs.unwrap_or(if opts.quick { 10 } else { 20 }).max(3);
    let moves = if opts.moves_per_node.is_empty() {
        vec![4]
    } else {
        opts.moves_per_node.clone()
    };
    let out_dir = util::target_dir().join("bench");
    std::fs::create_dir_all(&out_dir)?;
    let mut all = Vec::new();
    let mut md = String::new();
    for m in moves {
        let r = run(&bin, opts, items, secs, m)?;
        all.extend(rows(&r));
        markdown(&mut md, &r)?;
    }
    let path = out_dir.join("rebalance.json");
    std::fs::write(&path, serde_json::to_string_pretty(&all)?)?;
    std::fs::write(out_dir.join("rebalance.md"), &md)?;
    println!("{md}");
    println!("wrote {}", path.display());
    Ok(())
}
