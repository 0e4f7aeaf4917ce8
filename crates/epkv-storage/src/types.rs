//! Plain data passed across the [`KvStore`](crate::KvStore) boundary.

use epkv_types::VBucketState;

/// One document as stored: a mutation or, with `deleted`, a tombstone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// The key (at most `u16::MAX` bytes on disk; the protocol allows 250).
    pub key: Vec<u8>,
    /// The value (empty for most tombstones). Shared, so that the journal's pending
    /// commits and the applier hold it without copying it.
    pub value: bytes::Bytes,
    /// The seqno the vBucket gave this mutation.
    pub seqno: u64,
    /// The CAS.
    pub cas: u64,
    /// The revision seqno (how many times the key was mutated).
    pub rev_seqno: u64,
    /// Client flags.
    pub flags: u32,
    /// Absolute expiry time in seconds (0 = never).
    pub expiry: u32,
    /// Datatype bits (JSON, Snappy, Xattr).
    pub datatype: u8,
    /// True for a tombstone.
    pub deleted: bool,
}

/// One failover-log entry: the vBucket UUID that started at `seqno`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailoverEntry {
    /// vBucket UUID.
    pub uuid: u64,
    /// Seqno at which this UUID began.
    pub seqno: u64,
}

/// The vBucket state stored in every commit header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VbState {
    /// Active, replica, pending or dead.
    pub state: VBucketState,
    /// Highest seqno committed in this header.
    pub high_seqno: u64,
    /// Highest seqno known durable when this header was written (equal to `high_seqno`
    /// once the commit completes; the store sets it).
    pub persisted_seqno: u64,
    /// Tombstones at or below this seqno may have been purged by compaction.
    pub purge_seqno: u64,
    /// Largest CAS committed.
    pub max_cas: u64,
    /// High prepared seqno (HPS).
    pub high_prepared_seqno: u64,
    /// High completed seqno (HCS).
    pub high_completed_seqno: u64,
    /// Failover log, newest first.
    pub failover_log: Vec<FailoverEntry>,
}

impl VbState {
    /// A fresh state with all seqnos zero and an empty failover log.
    #[must_use]
    pub fn new(state: VBucketState) -> Self {
        Self {
            state,
            high_seqno: 0,
            persisted_seqno: 0,
            purge_seqno: 0,
            max_cas: 0,
            high_prepared_seqno: 0,
            high_completed_seqno: 0,
            failover_log: Vec::new(),
        }
    }
}

/// One vBucket's part of a flush batch: its documents and its new state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VbCommit {
    /// The vBucket.
    pub vbid: epkv_types::Vbid,
    /// Mutations and tombstones, in any order; for a key given twice the higher seqno wins.
    /// Shared: when each key is given once, in seqno order (as the engine's flusher gives
    /// them), the store keeps this very list for its pending commit instead of copying the
    /// documents, and the caller still has it afterwards (to count the bytes, or to queue
    /// the documents again after a failed commit).
    pub docs: std::sync::Arc<Vec<Document>>,
    /// The caller vouches that `docs` hold each key once, in ascending seqno order (the
    /// engine's dirty queue holds one version per key): the store then shares the list
    /// as it is, without hashing every key to de-duplicate it. False makes the store
    /// check, and copy out the newest version of each key when it must.
    pub keys_unique: bool,
    /// The vBucket state to commit with them. `high_seqno` and `max_cas` are raised to
    /// cover the documents if lower; `persisted_seqno` is set by the store.
    pub state: VbState,
}

impl VbCommit {
    /// The documents, each key once, in seqno order: this commit's own list, shared, when it
    /// already is that; otherwise the newest version of each key, copied.
    pub(crate) fn unique_docs(&self) -> std::sync::Arc<Vec<Document>> {
        debug_assert!(
            !self.keys_unique || unique_in_seqno_order(&self.docs),
            "a commit vouching for unique keys in seqno order has duplicates or is out of order"
        );
        if self.keys_unique || unique_in_seqno_order(&self.docs) {
            std::sync::Arc::clone(&self.docs)
        } else {
            std::sync::Arc::new(
                latest_versions(self.docs.iter(), self.docs.len())
                    .into_iter()
                    .cloned()
                    .collect(),
            )
        }
    }

    /// The state this commit leaves with `docs` (its [`VbCommit::unique_docs`]): high seqno
    /// and max CAS raised to cover them, the persisted seqno at the high seqno, and the
    /// purge seqno never below the stored one (`prev_purge`: compaction raises it, and a
    /// commit must not lower it, or a DCP client could resume below tombstones already
    /// purged).
    pub(crate) fn completed_state(&self, docs: &[Document], prev_purge: u64) -> VbState {
        let mut state = self.state.clone();
        state.purge_seqno = state.purge_seqno.max(prev_purge);
        if let Some(max) = docs.iter().map(|d| d.seqno).max() {
            state.high_seqno = state.high_seqno.max(max);
        }
        if let Some(max) = docs.iter().map(|d| d.cas).max() {
            state.max_cas = state.max_cas.max(max);
        }
        state.persisted_seqno = state.high_seqno;
        state
    }
}

/// The highest-seqno version of each key among `docs`, borrowed, in seqno order.
/// `capacity` sizes the map (a hint).
pub(crate) fn latest_versions<'a>(
    docs: impl Iterator<Item = &'a Document>,
    capacity: usize,
) -> Vec<&'a Document> {
    let mut latest: std::collections::HashMap<&[u8], &Document, foldhash::fast::RandomState> =
        std::collections::HashMap::with_capacity_and_hasher(
            capacity,
            foldhash::fast::RandomState::default(),
        );
    for d in docs {
        match latest.get(d.key.as_slice()) {
            Some(old) if old.seqno > d.seqno => {}
            _ => {
                latest.insert(&d.key, d);
            }
        }
    }
    let mut docs: Vec<&Document> = latest.into_values().collect();
    docs.sort_unstable_by_key(|d| d.seqno);
    docs
}

/// Whether `docs` hold each key once, in ascending seqno order.
fn unique_in_seqno_order(docs: &[Document]) -> bool {
    if docs.windows(2).any(|w| w[0].seqno >= w[1].seqno) {
        return false;
    }
    let mut seen: std::collections::HashSet<&[u8], foldhash::fast::RandomState> =
        std::collections::HashSet::with_capacity_and_hasher(
            docs.len(),
            foldhash::fast::RandomState::default(),
        );
    docs.iter().all(|d| seen.insert(d.key.as_slice()))
}

/// What compaction drops.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PurgeRule {
    /// Tombstones with a seqno at or below this are dropped (never the document at the
    /// vBucket's high seqno).
    pub purge_before_seqno: u64,
    /// Live documents with `0 < expiry <= now_secs` are dropped. `None` keeps them.
    pub now_secs: Option<u32>,
    /// Rewrite keys of format 1 as format 2 ([`crate::format::escape_v1_key`]): the
    /// upgrade of a file from before collections.
    pub escape_v1_keys: bool,
    /// Documents of these collections (dropped) are dropped, whatever their seqno
    /// (`epkv_types::doc_key::collection_of` of the key).
    pub dropped_collections: Vec<u32>,
    /// Drop completed SyncWrite prepares: live documents of collection
    /// [`PREPARE_NAMESPACE`] (KV-Engine's DurabilityPrepare namespace) at or below the
    /// vBucket's high completed seqno, whose commit or abort the file already holds.
    pub completed_prepares: bool,
}

/// Why a compaction drops a document ([`PurgeRule::verdict`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purged {
    /// A tombstone at or below [`PurgeRule::purge_before_seqno`].
    Tombstone,
    /// A live document past its expiry ([`PurgeRule::now_secs`]).
    Expired,
    /// A document of a dropped collection.
    DroppedCollection,
    /// A completed SyncWrite prepare.
    CompletedPrepare,
}

impl PurgeRule {
    /// Whether this rule drops the document with `key`, `seqno`, `deleted` and `expiry`
    /// from a vBucket whose high seqno and high completed seqno are given. The document at
    /// the high seqno is always kept (it carries the vBucket's high seqno across restarts).
    #[must_use]
    pub fn verdict(
        &self,
        key: &[u8],
        seqno: u64,
        deleted: bool,
        expiry: u32,
        high_seqno: u64,
        high_completed_seqno: u64,
    ) -> Option<Purged> {
        if seqno == high_seqno {
            None
        } else if deleted && seqno <= self.purge_before_seqno {
            Some(Purged::Tombstone)
        } else if !deleted && expiry != 0 && self.now_secs.is_some_and(|now| expiry <= now) {
            Some(Purged::Expired)
        } else if !self.dropped_collections.is_empty()
            && self
                .dropped_collections
                .contains(&epkv_types::doc_key::collection_of(key))
        {
            Some(Purged::DroppedCollection)
        } else if self.completed_prepares
            && !deleted
            && seqno <= high_completed_seqno
            && epkv_types::doc_key::collection_of(key) == PREPARE_NAMESPACE
        {
            Some(Purged::CompletedPrepare)
        } else {
            None
        }
    }
}

/// The reserved collection id under which an engine stores SyncWrite prepares (KV-Engine's
/// DurabilityPrepare namespace; `epkv_types::doc_key` never gives it to a collection).
pub const PREPARE_NAMESPACE: u32 = 2;

/// What a compaction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompactionOutcome {
    /// Documents copied into the new file.
    pub kept: u64,
    /// Tombstones dropped.
    pub tombstones_purged: u64,
    /// Documents of dropped collections removed.
    pub collection_docs_dropped: u64,
    /// Completed SyncWrite prepares removed ([`PurgeRule::completed_prepares`]).
    pub prepares_purged: u64,
    /// Expired documents dropped.
    pub expired: u64,
    /// File size before.
    pub bytes_before: u64,
    /// File size after.
    pub bytes_after: u64,
    /// Documents committed while the copy ran, appended to the new file afterwards
    /// (files backend; always 0 for the memory backend).
    pub caught_up: u64,
}

impl CompactionOutcome {
    /// Judges one document of a vBucket in `state` by `rule` ([`PurgeRule::verdict`]),
    /// counts it, and raises `purge_seqno` past a purged tombstone. Returns whether the
    /// document is kept.
    pub(crate) fn judge(
        &mut self,
        rule: &PurgeRule,
        state: &VbState,
        purge_seqno: &mut u64,
        (key, seqno, deleted, expiry): (&[u8], u64, bool, u32),
    ) -> bool {
        let v = rule.verdict(
            key,
            seqno,
            deleted,
            expiry,
            state.high_seqno,
            state.high_completed_seqno,
        );
        if v == Some(Purged::Tombstone) {
            *purge_seqno = (*purge_seqno).max(seqno);
        }
        self.count(v);
        v.is_none()
    }

    /// Counts one document: kept (`None`) or dropped for the reason given.
    fn count(&mut self, verdict: Option<Purged>) {
        match verdict {
            None => self.kept += 1,
            Some(Purged::Tombstone) => self.tombstones_purged += 1,
            Some(Purged::Expired) => self.expired += 1,
            Some(Purged::DroppedCollection) => self.collection_docs_dropped += 1,
            Some(Purged::CompletedPrepare) => self.prepares_purged += 1,
        }
    }
}

/// Hands `items` to `visit` in order until it says stop; returns how many it was given.
pub(crate) fn deliver<T>(
    items: impl IntoIterator<Item = T>,
    visit: &mut dyn FnMut(T) -> ScanControl,
) -> u64 {
    let mut n = 0;
    for item in items {
        n += 1;
        if visit(item) == ScanControl::Stop {
            break;
        }
    }
    n
}

/// Whether a scan continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanControl {
    /// Deliver the next document.
    Continue,
    /// Stop the scan now.
    Stop,
}

/// A key with its metadata, as delivered by a key scan (no value is read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyMeta {
    /// The key.
    pub key: Vec<u8>,
    /// Seqno of its newest version.
    pub seqno: u64,
    /// True if the newest version is a tombstone.
    pub deleted: bool,
}

/// Counters of one store, all since it was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// Flush batches committed.
    pub batches: u64,
    /// Documents committed.
    pub items_flushed: u64,
    /// fdatasync calls (journal and data files).
    pub syncs: u64,
    /// Bytes written (journal and data files).
    pub bytes_written: u64,
    /// Current journal size in bytes.
    pub journal_bytes: u64,
    /// Journal checkpoints (data files synced, a new journal generation started).
    pub checkpoints: u64,
    /// Data files open right now.
    pub open_files: u64,
    /// Data files opened since start.
    pub file_opens: u64,
    /// Compactions completed.
    pub compactions: u64,
    /// Commits that failed (and may be retried).
    pub commit_failures: u64,
    /// Bytes of the data files now (the sum of [`FileUsage::file_bytes`]).
    pub data_file_bytes: u64,
    /// Live bytes of the data files now (the sum of [`FileUsage::live_bytes`]).
    pub live_bytes: u64,
    /// Bytes compactions have given back: each one's old file size at the switch minus
    /// the new file's size.
    pub bytes_reclaimed: u64,
    /// Memory the store's key index takes (the write-once log's; 0 for stores whose index
    /// is on disk).
    pub index_bytes: u64,
}

/// How much of a vBucket's data file is live, for fragmentation-driven compaction.
///
/// `live_bytes` is what a compaction that purges nothing would write: the superblock,
/// the newest version of every key (tombstones included), the index segments the last
/// header points to and that header. Everything else up to `file_bytes` (superseded
/// versions, merged-away index segments, older headers) is garbage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileUsage {
    /// The data file's committed length (up to the end of its last header).
    pub file_bytes: u64,
    /// The bytes of it still reachable from the last header.
    pub live_bytes: u64,
}

impl FileUsage {
    /// Bytes a compaction would reclaim (`file_bytes - live_bytes`).
    #[must_use]
    pub fn garbage_bytes(&self) -> u64 {
        self.file_bytes.saturating_sub(self.live_bytes)
    }

    /// The share of the file that is garbage, `1 - live / file`, in percent (0 for an
    /// empty file).
    #[must_use]
    pub fn fragmentation_percent(&self) -> f64 {
        if self.file_bytes == 0 {
            return 0.0;
        }
        #[expect(clippy::cast_precision_loss, reason = "a ratio of file sizes")]
        let r = self.garbage_bytes() as f64 / self.file_bytes as f64;
        r * 100.0
    }
}
