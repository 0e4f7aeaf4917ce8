//! A real crash test: a child process writes to a persistent bucket as fast as it can and
//! prints each write once the engine reports it persisted; the parent SIGKILLs it at a
//! random moment, reopens the data directory, and checks that every write reported
//! persisted is there with its value and that every data file verifies. Cycles continue
//! on the same directory, so recovery of earlier kills is checked too. CI runs 3 cycles;
//! `EPKV_CRASH_CYCLES=N` runs more.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions panic on failure"
)]
use epkv_engine::StorageBackend;
use epkv_engine::{Bucket, BucketConfig, EngineClock, FlusherMode, PersistenceConfig};
use epkv_engine_api::{Engine, Expiry, StoreOp, StoreRequest};
use epkv_storage::{FileStore, FileStoreConfig, LogStore, LogStoreConfig};
use epkv_types::{Cas, Datatype, NUM_VBUCKETS, vbucket_for_key};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const DIR_ENV: &str = "EPKV_CRASH_CHILD_DIR";
const CYCLE_ENV: &str = "EPKV_CRASH_CHILD_CYCLE";
const SHARDS: u16 = 2;
const STORAGE_ENV: &str = "EPKV_CRASH_CHILD_STORAGE";

fn open(dir: &Path, flusher: FlusherMode, storage: StorageBackend) -> Arc<Bucket> {
    let mut p = PersistenceConfig::new(dir);
    p.shards = SHARDS;
    p.flusher = flusher;
    p.storage = storage;
    let b = Bucket::new(
        BucketConfig {
            expiry_pager_interval: Duration::ZERO,
            persistence: Some(p),
            ..BucketConfig::default()
        },
        EngineClock::System,
    )
    .unwrap();
    assert!(b.wait_warmup(Duration::from_secs(60)), "warmup finishes");
    b
}

fn value_of(key: &str) -> String {
    format!("value-of-{key}-{}", "x".repeat(key.len() % 97))
}

/// The child: write until killed; print `P <key> <seqno>` once a write is persisted.
fn child(dir: &str, cycle: &str, storage: StorageBackend) {
    let b = open(Path::new(dir), FlusherMode::Tasks, storage);
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let printer = std::thread::spawn(move || {
        let out = std::io::stdout();
        let mut out = out.lock();
        for line in rx {
            if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
                return;
            }
        }
    });
    for n in 0..2_000_000u64 {
        let key = format!("c{cycle}-k{n}");
        let vbid = vbucket_for_key(key.as_bytes(), NUM_VBUCKETS);
        let value = value_of(&key);
        let info = b
            .store(StoreRequest {
                op: StoreOp::Set,
                vbid,
                key: key.as_bytes(),
                value: value.as_bytes(),
                flags: 7,
                expiry: Expiry::Never,
                preserve_ttl: false,
                datatype: Datatype::RAW,
                cas: Cas::ANY,
                durability: None,
            })
            .unwrap();
        let tx = tx.clone();
        let line = format!("P {key} {}", info.seqno.0);
        b.when_persisted(vbid, info.seqno.0, move |_| {
            let _ = tx.send(line);
        })
        .unwrap();
    }
    drop(tx);
    b.shutdown();
    printer.join().unwrap();
}

fn check(dir: &Path, persisted: &[(String, u64)], storage: StorageBackend) {
    let b = open(dir, FlusherMode::Manual, storage);
    for (key, seqno) in persisted {
        let vbid = vbucket_for_key(key.as_bytes(), NUM_VBUCKETS);
        let item = b
            .get(vbid, key.as_bytes())
            .unwrap_or_else(|e| panic!("{key} (seqno {seqno}) reported persisted but {e:?}"));
        assert_eq!(item.value.as_ref(), value_of(key).as_bytes(), "{key}");
        assert_eq!(item.flags, 7);
        assert!(b.high_seqno(vbid).unwrap() >= *seqno);
        assert!(b.persisted_seqno(vbid).unwrap() >= *seqno);
    }
    b.shutdown();
    drop(b);
    for i in 0..SHARDS {
        let shard = dir.join(format!("shard_{i}"));
        match storage {
            StorageBackend::Files => FileStore::open(FileStoreConfig::new(shard))
                .unwrap()
                .verify()
                .map(drop)
                .unwrap(),
            // Opening reads and verifies every record.
            StorageBackend::Log | StorageBackend::Auto => {
                drop(LogStore::open(LogStoreConfig::new(shard)).unwrap());
            }
        }
    }
}

#[test]
fn sigkill_never_loses_a_write_reported_persisted() {
    sigkill_cycles(
        "sigkill_never_loses_a_write_reported_persisted",
        StorageBackend::Log,
    );
}

#[test]
fn sigkill_never_loses_a_write_reported_persisted_files_backend() {
    sigkill_cycles(
        "sigkill_never_loses_a_write_reported_persisted_files_backend",
        StorageBackend::Files,
    );
}

/// Runs a child that writes until killed after a random number of persisted reports,
/// then checks every reported write is there; several cycles over the same directory.
fn sigkill_cycles(test_name: &str, storage: StorageBackend) {
    if let (Some(dir), Some(cycle)) = (std::env::var_os(DIR_ENV), std::env::var_os(CYCLE_ENV)) {
        let storage = std::env::var(STORAGE_ENV)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(storage);
        child(dir.to_str().unwrap(), cycle.to_str().unwrap(), storage);
        return;
    }
    let cycles: u64 = std::env::var("EPKV_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let dir = tempfile::tempdir().unwrap();
    let mut all: Vec<(String, u64)> = Vec::new();
    let mut rng = rand_seed();
    for cycle in 0..cycles {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test_name, "--test-threads=1", "--nocapture"])
            .env(DIR_ENV, dir.path())
            .env(STORAGE_ENV, storage.name())
            .env(CYCLE_ENV, cycle.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Kill after a random number of persisted reports: somewhere in the middle of a
        // flush, a journal append or a background data-file write.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let kill_after = 20 + rng % 2000;
        let stdout = child.stdout.take().unwrap();
        let mut seen = 0u64;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.strip_prefix("P ") {
                let (key, seqno) = rest.split_once(' ').unwrap();
                all.push((key.to_owned(), seqno.parse().unwrap()));
                seen += 1;
                if seen == kill_after {
                    child.kill().unwrap();
                }
            }
        }
        let _ = child.wait().unwrap();
        assert!(
            seen >= kill_after,
            "cycle {cycle}: the child stopped after {seen} reports"
        );
        check(dir.path(), &all, storage);
    }
}

fn rand_seed() -> u64 {
    let t = std::process::id() as u64;
    0x9E37_79B9_7F4A_7C15 ^ (t << 21) ^ t
}
