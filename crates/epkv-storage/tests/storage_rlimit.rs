//! EMFILE for real: a child process lowers its RLIMIT_NOFILE below the store's descriptor
//! budget and writes to more vBuckets than it can keep open. The store must close idle
//! files and retry, report a temporary error when even that cannot help, and lose nothing
//! acknowledged; the parent then reopens the files and checks every write.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions panic on failure"
)]
use epkv_storage::{
    Document, Error, FdCache, FileStore, FileStoreConfig, KvStore, RealFs, VbCommit, VbState,
};
use epkv_types::{VBucketState, Vbid};
use std::sync::Arc;

const CHILD_ENV: &str = "EPKV_STORAGE_RLIMIT_CHILD_DIR";
const VBUCKETS: u16 = 120;
/// Descriptors the child may open beyond those it inherited (the harness and cargo pass
/// some on, a varying number).
const SPARE_FDS: u64 = 48;
/// The first scenario runs once per number of extra descriptors held outside the store, so
/// that some run ends with the cache owning every free descriptor when the store closes
/// (its directory sync then needs the cache to make room); which count does that depends on
/// what the test harness inherited.
const OFFSETS: usize = 12;

fn commit(s: &FileStore, vb: u16) -> Result<(), Error> {
    s.commit(&[VbCommit {
        vbid: Vbid(vb),
        docs: vec![Document {
            key: format!("key-{vb}").into_bytes(),
            value: (vec![vb as u8; 100]).into(),
            seqno: 1,
            cas: u64::from(vb) + 1,
            rev_seqno: 1,
            flags: 0,
            expiry: 0,
            datatype: 0,
            deleted: false,
        }]
        .into(),
        keys_unique: false,
        state: VbState::new(VBucketState::Active),
    }])
}

fn fill_past_the_limit(dir: &str) {
    // A budget far above what the OS now allows: EMFILE, not the budget, limits us.
    let fds = Arc::new(FdCache::new(Arc::new(RealFs), 10_000));
    let mut cfg = FileStoreConfig::new(dir);
    cfg.fd_cache = Some(Arc::clone(&fds));
    let s = FileStore::open(cfg).unwrap();
    for vb in 0..VBUCKETS {
        commit(&s, vb).unwrap();
        // The journal made it durable; writing the data file opens it.
        s.apply_pending(usize::MAX).unwrap();
    }
    assert!(fds.emfile_retries() > 0, "the lowered limit was never hit");
    // The cache holds nearly every descriptor the limit allows; closing syncs the
    // directory, which needs one more.
    s.close().unwrap();
}

fn child(dir: &str) {
    let inherited = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    let nofile = inherited + SPARE_FDS;
    let lim = libc::rlimit {
        rlim_cur: nofile,
        rlim_max: nofile,
    };
    // SAFETY: a valid rlimit struct; lowering the limit only affects this child process.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const lim) };
    assert_eq!(rc, 0);
    for offset in 0..OFFSETS {
        let held: Vec<_> = (0..offset)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        fill_past_the_limit(&format!("{dir}/off{offset}"));
        drop(held);
    }
    // A second store that keeps no file open (budget 0): with every descriptor taken
    // outside it, closing idle files cannot help, so the error is temporary.
    let dir2 = format!("{dir}/second");
    let mut cfg2 = FileStoreConfig::new(&dir2);
    cfg2.fd_budget = 0;
    cfg2.journal = epkv_storage::JournalMode::Off;
    let s2 = FileStore::open(cfg2).unwrap();
    let mut hog = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        hog.push(f);
    }
    let e = commit(&s2, 7).unwrap_err();
    assert!(matches!(e, Error::TooManyOpenFiles { .. }), "{e}");
    assert!(e.is_temporary());
    drop(hog);
    commit(&s2, 7).unwrap();
    s2.close().unwrap();
}

#[test]
fn emfile_under_a_lowered_rlimit_closes_idle_files_and_loses_nothing() {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        child(dir.to_str().unwrap());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "emfile_under_a_lowered_rlimit_closes_idle_files_and_loses_nothing",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(CHILD_ENV, dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for offset in 0..OFFSETS {
        let s = FileStore::open(FileStoreConfig::new(
            dir.path().join(format!("off{offset}")),
        ))
        .unwrap();
        assert_eq!(s.vbuckets().len(), usize::from(VBUCKETS));
        for vb in 0..VBUCKETS {
            let d = s
                .get(Vbid(vb), format!("key-{vb}").as_bytes())
                .unwrap()
                .unwrap();
            assert_eq!(d.value, vec![vb as u8; 100]);
        }
        s.verify().unwrap();
    }
    let mut cfg2 = FileStoreConfig::new(dir.path().join("second"));
    cfg2.journal = epkv_storage::JournalMode::Off;
    let s2 = FileStore::open(cfg2).unwrap();
    assert_eq!(s2.get(Vbid(7), b"key-7").unwrap().unwrap().seqno, 1);
}
