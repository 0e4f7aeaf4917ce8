//! `cargo xtask bench frontend`: epkv-server against memcached 1.6, both driven by
//! libmemcached's memaslap (Debian: `memcaslap`) over the binary protocol with identical
//! settings, one server at a time on this machine.
//!
//! For each case (connections × workload) both servers are started fresh, epkv first, and
//! loaded for the same time. Reported per run: ops/s from memaslap's closing line, and the
//! server's CPU microseconds per operation (utime + stime from `/proc/<pid>/stat` over the
//! run, divided by the operations memaslap completed). CPU per op is the steadier number
//! when client and server share two cores. Results go to `target/bench/frontend.json` (rows
//! as in benchmarks.md "Machine-readable results") and `target/bench/frontend.md`.
//!
//! memcached does not persist, so by default epkv runs memory-only (`--persistence false`,
//! a Couchbase ephemeral bucket) and the two servers do the same work. With
//! `--epkv-persistence` epkv runs as shipped, persistence included (its flusher writes to a
//! data directory of its own under target/xtask/tmp, removed after each run), to show
//! what persisting every write costs on top.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::memcapable::tempdir;
use crate::process::{self, ServerProcess};
use crate::util::{self, Stopwatch};

/// Options of `cargo xtask bench frontend`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct FrontendOptions {
    /// About 1-2 minutes in all: 2 rounds of 5 s runs (default: 5 rounds of 10 s, about 9
    /// minutes).
    #[arg(long)]
    pub(crate) quick: bool,
    /// Seconds per run (overrides --quick).
    #[arg(long)]
    pub(crate) secs: Option<u64>,
    /// Rounds over every case; each row reports the median (overrides --quick).
    #[arg(long)]
    pub(crate) rounds: Option<usize>,
    /// Server worker threads for both servers (default: the number of cores).
    #[arg(long)]
    pub(crate) server_threads: Option<usize>,
    /// memaslap client threads (default: the number of cores).
    #[arg(long)]
    pub(crate) client_threads: Option<usize>,
    /// Connection counts to run, comma separated.
    #[arg(long, value_delimiter = ',', default_values_t = [16usize, 64])]
    pub(crate) connections: Vec<usize>,
    /// Memory for each server in MiB (memcached -m, epkv --memory-quota).
    #[arg(long, default_value_t = 1024)]
    pub(crate) memory_mib: u64,
    /// Use this epkv-server binary instead of building target/release/epkv-server.
    #[arg(long)]
    pub(crate) epkv_bin: Option<PathBuf>,
    /// Run epkv with persistence on (as shipped) instead of memory-only like memcached.
    #[arg(long)]
    pub(crate) epkv_persistence: bool,
    /// One more argument for epkv-server, for A/B runs of a setting (repeat it:
    /// `--epkv-arg=--output-buffer-limit --epkv-arg=4MiB`).
    #[arg(long = "epkv-arg", allow_hyphen_values = true)]
    pub(crate) epkv_args: Vec<String>,
    /// Run the pipelined 90/10 case instead (16 connections x 16 in flight, driven by
    /// epkv-pipeload) against memcached, epkv memory-only and epkv as shipped.
    #[arg(long)]
    pub(crate) pipelined: bool,
    /// With --pipelined: a second epkv-server binary measured in the same run (memory
    /// only and as shipped, in the same rotation as the others), for an A/B of a change;
    /// the report gives its ratios to the build under test
    #[arg(long, requires = "pipelined")]
    pub(crate) compare_bin: Option<PathBuf>,
}

/// A request mix, written as a memaslap configuration file.
#[derive(Debug, Clone, Copy)]
struct Workload {
    name: &'static str,
    set_fraction: f64,
}

const WORKLOADS: [Workload; 2] = [
    Workload {
        name: "set_100",
        set_fraction: 1.0,
    },
    Workload {
        name: "get_90_set_10",
        set_fraction: 0.1,
    },
];

/// Key length in bytes (memaslap keys are random printable strings).
const KEY_BYTES: usize = 16;
/// Value length in bytes, per the issue.
const VALUE_BYTES: usize = 512;

/// One measured run, or the median of several runs of the same case.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    workload: &'static str,
    connections: usize,
    implementation: &'static str,
    /// Operations memaslap completed (summed over rounds).
    ops: u64,
    /// Seconds memaslap ran (summed over rounds).
    secs: f64,
    /// Operations per second (median over rounds).
    items_per_sec: f64,
    /// Server CPU (user + system) microseconds per operation (median over rounds).
    cpu_us_per_op: f64,
    /// How many runs this row summarises.
    rounds: usize,
    server_threads: usize,
    client_threads: usize,
}

impl Row {
    /// Whether this run is of the case (workload, connections).
    fn is_case(&self, workload: &str, connections: usize) -> bool {
        self.workload == workload && self.connections == connections
    }

    fn to_json(&self) -> serde_json::Value {
        json!({
            "bench": format!("frontend/{}", self.workload),
            "params": {
                "connections": self.connections,
                "value_bytes": VALUE_BYTES,
                "key_bytes": KEY_BYTES,
                "server_threads": self.server_threads,
                "client_threads": self.client_threads,
                "client": "memaslap --binary",
            },
            "impl": self.implementation,
            "items_per_sec": self.items_per_sec,
            "ns_per_op": 1e9 / self.items_per_sec,
            "cpu_us_per_op": self.cpu_us_per_op,
            "rounds": self.rounds,
            "ops": self.ops,
            "secs": self.secs,
        })
    }
}

/// Folds the runs of each (workload, connections, implementation) into one row holding
/// the medians, in first-seen order.
pub(crate) fn summarise(runs: &[Row]) -> Vec<Row> {
    let mut out: Vec<Row> = Vec::new();
    for r in runs {
        let same =
            |o: &Row| o.is_case(r.workload, r.connections) && o.implementation == r.implementation;
        if out.iter().any(same) {
            continue;
        }
        let group: Vec<&Row> = runs.iter().filter(|o| same(o)).collect();
        out.push(Row {
            ops: group.iter().map(|g| g.ops).sum(),
            secs: group.iter().map(|g| g.secs).sum(),
            items_per_sec: util::median(group.iter().map(|g| g.items_per_sec).collect()),
            cpu_us_per_op: util::median(group.iter().map(|g| g.cpu_us_per_op).collect()),
            rounds: group.iter().map(|g| g.rounds).sum(),
            ..r.clone()
        });
    }
    out
}

/// epkv against memcached for one case, from the runs of each round taken back to back:
/// the medians of the per-round ratios, and in how many rounds epkv came out ahead. A
/// burst of load from elsewhere on the machine moves both runs of a round alike, so these
/// are steadier than the ratio of two medians.
#[derive(Debug)]
pub(crate) struct Paired {
    workload: &'static str,
    connections: usize,
    /// Rounds with both servers measured.
    rounds: usize,
    /// Median over rounds of epkv ops/s divided by memcached ops/s.
    ops_ratio: f64,
    /// Median over rounds of epkv CPU per op divided by memcached CPU per op.
    cpu_ratio: f64,
    /// Rounds in which epkv served more ops/s.
    ops_ahead: usize,
    /// Rounds in which epkv used less CPU per op.
    cpu_ahead: usize,
}

/// Pairs the k-th epkv run of each case with the k-th memcached run of the same case
/// (the two runs of round k), in first-seen case order.
pub(crate) fn pair_rounds(runs: &[Row]) -> Vec<Paired> {
    let mut out: Vec<Paired> = Vec::new();
    for r in runs {
        if out.iter().any(|p| r.is_case(p.workload, p.connections)) {
            continue;
        }
        let of = |implementation: &str| -> Vec<&Row> {
            runs.iter()
                .filter(|o| {
                    o.is_case(r.workload, r.connections) && o.implementation == implementation
                })
                .collect()
        };
        let pairs: Vec<(&Row, &Row)> = of("epkv").into_iter().zip(of("memcached")).collect();
        if pairs.is_empty() {
            continue;
        }
        out.push(Paired {
            workload: r.workload,
            connections: r.connections,
            rounds: pairs.len(),
            ops_ratio: util::median(
                pairs
                    .iter()
                    .map(|(e, m)| e.items_per_sec / m.items_per_sec)
                    .collect(),
            ),
            cpu_ratio: util::median(
                pairs
                    .iter()
                    .map(|(e, m)| e.cpu_us_per_op / m.cpu_us_per_op)
                    .collect(),
            ),
            ops_ahead: pairs
                .iter()
                .filter(|(e, m)| e.items_per_sec > m.items_per_sec)
                .count(),
            cpu_ahead: pairs
                .iter()
                .filter(|(e, m)| e.cpu_us_per_op < m.cpu_us_per_op)
                .count(),
        });
    }
    out
}

/// Writes a memaslap `-F` configuration file for `w`.
fn memaslap_config(w: Workload) -> String {
    format!(
        "key\n{KEY_BYTES} {KEY_BYTES} 1\nvalue\n{VALUE_BYTES} {VALUE_BYTES} 1\ncmd\n0 {:.2}\n1 {:.2}\n",
        w.set_fraction,
        1.0 - w.set_fraction
    )
}

/// Parses memaslap's closing `Run time: 5.0s Ops: 294323 TPS: 58858 ...` line into
/// (operations, seconds).
pub(crate) fn parse_memaslap(text: &str) -> Option<(u64, f64)> {
    let line = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with("Run time:"))?;
    let mut words = line.split_whitespace();
    let mut secs = None;
    let mut ops = None;
    while let Some(w) = words.next() {
        match w {
            "time:" => secs = words.next()?.trim_end_matches('s').parse().ok(),
            "Ops:" => ops = words.next()?.parse().ok(),
            _ => {}
        }
    }
    Some((ops?, secs?))
}

/// Runs the whole comparison and writes the report files.
pub(crate) fn bench_frontend(opts: &FrontendOptions) -> Result<()> {
    if opts.pipelined {
        return crate::bench_pipelined::bench_pipelined(opts);
    }
    for tool in ["memcaslap", "memcached"] {
        if !util::on_path(tool) {
            bail!("{tool} is not installed; run `cargo xtask deps`");
        }
    }
    let secs = opts.secs.unwrap_or(if opts.quick { 5 } else { 10 });
    let rounds = opts.rounds.unwrap_or(if opts.quick { 2 } else { 5 }).max(1);
    let server_threads = opts.server_threads.unwrap_or_else(util::cores);
    let client_threads = opts.client_threads.unwrap_or_else(util::cores);
    let bin = process::release_server_bin(opts.epkv_bin.as_ref())?;
    let out_dir = util::target_dir().join("bench");
    std::fs::create_dir_all(&out_dir)?;
    let ticks = process::clock_ticks_per_sec() as f64;
    let mut rows = Vec::new();
    let total = Stopwatch::start();
    for &conns in &opts.connections {
        if conns < client_threads {
            bail!("memaslap needs at least as many connections ({conns}) as threads");
        }
    }
    // Rounds interleave the servers case by case, and alternate which goes first, so
    // that a burst of load from elsewhere on the machine hits both alike.
    for round in 0..rounds {
        for &conns in &opts.connections {
            for w in WORKLOADS {
                let cfg = out_dir.join(format!("memaslap-{}.cfg", w.name));
                std::fs::write(&cfg, memaslap_config(w))?;
                let order = if round % 2 == 0 {
                    ["epkv", "memcached"]
                } else {
                    ["memcached", "epkv"]
                };
                for implementation in order {
                    let logs = out_dir.join(format!("{implementation}-{}-{conns}.log", w.name));
                    // epkv's data directory is its own and is removed once the run's
                    // server has stopped (it stays empty when memory-only).
                    let mut data = None;
                    let server = match implementation {
                        "epkv" => {
                            let data = data.insert(tempdir("bench-frontend")?).path();
                            let mut args: Vec<String> = vec![
                                "--persistence".into(),
                                opts.epkv_persistence.to_string(),
                                "--threads".into(),
                                server_threads.to_string(),
                                "--memory-quota".into(),
                                format!("{}MiB", opts.memory_mib),
                                "--max-connections".into(),
                                "4096".into(),
                                "--data-dir".into(),
                                data.display().to_string(),
                            ];
                            args.extend(opts.epkv_args.iter().cloned());
                            ServerProcess::start_epkv(&bin, &args, logs)?
                        }
                        _ => ServerProcess::start_memcached(
                            &[
                                "-t".into(),
                                server_threads.to_string(),
                                "-m".into(),
                                opts.memory_mib.to_string(),
                                "-c".into(),
                                "4096".into(),
                            ],
                            logs,
                        )?,
                    };
                    let row = measure(
                        server,
                        implementation,
                        w,
                        conns,
                        secs,
                        client_threads,
                        server_threads,
                        &cfg,
                        ticks,
                    )?;
                    drop(data);
                    println!(
                        "round {}/{rounds} {:<10} {:<14} conns={:<3} {:>10.0} ops/s {:>7.2} cpu_us/op",
                        round + 1,
                        row.implementation,
                        row.workload,
                        row.connections,
                        row.items_per_sec,
                        row.cpu_us_per_op
                    );
                    rows.push(row);
                }
            }
        }
    }
    let runs = rows.len();
    let paired = pair_rounds(&rows);
    let rows = summarise(&rows);
    let json_rows: Vec<_> = rows
        .iter()
        .map(|r| {
            let mut j = r.to_json();
            j["params"]["epkv_persistence"] = opts.epkv_persistence.into();
            if let Some(p) = paired
                .iter()
                .find(|p| r.implementation == "epkv" && r.is_case(p.workload, p.connections))
            {
                j["paired_ops_ratio"] = p.ops_ratio.into();
                j["paired_cpu_ratio"] = p.cpu_ratio.into();
            }
            j
        })
        .collect();
    let json_path = out_dir.join("frontend.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&json_rows)?)?;
    let mut md = markdown(&rows, &paired, secs, rounds)?;
    writeln!(
        md,
        "\nepkv {} (`--epkv-persistence` {}).",
        if opts.epkv_persistence {
            "persisted every write to its data directory, memcached does not persist"
        } else {
            "ran memory-only (`--persistence false`), as memcached does"
        },
        if opts.epkv_persistence { "on" } else { "off" }
    )?;
    let md_path = out_dir.join("frontend.md");
    std::fs::write(&md_path, &md)?;
    println!("\n{md}");
    println!(
        "bench frontend: {runs} runs in {}; wrote {} and {}",
        util::fmt_duration(total.elapsed()),
        json_path.display(),
        md_path.display()
    );
    Ok(())
}

#[expect(
    clippy::too_many_arguments,
    reason = "one call site; a struct would only rename them"
)]
fn measure(
    server: ServerProcess,
    implementation: &'static str,
    w: Workload,
    conns: usize,
    secs: u64,
    client_threads: usize,
    server_threads: usize,
    cfg: &Path,
    ticks_per_sec: f64,
) -> Result<Row> {
    let mut server = server;
    let mut cmd = Command::new("memcaslap");
    cmd.arg("--binary")
        .arg(format!("--servers={}", server.addr()))
        .arg(format!("--threads={client_threads}"))
        .arg(format!("--concurrency={conns}"))
        .arg(format!("--time={secs}s"))
        .arg(format!("--cfg_cmd={}", cfg.display()))
        .stdin(Stdio::null());
    let line = util::describe(&cmd);
    let cpu_before = process::cpu_ticks(server.pid())?;
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let limit = Duration::from_secs(secs + 60);
    let out = wait_with_limit(child, limit).with_context(|| format!("`{line}`"))?;
    let cpu_after = process::cpu_ticks(server.pid())?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let alive = server.is_running();
    let stopped = server.stop();
    if !alive {
        bail!("{implementation} died during `{line}`; memaslap said:\n{text}");
    }
    stopped?;
    if !out.status.success() {
        bail!("`{line}` failed with {}:\n{text}", out.status);
    }
    let (ops, run_secs) = parse_memaslap(&text)
        .with_context(|| format!("no `Run time:` line from `{line}`:\n{text}"))?;
    if ops == 0 || run_secs <= 0.0 {
        bail!("`{line}` completed no operations:\n{text}");
    }
    Ok(Row {
        workload: w.name,
        connections: conns,
        implementation,
        ops,
        secs: run_secs,
        items_per_sec: ops as f64 / run_secs,
        cpu_us_per_op: (cpu_after.saturating_sub(cpu_before)) as f64 / ticks_per_sec * 1e6
            / ops as f64,
        rounds: 1,
        server_threads,
        client_threads,
    })
}

fn wait_with_limit(
    mut child: std::process::Child,
    limit: Duration,
) -> Result<std::process::Output> {
    let watch = Stopwatch::start();
    // memaslap prints little, so its pipes cannot fill before it exits.
    while child.try_wait()?.is_none() {
        if watch.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            bail!("did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(child.wait_with_output()?)
}

/// The machine, kernel, memcached and epkv commit, for the results' header line.
pub(crate) fn hardware_line() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':').map(|(_, v)| v.trim().to_owned()))
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let kernel = util::output(Command::new("uname").arg("-r")).unwrap_or_default();
    let memcached = util::output(Command::new("memcached").arg("-V")).unwrap_or_default();
    let sha = util::output(Command::new("git").args(["rev-parse", "--short", "HEAD"]))
        .unwrap_or_default();
    format!(
        "{cpu}, {} cores, Linux {}; {}; epkv {}",
        util::cores(),
        kernel.trim(),
        memcached.trim(),
        sha.trim()
    )
}

fn markdown(rows: &[Row], paired: &[Paired], secs: u64, rounds: usize) -> Result<String> {
    let mut md = String::new();
    writeln!(md, "### Front end: epkv vs memcached (memaslap --binary)")?;
    writeln!(md)?;
    let setup = rows.first().map_or_else(String::new, |r| {
        format!(
            "; median of {rounds} rounds of {secs} s per server and case, {VALUE_BYTES}-byte values, {KEY_BYTES}-byte keys, {} server \
             threads, {} memaslap threads, client and server on the same machine",
            r.server_threads, r.client_threads
        )
    });
    writeln!(md, "{}{setup}.", hardware_line())?;
    writeln!(md)?;
    writeln!(
        md,
        "| workload | conns | epkv ops/s | memcached ops/s | ops ratio | epkv cpu us/op | \
         memcached cpu us/op | cpu ratio |"
    )?;
    writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|")?;
    for r in rows.iter().filter(|r| r.implementation == "epkv") {
        let Some(peer) = rows.iter().find(|p| {
            p.implementation == "memcached"
                && p.workload == r.workload
                && p.connections == r.connections
        }) else {
            continue;
        };
        writeln!(
            md,
            "| {} | {} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} |",
            r.workload,
            r.connections,
            r.items_per_sec,
            peer.items_per_sec,
            r.items_per_sec / peer.items_per_sec,
            r.cpu_us_per_op,
            peer.cpu_us_per_op,
            r.cpu_us_per_op / peer.cpu_us_per_op,
        )?;
    }
    writeln!(md)?;
    writeln!(
        md,
        "ops ratio = epkv/memcached (higher is better); cpu ratio = epkv/memcached (lower is \
         better)."
    )?;
    if !paired.is_empty() {
        writeln!(md)?;
        writeln!(
            md,
            "Per round (the two servers run back to back): median of the round ratios, and \
             the rounds in which epkv was ahead."
        )?;
        writeln!(md)?;
        writeln!(
            md,
            "| workload | conns | ops ratio | cpu ratio | rounds ahead on ops/s | rounds ahead on cpu/op |"
        )?;
        writeln!(md, "|---|---:|---:|---:|---:|---:|")?;
        for p in paired {
            writeln!(
                md,
                "| {} | {} | {:.2} | {:.2} | {} of {} | {} of {} |",
                p.workload,
                p.connections,
                p.ops_ratio,
                p.cpu_ratio,
                p.ops_ahead,
                p.rounds,
                p.cpu_ahead,
                p.rounds
            )?;
        }
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memaslap_closing_line_parses() {
        let text = "cmd_get: 264884\ncmd_set: 29439\n\nRun time: 5.0s Ops: 294323 TPS: 58858 \
                    Net_rate: 33.4M/s\n";
        assert_eq!(parse_memaslap(text), Some((294323, 5.0)));
        assert_eq!(parse_memaslap("no summary"), None);
    }

    #[test]
    fn config_has_the_set_and_get_proportions() {
        let cfg = memaslap_config(WORKLOADS[1]);
        assert!(cfg.contains("value\n512 512 1\n"));
        assert!(cfg.ends_with("cmd\n0 0.10\n1 0.90\n"), "{cfg}");
    }

    fn run(implementation: &'static str, items_per_sec: f64, cpu_us_per_op: f64) -> Row {
        Row {
            workload: "set_100",
            connections: 16,
            implementation,
            ops: (items_per_sec * 10.0) as u64,
            secs: 10.0,
            items_per_sec,
            cpu_us_per_op,
            rounds: 1,
            server_threads: 2,
            client_threads: 2,
        }
    }

    #[test]
    fn markdown_pairs_rows_and_computes_ratios() {
        let runs = [
            run("epkv", 200_000.0, 2.0),
            run("memcached", 100_000.0, 4.0),
        ];
        let md = markdown(&runs, &pair_rounds(&runs), 10, 1).unwrap();
        assert!(
            md.contains("| set_100 | 16 | 200000 | 100000 | 2.00 | 2.00 | 4.00 | 0.50 |"),
            "{md}"
        );
        assert!(
            md.contains("| set_100 | 16 | 2.00 | 0.50 | 1 of 1 | 1 of 1 |"),
            "{md}"
        );
        let j = run("epkv", 100_000.0, 2.0).to_json();
        assert_eq!(j["impl"], "epkv");
        assert_eq!(j["items_per_sec"], 100_000.0);
        assert_eq!(j["ns_per_op"], 10_000.0);
        assert_eq!(j["cpu_us_per_op"], 2.0);
    }

    #[test]
    fn rounds_pair_in_order_and_give_median_ratios() {
        // Round 1: epkv 2x ahead; round 2: behind; round 3: 1.5x ahead. The medians of the
        // ratios are 1.5 (ops) and 1/1.5 (cpu); epkv was ahead in two rounds of three.
        let runs = [
            run("epkv", 200.0, 1.0),
            run("memcached", 100.0, 2.0),
            run("memcached", 100.0, 1.0),
            run("epkv", 50.0, 2.0),
            run("epkv", 150.0, 2.0),
            run("memcached", 100.0, 3.0),
        ];
        let p = pair_rounds(&runs);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].rounds, 3);
        assert_eq!(p[0].ops_ratio, 1.5);
        assert!((p[0].cpu_ratio - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!((p[0].ops_ahead, p[0].cpu_ahead), (2, 2));
        assert!(pair_rounds(&runs[..1]).is_empty(), "no peer, no pair");
    }

    #[test]
    fn summarise_takes_medians_per_case() {
        let mut other_conns = run("epkv", 1.0, 1.0);
        other_conns.connections = 64;
        let runs = [
            run("epkv", 100.0, 3.0),
            run("memcached", 50.0, 9.0),
            run("epkv", 300.0, 1.0),
            other_conns,
            run("epkv", 200.0, 2.0),
        ];
        let rows = summarise(&runs);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].implementation, "epkv");
        assert_eq!(rows[0].connections, 16);
        assert_eq!(rows[0].items_per_sec, 200.0);
        assert_eq!(rows[0].cpu_us_per_op, 2.0);
        assert_eq!(rows[0].rounds, 3);
        assert_eq!(rows[0].ops, 6_000);
        assert_eq!(rows[1].implementation, "memcached");
        assert_eq!(rows[2].connections, 64);
        assert_eq!(util::median(vec![4.0, 1.0]), 2.5);
    }
}
