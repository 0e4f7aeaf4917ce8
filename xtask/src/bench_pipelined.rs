//! `cargo xtask bench frontend --pipelined`: the 90/10 pipelined load of issue 22 (16
//! connections × 16 requests in flight, 512-byte values, 100,000 keys), driven by the
//! project's own load tool (`epkv-pipeload`) against memcached 1.6, epkv memory-only
//! and epkv as shipped (persistent, the defaults), one server at a time, each started
//! fresh per run, in rounds that rotate which goes first.
//!
//! Reported per server: ops/s and the server's CPU microseconds per operation (utime +
//! stime from `/proc/<pid>/stat` over the run), medians over the rounds, and the ratios
//! against memcached. Rows go to `target/bench/frontend-pipelined.json`, the table to
//! `target/bench/frontend-pipelined.md`.

use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::bench_frontend::FrontendOptions;
use crate::bench_tls::{parse_pipeload, pipeload_bin};
use crate::memcapable::tempdir;
use crate::process::{self, ServerProcess};
use crate::util;

const CONNECTIONS: usize = 16;
const DEPTH: usize = 16;
const VALUE_BYTES: usize = 512;
const KEYS: usize = 100_000;
const GET_FRACTION: f64 = 0.9;
const SERVERS: [&str; 3] = ["memcached", "epkv-memory-only", "epkv-as-shipped"];
/// The compared build's runs, with `--compare-bin`.
const COMPARED: [&str; 2] = ["compare-memory-only", "compare-as-shipped"];

/// Runs the pipelined cases.
pub(crate) fn bench_pipelined(opts: &FrontendOptions) -> Result<()> {
    if !util::on_path("memcached") {
        bail!("memcached is not installed; run `cargo xtask deps`");
    }
    crate::bench_tls::build_pipeload()?;
    let bin = process::release_server_bin(opts.epkv_bin.as_ref())?;
    let secs = opts.secs.unwrap_or(if opts.quick { 5 } else { 10 }).max(1);
    let rounds = opts.rounds.unwrap_or(if opts.quick { 2 } else { 3 }).max(1);
    let threads = opts.server_threads.unwrap_or_else(util::cores);
    let out_dir = util::target_dir().join("bench");
    std::fs::create_dir_all(&out_dir)?;
    let ticks = process::clock_ticks_per_sec() as f64;
    let mut results: Vec<(&str, f64, f64)> = Vec::new();
    let mut servers = SERVERS.to_vec();
    if opts.compare_bin.is_some() {
        servers.extend(COMPARED);
    }
    for round in 0..rounds {
        for i in 0..servers.len() {
            let name = servers[(i + round) % servers.len()];
            let log = out_dir.join(format!("pipelined-{name}.log"));
            let data = tempdir("bench-pipelined")?;
            let mem = format!("{}", opts.memory_mib);
            let server = match name {
                "memcached" => ServerProcess::start_memcached(
                    &["-m".into(), mem, "-t".into(), threads.to_string()],
                    log,
                )?,
                _ => {
                    let mut args: Vec<String> = vec![
                        "--threads".into(),
                        threads.to_string(),
                        "--memory-quota".into(),
                        format!("{mem}MiB"),
                        "--data-dir".into(),
                        data.path().display().to_string(),
                    ];
                    if name.ends_with("memory-only") {
                        args.extend(["--persistence".into(), "false".into()]);
                    }
                    args.extend(opts.epkv_args.iter().cloned());
                    let bin = match &opts.compare_bin {
                        Some(other) if name.starts_with("compare-") => other,
                        _ => &bin,
                    };
                    ServerProcess::start_epkv(bin, &args, log)?
                }
            };
            let mut cmd = Command::new(pipeload_bin());
            cmd.args(["run", "--mode", "plain", "--addr", &server.addr()])
                .args(["--connections", &CONNECTIONS.to_string()])
                .args(["--depth", &DEPTH.to_string()])
                .args(["--get-fraction", &GET_FRACTION.to_string()])
                .args(["--value-bytes", &VALUE_BYTES.to_string()])
                .args(["--keys", &KEYS.to_string()])
                .args(["--secs", &secs.to_string()]);
            // The populate phase is not counted: CPU is read around the timed run only
            // by running it once untimed first.
            let mut populate = Command::new(pipeload_bin());
            populate
                .args(["run", "--mode", "plain", "--addr", &server.addr()])
                .args(["--connections", "1", "--depth", "1", "--secs", "0"])
                .args(["--value-bytes", &VALUE_BYTES.to_string()])
                .args(["--keys", &KEYS.to_string()]);
            util::output(&mut populate)?;
            cmd.arg("--no-populate");
            let t0 = process::cpu_ticks(server.pid())?;
            let stdout = util::output(&mut cmd)?;
            let cpu = process::cpu_ticks(server.pid())?.saturating_sub(t0) as f64 / ticks;
            crate::bench_memory::stop(server);
            drop(data);
            let r = parse_pipeload(&stdout)
                .with_context(|| format!("no pipeload-result line in {stdout:?}"))?;
            let ops = r["ops"].as_u64().unwrap_or(0);
            let run_secs = r["secs"].as_f64().unwrap_or(f64::NAN);
            if ops == 0 || r["errors"].as_u64() != Some(0) {
                bail!("{name} run failed: {r}");
            }
            let rate = ops as f64 / run_secs;
            let cpu_us = cpu * 1e6 / ops as f64;
            eprintln!(
                "round {}/{rounds}: {name}: {rate:.0} ops/s, {cpu_us:.2} us CPU/op",
                round + 1
            );
            results.push((name, rate, cpu_us));
        }
    }
    let stat = |name: &str| {
        let rates = results
            .iter()
            .filter(|r| r.0 == name)
            .map(|r| r.1)
            .collect();
        let cpus = results
            .iter()
            .filter(|r| r.0 == name)
            .map(|r| r.2)
            .collect();
        (util::median(rates), util::median(cpus))
    };
    let (mc_rate, mc_cpu) = stat("memcached");
    let params = json!({"connections": CONNECTIONS, "depth": DEPTH, "value_bytes": VALUE_BYTES,
        "keys": KEYS, "get_fraction": GET_FRACTION, "secs": secs, "rounds": rounds,
        "server_threads": threads, "client": "epkv-pipeload"});
    let mut rows = Vec::new();
    let mut md = format!(
        "### Pipelined 90/10 GET/SET ({CONNECTIONS} connections x {DEPTH} in flight, \
         {VALUE_BYTES} B values, {KEYS} keys; medians of {rounds} rounds of {secs} s)\n\n\
         | server | ops/s | server CPU us/op | ops/s vs memcached | CPU/op vs memcached | goal |\n\
         |---|---:|---:|---:|---:|---|\n"
    );
    for &name in &servers {
        let (rate, cpu) = stat(name);
        rows.push(
            json!({"bench": "frontend/pipelined_get_90_set_10", "params": params,
            "impl": name, "items_per_sec": rate, "ns_per_op": 1e9 / rate,
            "cpu_us_per_op": cpu, "ratio_vs_memcached": rate / mc_rate}),
        );
        let goal = match name {
            "epkv-as-shipped" => ">= 0.9x ops/s",
            "epkv-memory-only" => ">= 1.1x ops/s at <= 0.9x CPU/op",
            _ => "",
        };
        md.push_str(&format!(
            "| {name} | {rate:.0} | {cpu:.2} | {:.2}x | {:.2}x | {goal} |\n",
            rate / mc_rate,
            cpu / mc_cpu
        ));
    }
    if opts.compare_bin.is_some() {
        md.push_str(
            "\n| build under test vs compared | ops/s (ratio of medians) | CPU/op (ratio of medians) \
             | ops/s (median of each round's ratio) | CPU/op (median of each round's ratio) |\n\
             |---|---:|---:|---:|---:|\n",
        );
        // Each round runs both builds back to back, so a round's ratio cancels the
        // machine's drift between rounds; its median is the steadier figure.
        let per_round = |name: &str| -> Vec<(f64, f64)> {
            results
                .iter()
                .filter(|r| r.0 == name)
                .map(|r| (r.1, r.2))
                .collect()
        };
        for (ours, theirs) in [SERVERS[1], SERVERS[2]].into_iter().zip(COMPARED) {
            let (rate, cpu) = stat(ours);
            let (other_rate, other_cpu) = stat(theirs);
            let pairs: Vec<_> = per_round(ours).into_iter().zip(per_round(theirs)).collect();
            let round_ops = util::median(pairs.iter().map(|(a, b)| a.0 / b.0).collect());
            let round_cpu = util::median(pairs.iter().map(|(a, b)| a.1 / b.1).collect());
            rows.push(
                json!({"bench": "frontend/pipelined_get_90_set_10_ab", "params": params,
                "impl": ours, "compared": theirs, "ops_ratio": rate / other_rate,
                "cpu_ratio": cpu / other_cpu, "ops_ratio_per_round_median": round_ops,
                "cpu_ratio_per_round_median": round_cpu}),
            );
            md.push_str(&format!(
                "| {ours} / {theirs} | {:.3}x | {:.3}x | {round_ops:.3}x | {round_cpu:.3}x |\n",
                rate / other_rate,
                cpu / other_cpu
            ));
        }
    }
    std::fs::write(
        out_dir.join("frontend-pipelined.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    std::fs::write(out_dir.join("frontend-pipelined.md"), &md)?;
    println!("\n{md}");
    Ok(())
}
