//! Background fetches from a cold disk, against raw reads of the same disk in the same run.
//!
//! One persistent epkv-server gets N items of 512-byte values with a quota of about 190
//! bytes per item, so that the item pager ejects the values of all but about a tenth of
//! them. Once the flusher has written everything (`ep_queue_size` 0):
//!
//! - (a) **one GET in flight.** The page cache is dropped, then `samples` GETs of random
//!   keys are timed one at a time; those that needed a background fetch (`ep_bg_fetched`
//!   went up, read after each untimed) give p50/p99. The page cache is dropped again and as
//!   many `pread`s of one document's size (9 + 40 + key + value bytes) at random 4 KiB-
//!   aligned offsets of the server's data files are timed the same way: one disk read,
//!   the floor of a fetch.
//! - (b) **C GETs in flight.** After dropping the page cache, C connections each send
//!   GETs of uniformly random keys, one at a time, for a fixed time. Then the server is
//!   stopped, and `fio` reads a file of the same size as the data files, in the same
//!   directory, with C jobs doing 4 KiB random `pread`s for the same time, also from a
//!   dropped page cache.
//!
//!
//! The machine may have far more memory than the data set, and then a page cache that
//! fills within seconds turns (b) into a CPU comparison. So during (b) the server, and
//! then fio, run in a memory cgroup ([`super::cgroup`]) that lets each take at most
//! `page_cache_mib` of new memory, page cache included (`--page-cache-mib`, 32; 0 turns
//! it off): their reads keep going to the disk. The rows give the cap (`page_cache_mib`,
//! 0 when no cgroup could be made).
//!
//! If the page cache cannot be dropped (not root), the figures are still taken, with a
//! warning, and the rows say `"cold": false`.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::cgroup::MemCgroup;
use super::per_item::{KEY_BYTES, key_of};
use super::quota::{self, VALUE_BYTES};
use super::wire::BinClient;
use super::{Section, drop_caches, percentile, stat, stop};
use crate::memcapable::tempdir;
use crate::process::{self, ServerProcess};
use crate::util::{self, Stopwatch};
use epkv_protocol::Status;

/// Quota per item: 96 bytes of metadata each, plus room for about a tenth of the values
/// between the watermarks.
const QUOTA_PER_ITEM: u64 = 190;
/// Bytes of one stored document: frame header, document header, key, value.
const DOC_BYTES: usize = 9 + 40 + KEY_BYTES + VALUE_BYTES;
/// Longest wait for the flusher to write everything.
const PERSIST_LIMIT: Duration = Duration::from_secs(300);

/// The bench's settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// Items loaded.
    pub(crate) items: u64,
    /// Timed reads in (a), of each kind.
    pub(crate) samples: usize,
    /// Reads in flight in (b).
    pub(crate) concurrency: usize,
    /// Seconds of (b), for each of epkv and fio.
    pub(crate) secs: u64,
    /// The memory cgroup limit of (b), in MiB (0: none).
    pub(crate) page_cache_mib: u64,
}

/// Latency summary in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Latency {
    pub(crate) count: usize,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
}

impl Latency {
    fn of(mut us: Vec<f64>) -> Self {
        us.sort_by(f64::total_cmp);
        Self {
            count: us.len(),
            p50_us: percentile(&us, 0.50),
            p99_us: percentile(&us, 0.99),
        }
    }
}

/// Throughput at C reads in flight.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Throughput {
    pub(crate) ops: u64,
    pub(crate) secs: f64,
    pub(crate) latency: Latency,
}

impl Throughput {
    pub(crate) fn rate(&self) -> f64 {
        self.ops as f64 / self.secs
    }
}

/// Everything measured.
#[derive(Debug, Clone)]
pub(crate) struct Measured {
    pub(crate) settings: Settings,
    pub(crate) quota: u64,
    /// Data files (`*.epkv` or `*.data`) and their total size.
    pub(crate) files: usize,
    pub(crate) file_bytes: u64,
    /// `vb_active_perc_mem_resident` once persisted, before (a).
    pub(crate) resident_pct: f64,
    /// Whether every page-cache drop worked.
    pub(crate) cold: bool,
    /// (a): GETs that needed a fetch, GETs that did not, raw preads.
    pub(crate) fetch: Latency,
    pub(crate) resident: Latency,
    pub(crate) pread: Latency,
    /// (b): epkv GETs, the share of them that needed a fetch, and fio.
    pub(crate) gets: Throughput,
    pub(crate) fetched_share: f64,
    /// Server CPU (user + system) microseconds per GET in (b).
    pub(crate) cpu_us_per_get: f64,
    /// The server's own averages over the fetches of (a), microseconds: from queueing to
    /// the start of the read (`ep_bg_wait_avg`), and the read and restore (`ep_bg_load_avg`).
    pub(crate) bg_wait_avg_us: f64,
    pub(crate) bg_load_avg_us: f64,
    pub(crate) fio: Throughput,
    /// The memory cgroup limit (b) ran under, in MiB; 0 when none.
    pub(crate) page_cache_mib: u64,
}

/// Waits until the flusher has written everything (bounded).
fn wait_persisted(c: &mut BinClient) -> Result<()> {
    let watch = Stopwatch::start();
    loop {
        let p = c.stats("persistence")?;
        if stat::<f64>(&p, "ep_queue_size")? == 0.0 {
            return Ok(());
        }
        if watch.elapsed() > PERSIST_LIMIT {
            bail!(
                "ep_queue_size still {} after {PERSIST_LIMIT:?}",
                p["ep_queue_size"]
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Every data file under `dir`, with its size: the write-once log's `*.epkv` (the default
/// storage) and the `files` backend's `*.data`.
fn data_files(dir: &Path) -> Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("read {}", d.display()))? {
            let entry = entry?;
            let meta = entry.metadata()?;
            let path = entry.path();
            if meta.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "data" || e == "epkv") {
                out.push((path, meta.len()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// (a), epkv: `samples` GETs of distinct random keys, one at a time. Returns the latencies
/// of those that needed a background fetch and of those that did not.
fn single_gets(c: &mut BinClient, items: u64, samples: usize) -> Result<(Latency, Latency)> {
    let mut rng = super::rng(0xc01d);
    let mut seen = HashSet::new();
    let mut fetched_us = Vec::with_capacity(samples);
    let mut resident_us = Vec::new();
    let mut fetches = stat::<f64>(&c.stats("")?, "ep_bg_fetched")?;
    // Distinct keys: at most `items` of them, and a bounded number of draws.
    for _ in 0..samples.saturating_mul(20) {
        if fetched_us.len() + resident_us.len() >= samples.min(items as usize) {
            break;
        }
        let k = super::below(&mut rng, items);
        if !seen.insert(k) {
            continue;
        }
        let key = key_of(k);
        let watch = Stopwatch::start();
        let r = c.get(&key)?;
        let us = watch.elapsed().as_secs_f64() * 1e6;
        if r.status != Status::Success.as_u16() || r.value.len() != VALUE_BYTES {
            bail!(
                "GET key {k} answered status {:#x} with {} bytes",
                r.status,
                r.value.len()
            );
        }
        let now = stat::<f64>(&c.stats("")?, "ep_bg_fetched")?;
        if now > fetches {
            fetched_us.push(us);
        } else {
            resident_us.push(us);
        }
        fetches = now;
    }
    Ok((Latency::of(fetched_us), Latency::of(resident_us)))
}

/// (a), the floor: `samples` preads of [`DOC_BYTES`] at random 4 KiB-aligned offsets of
/// `files` (a file chosen in proportion to its size), each file opened untimed.
fn single_preads(files: &[(PathBuf, u64)], samples: usize) -> Result<Latency> {
    let total: u64 = files.iter().map(|f| f.1).sum();
    if total == 0 {
        bail!("no data files to read");
    }
    let mut rng = super::rng(0xd15c);
    let mut buf = vec![0u8; DOC_BYTES];
    let mut us = Vec::with_capacity(samples);
    for _ in 0..samples {
        let mut at = super::below(&mut rng, total);
        let mut chosen = None;
        for (path, len) in files {
            if at < *len {
                chosen = Some((path, *len));
                break;
            }
            at -= len;
        }
        let Some((path, len)) = chosen else {
            bail!("offset past the data files");
        };
        let off = (at & !4095).min(len.saturating_sub(DOC_BYTES as u64) & !4095);
        let f = File::open(path).with_context(|| format!("open {}", path.display()))?;
        let watch = Stopwatch::start();
        let n = f.read_at(&mut buf, off)?;
        us.push(watch.elapsed().as_secs_f64() * 1e6);
        if n == 0 {
            bail!("read nothing at {off} of {}", path.display());
        }
    }
    Ok(Latency::of(us))
}

/// (b), epkv: `concurrency` connections each with one GET of a random key in flight, for
/// `secs`.
fn concurrent_gets(addr: &str, items: u64, concurrency: usize, secs: u64) -> Result<Throughput> {
    let limit = Duration::from_secs(secs);
    let start = Stopwatch::start();
    let results: Vec<Result<Vec<f64>>> = thread::scope(|s| {
        let handles: Vec<_> = (0..concurrency)
            .map(|n| {
                s.spawn(move || -> Result<Vec<f64>> {
                    let mut c = BinClient::connect(addr, true)?;
                    let mut rng = super::rng(0xbee5 + n as u64);
                    let mut us = Vec::new();
                    while start.elapsed() < limit {
                        let k = super::below(&mut rng, items);
                        let watch = Stopwatch::start();
                        let r = c.get(&key_of(k))?;
                        us.push(watch.elapsed().as_secs_f64() * 1e6);
                        if r.status != Status::Success.as_u16() {
                            bail!("GET key {k} answered status {:#x}", r.status);
                        }
                    }
                    Ok(us)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("reader panicked")))
            })
            .collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let mut all = Vec::new();
    for r in results {
        all.extend(r?);
    }
    Ok(Throughput {
        ops: all.len() as u64,
        secs,
        latency: Latency::of(all),
    })
}

/// Reads fio's JSON output: IOPS and completion-latency percentiles of the read side.
pub(crate) fn parse_fio(text: &str, secs: f64) -> Result<Throughput> {
    // fio may print warnings before the JSON.
    let start = text.find('{').context("no JSON in fio's output")?;
    let v: Value = serde_json::from_str(&text[start..]).context("fio's JSON")?;
    let read = &v["jobs"][0]["read"];
    let ops = read["total_ios"]
        .as_u64()
        .context("no jobs[0].read.total_ios")?;
    let runtime_ms = read["runtime"].as_f64().unwrap_or(secs * 1e3);
    let pct = |p: &str| {
        read["clat_ns"]["percentile"][p]
            .as_f64()
            .map_or(f64::NAN, |ns| ns / 1e3)
    };
    Ok(Throughput {
        ops,
        secs: runtime_ms / 1e3,
        latency: Latency {
            count: usize::try_from(ops).unwrap_or(usize::MAX),
            p50_us: pct("50.000000"),
            p99_us: pct("99.000000"),
        },
    })
}

/// (b), the floor: fio with `concurrency` jobs of 4 KiB random buffered preads of a file
/// of `bytes` in `dir`, for `secs`, from a dropped page cache. Returns the figures and
/// whether the drop worked.
fn fio(
    dir: &Path,
    bytes: u64,
    concurrency: usize,
    secs: u64,
    cap: Option<&MemCgroup>,
) -> Result<(Throughput, bool)> {
    let file = dir.join("fio-randread.dat");
    let common = |cmd: &mut Command| {
        cmd.arg("--name=r")
            .arg(format!("--filename={}", file.display()))
            .arg(format!("--size={bytes}"))
            .args(["--rw=randread", "--bs=4k", "--direct=0", "--ioengine=psync"]);
    };
    let mut layout = Command::new("fio");
    common(&mut layout);
    layout.arg("--create_only=1");
    util::output(&mut layout)?;
    let cold = drop_caches();
    // In the cgroup from its first read: a shell joins it, then becomes fio.
    let mut cmd = match cap {
        Some(cg) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg("echo $$ > \"$0\" && exec fio \"$@\"")
                .arg(cg.procs_file());
            c
        }
        None => Command::new("fio"),
    };
    common(&mut cmd);
    // psync does one read at a time per job, so C jobs keep C reads in flight.
    cmd.arg(format!("--numjobs={concurrency}"))
        .args(["--time_based", "--group_reporting", "--output-format=json"])
        .arg(format!("--runtime={secs}"));
    eprintln!("+ {}", util::describe(&cmd));
    let out = util::output(&mut cmd)?;
    let _ = std::fs::remove_file(&file);
    Ok((parse_fio(&out, secs as f64)?, cold))
}

/// A memory cgroup of `bytes` for (b), or `None` (with a warning) when the cap is off or
/// no cgroup can be made.
fn page_cache_cap(name: &str, bytes: u64) -> Option<MemCgroup> {
    if bytes == 0 {
        return None;
    }
    match MemCgroup::create(name, bytes) {
        Ok(cg) => Some(cg),
        Err(e) => {
            eprintln!("warning: no memory cgroup ({e:#}): (b) reads may come from the page cache");
            None
        }
    }
}

/// Waits until warmup has loaded every vBucket (bounded).
fn wait_warmed_up(c: &mut BinClient) -> Result<BTreeMap<String, String>> {
    let watch = Stopwatch::start();
    loop {
        let w = c.stats("warmup")?;
        if w.get("ep_warmup_state").is_some_and(|s| s == "done") {
            return Ok(w);
        }
        if watch.elapsed() > PERSIST_LIMIT {
            bail!("warmup not done after {PERSIST_LIMIT:?}: {w:?}");
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Runs the bench and reports.
pub(crate) fn run(bin: &Path, s: Settings, logs: &Path) -> Result<Section> {
    let quota = (s.items * QUOTA_PER_ITEM).max(2 << 20);
    let data = tempdir("bench-memory-bgfetch")?;
    let args = [
        "--memory-quota".to_owned(),
        quota.to_string(),
        "--data-dir".to_owned(),
        data.path().display().to_string(),
    ];
    let server = ServerProcess::start_epkv(bin, &args, logs.join("memory-bgfetch-load.log"))?;
    let pool = super::random_bytes((1 << 20) + VALUE_BYTES + 1, 0xfe7c);
    let load = quota::load(&server.addr(), s.items, &pool)?;
    wait_persisted(&mut BinClient::connect(&server.addr(), true)?)?;
    // A clean stop writes the commits still waiting in the journal (and in the server's
    // memory) to the data files, so that after the restart every document is read from
    // its data file. Warmup then loads values up to the low watermark, keys only after.
    server.stop().context("stopping epkv after the load")?;
    let server = ServerProcess::start_epkv(bin, &args, logs.join("memory-bgfetch-epkv.log"))?;
    let addr = server.addr();
    let mut c = BinClient::connect(&addr, true)?;
    let warmup = wait_warmed_up(&mut c)?;
    if warmup.get("ep_warmup_oom").is_some_and(|n| n != "0") {
        bail!("warmup could not load every key under the quota: {warmup:?}");
    }
    let stats = c.stats("")?;
    let resident_pct = stat::<f64>(&stats, "vb_active_perc_mem_resident")?;
    eprintln!(
        "bgfetch: loaded {} items in {:.1} s ({} TMPFAIL), persisted, restarted; \
         {resident_pct:.0}% resident, {} non-resident",
        s.items,
        load.secs,
        load.tmpfails,
        stats.get("ep_num_non_resident").map_or("?", String::as_str)
    );
    let files = data_files(data.path())?;
    let file_bytes: u64 = files.iter().map(|f| f.1).sum();

    let mut cold = drop_caches();
    let (fetch, resident) = single_gets(&mut c, s.items, s.samples)?;
    cold &= drop_caches();
    let pread = single_preads(&files, s.samples)?;
    eprintln!(
        "bgfetch (a): {} fetched GETs p50 {:.0} us p99 {:.0} us ({} resident, p50 {:.0} us); \
         pread p50 {:.0} us p99 {:.0} us",
        fetch.count,
        fetch.p50_us,
        fetch.p99_us,
        resident.count,
        resident.p50_us,
        pread.p50_us,
        pread.p99_us
    );

    let stats = c.stats("")?;
    let bg_wait_avg_us = stat::<f64>(&stats, "ep_bg_wait_avg")?;
    let bg_load_avg_us = stat::<f64>(&stats, "ep_bg_load_avg")?;
    let before = stat::<f64>(&stats, "ep_bg_fetched")?;
    let cap_bytes = s.page_cache_mib << 20;
    let epkv_cap = page_cache_cap("bgfetch-epkv", cap_bytes);
    if let Some(cg) = &epkv_cap {
        cg.add(server.pid())?;
    }
    let ticks_before = process::cpu_ticks(server.pid())?;
    cold &= drop_caches();
    let gets = concurrent_gets(&addr, s.items, s.concurrency, s.secs)?;
    let ticks = process::cpu_ticks(server.pid())?.saturating_sub(ticks_before);
    let after = stat::<f64>(&c.stats("")?, "ep_bg_fetched")?;
    drop(c);
    stop(server);
    let epkv_limit_hits = epkv_cap.as_ref().map_or(0, MemCgroup::limit_hits);
    drop(epkv_cap);
    let fio_cap = page_cache_cap("bgfetch-fio", cap_bytes);
    let (fio, fio_cold) = fio(
        data.path(),
        file_bytes,
        s.concurrency,
        s.secs,
        fio_cap.as_ref(),
    )?;
    let fio_limit_hits = fio_cap.as_ref().map_or(0, MemCgroup::limit_hits);
    let capped = fio_cap.is_some();
    drop(fio_cap);
    eprintln!(
        "bgfetch (b): memory cgroup of {} MiB: {} (limit reached {epkv_limit_hits} times by \
         epkv, {fio_limit_hits} by fio)",
        s.page_cache_mib,
        if capped { "on" } else { "off" }
    );
    cold &= fio_cold;
    drop(data);
    let m = Measured {
        settings: s,
        quota,
        files: files.len(),
        file_bytes,
        resident_pct,
        cold,
        fetch,
        resident,
        pread,
        gets,
        fetched_share: (after - before) / gets.ops.max(1) as f64,
        cpu_us_per_get: ticks as f64 / process::clock_ticks_per_sec() as f64 * 1e6
            / gets.ops.max(1) as f64,
        bg_wait_avg_us,
        bg_load_avg_us,
        fio,
        page_cache_mib: if capped { s.page_cache_mib } else { 0 },
    };
    eprintln!(
        "bgfetch (b): epkv {:.0} GETs/s ({:.0}% fetched), fio {:.0} reads/s",
        gets.rate(),
        m.fetched_share * 100.0,
        fio.rate()
    );
    Ok(Section {
        rows: rows(&m),
        md: markdown(&m)?,
    })
}

fn params(m: &Measured, extra: &[(&str, Value)]) -> Value {
    let mut p: BTreeMap<String, Value> = BTreeMap::from([
        ("items".to_owned(), json!(m.settings.items)),
        ("value_bytes".to_owned(), json!(VALUE_BYTES)),
        ("quota_bytes".to_owned(), json!(m.quota)),
        ("data_file_bytes".to_owned(), json!(m.file_bytes)),
        ("data_files".to_owned(), json!(m.files)),
        ("resident_pct".to_owned(), json!(m.resident_pct)),
        ("cold".to_owned(), json!(m.cold)),
    ]);
    for (k, v) in extra {
        p.insert((*k).to_owned(), v.clone());
    }
    json!(p)
}

/// The JSON rows: (a) epkv and `pread`, (b) epkv and `fio`.
pub(crate) fn rows(m: &Measured) -> Vec<Value> {
    let a = params(
        m,
        &[
            ("in_flight", json!(1)),
            ("read_bytes", json!(DOC_BYTES)),
            ("samples", json!(m.settings.samples)),
        ],
    );
    let b = params(
        m,
        &[
            ("in_flight", json!(m.settings.concurrency)),
            ("secs", json!(m.settings.secs)),
            ("page_cache_mib", json!(m.page_cache_mib)),
        ],
    );
    let lat = |l: &Latency| 1e6 / l.p50_us;
    vec![
        json!({
            "bench": "memory/bgfetch_cold/single",
            "params": a,
            "impl": "epkv",
            "items_per_sec": lat(&m.fetch),
            "ns_per_op": m.fetch.p50_us * 1e3,
            "p50_us": m.fetch.p50_us,
            "p99_us": m.fetch.p99_us,
            "samples": m.fetch.count,
            "resident_gets": m.resident.count,
            "resident_p50_us": m.resident.p50_us,
            "p50_ratio_vs_pread": m.fetch.p50_us / m.pread.p50_us,
            "ep_bg_wait_avg_us": m.bg_wait_avg_us,
            "ep_bg_load_avg_us": m.bg_load_avg_us,
        }),
        json!({
            "bench": "memory/bgfetch_cold/single",
            "params": a,
            "impl": "pread",
            "items_per_sec": lat(&m.pread),
            "ns_per_op": m.pread.p50_us * 1e3,
            "p50_us": m.pread.p50_us,
            "p99_us": m.pread.p99_us,
            "samples": m.pread.count,
        }),
        json!({
            "bench": "memory/bgfetch_cold/concurrent",
            "params": b,
            "impl": "epkv",
            "items_per_sec": m.gets.rate(),
            "ns_per_op": 1e9 / m.gets.rate(),
            "p50_us": m.gets.latency.p50_us,
            "p99_us": m.gets.latency.p99_us,
            "ops": m.gets.ops,
            "fetched_share": m.fetched_share,
            "cpu_us_per_op": m.cpu_us_per_get,
            "ratio_vs_fio": m.gets.rate() / m.fio.rate(),
        }),
        json!({
            "bench": "memory/bgfetch_cold/concurrent",
            "params": b,
            "impl": "fio",
            "items_per_sec": m.fio.rate(),
            "ns_per_op": 1e9 / m.fio.rate(),
            "p50_us": m.fio.latency.p50_us,
            "p99_us": m.fio.latency.p99_us,
            "ops": m.fio.ops,
        }),
    ]
}

/// The markdown section.
pub(crate) fn markdown(m: &Measured) -> Result<String> {
    let s = &m.settings;
    let mut md = String::new();
    writeln!(md, "### Background fetches, cold")?;
    writeln!(md)?;
    writeln!(
        md,
        "{} items of {VALUE_BYTES}-byte values in a persistent bucket with a {:.1} MiB quota, \
         all persisted, {:.0}% resident; {} data files, {:.1} MiB.{}",
        s.items,
        m.quota as f64 / 1048576.0,
        m.resident_pct,
        m.files,
        m.file_bytes as f64 / 1048576.0,
        if m.cold {
            " Page cache dropped before each measurement."
        } else {
            " **The page cache could not be dropped: these reads were not all cold.**"
        }
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "| measurement | in flight | epkv | peer | peer | epkv / peer |"
    )?;
    writeln!(md, "|---|---:|---:|---|---:|---:|")?;
    writeln!(
        md,
        "| GET needing a fetch, p50 ({} samples) | 1 | {:.0} us | pread {DOC_BYTES} B | {:.0} us | {:.2}x |",
        m.fetch.count,
        m.fetch.p50_us,
        m.pread.p50_us,
        m.fetch.p50_us / m.pread.p50_us
    )?;
    writeln!(
        md,
        "| same, p99 | 1 | {:.0} us | pread {DOC_BYTES} B | {:.0} us | {:.2}x |",
        m.fetch.p99_us,
        m.pread.p99_us,
        m.fetch.p99_us / m.pread.p99_us
    )?;
    writeln!(
        md,
        "| GET of a resident value, p50 ({} samples): the network and server floor | 1 | {:.0} us | | | |",
        m.resident.count, m.resident.p50_us
    )?;
    writeln!(
        md,
        "| random GETs ({:.0}% fetched), {} s | {} | {:.0}/s | fio randread 4k | {:.0}/s | {:.2}x |",
        m.fetched_share * 100.0,
        s.secs,
        s.concurrency,
        m.gets.rate(),
        m.fio.rate(),
        m.gets.rate() / m.fio.rate()
    )?;
    writeln!(
        md,
        "| same, p50 / p99 latency | {} | {:.0} / {:.0} us | fio | {:.0} / {:.0} us | |",
        s.concurrency,
        m.gets.latency.p50_us,
        m.gets.latency.p99_us,
        m.fio.latency.p50_us,
        m.fio.latency.p99_us
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "epkv's own split of (a)'s fetches, averages: {:.0} us from queueing to the read, \
         {:.0} us reading and restoring. In (b) the server used {:.1} us of CPU per GET. {}",
        m.bg_wait_avg_us,
        m.bg_load_avg_us,
        m.cpu_us_per_get,
        if m.page_cache_mib > 0 {
            format!(
                "During (b) epkv, then fio, ran in a memory cgroup letting each take {} MiB \
                 of new memory, page cache included, so that reads went to the disk.",
                m.page_cache_mib
            )
        } else {
            "(b) ran without a memory cgroup: reads may have come from the page cache.".to_owned()
        }
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "Goals: a fetched GET's p50 at most 2x a raw read's; random GETs at least 0.5x fio's \
         reads per second."
    )?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fio_json_gives_ios_and_percentiles() {
        let text = "fio: some warning\n{\"jobs\": [{\"read\": {\"total_ios\": 5000, \
                    \"runtime\": 2000, \"clat_ns\": {\"percentile\": {\"50.000000\": 150000, \
                    \"99.000000\": 900000}}}}]}";
        let t = parse_fio(text, 2.0).unwrap();
        assert_eq!(t.ops, 5000);
        assert_eq!(t.rate(), 2500.0);
        assert_eq!((t.latency.p50_us, t.latency.p99_us), (150.0, 900.0));
        assert!(parse_fio("no json", 1.0).is_err());
    }

    #[test]
    fn latency_takes_percentiles_of_the_sorted_samples() {
        let l = Latency::of((1..=100).rev().map(f64::from).collect());
        assert_eq!(l.count, 100);
        assert_eq!(l.p50_us, 50.0);
        assert_eq!(l.p99_us, 99.0);
    }

    #[test]
    fn data_files_are_found_under_subdirectories() {
        let dir = tempdir("bgfetch-data-files-test").unwrap();
        std::fs::create_dir_all(dir.path().join("default/0")).unwrap();
        std::fs::write(dir.path().join("default/0/vb_3.0.data"), b"abc").unwrap();
        std::fs::write(dir.path().join("default/0/journal.log"), b"x").unwrap();
        std::fs::create_dir_all(dir.path().join("other/shard_1")).unwrap();
        std::fs::write(dir.path().join("other/shard_1/log-00000001.epkv"), b"abcd").unwrap();
        let files = data_files(dir.path()).unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].1, 3);
        assert_eq!(files[1].1, 4);
        let l = single_preads(&files, 3).unwrap();
        assert_eq!(l.count, 3);
    }

    #[test]
    fn rows_carry_the_ratios() {
        let lat = |p50_us, p99_us| Latency {
            count: 10,
            p50_us,
            p99_us,
        };
        let m = Measured {
            settings: Settings {
                items: 100,
                samples: 10,
                concurrency: 4,
                secs: 2,
                page_cache_mib: 32,
            },
            quota: 19_000,
            files: 2,
            file_bytes: 60_000,
            resident_pct: 10.0,
            cold: true,
            fetch: lat(300.0, 900.0),
            resident: lat(40.0, 70.0),
            pread: lat(100.0, 400.0),
            gets: Throughput {
                ops: 1000,
                secs: 2.0,
                latency: lat(50.0, 80.0),
            },
            fetched_share: 0.9,
            cpu_us_per_get: 20.0,
            bg_wait_avg_us: 30.0,
            bg_load_avg_us: 150.0,
            fio: Throughput {
                ops: 4000,
                secs: 2.0,
                latency: lat(20.0, 60.0),
            },
            page_cache_mib: 32,
        };
        let rows = rows(&m);
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[0]["p50_ratio_vs_pread"], 3.0);
        assert_eq!(rows[0]["params"]["cold"], true);
        assert_eq!(rows[2]["ratio_vs_fio"], 0.25);
        assert_eq!(rows[3]["impl"], "fio");
        let md = markdown(&m).unwrap();
        assert!(
            md.contains("| 1 | 300 us | pread 576 B | 100 us | 3.00x |"),
            "{md}"
        );
        assert!(
            md.contains("| 4 | 500/s | fio randread 4k | 2000/s | 0.25x |"),
            "{md}"
        );
    }
}
