//! SyncWrites: durable writes as KV-Engine makes them (`docs/durability.md`).
//!
//! A write with durability requirements does not change the committed document. It
//! becomes a *prepare*, held in the hash table's prepared slot beside the committed
//! version:
//! - reads keep seeing the committed version;
//! - any other write of the key answers SyncWriteInProgress (0xa2) until the prepare
//!   completes.
//!
//! Each vBucket's [`Monitor`] tracks its prepares in seqno order and completes them in
//! that order, from the head, as the active durability monitor does. A majority is of
//! the vBucket's chain (this node and its replicas, [`Monitor::set_chain`]); a replica
//! counts once it acknowledged the prepare (DCP_SEQNO_ACKNOWLEDGED: a replica
//! acknowledges a PersistToMajority prepare only once it is on its disk):
//! - **Majority** is satisfied once a majority holds the prepare: at once on a single
//!   node, unless an earlier prepare of a persist level is still waiting for the disk (it
//!   fences the ones behind it);
//! - **MajorityAndPersistOnMaster** also needs the prepare on this node's disk;
//! - **PersistToMajority** needs it on this node's disk and acknowledged (persisted) by
//!   enough replicas.
//!
//! A chain whose live nodes cannot make a majority (a failed-over replica) answers
//! DurabilityImpossible. A replica vBucket keeps the prepares it receives in its
//! passive state until their commit or abort arrives (`crate::replica`).
//!
//! A **commit** turns the prepare into the committed version in place. It gets a new
//! seqno and keeps the prepare's CAS. The client hears success.
//!
//! An **abort** happens when the head's timeout passes first: the client's timeout, or
//! [`DEFAULT_TIMEOUT`]. The prepare is dropped with a new seqno and the client hears
//! SyncWriteAmbiguous (0xa3), since the prepare may already be on disk.
//!
//! **Timeouts** are kept by one task per vBucket on the NonIO group, created on the
//! vBucket's first SyncWrite. It is re-armed (the executor's O(1) snooze) to the head's
//! deadline whenever that changes; there is no timer per connection or per write.
//!
//! **Waiting.** The front end learns a write's outcome through
//! [`Bucket::when_sync_write_completed`] with the prepare's seqno. An outcome that
//! arrives before the front end asks is kept until it does.
//!
//! **On disk**, a prepare is a document under its key in a namespace of its own: the
//! bytes [`PREPARE_PREFIX`] (reserved collection id 2, KV-Engine's DurabilityPrepare
//! namespace) and then the key, so it never shadows the committed document. A durable
//! delete's prepare carries [`PREPARE_DELETES`] in its datatype. A commit is persisted as
//! the committed document. An abort is persisted as a tombstone of the prepare key.
//!
//! Every flush writes the high prepared and high completed seqnos (HPS, HCS) carried by
//! the documents it persists. Warmup loads the live prepares above the HCS as
//! `PreparedMaybeVisible`: the write may have been acknowledged before the crash. On a
//! single node they are persisted, so they are committed again before the vBucket
//! serves; a reader never sees the state from before them.

use std::collections::{HashMap, VecDeque};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use epkv_engine_api::{DurabilityRequirements, EngineResult, EngineStatus, SyncWriteCallback};
use epkv_hashtable::{CommittedState, Entry, ItemMeta, StoredValue};
use epkv_storage::Document;
use epkv_types::{Datatype, DurabilityLevel, Vbid};
use parking_lot::Mutex;

use crate::bucket::{Bucket, LazyNow};
use crate::stats::Counter;
use crate::vbucket::{Assigned, SyncStep, VBucket, tombstone_document};

/// The durability timeout of a SyncWrite whose client gave none (KV-Engine's 30 s).
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The prefix of a prepare's key on disk: a zero byte and the LEB128 id 2, a collection
/// id reserved by Couchbase and never given to a collection (see `epkv_types::doc_key`),
/// so no document key starts with it.
pub(crate) const PREPARE_PREFIX: [u8; 2] = [0, 2];

/// Datatype bit of a prepare document on disk that deletes its key (not a client bit).
pub(crate) const PREPARE_DELETES: u8 = 0x80;

/// Outcomes kept for a front end that has not asked yet; past this many the oldest go
/// (a caller that never asks, such as a test driving the engine directly).
const MAX_UNCLAIMED: usize = 1 << 16;

/// The key under which the prepare of `key` is stored.
pub(crate) fn prepare_key(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(PREPARE_PREFIX.len() + key.len());
    k.extend_from_slice(&PREPARE_PREFIX);
    k.extend_from_slice(key);
    k
}

/// The document key of a stored prepare, or `None` for any other stored key.
pub(crate) fn prepared_key_of(stored: &[u8]) -> Option<&[u8]> {
    stored.strip_prefix(&PREPARE_PREFIX[..])
}

/// One prepare in flight.
struct Tracked {
    seqno: u64,
    key: Vec<u8>,
    /// Its level needs this node's persistence (not Majority).
    persist: bool,
    /// When it is aborted if not committed; `None` for prepares warmup restored.
    deadline: Option<Instant>,
    waiter: Option<SyncWriteCallback>,
    /// It needs the replicas' acknowledgements (false for prepares warmup restored or a
    /// promoted replica held: they are committed once this node has them on disk).
    needs_acks: bool,
}

/// A prepare a replica vBucket holds, until its commit or abort arrives.
#[derive(Debug, Clone)]
pub(crate) struct Passive {
    pub(crate) seqno: u64,
    pub(crate) key: Vec<u8>,
    /// Its level needs persistence (the replica acknowledges it only once persisted).
    pub(crate) persist: bool,
}

/// The prepares of a replica vBucket and what it has acknowledged.
#[derive(Debug, Default)]
struct PassiveState {
    /// In seqno order.
    prepares: VecDeque<Passive>,
    /// The highest prepare seqno received.
    high_prepared: u64,
    /// The highest prepared seqno acknowledgeable (see [`Monitor::replica_hps`]).
    acked: u64,
}

#[derive(Default)]
struct State {
    /// In seqno order.
    tracked: VecDeque<Tracked>,
    /// Prepares taken off `tracked` whose completion is being applied, with their
    /// waiter if one asked: a waiter that asks meanwhile is attached here, so it hears
    /// the outcome only once the commit or abort is in the hash table.
    resolving: HashMap<u64, Option<SyncWriteCallback>>,
    /// Failures (aborts) of completed prepares nobody has asked for yet, by prepare
    /// seqno. A commit is not kept: a completed prepare found nowhere was committed.
    unclaimed: HashMap<u64, EngineResult<()>>,
    /// The highest seqno `unclaimed` dropped for room: an outcome asked for at or below
    /// it may have been a failure, so it reads as ambiguous.
    forgotten_upto: u64,
    /// The deadline the timeout task was last armed for.
    armed: Option<Instant>,
    /// The highest prepare seqno tracked (HPS) and the highest completed (HCS).
    high_prepared: u64,
    high_completed: u64,
    /// Replica slots of the vBucket's chain (0: this node alone is the majority).
    replicas: usize,
    /// Of those, the slots a node holds (a failed-over node leaves an empty slot).
    live_replicas: usize,
    /// Each replica's acknowledged high prepared seqno, by its DCP connection name.
    acks: Vec<(String, u64)>,
}

impl State {
    /// Replica acknowledgements a prepare needs: a majority of the chain of
    /// `1 + replicas` nodes (`(1 + replicas) / 2 + 1`), minus this node.
    fn acks_needed(&self) -> usize {
        self.replicas.div_ceil(2)
    }

    /// Replicas that acknowledged `seqno`.
    fn acked(&self, seqno: u64) -> usize {
        self.acks.iter().filter(|(_, a)| *a >= seqno).count()
    }
}

/// A vBucket's SyncWrites in flight (KV-Engine's ActiveDurabilityMonitor), and as a
/// replica the prepares it holds (its PassiveDurabilityMonitor).
#[derive(Default)]
pub(crate) struct Monitor {
    state: Mutex<State>,
    /// Held while completions are applied, so that they are applied in seqno order.
    completing: Mutex<()>,
    /// The timeout task, once the vBucket has had a SyncWrite with a deadline.
    task: OnceLock<epkv_executor::TaskHandle>,
    /// As a replica: the prepares received and not completed.
    passive: Mutex<PassiveState>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("tracked", &self.len())
            .finish_non_exhaustive()
    }
}

impl Monitor {
    /// SyncWrites in flight (not counting completions being applied).
    pub(crate) fn len(&self) -> usize {
        self.state.lock().tracked.len()
    }

    fn track(&self, t: Tracked) {
        let mut s = self.state.lock();
        s.high_prepared = s.high_prepared.max(t.seqno);
        s.tracked.push_back(t);
    }

    /// Tracks a prepare, unless it is a Majority one with nothing in flight before it:
    /// that one is resolved already (this node is its own majority, and no persist-level
    /// prepare fences it), so it is recorded as completed and the caller commits it in
    /// place. Returns whether it did so.
    fn track_or_complete(&self, t: Tracked, majority: bool) -> bool {
        let mut s = self.state.lock();
        s.high_prepared = s.high_prepared.max(t.seqno);
        if majority && s.tracked.is_empty() && s.replicas == 0 {
            s.high_completed = s.high_completed.max(t.seqno);
            return true;
        }
        s.tracked.push_back(t);
        false
    }

    /// The high prepared and high completed seqnos.
    pub(crate) fn seqnos(&self) -> (u64, u64) {
        let s = self.state.lock();
        (s.high_prepared, s.high_completed)
    }

    /// Sets the high prepared and completed seqnos warmup read.
    pub(crate) fn restore_seqnos(&self, prepared: u64, completed: u64) {
        let mut s = self.state.lock();
        s.high_prepared = s.high_prepared.max(prepared);
        s.high_completed = s.high_completed.max(completed);
    }

    /// Takes the head if it is resolved: `(prepare, true)` to commit, `(prepare, false)`
    /// to abort. Only the head is ever resolved, so completions follow seqno order.
    fn pop_resolved(&self, persisted: u64, now: Option<Instant>) -> Option<(Tracked, bool)> {
        let mut s = self.state.lock();
        let head = s.tracked.front()?;
        let commit = (!head.persist || head.seqno <= persisted)
            && (!head.needs_acks || s.acked(head.seqno) >= s.acks_needed());
        let expired = head
            .deadline
            .zip(now)
            .is_some_and(|(deadline, now)| deadline <= now);
        if !commit && !expired {
            return None;
        }
        let mut t = s.tracked.pop_front()?;
        s.high_completed = s.high_completed.max(t.seqno);
        let waiter = t.waiter.take();
        s.resolving.insert(t.seqno, waiter);
        Some((t, commit))
    }

    /// Hands the outcome of a prepare taken by [`Self::pop_resolved`] or [`Self::drain`]
    /// (its completion now applied) to its waiter, or keeps it for one. Returns the
    /// waiter to call (outside the lock).
    fn settle(
        &self,
        seqno: u64,
        outcome: EngineResult<()>,
    ) -> Option<(SyncWriteCallback, EngineResult<()>)> {
        let mut s = self.state.lock();
        if let Some(w) = s.resolving.remove(&seqno).flatten() {
            return Some((w, outcome));
        }
        if outcome.is_err() {
            if s.unclaimed.len() >= MAX_UNCLAIMED
                && let Some(oldest) = s.unclaimed.keys().min().copied()
            {
                s.unclaimed.remove(&oldest);
                s.forgotten_upto = s.forgotten_upto.max(oldest);
            }
            s.unclaimed.insert(seqno, outcome);
        }
        None
    }

    /// Attaches `done` to the prepare `seqno`, or returns it with the outcome to call it
    /// with at once (completed already; or unknown, which reads as ambiguous).
    fn claim(
        &self,
        seqno: u64,
        done: SyncWriteCallback,
    ) -> Option<(SyncWriteCallback, EngineResult<()>)> {
        let mut s = self.state.lock();
        if let Ok(i) = s.tracked.binary_search_by_key(&seqno, |t| t.seqno) {
            if let Some(t) = s.tracked.get_mut(i) {
                t.waiter = Some(done);
            }
            return None;
        }
        if let Some(slot) = s.resolving.get_mut(&seqno) {
            *slot = Some(done);
            return None;
        }
        let outcome = match s.unclaimed.remove(&seqno) {
            Some(failed) => failed,
            None if seqno > s.forgotten_upto && seqno <= s.high_completed => Ok(()),
            None => Err(EngineStatus::SyncWriteAmbiguous),
        };
        Some((done, outcome))
    }

    /// The head's deadline when the timeout task must be re-armed for it (and records
    /// it as armed): only when the task is armed for nothing or for later. A task armed
    /// earlier than the head needs (the previous head's deadline) is left alone: it runs
    /// once, spuriously, and re-arms itself. So a stream of SyncWrites with one timeout,
    /// whose deadlines only grow, re-arms the task about once per timeout period, not
    /// once per write.
    fn rearm(&self) -> Option<Instant> {
        let mut s = self.state.lock();
        let head = s.tracked.front().and_then(|t| t.deadline)?;
        if s.armed.is_some_and(|armed| armed <= head) {
            return None;
        }
        s.armed = Some(head);
        Some(head)
    }

    /// After a run of the timeout task: the deadline it must sleep until (recorded as
    /// armed), or `None` to sleep until a SyncWrite arms it.
    fn armed_after_run(&self) -> Option<Instant> {
        let mut s = self.state.lock();
        s.armed = s.tracked.front().and_then(|t| t.deadline);
        s.armed
    }

    /// Sets the chain this active vBucket replicates to: `replicas` slots, `live` of them
    /// held by a node. Acknowledgements so far are forgotten (new replicas start over).
    pub(crate) fn set_chain(&self, replicas: usize, live: usize) {
        let mut s = self.state.lock();
        if s.replicas != replicas || s.live_replicas != live {
            s.acks.clear();
        }
        s.replicas = replicas;
        s.live_replicas = live.min(replicas);
    }

    /// True when the chain has too few nodes for a majority (DurabilityImpossible).
    fn impossible(&self) -> bool {
        let s = self.state.lock();
        s.live_replicas < s.acks_needed()
    }

    /// Records replica `name`'s acknowledged high prepared seqno. Returns whether it
    /// moved.
    fn ack(&self, name: &str, seqno: u64) -> bool {
        let mut s = self.state.lock();
        if s.replicas == 0 {
            return false;
        }
        match s.acks.iter_mut().find(|(n, _)| n == name) {
            Some((_, a)) if *a >= seqno => false,
            Some((_, a)) => {
                *a = seqno;
                true
            }
            None => {
                s.acks.push((name.to_owned(), seqno));
                true
            }
        }
    }

    /// As a replica: a prepare received.
    pub(crate) fn passive_prepare(&self, p: Passive) {
        let mut s = self.passive.lock();
        s.high_prepared = s.high_prepared.max(p.seqno);
        s.prepares.push_back(p);
    }

    /// As a replica: the prepare `seqno` completed (committed or aborted). Returns it.
    pub(crate) fn passive_complete(&self, seqno: u64) -> Option<Passive> {
        let mut s = self.passive.lock();
        let i = s.prepares.iter().position(|p| p.seqno == seqno)?;
        s.prepares.remove(i)
    }

    /// As a replica: the high prepared seqno it may acknowledge with the vBucket
    /// persisted up to `persisted`: past every prepare received, except that it stops
    /// before the first persist-level prepare not yet on disk. Never goes back.
    pub(crate) fn replica_hps(&self, persisted: u64) -> u64 {
        let mut s = self.passive.lock();
        let blocked = s
            .prepares
            .iter()
            .find(|p| p.persist && p.seqno > persisted)
            .map(|p| p.seqno);
        let hps = match blocked {
            None => s.high_prepared,
            Some(b) => s
                .prepares
                .iter()
                .map(|p| p.seqno)
                .filter(|&q| q < b)
                .max()
                .unwrap_or(0)
                .max(s.acked),
        };
        s.acked = s.acked.max(hps);
        s.acked
    }

    /// As a replica becoming active, or starting over: takes the prepares it held.
    pub(crate) fn take_passive(&self) -> Vec<Passive> {
        let mut s = self.passive.lock();
        s.acked = 0;
        s.high_prepared = 0;
        s.prepares.drain(..).collect()
    }

    /// Takes every prepare in flight (FLUSH, a state change): their waiters hear
    /// SyncWriteAmbiguous.
    fn drain(&self) -> Vec<Tracked> {
        let mut s = self.state.lock();
        if let Some(last) = s.tracked.back() {
            s.high_completed = s.high_completed.max(last.seqno);
        }
        let taken: Vec<Tracked> = s.tracked.drain(..).collect();
        let mut out = Vec::with_capacity(taken.len());
        for mut t in taken {
            let waiter = t.waiter.take();
            s.resolving.insert(t.seqno, waiter);
            out.push(t);
        }
        out
    }
}

impl Bucket {
    /// The executor's time (the timeout task's clock).
    fn sync_now(&self) -> Option<Instant> {
        self.task_executor
            .get()
            .map(epkv_executor::ExecutorHandle::now)
    }

    /// Stores `sv` (built by a write as the key's next version) as a prepare of `d`
    /// instead of committing it, with its seqno, CAS and revision (`old_rev + 1`, or a
    /// new key's), and applies `patches` (macros) to it. The caller checked that no
    /// prepare is in flight for the key, and calls [`Self::sync_write_added`] once the
    /// stripe lock is released.
    #[expect(
        clippy::too_many_arguments,
        reason = "the parts of one versioned write"
    )]
    pub(crate) fn prepare_version(
        &self,
        vb: &VBucket,
        e: &mut Entry<'_>,
        sv: StoredValue,
        now: &LazyNow<'_>,
        old_rev: Option<u64>,
        patches: &crate::xattrs::Patches,
        d: &DurabilityRequirements,
    ) -> EngineResult<Assigned> {
        if vb.durability.impossible() {
            return Err(EngineStatus::DurabilityImpossible);
        }
        self.insert_or_tempfail(e, sv.with_state(CommittedState::Pending))?;
        let deadline = self
            .sync_now()
            .filter(|_| self.config.sync_write_timeouts)
            .map(|n| n + d.timeout.unwrap_or(DEFAULT_TIMEOUT));
        let rev = |a: &Assigned| old_rev.map_or(a.new_key_rev, |r| r + 1);
        let key = e.key().to_vec();
        let majority = d.level == DurabilityLevel::Majority;
        let mut patched = false;
        let mut at_once = false;
        let (a, woke) = vb.assign_sync(
            now.nanos(),
            SyncStep {
                prepared: true,
                completed: 0,
                deleted_rev: None,
                visible: false,
                level: d.level as u8,
            },
            |a| {
                let t = Tracked {
                    seqno: a.seqno.0,
                    key,
                    persist: !majority,
                    deadline,
                    waiter: None,
                    needs_acks: true,
                };
                at_once = vb.durability.track_or_complete(t, majority);
                // A prepare committed at once is never persisted: its commit is.
                !at_once
            },
            |a| {
                patch_prepared(e, patches, a);
                patched = true;
                prepare_document(e, a, rev(a))
            },
        );
        if !patched {
            patch_prepared(e, patches, &a);
        }
        if let Some(m) = e.prepared_meta_mut() {
            m.by_seqno = a.seqno;
            m.cas = a.cas;
            m.rev_seqno = rev(&a);
        }
        self.counters.incr(Counter::SyncWriteAccepted);
        self.queued(vb, woke);
        if at_once && self.commit_prepare(vb, e, a.seqno.0, now) {
            self.counters.incr(Counter::SyncWriteCommitted);
        }
        Ok(a)
    }

    /// A durable DELETE of the entry's live document: a prepare of its tombstone (with
    /// the system attributes, whose value the caller made resident).
    pub(crate) fn prepare_deletion(
        &self,
        vb: &VBucket,
        e: &mut Entry<'_>,
        now: &LazyNow<'_>,
        d: &DurabilityRequirements,
    ) -> EngineResult<Assigned> {
        let (meta, kept) = match e.get() {
            Some(sv) => (*sv.meta(), crate::bucket::system_section(sv)),
            None => return Err(EngineStatus::KeyNotFound),
        };
        let tomb = if kept.is_empty() {
            StoredValue::new_deleted(e.key(), ItemMeta::default())
        } else {
            let m = ItemMeta {
                datatype: Datatype::XATTR,
                ..ItemMeta::default()
            };
            StoredValue::new_tombstone(e.key(), &kept, m)
        }
        .map_err(|_| EngineStatus::Internal)?;
        let none = crate::xattrs::Patches::default();
        self.prepare_version(vb, e, tomb, now, Some(meta.rev_seqno), &none, d)
    }

    /// After a prepare (`seqno`) of level `level` was added and the stripe lock released:
    /// waits for its persistence if its level needs it (making the flush urgent),
    /// commits what is resolved, and arms the timeout task.
    pub(crate) fn sync_write_added(
        &self,
        vb: &VBucket,
        seqno: epkv_types::Seqno,
        level: DurabilityLevel,
    ) {
        // Nothing in flight: the prepare was committed in place, or has completed already.
        if vb.durability.len() == 0 {
            return;
        }
        if level != DurabilityLevel::Majority && vb.is_persistent() {
            self.complete_when_persisted(vb, seqno.0);
        }
        self.complete_sync_writes(vb);
        self.arm_sync_timeout(vb);
    }

    /// Completes `vb`'s resolved SyncWrites again once it has persisted `seqno` (making
    /// the flush urgent when it has not yet).
    fn complete_when_persisted(&self, vb: &VBucket, seqno: u64) {
        let Some(p) = &self.persistence else {
            return;
        };
        let weak = self.self_ref.get().cloned().unwrap_or_default();
        let index = usize::from(vb.id.0);
        let resolve = Box::new(move |_persisted: u64| {
            if let Some(b) = weak.upgrade()
                && let Some(vb) = b.vbuckets.get(index)
            {
                b.complete_sync_writes(vb);
            }
        });
        if vb.persist.when_persisted(seqno, resolve) {
            p.urgent(vb.id);
        }
    }

    /// Commits or aborts the resolved prepares at the head of `vb`'s monitor, in seqno
    /// order, and tells their waiters.
    pub(crate) fn complete_sync_writes(&self, vb: &VBucket) {
        let _in_order = vb.durability.completing.lock();
        let persisted = if vb.is_persistent() {
            vb.persist.persisted()
        } else {
            u64::MAX
        };
        let now = LazyNow::new(&*self.clock);
        let at = self.sync_now();
        while let Some((t, commit)) = vb.durability.pop_resolved(persisted, at) {
            // A prepare missing from the table (cannot happen while the monitor tracks
            // it) is answered ambiguous, never success.
            let committed = commit
                && vb
                    .table
                    .with_entry(&t.key, |e| self.commit_prepare(vb, e, t.seqno, &now));
            let outcome = if committed {
                self.counters.incr(Counter::SyncWriteCommitted);
                Ok(())
            } else if commit {
                Err(EngineStatus::SyncWriteAmbiguous)
            } else {
                vb.table
                    .with_entry(&t.key, |e| self.abort_prepare(vb, e, t.seqno, &now));
                self.counters.incr(Counter::SyncWriteAborted);
                Err(EngineStatus::SyncWriteAmbiguous)
            };
            if let Some((done, outcome)) = vb.durability.settle(t.seqno, outcome) {
                done(outcome);
            }
        }
    }

    /// Commits the entry's prepare `seqno`: it becomes the committed version with a new
    /// seqno and the prepare's CAS, queued for the flusher. Returns false (and changes
    /// nothing) when the prepare is not there.
    fn commit_prepare(
        &self,
        vb: &VBucket,
        e: &mut Entry<'_>,
        seqno: u64,
        now: &LazyNow<'_>,
    ) -> bool {
        let Some(p) = e.prepared().filter(|p| p.meta().by_seqno.0 == seqno) else {
            tracing::error!(vbid = %vb.id, seqno, "a tracked prepare is missing from the hash table");
            return false;
        };
        let pm = *p.meta();
        if let Some(sv) = e.committed() {
            vb.note_xattrs(sv.meta().datatype);
        }
        let deletes = p.is_deleted();
        if !deletes {
            Self::note_written(vb, e.key());
        }
        let (a, woke) = vb.assign_sync(
            now.nanos(),
            SyncStep {
                prepared: false,
                completed: seqno,
                deleted_rev: deletes.then_some(pm.rev_seqno),
                visible: true,
                level: 0,
            },
            |_| true,
            |a| {
                let mut doc = document_of_prepared(e, a, pm.rev_seqno);
                doc.key = e.key().to_vec();
                doc.cas = pm.cas.0;
                doc.datatype &= !PREPARE_DELETES;
                doc.deleted = deletes;
                doc
            },
        );
        let meta = ItemMeta {
            by_seqno: a.seqno,
            ..pm
        };
        let converted = e.convert_prepared(meta);
        if let Err(err) = &converted {
            tracing::error!(vbid = %vb.id, seqno, error = %err, "cannot commit a prepare");
        } else if !vb.is_persistent() {
            e.mark_clean(a.seqno);
            if deletes {
                e.remove();
            }
        }
        self.queued(vb, woke);
        converted.is_ok()
    }

    /// Aborts the entry's prepare `seqno`: it is dropped, and a tombstone of its prepare
    /// key with a new seqno is queued for the flusher.
    fn abort_prepare(&self, vb: &VBucket, e: &mut Entry<'_>, seqno: u64, now: &LazyNow<'_>) {
        if e.prepared().is_none_or(|p| p.meta().by_seqno.0 != seqno) {
            tracing::error!(vbid = %vb.id, seqno, "a tracked prepare is missing from the hash table");
            return;
        }
        let rev = e.prepared().map_or(0, |p| p.meta().rev_seqno);
        let key = e.key().to_vec();
        let (_, woke) = vb.assign_sync(
            now.nanos(),
            SyncStep {
                prepared: false,
                completed: seqno,
                deleted_rev: None,
                visible: false,
                level: 0,
            },
            |_| true,
            |a| tombstone_document(prepare_key(&key), a, rev),
        );
        e.remove_prepared();
        self.queued(vb, woke);
    }

    /// Calls `done` with the outcome of the SyncWrite whose prepare has `seqno` in
    /// `vbid`: success once committed, SyncWriteAmbiguous once aborted (at once if it has
    /// completed already).
    ///
    /// # Errors
    /// NotMyVbucket for a vBucket outside the bucket.
    pub fn when_sync_write_completed(
        &self,
        vbid: Vbid,
        seqno: u64,
        done: SyncWriteCallback,
    ) -> EngineResult<()> {
        let vb = self
            .vbuckets
            .get(usize::from(vbid.0))
            .ok_or(EngineStatus::NotMyVbucket)?;
        if let Some((done, outcome)) = vb.durability.claim(seqno, done) {
            done(outcome);
        }
        Ok(())
    }

    /// Points `vb`'s timeout task at the head's deadline, creating the task on the
    /// vBucket's first SyncWrite.
    fn arm_sync_timeout(&self, vb: &VBucket) {
        let Some(at) = vb.durability.rearm() else {
            return;
        };
        let task = match vb.durability.task.get() {
            Some(t) => t,
            None => {
                let Some(handle) = self.start_sync_timeout(vb.id) else {
                    return;
                };
                if let Err(extra) = vb.durability.task.set(handle) {
                    // Another writer created it first.
                    extra.cancel();
                }
                let Some(t) = vb.durability.task.get() else {
                    return;
                };
                t
            }
        };
        task.snooze_until(at);
    }

    fn start_sync_timeout(&self, vbid: Vbid) -> Option<epkv_executor::TaskHandle> {
        let exec = self.task_executor.get()?;
        let bucket = self.self_ref.get()?.upgrade()?;
        let spec = epkv_executor::TaskSpec::new(
            format!("durability-timeout-{}", vbid.0),
            epkv_executor::Group::NonIo,
        )
        .start(epkv_executor::Start::Sleep);
        let index = usize::from(vbid.0);
        match crate::bucket::schedule_weak(exec, &bucket, spec, move |b| b.sync_timeout_run(index))
        {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::error!(%vbid, error = %e, "cannot start the durability timeout task; SyncWrites of this vBucket are not aborted when their timeout passes");
                None
            }
        }
    }

    /// One run of a vBucket's timeout task: aborts the expired head(s), commits what
    /// follows if resolved, and sleeps until the new head's deadline.
    fn sync_timeout_run(&self, index: usize) -> epkv_executor::Next {
        let Some(vb) = self.vbuckets.get(index) else {
            return epkv_executor::Next::Done;
        };
        self.complete_sync_writes(vb);
        // A SyncWrite arming the task meanwhile wins if earlier (the executor keeps the
        // earlier of a run's answer and a request made during the run).
        match vb.durability.armed_after_run() {
            Some(at) => epkv_executor::Next::At(at),
            None => epkv_executor::Next::Sleep,
        }
    }

    /// Aborts every SyncWrite in flight and answers it SyncWriteAmbiguous (FLUSH, or the
    /// vBucket stops being active): whether it completes is no longer this node's to
    /// say.
    pub(crate) fn abandon_sync_writes(&self, vb: &VBucket) {
        let _in_order = vb.durability.completing.lock();
        let now = LazyNow::new(&*self.clock);
        for t in vb.durability.drain() {
            vb.table
                .with_entry(&t.key, |e| self.abort_prepare(vb, e, t.seqno, &now));
            self.counters.incr(Counter::SyncWriteAborted);
            if let Some((done, outcome)) = vb
                .durability
                .settle(t.seqno, Err(EngineStatus::SyncWriteAmbiguous))
            {
                done(outcome);
            }
        }
    }

    /// Restores a prepare warmup found above the high completed seqno: as
    /// `PreparedMaybeVisible`, tracked with no deadline until it is committed again.
    pub(crate) fn restore_prepare(vb: &VBucket, d: &Document) {
        let Some(key) = prepared_key_of(&d.key) else {
            return;
        };
        let meta = ItemMeta {
            cas: epkv_types::Cas(d.cas),
            rev_seqno: d.rev_seqno,
            by_seqno: epkv_types::Seqno(d.seqno),
            flags: d.flags,
            expiry: d.expiry,
            datatype: Datatype(d.datatype & !PREPARE_DELETES),
            ..ItemMeta::default()
        };
        let sv = if d.datatype & PREPARE_DELETES != 0 {
            StoredValue::new_tombstone(key, &d.value, meta)
        } else {
            StoredValue::new(key, &d.value, meta)
        };
        let Ok(sv) = sv else {
            tracing::error!(vbid = %vb.id, seqno = d.seqno, "cannot restore a pending prepare");
            return;
        };
        let stored = vb.table.with_entry(key, |e| {
            e.insert_prepared(sv.with_state(CommittedState::PreparedMaybeVisible))
        });
        if let Err(err) = stored {
            tracing::error!(vbid = %vb.id, seqno = d.seqno, error = %err, "cannot restore a pending prepare");
            return;
        }
        if vb.state_hint() == epkv_types::VBucketState::Replica {
            // A replica keeps it until the active's commit or abort arrives.
            vb.durability.passive_prepare(Passive {
                seqno: d.seqno,
                key: key.to_vec(),
                persist: true,
            });
            return;
        }
        vb.durability.track(Tracked {
            seqno: d.seqno,
            key: key.to_vec(),
            persist: true,
            deadline: None,
            waiter: None,
            needs_acks: false,
        });
    }

    /// A replica vBucket just became active: the prepares it held are tracked as its
    /// own, committed once this node has them on disk (they may have been acknowledged
    /// by the old active), as warmup does with the prepares it finds.
    pub(crate) fn adopt_passive_prepares(&self, vb: &VBucket) {
        let held = vb.durability.take_passive();
        if held.is_empty() {
            return;
        }
        tracing::info!(vbid = %vb.id, prepares = held.len(), "a promoted replica commits the SyncWrites it held");
        for p in held {
            vb.durability.track(Tracked {
                seqno: p.seqno,
                key: p.key,
                persist: true,
                deadline: None,
                waiter: None,
                needs_acks: false,
            });
        }
        self.complete_sync_writes(vb);
        let (high, _, _) = vb.ordering_snapshot();
        self.complete_when_persisted(vb, high);
    }

    /// A replica's acknowledgement (DCP_SEQNO_ACKNOWLEDGED) of `seqno` for active vBucket
    /// `vbid`: the prepares it satisfies commit.
    ///
    /// # Errors
    /// `NotMyVbucket` unless `vbid` is active here.
    pub(crate) fn op_seqno_acknowledged(
        &self,
        vbid: Vbid,
        replica: &str,
        seqno: u64,
    ) -> EngineResult<()> {
        let vb = self
            .vbuckets
            .get(usize::from(vbid.0))
            .ok_or(EngineStatus::NotMyVbucket)?;
        if vb.state_hint() != epkv_types::VBucketState::Active {
            return Err(EngineStatus::NotMyVbucket);
        }
        if vb.durability.ack(replica, seqno) {
            self.complete_sync_writes(vb);
        }
        Ok(())
    }

    /// Sets active vBucket `vbid`'s replication chain (see [`Monitor::set_chain`]).
    ///
    /// # Errors
    /// `NotMyVbucket` for a vBucket outside the bucket.
    pub(crate) fn op_set_replication_chain(
        &self,
        vbid: Vbid,
        replicas: usize,
        live: usize,
    ) -> EngineResult<()> {
        let vb = self
            .vbuckets
            .get(usize::from(vbid.0))
            .ok_or(EngineStatus::NotMyVbucket)?;
        vb.durability.set_chain(replicas, live);
        // Fewer acknowledgements may now be needed.
        self.complete_sync_writes(vb);
        Ok(())
    }
}

/// Writes the prepare's macros (`${Mutation.CAS}` and the like) once `a` is known.
fn patch_prepared(e: &mut Entry<'_>, patches: &crate::xattrs::Patches, a: &Assigned) {
    if !patches.is_empty()
        && let Some(v) = e.prepared_value_mut()
    {
        patches.apply(v, a);
    }
}

/// The entry's prepare as the flusher stores it: under [`prepare_key`].
fn prepare_document(e: &Entry<'_>, a: &Assigned, rev: u64) -> Document {
    let mut doc = document_of_prepared(e, a, rev);
    doc.key = prepare_key(e.key());
    doc
}

fn document_of_prepared(e: &Entry<'_>, a: &Assigned, rev: u64) -> Document {
    let (value, m, deletes) = match e.prepared() {
        Some(sv) => (
            bytes::Bytes::copy_from_slice(sv.value()),
            *sv.meta(),
            sv.is_deleted(),
        ),
        None => (bytes::Bytes::new(), ItemMeta::default(), false),
    };
    Document {
        key: Vec::new(),
        value,
        seqno: a.seqno.0,
        cas: a.cas.0,
        rev_seqno: rev,
        flags: m.flags,
        expiry: m.expiry,
        datatype: m.datatype.0 | if deletes { PREPARE_DELETES } else { 0 },
        deleted: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use epkv_executor::Clock as _;

    fn t0() -> Instant {
        epkv_executor::ManualClock::new(Duration::ZERO).now()
    }

    fn tracked(seqno: u64, persist: bool, deadline: Option<Instant>) -> Tracked {
        Tracked {
            needs_acks: true,
            seqno,
            key: format!("k{seqno}").into_bytes(),
            persist,
            deadline,
            waiter: None,
        }
    }

    #[test]
    fn prepares_are_stored_in_the_storage_prepare_namespace() {
        let k = prepare_key(b"\0\x08k");
        assert_eq!(
            epkv_types::doc_key::collection_of(&k),
            epkv_storage::PREPARE_NAMESPACE
        );
        assert_eq!(prepared_key_of(&k), Some(&b"\0\x08k"[..]));
        assert_eq!(prepared_key_of(b"k"), None);
        assert_eq!(prepared_key_of(b"\0\x08k"), None);
    }

    #[test]
    fn only_the_head_resolves_and_a_persist_level_head_fences_the_rest() {
        let m = Monitor::default();
        m.track(tracked(1, false, None));
        m.track(tracked(2, true, None));
        m.track(tracked(3, false, None));
        // Majority at the head commits; the unpersisted persist-level one stops the rest.
        assert!(matches!(m.pop_resolved(0, None), Some((t, true)) if t.seqno == 1));
        assert!(m.pop_resolved(1, None).is_none());
        // Persisted: it commits, and the Majority one behind it follows.
        assert!(matches!(m.pop_resolved(2, None), Some((t, true)) if t.seqno == 2));
        assert!(matches!(m.pop_resolved(2, None), Some((t, true)) if t.seqno == 3));
        assert!(m.pop_resolved(u64::MAX, None).is_none());
        assert_eq!(m.seqnos(), (3, 3));
    }

    #[test]
    fn an_expired_head_aborts_but_a_persisted_one_commits_first() {
        let t0 = t0();
        let m = Monitor::default();
        m.track(tracked(5, true, Some(t0)));
        m.track(tracked(6, true, Some(t0 + Duration::from_secs(9))));
        let later = Some(t0 + Duration::from_secs(1));
        // Persisted and expired: the commit wins.
        assert!(matches!(m.pop_resolved(5, later), Some((t, true)) if t.seqno == 5));
        // Not persisted, not expired.
        assert!(m.pop_resolved(5, later).is_none());
        // Expired: aborted.
        let much_later = Some(t0 + Duration::from_secs(10));
        assert!(matches!(m.pop_resolved(5, much_later), Some((t, false)) if t.seqno == 6));
    }

    #[test]
    fn the_timeout_task_is_rearmed_only_for_an_earlier_head() {
        let t0 = t0();
        let s = |n| Some(t0 + Duration::from_secs(n));
        let m = Monitor::default();
        assert_eq!(m.rearm(), None, "nothing to arm for");
        m.track(tracked(1, true, s(30)));
        assert_eq!(m.rearm(), s(30));
        assert_eq!(m.rearm(), None, "armed already");
        m.track(tracked(2, true, s(40)));
        assert!(m.pop_resolved(1, None).is_some());
        // The head is due later than the task: it is left to run once and re-arm itself.
        assert_eq!(m.rearm(), None);
        assert_eq!(m.armed_after_run(), s(40));
        assert!(m.pop_resolved(2, None).is_some());
        assert_eq!(m.armed_after_run(), None);
        m.track(tracked(3, true, s(5)));
        assert_eq!(m.rearm(), s(5), "a sleeping task is armed");
    }

    #[test]
    fn an_outcome_reaches_its_waiter_whenever_it_asks() {
        use std::sync::{Arc, Mutex};
        let m = Monitor::default();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let waiter = |seen: &Arc<Mutex<Vec<EngineResult<()>>>>| -> SyncWriteCallback {
            let seen = Arc::clone(seen);
            Box::new(move |r| seen.lock().unwrap_or_else(|e| e.into_inner()).push(r))
        };
        // Asked before completion: attached, then called by settle's caller.
        m.track(tracked(1, false, None));
        assert!(m.claim(1, waiter(&seen)).is_none());
        let Some((t, _)) = m.pop_resolved(0, None) else {
            panic!("the head resolves")
        };
        if let Some((done, r)) = m.settle(t.seqno, Ok(())) {
            done(r);
        }
        // Completed before anyone asked: kept, and handed over on the ask.
        m.track(tracked(2, false, None));
        let Some((t, _)) = m.pop_resolved(0, None) else {
            panic!("the head resolves")
        };
        assert!(
            m.settle(t.seqno, Err(EngineStatus::SyncWriteAmbiguous))
                .is_none()
        );
        if let Some((done, r)) = m.claim(2, waiter(&seen)) {
            done(r);
        }
        // Asked while the completion is being applied (taken off the monitor, not yet
        // settled): told at the settle, not before and not as unknown.
        m.track(tracked(3, false, None));
        let Some((t, _)) = m.pop_resolved(0, None) else {
            panic!("the head resolves")
        };
        assert!(
            m.claim(3, waiter(&seen)).is_none(),
            "attached, not answered"
        );
        assert_eq!(seen.lock().unwrap_or_else(|e| e.into_inner()).len(), 2);
        if let Some((done, r)) = m.settle(t.seqno, Ok(())) {
            done(r);
        }
        // Committed before anyone asked: nothing kept, and it reads as committed.
        m.track(tracked(4, false, None));
        let Some((t, _)) = m.pop_resolved(0, None) else {
            panic!("the head resolves")
        };
        assert!(m.settle(t.seqno, Ok(())).is_none());
        if let Some((done, r)) = m.claim(4, waiter(&seen)) {
            done(r);
        }
        // A Majority prepare with nothing before it completes at once.
        assert!(m.track_or_complete(tracked(5, false, None), true));
        if let Some((done, r)) = m.claim(5, waiter(&seen)) {
            done(r);
        }
        // Unknown: ambiguous, never success.
        if let Some((done, r)) = m.claim(99, waiter(&seen)) {
            done(r);
        }
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(
            seen,
            vec![
                Ok(()),
                Err(EngineStatus::SyncWriteAmbiguous),
                Ok(()),
                Ok(()),
                Ok(()),
                Err(EngineStatus::SyncWriteAmbiguous)
            ]
        );
    }
}
