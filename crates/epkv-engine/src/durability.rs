//! SyncWrites: durable writes as KV-Engine makes them (`docs/durability.md`).
//!
//! A write with durability requirements does not change the committed document. It
//! becomes a *prepare*, held in the hash table's prepared slot beside the committed
//! version:
//! - reads keep seeing the committed version;
//! - any other write of the key answers SyncWriteInProgress (0xa2) until the prepare
//!   completes.
//!
//! Each vBucket's [`Monitor`](crate::durability_monitor::Monitor) tracks its prepares in seqno order and completes them in
//! that order, from the head, as the active durability monitor does. A majority is of
//! the vBucket's chain (this node and its replicas, [`Monitor::set_chain`](crate::durability_monitor::Monitor::set_chain)), or of
//! each of its two chains while it moves to other nodes (KV-Engine's first and second
//! chain, named nodes, [`Monitor::set_topology`](crate::durability_monitor::Monitor::set_topology)); a replica
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
//! **State changes.** A vBucket leaving the active state answers its SyncWrites in
//! flight SyncWriteAmbiguous. Going pending (a takeover), it keeps their prepares as a
//! replica holds them, for the new active to complete
//! ([`BucketCore::hold_sync_writes`]); to any other state it aborts them
//! ([`BucketCore::abandon_sync_writes`]). Becoming active, it tracks the prepares it holds
//! again and commits them once on its disk ([`BucketCore::adopt_passive_prepares`]).
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
//! [`crate::Bucket::when_sync_write_completed`] with the prepare's seqno. An outcome that
//! arrives before the front end asks is kept until it does.
//!
//! **On disk**, a prepare is a document under its key in a namespace of its own: the
//! bytes [`PREPARE_PREFIX`](crate::durability_monitor::PREPARE_PREFIX) (reserved collection id 2, KV-Engine's DurabilityPrepare
//! namespace) and then the key, so it never shadows the committed document. A durable
//! delete's prepare carries [`PREPARE_DELETES`] in its datatype. A commit is persisted as
//! the committed document. An abort is persisted as a tombstone of the prepare key that
//! records the prepare's seqno ([`abort_document`]).
//!
//! Every flush writes the high prepared and high completed seqnos (HPS, HCS) carried by
//! the documents it persists. Warmup loads the live prepares above the HCS as
//! `PreparedMaybeVisible`: the write may have been acknowledged before the crash. On a
//! single node they are persisted, so they are committed again before the vBucket
//! serves; a reader never sees the state from before them.
//!
//! Level: a service over [`crate::bucket_core::BucketCore`]; it never names the bucket.
//! The per-vBucket bookkeeping is [`crate::durability_monitor`], a leaf.

use epkv_engine_api::{DurabilityRequirements, EngineResult, EngineStatus, SyncWriteCallback};
use epkv_hashtable::{CommittedState, Entry, ItemMeta, StoredValue};
use epkv_storage::Document;
use epkv_types::{Datatype, DurabilityLevel, VBucketState, Vbid};

use crate::bucket_core::{BucketCore, CoreOwner, schedule_weak};
use crate::durability_monitor::{DEFAULT_TIMEOUT, PREPARE_DELETES, Tracked, prepare_key};
use crate::lazy_now::LazyNow;
use crate::stats::Counter;
use crate::vbucket::{Assigned, SyncStep, VBucket, tombstone_document};

/// The document an abort of the prepare `prepared_seqno` of `key` persists: a tombstone
/// of the prepare's key, with the prepare's revision `rev`, whose value records the
/// prepare's seqno ([`crate::durability_monitor::abort_value`]).
pub(crate) fn abort_document(key: &[u8], a: &Assigned, rev: u64, prepared_seqno: u64) -> Document {
    Document {
        value: crate::durability_monitor::abort_value(prepared_seqno),
        ..tombstone_document(prepare_key(key), a, rev)
    }
}

impl BucketCore {
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
            Some(sv) => (*sv.meta(), crate::document::system_section(sv)),
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
        let owner = self.owner.clone();
        let index = usize::from(vb.id.0);
        let resolve = Box::new(move |_persisted: u64| {
            if let Some(b) = owner.upgrade()
                && let Some(vb) = b.core().vbuckets.get(index)
            {
                b.core().complete_sync_writes(vb);
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
            vb.note_written(e.key());
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
            |a| abort_document(&key, a, rev, seqno),
        );
        e.remove_prepared();
        self.queued(vb, woke);
    }

    /// See [`crate::Bucket::when_sync_write_completed`].
    pub(crate) fn when_sync_write_completed(
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
        // Nothing to schedule for once the bucket is gone.
        self.owner.upgrade()?;
        let spec = epkv_executor::TaskSpec::new(
            format!("durability-timeout-{}", vbid.0),
            epkv_executor::Group::NonIo,
        )
        .start(epkv_executor::Start::Sleep);
        let index = usize::from(vbid.0);
        match schedule_weak(
            exec,
            self.owner.clone(),
            spec,
            move |b: &(dyn CoreOwner + 'static)| b.core().sync_timeout_run(index),
        ) {
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

    /// `vb`'s state went from `was` to `now` (SET_VBUCKET, with the state lock held
    /// exclusively): its SyncWrites follow.
    /// - Becoming active (a promoted replica, or a pending vBucket whose move was rolled
    ///   back): the prepares it holds are tracked again ([`Self::adopt_passive_prepares`]).
    /// - Active to pending (a takeover): answered ambiguous, their prepares kept for the
    ///   new active ([`Self::hold_sync_writes`]).
    /// - Any other change: those in flight (an active vBucket's) are answered ambiguous and
    ///   aborted, as KV-Engine answers them when their vBucket stops being active
    ///   ([`Self::abandon_sync_writes`]); a replica going dead drops the prepares it held.
    ///   A pending vBucket keeps those it holds whatever it becomes: it may stream from
    ///   the new active later, whose completions of them must find them.
    pub(crate) fn sync_writes_state_changed(
        &self,
        vb: &VBucket,
        was: VBucketState,
        now: VBucketState,
    ) {
        match (was, now) {
            (VBucketState::Active, VBucketState::Active) => {}
            (_, VBucketState::Active) => self.adopt_passive_prepares(vb),
            (VBucketState::Active, VBucketState::Pending) => self.hold_sync_writes(vb),
            _ => {
                self.abandon_sync_writes(vb);
                if (was, now) == (VBucketState::Replica, VBucketState::Dead) {
                    for p in vb.durability.take_passive() {
                        vb.table.with_entry(&p.key, |e| {
                            e.remove_prepared();
                        });
                    }
                }
            }
        }
    }

    /// An active vBucket went pending (a takeover): its SyncWrites in flight are answered
    /// SyncWriteAmbiguous but not aborted, and their prepares stay in the hash table,
    /// held as a replica holds them ([`Monitor::hold_tracked`](crate::durability_monitor::Monitor::hold_tracked)). The node taking the
    /// vBucket over has them too and completes them once active; if the move is rolled
    /// back, [`Self::adopt_passive_prepares`] tracks them again here. An abort now would
    /// write a seqno the new active does not have.
    pub(crate) fn hold_sync_writes(&self, vb: &VBucket) {
        let waiters = {
            let _in_order = vb.durability.completing.lock();
            vb.durability.hold_tracked()
        };
        if !waiters.is_empty() {
            tracing::info!(vbid = %vb.id, waiters = waiters.len(), "a pending vBucket answers its SyncWrites in flight ambiguous and holds their prepares");
        }
        for done in waiters {
            done(Err(EngineStatus::SyncWriteAmbiguous));
        }
    }

    /// Aborts every SyncWrite in flight and answers it SyncWriteAmbiguous (FLUSH, or the
    /// vBucket stops being active other than by going pending): whether it completes is
    /// no longer this node's to say.
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

    /// A vBucket just became active: the prepares it held (as a replica, or as a pending
    /// vBucket whose move was rolled back, see [`Self::hold_sync_writes`]) are tracked as
    /// its own, committed once this node has them on disk (they may have been
    /// acknowledged by a majority already), as warmup does with the prepares it finds.
    /// None is left blocking its key.
    pub(crate) fn adopt_passive_prepares(&self, vb: &VBucket) {
        let held = vb.durability.take_passive();
        if held.is_empty() {
            return;
        }
        tracing::info!(vbid = %vb.id, prepares = held.len(), "a vBucket becoming active commits the SyncWrites it held");
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
    /// `vbid`: the prepares it satisfies commit. A pending vBucket records it too (its
    /// replicas still stream from it; it tracks nothing meanwhile).
    ///
    /// # Errors
    /// `NotMyVbucket` unless `vbid` is active or pending here.
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
        if !matches!(
            vb.state_hint(),
            VBucketState::Active | VBucketState::Pending
        ) {
            return Err(EngineStatus::NotMyVbucket);
        }
        if vb.durability.ack(replica, seqno) {
            self.complete_sync_writes(vb);
        }
        Ok(())
    }

    /// Sets active vBucket `vbid`'s replication chain (see [`Monitor::set_chain`](crate::durability_monitor::Monitor::set_chain)).
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

    /// Sets vBucket `vbid`'s replication topology (see
    /// [`Monitor::set_topology`](crate::durability_monitor::Monitor::set_topology)), then completes the SyncWrites in flight it
    /// resolves (the second chain gone, a prepare may have its majorities), as an
    /// acknowledgement does.
    ///
    /// # Errors
    /// `NotMyVbucket` for a vBucket outside the bucket; `Invalid` for a malformed
    /// topology.
    pub(crate) fn op_set_replication_topology(
        &self,
        vbid: Vbid,
        me: &str,
        chains: &[Vec<Option<String>>],
    ) -> EngineResult<()> {
        let vb = self
            .vbuckets
            .get(usize::from(vbid.0))
            .ok_or(EngineStatus::NotMyVbucket)?;
        if vb.durability.set_topology(me, chains)? {
            self.complete_sync_writes(vb);
        }
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
