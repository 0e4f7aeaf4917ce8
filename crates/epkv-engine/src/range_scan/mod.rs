//! Range scans (KV-Engine's `range_scans/`): RANGE_SCAN_CREATE fixes the keys a scan
//! returns, RANGE_SCAN_CONTINUE returns them (or their documents) a batch at a time,
//! RANGE_SCAN_CANCEL closes a scan, and a scan left idle expires.
//!
//! **The snapshot is of keys.** KV-Engine opens a snapshot of the vBucket's disk index;
//! epkv's index lives in memory, so a create copies the keys of the collection in the
//! range (or the sample) into a [`KeyList`]: sorted, packed, four bytes of overhead per
//! key. Keys written after the create are not returned, however the scan goes on. Under
//! full eviction the keys on disk only are read on a Reader task first (the create
//! answers `Pending` until then). A keys-only scan returns exactly the snapshot. A
//! documents scan reads each document when it returns it: the version current then (not
//! the one of the create: the difference from KV-Engine, whose disk snapshot keeps old
//! versions), and a document deleted or expired since the create is skipped.
//!
//! **Evicted values are read from disk without being made resident.** A continue that
//! meets a document whose value is not in memory (or, under full eviction, a key not in
//! memory) answers WouldBlock, and a Reader task reads the next documents the scan
//! needs (at most [`LOAD_ITEMS`] documents or [`LOAD_BYTES`] of values) into the scan
//! itself; the continue, run again, returns them from there. The hash table is not
//! touched, so a scan does not push the working set out of memory.
//!
//! **Limits** (the engine refuses beyond them with TooBusy, 0x85 Ebusy):
//! [`BucketConfig::range_scan_max_key_bytes`](crate::BucketConfig) per scan, and
//! `range_scan_max_per_owner` scans and `range_scan_max_owner_key_bytes` of keys per
//! owner (a connection; its scans close with it). One continue returns at most
//! [`CONTINUE_MAX_BYTES`] whatever the client's limits. A scan not used for
//! `range_scan_idle_timeout` (60 s by default) is closed by the reaper task; a continue
//! then answers KeyNotFound, as for any unknown scan.
//!
//! **Locking.** The registry's map and the owners' usage are leaf mutexes. A scan's state
//! mutex is taken with neither held, and held by a continue for its whole run (a second
//! continue of the same scan meanwhile answers TooBusy), across the vBucket's state lock
//! and one stripe lock at a time, as an operation takes them. A scan's last use is a leaf
//! mutex of its own, so the reaper reads it with the registry held and no scan state.
//! Callbacks run with no lock held.
//!
//! Level: an operation on the [`crate::Bucket`] (level 7); [`key_list`] is its leaf.

mod continue_scan;
mod create;
mod key_list;

pub(crate) use key_list::KeyList;

use epkv_engine_api::{EngineStatus, FetchedCallback, RangeScanId, ScanContent};
use epkv_storage::Document;
use epkv_types::Vbid;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most bytes of keys and values one continue returns, whatever the client's limits:
/// what a continue holds in the connection's output at once.
pub const CONTINUE_MAX_BYTES: usize = 1024 * 1024;
/// Most documents a Reader task reads from disk for one continue.
pub const LOAD_ITEMS: usize = 256;
/// Bytes of values after which a Reader task stops reading for one continue.
pub const LOAD_BYTES: usize = 4 * 1024 * 1024;

/// Where a scan is in its life.
#[derive(Debug)]
pub(crate) enum Phase {
    /// The create waits for this seqno to be persisted.
    WaitingSeqno(u64),
    /// The create's disk reads (full eviction's keys, `seqno_exists`) are running.
    ReadingDisk,
    /// The create's disk reads are done; the create, run again, finishes.
    Prepared(DiskFindings),
    /// The create failed while it waited (the seqno's timeout passed, a disk read
    /// failed): the create, run again, answers this and the scan goes.
    Failed(EngineStatus),
    /// The scan is open.
    Open(OpenScan),
    /// The scan was cancelled while a continue waited: that continue answers
    /// RangeScanCancelled.
    Cancelled,
}

/// What a create read from disk.
#[derive(Debug, Default)]
pub(crate) struct DiskFindings {
    /// Under full eviction: the live keys of the collection on disk (raw).
    pub(crate) keys: Vec<Vec<u8>>,
    /// With `seqno_exists`: the engine key whose newest version on disk has the seqno.
    pub(crate) seqno_key: Option<Vec<u8>>,
}

/// An open scan: its keys and how far it got.
#[derive(Debug)]
pub(crate) struct OpenScan {
    /// The keys, fixed at the create.
    pub(crate) keys: KeyList,
    /// The next key to return.
    pub(crate) cursor: usize,
    /// Documents a Reader task read from disk, by key index (`None`: no live version on
    /// disk). Emptied as they are returned.
    pub(crate) loaded: HashMap<usize, Option<Document>>,
    /// A Reader task is filling `loaded`.
    pub(crate) loading: bool,
}

/// What a scan's state mutex protects.
pub(crate) struct ScanState {
    pub(crate) phase: Phase,
    /// Called once the scan's wait is over ([`Phase::WaitingSeqno`],
    /// [`Phase::ReadingDisk`], a load of values).
    pub(crate) waiters: Vec<FetchedCallback>,
}

/// One scan.
#[derive(Debug)]
pub(crate) struct Scan {
    pub(crate) id: RangeScanId,
    pub(crate) vbid: Vbid,
    pub(crate) owner: u64,
    pub(crate) collection: u32,
    pub(crate) content: ScanContent,
    /// Key bytes charged to the owner (set once the scan opens).
    pub(crate) charged: Mutex<usize>,
    /// The last create or continue (a leaf lock; see the module docs).
    pub(crate) last_used: Mutex<Instant>,
    pub(crate) state: Mutex<ScanState>,
}

impl std::fmt::Debug for ScanState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScanState")
            .field("phase", &self.phase)
            .field("waiters", &self.waiters.len())
            .finish()
    }
}

impl Scan {
    /// Moves to `phase` and takes the waiters to call (after the lock is released).
    pub(crate) fn settle(&self, phase: Phase) -> Vec<FetchedCallback> {
        let mut st = self.state.lock();
        st.phase = phase;
        std::mem::take(&mut st.waiters)
    }
}

/// Calls waiters (with no lock held).
pub(crate) fn wake(waiters: Vec<FetchedCallback>) {
    for w in waiters {
        w(Ok(()));
    }
}

/// One owner's scans.
#[derive(Debug, Default, Clone, Copy)]
struct OwnerUse {
    scans: usize,
    key_bytes: usize,
}

/// Every scan of a bucket, by id, and what each owner holds.
#[derive(Debug, Default)]
pub(crate) struct RangeScans {
    scans: Mutex<HashMap<RangeScanId, Arc<Scan>>>,
    owners: Mutex<HashMap<u64, OwnerUse>>,
    /// The reaper task, once the first scan started it.
    pub(crate) reaper: std::sync::OnceLock<epkv_executor::TaskHandle>,
}

impl RangeScans {
    /// Registers a new scan of `owner` unless it has `max_scans` already.
    ///
    /// # Errors
    /// `TooBusy` at the owner's limit.
    pub(crate) fn add(&self, scan: Arc<Scan>, max_scans: usize) -> Result<(), EngineStatus> {
        {
            let mut owners = self.owners.lock();
            let u = owners.entry(scan.owner).or_default();
            if u.scans >= max_scans {
                return Err(EngineStatus::TooBusy);
            }
            u.scans += 1;
        }
        self.scans.lock().insert(scan.id, scan);
        Ok(())
    }

    /// The scan `id` of `vbid`.
    pub(crate) fn get(&self, vbid: Vbid, id: RangeScanId) -> Option<Arc<Scan>> {
        self.scans
            .lock()
            .get(&id)
            .filter(|s| s.vbid == vbid)
            .cloned()
    }

    /// Charges `bytes` of keys to the scan's owner unless that passes `max_bytes`.
    ///
    /// # Errors
    /// `TooBusy` past the limit.
    pub(crate) fn charge(
        &self,
        scan: &Scan,
        bytes: usize,
        max_bytes: usize,
    ) -> Result<(), EngineStatus> {
        let mut owners = self.owners.lock();
        let u = owners.entry(scan.owner).or_default();
        if u.key_bytes.saturating_add(bytes) > max_bytes {
            return Err(EngineStatus::TooBusy);
        }
        u.key_bytes += bytes;
        *scan.charged.lock() = bytes;
        Ok(())
    }

    /// Closes scan `id`: forgets it and gives its owner's allowance back. Returns it if it
    /// was there.
    pub(crate) fn remove(&self, id: RangeScanId) -> Option<Arc<Scan>> {
        let scan = self.scans.lock().remove(&id)?;
        self.uncharge(&scan);
        Some(scan)
    }

    fn uncharge(&self, scan: &Scan) {
        let bytes = std::mem::take(&mut *scan.charged.lock());
        let mut owners = self.owners.lock();
        if let Some(u) = owners.get_mut(&scan.owner) {
            u.scans = u.scans.saturating_sub(1);
            u.key_bytes = u.key_bytes.saturating_sub(bytes);
            if u.scans == 0 {
                owners.remove(&scan.owner);
            }
        }
    }

    /// Closes the scans not used since `idle` before `now`; returns how many. Their
    /// waiters (none, normally: a wait is short) are woken to find the scan gone.
    pub(crate) fn reap(&self, now: Instant, idle: Duration) -> usize {
        let gone: Vec<Arc<Scan>> = {
            let mut scans = self.scans.lock();
            let expired: Vec<RangeScanId> = scans
                .values()
                .filter(|s| now.saturating_duration_since(*s.last_used.lock()) >= idle)
                .map(|s| s.id)
                .collect();
            expired.iter().filter_map(|id| scans.remove(id)).collect()
        };
        for s in &gone {
            self.uncharge(s);
            wake(s.settle(Phase::Failed(EngineStatus::KeyNotFound)));
        }
        gone.len()
    }

    /// Closes every scan of `owner`.
    pub(crate) fn release(&self, owner: u64) {
        let gone: Vec<Arc<Scan>> = {
            let mut scans = self.scans.lock();
            let ids: Vec<RangeScanId> = scans
                .values()
                .filter(|s| s.owner == owner)
                .map(|s| s.id)
                .collect();
            ids.iter().filter_map(|id| scans.remove(id)).collect()
        };
        for s in &gone {
            self.uncharge(s);
            wake(s.settle(Phase::Cancelled));
        }
    }

    /// Closes every scan of `vbid` (its state changed, or it was reset).
    pub(crate) fn close_vbucket(&self, vbid: Vbid) {
        let gone: Vec<Arc<Scan>> = {
            let mut scans = self.scans.lock();
            let ids: Vec<RangeScanId> = scans
                .values()
                .filter(|s| s.vbid == vbid)
                .map(|s| s.id)
                .collect();
            ids.iter().filter_map(|id| scans.remove(id)).collect()
        };
        for s in &gone {
            self.uncharge(s);
            wake(s.settle(Phase::Cancelled));
        }
    }

    /// The number of open scans.
    pub(crate) fn len(&self) -> usize {
        self.scans.lock().len()
    }

    /// The key bytes held by scans.
    pub(crate) fn key_bytes(&self) -> usize {
        self.owners.lock().values().map(|u| u.key_bytes).sum()
    }
}

/// A new scan id: 16 random bytes with the version 4 UUID bits.
pub(crate) fn new_id() -> RangeScanId {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    RangeScanId(b)
}
