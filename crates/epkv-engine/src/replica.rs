//! Replica vBuckets: applying the changes a DCP consumer receives from the active copy,
//! reading them (GET_REPLICA), and starting over when the active's history differs.
//!
//! A replica vBucket takes no client writes (NotMyVbucket). Its only writer is the
//! replication stream, which hands each change to [`Bucket::replicate`] in the active's
//! seqno order: the document keeps the active's seqno, CAS, revision, flags, expiry and
//! datatype, goes into the hash table, and is queued for the flusher like any write, so
//! the replica persists what it holds and serves it again after a restart. A change whose
//! seqno is not above the replica's high seqno is refused (Invalid): a producer that
//! sends seqnos out of order does not corrupt the replica.
//!
//! **History.** A stream request names the replica's position (its high seqno and the
//! failover branch it came from); the active answers with its failover log, which the
//! replica adopts ([`Bucket::adopt_failover_log`]), or with a rollback. A replica rolls
//! back by starting over ([`Bucket::reset_replica`]: its documents and file are dropped
//! and its seqnos restart at 0), then streams everything again. KV-Engine rolls back to
//! the seqno asked for when its files still hold that point; epkv's files keep only the
//! newest version of each key, so starting over is what it can do correctly.
//!
//! **SyncWrites.** The stream asks for sync replication: a prepare is held in the
//! replica's prepared slot (readers of the replica see the committed version), persisted
//! under the prepare namespace, and tracked until the active's commit (the prepare becomes
//! the committed version at the commit's seqno) or abort. The replica acknowledges its
//! high prepared seqno ([`Bucket::op_replica_prepared_seqno`]): past every prepare it
//! received, except that it stops before a persist-level prepare not yet on its disk. When
//! the replica is promoted, the prepares it holds become the new active's and are
//! committed once on its disk.
//!
//! **Disk snapshots.** A backfill carries the newest version of each key only, so the
//! commit of a prepare the replica holds may not be in it (a later write of the key
//! replaced it). Its marker carries the active's high completed seqno instead: once the
//! replica has the whole snapshot, it completes every prepare it holds at or below that
//! seqno (KV-Engine's HCS rule), the committed versions being what the snapshot gave, and
//! persists that seqno, so that neither a promotion nor warmup commits such a prepare
//! over the newer value.

use crate::bucket::Bucket;
use crate::document::{document_of, expired, item_of};
use crate::durability_monitor::{PREPARE_DELETES, Passive, SnapshotEnd, prepare_key};
use crate::lazy_now::LazyNow;
use crate::stats::Counter;
use crate::vbucket::{DeleteSource, SyncStep, VBucket, tombstone_document};
use epkv_engine_api::dcp::DcpDocument;
use epkv_engine_api::{DcpEvent, EngineResult, EngineStatus, Item};
use epkv_hashtable::{CommittedState, ItemMeta, StoredValue};
use epkv_storage::Document;
use epkv_types::{Cas, Datatype, DurabilityLevel, Seqno, VBucketState, Vbid, vbucket_for_key};
use parking_lot::RwLockReadGuard;

impl Bucket {
    /// The replica vBucket `vbid`, ready (warm) and in the replica state.
    fn replica_vbucket(&self, vbid: Vbid) -> EngineResult<&VBucket> {
        let vb = self
            .core
            .vbuckets
            .get(usize::from(vbid.0))
            .ok_or(EngineStatus::NotMyVbucket)?;
        vb.check_warm()?;
        if vb.state_hint() != VBucketState::Replica {
            return Err(EngineStatus::NotMyVbucket);
        }
        Ok(vb)
    }

    /// The replica vBucket `vbid` for a client's read of `key` (GET_REPLICA, a
    /// sub-document lookup with ReplicaRead), with its state held: the key must hash to
    /// it and its collection exist.
    ///
    /// # Errors
    /// `NotMyVbucket` unless `vbid` is a replica here and `key` hashes to it;
    /// `UnknownCollection`.
    pub(crate) fn replica_for_read(
        &self,
        vbid: Vbid,
        key: &[u8],
    ) -> EngineResult<(&VBucket, RwLockReadGuard<'_, VBucketState>)> {
        let (_, raw) = epkv_types::doc_key::decode(key);
        if vbucket_for_key(raw, self.core.config.num_vbuckets) != vbid {
            return Err(EngineStatus::NotMyVbucket);
        }
        self.core.collections.check_key(key)?;
        let vb = self.replica_vbucket(vbid)?;
        let state = vb.state();
        if *state != VBucketState::Replica {
            return Err(EngineStatus::NotMyVbucket);
        }
        Ok((vb, state))
    }

    /// GET_REPLICA: reads `key` from replica vBucket `vbid`.
    ///
    /// # Errors
    /// `NotMyVbucket` unless `vbid` is a replica here; `KeyNotFound`; `WouldBlock` while
    /// an evicted value is read back.
    pub(crate) fn op_get_replica(&self, vbid: Vbid, key: &[u8]) -> EngineResult<Item> {
        let (vb, _state) = self.replica_for_read(vbid, key)?;
        let now = LazyNow::new(&*self.core.clock);
        vb.table.with_entry(key, |e| {
            self.fetch_if_evicted(vb, e)?;
            let sv = e.get().ok_or(EngineStatus::KeyNotFound)?;
            // A replica does not expire documents (the active's deletion arrives); it
            // just does not serve them.
            if expired(sv.meta(), &now) {
                return Err(EngineStatus::KeyNotFound);
            }
            Ok(item_of(sv, vbid, sv.meta().cas))
        })
    }

    /// Applies one change of the replication stream to replica vBucket `vbid`. A snapshot
    /// marker changes nothing but may end a disk snapshot, as may the change at its end:
    /// see [`Self::end_disk_snapshot`].
    ///
    /// # Errors
    /// `NotMyVbucket` unless `vbid` is a replica here; `Invalid` for a seqno not above the
    /// replica's high seqno; `TempFail` when memory is full (apply it again later).
    pub(crate) fn op_replicate(&self, vbid: Vbid, event: DcpEvent) -> EngineResult<()> {
        let vb = self.replica_vbucket(vbid)?;
        let state = vb.state();
        if *state != VBucketState::Replica {
            return Err(EngineStatus::NotMyVbucket);
        }
        let (high, _, _) = vb.ordering_snapshot();
        if let DcpEvent::SnapshotMarker {
            start,
            end,
            high_completed,
            ..
        } = event
        {
            if let Some(ended) = vb
                .durability
                .passive_marker(start, end, high_completed, high)
            {
                self.end_disk_snapshot(vb, &ended);
            }
            return Ok(());
        }
        let Some(seqno) = event.seqno() else {
            return Ok(());
        };
        if seqno <= high {
            tracing::warn!(%vbid, seqno, high_seqno = high, "replication stream sent a seqno out of order; refused");
            return Err(EngineStatus::Invalid);
        }
        self.core.counters.incr(Counter::ReplicaItems);
        self.apply_replicated(vb, event)?;
        if let Some(ended) = vb.durability.passive_applied(seqno) {
            self.end_disk_snapshot(vb, &ended);
        }
        Ok(())
    }

    /// The end of a disk snapshot (KV-Engine's HCS rule, see
    /// [`Monitor::passive_marker`](crate::durability_monitor::Monitor::passive_marker)):
    /// the prepares held at or below its high completed seqno were committed or aborted
    /// on the active, and what the snapshot carried of their keys is their outcome. Each
    /// leaves the prepared slot, the committed version as the snapshot made it; the high
    /// completed seqno is persisted with the vBucket's state, so that warmup does not
    /// restore them from the replica's disk either. Without it a promoted replica would
    /// commit such a prepare again, over the newer value of its key.
    fn end_disk_snapshot(&self, vb: &VBucket, ended: &SnapshotEnd) {
        for p in &ended.completed {
            vb.table.with_entry(&p.key, |e| {
                // A later prepare of the key the snapshot carried stays.
                if e.prepared().is_some_and(|h| h.meta().by_seqno.0 == p.seqno) {
                    e.remove_prepared();
                }
            });
        }
        if !ended.completed.is_empty() {
            tracing::debug!(vbid = %vb.id, prepares = ended.completed.len(), high_completed_seqno = ended.high_completed, "a disk snapshot's end completes the prepares the replica held");
        }
        if vb.is_persistent() {
            let woke = vb.persist.raise_completed(ended.high_completed);
            self.core.queued(vb, woke);
        }
    }

    /// Applies one change (an event with a seqno, checked above the high seqno) to `vb`.
    fn apply_replicated(&self, vb: &VBucket, event: DcpEvent) -> EngineResult<()> {
        let (doc, deleted) = match event {
            DcpEvent::Mutation(d) => (d, None),
            DcpEvent::Deletion(d) => (d, Some(DeleteSource::Explicit)),
            DcpEvent::Expiration(d) => (d, Some(DeleteSource::Expiry)),
            DcpEvent::SnapshotMarker { .. } | DcpEvent::End(_) => return Ok(()),
            DcpEvent::System { seqno, event } => {
                // Kept for the streams this vBucket serves once promoted; the node's
                // own manifest is not changed by it.
                let (_, woke) = vb.assign_replicated(seqno, 0, None, None, |a| {
                    crate::system_events::document(&event, a)
                });
                self.core.queued(vb, woke);
                return Ok(());
            }
            DcpEvent::Prepare {
                doc,
                deleted,
                level,
            } => return self.replicate_prepare(vb, doc, deleted, level),
            DcpEvent::Commit {
                key,
                prepared_seqno,
                commit_seqno,
            } => return self.replicate_commit(vb, &key, prepared_seqno, commit_seqno),
            DcpEvent::Abort {
                key,
                prepared_seqno,
                abort_seqno,
            } => return self.replicate_abort(vb, &key, prepared_seqno, abort_seqno),
        };
        let rev = doc.rev_seqno;
        vb.table.with_entry(&doc.key, |e| {
            if let Some(source) = deleted {
                let (a, woke) = vb.assign_replicated(doc.seqno, doc.cas, Some(rev), None, |a| {
                    let mut t = tombstone_document(doc.key.clone(), a, rev);
                    t.datatype |= source.tombstone_bits();
                    t
                });
                crate::full_eviction::remove_deleted(vb, e, &a, rev);
                self.core.queued(vb, woke);
                return Ok(());
            }
            let meta = ItemMeta {
                cas: Cas(doc.cas),
                rev_seqno: rev,
                by_seqno: Seqno(doc.seqno),
                flags: doc.flags,
                expiry: doc.expiry,
                datatype: Datatype(doc.datatype),
                ..ItemMeta::default()
            };
            let sv =
                StoredValue::new(&doc.key, &doc.value, meta).map_err(|_| EngineStatus::Invalid)?;
            vb.note_xattrs(Datatype(doc.datatype));
            self.core.insert_or_tempfail(e, sv)?;
            vb.note_written(e.key());
            let (a, woke) = vb.assign_replicated(doc.seqno, doc.cas, None, None, |a| {
                document_of(e, a, rev, None)
            });
            if !vb.is_persistent() {
                e.mark_clean(a.seqno);
            }
            self.core.queued(vb, woke);
            Ok(())
        })
    }

    /// A SyncWrite's prepare reaches the replica: held in the prepared slot (readers see
    /// the committed version), persisted under the prepare namespace, and tracked until
    /// its commit or abort.
    fn replicate_prepare(
        &self,
        vb: &VBucket,
        doc: DcpDocument,
        deleted: bool,
        level: u8,
    ) -> EngineResult<()> {
        let meta = ItemMeta {
            cas: Cas(doc.cas),
            rev_seqno: doc.rev_seqno,
            by_seqno: Seqno(doc.seqno),
            flags: doc.flags,
            expiry: doc.expiry,
            datatype: Datatype(doc.datatype),
            ..ItemMeta::default()
        };
        let sv = if deleted {
            StoredValue::new_tombstone(&doc.key, &doc.value, meta)
        } else {
            StoredValue::new(&doc.key, &doc.value, meta)
        }
        .map_err(|_| EngineStatus::Invalid)?
        .with_state(CommittedState::Pending);
        vb.table.with_entry(&doc.key, |e| {
            self.core.insert_or_tempfail(e, sv)?;
            let step = SyncStep {
                prepared: true,
                completed: 0,
                deleted_rev: None,
                visible: false,
                level,
            };
            let (_, woke) =
                vb.assign_replicated(doc.seqno, doc.cas, None, Some(step), |_| Document {
                    key: prepare_key(&doc.key),
                    value: doc.value.clone(),
                    seqno: doc.seqno,
                    cas: doc.cas,
                    rev_seqno: doc.rev_seqno,
                    flags: doc.flags,
                    expiry: doc.expiry,
                    datatype: doc.datatype | if deleted { PREPARE_DELETES } else { 0 },
                    deleted: false,
                });
            vb.durability.passive_prepare(Passive {
                seqno: doc.seqno,
                key: doc.key.clone(),
                // Only PersistToMajority needs the replica's disk (MajorityAndPersistOnMaster
                // needs the active's).
                persist: level == DurabilityLevel::PersistToMajority as u8,
            });
            self.core.queued(vb, woke);
            Ok(())
        })
    }

    /// The active committed prepare `prepared_seqno` at `commit_seqno`: the replica's
    /// prepare becomes the committed version with that seqno.
    fn replicate_commit(
        &self,
        vb: &VBucket,
        key: &[u8],
        prepared_seqno: u64,
        commit_seqno: u64,
    ) -> EngineResult<()> {
        vb.durability.passive_complete(prepared_seqno);
        vb.table.with_entry(key, |e| {
            let Some(p) = e.prepared().filter(|p| p.meta().by_seqno.0 == prepared_seqno) else {
                tracing::error!(vbid = %vb.id, prepared_seqno, "a replicated commit names a prepare the replica does not hold");
                return Err(EngineStatus::Invalid);
            };
            let pm = *p.meta();
            let deletes = p.is_deleted();
            let step = SyncStep {
                prepared: false,
                completed: prepared_seqno,
                deleted_rev: deletes.then_some(pm.rev_seqno),
                visible: true,
                level: 0,
            };
            let value = bytes::Bytes::copy_from_slice(p.value());
            let (a, woke) = vb.assign_replicated(
                commit_seqno,
                pm.cas.0,
                deletes.then_some(pm.rev_seqno),
                Some(step),
                |a| Document {
                    key: key.to_vec(),
                    value,
                    seqno: a.seqno.0,
                    cas: pm.cas.0,
                    rev_seqno: pm.rev_seqno,
                    flags: pm.flags,
                    expiry: pm.expiry,
                    datatype: pm.datatype.0,
                    deleted: deletes,
                },
            );
            let meta = ItemMeta {
                by_seqno: a.seqno,
                ..pm
            };
            e.convert_prepared(meta).map_err(|err| {
                tracing::error!(vbid = %vb.id, prepared_seqno, error = %err, "cannot commit a replicated prepare");
                EngineStatus::Internal
            })?;
            if !deletes {
                vb.note_written(key);
            }
            if !vb.is_persistent() {
                e.mark_clean(a.seqno);
                if deletes {
                    e.remove();
                }
            }
            self.core.queued(vb, woke);
            Ok(())
        })
    }

    /// The active aborted prepare `prepared_seqno` of `key` at `abort_seqno`. The prepare
    /// the replica holds for the key goes, whatever its seqno, as KV-Engine's passive
    /// monitor completes an abort by key: from a backfill the replica may get the abort
    /// of a later prepare of the key than the one it holds (the disk keeps only the
    /// newest abort of a key), or of a prepare it never saw.
    fn replicate_abort(
        &self,
        vb: &VBucket,
        key: &[u8],
        prepared_seqno: u64,
        abort_seqno: u64,
    ) -> EngineResult<()> {
        vb.table.with_entry(key, |e| {
            let held = e
                .prepared()
                .map(|p| (p.meta().by_seqno.0, p.meta().rev_seqno));
            vb.durability
                .passive_complete(held.map_or(prepared_seqno, |(seqno, _)| seqno));
            let rev = held.map_or(0, |(_, rev)| rev);
            e.remove_prepared();
            let step = SyncStep {
                prepared: false,
                completed: prepared_seqno,
                deleted_rev: None,
                visible: false,
                level: 0,
            };
            let (_, woke) = vb.assign_replicated(abort_seqno, 0, None, Some(step), |a| {
                crate::durability::abort_document(key, a, rev, prepared_seqno)
            });
            self.core.queued(vb, woke);
            Ok(())
        })
    }

    /// The high prepared seqno replica vBucket `vbid` may acknowledge now
    /// ([`crate::durability_monitor::Monitor::replica_hps`]).
    ///
    /// # Errors
    /// `NotMyVbucket` unless `vbid` is a replica here.
    pub(crate) fn op_replica_prepared_seqno(&self, vbid: Vbid) -> EngineResult<u64> {
        let vb = self.replica_vbucket(vbid)?;
        let persisted = if vb.is_persistent() {
            vb.persist.persisted()
        } else {
            u64::MAX
        };
        Ok(vb.durability.replica_hps(persisted))
    }

    /// Makes replica vBucket `vbid`'s failover log the active's (newest first), as the
    /// stream request's answer gives it.
    ///
    /// # Errors
    /// `NotMyVbucket` unless `vbid` is a replica here; `Invalid` for an empty log.
    pub(crate) fn adopt_failover_log(&self, vbid: Vbid, log: &[(u64, u64)]) -> EngineResult<()> {
        if log.is_empty() {
            return Err(EngineStatus::Invalid);
        }
        let vb = self.replica_vbucket(vbid)?;
        vb.replace_failover_log(log);
        if vb.is_persistent() {
            vb.persist.mark_state_dirty();
            if let Some(p) = &self.core.persistence {
                p.wake(vbid);
            }
        }
        Ok(())
    }

    /// Starts replica vBucket `vbid` over: drops its documents and its file, and restarts
    /// its seqnos at 0 (a rollback; see the module docs). A dead vBucket is emptied the
    /// same way (a rebalance moved it away from this node).
    ///
    /// # Errors
    /// `NotMyVbucket` unless `vbid` is a replica or dead here; `TempFail` when its file
    /// cannot be deleted.
    pub(crate) fn reset_replica(&self, vbid: Vbid) -> EngineResult<()> {
        let vb = self
            .core
            .vbuckets
            .get(usize::from(vbid.0))
            .ok_or(EngineStatus::NotMyVbucket)?;
        vb.check_warm()?;
        let state = vb.state();
        if !matches!(*state, VBucketState::Replica | VBucketState::Dead) {
            return Err(EngineStatus::NotMyVbucket);
        }
        if let Some(full) = &vb.full {
            full.reset();
        }
        vb.durability.take_passive();
        let removed = vb.table.clear();
        if let Some(p) = &self.core.persistence
            && let Err(e) = p.wipe_one(vb)
        {
            tracing::error!(bucket = %self.core.config.name, %vbid, error = %e, "cannot delete a replica vBucket's file to roll it back");
            return Err(EngineStatus::TempFail);
        }
        vb.reset_seqnos();
        tracing::info!(bucket = %self.core.config.name, %vbid, removed, "replica vBucket rolled back to seqno 0");
        Ok(())
    }
}
