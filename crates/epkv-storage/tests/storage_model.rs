//! Model-based test: random batches, compactions, checkpoints, injected failures and
//! restarts (clean, and simulated power loss through [`FaultFs`], with and without torn
//! tails), checked against an in-memory model. Property: after every restart, every
//! acknowledged document comes back with its value, seqno, CAS, flags, expiry and deleted
//! flag; scans by seqno and by key return exactly the model; the vBucket state's persisted
//! seqno is the model's.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions panic on failure"
)]

use epkv_storage::{
    Document, FaultFs, FaultOp, FileStore, FileStoreConfig, FileUsage, JournalMode, KvStore,
    LogStore, LogStoreConfig, PurgeRule, ScanControl, VbCommit, VbState,
};
use epkv_types::{VBucketState, Vbid};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

const VBS: u16 = 4;

#[derive(Debug, Clone)]
enum Op {
    /// (vb, key, deleted, value length, expiry) per document.
    Commit(Vec<(u16, u8, bool, u8, u32)>),
    /// Fail the nth call of an operation during the next commit (the commit is retried).
    FailingCommit(FaultOp, u64, Vec<(u16, u8, bool, u8, u32)>),
    Compact(u16, u64, Option<u32>),
    /// Background apply of journaled commits to data files, possibly with a failure.
    ApplyPending(usize, Option<(FaultOp, u64)>),
    Checkpoint,
    CleanRestart,
    Crash(bool),
}

fn docs_strategy() -> impl Strategy<Value = Vec<(u16, u8, bool, u8, u32)>> {
    prop::collection::vec(
        (
            0..VBS,
            0u8..24,
            prop::bool::weighted(0.2),
            any::<u8>(),
            prop_oneof![Just(0u32), 1u32..200],
        ),
        1..12,
    )
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let fault = prop_oneof![
        Just(FaultOp::Write),
        Just(FaultOp::Sync),
        Just(FaultOp::Open)
    ];
    prop_oneof![
        6 => docs_strategy().prop_map(Op::Commit),
        2 => (fault, 1u64..4, docs_strategy()).prop_map(|(f, n, d)| Op::FailingCommit(f, n, d)),
        1 => (0..VBS, 0u64..80, prop_oneof![Just(None), (0u32..200).prop_map(Some)])
            .prop_map(|(v, p, n)| Op::Compact(v, p, n)),
        2 => (1usize..4, prop::option::of((prop_oneof![Just(FaultOp::Write), Just(FaultOp::Open)], 1u64..3)))
            .prop_map(|(n, f)| Op::ApplyPending(n, f)),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::CleanRestart),
        2 => any::<bool>().prop_map(Op::Crash),
    ]
}

#[derive(Debug, Default)]
struct Model {
    docs: BTreeMap<u16, BTreeMap<Vec<u8>, Document>>,
    high: BTreeMap<u16, u64>,
    cas: u64,
}

impl Model {
    fn batch(
        &mut self,
        spec: &[(u16, u8, bool, u8, u32)],
    ) -> (Vec<VbCommit>, Vec<(u16, Document)>) {
        let mut per_vb: BTreeMap<u16, Vec<Document>> = BTreeMap::new();
        let mut all = Vec::new();
        for &(vb, key, deleted, vlen, expiry) in spec {
            let seqno = {
                let h = self.high.entry(vb).or_insert(0);
                *h += 1;
                *h
            };
            self.cas += 1;
            let d = Document {
                key: format!("key-{key}").into_bytes(),
                value: if deleted {
                    Vec::new().into()
                } else {
                    vec![key ^ vlen; vlen as usize].into()
                },
                seqno,
                cas: self.cas,
                rev_seqno: seqno,
                flags: u32::from(vlen) << 8,
                expiry,
                datatype: vlen % 2,
                deleted,
            };
            per_vb.entry(vb).or_default().push(d.clone());
            all.push((vb, d));
        }
        let commits = per_vb
            .into_iter()
            .map(|(vb, docs)| VbCommit {
                vbid: Vbid(vb),
                docs: docs.into(),
                keys_unique: false,
                state: VbState {
                    high_seqno: self.high[&vb],
                    ..VbState::new(VBucketState::Active)
                },
            })
            .collect();
        (commits, all)
    }

    fn ack(&mut self, docs: Vec<(u16, Document)>) {
        for (vb, d) in docs {
            self.docs.entry(vb).or_default().insert(d.key.clone(), d);
        }
    }

    fn compact(&mut self, vb: u16, rule: &PurgeRule) {
        let high = self.high.get(&vb).copied().unwrap_or(0);
        if let Some(m) = self.docs.get_mut(&vb) {
            m.retain(|_, d| {
                let purged = d.deleted && d.seqno <= rule.purge_before_seqno && d.seqno != high;
                let expired = !d.deleted
                    && d.expiry != 0
                    && rule.now_secs.is_some_and(|n| d.expiry <= n)
                    && d.seqno != high;
                !(purged || expired)
            });
        }
    }
}

/// The live-byte accounting maintained on every append and compaction equals a recount
/// from the file's index, and a file is never reported with more live bytes than it has.
fn check_usage(s: &FileStore) {
    let tracked: BTreeMap<u16, FileUsage> =
        s.file_usage().into_iter().map(|(v, u)| (v.0, u)).collect();
    for vb in 0..VBS {
        let recount = s.recount_usage(Vbid(vb)).unwrap();
        assert_eq!(tracked.get(&vb).copied(), recount, "vb {vb} usage");
        if let Some(u) = recount {
            assert!(u.live_bytes <= u.file_bytes, "vb {vb} usage {u:?}");
        }
    }
    let st = s.stats();
    assert_eq!(
        st.data_file_bytes,
        tracked.values().map(|u| u.file_bytes).sum::<u64>()
    );
    assert_eq!(
        st.live_bytes,
        tracked.values().map(|u| u.live_bytes).sum::<u64>()
    );
}

fn check(s: &FileStore, m: &Model) {
    check_usage(s);
    check_docs(s, m);
}

/// Scans by seqno and by key, and every get, return exactly the model; each vBucket's
/// persisted seqno is the model's high seqno.
fn check_docs(s: &dyn KvStore, m: &Model) {
    for vb in 0..VBS {
        let want: Vec<&Document> = {
            let mut v: Vec<&Document> = m
                .docs
                .get(&vb)
                .map(|x| x.values().collect())
                .unwrap_or_default();
            v.sort_by_key(|d| d.seqno);
            v
        };
        let mut got = Vec::new();
        s.scan_by_seqno(Vbid(vb), 0, u64::MAX, &mut |d| {
            got.push(d);
            ScanControl::Continue
        })
        .unwrap();
        let got_refs: Vec<&Document> = got.iter().collect();
        assert_eq!(got_refs, want, "vb {vb} scan");
        for d in &want {
            assert_eq!(s.get(Vbid(vb), &d.key).unwrap().as_ref(), Some(*d));
        }
        let mut keys = Vec::new();
        s.scan_keys(Vbid(vb), &mut |k| {
            keys.push((k.key, k.seqno));
            ScanControl::Continue
        })
        .unwrap();
        let want_keys: Vec<(Vec<u8>, u64)> = m
            .docs
            .get(&vb)
            .map(|x| x.values().map(|d| (d.key.clone(), d.seqno)).collect())
            .unwrap_or_default();
        assert_eq!(keys, want_keys, "vb {vb} keys");
        let high = m.high.get(&vb).copied().unwrap_or(0);
        if high > 0 && m.docs.contains_key(&vb) {
            let st = s.vbucket_state(Vbid(vb)).unwrap().unwrap();
            assert_eq!(st.persisted_seqno, high, "vb {vb} persisted seqno");
        }
    }
}

/// Runs a commit op (a first attempt failed by an injected fault is retried) and records
/// what it acknowledged in the model.
fn commit_op(s: &dyn KvStore, fs: &FaultFs, m: &mut Model, op: &Op) {
    match op {
        Op::Commit(spec) => {
            let (b, docs) = m.batch(spec);
            s.commit(&b).unwrap();
            m.ack(docs);
        }
        Op::FailingCommit(f, n, spec) => {
            let (b, docs) = m.batch(spec);
            fs.fail_nth(*f, *n);
            let first = s.commit(&b);
            fs.clear();
            if first.is_err() {
                s.commit(&b).unwrap();
            }
            m.ack(docs);
        }
        _ => unreachable!("not a commit: {op:?}"),
    }
}

/// Simulates power loss: unsynced writes are lost, or (torn) kept in part.
fn crash(fs: &FaultFs, torn: bool) {
    let mut k = 0u64;
    fs.crash_with(|_, n| {
        k += 1;
        if torn { (n * (k % 3)) / 3 } else { 0 }
    })
    .unwrap();
}

fn run(ops: Vec<Op>, journal: JournalMode, fd_budget: usize) {
    run_with(ops, journal, fd_budget, 0);
}

fn run_with(ops: Vec<Op>, journal: JournalMode, fd_budget: usize, apply_after_bytes: u64) {
    let dir = tempfile::tempdir().unwrap();
    let fs = FaultFs::new();
    let mut cfg = FileStoreConfig::new(dir.path());
    cfg.journal = journal;
    cfg.fd_budget = fd_budget;
    // A small preallocated journal in one variant: records of older generations then sit
    // after the current ones and must be ignored.
    cfg.journal_prealloc_bytes = if fd_budget == 2 { 16 * 1024 } else { 0 };
    cfg.checkpoint_bytes = 4096;
    cfg.apply_after_bytes = apply_after_bytes;
    let reopen = |fs: &FaultFs| FileStore::open_with(cfg.clone(), Arc::new(fs.clone())).unwrap();
    let mut s = reopen(&fs);
    let mut m = Model::default();
    for op in ops {
        check_usage(&s);
        match op {
            Op::Commit(_) | Op::FailingCommit(..) => commit_op(&s, &fs, &mut m, &op),
            Op::Compact(vb, p, now) => {
                let rule = PurgeRule {
                    purge_before_seqno: p,
                    now_secs: now,
                    ..PurgeRule::default()
                };
                s.compact(Vbid(vb), &rule).unwrap();
                m.compact(vb, &rule);
                // A file just compacted, with nothing committed during the copy, is all
                // live: the accounting's idea of "live" is exactly what compaction keeps.
                if let Some(u) = s.recount_usage(Vbid(vb)).unwrap() {
                    assert_eq!(u.garbage_bytes(), 0, "vb {vb} after compaction: {u:?}");
                }
            }
            Op::ApplyPending(n, fault) => {
                if let Some((f, k)) = fault {
                    fs.fail_nth(f, k);
                }
                let r = s.apply_pending(n);
                fs.clear();
                if fault.is_none() {
                    r.unwrap();
                }
            }
            Op::Checkpoint => s.checkpoint().unwrap(),
            Op::CleanRestart => {
                s.close().unwrap();
                s = reopen(&fs);
                check(&s, &m);
            }
            Op::Crash(torn) => {
                crash(&fs, torn);
                drop(s);
                s = reopen(&fs);
                check(&s, &m);
                s.verify().unwrap();
            }
        }
    }
    check(&s, &m);
    fs.crash().unwrap();
    drop(s);
    let s = reopen(&fs);
    check(&s, &m);
}

/// The same operations against the write-once [`LogStore`], with files of `file_bytes` so
/// that batches roll over to new files and cleaning (run where the files backend applies
/// its journal, possibly failing) copies live records forward and deletes files.
fn run_log(ops: Vec<Op>, file_bytes: u64) {
    let dir = tempfile::tempdir().unwrap();
    let fs = FaultFs::new();
    let mut cfg = LogStoreConfig::new(dir.path());
    cfg.file_bytes = file_bytes;
    let reopen = |fs: &FaultFs| LogStore::open_with(cfg.clone(), Arc::new(fs.clone())).unwrap();
    let check_log = |s: &LogStore, m: &Model| {
        check_docs(s, m);
        let (bytes, live) = s.usage();
        assert!(live <= bytes, "live {live} of {bytes}");
    };
    let mut s = reopen(&fs);
    let mut m = Model::default();
    for op in ops {
        match op {
            Op::Commit(_) | Op::FailingCommit(..) => commit_op(&s, &fs, &mut m, &op),
            Op::Compact(vb, p, now) => {
                let rule = PurgeRule {
                    purge_before_seqno: p,
                    now_secs: now,
                    ..PurgeRule::default()
                };
                s.compact(Vbid(vb), &rule).unwrap();
                m.compact(vb, &rule);
            }
            Op::ApplyPending(n, fault) => {
                if let Some((f, k)) = fault {
                    fs.fail_nth(f, k);
                }
                let r = s.clean(10, 0, n, &mut |_| {});
                fs.clear();
                if fault.is_none() {
                    r.unwrap();
                }
                check_log(&s, &m);
            }
            Op::Checkpoint => s.checkpoint().unwrap(),
            Op::CleanRestart => {
                s.close().unwrap();
                s = reopen(&fs);
                check_log(&s, &m);
            }
            Op::Crash(torn) => {
                crash(&fs, torn);
                drop(s);
                s = reopen(&fs);
                check_log(&s, &m);
            }
        }
    }
    check_log(&s, &m);
    fs.crash().unwrap();
    drop(s);
    let s = reopen(&fs);
    check_log(&s, &m);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn acknowledged_writes_survive_restarts_with_journal(ops in prop::collection::vec(op_strategy(), 1..40)) {
        run(ops, JournalMode::On, 64);
    }

    #[test]
    fn acknowledged_writes_survive_restarts_without_journal(ops in prop::collection::vec(op_strategy(), 1..40)) {
        run(ops, JournalMode::Off, 64);
    }

    #[test]
    fn acknowledged_writes_survive_with_deferred_apply(ops in prop::collection::vec(op_strategy(), 1..40)) {
        // apply_pending leaves commits pending below 1 KiB of documents, so several
        // commits of a vBucket reach its data file as one.
        run_with(ops, JournalMode::On, 64, 1024);
    }

    #[test]
    fn acknowledged_writes_survive_with_a_tiny_fd_budget(ops in prop::collection::vec(op_strategy(), 1..30)) {
        run(ops, JournalMode::On, 2);
    }

    #[test]
    fn log_store_acknowledged_writes_survive_restarts_and_cleaning(ops in prop::collection::vec(op_strategy(), 1..40)) {
        run_log(ops, 2048);
    }

    #[test]
    fn log_store_with_large_files(ops in prop::collection::vec(op_strategy(), 1..30)) {
        run_log(ops, 1 << 20);
    }
}
