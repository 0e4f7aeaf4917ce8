//! Storage benchmarks (seed 001 and KV-Engine's `kvstore_bench`), the store's modes side by
//! side in one run, on the disk of the target directory.
//!
//! `cargo bench -p epkv-bench --bench storage -- [--quick] [--vbuckets 1024]
//!  [--batch-items 2000] [--shards 1,4] [--docs 100000] [DiskFloor|Flush|Persist|Scan|Warmup]`
//!
//! - **DiskFloor**: append 4 KiB to a file and fdatasync it, repeatedly. items/s = syncs
//!   per second; ns/op = the disk's fdatasync latency, the floor every durable write pays.
//! - **FlushThroughput**: batches of `batch-items` 512-byte documents with random keys
//!   spread over `vbuckets` vBuckets (so a batch touches nearly every vBucket), committed
//!   back to back. items/s = documents made durable per second. Peers: journal on with data
//!   files kept open, the journal preallocated and journaled commits written to the data
//!   files 8 MiB at a time (`epkv`), the same writing each commit to the data files at once
//!   (`apply-each-commit`), the same with a journal that grows as it is appended to
//!   (`journal-growing`), journal on with files reopened per batch, journal off with files
//!   kept open, and journal off with files reopened per batch (what KV-Engine did before
//!   MB-36572: a sync per vBucket per batch and an open/close per vBucket per batch). Syncs
//!   per batch are printed for each.
//! - **PersistLatency**: a closed loop of `batch-items` writers, each with one write
//!   outstanding, over `shards` stores (one journal and one flusher thread each, vBucket
//!   `v` on shard `v % shards`, as the engine shards a bucket): a shard's flusher commits
//!   everything queued on it as one batch, then each writer whose write that was queues its
//!   next write to a random key (so to any shard). A write's latency runs from being
//!   queued to its batch's commit returning, waiting for the batch before it included.
//!   Reports p50 / p99 and p50 as a multiple of the DiskFloor latency measured in the same
//!   run (the figure to compare across machines; the goal is <= 3x with the journal), the
//!   mean writes per batch, and the mean split between waiting for the shard's previous
//!   commit and the write's own commit. items/s = writes persisted per second (by Little's
//!   law the mean latency is writers / items/s). Rows: `epkv` at each shard count,
//!   `apply-each-commit` and `journal-growing` at the largest, `kv-engine-2019` at 1 shard.
//!   This is the storage part of the seed's persistTo latency; the engine's queues and
//!   task wake-ups come on top.
//! - **KvStoreScan**: `docs` documents committed in one batch to one vBucket, then a full
//!   by-seqno scan reading every value from disk. Peers: the same documents written in 100
//!   commits (several index segments), and the in-memory store.
//! - **Warmup**: `vbuckets` vBuckets holding `docs` documents in all; open the store
//!   (recovery) and scan every vBucket by seqno. items/s = documents loaded per second.

use epkv_bench::harness::{Args, Report, Row, median, target_dir};
use epkv_executor::{Clock, SystemClock};
use epkv_storage::{
    Document, FileStore, FileStoreConfig, JournalMode, KvStore, MemStore, ScanControl, VbCommit,
    VbState,
};
use epkv_types::{VBucketState, Vbid};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

const VALUE_BYTES: usize = 512;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn bench_dir(name: &str) -> PathBuf {
    let d = target_dir().join("bench-data").join("storage").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap_or_else(|e| {
        eprintln!("cannot create {}: {e}", d.display());
        std::process::exit(2);
    });
    d
}

fn must<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    r.unwrap_or_else(|e| {
        eprintln!("{what}: {e}");
        std::process::exit(2);
    })
}

/// The disk's fdatasync latency: append `bytes`, fdatasync, for `d`. Returns (syncs/s, ns).
fn disk_floor(d: Duration, bytes: usize) -> (f64, f64) {
    let dir = bench_dir("floor");
    let path = dir.join("floor.bin");
    let f = must(
        OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path),
        "open",
    );
    let buf = vec![0x5au8; bytes];
    let t0 = SystemClock.now();
    let mut n = 0u64;
    let mut off = 0u64;
    while SystemClock.now() - t0 < d || n < 8 {
        must(f.write_all_at(&buf, off), "write");
        must(f.sync_data(), "fdatasync");
        off += bytes as u64;
        n += 1;
    }
    let secs = (SystemClock.now() - t0).as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    let rate = n as f64 / secs;
    (rate, 1e9 / rate)
}

#[derive(Clone, Copy)]
struct Mode {
    name: &'static str,
    journal: JournalMode,
    fd_budget: usize,
    journal_prealloc_bytes: u64,
    apply_after_bytes: u64,
}

/// Journal preallocation of the `epkv` mode: the checkpoint threshold (64 MiB) plus room
/// for the batch that crosses it.
const PREALLOC: u64 = 72 << 20;

/// Journaled documents the `epkv` mode lets accumulate before writing them to the data
/// files (the engine's default).
const APPLY_AFTER: u64 = 8 << 20;

const MODES: [Mode; 6] = [
    Mode {
        name: "epkv",
        journal: JournalMode::On,
        fd_budget: 4096,
        journal_prealloc_bytes: PREALLOC,
        apply_after_bytes: APPLY_AFTER,
    },
    Mode {
        name: "journal-growing",
        journal: JournalMode::On,
        fd_budget: 4096,
        journal_prealloc_bytes: 0,
        apply_after_bytes: APPLY_AFTER,
    },
    Mode {
        name: "journal-reopen-per-batch",
        journal: JournalMode::On,
        fd_budget: 0,
        journal_prealloc_bytes: PREALLOC,
        apply_after_bytes: APPLY_AFTER,
    },
    Mode {
        name: "no-journal-files-open",
        journal: JournalMode::Off,
        fd_budget: 4096,
        journal_prealloc_bytes: 0,
        apply_after_bytes: 0,
    },
    Mode {
        name: "kv-engine-2019",
        journal: JournalMode::Off,
        fd_budget: 0,
        journal_prealloc_bytes: 0,
        apply_after_bytes: 0,
    },
    Mode {
        name: "apply-each-commit",
        journal: JournalMode::On,
        fd_budget: 4096,
        journal_prealloc_bytes: PREALLOC,
        apply_after_bytes: 0,
    },
];

fn open_store(dir: &Path, m: Mode) -> FileStore {
    let mut cfg = FileStoreConfig::new(dir);
    cfg.journal = m.journal;
    cfg.fd_budget = m.fd_budget;
    cfg.journal_prealloc_bytes = m.journal_prealloc_bytes;
    cfg.apply_after_bytes = m.apply_after_bytes;
    must(FileStore::open(cfg), "open store")
}

fn make_batch(rng: &mut Rng, seqnos: &mut [u64], items: usize, keyspace: u64) -> Vec<VbCommit> {
    let vbs = seqnos.len() as u64;
    let mut per_vb: Vec<Vec<Document>> = vec![Vec::new(); seqnos.len()];
    for _ in 0..items {
        let k = rng.next() % keyspace;
        let vb = usize::try_from(k % vbs).unwrap_or(0);
        seqnos[vb] += 1;
        per_vb[vb].push(Document {
            key: format!("key{k:09}").into_bytes(),
            value: vec![(k & 0xff) as u8; VALUE_BYTES].into(),
            seqno: seqnos[vb],
            cas: seqnos[vb],
            rev_seqno: 1,
            flags: 0,
            expiry: 0,
            datatype: 0,
            deleted: false,
        });
    }
    per_vb
        .into_iter()
        .enumerate()
        .filter(|(_, d)| !d.is_empty())
        .map(|(vb, docs)| VbCommit {
            vbid: Vbid(u16::try_from(vb).unwrap_or(0)),
            docs: docs.into(),
            keys_unique: false,
            state: VbState::new(VBucketState::Active),
        })
        .collect()
}

/// Commits batches for `d` (at least 2); returns (items/s, syncs per batch, batches,
/// per-batch durations).
fn flush_run(m: Mode, vbuckets: usize, items: usize, d: Duration) -> (f64, f64, Vec<Duration>) {
    let dir = bench_dir(m.name);
    let store = open_store(&dir, m);
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut seqnos = vec![0u64; vbuckets];
    // Untimed: create every vBucket's file first, so the run measures steady state.
    must(
        store.commit(&make_batch(&mut rng, &mut seqnos, vbuckets * 2, 1 << 20)),
        "commit",
    );
    must(store.checkpoint(), "checkpoint");
    let s0 = store.stats();
    let mut times = Vec::new();
    let stop = AtomicBool::new(false);
    let t0 = SystemClock.now();
    std::thread::scope(|sc| {
        if m.journal == JournalMode::On {
            // The background half of a journal commit (the engine's Writer task): write
            // journaled commits to the data files while the flusher carries on.
            sc.spawn(|| {
                while !stop.load(Relaxed) {
                    match store.apply_pending(64) {
                        Ok(0) => std::thread::sleep(Duration::from_micros(200)),
                        Ok(_) => {}
                        Err(e) => {
                            eprintln!("apply_pending: {e}");
                            std::process::exit(2);
                        }
                    }
                }
            });
        }
        while SystemClock.now() - t0 < d || times.len() < 2 {
            let b = make_batch(&mut rng, &mut seqnos, items, 1 << 20);
            let t = SystemClock.now();
            must(store.commit(&b), "commit");
            times.push(SystemClock.now() - t);
        }
        stop.store(true, Relaxed);
    });
    let secs = (SystemClock.now() - t0).as_secs_f64();
    let s1 = store.stats();
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    let (rate, syncs) = (
        (s1.items_flushed - s0.items_flushed) as f64 / secs,
        (s1.syncs - s0.syncs) as f64 / times.len() as f64,
    );
    (rate, syncs, times)
}

/// One write waiting in a shard's queue: its vBucket, document and when it was queued.
struct Queued {
    vb: u16,
    doc: Document,
    at: Instant,
}

/// A shard's queue of writes (the engine's dirty queues of the shard's vBuckets) and the
/// seqnos of its vBuckets (assigned at queue time, under the lock, like the engine's
/// ordering point).
#[derive(Default)]
struct ShardQueue {
    q: Mutex<(Vec<Queued>, HashMap<u16, u64>)>,
    cv: Condvar,
}

/// PersistLatency runs of one case, summed over rounds.
#[derive(Default)]
struct PersistAcc {
    rates: Vec<f64>,
    latencies: Vec<Duration>,
    /// Summed wait (ns) over all writes, summed commit time (ns) over all batches.
    wait: f64,
    commit: f64,
    batches: u64,
}

/// What a PersistLatency run measured.
struct PersistRun {
    /// Writes persisted per second.
    rate: f64,
    /// Queued-to-persisted time of every write persisted.
    latencies: Vec<Duration>,
    /// Mean time a write waited queued before its batch was taken (the previous batch's
    /// commit still running), and mean commit time per batch.
    wait_ns: f64,
    commit_ns: f64,
    /// Commits (batches) and writes per commit.
    batches: u64,
}

fn make_doc(rng: &mut Rng, keyspace: u64, vbuckets: usize) -> (u16, Document) {
    let k = rng.next() % keyspace;
    let vb = u16::try_from(k % vbuckets as u64).unwrap_or(0);
    (
        vb,
        Document {
            key: format!("key{k:09}").into_bytes(),
            value: vec![(k & 0xff) as u8; VALUE_BYTES].into(),
            seqno: 0,
            cas: 0,
            rev_seqno: 1,
            flags: 0,
            expiry: 0,
            datatype: 0,
            deleted: false,
        },
    )
}

/// Queues writes on their shards (vBucket `v` belongs to shard `v % shards`), each with
/// the next seqno of its vBucket.
fn queue_writes(queues: &[ShardQueue], writes: Vec<(u16, Document)>, at: Instant) {
    let n = queues.len();
    let mut by_shard: Vec<Vec<(u16, Document)>> = (0..n).map(|_| Vec::new()).collect();
    for (vb, d) in writes {
        by_shard[usize::from(vb) % n].push((vb, d));
    }
    for (sq, ws) in queues.iter().zip(by_shard) {
        if ws.is_empty() {
            continue;
        }
        let mut g = sq.q.lock();
        for (vb, mut doc) in ws {
            let s = g.1.entry(vb).or_insert(0);
            *s += 1;
            doc.seqno = *s;
            doc.cas = *s;
            g.0.push(Queued { vb, doc, at });
        }
        drop(g);
        sq.cv.notify_one();
    }
}

/// The closed loop of `writers` writers over `shards` stores (one directory, journal and
/// flusher thread each, as the engine runs them): each writer has one write queued; a
/// shard's flusher commits everything queued on it as one batch, then every writer whose
/// write that was queues its next write (to a random key, so to any shard). A write's
/// latency is from being queued to its batch's commit returning. One applier thread writes
/// the journaled commits to the data files meanwhile (the engine's applier tasks).
#[expect(clippy::too_many_lines, reason = "one closed loop, read top to bottom")]
fn persist_run(m: Mode, shards: usize, vbuckets: usize, writers: usize, d: Duration) -> PersistRun {
    let dirs: Vec<PathBuf> = (0..shards)
        .map(|i| bench_dir(&format!("{}-{shards}-{i}", m.name)))
        .collect();
    let stores: Vec<FileStore> = dirs.iter().map(|dir| open_store(dir, m)).collect();
    let queues: Vec<ShardQueue> = (0..shards).map(|_| ShardQueue::default()).collect();
    // Untimed: create every vBucket's file first, so the run measures steady state.
    {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let mut seqnos = vec![0u64; vbuckets];
        let b = make_batch(&mut rng, &mut seqnos, vbuckets * 2, 1 << 20);
        for (i, s) in stores.iter().enumerate() {
            let part: Vec<VbCommit> = b
                .iter()
                .filter(|c| usize::from(c.vbid.0) % shards == i)
                .cloned()
                .collect();
            must(s.commit(&part), "commit");
            must(s.checkpoint(), "checkpoint");
        }
        for (vb, high) in seqnos.iter().enumerate() {
            let vb = u16::try_from(vb).unwrap_or(0);
            queues[usize::from(vb) % shards]
                .q
                .lock()
                .1
                .insert(vb, *high);
        }
    }
    let s0: u64 = stores.iter().map(|s| s.stats().items_flushed).sum();
    let stop = AtomicBool::new(false);
    let t0 = SystemClock.now();
    {
        let mut rng = Rng(0x0bad_cafe_f00d_d00d);
        let w = (0..writers)
            .map(|_| make_doc(&mut rng, 1 << 20, vbuckets))
            .collect();
        queue_writes(&queues, w, t0);
    }
    let per_shard: Vec<(Vec<Duration>, f64, f64, u64)> = std::thread::scope(|sc| {
        let applier = (m.journal == JournalMode::On).then(|| {
            let (stores, stop) = (&stores, &stop);
            sc.spawn(move || {
                while !stop.load(Relaxed) {
                    let mut left = 0;
                    for s in stores {
                        left += must(s.apply_pending(64), "apply_pending");
                    }
                    if left == 0 {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            })
        });
        let flushers: Vec<_> = (0..shards)
            .map(|i| {
                let (stores, queues, stop) = (&stores, &queues, &stop);
                sc.spawn(move || {
                    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1));
                    let mut lat = Vec::new();
                    let (mut wait, mut commit, mut batches) = (0f64, 0f64, 0u64);
                    loop {
                        let taken = {
                            let mut g = queues[i].q.lock();
                            while g.0.is_empty() && !stop.load(Relaxed) {
                                queues[i].cv.wait_for(&mut g, Duration::from_millis(5));
                            }
                            std::mem::take(&mut g.0)
                        };
                        if stop.load(Relaxed) && (SystemClock.now() - t0 >= d) {
                            break;
                        }
                        let start = SystemClock.now();
                        let mut per_vb: HashMap<u16, Vec<Document>> = HashMap::new();
                        let mut ats = Vec::with_capacity(taken.len());
                        for q in taken {
                            ats.push(q.at);
                            per_vb.entry(q.vb).or_default().push(q.doc);
                        }
                        let batch: Vec<VbCommit> = per_vb
                            .into_iter()
                            .map(|(vb, docs)| VbCommit {
                                vbid: Vbid(vb),
                                docs: docs.into(),
                                keys_unique: false,
                                state: VbState::new(VBucketState::Active),
                            })
                            .collect();
                        must(stores[i].commit(&batch), "commit");
                        let done = SystemClock.now();
                        commit += (done - start).as_secs_f64() * 1e9;
                        batches += 1;
                        for at in &ats {
                            wait += (start - *at).as_secs_f64() * 1e9;
                            lat.push(done - *at);
                        }
                        // Each writer whose write is persisted queues its next one.
                        let next = (0..ats.len())
                            .map(|_| make_doc(&mut rng, 1 << 20, vbuckets))
                            .collect();
                        queue_writes(queues, next, SystemClock.now());
                        if SystemClock.now() - t0 >= d && batches >= 2 {
                            stop.store(true, Relaxed);
                            for q in queues {
                                q.cv.notify_all();
                            }
                        }
                    }
                    (lat, wait, commit, batches)
                })
            })
            .collect();
        let out = flushers
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| std::process::exit(2)))
            .collect();
        stop.store(true, Relaxed);
        if let Some(a) = applier {
            let _ = a.join();
        }
        out
    });
    let secs = (SystemClock.now() - t0).as_secs_f64();
    let s1: u64 = stores.iter().map(|s| s.stats().items_flushed).sum();
    drop(stores);
    for dir in &dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
    let mut latencies = Vec::new();
    let (mut wait, mut commit, mut batches) = (0f64, 0f64, 0u64);
    for (l, w, c, b) in per_shard {
        latencies.extend(l);
        wait += w;
        commit += c;
        batches += b;
    }
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    let (rate, wait_ns, commit_ns) = (
        (s1 - s0) as f64 / secs,
        wait / latencies.len().max(1) as f64,
        commit / batches.max(1) as f64,
    );
    PersistRun {
        rate,
        latencies,
        wait_ns,
        commit_ns,
        batches,
    }
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort_unstable();
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "an index into a short vector"
    )]
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i]
}

fn scan_count(s: &dyn KvStore, vb: Vbid) -> u64 {
    let mut bytes = 0u64;
    let n = must(
        s.scan_by_seqno(vb, 0, u64::MAX, &mut |d| {
            bytes += d.value.len() as u64;
            ScanControl::Continue
        }),
        "scan",
    );
    std::hint::black_box(bytes);
    n
}

fn docs_for_scan(n: u64) -> Vec<Document> {
    (1..=n)
        .map(|i| Document {
            key: format!("key{i}").into_bytes(),
            value: b"value".to_vec().into(),
            seqno: i,
            cas: i,
            rev_seqno: 1,
            flags: 0,
            expiry: 0,
            datatype: 0,
            deleted: false,
        })
        .collect()
}

#[expect(
    clippy::too_many_lines,
    reason = "one benchmark driver, read top to bottom"
)]
fn main() {
    let args = Args::parse();
    let d = args.measure_time();
    let rounds = args.rounds();
    let vbuckets = args.list("vbuckets", &[1024])[0].clamp(1, 1024);
    let items = args.list("batch-items", &[2000])[0].max(1);
    let ndocs = args.list("docs", &[100_000])[0].max(1) as u64;
    let mut report = Report::new("storage");
    println!(
        "storage benchmarks in {}: {} s per measurement, {rounds} rounds (median)",
        target_dir().join("bench-data").display(),
        d.as_secs_f64()
    );
    let mut floor_ns = 0.0;
    if args.wants("DiskFloor") || args.wants("PersistLatency") {
        let mut lines = Vec::new();
        // 4 KiB: the latency floor; 1.2 MB: what one journal append of a 2000-item batch
        // of 512-byte values writes.
        for bytes in [4096usize, items * (VALUE_BYTES + 100)] {
            let mut rates = Vec::new();
            for _ in 0..rounds {
                rates.push(disk_floor(d, bytes).0);
            }
            let rate = median(rates);
            if bytes == 4096 {
                floor_ns = 1e9 / rate;
            }
            report.push(Row::new(
                "DiskFloor",
                &[("bytes", bytes as u64)],
                "fdatasync",
                rate,
            ));
            lines.push(format!("{bytes} bytes {:.0} us", 1e6 / rate));
        }
        report.note(&format!(
            "DiskFloor: append + fdatasync on the target directory's disk: {}.",
            lines.join(", ")
        ));
    }
    if args.wants("FlushThroughput") {
        let params = [
            ("vbuckets", vbuckets as u64),
            ("batch_items", items as u64),
            ("value_bytes", VALUE_BYTES as u64),
        ];
        let mut lines = Vec::new();
        let mut results: Vec<(Mode, Vec<f64>, Vec<f64>)> =
            MODES.iter().map(|m| (*m, Vec::new(), Vec::new())).collect();
        for _ in 0..rounds {
            for r in &mut results {
                let (rate, syncs, _) = flush_run(r.0, vbuckets, items, d);
                r.1.push(rate);
                r.2.push(syncs);
            }
        }
        for (m, rates, syncs) in results {
            let s = median(syncs);
            report.push(Row::new("FlushThroughput", &params, m.name, median(rates)));
            lines.push(format!("{} {s:.1}", m.name));
        }
        report.note(&format!(
            "FlushThroughput syncs per batch (median): {}. With the journal a batch costs one \
             journal fdatasync whatever the vBuckets touched; data files are synced at \
             checkpoints (every 64 MiB of journal), which is included. 'kv-engine-2019' \
             reopens every file per batch and syncs each vBucket file.",
            lines.join(", ")
        ));
    }
    if args.wants("PersistLatency") {
        let shard_counts = args.list("shards", &[1, 4]);
        let mut lines = Vec::new();
        let mut cases: Vec<(Mode, usize)> = Vec::new();
        for &n in &shard_counts {
            cases.push((MODES[0], n.clamp(1, 64)));
        }
        let most = shard_counts.last().copied().unwrap_or(1).clamp(1, 64);
        cases.push((MODES[5], most));
        cases.push((MODES[1], most));
        cases.push((MODES[4], 1));
        let mut results: Vec<PersistAcc> = cases.iter().map(|_| PersistAcc::default()).collect();
        for _ in 0..rounds {
            for (c, r) in cases.iter().zip(results.iter_mut()) {
                let run = persist_run(c.0, c.1, vbuckets, items, d);
                r.rates.push(run.rate);
                #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
                {
                    r.wait += run.wait_ns * run.latencies.len() as f64;
                    r.commit += run.commit_ns * run.batches as f64;
                }
                r.batches += run.batches;
                r.latencies.extend(run.latencies);
            }
        }
        for ((m, shards), acc) in cases.into_iter().zip(results) {
            let PersistAcc {
                rates,
                latencies: mut all,
                wait,
                commit,
                batches,
            } = acc;
            let params = [
                ("writers", items as u64),
                ("vbuckets", vbuckets as u64),
                ("shards", shards as u64),
            ];
            let p50 = percentile(&mut all, 0.5);
            let p99 = percentile(&mut all, 0.99);
            let rate = median(rates);
            report.push(Row::new("PersistLatency", &params, m.name, rate));
            let mult = if floor_ns > 0.0 {
                p50.as_secs_f64() * 1e9 / floor_ns
            } else {
                0.0
            };
            #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
            let (n, b) = (all.len().max(1) as f64, batches.max(1) as f64);
            lines.push(format!(
                "{} {shards} shard(s): p50 {:.2} ms, p99 {:.2} ms, p50 = {mult:.1}x fdatasync, \
                 {:.0} writes/batch, mean wait for a batch {:.2} ms + commit {:.2} ms",
                m.name,
                p50.as_secs_f64() * 1e3,
                p99.as_secs_f64() * 1e3,
                n / b,
                wait / n / 1e6,
                commit / b / 1e6,
            ));
        }
        report.note(&format!(
            "PersistLatency ({items} concurrent writers, closed loop, queued-to-persisted, \
             4 KiB floor {:.0} us): {}.",
            floor_ns / 1e3,
            lines.join("; ")
        ));
    }
    if args.wants("KvStoreScan") {
        let params = [("docs", ndocs)];
        let docs = docs_for_scan(ndocs);
        let one = |name: &str, commits: usize| -> FileStore {
            let dir = bench_dir(name);
            let s = open_store(&dir, MODES[1]);
            let per = docs.len().div_ceil(commits);
            for chunk in docs.chunks(per) {
                must(
                    s.commit(&[VbCommit {
                        vbid: Vbid(0),
                        docs: chunk.to_vec().into(),
                        keys_unique: false,
                        state: VbState::new(VBucketState::Active),
                    }]),
                    "commit",
                );
            }
            must(s.checkpoint(), "checkpoint");
            s
        };
        let single = one("scan-1", 1);
        let multi = one("scan-100", 100);
        let mem = MemStore::new();
        must(
            mem.commit(&[VbCommit {
                vbid: Vbid(0),
                docs: docs.clone().into(),
                keys_unique: false,
                state: VbState::new(VBucketState::Active),
            }]),
            "commit",
        );
        let peers: [(&str, &dyn KvStore); 3] = [
            ("epkv", &single),
            ("files-100-commits", &multi),
            ("memstore", &mem),
        ];
        let mut rates = vec![Vec::new(); peers.len()];
        for _ in 0..rounds {
            for (i, (_, s)) in peers.iter().enumerate() {
                let t0 = SystemClock.now();
                let mut n = 0u64;
                while SystemClock.now() - t0 < d || n == 0 {
                    n += scan_count(*s, Vbid(0));
                }
                #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
                rates[i].push(n as f64 / (SystemClock.now() - t0).as_secs_f64());
            }
        }
        for (i, (name, _)) in peers.iter().enumerate() {
            report.push(Row::new(
                "KvStoreScan",
                &params,
                name,
                median(rates[i].clone()),
            ));
        }
        drop(single);
        drop(multi);
        let _ = std::fs::remove_dir_all(bench_dir("scan-1"));
        let _ = std::fs::remove_dir_all(bench_dir("scan-100"));
        report.note(
            "KvStoreScan: a full by-seqno scan of one vBucket reading every value from the \
             data file (the page cache, after the first round), like kvstore_bench's Scan.",
        );
    }
    if args.wants("Warmup") {
        let params = [("docs", ndocs), ("vbuckets", vbuckets as u64)];
        let dir = bench_dir("warmup");
        {
            let s = open_store(&dir, MODES[1]);
            let mut rng = Rng(7);
            let mut seqnos = vec![0u64; vbuckets];
            let per = 10_000usize;
            let mut left = usize::try_from(ndocs).unwrap_or(0);
            while left > 0 {
                let n = left.min(per);
                must(
                    s.commit(&make_batch(&mut rng, &mut seqnos, n, u64::MAX)),
                    "commit",
                );
                left -= n;
            }
            must(s.close(), "close");
        }
        let mut rates = Vec::new();
        for _ in 0..rounds {
            let t0 = SystemClock.now();
            let s = open_store(&dir, MODES[1]);
            let mut n = 0;
            for vb in s.vbuckets() {
                n += scan_count(&s, vb);
            }
            #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
            rates.push(n as f64 / (SystemClock.now() - t0).as_secs_f64());
        }
        report.push(Row::new("Warmup", &params, "epkv", median(rates)));
        let _ = std::fs::remove_dir_all(&dir);
    }
    let mut out = std::io::stdout();
    let _ = out.flush();
    if let Err(e) = report.finish("epkv") {
        eprintln!("cannot write the report: {e}");
    }
}
