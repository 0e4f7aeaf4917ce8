//! [`BgFetchQueue`]: a shard's queued and in-flight background fetches, coalesced per key,
//! with the callbacks waiting for them; and [`BgFetchTimes`], their wait and read times.
//! The fetcher that drains the queue is [`crate::bg_fetcher`].
//!
//! Level: a leaf. It imports no module of this crate.

use epkv_engine_api::{EngineResult, EngineStatus, FetchedCallback};
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
/// retry comes `NO_ROOM_RETRY_AFTER` later, after the item pager (woken by the refusal)
/// has had its turn, so about 100 ms in all.
const MAX_NO_ROOM_RETRIES: u32 = 50;

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
    pub(crate) fn take(&self) -> Vec<(Vbid, Box<[u8]>, Instant, bool)> {
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
    pub(crate) fn complete(&self, vbid: Vbid, key: Box<[u8]>, outcome: EngineResult<()>) {
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
    pub(crate) fn retry_later(&self, vbid: Vbid, key: &[u8]) -> bool {
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
    pub(crate) fn is_idle(&self) -> bool {
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
pub(crate) fn record(h: &Mutex<Option<hdrhistogram::Histogram<u64>>>, d: Duration) {
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

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
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
