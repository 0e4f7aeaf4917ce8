//! Memory per item: the RSS growth of each server for N small items (15-byte keys, 32-byte
//! values), loaded with pipelined quiet SETs (binary protocol) or pipelined SETs (RESP).
//!
//! Each server is started fresh, gets one connection, and its RSS (`VmRSS`) is read; the
//! items are loaded over that connection in batches of [`BATCH`] fenced by a NOOP (or read
//! back reply by reply for Redis); then, once the RSS has settled, it is read again. The
//! growth divided by N is the figure. Each server's own count of its item memory is read
//! before and after too (epkv `mem_used`, memcached `bytes`, Redis `used_memory`), which
//! separates the items from the rest of the process (hash table arrays, allocator slack).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Result, bail};
use serde_json::json;

use super::wire::{BinClient, Reply, RespClient};
use super::{Section, rss_bytes, settle_rss, stat, stop};
use crate::memcapable::tempdir;
use crate::process::ServerProcess;
use crate::util::Stopwatch;
use epkv_protocol::Opcode;

/// Key length: `key:` and 11 digits.
pub(crate) const KEY_BYTES: usize = 15;
/// Value length.
pub(crate) const VALUE_BYTES: usize = 32;
/// Requests per pipelined batch.
const BATCH: u64 = 1000;

/// The key of item `i`.
pub(crate) fn key_of(i: u64) -> Vec<u8> {
    format!("key:{i:011}").into_bytes()
}

/// The value of item `i`: 32 printable bytes that differ from item to item.
pub(crate) fn value_of(i: u64) -> Vec<u8> {
    let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    format!("{h:016x}{:016x}", h.rotate_left(29)).into_bytes()
}

/// One server's figures.
#[derive(Debug, Clone)]
pub(crate) struct Measured {
    pub(crate) implementation: &'static str,
    pub(crate) items: u64,
    /// VmRSS after start-up and one connection.
    pub(crate) rss_before: u64,
    /// VmRSS after the load, once settled.
    pub(crate) rss_after: u64,
    /// Seconds the load took (all batches acknowledged).
    pub(crate) load_secs: f64,
    /// The server's own item-memory stat.
    pub(crate) self_stat: &'static str,
    pub(crate) self_before: u64,
    pub(crate) self_after: u64,
    /// Items the server says it holds after the load.
    pub(crate) held: u64,
}

impl Measured {
    /// RSS growth per item.
    pub(crate) fn bytes_per_item(&self) -> f64 {
        self.rss_after.saturating_sub(self.rss_before) as f64 / self.items as f64
    }

    /// Growth of the server's own item-memory stat per item.
    pub(crate) fn self_per_item(&self) -> f64 {
        self.self_after.saturating_sub(self.self_before) as f64 / self.items as f64
    }

    fn load_rate(&self) -> f64 {
        self.items as f64 / self.load_secs
    }
}

/// Loads items `0..items` over `c` with SETQ batches fenced by a NOOP.
fn load_binary(c: &mut BinClient, items: u64) -> Result<()> {
    let mut i = 0;
    while i < items {
        let end = (i + BATCH).min(items);
        for j in i..end {
            c.queue_set(Opcode::SetQ, &key_of(j), &value_of(j), 0)?;
        }
        let failed = c.fence()?;
        if let Some(r) = failed.first() {
            bail!(
                "{} quiet SETs failed in items {i}..{end}, the first with status {:#x}",
                failed.len(),
                r.status
            );
        }
        i = end;
    }
    Ok(())
}

/// Loads items `0..items` over `c` with pipelined SETs, each batch's replies read back.
fn load_resp(c: &mut RespClient, items: u64) -> Result<()> {
    let mut i = 0;
    while i < items {
        let end = (i + BATCH).min(items);
        for j in i..end {
            c.queue(&[b"SET", &key_of(j), &value_of(j)]);
        }
        c.flush()?;
        for j in i..end {
            match c.recv()? {
                Reply::Simple(s) if s == "OK" => {}
                other => bail!("SET of item {j} answered {other:?}"),
            }
        }
        i = end;
    }
    Ok(())
}

/// Starts a fresh epkv-server (memory-only, quota `memory_mib`) and measures it.
fn measure_epkv(bin: &Path, items: u64, memory_mib: u64, logs: &Path) -> Result<Measured> {
    let data = tempdir("bench-memory-per-item")?;
    let args = [
        "--persistence",
        "false",
        "--memory-quota",
        &format!("{memory_mib}MiB"),
        "--data-dir",
        &data.path().display().to_string(),
    ]
    .map(String::from);
    let server = ServerProcess::start_epkv(bin, &args, logs.join("memory-per-item-epkv.log"))?;
    let (m, _) = measure_binary(server, "epkv", "mem_used", items)?;
    Ok(m)
}

/// Starts a fresh memcached (`-m memory_mib`) and measures it.
fn measure_memcached(items: u64, memory_mib: u64, logs: &Path) -> Result<Measured> {
    let args = [
        "-m".to_owned(),
        memory_mib.to_string(),
        "-t".to_owned(),
        crate::util::cores().to_string(),
    ];
    let server = ServerProcess::start_memcached(&args, logs.join("memory-per-item-memcached.log"))?;
    let (m, after) = measure_binary(server, "memcached", "bytes", items)?;
    let evictions = stat::<u64>(&after, "evictions")?;
    if evictions > 0 {
        bail!("memcached evicted {evictions} items; raise --memory-mib");
    }
    Ok(m)
}

/// Loads `items` into a binary protocol server (epkv, whose requests carry vBuckets, or
/// memcached), measures it, stops it, and returns the figures with its stats after the
/// load. `self_stat` is the server's own item-memory stat.
fn measure_binary(
    server: ServerProcess,
    implementation: &'static str,
    self_stat: &'static str,
    items: u64,
) -> Result<(Measured, BTreeMap<String, String>)> {
    let mut c = BinClient::connect(&server.addr(), implementation == "epkv")?;
    c.fence()?;
    let before = c.stats("")?;
    let rss_before = rss_bytes(server.pid())?;
    let watch = Stopwatch::start();
    load_binary(&mut c, items)?;
    let load_secs = watch.elapsed().as_secs_f64();
    let rss_after = settle_rss(server.pid())?;
    let after = c.stats("")?;
    drop(c);
    let m = Measured {
        implementation,
        items,
        rss_before,
        rss_after,
        load_secs,
        self_stat,
        self_before: stat::<u64>(&before, self_stat)?,
        self_after: stat::<u64>(&after, self_stat)?,
        held: stat::<u64>(&after, "curr_items")?,
    };
    stop(server);
    Ok((m, after))
}

/// Starts a fresh redis-server (no persistence) and measures it.
fn measure_redis(items: u64, logs: &Path) -> Result<Measured> {
    let dir = tempdir("bench-memory-per-item-redis")?;
    let server =
        ServerProcess::start_redis(&[], dir.path(), logs.join("memory-per-item-redis.log"))?;
    let mut c = RespClient::connect(&server.addr())?;
    let pong = c.command(&[b"PING"])?;
    if pong != Reply::Simple("PONG".into()) {
        bail!("redis answered PING with {pong:?}");
    }
    let before = c.info("memory")?;
    let rss_before = rss_bytes(server.pid())?;
    let watch = Stopwatch::start();
    load_resp(&mut c, items)?;
    let load_secs = watch.elapsed().as_secs_f64();
    let rss_after = settle_rss(server.pid())?;
    let after = c.info("memory")?;
    let held = match c.command(&[b"DBSIZE"])? {
        Reply::Int(n) => u64::try_from(n).unwrap_or(0),
        other => bail!("DBSIZE answered {other:?}"),
    };
    drop(c);
    let m = Measured {
        implementation: "redis",
        items,
        rss_before,
        rss_after,
        load_secs,
        self_stat: "used_memory",
        self_before: stat::<u64>(&before, "used_memory")?,
        self_after: stat::<u64>(&after, "used_memory")?,
        held,
    };
    stop(server);
    Ok(m)
}

/// Runs the three servers one after the other and reports.
pub(crate) fn run(bin: &Path, items: u64, memory_mib: u64, logs: &Path) -> Result<Section> {
    let all = vec![
        measure_epkv(bin, items, memory_mib, logs)?,
        measure_memcached(items, memory_mib, logs)?,
        measure_redis(items, logs)?,
    ];
    for m in &all {
        if m.held != items {
            bail!(
                "{} holds {} items after loading {items}: something was evicted or refused",
                m.implementation,
                m.held
            );
        }
    }
    Ok(Section {
        rows: rows(&all),
        md: markdown(&all)?,
    })
}

fn peer<'a>(all: &'a [Measured], name: &str) -> Option<&'a Measured> {
    all.iter().find(|m| m.implementation == name)
}

/// The JSON rows: one per server; epkv's carries its ratios to the peers.
pub(crate) fn rows(all: &[Measured]) -> Vec<serde_json::Value> {
    let epkv = peer(all, "epkv");
    all.iter()
        .map(|m| {
            let mut row = json!({
                "bench": "memory/per_item",
                "params": {
                    "items": m.items,
                    "key_bytes": KEY_BYTES,
                    "value_bytes": VALUE_BYTES,
                    "connections": 1,
                    "batch": BATCH,
                },
                "impl": m.implementation,
                "bytes_per_item": m.bytes_per_item(),
                "rss_before_bytes": m.rss_before,
                "rss_after_bytes": m.rss_after,
                "self_stat": m.self_stat,
                "self_bytes_per_item": m.self_per_item(),
                "items_per_sec": m.load_rate(),
                "ns_per_op": 1e9 / m.load_rate(),
            });
            if let Some(e) = epkv.filter(|_| m.implementation != "epkv") {
                row["epkv_ratio"] = json!(e.bytes_per_item() / m.bytes_per_item());
            }
            row
        })
        .collect()
}

/// The markdown section.
pub(crate) fn markdown(all: &[Measured]) -> Result<String> {
    let mut md = String::new();
    let items = all.first().map_or(0, |m| m.items);
    writeln!(md, "### Memory per item")?;
    writeln!(md)?;
    writeln!(
        md,
        "{items} items, {KEY_BYTES}-byte keys, {VALUE_BYTES}-byte values, loaded over one \
         connection in pipelined batches of {BATCH}; RSS growth (VmRSS after the load, \
         settled, minus VmRSS after start-up and one connection) per item. `own stat` is \
         the growth of the server's own item-memory figure per item."
    )?;
    writeln!(md)?;
    writeln!(
        md,
        "| server | RSS before | RSS after | bytes/item | own stat | own bytes/item | load items/s | epkv / this |"
    )?;
    writeln!(md, "|---|---:|---:|---:|---|---:|---:|---:|")?;
    let epkv = peer(all, "epkv");
    for m in all {
        let ratio = epkv.map_or(f64::NAN, |e| e.bytes_per_item() / m.bytes_per_item());
        writeln!(
            md,
            "| {} | {:.1} MiB | {:.1} MiB | {:.1} | {} | {:.1} | {:.0} | {:.2}x |",
            m.implementation,
            m.rss_before as f64 / 1048576.0,
            m.rss_after as f64 / 1048576.0,
            m.bytes_per_item(),
            m.self_stat,
            m.self_per_item(),
            m.load_rate(),
            ratio,
        )?;
    }
    writeln!(md)?;
    if let Some(e) = epkv {
        writeln!(
            md,
            "epkv beyond its `mem_used`: {:.1} bytes/item (RSS growth {:.1} - mem_used {:.1}). \
             Goal: epkv/memcached <= 1.0x.",
            e.bytes_per_item() - e.self_per_item(),
            e.bytes_per_item(),
            e.self_per_item()
        )?;
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(implementation: &'static str, grow: u64, own: u64) -> Measured {
        Measured {
            implementation,
            items: 1000,
            rss_before: 1 << 20,
            rss_after: (1 << 20) + grow,
            load_secs: 0.5,
            self_stat: "mem_used",
            self_before: 10,
            self_after: 10 + own,
            held: 1000,
        }
    }

    #[test]
    fn keys_and_values_have_their_sizes() {
        assert_eq!(key_of(0).len(), KEY_BYTES);
        assert_eq!(key_of(99_999_999_999).len(), KEY_BYTES);
        assert_eq!(value_of(7).len(), VALUE_BYTES);
        assert_ne!(value_of(1), value_of(2));
    }

    #[test]
    fn ratios_are_epkv_over_peer() {
        let all = [m("epkv", 200_000, 150_000), m("memcached", 100_000, 80_000)];
        assert_eq!(all[0].bytes_per_item(), 200.0);
        assert_eq!(all[0].self_per_item(), 150.0);
        let rows = rows(&all);
        assert_eq!(rows[0]["impl"], "epkv");
        assert_eq!(rows[0]["items_per_sec"], 2000.0);
        assert!(rows[0].get("epkv_ratio").is_none());
        assert_eq!(rows[1]["epkv_ratio"], 2.0);
        let md = markdown(&all).unwrap();
        assert!(
            md.contains(
                "| memcached | 1.0 MiB | 1.1 MiB | 100.0 | mem_used | 80.0 | 2000 | 2.00x |"
            ),
            "{md}"
        );
        assert!(
            md.contains("epkv beyond its `mem_used`: 50.0 bytes/item"),
            "{md}"
        );
    }
}
