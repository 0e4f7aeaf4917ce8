//! `cargo xtask bench memory`: the memory benchmarks of issue 18, each against its peers
//! measured in the same run, since the machines are shared and noisy.
//!
//! - `per-item`: RSS growth per item of epkv-server (memory-only), memcached 1.6 and
//!   Redis 7 for the same small items ([`per_item`]).
//! - `quota`: SET throughput of a persistent bucket whose data set is 4x its quota, against
//!   one whose quota holds everything ([`quota`]).
//! - `bgfetch`: GETs that need a background fetch from a cold page cache, against raw
//!   `pread`s and `fio` on the same disk ([`bgfetch`]).
//!
//! Servers run on 127.0.0.1, each fresh with its own temporary data directory under
//! target/xtask/tmp (removed afterwards), one at a time. Results go to
//! `target/bench/memory.json` (rows as in benchmarks.md "Machine-readable results") and
//! `target/bench/memory.md`; server logs to `target/bench/memory-*.log`.

mod bgfetch;
mod cgroup;
mod per_item;
mod quota;
mod snappy;
pub(crate) mod wire;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::process;
use crate::util::{self, Stopwatch};

/// The benches, in the order they run.
const BENCHES: [&str; 4] = ["per-item", "quota", "bgfetch", "snappy"];

/// Options of `cargo xtask bench memory`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct MemoryOptions {
    /// Smaller runs, for routine use (about a minute): 200,000 items per server in
    /// `per-item`, 100,000 keys and 8 s in `quota` and `bgfetch`, 300 single reads.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Benches to run, comma separated (default: all, in this order).
    #[arg(long, value_delimiter = ',', value_parser = BENCHES)]
    pub(crate) only: Option<Vec<String>>,
    /// Items loaded into each server by `per-item` (default 1,000,000; 200,000 with --quick).
    #[arg(long)]
    pub(crate) items: Option<u64>,
    /// Memory of each server in `per-item`, in MiB (epkv --memory-quota, memcached -m):
    /// enough that nothing is evicted.
    #[arg(long, default_value_t = 1024)]
    pub(crate) memory_mib: u64,
    /// Keys written by `quota` (default 400,000; 100,000 with --quick); 512-byte values.
    #[arg(long)]
    pub(crate) write_keys: Option<u64>,
    /// Seconds of random writes in `quota`, and of concurrent reads by epkv and by fio in
    /// `bgfetch` (default 20; 8 with --quick).
    #[arg(long)]
    pub(crate) secs: Option<u64>,
    /// Rounds of `quota`, alternating which case goes first; figures are medians (default
    /// 3; 1 with --quick).
    #[arg(long)]
    pub(crate) rounds: Option<usize>,
    /// Items loaded by `bgfetch` (default 400,000; 100,000 with --quick); 512-byte values.
    #[arg(long)]
    pub(crate) fetch_items: Option<u64>,
    /// Reads timed one at a time by `bgfetch`, of each kind (default 1000; 300 with --quick).
    #[arg(long)]
    pub(crate) samples: Option<usize>,
    /// Reads in flight in `bgfetch`'s concurrent run (epkv connections, fio jobs).
    #[arg(long, default_value_t = 16)]
    pub(crate) concurrency: usize,
    /// Memory (MiB) that epkv, and then fio, may newly take during `bgfetch`'s concurrent
    /// run, page cache included: each runs in a memory cgroup with this limit, so that
    /// the reads go to the disk, not to a page cache larger than the data (0: no cgroup).
    #[arg(long, default_value_t = 32)]
    pub(crate) page_cache_mib: u64,
    /// Documents loaded by `snappy` (default 200,000; 50,000 with --quick); about 1 KiB of
    /// JSON each.
    #[arg(long)]
    pub(crate) snappy_items: Option<u64>,
    /// Use this epkv-server binary instead of building target/release/epkv-server.
    #[arg(long)]
    pub(crate) epkv_bin: Option<PathBuf>,
}

/// What one bench reports: JSON rows and a markdown section.
#[derive(Debug, Default)]
pub(crate) struct Section {
    pub(crate) rows: Vec<serde_json::Value>,
    pub(crate) md: String,
}

/// Runs the chosen benches and writes the report files.
pub(crate) fn bench_memory(opts: &MemoryOptions) -> Result<()> {
    let wanted: Vec<&str> = match &opts.only {
        Some(list) => BENCHES
            .into_iter()
            .filter(|b| list.iter().any(|w| w == b))
            .collect(),
        None => BENCHES.to_vec(),
    };
    let mut tools = vec![];
    if wanted.contains(&"per-item") {
        tools.extend(["memcached", "redis-server"]);
    }
    if wanted.contains(&"bgfetch") {
        tools.push("fio");
    }
    for tool in tools {
        if !util::on_path(tool) {
            bail!(
                "{tool} is not installed; `apt-get install -y memcached redis-server fio` \
                 (Debian) installs what this bench needs"
            );
        }
    }
    let bin = process::release_server_bin(opts.epkv_bin.as_ref())?;
    let out_dir = util::target_dir().join("bench");
    std::fs::create_dir_all(&out_dir)?;
    let total = Stopwatch::start();
    let mut sections = Vec::new();
    for bench in wanted {
        let watch = Stopwatch::start();
        let section = match bench {
            "per-item" => {
                let items = opts
                    .items
                    .unwrap_or(if opts.quick { 200_000 } else { 1_000_000 })
                    .max(1);
                per_item::run(&bin, items, opts.memory_mib, &out_dir)?
            }
            "quota" => {
                let keys = opts
                    .write_keys
                    .unwrap_or(if opts.quick { 100_000 } else { 400_000 })
                    .max(1);
                let secs = opts.secs.unwrap_or(if opts.quick { 8 } else { 20 }).max(1);
                let rounds = opts.rounds.unwrap_or(if opts.quick { 1 } else { 3 }).max(1);
                quota::run(&bin, keys, secs, rounds, &out_dir)?
            }
            "bgfetch" => {
                let settings = bgfetch::Settings {
                    items: opts
                        .fetch_items
                        .unwrap_or(if opts.quick { 100_000 } else { 400_000 })
                        .max(1),
                    samples: opts
                        .samples
                        .unwrap_or(if opts.quick { 300 } else { 1000 })
                        .max(1),
                    concurrency: opts.concurrency.max(1),
                    secs: opts.secs.unwrap_or(if opts.quick { 8 } else { 20 }).max(1),
                    page_cache_mib: opts.page_cache_mib,
                };
                bgfetch::run(&bin, settings, &out_dir)?
            }
            "snappy" => {
                let items = opts
                    .snappy_items
                    .unwrap_or(if opts.quick { 50_000 } else { 200_000 })
                    .max(1000);
                let secs = opts.secs.unwrap_or(if opts.quick { 4 } else { 10 }).max(1);
                snappy::run(&bin, items, secs, &out_dir)?
            }
            other => bail!("unknown bench {other}"),
        };
        println!("\n{}", section.md);
        eprintln!(
            "bench memory {bench}: {}",
            util::fmt_duration(watch.elapsed())
        );
        sections.push(section);
    }
    let rows: Vec<serde_json::Value> = sections.iter().flat_map(|s| s.rows.clone()).collect();
    let json_path = out_dir.join("memory.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&rows)?)?;
    let mut md = format!("{}\n", setup_line());
    for s in &sections {
        md.push('\n');
        md.push_str(&s.md);
    }
    let md_path = out_dir.join("memory.md");
    std::fs::write(&md_path, &md)?;
    println!(
        "bench memory: {} rows in {}; wrote {} and {}",
        rows.len(),
        util::fmt_duration(total.elapsed()),
        json_path.display(),
        md_path.display()
    );
    Ok(())
}

/// Stops a server; a slow or unclean stop is reported, not fatal (the figures are taken).
pub(crate) fn stop(server: process::ServerProcess) {
    let name = server.name;
    if let Err(e) = server.stop() {
        eprintln!("warning: {name}: {e:#}");
    }
}

/// Writes back dirty pages and drops the page cache (`sync; echo 3 >
/// /proc/sys/vm/drop_caches`, which needs root). Returns false, with a warning, if it
/// could not.
pub(crate) fn drop_caches() -> bool {
    let synced = Command::new("sync").status().is_ok_and(|s| s.success());
    match std::fs::write("/proc/sys/vm/drop_caches", "3") {
        Ok(()) if synced => true,
        Ok(()) => {
            eprintln!("warning: sync failed; the page cache may still hold dirty pages");
            false
        }
        Err(e) => {
            eprintln!(
                "warning: cannot drop the page cache ({e}; needs root): reads may be served \
                 from memory, and the rows say cold: false"
            );
            false
        }
    }
}

/// The `q` quantile (0..=1) of `sorted` by the nearest-rank method; NaN when empty.
pub(crate) fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (sorted.len() as f64 * q).ceil() as usize;
    sorted[rank.saturating_sub(1).min(sorted.len() - 1)]
}

/// A stat as a number.
pub(crate) fn stat<T>(stats: &BTreeMap<String, String>, name: &str) -> Result<T>
where
    T: std::str::FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    stats
        .get(name)
        .with_context(|| format!("no stat {name}"))?
        .parse()
        .with_context(|| format!("stat {name} is not a number"))
}

/// The benches' random numbers: keys and offsets, reproducible from a seed.
pub(crate) type Rng = rand::rngs::StdRng;

/// A generator seeded with `seed`.
pub(crate) fn rng(seed: u64) -> Rng {
    rand::SeedableRng::seed_from_u64(seed)
}

/// Uniform in `0..n` (0 when `n` is 0).
pub(crate) fn below(rng: &mut Rng, n: u64) -> u64 {
    if n == 0 {
        0
    } else {
        rand::Rng::gen_range(rng, 0..n)
    }
}

/// `len` pseudo-random bytes that values are sliced from.
pub(crate) fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; len];
    rand::RngCore::fill_bytes(&mut rng(seed), &mut out);
    out
}

/// The machine, the peers' versions and the commit, for the report.
fn setup_line() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':').map(|(_, v)| v.trim().to_owned()))
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let version = |cmd: &[&str]| {
        util::output(Command::new(cmd[0]).args(&cmd[1..]))
            .map(|s| s.lines().next().unwrap_or_default().trim().to_owned())
            .unwrap_or_else(|_| format!("{}: not installed", cmd[0]))
    };
    format!(
        "{cpu}, {} cores, Linux {}; {}; {}; epkv {}.",
        util::cores(),
        version(&["uname", "-r"]),
        version(&["memcached", "-V"]),
        version(&["redis-server", "--version"]),
        version(&["git", "rev-parse", "--short", "HEAD"]),
    )
}

/// Parses `VmRSS:   1234 kB` out of `/proc/<pid>/status` into bytes.
pub(crate) fn parse_vmrss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The resident set size of process `pid`, in bytes.
pub(crate) fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    parse_vmrss(&status).with_context(|| format!("no VmRSS in /proc/{pid}/status"))
}

/// Waits at least a second, then until two readings of the RSS 250 ms apart differ by
/// less than 0.2% (background rehashing, deferred frees), at most 10 s; returns the last.
pub(crate) fn settle_rss(pid: u32) -> Result<u64> {
    std::thread::sleep(Duration::from_secs(1));
    let watch = Stopwatch::start();
    let mut last = rss_bytes(pid)?;
    while watch.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(250));
        let now = rss_bytes(pid)?;
        if now.abs_diff(last) * 500 < last {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmrss_parses_to_bytes() {
        let status =
            "Name:\tepkv-server\nVmPeak:\t  9999 kB\nVmRSS:\t   2048 kB\nRssAnon:\t 1 kB\n";
        assert_eq!(parse_vmrss(status), Some(2 << 20));
        assert_eq!(parse_vmrss("Name: x\n"), None);
        assert!(rss_bytes(std::process::id()).unwrap() > 0);
    }
}
