//! [`LogStore`]: the write-once backend of [`KvStore`] for one shard. Each document is
//! written once, into the shard's log; there is no journal to replay and no second copy
//! in per-vBucket data files (which [`crate::FileStore`] keeps), so a commit costs one
//! encoding, one append and one fdatasync, and nothing runs after it.
//!
//! **On disk.** The shard's directory holds numbered log files (`log-00000001.epkv`, ...),
//! appended to in order; the newest is the *head*, and a file past
//! [`LogStoreConfig::file_bytes`] is sealed and a new head started. A file is a superblock
//! and then records: per batch a [`LogHead`] frame (per vBucket: its incarnation, its
//! state and how many documents follow) and the documents as [`RecordKind::Document`]
//! frames, each with its own CRC, so that one can be read alone; [`LogVbDelete`] and
//! [`LogPurge`] frames record vBucket deletions and compactions. See
//! `docs/storage-format.md`.
//!
//! **In memory.** Per vBucket, a map from each key to where its newest version lives
//! (file, offset, length, seqno, expiry, deleted): about 50 bytes plus the key per key.
//! Reads look the key up and read one frame; scans collect and sort the map. The map is
//! rebuilt at open by reading every file in order. Records resolve by content, not by
//! position: a key's newest version is the one with the highest seqno within the
//! vBucket's highest incarnation, and a state is the one with the highest commit sequence
//! number, so that cleaning may copy live records forward in any order.
//!
//! **Cleaning** ([`LogStore::clean`]) reclaims the space of superseded versions, oldest
//! file first: it copies the file's live records (those the map still points to, and the
//! vBucket states last written there) to the head, syncs, and deletes the file. Because
//! files are always cleaned oldest first, a [`LogPurge`] or [`LogVbDelete`] record can be
//! dropped when its file is cleaned: every version it made dead is in that file or an older
//! one (a version is only copied forward while it is live), so none is left to come back.
//! [`KvStore::compact`] of a vBucket does not copy anything: it writes a [`LogPurge`] of
//! what the rule drops and removes it from the map; cleaning reclaims the bytes later.
//!
//! **Failures.** A failed write or sync fails the commit (nothing is acknowledged); the
//! head is cut back to its last committed length before the next append. At open, a batch
//! that does not verify at the end of the head (a torn write) is cut off. Damage anywhere
//! else sets the whole store aside ([`LogStore::damage`]): which vBuckets the damaged
//! records held is unknown, so it serves none, refuses writes, and keeps its files until
//! [`LogStore::reset`] deletes them.
//!
//! **Locking.** `head` (the commit lock: appends, rolls, deletions, compactions) → `index`
//! (the maps, read-locked by reads) → `files` (open handles). Cleaning holds `clean` for
//! its whole run and the head and index only while it appends a chunk of copies.

use crate::error::{Error, Result};
use crate::fd_cache::{FdCache, default_fd_budget};
use crate::format::{
    self, LogHead, LogHeadEntry, LogPurge, LogVbDelete, RecordKind, SUPERBLOCK_LEN,
};
use crate::key_table::{KEY_INLINE, KeyTable, Tag};
use crate::kv_store::KvStore;
use crate::prefetch;
use crate::types::{
    CompactionOutcome, Document, KeyMeta, PurgeRule, ScanControl, StoreStats, VbCommit, VbState,
};
use crate::vfs::{DIRECT_ALIGN, OpenMode, RealFs, VFile, Vfs};
use epkv_types::Vbid;
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Settings of one [`LogStore`].
#[derive(Debug, Clone)]
pub struct LogStoreConfig {
    /// Directory holding this shard's log files (created if missing).
    pub dir: PathBuf,
    /// Size past which the head is sealed and a new file started (default 8 MiB).
    /// Cleaning reclaims a file at a time, oldest first: small files make the oldest one
    /// mostly garbage (each live record copied costs a write), large ones mean fewer
    /// files (descriptors are cached under [`LogStoreConfig::fd_cache`]'s budget).
    pub file_bytes: u64,
    /// The descriptor cache reads go through, shared with other shards; `None` makes one
    /// with [`default_fd_budget`].
    pub fd_cache: Option<Arc<FdCache>>,
    /// Append with direct I/O (`O_DIRECT`, bypassing the page cache) where the file
    /// system allows it (default true; see `LogStore::write_at_end`). Reads always go
    /// through the page cache.
    pub direct_io: bool,
}

impl LogStoreConfig {
    /// The default [`LogStoreConfig::file_bytes`]: 8 MiB.
    pub const DEFAULT_FILE_BYTES: u64 = 8 << 20;

    /// Defaults for `dir`.
    #[must_use]
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            file_bytes: Self::DEFAULT_FILE_BYTES,
            fd_cache: None,
            direct_io: true,
        }
    }

    /// The descriptor cache to read through: the shared one, or one of the default
    /// budget over `vfs`.
    fn fds(&self, vfs: &Arc<dyn Vfs>) -> Arc<FdCache> {
        self.fd_cache
            .clone()
            .unwrap_or_else(|| Arc::new(FdCache::new(Arc::clone(vfs), default_fd_budget())))
    }
}

/// What opening a log store found and repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogRecoveryReport {
    /// Files read.
    pub files: u64,
    /// Records (batches, deletions, purges) read.
    pub records: u64,
    /// Bytes of a torn batch cut off the end of the head.
    pub torn_bytes: u64,
}

/// What a cleaning run did ([`LogStore::clean`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanOutcome {
    /// Files deleted.
    pub files: u64,
    /// Live documents copied forward.
    pub copied: u64,
    /// Bytes the deleted files held.
    pub bytes_before: u64,
    /// Bytes written for the copies.
    pub bytes_written: u64,
}

/// Where a key's newest version lives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Loc {
    pub(crate) file: u32,
    pub(crate) len: u32,
    pub(crate) offset: u64,
    pub(crate) seqno: u64,
    pub(crate) expiry: u32,
    pub(crate) deleted: bool,
}

/// One vBucket's part of the index.
#[derive(Debug, Default)]
struct VbIndex {
    incarnation: u64,
    /// The state and the commit sequence number and file it was written with.
    state: Option<VbState>,
    state_seq: u64,
    state_file: u32,
    keys: KeyTable,
    /// Bytes of the frames `keys` points to.
    live_bytes: u64,
    /// Heap bytes of the keys too long to be stored inline.
    heap_key_bytes: u64,
}

/// Heap bytes a key of `len` bytes takes in the index besides its map entry.
fn heap_bytes(len: usize) -> u64 {
    if len > KEY_INLINE { len as u64 } else { 0 }
}

impl VbIndex {
    /// Points `key` at `loc` unless a newer version is already stored, and counts the
    /// bytes in this vBucket. Returns `None` when it did not, else the place the key had
    /// (whose bytes are now garbage in their file).
    fn place(&mut self, key: &[u8], loc: Loc) -> Option<Option<Loc>> {
        self.place_tagged(key, KeyTable::tag(key), loc)
    }

    /// [`Self::place`] with `key`'s tag ([`KeyTable::tag`]).
    fn place_tagged(&mut self, key: &[u8], t: Tag, loc: Loc) -> Option<Option<Loc>> {
        let old = match self.keys.get_mut_tagged(key, t) {
            Some(cur) if cur.seqno > loc.seqno => return None,
            Some(cur) => Some(std::mem::replace(cur, loc)),
            None => {
                self.keys.insert_tagged(key, t, loc);
                self.heap_key_bytes += heap_bytes(key.len());
                None
            }
        };
        self.live_bytes += u64::from(loc.len);
        if let Some(old) = old {
            self.live_bytes -= u64::from(old.len);
        }
        Some(old)
    }

    /// Takes `state`, written with commit sequence `seq` into `file`, unless a newer state
    /// is held.
    fn set_state(&mut self, seq: u64, file: u32, state: VbState) {
        if self.state.is_none() || seq >= self.state_seq {
            self.state = Some(state);
            self.state_seq = seq;
            self.state_file = file;
        }
    }

    /// Bytes of memory the vBucket's index takes: the table's slots and the long keys'
    /// heap.
    fn memory_bytes(&self) -> u64 {
        (self.keys.capacity() * KeyTable::SLOT_BYTES) as u64 + self.heap_key_bytes
    }
}

/// Bytes of one log file: its committed length and how many of them are live.
#[derive(Debug, Clone, Copy, Default)]
struct FileStat {
    bytes: u64,
    live: u64,
}

#[derive(Debug, Default)]
struct Index {
    vbs: HashMap<u16, VbIndex, foldhash::fast::RandomState>,
    files: BTreeMap<u32, FileStat>,
}

impl Index {
    /// Points `key` at `loc` if that is newer than what it points to; accounts the bytes.
    /// Returns whether it did.
    fn put(&mut self, vbid: u16, key: &[u8], loc: Loc) -> bool {
        let Some(old) = self.vbs.get_mut(&vbid).and_then(|vb| vb.place(key, loc)) else {
            return false;
        };
        if let Some(old) = old
            && let Some(f) = self.files.get_mut(&old.file)
        {
            f.live = f.live.saturating_sub(u64::from(old.len));
        }
        self.files.entry(loc.file).or_default().live += u64::from(loc.len);
        true
    }

    /// Removes `key`'s version if its seqno is at or below `seqno`.
    fn kill(&mut self, vbid: u16, key: &[u8], seqno: u64) {
        let Some(vb) = self.vbs.get_mut(&vbid) else {
            return;
        };
        if vb.keys.get(key).is_some_and(|l| l.seqno <= seqno)
            && let Some(old) = vb.keys.remove(key)
        {
            vb.heap_key_bytes -= heap_bytes(key.len());
            vb.live_bytes -= u64::from(old.len);
            if let Some(f) = self.files.get_mut(&old.file) {
                f.live = f.live.saturating_sub(u64::from(old.len));
            }
        }
    }

    /// Drops a vBucket's entry and the liveness of everything it pointed to.
    fn drop_vb(&mut self, vbid: u16) -> Option<VbIndex> {
        let vb = self.vbs.remove(&vbid)?;
        for l in vb.keys.values() {
            if let Some(f) = self.files.get_mut(&l.file) {
                f.live = f.live.saturating_sub(u64::from(l.len));
            }
        }
        Some(vb)
    }

    fn set_state(&mut self, vbid: u16, seq: u64, file: u32, state: VbState) {
        if let Some(vb) = self.vbs.get_mut(&vbid) {
            vb.set_state(seq, file, state);
        }
    }
}

/// The file being appended to.
struct Head {
    num: u32,
    file: Arc<dyn VFile>,
    path: PathBuf,
    /// Committed length: the next record goes here.
    end: u64,
    /// A failed append may have left bytes past `end`: cut them off before the next one.
    dirty_tail: bool,
    /// Copies appended by cleaning and not yet synced.
    unsynced: bool,
    next_seq: u64,
    next_incarnation: u64,
    /// The record buffer, kept between commits.
    buf: Vec<u8>,
    /// The head file's direct-write handle, when the file system does direct I/O (see
    /// [`LogStore::write_at_end`]).
    direct: Option<Arc<dyn VFile>>,
    /// The head's bytes from the last [`DIRECT_ALIGN`] boundary to `end`.
    tail: Vec<u8>,
    /// Aligned scratch memory for direct writes.
    dbuf: Vec<u8>,
}

impl std::fmt::Debug for Head {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Head")
            .field("num", &self.num)
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Counters {
    batches: AtomicU64,
    items: AtomicU64,
    syncs: AtomicU64,
    bytes: AtomicU64,
    compactions: AtomicU64,
    failures: AtomicU64,
    reclaimed: AtomicU64,
}

/// Record buffers larger than this are not kept between commits.
const BUF_KEEP: usize = 4 << 20;

/// How many documents ahead a commit hints the key and value it will copy next (see
/// [`prefetch`]).
const PREFETCH_AHEAD: usize = 4;

/// How many documents ahead a commit hints the index slot it will look up next (see
/// [`KeyTable::hint`]).
const HINT_AHEAD: usize = 8;
/// Bytes of copies cleaning appends at a time (and between calls of its pacing callback).
const CLEAN_CHUNK: usize = 1 << 20;

/// The write-once store of one shard (see the module documentation).
pub struct LogStore {
    cfg: LogStoreConfig,
    vfs: Arc<dyn Vfs>,
    head: Mutex<Head>,
    index: RwLock<Index>,
    /// Descriptors of the files read (the head's own is in `head`).
    fds: Arc<FdCache>,
    /// Held by a cleaning run; keeps the buffer it reads files into while cleaning goes
    /// on (a fresh 8 MiB buffer per file cost page faults and zeroing: 1.5% of the
    /// server's CPU under a full-speed overwrite load). Freed when a run finds nothing
    /// to clean.
    clean: Mutex<Vec<u8>>,
    counters: Counters,
    report: LogRecoveryReport,
    /// Damage found at open in a sealed file: the store then holds nothing and refuses
    /// writes until [`LogStore::reset`].
    damage: Mutex<Option<Damage>>,
}

/// Damage found at open in the middle of a shard's log: the file, the offset of the first
/// record that does not verify, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// The damaged file.
    pub path: PathBuf,
    /// Offset of the first bad record.
    pub offset: u64,
    /// The error, as logged.
    pub error: String,
}

impl std::fmt::Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("dir", &self.cfg.dir)
            .field("head", &*self.head.lock())
            .finish_non_exhaustive()
    }
}

fn file_name(num: u32) -> String {
    format!("log-{num:08}.epkv")
}

fn parse_file_name(p: &Path) -> Option<u32> {
    let name = p.file_name()?.to_str()?;
    let digits = name.strip_prefix("log-")?.strip_suffix(".epkv")?;
    if digits.len() != 8 {
        return None;
    }
    digits.parse().ok()
}

/// One document of a batch being encoded or read: its vBucket, key and place.
#[derive(Clone, Copy)]
struct Placed<'a> {
    vbid: u16,
    key: &'a [u8],
    loc: Loc,
}

/// One vBucket's records cleaning copies in a chunk: its head entry, and each live
/// document with its index tag and its frame's bytes.
type CopyEntry<'a> = (LogHeadEntry, Vec<(Placed<'a>, Tag, &'a [u8])>);

/// What reading one file found.
struct FileScan {
    /// Length up to the end of the last record that verified.
    valid_end: u64,
    /// Length of the file.
    len: u64,
    /// The first record that did not verify: offset and reason.
    bad: Option<(u64, format::DecodeError)>,
}

/// A parsed record of a log file.
enum Record<'a> {
    Batch(LogHead, Vec<Placed<'a>>),
    VbDelete(LogVbDelete),
    Purge(LogPurge),
}

/// Parses the record at `pos` of a file held in `buf` (`buf[0]` is offset 0); returns it
/// and the offset after it, `None` at zeros or the end, or the reason it does not verify.
/// With `verify_docs` false the documents' CRCs are not checked (their lengths, kinds
/// and metadata are): the caller checks the ones it uses ([`format::verify_frame`]).
fn parse_record(
    buf: &[u8],
    file: u32,
    pos: usize,
    verify_docs: bool,
) -> Result<Option<(Record<'_>, usize)>, format::DecodeError> {
    let rest = &buf[pos..];
    if rest.is_empty() || rest.iter().take(format::FRAME_HEADER_LEN).all(|&b| b == 0) {
        return Ok(None);
    }
    let (kind, body, used) = format::decode_frame(rest)?;
    let mut at = pos + used;
    let rec = match kind {
        RecordKind::LogHead => {
            let head = format::decode_log_head(body)?;
            let mut docs = Vec::new();
            for e in &head.entries {
                for _ in 0..e.docs {
                    let (k, b, n) = if verify_docs {
                        format::decode_frame(&buf[at..])?
                    } else {
                        format::split_frame(&buf[at..])?
                    };
                    if k != RecordKind::Document {
                        return Err(format::DecodeError::Invalid("log batch document kind"));
                    }
                    let m = format::decode_document_meta(b)?;
                    docs.push(Placed {
                        vbid: e.vbid,
                        key: m.key,
                        loc: Loc {
                            file,
                            len: u32::try_from(n).unwrap_or(u32::MAX),
                            offset: at as u64,
                            seqno: m.seqno,
                            expiry: m.expiry,
                            deleted: m.deleted,
                        },
                    });
                    at += n;
                }
            }
            Record::Batch(head, docs)
        }
        RecordKind::LogVbDelete => Record::VbDelete(format::decode_log_vb_delete(body)?),
        RecordKind::LogPurge => Record::Purge(format::decode_log_purge(body)?),
        _ => return Err(format::DecodeError::Invalid("log record kind")),
    };
    Ok(Some((rec, at)))
}

/// Whether a record that verifies starts anywhere after `bad` in `buf`: then the bad record
/// at `bad` is damage, not a torn tail (appends are sequential and a failed one is cut off
/// before the next, so nothing valid can follow the batch a crash tore).
fn record_after(buf: &[u8], bad: u64) -> bool {
    let start = usize::try_from(bad).unwrap_or(usize::MAX).saturating_add(1);
    (start..buf.len()).any(|pos| {
        matches!(
            RecordKind::from_u8(buf[pos]),
            Some(RecordKind::LogHead | RecordKind::LogVbDelete | RecordKind::LogPurge)
        ) && format::decode_frame(&buf[pos..]).is_ok()
    })
}

/// The tail after appending `buf` to a file whose tail was `tail`: the bytes since the
/// last [`DIRECT_ALIGN`] boundary.
fn next_tail(tail: &[u8], buf: &[u8]) -> Vec<u8> {
    let keep = (tail.len() + buf.len()) % DIRECT_ALIGN;
    if keep <= buf.len() {
        buf[buf.len() - keep..].to_vec()
    } else {
        let from_tail = keep - buf.len();
        let mut t = tail[tail.len() - from_tail..].to_vec();
        t.extend_from_slice(buf);
        t
    }
}

/// A file's bytes from the last [`DIRECT_ALIGN`] boundary at or below `end` to `end`.
fn read_tail(f: &dyn VFile, path: &Path, end: u64) -> Result<Vec<u8>> {
    let start = end - end % DIRECT_ALIGN as u64;
    let mut t = vec![0u8; usize::try_from(end - start).unwrap_or(0)];
    f.read_exact_at(&mut t, start)
        .map_err(|e| Error::io("read", path, e))?;
    Ok(t)
}

/// `len` bytes of `scratch` starting at a [`DIRECT_ALIGN`]-aligned address (a direct
/// write's buffer must be aligned; no unsafe allocation for it).
fn aligned_block(scratch: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if scratch.len() < len + DIRECT_ALIGN {
        scratch.resize(len + DIRECT_ALIGN, 0);
    }
    let off = scratch.as_ptr().align_offset(DIRECT_ALIGN);
    &mut scratch[off..off + len]
}

fn read_whole(f: &dyn VFile, path: &Path) -> Result<Vec<u8>> {
    let len = f.len().map_err(|e| Error::io("stat", path, e))?;
    let len = usize::try_from(len).map_err(|_| Error::InvalidArgument("file too large".into()))?;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, 0)
        .map_err(|e| Error::io("read", path, e))?;
    Ok(buf)
}

/// State of recovery across files: the highest sequence and incarnation seen, and which
/// incarnations of each vBucket are dead.
#[derive(Default)]
struct Replay {
    max_seq: u64,
    max_incarnation: u64,
    dead_upto: HashMap<u16, u64>,
    records: u64,
}

impl Replay {
    /// Whether records of `vbid` at `incarnation` count, making room for a newer
    /// incarnation in `index`.
    fn admit(&mut self, index: &mut Index, vbid: u16, incarnation: u64) -> bool {
        self.max_incarnation = self.max_incarnation.max(incarnation);
        if self.dead_upto.get(&vbid).is_some_and(|&d| incarnation <= d) {
            return false;
        }
        match index.vbs.get(&vbid).map(|v| v.incarnation) {
            Some(cur) if cur > incarnation => false,
            Some(cur) if cur == incarnation => true,
            _ => {
                index.drop_vb(vbid);
                index.vbs.insert(
                    vbid,
                    VbIndex {
                        incarnation,
                        ..VbIndex::default()
                    },
                );
                true
            }
        }
    }

    fn apply(&mut self, index: &mut Index, file: u32, rec: Record<'_>) {
        self.records += 1;
        match rec {
            Record::Batch(head, docs) => {
                self.max_seq = self.max_seq.max(head.seq);
                let mut admitted: smallvec::SmallVec<[(u16, bool); 8]> = smallvec::SmallVec::new();
                for e in head.entries {
                    let ok = self.admit(index, e.vbid, e.incarnation);
                    admitted.push((e.vbid, ok));
                    if ok && let Some((seq, st)) = e.state {
                        self.max_seq = self.max_seq.max(seq);
                        index.set_state(e.vbid, seq, file, st);
                    }
                }
                for d in docs {
                    if admitted.iter().any(|&(v, ok)| ok && v == d.vbid) {
                        index.put(d.vbid, d.key, d.loc);
                    }
                }
            }
            Record::VbDelete(d) => {
                self.max_incarnation = self.max_incarnation.max(d.incarnation);
                let e = self.dead_upto.entry(d.vbid).or_default();
                *e = (*e).max(d.incarnation);
                if index
                    .vbs
                    .get(&d.vbid)
                    .is_some_and(|v| v.incarnation <= d.incarnation)
                {
                    index.drop_vb(d.vbid);
                }
            }
            Record::Purge(p) => {
                self.max_seq = self.max_seq.max(p.seq);
                if self.admit(index, p.vbid, p.incarnation) {
                    for (k, s) in &p.keys {
                        index.kill(p.vbid, k, *s);
                    }
                    index.set_state(p.vbid, p.seq, file, p.state);
                }
            }
        }
    }
}

impl LogStore {
    /// Opens (or creates) the shard in `cfg.dir` on the real file system, reading every
    /// log file to rebuild the index. A torn last write is cut off; damage anywhere else
    /// opens the store set aside ([`LogStore::damage`]).
    ///
    /// # Errors
    /// I/O errors.
    pub fn open(cfg: LogStoreConfig) -> Result<Self> {
        Self::open_with(cfg, Arc::new(RealFs))
    }

    /// As [`LogStore::open`] over any [`Vfs`] (such as [`crate::FaultFs`]).
    ///
    /// # Errors
    /// As [`LogStore::open`].
    pub fn open_with(cfg: LogStoreConfig, vfs: Arc<dyn Vfs>) -> Result<Self> {
        vfs.create_dir_all(&cfg.dir)
            .map_err(|e| Error::io("mkdir", &cfg.dir, e))?;
        let mut nums: Vec<(u32, PathBuf)> = vfs
            .list(&cfg.dir)
            .map_err(|e| Error::io("list", &cfg.dir, e))?
            .into_iter()
            .filter_map(|p| parse_file_name(&p).map(|n| (n, p)))
            .collect();
        nums.sort_unstable();
        let mut report = LogRecoveryReport::default();
        let mut index = Index::default();
        let mut replay = Replay::default();
        let fds = cfg.fds(&vfs);
        let mut head_file: Option<Arc<dyn VFile>> = None;
        let mut last_end = 0u64;
        let last = nums.last().map(|(n, _)| *n);
        for (num, path) in &nums {
            let f = vfs
                .open(path, OpenMode::Existing)
                .map_err(|e| Error::io("open", path, e))?;
            let buf = read_whole(&*f, path)?;
            report.files += 1;
            let scan = Self::replay_file(&buf, *num, &mut index, &mut replay);
            let is_last = Some(*num) == last;
            let bad = match scan.bad {
                Some((offset, reason)) if !is_last || record_after(&buf, offset) => {
                    Some((offset, reason))
                }
                // Zeros where a frame header should be end a file's records (a torn or
                // padded tail); with a record after them they are a hole, not an end.
                None if scan.valid_end < scan.len && record_after(&buf, scan.valid_end) => Some((
                    scan.valid_end,
                    format::DecodeError::Invalid("zeros before a valid record"),
                )),
                _ => None,
            };
            if let Some((offset, reason)) = bad {
                // Which vBuckets the damaged records held is unknown, so none of the
                // shard's is served: the store opens empty, set aside, its files kept.
                let error = Error::Corrupt {
                    path: path.clone(),
                    offset,
                    reason,
                }
                .to_string();
                return Self::damaged(
                    cfg,
                    vfs,
                    report,
                    Damage {
                        path: path.clone(),
                        offset,
                        error,
                    },
                );
            }
            if is_last {
                if scan.valid_end < scan.len {
                    // Torn: the batch being written when the process died (or zeros past
                    // a short write). Nothing of it was acknowledged.
                    let torn = scan.len - scan.valid_end;
                    if buf[usize::try_from(scan.valid_end).unwrap_or(usize::MAX)..]
                        .iter()
                        .any(|&b| b != 0)
                    {
                        report.torn_bytes = torn;
                    }
                    f.set_len(scan.valid_end)
                        .map_err(|e| Error::io("truncate", path, e))?;
                    f.sync_data().map_err(|e| Error::io("sync", path, e))?;
                }
                last_end = scan.valid_end;
            }
            index.files.entry(*num).or_default().bytes = scan.valid_end;
            if is_last {
                head_file = Some(f);
            }
        }
        let (num, file, path, end) = match (nums.last(), head_file) {
            (Some((n, p)), Some(f)) if last_end >= SUPERBLOCK_LEN as u64 => {
                (*n, f, p.clone(), last_end)
            }
            (other, _) => {
                // No file, or a head whose superblock never made it: start one.
                let n = other.map_or(1, |(n, _)| *n);
                let path = cfg.dir.join(file_name(n));
                let f = Self::create_file(&*vfs, &cfg.dir, &path, n)?;
                index.files.entry(n).or_default().bytes = SUPERBLOCK_LEN as u64;
                (n, f, path, SUPERBLOCK_LEN as u64)
            }
        };
        report.records = replay.records;
        let store = Self {
            cfg,
            vfs,
            head: Mutex::new(Head {
                num,
                file,
                path,
                end,
                dirty_tail: false,
                unsynced: false,
                next_seq: replay.max_seq + 1,
                next_incarnation: replay.max_incarnation + 1,
                buf: Vec::new(),
                direct: None,
                tail: Vec::new(),
                dbuf: Vec::new(),
            }),
            index: RwLock::new(index),
            fds,
            clean: Mutex::new(Vec::new()),
            counters: Counters::default(),
            report,
            damage: Mutex::new(None),
        };
        {
            let mut h = store.head.lock();
            let end = h.end;
            store.attach_head(&mut h, end);
        }
        Ok(store)
    }

    /// A store set aside for `damage`: empty, refusing writes, files untouched.
    fn damaged(
        cfg: LogStoreConfig,
        vfs: Arc<dyn Vfs>,
        report: LogRecoveryReport,
        damage: Damage,
    ) -> Result<Self> {
        let path = damage.path.clone();
        let file = vfs
            .open(&path, OpenMode::Existing)
            .map_err(|e| Error::io("open", &path, e))?;
        let fds = cfg.fds(&vfs);
        Ok(Self {
            cfg,
            vfs,
            head: Mutex::new(Head {
                num: 0,
                file,
                path,
                end: 0,
                dirty_tail: false,
                unsynced: false,
                next_seq: 1,
                next_incarnation: 1,
                buf: Vec::new(),
                direct: None,
                tail: Vec::new(),
                dbuf: Vec::new(),
            }),
            index: RwLock::new(Index::default()),
            fds,
            clean: Mutex::new(Vec::new()),
            counters: Counters::default(),
            report,
            damage: Mutex::new(Some(damage)),
        })
    }

    /// The damage found at open, if the store was set aside for it.
    pub fn damage(&self) -> Option<Damage> {
        self.damage.lock().clone()
    }

    /// Fails while the store is set aside for damage.
    fn check_usable(&self, vbid: u16) -> Result<()> {
        match &*self.damage.lock() {
            Some(d) => Err(Error::VbucketUnavailable {
                vbid,
                reason: d.error.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Deletes every log file and starts empty (FLUSH of the whole shard); the way out of
    /// a damaged store.
    ///
    /// # Errors
    /// I/O errors.
    pub fn reset(&self) -> Result<()> {
        let _c = self.clean.lock();
        let mut h = self.head.lock();
        for p in self
            .vfs
            .list(&self.cfg.dir)
            .map_err(|e| Error::io("list", &self.cfg.dir, e))?
        {
            if parse_file_name(&p).is_some() {
                self.fds.forget(&p);
                self.vfs
                    .remove(&p)
                    .map_err(|e| Error::io("remove", &p, e))?;
            }
        }
        let num = h.num.max(1) + 1;
        let path = self.cfg.dir.join(file_name(num));
        let f = Self::create_file(&*self.vfs, &self.cfg.dir, &path, num)?;
        let mut ix = self.index.write();
        *ix = Index::default();
        ix.files.entry(num).or_default().bytes = SUPERBLOCK_LEN as u64;
        h.num = num;
        h.file = f;
        h.path = path;
        h.end = SUPERBLOCK_LEN as u64;
        h.dirty_tail = false;
        h.unsynced = false;
        self.attach_head(&mut h, SUPERBLOCK_LEN as u64);
        *self.damage.lock() = None;
        Ok(())
    }

    /// Reads one file's records into the index.
    fn replay_file(buf: &[u8], num: u32, index: &mut Index, replay: &mut Replay) -> FileScan {
        let len = buf.len() as u64;
        let sb = match format::decode_frame(buf) {
            Ok((RecordKind::LogSuperblock, body, used)) => {
                format::decode_superblock(body, RecordKind::LogSuperblock).map(|_| used)
            }
            Ok(_) => Err(format::DecodeError::Invalid("log superblock kind")),
            Err(e) => Err(e),
        };
        let mut pos = match sb {
            Ok(used) => used,
            Err(e) => {
                return FileScan {
                    valid_end: 0,
                    len,
                    bad: (len > 0).then_some((0, e)),
                };
            }
        };
        loop {
            match parse_record(buf, num, pos, true) {
                Ok(None) => {
                    return FileScan {
                        valid_end: pos as u64,
                        len,
                        bad: None,
                    };
                }
                Ok(Some((rec, next))) => {
                    replay.apply(index, num, rec);
                    pos = next;
                }
                Err(e) => {
                    return FileScan {
                        valid_end: pos as u64,
                        len,
                        bad: Some((pos as u64, e)),
                    };
                }
            }
        }
    }

    fn create_file(vfs: &dyn Vfs, dir: &Path, path: &Path, num: u32) -> Result<Arc<dyn VFile>> {
        let f = vfs
            .open(path, OpenMode::Create)
            .map_err(|e| Error::io("open", path, e))?;
        f.set_len(0).map_err(|e| Error::io("truncate", path, e))?;
        let mut sb = Vec::with_capacity(SUPERBLOCK_LEN);
        format::put_superblock(&mut sb, RecordKind::LogSuperblock, 0, u64::from(num));
        f.write_all_at(&sb, 0)
            .map_err(|e| Error::io("write", path, e))?;
        f.sync_data().map_err(|e| Error::io("sync", path, e))?;
        vfs.sync_dir(dir).map_err(|e| Error::io("sync", dir, e))?;
        Ok(f)
    }

    /// What opening the store found.
    pub fn recovery_report(&self) -> &LogRecoveryReport {
        &self.report
    }

    /// The shard's directory.
    pub fn dir(&self) -> &Path {
        &self.cfg.dir
    }

    /// Bytes of all log files, and how many of them are live.
    pub fn usage(&self) -> (u64, u64) {
        let ix = self.index.read();
        ix.files
            .values()
            .fold((0, 0), |(b, l), f| (b + f.bytes, l + f.live))
    }

    /// Bytes of memory the key index takes (all vBuckets).
    pub fn index_bytes(&self) -> u64 {
        self.index
            .read()
            .vbs
            .values()
            .map(VbIndex::memory_bytes)
            .sum()
    }

    /// Syncs and closes the store.
    ///
    /// # Errors
    /// I/O errors of the final sync.
    pub fn close(self) -> Result<()> {
        if self.damage.lock().is_some() {
            return Ok(());
        }
        let h = self.head.lock();
        self.trim_padding(&h)?;
        h.file
            .sync_data()
            .map_err(|e| Error::io("sync", &h.path, e))
    }

    fn sync(&self, f: &dyn VFile, path: &Path) -> Result<()> {
        self.counters.syncs.fetch_add(1, Relaxed);
        f.sync_data().map_err(|e| Error::io("sync", path, e))
    }

    /// Makes the head ready for an append of about `bytes`: cuts off a failed append's
    /// bytes, and seals the head for a new file when it is full.
    fn prepare_head(&self, h: &mut Head, bytes: u64) -> Result<()> {
        if h.dirty_tail {
            h.file
                .set_len(h.end)
                .map_err(|e| Error::io("truncate", &h.path, e))?;
            h.dirty_tail = false;
        }
        if h.end > SUPERBLOCK_LEN as u64 && h.end + bytes > self.cfg.file_bytes {
            // Direct appends leave zeros up to the next block boundary (also when they
            // fell back to buffered ones since): the sealed file is cut to its last
            // record, synced before the next file exists, so open never finds zeros at
            // the end of a sealed file.
            if self.trim_padding(h)? {
                h.unsynced = true;
            }
            if h.unsynced {
                self.sync(&*h.file, &h.path)?;
                h.unsynced = false;
            }
            let num = h.num + 1;
            let path = self.cfg.dir.join(file_name(num));
            let f = Self::create_file(&*self.vfs, &self.cfg.dir, &path, num)?;
            self.index.write().files.entry(num).or_default().bytes = SUPERBLOCK_LEN as u64;
            h.num = num;
            h.file = f;
            h.path = path;
            h.end = SUPERBLOCK_LEN as u64;
            self.attach_head(h, SUPERBLOCK_LEN as u64);
        }
        Ok(())
    }

    /// Appends `buf` at the head's end (synced if `sync`) and moves the end past it; on
    /// failure the head's tail is cut off before the next append.
    fn append(&self, h: &mut Head, buf: &[u8], sync: bool) -> Result<()> {
        let r = self
            .write_at_end(h, buf)
            .map_err(|e| Error::io("write", &h.path, e))
            .and_then(|()| {
                self.counters.bytes.fetch_add(buf.len() as u64, Relaxed);
                if sync {
                    self.sync(&*h.file, &h.path)
                } else {
                    Ok(())
                }
            });
        match r {
            Ok(()) => {
                h.tail = next_tail(&h.tail, buf);
                h.end += buf.len() as u64;
            }
            Err(_) => {
                h.dirty_tail = true;
                self.counters.failures.fetch_add(1, Relaxed);
            }
        }
        r
    }

    /// Writes `buf` at the head's end: directly when the head has a direct handle, else
    /// through the page cache.
    ///
    /// A direct write must start and end on [`DIRECT_ALIGN`] boundaries, so it starts at
    /// the boundary at or below the end, writing the head's tail (the committed bytes
    /// since that boundary) again, unchanged, then `buf`, then zeros up to the next
    /// boundary; the next append overwrites the zeros, and open cuts them off the last
    /// file (sealed files are cut to their end when the head moves on). Rewriting the
    /// tail risks nothing a buffered append does not: the page cache writes back the
    /// whole page holding the previous append's last bytes too, and those bytes are the
    /// same in the old and the new version of the block.
    ///
    /// Why: the page cache's per-page work (the copy, block reservation, writeback) was a
    /// quarter of the Writer threads' CPU at 50k SETs/s; a direct append of a 400 KB
    /// batch and its fdatasync take about 100 µs of CPU against about 280 µs buffered on
    /// the same file system (issue 22, `docs/benchmarks.md`).
    fn write_at_end(&self, h: &mut Head, buf: &[u8]) -> std::io::Result<()> {
        let Some(direct) = h.direct.clone() else {
            return h.file.write_all_at(buf, h.end);
        };
        let tail = h.tail.len();
        let total = tail + buf.len();
        let block = aligned_block(&mut h.dbuf, total.next_multiple_of(DIRECT_ALIGN));
        block[..tail].copy_from_slice(&h.tail);
        block[tail..total].copy_from_slice(buf);
        block[total..].fill(0);
        match direct.write_all_at(block, h.end - tail as u64) {
            // This file system takes direct opens but not these writes: buffered from
            // now on.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(path = %h.path.display(), error = %e, "direct writes refused; writing through the page cache");
                h.direct = None;
                h.file.write_all_at(buf, h.end)
            }
            r => r,
        }
    }

    /// Cuts the zeros direct appends left past the head's end; returns whether there were
    /// any.
    fn trim_padding(&self, h: &Head) -> Result<bool> {
        let len = h.file.len().map_err(|e| Error::io("stat", &h.path, e))?;
        if len <= h.end {
            return Ok(false);
        }
        h.file
            .set_len(h.end)
            .map_err(|e| Error::io("truncate", &h.path, e))?;
        Ok(true)
    }

    /// Makes the head's file (its bytes end at `end`) ready for direct appends: opens its
    /// direct handle (if the file system does direct I/O and it is configured) and reads
    /// its tail. Failing that (no descriptor left, a read error), the head's appends go
    /// through the page cache, which needs neither.
    fn attach_head(&self, h: &mut Head, end: u64) {
        h.direct = None;
        h.tail.clear();
        if !self.cfg.direct_io {
            return;
        }
        let attached = read_tail(&*h.file, &h.path, end).and_then(|tail| {
            let direct = self
                .vfs
                .open_direct(&h.path)
                .map_err(|e| Error::io("open", &h.path, e))?;
            Ok((direct, tail))
        });
        match attached {
            Ok((direct, tail)) => {
                h.direct = direct;
                h.tail = tail;
            }
            Err(e) => {
                tracing::warn!(path = %h.path.display(), error = %e, "cannot open the log file for direct writes; writing through the page cache");
            }
        }
    }

    /// Encodes and appends one batch of commits; returns the documents' places.
    fn commit_locked(&self, h: &mut Head, batch: &[VbCommit]) -> Result<()> {
        // Incarnations: a vBucket the index does not have starts a new one.
        let mut entries = Vec::with_capacity(batch.len());
        let mut doc_lists = Vec::with_capacity(batch.len());
        let seq = h.next_seq;
        let mut next_incarnation = h.next_incarnation;
        // New vBuckets' incarnations, so that a vBucket given twice in one batch gets one.
        let mut born: smallvec::SmallVec<[(u16, u64); 4]> = smallvec::SmallVec::new();
        {
            let ix = self.index.read();
            for c in batch {
                let docs = c.unique_docs();
                let stored = ix.vbs.get(&c.vbid.0);
                let prev_purge = stored
                    .and_then(|v| v.state.as_ref())
                    .map_or(0, |s| s.purge_seqno);
                let state = c.completed_state(&docs, prev_purge);
                let incarnation = match stored {
                    Some(v) => v.incarnation,
                    None => match born.iter().find(|(v, _)| *v == c.vbid.0) {
                        Some(&(_, inc)) => inc,
                        None => {
                            born.push((c.vbid.0, next_incarnation));
                            next_incarnation += 1;
                            next_incarnation - 1
                        }
                    },
                };
                entries.push(LogHeadEntry {
                    vbid: c.vbid.0,
                    incarnation,
                    state: Some((seq, state)),
                    docs: u32::try_from(docs.len()).map_err(|_| {
                        Error::InvalidArgument("too many documents in one commit".into())
                    })?,
                });
                doc_lists.push(docs);
            }
        }
        let approx: u64 = doc_lists
            .iter()
            .flat_map(|d| d.iter())
            .map(|d| (d.key.len() + d.value.len() + 64) as u64)
            .sum::<u64>()
            + 256 * batch.len() as u64;
        self.prepare_head(h, approx)?;
        let mut buf = std::mem::take(&mut h.buf);
        buf.clear();
        buf.reserve(usize::try_from(approx).unwrap_or(0));
        let head = LogHead { seq, entries };
        format::put_frame_with(&mut buf, RecordKind::LogHead, |out| {
            format::encode_log_head(out, &head);
        });
        // The batch's documents in order, with their vBuckets.
        let flat: Vec<(u16, &Document)> = head
            .entries
            .iter()
            .zip(&doc_lists)
            .flat_map(|(e, docs)| docs.iter().map(move |d| (e.vbid, d)))
            .collect();
        // Each document's offset and frame length, and its key's index tag (hashed while
        // the key is in cache for the copy).
        let mut places: Vec<(u64, u32, Tag)> = Vec::with_capacity(flat.len());
        for (i, &(_, d)) in flat.iter().enumerate() {
            // The key and value of a document a few ahead start loading while this one is
            // copied (the values were written by other threads, long ago: cold).
            if let Some((_, next)) = flat.get(i + PREFETCH_AHEAD) {
                prefetch::bytes(&next.key);
                prefetch::bytes(&next.value);
            }
            if d.key.len() > usize::from(u16::MAX) || d.value.len() > (64 << 20) {
                h.buf = buf;
                return Err(Error::InvalidArgument(format!(
                    "document too large: key {} bytes, value {} bytes",
                    d.key.len(),
                    d.value.len()
                )));
            }
            let at = buf.len();
            format::put_frame_with(&mut buf, RecordKind::Document, |out| {
                format::encode_document(out, d);
            });
            places.push((
                h.end + at as u64,
                (buf.len() - at) as u32,
                KeyTable::tag(&d.key),
            ));
        }
        let written = self.append(h, &buf, true);
        if buf.capacity() <= BUF_KEEP {
            h.buf = buf;
        }
        written?;
        h.unsynced = false;
        h.next_seq = seq + 1;
        h.next_incarnation = next_incarnation;
        let mut ix = self.index.write();
        let Index { vbs, files } = &mut *ix;
        let num = h.num;
        // Bytes made live in the head and made garbage elsewhere, applied to the files'
        // counts once per batch.
        let mut added = 0u64;
        let mut freed: smallvec::SmallVec<[(u32, u64); 4]> = smallvec::SmallVec::new();
        let mut items = 0u64;
        for e in &head.entries {
            vbs.entry(e.vbid).or_insert_with(|| VbIndex {
                incarnation: e.incarnation,
                ..VbIndex::default()
            });
        }
        // Each key's index slot (and the key, for the comparison) starts loading
        // HINT_AHEAD documents before its lookup, so that the lookups' cache misses overlap
        // instead of following one another.
        let hint = |vbs: &HashMap<u16, VbIndex, _>, i: usize| {
            if let (Some(&(vbid, d)), Some(&(_, _, t))) = (flat.get(i), places.get(i))
                && let Some(vb) = vbs.get(&vbid)
            {
                vb.keys.hint(t);
                prefetch::bytes(&d.key);
            }
        };
        for i in 0..HINT_AHEAD {
            hint(vbs, i);
        }
        for (i, (&(vbid, d), &(offset, len, t))) in flat.iter().zip(&places).enumerate() {
            hint(vbs, i + HINT_AHEAD);
            let Some(vb) = vbs.get_mut(&vbid) else {
                continue;
            };
            items += 1;
            let loc = Loc {
                file: num,
                len,
                offset,
                seqno: d.seqno,
                expiry: d.expiry,
                deleted: d.deleted,
            };
            match vb.place_tagged(&d.key, t, loc) {
                // A newer version is already stored (only a retried batch can do that).
                None => continue,
                Some(Some(old)) => match freed.iter_mut().find(|(f, _)| *f == old.file) {
                    Some((_, b)) => *b += u64::from(old.len),
                    None => freed.push((old.file, u64::from(old.len))),
                },
                Some(None) => {}
            }
            added += u64::from(len);
        }
        for e in head.entries {
            if let (Some((s, st)), Some(vb)) = (e.state, vbs.get_mut(&e.vbid)) {
                vb.set_state(s, num, st);
            }
        }
        let head_stat = files.entry(num).or_default();
        head_stat.bytes = h.end;
        head_stat.live += added;
        for (f, b) in freed {
            if let Some(st) = files.get_mut(&f) {
                st.live = st.live.saturating_sub(b);
            }
        }
        drop(ix);
        self.counters.batches.fetch_add(1, Relaxed);
        self.counters.items.fetch_add(items, Relaxed);
        Ok(())
    }

    /// A descriptor of log file `file`, or `None` if cleaning deleted it.
    fn handle(&self, file: u32) -> Result<Option<Arc<dyn VFile>>> {
        match self.fds.get(&self.path_of(file), OpenMode::Existing) {
            Ok(f) => Ok(Some(f)),
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn path_of(&self, file: u32) -> PathBuf {
        self.cfg.dir.join(file_name(file))
    }

    /// Reads the document at `loc` through `f`.
    fn read_at(&self, f: &dyn VFile, loc: Loc) -> Result<Document> {
        let mut buf = vec![0u8; loc.len as usize];
        let path = || self.path_of(loc.file);
        f.read_exact_at(&mut buf, loc.offset)
            .map_err(|e| Error::io("read", &path(), e))?;
        format::decode_frame_of(&buf, RecordKind::Document)
            .and_then(format::decode_document)
            .map_err(|reason| Error::Corrupt {
                path: path(),
                offset: loc.offset,
                reason,
            })
    }

    /// Looks `key` up and reads its newest version. A cleaning run may delete the file
    /// between the two: then the key has moved, and the lookup is repeated.
    fn read_key(&self, vbid: u16, key: &[u8]) -> Result<Option<Document>> {
        for _ in 0..8 {
            let (loc, f) = {
                let ix = self.index.read();
                let Some(loc) = ix.vbs.get(&vbid).and_then(|v| v.keys.get(key)).copied() else {
                    return Ok(None);
                };
                (loc, self.handle(loc.file)?)
            };
            if let Some(f) = f {
                return self.read_at(&*f, loc).map(Some);
            }
        }
        Err(Error::InvalidArgument(format!(
            "vBucket {vbid}: key kept moving while being read"
        )))
    }

    /// Reclaims space, oldest file first, while the files hold more than
    /// `fragmentation_percent` garbage and more than `min_bytes` in all (and any file that
    /// holds nothing live). `pace` is called with the bytes written after each chunk of
    /// copies, with no lock held: the caller bounds the I/O rate by sleeping there.
    /// At most `max_files` files are cleaned per call.
    ///
    /// # Errors
    /// I/O errors; the file being cleaned is kept (its copies are harmless duplicates).
    pub fn clean(
        &self,
        fragmentation_percent: u8,
        min_bytes: u64,
        max_files: usize,
        pace: &mut dyn FnMut(u64),
    ) -> Result<CleanOutcome> {
        let mut scratch = self.clean.lock();
        let mut out = CleanOutcome::default();
        if self.damage.lock().is_some() {
            return Ok(out);
        }
        for _ in 0..max_files {
            let (oldest, due) = {
                let head = self.head.lock().num;
                let ix = self.index.read();
                let (bytes, live) = ix
                    .files
                    .values()
                    .fold((0u64, 0u64), |(b, l), f| (b + f.bytes, l + f.live));
                let Some((&oldest, st)) = ix.files.iter().next() else {
                    break;
                };
                let fragmented = bytes > min_bytes
                    && (bytes - live.min(bytes)) * 100 > bytes * u64::from(fragmentation_percent);
                let empty = st.live == 0 && oldest != head;
                let worth = oldest != head || st.bytes > min_bytes.max(SUPERBLOCK_LEN as u64);
                (oldest, (fragmented || empty) && worth)
            };
            if !due {
                if out.files == 0 {
                    *scratch = Vec::new();
                }
                break;
            }
            self.clean_file(oldest, &mut scratch, pace, &mut out)?;
        }
        if out.files > 0 {
            self.counters.compactions.fetch_add(1, Relaxed);
        }
        Ok(out)
    }

    /// Copies the live records of file `num` (the oldest) to the head and deletes it.
    fn clean_file(
        &self,
        num: u32,
        buf: &mut Vec<u8>,
        pace: &mut dyn FnMut(u64),
        out: &mut CleanOutcome,
    ) -> Result<()> {
        {
            // The head is sealed first if it is the file to clean.
            let mut h = self.head.lock();
            if h.num == num {
                let full = self.cfg.file_bytes;
                self.prepare_head(&mut h, full)?;
                if h.num == num {
                    // An empty head: nothing to clean.
                    return Ok(());
                }
            }
        }
        let path = self.path_of(num);
        let Some(f) = self.handle(num)? else {
            return Ok(());
        };
        // A write or sync of the head that fails while the copies wait for their sync may
        // have lost them (the kernel can drop the pages of a failed writeback): the file
        // is then kept.
        let failures_before = self.counters.failures.load(Relaxed);
        let bytes = self.index.read().files.get(&num).map_or(0, |s| s.bytes);
        let buf = self.read_for_cleaning(&*f, &path, bytes, buf)?;
        let mut pos = SUPERBLOCK_LEN;
        // Copies gathered for the next chunk: (entry, its docs' frames).
        let mut chunk: Vec<CopyEntry<'_>> = Vec::new();
        let mut chunk_bytes = 0usize;
        let mut tags: Vec<Tag> = Vec::new();
        let corrupt = |offset: usize, reason| Error::Corrupt {
            path: path.clone(),
            offset: offset as u64,
            reason,
        };
        // The documents' CRCs are checked only for the records copied: the others are
        // garbage, and checking every frame was a third of cleaning's own CPU.
        while let Some((rec, next)) =
            parse_record(buf, num, pos, false).map_err(|reason| corrupt(pos, reason))?
        {
            let mut rec_purge = None;
            if let Record::Purge(p) = rec {
                rec_purge = Some(p);
            } else if let Record::Batch(head, docs) = rec {
                // Tags first, so that each lookup's slot can be hinted a few keys ahead.
                tags.clear();
                tags.extend(docs.iter().map(|d| KeyTable::tag(d.key)));
                let ix = self.index.read();
                let mut at = 0;
                for e in head.entries {
                    let n = (e.docs as usize).min(docs.len() - at);
                    let (mine, mine_tags) = (&docs[at..at + n], &tags[at..at + n]);
                    at += n;
                    let Some(vb) = ix
                        .vbs
                        .get(&e.vbid)
                        .filter(|v| v.incarnation == e.incarnation)
                    else {
                        continue;
                    };
                    let state = e
                        .state
                        .filter(|(s, _)| vb.state_file == num && vb.state_seq == *s);
                    for &t in mine_tags.iter().take(HINT_AHEAD) {
                        vb.keys.hint(t);
                    }
                    let mut live = Vec::new();
                    for (i, (d, &t)) in mine.iter().zip(mine_tags).enumerate() {
                        if let Some(&ahead) = mine_tags.get(i + HINT_AHEAD) {
                            vb.keys.hint(ahead);
                        }
                        if vb.keys.get_tagged(d.key, t) != Some(&d.loc) {
                            continue;
                        }
                        let s = usize::try_from(d.loc.offset).unwrap_or(0);
                        let frame = &buf[s..s + d.loc.len as usize];
                        format::verify_frame(frame).map_err(|reason| corrupt(s, reason))?;
                        live.push((*d, t, frame));
                    }
                    if state.is_none() && live.is_empty() {
                        continue;
                    }
                    chunk_bytes += live.iter().map(|(_, _, f)| f.len()).sum::<usize>() + 128;
                    chunk.push((
                        LogHeadEntry {
                            vbid: e.vbid,
                            incarnation: e.incarnation,
                            state,
                            docs: u32::try_from(live.len()).unwrap_or(u32::MAX),
                        },
                        live,
                    ));
                }
            }
            if let Some(p) = rec_purge {
                // The purge itself dies with its file; the state it set may be the
                // vBucket's latest, which must live on.
                let live = self.index.read().vbs.get(&p.vbid).is_some_and(|v| {
                    v.incarnation == p.incarnation && v.state_file == num && v.state_seq == p.seq
                });
                if live {
                    chunk_bytes += 128;
                    chunk.push((
                        LogHeadEntry {
                            vbid: p.vbid,
                            incarnation: p.incarnation,
                            state: Some((p.seq, p.state)),
                            docs: 0,
                        },
                        Vec::new(),
                    ));
                }
            }
            if chunk_bytes >= CLEAN_CHUNK {
                let n = self.append_copies(num, std::mem::take(&mut chunk), out)?;
                chunk_bytes = 0;
                pace(n);
            }
            pos = next;
        }
        if !chunk.is_empty() {
            let n = self.append_copies(num, chunk, out)?;
            pace(n);
        }
        {
            let mut h = self.head.lock();
            if h.unsynced {
                self.sync(&*h.file, &h.path)?;
                h.unsynced = false;
            }
        }
        if self.counters.failures.load(Relaxed) != failures_before {
            return Err(Error::Io {
                op: "clean",
                path,
                source: std::io::Error::other(
                    "a write or sync of the log failed while its copies were unsynced; the file is kept",
                ),
            });
        }
        // The copies are durable: the file can go.
        self.vfs
            .remove(&path)
            .map_err(|e| Error::io("remove", &path, e))?;
        self.vfs
            .sync_dir(&self.cfg.dir)
            .map_err(|e| Error::io("sync", &self.cfg.dir, e))?;
        self.fds.forget(&path);
        if let Some(st) = self.index.write().files.remove(&num) {
            out.bytes_before += st.bytes;
            self.counters.reclaimed.fetch_add(st.bytes, Relaxed);
        }
        out.files += 1;
        Ok(())
    }

    /// Reads the first `bytes` bytes of the file at `path` (at most its length) into
    /// `scratch` and returns them. Directly where the file system allows (the file was
    /// written directly, so nothing of it is in the page cache, and a buffered read would
    /// copy each page twice and fill the cache with a file about to be deleted); the last
    /// partial [`DIRECT_ALIGN`] block, and the whole file elsewhere, through `f`.
    fn read_for_cleaning<'b>(
        &self,
        f: &dyn VFile,
        path: &Path,
        bytes: u64,
        scratch: &'b mut Vec<u8>,
    ) -> Result<&'b [u8]> {
        let len = f.len().map_err(|e| Error::io("stat", path, e))?.min(bytes);
        let len =
            usize::try_from(len).map_err(|_| Error::InvalidArgument("file too large".into()))?;
        let whole = len - len % DIRECT_ALIGN;
        if whole > 0
            && let Some(d) = self
                .vfs
                .open_direct(path)
                .map_err(|e| Error::io("open", path, e))?
        {
            if scratch.len() < len + DIRECT_ALIGN {
                scratch.resize(len + DIRECT_ALIGN, 0);
            }
            let off = scratch.as_ptr().align_offset(DIRECT_ALIGN);
            let out = &mut scratch[off..off + len];
            match d.read_exact_at(&mut out[..whole], 0) {
                Ok(()) => {
                    f.read_exact_at(&mut out[whole..], whole as u64)
                        .map_err(|e| Error::io("read", path, e))?;
                    return Ok(&scratch[off..off + len]);
                }
                // Direct reads refused: through the page cache.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(Error::io("read", path, e)),
            }
        }
        if scratch.len() < len {
            scratch.resize(len, 0);
        }
        f.read_exact_at(&mut scratch[..len], 0)
            .map_err(|e| Error::io("read", path, e))?;
        Ok(&scratch[..len])
    }

    /// Appends one chunk of copies of records of file `from` as a batch (not synced) and
    /// points the index at them where it still points at the originals. Returns the bytes
    /// written.
    fn append_copies(
        &self,
        from: u32,
        chunk: Vec<CopyEntry<'_>>,
        out: &mut CleanOutcome,
    ) -> Result<u64> {
        let mut h = self.head.lock();
        let approx: usize = chunk
            .iter()
            .map(|(_, d)| 128 + d.iter().map(|(_, _, f)| f.len()).sum::<usize>())
            .sum();
        self.prepare_head(&mut h, approx as u64)?;
        let seq = h.next_seq;
        let (entries, docs): (Vec<LogHeadEntry>, Vec<_>) = chunk.into_iter().unzip();
        let head = LogHead { seq, entries };
        let mut buf = Vec::with_capacity(approx + 64);
        format::put_frame_with(&mut buf, RecordKind::LogHead, |o| {
            format::encode_log_head(o, &head);
        });
        let mut moved = Vec::new();
        for (e, ds) in head.entries.iter().zip(&docs) {
            for (d, t, frame) in ds {
                let at = h.end + buf.len() as u64;
                buf.extend_from_slice(frame);
                moved.push((e.vbid, d.key, *t, d.loc, at));
            }
        }
        self.append(&mut h, &buf, false)?;
        h.unsynced = true;
        h.next_seq = seq + 1;
        let num = h.num;
        let mut guard = self.index.write();
        let ix = &mut *guard;
        let hint = |vbs: &HashMap<u16, VbIndex, _>, i: usize| {
            if let Some(&(vbid, _, t, _, _)) = moved.get(i)
                && let Some(vb) = vbs.get(&vbid)
            {
                vb.keys.hint(t);
            }
        };
        for i in 0..HINT_AHEAD {
            hint(&ix.vbs, i);
        }
        let mut moved_bytes = 0u64;
        for (i, &(vbid, key, t, old, at)) in moved.iter().enumerate() {
            debug_assert_eq!(old.file, from, "copies come from the file being cleaned");
            hint(&ix.vbs, i + HINT_AHEAD);
            let Some(vb) = ix.vbs.get_mut(&vbid) else {
                continue;
            };
            if let Some(cur) = vb.keys.get_mut_tagged(key, t)
                && *cur == old
            {
                cur.file = num;
                cur.offset = at;
                moved_bytes += u64::from(old.len);
                out.copied += 1;
            }
        }
        let head_stat = ix.files.entry(num).or_default();
        head_stat.bytes = h.end;
        head_stat.live += moved_bytes;
        if let Some(f) = ix.files.get_mut(&from) {
            f.live = f.live.saturating_sub(moved_bytes);
        }
        for e in head.entries {
            if let Some((s, _)) = e.state
                && let Some(vb) = ix.vbs.get_mut(&e.vbid)
                && vb.incarnation == e.incarnation
                && vb.state_seq == s
            {
                vb.state_file = num;
            }
        }
        drop(guard);
        drop(h);
        out.bytes_written += buf.len() as u64;
        Ok(buf.len() as u64)
    }

    /// Appends a single-frame record made by `encode` and syncs it.
    fn append_record(
        &self,
        h: &mut Head,
        kind: RecordKind,
        encode: impl FnOnce(&mut Vec<u8>),
    ) -> Result<()> {
        let mut buf = Vec::new();
        format::put_frame_with(&mut buf, kind, encode);
        self.prepare_head(h, buf.len() as u64)?;
        self.append(h, &buf, true)?;
        h.unsynced = false;
        self.index.write().files.entry(h.num).or_default().bytes = h.end;
        Ok(())
    }
}

impl KvStore for LogStore {
    fn commit(&self, batch: &[VbCommit]) -> Result<()> {
        if let Some(c) = batch.first() {
            self.check_usable(c.vbid.0)?;
        }
        let mut h = self.head.lock();
        self.commit_locked(&mut h, batch)
    }

    fn get(&self, vbid: Vbid, key: &[u8]) -> Result<Option<Document>> {
        self.read_key(vbid.0, key)
    }

    fn key_meta(&self, vbid: Vbid, key: &[u8]) -> Result<Option<KeyMeta>> {
        let ix = self.index.read();
        Ok(ix
            .vbs
            .get(&vbid.0)
            .and_then(|v| v.keys.get(key))
            .map(|l| KeyMeta {
                key: key.to_vec(),
                seqno: l.seqno,
                deleted: l.deleted,
            }))
    }

    fn scan_by_seqno(
        &self,
        vbid: Vbid,
        start: u64,
        end: u64,
        visit: &mut dyn FnMut(Document) -> ScanControl,
    ) -> Result<u64> {
        let (mut locs, handles) = {
            let ix = self.index.read();
            let Some(vb) = ix.vbs.get(&vbid.0) else {
                return Ok(0);
            };
            let locs: Vec<Loc> = vb
                .keys
                .values()
                .filter(|l| l.seqno >= start && l.seqno <= end)
                .copied()
                .collect();
            // Handles taken under the same lock (cleaning moves every live record out of
            // a file, under the write lock, before it deletes the file): a file cleaned
            // afterwards stays readable through them.
            let mut handles: BTreeMap<u32, Arc<dyn VFile>> = BTreeMap::new();
            for l in &locs {
                if let std::collections::btree_map::Entry::Vacant(e) = handles.entry(l.file)
                    && let Some(f) = self.handle(l.file)?
                {
                    e.insert(f);
                }
            }
            (locs, handles)
        };
        locs.sort_unstable_by_key(|l| l.seqno);
        let mut n = 0;
        for l in locs {
            let Some(f) = handles.get(&l.file) else {
                continue;
            };
            n += 1;
            if visit(self.read_at(&**f, l)?) == ScanControl::Stop {
                break;
            }
        }
        Ok(n)
    }

    fn scan_keys(&self, vbid: Vbid, visit: &mut dyn FnMut(KeyMeta) -> ScanControl) -> Result<u64> {
        let mut keys: Vec<KeyMeta> = {
            let ix = self.index.read();
            let Some(vb) = ix.vbs.get(&vbid.0) else {
                return Ok(0);
            };
            vb.keys
                .iter()
                .map(|(k, l)| KeyMeta {
                    key: k.to_vec(),
                    seqno: l.seqno,
                    deleted: l.deleted,
                })
                .collect()
        };
        keys.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        Ok(crate::types::deliver(keys, visit))
    }

    fn vbucket_state(&self, vbid: Vbid) -> Result<Option<VbState>> {
        Ok(self
            .index
            .read()
            .vbs
            .get(&vbid.0)
            .and_then(|v| v.state.clone()))
    }

    fn vbuckets(&self) -> Vec<Vbid> {
        let ix = self.index.read();
        let mut v: Vec<Vbid> = ix
            .vbs
            .iter()
            .filter(|(_, v)| v.state.is_some())
            .map(|(id, _)| Vbid(*id))
            .collect();
        v.sort_unstable_by_key(|v| v.0);
        v
    }

    fn delete_vbucket(&self, vbid: Vbid) -> Result<()> {
        self.delete_vbuckets(&[vbid])
    }

    fn delete_vbuckets(&self, vbids: &[Vbid]) -> Result<()> {
        if let Some(v) = vbids.first() {
            self.check_usable(v.0)?;
        }
        let mut h = self.head.lock();
        let dels: Vec<LogVbDelete> = {
            let ix = self.index.read();
            vbids
                .iter()
                .filter_map(|v| {
                    ix.vbs.get(&v.0).map(|vb| LogVbDelete {
                        vbid: v.0,
                        incarnation: vb.incarnation,
                    })
                })
                .collect()
        };
        if dels.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::new();
        for d in &dels {
            format::put_frame_with(&mut buf, RecordKind::LogVbDelete, |o| {
                format::encode_log_vb_delete(o, d);
            });
        }
        self.prepare_head(&mut h, buf.len() as u64)?;
        self.append(&mut h, &buf, true)?;
        h.unsynced = false;
        let mut ix = self.index.write();
        ix.files.entry(h.num).or_default().bytes = h.end;
        for d in dels {
            ix.drop_vb(d.vbid);
        }
        Ok(())
    }

    fn compact(&self, vbid: Vbid, rule: &PurgeRule) -> Result<CompactionOutcome> {
        if self.damage.lock().is_some() {
            return Ok(CompactionOutcome::default());
        }
        let mut h = self.head.lock();
        let mut out = CompactionOutcome::default();
        let purge = {
            let ix = self.index.read();
            let Some(vb) = ix.vbs.get(&vbid.0) else {
                return Ok(out);
            };
            let Some(state) = vb.state.as_ref() else {
                return Ok(out);
            };
            out.bytes_before = vb.live_bytes;
            let mut keys = Vec::new();
            let mut purge_seqno = state.purge_seqno;
            for (k, l) in vb.keys.iter() {
                if !out.judge(
                    rule,
                    state,
                    &mut purge_seqno,
                    (k, l.seqno, l.deleted, l.expiry),
                ) {
                    keys.push((k.to_vec(), l.seqno));
                }
            }
            let mut state = state.clone();
            state.purge_seqno = purge_seqno;
            LogPurge {
                vbid: vbid.0,
                incarnation: vb.incarnation,
                seq: h.next_seq,
                state,
                keys,
            }
        };
        if !purge.keys.is_empty() {
            self.append_record(&mut h, RecordKind::LogPurge, |o| {
                format::encode_log_purge(o, &purge);
            })?;
            h.next_seq += 1;
            let mut ix = self.index.write();
            for (k, s) in &purge.keys {
                ix.kill(vbid.0, k, *s);
            }
            let num = h.num;
            ix.set_state(vbid.0, purge.seq, num, purge.state);
        }
        out.bytes_after = self
            .index
            .read()
            .vbs
            .get(&vbid.0)
            .map_or(0, |v| v.live_bytes);
        self.counters.compactions.fetch_add(1, Relaxed);
        Ok(out)
    }

    fn checkpoint(&self) -> Result<()> {
        if self.damage.lock().is_some() {
            return Ok(());
        }
        // Every commit is durable where it stays; only cleaning's copies may wait for a
        // sync.
        let mut h = self.head.lock();
        if h.unsynced {
            self.sync(&*h.file, &h.path)?;
            h.unsynced = false;
        }
        Ok(())
    }

    fn stats(&self) -> StoreStats {
        let (bytes, live) = self.usage();
        StoreStats {
            batches: self.counters.batches.load(Relaxed),
            items_flushed: self.counters.items.load(Relaxed),
            syncs: self.counters.syncs.load(Relaxed),
            bytes_written: self.counters.bytes.load(Relaxed),
            journal_bytes: 0,
            checkpoints: 0,
            open_files: self.fds.open_files() as u64,
            file_opens: self.report.files,
            compactions: self.counters.compactions.load(Relaxed),
            commit_failures: self.counters.failures.load(Relaxed),
            data_file_bytes: bytes,
            live_bytes: live,
            bytes_reclaimed: self.counters.reclaimed.load(Relaxed),
            index_bytes: self.index_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use epkv_types::VBucketState;

    fn doc(key: &str, seqno: u64, value: &str) -> Document {
        Document {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec().into(),
            seqno,
            cas: seqno,
            rev_seqno: 1,
            flags: 0,
            expiry: 0,
            datatype: 0,
            deleted: false,
        }
    }

    fn commit(s: &LogStore, vb: u16, docs: Vec<Document>) {
        let high = docs.iter().map(|d| d.seqno).max().unwrap_or(0);
        s.commit(&[VbCommit {
            vbid: Vbid(vb),
            docs: docs.into(),
            keys_unique: false,
            state: VbState {
                high_seqno: high,
                ..VbState::new(VBucketState::Active)
            },
        }])
        .unwrap();
    }

    fn value(s: &LogStore, vb: u16, key: &str) -> Option<Vec<u8>> {
        s.get(Vbid(vb), key.as_bytes())
            .unwrap()
            .map(|d| d.value.to_vec())
    }

    #[test]
    fn documents_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let s = LogStore::open(LogStoreConfig::new(dir.path())).unwrap();
        commit(&s, 3, vec![doc("a", 1, "x"), doc("b", 2, "y")]);
        commit(&s, 3, vec![doc("a", 3, "z")]);
        assert_eq!(value(&s, 3, "a"), Some(b"z".to_vec()));
        let long = "k".repeat(100);
        let before = s.index_bytes();
        assert!(before >= 2 * KeyTable::SLOT_BYTES as u64, "{before}");
        commit(&s, 3, vec![doc(&long, 4, "v")]);
        assert!(
            s.index_bytes() >= before + 100,
            "a long key's heap is counted"
        );
        assert_eq!(s.stats().index_bytes, s.index_bytes());
        s.close().unwrap();
        let s = LogStore::open(LogStoreConfig::new(dir.path())).unwrap();
        assert_eq!(value(&s, 3, "a"), Some(b"z".to_vec()));
        assert_eq!(value(&s, 3, "b"), Some(b"y".to_vec()));
        assert_eq!(s.vbucket_state(Vbid(3)).unwrap().unwrap().high_seqno, 4);
        assert_eq!(s.vbuckets(), vec![Vbid(3)]);
    }

    fn small(dir: &Path) -> LogStoreConfig {
        let mut cfg = LogStoreConfig::new(dir);
        cfg.file_bytes = 1024;
        cfg
    }

    fn file_count(dir: &Path) -> usize {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| parse_file_name(&e.as_ref().unwrap().path()).is_some())
            .count()
    }

    #[test]
    fn a_new_vbucket_given_twice_in_one_batch_is_one_vbucket() {
        let dir = tempfile::tempdir().unwrap();
        let s = LogStore::open(LogStoreConfig::new(dir.path())).unwrap();
        let c = |docs: Vec<Document>, high| VbCommit {
            vbid: Vbid(9),
            docs: docs.into(),
            keys_unique: false,
            state: VbState {
                high_seqno: high,
                ..VbState::new(VBucketState::Active)
            },
        };
        s.commit(&[c(vec![doc("a", 1, "x")], 1), c(vec![doc("b", 2, "y")], 2)])
            .unwrap();
        s.close().unwrap();
        let s = LogStore::open(LogStoreConfig::new(dir.path())).unwrap();
        assert_eq!(value(&s, 9, "a"), Some(b"x".to_vec()));
        assert_eq!(value(&s, 9, "b"), Some(b"y".to_vec()));
        assert_eq!(s.vbucket_state(Vbid(9)).unwrap().unwrap().high_seqno, 2);
    }

    #[test]
    fn cleaning_copies_live_documents_forward_and_deletes_old_files() {
        let dir = tempfile::tempdir().unwrap();
        let s = LogStore::open(small(dir.path())).unwrap();
        let big = "v".repeat(200);
        let mut seq = 0;
        for round in 0..20 {
            for k in 0..4 {
                seq += 1;
                commit(
                    &s,
                    1,
                    vec![doc(&format!("k{k}"), seq, &format!("{round}{big}"))],
                );
            }
        }
        // Keys written once, early: they must survive their files being cleaned.
        seq += 1;
        commit(&s, 2, vec![doc("keep", seq, "kept")]);
        for round in 20..40 {
            seq += 1;
            commit(&s, 1, vec![doc("k0", seq, &format!("{round}{big}"))]);
        }
        let before = file_count(dir.path());
        let (bytes, live) = s.usage();
        let out = s.clean(30, 0, 1000, &mut |_| {}).unwrap();
        assert!(out.files > 0, "{out:?}");
        assert!(file_count(dir.path()) < before);
        let (bytes2, live2) = s.usage();
        assert!(bytes2 < bytes, "{bytes} -> {bytes2}");
        assert_eq!(
            live2, live,
            "cleaning moves live bytes, it does not drop them"
        );
        assert_eq!(value(&s, 2, "keep"), Some(b"kept".to_vec()));
        assert_eq!(value(&s, 1, "k0"), Some(format!("39{big}").into_bytes()));
        assert_eq!(value(&s, 1, "k3"), Some(format!("19{big}").into_bytes()));
        s.close().unwrap();
        let s = LogStore::open(small(dir.path())).unwrap();
        assert_eq!(value(&s, 2, "keep"), Some(b"kept".to_vec()));
        assert_eq!(value(&s, 1, "k3"), Some(format!("19{big}").into_bytes()));
        assert_eq!(
            s.vbucket_state(Vbid(2)).unwrap().unwrap().high_seqno,
            seq - 20
        );
        assert_eq!(s.usage().1, live);
    }

    #[test]
    fn a_failed_sync_while_copies_wait_keeps_the_cleaned_file() {
        let dir = tempfile::tempdir().unwrap();
        let fs = crate::FaultFs::new();
        let s = LogStore::open_with(small(dir.path()), Arc::new(fs.clone())).unwrap();
        let v = "v".repeat(300);
        // The oldest file holds a live record ("keep"), so cleaning copies something.
        commit(&s, 1, vec![doc("keep", 1, "kept")]);
        for i in 1..7 {
            commit(&s, 1, vec![doc(&format!("k{}", i % 2), i + 1, &v)]);
        }
        let oldest = s.index.read().files.keys().next().copied().unwrap();
        // After the copies are appended (not yet synced), a commit whose sync fails.
        let mut once = true;
        let r = s.clean(0, 0, 1, &mut |_| {
            if std::mem::take(&mut once) {
                fs.fail_nth(crate::FaultOp::Sync, 1);
                let failed = s.commit(&[VbCommit {
                    vbid: Vbid(2),
                    docs: vec![doc("x", 1, "x")].into(),
                    keys_unique: false,
                    state: VbState::new(VBucketState::Active),
                }]);
                fs.clear();
                assert!(failed.is_err());
            }
        });
        assert!(r.is_err(), "{r:?}");
        assert!(
            s.index.read().files.contains_key(&oldest),
            "the file stays, and so do its records"
        );
        assert_eq!(value(&s, 1, "keep"), Some(b"kept".to_vec()));
        // The next run cleans it.
        assert_eq!(s.clean(0, 0, 1, &mut |_| {}).unwrap().files, 1);
        assert!(!s.index.read().files.contains_key(&oldest));
        assert_eq!(value(&s, 1, "keep"), Some(b"kept".to_vec()));
        assert_eq!(value(&s, 1, "k0"), Some(v.into_bytes()));
    }

    /// Flips one bit of the value of the frame at `loc`, on disk.
    fn flip_value_bit(dir: &Path, loc: Loc) {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join(file_name(loc.file)))
            .unwrap();
        let at = loc.offset + u64::from(loc.len) - 2;
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 4], at).unwrap();
    }

    #[test]
    fn cleaning_checks_the_records_it_copies_and_skips_the_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let s = LogStore::open(small(dir.path())).unwrap();
        let v = "v".repeat(150);
        commit(&s, 1, vec![doc("live", 1, &v), doc("dead", 2, &v)]);
        let loc = |k: &str| *s.index.read().vbs[&1].keys.get(k.as_bytes()).unwrap();
        let (live, dead) = (loc("live"), loc("dead"));
        for i in 0..8 {
            commit(&s, 1, vec![doc("dead", i + 3, &v)]);
        }
        // Garbage that does not verify is not cleaning's business: the file goes.
        flip_value_bit(dir.path(), dead);
        let out = s.clean(0, 0, 1, &mut |_| {}).unwrap();
        assert_eq!(out.files, 1, "{out:?}");
        assert!(!s.index.read().files.contains_key(&dead.file));
        assert_eq!(value(&s, 1, "live"), Some(v.clone().into_bytes()));
        assert_eq!(value(&s, 1, "dead"), Some(v.clone().into_bytes()));
        // A live record that does not verify stops cleaning, and its file is kept.
        let moved = loc("live");
        assert_ne!(moved, live, "copied forward");
        for i in 0..8 {
            commit(&s, 1, vec![doc("dead", i + 20, &v)]);
        }
        flip_value_bit(dir.path(), moved);
        let files_before = s.index.read().files.len();
        // Cleaning goes on, oldest file first, until it reaches the bad record's file.
        let (stopped_at, r) = loop {
            let oldest = *s.index.read().files.keys().next().unwrap();
            match s.clean(0, 0, 1, &mut |_| {}) {
                Ok(o) if o.files == 1 && oldest != moved.file => {}
                other => break (oldest, other),
            }
        };
        assert_eq!(stopped_at, moved.file);
        assert!(
            matches!(r, Err(Error::Corrupt { offset, .. }) if offset == moved.offset),
            "{r:?}"
        );
        assert!(s.index.read().files.contains_key(&moved.file));
        assert!(s.index.read().files.len() <= files_before);
        assert!(
            s.get(Vbid(1), b"live").is_err(),
            "still reported as corrupt"
        );
    }

    #[test]
    fn a_deleted_vbucket_stays_deleted_across_cleaning_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let s = LogStore::open(small(dir.path())).unwrap();
        commit(&s, 5, vec![doc("old", 1, "o"), doc("both", 2, "old")]);
        s.delete_vbucket(Vbid(5)).unwrap();
        assert_eq!(value(&s, 5, "old"), None);
        assert!(s.vbuckets().is_empty());
        commit(&s, 5, vec![doc("both", 1, "new")]);
        let filler = "f".repeat(300);
        for i in 0..10 {
            commit(&s, 6, vec![doc("f", i + 1, &filler)]);
        }
        s.clean(0, 0, 1000, &mut |_| {}).unwrap();
        s.close().unwrap();
        let s = LogStore::open(small(dir.path())).unwrap();
        assert_eq!(value(&s, 5, "old"), None);
        assert_eq!(value(&s, 5, "both"), Some(b"new".to_vec()));
        assert_eq!(s.vbuckets(), vec![Vbid(5), Vbid(6)]);
    }

    #[test]
    fn purged_tombstones_do_not_come_back_after_cleaning_or_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let s = LogStore::open(small(dir.path())).unwrap();
        commit(&s, 1, vec![doc("gone", 1, "v")]);
        let mut tomb = doc("gone", 2, "");
        tomb.deleted = true;
        commit(&s, 1, vec![tomb]);
        commit(&s, 1, vec![doc("last", 3, "l")]);
        let out = s
            .compact(
                Vbid(1),
                &PurgeRule {
                    purge_before_seqno: 2,
                    ..PurgeRule::default()
                },
            )
            .unwrap();
        assert_eq!(out.tombstones_purged, 1);
        assert_eq!(s.get(Vbid(1), b"gone").unwrap(), None);
        assert_eq!(s.vbucket_state(Vbid(1)).unwrap().unwrap().purge_seqno, 2);
        s.close().unwrap();
        let s = LogStore::open(small(dir.path())).unwrap();
        assert_eq!(s.get(Vbid(1), b"gone").unwrap(), None);
        assert_eq!(s.vbucket_state(Vbid(1)).unwrap().unwrap().purge_seqno, 2);
        let filler = "f".repeat(300);
        for i in 0..10 {
            commit(&s, 2, vec![doc("f", i + 1, &filler)]);
        }
        s.clean(0, 0, 1000, &mut |_| {}).unwrap();
        s.close().unwrap();
        let s = LogStore::open(small(dir.path())).unwrap();
        assert_eq!(s.get(Vbid(1), b"gone").unwrap(), None);
        assert_eq!(value(&s, 1, "last"), Some(b"l".to_vec()));
        assert_eq!(s.vbucket_state(Vbid(1)).unwrap().unwrap().purge_seqno, 2);
        // A later commit (whose state says purge seqno 0, as the engine's do) keeps it.
        commit(&s, 1, vec![doc("later", 4, "x")]);
        assert_eq!(s.vbucket_state(Vbid(1)).unwrap().unwrap().purge_seqno, 2);
    }

    #[test]
    fn a_tail_is_the_bytes_since_the_last_block_boundary() {
        let a = vec![1u8; 100];
        assert_eq!(next_tail(&a, &[2; 50]).len(), 150);
        let t = next_tail(&a, &vec![3u8; DIRECT_ALIGN]);
        assert_eq!((t.len(), t[0], t[99]), (100, 3, 3));
        let t = next_tail(&vec![4u8; DIRECT_ALIGN - 10], &[5; 20]);
        assert_eq!(t, vec![5u8; 10]);
        let t = next_tail(&vec![6u8; DIRECT_ALIGN - 10], &[7; 10]);
        assert!(t.is_empty(), "on a boundary");
        let mut scratch = Vec::new();
        for len in [DIRECT_ALIGN, 3 * DIRECT_ALIGN] {
            let b = aligned_block(&mut scratch, len);
            assert_eq!((b.len(), b.as_ptr() as usize % DIRECT_ALIGN), (len, 0));
        }
    }

    /// Commits small batches until the head rolls at least once; returns the file paths.
    fn fill_past_a_roll(dir: &Path, direct_io: bool) -> Vec<PathBuf> {
        let mut cfg = LogStoreConfig::new(dir);
        cfg.file_bytes = 16 << 10;
        cfg.direct_io = direct_io;
        let s = LogStore::open(cfg.clone()).unwrap();
        let v = "v".repeat(700);
        for i in 0..40u64 {
            commit(&s, 2, vec![doc(&format!("k{i}"), i + 1, &v)]);
            // Every append leaves the head's bytes readable and its end where it was.
            let h = s.head.lock();
            let on_disk = std::fs::metadata(&h.path).unwrap().len();
            if h.direct.is_some() {
                assert_eq!(on_disk, h.end.next_multiple_of(DIRECT_ALIGN as u64));
                assert_eq!(h.tail.len() as u64, h.end % DIRECT_ALIGN as u64);
            } else {
                assert_eq!(on_disk, h.end);
            }
            drop(h);
            assert_eq!(value(&s, 2, &format!("k{i}")), Some(v.clone().into_bytes()));
        }
        // Not closed: the head keeps its padding, as after a crash.
        drop(s);
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| parse_file_name(p).is_some())
            .collect();
        files.sort();
        assert!(files.len() >= 3, "{files:?}");
        let s = LogStore::open(cfg).unwrap();
        assert_eq!(
            s.recovery_report().torn_bytes,
            0,
            "padding is not a torn write"
        );
        assert!(s.damage().is_none());
        for i in 0..40u64 {
            assert!(value(&s, 2, &format!("k{i}")).is_some(), "k{i}");
        }
        files
    }

    /// The real file system, whose direct handles count their reads, refuse them all
    /// (EINVAL) when `refuse_reads`, and refuse writes after the first `writes_left`: as a
    /// file system that takes `O_DIRECT` opens but not the I/O may.
    #[derive(Debug)]
    struct TestDirect {
        writes_left: Arc<AtomicU64>,
        refuse_reads: bool,
        reads: Arc<AtomicU64>,
    }

    impl TestDirect {
        fn refusing_writes_after(allowed: u64) -> Self {
            Self {
                writes_left: Arc::new(AtomicU64::new(allowed)),
                refuse_reads: false,
                reads: Arc::default(),
            }
        }
    }

    #[derive(Debug)]
    struct TestDirectFile {
        file: Arc<dyn VFile>,
        writes_left: Arc<AtomicU64>,
        refuse_reads: bool,
        reads: Arc<AtomicU64>,
    }

    impl VFile for TestDirectFile {
        fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            self.reads.fetch_add(1, Relaxed);
            if self.refuse_reads {
                return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
            }
            self.file.read_exact_at(buf, offset)
        }
        fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
            let left = self.writes_left.load(Relaxed);
            if left == 0 {
                return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
            }
            self.writes_left.store(left - 1, Relaxed);
            self.file.write_all_at(buf, offset)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            self.file.sync_data()
        }
        fn len(&self) -> std::io::Result<u64> {
            self.file.len()
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.file.set_len(len)
        }
    }

    impl Vfs for TestDirect {
        fn open(&self, path: &Path, mode: OpenMode) -> std::io::Result<Arc<dyn VFile>> {
            RealFs.open(path, mode)
        }
        fn open_direct(&self, path: &Path) -> std::io::Result<Option<Arc<dyn VFile>>> {
            Ok(RealFs.open_direct(path)?.map(|file| {
                Arc::new(TestDirectFile {
                    file,
                    writes_left: Arc::clone(&self.writes_left),
                    refuse_reads: self.refuse_reads,
                    reads: Arc::clone(&self.reads),
                }) as Arc<dyn VFile>
            }))
        }
        fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
            RealFs.rename(from, to)
        }
        fn remove(&self, path: &Path) -> std::io::Result<()> {
            RealFs.remove(path)
        }
        fn list(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
            RealFs.list(dir)
        }
        fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
            RealFs.create_dir_all(dir)
        }
        fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
            RealFs.sync_dir(dir)
        }
    }

    #[test]
    fn cleaning_reads_files_directly_or_through_the_cache_when_refused() {
        for refuse in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let mut cfg = LogStoreConfig::new(dir.path());
            // Files of a few direct blocks and a partial one.
            cfg.file_bytes = 14 << 10;
            let test_fs = TestDirect {
                refuse_reads: refuse,
                ..TestDirect::refusing_writes_after(u64::MAX)
            };
            let reads = Arc::clone(&test_fs.reads);
            let vfs: Arc<dyn Vfs> = Arc::new(test_fs);
            let s = LogStore::open_with(cfg.clone(), Arc::clone(&vfs)).unwrap();
            let direct = s.head.lock().direct.is_some();
            let v = |i: u64| format!("{i}").repeat(700);
            let mut seq = 0;
            for i in 0..10u64 {
                seq += 1;
                commit(&s, 4, vec![doc(&format!("keep{i}"), seq, &v(i))]);
            }
            for round in 0..60u64 {
                seq += 1;
                commit(
                    &s,
                    4,
                    vec![doc(&format!("hot{}", round % 3), seq, &v(round))],
                );
            }
            let files = file_count(dir.path());
            let out = s.clean(0, 0, 1000, &mut |_| {}).unwrap();
            assert!(out.files > 2 && out.copied >= 10, "{out:?}");
            assert!(file_count(dir.path()) < files);
            // Direct reads were tried wherever the file system takes them.
            assert_eq!(reads.load(Relaxed) > 0, direct, "refuse {refuse}");
            let check = |s: &LogStore| {
                for i in 0..10u64 {
                    assert_eq!(value(s, 4, &format!("keep{i}")), Some(v(i).into_bytes()));
                }
                for r in 57..60u64 {
                    assert_eq!(
                        value(s, 4, &format!("hot{}", r % 3)),
                        Some(v(r).into_bytes())
                    );
                }
            };
            check(&s);
            s.close().unwrap();
            let s = LogStore::open_with(cfg, vfs).unwrap();
            assert!(s.damage().is_none());
            check(&s);
        }
    }

    #[test]
    fn refused_direct_writes_fall_back_and_sealed_files_still_end_at_their_last_record() {
        // The refusals start after each count of direct appends in turn, so that for some
        // the head is sealed while zeros from the last direct append are still past its
        // end.
        for allowed in 1..30 {
            let dir = tempfile::tempdir().unwrap();
            let mut cfg = LogStoreConfig::new(dir.path());
            cfg.file_bytes = 16 << 10;
            let vfs: Arc<dyn Vfs> = Arc::new(TestDirect::refusing_writes_after(allowed));
            let s = LogStore::open_with(cfg.clone(), Arc::clone(&vfs)).unwrap();
            let v = "v".repeat(700);
            for i in 0..40u64 {
                commit(&s, 2, vec![doc(&format!("k{i}"), i + 1, &v)]);
            }
            let direct = s.head.lock().direct.is_some();
            drop(s);
            let s = LogStore::open_with(cfg, vfs).unwrap();
            assert!(s.damage().is_none(), "after {allowed}: {:?}", s.damage());
            for i in 0..40u64 {
                assert_eq!(value(&s, 2, &format!("k{i}")), Some(v.clone().into_bytes()));
            }
            assert!(!direct, "fell back to buffered appends");
        }
    }

    #[test]
    fn direct_appends_pad_the_head_and_sealed_files_end_at_their_last_record() {
        let dir = tempfile::tempdir().unwrap();
        let probe = dir.path().join("probe");
        std::fs::write(&probe, b"").unwrap();
        let direct = RealFs.open_direct(&probe).unwrap().is_some();
        std::fs::remove_file(&probe).unwrap();
        let files = fill_past_a_roll(dir.path(), true);
        for f in &files[..files.len() - 1] {
            // A sealed file holds records to its last byte: open would call zeros there
            // damage.
            let bytes = std::fs::read(f).unwrap();
            let mut scan = Replay::default();
            let r = LogStore::replay_file(&bytes, 1, &mut Index::default(), &mut scan);
            assert_eq!((r.valid_end, r.bad.is_none()), (bytes.len() as u64, true));
        }
        if !direct {
            eprintln!("this file system does no direct I/O: the buffered path was tested");
        }
        let dir = tempfile::tempdir().unwrap();
        fill_past_a_roll(dir.path(), false);
    }

    #[test]
    fn a_torn_tail_is_cut_and_damage_elsewhere_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let s = LogStore::open(small(dir.path())).unwrap();
        let v = "v".repeat(400);
        for i in 0..6 {
            commit(&s, 1, vec![doc(&format!("k{i}"), i + 1, &v)]);
        }
        // Small batches after the big ones: the head holds several.
        for i in 0..4 {
            commit(&s, 1, vec![doc(&format!("s{i}"), 7 + i, "small")]);
        }
        s.close().unwrap();
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| parse_file_name(p).is_some())
            .collect();
        files.sort();
        // Half a batch at the end of the head: cut off at open, the rest intact.
        let head = files.last().unwrap().clone();
        let good = std::fs::metadata(&head).unwrap().len();
        let mut bytes = std::fs::read(&head).unwrap();
        let extra: Vec<u8> = bytes[SUPERBLOCK_LEN..].iter().take(100).copied().collect();
        bytes.extend_from_slice(&extra);
        std::fs::write(&head, &bytes).unwrap();
        let s = LogStore::open(small(dir.path())).unwrap();
        assert_eq!(s.recovery_report().torn_bytes, 100);
        assert_eq!(std::fs::metadata(&head).unwrap().len(), good);
        assert_eq!(value(&s, 1, "k5"), Some(v.clone().into_bytes()));
        drop(s);
        // A flipped byte in the middle of the head (valid records after it) is damage,
        // not a torn tail: nothing is cut.
        let mut bytes = std::fs::read(&head).unwrap();
        let saved = bytes.clone();
        bytes[SUPERBLOCK_LEN + 40] ^= 0xff;
        std::fs::write(&head, &bytes).unwrap();
        let s = LogStore::open(small(dir.path())).unwrap();
        assert_eq!(s.damage().map(|d| d.path), Some(head.clone()));
        assert_eq!(std::fs::read(&head).unwrap(), bytes, "nothing cut");
        drop(s);
        // Zeros over the first batch's frame header, with valid batches after them: a
        // hole, not the end of the records.
        let mut bytes = saved.clone();
        bytes[SUPERBLOCK_LEN..SUPERBLOCK_LEN + format::FRAME_HEADER_LEN].fill(0);
        std::fs::write(&head, &bytes).unwrap();
        let s = LogStore::open(small(dir.path())).unwrap();
        assert_eq!(s.damage().map(|d| d.path), Some(head.clone()));
        assert_eq!(std::fs::read(&head).unwrap(), bytes, "nothing cut");
        drop(s);
        std::fs::write(&head, &saved).unwrap();
        // A flipped byte in a sealed file is corruption, named with its file.
        let first = files.first().unwrap().clone();
        let mut bytes = std::fs::read(&first).unwrap();
        bytes[SUPERBLOCK_LEN + 40] ^= 0xff;
        std::fs::write(&first, &bytes).unwrap();
        let s = LogStore::open(small(dir.path())).unwrap();
        let d = s.damage().unwrap();
        assert_eq!(d.path, first);
        assert!(d.error.contains(first.to_str().unwrap()), "{d:?}");
        assert_eq!(value(&s, 1, "k5"), None, "a damaged store serves nothing");
        assert!(matches!(
            s.commit(&[VbCommit {
                vbid: Vbid(1),
                docs: vec![doc("x", 9, "x")].into(),
                keys_unique: false,
                state: VbState::new(VBucketState::Active),
            }]),
            Err(Error::VbucketUnavailable { vbid: 1, .. })
        ));
        assert!(first.exists(), "damaged files are kept");
        s.reset().unwrap();
        assert!(!first.exists());
        commit(&s, 1, vec![doc("x", 1, "again")]);
        s.close().unwrap();
        let s = LogStore::open(small(dir.path())).unwrap();
        assert_eq!(s.damage(), None);
        assert_eq!(value(&s, 1, "x"), Some(b"again".to_vec()));
        assert_eq!(value(&s, 1, "k5"), None);
    }
}
