//! Persistent storage for epkv: the write-once log ([`LogStore`], the default), per-vBucket
//! append-only data files behind a per-shard write-ahead journal ([`FileStore`]), and the
//! [`KvStore`] trait the engine's flusher, warmup and compaction use.
//!
//! **What it is.** A [`KvStore`] commits flush batches (documents plus each vBucket's
//! [`VbState`]), reads a document by key, streams a vBucket by seqno or by key, deletes and
//! compacts vBuckets. Backends: [`LogStore`] (each document written once into the shard's
//! log, an in-memory key index, cleaning oldest file first), [`FileStore`] (files; journal
//! on or off, see [`JournalMode`]), [`MemStore`] (memory), and either file backend over
//! [`FaultFs`] (fault injection and simulated crashes, for tests). The byte-level format is in
//! `docs/storage-format.md` and [`format`](mod@format).
//!
//! **What it is not.** It knows nothing about vBucket state machines, durability,
//! checkpoints or the hash table: it stores what it is given. It has no threads of its
//! own (a checkpoint syncs many data files from a few short-lived scoped threads) and no
//! clock: the engine runs it on its Writer/Reader/AuxIO tasks and passes "now" to
//! compaction in [`PurgeRule`].
//!
//! **Key types.** [`KvStore`], [`LogStore`] / [`LogStoreConfig`] / [`LogRecoveryReport`] /
//! [`Damage`] / [`CleanOutcome`], [`FileStore`] / [`FileStoreConfig`] / [`RecoveryReport`] /
//! [`Quarantined`],
//! [`MemStore`], [`FaultFs`], [`FdCache`] (open files under a descriptor budget),
//! [`Document`], [`VbState`], [`VbCommit`], [`StoreStats`], [`Error`].
//!
//! **Invariants.**
//! - Every record and header carries a CRC32C; a read that fails verification is an
//!   [`Error::Corrupt`] naming file and offset, never a panic and never bad data. Damage
//!   found at open in the middle of a vBucket's file sets that vBucket aside
//!   ([`Quarantined`], [`Error::VbucketUnavailable`] on commit) and opens the rest.
//! - `commit` returning `Ok` means durable. Files backend: a vBucket's committed state is
//!   its data file's last valid header, plus (journal on) the journal records with a
//!   higher commit id. Log: the records of every log file, resolved by incarnation, seqno
//!   and commit sequence number, not by position.
//! - A commit never lowers a vBucket's stored purge seqno.
//! - A failed write or sync is never ignored: `commit` returns the error, the file is cut
//!   back to its last header, and the batch can be retried.
//! - Data files stay open across writes, at most [`FdCache::budget`] of them; EMFILE on any
//!   open (a data file, the journal, a compaction target, a directory sync) closes the idle
//!   cached files and retries once, then reports [`Error::TooManyOpenFiles`] (temporary).
//! - Locking (per [`FileStore`]): commit lock → one vBucket's mutex → the [`FdCache`] mutex.
//!   Per [`LogStore`]: the head (commit lock) → the index → the [`FdCache`] mutex.
//!
//! **Dependencies.** `epkv-types` only (plus bytes, crc32c, foldhash, libc, parking_lot,
//! thiserror, tracing). It must never depend on the engine, the front end, the protocol or the
//! executor.
//!
//! ```
//! use epkv_storage::{Document, FileStore, FileStoreConfig, KvStore, VbCommit, VbState};
//! use epkv_types::{VBucketState, Vbid};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = std::env::temp_dir().join(format!("epkv-storage-doc-{}", std::process::id()));
//! let store = FileStore::open(FileStoreConfig::new(&dir))?;
//! let doc = Document {
//!     key: b"k".to_vec(), value: b"v".to_vec().into(), seqno: 1, cas: 7, rev_seqno: 1,
//!     flags: 0, expiry: 0, datatype: 0, deleted: false,
//! };
//! store.commit(&[VbCommit { vbid: Vbid(3), docs: vec![doc].into(), keys_unique: false, state: VbState::new(VBucketState::Active) }])?;
//! store.close()?;
//! let store = FileStore::open(FileStoreConfig::new(&dir))?;
//! assert_eq!(store.get(Vbid(3), b"k")?.map(|d| d.value.to_vec()), Some(b"v".to_vec()));
//! assert_eq!(store.vbucket_state(Vbid(3))?.map(|s| s.persisted_seqno), Some(1));
//! # drop(store); std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```
#![deny(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]

mod data_file;
mod error;
mod fault;
mod fd_cache;
mod file_store;
pub mod format;
mod key_table;
mod kv_store;
mod log_store;
mod mem_store;
mod prefetch;
mod types;
mod vfs;

pub use error::{Error, Result};
pub use fault::{FaultCounts, FaultFs, FaultOp};
pub use fd_cache::{FdCache, default_fd_budget};
pub use file_store::{
    COMPACT_CHUNK_BYTES, FileStore, FileStoreConfig, JournalMode, Quarantined, RecoveryReport,
};
pub use kv_store::KvStore;
pub use log_store::{CleanOutcome, Damage, LogRecoveryReport, LogStore, LogStoreConfig};
pub use mem_store::MemStore;
pub use types::{
    CompactionOutcome, Document, FailoverEntry, FileUsage, KeyMeta, PREPARE_NAMESPACE, PurgeRule,
    Purged, ScanControl, StoreStats, VbCommit, VbState,
};
pub use vfs::{DIRECT_ALIGN, OpenMode, RealFs, VFile, Vfs};
