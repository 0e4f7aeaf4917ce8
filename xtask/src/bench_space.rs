//! `cargo xtask bench space`: space amplification under random overwrites (issue 22),
//! with the fragmentation compactor on and off in the same run.
//!
//! For each mode, a fresh epkv-server as shipped (persistent, every default) except
//! `--compaction-fragmentation-percent` (the default, 30, or 0 for "off"): `epkv-pipeload`
//! loads `keys` keys of 512-byte values, then overwrites keys drawn at random over the
//! whole key space (`--fresh-keys`, 100% SET, 16 connections × 16 in flight) for `secs`
//! seconds. Meanwhile the data directory's size (every file under it, journals
//! included) is sampled every 250 ms; its peak over the load and its size `idle_secs`
//! after the load ends are reported over the live bytes (keys × (key + value)), with the
//! load's ops/s. Goals: ≤3.0x at the peak, ≤2.0x after the idle period, ops/s with
//! compaction ≥0.8x without. Each run also reports the server's CPU per op over the load
//! and the cleaning threads' share of it (a steadier figure than ops/s on a noisy
//! machine). `--compare-bin B` runs every mode with binary B too, interleaved, for a
//! same-run A/B; `--rounds N` repeats the whole. Results go to `target/bench/space.json`
//! and `target/bench/space.md`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::memcapable::tempdir;
use crate::process::{self, ServerProcess};
use crate::util;

/// Options of `cargo xtask bench space`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SpaceOptions {
    /// 100,000 keys for 15 s, 30 s idle (default: 1,000,000 keys for 60 s).
    #[arg(long)]
    pub(crate) quick: bool,
    /// Keys (overrides --quick).
    #[arg(long)]
    pub(crate) keys: Option<usize>,
    /// Seconds of overwrites (overrides --quick).
    #[arg(long)]
    pub(crate) secs: Option<u64>,
    /// Seconds to wait after the load before measuring again.
    #[arg(long, default_value_t = 30)]
    pub(crate) idle_secs: u64,
    /// Modes to run, comma separated: `on` (fragmentation compaction at its default) and
    /// `off` (`--compaction-fragmentation-percent 0`).
    #[arg(long, value_delimiter = ',', default_values_t = ["on".to_owned(), "off".to_owned()])]
    pub(crate) modes: Vec<String>,
    /// Use this epkv-server binary instead of building target/release/epkv-server.
    #[arg(long)]
    pub(crate) epkv_bin: Option<PathBuf>,
    /// Also run every mode with this epkv-server binary, interleaved with the first
    /// (a same-run A/B; rows are labelled `head` and `compare`).
    #[arg(long)]
    pub(crate) compare_bin: Option<PathBuf>,
    /// Rounds: every mode (and build) this many times, interleaved.
    #[arg(long, default_value_t = 1)]
    pub(crate) rounds: usize,
    /// Extra epkv-server flags for every mode, e.g. `--server-arg=--compaction-rate=0`.
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub(crate) server_args: Vec<String>,
}

/// Value size, as in the issue.
const VALUE_BYTES: usize = 512;
/// Key size of epkv-pipeload's keys (`pipeload-NNNNNNN`).
const KEY_BYTES: usize = 16;

/// One mode's measurements.
#[derive(Debug, Clone)]
pub(crate) struct SpaceRun {
    /// `head`, or `compare` for `--compare-bin`.
    build: String,
    /// Which round of `--rounds` (from 0).
    round: usize,
    mode: String,
    keys: usize,
    secs: u64,
    live_bytes: u64,
    peak_bytes: u64,
    idle_bytes: u64,
    /// Data files only (journals left out), at the same two moments.
    peak_data_bytes: u64,
    idle_data_bytes: u64,
    ops_per_sec: f64,
    /// p99 of one-at-a-time GETs on another connection during the load, in µs: what
    /// the front end's tail looks like while compaction runs (or not).
    p99_get_us: f64,
    /// The server's CPU time over the load, per op, in µs.
    server_us_per_op: f64,
    /// The compaction threads' share of the server's CPU over the load
    /// (`ep_compaction_cpu_time`).
    clean_share: f64,
}

/// Bytes of every file under `dir`, recursively, and of the journals among them (files
/// that vanish meanwhile count 0).
pub(crate) fn dir_bytes(dir: &Path) -> (u64, u64) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(_) => {
                let n = e.metadata().map(|m| m.len()).unwrap_or(0);
                let journal = e.file_name() == "journal.log";
                (n, if journal { n } else { 0 })
            }
            Err(_) => (0, 0),
        })
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

#[expect(clippy::cast_precision_loss, reason = "ratios of byte counts")]
fn ratio(a: u64, b: u64) -> f64 {
    a as f64 / b.max(1) as f64
}

/// The JSON rows and the markdown table.
pub(crate) fn report(runs: &[SpaceRun]) -> (Vec<Value>, String) {
    let mut rows = Vec::new();
    let mut md = String::from(
        "### Space amplification: random overwrites of 512-byte values (epkv-pipeload, 16 x 16)\n\n\
         | build | compaction | keys | secs | live MB | peak MB | peak / live | after idle MB | idle / live | data files / live (peak, idle) | ops/s | ops/s vs off | GET p99 µs (probe) | server CPU µs/op | cleaning share of CPU |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in runs {
        // Against the "off" run of the same build and round.
        let vs_off = runs
            .iter()
            .find(|o| o.mode == "off" && o.build == r.build && o.round == r.round)
            .map(|o| r.ops_per_sec / o.ops_per_sec);
        rows.push(json!({
            "bench": "SpaceAmplification",
            "params": {"keys": r.keys, "secs": r.secs, "value_bytes": VALUE_BYTES, "compaction": r.mode},
            "impl": "epkv",
            "build": r.build,
            "round": r.round,
            "items_per_sec": r.ops_per_sec,
            "live_bytes": r.live_bytes,
            "peak_bytes": r.peak_bytes,
            "idle_bytes": r.idle_bytes,
            "peak_ratio": ratio(r.peak_bytes, r.live_bytes),
            "idle_ratio": ratio(r.idle_bytes, r.live_bytes),
            "peak_data_ratio": ratio(r.peak_data_bytes, r.live_bytes),
            "idle_data_ratio": ratio(r.idle_data_bytes, r.live_bytes),
            "ops_vs_off": vs_off,
            "p99_get_us": r.p99_get_us,
            "server_us_per_op": r.server_us_per_op,
            "clean_share": r.clean_share,
        }));
        md.push_str(&format!(
            "| {} | {} | {} | {} | {:.0} | {:.0} | {:.2}x | {:.0} | {:.2}x | {:.2}x, {:.2}x | {:.0} | {} | {:.0} | {:.2} | {:.1}% |\n",
            r.build,
            r.mode,
            r.keys,
            r.secs,
            r.live_bytes as f64 / 1e6,
            r.peak_bytes as f64 / 1e6,
            ratio(r.peak_bytes, r.live_bytes),
            r.idle_bytes as f64 / 1e6,
            ratio(r.idle_bytes, r.live_bytes),
            ratio(r.peak_data_bytes, r.live_bytes),
            ratio(r.idle_data_bytes, r.live_bytes),
            r.ops_per_sec,
            vs_off.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}x")),
            r.p99_get_us,
            r.server_us_per_op,
            r.clean_share * 100.0,
        ));
    }
    md.push_str(
        "\nGoals (issue 22): peak ≤3.0x, after 30 s idle ≤2.0x, ops/s with compaction ≥0.8x \
         without. Data-directory bytes include the shards' journals.\n",
    );
    (rows, md)
}

/// `ep_compaction_cpu_time`: the compaction and cleaning threads' CPU time so far, in µs
/// (0 from a build without the stat, for a `--compare-bin` A/B against an older one).
fn compaction_cpu_us(c: &mut crate::bench_memory::wire::BinClient) -> Result<u64> {
    Ok(c.stats("persistence")?
        .get("ep_compaction_cpu_time")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0))
}

fn run_mode(
    opts: &SpaceOptions,
    (build, bin, round): (&str, &Path, usize),
    mode: &str,
    keys: usize,
    secs: u64,
) -> Result<SpaceRun> {
    let idle_secs = opts.idle_secs;
    let out_dir = util::target_dir().join("bench");
    let data = tempdir("bench-space")?;
    let percent = if mode == "off" { "0" } else { "30" };
    let mut args: Vec<String> = vec![
        "--data-dir".into(),
        data.path().display().to_string(),
        "--compaction-fragmentation-percent".into(),
        percent.into(),
        "--memory-quota".into(),
        "4GiB".into(),
    ];
    args.extend(opts.server_args.iter().cloned());
    let server = ServerProcess::start_epkv(
        bin,
        &args,
        out_dir.join(format!("space-{build}-{mode}.log")),
    )?;
    let base = |c: &mut Command| {
        c.args(["run", "--mode", "plain", "--addr", &server.addr()])
            .args(["--connections", "16", "--depth", "16"])
            .args(["--get-fraction", "0"])
            .args(["--value-bytes", &VALUE_BYTES.to_string()])
            .args(["--keys", &keys.to_string()]);
    };
    // Populate (a 1 s run after loading every key), then the timed overwrites.
    let mut pop = Command::new(crate::bench_tls::pipeload_bin());
    base(&mut pop);
    pop.args(["--secs", "1"]);
    util::output(&mut pop)?;
    let mut cmd = Command::new(crate::bench_tls::pipeload_bin());
    base(&mut cmd);
    cmd.args(["--secs", &secs.to_string(), "--no-populate", "--fresh-keys"])
        .stdout(Stdio::piped());
    let mut stats = crate::bench_memory::wire::BinClient::connect(&server.addr(), true)?;
    let (cpu0, clean0) = (
        process::cpu_ticks(server.pid())?,
        compaction_cpu_us(&mut stats)?,
    );
    let child = cmd.spawn().context("start epkv-pipeload")?;
    // The latency probe: GETs of random keys, one at a time, until the load ends.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probe = {
        let addr = server.addr();
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || -> Result<Vec<f64>> {
            let mut c = crate::bench_memory::wire::BinClient::connect(&addr, true)?;
            let mut rng = crate::bench_memory::rng(23);
            let mut lat = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let i = crate::bench_memory::below(&mut rng, keys as u64);
                let k = format!("pipeload-{i:07}");
                let t = crate::util::Stopwatch::start();
                c.get(k.as_bytes())?;
                lat.push(t.elapsed().as_secs_f64() * 1e6);
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(lat)
        })
    };
    let mut peak = (0u64, 0u64);
    let sample = |peak: &mut (u64, u64)| {
        let (all, journals) = dir_bytes(data.path());
        if all > peak.0 {
            *peak = (all, all - journals);
        }
    };
    let (tx, rx) = std::sync::mpsc::channel();
    // The load's output is read on its own thread so that sampling goes on meanwhile.
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let output = loop {
        sample(&mut peak);
        match rx.recv_timeout(Duration::from_millis(250)) {
            Ok(o) => break o.context("epkv-pipeload")?,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(e) => bail!("epkv-pipeload waiter: {e}"),
        }
    };
    let _ = waiter.join();
    let cpu = process::cpu_ticks(server.pid())?.saturating_sub(cpu0);
    let clean_us = compaction_cpu_us(&mut stats)?.saturating_sub(clean0);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut lat = probe
        .join()
        .map_err(|_| anyhow::anyhow!("the latency probe panicked"))??;
    lat.sort_by(f64::total_cmp);
    let p99_get_us = crate::bench_memory::percentile(&lat, 0.99);
    sample(&mut peak);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let r = crate::bench_tls::parse_pipeload(&stdout)
        .with_context(|| format!("no pipeload-result line in {stdout:?}"))?;
    let ops = r["ops"].as_u64().unwrap_or(0);
    if ops == 0 || r["errors"].as_u64() != Some(0) {
        bail!("{mode} load failed: {r}");
    }
    let ops_per_sec = ops as f64 / r["secs"].as_f64().unwrap_or(f64::NAN);
    let cpu_us = cpu as f64 / process::clock_ticks_per_sec() as f64 * 1e6;
    let server_us_per_op = cpu_us / ops as f64;
    let clean_share = clean_us as f64 / cpu_us.max(1.0);
    eprintln!(
        "{build} {mode}: {ops_per_sec:.0} ops/s, {server_us_per_op:.2} µs CPU/op ({:.1}% cleaning), peak {} MB; idling {idle_secs} s",
        clean_share * 100.0,
        peak.0 / 1_000_000
    );
    std::thread::sleep(Duration::from_secs(idle_secs));
    let (idle, idle_journals) = dir_bytes(data.path());
    crate::bench_memory::stop(server);
    drop(data);
    Ok(SpaceRun {
        build: build.to_owned(),
        round,
        mode: mode.to_owned(),
        keys,
        secs,
        live_bytes: (keys * (KEY_BYTES + VALUE_BYTES)) as u64,
        peak_bytes: peak.0,
        idle_bytes: idle,
        peak_data_bytes: peak.1,
        idle_data_bytes: idle - idle_journals,
        ops_per_sec,
        p99_get_us,
        server_us_per_op,
        clean_share,
    })
}

/// Runs the bench and writes its report.
pub(crate) fn bench_space(opts: &SpaceOptions) -> Result<()> {
    crate::bench_tls::build_pipeload()?;
    let bin = process::release_server_bin(opts.epkv_bin.as_ref())?;
    let keys = opts
        .keys
        .unwrap_or(if opts.quick { 100_000 } else { 1_000_000 });
    let secs = opts.secs.unwrap_or(if opts.quick { 15 } else { 60 }).max(1);
    let out_dir = util::target_dir().join("bench");
    std::fs::create_dir_all(&out_dir)?;
    let mut builds = vec![("head", bin)];
    if let Some(c) = &opts.compare_bin {
        builds.push(("compare", c.clone()));
    }
    if let Some(m) = opts.modes.iter().find(|m| *m != "on" && *m != "off") {
        bail!("unknown mode {m:?}: on or off");
    }
    let mut runs = Vec::new();
    for round in 0..opts.rounds.max(1) {
        // Alternate which build goes first, so that neither always runs on a warmer machine.
        let mut order: Vec<_> = builds.iter().collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for mode in &opts.modes {
            for (build, bin) in &order {
                runs.push(run_mode(opts, (build, bin, round), mode, keys, secs)?);
            }
        }
    }
    let (rows, md) = report(&runs);
    std::fs::write(
        out_dir.join("space.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    std::fs::write(out_dir.join("space.md"), &md)?;
    println!("\n{md}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_bytes_counts_nested_files() {
        let d = tempdir("space-test").unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::fs::write(d.path().join("x"), [0u8; 10]).unwrap();
        std::fs::write(d.path().join("a/b/y"), [0u8; 5]).unwrap();
        std::fs::write(d.path().join("a/journal.log"), [0u8; 7]).unwrap();
        assert_eq!(dir_bytes(d.path()), (22, 7));
    }

    #[test]
    fn report_has_ratios_against_off() {
        let run = |build: &str, round: usize, mode: &str, ops: f64| SpaceRun {
            build: build.to_owned(),
            round,
            mode: mode.to_owned(),
            keys: 10,
            secs: 1,
            live_bytes: 100,
            peak_bytes: 250,
            idle_bytes: 150,
            peak_data_bytes: 200,
            idle_data_bytes: 100,
            ops_per_sec: ops,
            p99_get_us: 50.0,
            server_us_per_op: 4.0,
            clean_share: 0.25,
        };
        let (rows, md) = report(&[
            run("head", 0, "on", 90.0),
            run("compare", 0, "on", 70.0),
            run("head", 0, "off", 100.0),
            run("compare", 0, "off", 200.0),
            run("head", 1, "on", 90.0),
            run("head", 1, "off", 300.0),
        ]);
        assert_eq!(rows.len(), 6);
        assert_eq!(rows[0]["peak_ratio"], json!(2.5));
        assert!(md.contains("0.90x"), "{md}");
        // Each build's "on" run is compared with its own "off" run.
        assert_eq!(rows[1]["ops_vs_off"], json!(0.35));
        // ... of the same round.
        assert_eq!(rows[4]["ops_vs_off"], json!(0.3));
        assert!(md.contains("25.0%"), "{md}");
    }
}
