//! DCP producer streams: each vBucket's log of recent changes and the streams that read
//! it, falling back to a backfill from disk when they are behind it.
//!
//! **The log.** A vBucket keeps a [`crate::dcp_log::DcpLog`] only while at least one stream is open on
//! it, so a bucket nobody streams from pays one atomic load per write. While it is on,
//! the ordering point ([`crate::vbucket::VBucket::assign_queued`] and `assign_sync`)
//! appends every change to it with the ordering lock held, so the log is in seqno order
//! and has no gaps: it holds every seqno above its `base`. It is bounded (bytes charged
//! to the bucket's memory quota, at most [`crate::dcp_log::LOG_BYTES`] per vBucket): when
//! full, or when the quota refuses the charge, the oldest entries go and `base` moves up.
//!
//! **A stream** ([`Stream`]) has a cursor, the last seqno it handed out. While the log
//! holds the seqno after it, it reads from memory: each read is one snapshot
//! ([`SNAPSHOT_MEMORY`]) of the entries it takes. When the cursor is below the log's
//! `base` (the stream started from an older seqno, or fell behind), a persistent bucket
//! backfills: it reads the vBucket's file by seqno from the cursor up to the persisted
//! seqno, as one disk snapshot ([`SNAPSHOT_DISK`]), a budget at a time, then goes back
//! to the log (backfilling again if the log has moved on meanwhile). A disk snapshot
//! carries the newest version of each key in its range, as KV-Engine's do; a key changed
//! again while the backfill runs arrives later with its newer seqno. A memory-only bucket
//! has no disk: a stream that falls behind its log ends with [`DcpEndReason::Slow`], and a
//! stream cannot start below the high seqno.
//!
//! **What a stream sends.** Committed changes as mutations and deletions; with sync
//! replication, prepares, commits and aborts as they are. On disk a commit is the
//! committed document, sent as a mutation or deletion; a disk snapshot with sync
//! replication also sends the prepares still pending and, as KV-Engine's do, the aborts
//! (an abort's tombstone names its prepare), so that what the replica applies ends at
//! the last seqno of the range, aborts included. A stream without the collection filter
//! sees every collection; the front end encodes keys for the client.
//!
//! **Waking.** A stream with nothing to send leaves its waker with the log (new entries
//! wake it), or with the persistence waiters when it waits for the flusher to reach the
//! log's base. A state change wakes every waiter, so streams end with
//! [`DcpEndReason::StateChanged`] promptly.
//!
//! **States.** An active or a pending vBucket streams: during a takeover the vBucket is
//! pending (its clients parked, see [`crate::parking`]) while the node taking it over
//! catches up over its stream, so going pending does not end a stream. Going replica or
//! dead does, and so does becoming active again from pending (a move rolled back starts
//! a new failover branch; the consumer asks again from where it is).
//!
//! Level: a service over [`crate::bucket_core::BucketCore`]; a stream holds its bucket as a
//! `Weak<dyn CoreOwner>` and never names it. The log itself is [`crate::dcp_log`], a leaf.

use crate::bucket_core::{BucketCore, CoreOwner};
use crate::collections::Manifest;
use crate::dcp_log::{LogKind, Read};
use crate::vbucket::VBucket;
use epkv_engine_api::EngineStatus;
use epkv_engine_api::dcp::{
    CollectionEvent, CollectionEventKind, DcpDocument, DcpEndReason, DcpEvent, DcpStream,
    DcpStreamError, DcpStreamRequest, SNAPSHOT_CHECKPOINT, SNAPSHOT_DISK, SNAPSHOT_MEMORY,
};
use epkv_storage::{Document, ScanControl};
use epkv_types::{VBucketState, Vbid};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

/// Checks a stream request against the vBucket's failover log (newest first) and high
/// seqno, as KV-Engine's failover table does. Returns the uuid the stream follows.
///
/// # Errors
/// `Rollback(seqno)` when the client's history is not this vBucket's; `OutOfRange` when
/// the start is past the end; `Invalid` when the start is outside the client's snapshot.
pub(crate) fn check_history(
    failover: &[(u64, u64)],
    high_seqno: u64,
    purge_seqno: u64,
    req: &DcpStreamRequest,
) -> Result<u64, DcpStreamError> {
    let newest = failover.first().map_or(0, |e| e.0);
    if req.start_seqno > req.end_seqno {
        return Err(EngineStatus::OutOfRange.into());
    }
    if req.snap_start_seqno > req.start_seqno || req.start_seqno > req.snap_end_seqno {
        return Err(EngineStatus::Invalid.into());
    }
    if req.start_seqno == 0 {
        return Ok(newest);
    }
    let Some(i) = failover.iter().position(|e| e.0 == req.vbucket_uuid) else {
        return Err(DcpStreamError::Rollback(0));
    };
    // The branch's history ends where the next branch began (or at the high seqno).
    let upper = if i == 0 {
        high_seqno
    } else {
        failover[i - 1].1
    };
    if req.snap_end_seqno > upper {
        let to = if req.snap_start_seqno <= upper {
            req.snap_start_seqno
        } else {
            upper
        };
        return Err(DcpStreamError::Rollback(to));
    }
    if req.start_seqno < purge_seqno {
        // Deletions the client has not seen may be gone.
        return Err(DcpStreamError::Rollback(0));
    }
    Ok(newest)
}

/// Where a stream reads from.
#[derive(Debug)]
enum Phase {
    /// The log.
    Memory,
    /// The vBucket's file, up to `upto`; `marker` is whether its snapshot marker went.
    Backfill { upto: u64, hcs: u64, marker: bool },
    /// Ended.
    Done,
}

/// Which collections a stream sends, and their scope and collection events.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Filter {
    /// Every collection and every event.
    All,
    /// These collections, and their creation and drop; when the last one is dropped the
    /// stream ends ([`DcpEndReason::FilterEmpty`]).
    Collections(Vec<u32>),
    /// The collections of this scope (created before or after the stream began), their
    /// events and the scope's drop, which ends the stream.
    Scope(u32),
}

impl Filter {
    /// The manifest a read resolves a scope filter's collections with: taken once per
    /// read (after the entries it covers were written), not once per document.
    fn manifest(&self, b: &BucketCore) -> Option<Arc<Manifest>> {
        matches!(self, Self::Scope(_)).then(|| b.collections.manifest())
    }

    /// Whether a document of stored key `key` (a prepare's or a committed one) passes;
    /// `manifest` is [`Self::manifest`]'s.
    fn wants(&self, manifest: Option<&Manifest>, key: &[u8]) -> bool {
        let cid = match crate::durability_monitor::prepared_key_of(key) {
            Some(k) => epkv_types::doc_key::collection_of(k),
            None => epkv_types::doc_key::collection_of(key),
        };
        match self {
            Self::All => true,
            Self::Collections(c) => c.contains(&cid),
            Self::Scope(sid) => manifest
                .and_then(|m| m.collection(cid))
                .is_some_and(|(s, _)| s.id == *sid),
        }
    }

    /// Whether `ev` passes, and whether the filter is empty after it (the stream ends
    /// once it is sent).
    fn on_event(&mut self, ev: &CollectionEvent) -> (bool, bool) {
        let collection_event = matches!(
            ev.kind,
            CollectionEventKind::CreateCollection | CollectionEventKind::DropCollection
        );
        match self {
            Self::All => (true, false),
            Self::Collections(c) => {
                if !collection_event || !c.contains(&ev.collection_id) {
                    return (false, false);
                }
                if ev.kind == CollectionEventKind::DropCollection {
                    c.retain(|id| *id != ev.collection_id);
                }
                (true, c.is_empty())
            }
            Self::Scope(sid) => {
                if ev.scope_id != *sid {
                    return (false, false);
                }
                (true, ev.kind == CollectionEventKind::DropScope)
            }
        }
    }
}

/// The event a stream with `filter` sends for the change `doc` of `kind`, if any. Sets
/// `emptied` when the change empties the filter. A committed change of a collection that
/// no longer exists is not sent (as a backfill skips them), so that a write racing a
/// drop never reaches a client after the drop's event. `manifest` is
/// [`Filter::manifest`]'s.
fn select(
    filter: &mut Filter,
    b: &BucketCore,
    manifest: Option<&Manifest>,
    sync: bool,
    kind: LogKind,
    doc: Document,
    emptied: &mut bool,
) -> Option<DcpEvent> {
    if kind == LogKind::System {
        let ev = event_of(kind, doc, sync)?;
        let DcpEvent::System { event, .. } = &ev else {
            return None;
        };
        let (wanted, empty) = filter.on_event(event);
        *emptied = empty;
        return wanted.then_some(ev);
    }
    if !filter.wants(manifest, &doc.key) {
        return None;
    }
    let committed = match kind {
        LogKind::Mutation | LogKind::Deletion => true,
        LogKind::Commit(_) => !sync,
        _ => false,
    };
    if committed && b.collections.check_key(&doc.key).is_err() {
        return None;
    }
    event_of(kind, doc, sync)
}

/// One vBucket's stream (see the module docs).
pub(crate) struct Stream {
    bucket: Weak<dyn CoreOwner>,
    vbid: Vbid,
    uuid: u64,
    cursor: u64,
    end: u64,
    sync: bool,
    filter: Filter,
    phase: Phase,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("vbid", &self.vbid)
            .field("cursor", &self.cursor)
            .field("end", &self.end)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

impl BucketCore {
    /// Opens a DCP stream of `vbid` ([`epkv_engine_api::Engine::dcp_stream`]).
    pub(crate) fn dcp_stream(
        &self,
        vbid: Vbid,
        req: DcpStreamRequest,
    ) -> Result<Box<dyn DcpStream>, DcpStreamError> {
        let vb = self
            .vbuckets
            .get(usize::from(vbid.0))
            .ok_or(EngineStatus::NotMyVbucket)?;
        vb.check_warm()?;
        let bucket = self.owner.clone();
        let state = vb.state();
        if !matches!(*state, VBucketState::Active | VBucketState::Pending) {
            return Err(EngineStatus::NotMyVbucket.into());
        }
        let failover: Vec<(u64, u64)> = vb
            .failover_log()
            .iter()
            .map(|e| (e.uuid, e.seqno))
            .collect();
        let purge_seqno = match &self.persistence {
            Some(p) => p.purge_seqno(vbid),
            None => 0,
        };
        // Attached under the ordering lock: the log starts right after the high seqno
        // the history check uses.
        let high_seqno = vb.dcp_attach();
        let checked = check_history(&failover, high_seqno, purge_seqno, &req).and_then(|uuid| {
            if self.persistence.is_none() && req.start_seqno < high_seqno {
                // Nothing to backfill from.
                tracing::info!(bucket = %self.config.name, %vbid, start = req.start_seqno, high_seqno, "DCP stream refused: a memory-only bucket streams only from its high seqno");
                return Err(EngineStatus::NotSupported.into());
            }
            Ok(uuid)
        });
        drop(state);
        let uuid = match checked {
            Ok(uuid) => uuid,
            Err(e) => {
                vb.dcp.detach(&self.memory);
                return Err(e);
            }
        };
        Ok(Box::new(Stream {
            bucket,
            vbid,
            uuid,
            cursor: req.start_seqno,
            end: req.end_seqno,
            sync: req.sync_replication,
            filter: match (req.collections, req.scope) {
                (Some(c), _) => Filter::Collections(c),
                (None, Some(sid)) => Filter::Scope(sid),
                (None, None) => Filter::All,
            },
            phase: Phase::Memory,
        }))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if matches!(self.phase, Phase::Done) {
            return;
        }
        if let Some(b) = self.bucket.upgrade()
            && let Some(vb) = b.core().vbuckets.get(usize::from(self.vbid.0))
        {
            vb.dcp.detach(&b.core().memory);
        }
    }
}

/// The event for a change, or `None` when the stream does not send it.
fn event_of(kind: LogKind, doc: Document, sync: bool) -> Option<DcpEvent> {
    let document = |doc: Document| DcpDocument {
        key: doc.key,
        value: doc.value,
        seqno: doc.seqno,
        rev_seqno: doc.rev_seqno,
        cas: doc.cas,
        flags: doc.flags,
        expiry: doc.expiry,
        datatype: crate::vbucket::client_datatype(doc.datatype).0,
    };
    // A committed change: a mutation, or a deletion (an expiration, when the expiry
    // pass or an access found it expired) when its document is a tombstone.
    let committed = |doc: Document| {
        if !doc.deleted {
            DcpEvent::Mutation(document(doc))
        } else if doc.datatype & crate::vbucket::EXPIRED_TOMBSTONE != 0 {
            DcpEvent::Expiration(document(doc))
        } else {
            DcpEvent::Deletion(document(doc))
        }
    };
    match kind {
        LogKind::System => {
            crate::system_events::event_of_document(&doc).map(|event| DcpEvent::System {
                seqno: doc.seqno,
                event,
            })
        }
        LogKind::Mutation | LogKind::Deletion => Some(committed(doc)),
        // Without sync replication a commit is the committed change itself.
        LogKind::Commit(_) if !sync => Some(committed(doc)),
        LogKind::Prepare(_) | LogKind::Abort(_) if !sync => None,
        LogKind::Prepare(level) => {
            let key = crate::durability_monitor::prepared_key_of(&doc.key)?.to_vec();
            let deleted = doc.datatype & crate::durability_monitor::PREPARE_DELETES != 0;
            Some(DcpEvent::Prepare {
                doc: DcpDocument {
                    key,
                    ..document(doc)
                },
                deleted,
                level,
            })
        }
        LogKind::Commit(prepared_seqno) => Some(DcpEvent::Commit {
            key: doc.key,
            prepared_seqno,
            commit_seqno: doc.seqno,
        }),
        LogKind::Abort(prepared_seqno) => Some(DcpEvent::Abort {
            key: crate::durability_monitor::prepared_key_of(&doc.key)?.to_vec(),
            prepared_seqno,
            abort_seqno: doc.seqno,
        }),
    }
}

impl Stream {
    fn end(&mut self, reason: DcpEndReason, out: &mut Vec<DcpEvent>) -> Poll<()> {
        if let Some(b) = self.bucket.upgrade()
            && let Some(vb) = b.core().vbuckets.get(usize::from(self.vbid.0))
        {
            vb.dcp.detach(&b.core().memory);
        }
        self.phase = Phase::Done;
        out.push(DcpEvent::End(reason));
        Poll::Ready(())
    }

    fn read_memory(
        &mut self,
        b: &BucketCore,
        vb: &VBucket,
        cx: &Context<'_>,
        budget: usize,
        out: &mut Vec<DcpEvent>,
    ) -> Poll<()> {
        match vb.dcp.read(self.cursor, self.end, budget, cx) {
            Read::Empty => Poll::Pending,
            Read::Entries(entries) => {
                let manifest = self.filter.manifest(b);
                let mut last = self.cursor;
                let mut events = Vec::with_capacity(entries.len());
                let mut max_visible = 0;
                let mut emptied = false;
                for e in entries {
                    last = e.doc.seqno;
                    if matches!(
                        e.kind,
                        LogKind::Mutation
                            | LogKind::Deletion
                            | LogKind::Commit(_)
                            | LogKind::System
                    ) {
                        max_visible = e.doc.seqno;
                    }
                    let (sync, manifest) = (self.sync, manifest.as_deref());
                    if let Some(ev) = select(
                        &mut self.filter,
                        b,
                        manifest,
                        sync,
                        e.kind,
                        e.doc,
                        &mut emptied,
                    ) {
                        events.push(ev);
                    }
                    if emptied {
                        break;
                    }
                }
                let sent = !events.is_empty();
                if sent {
                    out.push(DcpEvent::SnapshotMarker {
                        start: self.cursor + 1,
                        end: last,
                        flags: SNAPSHOT_MEMORY | SNAPSHOT_CHECKPOINT,
                        max_visible: max_visible.max(self.cursor),
                        high_completed: None,
                    });
                    out.extend(events);
                }
                self.cursor = last;
                if emptied {
                    return self.end(DcpEndReason::FilterEmpty, out);
                }
                if self.cursor >= self.end {
                    return self.end(DcpEndReason::Ok, out);
                }
                if !sent {
                    // Everything was filtered out: look again at once.
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Poll::Ready(())
            }
            Read::Behind { base } => {
                let Some(p) = &b.persistence else {
                    return self.end(DcpEndReason::Slow, out);
                };
                let persisted = vb.persist.persisted();
                if persisted < base.min(self.end) {
                    // The disk has not reached the log yet: wait for the flusher.
                    let waker = cx.waker().clone();
                    if !vb
                        .persist
                        .when_persisted(base.min(self.end), Box::new(move |_| waker.wake()))
                    {
                        cx.waker().wake_by_ref();
                    } else {
                        p.urgent(self.vbid);
                    }
                    return Poll::Pending;
                }
                let hcs = p.high_completed_seqno(self.vbid);
                self.phase = Phase::Backfill {
                    upto: persisted.min(self.end),
                    hcs,
                    marker: false,
                };
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }

    fn read_disk(&mut self, b: &BucketCore, budget: usize, out: &mut Vec<DcpEvent>) -> Poll<()> {
        let Phase::Backfill { upto, hcs, marker } = self.phase else {
            return Poll::Pending;
        };
        let Some(p) = &b.persistence else {
            return self.end(DcpEndReason::BackfillFailed, out);
        };
        let mut events = Vec::new();
        let mut size = 0usize;
        let mut last = self.cursor;
        let mut max_visible = 0;
        let mut stopped = false;
        let mut emptied = false;
        let sync = self.sync;
        let manifest = self.filter.manifest(b);
        let filter = &mut self.filter;
        let scanned = p.scan_by_seqno(self.vbid, self.cursor + 1, upto, &mut |d: Document| {
            if size >= budget {
                stopped = true;
                return ScanControl::Stop;
            }
            last = d.seqno;
            let prepare = crate::durability_monitor::prepared_key_of(&d.key).is_some();
            if !prepare {
                max_visible = d.seqno;
            }
            let kind = if crate::system_events::is_system_key(&d.key) {
                LogKind::System
            } else if prepare && d.deleted {
                // An abort (its tombstone replaced the prepare's document): a sync
                // replication stream sends it, so that the replica reaches the active's
                // high seqno even when the abort is the last change of the range.
                LogKind::Abort(crate::durability_monitor::aborted_prepare_seqno(&d.value))
            } else if prepare {
                if d.seqno <= hcs {
                    // Committed: the committed document the snapshot carries is the
                    // outcome.
                    return ScanControl::Continue;
                }
                // The level is not stored: a pending prepare read back is Majority.
                LogKind::Prepare(1)
            } else if d.deleted {
                LogKind::Deletion
            } else {
                LogKind::Mutation
            };
            if let Some(ev) = select(filter, b, manifest.as_deref(), sync, kind, d, &mut emptied) {
                size += ev.wire_size();
                events.push(ev);
            }
            if emptied {
                stopped = true;
                return ScanControl::Stop;
            }
            ScanControl::Continue
        });
        if let Err(e) = scanned {
            tracing::error!(vbid = %self.vbid, error = %e, "DCP backfill failed");
            return self.end(DcpEndReason::BackfillFailed, out);
        }
        if !events.is_empty() && !marker {
            out.push(DcpEvent::SnapshotMarker {
                start: self.cursor + 1,
                end: upto,
                flags: SNAPSHOT_DISK | SNAPSHOT_CHECKPOINT,
                max_visible: max_visible.max(self.cursor),
                high_completed: Some(hcs),
            });
        }
        let sent_marker = marker || !events.is_empty();
        out.extend(events);
        if emptied {
            self.cursor = last;
            return self.end(DcpEndReason::FilterEmpty, out);
        }
        if stopped {
            self.cursor = last;
            self.phase = Phase::Backfill {
                upto,
                hcs,
                marker: sent_marker,
            };
        } else {
            self.cursor = upto;
            self.phase = Phase::Memory;
            if self.cursor >= self.end {
                return self.end(DcpEndReason::Ok, out);
            }
        }
        Poll::Ready(())
    }
}

impl DcpStream for Stream {
    fn poll_events(
        &mut self,
        cx: &mut Context<'_>,
        budget_bytes: usize,
        out: &mut Vec<DcpEvent>,
    ) -> Poll<()> {
        if matches!(self.phase, Phase::Done) {
            return Poll::Pending;
        }
        let Some(owner) = self.bucket.upgrade() else {
            return self.end(DcpEndReason::StateChanged, out);
        };
        let b = owner.core();
        let Some(vb) = b.vbuckets.get(usize::from(self.vbid.0)) else {
            return self.end(DcpEndReason::StateChanged, out);
        };
        // A pending vBucket streams on (the node taking it over catches up); any other
        // change ends the stream, as does a new failover branch (pending → active again).
        let streams = matches!(
            vb.state_hint(),
            VBucketState::Active | VBucketState::Pending
        );
        if !streams || vb.uuid() != self.uuid {
            return self.end(DcpEndReason::StateChanged, out);
        }
        if self.cursor >= self.end {
            return self.end(DcpEndReason::Ok, out);
        }
        let before = out.len();
        let r = match self.phase {
            Phase::Memory => self.read_memory(b, vb, cx, budget_bytes, out),
            Phase::Backfill { .. } => self.read_disk(b, budget_bytes, out),
            Phase::Done => Poll::Pending,
        };
        if r.is_ready() && out.len() == before {
            // A backfill chunk with nothing to send: go on at the next poll.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        r
    }

    fn vbucket_uuid(&self) -> u64 {
        self.uuid
    }

    fn last_seqno(&self) -> u64 {
        self.cursor
    }

    fn backfilling(&self) -> bool {
        matches!(self.phase, Phase::Backfill { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(start: u64, uuid: u64, snap: (u64, u64)) -> DcpStreamRequest {
        DcpStreamRequest {
            start_seqno: start,
            end_seqno: u64::MAX,
            vbucket_uuid: uuid,
            snap_start_seqno: snap.0,
            snap_end_seqno: snap.1,
            ..DcpStreamRequest::default()
        }
    }

    #[test]
    fn history_check_follows_the_failover_log() {
        // Branch 7 began at 0, branch 9 at 100; high seqno 150.
        let log = [(9, 100), (7, 0)];
        assert_eq!(check_history(&log, 150, 0, &req(0, 0, (0, 0))), Ok(9));
        assert_eq!(check_history(&log, 150, 0, &req(120, 9, (120, 120))), Ok(9));
        // On the old branch, up to where the new one began.
        assert_eq!(check_history(&log, 150, 0, &req(90, 7, (90, 90))), Ok(9));
        // Past the branch point on the old branch: roll back to it.
        assert_eq!(
            check_history(&log, 150, 0, &req(120, 7, (120, 120))),
            Err(DcpStreamError::Rollback(100))
        );
        // In a snapshot that straddles the branch point: to the snapshot's start.
        assert_eq!(
            check_history(&log, 150, 0, &req(95, 7, (90, 110))),
            Err(DcpStreamError::Rollback(90))
        );
        // An unknown branch: from scratch.
        assert_eq!(
            check_history(&log, 150, 0, &req(10, 5, (10, 10))),
            Err(DcpStreamError::Rollback(0))
        );
        // Ahead of the vBucket: roll back to its high seqno.
        assert_eq!(
            check_history(&log, 150, 0, &req(200, 9, (200, 200))),
            Err(DcpStreamError::Rollback(150))
        );
        // Deletions purged after the client's seqno.
        assert_eq!(
            check_history(&log, 150, 50, &req(40, 9, (40, 40))),
            Err(DcpStreamError::Rollback(0))
        );
        // Malformed requests.
        let mut r = req(10, 9, (10, 10));
        r.end_seqno = 5;
        assert_eq!(
            check_history(&log, 150, 0, &r),
            Err(DcpStreamError::Status(EngineStatus::OutOfRange))
        );
        assert_eq!(
            check_history(&log, 150, 0, &req(10, 9, (11, 12))),
            Err(DcpStreamError::Status(EngineStatus::Invalid))
        );
    }
}
