//! [`FileStore`]: the files backend of [`KvStore`] for one shard: per-vBucket data files
//! plus, unless turned off, one write-ahead journal.
//!
//! **Commit with the journal** ([`JournalMode::On`]): the whole batch (every vBucket it
//! touches) is appended to the journal as one record and made durable by one fdatasync;
//! then each vBucket's data file gets the documents, an index segment and a header,
//! *without* a sync. The data files are synced at a checkpoint (when the journal exceeds
//! [`FileStoreConfig::checkpoint_bytes`], before deleting a vBucket, on
//! [`KvStore::checkpoint`] and on close), after which the journal starts a new generation
//! (it is never truncated; see `docs/storage-format.md`). Recovery = each data file's last
//! valid header + replay of the current generation's journal batches the file lacks.
//!
//! **Commit without the journal** ([`JournalMode::Off`], KV-Engine's behaviour): each data
//! file is written and synced, one fdatasync per vBucket per batch.
//!
//! **Failures.** A failed write or sync is never ignored: the commit returns the error, the
//! written bytes are cut back to the last committed header (or, if even that fails, the
//! vBucket is marked for repair before its next use), and the caller retries the batch.
//! Each journal record carries, per vBucket, the commit id it becomes; on replay the last
//! record for a commit id wins, so a retried batch supersedes the failed attempt.
//!
//! **Locking.** `commit_lock` (journal + commit order of the shard) → one vBucket's mutex →
//! the [`FdCache`] mutex. Readers take only the vBucket mutex, briefly, to clone its
//! [`ReadView`], then read with positional I/O and no lock. Compaction (one at a time per
//! vBucket, marked in `compacting` before any lock is taken; different vBuckets of a shard
//! compact at once) holds the vBucket's mutex only twice, briefly: to
//! snapshot the last header and index, and, after copying that snapshot to the next
//! revision with no lock held, to catch up the documents committed meanwhile (seqno above
//! the snapshot's high seqno) and switch files. Commits to the vBucket go on during the
//! copy; they wait only for the catch-up, which is proportional to what they wrote.

use crate::data_file::{self, ReadView, Segment};
use crate::error::{Error, Result};
use crate::fd_cache::{FdCache, default_fd_budget};
use crate::format::{self, Header, JournalEntry, KeyEntry, RecordKind, SUPERBLOCK_LEN};
use crate::kv_store::KvStore;
use crate::types::{
    CompactionOutcome, Document, FileUsage, KeyMeta, PurgeRule, ScanControl, StoreStats, VbCommit,
    VbState,
};
use crate::vfs::{OpenMode, RealFs, VFile, Vfs};
use epkv_types::Vbid;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Whether commits go through the shard's write-ahead journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalMode {
    /// One journal append and one fdatasync per batch; data files synced at checkpoints.
    On,
    /// One fdatasync per vBucket data file per batch (KV-Engine's behaviour).
    Off,
}

/// Settings of one [`FileStore`].
#[derive(Debug, Clone)]
pub struct FileStoreConfig {
    /// Directory holding this shard's data files and journal (created if missing).
    pub dir: PathBuf,
    /// Journal on or off.
    pub journal: JournalMode,
    /// Journal size that triggers a checkpoint, in bytes (default 64 MiB).
    pub checkpoint_bytes: u64,
    /// Open data files kept, when no shared cache is given (default: from RLIMIT_NOFILE;
    /// 0 = open and close the file on every use).
    pub fd_budget: usize,
    /// A descriptor cache shared with other shards; overrides `fd_budget`.
    pub fd_cache: Option<Arc<FdCache>>,
    /// Bytes of zeros written into a new journal so that appends overwrite allocated
    /// blocks and an fdatasync need not also write the inode (default 0: the journal grows
    /// as it is appended to). The journal is never shrunk; a checkpoint starts a new
    /// generation instead.
    pub journal_prealloc_bytes: u64,
    /// Document bytes of journaled commits [`KvStore::apply_pending`] lets accumulate
    /// before it writes them to the data files (default 0: write at once). Above 0, each
    /// data file gets many commits in one write (one append, one index segment, one
    /// header), which costs far less than one write per commit; reads, compaction and
    /// checkpoints still apply what they need first.
    pub apply_after_bytes: u64,
}

impl FileStoreConfig {
    /// Defaults for `dir`: journal on, 64 MiB checkpoints, budget from RLIMIT_NOFILE.
    #[must_use]
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            journal: JournalMode::On,
            checkpoint_bytes: 64 << 20,
            fd_budget: default_fd_budget(),
            fd_cache: None,
            journal_prealloc_bytes: 0,
            apply_after_bytes: 0,
        }
    }
}

/// What opening a store found and repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Data files whose uncommitted or torn tail was cut off: (file, bytes dropped).
    pub torn_tails: Vec<(PathBuf, u64)>,
    /// Bytes of the journal's torn tail dropped.
    pub journal_torn_bytes: u64,
    /// vBucket commits re-applied from the journal.
    pub journal_commits_replayed: u64,
    /// Leftover files removed (old revisions, unfinished compactions).
    pub files_removed: Vec<PathBuf>,
    /// vBuckets whose newest data file is damaged in the middle: set aside
    /// ([`FileStore::quarantined`]) instead of failing the whole shard's open.
    pub quarantined: Vec<Quarantined>,
    /// Journal commits of quarantined vBuckets that could not be replayed (dropped).
    pub journal_commits_dropped: u64,
}

/// A vBucket set aside at open because its data file is corrupt in the middle: its files
/// are left untouched for inspection, it is absent from [`KvStore::vbuckets`], reads find
/// nothing in it and commits to it fail with [`Error::VbucketUnavailable`], until
/// [`KvStore::delete_vbuckets`] removes its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    /// The vBucket.
    pub vbid: Vbid,
    /// The damaged file.
    pub path: PathBuf,
    /// Byte offset of the first bad record.
    pub offset: u64,
    /// The error, as logged.
    pub error: String,
}

/// A 64-bit hash of a document key, the key of [`Accounting::doc_lens`]: SipHash-1-3
/// with fixed keys, so it is the same in every run (a collision of two keys only skews
/// the accounting, which the next compaction recounts).
fn key_hash(key: &[u8]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    h.write(key);
    h.finish()
}

/// A [`Hasher`] for keys that are already hashes ([`key_hash`]).
#[derive(Debug, Default, Clone, Copy)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// The live-byte accounting of one data file (see [`FileUsage`]). Kept up to date by
/// every append ([`FileStore::apply`]), built from the index at open and from the copy
/// at compaction. Costs about 16-24 bytes of memory per key.
#[derive(Debug, Default, Clone)]
struct Accounting {
    /// Frame length of each key's newest version in the file, by [`key_hash`].
    doc_lens: HashMap<u64, u32, BuildHasherDefault<PassThrough>>,
    /// Sum of `doc_lens`.
    doc_bytes: u64,
    /// Length of the last header's frame.
    header_bytes: u64,
}

impl Accounting {
    /// Records `len` bytes as the newest version of the key hashed `h`; the version it
    /// replaces (if any) becomes garbage.
    fn put(&mut self, h: u64, len: u32) {
        if let Some(old) = self.doc_lens.insert(h, len) {
            self.doc_bytes -= u64::from(old);
        }
        self.doc_bytes += u64::from(len);
    }

    /// Builds the accounting of a file from its index: every segment's keys, newest
    /// segment first (an older segment's version of a key is garbage).
    fn from_index(
        f: &dyn VFile,
        path: &Path,
        segments: &[Arc<Segment>],
        header: &Header,
    ) -> Result<Self> {
        let mut a = Self {
            header_bytes: header_frame_len(header),
            ..Self::default()
        };
        for seg in segments.iter().rev() {
            for e in data_file::read_all_keys(f, path, seg)? {
                let h = key_hash(&e.key);
                if let std::collections::hash_map::Entry::Vacant(v) = a.doc_lens.entry(h) {
                    v.insert(e.len);
                    a.doc_bytes += u64::from(e.len);
                }
            }
        }
        Ok(a)
    }
}

/// The length of a header's frame as written.
fn header_frame_len(h: &Header) -> u64 {
    let mut b = Vec::with_capacity(256);
    format::put_header(&mut b, h);
    b.len() as u64
}

/// Bytes of a file's index: the segments the last header points to and their blocks.
fn index_bytes(segments: &[Arc<Segment>]) -> u64 {
    segments
        .iter()
        .map(|s| {
            u64::from(s.len)
                + s.dir
                    .key_blocks
                    .iter()
                    .chain(&s.dir.seq_blocks)
                    .map(|b| u64::from(b.len))
                    .sum::<u64>()
        })
        .sum()
}

#[derive(Debug)]
struct VbFile {
    vbid: u16,
    rev: u64,
    path: PathBuf,
    /// Append position: the end of the last committed header (0 = no file yet).
    end: u64,
    header: Option<Header>,
    segments: Arc<Vec<Arc<Segment>>>,
    /// A write failed and the tail could not be cut back yet: repair before next use.
    needs_repair: bool,
    /// Commits durable in the journal but not yet written to the data file, oldest first
    /// (journal mode): applied in the background, before any read of this vBucket, and
    /// before a checkpoint.
    pending: Vec<JournalEntry>,
    /// Live bytes of the file, for [`FileUsage`].
    acct: Accounting,
    /// The file's format version (its superblock's): 1 for a file from before
    /// collections, which [`FileStore::upgrade_format`] rewrites.
    format_version: u16,
}

impl VbFile {
    fn new(dir: &Path, vbid: u16, format_version: u16) -> Self {
        Self {
            vbid,
            rev: 0,
            path: dir.join(data_file::file_name(vbid, 0)),
            end: 0,
            header: None,
            segments: Arc::new(Vec::new()),
            needs_repair: false,
            pending: Vec::new(),
            acct: Accounting::default(),
            format_version,
        }
    }

    /// The file's size and live bytes (its committed part: up to `end`).
    fn usage(&self) -> FileUsage {
        if self.end == 0 || self.header.is_none() {
            return FileUsage::default();
        }
        FileUsage {
            file_bytes: self.end,
            live_bytes: SUPERBLOCK_LEN as u64
                + self.acct.doc_bytes
                + index_bytes(&self.segments)
                + self.acct.header_bytes,
        }
    }

    /// The commit id the next commit of this vBucket gets.
    fn next_commit_id(&self) -> u64 {
        self.header.as_ref().map_or(0, |h| h.commit_id) + self.pending.len() as u64 + 1
    }

    /// The newest committed state, including commits not yet applied to the file.
    fn latest_state(&self) -> Option<&VbState> {
        self.pending
            .last()
            .map(|e| &e.state)
            .or(self.header.as_ref().map(|h| &h.state))
    }
}

#[derive(Debug)]
struct Journal {
    path: PathBuf,
    file: Arc<dyn VFile>,
    /// Where the next record goes: the end of the current generation's records.
    end: u64,
    /// The generation in the superblock; only records carrying it are replayed.
    generation: u64,
    /// The buffer each commit encodes its record into, kept between commits: a fresh
    /// buffer of a large batch is fresh memory, which costs a page fault per 4 KiB.
    buf: Vec<u8>,
}

/// The most a journal's record buffer keeps between commits.
const JOURNAL_BUF_KEEP: usize = 4 << 20;

#[derive(Debug, Default)]
struct Counters {
    batches: AtomicU64,
    items: AtomicU64,
    syncs: AtomicU64,
    bytes: AtomicU64,
    journal_bytes: AtomicU64,
    checkpoints: AtomicU64,
    compactions: AtomicU64,
    failures: AtomicU64,
    reclaimed: AtomicU64,
}

/// The files backend for one shard. See the module docs.
#[derive(Debug)]
pub struct FileStore {
    cfg: FileStoreConfig,
    vfs: Arc<dyn Vfs>,
    fds: Arc<FdCache>,
    /// The vBuckets' files. Lock order: a file's lock may be held while this one is
    /// taken (a compaction checks that its file is still current), never the reverse.
    vbs: Mutex<HashMap<u16, Arc<Mutex<VbFile>>>>,
    /// The journal (None when off); its mutex also orders the shard's commits.
    commit_lock: Mutex<Option<Journal>>,
    /// vBuckets whose data file has unsynced bytes (journal mode).
    dirty: Mutex<BTreeSet<u16>>,
    /// vBuckets with commits not yet applied to their data file (journal mode).
    pending_vbs: Mutex<BTreeSet<u16>>,
    /// vBuckets being compacted (one compaction at a time per vBucket; the next revision's
    /// name is taken under it), with the condition a second compaction of one waits on.
    compacting: Mutex<BTreeSet<u16>>,
    compacting_done: parking_lot::Condvar,
    /// vBuckets set aside at open (corrupt data file), by vbid. Leaf lock.
    quarantined: Mutex<BTreeMap<u16, Quarantined>>,
    /// Each vBucket's [`FileUsage`] as of its last append or compaction, so that the
    /// compactor can pick files without taking their locks. Leaf lock.
    usage: Mutex<BTreeMap<u16, FileUsage>>,
    /// Bytes of documents in pending commits; above [`MAX_PENDING_BYTES`] a commit applies
    /// them itself (back-pressure when the background applier falls behind).
    pending_bytes: AtomicU64,
    /// A file was created or removed since the directory was last synced.
    dir_dirty: AtomicU64,
    counters: Counters,
    report: RecoveryReport,
    /// A journal of format 1 is being replayed: files it creates are format 1.
    legacy_replay: bool,
}

const JOURNAL_NAME: &str = "journal.log";
/// Threads a checkpoint syncs data files from, when it has at least
/// [`PARALLEL_SYNC_MIN`] of them (and the descriptor budget is at least that).
const CHECKPOINT_SYNC_THREADS: usize = 8;
const PARALLEL_SYNC_MIN: usize = 32;
/// Document bytes allowed to wait for the background applier (64 MiB).
const MAX_PENDING_BYTES: u64 = 64 << 20;
/// Bytes a compaction's copy buffers before each write (and each call of its pacing
/// callback): small enough that a rate limit sleeps in short, even steps, large enough
/// that the writes stay sequential and few.
pub const COMPACT_CHUNK_BYTES: usize = 1 << 20;

/// The documents of several pending commits of one vBucket (oldest first) as one commit's:
/// the newest version of each key, in seqno order, borrowed (nothing is copied).
fn latest_of_entries(pending: &[JournalEntry]) -> Vec<&Document> {
    let n: usize = pending.iter().map(|e| e.docs.len()).sum();
    crate::types::latest_versions(pending.iter().flat_map(|e| e.docs.iter()), n)
}

/// A vBucket's mark in [`FileStore::compacting`]; dropping it wakes a compaction waiting for
/// the same vBucket.
struct CompactingGuard<'a> {
    store: &'a FileStore,
    vbid: u16,
}

impl Drop for CompactingGuard<'_> {
    fn drop(&mut self) {
        self.store.compacting.lock().remove(&self.vbid);
        self.store.compacting_done.notify_all();
    }
}

fn entry_bytes(e: &JournalEntry) -> u64 {
    e.docs
        .iter()
        .map(|d| (d.key.len() + d.value.len() + 64) as u64)
        .sum()
}

impl FileStore {
    /// Opens (or creates) the shard in `cfg.dir` on the real file system, recovering every
    /// data file and replaying the journal.
    ///
    /// # Errors
    /// I/O errors, or [`Error::Corrupt`] naming the file and offset of damage in the
    /// middle of a file.
    pub fn open(cfg: FileStoreConfig) -> Result<Self> {
        Self::open_with(cfg, Arc::new(RealFs))
    }

    /// As [`FileStore::open`] over any [`Vfs`] (such as [`crate::FaultFs`]).
    ///
    /// # Errors
    /// As [`FileStore::open`].
    pub fn open_with(cfg: FileStoreConfig, vfs: Arc<dyn Vfs>) -> Result<Self> {
        vfs.create_dir_all(&cfg.dir)
            .map_err(|e| Error::io("mkdir", &cfg.dir, e))?;
        let fds = cfg
            .fd_cache
            .clone()
            .unwrap_or_else(|| Arc::new(FdCache::new(Arc::clone(&vfs), cfg.fd_budget)));
        let mut store = Self {
            cfg,
            vfs,
            fds,
            vbs: Mutex::new(HashMap::new()),
            commit_lock: Mutex::new(None),
            dirty: Mutex::new(BTreeSet::new()),
            pending_vbs: Mutex::new(BTreeSet::new()),
            compacting: Mutex::new(BTreeSet::new()),
            compacting_done: parking_lot::Condvar::new(),
            quarantined: Mutex::new(BTreeMap::new()),
            usage: Mutex::new(BTreeMap::new()),
            pending_bytes: AtomicU64::new(0),
            dir_dirty: AtomicU64::new(0),
            counters: Counters::default(),
            report: RecoveryReport::default(),
            legacy_replay: false,
        };
        store.recover_data_files()?;
        store.recover_journal()?;
        store.upgrade_format()?;
        Ok(store)
    }

    /// What recovery found when the store was opened.
    #[must_use]
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    /// The vBuckets currently set aside because their data file is corrupt (see
    /// [`Quarantined`]).
    #[must_use]
    pub fn quarantined(&self) -> Vec<Quarantined> {
        self.quarantined.lock().values().cloned().collect()
    }

    /// The shard's directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.cfg.dir
    }

    /// Checks every record of every data file (CRC and structure), returning how many
    /// documents were verified.
    ///
    /// # Errors
    /// The first [`Error::Corrupt`] found, naming file and offset.
    pub fn verify(&self) -> Result<u64> {
        let mut n = 0;
        for vb in self.vbuckets() {
            let docs = self.scan_by_seqno(vb, 0, u64::MAX, &mut |_| ScanControl::Continue)?;
            n += docs;
            let view = self.view(vb.0)?;
            if let Some(view) = view {
                let f = self.fds.get(&view.path, OpenMode::Existing)?;
                for s in view.segments.iter() {
                    data_file::read_all_keys(&*f, &view.path, s)?;
                }
            }
        }
        Ok(n)
    }

    /// Syncs every data file and the journal, then closes (what a clean shutdown does).
    ///
    /// # Errors
    /// If the final checkpoint fails; nothing acknowledged is lost either way (the journal
    /// is kept until a checkpoint succeeds).
    pub fn close(self) -> Result<()> {
        self.checkpoint()
    }

    fn vb(&self, vbid: u16) -> Arc<Mutex<VbFile>> {
        let mut g = self.vbs.lock();
        Arc::clone(g.entry(vbid).or_insert_with(|| {
            let version = if self.legacy_replay {
                1
            } else {
                format::FORMAT_VERSION
            };
            Arc::new(Mutex::new(VbFile::new(&self.cfg.dir, vbid, version)))
        }))
    }

    fn existing_vb(&self, vbid: u16) -> Option<Arc<Mutex<VbFile>>> {
        self.vbs.lock().get(&vbid).cloned()
    }

    fn view(&self, vbid: u16) -> Result<Option<ReadView>> {
        let Some(vb) = self.existing_vb(vbid) else {
            return Ok(None);
        };
        let mut g = vb.lock();
        self.apply_pending_vb(&mut g)?;
        if g.header.is_none() {
            return Ok(None);
        }
        Ok(Some(ReadView {
            path: g.path.clone(),
            segments: Arc::clone(&g.segments),
        }))
    }

    /// Publishes a vBucket's [`FileUsage`] for [`KvStore::file_usage`].
    fn publish_usage(&self, g: &VbFile) {
        let u = g.usage();
        let mut m = self.usage.lock();
        if u.file_bytes == 0 {
            m.remove(&g.vbid);
        } else {
            m.insert(g.vbid, u);
        }
    }

    /// Recounts a vBucket's [`FileUsage`] from its file's index (the accounting that
    /// [`KvStore::file_usage`] reports is maintained incrementally; tests check the two
    /// agree). `None` for a vBucket without a data file.
    ///
    /// # Errors
    /// I/O errors or a corrupt index block.
    #[doc(hidden)]
    pub fn recount_usage(&self, vbid: Vbid) -> Result<Option<FileUsage>> {
        let Some(vb) = self.existing_vb(vbid.0) else {
            return Ok(None);
        };
        let g = vb.lock();
        let Some(header) = g.header.as_ref() else {
            return Ok(None);
        };
        if g.end == 0 {
            return Ok(None);
        }
        let f = self.fds.get(&g.path, OpenMode::Existing)?;
        let acct = Accounting::from_index(&*f, &g.path, &g.segments, header)?;
        Ok(Some(FileUsage {
            file_bytes: g.end,
            live_bytes: SUPERBLOCK_LEN as u64
                + acct.doc_bytes
                + index_bytes(&g.segments)
                + acct.header_bytes,
        }))
    }

    /// As [`KvStore::compact`], calling `pace` with the bytes written after each chunk of
    /// the copy (at most [`COMPACT_CHUNK_BYTES`]), with no lock held: the caller bounds
    /// the compaction's I/O rate by sleeping there.
    ///
    /// # Errors
    /// As [`KvStore::compact`].
    pub fn compact_paced(
        &self,
        vbid: Vbid,
        rule: &PurgeRule,
        pace: &mut dyn FnMut(u64),
    ) -> Result<CompactionOutcome> {
        let Some(vb) = self.existing_vb(vbid.0) else {
            return Ok(CompactionOutcome::default());
        };
        self.compact_vb(&vb, rule, pace, &mut || {})
    }

    fn sync_file(&self, f: &dyn VFile, path: &Path) -> Result<()> {
        self.counters.syncs.fetch_add(1, Relaxed);
        f.sync_data().map_err(|e| Error::io("sync", path, e))
    }

    fn sync_dir(&self) -> Result<()> {
        self.counters.syncs.fetch_add(1, Relaxed);
        let dir = &self.cfg.dir;
        self.fds
            .with_room(dir, || self.vfs.sync_dir(dir))
            .map_err(|e| Error::io("sync dir", dir, e))?;
        self.dir_dirty.store(0, Relaxed);
        Ok(())
    }

    // ----- recovery -----

    fn recover_data_files(&mut self) -> Result<()> {
        let files = self
            .vfs
            .list(&self.cfg.dir)
            .map_err(|e| Error::io("list", &self.cfg.dir, e))?;
        let mut by_vb: BTreeMap<u16, Vec<(u64, PathBuf)>> = BTreeMap::new();
        for p in files {
            let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            match data_file::parse_file_name(name) {
                Some((_, _, true)) => {
                    // An unfinished compaction.
                    self.remove_file(&p)?;
                }
                Some((vbid, rev, false)) => by_vb.entry(vbid).or_default().push((rev, p)),
                None => {}
            }
        }
        for (vbid, mut revs) in by_vb {
            revs.sort_by_key(|(r, _)| std::cmp::Reverse(*r));
            match self.recover_vbucket(vbid, revs) {
                Ok(Some(v)) => {
                    self.publish_usage(&v);
                    self.vbs.lock().insert(vbid, Arc::new(Mutex::new(v)));
                }
                Ok(None) => {}
                Err(Error::Corrupt {
                    path,
                    offset,
                    reason,
                }) => {
                    let error = Error::Corrupt {
                        path: path.clone(),
                        offset,
                        reason,
                    }
                    .to_string();
                    tracing::error!(vbid, path = %path.display(), offset, %error, "data file corrupt in the middle: this vBucket is set aside (unavailable), its files are kept for inspection; the other vBuckets open normally");
                    self.fds.forget(&path);
                    let q = Quarantined {
                        vbid: Vbid(vbid),
                        path,
                        offset,
                        error,
                    };
                    self.report.quarantined.push(q.clone());
                    self.quarantined.lock().insert(vbid, q);
                }
                Err(e) => return Err(e),
            }
        }
        if self.dir_dirty.load(Relaxed) > 0 {
            self.sync_dir()?;
        }
        Ok(())
    }

    /// Chooses a vBucket's file among its revisions (newest first): the newest with a
    /// committed header, whose torn tail is cut off; older ones are removed. A corrupt
    /// newest revision is returned as the error and nothing is removed.
    fn recover_vbucket(&mut self, vbid: u16, revs: Vec<(u64, PathBuf)>) -> Result<Option<VbFile>> {
        let mut chosen: Option<VbFile> = None;
        for (rev, path) in revs {
            if chosen.is_some() {
                self.remove_file(&path)?;
                continue;
            }
            let f = self.fds.get(&path, OpenMode::Existing)?;
            let rec = data_file::recover(&*f, &path, vbid)?;
            let Some((header, end)) = rec.header else {
                // Nothing committed in this revision: a fresh file whose first commit
                // never became durable. The journal (if any) holds its commits.
                self.fds.forget(&path);
                self.remove_file(&path)?;
                if rec.torn_bytes > 0 {
                    self.report.torn_tails.push((path.clone(), rec.torn_bytes));
                }
                continue;
            };
            let mut segs = Vec::with_capacity(header.segments.len());
            for (off, len) in &header.segments {
                segs.push(Arc::new(data_file::load_segment(&*f, &path, *off, *len)?));
            }
            if rec.torn_bytes > 0 {
                tracing::warn!(path = %path.display(), dropped_bytes = rec.torn_bytes, "data file: cutting off torn tail after the last valid header");
                f.set_len(end)
                    .map_err(|e| Error::io("truncate", &path, e))?;
                self.sync_file(&*f, &path)?;
                self.report.torn_tails.push((path.clone(), rec.torn_bytes));
            }
            let acct = Accounting::from_index(&*f, &path, &segs, &header)?;
            chosen = Some(VbFile {
                vbid,
                rev,
                path,
                end,
                header: Some(header),
                segments: Arc::new(segs),
                needs_repair: false,
                pending: Vec::new(),
                acct,
                format_version: rec.format_version,
            });
        }
        Ok(chosen)
    }

    fn remove_file(&mut self, p: &Path) -> Result<()> {
        self.fds.forget(p);
        match self.vfs.remove(p) {
            Ok(()) => {}
            // Gone already: what recovery wanted.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io("remove", p, e)),
        }
        self.dir_dirty.fetch_add(1, Relaxed);
        self.report.files_removed.push(p.to_owned());
        Ok(())
    }

    fn recover_journal(&mut self) -> Result<()> {
        let path = self.cfg.dir.join(JOURNAL_NAME);
        if self.cfg.journal == JournalMode::Off {
            // A journal left by a run with it on must still be replayed once.
            match self
                .fds
                .with_room(&path, || self.vfs.open(&path, OpenMode::Existing))
            {
                Ok(f) => {
                    let j = read_journal(&*f, &path)?;
                    self.report.journal_torn_bytes = j.torn_bytes;
                    self.legacy_replay = j.version < format::FORMAT_VERSION;
                    self.replay(j.entries)?;
                    self.legacy_replay = false;
                    self.checkpoint_files()?;
                    drop(f);
                    self.vfs
                        .remove(&path)
                        .map_err(|e| Error::io("remove", &path, e))?;
                    self.sync_dir()?;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("open", &path, e)),
            }
            return Ok(());
        }
        let f = self
            .fds
            .with_room(&path, || self.vfs.open(&path, OpenMode::Create))
            .map_err(|e| Error::io("open", &path, e))?;
        let len = f.len().map_err(|e| Error::io("stat", &path, e))?;
        let sb = SUPERBLOCK_LEN as u64;
        if len < sb {
            let mut b = Vec::new();
            format::put_superblock(&mut b, RecordKind::JournalSuperblock, 0, 1);
            f.set_len(0).map_err(|e| Error::io("truncate", &path, e))?;
            f.write_all_at(&b, 0)
                .map_err(|e| Error::io("write", &path, e))?;
            self.preallocate(&*f, &path, sb)?;
            self.sync_file(&*f, &path)?;
            self.sync_dir()?;
            *self.commit_lock.lock() = Some(Journal {
                path,
                file: f,
                end: sb,
                generation: 1,
                buf: Vec::new(),
            });
            return Ok(());
        }
        let j = read_journal(&*f, &path)?;
        if j.torn_bytes > 0 {
            tracing::warn!(path = %path.display(), dropped_bytes = j.torn_bytes, "journal: dropping torn tail");
        }
        self.report.journal_torn_bytes = j.torn_bytes;
        // Files a format-1 journal creates are format 1 too, so that the upgrade below
        // (or, after a crash, at the next open) rewrites their keys.
        self.legacy_replay = j.version < format::FORMAT_VERSION;
        self.replay(j.entries)?;
        self.legacy_replay = false;
        self.preallocate(&*f, &path, len)?;
        *self.commit_lock.lock() = Some(Journal {
            path,
            file: f,
            end: j.end,
            generation: j.generation,
            buf: Vec::new(),
        });
        // Make the replayed data files durable and start a new journal generation.
        self.checkpoint()
    }

    /// Rewrites every data file of format 1 (before collections) as format 2, by a
    /// compaction that keeps every document and escapes the keys that start with a zero
    /// byte ([`format::escape_v1_key`]); a crash leaves the old file, rewritten at the
    /// next open. Runs once, at open, after the journal's replay.
    fn upgrade_format(&self) -> Result<()> {
        let old: Vec<u16> = self
            .vbs
            .lock()
            .iter()
            .filter(|(_, v)| v.lock().format_version < format::FORMAT_VERSION)
            .map(|(id, _)| *id)
            .collect();
        for vbid in old {
            let rule = PurgeRule {
                escape_v1_keys: true,
                ..PurgeRule::default()
            };
            let out = self.compact_with(Vbid(vbid), &rule, &mut || {})?;
            tracing::info!(
                vbid,
                documents = out.kept,
                "data file upgraded from format 1 to 2"
            );
        }
        Ok(())
    }

    /// Writes zeros from `from` up to the configured preallocation (never shrinks).
    fn preallocate(&self, f: &dyn VFile, path: &Path, from: u64) -> Result<()> {
        let want = self.cfg.journal_prealloc_bytes;
        let len = f.len().map_err(|e| Error::io("stat", path, e))?.max(from);
        if len >= want {
            return Ok(());
        }
        let zeros = vec![0u8; 1 << 20];
        let mut pos = len;
        while pos < want {
            let n = (want - pos).min(zeros.len() as u64);
            f.write_all_at(&zeros[..usize::try_from(n).unwrap_or(0)], pos)
                .map_err(|e| Error::io("write", path, e))?;
            pos += n;
        }
        self.sync_file(f, path)
    }

    fn replay(&mut self, entries: Vec<JournalEntry>) -> Result<()> {
        // For each (vbid, commit id) the last record wins: a retried batch supersedes the
        // failed attempt that was journaled before it.
        let mut last: BTreeMap<(u16, u64), JournalEntry> = BTreeMap::new();
        for e in entries {
            last.insert((e.vbid, e.commit_id), e);
        }
        for ((vbid, commit_id), e) in last {
            if self.quarantined.lock().contains_key(&vbid) {
                tracing::error!(
                    vbid,
                    commit_id,
                    documents = e.docs.len(),
                    "journal commit of a quarantined vBucket dropped"
                );
                self.report.journal_commits_dropped += 1;
                continue;
            }
            let vb = self.vb(vbid);
            let mut g = vb.lock();
            let have = g.header.as_ref().map_or(0, |h| h.commit_id);
            if commit_id <= have {
                continue;
            }
            self.apply_entry(&mut g, &e)?;
            self.dirty.lock().insert(vbid);
            self.report.journal_commits_replayed += 1;
        }
        Ok(())
    }

    // ----- writing -----

    /// Cuts a vBucket's file back to its last committed header after a failed write.
    fn repair(&self, g: &mut VbFile) -> Result<()> {
        if !g.needs_repair {
            return Ok(());
        }
        self.fds.forget(&g.path);
        if g.end == 0 {
            match self.vfs.remove(&g.path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("remove", &g.path, e)),
            }
        } else {
            let f = self.fds.get(&g.path, OpenMode::Existing)?;
            f.set_len(g.end)
                .map_err(|e| Error::io("truncate", &g.path, e))?;
        }
        g.needs_repair = false;
        Ok(())
    }

    /// Prepares one vBucket's journal entry: de-duplicated documents in seqno order, the
    /// next commit id and the completed state. The commit's own list is shared when it
    /// already is that (each key once, in seqno order); otherwise the documents are copied.
    fn prepare(g: &VbFile, c: &VbCommit) -> JournalEntry {
        let docs = c.unique_docs();
        JournalEntry {
            vbid: g.vbid,
            commit_id: g.next_commit_id(),
            state: c.completed_state(&docs, g.latest_state().map_or(0, |s| s.purge_seqno)),
            docs,
        }
    }

    /// Appends one commit (documents, a segment, a header) to the vBucket's data file,
    /// without syncing. On failure the vBucket is marked for repair.
    fn apply(
        &self,
        g: &mut VbFile,
        docs: &[&Document],
        commit_id: u64,
        state: &VbState,
    ) -> Result<()> {
        self.repair(g)?;
        let r = self.apply_inner(g, docs, commit_id, state);
        if r.is_err() {
            g.needs_repair = true;
            self.fds.forget(&g.path);
        } else {
            self.publish_usage(g);
        }
        r
    }

    /// As [`FileStore::apply`] for one journal entry.
    fn apply_entry(&self, g: &mut VbFile, e: &JournalEntry) -> Result<()> {
        let docs: Vec<&Document> = e.docs.iter().collect();
        self.apply(g, &docs, e.commit_id, &e.state)
    }

    fn apply_inner(
        &self,
        g: &mut VbFile,
        docs: &[&Document],
        commit_id: u64,
        state: &VbState,
    ) -> Result<()> {
        let f = self.fds.get(&g.path, OpenMode::Create)?;
        let mut buf = Vec::with_capacity(
            docs.iter()
                .map(|d| d.key.len() * 2 + d.value.len() + 96)
                .sum::<usize>()
                + 256,
        );
        if g.end == 0 {
            buf.extend_from_slice(&data_file::superblock(g.vbid, g.rev, g.format_version));
            self.dir_dirty.fetch_add(1, Relaxed);
        }
        let base = g.end;
        let mut keys: Vec<KeyEntry> = Vec::with_capacity(docs.len());
        let mut lens: Vec<(u64, u32)> = Vec::with_capacity(docs.len());
        for &d in docs {
            if d.key.len() > usize::from(u16::MAX) || d.value.len() > (64 << 20) {
                return Err(Error::InvalidArgument(format!(
                    "document too large: key {} bytes, value {} bytes",
                    d.key.len(),
                    d.value.len()
                )));
            }
            let offset = base + buf.len() as u64;
            format::put_frame_with(&mut buf, RecordKind::Document, |out| {
                format::encode_document(out, d);
            });
            let len = u32::try_from(base + buf.len() as u64 - offset).unwrap_or(u32::MAX);
            lens.push((key_hash(&d.key), len));
            keys.push(KeyEntry {
                key: d.key.clone(),
                seqno: d.seqno,
                offset,
                len,
                deleted: d.deleted,
            });
        }
        keys.sort_by(|a, b| a.key.cmp(&b.key));
        let mut segs: Vec<Arc<Segment>> = g.segments.as_ref().clone();
        if !keys.is_empty() {
            // Merge with the previous segments while the new one is at least half their
            // size (tiered merging keeps O(log n) segments).
            while let Some(prev) = segs.last() {
                let n = keys.len() as u64;
                if prev.dir.items > 2 * n && segs.len() < data_file::MAX_SEGMENTS {
                    break;
                }
                let older = data_file::read_all_keys(&*f, &g.path, prev)?;
                keys = data_file::merge_keys(older, keys);
                segs.pop();
            }
            let seg = data_file::put_segment(&mut buf, base, &keys);
            segs.push(Arc::new(seg));
        }
        let header = Header {
            commit_id,
            state: state.clone(),
            segments: segs.iter().map(|s| (s.offset, s.len)).collect(),
        };
        let header_at = buf.len();
        format::put_header(&mut buf, &header);
        let header_bytes = (buf.len() - header_at) as u64;
        f.write_all_at(&buf, base)
            .map_err(|err| Error::io("write", &g.path, err))?;
        self.counters.bytes.fetch_add(buf.len() as u64, Relaxed);
        if self.cfg.journal == JournalMode::Off {
            self.sync_file(&*f, &g.path)?;
            if self.dir_dirty.load(Relaxed) > 0 {
                self.sync_dir()?;
            }
        }
        g.end = base + buf.len() as u64;
        g.header = Some(header);
        g.segments = Arc::new(segs);
        for (h, len) in lens {
            g.acct.put(h, len);
        }
        g.acct.header_bytes = header_bytes;
        Ok(())
    }

    fn commit_locked(&self, journal: &mut Option<Journal>, batch: &[VbCommit]) -> Result<()> {
        {
            let q = self.quarantined.lock();
            if let Some(bad) = batch.iter().find_map(|c| q.get(&c.vbid.0)) {
                return Err(Error::VbucketUnavailable {
                    vbid: bad.vbid.0,
                    reason: bad.error.clone(),
                });
            }
        }
        let mut vbs: Vec<Arc<Mutex<VbFile>>> = Vec::with_capacity(batch.len());
        let mut entries: Vec<JournalEntry> = Vec::with_capacity(batch.len());
        for c in batch {
            let vb = self.vb(c.vbid.0);
            let entry = {
                let mut g = vb.lock();
                self.repair(&mut g)?;
                Self::prepare(&g, c)
            };
            vbs.push(vb);
            entries.push(entry);
        }
        let items: usize = entries.iter().map(|e| e.docs.len()).sum();
        if let Some(j) = journal.as_mut() {
            // Sized up front: the batch is encoded once, into its frame, with no regrowth.
            let approx: usize = entries
                .iter()
                .map(|e| {
                    256 + e
                        .docs
                        .iter()
                        .map(|d| 64 + d.key.len() + d.value.len())
                        .sum::<usize>()
                })
                .sum();
            let mut frame = std::mem::take(&mut j.buf);
            frame.clear();
            frame.reserve(approx + format::FRAME_HEADER_LEN + 16);
            format::put_frame_with(&mut frame, RecordKind::JournalBatch, |out| {
                format::encode_journal_batch(out, j.generation, &entries);
            });
            let written = j
                .file
                .write_all_at(&frame, j.end)
                .map_err(|e| Error::io("write", &j.path, e))
                .and_then(|()| {
                    self.counters.bytes.fetch_add(frame.len() as u64, Relaxed);
                    self.sync_file(&*j.file, &j.path)
                });
            // On failure nothing is acknowledged and `end` stays: the next append
            // overwrites the record at the same offset. (If it did reach the disk and the
            // process dies first, replaying it is harmless: an unacknowledged write may
            // survive.)
            let frame_len = frame.len() as u64;
            if frame.capacity() <= JOURNAL_BUF_KEEP {
                j.buf = frame;
            }
            written?;
            j.end += frame_len;
            self.counters.journal_bytes.store(j.end, Relaxed);
        }
        let journaled = journal.is_some();
        for (vb, entry) in vbs.iter().zip(entries) {
            let mut g = vb.lock();
            if journaled {
                // Durable now; the data file is brought up to date in the background.
                self.pending_bytes.fetch_add(entry_bytes(&entry), Relaxed);
                g.pending.push(entry);
                self.pending_vbs.lock().insert(g.vbid);
            } else {
                self.apply_entry(&mut g, &entry)?;
            }
        }
        self.counters.batches.fetch_add(1, Relaxed);
        self.counters.items.fetch_add(items as u64, Relaxed);
        if self.pending_bytes.load(Relaxed) > MAX_PENDING_BYTES {
            self.apply_pending_upto(usize::MAX)?;
        }
        let over = journal
            .as_ref()
            .is_some_and(|j| j.end > self.cfg.checkpoint_bytes);
        let too_many_dirty = self.fds.budget() > 0 && self.dirty.lock().len() > self.fds.budget();
        if over || too_many_dirty {
            self.checkpoint_locked(journal)?;
        }
        Ok(())
    }

    /// Writes one vBucket's pending commits to its data file, all of them as one commit
    /// (one append, one index segment, one header carrying the last commit's id and state):
    /// the documents of all of them, the newest version of each key.
    fn apply_pending_vb(&self, g: &mut VbFile) -> Result<()> {
        self.repair(g)?;
        let pending = std::mem::take(&mut g.pending);
        if let Some(last) = pending.last() {
            // The last commit's id and state, with the documents of all of them.
            let docs = match pending.as_slice() {
                [only] => only.docs.iter().collect(),
                many => latest_of_entries(many),
            };
            if let Err(err) = self.apply(g, &docs, last.commit_id, &last.state) {
                g.pending = pending;
                return Err(err);
            }
            let bytes: u64 = pending.iter().map(entry_bytes).sum();
            self.pending_bytes.fetch_sub(bytes, Relaxed);
            self.dirty.lock().insert(g.vbid);
        }
        self.pending_vbs.lock().remove(&g.vbid);
        Ok(())
    }

    /// Brings up to `max_vbuckets` data files up to date with commits that are durable in
    /// the journal but not yet written to them (the background half of a journal commit;
    /// the engine runs it on a Writer task). Returns how many vBuckets still have pending
    /// commits.
    ///
    /// # Errors
    /// The first write error; the commit stays pending (it is durable in the journal) and
    /// is retried on the next call.
    fn apply_pending_upto(&self, max_vbuckets: usize) -> Result<usize> {
        let todo: Vec<u16> = self
            .pending_vbs
            .lock()
            .iter()
            .take(max_vbuckets)
            .copied()
            .collect();
        for vbid in todo {
            if let Some(vb) = self.existing_vb(vbid) {
                self.apply_pending_vb(&mut vb.lock())?;
            } else {
                self.pending_vbs.lock().remove(&vbid);
            }
        }
        Ok(self.pending_vbs.lock().len())
    }

    /// Syncs every dirty data file (and the directory). Many of them are synced from
    /// [`CHECKPOINT_SYNC_THREADS`] short-lived threads at once: the disk completes
    /// concurrent fdatasyncs together (1000 small files: 233-314 ms one by one, 87-101 ms
    /// from 8 threads, on the reference VM), and the checkpoint holds the shard's commits.
    fn checkpoint_files(&self) -> Result<()> {
        self.apply_pending_upto(usize::MAX)?;
        let dirty: Vec<u16> = self.dirty.lock().iter().copied().collect();
        let parallel = dirty.len() >= PARALLEL_SYNC_MIN && self.fds.budget() >= PARALLEL_SYNC_MIN;
        if parallel {
            let next = std::sync::atomic::AtomicUsize::new(0);
            let failed: Mutex<Option<Error>> = Mutex::new(None);
            let work = || {
                while failed.lock().is_none() {
                    let Some(&vbid) = dirty.get(next.fetch_add(1, Relaxed)) else {
                        break;
                    };
                    if let Err(e) = self.sync_dirty_vb(vbid) {
                        failed.lock().get_or_insert(e);
                    }
                }
            };
            std::thread::scope(|sc| {
                for i in 1..CHECKPOINT_SYNC_THREADS {
                    // A thread that cannot be started leaves its share to the others.
                    let _ = std::thread::Builder::new()
                        .name(format!("epkv-ckpt-{i}"))
                        .spawn_scoped(sc, work);
                }
                work();
            });
            if let Some(e) = failed.into_inner() {
                return Err(e);
            }
        } else {
            for vbid in dirty {
                self.sync_dirty_vb(vbid)?;
            }
        }
        if self.dir_dirty.load(Relaxed) > 0 {
            self.sync_dir()?;
        }
        Ok(())
    }

    /// Syncs one dirty vBucket's data file and marks it clean.
    fn sync_dirty_vb(&self, vbid: u16) -> Result<()> {
        let Some(vb) = self.existing_vb(vbid) else {
            self.dirty.lock().remove(&vbid);
            return Ok(());
        };
        let g = vb.lock();
        if g.end > 0 && !g.needs_repair {
            let f = self.fds.get(&g.path, OpenMode::Existing)?;
            self.sync_file(&*f, &g.path)?;
        }
        self.dirty.lock().remove(&vbid);
        Ok(())
    }

    fn checkpoint_locked(&self, journal: &mut Option<Journal>) -> Result<()> {
        self.checkpoint_files()?;
        if let Some(j) = journal.as_mut() {
            let sb = SUPERBLOCK_LEN as u64;
            if j.end > sb {
                // Start a new generation: the records of the old one stay on disk (the
                // space is reused) but are never replayed again.
                let generation = j.generation + 1;
                let mut b = Vec::with_capacity(SUPERBLOCK_LEN);
                format::put_superblock(&mut b, RecordKind::JournalSuperblock, 0, generation);
                j.file
                    .write_all_at(&b, 0)
                    .map_err(|e| Error::io("write", &j.path, e))?;
                self.sync_file(&*j.file, &j.path)?;
                j.generation = generation;
                j.end = sb;
            }
            self.counters.journal_bytes.store(j.end, Relaxed);
        }
        self.counters.checkpoints.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Marks `vbid` as being compacted until the guard drops, waiting for a compaction of
    /// it already running.
    fn compacting_guard(&self, vbid: u16) -> CompactingGuard<'_> {
        let mut set = self.compacting.lock();
        while set.contains(&vbid) {
            self.compacting_done.wait(&mut set);
        }
        set.insert(vbid);
        CompactingGuard { store: self, vbid }
    }

    /// Compacts one vBucket while its commits go on (see the module docs): the bulk copy
    /// runs with no lock held; only the snapshot and the catch-up of the commits made
    /// meanwhile hold the vBucket's mutex. `between` runs after the copy, with no lock
    /// held (a test hook to interleave commits deterministically).
    fn compact_vb(
        &self,
        vb: &Arc<Mutex<VbFile>>,
        rule: &PurgeRule,
        pace: &mut dyn FnMut(u64),
        between: &mut dyn FnMut(),
    ) -> Result<CompactionOutcome> {
        // One compaction at a time per vBucket: the next revision's name is taken here.
        // (The vBucket's mutex is released before waiting: the compaction running holds
        // it to switch files.)
        let vbid = vb.lock().vbid;
        let _one = self.compacting_guard(vbid);
        // 1. Snapshot (short lock): the last header and its index, after writing the
        //    vBucket's journaled commits.
        let (vbid, rev, header, view) = {
            let mut g = vb.lock();
            self.apply_pending_vb(&mut g)?;
            let Some(header) = g.header.clone() else {
                return Ok(CompactionOutcome::default());
            };
            let view = ReadView {
                path: g.path.clone(),
                segments: Arc::clone(&g.segments),
            };
            (g.vbid, g.rev, header, view)
        };
        let new_rev = rev + 1;
        let tmp = self.cfg.dir.join(format!("vb_{vbid}.{new_rev}.compact"));
        let dst = self.cfg.dir.join(data_file::file_name(vbid, new_rev));
        let fail = |e: Error| {
            self.fds.forget(&tmp);
            let _ = self.vfs.remove(&tmp);
            e
        };
        // 2. Copy (no lock): the snapshot's bytes never change (the file is append-only
        //    and a repair only cuts bytes after the last header), so commits can append
        //    meanwhile. The copy is synced here, so that the catch-up syncs only its tail.
        let old = self.fds.get(&view.path, OpenMode::Existing)?;
        let (out, end, new_header, seg, acct) = self
            .write_compacted(&*old, &view, &header, rule, vbid, new_rev, &tmp, pace)
            .map_err(fail)?;
        drop(old);
        between();
        // 3. Catch up and switch (lock held): the documents committed since the snapshot
        //    (seqno above its high seqno) are appended to the new file as one commit
        //    carrying the current header's commit id and state.
        let mut g = vb.lock();
        let same = self
            .existing_vb(vbid)
            .is_some_and(|cur| Arc::ptr_eq(&cur, vb))
            && g.rev == rev;
        if !same {
            // The vBucket was deleted (or recreated) meanwhile: its old files are gone.
            return Err(fail(Error::InvalidArgument(format!(
                "vBucket {vbid} was deleted during its compaction"
            ))));
        }
        self.apply_pending_vb(&mut g).map_err(fail)?;
        let Some(current) = g.header.clone() else {
            return Err(fail(Error::InvalidArgument(format!(
                "vBucket {vbid} lost its header during its compaction"
            ))));
        };
        let mut next = VbFile {
            vbid,
            rev: new_rev,
            path: tmp.clone(),
            end,
            header: Some(new_header),
            segments: Arc::new(seg.into_iter().map(Arc::new).collect()),
            needs_repair: false,
            pending: Vec::new(),
            acct,
            format_version: format::FORMAT_VERSION,
        };
        let mut caught_up = 0u64;
        if current.commit_id != header.commit_id {
            let cur_view = ReadView {
                path: g.path.clone(),
                segments: Arc::clone(&g.segments),
            };
            let f = self
                .fds
                .get(&cur_view.path, OpenMode::Existing)
                .map_err(fail)?;
            let mut docs = Vec::new();
            data_file::scan_by_seqno(
                &*f,
                &cur_view,
                header.state.high_seqno + 1,
                u64::MAX,
                &mut |d| {
                    docs.push(d);
                    ScanControl::Continue
                },
            )
            .map_err(fail)?;
            caught_up = docs.len() as u64;
            let mut state = current.state.clone();
            state.purge_seqno = state
                .purge_seqno
                .max(next.header.as_ref().map_or(0, |h| h.state.purge_seqno));
            let refs: Vec<&Document> = docs.iter().collect();
            self.apply_inner(&mut next, &refs, current.commit_id, &state)
                .map_err(fail)?;
            let nf = self.fds.get(&tmp, OpenMode::Existing).map_err(fail)?;
            self.sync_file(&*nf, &tmp).map_err(fail)?;
        }
        self.fds.forget(&tmp);
        if let Err(e) = self.vfs.rename(&tmp, &dst) {
            let _ = self.vfs.remove(&tmp);
            return Err(Error::io("rename", &tmp, e));
        }
        self.sync_dir()?;
        // From here the new revision is the vBucket's file.
        let old_path = std::mem::replace(&mut g.path, dst);
        self.counters
            .reclaimed
            .fetch_add(g.end.saturating_sub(next.end), Relaxed);
        g.rev = new_rev;
        g.end = next.end;
        g.header = next.header;
        g.segments = next.segments;
        g.acct = next.acct;
        g.format_version = next.format_version;
        self.publish_usage(&g);
        self.dirty.lock().remove(&vbid);
        drop(g);
        self.fds.forget(&old_path);
        if let Err(e) = self.vfs.remove(&old_path) {
            tracing::warn!(path = %old_path.display(), error = %e, "compaction: cannot remove the old revision; it is removed at next open");
        }
        self.dir_dirty.fetch_add(1, Relaxed);
        self.counters.compactions.fetch_add(1, Relaxed);
        Ok(CompactionOutcome {
            caught_up,
            bytes_after: next.end,
            ..out
        })
    }

    /// As [`KvStore::compact`], running `between` after the bulk copy with no lock held,
    /// before the commits made meanwhile are caught up: tests use it to interleave
    /// commits with a compaction deterministically.
    ///
    /// # Errors
    /// As [`KvStore::compact`].
    #[doc(hidden)]
    pub fn compact_with(
        &self,
        vbid: Vbid,
        rule: &PurgeRule,
        between: &mut dyn FnMut(),
    ) -> Result<CompactionOutcome> {
        let Some(vb) = self.existing_vb(vbid.0) else {
            return Ok(CompactionOutcome::default());
        };
        self.compact_vb(&vb, rule, &mut |_| {}, between)
    }

    #[expect(clippy::too_many_arguments, reason = "one private step of compaction")]
    fn write_compacted(
        &self,
        old: &dyn VFile,
        view: &ReadView,
        header: &Header,
        rule: &PurgeRule,
        vbid: u16,
        rev: u64,
        tmp: &Path,
        pace: &mut dyn FnMut(u64),
    ) -> Result<(CompactionOutcome, u64, Header, Option<Segment>, Accounting)> {
        let mut out = CompactionOutcome {
            bytes_before: old.len().map_err(|e| Error::io("stat", &view.path, e))?,
            ..CompactionOutcome::default()
        };
        let f = self
            .fds
            .with_room(tmp, || self.vfs.open(tmp, OpenMode::Create))
            .map_err(|e| Error::io("open", tmp, e))?;
        f.set_len(0).map_err(|e| Error::io("truncate", tmp, e))?;
        let mut buf = data_file::superblock(vbid, rev, format::FORMAT_VERSION);
        let mut base = 0u64;
        let mut keys: Vec<KeyEntry> = Vec::new();
        let mut purge_seqno = header.state.purge_seqno;
        let mut io_err: Option<Error> = None;
        let mut body = Vec::new();
        data_file::scan_by_seqno(old, view, 0, u64::MAX, &mut |d| {
            if !out.judge(
                rule,
                &header.state,
                &mut purge_seqno,
                (&d.key, d.seqno, d.deleted, d.expiry),
            ) {
                return ScanControl::Continue;
            }
            let mut d = d;
            if rule.escape_v1_keys
                && let std::borrow::Cow::Owned(k) = format::escape_v1_key(&d.key)
            {
                d.key = k;
            }
            let offset = base + buf.len() as u64;
            body.clear();
            format::encode_document(&mut body, &d);
            format::put_frame(&mut buf, RecordKind::Document, &body);
            keys.push(KeyEntry {
                key: d.key,
                seqno: d.seqno,
                offset,
                len: u32::try_from(base + buf.len() as u64 - offset).unwrap_or(u32::MAX),
                deleted: d.deleted,
            });
            if buf.len() >= COMPACT_CHUNK_BYTES {
                if let Err(e) = f.write_all_at(&buf, base) {
                    io_err = Some(Error::io("write", tmp, e));
                    return ScanControl::Stop;
                }
                self.counters.bytes.fetch_add(buf.len() as u64, Relaxed);
                base += buf.len() as u64;
                pace(buf.len() as u64);
                buf.clear();
            }
            ScanControl::Continue
        })?;
        if let Some(e) = io_err {
            return Err(e);
        }
        keys.sort_by(|a, b| a.key.cmp(&b.key));
        let mut acct = Accounting::default();
        for k in &keys {
            acct.put(key_hash(&k.key), k.len);
        }
        let seg = (!keys.is_empty()).then(|| data_file::put_segment(&mut buf, base, &keys));
        let mut state = header.state.clone();
        state.purge_seqno = purge_seqno;
        let new_header = Header {
            commit_id: header.commit_id,
            state,
            segments: seg.iter().map(|s| (s.offset, s.len)).collect(),
        };
        let header_at = buf.len();
        format::put_header(&mut buf, &new_header);
        acct.header_bytes = (buf.len() - header_at) as u64;
        f.write_all_at(&buf, base)
            .map_err(|e| Error::io("write", tmp, e))?;
        self.counters.bytes.fetch_add(buf.len() as u64, Relaxed);
        pace(buf.len() as u64);
        let end = base + buf.len() as u64;
        self.sync_file(&*f, tmp)?;
        out.bytes_after = end;
        Ok((out, end, new_header, seg, acct))
    }
}

/// What reading a journal found.
#[derive(Debug)]
struct JournalRead {
    /// The current generation's batches, in order.
    entries: Vec<JournalEntry>,
    /// End of the last of them (where the next record goes).
    end: u64,
    /// The superblock's generation.
    generation: u64,
    /// Bytes of a torn record of the current generation after `end` (0 when what follows
    /// is zeros or records of an older generation).
    torn_bytes: u64,
    /// The journal's format version.
    version: u16,
}

/// Reads the current generation's journal batches, up to the first frame that does not
/// verify or belongs to an older generation.
fn read_journal(f: &dyn VFile, path: &Path) -> Result<JournalRead> {
    let len = f.len().map_err(|e| Error::io("stat", path, e))?;
    let sb = SUPERBLOCK_LEN as u64;
    if len < sb {
        // A journal whose creation never completed: nothing in it was acknowledged.
        return Ok(JournalRead {
            entries: Vec::new(),
            end: sb,
            generation: 1,
            torn_bytes: len,
            version: format::FORMAT_VERSION,
        });
    }
    let mut head = vec![0u8; SUPERBLOCK_LEN];
    f.read_exact_at(&mut head, 0)
        .map_err(|e| Error::io("read", path, e))?;
    let body = format::decode_frame_of(&head, RecordKind::JournalSuperblock)
        .map_err(|r| data_file::corrupt(path, 0, r))?;
    let (_, generation, version) = format::decode_superblock(body, RecordKind::JournalSuperblock)
        .map_err(|r| data_file::corrupt(path, 0, r))?;
    let mut out = Vec::new();
    let mut pos = sb;
    let mut fh = [0u8; format::FRAME_HEADER_LEN + 8];
    let mut torn_bytes = 0;
    while pos + fh.len() as u64 <= len {
        f.read_exact_at(&mut fh, pos)
            .map_err(|e| Error::io("read", path, e))?;
        let Ok((kind, blen, _)) = format::parse_frame_header(&fh) else {
            break;
        };
        let gen_bytes: [u8; 8] = fh[format::FRAME_HEADER_LEN..]
            .try_into()
            .unwrap_or_default();
        let ours =
            kind == RecordKind::JournalBatch as u8 && u64::from_le_bytes(gen_bytes) == generation;
        if !ours {
            break;
        }
        let total = format::FRAME_HEADER_LEN as u64 + u64::from(blen);
        if pos + total > len {
            torn_bytes = len - pos;
            break;
        }
        let mut buf = vec![0u8; usize::try_from(total).unwrap_or(0)];
        f.read_exact_at(&mut buf, pos)
            .map_err(|e| Error::io("read", path, e))?;
        let Ok(body) = format::decode_frame_of(&buf, RecordKind::JournalBatch) else {
            torn_bytes = total;
            break;
        };
        match format::decode_journal_batch(body) {
            Ok((_, entries)) => out.extend(entries),
            // A record whose CRC verifies but does not decode was written by a broken
            // build: refuse rather than guess.
            Err(r) => return Err(data_file::corrupt(path, pos, r)),
        }
        pos += total;
    }
    Ok(JournalRead {
        entries: out,
        end: pos,
        generation,
        torn_bytes,
        version,
    })
}

/// Where [`FileStore::lookup`] found a key's newest version.
enum Lookup {
    Absent,
    /// In a journaled commit not yet written to the data file (which cannot be written
    /// now: out of space or descriptors).
    Pending(Document),
    /// In the data file's index: the file, its path and the entry.
    Indexed(Arc<dyn VFile>, PathBuf, KeyEntry),
}

impl FileStore {
    /// Finds `key`'s newest version: in the index (no document read), or in a pending
    /// commit when pending commits cannot be applied.
    fn lookup(&self, vbid: Vbid, key: &[u8]) -> Result<Lookup> {
        let Some(vb) = self.existing_vb(vbid.0) else {
            return Ok(Lookup::Absent);
        };
        let view = {
            let mut g = vb.lock();
            if let Err(e) = self.apply_pending_vb(&mut g) {
                // Out of space or descriptors: the commits that could not be written are
                // durable in the journal and still in memory, so reads keep working.
                if !e.is_temporary() {
                    return Err(e);
                }
                for entry in g.pending.iter().rev() {
                    if let Some(d) = entry.docs.iter().find(|d| d.key == key) {
                        return Ok(Lookup::Pending(d.clone()));
                    }
                }
            }
            if g.header.is_none() {
                return Ok(Lookup::Absent);
            }
            // Reads only follow the last header's index, so bytes a failed write left
            // after it are never looked at.
            ReadView {
                path: g.path.clone(),
                segments: Arc::clone(&g.segments),
            }
        };
        let f = self.fds.get(&view.path, OpenMode::Existing)?;
        Ok(
            match data_file::find_key(&*f, &view.path, &view.segments, key)? {
                Some(e) => Lookup::Indexed(f, view.path, e),
                None => Lookup::Absent,
            },
        )
    }
}

impl KvStore for FileStore {
    fn commit(&self, batch: &[VbCommit]) -> Result<()> {
        let mut j = self.commit_lock.lock();
        let r = self.commit_locked(&mut j, batch);
        if r.is_err() {
            self.counters.failures.fetch_add(1, Relaxed);
        }
        r
    }

    fn get(&self, vbid: Vbid, key: &[u8]) -> Result<Option<Document>> {
        Ok(match self.lookup(vbid, key)? {
            Lookup::Absent => None,
            Lookup::Pending(d) => Some(d),
            Lookup::Indexed(f, path, e) => Some(data_file::read_doc(&*f, &path, e.offset, e.len)?),
        })
    }

    fn key_meta(&self, vbid: Vbid, key: &[u8]) -> Result<Option<KeyMeta>> {
        Ok(match self.lookup(vbid, key)? {
            Lookup::Absent => None,
            Lookup::Pending(d) => Some(KeyMeta {
                key: d.key,
                seqno: d.seqno,
                deleted: d.deleted,
            }),
            Lookup::Indexed(_, _, e) => Some(KeyMeta {
                key: e.key,
                seqno: e.seqno,
                deleted: e.deleted,
            }),
        })
    }

    fn scan_by_seqno(
        &self,
        vbid: Vbid,
        start: u64,
        end: u64,
        visit: &mut dyn FnMut(Document) -> ScanControl,
    ) -> Result<u64> {
        let Some(view) = self.view(vbid.0)? else {
            return Ok(0);
        };
        let f = self.fds.get(&view.path, OpenMode::Existing)?;
        data_file::scan_by_seqno(&*f, &view, start, end, visit)
    }

    fn scan_keys(&self, vbid: Vbid, visit: &mut dyn FnMut(KeyMeta) -> ScanControl) -> Result<u64> {
        let Some(view) = self.view(vbid.0)? else {
            return Ok(0);
        };
        let f = self.fds.get(&view.path, OpenMode::Existing)?;
        data_file::scan_keys(&*f, &view, visit)
    }

    fn vbucket_state(&self, vbid: Vbid) -> Result<Option<VbState>> {
        let Some(vb) = self.existing_vb(vbid.0) else {
            return Ok(None);
        };
        let g = vb.lock();
        Ok(g.latest_state().cloned())
    }

    fn vbuckets(&self) -> Vec<Vbid> {
        // The map's lock is released before any file's is taken: a compaction holds its
        // file's lock while it looks the map up (the order is file, then map).
        let files: Vec<(u16, Arc<Mutex<VbFile>>)> = self
            .vbs
            .lock()
            .iter()
            .map(|(id, f)| (*id, Arc::clone(f)))
            .collect();
        let mut v: Vec<Vbid> = files
            .iter()
            .filter(|(_, f)| f.lock().latest_state().is_some())
            .map(|(id, _)| Vbid(*id))
            .collect();
        v.sort_unstable();
        v
    }

    fn delete_vbucket(&self, vbid: Vbid) -> Result<()> {
        self.delete_vbuckets(&[vbid])
    }

    fn delete_vbuckets(&self, vbids: &[Vbid]) -> Result<()> {
        let mut j = self.commit_lock.lock();
        // The journal must not hold commits of a vBucket whose files are gone.
        self.checkpoint_locked(&mut j)?;
        let mut removed = false;
        for vbid in vbids {
            if self.quarantined.lock().contains_key(&vbid.0) {
                // Every revision of it goes, then it is an ordinary (absent) vBucket.
                let files = self
                    .vfs
                    .list(&self.cfg.dir)
                    .map_err(|e| Error::io("list", &self.cfg.dir, e))?;
                for p in files {
                    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                    if data_file::parse_file_name(name).is_some_and(|(v, _, _)| v == vbid.0) {
                        self.fds.forget(&p);
                        match self.vfs.remove(&p) {
                            Ok(()) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                            Err(e) => return Err(Error::io("remove", &p, e)),
                        }
                        removed = true;
                    }
                }
                self.quarantined.lock().remove(&vbid.0);
                tracing::info!(vbid = vbid.0, "quarantined vBucket deleted");
            }
            let Some(vb) = self.existing_vb(vbid.0) else {
                continue;
            };
            let g = vb.lock();
            self.fds.forget(&g.path);
            match self.vfs.remove(&g.path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("remove", &g.path, e)),
            }
            drop(g);
            self.vbs.lock().remove(&vbid.0);
            self.usage.lock().remove(&vbid.0);
            self.dirty.lock().remove(&vbid.0);
            removed = true;
        }
        if removed {
            self.sync_dir()?;
        }
        Ok(())
    }

    fn compact(&self, vbid: Vbid, rule: &PurgeRule) -> Result<CompactionOutcome> {
        self.compact_with(vbid, rule, &mut || {})
    }

    fn apply_pending(&self, max_vbuckets: usize) -> Result<usize> {
        if self.pending_bytes.load(Relaxed) < self.cfg.apply_after_bytes {
            return Ok(0);
        }
        self.apply_pending_upto(max_vbuckets)
    }

    fn checkpoint(&self) -> Result<()> {
        let mut j = self.commit_lock.lock();
        self.checkpoint_locked(&mut j)
    }

    fn stats(&self) -> StoreStats {
        let c = &self.counters;
        let (data_file_bytes, live_bytes) = {
            let u = self.usage.lock();
            (
                u.values().map(|x| x.file_bytes).sum(),
                u.values().map(|x| x.live_bytes).sum(),
            )
        };
        StoreStats {
            batches: c.batches.load(Relaxed),
            items_flushed: c.items.load(Relaxed),
            syncs: c.syncs.load(Relaxed),
            bytes_written: c.bytes.load(Relaxed),
            journal_bytes: c.journal_bytes.load(Relaxed),
            checkpoints: c.checkpoints.load(Relaxed),
            open_files: self.fds.open_files() as u64,
            file_opens: self.fds.opens(),
            compactions: c.compactions.load(Relaxed),
            commit_failures: c.failures.load(Relaxed),
            data_file_bytes,
            live_bytes,
            bytes_reclaimed: c.reclaimed.load(Relaxed),
            index_bytes: 0,
        }
    }

    fn file_usage(&self) -> Vec<(Vbid, FileUsage)> {
        self.usage
            .lock()
            .iter()
            .map(|(v, u)| (Vbid(*v), *u))
            .collect()
    }
}
