//! [`MemoryTracker`]: bytes charged by items, shared by every table of a bucket, with a limit.

use crate::{Error, Result};
#[cfg(epkv_loom)]
use loom::sync::atomic::{AtomicUsize, Ordering};
#[cfg(not(epkv_loom))]
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes a shard reserves from the global count at a time, and keeps at most (twice
/// this) before it gives the excess back.
const CHUNK: usize = 64 * 1024;

/// Shards per tracker: threads are spread over them round robin, so up to this many
/// writing threads never share one.
const SHARDS: usize = 32;

/// One shard's reserve: bytes counted in the global total that no item holds yet.
/// Aligned to 128 bytes so that two shards never share a cache line (nor the adjacent
/// line the x86 spatial prefetcher pulls in).
#[derive(Debug)]
#[repr(align(128))]
struct Shard {
    free: AtomicUsize,
}

/// Counts the bytes charged by items (see [`crate::StoredValue::footprint`]) across every
/// table that shares it, and refuses growth beyond a limit.
///
/// # How it counts
/// Every writer thread would otherwise update one shared counter per insert, replace
/// and delete, and at two or more threads that counter's cache line moves between the
/// cores on every write. So the global count, `reserved`, is taken in chunks of 64 KiB
/// by per-thread shards, which charge and release items against their own reserve (an
/// atomic operation on a line that stays with its core) and go back to `reserved` only
/// to take another chunk or to return a surplus above two chunks (KV-Engine keeps
/// per-core memory counters for the same reason).
///
/// - **The limit is exact.** `reserved` never exceeds the limit, even transiently: it
///   grows only through a compare-and-swap loop that checks it. A charge that does not
///   fit in its shard's reserve or a new chunk takes exactly the bytes it needs, and if
///   even that does not fit it first collects every shard's reserve back into `reserved`
///   and tries once more, so a charge is refused only when the bytes that items hold plus
///   those of charges in flight leave no room.
/// - **[`Self::used`]** is `reserved` minus the shards' reserves: exact once concurrent
///   calls have returned, and never above the limit.
/// - Releases always succeed.
///
/// # The high watermark
/// An owner that frees memory in the background (the engine's item pager) sets a high
/// watermark and a hook ([`Self::set_high_watermark`]): whenever `reserved` grows past the
/// watermark the hook runs, on the thread that charged. It is checked only when a shard
/// takes from `reserved` (once per 64 KiB of growth per thread), so it costs the charges
/// that fit in a shard's reserve nothing, and it may fire up to the shards' reserves
/// (at most 4 MiB) later than exact accounting would.
pub struct MemoryTracker {
    /// Bytes taken from the limit: charged by items, or held in a shard's reserve.
    reserved: AtomicUsize,
    /// Bytes that may be reserved at most; `usize::MAX` means unlimited.
    limit: AtomicUsize,
    shards: Box<[Shard]>,
    /// `reserved` above this runs `on_high`; `usize::MAX` (the default) never does.
    high_wat: AtomicUsize,
    /// Set once by [`Self::set_high_watermark`].
    on_high: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for MemoryTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryTracker")
            .field("used", &self.used())
            .field("limit", &self.limit())
            .field("high_wat", &self.high_wat.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl MemoryTracker {
    /// Creates a tracker with the given limit in bytes.
    #[must_use]
    pub fn new(limit_bytes: usize) -> Self {
        Self {
            reserved: AtomicUsize::new(0),
            limit: AtomicUsize::new(limit_bytes),
            shards: (0..SHARDS)
                .map(|_| Shard {
                    free: AtomicUsize::new(0),
                })
                .collect(),
            high_wat: AtomicUsize::new(usize::MAX),
            on_high: std::sync::OnceLock::new(),
        }
    }

    /// Sets the high watermark in bytes and, the first time, the hook run whenever
    /// growth takes the reserved bytes past it (see the type's docs). Later calls change
    /// only the watermark.
    pub fn set_high_watermark(&self, bytes: usize, on_high: impl Fn() + Send + Sync + 'static) {
        self.high_wat.store(bytes, Ordering::Relaxed);
        let _ = self.on_high.set(Box::new(on_high));
    }

    /// Creates a tracker without a limit.
    #[must_use]
    pub fn unlimited() -> Self {
        Self::new(usize::MAX)
    }

    /// Returns the bytes currently charged (a snapshot: exact once concurrent charges
    /// and releases have returned).
    #[must_use]
    pub fn used(&self) -> usize {
        let spare: usize = self
            .shards
            .iter()
            .map(|s| s.free.load(Ordering::Relaxed))
            .fold(0, usize::wrapping_add);
        self.reserved.load(Ordering::Relaxed).saturating_sub(spare)
    }

    /// Returns the limit in bytes.
    #[must_use]
    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// Changes the limit. Bytes already charged stay charged even if above the new limit;
    /// only later growth is refused (the shards' reserves go back first, so none of them
    /// is spent above a lowered limit).
    pub fn set_limit(&self, limit_bytes: usize) {
        self.limit.store(limit_bytes, Ordering::Relaxed);
        self.collect_reserves();
    }

    /// Charges `bytes` if that keeps the total within the limit.
    ///
    /// # Errors
    /// [`Error::QuotaExceeded`] when the charge would exceed the limit; nothing is charged.
    pub fn try_charge(&self, bytes: usize) -> Result<()> {
        self.try_charge_on(epkv_types::thread_shard(SHARDS), bytes)
    }

    /// [`Self::try_charge`] against shard `shard`.
    fn try_charge_on(&self, shard: usize, bytes: usize) -> Result<()> {
        let shard = &self.shards[shard];
        if shard
            .free
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |free| {
                free.checked_sub(bytes)
            })
            .is_ok()
        {
            return Ok(());
        }
        // A new chunk for the shard, with this charge taken from it.
        if let Some(chunk_and_bytes) = bytes.checked_add(CHUNK)
            && self.reserve(chunk_and_bytes)
        {
            shard.free.fetch_add(CHUNK, Ordering::Relaxed);
            return Ok(());
        }
        // Near the limit: just the bytes, if need be after collecting every reserve.
        if self.reserve(bytes) {
            return Ok(());
        }
        self.collect_reserves();
        if self.reserve(bytes) {
            return Ok(());
        }
        Err(Error::QuotaExceeded {
            needed: bytes,
            used: self.used(),
            limit: self.limit(),
        })
    }

    /// Returns `bytes` to the tracker.
    pub fn release(&self, bytes: usize) {
        self.release_on(epkv_types::thread_shard(SHARDS), bytes);
    }

    /// [`Self::release`] into shard `shard`.
    fn release_on(&self, shard: usize, bytes: usize) {
        let shard = &self.shards[shard];
        let free = shard.free.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if free > 2 * CHUNK {
            // Keep one chunk; give the surplus (whatever is above it now) back.
            let surplus = shard
                .free
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |f| {
                    (f > CHUNK).then_some(CHUNK)
                })
                .map_or(0, |f| f - CHUNK);
            self.unreserve(surplus);
        }
    }

    /// Adds `bytes` to `reserved` if that keeps it within the limit.
    fn reserve(&self, bytes: usize) -> bool {
        let limit = self.limit();
        match self
            .reserved
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                r.checked_add(bytes).filter(|&total| total <= limit)
            }) {
            Ok(before) => {
                if before + bytes > self.high_wat.load(Ordering::Relaxed)
                    && let Some(f) = self.on_high.get()
                {
                    f();
                }
                true
            }
            Err(_) => false,
        }
    }

    fn unreserve(&self, bytes: usize) {
        if bytes > 0 {
            let prev = self.reserved.fetch_sub(bytes, Ordering::Relaxed);
            debug_assert!(prev >= bytes, "released more memory than was charged");
        }
    }

    /// Moves every shard's reserve back to `reserved`.
    fn collect_reserves(&self) {
        for s in self.shards.iter() {
            self.unreserve(s.free.swap(0, Ordering::Relaxed));
        }
    }
}

impl Default for MemoryTracker {
    fn default() -> Self {
        Self::unlimited()
    }
}

#[cfg(all(test, not(epkv_loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_high_watermark_hook_runs_only_once_reserved_bytes_pass_it() {
        let t = MemoryTracker::new(1 << 20);
        let fired = std::sync::Arc::new(AtomicUsize::new(0));
        let f = std::sync::Arc::clone(&fired);
        t.set_high_watermark(512 * 1024, move || {
            f.fetch_add(1, Ordering::Relaxed);
        });
        // Below the watermark (a shard's first chunk and then some): no call.
        for _ in 0..4 {
            t.try_charge(64 * 1024).unwrap();
        }
        assert_eq!(fired.load(Ordering::Relaxed), 0);
        // Past it: each growth of the reserved bytes calls the hook.
        for _ in 0..6 {
            t.try_charge(64 * 1024).unwrap();
        }
        assert!(fired.load(Ordering::Relaxed) > 0);
        assert!(t.used() <= t.limit());
    }

    #[test]
    fn charge_within_limit_succeeds_and_beyond_fails() {
        let t = MemoryTracker::new(100);
        t.try_charge(60).unwrap();
        assert!(matches!(
            t.try_charge(41),
            Err(Error::QuotaExceeded {
                needed: 41,
                used: 60,
                limit: 100
            })
        ));
        assert_eq!(t.used(), 60);
        t.try_charge(40).unwrap();
        assert_eq!(t.used(), 100);
        t.release(100);
        assert_eq!(t.used(), 0);
    }

    #[test]
    fn a_charge_near_the_limit_collects_the_other_threads_reserves() {
        let limit = 200_000;
        let t = MemoryTracker::new(limit);
        // Another thread charges a little, and its shard reserves a chunk beside it.
        std::thread::scope(|s| {
            s.spawn(|| t.try_charge(1_000).unwrap());
        });
        assert_eq!(t.used(), 1_000);
        // Everything else fits only once that reserve is given back.
        t.try_charge(limit - 1_000).unwrap();
        assert_eq!(t.used(), limit);
        assert!(matches!(
            t.try_charge(1),
            Err(Error::QuotaExceeded { needed: 1, used, limit: l }) if used == limit && l == limit
        ));
        t.release(limit);
        assert_eq!(t.used(), 0);
    }

    #[test]
    fn a_lowered_limit_is_not_passed_by_spending_a_reserve() {
        let t = MemoryTracker::new(usize::MAX);
        t.try_charge(10).unwrap();
        t.set_limit(10);
        assert!(t.try_charge(1).is_err());
        assert_eq!(t.used(), 10);
    }

    #[test]
    fn bytes_charged_on_one_thread_can_be_released_on_another() {
        let t = MemoryTracker::new(1 << 30);
        for _ in 0..100 {
            t.try_charge(3_000).unwrap();
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..100 {
                    t.release(3_000);
                }
            });
        });
        assert_eq!(t.used(), 0);
    }

    #[test]
    fn concurrent_charges_never_pass_the_limit_and_add_up() {
        const THREADS: usize = 6;
        const ROUNDS: usize = 20_000;
        let limit = 1_000_000;
        let t = MemoryTracker::new(limit);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let held: Vec<usize> = std::thread::scope(|s| {
            let watcher = s.spawn(|| {
                let mut checks = 0u64;
                while !stop.load(Ordering::Relaxed) && checks < 10_000_000 {
                    assert!(t.reserved.load(Ordering::Relaxed) <= limit);
                    assert!(t.used() <= limit);
                    checks += 1;
                }
            });
            let workers: Vec<_> = (0..THREADS)
                .map(|i| {
                    let t = &t;
                    s.spawn(move || {
                        // Each thread keeps what it charged in a stack and releases in
                        // turn, charging sizes from 1 byte to 100 KiB.
                        let mut mine = Vec::new();
                        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ i as u64;
                        for _ in 0..ROUNDS {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let n = (x % 100_000) as usize + 1;
                            if x.is_multiple_of(3) {
                                if let Some(b) = mine.pop() {
                                    t.release(b);
                                }
                            } else if t.try_charge(n).is_ok() {
                                mine.push(n);
                            }
                        }
                        mine.iter().sum::<usize>()
                    })
                })
                .collect();
            let held = workers.into_iter().map(|w| w.join().unwrap()).collect();
            stop.store(true, Ordering::Relaxed);
            watcher.join().unwrap();
            held
        });
        assert_eq!(t.used(), held.iter().sum::<usize>());
    }

    #[test]
    fn lowering_the_limit_refuses_only_growth() {
        let t = MemoryTracker::new(100);
        t.try_charge(80).unwrap();
        t.set_limit(50);
        assert!(t.try_charge(1).is_err());
        t.release(40);
        t.try_charge(10).unwrap();
        assert_eq!(t.used(), 50);
    }
}

/// Loom models of the shard hand-offs. Run with
/// `RUSTFLAGS="--cfg epkv_loom" cargo test -p epkv-hashtable --release --lib loom`.
#[cfg(all(test, epkv_loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// Two charges on two shards that fit the limit only one at a time: exactly one
    /// succeeds, whatever the interleaving, and the count never passes the limit.
    #[test]
    fn loom_only_one_of_two_charges_that_together_pass_the_limit_succeeds() {
        loom::model(|| {
            let t = Arc::new(MemoryTracker::new(100));
            let spawn = |shard| {
                let t = Arc::clone(&t);
                thread::spawn(move || {
                    let ok = t.try_charge_on(shard, 60).is_ok();
                    assert!(t.reserved.load(Ordering::Relaxed) <= 100);
                    ok
                })
            };
            let (a, b) = (spawn(0), spawn(1));
            let (a, b) = (a.join().unwrap(), b.join().unwrap());
            assert!(a ^ b, "exactly one charge fits");
            assert_eq!(t.used(), 60);
        });
    }

    /// Shard 0 holds 100 bytes and a chunk reserve; one thread releases the 100 bytes
    /// while another charges a chunk on shard 1, which fits only once shard 0's reserve is
    /// given back: it succeeds in every interleaving, the limit is never passed, and the
    /// count ends exact.
    #[test]
    fn loom_a_charge_near_the_limit_reclaims_another_shards_reserve() {
        loom::model(|| {
            let limit = CHUNK + 200;
            let t = Arc::new(MemoryTracker::new(limit));
            // Shard 0 takes a chunk beside its 100 bytes.
            t.try_charge_on(0, 100).unwrap();
            assert_eq!(t.used(), 100);
            let releaser = {
                let t = Arc::clone(&t);
                thread::spawn(move || t.release_on(0, 100))
            };
            let charger = {
                let t = Arc::clone(&t);
                thread::spawn(move || {
                    let ok = t.try_charge_on(1, CHUNK).is_ok();
                    assert!(t.reserved.load(Ordering::Relaxed) <= limit);
                    ok
                })
            };
            releaser.join().unwrap();
            let ok = charger.join().unwrap();
            // CHUNK fits beside 100 held bytes (limit - 100 >= CHUNK), so it must succeed
            // once shard 0's unused reserve is collected.
            assert!(ok, "the reserve of shard 0 must be reclaimed");
            assert_eq!(t.used(), CHUNK);
            assert!(t.reserved.load(Ordering::Relaxed) <= limit);
        });
    }
}
