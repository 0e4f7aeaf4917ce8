//! RANGE_SCAN_CONTINUE and RANGE_SCAN_CANCEL: returning a scan's keys or documents a
//! batch at a time, and reading evicted documents on a Reader task.

use crate::Bucket;
use crate::bucket_core::schedule_weak;
use crate::scan_registry::{
    CONTINUE_MAX_BYTES, LOAD_BYTES, LOAD_ITEMS, OpenScan, Phase, Scan, wake,
};
use crate::vbucket::{VBucket, client_datatype};
use epkv_engine_api::{
    EngineResult, EngineStatus, FetchedCallback, RangeScanId, RangeScanLimits, RangeScanProgress,
    ScanContent, ScanDocument, ScanItem,
};
use epkv_hashtable::{TrackReference, WantsDeleted};
use epkv_storage::{Document, KvStore};
use epkv_types::Vbid;
use epkv_types::doc_key::{self, DocKeyBuf};
use std::sync::Arc;

/// Items between two reads of the clock for a continue's time limit.
const CLOCK_EVERY: usize = 64;

/// What a continue found for one document.
enum Found {
    /// Returned (with these bytes).
    Emitted(usize),
    /// Gone since the create (deleted, expired): skipped.
    Skipped,
    /// Its value (or, under full eviction, the document) is only on disk.
    OnDisk,
}

impl Bucket {
    /// See [`epkv_engine_api::Engine::range_scan_continue`].
    pub(crate) fn op_range_scan_continue(
        &self,
        vbid: Vbid,
        id: RangeScanId,
        limits: RangeScanLimits,
        emit: &mut dyn FnMut(ScanItem<'_>),
    ) -> EngineResult<RangeScanProgress> {
        let scan = self
            .range_scans
            .get(vbid, id)
            .ok_or(EngineStatus::KeyNotFound)?;
        let Some(mut st) = scan.state.try_lock() else {
            return Err(EngineStatus::TooBusy);
        };
        let open = match &mut st.phase {
            Phase::Open(open) => open,
            Phase::Cancelled => {
                drop(st);
                self.range_scans.remove(id);
                return Err(EngineStatus::RangeScanCancelled);
            }
            // A create not finished yet is not a scan a client can know.
            _ => return Err(EngineStatus::KeyNotFound),
        };
        if open.loading {
            return Err(EngineStatus::WouldBlock);
        }
        *scan.last_used.lock() = self.core.clock.now();
        let (vb, _state) = match self.scan_vbucket(vbid, scan.collection) {
            Ok(v) => v,
            Err(e) => {
                drop(st);
                self.range_scans.remove(id);
                return Err(e);
            }
        };
        let progress = self.continue_open(vb, &scan, open, limits, emit);
        match progress {
            Ok(RangeScanProgress::Complete) => {
                drop(st);
                self.range_scans.remove(id);
            }
            Err(EngineStatus::WouldBlock) => {
                let from = open.cursor;
                open.loading = true;
                drop(st);
                self.load_values(&scan, from, limits);
            }
            _ => {}
        }
        progress
    }

    /// Emits from the cursor on until a limit or the end.
    fn continue_open(
        &self,
        vb: &VBucket,
        scan: &Scan,
        open: &mut OpenScan,
        limits: RangeScanLimits,
        emit: &mut dyn FnMut(ScanItem<'_>),
    ) -> EngineResult<RangeScanProgress> {
        let started = self.core.clock.now();
        let now_secs = u32::try_from(self.core.clock.unix_time().as_secs()).unwrap_or(u32::MAX);
        let max_items = match limits.items {
            0 => usize::MAX,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        };
        let max_bytes = match limits.bytes {
            0 => CONTINUE_MAX_BYTES,
            n => usize::try_from(n)
                .unwrap_or(usize::MAX)
                .min(CONTINUE_MAX_BYTES),
        };
        let (mut items, mut bytes) = (0usize, 0usize);
        let mut buf = DocKeyBuf::new();
        while let Some(raw) = open.keys.get(open.cursor) {
            if items >= max_items || bytes >= max_bytes {
                return Ok(RangeScanProgress::More);
            }
            if !limits.time.is_zero()
                && items > 0
                && items % CLOCK_EVERY == 0
                && self.core.clock.now().saturating_duration_since(started) >= limits.time
            {
                return Ok(RangeScanProgress::More);
            }
            let found = match scan.content {
                ScanContent::Keys => {
                    emit(ScanItem::Key(raw));
                    Found::Emitted(raw.len())
                }
                ScanContent::Documents => {
                    let key = doc_key::encode(scan.collection, raw, &mut buf);
                    let loaded = open.loaded.remove(&open.cursor);
                    emit_document(vb, key, raw, loaded, now_secs, emit)
                }
            };
            match found {
                Found::Emitted(n) => {
                    items += 1;
                    bytes += n;
                }
                Found::Skipped => {}
                // Return what there is; the next continue reads the rest from disk.
                Found::OnDisk if items > 0 => return Ok(RangeScanProgress::More),
                Found::OnDisk => return Err(EngineStatus::WouldBlock),
            }
            open.cursor += 1;
        }
        Ok(RangeScanProgress::Complete)
    }

    /// Reads from disk, on a Reader task, the documents from key `from` on that memory
    /// does not hold, into the scan; then wakes its waiters.
    fn load_values(&self, scan: &Arc<Scan>, from: usize, limits: RangeScanLimits) {
        let Some(exec) = self.core.task_executor.get() else {
            return self.finish_load(scan, Vec::new());
        };
        let task_scan = Arc::clone(scan);
        let spec = epkv_executor::TaskSpec::new("range-scan-load", epkv_executor::Group::Reader);
        let items = match limits.items {
            0 => LOAD_ITEMS,
            n => usize::try_from(n).unwrap_or(LOAD_ITEMS).min(LOAD_ITEMS),
        };
        let scheduled = schedule_weak(exec, self.self_ref.clone(), spec, move |b: &Bucket| {
            let docs = b.read_values(&task_scan, from, items);
            b.finish_load(&task_scan, docs);
            epkv_executor::Next::Done
        });
        if let Err(e) = scheduled {
            tracing::warn!(error = %e, "cannot schedule a range scan's disk read");
            self.finish_load(scan, Vec::new());
        }
    }

    /// Reads up to `items` documents (or [`LOAD_BYTES`] of values) that are not in memory,
    /// from key `from` on. No engine lock is held during a read.
    fn read_values(
        &self,
        scan: &Scan,
        from: usize,
        items: usize,
    ) -> Vec<(usize, Option<Document>)> {
        let Some(p) = &self.core.persistence else {
            return Vec::new();
        };
        let (Some(vb), Some(shard)) = (
            self.core.vbuckets.get(usize::from(scan.vbid.0)),
            p.shards.get(p.shard_of(scan.vbid)),
        ) else {
            return Vec::new();
        };
        // The keys to read, copied so that no scan lock is held during the reads.
        let wanted: Vec<(usize, Vec<u8>)> = {
            let st = scan.state.lock();
            let Phase::Open(open) = &st.phase else {
                return Vec::new();
            };
            let mut buf = DocKeyBuf::new();
            (from..open.keys.len())
                .take(items)
                .filter_map(|i| {
                    let raw = open.keys.get(i)?;
                    let key = doc_key::encode(scan.collection, raw, &mut buf);
                    let resident = vb
                        .table
                        .find_for_read(key, TrackReference::No, WantsDeleted::Yes, |sv| {
                            sv.is_resident() && !sv.is_placeholder()
                        })
                        .unwrap_or(false);
                    (!resident).then(|| (i, key.to_vec()))
                })
                .collect()
        };
        let mut out = Vec::with_capacity(wanted.len());
        let mut bytes = 0;
        for (i, key) in wanted {
            if bytes >= LOAD_BYTES {
                break;
            }
            match shard.store.get(scan.vbid, &key) {
                Ok(doc) => {
                    let doc = doc.filter(|d| !d.deleted);
                    bytes += doc.as_ref().map_or(0, |d| d.value.len());
                    out.push((i, doc));
                }
                Err(e) => {
                    tracing::warn!(vbid = %scan.vbid, error = %e, "range scan cannot read a document");
                    break;
                }
            }
        }
        out
    }

    /// Stores what a load read and wakes the scan's waiters.
    fn finish_load(&self, scan: &Scan, docs: Vec<(usize, Option<Document>)>) {
        let waiters = {
            let mut st = scan.state.lock();
            if let Phase::Open(open) = &mut st.phase {
                open.loading = false;
                open.loaded.extend(docs);
            }
            std::mem::take(&mut st.waiters)
        };
        *scan.last_used.lock() = self.core.clock.now();
        wake(waiters);
    }

    /// See [`epkv_engine_api::Engine::range_scan_cancel`].
    pub(crate) fn op_range_scan_cancel(&self, vbid: Vbid, id: RangeScanId) -> EngineResult<()> {
        let scan = self
            .range_scans
            .get(vbid, id)
            .ok_or(EngineStatus::KeyNotFound)?;
        let waiting = {
            let st = scan.state.lock();
            !st.waiters.is_empty() || matches!(&st.phase, Phase::Open(o) if o.loading)
        };
        if waiting {
            // The continue (or create) waiting for it learns it was cancelled.
            wake(scan.settle(Phase::Cancelled));
        } else {
            self.range_scans.remove(id);
        }
        Ok(())
    }

    /// See [`epkv_engine_api::Engine::when_range_scan_ready`].
    pub(crate) fn op_when_range_scan_ready(
        &self,
        vbid: Vbid,
        id: RangeScanId,
        done: FetchedCallback,
    ) {
        let Some(scan) = self.range_scans.get(vbid, id) else {
            return done(Ok(()));
        };
        let mut st = scan.state.lock();
        let waits = match &st.phase {
            Phase::WaitingSeqno(seqno) => self
                .core
                .vbuckets
                .get(usize::from(vbid.0))
                .is_some_and(|vb| vb.persisted_seqno().0 < *seqno),
            Phase::ReadingDisk => true,
            Phase::Open(open) => open.loading,
            Phase::Prepared(_) | Phase::Failed(_) | Phase::Cancelled => false,
        };
        if waits {
            st.waiters.push(done);
        } else {
            drop(st);
            done(Ok(()));
        }
    }
}

/// Emits the document under `key` as it is now: from memory, else from what a load read
/// (`loaded`), else it is on disk.
fn emit_document(
    vb: &VBucket,
    key: &[u8],
    raw: &[u8],
    loaded: Option<Option<Document>>,
    now_secs: u32,
    emit: &mut dyn FnMut(ScanItem<'_>),
) -> Found {
    let in_memory = vb
        .table
        .find_for_read(key, TrackReference::No, WantsDeleted::Yes, |sv| {
            let m = sv.meta();
            if sv.is_placeholder() {
                return Err(None);
            }
            if sv.is_deleted() || m.is_expired(now_secs) {
                return Ok(Found::Skipped);
            }
            if !sv.is_resident() {
                return Err(Some(m.by_seqno.0));
            }
            let value = sv.value();
            emit(ScanItem::Document(ScanDocument {
                key: raw,
                value,
                flags: m.flags,
                expiry: m.expiry,
                seqno: m.by_seqno.0,
                cas: m.cas.0,
                datatype: m.datatype.intersect(epkv_types::Datatype::ALL),
            }));
            Ok(Found::Emitted(raw.len() + value.len()))
        });
    // `Err(Some(seqno))`: memory has this version without its value; `Err(None)`: memory
    // does not know (full eviction).
    let memory_seqno = match in_memory {
        Some(Ok(found)) => return found,
        Some(Err(seqno)) => seqno,
        None if vb.full.is_none() => return Found::Skipped,
        None => None,
    };
    match loaded {
        Some(Some(doc)) if memory_seqno.is_none_or(|s| s == doc.seqno) => {
            if doc.expiry != 0 && doc.expiry <= now_secs {
                return Found::Skipped;
            }
            emit(ScanItem::Document(ScanDocument {
                key: raw,
                value: &doc.value,
                flags: doc.flags,
                expiry: doc.expiry,
                seqno: doc.seqno,
                cas: doc.cas,
                datatype: client_datatype(doc.datatype),
            }));
            Found::Emitted(raw.len() + doc.value.len())
        }
        Some(None) if memory_seqno.is_none() => Found::Skipped,
        _ => Found::OnDisk,
    }
}
