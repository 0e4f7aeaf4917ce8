//! RANGE_SCAN_CREATE: the checks, the wait for the seqno, the disk reads, then the key
//! snapshot.

use crate::Bucket;
use crate::bucket_core::schedule_weak;
use crate::scan_registry::{
    DiskFindings, KeyList, OpenScan, Phase, Scan, ScanState, key_list, new_id, wake,
};
use crate::vbucket::VBucket;
use epkv_engine_api::{
    EngineResult, EngineStatus, RangeScanCreate, RangeScanCreated, RangeScanId, RangeScanKind,
};
use epkv_storage::{KvStore, ScanControl};
use epkv_types::doc_key::{self, DocKeyBuf};
use epkv_types::{VBucketState, Vbid};
use parking_lot::{Mutex, RwLockReadGuard};
use std::collections::HashMap;
use std::sync::Arc;

impl Bucket {
    /// The vBucket a scan reads, with its state held: it must be active and warm, and the
    /// collection must exist.
    pub(crate) fn scan_vbucket(
        &self,
        vbid: Vbid,
        collection: u32,
    ) -> EngineResult<(&VBucket, RwLockReadGuard<'_, VBucketState>)> {
        let vb = self
            .core
            .vbuckets
            .get(usize::from(vbid.0))
            .ok_or(EngineStatus::NotMyVbucket)?;
        vb.check_warm()?;
        let state = vb.state();
        if *state != VBucketState::Active {
            return Err(EngineStatus::NotMyVbucket);
        }
        let mut buf = DocKeyBuf::new();
        self.core
            .collections
            .check_key(doc_key::encode(collection, b"", &mut buf))?;
        Ok((vb, state))
    }

    /// The seqno a scan's snapshot requirements compare with: the persisted seqno, or
    /// the high seqno of a memory-only bucket.
    fn scan_seqno(&self, vb: &VBucket) -> u64 {
        if self.core.persistence.is_some() {
            vb.persisted_seqno().0
        } else {
            vb.ordering_snapshot().0
        }
    }

    /// See [`epkv_engine_api::Engine::range_scan_create`].
    pub(crate) fn op_range_scan_create(
        &self,
        vbid: Vbid,
        req: &RangeScanCreate,
        resume: Option<RangeScanId>,
    ) -> EngineResult<RangeScanCreated> {
        self.start_scan_reaper();
        let (vb, _state) = match self.scan_vbucket(vbid, req.collection) {
            Ok(v) => v,
            Err(e) => {
                if let Some(id) = resume {
                    self.range_scans.remove(id);
                }
                return Err(e);
            }
        };
        let Some(id) = resume else {
            return self.create_new(vb, req);
        };
        let scan = self
            .range_scans
            .get(vbid, id)
            .ok_or(EngineStatus::KeyNotFound)?;
        *scan.last_used.lock() = self.core.clock.now();
        let mut st = scan.state.lock();
        match std::mem::replace(&mut st.phase, Phase::ReadingDisk) {
            Phase::WaitingSeqno(needed) => {
                st.phase = Phase::WaitingSeqno(needed);
                drop(st);
                if self.scan_seqno(vb) < needed {
                    return Ok(RangeScanCreated::Pending(id));
                }
                self.prepare(vb, req, scan)
            }
            Phase::ReadingDisk => Ok(RangeScanCreated::Pending(id)),
            Phase::Prepared(disk) => {
                drop(st);
                self.finish(vb, req, &scan, disk)
            }
            p @ Phase::Open(_) => {
                st.phase = p;
                Ok(RangeScanCreated::Ready(id))
            }
            Phase::Failed(e) => {
                drop(st);
                self.range_scans.remove(id);
                Err(e)
            }
            Phase::Cancelled => {
                drop(st);
                self.range_scans.remove(id);
                Err(EngineStatus::KeyNotFound)
            }
        }
    }

    /// A create's first run: checks the snapshot requirements, waits for the seqno if it
    /// must, then prepares the scan.
    fn create_new(&self, vb: &VBucket, req: &RangeScanCreate) -> EngineResult<RangeScanCreated> {
        let cfg = &self.core.config;
        let scan = Arc::new(Scan {
            id: new_id(),
            vbid: vb.id,
            owner: req.owner,
            collection: req.collection,
            content: req.content,
            charged: Mutex::new(0),
            last_used: Mutex::new(self.core.clock.now()),
            state: Mutex::new(ScanState {
                phase: Phase::ReadingDisk,
                waiters: Vec::new(),
            }),
        });
        if let Some(s) = req.snapshot {
            if vb.uuid() != s.vb_uuid {
                return Err(EngineStatus::VbUuidNotEqual);
            }
            if self.scan_seqno(vb) < s.seqno {
                let Some(timeout) = s.timeout.filter(|_| self.core.persistence.is_some()) else {
                    return Err(EngineStatus::TempFail);
                };
                scan.state.lock().phase = Phase::WaitingSeqno(s.seqno);
                self.range_scans
                    .add(Arc::clone(&scan), cfg.range_scan_max_per_owner)?;
                self.wait_for_seqno(&scan, s.seqno, timeout);
                return Ok(RangeScanCreated::Pending(scan.id));
            }
        }
        self.range_scans
            .add(Arc::clone(&scan), cfg.range_scan_max_per_owner)?;
        self.prepare(vb, req, scan)
    }

    /// Registers the seqno wait of a pending create and the task ending it at `timeout`.
    fn wait_for_seqno(&self, scan: &Arc<Scan>, seqno: u64, timeout: std::time::Duration) {
        let reached = Arc::downgrade(scan);
        let persisted = self.when_persisted(scan.vbid, seqno, move |_| {
            if let Some(s) = reached.upgrade() {
                let waiters = {
                    let mut st = s.state.lock();
                    std::mem::take(&mut st.waiters)
                };
                wake(waiters);
            }
        });
        if persisted.is_err() {
            wake(scan.settle(Phase::Failed(EngineStatus::TempFail)));
            return;
        }
        let Some(exec) = self.core.task_executor.get() else {
            return;
        };
        let expired = Arc::downgrade(scan);
        let spec =
            epkv_executor::TaskSpec::new("range-scan-seqno-timeout", epkv_executor::Group::NonIo)
                .start(epkv_executor::Start::After(timeout));
        let task = schedule_weak(exec, self.self_ref.clone(), spec, move |b: &Bucket| {
            let Some(s) = expired.upgrade() else {
                return epkv_executor::Next::Done;
            };
            let waiting = matches!(s.state.lock().phase, Phase::WaitingSeqno(_));
            let vb_seqno = b
                .core
                .vbuckets
                .get(usize::from(s.vbid.0))
                .map_or(0, |vb| b.scan_seqno(vb));
            if waiting && vb_seqno < seqno {
                wake(s.settle(Phase::Failed(EngineStatus::TempFail)));
            }
            epkv_executor::Next::Done
        });
        if let Err(e) = task {
            tracing::warn!(error = %e, "cannot schedule a range scan's seqno timeout");
        }
    }

    /// Reads what the create needs from disk on a Reader task (answering Pending), or
    /// finishes at once when it needs nothing from disk.
    fn prepare(
        &self,
        vb: &VBucket,
        req: &RangeScanCreate,
        scan: Arc<Scan>,
    ) -> EngineResult<RangeScanCreated> {
        let full = vb.full.is_some();
        let seqno_exists = req.snapshot.filter(|s| s.seqno_exists).map(|s| s.seqno);
        let disk = self.core.persistence.is_some() && (full || seqno_exists.is_some());
        if !disk {
            return self.finish(vb, req, &scan, DiskFindings::default());
        }
        let Some(exec) = self.core.task_executor.get() else {
            self.range_scans.remove(scan.id);
            return Err(EngineStatus::TempFail);
        };
        scan.state.lock().phase = Phase::ReadingDisk;
        let id = scan.id;
        let task_scan = Arc::clone(&scan);
        let spec = epkv_executor::TaskSpec::new("range-scan-create", epkv_executor::Group::Reader);
        let scheduled = schedule_weak(exec, self.self_ref.clone(), spec, move |b: &Bucket| {
            let phase = match b.read_scan_disk(&task_scan, full, seqno_exists) {
                Ok(found) => Phase::Prepared(found),
                Err(e) => Phase::Failed(e),
            };
            wake(task_scan.settle(phase));
            epkv_executor::Next::Done
        });
        if let Err(e) = scheduled {
            tracing::warn!(error = %e, "cannot schedule a range scan's disk read");
            self.range_scans.remove(id);
            return Err(EngineStatus::TempFail);
        }
        Ok(RangeScanCreated::Pending(id))
    }

    /// The disk reads of a create (on a Reader thread, no engine lock held).
    fn read_scan_disk(
        &self,
        scan: &Scan,
        full: bool,
        seqno_exists: Option<u64>,
    ) -> EngineResult<DiskFindings> {
        let p = self
            .core
            .persistence
            .as_ref()
            .ok_or(EngineStatus::Internal)?;
        let store = &p
            .shards
            .get(p.shard_of(scan.vbid))
            .ok_or(EngineStatus::Internal)?
            .store;
        let mut found = DiskFindings::default();
        let failed = |e: epkv_storage::Error| {
            tracing::warn!(vbid = %scan.vbid, error = %e, "range scan cannot read the disk");
            EngineStatus::Internal
        };
        if full {
            store
                .scan_keys(scan.vbid, &mut |km| {
                    let (cid, raw) = doc_key::decode(&km.key);
                    if cid == scan.collection && !km.deleted {
                        found.keys.push(raw.to_vec());
                    }
                    ScanControl::Continue
                })
                .map_err(failed)?;
        }
        if let Some(seqno) = seqno_exists {
            store
                .scan_by_seqno(scan.vbid, seqno, seqno, &mut |doc| {
                    if doc.seqno == seqno {
                        found.seqno_key = Some(doc.key);
                    }
                    ScanControl::Stop
                })
                .map_err(failed)?;
        }
        Ok(found)
    }

    /// Takes the snapshot of keys and opens the scan.
    fn finish(
        &self,
        vb: &VBucket,
        req: &RangeScanCreate,
        scan: &Arc<Scan>,
        disk: DiskFindings,
    ) -> EngineResult<RangeScanCreated> {
        let result = self.snapshot_keys(vb, req, disk).and_then(|keys| {
            let cfg = &self.core.config;
            let bytes = keys.footprint();
            if bytes > cfg.range_scan_max_key_bytes {
                return Err(EngineStatus::TooBusy);
            }
            self.range_scans
                .charge(scan, bytes, cfg.range_scan_max_owner_key_bytes)?;
            Ok(keys)
        });
        match result {
            Ok(keys) => {
                let waiters = scan.settle(Phase::Open(OpenScan {
                    keys,
                    cursor: 0,
                    loaded: HashMap::new(),
                    loading: false,
                }));
                wake(waiters);
                Ok(RangeScanCreated::Ready(scan.id))
            }
            Err(e) => {
                self.range_scans.remove(scan.id);
                Err(e)
            }
        }
    }

    /// The keys of the scan: the collection's live keys in memory (and, under full
    /// eviction, those only on disk), in the range or sampled.
    fn snapshot_keys(
        &self,
        vb: &VBucket,
        req: &RangeScanCreate,
        disk: DiskFindings,
    ) -> EngineResult<KeyList> {
        let now = u32::try_from(self.core.clock.unix_time().as_secs()).unwrap_or(u32::MAX);
        let seqno = req.snapshot.filter(|s| s.seqno_exists).map(|s| s.seqno);
        let mut seqno_in_memory = false;
        let mut keys = Vec::new();
        // Keys memory knows, live or not: memory has their newest version.
        let mut known = std::collections::HashSet::new();
        let full = vb.full.is_some();
        let wanted = |raw: &[u8]| match &req.kind {
            RangeScanKind::Range { start, end } => key_list::in_range(raw, start, end),
            RangeScanKind::Sampling { .. } => true,
        };
        vb.table.for_each(|sv| {
            if sv.is_placeholder() {
                return;
            }
            if seqno == Some(sv.meta().by_seqno.0) {
                seqno_in_memory = true;
            }
            let (cid, raw) = doc_key::decode(sv.key());
            if cid != req.collection {
                return;
            }
            if full {
                known.insert(raw.to_vec());
            }
            if sv.is_deleted() || sv.meta().is_expired(now) || !wanted(raw) {
                return;
            }
            keys.push(raw.to_vec());
        });
        for k in disk.keys {
            if !known.contains(&k) && wanted(&k) {
                keys.push(k);
            }
        }
        if let Some(s) = seqno
            && !seqno_in_memory
        {
            // On disk, and not replaced since in memory.
            let on_disk = disk.seqno_key.is_some_and(|k| {
                vb.table
                    .find_for_write(&k, |sv| sv.meta().by_seqno.0 == s)
                    .unwrap_or(true)
            });
            if !on_disk {
                return Err(EngineStatus::NotStored);
            }
        }
        if let RangeScanKind::Sampling { samples, seed } = req.kind {
            keys.sort_unstable();
            keys.dedup();
            keys = key_list::sample(keys, samples, seed);
        }
        let list = KeyList::from_unsorted(keys);
        if list.is_empty() {
            return Err(EngineStatus::KeyNotFound);
        }
        Ok(list)
    }

    /// Schedules the task closing idle scans, once.
    fn start_scan_reaper(&self) {
        if self.range_scans.reaper.get().is_some() {
            return;
        }
        let Some(exec) = self.core.task_executor.get() else {
            return;
        };
        let idle = self.core.config.range_scan_idle_timeout;
        let every = (idle / 4).clamp(
            std::time::Duration::from_millis(10),
            std::time::Duration::from_secs(10),
        );
        let spec = epkv_executor::TaskSpec::new("range-scan-reaper", epkv_executor::Group::NonIo)
            .start(epkv_executor::Start::After(every));
        match schedule_weak(exec, self.self_ref.clone(), spec, move |b: &Bucket| {
            let n = b.range_scans.reap(b.core.clock.now(), idle);
            if n > 0 {
                tracing::debug!(bucket = %b.core.config.name, scans = n, "idle range scans closed");
            }
            epkv_executor::Next::After(every)
        }) {
            Ok(handle) => {
                // A concurrent create may have started one too; the second is cancelled.
                if let Err(extra) = self.range_scans.reaper.set(handle) {
                    extra.cancel();
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot schedule the range scan reaper"),
        }
    }
}
