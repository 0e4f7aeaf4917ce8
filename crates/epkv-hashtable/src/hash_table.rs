//! [`HashTable`], a lock-striped concurrent map from key to [`StoredValue`], and [`Entry`],
//! the handle through which one key is read and changed atomically.
//!
//! The table is an array of stripes; each stripe is a `parking_lot::Mutex` over a
//! `hashbrown::HashTable<StoredValue>` (open addressing, SwissTable). A key's 64-bit
//! foldhash picks the stripe from bits 20..52 and hashbrown uses the low bits for the slot
//! and the top 7 bits for its tag byte, so the three uses do not correlate. This is the
//! structure of KV-Engine's `HashTable` (`ht_locks` mutexes over hash buckets) with the
//! chained buckets replaced by per-stripe SwissTables that grow independently, so no
//! whole-table resize exists.

use crate::{Error, ItemMeta, MemoryTracker, Result, StoredValue};
use foldhash::fast::RandomState;
use parking_lot::Mutex;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

type RawTable = hashbrown::HashTable<StoredValue>;

/// One lock stripe, aligned to 128 bytes so neighbouring stripes' mutexes never share a
/// cache line (nor the adjacent line the x86 spatial prefetcher pulls in).
#[repr(align(128))]
struct Stripe {
    map: Mutex<RawTable>,
}

/// State shared by every stripe of one table.
struct Shared {
    /// Random seed per table: a client cannot pick keys that collide on every server.
    build: RandomState,
    /// Items in this table. Updated under the owning stripe's lock; read without locks.
    items: AtomicUsize,
    /// Bytes charged by this table's items. Same protection as `items`.
    mem_used: AtomicUsize,
    /// The bucket-wide tracker every charge also goes to.
    tracker: Arc<MemoryTracker>,
}

impl Shared {
    fn hash(&self, key: &[u8]) -> u64 {
        self.build.hash_one(key)
    }

    fn charge(&self, bytes: usize) -> Result<()> {
        self.tracker.try_charge(bytes)?;
        self.mem_used.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    fn release(&self, bytes: usize) {
        self.tracker.release(bytes);
        self.mem_used.fetch_sub(bytes, Ordering::Relaxed);
    }

    fn account_removed(&self, sv: &StoredValue) {
        self.release(sv.footprint());
        self.items.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A concurrent map from key to [`StoredValue`] with lock striping and memory accounting.
///
/// All access to an item happens under its stripe's mutex, through
/// [`HashTable::with_entry`] (check-and-modify of one key) or a visitor
/// ([`HashTable::retain`], [`HashTable::for_each`]), which lock one stripe at a time.
/// Item count and charged bytes are kept per table and, for bytes, in the shared
/// [`MemoryTracker`] too, which can refuse growth.
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
                map: Mutex::new(RawTable::new()),
            })
            .collect();
        Ok(Self {
            stripes,
            shared: Shared {
                build: RandomState::default(),
                items: AtomicUsize::new(0),
                mem_used: AtomicUsize::new(0),
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

    /// Returns the number of items (a snapshot; concurrent writers may change it at once).
    #[must_use]
    pub fn len(&self) -> usize {
        self.shared.items.load(Ordering::Relaxed)
    }

    /// Returns true when the table holds no items.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Returns the bytes charged by this table's items.
    #[must_use]
    pub fn mem_used(&self) -> usize {
        self.shared.mem_used.load(Ordering::Relaxed)
    }

    /// Returns the memory tracker this table charges.
    #[must_use]
    pub fn tracker(&self) -> &Arc<MemoryTracker> {
        &self.shared.tracker
    }

    fn stripe_for(&self, hash: u64) -> &Stripe {
        // Multiply-shift range reduction over bits 20..52 of the hash.
        let bits = (hash >> 20) & 0xffff_ffff;
        let n = self.stripes.len() as u64;
        // `bits * n >> 32 < n`, so the index is in range and fits usize.
        let idx = ((bits * n) >> 32) as usize;
        &self.stripes[idx]
    }

    /// Locks `key`'s stripe and runs `f` on the key's [`Entry`]; whatever `f` reads and
    /// changes through the entry happens atomically with respect to every other access to
    /// the key. Keep `f` short: it blocks every key of the stripe.
    pub fn with_entry<R>(&self, key: &[u8], f: impl FnOnce(&mut Entry<'_>) -> R) -> R {
        let hash = self.shared.hash(key);
        let mut table = self.stripe_for(hash).map.lock();
        let index = table.find_bucket_index(hash, |sv| sv.key() == key);
        let mut entry = Entry {
            table: &mut table,
            shared: &self.shared,
            hash,
            key,
            index,
        };
        f(&mut entry)
    }

    /// Returns a copy of the item stored under `key` (cheap: key and value are shared).
    #[must_use]
    pub fn get(&self, key: &[u8]) -> Option<StoredValue> {
        self.with_entry(key, |e| e.get().cloned())
    }

    /// Stores `sv` under its key, returning the item it replaced.
    ///
    /// # Errors
    /// [`Error::QuotaExceeded`] when the tracker refuses the extra bytes; the table is
    /// unchanged.
    pub fn insert(&self, sv: StoredValue) -> Result<Option<StoredValue>> {
        // A copy, not `key_bytes`: slicing the item's buffer would make `Bytes` allocate
        // its shared header for the item's whole life.
        let key = sv.key().to_vec();
        self.with_entry(&key, |e| e.insert(sv))
    }

    /// Removes and returns the item stored under `key`.
    pub fn remove(&self, key: &[u8]) -> Option<StoredValue> {
        self.with_entry(key, |e| e.remove())
    }

    /// Visits every item, one stripe at a time, and removes those for which `keep` returns
    /// false; returns how many were removed.
    ///
    /// `keep` runs under the stripe's lock (so it may act atomically on the item it is
    /// shown), but no lock is held between stripes: items written concurrently may or may
    /// not be visited.
    pub fn retain(&self, mut keep: impl FnMut(&StoredValue) -> bool) -> usize {
        let mut removed = 0;
        for stripe in &self.stripes {
            let mut table = stripe.map.lock();
            table.retain(|sv| {
                let k = keep(sv);
                if !k {
                    self.shared.account_removed(sv);
                    removed += 1;
                }
                k
            });
        }
        removed
    }

    /// Calls `f` on every item, one stripe at a time, holding only that stripe's lock.
    pub fn for_each(&self, mut f: impl FnMut(&StoredValue)) {
        for stripe in &self.stripes {
            let table = stripe.map.lock();
            table.iter().for_each(&mut f);
        }
    }

    /// Removes every item, one stripe at a time; returns how many were removed.
    pub fn clear(&self) -> usize {
        self.retain(|_| false)
    }
}

/// The slot of one key inside a locked stripe: present or absent, readable and changeable
/// while [`HashTable::with_entry`]'s closure runs.
pub struct Entry<'a> {
    table: &'a mut RawTable,
    shared: &'a Shared,
    hash: u64,
    key: &'a [u8],
    /// Bucket index of the key's item; valid because nothing else can touch the stripe
    /// while the entry exists, and refreshed by every insert and remove.
    index: Option<usize>,
}

impl Entry<'_> {
    /// Returns the key this entry is for.
    #[must_use]
    pub fn key(&self) -> &[u8] {
        self.key
    }

    /// Returns the item, if the key is present.
    #[must_use]
    pub fn get(&self) -> Option<&StoredValue> {
        self.index.and_then(|i| self.table.get_bucket(i))
    }

    /// Returns the item's metadata for in-place change, if the key is present. Key and
    /// value cannot change this way; use [`Entry::insert`].
    pub fn meta_mut(&mut self) -> Option<&mut ItemMeta> {
        self.index
            .and_then(|i| self.table.get_bucket_mut(i))
            .map(StoredValue::meta_mut)
    }

    /// Stores `sv` (whose key must be this entry's key), returning the item it replaced.
    ///
    /// # Errors
    /// [`Error::KeyMismatch`] for an item with another key; [`Error::QuotaExceeded`] when
    /// the memory tracker refuses the extra bytes. Either way nothing changes.
    pub fn insert(&mut self, sv: StoredValue) -> Result<Option<StoredValue>> {
        if sv.key() != self.key {
            return Err(Error::KeyMismatch);
        }
        let new_fp = sv.footprint();
        let shared = self.shared;
        if let Some(slot) = self.index.and_then(|i| self.table.get_bucket_mut(i)) {
            let old_fp = slot.footprint();
            if new_fp >= old_fp {
                shared.charge(new_fp - old_fp)?;
            } else {
                shared.release(old_fp - new_fp);
            }
            return Ok(Some(std::mem::replace(slot, sv)));
        }
        shared.charge(new_fp)?;
        let occupied = self
            .table
            .insert_unique(self.hash, sv, |v| shared.hash(v.key()));
        self.index = Some(occupied.bucket_index());
        shared.items.fetch_add(1, Ordering::Relaxed);
        Ok(None)
    }

    /// Removes and returns the item, if present.
    pub fn remove(&mut self) -> Option<StoredValue> {
        let index = self.index.take()?;
        let (sv, _) = self.table.get_bucket_entry(index).ok()?.remove();
        self.shared.account_removed(&sv);
        Some(sv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use epkv_types::Cas;

    fn sv(key: &str, value: &str, cas: u64) -> StoredValue {
        StoredValue::new(
            key.as_bytes(),
            value.as_bytes(),
            ItemMeta {
                cas: Cas(cas),
                ..ItemMeta::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn zero_stripes_is_rejected() {
        assert_eq!(
            HashTable::unlimited(0).unwrap_err(),
            Error::InvalidStripeCount(0)
        );
    }

    #[test]
    fn insert_get_replace_remove_keep_counts() {
        let t = HashTable::unlimited(4).unwrap();
        assert!(t.is_empty());
        assert_eq!(t.insert(sv("a", "1", 1)).unwrap(), None);
        assert_eq!(t.len(), 1);
        assert_eq!(t.mem_used(), sv("a", "1", 1).footprint());
        let old = t.insert(sv("a", "22", 2)).unwrap().unwrap();
        assert_eq!(old.value(), b"1");
        assert_eq!(t.len(), 1);
        assert_eq!(t.mem_used(), sv("a", "22", 2).footprint());
        assert_eq!(t.get(b"a").unwrap().meta().cas, Cas(2));
        assert_eq!(t.remove(b"a").unwrap().value(), b"22");
        assert_eq!(t.remove(b"a"), None);
        assert_eq!(t.len(), 0);
        assert_eq!(t.mem_used(), 0);
        assert_eq!(t.tracker().used(), 0);
    }

    #[test]
    fn entry_insert_then_remove_within_one_closure() {
        let t = HashTable::unlimited(1).unwrap();
        t.with_entry(b"k", |e| {
            assert!(e.get().is_none());
            e.insert(sv("k", "v", 1)).unwrap();
            assert_eq!(e.get().unwrap().value(), b"v");
            e.meta_mut().unwrap().flags = 9;
            assert_eq!(e.get().unwrap().meta().flags, 9);
            assert!(e.remove().is_some());
            assert!(e.get().is_none());
            assert!(e.meta_mut().is_none());
        });
        assert!(t.is_empty());
        assert_eq!(t.mem_used(), 0);
    }

    #[test]
    fn entry_refuses_a_foreign_key() {
        let t = HashTable::unlimited(2).unwrap();
        let r = t.with_entry(b"k", |e| e.insert(sv("other", "v", 1)));
        assert_eq!(r, Err(Error::KeyMismatch));
        assert!(t.is_empty());
    }

    #[test]
    fn quota_refuses_growth_but_allows_shrink_and_leaves_old_item() {
        let one = sv("k", "v", 1).footprint();
        let tracker = Arc::new(MemoryTracker::new(one + 2));
        let t = HashTable::new(2, tracker.clone()).unwrap();
        t.insert(sv("k", "v", 1)).unwrap();
        // Growing by 3 bytes is more than the 2 left.
        assert!(matches!(
            t.insert(sv("k", "vvvv", 2)),
            Err(Error::QuotaExceeded { needed: 3, .. })
        ));
        assert_eq!(t.get(b"k").unwrap().value(), b"v");
        assert!(t.insert(sv("x", "v", 1)).is_err());
        assert_eq!(t.len(), 1);
        t.insert(sv("k", "", 3)).unwrap();
        assert_eq!(tracker.used(), one - 1);
    }

    #[test]
    fn tables_sharing_a_tracker_add_up() {
        let tracker = Arc::new(MemoryTracker::unlimited());
        let a = HashTable::new(2, tracker.clone()).unwrap();
        let b = HashTable::new(3, tracker.clone()).unwrap();
        a.insert(sv("a", "1", 1)).unwrap();
        b.insert(sv("b", "22", 1)).unwrap();
        assert_eq!(tracker.used(), a.mem_used() + b.mem_used());
        a.clear();
        assert_eq!(tracker.used(), b.mem_used());
    }

    #[test]
    fn retain_removes_rejected_items_and_accounts_them() {
        let t = HashTable::unlimited(8).unwrap();
        for i in 0..100u64 {
            t.insert(sv(&format!("k{i}"), "v", i)).unwrap();
        }
        let removed = t.retain(|sv| sv.meta().cas.0 % 2 == 0);
        assert_eq!(removed, 50);
        assert_eq!(t.len(), 50);
        let mut seen = 0;
        t.for_each(|sv| {
            assert_eq!(sv.meta().cas.0 % 2, 0);
            seen += 1;
        });
        assert_eq!(seen, 50);
        assert_eq!(t.mem_used(), 50 * sv("k10", "v", 0).footprint() - 5);
        assert_eq!(t.clear(), 50);
        assert_eq!(t.mem_used(), 0);
    }

    #[test]
    fn many_keys_survive_growth_of_every_stripe() {
        let t = HashTable::unlimited(3).unwrap();
        for i in 0..5_000u32 {
            t.insert(sv(&i.to_string(), &i.to_string(), u64::from(i)))
                .unwrap();
        }
        for i in 0..5_000u32 {
            let got = t.get(i.to_string().as_bytes()).unwrap();
            assert_eq!(got.value(), i.to_string().as_bytes());
        }
        assert_eq!(t.len(), 5_000);
    }
}
