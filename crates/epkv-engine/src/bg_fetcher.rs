//! Background fetches: reading evicted values back from disk on the Reader group, as
//! KV-Engine's `BgFetcher` / `MultiBGFetcherTask` do.
//!
//! An operation that finds the value it needs evicted queues the key on its shard's
//! [`BgFetchQueue`] (coalesced: one fetch per key however many operations wait for it) and
//! answers [`EngineStatus::WouldBlock`]; the caller registers a callback with
//! [`epkv_engine_api::Engine::when_fetched`] and runs the operation again once called. The
//! shard's fetcher task takes every queued key, reads them vBucket by vBucket (no lock of
//! the engine held during the read), then restores each value under the key's stripe lock
//! **only if the item is still the non-resident version that was read**: a write that
//! raced the fetch wins, and the waiting operation, run again, sees the write.

use crate::bucket::Bucket;
use crate::stats::Counter;
use crate::vbucket::VBucket;
use epkv_engine_api::{EngineResult, EngineStatus, FetchedCallback};
use epkv_hashtable::{ItemMeta, StoredValue};
use epkv_types::Vbid;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::collections::hash_map::Entry as MapEntry;
use std::time::{Duration, Instant};

/// One key's fetch: when it was queued, whether the fetcher has taken it, and who waits.
struct Pending {
    queued_at: Instant,
    in_flight: bool,
    /// Whether a waiter needs the value, not only the metadata (full eviction's
    /// metadata fetches restore a non-resident item).
    value: bool,
    /// Times the value was read but did not fit in memory (the item pager was woken to
    /// make room, and the fetch is retried).
    no_room: u32,
    waiters: Vec<FetchedCallback>,
}

/// Reads of one key that may find memory full before its waiters are told TMPFAIL: each
/// retry comes [`NO_ROOM_RETRY_AFTER`] later, after the item pager (woken by the refusal)
/// has had its turn, so about 100 ms in all.
const MAX_NO_ROOM_RETRIES: u32 = 50;

/// Pause before a fetch whose value did not fit is retried.
const NO_ROOM_RETRY_AFTER: Duration = Duration::from_millis(2);

/// A shard's fetches by vBucket and key, with how many of them wait for the fetcher.
#[derive(Default)]
struct Fetches {
    by_key: HashMap<(Vbid, Box<[u8]>), Pending>,
    /// Entries of `by_key` that are not in flight (so `queue` and `is_idle` need not
    /// scan the map).
    queued: usize,
}

/// A shard's queued and in-flight background fetches, by vBucket and key. Its mutex is a
/// leaf: callbacks run after it is released.
#[derive(Default)]
pub(crate) struct BgFetchQueue {
    pending: Mutex<Fetches>,
}

impl std::fmt::Debug for BgFetchQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BgFetchQueue")
            .field("pending", &self.pending.lock().by_key.len())
            .finish()
    }
}

impl BgFetchQueue {
    /// Queues a fetch of `key` unless one is queued or in flight; returns true when the
    /// fetcher must be woken (nothing else was queued).
    /// `value`: the operation needs the value, not only the metadata.
    pub(crate) fn queue(&self, vbid: Vbid, key: &[u8], now: Instant, value: bool) -> bool {
        let mut q = self.pending.lock();
        let idle = q.queued == 0;
        match q.by_key.entry((vbid, key.into())) {
            MapEntry::Occupied(mut o) => {
                // A metadata fetch in flight restores no value: the operation that wants
                // it runs again after and queues a value fetch then.
                o.get_mut().value |= value;
                false
            }
            MapEntry::Vacant(v) => {
                v.insert(Pending {
                    queued_at: now,
                    in_flight: false,
                    value,
                    no_room: 0,
                    waiters: Vec::new(),
                });
                q.queued += 1;
                idle
            }
        }
    }

    /// Runs `done` once the fetch of `key` is over, or at once (with `Ok`) if none is
    /// queued or in flight.
    pub(crate) fn when_fetched(&self, vbid: Vbid, key: &[u8], done: FetchedCallback) {
        let mut q = self.pending.lock();
        // A borrowed lookup of a (Vbid, Box<[u8]>) key needs the owned form.
        if let Some(p) = q.by_key.get_mut(&(vbid, key.into())) {
            p.waiters.push(done);
            return;
        }
        drop(q);
        done(Ok(()));
    }

    /// Marks every queued fetch in flight and returns them (vbid, key, time queued,
    /// whether the value is wanted), sorted by vBucket so that each vBucket's keys are
    /// read together.
    fn take(&self) -> Vec<(Vbid, Box<[u8]>, Instant, bool)> {
        let mut q = self.pending.lock();
        q.queued = 0;
        let mut batch: Vec<_> = q
            .by_key
            .iter_mut()
            .filter(|(_, p)| !p.in_flight)
            .map(|((vbid, key), p)| {
                p.in_flight = true;
                (*vbid, key.clone(), p.queued_at, p.value)
            })
            .collect();
        drop(q);
        batch.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        batch
    }

    /// Ends the fetch of `key`: removes it and calls its waiters with `outcome`.
    fn complete(&self, vbid: Vbid, key: Box<[u8]>, outcome: EngineResult<()>) {
        let waiters = self
            .pending
            .lock()
            .by_key
            .remove(&(vbid, key))
            .map(|p| p.waiters)
            .unwrap_or_default();
        for w in waiters {
            w(outcome);
        }
    }

    /// Puts a fetch whose value did not fit back in the queue, unless it has been
    /// retried [`MAX_NO_ROOM_RETRIES`] times; returns false (and leaves it in flight) then.
    fn retry_later(&self, vbid: Vbid, key: &[u8]) -> bool {
        let mut q = self.pending.lock();
        match q.by_key.get_mut(&(vbid, key.into())) {
            Some(p) if p.no_room < MAX_NO_ROOM_RETRIES => {
                p.no_room += 1;
                p.in_flight = false;
                q.queued += 1;
                true
            }
            _ => false,
        }
    }

    /// True when nothing is queued that the fetcher has not taken.
    fn is_idle(&self) -> bool {
        self.pending.lock().queued == 0
    }

    /// Fails every queued and in-flight fetch (shutdown): the waiters get `status`.
    pub(crate) fn fail_all(&self, status: EngineStatus) {
        let all: Vec<_> = {
            let mut q = self.pending.lock();
            q.queued = 0;
            q.by_key.drain().collect()
        };
        for (_, p) in all {
            for w in p.waiters {
                w(Err(status));
            }
        }
    }
}

/// Wait and read times of background fetches (KV-Engine's `ep_bg_wait` and `ep_bg_load`),
/// in microseconds.
#[derive(Debug)]
pub(crate) struct BgFetchTimes {
    /// From queueing to the start of the read. `None` only if the histogram could not
    /// be built (its bounds are constants, so never).
    pub(crate) wait: Mutex<Option<hdrhistogram::Histogram<u64>>>,
    /// The read itself, restore included.
    pub(crate) load: Mutex<Option<hdrhistogram::Histogram<u64>>>,
}

impl BgFetchTimes {
    /// `f` of the wait histogram, as a stat value ("0" when nothing was recorded).
    pub(crate) fn wait_summary(&self, f: impl Fn(&hdrhistogram::Histogram<u64>) -> u64) -> String {
        summary(&self.wait, f)
    }

    /// `f` of the load histogram, as a stat value ("0" when nothing was recorded).
    pub(crate) fn load_summary(&self, f: impl Fn(&hdrhistogram::Histogram<u64>) -> u64) -> String {
        summary(&self.load, f)
    }
}

fn summary(
    h: &Mutex<Option<hdrhistogram::Histogram<u64>>>,
    f: impl Fn(&hdrhistogram::Histogram<u64>) -> u64,
) -> String {
    match h.lock().as_ref() {
        Some(h) if !h.is_empty() => f(h).to_string(),
        _ => "0".to_owned(),
    }
}

fn micros_histogram() -> Option<hdrhistogram::Histogram<u64>> {
    // 1 us .. 1 hour at 2 significant digits; longer values saturate.
    hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 2).ok()
}

/// Records `d` in microseconds, saturating at the histogram's top.
fn record(h: &Mutex<Option<hdrhistogram::Histogram<u64>>>, d: Duration) {
    if let Some(h) = h.lock().as_mut() {
        h.saturating_record(micros(d));
    }
}

impl Default for BgFetchTimes {
    fn default() -> Self {
        Self {
            wait: Mutex::new(micros_histogram()),
            load: Mutex::new(micros_histogram()),
        }
    }
}

/// Why a fetch did not restore its value.
enum FetchError {
    /// The value did not fit under the quota (the item pager was woken).
    NoRoom,
    /// Any other outcome, told to the waiters as it is.
    Failed(EngineStatus),
}
use FetchError::{Failed, NoRoom};

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

impl Bucket {
    /// Queues a background fetch of the entry's key in `vb` and answers WouldBlock: the
    /// caller waits with [`epkv_engine_api::Engine::when_fetched`] and runs the operation
    /// again. Internal for a bucket that cannot fetch (memory-only: nothing is ever
    /// evicted there).
    /// `value`: whether the operation needs the value or only the metadata.
    pub(crate) fn queue_bg_fetch(&self, vb: &VBucket, key: &[u8], value: bool) -> EngineStatus {
        let Some(p) = &self.persistence else {
            tracing::error!(vbid = %vb.id, "a memory-only bucket has a non-resident item");
            return EngineStatus::Internal;
        };
        let shard = p.shard_of(vb.id);
        let Some(q) = p.fetch_queues.get(shard) else {
            return EngineStatus::Internal;
        };
        if q.queue(vb.id, key, self.clock.now(), value) {
            p.wake_fetcher(shard);
        }
        EngineStatus::WouldBlock
    }

    /// Registers `done` for the end of the background fetch of `key` in `vbid` (at once
    /// when none is in flight).
    pub(crate) fn bg_fetch_when_done(&self, vbid: Vbid, key: &[u8], done: FetchedCallback) {
        let Some(p) = &self.persistence else {
            done(Ok(()));
            return;
        };
        match p.fetch_queues.get(p.shard_of(vbid)) {
            Some(q) => q.when_fetched(vbid, key, done),
            None => done(Ok(())),
        }
    }

    /// Blocks the calling thread until the background fetch of `key` in `vbid` is over
    /// (at once if none is in flight), at most `timeout`: for callers outside the front
    /// end (tests, tools) that got WouldBlock and want to run the operation again.
    ///
    /// # Errors
    /// The fetch's error (TempFail, Internal), or TempFail if `timeout` passed first.
    pub fn wait_fetched(&self, vbid: Vbid, key: &[u8], timeout: Duration) -> EngineResult<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.bg_fetch_when_done(
            vbid,
            key,
            Box::new(move |outcome| {
                let _ = tx.send(outcome);
            }),
        );
        rx.recv_timeout(timeout)
            .unwrap_or(Err(EngineStatus::TempFail))
    }

    /// Runs a shard's queued background fetches now (the fetcher task's run; tests with
    /// a manual executor call it through the task). Returns how many keys it read and how
    /// many of those it queued again because their values did not fit in memory.
    pub fn run_bg_fetches(&self, shard: usize) -> (usize, usize) {
        let Some(p) = &self.persistence else {
            return (0, 0);
        };
        let Some(q) = p.fetch_queues.get(shard) else {
            return (0, 0);
        };
        let batch = q.take();
        let n = batch.len();
        let mut retried = 0;
        for (vbid, key, queued_at, value) in batch {
            let start = self.clock.now();
            let vb = self.vbuckets.get(usize::from(vbid.0));
            let outcome = match vb {
                Some(vb) => self.fetch_and_restore(vb, &key, value),
                None => Err(Failed(EngineStatus::NotMyVbucket)),
            };
            let end = self.clock.now();
            record(
                &self.bg_times.wait,
                start.saturating_duration_since(queued_at),
            );
            record(&self.bg_times.load, end.saturating_duration_since(start));
            match outcome {
                // Memory is full until the pager (woken by the refusal) ejects something:
                // try again shortly rather than fail the reader.
                Err(NoRoom) if q.retry_later(vbid, &key) => retried += 1,
                Ok(()) => q.complete(vbid, key, Ok(())),
                Err(err) => {
                    // A placeholder left behind would only make the next operation queue
                    // the same fetch again; remove it so that memory holds nothing stale.
                    if let Some(vb) = vb {
                        vb.table.with_entry(&key, |e| {
                            if e.committed().is_some_and(StoredValue::is_placeholder) {
                                e.remove();
                            }
                        });
                    }
                    let status = match err {
                        NoRoom => EngineStatus::TempFail,
                        Failed(status) => status,
                    };
                    q.complete(vbid, key, Err(status));
                }
            }
        }
        (n, retried)
    }

    /// One run of a shard's fetcher task.
    pub(crate) fn bg_fetcher_run(&self, shard: usize) -> epkv_executor::Next {
        let (_, retried) = self.run_bg_fetches(shard);
        let idle = self
            .persistence
            .as_ref()
            .and_then(|p| p.fetch_queues.get(shard))
            .is_none_or(BgFetchQueue::is_idle);
        if idle {
            epkv_executor::Next::Sleep
        } else if retried > 0 {
            // Values that did not fit are queued again: give the woken pager time. (Keys
            // queued meanwhile wait as long, at most 2 ms.)
            epkv_executor::Next::After(NO_ROOM_RETRY_AFTER)
        } else {
            epkv_executor::Next::After(Duration::ZERO)
        }
    }

    /// Reads `key`'s newest version from disk (no engine lock held), then, under the key's
    /// stripe lock, puts its value back if the item in memory is still that version and
    /// still non-resident. Anything else means the item changed while the read ran; the
    /// operation waiting runs again and sees the change.
    fn fetch_and_restore(&self, vb: &VBucket, key: &[u8], value: bool) -> Result<(), FetchError> {
        let Some(shard) = self
            .persistence
            .as_ref()
            .and_then(|p| p.shards.get(p.shard_of(vb.id)))
        else {
            return Err(Failed(EngineStatus::Internal));
        };
        // Full eviction: the placeholder the read is for. Restoring over another one (the
        // key was written, persisted and evicted again while the read ran, and a new
        // lookup began) would put back what the read found before that write.
        let placeholder = vb.table.with_entry(key, |e| {
            e.committed()
                .filter(|sv| sv.is_placeholder())
                .map(|sv| sv.meta().cas)
        });
        let doc = match epkv_storage::KvStore::get(&shard.store, vb.id, key) {
            Ok(d) => d,
            Err(err) if err.is_temporary() => return Err(Failed(EngineStatus::TempFail)),
            Err(err) => {
                tracing::error!(vbid = %vb.id, error = %err, "background fetch: cannot read a non-resident value from disk");
                return Err(Failed(EngineStatus::Internal));
            }
        };
        vb.table.with_entry(key, |e| {
            let meta = match e.committed() {
                Some(sv) if sv.is_placeholder() => {
                    return if placeholder == Some(sv.meta().cas) {
                        self.restore_looked_up(vb, e, doc, value)
                    } else {
                        Ok(())
                    };
                }
                Some(sv) if !sv.is_deleted() && !sv.is_resident() => *sv.meta(),
                // Resident again (a write raced the fetch) or gone: nothing to restore.
                _ => return Ok(()),
            };
            match doc {
                Some(d) if !d.deleted && d.seqno == meta.by_seqno.0 => {
                    let sv = StoredValue::new(key, &d.value, meta).map_err(|err| {
                        tracing::error!(vbid = %vb.id, error = %err, "background fetch: value refused");
                        Failed(EngineStatus::Internal)
                    })?;
                    match self.insert_or_tempfail(e, sv) {
                        Ok(()) => {}
                        Err(EngineStatus::TempFail) => return Err(NoRoom),
                        Err(s) => return Err(Failed(s)),
                    }
                    e.mark_clean(meta.by_seqno);
                    e.raise_mfu(epkv_hashtable::mfu::INITIAL);
                    self.counters.incr(Counter::BgFetched);
                    Ok(())
                }
                // Read before a newer version was written, flushed and evicted: the
                // operation runs again and fetches that one.
                Some(d) if d.seqno < meta.by_seqno.0 => Ok(()),
                other => {
                    tracing::error!(vbid = %vb.id, seqno = meta.by_seqno.0, on_disk = ?other.map(|d| (d.seqno, d.deleted)), "background fetch: a non-resident document's version is not on disk");
                    Err(Failed(EngineStatus::Internal))
                }
            }
        })
    }
}

impl Bucket {
    /// Full eviction: replaces a placeholder with what the disk has for its key: the
    /// document (with its value if `value`, else metadata only), or a clean tombstone
    /// that reads as absent when the disk has no live version.
    fn restore_looked_up(
        &self,
        vb: &VBucket,
        e: &mut epkv_hashtable::Entry<'_>,
        doc: Option<epkv_storage::Document>,
        value: bool,
    ) -> Result<(), FetchError> {
        let key = e.key();
        let meta_of = |d: &epkv_storage::Document| ItemMeta {
            cas: epkv_types::Cas(d.cas),
            rev_seqno: d.rev_seqno,
            by_seqno: epkv_types::Seqno(d.seqno),
            flags: d.flags,
            expiry: d.expiry,
            datatype: crate::vbucket::client_datatype(d.datatype),
            ..ItemMeta::default()
        };
        let (sv, seqno, live) = match &doc {
            Some(d) if !d.deleted => (StoredValue::new(key, &d.value, meta_of(d)), d.seqno, true),
            other => {
                self.counters.incr(Counter::BloomFalsePositives);
                let meta = other.as_ref().map_or_else(ItemMeta::default, |d| ItemMeta {
                    expiry: 0,
                    flags: 0,
                    ..meta_of(d)
                });
                // A tombstone keeps its value: the system extended attributes.
                let value = other.as_ref().map_or(&[][..], |d| &d.value[..]);
                (
                    StoredValue::new_tombstone(key, value, meta),
                    meta.by_seqno.0,
                    false,
                )
            }
        };
        let sv = sv.map_err(|err| {
            tracing::error!(vbid = %vb.id, error = %err, "background fetch: document refused");
            Failed(EngineStatus::Internal)
        })?;
        match self.insert_or_tempfail(e, sv) {
            Ok(()) => {}
            Err(EngineStatus::TempFail) => return Err(NoRoom),
            Err(s) => return Err(Failed(s)),
        }
        e.mark_clean(epkv_types::Seqno(seqno));
        if !live {
            return Ok(());
        }
        if let Some(full) = &vb.full {
            full.sub_evicted(1);
        }
        e.raise_mfu(epkv_hashtable::mfu::INITIAL);
        if value {
            self.counters.incr(Counter::BgFetched);
        } else {
            e.evict_value();
            self.counters.incr(Counter::BgMetaFetched);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn fetches_are_coalesced_per_key_and_waiters_run_once_with_the_outcome() {
        let q = BgFetchQueue::default();
        let now = epkv_executor::Clock::now(&epkv_executor::SystemClock);
        assert!(
            q.queue(Vbid(1), b"a", now, true),
            "first fetch wakes the fetcher"
        );
        assert!(!q.queue(Vbid(1), b"a", now, false), "same key: coalesced");
        assert!(!q.queue(Vbid(1), b"b", now, false), "fetcher already woken");
        let calls = Arc::new(AtomicUsize::new(0));
        for _ in 0..3 {
            let c = Arc::clone(&calls);
            q.when_fetched(
                Vbid(1),
                b"a",
                Box::new(move |r| {
                    assert_eq!(r, Err(EngineStatus::TempFail));
                    c.fetch_add(1, Ordering::Relaxed);
                }),
            );
        }
        let batch = q.take();
        assert_eq!(batch.len(), 2);
        assert!(q.is_idle());
        // A key queued while its fetch is in flight joins it.
        assert!(!q.queue(Vbid(1), b"a", now, true));
        assert!(q.take().is_empty());
        assert_eq!(calls.load(Ordering::Relaxed), 0);
        q.complete(Vbid(1), b"a"[..].into(), Err(EngineStatus::TempFail));
        assert_eq!(calls.load(Ordering::Relaxed), 3);
        // Nothing in flight for `a` any more: a waiter runs at once.
        let c = Arc::clone(&calls);
        q.when_fetched(
            Vbid(1),
            b"a",
            Box::new(move |r| {
                assert_eq!(r, Ok(()));
                c.fetch_add(1, Ordering::Relaxed);
            }),
        );
        assert_eq!(calls.load(Ordering::Relaxed), 4);
    }
}
