//! `epkv-fight`: a pillowfight-style load generator for durable writes.
//!
//! It reproduces the seed's `cbc-pillowfight` persistTo run (docs/benchmarks.md,
//! "Persistence and durability"): N connections, each a tokio task with one request
//! outstanding (batch size 1), over pre-loaded keys, 100% SET of random values at a chosen
//! durability level (frame info id 1; PersistToMajority is level 3 and is answered only
//! once the write is on disk). Latency goes into an [`hdrhistogram::Histogram`] in
//! microseconds and is printed as pillowfight does (range, cumulative %, count, bar) with
//! mean/p50/p99/p99.9 and ops/s; the last line is `fight-result: {json}` for xtask.
//! A SET that meets another connection's SyncWrite of its key (SyncWriteInProgress, or
//! TMPFAIL without XERROR) is retried after a 1-32 ms backoff, as the SDKs retry it, and
//! timed as one operation.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use epkv_client::{Client, StoreOptions};
use epkv_executor::{Clock, SystemClock};
use epkv_protocol::{DurabilityRequirement, Status};
use epkv_types::DurabilityLevel;
use hdrhistogram::Histogram;
use serde_json::json;

/// The durability level asked of every measured SET.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Durability {
    /// Plain SET, acknowledged from memory.
    None,
    /// Majority (level 1): on one node, acknowledged once in memory.
    Majority,
    /// PersistToMajority (level 3): acknowledged once persisted.
    PersistMajority,
}

impl Durability {
    /// The name used in reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Durability::None => "none",
            Durability::Majority => "majority",
            Durability::PersistMajority => "persist-majority",
        }
    }

    fn level(self) -> Option<DurabilityLevel> {
        match self {
            Durability::None => None,
            Durability::Majority => Some(DurabilityLevel::Majority),
            Durability::PersistMajority => Some(DurabilityLevel::PersistToMajority),
        }
    }
}

/// Command-line options of `epkv-fight`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "epkv-fight",
    about = "Durable-write latency under concurrency (pillowfight-style)"
)]
pub struct FightOptions {
    /// Server address (start one with `epkv-server --port 0` or use `cargo xtask bench persistence`).
    /// A node of a cluster works too: the cluster map it serves names the others, and
    /// each key goes to the node holding its vBucket's active copy.
    #[arg(long, default_value = "127.0.0.1:11210")]
    pub addr: String,
    /// Concurrent connections, each with one request outstanding.
    #[arg(long, default_value_t = 2000)]
    pub connections: usize,
    /// Keys pre-loaded before the measured run and then overwritten at random.
    #[arg(long, default_value_t = 200_000)]
    pub keys: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 512)]
    pub value_bytes: usize,
    /// Seconds to run (the run stops at whichever of --secs / --ops comes first).
    #[arg(long, default_value_t = 10)]
    pub secs: u64,
    /// Stop after this many measured operations in all (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub ops: u64,
    /// Durability level of the measured SETs.
    #[arg(long, value_enum, default_value_t = Durability::PersistMajority)]
    pub durability: Durability,
    /// Durability timeout sent with each SET, in milliseconds (1..=65534).
    #[arg(long, default_value_t = 60_000)]
    pub durability_timeout_ms: u64,
    /// Skip pre-loading (the keys are already there).
    #[arg(long)]
    pub no_populate: bool,
    /// Seed of the key and value generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// The summary of one run.
#[derive(Debug, Clone)]
pub struct FightResult {
    /// Successful measured operations.
    pub ops: u64,
    /// Operations answered with an error status.
    pub errors: u64,
    /// Wall time of the measured phase in seconds.
    pub secs: f64,
    /// Latency histogram in microseconds (successful operations).
    pub hist: Histogram<u64>,
}

impl FightResult {
    /// Successful operations per second.
    #[must_use]
    pub fn items_per_sec(&self) -> f64 {
        if self.secs > 0.0 {
            self.ops as f64 / self.secs
        } else {
            0.0
        }
    }

    /// The machine-readable summary (latencies in microseconds).
    #[must_use]
    pub fn to_json(&self, opts: &FightOptions) -> serde_json::Value {
        json!({
            "connections": opts.connections,
            "keys": opts.keys,
            "value_bytes": opts.value_bytes,
            "durability": opts.durability.name(),
            "ops": self.ops,
            "errors": self.errors,
            "secs": self.secs,
            "items_per_sec": self.items_per_sec(),
            "mean_us": self.hist.mean(),
            "p50_us": self.hist.value_at_quantile(0.50),
            "p99_us": self.hist.value_at_quantile(0.99),
            "p999_us": self.hist.value_at_quantile(0.999),
            "max_us": self.hist.max(),
        })
    }
}

/// Formats `us` microseconds with the unit pillowfight would use (us, ms or s).
#[must_use]
pub fn fmt_us(us: u64) -> String {
    if us < 1_000 {
        format!("{us}us")
    } else if us < 1_000_000 {
        format!("{:.1}ms", us as f64 / 1e3)
    } else {
        format!("{:.2}s", us as f64 / 1e6)
    }
}

/// Bucket bounds in microseconds: 1, 2, 5, 10, 20, 50, ... up to past `max`.
fn bucket_bounds(max: u64) -> Vec<u64> {
    let mut bounds = vec![0];
    let mut decade = 1u64;
    'outer: loop {
        for m in [1, 2, 5] {
            let b = decade.saturating_mul(m);
            bounds.push(b);
            if b > max || b == u64::MAX {
                break 'outer;
            }
        }
        decade = decade.saturating_mul(10);
    }
    bounds
}

/// Prints the histogram as pillowfight does: one line per non-empty range
/// `[lo - hi)`, its cumulative percentage, its count and a bar scaled to the fullest
/// range (`width` characters).
#[must_use]
pub fn format_histogram(hist: &Histogram<u64>, width: usize) -> String {
    let mut out = String::new();
    let total = hist.len();
    if total == 0 {
        out.push_str("(no samples)\n");
        return out;
    }
    let bounds = bucket_bounds(hist.max());
    let counts: Vec<(u64, u64, u64)> = bounds
        .windows(2)
        .map(|w| {
            let (lo, hi) = (w[0], w[1]);
            let count = hist
                .iter_recorded()
                .filter(|v| {
                    let x = v.value_iterated_to();
                    x >= lo && x < hi
                })
                .map(|v| v.count_at_value())
                .sum();
            (lo, hi, count)
        })
        .collect();
    let fullest = counts.iter().map(|c| c.2).max().unwrap_or(1).max(1);
    let mut cumulative = 0u64;
    for (lo, hi, count) in counts {
        if count == 0 {
            continue;
        }
        cumulative += count;
        let bar = usize::try_from(count * width as u64 / fullest)
            .unwrap_or(width)
            .max(1);
        let _ = writeln!(
            out,
            "[{:>7} - {:>7}] {:>7.3}% {:>9} |{}",
            fmt_us(lo),
            fmt_us(hi),
            cumulative as f64 * 100.0 / total as f64,
            count,
            "#".repeat(bar)
        );
    }
    out
}

/// The summary lines printed under the histogram.
#[must_use]
pub fn format_summary(result: &FightResult) -> String {
    let h = &result.hist;
    format!(
        "ops {} errors {} in {:.2}s: {:.0} ops/s; latency mean {} p50 {} p99 {} p99.9 {} max {}\n",
        result.ops,
        result.errors,
        result.secs,
        result.items_per_sec(),
        fmt_us(h.mean().round() as u64),
        fmt_us(h.value_at_quantile(0.50)),
        fmt_us(h.value_at_quantile(0.99)),
        fmt_us(h.value_at_quantile(0.999)),
        fmt_us(h.max()),
    )
}

/// A xorshift64* generator: keys and value offsets only need to be cheap and spread out,
/// not cryptographic, and this keeps every task's stream reproducible from `--seed`.
#[derive(Debug, Clone)]
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

/// Where each key goes: the nodes of the cluster map and the node of each vBucket's
/// active copy (one node holding everything for a single server).
#[derive(Debug, Clone)]
pub struct Router {
    /// KV `host:port` of each node, as the map's `serverList` names them.
    pub nodes: Vec<String>,
    /// Per vBucket, the index in `nodes` of its active copy.
    pub active: Vec<usize>,
}

impl Router {
    /// Reads the cluster map from `addr`.
    ///
    /// # Errors
    /// Connection errors, or a map without a server list or vBucket map.
    pub async fn discover(addr: &str) -> Result<Router, String> {
        let mut c = Client::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let r = c
            .get_cluster_config(None)
            .await
            .map_err(|e| format!("cluster map: {e}"))?;
        let map: serde_json::Value =
            serde_json::from_slice(&r.value).map_err(|e| format!("cluster map: {e}"))?;
        let servers = map["vBucketServerMap"]["serverList"]
            .as_array()
            .ok_or("cluster map without a server list")?;
        let rows = map["vBucketServerMap"]["vBucketMap"]
            .as_array()
            .ok_or("cluster map without a vBucket map")?;
        let nodes: Vec<String> = servers
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect();
        if nodes.len() <= 1 {
            // A single node: the address the caller gave (the map may name another
            // interface).
            return Ok(Router {
                nodes: vec![addr.to_owned()],
                active: vec![0; rows.len().max(1)],
            });
        }
        let active = rows
            .iter()
            .map(|row| {
                row[0]
                    .as_i64()
                    .and_then(|n| usize::try_from(n).ok())
                    .unwrap_or(0)
            })
            .collect();
        Ok(Router { nodes, active })
    }

    /// The node of `key`'s active copy.
    #[must_use]
    pub fn node_of(&self, key: &[u8]) -> usize {
        let n = u16::try_from(self.active.len()).unwrap_or(1).max(1);
        let vb = epkv_types::vbucket_for_key(key, n);
        self.active.get(usize::from(vb.0)).copied().unwrap_or(0)
    }
}

/// The key of index `i` (fixed width, as pillowfight's keys).
#[must_use]
pub fn key_of(i: u64) -> Vec<u8> {
    format!("fight{i:014}").into_bytes()
}

fn new_hist() -> Result<Histogram<u64>, String> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).map_err(|e| e.to_string())
}

/// Pre-loads `opts.keys` keys with plain SETs over up to 32 connections.
///
/// # Errors
/// Fails on a connection error or a non-success status.
pub async fn populate(opts: &FightOptions, pool: Arc<Vec<u8>>) -> Result<(), String> {
    let tasks = opts.connections.clamp(1, 32) as u64;
    let router = Arc::new(Router::discover(&opts.addr).await?);
    let mut handles = Vec::new();
    for t in 0..tasks {
        let router = Arc::clone(&router);
        let (keys, value_bytes) = (opts.keys, opts.value_bytes);
        let pool = Arc::clone(&pool);
        handles.push(tokio::spawn(async move {
            let mut conns = Vec::with_capacity(router.nodes.len());
            for addr in &router.nodes {
                conns.push(
                    Client::connect(addr.as_str())
                        .await
                        .map_err(|e| format!("connect {addr}: {e}"))?,
                );
            }
            let mut i = t;
            while i < keys {
                let off = usize::try_from(i * 7 % (pool.len() - value_bytes) as u64).unwrap_or(0);
                let c = &mut conns[router.node_of(&key_of(i))];
                let r = c
                    .set(
                        &key_of(i),
                        &pool[off..off + value_bytes],
                        StoreOptions::new(),
                    )
                    .await
                    .map_err(|e| format!("populate: {e}"))?;
                if r.status() != Some(Status::Success) {
                    return Err(format!("populate: status {:#x}", r.status_raw));
                }
                i += tasks;
            }
            Ok::<(), String>(())
        }));
    }
    for h in handles {
        h.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// Runs the measured phase: `opts.connections` writers until `--secs` or `--ops`.
///
/// # Errors
/// Fails if a connection cannot be made or breaks.
pub async fn run(opts: &FightOptions, pool: Arc<Vec<u8>>) -> Result<FightResult, String> {
    let durability = opts.durability.level().map(|level| DurabilityRequirement {
        level,
        timeout: Some(Duration::from_millis(
            opts.durability_timeout_ms.clamp(1, 65_534),
        )),
    });
    let store = StoreOptions {
        durability,
        ..StoreOptions::new()
    };
    // Connect everyone first so that connection set-up is not measured. Connection n
    // goes to node n mod nodes and writes only keys whose active copy is there.
    let router = Arc::new(Router::discover(&opts.addr).await?);
    let mut clients = Vec::with_capacity(opts.connections);
    for n in 0..opts.connections {
        let addr = &router.nodes[n % router.nodes.len()];
        clients.push(
            Client::connect(addr.as_str())
                .await
                .map_err(|e| format!("connect {addr}: {e}"))?,
        );
    }
    let start = SystemClock.now();
    let end = start + Duration::from_secs(opts.secs);
    let budget = Arc::new(std::sync::atomic::AtomicU64::new(if opts.ops == 0 {
        u64::MAX
    } else {
        opts.ops
    }));
    let mut handles = Vec::with_capacity(clients.len());
    for (n, mut c) in clients.into_iter().enumerate() {
        let node = n % router.nodes.len();
        let router = Arc::clone(&router);
        let pool = Arc::clone(&pool);
        let budget = Arc::clone(&budget);
        let (keys, value_bytes) = (opts.keys.max(1), opts.value_bytes);
        let mut rng = XorShift::new(opts.seed.wrapping_add(n as u64));
        handles.push(tokio::spawn(async move {
            let mut hist = new_hist()?;
            let (mut ops, mut errors) = (0u64, 0u64);
            let span = (pool.len() - value_bytes) as u64;
            loop {
                if SystemClock.now() >= end {
                    break;
                }
                let took = budget.fetch_update(
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                    |b| b.checked_sub(1),
                );
                if took.is_err() {
                    break;
                }
                let key = loop {
                    let k = key_of(rng.below(keys));
                    if router.node_of(&k) == node {
                        break k;
                    }
                };
                let off = usize::try_from(rng.below(span)).unwrap_or(0);
                let t0 = SystemClock.now();
                let mut r = c
                    .set(&key, &pool[off..off + value_bytes], store)
                    .await
                    .map_err(|e| format!("set: {e}"))?;
                // Another connection's SyncWrite of the same key is in flight
                // (SyncWriteInProgress, or TMPFAIL for a client without XERROR): retried
                // after a pause, as the SDKs retry it, and timed as one operation.
                let mut pause = Duration::from_millis(1);
                while matches!(
                    r.status(),
                    Some(Status::SyncWriteInProgress | Status::Etmpfail)
                ) && SystemClock.now() < end
                {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(32));
                    r = c
                        .set(&key, &pool[off..off + value_bytes], store)
                        .await
                        .map_err(|e| format!("set: {e}"))?;
                }
                let us = u64::try_from((SystemClock.now() - t0).as_micros()).unwrap_or(u64::MAX);
                if r.status() == Some(Status::Success) {
                    ops += 1;
                    hist.saturating_record(us.max(1));
                } else {
                    errors += 1;
                }
            }
            Ok::<_, String>((hist, ops, errors))
        }));
    }
    let mut hist = new_hist()?;
    let (mut ops, mut errors) = (0, 0);
    for h in handles {
        let (h, o, e) = h.await.map_err(|e| e.to_string())??;
        hist.add(&h).map_err(|e| e.to_string())?;
        ops += o;
        errors += e;
    }
    let secs = (SystemClock.now() - start).as_secs_f64();
    Ok(FightResult {
        ops,
        errors,
        secs,
        hist,
    })
}

/// Random bytes that values are sliced from (1 MiB plus one value).
#[must_use]
pub fn value_pool(value_bytes: usize, seed: u64) -> Vec<u8> {
    let mut rng = XorShift::new(seed ^ 0xA5A5);
    (0..(1 << 20) + value_bytes + 1)
        .map(|_| (rng.next() >> 56) as u8)
        .collect()
}

/// The soft open-file limit of this process from `/proc/self/limits`, if readable (2000
/// connections need more than the common default of 1024; raise it with `ulimit -n`).
#[must_use]
pub fn nofile_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_with_defaults_and_overrides() {
        let o = FightOptions::try_parse_from(["epkv-fight"]).unwrap();
        assert_eq!(o.connections, 2000);
        assert_eq!(o.keys, 200_000);
        assert_eq!(o.value_bytes, 512);
        assert_eq!(o.durability, Durability::PersistMajority);
        let o = FightOptions::try_parse_from([
            "epkv-fight",
            "--connections",
            "1",
            "--durability",
            "none",
            "--secs",
            "3",
            "--addr",
            "127.0.0.1:5",
            "--ops",
            "10",
        ])
        .unwrap();
        assert_eq!(o.connections, 1);
        assert_eq!(o.durability, Durability::None);
        assert_eq!(o.secs, 3);
        assert_eq!(o.ops, 10);
        assert_eq!(o.addr, "127.0.0.1:5");
        assert!(FightOptions::try_parse_from(["epkv-fight", "--durability", "bogus"]).is_err());
        assert_eq!(
            Durability::Majority.level(),
            Some(DurabilityLevel::Majority)
        );
        assert_eq!(Durability::None.level(), None);
    }

    #[test]
    fn units_switch_at_thousands() {
        assert_eq!(fmt_us(999), "999us");
        assert_eq!(fmt_us(1_500), "1.5ms");
        assert_eq!(fmt_us(748_000), "748.0ms");
        assert_eq!(fmt_us(2_500_000), "2.50s");
    }

    #[test]
    fn histogram_has_ranges_cumulative_counts_and_bars() {
        let mut h = new_hist().unwrap();
        for _ in 0..3 {
            h.record(3).unwrap();
        }
        h.record(15).unwrap();
        for _ in 0..6 {
            h.record(4_000).unwrap();
        }
        let text = format_histogram(&h, 12);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0], "[    2us -     5us]  30.000%         3 |######");
        assert_eq!(lines[1], "[   10us -    20us]  40.000%         1 |##");
        assert_eq!(
            lines[2],
            "[  2.0ms -   5.0ms] 100.000%         6 |############"
        );
        assert_eq!(format_histogram(&new_hist().unwrap(), 10), "(no samples)\n");
    }

    #[test]
    fn summary_and_json_report_the_quantiles() {
        let mut hist = new_hist().unwrap();
        for v in 1..=1000u64 {
            hist.record(v * 1000).unwrap();
        }
        let r = FightResult {
            ops: 1000,
            errors: 2,
            secs: 2.0,
            hist,
        };
        let s = format_summary(&r);
        assert!(
            s.starts_with("ops 1000 errors 2 in 2.00s: 500 ops/s"),
            "{s}"
        );
        let o = FightOptions::try_parse_from(["epkv-fight"]).unwrap();
        let j = r.to_json(&o);
        assert_eq!(j["items_per_sec"], 500.0);
        let p50 = j["p50_us"].as_u64().unwrap();
        assert!((499_000..=501_000).contains(&p50), "{p50}");
        assert_eq!(j["durability"], "persist-majority");
    }

    #[test]
    fn bounds_cover_the_maximum_and_keys_are_fixed_width() {
        let b = bucket_bounds(700);
        assert_eq!(b, vec![0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]);
        assert_eq!(key_of(7).len(), key_of(123_456).len());
        let mut r = XorShift::new(3);
        assert!((0..100).all(|_| r.below(10) < 10));
        assert_eq!(value_pool(512, 1).len(), (1 << 20) + 513);
    }
}
