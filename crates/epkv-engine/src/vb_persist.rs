//! [`VbPersist`]: one vBucket's persistence state: its dirty queue, its persisted seqno
//! and the callbacks waiting for it.
//!
//! Every mutation is queued at the vBucket's ordering point (with its `order` mutex held),
//! keyed by document key, so a key written many times between two flushes is flushed once
//! (KV-Engine's checkpoint de-duplication). Because queueing and seqno assignment happen
//! together, taking the queue yields every seqno up to its largest one. The flusher
//! ([`crate::persistence`]) takes the queue and raises the persisted seqno.
//!
//! Level: a leaf, below the vBucket that owns one. It imports no module of this crate.

use epkv_storage::Document;
use parking_lot::Mutex;
use std::hash::BuildHasher as _;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

pub(crate) type Waiter = Box<dyn FnOnce(u64) + Send>;

/// One vBucket's persistence state.
#[derive(Default)]
pub(crate) struct VbPersist {
    /// Documents waiting for the flusher, by key (newest version only). Taken inside the
    /// vBucket's `order` mutex by writers, alone by the flusher.
    dirty: Mutex<DirtyQueue>,
    /// Highest seqno known durable.
    persisted_seqno: AtomicU64,
    /// Callbacks waiting for `persisted_seqno >= seqno`. Leaf lock.
    waiters: Mutex<Vec<(u64, Waiter)>>,
}

impl std::fmt::Debug for VbPersist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VbPersist")
            .field("persisted_seqno", &self.persisted_seqno.load(Relaxed))
            .finish_non_exhaustive()
    }
}

/// One vBucket's documents waiting for the flusher: the newest version of each key, in
/// seqno order once taken.
///
/// A list in queue order (which is seqno order: writers queue under the vBucket's ordering
/// lock) with a table of positions by key beside it, rather than a hash set of documents:
/// the flusher takes the list whole, without copying it, where draining a set moved every
/// document out in table order and then sorted them (12% of the Writer threads' CPU at
/// 50k SETs/s, issue 22). A key queued again takes its older version's place, so the list
/// never holds more than one document per key; the list is then out of seqno order and is
/// sorted when taken.
#[derive(Default)]
struct DirtyQueue {
    docs: Vec<Document>,
    /// `docs` positions of the queued keys, hashed by key.
    at: hashbrown::HashTable<u32>,
    /// A document replaced an older version in place since the last take.
    unsorted: bool,
    hasher: foldhash::fast::RandomState,
    /// Keys written (full eviction) without knowing whether they existed on disk (see
    /// [`VbPersist::mark_unknown`]).
    unknown: std::collections::HashSet<Vec<u8>>,
    /// The vBucket state changed and must be committed even with no documents.
    state_dirty: bool,
    /// The highest prepare seqno queued (HPS) and the highest prepare seqno whose commit
    /// or abort is queued (HCS), kept as running maxima under this lock, so that the state
    /// a flush writes never claims a completion whose document it does not carry.
    sync: SyncSeqnos,
}

impl std::fmt::Debug for DirtyQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirtyQueue")
            .field("queued", &self.docs.len())
            .field("state_dirty", &self.state_dirty)
            .finish_non_exhaustive()
    }
}

impl DirtyQueue {
    /// Queues `doc`; an older version of its key queued before is replaced.
    fn push(&mut self, doc: Document) {
        let hash = self.hasher.hash_one(doc.key.as_slice());
        let docs = &mut self.docs;
        let found = self.at.find(hash, |&i| {
            docs.get(i as usize).is_some_and(|d| d.key == doc.key)
        });
        match found.and_then(|&i| docs.get_mut(i as usize)) {
            Some(old) => {
                *old = doc;
                self.unsorted = true;
            }
            None => {
                let hasher = &self.hasher;
                let pos = u32::try_from(docs.len()).unwrap_or(u32::MAX);
                self.at.insert_unique(hash, pos, |&i| {
                    docs.get(i as usize)
                        .map_or(0, |d| hasher.hash_one(d.key.as_slice()))
                });
                docs.push(doc);
            }
        }
    }

    /// Takes the queued documents, in seqno order; the table is emptied (and given back
    /// if a burst grew it far past what is queued now).
    fn take_docs(&mut self) -> Vec<Document> {
        let n = self.docs.len();
        let mut docs = std::mem::take(&mut self.docs);
        if std::mem::take(&mut self.unsorted) {
            docs.sort_unstable_by_key(|d| d.seqno);
        }
        if self.at.capacity() > 64 && self.at.capacity() > 4 * n {
            self.at = hashbrown::HashTable::new();
        } else {
            self.at.clear();
        }
        docs
    }
}

/// A vBucket's high prepared and high completed seqnos (see [`crate::durability`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SyncSeqnos {
    /// High prepared seqno.
    pub(crate) prepared: u64,
    /// High completed seqno.
    pub(crate) completed: u64,
}

impl VbPersist {
    /// Queues a document; returns true if the queue was empty.
    pub(crate) fn queue(&self, doc: Document) -> bool {
        self.queue_sync(doc, (0, 0))
    }

    /// [`Self::queue`] of a SyncWrite step's document: a prepare raises the high
    /// prepared seqno, a commit or abort of the prepare `completed` the high completed
    /// one.
    pub(crate) fn queue_sync(&self, doc: Document, (prepared, completed): (u64, u64)) -> bool {
        let mut q = self.dirty.lock();
        let was_empty = q.docs.is_empty() && !q.state_dirty;
        q.sync.prepared = q.sync.prepared.max(prepared);
        q.sync.completed = q.sync.completed.max(completed);
        q.push(doc);
        was_empty
    }

    /// Raises the high completed seqno the next flush commits to `completed` (a replica
    /// completed the prepares up to it at the end of a disk snapshot, see
    /// [`crate::replica`]; the documents up to that snapshot's end are queued or on disk
    /// already). The high prepared seqno follows (HPS >= HCS). When nothing is queued the
    /// state alone is committed; returns whether the flusher needs a wake for it.
    pub(crate) fn raise_completed(&self, completed: u64) -> bool {
        let mut q = self.dirty.lock();
        if completed <= q.sync.completed {
            return false;
        }
        q.sync.completed = completed;
        q.sync.prepared = q.sync.prepared.max(completed);
        let was_empty = q.docs.is_empty() && !q.state_dirty;
        q.state_dirty = true;
        was_empty
    }

    /// Sets the high prepared and completed seqnos warmup read from disk.
    pub(crate) fn restore_sync(&self, sync: SyncSeqnos) {
        self.dirty.lock().sync = sync;
    }

    /// Notes that `key` was written, under full eviction, without knowing whether its
    /// newest version on disk is live: the flusher looks that up before it persists the
    /// key's next document, and if so the item was counted twice (in memory and as
    /// evicted) and the evicted count goes down by one.
    pub(crate) fn mark_unknown(&self, key: &[u8]) {
        self.dirty.lock().unknown.insert(key.to_vec());
    }

    /// Notes that the vBucket's state must be committed.
    pub(crate) fn mark_state_dirty(&self) {
        self.dirty.lock().state_dirty = true;
    }

    /// Takes the queue: the documents in seqno order, whether the state was dirty, the
    /// keys of those documents marked [`Self::mark_unknown`], and the SyncWrite seqnos
    /// those documents reach.
    pub(crate) fn take(&self) -> (Vec<Document>, bool, Vec<Vec<u8>>, SyncSeqnos) {
        let mut q = self.dirty.lock();
        let sync = q.sync;
        let state_dirty = std::mem::take(&mut q.state_dirty);
        let docs = q.take_docs();
        let mut unknown = Vec::new();
        if !q.unknown.is_empty() {
            // A mark whose document is not queued yet (the writer marks first) stays.
            for d in &docs {
                if let Some(k) = q.unknown.take(&d.key) {
                    unknown.push(k);
                }
            }
        }
        drop(q);
        (docs, state_dirty, unknown, sync)
    }

    /// Puts back documents a failed commit did not persist; a newer version queued since
    /// wins.
    pub(crate) fn put_back(&self, docs: Vec<Document>, unknown: Vec<Vec<u8>>) {
        let mut q = self.dirty.lock();
        q.state_dirty = true;
        q.unknown.extend(unknown);
        // The failed batch goes back in front of what was queued since (seqno order); a
        // key queued since keeps its newer version.
        let newer = q.take_docs();
        for d in docs {
            q.push(d);
        }
        for d in newer {
            q.push(d);
        }
    }

    /// Drops everything queued (FLUSH).
    pub(crate) fn clear(&self) {
        let mut q = self.dirty.lock();
        q.take_docs();
        q.unknown.clear();
        q.state_dirty = false;
    }

    /// Documents waiting for the flusher.
    pub(crate) fn queued(&self) -> usize {
        self.dirty.lock().docs.len()
    }

    /// The persisted seqno.
    pub(crate) fn persisted(&self) -> u64 {
        self.persisted_seqno.load(Relaxed)
    }

    /// Sets the persisted seqno back to 0 (a replica starting over).
    pub(crate) fn reset_persisted(&self) {
        self.persisted_seqno.store(0, Relaxed);
    }

    /// Raises the persisted seqno and runs the waiters it satisfies.
    pub(crate) fn set_persisted(&self, seqno: u64) {
        self.persisted_seqno.fetch_max(seqno, Relaxed);
        let now = self.persisted();
        let ready: Vec<(u64, Waiter)> = {
            let mut w = self.waiters.lock();
            if w.is_empty() {
                return;
            }
            let (ready, keep): (Vec<_>, Vec<_>) = w.drain(..).partition(|(s, _)| *s <= now);
            *w = keep;
            ready
        };
        for (_, f) in ready {
            f(now);
        }
    }

    /// Runs `f` once the persisted seqno reaches `seqno` (at once if it has). Returns
    /// whether it waits (the caller then makes the flush urgent).
    pub(crate) fn when_persisted(&self, seqno: u64, f: Waiter) -> bool {
        let mut w = self.waiters.lock();
        let now = self.persisted();
        if now >= seqno {
            drop(w);
            f(now);
            false
        } else {
            w.push((seqno, f));
            true
        }
    }

    /// Waiters registered.
    pub(crate) fn waiter_count(&self) -> usize {
        self.waiters.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qdoc(key: &str, seqno: u64) -> Document {
        Document {
            key: key.as_bytes().to_vec(),
            value: bytes::Bytes::new(),
            seqno,
            cas: seqno,
            rev_seqno: 1,
            flags: 0,
            expiry: 0,
            datatype: 0,
            deleted: false,
        }
    }

    fn seqnos(docs: &[Document]) -> Vec<(String, u64)> {
        docs.iter()
            .map(|d| (String::from_utf8_lossy(&d.key).into_owned(), d.seqno))
            .collect()
    }

    #[test]
    fn the_dirty_queue_keeps_the_newest_version_of_each_key_in_seqno_order() {
        let p = VbPersist::default();
        assert!(
            p.queue(qdoc("a", 1)),
            "the first document finds the queue empty"
        );
        assert!(!p.queue(qdoc("b", 2)));
        assert!(!p.queue(qdoc("a", 3)));
        assert!(!p.queue(qdoc("c", 4)));
        assert_eq!(p.queued(), 3);
        let (docs, state_dirty, unknown, _) = p.take();
        assert_eq!(
            seqnos(&docs),
            [("b".into(), 2), ("a".into(), 3), ("c".into(), 4)]
        );
        assert!(!state_dirty && unknown.is_empty());
        assert_eq!(p.queued(), 0);
        assert!(p.queue(qdoc("a", 5)), "taking empties the queue");
    }

    #[test]
    fn a_failed_batch_goes_back_in_front_of_newer_writes() {
        let p = VbPersist::default();
        p.queue(qdoc("a", 1));
        p.queue(qdoc("b", 2));
        let (docs, ..) = p.take();
        p.queue(qdoc("b", 3));
        p.queue(qdoc("c", 4));
        p.put_back(docs, Vec::new());
        let (docs, state_dirty, ..) = p.take();
        assert_eq!(
            seqnos(&docs),
            [("a".into(), 1), ("b".into(), 3), ("c".into(), 4)],
            "b's newer version wins"
        );
        assert!(state_dirty, "a failed batch's state is written again");
    }

    #[test]
    fn a_hot_key_rewritten_while_nothing_flushes_does_not_grow_the_queue() {
        let p = VbPersist::default();
        p.queue(qdoc("cold", 1));
        for s in 2..100_000 {
            p.queue(qdoc("hot", s));
        }
        assert_eq!(p.queued(), 2, "one document per key");
        let (docs, ..) = p.take();
        assert_eq!(seqnos(&docs), [("cold".into(), 1), ("hot".into(), 99_999)]);
    }

    proptest::proptest! {
        #[test]
        fn the_dirty_queue_matches_a_model(
            ops in proptest::collection::vec((0u8..40, 0u8..10), 1..400)
        ) {
            // (key, 0): take and check; (key, 9): a failed take put back; else queue.
            let p = VbPersist::default();
            let mut model: std::collections::BTreeMap<u64, String> = Default::default();
            let mut seqno = 0;
            for (k, op) in ops {
                match op {
                    0 => {
                        let (docs, ..) = p.take();
                        let want: Vec<(String, u64)> =
                            std::mem::take(&mut model).into_iter().map(|(s, k)| (k, s)).collect();
                        proptest::prop_assert_eq!(seqnos(&docs), want);
                    }
                    9 => {
                        // A write of key k lands between the take and the put-back.
                        let (docs, ..) = p.take();
                        let taken = std::mem::take(&mut model);
                        seqno += 1;
                        let key = format!("k{k}");
                        p.queue(qdoc(&key, seqno));
                        p.put_back(docs, Vec::new());
                        model = taken.into_iter().filter(|(_, v)| *v != key).collect();
                        model.insert(seqno, key);
                    }
                    _ => {
                        seqno += 1;
                        let key = format!("k{k}");
                        model.retain(|_, v| *v != key);
                        model.insert(seqno, key.clone());
                        p.queue(qdoc(&key, seqno));
                    }
                }
                proptest::prop_assert_eq!(p.queued(), model.len());
            }
        }
    }
}
