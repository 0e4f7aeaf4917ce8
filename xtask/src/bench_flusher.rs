//! `cargo xtask bench flusher`: the persistence path's CPU per persisted item (issue 22).
//!
//! epkv as shipped (persistent, the defaults) takes SETs of 512-byte values over 100,000
//! keys at fixed rates (1k, 10k and 50k per second, paced in 10 ms slices over 4
//! connections) and then as fast as it can (100 in flight on each connection). For each
//! rate: the CPU time of the Writer threads (`epkv-writer-*`: flushers and appliers, from
//! `/proc/<pid>/task/*/stat`) over the items persisted meanwhile (`ep_total_persisted`),
//! and the whole server's CPU per SET. Goal: at most 1.5 µs per persisted item at 50k/s
//! and above. Rows `flusher/cpu_per_persisted_item` in `target/bench/flusher.json`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use epkv_protocol::Opcode;
use serde_json::json;

use crate::bench_memory::wire::BinClient;
use crate::memcapable::tempdir;
use crate::process::{self, ServerProcess};
use crate::util::{self, Stopwatch};

/// `cargo xtask bench flusher` options.
#[derive(Debug, clap::Args)]
pub(crate) struct FlusherOptions {
    /// 3 s per rate instead of 10
    #[arg(long)]
    pub(crate) quick: bool,
    /// Seconds per rate
    #[arg(long)]
    pub(crate) secs: Option<u64>,
    /// Use this epkv-server binary instead of building target/release/epkv-server
    #[arg(long)]
    pub(crate) epkv_bin: Option<PathBuf>,
    /// One more argument for epkv-server (repeat it), for A/B runs of a setting
    #[arg(long = "epkv-arg", allow_hyphen_values = true)]
    pub(crate) epkv_args: Vec<String>,
    /// A second epkv-server binary measured in the same run, alternating with the first
    /// round by round (A/B of a change; the report gives both and their ratios)
    #[arg(long)]
    pub(crate) compare_bin: Option<PathBuf>,
    /// Arguments of the compared build instead of the --epkv-arg ones (repeat it); with no
    /// --compare-bin, the compared build is the same binary (A/B of a setting)
    #[arg(long = "compare-arg", allow_hyphen_values = true)]
    pub(crate) compare_args: Vec<String>,
    /// Rounds (each starts every build fresh); the report gives medians
    #[arg(long, default_value_t = 1)]
    pub(crate) rounds: usize,
    /// Rates to run, comma separated SETs per second or `max` (default 1000,10000,50000,max)
    #[arg(long)]
    pub(crate) rates: Option<String>,
}

const KEYS: u64 = 100_000;
const CONNECTIONS: usize = 4;
const RATES: [Option<u64>; 4] = [Some(1_000), Some(10_000), Some(50_000), None];

/// `ep_total_persisted` and `ep_commit_num` (journal commits).
fn persisted(c: &mut BinClient) -> Result<(u64, u64)> {
    let s = c.stats("persistence")?;
    let get = |name: &str| {
        s.get(name)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no {name} in STAT"))
    };
    Ok((get("ep_total_persisted")?, get("ep_commit_num")?))
}

/// Waits (bounded) until nothing is left to persist.
fn drain(c: &mut BinClient) -> Result<()> {
    for _ in 0..600 {
        let s = c.stats("persistence")?;
        if s.get("ep_queue_size").is_none_or(|v| v == "0") {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("the flusher did not catch up within 30 s")
}

fn key(i: u64) -> Vec<u8> {
    format!("fl:{i:08}").into_bytes()
}

/// SETs for `secs` at `rate` per second (None: as fast as 100 in flight per connection
/// allow); returns the SETs acknowledged.
fn drive(conns: &mut [BinClient], rate: Option<u64>, secs: u64) -> Result<u64> {
    let value = vec![b'v'; 512];
    let mut rng = crate::bench_memory::rng(17);
    let watch = Stopwatch::start();
    let mut sent = 0u64;
    let slice = Duration::from_millis(10);
    let mut slot = 0u64;
    while watch.elapsed() < Duration::from_secs(secs) {
        let batch = match rate {
            // Spread over the connections, a slice's worth at a time.
            Some(r) => {
                let due = r * (slot + 1) / 100;
                let n = due.saturating_sub(r * slot / 100);
                slot += 1;
                n
            }
            None => 100 * conns.len() as u64,
        };
        let n = conns.len() as u64;
        for (j, c) in conns.iter_mut().enumerate() {
            let share = batch / n + u64::from((j as u64) < batch % n);
            for _ in 0..share {
                let k = key(crate::bench_memory::below(&mut rng, KEYS));
                c.queue_set(Opcode::Set, &k, &value, 1)?;
            }
            c.flush()?;
            for _ in 0..share {
                let r = c.recv()?;
                if r.status != 0 {
                    bail!("SET failed with {:#x}", r.status);
                }
            }
            sent += share;
        }
        if rate.is_some() {
            let next = slice * u32::try_from(slot).unwrap_or(u32::MAX);
            if let Some(wait) = next.checked_sub(watch.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    Ok(sent)
}

/// One rate's measurement on one server.
#[derive(Debug, Clone, Copy)]
struct Sample {
    achieved: f64,
    persisted_per_sec: f64,
    per_commit: f64,
    per_item: f64,
    per_set: f64,
}

/// Starts `bin` on a fresh data directory, loads the keys, and measures each of `rates`.
fn run_server(
    bin: &std::path::Path,
    extra: &[String],
    rates: &[Option<u64>],
    secs: u64,
    log: PathBuf,
) -> Result<Vec<Sample>> {
    let data = tempdir("bench-flusher")?;
    let mut args = vec!["--data-dir".to_owned(), data.path().display().to_string()];
    args.extend(extra.iter().cloned());
    let server = ServerProcess::start_epkv(bin, &args, log)?;
    let pid = server.pid();
    let ticks = process::clock_ticks_per_sec() as f64;
    let mut conns = (0..CONNECTIONS)
        .map(|_| BinClient::connect(&server.addr(), true))
        .collect::<Result<Vec<_>>>()?;
    let mut stats_conn = BinClient::connect(&server.addr(), true)?;
    // Load every key once, so that each rate overwrites.
    let value = vec![b'v'; 512];
    for start in (0..KEYS).step_by(1000) {
        for i in start..start + 1000 {
            conns[0].queue_set(Opcode::SetQ, &key(i), &value, 0)?;
        }
        if !conns[0].fence()?.is_empty() {
            bail!("loading failed");
        }
    }
    drain(&mut stats_conn)?;
    let mut out = Vec::with_capacity(rates.len());
    for &rate in rates {
        let w0 = process::thread_ticks(pid, "epkv-writer")?;
        let s0 = process::cpu_ticks(pid)?;
        let (p0, c0) = persisted(&mut stats_conn)?;
        let watch = Stopwatch::start();
        let sent = drive(&mut conns, rate, secs)?;
        drain(&mut stats_conn)?;
        let elapsed = watch.elapsed().as_secs_f64();
        let (p1, c1) = persisted(&mut stats_conn)?;
        let items = p1.saturating_sub(p0);
        let writer_us =
            process::thread_ticks(pid, "epkv-writer")?.saturating_sub(w0) as f64 / ticks * 1e6;
        let server_us = process::cpu_ticks(pid)?.saturating_sub(s0) as f64 / ticks * 1e6;
        let sample = Sample {
            achieved: sent as f64 / secs as f64,
            persisted_per_sec: items as f64 / elapsed,
            per_commit: items as f64 / c1.saturating_sub(c0).max(1) as f64,
            per_item: writer_us / items.max(1) as f64,
            per_set: server_us / sent.max(1) as f64,
        };
        eprintln!(
            "{}: {:.0} SETs/s, {items} persisted, {:.2} us writer CPU per item",
            label(rate),
            sample.achieved,
            sample.per_item
        );
        out.push(sample);
    }
    crate::bench_memory::stop(server);
    drop(data);
    Ok(out)
}

fn label(rate: Option<u64>) -> String {
    rate.map_or_else(|| "max".to_owned(), |r| r.to_string())
}

fn parse_rate(s: &str) -> Result<Option<u64>> {
    if s == "max" {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .with_context(|| format!("rate {s:?}: a number or max"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Rate `r`'s median over `rounds`, field by field.
fn median_sample(rounds: &[Vec<Sample>], r: usize) -> Sample {
    let col = |f: fn(&Sample) -> f64| median(rounds.iter().map(|s| f(&s[r])).collect());
    Sample {
        achieved: col(|s| s.achieved),
        persisted_per_sec: col(|s| s.persisted_per_sec),
        per_commit: col(|s| s.per_commit),
        per_item: col(|s| s.per_item),
        per_set: col(|s| s.per_set),
    }
}

/// Runs the bench and writes its report.
pub(crate) fn bench_flusher(opts: &FlusherOptions) -> Result<()> {
    let bin = process::release_server_bin(opts.epkv_bin.as_ref())?;
    let secs = opts.secs.unwrap_or(if opts.quick { 3 } else { 10 }).max(1);
    let rates: Vec<Option<u64>> = match &opts.rates {
        Some(list) => list.split(',').map(parse_rate).collect::<Result<_>>()?,
        None => RATES.to_vec(),
    };
    let out_dir = util::target_dir().join("bench");
    std::fs::create_dir_all(&out_dir)?;
    // (name, binary): the build under test, then the one to compare with, if any; the
    // rounds alternate them so that the machine's drift falls on both.
    let mut builds = vec![(
        "epkv-as-shipped".to_owned(),
        bin.clone(),
        opts.epkv_args.clone(),
    )];
    if opts.compare_bin.is_some() || !opts.compare_args.is_empty() {
        let other = opts.compare_bin.clone().unwrap_or(bin);
        let args = if opts.compare_args.is_empty() {
            opts.epkv_args.clone()
        } else {
            opts.compare_args.clone()
        };
        builds.push(("compare".to_owned(), other, args));
    }
    let rounds = opts.rounds.max(1);
    let mut samples: Vec<Vec<Vec<Sample>>> = vec![Vec::new(); builds.len()];
    for round in 0..rounds {
        for (i, (name, b, args)) in builds.iter().enumerate() {
            eprintln!(
                "round {} of {rounds}: {name} ({} {})",
                round + 1,
                b.display(),
                args.join(" ")
            );
            let log = out_dir.join(format!("flusher-{name}.log"));
            samples[i].push(run_server(b, args, &rates, secs, log)?);
        }
    }
    let mut rows = Vec::new();
    let mut md = format!(
        "### Persistence CPU per persisted item (epkv as shipped; median of {rounds} round(s))\n\n\
         | build | target SETs/s | achieved SETs/s | items persisted/s | items per commit | writer CPU µs per persisted item (each round) | server CPU µs per SET |\n\
         |---|---|---:|---:|---:|---:|---:|\n",
    );
    // Each build's medians over the rounds, per rate.
    let medians: Vec<Vec<Sample>> = samples
        .iter()
        .map(|rounds| (0..rates.len()).map(|r| median_sample(rounds, r)).collect())
        .collect();
    for (i, (name, b, args)) in builds.iter().enumerate() {
        for (r, &rate) in rates.iter().enumerate() {
            let m = medians[i][r];
            let each: Vec<String> = samples[i]
                .iter()
                .map(|s| format!("{:.2}", s[r].per_item))
                .collect();
            let label = label(rate);
            rows.push(json!({"bench": "flusher/cpu_per_persisted_item",
                "params": {"target_sets_per_sec": label, "secs": secs, "value_bytes": 512, "keys": KEYS, "connections": CONNECTIONS, "rounds": rounds, "binary": b.display().to_string(), "args": args},
                "impl": name, "items_per_sec": m.persisted_per_sec,
                "ns_per_op": m.per_item * 1e3, "writer_cpu_us_per_item": m.per_item,
                "server_cpu_us_per_set": m.per_set, "sets_per_sec": m.achieved,
                "items_per_commit": m.per_commit}));
            md.push_str(&format!(
                "| {name} | {label} | {:.0} | {:.0} | {:.1} | **{:.2}** ({}) | {:.2} |\n",
                m.achieved,
                m.persisted_per_sec,
                m.per_commit,
                m.per_item,
                each.join(", "),
                m.per_set
            ));
        }
    }
    if let [shipped, compare] = medians.as_slice() {
        md.push_str("\nRatios (as shipped / compare, writer CPU per item, medians): ");
        let parts: Vec<String> = rates
            .iter()
            .zip(shipped.iter().zip(compare))
            .map(|(&rate, (a, b))| {
                format!(
                    "{} {:.2}x",
                    label(rate),
                    a.per_item / b.per_item.max(f64::MIN_POSITIVE)
                )
            })
            .collect();
        md.push_str(&parts.join(", "));
        md.push('\n');
    }
    md.push_str(
        "\nGoal: at most 1.5 µs of writer CPU per persisted item at 50k SETs/s and above.\n",
    );
    std::fs::write(
        out_dir.join("flusher.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    std::fs::write(out_dir.join("flusher.md"), &md)?;
    println!("\n{md}");
    Ok(())
}
