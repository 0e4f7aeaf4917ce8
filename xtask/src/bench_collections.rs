//! `cargo xtask bench collections`: a named collection against the default one (issue 21),
//! epkv against itself in the same run, as shipped (persistent, the defaults).
//!
//! - `get` / `set`: 100,000 keys of 256 bytes in the default collection (a client without
//!   HELLO Collections, as a classic client) and in collection `bench.c1` (a client that
//!   negotiated collections, every key prefixed with its id); GETs and SETs of random
//!   keys, 100 in flight on one connection, for `secs` each, alternating default and
//!   named in `rounds` rounds (the median is reported). Goal: named >= 0.95x default.
//! - `drop`: `drop_docs` documents in collection `bench.big`; one client reads the
//!   default collection one request at a time while the collection is dropped: p99
//!   latency before the drop and while its documents are purged, and how long the purge
//!   took (the server logs it; the bench waits until `STAT collections` no longer lists
//!   it and memory fell).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use epkv_protocol::Opcode;
use serde_json::json;

use crate::bench_memory::wire::BinClient;
use crate::memcapable::tempdir;
use crate::process::{self, ServerProcess};
use crate::util::{self, Stopwatch};

/// `cargo xtask bench collections` options.
#[derive(Debug, clap::Args)]
pub(crate) struct CollectionsOptions {
    /// Shorter phases (2 s, 3 rounds, 200,000 documents to drop)
    #[arg(long)]
    pub(crate) quick: bool,
    /// Seconds of each phase
    #[arg(long)]
    pub(crate) secs: Option<u64>,
    /// Documents in the dropped collection (default 1,000,000)
    #[arg(long)]
    pub(crate) drop_docs: Option<u64>,
    /// Use this epkv-server binary instead of building target/release/epkv-server
    #[arg(long)]
    pub(crate) epkv_bin: Option<PathBuf>,
}

const KEYS: u64 = 100_000;

fn key(i: u64) -> Vec<u8> {
    format!("key:{i:08}").into_bytes()
}

fn prefixed(cid: u32, k: &[u8]) -> Vec<u8> {
    epkv_types::doc_key::DocKeyBuf::new()
        .put_wire(cid, k)
        .to_vec()
}

/// The id of collection `path` (`scope.collection`), from the manifest
/// (GET_COLLECTIONS_MANIFEST; the bench client does not keep the extras
/// GET_COLLECTION_ID answers with).
fn collection_id(c: &mut BinClient, path: &str) -> Result<u32> {
    c.queue(Opcode::GetCollectionsManifest, b"", b"", b"", 0)?;
    c.flush()?;
    let m: serde_json::Value = serde_json::from_slice(&c.recv()?.value)?;
    let (scope, name) = path.split_once('.').unwrap_or(("", path));
    for s in m["scopes"].as_array().into_iter().flatten() {
        if s["name"] == scope {
            for col in s["collections"].as_array().into_iter().flatten() {
                if col["name"] == name {
                    let id = col["uid"].as_str().unwrap_or("0");
                    return Ok(u32::from_str_radix(id, 16)?);
                }
            }
        }
    }
    bail!("{path} is not in the manifest")
}

/// Stores `n` keys `key_of(i)` with `value`, pipelined.
fn load(c: &mut BinClient, n: u64, value: &[u8], key_of: impl Fn(u64) -> Vec<u8>) -> Result<()> {
    for start in (0..n).step_by(1000) {
        for i in start..(start + 1000).min(n) {
            c.queue_set(Opcode::SetQ, &key_of(i), value, 0)?;
        }
        if !c.fence()?.is_empty() {
            bail!("loading failed");
        }
    }
    Ok(())
}

/// One request at a time for `secs`: the latencies in microseconds.
fn latencies(c: &mut BinClient, secs: f64, stop: &dyn Fn() -> bool) -> Result<Vec<f64>> {
    let mut rng = crate::bench_memory::rng(13);
    let watch = Stopwatch::start();
    let mut out = Vec::new();
    while watch.elapsed().as_secs_f64() < secs && !stop() {
        let k = key(crate::bench_memory::below(&mut rng, KEYS));
        let t = Stopwatch::start();
        let r = c.get(&k)?;
        out.push(t.elapsed().as_secs_f64() * 1e6);
        if r.status != 0 {
            bail!("GET failed with {:#x}", r.status);
        }
    }
    Ok(out)
}

fn p99(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    crate::bench_memory::percentile(&v, 0.99)
}

/// One HTTP request to the management port (open mode: no credentials).
fn http(addr: &str, method: &str, path: &str, form: &str) -> Result<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: \
         application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{form}",
        form.len()
    )?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    Ok(reply
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0))
}

/// Runs the bench and writes its report.
pub(crate) fn bench_collections(opts: &CollectionsOptions) -> Result<()> {
    let bin = process::release_server_bin(opts.epkv_bin.as_ref())?;
    let secs = opts.secs.unwrap_or(if opts.quick { 2 } else { 5 }).max(1);
    let rounds = if opts.quick { 3 } else { 5 };
    let drop_docs = opts
        .drop_docs
        .unwrap_or(if opts.quick { 200_000 } else { 1_000_000 });
    let out_dir = util::target_dir().join("bench");
    std::fs::create_dir_all(&out_dir)?;
    let data = tempdir("bench-collections")?;
    let args = [
        "--data-dir".to_owned(),
        data.path().display().to_string(),
        "--memory-quota".to_owned(),
        "2GiB".to_owned(),
        "--collections".to_owned(),
        "default:bench.c1,default:bench.big".to_owned(),
    ];
    let server = ServerProcess::start_epkv(&bin, &args, out_dir.join("collections-epkv.log"))?;
    let mgmt = server
        .listening_line
        .split("mgmt http://")
        .nth(1)
        .and_then(|s| s.split([',', ')', ' ']).next())
        .map(str::to_owned);
    let mut plain = BinClient::connect(&server.addr(), true)?;
    let mut named = BinClient::connect(&server.addr(), true)?;
    named.negotiate_collections()?;
    let c1 = collection_id(&mut named, "bench.c1")?;
    let big = collection_id(&mut named, "bench.big")?;
    let value = vec![b'v'; 256];
    load(&mut plain, KEYS, &value, key)?;
    load(&mut named, KEYS, &value, |i| prefixed(c1, &key(i)))?;

    // Keys built before the timed phases, so that both clients do the same work.
    let keys_d: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
    let keys_n: Vec<Vec<u8>> = (0..KEYS).map(|i| prefixed(c1, &key(i))).collect();
    let at = |keys: &[Vec<u8>], i: u64| keys[usize::try_from(i).unwrap_or(0)].clone();
    let (mut get_d, mut get_n, mut set_d, mut set_n) = (vec![], vec![], vec![], vec![]);
    // Each round runs the two sides in turn, the first side alternating, so that neither
    // always follows the other (a SET phase leaves the flusher busy for the next one).
    for round in 0..rounds {
        for side in [round % 2, 1 - round % 2] {
            let (c, keys, gets) = if side == 0 {
                (&mut plain, &keys_d, &mut get_d)
            } else {
                (&mut named, &keys_n, &mut get_n)
            };
            gets.push(crate::bench_subdoc::pipelined(c, secs, KEYS, |c, i| {
                c.queue(Opcode::Get, &at(keys, i), b"", b"", 1)
            })?);
        }
        for side in [round % 2, 1 - round % 2] {
            let (c, keys, sets) = if side == 0 {
                (&mut plain, &keys_d, &mut set_d)
            } else {
                (&mut named, &keys_n, &mut set_n)
            };
            sets.push(crate::bench_subdoc::pipelined(c, secs, KEYS, |c, i| {
                c.queue_set(Opcode::Set, &at(keys, i), &value, 2)
            })?);
        }
    }
    let (gd, gn, sd, sn) = (
        util::median(get_d),
        util::median(get_n),
        util::median(set_d),
        util::median(set_n),
    );

    // The drop.
    load(&mut named, drop_docs, b"x", |i| prefixed(big, &key(i)))?;
    let before = latencies(&mut plain, 3.0, &|| false)?;
    let Some(mgmt) = mgmt else {
        bail!("the server did not name its management address");
    };
    let watch = Stopwatch::start();
    let status = http(
        &mgmt,
        "DELETE",
        "/pools/default/buckets/default/scopes/bench/collections/big",
        "",
    )?;
    if status != 200 {
        bail!("the drop answered {status}");
    }
    // Reads during the purge: until the collection's documents have left memory.
    let purged = || {
        let Ok(mut c) = BinClient::connect(&server.addr(), true) else {
            return false;
        };
        c.stats("").is_ok_and(|s| {
            s.get("curr_items")
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|n| n <= 2 * KEYS)
        })
    };
    let mut during = Vec::new();
    while watch.elapsed() < Duration::from_secs(120) && !purged() {
        during.extend(latencies(&mut plain, 0.5, &|| false)?);
    }
    let purge_secs = watch.elapsed().as_secs_f64();
    crate::bench_memory::stop(server);
    let (p_before, p_during) = (p99(before), p99(during.clone()));

    let params =
        json!({"keys": KEYS, "value_bytes": 256, "in_flight": 100, "secs": secs, "rounds": rounds});
    let rows = vec![
        json!({"bench": "collections/get", "params": params, "impl": "default-collection", "items_per_sec": gd, "ns_per_op": 1e9 / gd}),
        json!({"bench": "collections/get", "params": params, "impl": "named-collection", "items_per_sec": gn, "ns_per_op": 1e9 / gn, "ratio_vs_default": gn / gd}),
        json!({"bench": "collections/set", "params": params, "impl": "default-collection", "items_per_sec": sd, "ns_per_op": 1e9 / sd}),
        json!({"bench": "collections/set", "params": params, "impl": "named-collection", "items_per_sec": sn, "ns_per_op": 1e9 / sn, "ratio_vs_default": sn / sd}),
        json!({"bench": "collections/drop", "params": {"docs": drop_docs}, "impl": "epkv", "p99_us_before": p_before, "p99_us_during": p_during, "reads_during": during.len(), "purge_secs": purge_secs}),
    ];
    let md = format!(
        "### Collections (epkv as shipped)\n\n| case | default | named | ratio | goal |\n\
         |---|---:|---:|---:|---|\n\
         | GET, 100 in flight (ops/s, median of {rounds}) | {gd:.0} | {gn:.0} | {:.2}x | >= 0.95x |\n\
         | SET, 100 in flight (ops/s, median of {rounds}) | {sd:.0} | {sn:.0} | {:.2}x | >= 0.95x |\n\n\
         Dropping a collection of {drop_docs} documents: GET p99 {p_before:.0} us before, \
         {p_during:.0} us while it is purged ({} reads); purged from memory in {purge_secs:.1} s.\n",
        gn / gd,
        sn / sd,
        during.len()
    );
    std::fs::write(
        out_dir.join("collections.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    std::fs::write(out_dir.join("collections.md"), &md)?;
    println!("\n{md}");
    Ok(())
}
