//! Snappy (issue 20): memory per item for compressible ~1 KiB JSON documents stored
//! compressed (a client that negotiated Snappy sends them compressed) against the same
//! documents stored uncompressed, and what reads and writes cost both ways.
//!
//! Two fresh memory-only servers (`--persistence false`, a quota far above the data):
//! - `plain`: a client without Snappy stores the documents as they are;
//! - `snappy`: a client that negotiated Snappy stores them compressed (the client
//!   compresses, as the SDKs do).
//!
//! Each load is N pipelined SETs (batches of 1000); memory is the RSS growth and
//! `mem_used` growth per item. Then, on the `snappy` server, random GETs for S seconds,
//! pipelined 100 deep, by a Snappy client (gets the stored bytes) and by a plain client
//! (the server decompresses each value), and the same from a plain client on the `plain`
//! server: ops/s and server CPU per GET.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{Result, bail};
use epkv_protocol::Opcode;
use epkv_types::{Cas, Datatype};

use serde_json::json;

use super::wire::BinClient;
use super::{Section, rss_bytes, settle_rss, stat, stop};
use crate::memcapable::tempdir;
use crate::process::{self, ServerProcess};
use crate::util::Stopwatch;

/// A compressible JSON document of about 1 KiB: the fields of a user profile with some
/// text, different for each `i`.
pub(crate) fn document(i: u64) -> Vec<u8> {
    let words = [
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
    ];
    let pick = |n: u64| words[(n % words.len() as u64) as usize];
    let text: Vec<&str> = (0..142)
        .map(|k| pick(i.wrapping_mul(31).wrapping_add(k)))
        .collect();
    json!({
        "id": i,
        "name": format!("user-{i:08}"),
        "email": format!("user-{i:08}@example.com"),
        "tags": [pick(i), pick(i + 1), pick(i + 2)],
        "active": !i.is_multiple_of(3),
        "bio": text.join(" "),
    })
    .to_string()
    .into_bytes()
}

fn key(i: u64) -> Vec<u8> {
    format!("doc:{i:010}").into_bytes()
}

/// HELLO with JSON, and Snappy when asked; checks the server agreed.
fn hello(c: &mut BinClient, snappy: bool) -> Result<()> {
    let mut features = vec![0x00, 0x0b];
    if snappy {
        features.extend_from_slice(&[0x00, 0x0a]);
    }
    c.queue(Opcode::Hello, b"bench-snappy", b"", &features, 0)?;
    c.flush()?;
    let r = c.recv()?;
    if snappy && !r.value.chunks(2).any(|f| f == [0x00, 0x0a]) {
        bail!("the server did not agree to Snappy");
    }
    Ok(())
}

/// One case's load.
#[derive(Debug, Clone)]
pub(crate) struct Load {
    pub(crate) case: &'static str,
    pub(crate) items: u64,
    pub(crate) doc_bytes: f64,
    pub(crate) stored_bytes: f64,
    pub(crate) rss_per_item: f64,
    pub(crate) mem_used_per_item: f64,
    pub(crate) sets_per_sec: f64,
    pub(crate) cpu_us_per_set: f64,
}

/// One read run.
#[derive(Debug, Clone)]
pub(crate) struct Reads {
    pub(crate) name: &'static str,
    pub(crate) gets_per_sec: f64,
    pub(crate) cpu_us_per_get: f64,
}

fn load(server: &ServerProcess, case: &'static str, items: u64) -> Result<Load> {
    let snappy = case == "snappy";
    let mut c = BinClient::connect(&server.addr(), true)?;
    hello(&mut c, snappy)?;
    c.fence()?;
    let before = c.stats("")?;
    let rss_before = rss_bytes(server.pid())?;
    let ticks0 = process::cpu_ticks(server.pid())?;
    let watch = Stopwatch::start();
    let (mut doc_total, mut stored_total) = (0u64, 0u64);
    let dt = if snappy {
        Datatype(Datatype::JSON.0 | Datatype::SNAPPY.0)
    } else {
        Datatype::JSON
    };
    let mut enc = snap::raw::Encoder::new();
    for start in (0..items).step_by(1000) {
        for i in start..(start + 1000).min(items) {
            let doc = document(i);
            let value = if snappy {
                enc.compress_vec(&doc)?
            } else {
                doc.clone()
            };
            doc_total += doc.len() as u64;
            stored_total += value.len() as u64;
            c.queue_set_datatype(Opcode::SetQ, &key(i), &value, dt, Cas::ANY, 0)?;
        }
        let failed = c.fence()?;
        if let Some(r) = failed.first() {
            bail!("{case}: a SET failed with {:#x}", r.status);
        }
    }
    let secs = watch.elapsed().as_secs_f64();
    let ticks = process::cpu_ticks(server.pid())?.saturating_sub(ticks0);
    let rss_after = settle_rss(server.pid())?;
    let after = c.stats("")?;
    let n = items as f64;
    Ok(Load {
        case,
        items,
        doc_bytes: doc_total as f64 / n,
        stored_bytes: stored_total as f64 / n,
        rss_per_item: rss_after.saturating_sub(rss_before) as f64 / n,
        mem_used_per_item: (stat::<u64>(&after, "mem_used")? as f64
            - stat::<u64>(&before, "mem_used")? as f64)
            / n,
        sets_per_sec: n / secs,
        cpu_us_per_set: ticks as f64 / process::clock_ticks_per_sec() as f64 * 1e6 / n,
    })
}

fn reads(
    server: &ServerProcess,
    name: &'static str,
    snappy: bool,
    items: u64,
    secs: u64,
) -> Result<Reads> {
    let mut c = BinClient::connect(&server.addr(), true)?;
    hello(&mut c, snappy)?;
    let mut rng = super::rng(0x5a_ed);
    let ticks0 = process::cpu_ticks(server.pid())?;
    let watch = Stopwatch::start();
    let mut done = 0u64;
    while watch.elapsed() < Duration::from_secs(secs) {
        for _ in 0..100 {
            c.queue(
                Opcode::Get,
                &key(super::below(&mut rng, items)),
                b"",
                b"",
                1,
            )?;
        }
        c.flush()?;
        for _ in 0..100 {
            let r = c.recv()?;
            if r.status != 0 {
                bail!("{name}: GET failed with {:#x}", r.status);
            }
        }
        done += 100;
    }
    let elapsed = watch.elapsed().as_secs_f64();
    let ticks = process::cpu_ticks(server.pid())?.saturating_sub(ticks0);
    Ok(Reads {
        name,
        gets_per_sec: done as f64 / elapsed,
        cpu_us_per_get: ticks as f64 / process::clock_ticks_per_sec() as f64 * 1e6 / done as f64,
    })
}

/// Runs the bench and reports.
pub(crate) fn run(bin: &Path, items: u64, secs: u64, logs: &Path) -> Result<Section> {
    let mut loads = Vec::new();
    let mut runs = Vec::new();
    for case in ["plain", "snappy"] {
        let dir = tempdir("bench-memory-snappy")?;
        let args = [
            "--persistence".to_owned(),
            "false".to_owned(),
            "--memory-quota".to_owned(),
            "2048MiB".to_owned(),
            "--data-dir".to_owned(),
            dir.path().display().to_string(),
        ];
        let server =
            ServerProcess::start_epkv(bin, &args, logs.join(format!("memory-snappy-{case}.log")))?;
        loads.push(load(&server, case, items)?);
        if case == "plain" {
            runs.push(reads(
                &server,
                "plain docs, plain client",
                false,
                items,
                secs,
            )?);
        } else {
            runs.push(reads(
                &server,
                "snappy docs, snappy client",
                true,
                items,
                secs,
            )?);
            runs.push(reads(
                &server,
                "snappy docs, plain client",
                false,
                items,
                secs,
            )?);
        }
        stop(server);
    }
    eprintln!("snappy: {loads:?} {runs:?}");
    Ok(Section {
        rows: rows(&loads, &runs, secs),
        md: markdown(&loads, &runs, secs)?,
    })
}

/// The JSON rows: one per load, one per read run.
pub(crate) fn rows(loads: &[Load], runs: &[Reads], secs: u64) -> Vec<serde_json::Value> {
    let plain_rss = loads.first().map_or(f64::NAN, |l| l.rss_per_item);
    let mut out: Vec<serde_json::Value> = loads
        .iter()
        .map(|l| {
            json!({
                "bench": "memory/snappy_per_item",
                "params": {"items": l.items, "doc_bytes": l.doc_bytes},
                "impl": format!("epkv-{}", l.case),
                "items_per_sec": l.sets_per_sec,
                "ns_per_op": 1e9 / l.sets_per_sec,
                "bytes_per_item": l.rss_per_item,
                "mem_used_per_item": l.mem_used_per_item,
                "stored_bytes": l.stored_bytes,
                "cpu_us_per_set": l.cpu_us_per_set,
                "ratio_vs_plain": l.rss_per_item / plain_rss,
            })
        })
        .collect();
    out.extend(runs.iter().map(|r| {
        json!({
            "bench": "memory/snappy_gets",
            "params": {"secs": secs, "pipeline": 100, "case": r.name},
            "impl": "epkv",
            "items_per_sec": r.gets_per_sec,
            "ns_per_op": 1e9 / r.gets_per_sec,
            "cpu_us_per_op": r.cpu_us_per_get,
        })
    }));
    out
}

/// The markdown section.
pub(crate) fn markdown(loads: &[Load], runs: &[Reads], secs: u64) -> Result<String> {
    let mut md = String::from("### Snappy\n\n");
    let plain = loads.first().map_or(f64::NAN, |l| l.rss_per_item);
    writeln!(
        md,
        "| stored | document | stored bytes | RSS per item | mem_used per item | vs plain | SETs/s | server CPU per SET |"
    )?;
    writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|")?;
    for l in loads {
        writeln!(
            md,
            "| {} | {:.0} B | {:.0} B | {:.1} B | {:.1} B | {:.2}x | {:.0} | {:.2} us |",
            l.case,
            l.doc_bytes,
            l.stored_bytes,
            l.rss_per_item,
            l.mem_used_per_item,
            l.rss_per_item / plain,
            l.sets_per_sec,
            l.cpu_us_per_set
        )?;
    }
    writeln!(md)?;
    writeln!(
        md,
        "| GETs, pipelined 100 deep, {secs} s | GETs/s | server CPU per GET |"
    )?;
    writeln!(md, "|---|---:|---:|")?;
    for r in runs {
        writeln!(
            md,
            "| {} | {:.0} | {:.2} us |",
            r.name, r.gets_per_sec, r.cpu_us_per_get
        )?;
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_json_of_about_a_kilobyte_and_compress_well() {
        for i in [0, 7, 123_456] {
            let d = document(i);
            assert!((900..1200).contains(&d.len()), "{}", d.len());
            let v: serde_json::Value = serde_json::from_slice(&d).unwrap();
            assert_eq!(v["id"], i);
            let z = snap::raw::Encoder::new().compress_vec(&d).unwrap();
            assert!(z.len() * 2 < d.len(), "{} -> {}", d.len(), z.len());
        }
        assert_ne!(document(1), document(2));
    }
}
