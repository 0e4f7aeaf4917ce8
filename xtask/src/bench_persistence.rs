//! `cargo xtask bench persistence`: the seed's persistTo pillowfight run against epkv.
//!
//! Builds the release `epkv-server` and `epkv-fight`, measures the disk floor of the data
//! directory's filesystem (append 4 KiB + fdatasync, repeated), then for each connection
//! count starts a fresh server on its own temporary data directory (removed afterwards)
//! and runs `epkv-fight` at PersistToMajority. Prints each run's histogram, then a table
//! with mean/p50/p99/p99.9, ops/s, p50 as a multiple of the disk floor, and the seed's
//! kv_engine averages alongside. Writes `target/bench/persistence.json` and `.md`.
//!
//! Every connection count runs in three storage modes, side by side: `journal` (as
//! shipped: one journal fdatasync per batch per shard, data files kept open),
//! `no-journal` (`--journal false`: a sync per vBucket data file per batch, files kept
//! open; KV-Engine after the seed's fix) and `reopen` (`--journal false --fd-budget 1`:
//! also reopening the data files, KV-Engine before it).

use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::memcapable::tempdir;
use crate::process::{self, ServerProcess};
use crate::util::{self, Stopwatch};

/// Options of `cargo xtask bench persistence`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct PersistenceOptions {
    /// A few seconds per run: connections 1 and 500, 20k keys (default: 1 and 2000, 200k keys).
    #[arg(long)]
    pub(crate) quick: bool,
    /// Seconds per run (default: 5 quick, 20 full).
    #[arg(long)]
    pub(crate) secs: Option<u64>,
    /// Connection counts, comma separated (overrides --quick).
    #[arg(long, value_delimiter = ',')]
    pub(crate) connections: Option<Vec<usize>>,
    /// Pre-loaded keys (overrides --quick).
    #[arg(long)]
    pub(crate) keys: Option<u64>,
    /// Storage modes to run, comma separated: journal, no-journal, reopen (default all).
    #[arg(long, value_delimiter = ',', value_parser = ["journal", "no-journal", "reopen"])]
    pub(crate) modes: Option<Vec<String>>,
}

/// The server flags of a storage mode.
fn mode_args(mode: &str) -> &'static [&'static str] {
    match mode {
        "no-journal" => &["--journal", "false"],
        "reopen" => &["--journal", "false", "--fd-budget", "1"],
        _ => &["--journal", "true"],
    }
}

/// The seed's cbc-pillowfight averages (ms): (threads, before, after).
const SEED_MS: [(usize, f64, f64); 2] = [(1, 4.8, 4.6), (2000, 748.0, 614.0)];

/// fdatasync samples for the disk floor.
const FLOOR_SAMPLES: usize = 200;

/// One measured run.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub(crate) connections: usize,
    /// Storage mode: journal, no-journal or reopen.
    pub(crate) mode: String,
    /// `epkv-fight`'s `fight-result` object.
    pub(crate) result: Value,
}

/// Median latency in microseconds of appending 4 KiB and fdatasync-ing, `samples` times,
/// in a file under `dir` (removed afterwards).
pub(crate) fn disk_floor_us(dir: &Path, samples: usize) -> Result<f64> {
    let path = dir.join("disk-floor.tmp");
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("open {}", path.display()))?;
    let block = vec![0x5au8; 4096];
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let watch = Stopwatch::start();
        f.write_all(&block)?;
        f.sync_data()?;
        times.push(watch.elapsed().as_secs_f64() * 1e6);
    }
    drop(f);
    std::fs::remove_file(&path)?;
    times.sort_by(f64::total_cmp);
    Ok(times.get(times.len() / 2).copied().unwrap_or(f64::NAN))
}

/// Returns the soft open-file limit of process `pid` from `/proc/<pid>/limits`.
fn nofile_limit(pid: u32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    let mut words = line.split_whitespace().skip(3);
    let soft = words.next()?.parse().ok()?;
    let hard = words.next()?.parse().ok()?;
    Some((soft, hard))
}

/// Makes sure this process (and so the server and epkv-fight it starts) may open `need`
/// files: raises the soft RLIMIT_NOFILE to the hard limit with util-linux `prlimit` when
/// it is lower, and fails if even the hard limit is too low.
pub(crate) fn ensure_nofile(need: u64) -> Result<()> {
    let pid = std::process::id();
    let Some((soft, hard)) = nofile_limit(pid) else {
        return Ok(());
    };
    if soft >= need {
        return Ok(());
    }
    if hard < need {
        bail!("{need} open files needed but the hard limit is {hard}; raise it (ulimit -Hn)");
    }
    util::run(Command::new("prlimit").args([
        "--pid",
        &pid.to_string(),
        &format!("--nofile={hard}:{hard}"),
    ]))?;
    eprintln!("raised RLIMIT_NOFILE from {soft} to {hard}");
    Ok(())
}

/// Extracts the JSON of the `fight-result: {...}` line.
pub(crate) fn parse_fight(stdout: &str) -> Option<Value> {
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("fight-result: "))?;
    serde_json::from_str(line).ok()
}

fn fight_bin() -> PathBuf {
    util::target_dir().join("release").join("epkv-fight")
}

/// Builds the release `epkv-server` and `epkv-fight` the fight benchmarks run.
pub(crate) fn build_server_and_fight() -> Result<()> {
    util::run(util::cargo().args([
        "build",
        "--release",
        "-p",
        "epkv-server",
        "-p",
        "epkv-bench",
        "--bin",
        "epkv-server",
        "--bin",
        "epkv-fight",
    ]))
}

/// One `epkv-fight` run: its command line, whether it succeeded, and its stdout (echoed).
pub(crate) struct FightRun {
    pub(crate) line: String,
    pub(crate) ok: bool,
    pub(crate) stdout: String,
}

impl FightRun {
    /// Runs the release `epkv-fight` against `addr`.
    pub(crate) fn start(
        addr: &str,
        conns: usize,
        keys: u64,
        secs: u64,
        durability: &str,
    ) -> Result<FightRun> {
        let mut cmd = Command::new(fight_bin());
        cmd.args(["--addr", addr])
            .args(["--connections", &conns.to_string()])
            .args(["--keys", &keys.to_string()])
            .args(["--secs", &secs.to_string()])
            .args(["--durability", durability])
            .stdin(Stdio::null())
            .stderr(Stdio::inherit());
        let line = util::describe(&cmd);
        println!("\n$ {line}");
        let out = cmd.output().with_context(|| format!("run `{line}`"))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        print!("{stdout}");
        Ok(FightRun {
            line,
            ok: out.status.success(),
            stdout,
        })
    }

    /// The `fight-result` object, or the failure.
    pub(crate) fn result(&self) -> Result<Value> {
        if !self.ok {
            bail!("`{}` failed", self.line);
        }
        parse_fight(&self.stdout).with_context(|| format!("no fight-result from `{}`", self.line))
    }
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

/// Builds the JSON rows (one per run; `impl` epkv).
pub(crate) fn rows(runs: &[Run], floor_us: f64) -> Vec<Value> {
    runs.iter()
        .map(|r| {
            let x = &r.result;
            let ips = num(x, "items_per_sec");
            json!({
                "bench": "persistence/set_persist_majority",
                "params": {
                    "connections": r.connections,
                    "keys": x["keys"],
                    "value_bytes": x["value_bytes"],
                    "durability": x["durability"],
                    "mode": r.mode,
                    "journal": if r.mode == "journal" { "on" } else { "off" },
                    "files": if r.mode == "reopen" { "reopened" } else { "kept open" },
                    "client": "epkv-fight",
                },
                "impl": "epkv",
                "items_per_sec": ips,
                "ns_per_op": 1e9 / ips,
                "mean_us": x["mean_us"],
                "p50_us": x["p50_us"],
                "p99_us": x["p99_us"],
                "p999_us": x["p999_us"],
                "max_us": x["max_us"],
                "ops": x["ops"],
                "errors": x["errors"],
                "secs": x["secs"],
                "disk_floor_us": floor_us,
                "p50_over_disk_floor": num(x, "p50_us") / floor_us,
            })
        })
        .collect()
}

/// The markdown table, with the seed's averages and ratios.
pub(crate) fn markdown(runs: &[Run], floor_us: f64, secs: u64) -> Result<String> {
    let mut md = String::new();
    writeln!(
        md,
        "### Persistence: PersistToMajority SET latency (epkv-fight)"
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "{secs} s per run, fresh server and data directory per run; disk floor (median \
         append 4 KiB + fdatasync on the data directory's filesystem) {floor_us:.0} us."
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "| conns | mode | ops/s | mean | p50 | p99 | p99.9 | errors | p50 / disk floor | p50 / journal p50 | seed avg before / after (threads) | epkv mean / seed after |"
    )?;
    writeln!(
        md,
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )?;
    for r in runs {
        let x = &r.result;
        let mean_ms = num(x, "mean_us") / 1e3;
        // The seed ran 1 and 2000 threads: one connection against its 1-thread run, any
        // concurrent run against its 2000-thread run.
        let seed = if r.connections <= 1 {
            SEED_MS[0]
        } else {
            SEED_MS[1]
        };
        let journal_p50 = runs
            .iter()
            .find(|j| j.connections == r.connections && j.mode == "journal")
            .map_or(f64::NAN, |j| num(&j.result, "p50_us"));
        writeln!(
            md,
            "| {} | {} | {:.0} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {} | {:.1}x | {:.2}x | {} / {} ms ({}) | {:.3} |",
            r.connections,
            r.mode,
            num(x, "items_per_sec"),
            mean_ms,
            num(x, "p50_us") / 1e3,
            num(x, "p99_us") / 1e3,
            num(x, "p999_us") / 1e3,
            x["errors"],
            num(x, "p50_us") / floor_us,
            num(x, "p50_us") / journal_p50,
            seed.1,
            seed.2,
            seed.0,
            mean_ms / seed.2,
        )?;
    }
    writeln!(md)?;
    writeln!(
        md,
        "The seed numbers are kv_engine under cbc-pillowfight on other hardware, shown for \
         scale only; p50 / disk floor is the figure comparable across machines."
    )?;
    Ok(md)
}

/// Runs the benchmark and writes the report files.
pub(crate) fn bench_persistence(opts: &PersistenceOptions) -> Result<()> {
    let secs = opts.secs.unwrap_or(if opts.quick { 5 } else { 20 });
    let conns = opts.connections.clone().unwrap_or_else(|| {
        if opts.quick {
            vec![1, 500]
        } else {
            vec![1, 2000]
        }
    });
    let keys = opts
        .keys
        .unwrap_or(if opts.quick { 20_000 } else { 200_000 });
    build_server_and_fight()?;
    let server_bin = process::epkv_server_bin("release");
    let out_dir = util::target_dir().join("bench");
    std::fs::create_dir_all(&out_dir)?;
    let floor_dir = tempdir("bench-persistence-floor")?;
    let floor_us = disk_floor_us(floor_dir.path(), FLOOR_SAMPLES)?;
    drop(floor_dir);
    println!(
        "disk floor: {floor_us:.0} us per 4 KiB append + fdatasync (median of {FLOOR_SAMPLES})"
    );
    let max_conns = conns.iter().copied().max().unwrap_or(1);
    // Each connection is a socket in the client and one in the server, plus files.
    ensure_nofile(max_conns as u64 + 512)?;
    let total = Stopwatch::start();
    let mut runs = Vec::new();
    let modes = opts.modes.clone().unwrap_or_else(|| {
        ["journal", "no-journal", "reopen"]
            .map(String::from)
            .to_vec()
    });
    // Modes alternate within each connection count, so noise hits them alike.
    for (c, mode) in conns
        .iter()
        .flat_map(|&c| modes.iter().map(move |m| (c, m.clone())))
    {
        let data = tempdir("bench-persistence")?;
        let mut args = vec![
            "--data-dir".into(),
            data.path().display().to_string(),
            "--max-connections".into(),
            (max_conns + 256).to_string(),
        ];
        args.extend(mode_args(&mode).iter().map(|a| (*a).to_owned()));
        let log = out_dir.join(format!("persistence-epkv-{mode}-{c}.log"));
        let mut server = ServerProcess::start_epkv(&server_bin, &args, log)?;
        let fought = FightRun::start(&server.addr(), c, keys, secs, "persist-majority")?;
        let line = fought.line.clone();
        let alive = server.is_running();
        let stopped = server.stop();
        drop(data);
        if !alive {
            bail!("epkv died during `{line}`");
        }
        stopped?;
        let result = fought.result()?;
        runs.push(Run {
            connections: c,
            mode,
            result,
        });
    }
    let json_path = out_dir.join("persistence.json");
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&rows(&runs, floor_us))?,
    )?;
    let md = markdown(&runs, floor_us, secs)?;
    let md_path = out_dir.join("persistence.md");
    std::fs::write(&md_path, &md)?;
    println!("\n{md}");
    println!(
        "bench persistence: {} runs in {}; wrote {} and {}",
        runs.len(),
        util::fmt_duration(total.elapsed()),
        json_path.display(),
        md_path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(c: usize) -> Run {
        Run {
            connections: c,
            mode: "journal".into(),
            result: json!({"connections": c, "keys": 10, "value_bytes": 512,
                "durability": "persist-majority", "ops": 100, "errors": 0, "secs": 1.0,
                "items_per_sec": 100.0, "mean_us": 4600.0, "p50_us": 2000, "p99_us": 9000,
                "p999_us": 9500, "max_us": 9999}),
        }
    }

    #[test]
    fn own_nofile_limit_is_readable() {
        let (soft, hard) = nofile_limit(std::process::id()).unwrap();
        assert!(soft <= hard);
        assert!(ensure_nofile(1).is_ok());
    }

    #[test]
    fn fight_result_line_parses() {
        let v = parse_fight("[1us - 2us] ...\nfight-result: {\"ops\": 3}\n").unwrap();
        assert_eq!(v["ops"], 3);
        assert!(parse_fight("nothing").is_none());
    }

    #[test]
    fn rows_and_markdown_carry_ratios() {
        let runs = [run(1), run(2000)];
        let rows = rows(&runs, 1000.0);
        assert_eq!(rows[0]["impl"], "epkv");
        assert_eq!(rows[0]["p50_over_disk_floor"], 2.0);
        assert_eq!(rows[1]["params"]["connections"], 2000);
        assert_eq!(rows[1]["ns_per_op"], 1e7);
        let md = markdown(&runs, 1000.0, 5).unwrap();
        assert!(
            md.contains("| 1 | journal | 100 | 4.60 ms | 2.00 ms | 9.00 ms | 9.50 ms | 0 | 2.0x | 1.00x | 4.8 / 4.6 ms (1) | 1.000 |"),
            "{md}"
        );
        assert_eq!(rows[0]["params"]["journal"], "on");
        assert!(md.contains("748 / 614 ms (2000)"), "{md}");
        // A journal-off run is compared with the journal run at its connection count.
        let mut off = run(1);
        off.mode = "reopen".into();
        off.result["p50_us"] = json!(5000);
        let rows = super::rows(&[run(1), off.clone()], 1000.0);
        assert_eq!(rows[1]["params"]["journal"], "off");
        assert_eq!(rows[1]["params"]["files"], "reopened");
        let md = markdown(&[run(1), off], 1000.0, 5).unwrap();
        assert!(
            md.contains("| 1 | reopen | 100 | 4.60 ms | 5.00 ms |"),
            "{md}"
        );
        assert!(md.contains("| 5.0x | 2.50x |"), "{md}");
        let md = markdown(&[run(500)], 1000.0, 5).unwrap();
        assert!(md.contains("748 / 614 ms (2000)"), "{md}");
    }

    #[test]
    fn disk_floor_is_positive() {
        let dir = tempdir("disk-floor-test").unwrap();
        let us = disk_floor_us(dir.path(), 3).unwrap();
        assert!(us > 0.0);
        assert!(!dir.path().join("disk-floor.tmp").exists());
    }
}
