//! `cargo xtask bench metrics`: the server CPU one Prometheus scrape costs (issue 19's
//! goal: at most 5 ms with 1024 vBuckets, every task's histograms and 1,000 connections),
//! and the size of the exposition.
//!
//! Builds the release `epkv-server`, starts it persistent (1024 vBuckets, every
//! persistence task) with `--metrics-port 0`, writes and reads documents on one
//! connection (so the command, flusher and fetcher histograms have samples), opens 1,000
//! more connections (each answers a NOOP, so the server holds them all), then:
//! - measures the idle CPU rate over a few seconds (the pagers and flushers wake on their
//!   own);
//! - scrapes `/metrics` N times back to back, reading `utime + stime` of the server from
//!   `/proc/PID/stat` before and after.
//!
//! Reports the CPU per scrape (raw, and with the idle rate over the same wall time taken
//! off), the exposition's bytes, series and families. Writes `target/bench/metrics.json`
//! and `.md`.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::memcapable::tempdir;
use crate::process::{self, ServerProcess};
use crate::util::{self, Stopwatch};

/// Options of `cargo xtask bench metrics`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct MetricsOptions {
    /// 100 scrapes and 2 s of idle measurement (default: 500 and 5 s).
    #[arg(long)]
    pub(crate) quick: bool,
    /// Scrapes to time (overrides --quick).
    #[arg(long)]
    pub(crate) scrapes: Option<usize>,
    /// Client connections held open during the scrapes.
    #[arg(long, default_value_t = 1000)]
    pub(crate) connections: usize,
    /// Documents written (and read back) before the scrapes.
    #[arg(long, default_value_t = 20_000)]
    pub(crate) docs: usize,
}

/// One measured run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Measured {
    pub(crate) scrapes: usize,
    pub(crate) connections: usize,
    pub(crate) docs: usize,
    pub(crate) cpu_ms_per_scrape: f64,
    pub(crate) idle_cpu_ms_per_scrape: f64,
    pub(crate) wall_ms_per_scrape: f64,
    pub(crate) exposition_bytes: usize,
    pub(crate) series: usize,
    pub(crate) families: usize,
}

impl Measured {
    /// CPU per scrape with the idle rate over the same wall time taken off.
    pub(crate) fn net_cpu_ms(&self) -> f64 {
        (self.cpu_ms_per_scrape - self.idle_cpu_ms_per_scrape).max(0.0)
    }
}

/// A memcached binary request: magic 0x80, `opcode`, key, extras and value.
fn request(opcode: u8, key: &[u8], extras: &[u8], value: &[u8]) -> Vec<u8> {
    let body = extras.len() + key.len() + value.len();
    let mut r = Vec::with_capacity(24 + body);
    r.push(0x80);
    r.push(opcode);
    r.extend_from_slice(&u16::try_from(key.len()).unwrap_or(u16::MAX).to_be_bytes());
    r.push(u8::try_from(extras.len()).unwrap_or(u8::MAX));
    r.extend_from_slice(&[0, 0, 0]); // datatype, vbucket 0 (routed by key: no HELLO)
    r.extend_from_slice(&u32::try_from(body).unwrap_or(u32::MAX).to_be_bytes());
    r.extend_from_slice(&[0; 12]); // opaque, cas
    r.extend_from_slice(extras);
    r.extend_from_slice(key);
    r.extend_from_slice(value);
    r
}

/// Reads `n` responses (headers and bodies) from `s`.
fn read_responses(s: &mut TcpStream, n: usize) -> Result<()> {
    let mut header = [0u8; 24];
    for _ in 0..n {
        s.read_exact(&mut header)?;
        if header[0] != 0x81 {
            bail!("not a response: {header:?}");
        }
        let body = u32::from_be_bytes([header[8], header[9], header[10], header[11]]);
        let mut skip = vec![0u8; body as usize];
        s.read_exact(&mut skip)?;
    }
    Ok(())
}

/// Writes `docs` documents and reads them back, in batches of 500 pipelined requests.
fn load(port: u16, docs: usize) -> Result<()> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let value = vec![b'v'; 512];
    for (opcode, extras) in [(0x01u8, &[0u8; 8][..]), (0x00, &[][..])] {
        for start in (0..docs).step_by(500) {
            let end = (start + 500).min(docs);
            let mut batch = Vec::new();
            for i in start..end {
                let key = format!("metrics-bench-{i}");
                let v: &[u8] = if opcode == 0x01 { &value } else { &[] };
                batch.extend(request(opcode, key.as_bytes(), extras, v));
            }
            s.write_all(&batch)?;
            read_responses(&mut s, end - start)?;
        }
    }
    Ok(())
}

/// Opens `n` connections, each answered one NOOP, and returns them (kept open).
fn hold_connections(port: u16, n: usize) -> Result<Vec<TcpStream>> {
    let noop = request(0x0a, &[], &[], &[]);
    (0..n)
        .map(|i| {
            let mut s = TcpStream::connect(("127.0.0.1", port))
                .with_context(|| format!("connection {i}"))?;
            s.set_read_timeout(Some(Duration::from_secs(30)))?;
            s.write_all(&noop)?;
            read_responses(&mut s, 1)?;
            Ok(s)
        })
        .collect()
}

/// `GET /metrics` on a fresh connection; returns the body.
fn scrape(port: u16) -> Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8(raw).context("metrics are not utf-8")?;
    let (head, body) = text.split_once("\r\n\r\n").context("no header block")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("scrape answered {head}");
    }
    Ok(body.to_owned())
}

/// The metrics port from epkv's listening line (`..., metrics http://ADDR/metrics)`).
pub(crate) fn metrics_port(line: &str) -> Option<u16> {
    let rest = line.split("metrics http://").nth(1)?;
    let addr = rest.split('/').next()?;
    addr.rsplit_once(':')?.1.parse().ok()
}

/// Sample lines and `# TYPE` lines of an exposition.
pub(crate) fn count_series(text: &str) -> (usize, usize) {
    let series = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    let families = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
    (series, families)
}

/// Runs the benchmark.
pub(crate) fn bench_metrics(opts: &MetricsOptions) -> Result<()> {
    let scrapes = opts.scrapes.unwrap_or(if opts.quick { 100 } else { 500 });
    let idle = Duration::from_secs(if opts.quick { 2 } else { 5 });
    util::run(util::cargo().args(["build", "--release", "-p", "epkv-server"]))?;
    let out_dir = util::target_dir().join("bench");
    std::fs::create_dir_all(&out_dir)?;
    let data = tempdir("bench-metrics")?;
    let bin = process::epkv_server_bin("release");
    let args: Vec<String> = [
        "--metrics-port",
        "0",
        "--max-connections",
        "4096",
        "--data-dir",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([data.path().display().to_string()])
    .collect();
    let server = ServerProcess::start_epkv(&bin, &args, out_dir.join("metrics-epkv.log"))?;
    let port = metrics_port(&server.listening_line)
        .with_context(|| format!("no metrics port in {:?}", server.listening_line))?;
    let pid = server.pid();

    load(server.port, opts.docs)?;
    let held = hold_connections(server.port, opts.connections)?;
    // Let the flushers write the load, so their histograms have samples.
    std::thread::sleep(Duration::from_secs(1));
    let first = scrape(port)?;
    let conns = first
        .lines()
        .find_map(|l| l.strip_prefix("kv_curr_connections "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    #[expect(clippy::cast_precision_loss, reason = "a connection count")]
    if conns < opts.connections as f64 {
        bail!(
            "the server reports {conns} connections, expected at least {}",
            opts.connections
        );
    }
    for _ in 0..5 {
        scrape(port)?;
    }

    let hz = process::clock_ticks_per_sec() as f64;
    let t0 = process::cpu_ticks(pid)?;
    std::thread::sleep(idle);
    let idle_ticks = process::cpu_ticks(pid)? - t0;
    let idle_ms_per_sec = idle_ticks as f64 / hz * 1000.0 / idle.as_secs_f64();

    let watch = Stopwatch::start();
    let before = process::cpu_ticks(pid)?;
    let mut last = String::new();
    for _ in 0..scrapes {
        last = scrape(port)?;
    }
    let busy_ticks = process::cpu_ticks(pid)? - before;
    let wall = watch.elapsed();
    drop(held);
    server.stop()?;
    drop(data);

    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^53")]
    let m = {
        let (series, families) = count_series(&last);
        let per = scrapes as f64;
        Measured {
            scrapes,
            connections: opts.connections,
            docs: opts.docs,
            cpu_ms_per_scrape: busy_ticks as f64 / hz * 1000.0 / per,
            idle_cpu_ms_per_scrape: idle_ms_per_sec * wall.as_secs_f64() / per,
            wall_ms_per_scrape: wall.as_secs_f64() * 1000.0 / per,
            exposition_bytes: last.len(),
            series,
            families,
        }
    };
    let json_path = out_dir.join("metrics.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&rows(&m))?)?;
    let md = markdown(&m)?;
    let md_path = out_dir.join("metrics.md");
    std::fs::write(&md_path, &md)?;
    println!("\n{md}");
    println!(
        "bench metrics: wrote {} and {}",
        json_path.display(),
        md_path.display()
    );
    Ok(())
}

/// The JSON rows.
pub(crate) fn rows(m: &Measured) -> Vec<Value> {
    vec![json!({
        "bench": "metrics/scrape",
        "params": {
            "vbuckets": 1024,
            "connections": m.connections,
            "docs": m.docs,
            "scrapes": m.scrapes,
            "persistence": true,
        },
        "impl": "epkv",
        "cpu_ms_per_scrape": m.cpu_ms_per_scrape,
        "idle_cpu_ms_per_scrape": m.idle_cpu_ms_per_scrape,
        "net_cpu_ms_per_scrape": m.net_cpu_ms(),
        "wall_ms_per_scrape": m.wall_ms_per_scrape,
        "exposition_bytes": m.exposition_bytes,
        "series": m.series,
        "families": m.families,
        "goal_cpu_ms_per_scrape": 5.0,
    })]
}

/// The markdown table.
pub(crate) fn markdown(m: &Measured) -> Result<String> {
    let mut md = String::new();
    writeln!(md, "{}\n", crate::bench_frontend::hardware_line())?;
    writeln!(
        md,
        "1024 vBuckets, {} documents, {} connections held open, {} scrapes\n",
        m.docs, m.connections, m.scrapes
    )?;
    writeln!(
        md,
        "| CPU/scrape | idle CPU in that time | net CPU/scrape | wall/scrape | bytes | series | families |"
    )?;
    writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|")?;
    writeln!(
        md,
        "| {:.2} ms | {:.2} ms | {:.2} ms (goal ≤ 5) | {:.2} ms | {} | {} | {} |",
        m.cpu_ms_per_scrape,
        m.idle_cpu_ms_per_scrape,
        m.net_cpu_ms(),
        m.wall_ms_per_scrape,
        m.exposition_bytes,
        m.series,
        m.families
    )?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_framed_as_the_binary_protocol() {
        let r = request(0x01, b"k", &[0; 8], b"vv");
        assert_eq!(r.len(), 24 + 11);
        assert_eq!(&r[..2], &[0x80, 0x01]);
        assert_eq!(u16::from_be_bytes([r[2], r[3]]), 1);
        assert_eq!(r[4], 8);
        assert_eq!(u32::from_be_bytes([r[8], r[9], r[10], r[11]]), 11);
        assert_eq!(&r[32..], b"kvv");
    }

    #[test]
    fn metrics_port_and_series_are_parsed() {
        assert_eq!(
            metrics_port(
                "epkv listening on 127.0.0.1:1 (buckets default, no users: any credentials accepted on loopback, metrics http://127.0.0.1:9091/metrics)"
            ),
            Some(9091)
        );
        assert_eq!(metrics_port("epkv listening on 127.0.0.1:1 (x)"), None);
        let text = "# HELP a x\n# TYPE a gauge\na 1\na{b=\"c\"} 2\n# TYPE d counter\nd_total 3\n";
        assert_eq!(count_series(text), (3, 2));
    }

    #[test]
    fn rows_and_markdown_report_net_cpu() {
        let m = Measured {
            scrapes: 100,
            connections: 1000,
            docs: 10,
            cpu_ms_per_scrape: 1.5,
            idle_cpu_ms_per_scrape: 0.5,
            wall_ms_per_scrape: 3.0,
            exposition_bytes: 80_000,
            series: 900,
            families: 90,
        };
        let r = rows(&m);
        assert_eq!(r[0]["net_cpu_ms_per_scrape"], 1.0);
        assert_eq!(r[0]["params"]["connections"], 1000);
        let md = markdown(&m).unwrap();
        assert!(
            md.contains("| 1.50 ms | 0.50 ms | 1.00 ms (goal ≤ 5) |"),
            "{md}"
        );
    }
}
