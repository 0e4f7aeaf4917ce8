//! SyncWrite benchmarks (issue 23: the DurabilityTimeout re-arm, seed 000's timeout
//! pattern applied to durable writes), epkv and its peers side by side in one run.
//!
//! `cargo bench -p epkv-bench --bench durability -- [--quick] [--threads 1,2]
//!  [--impls epkv,no-timeouts,plain-set]`
//!
//! - **SyncWriteOneVBucket**: a memory-only bucket of one vBucket (its background tasks
//!   on the bucket's own executor, so the durability timeout task runs on a real NonIO
//!   thread). Each thread SETs 64-byte values over its own 10,000 keys (no two threads
//!   write a key, so no write meets another's prepare) at level Majority and asks for the
//!   outcome as the front end does (`Engine::when_sync_write_completed`); on a single node
//!   Majority commits before the call returns. Timed: the SET plus the outcome call.
//!   Two cases, `timeout_ms:30000` (every write gives 30 s: deadlines only grow, as
//!   with SDK defaults) and `timeout_ms:0` (each write a random timeout of 1-30 s, so a
//!   new head is often due earlier than the task is armed for, and the task is re-armed).
//!   Peers:
//!   - `epkv`: as shipped: every prepare has a deadline and the vBucket's timeout task is
//!     re-armed (the executor's O(1) snooze) whenever the head's deadline comes earlier
//!     than the task is armed for.
//!   - `no-timeouts`: `BucketConfig::sync_write_timeouts = false`: the same SyncWrites
//!     with no deadline tracked and no task. Goal: `epkv` ≥ 0.95x of it.
//!   - `plain-set` (reference): the same SETs without durability, for the cost of a
//!     SyncWrite itself (prepare, commit, outcome).
//!
//!   A Majority prepare with nothing in flight before it is committed at once, without
//!   the monitor's list or the timeout task, so this case measures that path.
//! - **SyncWriteTracked**: the same on a persistent bucket of one vBucket (data directory
//!   under `/dev/shm` when there is one, so that the fdatasync costs little; flusher run
//!   by hand), at PersistToMajority: every prepare is tracked by the monitor, with a
//!   deadline, and the timeout task is re-armed as heads change. Every 256 writes the
//!   thread flushes (`Bucket::flush_all`, timed, the same for every peer), which commits
//!   them. Peers `epkv` and `no-timeouts` as above.

use epkv_bench::harness::{Args, Measurement, Report, Runner, compare, run_threads};
use epkv_engine::{Bucket, BucketConfig, EngineClock};
use epkv_engine_api::{DurabilityRequirements, Engine, Expiry, StoreOp, StoreRequest};
use epkv_types::{Cas, Datatype, DurabilityLevel, Vbid};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

/// The allocator `epkv-server` runs with.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const KEYS_PER_THREAD: usize = 10_000;

const VALUE: [u8; 64] = [b'v'; 64];

fn bucket(timeouts: bool, dir: Option<&std::path::Path>) -> Arc<Bucket> {
    let persistence = dir.map(|d| {
        let mut p = epkv_engine::PersistenceConfig::new(d);
        p.shards = 1;
        p.flusher = epkv_engine::FlusherMode::Manual;
        p.compaction_interval = Duration::ZERO;
        p
    });
    let config = BucketConfig {
        num_vbuckets: 1,
        expiry_pager_interval: Duration::ZERO,
        memory_quota_bytes: 1 << 30,
        sync_write_timeouts: timeouts,
        persistence,
        ..BucketConfig::default()
    };
    match Bucket::new(config, EngineClock::System) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("cannot create the bucket: {e}");
            std::process::exit(2);
        }
    }
}

/// How a run's SETs ask for durability.
#[derive(Clone, Copy)]
enum Mode {
    Plain,
    Majority,
    /// PersistToMajority, flushing every 256 writes.
    Persist,
}

/// One peer's timed run: `threads` threads of SETs on the bucket in `mode`; `timeout_ms`
/// 0 picks a random 1-30 s per write.
fn run(b: &Bucket, threads: usize, d: Duration, mode: Mode, timeout_ms: u64) -> Measurement {
    run_threads(threads, d, |t| {
        let keys: Vec<Vec<u8>> = (0..KEYS_PER_THREAD)
            .map(|i| format!("t{t}-k{i}").into_bytes())
            .collect();
        let mut i = 0usize;
        let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1);
        move || {
            let key = &keys[i % KEYS_PER_THREAD];
            i = i.wrapping_add(1);
            if matches!(mode, Mode::Persist) && i.is_multiple_of(256) && b.flush_all().is_err() {
                eprintln!("flush failed");
                std::process::exit(2);
            }
            let level = match mode {
                Mode::Plain => None,
                Mode::Majority => Some(DurabilityLevel::Majority),
                Mode::Persist => Some(DurabilityLevel::PersistToMajority),
            };
            let durability = level.map(|level| {
                let ms = if timeout_ms == 0 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    1000 + rng % 29_000
                } else {
                    timeout_ms
                };
                DurabilityRequirements {
                    level,
                    timeout: Some(Duration::from_millis(ms)),
                }
            });
            let r = b.store(StoreRequest {
                op: StoreOp::Set,
                vbid: Vbid(0),
                key,
                value: &VALUE,
                flags: 0,
                expiry: Expiry::Never,
                preserve_ttl: false,
                datatype: Datatype::RAW,
                cas: Cas::ANY,
                durability,
            });
            match r {
                Ok(info) if level.is_some() => {
                    let asked = b.when_sync_write_completed(
                        Vbid(0),
                        info.seqno.0,
                        Box::new(|r| {
                            black_box(r.is_ok());
                        }),
                    );
                    black_box(asked.is_ok());
                }
                Ok(info) => {
                    black_box(info);
                }
                Err(e) => {
                    eprintln!("SET failed: {e:?}");
                    std::process::exit(2);
                }
            }
        }
    })
}

fn main() {
    let args = Args::parse();
    let d = args.measure_time();
    let mut report = Report::new("durability");
    println!(
        "durability benchmarks: {} s per measurement, {} rounds (median), threads {:?}",
        d.as_secs_f64(),
        args.rounds(),
        args.threads,
    );
    if args.wants("SyncWriteOneVBucket") {
        let with = bucket(true, None);
        let without = bucket(false, None);
        for timeout_ms in [30_000u64, 0] {
            for &t in &args.threads {
                let peers: Vec<Runner<'_>> = vec![
                    (
                        "epkv",
                        Box::new(|| run(&with, t, d, Mode::Majority, timeout_ms)),
                    ),
                    (
                        "no-timeouts",
                        Box::new(|| run(&without, t, d, Mode::Majority, timeout_ms)),
                    ),
                    (
                        "plain-set",
                        Box::new(|| run(&without, t, d, Mode::Plain, timeout_ms)),
                    ),
                ];
                let params = [("timeout_ms", timeout_ms), ("threads", t as u64)];
                compare(&mut report, &args, "SyncWriteOneVBucket", &params, &peers);
            }
        }
        with.shutdown();
        without.shutdown();
    }
    if args.wants("SyncWriteTracked") {
        let base = std::path::Path::new("/dev/shm");
        let tmp = || {
            let made = if base.is_dir() {
                tempfile::Builder::new()
                    .prefix("epkv-durability-")
                    .tempdir_in(base)
            } else {
                tempfile::Builder::new()
                    .prefix("epkv-durability-")
                    .tempdir()
            };
            made.unwrap_or_else(|e| {
                eprintln!("cannot make a data directory: {e}");
                std::process::exit(2);
            })
        };
        let (dir_with, dir_without) = (tmp(), tmp());
        let with = bucket(true, Some(dir_with.path()));
        let without = bucket(false, Some(dir_without.path()));
        for timeout_ms in [30_000u64, 0] {
            for &t in &args.threads {
                let peers: Vec<Runner<'_>> = vec![
                    (
                        "epkv",
                        Box::new(|| run(&with, t, d, Mode::Persist, timeout_ms)),
                    ),
                    (
                        "no-timeouts",
                        Box::new(|| run(&without, t, d, Mode::Persist, timeout_ms)),
                    ),
                ];
                let params = [("timeout_ms", timeout_ms), ("threads", t as u64)];
                compare(&mut report, &args, "SyncWriteTracked", &params, &peers);
            }
        }
        with.shutdown();
        without.shutdown();
    }
    report.note(
        "Goal (issue 23): epkv >= 0.95x no-timeouts. Shared 2-core machine: absolute \
         numbers are noisy; the ratios (peers interleaved round by round, medians) are the \
         result.",
    );
    if let Err(e) = report.finish("epkv") {
        eprintln!("cannot write the results: {e}");
        std::process::exit(2);
    }
}
