//! `cargo xtask bench cluster`: epkv on two nodes with one replica (issue 11).
//!
//! Each run starts a fresh two-node cluster on loopback (its own cluster file and data
//! directories, removed afterwards; both nodes share this machine's cores) and drives it
//! with `epkv-fight`, which reads the cluster map and sends each key to the node holding
//! its vBucket's active copy:
//! - **Replication throughput**: SETs at full speed (`--throughput-connections`, one
//!   outstanding each) on the cluster with one replica, against the same load on the same
//!   two nodes with no replica, in the same invocation. While the replicated load runs a
//!   sampler reads both nodes' `STAT replication` every 10 ms (the sums of the high seqnos
//!   of their active and of their replica vBuckets): the replication lag in seqnos is
//!   active minus replica, and in ms, for each sample, the time until the replicas reached
//!   the actives' sum of that moment. Goals: p99 lag ≤ 1 s; ops/s with the replica ≥ 0.5x.
//! - **Seed 001 on two nodes**: 2000 connections of PersistToMajority SETs of 512 bytes
//!   (acknowledged once the active and the replica both have the write on disk), and the
//!   same load at level None as the ceiling. KV-Engine's average was 614 ms.
//!
//! Writes `target/bench/cluster.json` (rows as docs/benchmarks.md describes) and prints
//! a table.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Result, bail};
use serde_json::{Value, json};

use crate::bench_persistence::{FightRun, build_server_and_fight, ensure_nofile};
use crate::memcapable::tempdir;
use crate::process::{self, ServerProcess};
use crate::util;

/// Options of `cargo xtask bench cluster`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ClusterOptions {
    /// Short runs (5 s; 500 durable connections, 20k keys).
    #[arg(long)]
    pub(crate) quick: bool,
    /// Seconds per run (default 5 quick, 15 full).
    #[arg(long)]
    pub(crate) secs: Option<u64>,
    /// Connections of the throughput runs.
    #[arg(long, default_value_t = 128)]
    pub(crate) throughput_connections: usize,
    /// Connections of the seed-001 runs (default 500 quick, 2000 full).
    #[arg(long)]
    pub(crate) durable_connections: Option<usize>,
}

/// A running two-node cluster.
struct TwoNodes {
    nodes: Vec<ServerProcess>,
    _dir: crate::memcapable::TempDir,
}

impl TwoNodes {
    fn start(replicas: usize, max_conns: usize, tag: &str) -> Result<TwoNodes> {
        let dir = tempdir("bench-cluster")?;
        let ports = [process::free_port()?, process::free_port()?];
        if ports[0] == ports[1] {
            bail!("the same free port twice; run again");
        }
        let mut file = format!("replicas = {replicas}\n");
        for p in ports {
            let _ = write!(file, "[[nodes]]\nhost = \"127.0.0.1\"\nport = {p}\n");
        }
        let path = dir.path().join("cluster.toml");
        std::fs::write(&path, file)?;
        let bin = process::epkv_server_bin("release");
        let out_dir = util::target_dir().join("bench");
        let mut nodes = Vec::new();
        for (i, p) in ports.iter().enumerate() {
            let data = dir.path().join(format!("node{i}"));
            let args: Vec<String> = [
                "--port",
                &p.to_string(),
                "--data-dir",
                &data.display().to_string(),
                "--max-connections",
                &(max_conns + 256).to_string(),
                "--cluster",
                &path.display().to_string(),
                "--cluster-node",
                &i.to_string(),
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
            let log = out_dir.join(format!("cluster-{tag}-node{i}.log"));
            nodes.push(ServerProcess::start_epkv(&bin, &args, log)?);
        }
        // States and replication streams come up right after the listening line.
        std::thread::sleep(Duration::from_secs(1));
        Ok(TwoNodes { nodes, _dir: dir })
    }

    fn stop(self) -> Result<()> {
        for n in self.nodes {
            n.stop()?;
        }
        Ok(())
    }
}

/// One `STAT replication` reading of a node: (active sum, replica sum).
fn replication_sums(addr: &str) -> Result<(u64, u64)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let group = b"replication";
    let mut req = vec![0x80, 0x10];
    req.extend_from_slice(&u16::try_from(group.len())?.to_be_bytes());
    req.extend_from_slice(&[0, 0, 0, 0]);
    req.extend_from_slice(&u32::try_from(group.len())?.to_be_bytes());
    req.extend_from_slice(&[0; 12]);
    req.extend_from_slice(group);
    s.write_all(&req)?;
    let (mut active, mut replica) = (0, 0);
    loop {
        let mut head = [0u8; 24];
        s.read_exact(&mut head)?;
        let key_len = usize::from(u16::from_be_bytes([head[2], head[3]]));
        let extras = usize::from(head[4]);
        let status = u16::from_be_bytes([head[6], head[7]]);
        let body = u32::from_be_bytes([head[8], head[9], head[10], head[11]]) as usize;
        let mut b = vec![0u8; body];
        s.read_exact(&mut b)?;
        if status != 0 {
            bail!("STAT replication answered {status:#x}");
        }
        if key_len == 0 {
            return Ok((active, replica));
        }
        let key = String::from_utf8_lossy(&b[extras..extras + key_len]).into_owned();
        let value: u64 = String::from_utf8_lossy(&b[extras + key_len..])
            .parse()
            .unwrap_or(0);
        match key.as_str() {
            "vb_active_high_seqno_sum" => active = value,
            "vb_replica_high_seqno_sum" => replica = value,
            _ => {}
        }
    }
}

/// A sample: when (since sampling began), the actives' and the replicas' high seqno sums
/// over both nodes.
type Sample = (Duration, u64, u64);

/// Samples both nodes every 10 ms until `stop`, then until the replicas caught up (at
/// most 10 s more).
fn sample(addrs: &[String], stop: &AtomicBool) -> Vec<Sample> {
    let mut out = Vec::new();
    let mut after: Option<Duration> = None;
    let clock = util::Stopwatch::start();
    loop {
        let t = clock.elapsed();
        let (mut a, mut r) = (0, 0);
        for addr in addrs {
            if let Ok((x, y)) = replication_sums(addr) {
                a += x;
                r += y;
            }
        }
        out.push((t, a, r));
        if stop.load(Ordering::Relaxed) {
            let since = *after.get_or_insert(t);
            if r >= a || t.saturating_sub(since) > Duration::from_secs(10) {
                return out;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// p50/p99/max of the lag in seqnos and in ms.
fn lag_stats(samples: &[Sample]) -> Value {
    let mut seqnos: Vec<u64> = samples
        .iter()
        .map(|(_, a, r)| a.saturating_sub(*r))
        .collect();
    let mut ms: Vec<f64> = samples
        .iter()
        .filter_map(|&(t, a, _)| {
            samples
                .iter()
                .find(|&&(u, _, r)| u >= t && r >= a)
                .map(|&(u, _, _)| u.saturating_sub(t).as_secs_f64() * 1e3)
        })
        .collect();
    let caught_up = ms.len() == samples.len();
    seqnos.sort_unstable();
    ms.sort_by(f64::total_cmp);
    let q = |v: &[u64], p: f64| {
        v.get(((v.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0)
    };
    let qf = |v: &[f64], p: f64| {
        v.get(((v.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    json!({
        "samples": samples.len(),
        "lag_seqnos_p50": q(&seqnos, 0.5),
        "lag_seqnos_p99": q(&seqnos, 0.99),
        "lag_seqnos_max": seqnos.last().copied().unwrap_or(0),
        "lag_ms_p50": qf(&ms, 0.5),
        "lag_ms_p99": qf(&ms, 0.99),
        "lag_ms_max": ms.last().copied().unwrap_or(f64::NAN),
        "replicas_caught_up": caught_up,
    })
}

/// One run: a fresh cluster with `replicas`, the load, and (with `lag`) the sampler.
fn run(
    replicas: usize,
    conns: usize,
    keys: u64,
    secs: u64,
    durability: &str,
    lag: bool,
) -> Result<(Value, Option<Value>)> {
    let tag = format!("r{replicas}-{durability}-{conns}");
    let cluster = TwoNodes::start(replicas, conns, &tag)?;
    let addrs: Vec<String> = cluster.nodes.iter().map(ServerProcess::addr).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = lag.then(|| {
        let (addrs, stop) = (addrs.clone(), Arc::clone(&stop));
        std::thread::spawn(move || sample(&addrs, &stop))
    });
    let result = FightRun::start(&addrs[0], conns, keys, secs, durability);
    stop.store(true, Ordering::Relaxed);
    let lag = sampler
        .and_then(|h| h.join().ok())
        .map(|samples| lag_stats(&samples));
    cluster.stop()?;
    Ok((result?.result()?, lag))
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

/// Runs the benchmark and writes the report.
pub(crate) fn bench_cluster(opts: &ClusterOptions) -> Result<()> {
    let secs = opts.secs.unwrap_or(if opts.quick { 5 } else { 15 });
    let durable_conns = opts
        .durable_connections
        .unwrap_or(if opts.quick { 500 } else { 2000 });
    let keys = if opts.quick { 20_000 } else { 200_000 };
    build_server_and_fight()?;
    ensure_nofile(durable_conns.max(opts.throughput_connections) as u64 * 2 + 1024)?;
    let out_dir = util::target_dir().join("bench");
    std::fs::create_dir_all(&out_dir)?;
    let tc = opts.throughput_connections;
    let (no_replica, _) = run(0, tc, keys, secs, "none", false)?;
    let (with_replica, lag) = run(1, tc, keys, secs, "none", true)?;
    let (persist, _) = run(1, durable_conns, keys, secs, "persist-majority", false)?;
    let (ceiling, _) = run(1, durable_conns, keys, secs, "none", false)?;
    let lag = lag.unwrap_or(Value::Null);
    let ratio = num(&with_replica, "items_per_sec") / num(&no_replica, "items_per_sec");
    let row = |bench: &str, replicas: usize, x: &Value, extra: Value| {
        let ips = num(x, "items_per_sec");
        let mut r = json!({
            "bench": bench,
            "params": {
                "nodes": 2,
                "replicas": replicas,
                "connections": x["connections"],
                "keys": x["keys"],
                "value_bytes": x["value_bytes"],
                "durability": x["durability"],
                "client": "epkv-fight",
            },
            "impl": "epkv",
            "items_per_sec": ips,
            "ns_per_op": 1e9 / ips,
            "mean_us": x["mean_us"],
            "p50_us": x["p50_us"],
            "p99_us": x["p99_us"],
            "p999_us": x["p999_us"],
            "errors": x["errors"],
        });
        if let (Some(o), Some(e)) = (r.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        r
    };
    let rows = vec![
        row("cluster/replication_throughput", 0, &no_replica, json!({})),
        row(
            "cluster/replication_throughput",
            1,
            &with_replica,
            json!({ "ratio_vs_no_replica": ratio, "lag": lag }),
        ),
        row(
            "cluster/seed001_two_nodes",
            1,
            &persist,
            json!({ "seed_avg_ms": 614.0 }),
        ),
        row("cluster/seed001_two_nodes", 1, &ceiling, json!({})),
    ];
    let path = out_dir.join("cluster.json");
    std::fs::write(&path, serde_json::to_string_pretty(&rows)?)?;
    let mut md = String::new();
    writeln!(md, "\n### Two nodes, one replica ({secs} s per run)\n")?;
    writeln!(md, "| run | conns | ops/s | mean | p50 | p99 | errors |")?;
    writeln!(md, "|---|---:|---:|---:|---:|---:|---:|")?;
    for (name, x) in [
        ("SET, no replica", &no_replica),
        ("SET, one replica", &with_replica),
        ("PersistToMajority, one replica", &persist),
        ("SET (None), one replica", &ceiling),
    ] {
        writeln!(
            md,
            "| {name} | {} | {:.0} | {:.2} ms | {:.2} ms | {:.2} ms | {} |",
            x["connections"],
            num(x, "items_per_sec"),
            num(x, "mean_us") / 1e3,
            num(x, "p50_us") / 1e3,
            num(x, "p99_us") / 1e3,
            x["errors"],
        )?;
    }
    writeln!(
        md,
        "\nReplication: ops/s with the replica {ratio:.2}x of without (goal ≥ 0.5); lag p99 \
         {} seqnos, {:.1} ms (goal ≤ 1 s); p50 {} seqnos, {:.1} ms; max {:.1} ms; replicas \
         caught up: {}.",
        lag["lag_seqnos_p99"],
        num(&lag, "lag_ms_p99"),
        lag["lag_seqnos_p50"],
        num(&lag, "lag_ms_p50"),
        num(&lag, "lag_ms_max"),
        lag["replicas_caught_up"],
    )?;
    writeln!(
        md,
        "Seed 001 on two nodes: PersistToMajority mean {:.1} ms = {:.3} of KV-Engine's 614 ms; \
         {:.2}x the None ceiling's ops/s.",
        num(&persist, "mean_us") / 1e3,
        num(&persist, "mean_us") / 1e3 / 614.0,
        num(&persist, "items_per_sec") / num(&ceiling, "items_per_sec"),
    )?;
    print!("{md}");
    std::fs::write(out_dir.join("cluster.md"), &md)?;
    println!("wrote {}", path.display());
    Ok(())
}
