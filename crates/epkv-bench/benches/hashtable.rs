//! Hash-table benchmarks (seed 003, KV-Engine's HashTableBench), epkv and its peers side
//! by side in one run.
//!
//! `cargo bench -p epkv-bench --bench hashtable -- [--quick] [--threads 1,2]
//!  [--items 100000] [--stripes 64] [FindForRead|FindForWrite|Insert|Replace|Delete|GetValue|Resize|Memory]`
//!
//! One shared table; each thread owns `--items` keys (`k<thread>:<i>`, under 20 bytes) with
//! 8-byte values (512-byte for GetValue), and every timed pass visits exactly its item set
//! once. items/s = all threads' operations / the threads' mean wall time of the pass (also
//! printed per thread).
//!
//! - **FindForRead** (0% and 50% of the keys present only as a prepared SyncWrite, which a
//!   reader must not see): epkv `find_for_read` with an MFU bump; peers `get` and a check
//!   of the item's "prepared" flag.
//! - **FindForWrite** (0% / 50%): epkv `find_for_write` (the prepare if any); peers `get`.
//! - **Insert**: new keys into a map built (untimed) for each pass, so every implementation
//!   starts with no capacity and grows as it fills. (Until 2026-11-24 the map was cleared
//!   instead: papaya cannot shrink, so its later passes filled the arrays grown by the
//!   first, about 1.4x faster than a new papaya map, while epkv, dashmap and
//!   `Mutex<HashMap>` shrank on clear and grew again.)
//! - **Replace**: overwrite existing keys (epkv `replace`; peers `get_mut` and assign, or
//!   papaya's `insert`).
//! - **Delete**: remove keys; the table is repopulated (untimed) before each pass.
//! - **GetValue**: as a GET reply is built: look the key up (epkv `find_for_read` with an
//!   MFU bump) and copy its 512-byte value into a reply buffer while the map still guards
//!   it. The table holds 512-byte values for this one.
//! - **Resize**: one thread fills an empty table with `threads x items` keys timing every
//!   insert, then empties it timing every remove: the longest single call is the longest
//!   pause a resize (grow or shrink) imposed on a caller.
//! - **Memory**: bytes per item for 20-byte keys and 512-byte values, counted by a global
//!   allocator that wraps mimalloc (the server's allocator) and adds up `mi_usable_size`
//!   of every live block, so allocator size-class rounding is included; once with
//!   mimalloc called as `mimalloc::MiMalloc` calls it, once with `mi_malloc` for small
//!   alignments (see `PLAIN_SMALL`).
//!
//! - **floor** (with the two lookups only; not a peer and not in "best peer"): hash the
//!   key and read one 16-byte slot of a flat array at the hash's position, nothing else.
//!   No map can look a key up with less memory traffic, so its rate bounds every peer's;
//!   the output says what multiple of it 1.5x the best peer would be.
//!
//! - **sketch-lockfree**, **sketch-lockfree-mfu** (with the two lookups only; not peers):
//!   the lock-free table epkv would need for papaya-like reads, cut down to a read's cost
//!   (atomic 16-byte slots, a `seize` guard per lookup, no lock), without and with the MFU
//!   bump `find_read` must make (a compare-and-swap on the slot word); see [`Sketch`]. They
//!   show what such a redesign could gain before building it.
//!
//! Peers: `Mutex<std::collections::HashMap>`, `dashmap` (as many shards as epkv has
//! stripes) and `papaya`, all keyed by `Box<[u8]>`, storing the same metadata (`ItemMeta`),
//! the value as `Bytes` and a "prepared" flag, and all hashing with
//! `foldhash::fast::RandomState`, the hash epkv uses.

use bytes::Bytes;
use epkv_bench::harness::{Args, Report, Row, median, rate};
use epkv_executor::{Clock, SystemClock};
use epkv_hashtable::{
    CommittedState, HashTable, ItemMeta, StoredValue, TrackReference, WantsDeleted,
};
use epkv_types::Cas;
use std::alloc::{GlobalAlloc, Layout};
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::time::Duration;

type Hasher = foldhash::fast::RandomState;

// ------------------------------------------------------------------ allocator accounting

/// mimalloc, counting the usable size of every live block.
struct CountingMimalloc;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

/// Counting is on only while the Memory benchmark runs, so the timed benchmarks pay
/// nothing but one relaxed load per allocation.
static COUNTING: AtomicBool = AtomicBool::new(false);

fn counting() -> bool {
    COUNTING.load(Ordering::Relaxed)
}

/// When set, blocks with an alignment of at most 8 come from `mi_malloc` instead of
/// `mi_malloc_aligned` (what `mimalloc::MiMalloc` always calls). mimalloc 3's aligned path
/// falls back to over-allocating `size + align - 1` whenever its current page for that
/// size class is exhausted, unless the size class is a power of two, so a 96-byte
/// `Box<StoredValue>` mostly lands in the 112-byte class. Every mimalloc block is
/// 8-byte aligned, so the plain call is enough for such layouts.
static PLAIN_SMALL: AtomicBool = AtomicBool::new(false);

/// Allocates as `MiMalloc` does, or through `mi_malloc` under [`PLAIN_SMALL`].
///
/// # Safety
/// As [`GlobalAlloc::alloc`].
unsafe fn mi_alloc(layout: Layout, zero: bool) -> *mut u8 {
    if PLAIN_SMALL.load(Ordering::Relaxed) && layout.align() <= 8 {
        // SAFETY: mimalloc returns 8-aligned blocks of at least `size` bytes (or null).
        unsafe {
            if zero {
                libmimalloc_sys::mi_zalloc(layout.size()).cast()
            } else {
                libmimalloc_sys::mi_malloc(layout.size()).cast()
            }
        }
    } else if zero {
        // SAFETY: forwarded with the caller's layout.
        unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
    } else {
        // SAFETY: forwarded with the caller's layout.
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }
}

// SAFETY: every call forwards to mimalloc with the caller's arguments; the counter only
// reads the usable size of a block mimalloc just returned or is about to free.
unsafe impl GlobalAlloc for CountingMimalloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { mi_alloc(layout, false) };
        if counting() && !p.is_null() {
            // SAFETY: `p` is a live mimalloc block.
            let n = unsafe { libmimalloc_sys::mi_usable_size(p.cast()) };
            LIVE_BYTES.fetch_add(n as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if counting() {
            // SAFETY: `ptr` is a live mimalloc block (the caller's contract).
            let n = unsafe { libmimalloc_sys::mi_usable_size(ptr.cast()) };
            LIVE_BYTES.fetch_sub(n as isize, Ordering::Relaxed);
        }
        // SAFETY: forwarded with the caller's arguments.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { mi_alloc(layout, true) };
        if counting() && !p.is_null() {
            // SAFETY: `p` is a live mimalloc block.
            let n = unsafe { libmimalloc_sys::mi_usable_size(p.cast()) };
            LIVE_BYTES.fetch_add(n as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let on = counting();
        // SAFETY: `ptr` is a live mimalloc block (the caller's contract).
        let old = if on {
            unsafe { libmimalloc_sys::mi_usable_size(ptr.cast()) }
        } else {
            0
        };
        // SAFETY: forwarded with the caller's arguments.
        let p = unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) };
        if on && !p.is_null() {
            // SAFETY: `p` is a live mimalloc block.
            let n = unsafe { libmimalloc_sys::mi_usable_size(p.cast()) };
            LIVE_BYTES.fetch_add(n as isize, Ordering::Relaxed);
            LIVE_BYTES.fetch_sub(old as isize, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: CountingMimalloc = CountingMimalloc;

// ------------------------------------------------------------------ the maps under test

/// What a peer stores per key: the same metadata epkv keeps, the value, and whether the
/// key is only a prepared SyncWrite (invisible to readers).
#[derive(Clone)]
struct PeerItem {
    meta: ItemMeta,
    value: Bytes,
    prepared: bool,
}

fn peer_item(value: &[u8], cas: u64, prepared: bool) -> PeerItem {
    PeerItem {
        meta: ItemMeta {
            cas: Cas(cas),
            ..ItemMeta::default()
        },
        value: Bytes::copy_from_slice(value),
        prepared,
    }
}

/// The operations every implementation offers, as the benchmark uses them.
trait Map: Send + Sync {
    fn name(&self) -> &'static str;
    fn set(&self, key: &[u8], value: &[u8], cas: u64, prepared: bool);
    /// Committed only; epkv bumps the MFU counter.
    fn find_read(&self, key: &[u8]) -> Option<u64>;
    /// The prepare if any, else the committed version.
    fn find_write(&self, key: &[u8]) -> Option<u64>;
    /// A shared handle to the committed value, as a GET hands it out.
    fn read_value(&self, key: &[u8]) -> Option<Bytes>;
    /// Appends the committed value to `out` while the map still guards it, as the server
    /// writes a GET reply; false when the key is absent.
    fn copy_value(&self, key: &[u8], out: &mut Vec<u8>) -> bool;
    fn replace(&self, key: &[u8], value: &[u8], cas: u64) -> bool;
    fn delete(&self, key: &[u8]) -> bool;
    fn clear(&self);
    /// Something that changes whenever the map resizes (a resize count or a capacity),
    /// read outside the timed calls; `None` when the map has no such figure.
    fn resize_marker(&self) -> Option<usize>;
}

/// The item epkv (and the design sketches) store for a `set`: the value, CAS `cas`, and
/// for a prepared key a pending SyncWrite. `None` only for a key too long to store.
fn stored_value(key: &[u8], value: &[u8], cas: u64, prepared: bool) -> Option<StoredValue> {
    let meta = ItemMeta {
        cas: Cas(cas),
        ..ItemMeta::default()
    };
    let sv = StoredValue::new(key, value, meta).ok()?;
    Some(if prepared {
        sv.with_state(CommittedState::Pending)
    } else {
        sv
    })
}

struct Epkv(HashTable);

impl Map for Epkv {
    fn name(&self) -> &'static str {
        "epkv"
    }
    fn set(&self, key: &[u8], value: &[u8], cas: u64, prepared: bool) {
        if let Some(sv) = stored_value(key, value, cas, prepared) {
            let _ = self.0.insert(sv);
        }
    }
    fn find_read(&self, key: &[u8]) -> Option<u64> {
        self.0
            .find_for_read(key, TrackReference::Yes, WantsDeleted::No, |sv| {
                sv.meta().cas.0
            })
    }
    fn find_write(&self, key: &[u8]) -> Option<u64> {
        self.0.find_for_write(key, |sv| sv.meta().cas.0)
    }
    fn read_value(&self, key: &[u8]) -> Option<Bytes> {
        self.0
            .find_for_read(key, TrackReference::Yes, WantsDeleted::No, |sv| {
                sv.value_bytes()
            })
    }
    fn copy_value(&self, key: &[u8], out: &mut Vec<u8>) -> bool {
        self.0
            .find_for_read(key, TrackReference::Yes, WantsDeleted::No, |sv| {
                out.extend_from_slice(sv.value());
            })
            .is_some()
    }
    fn replace(&self, key: &[u8], value: &[u8], cas: u64) -> bool {
        stored_value(key, value, cas, false).is_some_and(|sv| self.0.replace(sv).is_ok())
    }
    fn delete(&self, key: &[u8]) -> bool {
        self.0.remove(key).is_some()
    }
    fn clear(&self) {
        self.0.clear();
    }
    fn resize_marker(&self) -> Option<usize> {
        Some(self.0.resizes())
    }
}

struct StdMutex(parking_lot::Mutex<HashMap<Box<[u8]>, PeerItem, Hasher>>);

impl Map for StdMutex {
    fn name(&self) -> &'static str {
        "mutex-hashmap"
    }
    fn set(&self, key: &[u8], value: &[u8], cas: u64, prepared: bool) {
        self.0
            .lock()
            .insert(key.into(), peer_item(value, cas, prepared));
    }
    fn find_read(&self, key: &[u8]) -> Option<u64> {
        let m = self.0.lock();
        m.get(key).filter(|v| !v.prepared).map(|v| v.meta.cas.0)
    }
    fn find_write(&self, key: &[u8]) -> Option<u64> {
        self.0.lock().get(key).map(|v| v.meta.cas.0)
    }
    fn read_value(&self, key: &[u8]) -> Option<Bytes> {
        self.0.lock().get(key).map(|v| v.value.clone())
    }
    fn copy_value(&self, key: &[u8], out: &mut Vec<u8>) -> bool {
        let m = self.0.lock();
        m.get(key)
            .map(|v| out.extend_from_slice(&v.value))
            .is_some()
    }
    fn replace(&self, key: &[u8], value: &[u8], cas: u64) -> bool {
        let item = peer_item(value, cas, false);
        match self.0.lock().get_mut(key) {
            Some(v) => {
                *v = item;
                true
            }
            None => false,
        }
    }
    fn delete(&self, key: &[u8]) -> bool {
        self.0.lock().remove(key).is_some()
    }
    fn clear(&self) {
        let mut m = self.0.lock();
        m.clear();
        m.shrink_to_fit();
    }
    fn resize_marker(&self) -> Option<usize> {
        Some(self.0.lock().capacity())
    }
}

struct Dash(dashmap::DashMap<Box<[u8]>, PeerItem, Hasher>);

impl Map for Dash {
    fn name(&self) -> &'static str {
        "dashmap"
    }
    fn set(&self, key: &[u8], value: &[u8], cas: u64, prepared: bool) {
        self.0.insert(key.into(), peer_item(value, cas, prepared));
    }
    fn find_read(&self, key: &[u8]) -> Option<u64> {
        self.0
            .get(key)
            .filter(|v| !v.prepared)
            .map(|v| v.meta.cas.0)
    }
    fn find_write(&self, key: &[u8]) -> Option<u64> {
        self.0.get(key).map(|v| v.meta.cas.0)
    }
    fn read_value(&self, key: &[u8]) -> Option<Bytes> {
        self.0.get(key).map(|v| v.value.clone())
    }
    fn copy_value(&self, key: &[u8], out: &mut Vec<u8>) -> bool {
        self.0
            .get(key)
            .map(|v| out.extend_from_slice(&v.value))
            .is_some()
    }
    fn replace(&self, key: &[u8], value: &[u8], cas: u64) -> bool {
        let item = peer_item(value, cas, false);
        match self.0.get_mut(key) {
            Some(mut v) => {
                *v = item;
                true
            }
            None => false,
        }
    }
    fn delete(&self, key: &[u8]) -> bool {
        self.0.remove(key).is_some()
    }
    fn clear(&self) {
        self.0.clear();
        self.0.shrink_to_fit();
    }
    fn resize_marker(&self) -> Option<usize> {
        Some(self.0.capacity())
    }
}

struct Papaya(papaya::HashMap<Box<[u8]>, PeerItem, Hasher>);

impl Map for Papaya {
    fn name(&self) -> &'static str {
        "papaya"
    }
    fn set(&self, key: &[u8], value: &[u8], cas: u64, prepared: bool) {
        self.0
            .pin()
            .insert(key.into(), peer_item(value, cas, prepared));
    }
    fn find_read(&self, key: &[u8]) -> Option<u64> {
        let m = self.0.pin();
        m.get(key).filter(|v| !v.prepared).map(|v| v.meta.cas.0)
    }
    fn find_write(&self, key: &[u8]) -> Option<u64> {
        self.0.pin().get(key).map(|v| v.meta.cas.0)
    }
    fn read_value(&self, key: &[u8]) -> Option<Bytes> {
        self.0.pin().get(key).map(|v| v.value.clone())
    }
    fn copy_value(&self, key: &[u8], out: &mut Vec<u8>) -> bool {
        let m = self.0.pin();
        m.get(key)
            .map(|v| out.extend_from_slice(&v.value))
            .is_some()
    }
    fn replace(&self, key: &[u8], value: &[u8], cas: u64) -> bool {
        let m = self.0.pin();
        if m.contains_key(key) {
            m.insert(key.into(), peer_item(value, cas, false));
            true
        } else {
            false
        }
    }
    fn delete(&self, key: &[u8]) -> bool {
        self.0.pin().remove(key).is_some()
    }
    fn clear(&self) {
        self.0.pin().clear();
    }
    fn resize_marker(&self) -> Option<usize> {
        // papaya resizes incrementally and exposes no capacity.
        None
    }
}

/// The [`Map`] methods of the floor and the design sketches besides the lookups: `main`
/// runs those with `FindForRead` and `FindForWrite` only, so nothing else may reach them.
macro_rules! lookups_only {
    ($what:literal) => {
        fn read_value(&self, _key: &[u8]) -> Option<Bytes> {
            unreachable!(concat!($what, " only runs the lookups"))
        }
        fn copy_value(&self, _key: &[u8], _out: &mut Vec<u8>) -> bool {
            unreachable!(concat!($what, " only runs the lookups"))
        }
        fn replace(&self, _key: &[u8], _value: &[u8], _cas: u64) -> bool {
            unreachable!(concat!($what, " only runs the lookups"))
        }
        fn delete(&self, _key: &[u8]) -> bool {
            unreachable!(concat!($what, " only runs the lookups"))
        }
        fn resize_marker(&self) -> Option<usize> {
            unreachable!(concat!($what, " only runs the lookups"))
        }
    };
}

/// A lower bound, not a map: what any hash-indexed lookup must at least do here. The key
/// is hashed (foldhash, as everywhere) and one 16-byte slot of a flat array sized like a
/// table for every benchmark key (two slots per key) is read at the hash's position; no
/// probing, key comparison, lock, guard or metadata. Lookups are independent, so the CPU
/// overlaps their memory accesses as far as it can: its rate is the most this machine's
/// caches and memory deliver for one random slot read per key, a ceiling for every peer.
struct Floor {
    build: Hasher,
    /// Each slot: the hash written there, and the CAS.
    slots: Box<[[std::sync::atomic::AtomicU64; 2]]>,
    mask: usize,
}

impl Floor {
    fn new(keys: usize) -> Self {
        let n = (keys * 2).next_power_of_two();
        Self {
            build: Hasher::default(),
            slots: (0..n).map(|_| Default::default()).collect(),
            mask: n - 1,
        }
    }

    /// The key's hash and its slot (picked by the hash's low bits).
    #[inline]
    fn slot(&self, key: &[u8]) -> (u64, &[std::sync::atomic::AtomicU64; 2]) {
        use std::hash::BuildHasher;
        let h = self.build.hash_one(key);
        (h, &self.slots[h as usize & self.mask])
    }

    /// Reads the key's slot: the stored CAS when the slot's hash is the key's.
    #[inline]
    fn read(&self, key: &[u8]) -> Option<u64> {
        let (h, [tag, cas]) = self.slot(key);
        (tag.load(Ordering::Relaxed) == h).then(|| cas.load(Ordering::Relaxed))
    }
}

impl Map for Floor {
    fn name(&self) -> &'static str {
        "floor"
    }
    fn set(&self, key: &[u8], _value: &[u8], cas: u64, _prepared: bool) {
        let (h, [tag, stored]) = self.slot(key);
        tag.store(h, Ordering::Relaxed);
        stored.store(cas, Ordering::Relaxed);
    }
    fn find_read(&self, key: &[u8]) -> Option<u64> {
        self.read(key)
    }
    fn find_write(&self, key: &[u8]) -> Option<u64> {
        self.read(key)
    }
    lookups_only!("the floor");
    fn clear(&self) {
        for s in self.slots.iter().flatten() {
            s.store(0, Ordering::Relaxed);
        }
    }
}

/// A design sketch, not a peer and not epkv (like the floor: lookups only, never the
/// "best peer"): the lock-free table epkv would need for papaya-like reads, cut down to
/// what a read costs. 64 stripes of 16-byte slots (the key's 56-bit tag with an 8-bit MFU
/// counter in one word, and a pointer to the boxed [`StoredValue`]), linear probing, no
/// resize (sized for the run's keys at a load of about 3/4), writers under the
/// stripe's mutex, readers with no lock: a `seize` guard per lookup, as papaya takes,
/// then atomic loads. With `mfu`, `find_read` bumps the counter as epkv must
/// (probability 1/(1 + 0.012 c^2)) with a compare-and-swap on the slot word, the only
/// update a lock-free reader could make without clobbering a concurrent writer's word.
/// Items are freed only by `clear` and `drop`, which the harness calls while no lookup
/// runs, so the guard is never needed for safety here: it is taken only for its cost.
struct Sketch {
    build: Hasher,
    stripes: Box<[SketchStripe]>,
    mfu: bool,
    collector: seize::Collector,
}

struct SketchStripe {
    lock: parking_lot::Mutex<()>,
    slots: Box<[SketchSlot]>,
}

#[derive(Default)]
struct SketchSlot {
    /// 0 when empty, else the tag (low 56 bits, never 0) and the MFU counter (top 8).
    word: std::sync::atomic::AtomicU64,
    item: std::sync::atomic::AtomicPtr<StoredValue>,
}

const SKETCH_TAG: u64 = (1 << 56) - 1;

impl Sketch {
    fn new(keys: usize, mfu: bool) -> Self {
        const STRIPES: usize = 64;
        // Load about 3/4 (like hashbrown's stripes when full): as many bytes of slot
        // array per key as epkv's table.
        let per = (keys * 4 / 3 / STRIPES + 16).next_power_of_two();
        Self {
            build: Hasher::default(),
            stripes: (0..STRIPES)
                .map(|_| SketchStripe {
                    lock: parking_lot::Mutex::new(()),
                    slots: (0..per).map(|_| SketchSlot::default()).collect(),
                })
                .collect(),
            mfu,
            collector: seize::Collector::new(),
        }
    }

    /// The key's tag (never 0), its stripe and its first slot there.
    #[inline]
    fn place(&self, key: &[u8]) -> (u64, &SketchStripe, usize) {
        use std::hash::BuildHasher;
        let h = self.build.hash_one(key);
        let tag = (h & SKETCH_TAG).max(1);
        let stripe = &self.stripes[((h >> 56) as usize) % self.stripes.len()];
        (tag, stripe, (h >> 20) as usize & (stripe.slots.len() - 1))
    }

    /// Runs `f` on the item stored under `key`, lock-free.
    #[inline]
    fn find<R>(&self, key: &[u8], bump: bool, f: impl FnOnce(&StoredValue) -> R) -> Option<R> {
        let _guard = self.collector.enter();
        let (tag, stripe, mut i) = self.place(key);
        let mask = stripe.slots.len() - 1;
        loop {
            let slot = &stripe.slots[i];
            let w = slot.word.load(Ordering::Acquire);
            if w == 0 {
                return None;
            }
            if w & SKETCH_TAG == tag {
                let p = slot.item.load(Ordering::Acquire);
                // SAFETY: a slot's item is written before its word (release) and freed
                // only by `clear`/`drop`, never while a lookup runs (see the type docs).
                let sv = unsafe { &*p };
                if sv.key() == key {
                    if bump && !sv.is_prepared() {
                        let c = (w >> 56) as u8;
                        let n = epkv_hashtable::mfu::next_on_access(c);
                        if n != c {
                            let new = (w & SKETCH_TAG) | (u64::from(n) << 56);
                            let _ = slot.word.compare_exchange(
                                w,
                                new,
                                Ordering::Relaxed,
                                Ordering::Relaxed,
                            );
                        }
                    }
                    return Some(f(sv));
                }
            }
            i = (i + 1) & mask;
        }
    }
}

impl Map for Sketch {
    fn name(&self) -> &'static str {
        if self.mfu {
            "sketch-lockfree-mfu"
        } else {
            "sketch-lockfree"
        }
    }
    fn set(&self, key: &[u8], value: &[u8], cas: u64, prepared: bool) {
        let Some(sv) = stored_value(key, value, cas, prepared) else {
            return;
        };
        let (tag, stripe, mut i) = self.place(key);
        let mask = stripe.slots.len() - 1;
        let _locked = stripe.lock.lock();
        for _ in 0..stripe.slots.len() {
            let slot = &stripe.slots[i];
            let w = slot.word.load(Ordering::Relaxed);
            if w == 0 {
                slot.item
                    .store(Box::into_raw(Box::new(sv)), Ordering::Relaxed);
                let initial = u64::from(epkv_hashtable::mfu::INITIAL) << 56;
                slot.word.store(tag | initial, Ordering::Release);
                return;
            }
            i = (i + 1) & mask;
        }
        unreachable!("the sketch is sized for every benchmark key");
    }
    fn find_read(&self, key: &[u8]) -> Option<u64> {
        self.find(key, self.mfu, |sv| {
            (!sv.is_prepared()).then_some(sv.meta().cas.0)
        })
        .flatten()
    }
    fn find_write(&self, key: &[u8]) -> Option<u64> {
        self.find(key, false, |sv| sv.meta().cas.0)
    }
    lookups_only!("a sketch");
    fn clear(&self) {
        for stripe in self.stripes.iter() {
            let _locked = stripe.lock.lock();
            for slot in stripe.slots.iter() {
                slot.word.store(0, Ordering::Relaxed);
                let p = slot.item.swap(std::ptr::null_mut(), Ordering::Relaxed);
                if !p.is_null() {
                    // SAFETY: `p` came from `Box::into_raw` in `set` and was just taken out
                    // of its slot; no lookup runs during `clear` (see the type docs).
                    drop(unsafe { Box::from_raw(p) });
                }
            }
        }
    }
}

impl Drop for Sketch {
    fn drop(&mut self) {
        self.clear();
    }
}

fn make(name: &str, stripes: usize) -> Box<dyn Map> {
    match name {
        "epkv" => match HashTable::unlimited(stripes) {
            Ok(t) => Box::new(Epkv(t)),
            Err(e) => {
                eprintln!("cannot create the table: {e}");
                std::process::exit(2);
            }
        },
        "mutex-hashmap" => Box::new(StdMutex(parking_lot::Mutex::new(HashMap::with_hasher(
            Hasher::default(),
        )))),
        "dashmap" => Box::new(Dash(dashmap::DashMap::with_hasher_and_shard_amount(
            Hasher::default(),
            stripes.next_power_of_two().max(2),
        ))),
        _ => Box::new(Papaya(papaya::HashMap::with_hasher(Hasher::default()))),
    }
}

const IMPLS: [&str; 4] = ["epkv", "mutex-hashmap", "dashmap", "papaya"];

// ------------------------------------------------------------------ timed passes

/// This thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`): unlike wall time it does not grow
/// while the thread is preempted, which on a shared two-core machine is most of the noise.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// The best pass of one benchmark run.
#[derive(Clone, Default)]
struct PassRate {
    /// All threads' ops / mean thread wall time.
    wall: f64,
    /// All threads' ops / mean thread CPU time (ops per CPU-second, times threads).
    cpu: f64,
    /// Per-thread wall rates.
    per_thread: Vec<f64>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Bench {
    FindForRead,
    FindForWrite,
    Insert,
    Replace,
    Delete,
    GetValue,
}

impl Bench {
    fn name(self) -> &'static str {
        match self {
            Self::FindForRead => "FindForRead",
            Self::FindForWrite => "FindForWrite",
            Self::Insert => "Insert",
            Self::Replace => "Replace",
            Self::Delete => "Delete",
            Self::GetValue => "GetValue",
        }
    }
}

fn keys_of(thread: usize, items: usize) -> Vec<Vec<u8>> {
    (0..items)
        .map(|i| format!("k{thread}:{i}").into_bytes())
        .collect()
}

const VALUE: &[u8] = b"value-08";
/// The value `GetValue` stores and copies out: the front-end benchmark's size.
const GET_VALUE: &[u8] = &[b'v'; 512];

/// Runs `passes` timed passes of `bench` over every thread's keys; returns the best pass's
/// operations per second of all threads (ops / mean thread time) and per thread.
fn run_bench(
    map: &dyn Map,
    fresh: &(dyn Fn() -> Box<dyn Map> + Sync),
    bench: Bench,
    prepared_pct: usize,
    keys: &[Vec<Vec<u8>>],
    passes: usize,
) -> PassRate {
    let threads = keys.len();
    let barrier = Barrier::new(threads);
    let times = parking_lot::Mutex::new(vec![
        vec![(Duration::ZERO, Duration::ZERO); threads];
        passes
    ]);
    let is_prepared = |i: usize| prepared_pct > 0 && i % 100 < prepared_pct;
    // Population for the benchmarks that need items up front.
    let value = if bench == Bench::GetValue {
        GET_VALUE
    } else {
        VALUE
    };
    let populate = |mine: &[Vec<u8>]| {
        for (i, k) in mine.iter().enumerate() {
            map.set(k, value, i as u64, is_prepared(i));
        }
    };
    map.clear();
    // Insert passes each fill a map built for the pass: every implementation starts with
    // no capacity, and none inherits the grown arrays (or tombstones) of the last pass.
    let fresh_map: parking_lot::RwLock<Option<Box<dyn Map>>> = parking_lot::RwLock::new(None);
    std::thread::scope(|s| {
        for (t, mine) in keys.iter().enumerate() {
            let (barrier, times, fresh_map) = (&barrier, &times, &fresh_map);
            s.spawn(move || {
                if bench != Bench::Insert && bench != Bench::Delete {
                    populate(mine);
                }
                for pass in 0..passes {
                    // Untimed reset with every thread paused between two barriers.
                    barrier.wait();
                    if bench == Bench::Insert && t == 0 {
                        // The last pass's map is dropped here, untimed.
                        *fresh_map.write() = Some(fresh());
                    }
                    barrier.wait();
                    if bench == Bench::Delete {
                        populate(mine);
                    }
                    let pass_map = fresh_map.read();
                    let map: &dyn Map = pass_map.as_deref().unwrap_or(map);
                    barrier.wait();
                    let t0 = SystemClock.now();
                    let c0 = thread_cpu_time();
                    let mut hits = 0usize;
                    match bench {
                        Bench::FindForRead => {
                            for k in mine {
                                hits += usize::from(black_box(map.find_read(k)).is_some());
                            }
                        }
                        Bench::FindForWrite => {
                            for k in mine {
                                hits += usize::from(black_box(map.find_write(k)).is_some());
                            }
                        }
                        Bench::Insert => {
                            for (i, k) in mine.iter().enumerate() {
                                map.set(k, VALUE, i as u64, false);
                                hits += 1;
                            }
                        }
                        Bench::Replace => {
                            for (i, k) in mine.iter().enumerate() {
                                hits += usize::from(map.replace(k, VALUE, (i + pass) as u64));
                            }
                        }
                        Bench::Delete => {
                            for k in mine {
                                hits += usize::from(map.delete(k));
                            }
                        }
                        Bench::GetValue => {
                            let mut reply = Vec::with_capacity(GET_VALUE.len());
                            for k in mine {
                                reply.clear();
                                hits += usize::from(map.copy_value(k, &mut reply));
                                black_box(&reply);
                            }
                        }
                    }
                    let dt = SystemClock.now() - t0;
                    let dc = thread_cpu_time().saturating_sub(c0);
                    black_box(hits);
                    drop(pass_map);
                    times.lock()[pass][t] = (dt, dc);
                }
            });
        }
    });
    map.clear();
    // The best pass: noise from other processes on a shared machine only ever slows a
    // pass down, so the fastest one is the least disturbed measurement (by each clock).
    let per_pass = keys[0].len() as f64;
    let mut best = PassRate::default();
    for pass in times.into_inner() {
        let wall = pass.iter().map(|p| p.0).sum::<Duration>().as_secs_f64() / threads as f64;
        let cpu = pass.iter().map(|p| p.1).sum::<Duration>().as_secs_f64() / threads as f64;
        let wall_rate = per_pass * threads as f64 / wall.max(1e-9);
        let cpu_rate = per_pass * threads as f64 / cpu.max(1e-9);
        if wall_rate > best.wall {
            best.wall = wall_rate;
            best.per_thread = pass
                .iter()
                .map(|p| per_pass / p.0.as_secs_f64().max(1e-9))
                .collect();
        }
        best.cpu = best.cpu.max(cpu_rate);
    }
    best
}

// ------------------------------------------------------------------ resize and memory

/// The longest calls while one thread fills an empty map with `n` keys and then empties
/// it.
#[derive(Default)]
struct Pauses {
    /// Longest insert / remove during which the map resized (its resize marker changed).
    grow: Duration,
    shrink: Duration,
    /// Longest insert / remove of all (includes preemption by other processes).
    any_insert: Duration,
    any_remove: Duration,
}

fn resize_pauses(map: &dyn Map, n: usize) -> Pauses {
    map.clear();
    let keys = keys_of(9, n);
    let mut p = Pauses::default();
    for (i, k) in keys.iter().enumerate() {
        let before = map.resize_marker();
        let t0 = SystemClock.now();
        map.set(k, VALUE, i as u64, false);
        let dt = SystemClock.now() - t0;
        p.any_insert = p.any_insert.max(dt);
        if map.resize_marker() != before {
            p.grow = p.grow.max(dt);
        }
    }
    for k in &keys {
        let before = map.resize_marker();
        let t0 = SystemClock.now();
        map.delete(k);
        let dt = SystemClock.now() - t0;
        p.any_remove = p.any_remove.max(dt);
        if map.resize_marker() != before {
            p.shrink = p.shrink.max(dt);
        }
    }
    map.clear();
    p
}

/// Bytes per item (allocator usable sizes) of `n` items with 20-byte keys and 512-byte
/// values, measured as the growth of live heap bytes while inserting them; the second
/// figure after reading every value once (a read shares the value, which makes `Bytes`
/// allocate its shared header in every map).
fn bytes_per_item(name: &str, stripes: usize, n: usize) -> (f64, f64) {
    let keys: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("key-{i:016}").into_bytes())
        .collect();
    let value = vec![b'v'; 512];
    COUNTING.store(true, Ordering::SeqCst);
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let map = make(name, stripes);
    for (i, k) in keys.iter().enumerate() {
        map.set(k, &value, i as u64, false);
    }
    let written = LIVE_BYTES.load(Ordering::Relaxed);
    for k in &keys {
        drop(black_box(map.read_value(k)));
    }
    let read = LIVE_BYTES.load(Ordering::Relaxed);
    drop(map);
    COUNTING.store(false, Ordering::SeqCst);
    (
        (written - before) as f64 / n as f64,
        (read - before) as f64 / n as f64,
    )
}

fn main() {
    let args = Args::parse();
    let items = args.list("items", &[100_000])[0];
    let stripes = args.list("stripes", &[64])[0].max(1);
    let passes = if args.quick { 2 } else { 4 };
    let mut report = Report::new("hashtable");
    report.note(&format!(
        "{items} items per thread, keys under 20 bytes, 8-byte values (512 for GetValue), {stripes} epkv stripes \
         and dashmap shards, foldhash for every map, mimalloc; items/s = ops / mean thread \
         time of a pass (rows with per_cpu_sec:1: ops / mean thread CPU time, which preemption \
         does not inflate); best of {} rounds of {passes} passes (the machine is shared: \
         noise only slows a pass), implementations interleaved round by round",
        args.rounds()
    ));
    let benches: [(Bench, usize); 8] = [
        (Bench::FindForRead, 0),
        (Bench::FindForRead, 50),
        (Bench::FindForWrite, 0),
        (Bench::FindForWrite, 50),
        (Bench::Insert, 0),
        (Bench::Replace, 0),
        (Bench::Delete, 0),
        (Bench::GetValue, 0),
    ];
    let impls: Vec<&str> = IMPLS
        .iter()
        .copied()
        .filter(|n| args.wants_impl(n))
        .collect();
    let maps: Vec<Box<dyn Map>> = impls.iter().map(|n| make(n, stripes)).collect();
    let all_keys = items * args.threads.iter().copied().max().unwrap_or(1);
    let floor = Floor::new(all_keys);
    for &threads in &args.threads {
        let keys: Vec<Vec<Vec<u8>>> = (0..threads).map(|t| keys_of(t, items)).collect();
        let sketches = [
            Sketch::new(items * threads, false),
            Sketch::new(items * threads, true),
        ];
        for &(bench, pct) in &benches {
            if !args.wants(bench.name()) {
                continue;
            }
            let is_find = matches!(bench, Bench::FindForRead | Bench::FindForWrite);
            // The floor and the design sketches run with the lookups only, after the maps
            // in each round, the floor first.
            let mut runs: Vec<&dyn Map> = maps.iter().map(AsRef::as_ref).collect();
            if is_find {
                runs.push(&floor);
                runs.extend(sketches.iter().map(|s| s as &dyn Map));
            }
            let mut results: Vec<PassRate> = vec![PassRate::default(); runs.len()];
            for _ in 0..args.rounds() {
                for (i, m) in runs.iter().enumerate() {
                    let name = m.name();
                    let fresh = || make(name, stripes);
                    let r = run_bench(*m, &fresh, bench, pct, &keys, passes);
                    // Best round (see `run_bench`).
                    let b = &mut results[i];
                    if r.wall > b.wall {
                        b.wall = r.wall;
                        b.per_thread = r.per_thread;
                    }
                    b.cpu = b.cpu.max(r.cpu);
                }
            }
            let mut epkv = (0.0, 0.0);
            let mut best_peer = (0.0f64, 0.0f64);
            let mut floor_rate = None;
            let mut sketch_rates = Vec::new();
            for (i, m) in runs.iter().enumerate() {
                let r = &results[i];
                let mut params: Vec<(&str, u64)> =
                    vec![("items", items as u64), ("threads", threads as u64)];
                if matches!(bench, Bench::FindForRead | Bench::FindForWrite) {
                    params.push(("prepared_pct", pct as u64));
                }
                report.push(Row::new(bench.name(), &params, m.name(), r.wall));
                let per_thread: Vec<String> = r.per_thread.iter().map(|v| rate(*v)).collect();
                println!("    per thread {}", per_thread.join(" "));
                params.push(("per_cpu_sec", 1));
                report.push(Row::new(bench.name(), &params, m.name(), r.cpu));
                if i == maps.len() {
                    // The floor, pushed right after the maps.
                    floor_rate = Some(r.wall);
                } else if i > maps.len() {
                    // A design sketch: neither epkv nor a peer.
                    sketch_rates.push((m.name(), r.wall));
                } else if i == 0 {
                    epkv = (r.wall, r.cpu);
                } else {
                    best_peer = (best_peer.0.max(r.wall), best_peer.1.max(r.cpu));
                }
            }
            // `--impls epkv` runs no peer, and so prints no ratio to one.
            if best_peer.0 > 0.0 {
                println!(
                    "    {}/{pct}%/threads {threads}: epkv / best peer = {:.2}x wall, {:.2}x CPU",
                    bench.name(),
                    epkv.0 / best_peer.0,
                    epkv.1 / best_peer.1.max(1e-9)
                );
            }
            for (name, r) in sketch_rates {
                if best_peer.0 > 0.0 {
                    println!(
                        "    {}/{pct}%/threads {threads}: {name} / best peer = {:.2}x wall \
                         (epkv / {name} = {:.2}x)",
                        bench.name(),
                        r / best_peer.0,
                        epkv.0 / r.max(1e-9)
                    );
                }
            }
            if let Some(f) = floor_rate {
                println!(
                    "    {}/{pct}%/threads {threads}: floor (hash + one random slot read) = \
                     {}; best peer / floor = {:.2}, epkv / floor = {:.2}: 1.5x the best \
                     peer is {:.2}x the floor",
                    bench.name(),
                    rate(f),
                    best_peer.0 / f.max(1e-9),
                    epkv.0 / f.max(1e-9),
                    1.5 * best_peer.0 / f.max(1e-9)
                );
            }
        }
    }
    if args.wants("Resize") {
        let n = items * args.threads.iter().copied().max().unwrap_or(1);
        for m in &maps {
            let mut runs = Vec::new();
            for _ in 0..args.rounds() {
                runs.push(resize_pauses(m.as_ref(), n));
            }
            let us = |f: &dyn Fn(&Pauses) -> Duration| {
                median(runs.iter().map(|p| f(p).as_secs_f64() * 1e6).collect())
            };
            let resizing = if m.resize_marker().is_some() {
                format!(
                    "longest resizing insert {:.0} us, longest resizing remove {:.0} us; ",
                    us(&|p| p.grow),
                    us(&|p| p.shrink)
                )
            } else {
                "resizes incrementally (no resize marker); ".to_owned()
            };
            report.note(&format!(
                "Resize: {}: one thread grows an empty map to {n} items and empties it: \
                 {resizing}longest call of all {:.0} us insert / {:.0} us remove (median \
                 of {} runs; the latter include preemption)",
                m.name(),
                us(&|p| p.any_insert),
                us(&|p| p.any_remove),
                args.rounds()
            ));
        }
    }
    drop(maps);
    if args.wants("Memory") {
        let n = if args.quick { 100_000 } else { 200_000 };
        for plain in [false, true] {
            PLAIN_SMALL.store(plain, Ordering::SeqCst);
            let how = if plain {
                "mi_malloc for alignments <= 8"
            } else {
                "MiMalloc as the server uses it"
            };
            for &name in &impls {
                let (written, read) = bytes_per_item(name, stripes, n);
                report.note(&format!(
                    "Memory ({how}): {name}: {written:.0} bytes per item as written, \
                     {read:.0} after one read of every value (20-byte keys, 512-byte \
                     values, {n} items; usable sizes of every live block, table arrays \
                     included)"
                ));
            }
        }
        PLAIN_SMALL.store(false, Ordering::SeqCst);
        let t = HashTable::unlimited(stripes);
        if let Ok(t) = t {
            for i in 0..n {
                let k = format!("key-{i:016}");
                if let Ok(sv) = StoredValue::new(k.as_bytes(), &[b'v'; 512], ItemMeta::default()) {
                    let _ = t.insert(sv);
                }
            }
            let s = t.stats();
            let probe = Box::new([0u64; StoredValue::FIXED_BYTES / 8]);
            // SAFETY: `probe` is a live block from the global allocator (mimalloc).
            let usable = unsafe { libmimalloc_sys::mi_usable_size(probe.as_ptr().cast()) };
            report.note(&format!(
                "Memory: a {}-byte StoredValue allocation gets a {usable}-byte mimalloc block",
                StoredValue::FIXED_BYTES
            ));
            report.note(&format!(
                "Memory: epkv accounting: {:.0} bytes per item requested (item {} + table \
                 arrays {:.1}); KV-Engine: 53 + key = 73 bytes of StoredValue plus its Blob",
                s.bytes_per_item(),
                StoredValue::footprint_for(20, 512),
                s.table_bytes as f64 / s.items.max(1) as f64,
            ));
        }
    }
    if let Err(e) = report.finish("epkv") {
        eprintln!("cannot write the report: {e}");
        std::process::exit(1);
    }
}
