//! [`VBucket`]: one partition of the bucket, with its state, hash table, ordering point
//! (seqno + HLC CAS + deleted revision) and failover log.

use crate::hlc;
use crate::vb_persist::VbPersist;
use epkv_hashtable::{HashTable, MemoryTracker};
use epkv_storage::Document;
use epkv_types::{Cas, Seqno, VBucketState, Vbid};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

/// Most failover entries kept per vBucket (KV-Engine `max_failover_entries`).
const MAX_FAILOVER_ENTRIES: usize = 25;

/// One entry of a vBucket's failover log: the history branch `uuid` began at `seqno`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FailoverEntry {
    /// Random branch id (64 random bits shifted right 16; never zero).
    pub(crate) uuid: u64,
    /// The high seqno when the branch began.
    pub(crate) seqno: u64,
}

/// The values assigned at the vBucket's single ordering point.
#[derive(Debug, Default)]
struct OrderPoint {
    /// The last seqno handed out (0 = none yet).
    high_seqno: u64,
    /// The largest CAS handed out (mutations and lock CASes).
    max_cas: u64,
    /// The largest revision seqno any deleted (or expired) item of this vBucket had; a
    /// key created afresh starts above it.
    max_deleted_rev: u64,
    /// The last seqno readers can see: a mutation, deletion or commit, not a SyncWrite's
    /// prepare or abort (KV-Engine's max visible seqno).
    max_visible: u64,
}

impl OrderPoint {
    /// Hands out the next seqno and a CAS above every earlier one (so that seqno order and
    /// CAS order agree), after raising the max deleted revision to `deleted_rev` (a
    /// deletion's tombstone); `visible` moves the max visible seqno to it.
    fn next(&mut self, now_nanos: u64, deleted_rev: Option<u64>, visible: bool) -> Assigned {
        if let Some(rev) = deleted_rev {
            self.max_deleted_rev = self.max_deleted_rev.max(rev);
        }
        self.high_seqno += 1;
        if visible {
            self.max_visible = self.high_seqno;
        }
        self.max_cas = hlc::next_cas(self.max_cas, now_nanos);
        Assigned {
            seqno: Seqno(self.high_seqno),
            cas: Cas(self.max_cas),
            new_key_rev: self.max_deleted_rev + 1,
        }
    }
}

/// What a SyncWrite step is, at the ordering point ([`VBucket::assign_sync`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SyncStep {
    /// A prepare (raises the high prepared seqno).
    pub(crate) prepared: bool,
    /// The prepare seqno a commit or abort completes (raises the high completed seqno);
    /// 0 for a prepare.
    pub(crate) completed: u64,
    /// For the commit of a deletion, its revision.
    pub(crate) deleted_rev: Option<u64>,
    /// Readers see it: a commit.
    pub(crate) visible: bool,
    /// For a prepare, its durability level (1-3) as DCP sends it; 0 otherwise.
    pub(crate) level: u8,
}

/// Where a vBucket is in warmup ([`VBucket::warmup_phase`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WarmupPhase {
    /// Serving: nothing to load, or loaded.
    Ready,
    /// Its files are still being loaded: data requests answer TempFail, and nothing may
    /// write to it (a mutation now would take a seqno below the stored ones).
    Loading,
    /// Loading failed (a corrupt or unreadable file): the vBucket is unavailable
    /// (NotMyVbucket, like a dead vBucket) and its files are left untouched.
    Failed,
}

impl WarmupPhase {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Ready,
            1 => Self::Loading,
            _ => Self::Failed,
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            Self::Ready => 0,
            Self::Loading => 1,
            Self::Failed => 2,
        }
    }
}

/// Seqno, CAS and (for new keys) revision seqno handed out for one mutation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Assigned {
    /// The mutation's seqno.
    pub(crate) seqno: Seqno,
    /// The mutation's CAS.
    pub(crate) cas: Cas,
    /// The revision seqno a newly created key starts with (max deleted revision + 1).
    pub(crate) new_key_rev: u64,
}

/// One vBucket.
///
/// Locking (see the crate docs for the global order): `state` is held shared by every
/// client operation for its whole duration and exclusively by a state change; the hash
/// table's stripe lock is taken next; `order` is taken last, briefly, while the stripe
/// lock is held; `failover` is taken only by state changes and stats, with `state` held.
///
/// Layout: every client operation reads the warmup phase, takes `state` shared and then
/// goes to the hash table's stripes, so those fields come first (`repr(C)`) and the
/// struct is cache-line aligned: they share one line, which is one cache miss per
/// operation instead of up to three (the vBucket array is 1024 entries of several lines
/// each, too large to stay cached under load). A test checks that the hot fields fit in
/// the first 64 bytes.
#[repr(C, align(64))]
pub(crate) struct VBucket {
    /// This vBucket's id.
    pub(crate) id: Vbid,
    /// [`WarmupPhase`] as a u8. Goes Loading → Ready or Loading → Failed once (FLUSH,
    /// which deletes the files, also makes a Failed vBucket Ready). Written with Release
    /// after warmup has stored everything it loaded; read with Acquire before an
    /// operation touches the vBucket.
    warmup: AtomicU8,
    /// True when the bucket persists: mutations are queued for the flusher.
    persistent: bool,
    /// The state; protects "which operations may run" for the duration of an operation.
    state: RwLock<VBucketState>,
    /// The items.
    pub(crate) table: HashTable,
    /// The ordering point. Protected by its own mutex, always taken inside a stripe lock.
    order: Mutex<OrderPoint>,
    /// The newest failover entry's uuid, readable without locks; written with `failover`
    /// held.
    uuid: AtomicU64,
    /// The failover log, newest first. Protected by its mutex.
    failover: Mutex<Vec<FailoverEntry>>,
    /// Persistence state: the dirty queue (filled at the ordering point, with `order`
    /// held), the persisted seqno and its waiters. Unused by an ephemeral bucket.
    pub(crate) persist: VbPersist,
    /// The state as its `u8`, written with `state` held exclusively and read without any
    /// lock by the item pager's ordering (a hint: it may be one change behind).
    state_hint: AtomicU8,
    /// Full eviction's key filter and evicted count; `None` with value eviction.
    pub(crate) full: Option<crate::key_filter::FullState>,
    /// Numbers placeholders (kept in their CAS, which nothing else reads): a fetch
    /// restores only over the placeholder that was there when its read began.
    placeholders: AtomicU64,
    /// Some document of this vBucket has (or had) extended attributes: a SET that does
    /// not know what it replaces (full eviction, key not in memory) must then read the
    /// old version, to keep its attributes (KV-Engine's `mayContainXattrs`).
    may_contain_xattrs: AtomicBool,
    /// SyncWrites in flight, in seqno order (see [`crate::durability`]).
    pub(crate) durability: crate::durability_monitor::Monitor,
    /// Recent changes for DCP streams, kept only while one is open ([`crate::dcp`]).
    pub(crate) dcp: crate::dcp_log::DcpLog,
    /// Client operations parked while the vBucket is pending ([`Self::park_if_pending`]).
    pub(crate) pending_ops: crate::pending_ops::PendingOps,
}

/// Datatype bit of a tombstone the expiry of its document made (on disk and in the DCP
/// log; never a client bit, and masked off wherever a stored datatype is read back), so
/// that DCP streams send it as an expiration, from memory or from disk.
pub(crate) const EXPIRED_TOMBSTONE: u8 = 0x40;

/// The datatype a stored document's `datatype` byte gives clients: its client bits only
/// (without [`EXPIRED_TOMBSTONE`] or a prepare's mark).
pub(crate) fn client_datatype(stored: u8) -> epkv_types::Datatype {
    epkv_types::Datatype(stored).intersect(epkv_types::Datatype::ALL)
}

/// Why a document is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeleteSource {
    /// A client (or the item pager of a memory-only bucket) deleted it.
    Explicit,
    /// It expired.
    Expiry,
}

impl DeleteSource {
    /// The datatype bits its tombstone carries.
    pub(crate) fn tombstone_bits(self) -> u8 {
        match self {
            Self::Explicit => 0,
            Self::Expiry => EXPIRED_TOMBSTONE,
        }
    }
}

/// The document the flusher persists for a deletion of `key` at `a` (revision `rev`).
pub(crate) fn tombstone_document(key: Vec<u8>, a: &Assigned, rev: u64) -> Document {
    Document {
        key,
        value: bytes::Bytes::new(),
        seqno: a.seqno.0,
        cas: a.cas.0,
        rev_seqno: rev,
        flags: 0,
        expiry: 0,
        datatype: 0,
        deleted: true,
    }
}

fn new_failover_uuid() -> u64 {
    loop {
        let uuid = rand::random::<u64>() >> 16;
        if uuid != 0 {
            return uuid;
        }
    }
}

impl VBucket {
    /// Creates a vBucket in `state` with an empty table charging `tracker`.
    pub(crate) fn new(
        id: Vbid,
        state: VBucketState,
        ht_locks: usize,
        tracker: Arc<MemoryTracker>,
    ) -> epkv_hashtable::Result<Self> {
        let uuid = new_failover_uuid();
        Ok(Self {
            id,
            state: RwLock::new(state),
            table: HashTable::new(ht_locks, tracker)?,
            order: Mutex::new(OrderPoint::default()),
            uuid: AtomicU64::new(uuid),
            failover: Mutex::new(vec![FailoverEntry { uuid, seqno: 0 }]),
            persist: VbPersist::default(),
            persistent: false,
            warmup: AtomicU8::new(0),
            state_hint: AtomicU8::new(state as u8),
            full: None,
            placeholders: AtomicU64::new(0),
            may_contain_xattrs: AtomicBool::new(false),
            durability: crate::durability_monitor::Monitor::default(),
            dcp: crate::dcp_log::DcpLog::default(),
            pending_ops: crate::pending_ops::PendingOps::default(),
        })
    }

    /// Live documents: in memory, plus (full eviction) those only on disk.
    pub(crate) fn item_count(&self) -> usize {
        let on_disk = self.full.as_ref().map_or(0, |f| f.evicted());
        self.table
            .len()
            .saturating_add(usize::try_from(on_disk).unwrap_or(usize::MAX))
    }

    /// Notes a live version of `key` written here (full eviction: the key filter must
    /// contain every key that may exist).
    pub(crate) fn note_written(&self, key: &[u8]) {
        if let Some(full) = &self.full {
            full.filter.add(key);
        }
    }

    /// Whether some document of this vBucket may have extended attributes.
    pub(crate) fn may_contain_xattrs(&self) -> bool {
        self.may_contain_xattrs.load(Relaxed)
    }

    /// Notes a document with extended attributes (it never goes back to false).
    pub(crate) fn note_xattrs(&self, datatype: epkv_types::Datatype) {
        if datatype.contains(epkv_types::Datatype::XATTR) && !self.may_contain_xattrs() {
            self.may_contain_xattrs.store(true, Relaxed);
        }
    }

    /// The persisted seqno: every version of this vBucket up to it is on disk, so an item
    /// whose seqno is at or below it is clean whatever its dirty bit says (the flusher
    /// does not clear the bits; see [`epkv_hashtable::Entry::mark_clean_upto`]). 0 for a
    /// memory-only vBucket.
    pub(crate) fn persisted_seqno(&self) -> Seqno {
        Seqno(self.persist.persisted())
    }

    /// True when the bucket persists (mutations are queued for the flusher).
    pub(crate) fn is_persistent(&self) -> bool {
        self.persistent
    }

    /// Makes this vBucket queue its mutations for the flusher.
    pub(crate) fn with_persistence(mut self) -> Self {
        self.persistent = true;
        self
    }

    /// A new placeholder for `key` (see [`crate::full_eviction`]), with its own number.
    pub(crate) fn new_placeholder(
        &self,
        key: &[u8],
    ) -> epkv_hashtable::Result<epkv_hashtable::StoredValue> {
        let token = self.placeholders.fetch_add(1, Ordering::Relaxed) + 1;
        Ok(
            epkv_hashtable::StoredValue::new_placeholder(key)?.with_meta(
                epkv_hashtable::ItemMeta {
                    cas: Cas(token),
                    ..epkv_hashtable::ItemMeta::default()
                },
            ),
        )
    }

    /// Makes this vBucket evict whole documents (it gets a key filter).
    pub(crate) fn with_full_eviction(mut self) -> Self {
        self.full = Some(crate::key_filter::FullState::new());
        self
    }

    /// Restores what warmup read from disk: state, failover log, high seqno, max CAS and
    /// max deleted revision; the persisted seqno becomes the high seqno.
    pub(crate) fn restore(
        &self,
        state: VBucketState,
        failover: Vec<FailoverEntry>,
        high_seqno: u64,
        max_cas: u64,
        max_deleted_rev: u64,
    ) {
        let mut st = self.state.write();
        {
            let mut o = self.order.lock();
            o.high_seqno = high_seqno;
            o.max_visible = high_seqno;
            o.max_cas = o.max_cas.max(max_cas);
            o.max_deleted_rev = o.max_deleted_rev.max(max_deleted_rev);
        }
        if let Some(first) = failover.first() {
            self.uuid.store(first.uuid, Ordering::Relaxed);
            *self.failover.lock() = failover;
        }
        *st = state;
        self.state_hint.store(state as u8, Ordering::Relaxed);
        self.persist.set_persisted(high_seqno);
    }

    /// Where this vBucket is in warmup.
    pub(crate) fn warmup_phase(&self) -> WarmupPhase {
        WarmupPhase::from_u8(self.warmup.load(Ordering::Acquire))
    }

    /// TempFail while warmup is loading this vBucket, NotMyVbucket if loading failed.
    pub(crate) fn check_warm(&self) -> epkv_engine_api::EngineResult<()> {
        match self.warmup_phase() {
            WarmupPhase::Ready => Ok(()),
            WarmupPhase::Loading => Err(epkv_engine_api::EngineStatus::TempFail),
            WarmupPhase::Failed => Err(epkv_engine_api::EngineStatus::NotMyVbucket),
        }
    }

    /// Moves this vBucket to another warmup phase.
    pub(crate) fn set_warmup_phase(&self, phase: WarmupPhase) {
        self.warmup.store(phase.as_u8(), Ordering::Release);
    }

    /// Takes the state lock shared; the guard keeps the state from changing.
    pub(crate) fn state(&self) -> RwLockReadGuard<'_, VBucketState> {
        self.state.read()
    }

    /// Parks `done` (an operation's [`epkv_engine_api::Engine::when_fetched`]) until the
    /// vBucket leaves the pending state, or `deadline`, if it is pending: checked and
    /// parked under the state lock, which a state change holds exclusively, so that an
    /// operation is parked before the change (and released by it) or sees the new state.
    /// Returns the deadline to arm the timeout task for, if it must be armed; or `done`
    /// back when the vBucket is not pending.
    pub(crate) fn park_if_pending(
        &self,
        deadline: std::time::Instant,
        done: epkv_engine_api::FetchedCallback,
    ) -> Result<Option<std::time::Instant>, epkv_engine_api::FetchedCallback> {
        let state = self.state.read();
        if *state != VBucketState::Pending {
            return Err(done);
        }
        Ok(self.pending_ops.park(deadline, done))
    }

    /// Changes the state, then runs `then` with the state it had, the state lock still
    /// held exclusively: no client operation runs between the change and what `then`
    /// does (SET_VBUCKET settles the SyncWrites in flight there). Becoming active from
    /// another state starts a new failover branch; leaving the pending state calls the
    /// operations parked on it (after `then`, no lock held), which then run again in the
    /// new state.
    pub(crate) fn set_state(&self, new_state: VBucketState, then: impl FnOnce(VBucketState)) {
        let mut state = self.state.write();
        let was = *state;
        if *state != new_state && self.persistent {
            self.persist.mark_state_dirty();
        }
        if *state != VBucketState::Active && new_state == VBucketState::Active {
            let seqno = self.order.lock().high_seqno;
            let uuid = new_failover_uuid();
            let mut log = self.failover.lock();
            log.insert(0, FailoverEntry { uuid, seqno });
            log.truncate(MAX_FAILOVER_ENTRIES);
            self.uuid.store(uuid, Ordering::Relaxed);
        }
        let unparked = if *state == VBucketState::Pending && new_state != VBucketState::Pending {
            self.pending_ops.take_all()
        } else {
            Vec::new()
        };
        *state = new_state;
        self.state_hint.store(new_state as u8, Ordering::Relaxed);
        then(was);
        drop(state);
        // DCP streams end when their vBucket stops being active (or pending).
        self.dcp.wake_all();
        for done in unparked {
            done(Ok(()));
        }
    }

    /// Attaches a DCP stream to the log ([`crate::dcp_log::DcpLog::attach`]) and returns the
    /// high seqno the log starts after.
    pub(crate) fn dcp_attach(&self) -> u64 {
        let o = self.order.lock();
        self.dcp.attach(o.high_seqno);
        o.high_seqno
    }

    /// The state without taking the state lock (possibly one change behind).
    pub(crate) fn state_hint(&self) -> VBucketState {
        VBucketState::from_u8(self.state_hint.load(Ordering::Relaxed)).unwrap_or(VBucketState::Dead)
    }

    /// Starts a new failover branch at the current high seqno (after an unclean shutdown,
    /// as KV-Engine does at warmup: writes acknowledged but not persisted may be gone, so
    /// clients must not trust seqnos above it under the old uuid).
    pub(crate) fn start_failover_branch(&self) {
        let _state = self.state.write();
        let seqno = self.order.lock().high_seqno;
        let uuid = new_failover_uuid();
        let mut log = self.failover.lock();
        log.insert(0, FailoverEntry { uuid, seqno });
        log.truncate(MAX_FAILOVER_ENTRIES);
        self.uuid.store(uuid, Ordering::Relaxed);
        if self.persistent {
            self.persist.mark_state_dirty();
        }
    }

    /// Returns the current failover uuid.
    pub(crate) fn uuid(&self) -> u64 {
        self.uuid.load(Ordering::Relaxed)
    }

    /// Returns the failover log, newest first.
    pub(crate) fn failover_log(&self) -> Vec<FailoverEntry> {
        self.failover.lock().clone()
    }

    /// Runs `f` on the failover log under its lock (no copy of it).
    pub(crate) fn with_failover_log<T>(&self, f: impl FnOnce(&[FailoverEntry]) -> T) -> T {
        f(&self.failover.lock())
    }

    /// The last seqno readers can see (see `OrderPoint::max_visible`).
    pub(crate) fn max_visible_seqno(&self) -> u64 {
        self.order.lock().max_visible
    }

    /// Returns (high seqno, max CAS, max deleted revision).
    pub(crate) fn ordering_snapshot(&self) -> (u64, u64, u64) {
        let o = self.order.lock();
        (o.high_seqno, o.max_cas, o.max_deleted_rev)
    }

    /// The ordering point for a mutation: hands out the next seqno and a CAS above every
    /// earlier one, so that seqno order and CAS order agree. Call with the key's stripe
    /// lock held. (The engine uses [`VBucket::assign_mutation_queued`].)
    #[cfg(test)]
    pub(crate) fn assign_mutation(&self, now_nanos: u64) -> Assigned {
        self.order.lock().next(now_nanos, None, false)
    }

    /// The ordering point for a deletion (explicit or expiry) of an item whose tombstone
    /// has revision `deleted_rev`. Call with the key's stripe lock held. (The engine uses
    /// [`VBucket::assign_deletion_queued`].)
    #[cfg(test)]
    pub(crate) fn assign_deletion(&self, now_nanos: u64, deleted_rev: u64) -> Assigned {
        self.order.lock().next(now_nanos, Some(deleted_rev), false)
    }

    /// As [`VBucket::assign_mutation`], and (when persistent) queues the document `make`
    /// builds for the flusher while the ordering point is held, so that the dirty queue
    /// always holds every seqno up to the high seqno. Returns whether the queue was empty
    /// (the flusher needs a wake).
    pub(crate) fn assign_mutation_queued(
        &self,
        now_nanos: u64,
        make: impl FnOnce(&Assigned) -> Document,
    ) -> (Assigned, bool) {
        self.assign_queued(now_nanos, None, make)
    }

    /// The ordering point of a mutation or (with `deleted_rev`, the tombstone's revision)
    /// a deletion, queueing the document `make` builds when persistent. Returns whether
    /// the queue was empty.
    pub(crate) fn assign_queued(
        &self,
        now_nanos: u64,
        deleted_rev: Option<u64>,
        make: impl FnOnce(&Assigned) -> Document,
    ) -> (Assigned, bool) {
        let mut o = self.order.lock();
        let a = o.next(now_nanos, deleted_rev, true);
        let kind = if deleted_rev.is_some() {
            crate::dcp_log::LogKind::Deletion
        } else {
            crate::dcp_log::LogKind::Mutation
        };
        let woke = self.log_and_queue(kind, &a, make);
        (a, woke)
    }

    /// With the ordering lock held: builds the change's document when it is persisted or
    /// streamed, appends it to the DCP log as `kind` and queues it for the flusher.
    /// Returns whether the queue was empty.
    fn log_and_queue(
        &self,
        kind: crate::dcp_log::LogKind,
        a: &Assigned,
        make: impl FnOnce(&Assigned) -> Document,
    ) -> bool {
        let dcp = self.dcp.is_on();
        if !self.persistent && !dcp {
            return false;
        }
        let doc = make(a);
        if dcp {
            self.dcp.append(kind, &doc, self.table.tracker());
        }
        self.persistent && self.persist.queue(doc)
    }

    /// The ordering point of a scope or collection change (a system event, see
    /// [`crate::system_events`]): the next seqno and a CAS, the document `make` builds
    /// logged for DCP and queued when persistent. Takes no stripe lock (no key of the
    /// hash table is involved). Returns whether the queue was empty.
    pub(crate) fn assign_system(
        &self,
        now_nanos: u64,
        make: impl FnOnce(&Assigned) -> Document,
    ) -> (Assigned, bool) {
        let a = self.order.lock().next(now_nanos, None, true);
        let woke = self.log_and_queue(crate::dcp_log::LogKind::System, &a, make);
        (a, woke)
    }

    /// The ordering point of a SyncWrite `step`: `track` runs with the ordering lock held
    /// (so the durability monitor learns of prepares in seqno order) and says whether the
    /// step's document is to be persisted; if so and persistent, the document `make`
    /// builds is queued with the step's prepared and completed seqnos (see
    /// [`VbPersist::queue_sync`]). Returns whether the queue was empty.
    pub(crate) fn assign_sync(
        &self,
        now_nanos: u64,
        step: SyncStep,
        track: impl FnOnce(&Assigned) -> bool,
        make: impl FnOnce(&Assigned) -> Document,
    ) -> (Assigned, bool) {
        let SyncStep {
            prepared,
            completed,
            deleted_rev,
            visible,
            level,
        } = step;
        let mut o = self.order.lock();
        let a = o.next(now_nanos, deleted_rev, visible);
        let persist = track(&a);
        // A completion also covers its prepare (HPS >= HCS).
        let hps = if prepared { a.seqno.0 } else { completed };
        let dcp = self.dcp.is_on();
        let woke = if (self.persistent && persist) || dcp {
            let doc = make(&a);
            if dcp {
                let kind = match (prepared, visible) {
                    (true, _) => crate::dcp_log::LogKind::Prepare(level),
                    (false, true) => crate::dcp_log::LogKind::Commit(completed),
                    (false, false) => crate::dcp_log::LogKind::Abort(completed),
                };
                self.dcp.append(kind, &doc, self.table.tracker());
            }
            self.persistent && persist && self.persist.queue_sync(doc, (hps, completed))
        } else {
            false
        };
        (a, woke)
    }

    /// As [`VBucket::assign_deletion`], queueing a tombstone of `key` (deleted by
    /// `source`) when persistent. Returns whether the queue was empty.
    pub(crate) fn assign_deletion_queued(
        &self,
        now_nanos: u64,
        deleted_rev: u64,
        key: &[u8],
        source: DeleteSource,
    ) -> (Assigned, bool) {
        self.assign_queued(now_nanos, Some(deleted_rev), |a| {
            let mut doc = tombstone_document(key.to_vec(), a, deleted_rev);
            doc.datatype |= source.tombstone_bits();
            doc
        })
    }

    /// The ordering point of a change a replica receives: the active's seqno and CAS
    /// (above every earlier one; the caller checked) become this vBucket's, and the
    /// document `make` builds is queued when persistent. Returns whether the queue was
    /// empty.
    pub(crate) fn assign_replicated(
        &self,
        seqno: u64,
        cas: u64,
        deleted_rev: Option<u64>,
        sync: Option<SyncStep>,
        make: impl FnOnce(&Assigned) -> Document,
    ) -> (Assigned, bool) {
        let mut o = self.order.lock();
        if let Some(rev) = deleted_rev {
            o.max_deleted_rev = o.max_deleted_rev.max(rev);
        }
        o.high_seqno = o.high_seqno.max(seqno);
        if sync.is_none_or(|s| s.visible) {
            o.max_visible = o.high_seqno;
        }
        o.max_cas = o.max_cas.max(cas);
        let a = Assigned {
            seqno: Seqno(seqno),
            cas: Cas(cas),
            new_key_rev: o.max_deleted_rev + 1,
        };
        let woke = self.persistent
            && match sync {
                None => self.persist.queue(make(&a)),
                Some(s) => {
                    let hps = if s.prepared { seqno } else { s.completed };
                    self.persist.queue_sync(make(&a), (hps, s.completed))
                }
            };
        (a, woke)
    }

    /// Replaces the failover log (newest first) with the active's, as a replica does.
    pub(crate) fn replace_failover_log(&self, log: &[(u64, u64)]) {
        let mut f = self.failover.lock();
        *f = log
            .iter()
            .take(MAX_FAILOVER_ENTRIES)
            .map(|&(uuid, seqno)| FailoverEntry { uuid, seqno })
            .collect();
        if let Some(first) = f.first() {
            self.uuid.store(first.uuid, Ordering::Relaxed);
        }
    }

    /// Restarts the seqnos at 0 (a replica starting over; its documents are gone).
    pub(crate) fn reset_seqnos(&self) {
        let mut o = self.order.lock();
        o.high_seqno = 0;
        o.max_visible = 0;
        drop(o);
        self.persist.reset_persisted();
    }

    /// Hands out a CAS without a seqno (the CAS of a GET_LOCKED lock).
    pub(crate) fn assign_lock_cas(&self, now_nanos: u64) -> Cas {
        let mut o = self.order.lock();
        o.max_cas = hlc::next_cas(o.max_cas, now_nanos);
        Cas(o.max_cas)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vb() -> VBucket {
        VBucket::new(
            Vbid(3),
            VBucketState::Active,
            2,
            Arc::new(MemoryTracker::unlimited()),
        )
        .unwrap()
    }

    #[test]
    fn the_fields_every_operation_reads_share_the_first_cache_line() {
        // A lookup reads the table's front; the rest (the memory tracker's address) only
        // writes read, and they read `order`, in the second line, anyway.
        let end_of_table = std::mem::offset_of!(VBucket, table) + HashTable::LOOKUP_BYTES;
        assert!(end_of_table <= 64, "hot fields end at byte {end_of_table}");
        assert!(std::mem::offset_of!(VBucket, state) < end_of_table);
        assert!(std::mem::offset_of!(VBucket, warmup) < end_of_table);
        assert_eq!(std::mem::align_of::<VBucket>(), 64);
    }

    #[test]
    fn seqnos_and_cas_increase_together() {
        let vb = vb();
        let a = vb.assign_mutation(1_000_000_000);
        let b = vb.assign_mutation(1_000_000_000);
        let c = vb.assign_mutation(500);
        assert_eq!((a.seqno, b.seqno, c.seqno), (Seqno(1), Seqno(2), Seqno(3)));
        assert!(a.cas < b.cas && b.cas < c.cas);
    }

    #[test]
    fn deletion_raises_the_revision_of_new_keys() {
        let vb = vb();
        assert_eq!(vb.assign_mutation(1).new_key_rev, 1);
        vb.assign_deletion(1, 7);
        vb.assign_deletion(1, 3);
        assert_eq!(vb.assign_mutation(1).new_key_rev, 8);
        assert_eq!(vb.ordering_snapshot().0, 4);
    }

    #[test]
    fn lock_cas_is_above_mutation_cas_but_takes_no_seqno() {
        let vb = vb();
        let m = vb.assign_mutation(10 << 16);
        let l = vb.assign_lock_cas(10 << 16);
        let m2 = vb.assign_mutation(10 << 16);
        assert!(m.cas < l && l < m2.cas);
        assert_eq!(m2.seqno, Seqno(2));
    }

    #[test]
    fn promotion_to_active_starts_a_failover_branch() {
        let vb = vb();
        let first = vb.uuid();
        assert_ne!(first, 0);
        vb.assign_mutation(1);
        vb.set_state(VBucketState::Active, |_| {});
        assert_eq!(
            vb.failover_log().len(),
            1,
            "active → active is not a promotion"
        );
        vb.set_state(VBucketState::Replica, |_| {});
        vb.set_state(VBucketState::Active, |was| {
            assert_eq!(was, VBucketState::Replica);
        });
        let log = vb.failover_log();
        assert_eq!(log.len(), 2);
        assert_eq!(log[0].seqno, 1);
        assert_eq!(log[0].uuid, vb.uuid());
        assert_eq!(log[1].uuid, first);
        assert_eq!(*vb.state(), VBucketState::Active);
    }
}
