//! [`HashTable`]: a lock-striped concurrent map from key to a committed and a prepared
//! [`StoredValue`]; [`Entry`], the handle through which one key is read and changed
//! atomically; the `find_for_*` lookups.
//!
//! The table is an array of stripes; each stripe is a `parking_lot::Mutex` over two
//! [`SlotTable`]s (linear probing over 16-byte slots that hold the key's tag, the item's
//! pointer, its size in cache lines and its MFU counter): one for the committed versions, one for the prepared versions
//! (empty, and unallocated, unless SyncWrites are in flight, so a lookup without prepares
//! never probes it). A key's foldhash gives a 53-bit tag; the stripe is picked from tag
//! bits 12..44 and the first bucket from the low bits, so the two do not correlate.
//!
//! Beside the stripes, a dense array holds where each stripe's committed slots are: a
//! lookup prefetches the key's first bucket from it before it waits for the stripe's
//! lock, so the lock's cache miss and the bucket's overlap.
//!
//! Each stripe grows (doubling) and shrinks (to twice its items once it is a quarter
//! full) on its own, under its own lock: a resize stops only that stripe's keys, for as
//! long as it takes to rehash that stripe.

use crate::mfu;
pub(crate) use crate::slot_table::Slot;
use crate::slot_table::{SlotTable, prefetch_bucket};
use crate::stats::{MfuHistogram, Props, StripeCounts, TableStats};
use crate::{CommittedState, Error, ItemMeta, MemoryTracker, Result, StoredValue};
use foldhash::fast::RandomState;
use parking_lot::{Mutex, MutexGuard};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The low 53 bits of a [`Slot`]'s word: the key's tag.
pub(crate) const TAG_BITS: u64 = (1 << 53) - 1;

/// A key's hash as the table uses it: `tag`, 53 bits of the key's foldhash, stored in the
/// key's slot and compared before the key; `probe`, whose low bits pick the key's first
/// bucket, recomputed from the tag alone when a stripe rehashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyHash {
    pub(crate) tag: u64,
    pub(crate) probe: u64,
}

impl KeyHash {
    #[inline]
    pub(crate) fn from_tag(tag: u64) -> Self {
        // Multiplying by an odd constant maps the tag one to one onto the 64 bits: its low
        // bits follow the tag's low bits, its top bits mix all of them.
        Self {
            tag,
            probe: tag.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        }
    }

    /// The bits the stripe is picked from: tag bits 12..44. The range reduction takes the
    /// stripe from the top of that range, far above the low tag bits that choose a
    /// bucket within the stripe, so the two choices do not correlate.
    #[inline]
    fn stripe_bits(self) -> u64 {
        (self.tag >> 12) & 0xffff_ffff
    }
}

/// Stripes whose committed table has at most this many buckets are never shrunk.
const MIN_SHRINK_BUCKETS: usize = 64;

/// How [`HashTable::store`] treats an existing version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    Upsert,
    ReplaceLive,
}

/// Whether a read counts as a reference for the MFU counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrackReference {
    /// Bump the item's MFU counter (a client read).
    Yes,
    /// Leave it (internal reads: stats, pagers, tests).
    No,
}

/// Whether a lookup returns tombstones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WantsDeleted {
    /// Return a deleted (tombstone) committed version too.
    Yes,
    /// Treat a tombstone as absent.
    No,
}

/// The contents of one stripe, behind its lock.
///
/// `repr(C)` keeps what a lookup and an insert touch together at the front of the
/// stripe (checked by a test): the lock's byte, then (8 bytes in) the prepared table's
/// header, which every lookup reads to see whether there are prepares at all, then the
/// committed table's header, whose first half (the bucket array's address and length, all
/// a probe needs) is still in the first cache line, then the inline low MFU counts, in
/// the second line with the committed table's item count that an insert updates anyway:
/// one 128-byte aligned pair of lines.
#[derive(Default)]
#[repr(C)]
pub(crate) struct Inner {
    pub(crate) prepared: SlotTable,
    pub(crate) committed: SlotTable,
    pub(crate) mfu: MfuHistogram,
}

impl Inner {
    fn table_bytes(&self) -> usize {
        self.committed.heap_bytes() + self.prepared.heap_bytes() + self.mfu.heap_bytes()
    }
}

/// One lock stripe, aligned to 128 bytes so neighbouring stripes' locks and counters
/// never share a cache line (nor the adjacent line the x86 spatial prefetcher pulls in).
/// `repr(C)`: the lock and its `Inner` come first, at the start of the stripe's line.
#[repr(C, align(128))]
pub(crate) struct Stripe {
    pub(crate) inner: Mutex<Inner>,
    pub(crate) counts: StripeCounts,
    /// Set (under the lock) when a visit pauses inside this stripe, cleared when a visit
    /// walks the stripe to its end: while set, the stripe does not shrink, so a paused
    /// visit is restarted only by growth, which then doubles the stripe each time and so
    /// cannot go on for ever.
    pub(crate) visit_paused: AtomicBool,
}

/// State shared by every stripe of one table. `repr(C)`: the hasher, which every lookup
/// uses, before the tracker, which only writes use (see [`HashTable::LOOKUP_BYTES`]).
#[repr(C)]
pub(crate) struct Shared {
    /// Random seed per table: a client cannot pick keys that collide on every server.
    build: RandomState,
    /// The bucket-wide tracker every item's footprint is charged to.
    pub(crate) tracker: Arc<MemoryTracker>,
}

impl Shared {
    #[inline]
    pub(crate) fn hash(&self, key: &[u8]) -> KeyHash {
        KeyHash::from_tag(self.build.hash_one(key) >> 11)
    }

    /// Charges or releases the difference between two footprints.
    pub(crate) fn recharge(&self, old: usize, new: usize) -> Result<()> {
        if new > old {
            self.tracker.try_charge(new - old)
        } else if new == old {
            Ok(())
        } else {
            self.tracker.release(old - new);
            Ok(())
        }
    }
}

/// A concurrent map from key to a committed and a prepared [`StoredValue`], with lock
/// striping, incremental statistics and memory accounting.
///
/// All access to an item happens under its stripe's mutex: through the `find_for_*`
/// lookups, through [`HashTable::with_entry`] (check-and-modify of one key), or through
/// the visitor ([`HashTable::visit`] and its wrappers), which locks one stripe at a time.
///
/// `repr(C)`: what a lookup reads comes first ([`HashTable::LOOKUP_BYTES`]).
#[repr(C)]
pub struct HashTable {
    stripes: Box<[Stripe]>,
    /// Per stripe, its committed table's [`SlotTable::address_hint`], written under the
    /// stripe's lock whenever the array moves and read without it: a lookup prefetches
    /// the key's bucket from it while it waits for the lock, so the two cache misses
    /// overlap. Kept apart from the stripes (whose lock line the lookup has yet to load),
    /// in one dense array that stays in cache.
    bucket_hints: Box<[AtomicU64]>,
    shared: Shared,
}

impl std::fmt::Debug for HashTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HashTable")
            .field("stripes", &self.stripes.len())
            .field("items", &self.len())
            .field("mem_used", &self.mem_used())
            .finish()
    }
}

impl HashTable {
    /// How many leading bytes of a `HashTable` a lookup reads: the stripes' and the bucket
    /// hints' addresses and the hasher. Only writes read the rest (the memory tracker's
    /// address). An owner that wants every lookup to touch one cache line of its own keeps
    /// these bytes in it (the engine's `VBucket` does).
    pub const LOOKUP_BYTES: usize =
        std::mem::offset_of!(HashTable, shared) + std::mem::offset_of!(Shared, tracker);

    /// Creates an empty table with `num_stripes` locks, charging memory to `tracker`.
    ///
    /// # Errors
    /// [`Error::InvalidStripeCount`] when `num_stripes` is zero.
    pub fn new(num_stripes: usize, tracker: Arc<MemoryTracker>) -> Result<Self> {
        if num_stripes == 0 {
            return Err(Error::InvalidStripeCount(num_stripes));
        }
        let stripes = (0..num_stripes)
            .map(|_| Stripe {
                inner: Mutex::new(Inner::default()),
                counts: StripeCounts::default(),
                visit_paused: AtomicBool::new(false),
            })
            .collect();
        Ok(Self {
            stripes,
            bucket_hints: (0..num_stripes).map(|_| AtomicU64::new(0)).collect(),
            shared: Shared {
                build: RandomState::default(),
                tracker,
            },
        })
    }

    /// Creates an empty table with `num_stripes` locks and its own unlimited tracker.
    ///
    /// # Errors
    /// [`Error::InvalidStripeCount`] when `num_stripes` is zero.
    pub fn unlimited(num_stripes: usize) -> Result<Self> {
        Self::new(num_stripes, Arc::new(MemoryTracker::unlimited()))
    }

    /// Returns the number of lock stripes.
    #[must_use]
    pub fn num_stripes(&self) -> usize {
        self.stripes.len()
    }

    fn sum(&self, f: impl Fn(&StripeCounts) -> &std::sync::atomic::AtomicUsize) -> usize {
        self.stripes
            .iter()
            .map(|s| f(&s.counts).load(std::sync::atomic::Ordering::Relaxed))
            .fold(0usize, usize::wrapping_add)
    }

    /// Returns the number of live committed items (a snapshot; concurrent writers may
    /// change it at once). Tombstones and prepares are not counted.
    #[must_use]
    pub fn len(&self) -> usize {
        self.sum(|c| &c.items)
    }

    /// Returns true when the table holds no live committed item.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Returns the number of prepared SyncWrites in the table.
    #[must_use]
    pub fn num_prepared(&self) -> usize {
        self.sum(|c| &c.prepared)
    }

    /// Returns the bytes charged by this table's items (committed and prepared).
    #[must_use]
    pub fn mem_used(&self) -> usize {
        self.sum(|c| &c.mem)
    }

    /// Returns how many times a stripe of this table has been resized (grown or shrunk).
    #[must_use]
    pub fn resizes(&self) -> usize {
        self.sum(|c| &c.resizes)
    }

    /// Returns the memory tracker this table charges.
    #[must_use]
    pub fn tracker(&self) -> &Arc<MemoryTracker> {
        &self.shared.tracker
    }

    /// Returns a snapshot of the statistics (locks each stripe briefly for the table's
    /// array sizes and MFU histogram).
    #[must_use]
    pub fn stats(&self) -> TableStats {
        let mut hist = Box::new([0u64; 256]);
        let mut table_bytes = std::mem::size_of_val::<[Stripe]>(&self.stripes);
        for s in &self.stripes {
            let inner = s.inner.lock();
            table_bytes += inner.table_bytes();
            inner.mfu.add_to(&mut hist);
        }
        TableStats {
            items: self.len(),
            deleted: self.sum(|c| &c.deleted),
            prepared: self.num_prepared(),
            non_resident: self.sum(|c| &c.non_resident),
            dirty: self.sum(|c| &c.dirty),
            mem_bytes: self.mem_used(),
            table_bytes,
            resizes: self.resizes(),
            mfu_histogram: hist,
        }
    }

    /// Adds this table's histogram of evictable items by MFU counter (live, resident,
    /// committed; what [`TableStats::mfu_histogram`] holds) to `hist`, locking each stripe
    /// briefly. Cheaper than [`Self::stats`] when only the histogram is wanted (the item
    /// pager sums it over every vBucket).
    pub fn add_mfu_histogram(&self, hist: &mut [u64; 256]) {
        for s in &self.stripes {
            s.inner.lock().mfu.add_to(hist);
        }
    }

    /// Returns the number of live committed items whose value is not resident.
    #[must_use]
    pub fn num_non_resident(&self) -> usize {
        self.sum(|c| &c.non_resident)
    }

    #[inline]
    fn stripe_index(&self, hash: KeyHash) -> usize {
        // Multiply-shift range reduction of 32 bits: `bits * n >> 32 < n`.
        ((hash.stripe_bits() * self.stripes.len() as u64) >> 32) as usize
    }

    /// Prefetches `hash`'s first committed bucket, then locks its stripe; returns the
    /// stripe, its index and its guard.
    #[inline]
    fn lock_stripe(&self, hash: KeyHash) -> (&Stripe, usize, MutexGuard<'_, Inner>) {
        let index = self.stripe_index(hash);
        prefetch_bucket(self.bucket_hints[index].load(Ordering::Relaxed), hash.probe);
        let stripe = &self.stripes[index];
        (stripe, index, stripe.inner.lock())
    }

    /// Publishes stripe `index`'s bucket hint if its committed array has moved. Call it,
    /// with the stripe locked, after anything that may have rehashed the stripe.
    #[inline]
    pub(crate) fn refresh_bucket_hint(&self, index: usize, inner: &Inner) {
        let now = inner.committed.address_hint();
        let hint = &self.bucket_hints[index];
        if hint.load(Ordering::Relaxed) != now {
            hint.store(now, Ordering::Relaxed);
        }
    }

    pub(crate) fn stripes(&self) -> &[Stripe] {
        &self.stripes
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Starts loading the table's front, which every lookup reads first (the stripes'
    /// and bucket hints' addresses and the hasher; an owner keeping its hot fields in the
    /// same cache line gets them too). The first stage of a two-stage hint: this for a
    /// request two ahead, [`Self::prefetch`] (which reads the front) for the next one.
    #[inline]
    pub fn prefetch_table(&self) {
        crate::prefetch::prefetch_line(std::ptr::from_ref(self) as usize);
    }

    /// Starts loading what a lookup of `key` will touch first: its stripe's lock and its
    /// first committed bucket. A hint for a key looked up shortly after (the front end
    /// gives it for the next pipelined request while it runs the current one, so that
    /// their cache misses overlap); it changes nothing and takes no lock.
    #[inline]
    pub fn prefetch(&self, key: &[u8]) {
        let hash = self.shared.hash(key);
        let index = self.stripe_index(hash);
        prefetch_bucket(self.bucket_hints[index].load(Ordering::Relaxed), hash.probe);
        crate::prefetch::prefetch_line(std::ptr::from_ref(&self.stripes[index]) as usize);
    }

    /// Locks `key`'s stripe and runs `f` on the key's [`Entry`] (committed and prepared
    /// versions); whatever `f` reads and changes through the entry happens atomically
    /// with respect to every other access to the key. Keep `f` short: it blocks every key
    /// of the stripe. This is KV-Engine's `findForUpdate`.
    pub fn with_entry<R>(&self, key: &[u8], f: impl FnOnce(&mut Entry<'_>) -> R) -> R {
        let hash = self.shared.hash(key);
        let (stripe, index, mut inner) = self.lock_stripe(hash);
        let committed = inner.committed.find(hash, key);
        let prepared = if inner.prepared.is_empty() {
            None
        } else {
            inner.prepared.find(hash, key)
        };
        let mut entry = Entry {
            inner: &mut inner,
            counts: &stripe.counts,
            shared: &self.shared,
            hash,
            key,
            committed,
            prepared,
            shrink: false,
            visit_paused: stripe.visit_paused.load(Ordering::Relaxed),
        };
        let r = f(&mut entry);
        let shrink = entry.shrink;
        if shrink && !stripe.visit_paused.load(Ordering::Relaxed) && shrink_if_sparse(&mut inner) {
            stripe.counts.count_resize();
        }
        self.refresh_bucket_hint(index, &inner);
        r
    }

    /// Same as [`Self::with_entry`] (KV-Engine's name).
    pub fn find_for_update<R>(&self, key: &[u8], f: impl FnOnce(&mut Entry<'_>) -> R) -> R {
        self.with_entry(key, f)
    }

    /// Looks `key` up for a client read and runs `f` on what a reader may see: the
    /// committed version (a tombstone only with [`WantsDeleted::Yes`]), or, when the key
    /// has a [`CommittedState::PreparedMaybeVisible`] prepare, that prepare (the caller
    /// must refuse the read until it completes). A pending prepare is invisible. With
    /// [`TrackReference::Yes`] a live committed item's MFU counter is bumped.
    pub fn find_for_read<R>(
        &self,
        key: &[u8],
        track: TrackReference,
        wants_deleted: WantsDeleted,
        f: impl FnOnce(&StoredValue) -> R,
    ) -> Option<R> {
        let hash = self.shared.hash(key);
        let (stripe, _, mut guard) = self.lock_stripe(hash);
        let inner = &mut *guard;
        // Only a maybe-visible prepare changes what a reader sees; they are rare (warmup,
        // promotion), so without one the prepared table is not probed at all. The
        // emptiness check comes first: it reads the stripe's first cache line, the
        // counter another.
        if !inner.prepared.is_empty()
            && stripe
                .counts
                .maybe_visible
                .load(std::sync::atomic::Ordering::Relaxed)
                != 0
            && let Some(p) = inner.prepared.find_slot(hash, key)
            && p.committed_state() == CommittedState::PreparedMaybeVisible
        {
            return Some(f(p));
        }
        let sv = inner.committed.find_slot_mut(hash, key)?;
        if sv.is_deleted() {
            return (wants_deleted == WantsDeleted::Yes).then(|| f(sv));
        }
        if track == TrackReference::Yes {
            bump_mfu(sv, &mut inner.mfu);
        }
        Some(f(sv))
    }

    /// Looks `key` up for a write and runs `f` on the version a write must build on: the
    /// in-flight prepare if there is one, else the committed version (tombstones
    /// included). No MFU bump.
    pub fn find_for_write<R>(&self, key: &[u8], f: impl FnOnce(&StoredValue) -> R) -> Option<R> {
        let hash = self.shared.hash(key);
        let (_, _, inner) = self.lock_stripe(hash);
        if !inner.prepared.is_empty()
            && let Some(p) = inner.prepared.find_slot(hash, key)
            && p.committed_state().is_in_flight()
        {
            return Some(f(p));
        }
        inner.committed.find_slot(hash, key).map(|sv| f(sv))
    }

    /// Returns a copy of the live committed item stored under `key` (cheap: the value is
    /// shared). No MFU bump.
    #[must_use]
    pub fn get(&self, key: &[u8]) -> Option<StoredValue> {
        self.with_entry(key, |e| e.get().cloned())
    }

    /// Returns a copy of the prepared version of `key`, if any.
    #[must_use]
    pub fn get_prepared(&self, key: &[u8]) -> Option<StoredValue> {
        self.with_entry(key, |e| e.prepared().cloned())
    }

    /// Stores `sv` under its key (as the committed or the prepared version, by its
    /// state), returning the version it replaced.
    ///
    /// # Errors
    /// [`Error::QuotaExceeded`] when the tracker refuses the extra bytes; the table is
    /// unchanged.
    pub fn insert(&self, sv: StoredValue) -> Result<Option<StoredValue>> {
        self.store(sv, Store::Upsert)
    }

    /// Replaces the committed version of `sv`'s key, only if there is a live one.
    ///
    /// # Errors
    /// [`Error::NotFound`] without a live committed version; [`Error::WrongState`] for a
    /// prepare; [`Error::QuotaExceeded`] as for [`Self::insert`].
    pub fn replace(&self, sv: StoredValue) -> Result<StoredValue> {
        if sv.is_prepared() {
            return Err(Error::WrongState);
        }
        self.store(sv, Store::ReplaceLive)?.ok_or(Error::NotFound)
    }

    /// [`Self::insert`] and [`Self::replace`] without an [`Entry`]: the key is looked up
    /// while `sv` is still borrowed, then `sv` moves into the table (no key copy).
    fn store(&self, sv: StoredValue, mode: Store) -> Result<Option<StoredValue>> {
        let hash = self.shared.hash(sv.key());
        let (stripe, stripe_index, mut guard) = self.lock_stripe(hash);
        let inner = &mut *guard;
        let prepared = sv.is_prepared();
        let table = if prepared {
            &mut inner.prepared
        } else {
            &mut inner.committed
        };
        let mut index = table.find(hash, sv.key());
        if mode == Store::ReplaceLive
            && index
                .and_then(|i| table.get(i))
                .is_none_or(|v| v.is_deleted())
        {
            return Err(Error::NotFound);
        }
        let r = insert_into(
            table,
            &mut inner.mfu,
            &mut index,
            Around {
                counts: &stripe.counts,
                shared: &self.shared,
                visit_paused: stripe.visit_paused.load(Ordering::Relaxed),
                charged: 0,
            },
            hash,
            sv,
        );
        self.refresh_bucket_hint(stripe_index, inner);
        r
    }

    /// Removes and returns the committed version of `key` (live or tombstone).
    pub fn remove(&self, key: &[u8]) -> Option<StoredValue> {
        self.with_entry(key, |e| e.remove())
    }

    /// Visits every committed item, one stripe at a time, and removes those for which
    /// `keep` returns false; returns how many were removed. No lock is held between
    /// stripes: items written concurrently may or may not be visited.
    pub fn retain(&self, mut keep: impl FnMut(&StoredValue) -> bool) -> usize {
        let mut removed = 0;
        self.visit(crate::Position::START, |item| {
            if item.item().is_some_and(|sv| !keep(sv)) {
                item.remove();
                removed += 1;
            }
            crate::Visit::Continue
        });
        removed
    }

    /// Calls `f` on every committed item, one stripe at a time, holding only that
    /// stripe's lock.
    pub fn for_each(&self, mut f: impl FnMut(&StoredValue)) {
        self.visit(crate::Position::START, |item| {
            if let Some(sv) = item.item() {
                f(sv);
            }
            crate::Visit::Continue
        });
    }

    /// Calls `f` on every prepared version, one stripe at a time.
    pub fn for_each_prepared(&self, mut f: impl FnMut(&StoredValue)) {
        for s in self.stripes.iter() {
            let inner = s.inner.lock();
            inner.prepared.iter().for_each(|sv| f(sv));
        }
    }

    /// Removes every item, committed and prepared, one stripe at a time; returns how many
    /// committed items (live or tombstones) were removed.
    pub fn clear(&self) -> usize {
        let mut removed = 0;
        for (index, s) in self.stripes.iter().enumerate() {
            let mut inner = s.inner.lock();
            let inner = &mut *inner;
            let before = inner.committed.num_buckets() + inner.prepared.num_buckets();
            for sv in inner.committed.drain().chain(inner.prepared.drain()) {
                let p = sv.props();
                self.shared.tracker.release(p.footprint());
                s.counts.apply(Some(&p), None);
                inner.mfu.apply(p.evictable_mfu, None);
                if sv.is_committed() {
                    removed += 1;
                }
            }
            // Draining released both arrays.
            if before != 0 {
                s.counts.count_resize();
            }
            self.refresh_bucket_hint(index, inner);
        }
        removed
    }
}

/// Bumps a live resident item's MFU counter probabilistically, moving it in the
/// histogram.
#[inline]
/// Sets an item's MFU counter, moving it between the histogram's bins if it is evictable.
pub(crate) fn set_mfu(sv: &mut Slot, hist: &mut MfuHistogram, mfu: u8) {
    let before = sv.props().evictable_mfu;
    sv.set_mfu(mfu);
    hist.apply(before, sv.props().evictable_mfu);
}

pub(crate) fn bump_mfu(sv: &mut Slot, hist: &mut MfuHistogram) {
    let c = sv.mfu();
    let n = mfu::next_on_access(c);
    sv.set_mfu(n);
    if sv.is_resident() && sv.is_committed() && !sv.is_deleted() {
        hist.shift(c, n);
    }
}

/// Shrinks a stripe's tables that are under a quarter full to about half full; returns
/// whether either moved its items.
pub(crate) fn shrink_if_sparse(inner: &mut Inner) -> bool {
    let mut shrunk = false;
    for t in [&mut inner.committed, &mut inner.prepared] {
        let buckets = t.num_buckets();
        if buckets > MIN_SHRINK_BUCKETS && t.len() * 4 < buckets {
            shrunk |= t.shrink_to(t.len() * 2);
        }
    }
    shrunk
}

/// The committed and prepared versions of one key inside a locked stripe, readable and
/// changeable while [`HashTable::with_entry`]'s closure runs. Every change keeps the
/// statistics and the memory accounting exact.
pub struct Entry<'a> {
    inner: &'a mut Inner,
    counts: &'a StripeCounts,
    shared: &'a Shared,
    hash: KeyHash,
    key: &'a [u8],
    /// Bucket indices of the key's versions; valid because nothing else can touch the
    /// stripe while the entry exists, refreshed by every insert and remove, and never
    /// invalidated by a shrink (which waits until the closure has returned).
    committed: Option<usize>,
    prepared: Option<usize>,
    shrink: bool,
    /// Whether a paused visit is inside the stripe (read under its lock): growth then
    /// doubles the stripe (see [`SlotTable::insert_new`]).
    visit_paused: bool,
}

impl Entry<'_> {
    /// Returns the key this entry is for.
    #[must_use]
    pub fn key(&self) -> &[u8] {
        self.key
    }

    /// Returns the live committed version (not a tombstone), if any.
    #[must_use]
    pub fn get(&self) -> Option<&StoredValue> {
        self.committed().filter(|sv| !sv.is_deleted())
    }

    /// Returns the committed version, tombstone included, if any.
    #[must_use]
    pub fn committed(&self) -> Option<&StoredValue> {
        self.committed
            .and_then(|i| self.inner.committed.get(i))
            .map(|b| &**b)
    }

    /// Returns the prepared version, if any.
    #[must_use]
    pub fn prepared(&self) -> Option<&StoredValue> {
        self.prepared
            .and_then(|i| self.inner.prepared.get(i))
            .map(|b| &**b)
    }

    /// KV-Engine's `selectSVToModify`: for a durable write the prepare if there is one,
    /// else the committed version; for a plain write the prepare only while it is in
    /// flight.
    #[must_use]
    pub fn select_to_modify(&self, durable: bool) -> Option<&StoredValue> {
        match self.prepared() {
            Some(p) if durable || p.committed_state().is_in_flight() => Some(p),
            _ => self.committed(),
        }
    }

    fn committed_mut(&mut self) -> Option<&mut Slot> {
        self.committed.and_then(|i| self.inner.committed.get_mut(i))
    }

    /// Returns the committed version's MFU counter (tombstones included), if there is a
    /// committed version. The table keeps the counter beside the item, not in it.
    #[must_use]
    pub fn mfu(&self) -> Option<u8> {
        self.committed
            .and_then(|i| self.inner.committed.get(i))
            .map(Slot::mfu)
    }

    /// Returns the committed version's metadata for in-place change (tombstones
    /// included). Key, value and state cannot change this way.
    pub fn meta_mut(&mut self) -> Option<&mut ItemMeta> {
        self.committed_mut().map(|slot| slot.meta_mut())
    }

    /// Returns the committed version's value (tombstones included) for in-place change
    /// of its bytes; its length cannot change.
    pub fn value_mut(&mut self) -> Option<&mut [u8]> {
        self.committed_mut().map(|slot| slot.value_mut())
    }

    /// Returns the prepared version's value for in-place change of its bytes; its length
    /// cannot change.
    pub fn prepared_value_mut(&mut self) -> Option<&mut [u8]> {
        self.prepared
            .and_then(|i| self.inner.prepared.get_mut(i))
            .map(|b| b.value_mut())
    }

    /// Returns the prepared version's metadata for in-place change.
    pub fn prepared_meta_mut(&mut self) -> Option<&mut ItemMeta> {
        self.prepared
            .and_then(|i| self.inner.prepared.get_mut(i))
            .map(|b| b.meta_mut())
    }

    /// Raises the committed version's MFU counter to at least `mfu` (a value read back
    /// from disk for a client counts as freshly used, not as the coldest item, which
    /// the pager would evict again before the client reads it).
    pub fn raise_mfu(&mut self, mfu: u8) {
        let Some(i) = self.committed else { return };
        let inner = &mut *self.inner;
        if let Some(sv) = inner.committed.get_mut(i)
            && sv.mfu() < mfu
        {
            set_mfu(sv, &mut inner.mfu, mfu);
        }
    }

    /// Counts a client reference to the live committed version (MFU bump).
    pub fn track_reference(&mut self) {
        let Some(i) = self.committed else { return };
        if let Some(sv) = self.inner.committed.get_mut(i)
            && !sv.is_deleted()
        {
            bump_mfu(sv, &mut self.inner.mfu);
        }
    }

    /// Stores `sv` as the committed version, returning the one it replaced. An existing
    /// version is overwritten in place (same allocation) and its MFU counter carries over
    /// with one access added, as in KV-Engine.
    ///
    /// # Errors
    /// [`Error::KeyMismatch`] for an item with another key; [`Error::WrongState`] for a
    /// prepare; [`Error::QuotaExceeded`] when the memory tracker refuses the extra bytes.
    /// Either way nothing changes.
    pub fn insert(&mut self, sv: StoredValue) -> Result<Option<StoredValue>> {
        if sv.key() != self.key {
            return Err(Error::KeyMismatch);
        }
        if !sv.is_committed() {
            return Err(Error::WrongState);
        }
        self.insert_charged(sv, 0)
    }

    /// [`Self::insert`] of a version of whose footprint `charged` bytes are already
    /// charged to the tracker.
    fn insert_charged(&mut self, sv: StoredValue, charged: usize) -> Result<Option<StoredValue>> {
        let shared = self.shared;
        let counts = self.counts;
        let inner = &mut *self.inner;
        insert_into(
            &mut inner.committed,
            &mut inner.mfu,
            &mut self.committed,
            Around {
                counts,
                shared,
                visit_paused: self.visit_paused,
                charged,
            },
            self.hash,
            sv,
        )
    }

    /// Stores `sv` (a prepare) as the prepared version, returning the one it replaced.
    ///
    /// # Errors
    /// As [`Self::insert`]; [`Error::WrongState`] for a committed item.
    pub fn insert_prepared(&mut self, sv: StoredValue) -> Result<Option<StoredValue>> {
        if sv.key() != self.key {
            return Err(Error::KeyMismatch);
        }
        if !sv.is_prepared() {
            return Err(Error::WrongState);
        }
        let shared = self.shared;
        let counts = self.counts;
        let inner = &mut *self.inner;
        insert_into(
            &mut inner.prepared,
            &mut inner.mfu,
            &mut self.prepared,
            Around {
                counts,
                shared,
                visit_paused: self.visit_paused,
                charged: 0,
            },
            self.hash,
            sv,
        )
    }

    /// Removes and returns the committed version (live or tombstone), if any.
    pub fn remove(&mut self) -> Option<StoredValue> {
        let index = self.committed.take()?;
        let sv = self.inner.committed.remove(index)?;
        let p = sv.props();
        self.shared.tracker.release(p.footprint());
        self.counts.apply(Some(&p), None);
        self.inner.mfu.apply(p.evictable_mfu, None);
        self.shrink = true;
        Some(sv.into_inner())
    }

    /// Removes and returns the prepared version (an abort, or the end of a completed
    /// prepare), if any.
    pub fn remove_prepared(&mut self) -> Option<StoredValue> {
        let index = self.prepared.take()?;
        let sv = self.inner.prepared.remove(index)?;
        let p = sv.props();
        self.shared.tracker.release(p.footprint());
        self.counts.apply(Some(&p), None);
        self.shrink = true;
        Some(sv.into_inner())
    }

    /// Commits the prepared version: it becomes the committed version (state
    /// [`CommittedState::CommittedViaPrepare`], metadata `meta`, with the seqno and CAS the
    /// caller assigned to the commit), replacing any committed version, and the prepare
    /// is gone. Returns the committed version it replaced.
    ///
    /// The prepare's allocation becomes the committed version (no copy of the value) and
    /// its charge goes with it. The commit is refused, as an insert of a copy would be,
    /// when the tracker has no room for the committed version beside the prepare.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no prepare; [`Error::QuotaExceeded`] as for
    /// [`Self::insert`] (nothing changes).
    pub fn commit_prepared(&mut self, meta: ItemMeta) -> Result<Option<StoredValue>> {
        self.commit_prepared_charging(meta, true)
    }

    /// [`Self::commit_prepared`] that is never refused for memory: the prepare's
    /// allocation and charge become the committed version's and the version it replaces
    /// is released, so item memory never grows (KV-Engine converts the prepare in place,
    /// and a commit the durability monitor has decided cannot fail).
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no prepare.
    pub fn convert_prepared(&mut self, meta: ItemMeta) -> Result<Option<StoredValue>> {
        self.commit_prepared_charging(meta, false)
    }

    fn commit_prepared_charging(
        &mut self,
        meta: ItemMeta,
        charge_copy: bool,
    ) -> Result<Option<StoredValue>> {
        let index = self.prepared.ok_or(Error::NotFound)?;
        let p_bytes = self
            .inner
            .prepared
            .get(index)
            .ok_or(Error::NotFound)?
            .footprint();
        let old_bytes = self
            .committed
            .and_then(|i| self.inner.committed.get(i))
            .map_or(0, |slot| slot.footprint());
        // What inserting a copy charged before the prepare was freed.
        let extra = if charge_copy {
            p_bytes.saturating_sub(old_bytes)
        } else {
            0
        };
        self.shared.tracker.try_charge(extra)?;
        let Some(slot) = self.inner.prepared.remove(index) else {
            unreachable!("the prepare was just found at this index")
        };
        self.prepared = None;
        let p = slot.props();
        self.counts.apply(Some(&p), None);
        self.shrink = true;
        let committed = slot
            .into_inner()
            .with_state(CommittedState::CommittedViaPrepare)
            .with_meta(meta);
        // Charged: the prepare's bytes (the committed version's footprint) plus `extra`;
        // the insert releases `extra` and the version it replaces, and cannot fail.
        self.insert_charged(committed, p_bytes + extra)
    }

    /// Marks the committed version clean if it is still the version with `by_seqno`
    /// (the flusher persisted it); returns whether it did.
    pub fn mark_clean(&mut self, by_seqno: epkv_types::Seqno) -> bool {
        let counts = self.counts;
        self.committed_mut()
            .is_some_and(|sv| clean_if(sv, counts, |v| v.meta().by_seqno == by_seqno))
    }

    /// Marks the committed version clean if `persisted` (its vBucket's persisted seqno)
    /// covers it ([`StoredValue::is_unpersisted`] is false); returns whether it did. The
    /// flusher does not look its items up to clear their dirty bits; whoever needs the
    /// bit exact (eviction, OBSERVE) settles it with this first.
    pub fn mark_clean_upto(&mut self, persisted: epkv_types::Seqno) -> bool {
        let counts = self.counts;
        self.committed_mut()
            .is_some_and(|sv| clean_upto(sv, counts, persisted))
    }

    /// Evicts the committed version's value if it is live, clean and resident (value
    /// eviction); returns whether it did. The metadata stays.
    pub fn evict_value(&mut self) -> bool {
        let counts = self.counts;
        let shared = self.shared;
        let Some(i) = self.committed else {
            return false;
        };
        let inner = &mut *self.inner;
        let Some(sv) = inner.committed.get_mut(i) else {
            return false;
        };
        evict(sv, counts, shared, &mut inner.mfu)
    }
}

/// Clears a dirty item's dirty bit if `persisted(item)`, keeping the counts; returns
/// whether it did.
fn clean_if(
    sv: &mut Slot,
    counts: &StripeCounts,
    persisted: impl FnOnce(&StoredValue) -> bool,
) -> bool {
    if !sv.is_dirty() || !persisted(sv) {
        return false;
    }
    let before = sv.props();
    sv.set_dirty(false);
    counts.apply(Some(&before), Some(&sv.props()));
    true
}

/// [`Entry::mark_clean_upto`] of one slot.
pub(crate) fn clean_upto(
    sv: &mut Slot,
    counts: &StripeCounts,
    persisted: epkv_types::Seqno,
) -> bool {
    clean_if(sv, counts, |v| !v.is_unpersisted(persisted))
}

/// Evicts a live, clean, resident committed item's value.
pub(crate) fn evict(
    sv: &mut Slot,
    counts: &StripeCounts,
    shared: &Shared,
    hist: &mut MfuHistogram,
) -> bool {
    if !sv.is_committed() || sv.is_deleted() || sv.is_dirty() || !sv.is_resident() {
        return false;
    }
    let before = sv.props();
    sv.eject_value();
    let after = sv.props();
    shared
        .tracker
        .release(before.footprint() - after.footprint());
    counts.apply(Some(&before), Some(&after));
    hist.apply(before.evictable_mfu, after.evictable_mfu);
    true
}

/// What [`insert_into`] needs of the stripe besides its tables.
struct Around<'a> {
    counts: &'a StripeCounts,
    shared: &'a Shared,
    /// Whether a paused visit is inside the stripe (see [`SlotTable::insert_new`]).
    visit_paused: bool,
    /// Bytes of the new version already charged to the tracker (a prepare's allocation
    /// that a commit hands over), so only the difference is charged or released.
    charged: usize,
}

/// Inserts or overwrites one version in `table` at `index`, keeping the accounting.
fn insert_into(
    table: &mut SlotTable,
    hist: &mut MfuHistogram,
    index: &mut Option<usize>,
    around: Around<'_>,
    hash: KeyHash,
    sv: StoredValue,
) -> Result<Option<StoredValue>> {
    let Around {
        counts,
        shared,
        visit_paused,
        charged,
    } = around;
    if let Some(slot) = index.and_then(|i| table.get_mut(i)) {
        let mfu = mfu::next_on_access(slot.mfu());
        let before = slot.props();
        let after = Props::of(&sv, mfu);
        shared.recharge(before.footprint() + charged, after.footprint())?;
        counts.apply(Some(&before), Some(&after));
        hist.apply(before.evictable_mfu, after.evictable_mfu);
        slot.set_mfu(mfu);
        return Ok(Some(slot.replace(sv)));
    }
    let after = Props::of(&sv, mfu::INITIAL);
    shared.recharge(charged, after.footprint())?;
    counts.apply(None, Some(&after));
    hist.apply(None, after.evictable_mfu);
    let (at, rehashed) = table.insert_new(Slot::new(hash, sv, mfu::INITIAL), visit_paused);
    *index = Some(at);
    if rehashed {
        counts.count_resize();
    }
    Ok(None)
}

#[cfg(test)]
mod mfu_tests {
    use super::*;

    fn item(key: &[u8]) -> StoredValue {
        StoredValue::new(key, b"v", ItemMeta::default()).unwrap()
    }

    fn mfu_of(t: &HashTable, key: &[u8]) -> Option<u8> {
        t.with_entry(key, |e| e.mfu())
    }

    fn read(t: &HashTable, key: &[u8], track: TrackReference) {
        t.find_for_read(key, track, WantsDeleted::No, |_| ())
            .expect("the key is there");
    }

    #[test]
    fn the_slot_keeps_the_counter_through_reads_resizes_and_overwrites() {
        let t = HashTable::unlimited(1).unwrap();
        t.insert(item(b"hot")).unwrap();
        assert_eq!(mfu_of(&t, b"hot"), Some(mfu::INITIAL));
        // Up to 20 the increment probability is at least 1/5.8: 400 reads add far more
        // than 5 (the chance of 5 or fewer is below 1e-30).
        for _ in 0..400 {
            read(&t, b"hot", TrackReference::Yes);
        }
        let hot = mfu_of(&t, b"hot").unwrap();
        assert!(hot > mfu::INITIAL + 5, "{hot}");
        for _ in 0..100 {
            read(&t, b"hot", TrackReference::No);
        }
        assert_eq!(mfu_of(&t, b"hot"), Some(hot), "untracked reads leave it");

        // Growing the stripe rehashes from the slot word's tag, not its MFU byte.
        let keys: Vec<Vec<u8>> = (0..5000).map(|i| format!("k{i}").into_bytes()).collect();
        for k in &keys {
            t.insert(item(k)).unwrap();
        }
        assert!(t.resizes() > 0);
        assert_eq!(mfu_of(&t, b"hot"), Some(hot));
        for k in &keys {
            assert_eq!(mfu_of(&t, k), Some(mfu::INITIAL), "{k:?}");
        }

        // An overwrite keeps the counter plus one access at most.
        t.insert(item(b"hot")).unwrap();
        let after = mfu_of(&t, b"hot").unwrap();
        assert!(after == hot || after == hot + 1, "{hot} -> {after}");
        let stats = t.stats();
        assert_eq!(stats.mfu_histogram[usize::from(after)], 1);
        assert_eq!(stats.mfu_histogram[usize::from(mfu::INITIAL)], 5000);

        // Removed and inserted again, the key starts over.
        assert!(t.remove(b"hot").is_some());
        assert_eq!(mfu_of(&t, b"hot"), None);
        t.insert(item(b"hot")).unwrap();
        assert_eq!(mfu_of(&t, b"hot"), Some(mfu::INITIAL));
    }

    #[test]
    fn tags_spread_over_buckets_and_survive_the_mfu_byte() {
        // The probe hash is a one-to-one map of the tag: distinct tags never collide, and
        // the bucket bits take nearly every value.
        let t = HashTable::unlimited(1).unwrap();
        let hashes: Vec<KeyHash> = (0..4096)
            .map(|i| t.shared().hash(format!("key{i}").as_bytes()))
            .collect();
        let buckets: std::collections::HashSet<u64> =
            hashes.iter().map(|h| h.probe & 1023).collect();
        assert!(buckets.len() > 900, "{} of 1024 buckets", buckets.len());
        // A resize places a slot by the probe hash it recomputes from its word: that must
        // be the probe the key was inserted with, whatever its MFU byte holds.
        for h in &hashes {
            assert_eq!(h.tag >> 53, 0);
            let mut slot = Slot::new(*h, item(b"k"), mfu::INITIAL);
            for counter in [0, 1, mfu::INITIAL, 200, u8::MAX] {
                slot.set_mfu(counter);
                assert_eq!((slot.probe_hash(), slot.mfu()), (h.probe, counter));
            }
        }
    }
}

#[cfg(test)]
mod layout_tests {
    use super::*;

    #[test]
    fn prefetch_hints_change_nothing_on_empty_full_or_resized_tables() {
        let t = HashTable::unlimited(4).unwrap();
        // No bucket array yet (its hint is 0).
        t.prefetch_table();
        t.prefetch(b"k");
        for i in 0..2000u32 {
            let key = format!("key-{i}");
            t.prefetch(key.as_bytes());
            t.insert(StoredValue::new(key.as_bytes(), b"v", ItemMeta::default()).unwrap())
                .unwrap();
        }
        for i in 0..4000u32 {
            t.prefetch(format!("key-{i}").as_bytes());
        }
        assert_eq!(t.len(), 2000);
        assert!(t.get(b"key-1999").is_some());
        assert!(t.get(b"key-2000").is_none());
    }

    fn lines_of(t: &HashTable, key: &[u8]) -> (usize, usize) {
        t.with_entry(key, |e| {
            let slot = e.committed_mut().expect("the key is there");
            (slot.prefetch_lines(), slot.footprint())
        })
    }

    #[test]
    fn the_slots_line_count_follows_every_new_version_and_eviction() {
        let t = HashTable::unlimited(1).unwrap();
        let v1 = StoredValue::new(b"k", &[1; 100], ItemMeta::default()).unwrap();
        t.insert(v1).unwrap();
        assert_eq!(lines_of(&t, b"k"), (3, 149));
        // Overwrites replace the item in place; the count must follow its size.
        let v2 = StoredValue::new(b"k", &[2; 700], ItemMeta::default()).unwrap();
        t.insert(v2).unwrap();
        assert_eq!(lines_of(&t, b"k").0, crate::slot_table::MAX_ITEM_LINES);
        // Resizes move slots, words included.
        for i in 0..1000u32 {
            let k = i.to_be_bytes();
            t.insert(StoredValue::new(&k, b"x", ItemMeta::default()).unwrap())
                .unwrap();
        }
        assert_eq!(lines_of(&t, b"k").0, crate::slot_table::MAX_ITEM_LINES);
        let evicted = t.with_entry(b"k", |e| {
            e.committed_mut().expect("there").set_dirty(false);
            e.evict_value()
        });
        assert!(evicted);
        assert_eq!(lines_of(&t, b"k"), (1, 49));
        // The MFU byte and the line count share the word without disturbing each other.
        t.with_entry(b"k", |e| {
            let slot = e.committed_mut().expect("there");
            slot.set_mfu(u8::MAX);
            assert_eq!((slot.prefetch_lines(), slot.mfu()), (1, u8::MAX));
        });
    }

    #[test]
    fn mark_clean_upto_cleans_only_versions_at_or_below_the_persisted_seqno() {
        let t = HashTable::unlimited(4).unwrap();
        let meta = |seqno| ItemMeta {
            by_seqno: epkv_types::Seqno(seqno),
            ..ItemMeta::default()
        };
        t.insert(StoredValue::new(b"a", b"x", meta(5)).unwrap())
            .unwrap();
        t.insert(StoredValue::new(b"b", b"x", meta(9)).unwrap())
            .unwrap();
        assert_eq!(t.stats().dirty, 2);
        // Nothing persisted yet (0) cleans nothing, not even a version at seqno 0.
        let settle = |k: &[u8], p| t.with_entry(k, |e| e.mark_clean_upto(epkv_types::Seqno(p)));
        assert!(!settle(b"a", 0));
        assert!(!settle(b"a", 4));
        assert!(settle(b"a", 5));
        assert!(!settle(b"a", 5), "already clean");
        assert!(!settle(b"b", 8));
        assert!(!settle(b"missing", 100));
        assert_eq!(t.stats().dirty, 1);
        // A clean item can be evicted; the dirty one cannot until it is settled.
        assert!(t.with_entry(b"a", |e| e.evict_value()));
        assert!(!t.with_entry(b"b", |e| e.evict_value()));
        assert!(settle(b"b", 12));
        assert!(t.with_entry(b"b", |e| e.evict_value()));
        assert_eq!(t.stats().dirty, 0);
    }

    /// Whether every stripe's bucket hint says where its committed slots are now.
    fn hints_are_current(t: &HashTable) -> bool {
        t.stripes().iter().enumerate().all(|(i, s)| {
            let inner = s.inner.lock();
            t.bucket_hints[i].load(Ordering::Relaxed) == inner.committed.address_hint()
        })
    }

    #[test]
    fn the_bucket_hints_follow_every_rehash() {
        let t = HashTable::unlimited(4).unwrap();
        assert!(hints_are_current(&t), "all zero while unallocated");
        let keys: Vec<[u8; 4]> = (0..5000u32).map(u32::to_be_bytes).collect();
        let item = |k: &[u8]| StoredValue::new(k, b"x", ItemMeta::default()).unwrap();
        // Growth through `insert` (store) and through an entry.
        for k in &keys[..2500] {
            t.insert(item(k)).unwrap();
        }
        for k in &keys[2500..] {
            t.with_entry(k, |e| e.insert(item(k))).unwrap();
        }
        let grown = t.resizes();
        assert!(grown > 4 && hints_are_current(&t));
        // Shrinks after removals through an entry and through the visitor.
        for k in &keys[..2000] {
            assert!(t.remove(k).is_some());
        }
        let kept: std::collections::HashSet<&[u8]> = keys[4900..].iter().map(|k| &k[..]).collect();
        assert_eq!(t.retain(|sv| kept.contains(sv.key())), 2900);
        assert!(t.resizes() > grown && hints_are_current(&t));
        for k in &keys[4900..] {
            assert!(t.get(k).is_some());
        }
        t.clear();
        assert!(hints_are_current(&t));
        assert!(
            t.bucket_hints
                .iter()
                .all(|h| h.load(Ordering::Relaxed) == 0)
        );
    }

    #[test]
    fn a_lookup_reads_the_front_of_the_table_and_only_writes_read_the_tracker() {
        assert_eq!(HashTable::LOOKUP_BYTES, 40);
        assert_eq!(
            std::mem::size_of::<HashTable>(),
            HashTable::LOOKUP_BYTES + std::mem::size_of::<Arc<MemoryTracker>>()
        );
    }

    #[test]
    fn a_lookup_and_an_insert_touch_only_the_first_two_lines_of_a_stripe() {
        let table = HashTable::unlimited(1).unwrap();
        let stripe = &table.stripes()[0];
        let base = std::ptr::from_ref(stripe) as usize;
        assert_eq!(base % 128, 0, "stripes are line aligned");
        let inner = stripe.inner.lock();
        let end_of = |p: usize, len: usize| p + len - base;
        let prepared = std::ptr::from_ref(&inner.prepared) as usize;
        assert!(end_of(prepared, std::mem::size_of::<SlotTable>()) <= 64);
        let committed = std::ptr::from_ref(&inner.committed) as usize;
        assert!(
            end_of(committed, 16) <= 64,
            "a probe's half of the committed header"
        );
        assert!(end_of(committed, std::mem::size_of::<SlotTable>()) <= 128);
        let initial = std::ptr::from_ref(&inner.mfu.low[usize::from(mfu::INITIAL)]) as usize;
        assert!(
            end_of(initial, 4) <= 128,
            "count of MFU {} at {}",
            mfu::INITIAL,
            initial - base
        );
        assert_eq!(
            std::mem::size_of::<Stripe>(),
            256,
            "the inline counts did not grow a stripe"
        );
    }
}
