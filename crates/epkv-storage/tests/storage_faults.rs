//! Disk errors, descriptor exhaustion, torn tails and corruption, through [`FaultFs`].

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions panic on failure"
)]

use epkv_storage::{
    Document, Error, FaultFs, FaultOp, FileStore, FileStoreConfig, JournalMode, KvStore,
    ScanControl, VbCommit, VbState,
};
use epkv_types::{VBucketState, Vbid};
use std::path::Path;
use std::sync::Arc;

fn doc(key: &str, seqno: u64) -> Document {
    Document {
        key: key.as_bytes().to_vec(),
        value: (format!("value-{seqno}").into_bytes()).into(),
        seqno,
        cas: seqno * 3,
        rev_seqno: 1,
        flags: 5,
        expiry: 0,
        datatype: 0,
        deleted: false,
    }
}

fn batch(vbs: &[u16], key: &str, seqno: u64) -> Vec<VbCommit> {
    vbs.iter()
        .map(|&vb| VbCommit {
            vbid: Vbid(vb),
            docs: vec![doc(key, seqno)].into(),
            keys_unique: false,
            state: VbState::new(VBucketState::Active),
        })
        .collect()
}

fn open(dir: &Path, fs: &FaultFs, mode: JournalMode) -> FileStore {
    let mut cfg = FileStoreConfig::new(dir);
    cfg.journal = mode;
    FileStore::open_with(cfg, Arc::new(fs.clone())).unwrap()
}

fn must_value(s: &FileStore, vb: u16, key: &str) -> Option<u64> {
    s.get(Vbid(vb), key.as_bytes()).unwrap().map(|d| d.seqno)
}

/// A failed write or sync, at any point of a commit, returns an error, leaves every
/// vBucket readable at a committed state, and a retry of the same batch succeeds and
/// survives a crash.
#[test]
fn failed_write_or_sync_is_reported_and_retry_succeeds() {
    for mode in [JournalMode::On, JournalMode::Off] {
        for op in [FaultOp::Write, FaultOp::Sync] {
            for nth in 1..=4 {
                let dir = tempfile::tempdir().unwrap();
                let fs = FaultFs::new();
                let s = open(dir.path(), &fs, mode);
                s.commit(&batch(&[1, 2, 3], "k", 1)).unwrap();
                fs.fail_nth(op, nth);
                let first = s.commit(&batch(&[1, 2, 3], "k", 2));
                fs.clear();
                if nth == 1 {
                    assert!(
                        first.is_err(),
                        "{mode:?} {op:?}: the first {op:?} must fail"
                    );
                }
                if first.is_err() {
                    assert_eq!(s.stats().commit_failures, 1);
                    for vb in [1, 2, 3] {
                        let v = must_value(&s, vb, "k");
                        assert!(v == Some(1) || v == Some(2), "{mode:?} {op:?} {nth}: {v:?}");
                    }
                    s.commit(&batch(&[1, 2, 3], "k", 2)).unwrap();
                }
                for vb in [1, 2, 3] {
                    assert_eq!(must_value(&s, vb, "k"), Some(2));
                }
                fs.crash().unwrap();
                drop(s);
                let s = open(dir.path(), &fs, mode);
                for vb in [1, 2, 3] {
                    assert_eq!(must_value(&s, vb, "k"), Some(2), "{mode:?} {op:?} {nth}");
                }
                s.verify().unwrap();
            }
        }
    }
}

/// A checkpoint syncing many data files at once (from several threads) reports a failed
/// sync, keeps the journal generation, and a second checkpoint completes; after a crash
/// every vBucket has its document.
#[test]
fn failed_sync_during_a_parallel_checkpoint_loses_nothing() {
    let vbs: Vec<u16> = (0..100).collect();
    for nth in [1, 37, 100] {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultFs::new();
        let s = open(dir.path(), &fs, JournalMode::On);
        s.commit(&batch(&vbs, "k", 1)).unwrap();
        s.apply_pending(usize::MAX).unwrap();
        let syncs = fs.counts().syncs;
        fs.fail_nth(FaultOp::Sync, nth);
        assert!(s.checkpoint().is_err(), "sync {nth} of 100 failed");
        fs.clear();
        assert!(
            s.stats().journal_bytes > 29,
            "the journal generation is kept"
        );
        s.checkpoint().unwrap();
        assert!(fs.counts().syncs - syncs >= 100);
        assert_eq!(s.stats().journal_bytes, 29);
        fs.crash().unwrap();
        drop(s);
        let s = open(dir.path(), &fs, JournalMode::On);
        for &vb in &vbs {
            assert_eq!(must_value(&s, vb, "k"), Some(1), "nth {nth} vb {vb}");
        }
        s.verify().unwrap();
    }
}

/// A torn write (half the bytes land) is cut off and the retry is clean.
#[test]
fn torn_write_is_cut_back_and_retried() {
    for mode in [JournalMode::On, JournalMode::Off] {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultFs::new();
        let s = open(dir.path(), &fs, mode);
        s.commit(&batch(&[7], "a", 1)).unwrap();
        fs.tear_nth_write(1);
        assert!(s.commit(&batch(&[7], "b", 2)).is_err());
        s.commit(&batch(&[7], "b", 2)).unwrap();
        s.close().unwrap();
        let s = open(dir.path(), &fs, mode);
        assert_eq!(must_value(&s, 7, "a"), Some(1));
        assert_eq!(must_value(&s, 7, "b"), Some(2));
        assert_eq!(s.verify().unwrap(), 2);
    }
}

/// ENOSPC is a distinct, temporary error; reads keep working; writes resume when space
/// comes back.
#[test]
fn enospc_fails_writes_distinctly_while_reads_work() {
    for mode in [JournalMode::On, JournalMode::Off] {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultFs::new();
        let s = open(dir.path(), &fs, mode);
        s.commit(&batch(&[1], "a", 1)).unwrap();
        s.commit(&batch(&[1], "c", 2)).unwrap();
        s.apply_pending(usize::MAX).unwrap();
        s.commit(&batch(&[1], "d", 3)).unwrap();
        fs.set_enospc(true);
        let e = s.commit(&batch(&[1], "b", 2)).unwrap_err();
        assert!(matches!(e, Error::NoSpace { .. }), "{e}");
        assert!(e.is_temporary());
        // Reads keep working: from the file, and (journal on) from commits that are
        // durable in the journal but could not be written to the full disk yet.
        assert_eq!(must_value(&s, 1, "a"), Some(1));
        assert_eq!(must_value(&s, 1, "c"), Some(2));
        assert_eq!(must_value(&s, 1, "d"), Some(3));
        assert_eq!(must_value(&s, 1, "b"), None);
        fs.set_enospc(false);
        s.commit(&batch(&[1], "b", 4)).unwrap();
        assert_eq!(must_value(&s, 1, "b"), Some(4));
        s.close().unwrap();
        let s = open(dir.path(), &fs, mode);
        for (k, v) in [("a", 1), ("b", 4), ("c", 2), ("d", 3)] {
            assert_eq!(must_value(&s, 1, k), Some(v));
        }
    }
}

/// EMFILE while opening a data file closes cached files and retries; if the OS keeps
/// refusing, the error is TooManyOpenFiles (temporary) and nothing acknowledged is lost.
/// With the journal the commit itself needs no data file: the background apply (and a read
/// that must apply first) meets the error, and gets are still served from memory.
#[test]
fn emfile_retries_then_fails_temporarily_without_losing_data() {
    for mode in [JournalMode::On, JournalMode::Off] {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultFs::new();
        let s = open(dir.path(), &fs, mode);
        s.commit(&batch(&[1, 2], "a", 1)).unwrap();
        s.apply_pending(usize::MAX).unwrap();
        fs.set_emfile(1);
        s.commit(&batch(&[3], "a", 1)).unwrap();
        assert_eq!(s.apply_pending(usize::MAX).unwrap(), 0);
        fs.set_emfile(1000);
        let e = match mode {
            JournalMode::On => {
                s.commit(&batch(&[4], "a", 1)).unwrap();
                assert_eq!(must_value(&s, 4, "a"), Some(1), "served from memory");
                s.apply_pending(usize::MAX).unwrap_err()
            }
            JournalMode::Off => s.commit(&batch(&[4], "a", 1)).unwrap_err(),
        };
        assert!(matches!(e, Error::TooManyOpenFiles { .. }), "{e}");
        assert!(e.is_temporary());
        fs.set_emfile(0);
        if mode == JournalMode::Off {
            s.commit(&batch(&[4], "a", 1)).unwrap();
        }
        fs.crash().unwrap();
        drop(s);
        let s = open(dir.path(), &fs, mode);
        for vb in 1..=4 {
            assert_eq!(must_value(&s, vb, "a"), Some(1), "{mode:?} vb {vb}");
        }
    }
}

/// A failed open, and a failed rename during compaction, leave the vBucket as it was.
#[test]
fn failed_open_and_failed_compaction_rename_leave_state_intact() {
    let dir = tempfile::tempdir().unwrap();
    let fs = FaultFs::new();
    let mut cfg = FileStoreConfig::new(dir.path());
    cfg.fd_budget = 0;
    let s = FileStore::open_with(cfg, Arc::new(fs.clone())).unwrap();
    s.commit(&batch(&[1], "a", 1)).unwrap();
    fs.fail_nth(FaultOp::Open, 1);
    assert!(s.get(Vbid(1), b"a").is_err());
    assert_eq!(must_value(&s, 1, "a"), Some(1));
    fs.fail_nth(FaultOp::Rename, 1);
    assert!(s.compact(Vbid(1), &Default::default()).is_err());
    assert_eq!(must_value(&s, 1, "a"), Some(1));
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(!files.iter().any(|f| f.ends_with(".compact")), "{files:?}");
    s.compact(Vbid(1), &Default::default()).unwrap();
    assert_eq!(must_value(&s, 1, "a"), Some(1));
}

fn data_file(dir: &Path, vb: u16) -> std::path::PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(&format!("vb_{vb}."))
        })
        .unwrap()
}

/// Garbage after the last header (a torn tail) is cut off at open and reported.
#[test]
fn torn_tail_is_dropped_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = FileStoreConfig::new(dir.path());
    cfg.journal = JournalMode::Off;
    let s = FileStore::open(cfg.clone()).unwrap();
    s.commit(&batch(&[5], "a", 1)).unwrap();
    s.commit(&batch(&[5], "b", 2)).unwrap();
    drop(s);
    let p = data_file(dir.path(), 5);
    let len = std::fs::metadata(&p).unwrap().len();
    // Cut the last header in half, then add junk.
    let f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
    f.set_len(len - 20).unwrap();
    use std::io::Write;
    (&f).write_all(&[0xAB; 13]).unwrap();
    drop(f);
    let s = FileStore::open(cfg).unwrap();
    let r = s.recovery_report();
    assert_eq!(r.torn_tails.len(), 1, "{r:?}");
    assert_eq!(r.torn_tails[0].0, p);
    assert!(r.torn_tails[0].1 > 13);
    assert_eq!(must_value(&s, 5, "a"), Some(1));
    assert_eq!(must_value(&s, 5, "b"), None);
    s.commit(&batch(&[5], "b", 2)).unwrap();
    assert_eq!(s.verify().unwrap(), 2);
}

/// Damage in the middle of a file (a valid header follows it) is reported at open with the
/// file and the offset, never a panic, and sets only that vBucket aside: the shard opens,
/// other vBuckets work, the damaged file is kept, commits to the vBucket fail until it is
/// deleted, and its journaled commits are dropped (and counted).
#[test]
fn mid_file_corruption_sets_that_vbucket_aside_and_names_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = FileStoreConfig::new(dir.path());
    cfg.journal = JournalMode::Off;
    let s = FileStore::open(cfg.clone()).unwrap();
    s.commit(&batch(&[5, 6], "a", 1)).unwrap();
    s.commit(&batch(&[5, 6], "b", 2)).unwrap();
    drop(s);
    // A run with the journal on leaves a commit of both only in the journal (a crash
    // before its data files were written).
    cfg.journal = JournalMode::On;
    let s = FileStore::open(cfg.clone()).unwrap();
    s.commit(&batch(&[5, 6], "j", 3)).unwrap();
    drop(s);
    let p = data_file(dir.path(), 5);
    let mut bytes = std::fs::read(&p).unwrap();
    // The first document's frame starts right after the 29-byte superblock; flip a byte
    // in its body, and a byte of the last header so the fast path cannot be taken.
    bytes[29 + 20] ^= 0xff;
    let n = bytes.len();
    bytes.push(0); // an extra byte after the last header: the file no longer ends in one
    bytes[n] = 1;
    std::fs::write(&p, &bytes).unwrap();
    let s = FileStore::open(cfg.clone()).unwrap();
    let r = s.recovery_report().clone();
    assert_eq!(r.quarantined.len(), 1, "{r:?}");
    assert_eq!(r.journal_commits_dropped, 1, "{r:?}");
    assert_eq!(r.journal_commits_replayed, 1, "{r:?}");
    let q = &r.quarantined[0];
    assert_eq!(q.vbid, Vbid(5));
    assert_eq!(q.path, p);
    assert_eq!(q.offset, 29);
    assert!(
        q.error.contains("offset 29") && q.error.contains("vb_5."),
        "{}",
        q.error
    );
    assert_eq!(s.quarantined(), r.quarantined);
    assert_eq!(s.vbuckets(), vec![Vbid(6)]);
    assert_eq!(must_value(&s, 6, "b"), Some(2));
    assert_eq!(must_value(&s, 6, "j"), Some(3));
    assert_eq!(must_value(&s, 5, "a"), None);
    let e = s.commit(&batch(&[5, 6], "c", 4)).unwrap_err();
    assert!(
        matches!(&e, Error::VbucketUnavailable { vbid: 5, .. }),
        "{e}"
    );
    assert!(p.exists(), "the damaged file is kept");
    s.commit(&batch(&[6], "c", 4)).unwrap();
    assert_eq!(s.verify().unwrap(), 4);
    drop(s);

    // Still set aside at the next open (the file is untouched).
    let s = FileStore::open(cfg.clone()).unwrap();
    assert_eq!(s.quarantined().len(), 1);
    assert_eq!(must_value(&s, 6, "c"), Some(4));
    // Deleting it removes its files; the vbid is usable again.
    s.delete_vbuckets(&[Vbid(5)]).unwrap();
    assert!(s.quarantined().is_empty());
    assert!(!p.exists());
    s.commit(&batch(&[5], "fresh", 1)).unwrap();
    assert_eq!(must_value(&s, 5, "fresh"), Some(1));
    s.close().unwrap();
    let s = FileStore::open(cfg).unwrap();
    assert!(s.quarantined().is_empty());
    assert_eq!(must_value(&s, 5, "fresh"), Some(1));
    assert_eq!(s.verify().unwrap(), 5);
}

/// A corrupt record met by a read (the file ends in a valid header, so open is fast and
/// does not walk it) is an error naming file and offset.
#[test]
fn corrupt_document_is_reported_on_read() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = FileStoreConfig::new(dir.path());
    let s = FileStore::open(cfg.clone()).unwrap();
    s.commit(&batch(&[2], "a", 1)).unwrap();
    s.close().unwrap();
    let p = data_file(dir.path(), 2);
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[29 + 12] ^= 0x01;
    std::fs::write(&p, &bytes).unwrap();
    let s = FileStore::open(cfg).unwrap();
    let e = s.get(Vbid(2), b"a").unwrap_err();
    assert!(matches!(&e, Error::Corrupt { offset: 29, .. }), "{e}");
    let e = s
        .scan_by_seqno(Vbid(2), 0, u64::MAX, &mut |_| ScanControl::Continue)
        .unwrap_err();
    assert!(matches!(&e, Error::Corrupt { offset: 29, .. }), "{e}");
    assert!(s.verify().is_err());
}

/// The journal's torn tail (a batch whose sync never completed) is dropped and reported.
#[test]
fn journal_torn_tail_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let fs = FaultFs::new();
    let s = open(dir.path(), &fs, JournalMode::On);
    s.commit(&batch(&[1, 2], "a", 1)).unwrap();
    fs.fail_nth(FaultOp::Sync, 1);
    assert!(s.commit(&batch(&[1, 2], "b", 2)).is_err());
    // The failed batch was cut back; now crash keeping a few junk bytes of a third one.
    fs.crash_with(|_, n| n / 2).unwrap();
    drop(s);
    let s = open(dir.path(), &fs, JournalMode::On);
    assert_eq!(must_value(&s, 1, "a"), Some(1));
    assert_eq!(must_value(&s, 2, "a"), Some(1));
    s.verify().unwrap();
}
