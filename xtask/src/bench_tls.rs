//! `cargo xtask bench tls`: pipelined 90/10 GET/SET over TLS against the same load in
//! clear text, epkv against itself in the same run (issue 19; goal: TLS at least 0.7x the
//! plain ops/s).
//!
//! One memory-only epkv-server with both listeners (a certificate from
//! `epkv-pipeload certs`). Each round runs `epkv-pipeload` once in each mode, for each
//! connection count, back to back (the order alternates between rounds, so neither mode
//! always runs on a warmer machine). Reported per run: ops/s, and the server's CPU
//! microseconds per operation (utime + stime from `/proc/<pid>/stat` over the run); per
//! case, the medians and the median of the per-round TLS/plain ratios. The client shares
//! the machine's cores with the server, and its own encryption is part of the TLS
//! figure; CPU per op isolates the server. Results go to `target/bench/tls.json` (rows
//! as in benchmarks.md "Machine-readable results") and `target/bench/tls.md`.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::memcapable::tempdir;
use crate::process::{self, ServerProcess};
use crate::util;

/// Options of `cargo xtask bench tls`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct TlsOptions {
    /// About a minute: 2 rounds of 5 s runs (default: 5 rounds of 10 s).
    #[arg(long)]
    pub(crate) quick: bool,
    /// Seconds per run (overrides --quick).
    #[arg(long)]
    pub(crate) secs: Option<u64>,
    /// Rounds (overrides --quick).
    #[arg(long)]
    pub(crate) rounds: Option<usize>,
    /// Connection counts, comma separated.
    #[arg(long, value_delimiter = ',', default_values_t = [4usize, 32])]
    pub(crate) connections: Vec<usize>,
    /// Requests per pipelined batch.
    #[arg(long, default_value_t = 32)]
    pub(crate) depth: usize,
    /// Server worker threads (default: the number of cores).
    #[arg(long)]
    pub(crate) server_threads: Option<usize>,
    /// Use this epkv-server binary instead of building target/release/epkv-server.
    #[arg(long)]
    pub(crate) epkv_bin: Option<PathBuf>,
}

/// Value size, as the front-end bench.
const VALUE_BYTES: usize = 512;

/// One run of one mode.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    mode: &'static str,
    connections: usize,
    ops_per_sec: f64,
    cpu_us_per_op: f64,
}

/// Builds `epkv-pipeload` (release), which the benches that drive a pipelined load run.
pub(crate) fn build_pipeload() -> Result<()> {
    util::run(util::cargo().args([
        "build",
        "--release",
        "-p",
        "epkv-bench",
        "--bin",
        "epkv-pipeload",
    ]))?;
    Ok(())
}

pub(crate) fn pipeload_bin() -> PathBuf {
    util::target_dir().join("release").join("epkv-pipeload")
}

/// Parses the `pipeload-result: {json}` line.
pub(crate) fn parse_pipeload(stdout: &str) -> Option<Value> {
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("pipeload-result: "))?;
    serde_json::from_str(line).ok()
}

/// The median over rounds of TLS/plain for one connection count: (ops ratio, CPU ratio).
pub(crate) fn ratios(runs: &[Run], connections: usize) -> Option<(f64, f64)> {
    let of = |mode: &str| -> Vec<&Run> {
        runs.iter()
            .filter(|r| r.mode == mode && r.connections == connections)
            .collect()
    };
    let pairs: Vec<(&Run, &Run)> = of("tls").into_iter().zip(of("plain")).collect();
    if pairs.is_empty() {
        return None;
    }
    Some((
        util::median(
            pairs
                .iter()
                .map(|(t, p)| t.ops_per_sec / p.ops_per_sec)
                .collect(),
        ),
        util::median(
            pairs
                .iter()
                .map(|(t, p)| t.cpu_us_per_op / p.cpu_us_per_op)
                .collect(),
        ),
    ))
}

/// JSON rows (medians per mode and connection count) and the markdown table.
pub(crate) fn report(
    runs: &[Run],
    connections: &[usize],
    depth: usize,
    threads: usize,
) -> (Vec<Value>, String) {
    let mut rows = Vec::new();
    let mut md = String::from(
        "### TLS vs plain text: pipelined 90/10 GET/SET (epkv-pipeload)\n\n\
         | connections | plain ops/s | TLS ops/s | TLS / plain | plain CPU/op | TLS CPU/op | \
         TLS / plain CPU |\n|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for &c in connections {
        let med = |mode: &str, f: fn(&Run) -> f64| {
            util::median(
                runs.iter()
                    .filter(|r| r.mode == mode && r.connections == c)
                    .map(f)
                    .collect(),
            )
        };
        for mode in ["plain", "tls"] {
            let n = runs
                .iter()
                .filter(|r| r.mode == mode && r.connections == c)
                .count();
            if n == 0 {
                continue;
            }
            let ops = med(mode, |r| r.ops_per_sec);
            rows.push(json!({
                "bench": "tls/get_90_set_10",
                "params": {
                    "connections": c,
                    "depth": depth,
                    "value_bytes": VALUE_BYTES,
                    "server_threads": threads,
                    "client": "epkv-pipeload",
                },
                "impl": format!("epkv-{mode}"),
                "items_per_sec": ops,
                "ns_per_op": 1e9 / ops,
                "cpu_us_per_op": med(mode, |r| r.cpu_us_per_op),
                "rounds": n,
            }));
        }
        if let Some((ops_ratio, cpu_ratio)) = ratios(runs, c) {
            md.push_str(&format!(
                "| {c} | {:.0} | {:.0} | {ops_ratio:.2}x | {:.2} us | {:.2} us | {cpu_ratio:.2}x |\n",
                med("plain", |r| r.ops_per_sec),
                med("tls", |r| r.ops_per_sec),
                med("plain", |r| r.cpu_us_per_op),
                med("tls", |r| r.cpu_us_per_op),
            ));
        }
    }
    md.push_str(&format!(
        "\nDepth {depth}, {VALUE_BYTES}-byte values, 10,000 keys, {threads} server threads, \
         memory-only bucket; ops/s and CPU/op are medians over rounds, ratios the median of \
         the per-round ratios. Goal: TLS at least 0.7x the plain ops/s.\n"
    ));
    (rows, md)
}

/// Runs the bench and writes its report.
pub(crate) fn bench_tls(opts: &TlsOptions) -> Result<()> {
    build_pipeload()?;
    // Built separately: `--bin` would otherwise limit every package to that binary.
    let bin = process::release_server_bin(opts.epkv_bin.as_ref())?;
    let secs = opts.secs.unwrap_or(if opts.quick { 5 } else { 10 }).max(1);
    let rounds = opts.rounds.unwrap_or(if opts.quick { 2 } else { 5 }).max(1);
    let threads = opts.server_threads.unwrap_or_else(util::cores);
    let out_dir = util::target_dir().join("bench");
    std::fs::create_dir_all(&out_dir)?;
    let data = tempdir("bench-tls")?;
    let certs = data.path().join("certs");
    util::run(Command::new(pipeload_bin()).arg("certs").arg(&certs))?;
    let tls_port = process::free_port()?;
    let args: Vec<String> = vec![
        "--persistence".into(),
        "false".into(),
        "--threads".into(),
        threads.to_string(),
        "--data-dir".into(),
        data.path().display().to_string(),
        "--tls-port".into(),
        tls_port.to_string(),
        "--tls-cert".into(),
        certs.join("server.pem").display().to_string(),
        "--tls-key".into(),
        certs.join("server.key").display().to_string(),
    ];
    let server = ServerProcess::start_epkv(&bin, &args, out_dir.join("tls-epkv.log"))?;
    let addr = |mode: &str| match mode {
        "tls" => format!("127.0.0.1:{tls_port}"),
        _ => server.addr(),
    };
    let mut runs = Vec::new();
    let mut populated = false;
    for round in 0..rounds {
        for &c in &opts.connections {
            let order = if round % 2 == 0 {
                ["plain", "tls"]
            } else {
                ["tls", "plain"]
            };
            for mode in order {
                let mut cmd = Command::new(pipeload_bin());
                cmd.args(["run", "--mode", mode, "--addr", &addr(mode)])
                    .arg("--ca")
                    .arg(certs.join("ca.pem"))
                    .args(["--connections", &c.to_string()])
                    .args(["--depth", &opts.depth.to_string()])
                    .args(["--value-bytes", &VALUE_BYTES.to_string()])
                    .args(["--secs", &secs.to_string()]);
                if populated {
                    cmd.arg("--no-populate");
                }
                let ticks0 = process::cpu_ticks(server.pid())?;
                let stdout = util::output(&mut cmd)?;
                let ticks = process::cpu_ticks(server.pid())?.saturating_sub(ticks0);
                populated = true;
                let r = parse_pipeload(&stdout)
                    .with_context(|| format!("no pipeload-result line in {stdout:?}"))?;
                let ops = r["ops"].as_u64().unwrap_or(0);
                let run_secs = r["secs"].as_f64().unwrap_or(f64::NAN);
                if ops == 0 || r["errors"].as_u64() != Some(0) {
                    bail!("{mode} run failed: {r}");
                }
                let cpu_us = ticks as f64 * 1e6 / process::clock_ticks_per_sec() as f64;
                let run = Run {
                    mode,
                    connections: c,
                    ops_per_sec: ops as f64 / run_secs,
                    cpu_us_per_op: cpu_us / ops as f64,
                };
                eprintln!(
                    "round {}/{rounds}: {mode} {c} connections: {:.0} ops/s, {:.2} us CPU/op",
                    round + 1,
                    run.ops_per_sec,
                    run.cpu_us_per_op
                );
                runs.push(run);
            }
        }
    }
    crate::bench_memory::stop(server);
    drop(data);
    let (rows, md) = report(&runs, &opts.connections, opts.depth, threads);
    std::fs::write(
        out_dir.join("tls.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    std::fs::write(out_dir.join("tls.md"), &md)?;
    println!("\n{md}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(mode: &'static str, connections: usize, ops: f64, cpu: f64) -> Run {
        Run {
            mode,
            connections,
            ops_per_sec: ops,
            cpu_us_per_op: cpu,
        }
    }

    #[test]
    fn result_line_parses() {
        let v = parse_pipeload("noise\npipeload-result: {\"ops\":5,\"errors\":0}\n").unwrap();
        assert_eq!(v["ops"], 5);
        assert!(parse_pipeload("nothing").is_none());
    }

    #[test]
    fn ratios_pair_rounds_and_the_report_has_both_modes() {
        let runs = [
            run("plain", 4, 100.0, 2.0),
            run("tls", 4, 80.0, 3.0),
            run("tls", 4, 60.0, 3.0),
            run("plain", 4, 100.0, 2.0),
        ];
        let (ops, cpu) = ratios(&runs, 4).unwrap();
        assert!((ops - 0.7).abs() < 1e-9, "{ops}");
        assert!((cpu - 1.5).abs() < 1e-9, "{cpu}");
        assert!(ratios(&runs, 32).is_none());
        let (rows, md) = report(&runs, &[4], 32, 2);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1]["impl"], "epkv-tls");
        assert!(md.contains("0.70x"), "{md}");
    }
}
