//! [`Slot`], one bucket of a stripe, and [`SlotTable`], the open-addressing table of
//! slots each stripe keeps (one for committed versions, one for prepared ones).
//!
//! Written here rather than taken from hashbrown because the lookup is the core of the
//! product and its cost is cache misses: hashbrown keeps a separate array of control
//! bytes, so a lookup waits for the control bytes' line and then for the slot's line, one
//! after the other. Here the key's tag lives in the slot itself: the first line a lookup
//! touches is the slot's, and the item and its value are fetched from there
//! ("The slot table" in `docs/hashtable.md` has the measurements).
//!
//! Linear probing over an array of 16-byte slots, at most 13/16 full. At that load a
//! lookup probes about 3 slots for a present key and 15 for a missing one (Knuth's
//! estimates; just after a growth, at 13/20, 2 and 4.6).
//!
//! The array grows by half, then by a third, not double: its sizes are 4 or 6 times a
//! power of two ([`buckets_for`]), and a key's first bucket is the high part of its
//! probe hash times the size (a multiply, not a mask). A stripe's slots are then 54-81%
//! full between growths instead of 41-81%: at 1,000,000 items in 1024 vBuckets (122 per
//! stripe) that is 25 bytes of slots per item instead of 33, and the server's RSS per
//! item fell from 135-138 to 128 bytes (memcached 125 in the same runs). Growing by a
//! quarter (sizes 4, 5, 6, 7 times a power of two) took it to 123.5 but halved the
//! Insert benchmark (13.5 -> 7.0 M/s at one thread, each item moved about five times on
//! its way up); by half and a third it runs 10.4 M/s, doubling 13.5 M/s (see "Table
//! sizes" in `docs/hashtable.md`). A limit of three quarters measured slower, not
//! faster.
//!
//! A removal leaves a tombstone unless it ends its run, so removing never moves another
//! item: an [`crate::Entry`]'s and a paused visit's bucket indices stay valid, and only a
//! rehash (growth, shrink, or clearing out tombstones at the same size) moves items,
//! which the caller counts as a resize.
//!
//! No unsafe code here: an empty or tombstone slot is one whose item is `None`.

use crate::StoredValue;
use crate::hash_table::{KeyHash, TAG_BITS};
use crate::prefetch::{ADDR_BITS, prefetch_line};

/// The word of a never-used bucket (and no item).
const EMPTY: u64 = 0;
/// The word of a bucket whose item was removed from inside a run (and no item).
const TOMBSTONE: u64 = 1;
/// The fewest buckets an allocated table has.
const MIN_BUCKETS: usize = 8;

/// One bucket: the item (a one-word pointer to its single allocation, see
/// [`StoredValue`]) and one word holding its key's tag (low 53 bits), how many more cache
/// lines of the item a lookup prefetches (3 bits) and the item's MFU counter (top 8
/// bits). 16 bytes. A bucket without an item is empty or a tombstone, by its word.
///
/// - **The tag** lets a lookup compare 53 bits of hash before following the pointer to
///   compare keys, and a rehash place the slot without reading its item (which would be
///   a cache miss per item).
/// - **The MFU counter** lives here, not in the item, so that a read's bump writes to the
///   slot's cache line, which the lookup has just read, and a read never writes to the
///   item (FindForRead +5% in interleaved runs; see "Lookup cost" in docs/hashtable.md).
/// - **The line count** lets a lookup fetch all of the item (its value included, up to
///   [`MAX_ITEM_LINES`] lines) at once instead of line after line (see [`Slot::is`]).
///   It is refreshed whenever the table puts a new version in the slot or ejects its
///   value.
///
/// A `&Slot` or `&mut Slot` outside this module always has an item: [`SlotTable`] hands
/// out only occupied buckets.
pub(crate) struct Slot {
    word: u64,
    sv: Option<StoredValue>,
}

/// The most cache lines of an item a lookup prefetches (512 bytes): enough for the
/// hardware's stream prefetcher to take over on longer values.
pub(crate) const MAX_ITEM_LINES: usize = 8;

/// Where the line count sits in a slot's word.
const LINES_SHIFT: u32 = 53;
const LINES_BITS: u64 = 0b111 << LINES_SHIFT;

/// The word's line-count bits for `sv`: its cache lines after the first, at most
/// [`MAX_ITEM_LINES`] in all.
#[inline]
fn lines_of(sv: &StoredValue) -> u64 {
    let lines = sv.footprint().div_ceil(64).clamp(1, MAX_ITEM_LINES);
    (lines as u64 - 1) << LINES_SHIFT
}

impl Slot {
    pub(crate) fn new(hash: KeyHash, sv: StoredValue, mfu: u8) -> Self {
        Self {
            word: hash.tag | lines_of(&sv) | (u64::from(mfu) << 56),
            sv: Some(sv),
        }
    }

    const fn vacant(word: u64) -> Self {
        Self { word, sv: None }
    }

    /// Whether the bucket holds an item.
    #[inline]
    fn is_occupied(&self) -> bool {
        self.sv.is_some()
    }

    /// Whether the bucket was never used since the last rehash: a probe stops here.
    #[inline]
    fn is_empty(&self) -> bool {
        self.word == EMPTY && !self.is_occupied()
    }

    #[inline]
    fn item(&self) -> &StoredValue {
        match &self.sv {
            Some(sv) => sv,
            None => unreachable!("the slot table hands out occupied slots only"),
        }
    }

    #[inline]
    fn item_mut(&mut self) -> &mut StoredValue {
        match &mut self.sv {
            Some(sv) => sv,
            None => unreachable!("the slot table hands out occupied slots only"),
        }
    }

    /// Keeps the word's line count in step with the item's size.
    #[inline]
    fn refresh_lines(&mut self) {
        let lines = lines_of(self.item());
        self.word = (self.word & !LINES_BITS) | lines;
    }

    /// Puts `sv` in the slot and returns the version it held.
    pub(crate) fn replace(&mut self, sv: StoredValue) -> StoredValue {
        let old = std::mem::replace(self.item_mut(), sv);
        self.refresh_lines();
        old
    }

    /// Ejects the item's value (value eviction).
    pub(crate) fn eject_value(&mut self) {
        self.item_mut().eject_value();
        self.refresh_lines();
    }

    /// How many cache lines of the item a lookup prefetches (for tests that check it
    /// follows the item).
    #[cfg(test)]
    pub(crate) fn prefetch_lines(&self) -> usize {
        ((self.word & LINES_BITS) >> LINES_SHIFT) as usize + 1
    }

    /// The hash a rehash places the slot by.
    #[inline]
    pub(crate) fn probe_hash(&self) -> u64 {
        KeyHash::from_tag(self.word & TAG_BITS).probe
    }

    /// Whether this slot holds `key`, whose hash is `hash` (false for a vacant bucket).
    ///
    /// When the tag matches, the slot almost surely holds the key, and the caller reads
    /// the item next: the item's lines after the first (its value's, mostly) are
    /// prefetched before the key comparison waits for the first, so the misses overlap
    /// instead of following one another.
    #[inline]
    pub(crate) fn is(&self, hash: KeyHash, key: &[u8]) -> bool {
        if self.word & TAG_BITS != hash.tag {
            return false;
        }
        let Some(sv) = &self.sv else { return false };
        let addr = sv.addr();
        let lines = ((self.word & LINES_BITS) >> LINES_SHIFT) as usize;
        for i in 1..=lines {
            prefetch_line(addr + i * 64);
        }
        sv.key() == key
    }

    /// The item's 8-bit MFU (most frequently used) counter.
    #[inline]
    pub(crate) fn mfu(&self) -> u8 {
        (self.word >> 56) as u8
    }

    #[inline]
    pub(crate) fn set_mfu(&mut self, mfu: u8) {
        self.word = (self.word & !(0xff << 56)) | (u64::from(mfu) << 56);
    }

    /// The item's properties for the statistics, its MFU counter included.
    #[inline]
    pub(crate) fn props(&self) -> crate::stats::Props {
        crate::stats::Props::of(self.item(), self.mfu())
    }

    pub(crate) fn into_inner(self) -> StoredValue {
        match self.sv {
            Some(sv) => sv,
            None => unreachable!("the slot table hands out occupied slots only"),
        }
    }
}

impl std::ops::Deref for Slot {
    type Target = StoredValue;

    #[inline]
    fn deref(&self) -> &StoredValue {
        self.item()
    }
}

impl std::ops::DerefMut for Slot {
    #[inline]
    fn deref_mut(&mut self) -> &mut StoredValue {
        self.item_mut()
    }
}

/// A linear-probing table of [`Slot`]s, unallocated until its first insert.
///
/// Invariant: `items` occupied buckets; `growth_left` empty buckets may still be filled
/// before a rehash, which keeps occupied plus tombstone buckets at most 13/16 of the
/// array ([`max_load`]), so every probe meets an empty bucket.
#[derive(Default)]
pub(crate) struct SlotTable {
    buckets: Box<[Slot]>,
    items: usize,
    growth_left: usize,
}

/// Starts loading the first bucket `probe` looks at in the array `hint` describes (a
/// [`SlotTable::address_hint`] read without the stripe's lock, so possibly stale: a
/// prefetch never faults, and a stale hint only wastes it).
#[inline]
pub(crate) fn prefetch_bucket(hint: u64, probe: u64) {
    if hint == 0 {
        return;
    }
    let n = size_of_code((hint >> 56) as u8);
    let addr = (hint & ADDR_BITS) + (first_bucket(probe, n) * std::mem::size_of::<Slot>()) as u64;
    // A 16-byte slot sits in one line when the array is 16-aligned, as allocators give
    // it; the second prefetch covers an array that is not.
    prefetch_line(addr as usize);
    prefetch_line(addr as usize + std::mem::size_of::<Slot>() - 1);
}

/// How many buckets of `n` may be occupied or tombstones: 13/16 of them, rounded down.
const fn max_load(n: usize) -> usize {
    n / 16 * 13 + (n % 16) * 13 / 16
}

/// The fewest buckets that hold `items`: at least [`MIN_BUCKETS`], and 4 or 6 times a
/// power of two (8, 12, 16, 24, 32, 48, ...), so that each size is at most half above the
/// one before.
fn buckets_for(items: usize) -> usize {
    let mut n = MIN_BUCKETS;
    while max_load(n) < items {
        n = next_size(n);
    }
    n
}

/// The size after `n` (itself such a size).
const fn next_size(n: usize) -> usize {
    // The largest power of two at most `n`, halved: 4 for 8 and 12, 8 for 16 and 24, ...
    n + ((1usize << (usize::BITS - 1 - n.leading_zeros())) >> 1)
}

/// The one-byte code of a size `n` that is 4 to 7 times a power of two: the exponent and
/// the multiplier.
fn size_code(n: usize) -> u8 {
    let e = usize::BITS - 1 - n.leading_zeros() - 2;
    let m = n >> e;
    debug_assert!(
        (4..8).contains(&m) && m << e == n,
        "{n} is not a table size"
    );
    ((e as u8) << 2) | (m as u8 - 4)
}

/// The size whose code is `code`.
#[inline]
const fn size_of_code(code: u8) -> usize {
    ((code as usize & 3) + 4) << (code >> 2)
}

/// A key's first bucket in an array of `n`: the high half of `probe` times `n`
/// (Lemire's range reduction), which is uniform over any size, not only powers of two.
#[inline]
fn first_bucket(probe: u64, n: usize) -> usize {
    ((u128::from(probe) * n as u128) >> 64) as usize
}

impl SlotTable {
    /// Buckets allocated (occupied, tombstone or empty).
    #[inline]
    pub(crate) fn num_buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Occupied buckets.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.items
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.items == 0
    }

    /// Bytes of the bucket array.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.buckets.len() * std::mem::size_of::<Slot>()
    }

    /// Where the bucket array is and how big, in one word (0 while unallocated): what
    /// [`prefetch_bucket`] needs to fetch a key's first bucket before the stripe's lock
    /// is taken.
    #[inline]
    pub(crate) fn address_hint(&self) -> u64 {
        let n = self.buckets.len();
        if n == 0 {
            return 0;
        }
        (self.buckets.as_ptr() as u64 & ADDR_BITS) | (u64::from(size_code(n)) << 56)
    }

    /// The bucket index of `key`, whose hash is `hash`.
    #[inline]
    pub(crate) fn find(&self, hash: KeyHash, key: &[u8]) -> Option<usize> {
        let n = self.buckets.len();
        let mut i = first_bucket(hash.probe, n);
        // At most `n` steps: the table always keeps an empty bucket, so the loop ends
        // there long before; the bound only makes that visible.
        for _ in 0..n {
            let b = &self.buckets[i];
            if b.is(hash, key) {
                return Some(i);
            }
            if b.is_empty() {
                return None;
            }
            i += 1;
            if i == n {
                i = 0;
            }
        }
        None
    }

    /// The slot holding `key`, whose hash is `hash`.
    #[inline]
    pub(crate) fn find_slot(&self, hash: KeyHash, key: &[u8]) -> Option<&Slot> {
        self.find(hash, key).and_then(|i| self.get(i))
    }

    /// The slot holding `key`, for change.
    #[inline]
    pub(crate) fn find_slot_mut(&mut self, hash: KeyHash, key: &[u8]) -> Option<&mut Slot> {
        self.find(hash, key).and_then(|i| self.get_mut(i))
    }

    /// The occupied bucket at `index`.
    #[inline]
    pub(crate) fn get(&self, index: usize) -> Option<&Slot> {
        self.buckets.get(index).filter(|b| b.is_occupied())
    }

    /// The occupied bucket at `index`, for change.
    #[inline]
    pub(crate) fn get_mut(&mut self, index: usize) -> Option<&mut Slot> {
        self.buckets.get_mut(index).filter(|b| b.is_occupied())
    }

    /// Every occupied bucket, in bucket order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Slot> {
        self.buckets.iter().filter(|b| b.is_occupied())
    }

    /// Empties the table, releasing its array, and returns its slots.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = Slot> + use<> {
        let buckets = std::mem::take(self).buckets;
        buckets.into_iter().filter(Slot::is_occupied)
    }

    /// Removes the item at `index`. No other item moves: the bucket becomes a tombstone,
    /// or, when it ends its run of occupied buckets, empty (and so do the tombstones
    /// just before it, which no probe needs to pass any more).
    pub(crate) fn remove(&mut self, index: usize) -> Option<Slot> {
        let n = self.buckets.len();
        let b = self.get_mut(index)?;
        let slot = std::mem::replace(b, Slot::vacant(TOMBSTONE));
        self.items -= 1;
        if self.buckets[if index + 1 == n { 0 } else { index + 1 }].is_empty() {
            let mut i = index;
            for _ in 0..n {
                let b = &mut self.buckets[i];
                if b.is_occupied() || b.word != TOMBSTONE {
                    break;
                }
                b.word = EMPTY;
                self.growth_left += 1;
                i = if i == 0 { n - 1 } else { i - 1 };
            }
        }
        Some(slot)
    }

    /// Inserts `slot`, whose key must not be in the table, and returns its bucket index
    /// and whether the table rehashed (moving every other item) to make room.
    ///
    /// With `visit_paused` (a paused visit is inside the stripe and restarts it after
    /// any rehash), a full table at least doubles and never rehashes at the same size, so
    /// that however writes go, a visit is restarted a bounded number of times.
    pub(crate) fn insert_new(&mut self, slot: Slot, visit_paused: bool) -> (usize, bool) {
        let probe = slot.probe_hash();
        let mut i = self.vacant_bucket(probe);
        let mut rehashed = false;
        if i.is_none_or(|i| self.buckets[i].word == EMPTY && self.growth_left == 0) {
            // Full of items and tombstones: clear out the tombstones at the same size
            // when the items alone fill at most half the allowance, else grow.
            let n = self.buckets.len();
            let target = if visit_paused {
                buckets_for((self.items + 1).max(max_load(n) * 2))
            } else if self.items < max_load(n) / 2 {
                n
            } else {
                buckets_for(self.items + 1)
            };
            self.rehash(target);
            rehashed = true;
            i = self.vacant_bucket(probe);
        }
        let i = i.unwrap_or_else(|| unreachable!("a rehashed table has room"));
        let b = &mut self.buckets[i];
        if b.word == EMPTY {
            self.growth_left -= 1;
        }
        *b = slot;
        self.items += 1;
        (i, rehashed)
    }

    /// Rehashes into the fewest buckets that hold `min_items` (and every item), if that
    /// is fewer than now; returns whether it did. `shrink_to(0)` of an empty table
    /// releases its array.
    pub(crate) fn shrink_to(&mut self, min_items: usize) -> bool {
        if self.buckets.is_empty() {
            return false;
        }
        if self.items == 0 && min_items == 0 {
            *self = Self::default();
            return true;
        }
        let target = buckets_for(min_items.max(self.items));
        if target >= self.buckets.len() {
            return false;
        }
        self.rehash(target);
        true
    }

    /// The first empty or tombstone bucket on `probe`'s path.
    fn vacant_bucket(&self, probe: u64) -> Option<usize> {
        let n = self.buckets.len();
        let mut i = first_bucket(probe, n);
        for _ in 0..n {
            if !self.buckets[i].is_occupied() {
                return Some(i);
            }
            i += 1;
            if i == n {
                i = 0;
            }
        }
        None
    }

    /// Moves every item into a fresh array of `n` buckets (no tombstones).
    fn rehash(&mut self, n: usize) {
        debug_assert!(n == 0 || size_of_code(size_code(n)) == n);
        debug_assert!(max_load(n) >= self.items);
        let old = std::mem::replace(
            &mut self.buckets,
            (0..n).map(|_| Slot::vacant(EMPTY)).collect(),
        );
        for slot in old.into_iter().filter(Slot::is_occupied) {
            let i = self
                .vacant_bucket(slot.probe_hash())
                .unwrap_or_else(|| unreachable!("the new array holds every item"));
            self.buckets[i] = slot;
        }
        self.growth_left = max_load(n) - self.items;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ItemMeta;

    fn hash_of(tag: u64) -> KeyHash {
        KeyHash::from_tag(tag & TAG_BITS)
    }

    fn slot(key: &[u8], tag: u64) -> Slot {
        let sv = StoredValue::new(key, b"v", ItemMeta::default()).unwrap();
        Slot::new(hash_of(tag), sv, 0)
    }

    fn tombstones(t: &SlotTable) -> usize {
        t.buckets
            .iter()
            .filter(|b| !b.is_occupied() && b.word == TOMBSTONE)
            .count()
    }

    #[test]
    fn a_slot_is_as_small_as_its_two_words() {
        assert_eq!(std::mem::size_of::<Slot>(), 16);
        assert_eq!(std::mem::size_of::<SlotTable>(), 32);
    }

    #[test]
    fn colliding_tags_are_told_apart_by_key_and_survive_removals() {
        // Every key has the same tag, hence the same probe: one long run.
        let mut t = SlotTable::default();
        let keys: Vec<Vec<u8>> = (0..5u8).map(|i| vec![b'k', i]).collect();
        let mut at = Vec::new();
        for k in &keys {
            assert_eq!(t.find(hash_of(42), k), None);
            at.push(t.insert_new(slot(k, 42), false).0);
        }
        for (k, i) in keys.iter().zip(&at) {
            assert_eq!(t.find(hash_of(42), k), Some(*i));
        }
        // Removing from inside the run leaves a tombstone the later keys probe past.
        let removed = t.remove(at[1]).unwrap();
        assert_eq!(removed.key(), keys[1].as_slice());
        assert_eq!(tombstones(&t), 1);
        assert_eq!(t.find(hash_of(42), &keys[1]), None);
        for j in [0, 2, 3, 4] {
            assert_eq!(t.find(hash_of(42), &keys[j]), Some(at[j]), "nothing moved");
        }
        // Removing the run's end clears it and the tombstones before it.
        t.remove(at[4]).unwrap();
        t.remove(at[3]).unwrap();
        t.remove(at[2]).unwrap();
        assert_eq!(tombstones(&t), 0);
        assert_eq!((t.len(), t.find(hash_of(42), &keys[0])), (1, Some(at[0])));
        assert!(
            t.remove(at[1]).is_none(),
            "a vacant bucket has nothing to remove"
        );
        assert!(t.get(at[1]).is_none());
    }

    #[test]
    fn a_tag_of_zero_or_one_is_not_mistaken_for_a_vacant_bucket() {
        let mut t = SlotTable::default();
        let (i0, _) = t.insert_new(slot(b"zero", 0), false);
        let (i1, _) = t.insert_new(slot(b"one", 1), false);
        assert_eq!(t.find(hash_of(0), b"zero"), Some(i0));
        assert_eq!(t.find(hash_of(1), b"one"), Some(i1));
        assert_eq!(t.find(hash_of(0), b"one"), None);
        // A vacant bucket's word equals those tags; it must never match.
        assert_eq!(t.find(hash_of(0), b""), None);
        assert_eq!(t.iter().count(), 2);
    }

    #[test]
    fn churn_clears_tombstones_without_growing_and_growth_keeps_every_item() {
        let mut t = SlotTable::default();
        let mut rehashes = 0;
        // Insert and remove far more keys than the table ever holds at once.
        let tag = |i: u64| i.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 8;
        let mut live = std::collections::VecDeque::new();
        for i in 0..20_000u64 {
            let key = i.to_be_bytes();
            let (_, r) = t.insert_new(slot(&key, tag(i)), false);
            rehashes += usize::from(r);
            live.push_back(i);
            if live.len() > 40 {
                let old = live.pop_front().unwrap();
                let k = old.to_be_bytes();
                let at = t.find(hash_of(tag(old)), &k).expect("still there");
                t.remove(at).unwrap();
            }
            assert!(t.num_buckets() <= 64, "churn alone never grows the table");
        }
        assert!(rehashes > 3, "tombstones were cleared out ({rehashes})");
        for i in &live {
            assert!(t.find(hash_of(tag(*i)), &i.to_be_bytes()).is_some());
        }
        // Growth and shrink keep every item findable.
        for i in 100_000..110_000u64 {
            t.insert_new(slot(&i.to_be_bytes(), tag(i)), false);
        }
        assert_eq!(t.len(), 10_040);
        assert!(t.num_buckets() >= 10_040 * 4 / 3);
        for i in (100_000..110_000u64).step_by(7) {
            assert!(t.find(hash_of(tag(i)), &i.to_be_bytes()).is_some());
        }
        let drained: Vec<Slot> = t.drain().collect();
        assert_eq!(drained.len(), 10_040);
        assert_eq!((t.len(), t.num_buckets()), (0, 0));
        assert!(!t.shrink_to(0), "nothing to release");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8),
        Remove(u8),
        Shrink(u8),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => any::<u8>().prop_map(Op::Insert),
            3 => any::<u8>().prop_map(Op::Remove),
            1 => any::<u8>().prop_map(Op::Shrink),
        ]
    }

    proptest::proptest! {
        /// Against a map as the model, with tags drawn from only eight values so runs,
        /// tombstones and rehashes are everywhere: every key is found exactly when the
        /// model has it, at a bucket that moves only when the table says it rehashed.
        #[test]
        fn the_table_agrees_with_a_model(ops in proptest::collection::vec(op(), 1..400)) {
            let mut t = SlotTable::default();
            let mut model: std::collections::HashMap<u8, usize> = Default::default();
            let tag = |k: u8| u64::from(k % 8) * 0x0101_0101;
            for op in ops {
                let moved = match op {
                    Op::Insert(k) => match model.entry(k) {
                        std::collections::hash_map::Entry::Occupied(_) => false,
                        std::collections::hash_map::Entry::Vacant(v) => {
                            let (at, rehashed) = t.insert_new(slot(&[k], tag(k)), false);
                            v.insert(at);
                            rehashed
                        }
                    },
                    Op::Remove(k) => {
                        let removed = model.remove(&k).map(|at| t.remove(at).unwrap());
                        proptest::prop_assert!(removed.is_none_or(|s| s.key() == [k]));
                        false
                    }
                    Op::Shrink(n) => t.shrink_to(usize::from(n)),
                };
                if moved {
                    for (k, at) in model.iter_mut() {
                        *at = t.find(hash_of(tag(*k)), &[*k]).unwrap();
                    }
                }
                proptest::prop_assert_eq!(t.len(), model.len());
                proptest::prop_assert_eq!(t.iter().count(), model.len());
                proptest::prop_assert!(t.len() + tombstones(&t) <= max_load(t.num_buckets()));
                for k in 0..=u8::MAX {
                    proptest::prop_assert_eq!(t.find(hash_of(tag(k)), &[k]), model.get(&k).copied());
                }
            }
        }
    }

    #[test]
    fn shrink_rehashes_into_the_fewest_buckets_that_hold_the_items() {
        let mut t = SlotTable::default();
        for i in 0..1000u64 {
            t.insert_new(
                slot(&i.to_be_bytes(), i.wrapping_mul(0x9E37_79B9) >> 3),
                false,
            );
        }
        let big = t.num_buckets();
        for i in 0..990u64 {
            let at = t
                .find(hash_of(i.wrapping_mul(0x9E37_79B9) >> 3), &i.to_be_bytes())
                .unwrap();
            t.remove(at).unwrap();
        }
        assert!(!t.shrink_to(big), "never grows");
        assert!(t.shrink_to(20));
        assert_eq!(t.num_buckets(), 32);
        assert_eq!(tombstones(&t), 0);
        for i in 990..1000u64 {
            assert!(
                t.find(hash_of(i.wrapping_mul(0x9E37_79B9) >> 3), &i.to_be_bytes())
                    .is_some()
            );
        }
        assert_eq!(buckets_for(0), MIN_BUCKETS);
        assert_eq!(buckets_for(6), 8);
        assert_eq!(buckets_for(7), 12);
        assert_eq!(buckets_for(122), 192);
    }

    #[test]
    fn sizes_grow_by_half_at_most_and_their_codes_round_trip() {
        let mut n = MIN_BUCKETS;
        let mut seen = vec![n];
        while n < 1 << 40 {
            let next = next_size(n);
            assert!(next > n && next * 2 <= n * 3, "{n} -> {next}");
            assert_eq!(size_of_code(size_code(n)), n);
            n = next;
            seen.push(n);
        }
        assert_eq!(&seen[..8], &[8, 12, 16, 24, 32, 48, 64, 96]);
        // The first bucket is uniform over a size that is not a power of two.
        let n = 160;
        let mut hits = vec![0u32; n];
        for t in 0..160_000u64 {
            hits[first_bucket(KeyHash::from_tag(t).probe, n)] += 1;
        }
        assert!(hits.iter().all(|&h| (800..1200).contains(&h)), "{hits:?}");
    }
}
