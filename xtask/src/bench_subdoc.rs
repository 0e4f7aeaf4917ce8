//! `cargo xtask bench subdoc`: sub-document operations against what a client does without
//! them (issue 20), epkv against itself in the same run.
//!
//! One memory-only epkv-server holds 1,000 JSON documents of about 4 KiB (40 fields of
//! nested objects). Over one connection:
//! - `get` vs `subdoc-get`: random documents, 100 requests in flight, for `secs` each: a
//!   full GET, and a SUBDOC_GET of one path (`f20.name`). Goal: the path read at least
//!   0.9x the full GET's ops/s (its reply is smaller).
//! - `get+cas-set` vs `multi-mutation`: one change of 4 paths to a random document, one
//!   change at a time (each waits for its reply): the client's way (GET, change the JSON,
//!   SET with the CAS it read), and one SUBDOC_MULTI_MUTATION. Goal: at least 1.5x.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use epkv_protocol::{Opcode, put_mutation_spec};
use serde_json::{Value, json};

use crate::bench_memory::wire::BinClient;
use crate::memcapable::tempdir;
use crate::process::{self, ServerProcess};
use crate::util::{self, Stopwatch};

const DOCS: u64 = 1000;

/// `cargo xtask bench subdoc` options.
#[derive(Debug, clap::Args)]
pub(crate) struct SubdocOptions {
    /// Shorter phases (3 s instead of 10).
    #[arg(long)]
    pub(crate) quick: bool,
    /// Seconds of each phase.
    #[arg(long)]
    pub(crate) secs: Option<u64>,
    /// Use this epkv-server binary instead of building target/release/epkv-server.
    #[arg(long)]
    pub(crate) epkv_bin: Option<PathBuf>,
}

fn document(i: u64) -> Vec<u8> {
    let mut doc = serde_json::Map::new();
    for f in 0..40 {
        doc.insert(
            format!("f{f}"),
            json!({"name": format!("field {f} of {i}"), "count": f * i, "tags": ["a", "b", "c"],
                   "note": "some text that makes each field about a hundred bytes long"}),
        );
    }
    Value::Object(doc).to_string().into_bytes()
}

fn key(i: u64) -> Vec<u8> {
    format!("sd:{i:06}").into_bytes()
}

/// Ops per second of `secs` seconds of batches of 100 requests `queue` builds, each
/// for a random document below `keys`.
pub(crate) fn pipelined(
    c: &mut BinClient,
    secs: u64,
    keys: u64,
    mut queue: impl FnMut(&mut BinClient, u64) -> Result<()>,
) -> Result<f64> {
    let mut rng = crate::bench_memory::rng(7);
    let watch = Stopwatch::start();
    let mut done = 0u64;
    while watch.elapsed() < Duration::from_secs(secs) {
        for _ in 0..100 {
            queue(c, crate::bench_memory::below(&mut rng, keys))?;
        }
        c.flush()?;
        for _ in 0..100 {
            let r = c.recv()?;
            if r.status != 0 {
                bail!("a request failed with {:#x}", r.status);
            }
        }
        done += 100;
    }
    Ok(done as f64 / watch.elapsed().as_secs_f64())
}

/// Ops per second of `secs` seconds of one-at-a-time changes `change` makes.
fn sequential(
    c: &mut BinClient,
    secs: u64,
    mut change: impl FnMut(&mut BinClient, u64) -> Result<()>,
) -> Result<f64> {
    let mut rng = crate::bench_memory::rng(9);
    let watch = Stopwatch::start();
    let mut done = 0u64;
    while watch.elapsed() < Duration::from_secs(secs) {
        change(c, crate::bench_memory::below(&mut rng, DOCS))?;
        done += 1;
    }
    Ok(done as f64 / watch.elapsed().as_secs_f64())
}

/// Runs the bench and writes its report.
pub(crate) fn bench_subdoc(opts: &SubdocOptions) -> Result<()> {
    let bin = process::release_server_bin(opts.epkv_bin.as_ref())?;
    let secs = opts.secs.unwrap_or(if opts.quick { 3 } else { 10 }).max(1);
    let out_dir = util::target_dir().join("bench");
    std::fs::create_dir_all(&out_dir)?;
    let data = tempdir("bench-subdoc")?;
    let args = [
        "--persistence".to_owned(),
        "false".to_owned(),
        "--data-dir".to_owned(),
        data.path().display().to_string(),
    ];
    let server = ServerProcess::start_epkv(&bin, &args, out_dir.join("subdoc-epkv.log"))?;
    let mut c = BinClient::connect(&server.addr(), true)?;
    for i in 0..DOCS {
        c.queue_set_datatype(
            Opcode::SetQ,
            &key(i),
            &document(i),
            epkv_types::Datatype::JSON,
            epkv_types::Cas::ANY,
            0,
        )?;
    }
    if !c.fence()?.is_empty() {
        bail!("loading the documents failed");
    }
    let path = b"f20.name";
    let mut extras = (path.len() as u16).to_be_bytes().to_vec();
    extras.push(0);
    let get = pipelined(&mut c, secs, DOCS, |c, i| {
        c.queue(Opcode::Get, &key(i), b"", b"", 1)
    })?;
    let sub = pipelined(&mut c, secs, DOCS, |c, i| {
        c.queue(Opcode::SubdocGet, &key(i), &extras, path, 1)
    })?;
    let rmw = sequential(&mut c, secs, |c, i| {
        let k = key(i);
        let got = c.get(&k)?;
        if got.status != 0 {
            bail!("GET failed with {:#x}", got.status);
        }
        let mut doc: Value = serde_json::from_slice(&got.value)?;
        for f in ["f1", "f2", "f3", "f4"] {
            doc[f]["count"] = json!(i);
        }
        c.queue_set_datatype(
            Opcode::Set,
            &k,
            &doc.to_string().into_bytes(),
            epkv_types::Datatype::JSON,
            got.cas,
            2,
        )?;
        c.flush()?;
        let r = c.recv()?;
        if r.status != 0 {
            bail!("CAS SET failed with {:#x}", r.status);
        }
        Ok(())
    })?;
    let multi = sequential(&mut c, secs, |c, i| {
        let mut specs = Vec::new();
        let v = i.to_string();
        for f in ["f1.count", "f2.count", "f3.count", "f4.count"] {
            put_mutation_spec(
                &mut specs,
                Opcode::SubdocDictUpsert,
                0,
                f.as_bytes(),
                v.as_bytes(),
            );
        }
        c.queue(Opcode::SubdocMultiMutation, &key(i), b"", &specs, 3)?;
        c.flush()?;
        let r = c.recv()?;
        if r.status != 0 {
            bail!("MULTI_MUTATION failed with {:#x}", r.status);
        }
        Ok(())
    })?;
    crate::bench_memory::stop(server);
    drop(data);
    let rows = vec![
        json!({"bench": "subdoc/get_one_path", "params": {"doc_bytes": document(0).len(), "in_flight": 100, "secs": secs}, "impl": "get", "items_per_sec": get, "ns_per_op": 1e9 / get}),
        json!({"bench": "subdoc/get_one_path", "params": {"doc_bytes": document(0).len(), "in_flight": 100, "secs": secs}, "impl": "subdoc-get", "items_per_sec": sub, "ns_per_op": 1e9 / sub, "ratio_vs_get": sub / get}),
        json!({"bench": "subdoc/change_four_paths", "params": {"doc_bytes": document(0).len(), "in_flight": 1, "secs": secs}, "impl": "get+cas-set", "items_per_sec": rmw, "ns_per_op": 1e9 / rmw}),
        json!({"bench": "subdoc/change_four_paths", "params": {"doc_bytes": document(0).len(), "in_flight": 1, "secs": secs}, "impl": "multi-mutation", "items_per_sec": multi, "ns_per_op": 1e9 / multi, "ratio_vs_get_cas_set": multi / rmw}),
    ];
    let md = format!(
        "### Sub-document\n\n| case | ops/s | ratio | goal |\n|---|---:|---:|---|\n\
         | full GET of a {} B document, 100 in flight | {get:.0} | | |\n\
         | SUBDOC_GET of one path, 100 in flight | {sub:.0} | {:.2}x | >= 0.9x |\n\
         | GET + client change + CAS SET, one at a time | {rmw:.0} | | |\n\
         | MULTI_MUTATION of 4 paths, one at a time | {multi:.0} | {:.2}x | >= 1.5x |\n",
        document(0).len(),
        sub / get,
        multi / rmw
    );
    std::fs::write(
        out_dir.join("subdoc.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    std::fs::write(out_dir.join("subdoc.md"), &md)?;
    println!("\n{md}");
    Ok(())
}
