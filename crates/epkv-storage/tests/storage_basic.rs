//! Behaviour every backend shares, plus restarts of the files backend.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions panic on failure"
)]

use epkv_storage::{
    Document, FileStore, FileStoreConfig, JournalMode, KvStore, LogStore, LogStoreConfig, MemStore,
    PurgeRule, ScanControl, VbCommit, VbState,
};
use epkv_types::{VBucketState, Vbid};

fn doc(key: &str, seqno: u64, value: &str) -> Document {
    Document {
        key: key.as_bytes().to_vec(),
        value: (value.as_bytes().to_vec()).into(),
        seqno,
        cas: 1000 + seqno,
        rev_seqno: seqno,
        flags: 0x0102_0304,
        expiry: 0,
        datatype: 1,
        deleted: false,
    }
}

fn tomb(key: &str, seqno: u64) -> Document {
    Document {
        deleted: true,
        value: (Vec::new()).into(),
        ..doc(key, seqno, "")
    }
}

fn commit(s: &dyn KvStore, vb: u16, docs: Vec<Document>) {
    s.commit(&[VbCommit {
        vbid: Vbid(vb),
        docs: docs.into(),
        keys_unique: false,
        state: VbState::new(VBucketState::Active),
    }])
    .unwrap();
}

fn must_scan(s: &dyn KvStore, vb: u16, start: u64, end: u64) -> Vec<(String, u64, bool)> {
    let mut v = Vec::new();
    s.scan_by_seqno(Vbid(vb), start, end, &mut |d| {
        v.push((String::from_utf8(d.key).unwrap(), d.seqno, d.deleted));
        ScanControl::Continue
    })
    .unwrap();
    v
}

fn must_keys(s: &dyn KvStore, vb: u16) -> Vec<(String, u64)> {
    let mut v = Vec::new();
    s.scan_keys(Vbid(vb), &mut |m| {
        v.push((String::from_utf8(m.key).unwrap(), m.seqno));
        ScanControl::Continue
    })
    .unwrap();
    v
}

/// The conformance suite run against every backend.
fn conformance(s: &dyn KvStore) {
    commit(
        s,
        1,
        vec![doc("a", 1, "x"), doc("b", 2, "y"), doc("a", 3, "z")],
    );
    let a = s.get(Vbid(1), b"a").unwrap().unwrap();
    assert_eq!((a.value.as_ref(), a.seqno, a.cas), (&b"z"[..], 3, 1003));
    assert_eq!(a.flags, 0x0102_0304);
    assert!(s.get(Vbid(1), b"zz").unwrap().is_none());
    assert!(s.get(Vbid(2), b"a").unwrap().is_none());
    commit(s, 1, vec![tomb("b", 4), doc("c", 5, "w")]);
    assert!(s.get(Vbid(1), b"b").unwrap().unwrap().deleted);
    let meta = |k: &[u8]| {
        s.key_meta(Vbid(1), k)
            .unwrap()
            .map(|m| (m.seqno, m.deleted))
    };
    assert_eq!(meta(b"a"), Some((3, false)));
    assert_eq!(meta(b"b"), Some((4, true)));
    assert_eq!(meta(b"zz"), None);
    assert!(s.key_meta(Vbid(9), b"a").unwrap().is_none());
    assert_eq!(
        must_scan(s, 1, 0, u64::MAX),
        [
            ("a".into(), 3, false),
            ("b".into(), 4, true),
            ("c".into(), 5, false)
        ]
    );
    assert_eq!(must_scan(s, 1, 4, 4), [("b".into(), 4, true)]);
    assert_eq!(
        must_keys(s, 1),
        [("a".into(), 3), ("b".into(), 4), ("c".into(), 5)]
    );
    let st = s.vbucket_state(Vbid(1)).unwrap().unwrap();
    assert_eq!(
        (st.high_seqno, st.persisted_seqno, st.max_cas),
        (5, 5, 1005)
    );
    // Stop early.
    let mut n = 0;
    s.scan_by_seqno(Vbid(1), 0, u64::MAX, &mut |_| {
        n += 1;
        ScanControl::Stop
    })
    .unwrap();
    assert_eq!(n, 1);
    // State-only commit.
    let mut st2 = VbState::new(VBucketState::Replica);
    st2.high_seqno = 5;
    st2.failover_log
        .push(epkv_storage::FailoverEntry { uuid: 42, seqno: 0 });
    s.set_vbucket_state(Vbid(1), &st2).unwrap();
    let got = s.vbucket_state(Vbid(1)).unwrap().unwrap();
    assert_eq!(
        (got.state, got.failover_log.len()),
        (VBucketState::Replica, 1)
    );
    // Compaction: purge tombstones below 10 and items expired at t=100.
    let mut e = doc("exp", 6, "old");
    e.expiry = 50;
    commit(s, 1, vec![e, doc("keep", 7, "k")]);
    let out = s
        .compact(
            Vbid(1),
            &PurgeRule {
                purge_before_seqno: 10,
                now_secs: Some(100),
                ..PurgeRule::default()
            },
        )
        .unwrap();
    assert_eq!((out.tombstones_purged, out.expired, out.kept), (1, 1, 3));
    assert_eq!(
        must_scan(s, 1, 0, u64::MAX),
        [
            ("a".into(), 3, false),
            ("c".into(), 5, false),
            ("keep".into(), 7, false)
        ]
    );
    assert_eq!(s.vbucket_state(Vbid(1)).unwrap().unwrap().purge_seqno, 4);
    // Writes continue after compaction, and do not lower the purge seqno (the commit's
    // state says 0, as the engine's do).
    commit(s, 1, vec![doc("a", 8, "after")]);
    assert_eq!(
        s.get(Vbid(1), b"a").unwrap().unwrap().value.as_ref(),
        b"after"
    );
    assert_eq!(s.vbucket_state(Vbid(1)).unwrap().unwrap().purge_seqno, 4);
    assert_eq!(s.vbuckets(), [Vbid(1)]);
    s.delete_vbucket(Vbid(1)).unwrap();
    assert!(s.vbuckets().is_empty());
    assert!(s.get(Vbid(1), b"a").unwrap().is_none());
    commit(s, 2, vec![doc("x", 1, "x")]);
    commit(s, 3, vec![doc("y", 1, "y")]);
    commit(s, 4, vec![doc("z", 1, "z")]);
    s.delete_vbuckets(&[Vbid(2), Vbid(3), Vbid(99)]).unwrap();
    assert_eq!(s.vbuckets(), [Vbid(4)]);
    assert!(s.get(Vbid(2), b"x").unwrap().is_none());
    assert_eq!(s.get(Vbid(4), b"z").unwrap().unwrap().value.as_ref(), b"z");
}

#[test]
fn memory_backend_conforms() {
    conformance(&MemStore::new());
}

#[test]
fn files_backend_conforms_with_and_without_journal() {
    for mode in [JournalMode::On, JournalMode::Off] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = FileStoreConfig::new(dir.path());
        cfg.journal = mode;
        let s = FileStore::open(cfg).unwrap();
        conformance(&s);
        assert_eq!(s.verify().unwrap(), 1, "vb 4 keeps its one document");
    }
}

#[test]
fn log_backend_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(LogStoreConfig::new(dir.path())).unwrap();
    conformance(&s);
    s.close().unwrap();
    // And reads the same after a reopen.
    let s = LogStore::open(LogStoreConfig::new(dir.path())).unwrap();
    assert_eq!(s.vbuckets(), [Vbid(4)]);
    assert_eq!(s.get(Vbid(4), b"z").unwrap().unwrap().value.as_ref(), b"z");
    assert!(
        s.get(Vbid(1), b"a").unwrap().is_none(),
        "deleted stays deleted"
    );
}

#[test]
fn files_backend_reopens_to_the_same_state() {
    for mode in [JournalMode::On, JournalMode::Off] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = FileStoreConfig::new(dir.path());
        cfg.journal = mode;
        let s = FileStore::open(cfg.clone()).unwrap();
        for i in 0..50u64 {
            commit(
                &s,
                (i % 5) as u16,
                vec![
                    doc(&format!("k{i}"), i + 1, "v"),
                    doc("same", i + 1000, &i.to_string()),
                ],
            );
        }
        // Drop without close: with the journal on, the data files were never synced and
        // the journal replays them.
        drop(s);
        let s = FileStore::open(cfg.clone()).unwrap();
        assert_eq!(s.vbuckets().len(), 5);
        for i in 0..50u64 {
            let d = s
                .get(Vbid((i % 5) as u16), format!("k{i}").as_bytes())
                .unwrap()
                .unwrap();
            assert_eq!(d.seqno, i + 1);
        }
        assert_eq!(
            s.get(Vbid(4), b"same").unwrap().unwrap().value.as_ref(),
            b"49"
        );
        assert_eq!(s.verify().unwrap(), 55);
        s.close().unwrap();
    }
}

#[test]
fn many_commits_merge_segments_and_scans_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    let s = FileStore::open(FileStoreConfig::new(dir.path())).unwrap();
    let mut model = std::collections::BTreeMap::new();
    let mut seqno = 0;
    for round in 0..200u64 {
        let mut docs = Vec::new();
        for j in 0..(1 + round % 7) {
            seqno += 1;
            let key = format!("key{:03}", (round * 13 + j * 7) % 300);
            docs.push(doc(&key, seqno, &format!("{round}")));
            model.insert(key, seqno);
        }
        commit(&s, 9, docs);
    }
    let keys = must_keys(&s, 9);
    let want: Vec<(String, u64)> = model.iter().map(|(k, v)| (k.clone(), *v)).collect();
    assert_eq!(keys, want);
    let mut by_seq: Vec<(String, u64, bool)> =
        model.iter().map(|(k, v)| (k.clone(), *v, false)).collect();
    by_seq.sort_by_key(|x| x.1);
    assert_eq!(must_scan(&s, 9, 0, u64::MAX), by_seq);
    let mid = by_seq[by_seq.len() / 2].1;
    let tail: Vec<_> = by_seq.iter().filter(|x| x.1 >= mid).cloned().collect();
    assert_eq!(must_scan(&s, 9, mid, u64::MAX), tail);
}

/// Ten journaled commits of one vBucket, the key `same` rewritten in each; `apply_each`
/// applies after every commit, otherwise all ten wait. Returns the bytes the applier wrote.
fn ten_commits_then_apply(dir: &std::path::Path, apply_each: bool, apply_after: u64) -> u64 {
    let mut cfg = FileStoreConfig::new(dir);
    cfg.apply_after_bytes = apply_after;
    let s = FileStore::open(cfg.clone()).unwrap();
    let mut applied = 0;
    let mut apply = |s: &FileStore| {
        let before = s.stats().bytes_written;
        assert_eq!(s.apply_pending(usize::MAX).unwrap(), 0);
        applied += s.stats().bytes_written - before;
    };
    for i in 0..10u64 {
        commit(
            &s,
            3,
            vec![
                doc(&format!("k{i}"), 2 * i + 1, "v"),
                doc("same", 2 * i + 2, &i.to_string()),
            ],
        );
        if apply_each {
            apply(&s);
        }
    }
    apply(&s);
    // Unclean stop: recovery = the data file's last header + the journal.
    drop(s);
    let s = FileStore::open(cfg).unwrap();
    assert_eq!(
        s.get(Vbid(3), b"same").unwrap().unwrap().value.as_ref(),
        b"9"
    );
    assert_eq!(s.vbucket_state(Vbid(3)).unwrap().unwrap().high_seqno, 20);
    let mut want: Vec<(String, u64, bool)> = (0..10u64)
        .map(|i| (format!("k{i}"), 2 * i + 1, false))
        .collect();
    want.push(("same".to_owned(), 20, false));
    want.sort_by_key(|x| x.1);
    assert_eq!(must_scan(&s, 3, 0, u64::MAX), want);
    assert_eq!(s.verify().unwrap(), 11);
    applied
}

#[test]
fn pending_commits_of_a_vbucket_reach_its_data_file_as_one_write() {
    let each = ten_commits_then_apply(tempfile::tempdir().unwrap().path(), true, 0);
    let merged = ten_commits_then_apply(tempfile::tempdir().unwrap().path(), false, 0);
    // One header, one index segment and one copy of `same` instead of ten.
    assert!(
        merged * 2 < each,
        "merged {merged} bytes, one by one {each}"
    );
    // Below the threshold apply_pending writes nothing; reads and recovery still see all.
    let deferred = ten_commits_then_apply(tempfile::tempdir().unwrap().path(), true, 1 << 20);
    assert_eq!(deferred, 0);
}

#[test]
fn journal_makes_a_multi_vbucket_batch_durable_with_one_sync() {
    let dir = tempfile::tempdir().unwrap();
    let s = FileStore::open(FileStoreConfig::new(dir.path())).unwrap();
    let batch: Vec<VbCommit> = (0..64u16)
        .map(|vb| VbCommit {
            vbid: Vbid(vb),
            docs: vec![doc("k", 1, "v")].into(),
            keys_unique: false,
            state: VbState::new(VBucketState::Active),
        })
        .collect();
    let before = s.stats().syncs;
    s.commit(&batch).unwrap();
    assert_eq!(s.stats().syncs - before, 1);
    assert!(s.stats().journal_bytes > 0);
    s.checkpoint().unwrap();
    assert_eq!(s.stats().journal_bytes, 29);

    let dir2 = tempfile::tempdir().unwrap();
    let mut cfg = FileStoreConfig::new(dir2.path());
    cfg.journal = JournalMode::Off;
    let s2 = FileStore::open(cfg).unwrap();
    let before = s2.stats().syncs;
    s2.commit(&batch).unwrap();
    assert!(s2.stats().syncs - before >= 64);
}

#[test]
fn zero_budget_reopens_files_and_still_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = FileStoreConfig::new(dir.path());
    cfg.fd_budget = 0;
    cfg.journal = JournalMode::Off;
    let s = FileStore::open(cfg).unwrap();
    for vb in 0..10u16 {
        commit(&s, vb, vec![doc("k", 1, "v")]);
    }
    assert_eq!(s.stats().open_files, 0);
    assert!(s.stats().file_opens >= 10);
    assert_eq!(s.get(Vbid(3), b"k").unwrap().unwrap().value.as_ref(), b"v");
}

/// Checkpoints start a new journal generation instead of truncating: records of older
/// generations stay in the (reused, possibly preallocated) file and must never be
/// replayed, or a deleted vBucket would come back.
#[test]
fn older_journal_generations_are_never_replayed() {
    for prealloc in [0, 256 * 1024] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = FileStoreConfig::new(dir.path());
        cfg.journal_prealloc_bytes = prealloc;
        let s = FileStore::open(cfg.clone()).unwrap();
        commit(&s, 1, vec![doc("a", 1, "x"), doc("b", 2, "y")]);
        commit(&s, 2, vec![doc("c", 1, "z")]);
        s.delete_vbucket(Vbid(1)).unwrap();
        // The old generation's records now start right after the superblock.
        drop(s);
        let s = FileStore::open(cfg.clone()).unwrap();
        assert_eq!(s.vbuckets(), [Vbid(2)], "prealloc {prealloc}");
        assert!(s.get(Vbid(1), b"a").unwrap().is_none());
        commit(&s, 2, vec![doc("d", 2, "w")]);
        let journal_len = std::fs::metadata(dir.path().join("journal.log"))
            .unwrap()
            .len();
        assert!(journal_len >= prealloc);
        drop(s);
        let s = FileStore::open(cfg).unwrap();
        assert_eq!(s.vbuckets(), [Vbid(2)], "prealloc {prealloc}");
        assert!(s.get(Vbid(1), b"a").unwrap().is_none());
        assert_eq!(s.get(Vbid(2), b"d").unwrap().unwrap().value.as_ref(), b"w");
        assert_eq!(s.recovery_report().journal_torn_bytes, 0);
    }
}

/// Commits made while a compaction copies the vBucket (the `between` hook runs with no
/// lock held) are neither blocked nor lost: they are caught up into the new revision.
#[test]
fn commits_during_a_compaction_are_caught_up_into_the_new_file() {
    use std::collections::BTreeMap;
    for mode in [JournalMode::On, JournalMode::Off] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = FileStoreConfig::new(dir.path());
        cfg.journal = mode;
        let s = FileStore::open(cfg.clone()).unwrap();
        // key -> (seqno, deleted, value)
        let mut model: BTreeMap<String, (u64, bool, String)> = BTreeMap::new();
        let mut seqno = 0;
        let mut put = |model: &mut BTreeMap<String, (u64, bool, String)>,
                       docs: &mut Vec<Document>,
                       key: String,
                       deleted: bool| {
            seqno += 1;
            let value = if deleted {
                String::new()
            } else {
                format!("v{seqno}")
            };
            docs.push(if deleted {
                tomb(&key, seqno)
            } else {
                doc(&key, seqno, &value)
            });
            model.insert(key, (seqno, deleted, value));
        };
        for round in 0..4 {
            let mut docs = Vec::new();
            for i in 0..50 {
                put(&mut model, &mut docs, format!("k{}", round * 50 + i), false);
            }
            commit(&s, 3, docs);
        }
        let mut docs = Vec::new();
        for i in 0..10 {
            put(&mut model, &mut docs, format!("k{i}"), true);
        }
        commit(&s, 3, docs);
        let high_before = s.vbucket_state(Vbid(3)).unwrap().unwrap().high_seqno;

        let s = std::sync::Arc::new(s);
        let mut during: Vec<Document> = Vec::new();
        for batch in 0..3u64 {
            let mut docs = Vec::new();
            put(&mut model, &mut docs, format!("k{}", 20 + batch), false);
            put(&mut model, &mut docs, format!("k{}", 30 + batch), true);
            put(&mut model, &mut docs, format!("k{batch}"), false);
            put(&mut model, &mut docs, format!("new{batch}"), false);
            during.extend(docs);
        }
        let interleaved = during.len() as u64;
        let mut during = Some(during);
        let out = s
            .compact_with(
                Vbid(3),
                &PurgeRule {
                    purge_before_seqno: high_before,
                    now_secs: None,
                    ..PurgeRule::default()
                },
                &mut || {
                    // Overwrites, deletes of copied keys, a re-created purged key, new
                    // keys: three commits from another thread, one of them applied to the
                    // old file. A compaction holding the vBucket's lock here would block
                    // them: fail (the panic releases it) instead of hanging.
                    let docs = during.take().unwrap();
                    let (tx, rx) = std::sync::mpsc::channel();
                    let s2 = std::sync::Arc::clone(&s);
                    std::thread::spawn(move || {
                        for (i, chunk) in docs.chunks(4).enumerate() {
                            commit(&*s2, 3, chunk.to_vec());
                            if i == 0 {
                                s2.apply_pending(usize::MAX).unwrap();
                            }
                        }
                        tx.send(()).unwrap();
                    });
                    rx.recv_timeout(std::time::Duration::from_secs(60))
                        .expect("commits ran while the compaction copied");
                },
            )
            .unwrap();
        assert_eq!(
            out.tombstones_purged, 9,
            "{mode:?}: the tombstone at the high seqno stays"
        );
        assert_eq!(out.caught_up, interleaved, "{mode:?}");
        assert!(dir.path().join("vb_3.1.data").exists());
        assert!(!dir.path().join("vb_3.0.data").exists());

        let check = |s: &FileStore, model: &BTreeMap<String, (u64, bool, String)>| {
            for (key, (seq, deleted, value)) in model {
                let got = s.get(Vbid(3), key.as_bytes()).unwrap();
                match got {
                    Some(d) => {
                        assert_eq!(d.seqno, *seq, "{mode:?} {key}");
                        assert_eq!(d.deleted, *deleted, "{mode:?} {key}");
                        assert_eq!(d.value, value.as_bytes(), "{mode:?} {key}");
                    }
                    None => assert!(*deleted && *seq <= high_before, "{mode:?} {key} lost"),
                }
            }
            let live: Vec<String> = must_scan(s, 3, 0, u64::MAX)
                .into_iter()
                .filter(|(_, _, d)| !d)
                .map(|(k, _, _)| k)
                .collect();
            let want: Vec<String> = model
                .iter()
                .filter(|(_, (_, d, _))| !d)
                .map(|(k, _)| k.clone())
                .collect();
            let mut live_sorted = live.clone();
            live_sorted.sort();
            assert_eq!(live_sorted, want, "{mode:?}");
            assert_eq!(
                s.vbucket_state(Vbid(3)).unwrap().unwrap().high_seqno,
                model.values().map(|v| v.0).max().unwrap(),
                "{mode:?}"
            );
            s.verify().unwrap();
            // The live-byte accounting of the new file (built by the copy, then kept by
            // the catch-up and later commits) equals a recount from its index.
            let tracked = s.file_usage().into_iter().find(|(v, _)| *v == Vbid(3));
            assert_eq!(
                tracked.map(|(_, u)| u),
                s.recount_usage(Vbid(3)).unwrap(),
                "{mode:?}"
            );
        };
        check(&s, &model);
        // Writes continue on the new file, and everything survives a reopen.
        let mut docs = Vec::new();
        put(&mut model, &mut docs, "after".into(), false);
        commit(&*s, 3, docs);
        check(&s, &model);
        std::sync::Arc::into_inner(s).unwrap().close().unwrap();
        let s = FileStore::open(cfg).unwrap();
        check(&s, &model);
    }
}

#[test]
fn overwrites_raise_fragmentation_and_compaction_reclaims_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = FileStore::open(FileStoreConfig::new(dir.path())).unwrap();
    let value = "v".repeat(500);
    let mut seq = 0;
    for _round in 0..10 {
        let docs = (0..50)
            .map(|k| {
                seq += 1;
                doc(&format!("key-{k}"), seq, &value)
            })
            .collect();
        commit(&s, 5, docs);
        s.apply_pending(usize::MAX).unwrap();
    }
    let before = s.file_usage()[0].1;
    assert_eq!(Some(before), s.recount_usage(Vbid(5)).unwrap());
    // Ten versions of each key: about 90% of the file is garbage.
    assert!(before.fragmentation_percent() > 80.0, "{before:?}");
    let out = s.compact(Vbid(5), &PurgeRule::default()).unwrap();
    let after = s.file_usage()[0].1;
    assert_eq!(after.garbage_bytes(), 0, "{after:?}");
    assert_eq!(after.file_bytes, out.bytes_after);
    assert_eq!(
        s.stats().bytes_reclaimed,
        before.file_bytes - after.file_bytes
    );
    assert_eq!(s.stats().live_bytes, after.live_bytes);
    // The accounting is rebuilt at open.
    s.close().unwrap();
    let s = FileStore::open(FileStoreConfig::new(dir.path())).unwrap();
    assert_eq!(s.file_usage()[0].1, after);
}

/// Rewrites the superblock of every data file and journal in `dir` as format 1, as a build
/// from before collections wrote them.
fn make_format_1(dir: &std::path::Path) {
    use epkv_storage::format::{self, RecordKind, SUPERBLOCK_LEN};
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        if bytes.len() < SUPERBLOCK_LEN {
            continue;
        }
        for kind in [RecordKind::DataSuperblock, RecordKind::JournalSuperblock] {
            let Ok(body) = format::decode_frame_of(&bytes[..SUPERBLOCK_LEN], kind) else {
                continue;
            };
            let (id, rev, _) = format::decode_superblock(body, kind).unwrap();
            let mut sb = Vec::new();
            format::put_superblock_version(&mut sb, kind, id, rev, 1);
            bytes[..SUPERBLOCK_LEN].copy_from_slice(&sb);
            std::fs::write(&path, &bytes).unwrap();
        }
    }
}

#[test]
fn format_1_files_are_upgraded_once_with_zero_byte_keys_escaped() {
    for mode in [JournalMode::On, JournalMode::Off] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = FileStoreConfig::new(dir.path());
        cfg.journal = mode;
        {
            let s = FileStore::open(cfg.clone()).unwrap();
            // A build from before collections stored keys as clients sent them.
            commit(&s, 3, vec![doc("plain", 1, "a"), doc("\0legacy", 2, "b")]);
            s.close().unwrap();
        }
        // ...and, with the journal on, one more commit left in the journal only.
        if mode == JournalMode::On {
            let s = FileStore::open(cfg.clone()).unwrap();
            commit(&s, 4, vec![doc("\0journal", 1, "c")]);
            drop(s); // no checkpoint: vb 4 lives in the journal
        }
        make_format_1(dir.path());
        for round in 0..2 {
            let s = FileStore::open(cfg.clone()).unwrap();
            let get = |vb: u16, k: &[u8]| s.get(Vbid(vb), k).unwrap().map(|d| d.value);
            assert_eq!(
                get(3, b"plain"),
                Some(bytes::Bytes::from_static(b"a")),
                "{mode:?} {round}"
            );
            assert_eq!(
                get(3, b"\0\0\0legacy"),
                Some(bytes::Bytes::from_static(b"b")),
                "{mode:?} {round}"
            );
            assert_eq!(get(3, b"\0legacy"), None, "{mode:?} {round}");
            if mode == JournalMode::On {
                assert_eq!(
                    get(4, b"\0\0\0journal"),
                    Some(bytes::Bytes::from_static(b"c")),
                    "{mode:?} {round}"
                );
            }
            s.close().unwrap();
        }
    }
}

#[test]
fn compactions_of_one_shard_run_at_once_and_of_one_vbucket_one_at_a_time() {
    // Four threads compact two vBuckets of one store (two per vBucket, so each vBucket's
    // second compaction waits for its first) while commits go on; nothing is lost and every
    // file ends compacted and readable.
    let dir = tempfile::tempdir().unwrap();
    let s = FileStore::open(FileStoreConfig::new(dir.path())).unwrap();
    let value = "v".repeat(200);
    let mut seq = [0u64; 2];
    let round = |s: &FileStore, seq: &mut [u64; 2], tag: &str| {
        for (i, vb) in [3u16, 7].into_iter().enumerate() {
            let docs = (0..40)
                .map(|k| {
                    seq[i] += 1;
                    doc(&format!("{tag}-{k}"), seq[i], &value)
                })
                .collect();
            commit(s, vb, docs);
        }
        s.apply_pending(usize::MAX).unwrap();
    };
    for r in 0..5 {
        round(&s, &mut seq, &format!("old{r}"));
    }
    std::thread::scope(|sc| {
        for vb in [3u16, 7, 3, 7] {
            let s = &s;
            sc.spawn(move || {
                s.compact(Vbid(vb), &PurgeRule::default()).unwrap();
            });
        }
        for r in 0..5 {
            round(&s, &mut seq, &format!("new{r}"));
        }
    });
    assert_eq!(s.stats().compactions, 4);
    for vb in [3u16, 7] {
        for r in 0..5 {
            for k in [0, 39] {
                for tag in ["old", "new"] {
                    let key = format!("{tag}{r}-{k}");
                    let d = s.get(Vbid(vb), key.as_bytes()).unwrap();
                    assert_eq!(d.map(|d| d.value.len()), Some(200), "vb {vb} {key}");
                }
            }
        }
    }
    s.close().unwrap();
    let s = FileStore::open(FileStoreConfig::new(dir.path())).unwrap();
    assert!(s.verify().unwrap() > 0);
    assert!(s.get(Vbid(7), b"new4-39").unwrap().is_some());
}
