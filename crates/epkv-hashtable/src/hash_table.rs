//! [`HashTable`]: a lock-striped concurrent map from key to a committed and a prepared
//! [`StoredValue`]; [`Entry`], the handle through which one key is read and changed
//! atomically; the `find_for_*` lookups.
//!
//! The table is an array of stripes; each stripe is a `parking_lot::Mutex` over two
//! `hashbrown::HashTable<Box<StoredValue>>` (open addressing, SwissTable): one for the
//! committed versions, one for the prepared versions (empty, and unallocated, unless
//! SyncWrites are in flight, so a lookup without prepares never probes it). A key's 64-bit
//! foldhash picks the stripe from bits 20..52; hashbrown uses the low bits for the slot
//! and the top 7 bits for its tag byte, so the three uses do not correlate.
//!
//! Each stripe grows (doubling) and shrinks (to twice its items once it is a quarter
//! full) on its own, under its own lock: a resize stops only that stripe's keys, for as
//! long as it takes to rehash that stripe.

use crate::mfu;
use crate::prefetch::{ValueHint, prefetch_line};
use crate::stats::{MfuHistogram, Props, StripeCounts, TableStats};
use crate::{CommittedState, Error, ItemMeta, MemoryTracker, Result, StoredValue};
use foldhash::fast::RandomState;
use parking_lot::Mutex;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The low 56 bits of a [`Slot`]'s word: the key's tag.
const TAG_BITS: u64 = (1 << 56) - 1;

/// A key's hash as the table uses it: `tag`, 56 bits of the key's foldhash, stored in the
/// key's slot and compared before the key; `probe`, the hash hashbrown is given (it takes
/// the bucket from the low bits and its control byte from the top seven), recomputed from
/// the tag alone when a stripe resizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyHash {
    tag: u64,
    probe: u64,
}

impl KeyHash {
    #[inline]
    fn from_tag(tag: u64) -> Self {
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

/// One occupied bucket: the item's boxed [`StoredValue`], one word holding its key's
/// tag (low 56 bits) and the item's MFU counter (top 8 bits), and a [`ValueHint`] saying
/// where the item's value is.
///
/// - **The tag** lets a resize rehash without reading any item (it would read every boxed
///   item, a cache miss each, to hash its key again) and a lookup compare 56 bits of hash
///   before following the pointer to compare keys.
/// - **The MFU counter** lives here, not in the item, so that a read's bump writes to the
///   slot's cache line, which the lookup has just read, and a read never writes to the
///   item (FindForRead +5% in interleaved runs; see "Lookup cost" in docs/hashtable.md).
///   Everything a read changes is then in this word, which is what a lock-free read
///   would need.
/// - **The value hint** lets a lookup fetch the item and its value at the same time
///   (see [`Slot::is`]). It costs 8 bytes per bucket and saves most of a cache miss
///   per read (`crate::prefetch` has the numbers). It is refreshed whenever the table puts a new
///   version in the slot or ejects its value.
pub(crate) struct Slot {
    word: u64,
    sv: Box<StoredValue>,
    value: ValueHint,
}

impl Slot {
    fn new(hash: KeyHash, sv: StoredValue, mfu: u8) -> Self {
        Self {
            word: hash.tag | (u64::from(mfu) << 56),
            value: sv.value_hint(),
            sv: Box::new(sv),
        }
    }

    /// Puts `sv` in the slot and returns the version it held.
    fn replace(&mut self, sv: StoredValue) -> StoredValue {
        self.value = sv.value_hint();
        std::mem::replace(&mut *self.sv, sv)
    }

    /// The hash hashbrown placed the slot by (the table's hasher for resizes).
    #[inline]
    pub(crate) fn probe_hash(&self) -> u64 {
        KeyHash::from_tag(self.word & TAG_BITS).probe
    }

    /// Whether this slot holds `key`, whose hash is `hash`.
    ///
    /// When the tag matches, the slot almost surely holds the key, and the caller reads
    /// the item next: the item's second cache line and the value's first lines are
    /// prefetched before the key comparison waits for the item's first line, so the
    /// three misses overlap instead of following one another.
    #[inline]
    pub(crate) fn is(&self, hash: KeyHash, key: &[u8]) -> bool {
        if self.word & TAG_BITS != hash.tag {
            return false;
        }
        self.value.prefetch();
        prefetch_line(std::ptr::from_ref::<StoredValue>(&self.sv) as usize + 64);
        self.sv.key() == key
    }

    /// The item's 8-bit MFU (most frequently used) counter.
    #[inline]
    pub(crate) fn mfu(&self) -> u8 {
        (self.word >> 56) as u8
    }

    #[inline]
    pub(crate) fn set_mfu(&mut self, mfu: u8) {
        self.word = (self.word & TAG_BITS) | (u64::from(mfu) << 56);
    }

    /// The item's properties for the statistics, its MFU counter included.
    #[inline]
    pub(crate) fn props(&self) -> Props {
        Props::of(&self.sv, self.mfu())
    }

    fn into_inner(self) -> StoredValue {
        *self.sv
    }
}

impl std::ops::Deref for Slot {
    type Target = StoredValue;

    #[inline]
    fn deref(&self) -> &StoredValue {
        &self.sv
    }
}

impl std::ops::DerefMut for Slot {
    #[inline]
    fn deref_mut(&mut self) -> &mut StoredValue {
        &mut self.sv
    }
}
pub(crate) type RawTable = hashbrown::HashTable<Slot>;

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
/// committed table's header, whose first half (where hashbrown keeps the bucket mask and
/// control pointer a probe needs) is still in the first cache line, then the inline low
/// MFU counts, in the second line with the committed table's item count that an insert
/// updates anyway: one 128-byte aligned pair of lines.
#[derive(Default)]
#[repr(C)]
pub(crate) struct Inner {
    pub(crate) prepared: RawTable,
    pub(crate) committed: RawTable,
    pub(crate) mfu: MfuHistogram,
}

impl Inner {
    fn table_bytes(&self) -> usize {
        fn one(t: &RawTable) -> usize {
            let n = t.num_buckets();
            if n == 0 {
                0
            } else {
                // One slot (tag word, item pointer, value hint) and one control byte
                // per bucket, plus a group of trailing control bytes.
                n * (std::mem::size_of::<Slot>() + 1) + 16
            }
        }
        one(&self.committed) + one(&self.prepared) + self.mfu.heap_bytes()
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
    /// visit is restarted only by growth, which doubles the stripe each time and so
    /// cannot go on for ever.
    pub(crate) visit_paused: AtomicBool,
}

/// State shared by every stripe of one table.
pub(crate) struct Shared {
    /// Random seed per table: a client cannot pick keys that collide on every server.
    build: RandomState,
    /// The bucket-wide tracker every item's footprint is charged to.
    pub(crate) tracker: Arc<MemoryTracker>,
}

impl Shared {
    #[inline]
    pub(crate) fn hash(&self, key: &[u8]) -> KeyHash {
        KeyHash::from_tag(self.build.hash_one(key) >> 8)
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
pub struct HashTable {
    stripes: Box<[Stripe]>,
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

    #[inline]
    fn stripe_index(&self, hash: KeyHash) -> usize {
        // Multiply-shift range reduction of 32 bits: `bits * n >> 32 < n`.
        ((hash.stripe_bits() * self.stripes.len() as u64) >> 32) as usize
    }

    pub(crate) fn stripes(&self) -> &[Stripe] {
        &self.stripes
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Locks `key`'s stripe and runs `f` on the key's [`Entry`] (committed and prepared
    /// versions); whatever `f` reads and changes through the entry happens atomically
    /// with respect to every other access to the key. Keep `f` short: it blocks every key
    /// of the stripe. This is KV-Engine's `findForUpdate`.
    pub fn with_entry<R>(&self, key: &[u8], f: impl FnOnce(&mut Entry<'_>) -> R) -> R {
        let hash = self.shared.hash(key);
        let stripe = &self.stripes[self.stripe_index(hash)];
        let mut inner = stripe.inner.lock();
        let buckets = inner.committed.num_buckets() + inner.prepared.num_buckets();
        let committed = inner
            .committed
            .find_bucket_index(hash.probe, |sv| sv.is(hash, key));
        let prepared = if inner.prepared.is_empty() {
            None
        } else {
            inner
                .prepared
                .find_bucket_index(hash.probe, |sv| sv.is(hash, key))
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
        };
        let r = f(&mut entry);
        let shrink = entry.shrink;
        if shrink && !stripe.visit_paused.load(Ordering::Relaxed) {
            shrink_if_sparse(&mut inner);
        }
        if inner.committed.num_buckets() + inner.prepared.num_buckets() != buckets {
            stripe.counts.count_resize();
        }
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
        let stripe = &self.stripes[self.stripe_index(hash)];
        let mut guard = stripe.inner.lock();
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
            && let Some(p) = inner.prepared.find(hash.probe, |sv| sv.is(hash, key))
            && p.committed_state() == CommittedState::PreparedMaybeVisible
        {
            return Some(f(p));
        }
        let sv = inner
            .committed
            .find_mut(hash.probe, |sv| sv.is(hash, key))?;
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
        let stripe = &self.stripes[self.stripe_index(hash)];
        let inner = stripe.inner.lock();
        if !inner.prepared.is_empty()
            && let Some(p) = inner.prepared.find(hash.probe, |sv| sv.is(hash, key))
            && p.committed_state().is_in_flight()
        {
            return Some(f(p));
        }
        inner
            .committed
            .find(hash.probe, |sv| sv.is(hash, key))
            .map(|sv| f(sv))
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
        let stripe = &self.stripes[self.stripe_index(hash)];
        let mut guard = stripe.inner.lock();
        let inner = &mut *guard;
        let prepared = sv.is_prepared();
        let table = if prepared {
            &mut inner.prepared
        } else {
            &mut inner.committed
        };
        let buckets = table.num_buckets();
        let mut index = table.find_bucket_index(hash.probe, |v| v.is(hash, sv.key()));
        if mode == Store::ReplaceLive
            && index
                .and_then(|i| table.get_bucket(i))
                .is_none_or(|v| v.is_deleted())
        {
            return Err(Error::NotFound);
        }
        let r = insert_into(
            table,
            &mut inner.mfu,
            &mut index,
            &stripe.counts,
            &self.shared,
            hash,
            sv,
        );
        if table.num_buckets() != buckets {
            stripe.counts.count_resize();
        }
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
        for s in self.stripes.iter() {
            let mut inner = s.inner.lock();
            let inner = &mut *inner;
            for sv in inner.committed.drain().chain(inner.prepared.drain()) {
                let p = sv.props();
                self.shared.tracker.release(p.footprint());
                s.counts.apply(Some(&p), None);
                inner.mfu.apply(p.evictable_mfu, None);
                if sv.is_committed() {
                    removed += 1;
                }
            }
            let before = inner.committed.num_buckets() + inner.prepared.num_buckets();
            inner.committed.shrink_to(0, Slot::probe_hash);
            inner.prepared.shrink_to(0, Slot::probe_hash);
            if before != 0 {
                s.counts.count_resize();
            }
        }
        removed
    }
}

/// Bumps a live resident item's MFU counter probabilistically, moving it in the
/// histogram.
#[inline]
pub(crate) fn bump_mfu(sv: &mut Slot, hist: &mut MfuHistogram) {
    let c = sv.mfu();
    let n = mfu::next_on_access(c);
    sv.set_mfu(n);
    if sv.is_resident() && sv.is_committed() && !sv.is_deleted() {
        hist.shift(c, n);
    }
}

/// Shrinks a stripe's tables that are under a quarter full to about half full.
pub(crate) fn shrink_if_sparse(inner: &mut Inner) {
    for t in [&mut inner.committed, &mut inner.prepared] {
        let buckets = t.num_buckets();
        if buckets > MIN_SHRINK_BUCKETS && t.len() * 4 < buckets {
            t.shrink_to(t.len() * 2, Slot::probe_hash);
        }
    }
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
            .and_then(|i| self.inner.committed.get_bucket(i))
            .map(|b| &**b)
    }

    /// Returns the prepared version, if any.
    #[must_use]
    pub fn prepared(&self) -> Option<&StoredValue> {
        self.prepared
            .and_then(|i| self.inner.prepared.get_bucket(i))
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
        self.committed
            .and_then(|i| self.inner.committed.get_bucket_mut(i))
    }

    /// Returns the committed version's MFU counter (tombstones included), if there is a
    /// committed version. The table keeps the counter beside the item, not in it.
    #[must_use]
    pub fn mfu(&self) -> Option<u8> {
        self.committed
            .and_then(|i| self.inner.committed.get_bucket(i))
            .map(Slot::mfu)
    }

    /// Returns the committed version's metadata for in-place change (tombstones
    /// included). Key, value and state cannot change this way.
    pub fn meta_mut(&mut self) -> Option<&mut ItemMeta> {
        self.committed_mut().map(|slot| slot.sv.meta_mut())
    }

    /// Returns the prepared version's metadata for in-place change.
    pub fn prepared_meta_mut(&mut self) -> Option<&mut ItemMeta> {
        self.prepared
            .and_then(|i| self.inner.prepared.get_bucket_mut(i))
            .map(|b| b.meta_mut())
    }

    /// Counts a client reference to the live committed version (MFU bump).
    pub fn track_reference(&mut self) {
        let Some(i) = self.committed else { return };
        if let Some(sv) = self.inner.committed.get_bucket_mut(i)
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
        let shared = self.shared;
        let counts = self.counts;
        let inner = &mut *self.inner;
        insert_into(
            &mut inner.committed,
            &mut inner.mfu,
            &mut self.committed,
            counts,
            shared,
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
            counts,
            shared,
            self.hash,
            sv,
        )
    }

    /// Removes and returns the committed version (live or tombstone), if any.
    pub fn remove(&mut self) -> Option<StoredValue> {
        let index = self.committed.take()?;
        let (sv, _) = self.inner.committed.get_bucket_entry(index).ok()?.remove();
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
        let (sv, _) = self.inner.prepared.get_bucket_entry(index).ok()?.remove();
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
    /// # Errors
    /// [`Error::NotFound`] when there is no prepare; [`Error::QuotaExceeded`] as for
    /// [`Self::insert`] (nothing changes).
    pub fn commit_prepared(&mut self, meta: ItemMeta) -> Result<Option<StoredValue>> {
        let committed = self
            .prepared()
            .ok_or(Error::NotFound)?
            .clone()
            .with_state(CommittedState::CommittedViaPrepare)
            .with_meta(meta);
        let old = self.insert(committed)?;
        self.remove_prepared();
        Ok(old)
    }

    /// Marks the committed version clean if it is still the version with `by_seqno`
    /// (the flusher persisted it); returns whether it did.
    pub fn mark_clean(&mut self, by_seqno: epkv_types::Seqno) -> bool {
        let counts = self.counts;
        match self.committed_mut() {
            Some(sv) if sv.meta().by_seqno == by_seqno && sv.is_dirty() => {
                let before = sv.props();
                sv.set_dirty(false);
                counts.apply(Some(&before), Some(&sv.props()));
                true
            }
            _ => false,
        }
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
        let Some(sv) = inner.committed.get_bucket_mut(i) else {
            return false;
        };
        evict(sv, counts, shared, &mut inner.mfu)
    }
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
    sv.value = ValueHint::default();
    let after = sv.props();
    shared
        .tracker
        .release(before.footprint() - after.footprint());
    counts.apply(Some(&before), Some(&after));
    hist.apply(before.evictable_mfu, after.evictable_mfu);
    true
}

/// Inserts or overwrites one version in `table` at `index`, keeping the accounting.
fn insert_into(
    table: &mut RawTable,
    hist: &mut MfuHistogram,
    index: &mut Option<usize>,
    counts: &StripeCounts,
    shared: &Shared,
    hash: KeyHash,
    sv: StoredValue,
) -> Result<Option<StoredValue>> {
    if let Some(slot) = index.and_then(|i| table.get_bucket_mut(i)) {
        let mfu = mfu::next_on_access(slot.mfu());
        let before = slot.props();
        let after = Props::of(&sv, mfu);
        shared.recharge(before.footprint(), after.footprint())?;
        counts.apply(Some(&before), Some(&after));
        hist.apply(before.evictable_mfu, after.evictable_mfu);
        slot.set_mfu(mfu);
        return Ok(Some(slot.replace(sv)));
    }
    let after = Props::of(&sv, mfu::INITIAL);
    shared.tracker.try_charge(after.footprint())?;
    counts.apply(None, Some(&after));
    hist.apply(None, after.evictable_mfu);
    let slot = Slot::new(hash, sv, mfu::INITIAL);
    let occupied = table.insert_unique(hash.probe, slot, Slot::probe_hash);
    *index = Some(occupied.bucket_index());
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
    fn tags_spread_over_buckets_and_control_bytes() {
        // The probe hash is a one-to-one map of the tag: distinct tags never collide, and
        // both the bucket bits and hashbrown's 7-bit control byte take every value.
        let t = HashTable::unlimited(1).unwrap();
        let hashes: Vec<KeyHash> = (0..4096)
            .map(|i| t.shared().hash(format!("key{i}").as_bytes()))
            .collect();
        let buckets: std::collections::HashSet<u64> =
            hashes.iter().map(|h| h.probe & 1023).collect();
        let tags: std::collections::HashSet<u64> = hashes.iter().map(|h| h.probe >> 57).collect();
        assert!(buckets.len() > 900, "{} of 1024 buckets", buckets.len());
        assert_eq!(tags.len(), 128);
        // A resize places a slot by the probe hash it recomputes from its word: that must
        // be the probe the key was inserted with, whatever its MFU byte holds.
        for h in &hashes {
            assert_eq!(h.tag >> 56, 0);
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

    fn hint_of(t: &HashTable, key: &[u8]) -> (ValueHint, ValueHint) {
        t.with_entry(key, |e| {
            let slot = e.committed_mut().expect("the key is there");
            (slot.value, slot.sv.value_hint())
        })
    }

    #[test]
    fn the_slots_value_hint_follows_every_new_version_and_eviction() {
        let t = HashTable::unlimited(1).unwrap();
        let v1 = StoredValue::new(b"k", &[1; 100], ItemMeta::default()).unwrap();
        t.insert(v1).unwrap();
        let (hint, actual) = hint_of(&t, b"k");
        assert_eq!(hint, actual);
        assert_ne!(hint, ValueHint::default());
        // Overwrites replace the item in place; the hint must move with the value.
        let v2 = StoredValue::new(b"k", &[2; 700], ItemMeta::default()).unwrap();
        t.insert(v2).unwrap();
        let (hint2, actual) = hint_of(&t, b"k");
        assert_eq!(hint2, actual);
        assert_ne!(hint2, hint);
        // Resizes move slots, hints included.
        for i in 0..1000u32 {
            let k = i.to_be_bytes();
            t.insert(StoredValue::new(&k, b"x", ItemMeta::default()).unwrap())
                .unwrap();
        }
        assert_eq!(hint_of(&t, b"k").0, hint2);
        let evicted = t.with_entry(b"k", |e| {
            e.committed_mut().expect("there").sv.set_dirty(false);
            e.evict_value()
        });
        assert!(evicted);
        assert_eq!(
            hint_of(&t, b"k"),
            (ValueHint::default(), ValueHint::default())
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
        assert!(end_of(prepared, std::mem::size_of::<RawTable>()) <= 64);
        let committed = std::ptr::from_ref(&inner.committed) as usize;
        assert!(
            end_of(committed, 16) <= 64,
            "a probe's half of the committed header"
        );
        assert!(end_of(committed, std::mem::size_of::<RawTable>()) <= 128);
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
