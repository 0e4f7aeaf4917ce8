//! The [`KvStore`] trait: what the engine needs from persistent storage.

use crate::error::Result;
use crate::types::{
    CompactionOutcome, Document, FileUsage, KeyMeta, PurgeRule, ScanControl, StoreStats, VbCommit,
    VbState,
};
use epkv_types::Vbid;

/// A store of vBuckets: documents by key and by seqno, plus each vBucket's state.
///
/// Implementations: [`FileStore`](crate::FileStore) (files, with or without the journal),
/// [`MemStore`](crate::MemStore) (memory), and `FileStore` over
/// [`FaultFs`](crate::FaultFs) (fault injection). One store is one shard: its commits are
/// serialised; reads may run concurrently with a commit and see either the state before or
/// after it, never a mixture within one vBucket.
pub trait KvStore: Send + Sync + std::fmt::Debug {
    /// Commits a flush batch: for each vBucket its documents and its new state, atomically
    /// per vBucket and durably for the whole batch when this returns `Ok`.
    ///
    /// # Errors
    /// Any I/O error ([`Error::NoSpace`](crate::Error::NoSpace) and
    /// [`Error::TooManyOpenFiles`](crate::Error::TooManyOpenFiles) are temporary). After an
    /// error nothing of the batch is acknowledged, each vBucket still reads as its last
    /// committed state or the new one, and the same batch may be retried.
    fn commit(&self, batch: &[VbCommit]) -> Result<()>;

    /// Returns the newest version of `key` (a tombstone has `deleted` set).
    ///
    /// # Errors
    /// I/O errors, or a corrupt record naming file and offset.
    fn get(&self, vbid: Vbid, key: &[u8]) -> Result<Option<Document>>;

    /// Returns the seqno and deleted flag of `key`'s newest version without reading its
    /// document where the store can (the files backend reads only its index).
    ///
    /// # Errors
    /// As [`KvStore::get`].
    fn key_meta(&self, vbid: Vbid, key: &[u8]) -> Result<Option<KeyMeta>> {
        Ok(self.get(vbid, key)?.map(|d| KeyMeta {
            seqno: d.seqno,
            deleted: d.deleted,
            key: d.key,
        }))
    }

    /// Streams the newest version of every document with `start <= seqno <= end`, in
    /// seqno order, reading values from disk as it goes. Returns the number delivered.
    ///
    /// # Errors
    /// As [`KvStore::get`].
    fn scan_by_seqno(
        &self,
        vbid: Vbid,
        start: u64,
        end: u64,
        visit: &mut dyn FnMut(Document) -> ScanControl,
    ) -> Result<u64>;

    /// Streams every key with its newest seqno and deleted flag, in key order, without
    /// reading values. Returns the number delivered.
    ///
    /// # Errors
    /// As [`KvStore::get`].
    fn scan_keys(&self, vbid: Vbid, visit: &mut dyn FnMut(KeyMeta) -> ScanControl) -> Result<u64>;

    /// Returns the last committed state of a vBucket, or `None` if it has none.
    ///
    /// # Errors
    /// I/O errors.
    fn vbucket_state(&self, vbid: Vbid) -> Result<Option<VbState>>;

    /// Commits a new state for a vBucket with no documents.
    ///
    /// # Errors
    /// As [`KvStore::commit`].
    fn set_vbucket_state(&self, vbid: Vbid, state: &VbState) -> Result<()> {
        self.commit(&[VbCommit {
            vbid,
            docs: Default::default(),
            keys_unique: false,
            state: state.clone(),
        }])
    }

    /// The vBuckets that have a committed state, in vbid order.
    fn vbuckets(&self) -> Vec<Vbid>;

    /// Deletes a vBucket's files and state.
    ///
    /// # Errors
    /// I/O errors.
    fn delete_vbucket(&self, vbid: Vbid) -> Result<()>;

    /// Deletes several vBuckets' files and states (one checkpoint and one directory sync
    /// for all of them in the files backend).
    ///
    /// # Errors
    /// I/O errors; vBuckets before the failing one are deleted.
    fn delete_vbuckets(&self, vbids: &[Vbid]) -> Result<()> {
        for v in vbids {
            self.delete_vbucket(*v)?;
        }
        Ok(())
    }

    /// Rewrites a vBucket keeping only the newest version of each key and dropping what
    /// `rule` purges. Commits to the vBucket may go on meanwhile; the interlock lives
    /// here, not in the caller ([`crate::FileStore`] copies with no lock held and catches
    /// up the commits made meanwhile under the vBucket's lock; [`crate::MemStore`] holds
    /// its lock throughout).
    ///
    /// # Errors
    /// I/O errors; the vBucket is unchanged after a failed compaction.
    fn compact(&self, vbid: Vbid, rule: &PurgeRule) -> Result<CompactionOutcome>;

    /// Does the deferred half of journal commits: writes up to `max_vbuckets` vBuckets'
    /// journaled commits to their data files (each vBucket's pending commits as one data
    /// file commit). Returns how many vBuckets still have such commits; a store may leave
    /// commits pending until enough have accumulated and return 0 meanwhile
    /// (`FileStoreConfig::apply_after_bytes`). Nothing depends on it for correctness (reads, compaction and checkpoints
    /// apply what they need first); the engine runs it on a background task so that the
    /// flusher's commit returns as soon as the journal is synced.
    ///
    /// # Errors
    /// A write error; the commits stay pending (they are durable in the journal).
    fn apply_pending(&self, max_vbuckets: usize) -> Result<usize> {
        let _ = max_vbuckets;
        Ok(0)
    }

    /// Makes everything committed durable in the data files and empties the journal.
    ///
    /// # Errors
    /// I/O errors (the journal is kept until a checkpoint succeeds).
    fn checkpoint(&self) -> Result<()>;

    /// The store's counters.
    fn stats(&self) -> StoreStats;

    /// Each stored vBucket's data-file size and live bytes (see [`FileUsage`]), in vbid
    /// order, without taking any vBucket's lock. Empty for a store without files.
    fn file_usage(&self) -> Vec<(Vbid, FileUsage)> {
        Vec::new()
    }
}
