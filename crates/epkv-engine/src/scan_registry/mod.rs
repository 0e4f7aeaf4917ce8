//! The registry of a bucket's range scans (see [`crate::range_scan`] for what a scan
//! is): each scan's state, its owner's allowance, the idle reaper's sweep, and
//! [`KeyList`], the packed keys a scan holds. A leaf: it knows vBucket ids and stored
//! documents, not the bucket.
//!
//! **Locking.** The map of scans and the owners' usage are leaf mutexes. A scan's state
//! mutex is taken with neither held. A scan's last use is a leaf mutex of its own, so
//! [`RangeScans::reap`] reads it with the map held and no scan state. Waiters are called
//! with no lock held.

pub(crate) mod key_list;

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
        self.cancel_where(|s| s.owner == owner);
    }

    /// Closes every scan of `vbid` (its state changed, or it was reset).
    pub(crate) fn close_vbucket(&self, vbid: Vbid) {
        self.cancel_where(|s| s.vbid == vbid);
    }

    /// Removes the scans `which` picks and settles them cancelled.
    fn cancel_where(&self, which: impl Fn(&Scan) -> bool) {
        let gone: Vec<Arc<Scan>> = {
            let mut scans = self.scans.lock();
            let ids: Vec<RangeScanId> = scans.values().filter(|s| which(s)).map(|s| s.id).collect();
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
