//! Writes past the quota: SET throughput of a persistent epkv bucket whose data set is 4x
//! its memory quota, against the same load on a bucket whose quota is twice the data set
//! (everything fits), in the same run.
//!
//! Each case starts a fresh epkv-server with persistence on (the defaults) and its own
//! data directory, then runs two phases with [`CONNECTIONS`] connections, each keeping
//! [`DEPTH`] SETs of 512-byte values in flight:
//!
//! 1. `load`: every key once, in order (connection `c` writes keys `c`, `c + C`, ...);
//! 2. `random`: uniformly random keys for a fixed time.
//!
//! A SET answered TMPFAIL (no room under the quota yet: the pager must eject values the
//! flusher has persisted) is counted and sent again after a back-off of 1 ms, doubling
//! up to 16 ms while refusals go on. Ops/s counts acknowledged SETs only.
//!
//! The two cases run in rounds, alternating which goes first; each figure is the median
//! over the rounds, and the ratio is also given per round (the two runs of a round are
//! back to back, so load from elsewhere on the machine hits both alike).

use std::fmt::Write as _;
use std::path::Path;
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::json;

use super::per_item::key_of;
use super::wire::BinClient;
use super::{Section, stat, stop};
use crate::memcapable::tempdir;
use crate::process::ServerProcess;
use crate::util::Stopwatch;
use epkv_protocol::{Opcode, Status};

/// Value length.
pub(crate) const VALUE_BYTES: usize = 512;
/// Client connections, one thread each.
pub(crate) const CONNECTIONS: usize = 8;
/// SETs in flight per connection.
pub(crate) const DEPTH: usize = 16;
/// Longest the `load` phase may take before the bench gives up.
const LOAD_LIMIT: Duration = Duration::from_secs(300);
/// Longest back-off after a TMPFAIL.
const MAX_BACKOFF: Duration = Duration::from_millis(16);

/// The two quotas compared, as (impl name, quota / data set).
const CASES: [(&str, f64); 2] = [("epkv", 0.25), ("epkv-fits", 2.0)];

/// What the writers of one phase did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Phase {
    /// SETs acknowledged with success.
    pub(crate) ops: u64,
    /// TMPFAIL replies (each retried).
    pub(crate) tmpfails: u64,
    /// Wall seconds of the phase.
    pub(crate) secs: f64,
}

impl Phase {
    pub(crate) fn rate(&self) -> f64 {
        self.ops as f64 / self.secs
    }
}

/// One case: a server with one quota, both phases, and its stats at the end.
#[derive(Debug, Clone)]
pub(crate) struct Case {
    pub(crate) implementation: &'static str,
    pub(crate) keys: u64,
    pub(crate) quota: u64,
    pub(crate) load: Phase,
    pub(crate) random: Phase,
    /// `vb_active_perc_mem_resident` after the random phase.
    pub(crate) resident_pct: f64,
    /// `ep_tmp_oom_errors` after the random phase.
    pub(crate) tmp_oom_errors: f64,
    /// `mem_used` after the random phase.
    pub(crate) mem_used: f64,
}

impl Case {
    fn data_bytes(&self) -> u64 {
        self.keys * VALUE_BYTES as u64
    }
}

/// Which keys a writer sends.
#[derive(Debug, Clone)]
enum Keys {
    /// `next`, `next + step`, ... below `end`.
    Strided { next: u64, step: u64, end: u64 },
    /// Uniformly random below `keys`.
    Random { rng: Box<super::Rng>, keys: u64 },
}

impl Iterator for Keys {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        match self {
            Keys::Strided { next, step, end } => {
                let k = *next;
                *next += *step;
                (k < *end).then_some(k)
            }
            Keys::Random { rng, keys } => Some(super::below(rng, *keys)),
        }
    }
}

/// One connection's writer: SETs from `keys` with [`DEPTH`] in flight, until the keys run
/// out or `limit` has passed since `start`. Returns (acknowledged, TMPFAIL replies, done).
fn writer(
    addr: &str,
    mut keys: Keys,
    pool: &[u8],
    start: Stopwatch,
    limit: Duration,
) -> Result<(u64, u64, bool)> {
    let mut c = BinClient::connect(addr, true)?;
    let (mut ops, mut tmpfails) = (0u64, 0u64);
    let mut retry: Vec<u64> = Vec::new();
    let mut batch: Vec<u64> = Vec::with_capacity(DEPTH);
    let mut backoff = Duration::from_millis(1);
    let span = (pool.len() - VALUE_BYTES) as u64;
    let mut round = 0u64;
    while start.elapsed() < limit {
        batch.clear();
        while batch.len() < DEPTH {
            match retry.pop().or_else(|| keys.next()) {
                Some(k) => batch.push(k),
                None => break,
            }
        }
        if batch.is_empty() {
            return Ok((ops, tmpfails, true));
        }
        round += 1;
        for (n, &k) in batch.iter().enumerate() {
            let off = usize::try_from((k.wrapping_mul(7919) + round) % span).unwrap_or(0);
            c.queue_set(
                Opcode::Set,
                &key_of(k),
                &pool[off..off + VALUE_BYTES],
                n as u32,
            )?;
        }
        c.flush()?;
        let mut refused = false;
        for (n, &k) in batch.iter().enumerate() {
            let r = c.recv()?;
            if r.opaque != n as u32 {
                bail!("reply out of order: opaque {} for request {n}", r.opaque);
            }
            match Status::from_u16(r.status) {
                Some(Status::Success) => ops += 1,
                Some(Status::Etmpfail) => {
                    tmpfails += 1;
                    retry.push(k);
                    refused = true;
                }
                _ => bail!("SET of key {k} answered status {:#x}", r.status),
            }
        }
        if refused {
            thread::sleep(backoff);
            backoff = (backoff * 2).min(MAX_BACKOFF);
        } else {
            backoff = Duration::from_millis(1);
        }
    }
    Ok((ops, tmpfails, false))
}

/// Runs [`CONNECTIONS`] writers, the `c`-th with `keys_of(c)`, and sums what they did.
fn phase(
    addr: &str,
    pool: &[u8],
    limit: Duration,
    keys_of: impl Fn(usize) -> Keys,
) -> Result<(Phase, bool)> {
    let start = Stopwatch::start();
    let results: Vec<Result<(u64, u64, bool)>> = thread::scope(|s| {
        let handles: Vec<_> = (0..CONNECTIONS)
            .map(|c| {
                let keys = keys_of(c);
                s.spawn(move || writer(addr, keys, pool, start, limit))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("writer panicked")))
            })
            .collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let mut p = Phase {
        secs,
        ..Phase::default()
    };
    let mut all_done = true;
    for r in results {
        let (ops, tmpfails, done) = r?;
        p.ops += ops;
        p.tmpfails += tmpfails;
        all_done &= done;
    }
    Ok((p, all_done))
}

/// Writes keys `0..keys` once (the `load` phase) to the server at `addr`, retrying
/// TMPFAIL; fails unless every key was acknowledged within the time limit.
pub(crate) fn load(addr: &str, keys: u64, pool: &[u8]) -> Result<Phase> {
    let step = CONNECTIONS as u64;
    let (p, done) = phase(addr, pool, LOAD_LIMIT, |c| Keys::Strided {
        next: c as u64,
        step,
        end: keys,
    })?;
    if !done {
        bail!(
            "the load of {keys} keys did not finish within {LOAD_LIMIT:?} ({} acknowledged, \
             {} TMPFAIL)",
            p.ops,
            p.tmpfails
        );
    }
    Ok(p)
}

/// Runs one case on a fresh persistent server with `quota` bytes.
fn run_case(
    bin: &Path,
    implementation: &'static str,
    keys: u64,
    quota: u64,
    secs: u64,
    pool: &[u8],
    logs: &Path,
) -> Result<Case> {
    let data = tempdir(&format!("bench-memory-quota-{implementation}"))?;
    let args = [
        "--memory-quota".to_owned(),
        quota.to_string(),
        "--data-dir".to_owned(),
        data.path().display().to_string(),
    ];
    let log = logs.join(format!("memory-quota-{implementation}.log"));
    let mut server = ServerProcess::start_epkv(bin, &args, log)?;
    let addr = server.addr();
    let load = load(&addr, keys, pool)?;
    eprintln!(
        "{implementation}: loaded {keys} keys in {:.1} s ({:.0}/s, {} TMPFAIL)",
        load.secs,
        load.rate(),
        load.tmpfails
    );
    let (random, _) = phase(&addr, pool, Duration::from_secs(secs), |c| Keys::Random {
        rng: Box::new(super::rng(0x5e7 + c as u64)),
        keys,
    })?;
    if !server.is_running() {
        bail!(
            "{implementation} died during the writes; log:\n{}",
            server.log_tail()
        );
    }
    let stats = BinClient::connect(&addr, true)?.stats("")?;
    let case = Case {
        implementation,
        keys,
        quota,
        load,
        random,
        resident_pct: stat::<f64>(&stats, "vb_active_perc_mem_resident")?,
        tmp_oom_errors: stat::<f64>(&stats, "ep_tmp_oom_errors")?,
        mem_used: stat::<f64>(&stats, "mem_used")?,
    };
    eprintln!(
        "{implementation}: {:.0} random SETs/s, {} TMPFAIL, {:.0}% resident",
        random.rate(),
        random.tmpfails,
        case.resident_pct
    );
    stop(server);
    drop(data);
    Ok(case)
}

/// The run whose rate is the median of `phases` (the lower middle for an even count).
fn median_phase(mut phases: Vec<Phase>) -> Phase {
    phases.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
    phases
        .get(phases.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or_default()
}

/// Per implementation (in first-seen order): the median load and random phases over its
/// runs, and the stats of its last run.
pub(crate) fn summarise(runs: &[Case]) -> Vec<Case> {
    let mut out: Vec<Case> = Vec::new();
    for r in runs {
        if out.iter().any(|o| o.implementation == r.implementation) {
            continue;
        }
        let same: Vec<&Case> = runs
            .iter()
            .filter(|o| o.implementation == r.implementation)
            .collect();
        let Some(last) = same.last() else { continue };
        out.push(Case {
            load: median_phase(same.iter().map(|c| c.load).collect()),
            random: median_phase(same.iter().map(|c| c.random).collect()),
            ..(*last).clone()
        });
    }
    out
}

/// Per round, epkv's rate over epkv-fits's in the same round: (load, random).
pub(crate) fn round_ratios(runs: &[Case]) -> Vec<(f64, f64)> {
    let of = |name: &'static str| runs.iter().filter(move |c| c.implementation == name);
    of("epkv")
        .zip(of("epkv-fits"))
        .map(|(e, f)| {
            (
                e.load.rate() / f.load.rate(),
                e.random.rate() / f.random.rate(),
            )
        })
        .collect()
}

/// Runs both cases `rounds` times, alternating which goes first, and reports.
pub(crate) fn run(bin: &Path, keys: u64, secs: u64, rounds: usize, logs: &Path) -> Result<Section> {
    let data = keys * VALUE_BYTES as u64;
    let pool = super::random_bytes((1 << 20) + VALUE_BYTES + 1, 0xda7a);
    let mut runs = Vec::new();
    for round in 0..rounds {
        let mut order = CASES.to_vec();
        if round % 2 == 1 {
            order.reverse();
        }
        for (implementation, quota_over_data) in order {
            let quota = (data as f64 * quota_over_data) as u64;
            let case = run_case(bin, implementation, keys, quota, secs, &pool, logs)
                .with_context(|| format!("writes past the quota, {implementation}"))?;
            runs.push(case);
        }
    }
    let cases = summarise(&runs);
    let ratios = round_ratios(&runs);
    Ok(Section {
        rows: rows(&cases, &ratios, secs),
        md: markdown(&cases, &ratios, secs)?,
    })
}

/// The JSON rows: per case, one for each phase; epkv's carry the ratio to epkv-fits (of
/// the medians, and the median of the per-round ratios).
pub(crate) fn rows(cases: &[Case], ratios: &[(f64, f64)], secs: u64) -> Vec<serde_json::Value> {
    let fits = cases.iter().find(|c| c.implementation == "epkv-fits");
    let mut rows = Vec::new();
    for c in cases {
        for (name, p, fit, paired) in [
            (
                "load",
                c.load,
                fits.map(|f| f.load),
                crate::util::median(ratios.iter().map(|r| r.0).collect()),
            ),
            (
                "random",
                c.random,
                fits.map(|f| f.random),
                crate::util::median(ratios.iter().map(|r| r.1).collect()),
            ),
        ] {
            let mut row = json!({
                "bench": format!("memory/writes_past_quota/{name}"),
                "params": {
                    "keys": c.keys,
                    "value_bytes": VALUE_BYTES,
                    "connections": CONNECTIONS,
                    "depth": DEPTH,
                    "quota_bytes": c.quota,
                    "data_over_quota": c.data_bytes() as f64 / c.quota as f64,
                    "secs": if name == "random" { secs as f64 } else { p.secs },
                    "persistence": true,
                    "rounds": ratios.len().max(1),
                },
                "impl": c.implementation,
                "items_per_sec": p.rate(),
                "ns_per_op": 1e9 / p.rate(),
                "ops": p.ops,
                "tmpfails": p.tmpfails,
                "secs": p.secs,
                "resident_pct_after": c.resident_pct,
                "ep_tmp_oom_errors_after": c.tmp_oom_errors,
                "mem_used_after": c.mem_used,
            });
            if let Some(f) = fit.filter(|_| c.implementation == "epkv") {
                row["ratio_vs_fits"] = json!(p.rate() / f.rate());
                row["paired_ratio_vs_fits"] = json!(paired);
            }
            rows.push(row);
        }
    }
    rows
}

/// The markdown section.
pub(crate) fn markdown(cases: &[Case], ratios: &[(f64, f64)], secs: u64) -> Result<String> {
    let mut md = String::new();
    let keys = cases.first().map_or(0, |c| c.keys);
    writeln!(md, "### Writes past the quota")?;
    writeln!(md)?;
    writeln!(
        md,
        "{keys} keys of {VALUE_BYTES}-byte values ({:.0} MiB of values), persistent bucket, \
         {CONNECTIONS} connections with {DEPTH} SETs in flight each: `load` writes every key \
         once, `random` writes uniformly random keys for {secs} s. TMPFAIL replies are retried \
         after a back-off and counted; ops/s counts acknowledged SETs. Median of {} rounds \
         (the round with the median rate; its TMPFAIL count).",
        (keys * VALUE_BYTES as u64) as f64 / 1048576.0,
        ratios.len().max(1)
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "| case | quota | data / quota | phase | ops/s | TMPFAIL | resident after | ratio to epkv-fits |"
    )?;
    writeln!(md, "|---|---:|---:|---|---:|---:|---:|---:|")?;
    let fits = cases.iter().find(|c| c.implementation == "epkv-fits");
    for c in cases {
        for (name, p, fit) in [
            ("load", c.load, fits.map(|f| f.load)),
            ("random", c.random, fits.map(|f| f.random)),
        ] {
            writeln!(
                md,
                "| {} | {:.1} MiB | {:.2} | {name} | {:.0} | {} | {:.0}% | {:.2}x |",
                c.implementation,
                c.quota as f64 / 1048576.0,
                c.data_bytes() as f64 / c.quota as f64,
                p.rate(),
                p.tmpfails,
                c.resident_pct,
                fit.map_or(f64::NAN, |f| p.rate() / f.rate()),
            )?;
        }
    }
    writeln!(md)?;
    let list = |pick: fn(&(f64, f64)) -> f64| {
        ratios
            .iter()
            .map(|r| format!("{:.2}", pick(r)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    writeln!(
        md,
        "Per round, epkv / epkv-fits: load {} (median {:.2}); random {} (median {:.2}).",
        list(|r| r.0),
        crate::util::median(ratios.iter().map(|r| r.0).collect()),
        list(|r| r.1),
        crate::util::median(ratios.iter().map(|r| r.1).collect()),
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "Goal: the bucket at 4x its quota writes at least 0.7x as fast as the one where \
         everything fits."
    )?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_keys_cover_the_range_once() {
        let mut all: Vec<u64> = (0..3)
            .flat_map(|c| Keys::Strided {
                next: c,
                step: 3,
                end: 10,
            })
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
        let mut r = Keys::Random {
            rng: Box::new(crate::bench_memory::rng(1)),
            keys: 5,
        };
        assert!((0..100).all(|_| r.next().is_some_and(|k| k < 5)));
    }

    #[test]
    fn rows_and_markdown_give_the_ratio_to_the_fitting_case() {
        let case = |implementation, quota, rate: f64| Case {
            implementation,
            keys: 1000,
            quota,
            load: Phase {
                ops: 1000,
                tmpfails: 3,
                secs: 1000.0 / rate,
            },
            random: Phase {
                ops: (rate * 2.0) as u64,
                tmpfails: 0,
                secs: 2.0,
            },
            resident_pct: 40.0,
            tmp_oom_errors: 3.0,
            mem_used: 1.0,
        };
        // Two rounds: epkv 800 then 500 per second, epkv-fits 1000 both times.
        let runs = [
            case("epkv", 128_000, 800.0),
            case("epkv-fits", 1_024_000, 1000.0),
            case("epkv-fits", 1_024_000, 1000.0),
            case("epkv", 128_000, 500.0),
        ];
        let cases = summarise(&runs);
        assert_eq!(cases.len(), 2);
        assert_eq!(cases[0].random.rate(), 500.0, "lower middle of two");
        let ratios = round_ratios(&runs);
        assert_eq!(ratios, vec![(0.8, 0.8), (0.5, 0.5)]);
        let rows = rows(&cases, &ratios, 2);
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[0]["bench"], "memory/writes_past_quota/load");
        assert_eq!(rows[0]["params"]["data_over_quota"], 4.0);
        assert_eq!(rows[0]["params"]["rounds"], 2);
        assert_eq!(rows[1]["ratio_vs_fits"], 0.5);
        assert_eq!(rows[1]["paired_ratio_vs_fits"], 0.65);
        assert!(rows[2].get("ratio_vs_fits").is_none());
        let md = markdown(&cases, &ratios, 2).unwrap();
        assert!(
            md.contains("| epkv | 0.1 MiB | 4.00 | random | 500 | 0 | 40% | 0.50x |"),
            "{md}"
        );
        assert!(md.contains("random 0.80, 0.50 (median 0.65)"), "{md}");
    }
}
