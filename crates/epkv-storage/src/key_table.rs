//! [`KeyTable`]: the write-once log's index of one vBucket, key → [`Loc`].
//!
//! Written here rather than taken from hashbrown because a commit looks up every document
//! it writes, the keys are cold, and the lookups were the largest part of the Writer
//! threads' CPU at 50k SETs/s (16%, issue 22). hashbrown keeps its control bytes apart
//! from its entries, so a lookup waits for the control bytes' line and then for the
//! entry's line, and it offers no way to learn either address before the lookup. Here a
//! slot is one cache line holding the key's hash tag, the key (up to [`KEY_INLINE`] bytes
//! inline) and its location: a lookup that finds its key in its first slot touches one
//! line, and [`KeyTable::hint`] lets the commit start loading that line several documents
//! ahead ([`crate::prefetch`]).
//!
//! Linear probing, at most 3/4 full; the array grows by half, then by a third (sizes
//! 4 or 6 times a power of two, as `epkv-hashtable`'s slot table does), and a key's home
//! slot is the high part of its tag times the size (a multiply, not a mask), so that the
//! table is 50-75% full between growths. A removal shifts the run after it back (no
//! tombstones), so lookups never slow down with churn. No unsafe code.

use crate::log_store::Loc;
use std::hash::BuildHasher;

/// Key bytes stored in the slot itself; longer keys have an allocation of their own.
/// Couchbase keys are mostly a collection prefix and a short id.
pub(crate) const KEY_INLINE: usize = 22;

/// The fewest slots an allocated table has.
const MIN_SLOTS: usize = 8;

/// A key as a slot holds it. 24 bytes.
#[derive(Clone)]
enum SlotKey {
    Inline { len: u8, bytes: [u8; KEY_INLINE] },
    Heap(Box<[u8]>),
}

impl Default for SlotKey {
    fn default() -> Self {
        Self::Inline {
            len: 0,
            bytes: [0; KEY_INLINE],
        }
    }
}

impl SlotKey {
    fn new(key: &[u8]) -> Self {
        if key.len() <= KEY_INLINE {
            let mut bytes = [0; KEY_INLINE];
            bytes[..key.len()].copy_from_slice(key);
            Self::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            Self::Heap(key.into())
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Heap(b) => b,
        }
    }
}

/// One slot, one cache line: the tag (0: empty), the key and where its newest version is.
#[derive(Clone, Default)]
#[repr(align(64))]
struct Slot {
    key: SlotKey,
    loc: Loc,
    tag: u32,
}

/// A key's tag: 32 bits of its hash, never 0 (0 marks an empty slot). The home slot is
/// taken from it too, so that a removal can find where a moved key belongs without
/// hashing it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tag(u32);

/// An open-addressing map from keys to [`Loc`]s (see the module docs).
#[derive(Default)]
pub(crate) struct KeyTable {
    slots: Vec<Slot>,
    len: usize,
}

/// The keys' hasher: one random seed per process, so that a commit can compute a key's
/// [`Tag`] while it encodes the document (the key is in cache then) before it knows the
/// table.
static HASHER: std::sync::LazyLock<foldhash::fast::RandomState> =
    std::sync::LazyLock::new(foldhash::fast::RandomState::default);

impl std::fmt::Debug for KeyTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyTable")
            .field("len", &self.len)
            .field("slots", &self.slots.len())
            .finish()
    }
}

/// The slot count after `n`: 4 or 6 times a power of two, half or a third more.
fn grown(n: usize) -> usize {
    if n < MIN_SLOTS {
        return MIN_SLOTS;
    }
    if n.is_power_of_two() {
        n / 2 * 3
    } else {
        n / 3 * 4
    }
}

impl KeyTable {
    /// Bytes of memory one slot takes.
    pub(crate) const SLOT_BYTES: usize = std::mem::size_of::<Slot>();

    /// The tag of `key`.
    pub(crate) fn tag(key: &[u8]) -> Tag {
        let h = HASHER.hash_one(key);
        Tag(((h >> 32) as u32).max(1))
    }

    /// Where a key of tag `t` starts probing in a table of `n` slots.
    fn home(t: u32, n: usize) -> usize {
        ((u64::from(t) * n as u64) >> 32) as usize
    }

    /// Starts loading the home slot of a key of tag `t`, for a lookup shortly after
    /// ([`Self::get_mut_tagged`], [`Self::insert_tagged`]).
    pub(crate) fn hint(&self, t: Tag) {
        if let Some(s) = self.slots.get(Self::home(t.0, self.slots.len())) {
            crate::prefetch::line(std::ptr::from_ref(s) as usize);
        }
    }

    /// Keys held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Slots allocated.
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    fn find(&self, key: &[u8], t: Tag) -> Option<usize> {
        let n = self.slots.len();
        if n == 0 {
            return None;
        }
        let mut i = Self::home(t.0, n);
        loop {
            let s = &self.slots[i];
            if s.tag == 0 {
                return None;
            }
            if s.tag == t.0 && s.key.as_slice() == key {
                return Some(i);
            }
            i += 1;
            if i == n {
                i = 0;
            }
        }
    }

    /// Where `key`'s newest version is.
    pub(crate) fn get(&self, key: &[u8]) -> Option<&Loc> {
        self.get_tagged(key, Self::tag(key))
    }

    /// [`Self::get`] with `key`'s tag ([`Self::tag`]).
    pub(crate) fn get_tagged(&self, key: &[u8], t: Tag) -> Option<&Loc> {
        self.find(key, t).map(|i| &self.slots[i].loc)
    }

    /// [`Self::get_tagged`], mutably.
    pub(crate) fn get_mut_tagged(&mut self, key: &[u8], t: Tag) -> Option<&mut Loc> {
        self.find(key, t).map(|i| &mut self.slots[i].loc)
    }

    /// Adds `key`, which the table does not hold, with tag `t`.
    pub(crate) fn insert_tagged(&mut self, key: &[u8], t: Tag, loc: Loc) {
        debug_assert!(self.find(key, t).is_none(), "the key is already held");
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.resize(grown(self.slots.len()));
        }
        let n = self.slots.len();
        let mut i = Self::home(t.0, n);
        while self.slots[i].tag != 0 {
            i += 1;
            if i == n {
                i = 0;
            }
        }
        self.slots[i] = Slot {
            key: SlotKey::new(key),
            loc,
            tag: t.0,
        };
        self.len += 1;
    }

    /// Moves every key into a table of `n` slots.
    fn resize(&mut self, n: usize) {
        let old = std::mem::replace(&mut self.slots, vec![Slot::default(); n]);
        for s in old {
            if s.tag == 0 {
                continue;
            }
            let mut i = Self::home(s.tag, n);
            while self.slots[i].tag != 0 {
                i += 1;
                if i == n {
                    i = 0;
                }
            }
            self.slots[i] = s;
        }
    }

    /// Removes `key`; returns where its version was.
    pub(crate) fn remove(&mut self, key: &[u8]) -> Option<Loc> {
        let mut hole = self.find(key, Self::tag(key))?;
        let removed = std::mem::take(&mut self.slots[hole]);
        self.len -= 1;
        // Shift the run after the hole back: a key moves into the hole unless its home is
        // after the hole (cyclically, up to where it sits), where it must stay reachable.
        let n = self.slots.len();
        let mut j = hole;
        loop {
            j += 1;
            if j == n {
                j = 0;
            }
            let t = self.slots[j].tag;
            if t == 0 {
                break;
            }
            let home = Self::home(t, n);
            let home_dist = (home + n - hole) % n;
            let here_dist = (j + n - hole) % n;
            if home_dist == 0 || home_dist > here_dist {
                self.slots.swap(hole, j);
                hole = j;
            }
        }
        if self.len == 0 {
            self.slots = Vec::new();
        }
        Some(removed.loc)
    }

    /// Every key and where its version is, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &Loc)> {
        self.slots
            .iter()
            .filter(|s| s.tag != 0)
            .map(|s| (s.key.as_slice(), &s.loc))
    }

    /// Every key's location, in no particular order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Loc> {
        self.iter().map(|(_, l)| l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    impl KeyTable {
        fn insert(&mut self, key: &[u8], loc: Loc) {
            let t = Self::tag(key);
            self.insert_tagged(key, t, loc);
        }
    }

    fn loc(seqno: u64) -> Loc {
        Loc {
            file: 1,
            len: 10,
            offset: seqno.wrapping_mul(10),
            seqno,
            expiry: 0,
            deleted: false,
        }
    }

    #[test]
    fn a_slot_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<SlotKey>(), 24);
        assert_eq!(KeyTable::SLOT_BYTES, 64);
    }

    #[test]
    fn sizes_grow_by_half_then_a_third() {
        let mut n = 0;
        let mut seen = Vec::new();
        for _ in 0..6 {
            n = grown(n);
            seen.push(n);
        }
        assert_eq!(seen, [8, 12, 16, 24, 32, 48]);
    }

    #[test]
    fn inline_and_long_keys_round_trip() {
        let mut t = KeyTable::default();
        let long = vec![b'x'; 200];
        let edge = vec![b'e'; KEY_INLINE];
        t.insert(b"", loc(1));
        t.insert(&long, loc(2));
        t.insert(&edge, loc(3));
        assert_eq!(t.get(b"").map(|l| l.seqno), Some(1));
        assert_eq!(t.get(&long).map(|l| l.seqno), Some(2));
        assert_eq!(t.get(&edge).map(|l| l.seqno), Some(3));
        assert_eq!(t.get(&long[..199]), None);
        assert_eq!(t.remove(&long).map(|l| l.seqno), Some(2));
        assert_eq!(t.get(&long), None);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn removing_everything_frees_the_slots() {
        let mut t = KeyTable::default();
        for i in 0..1000u64 {
            t.insert(&i.to_le_bytes(), loc(i));
        }
        assert!(t.capacity() * 3 >= t.len() * 4);
        for i in 0..1000u64 {
            assert_eq!(t.remove(&i.to_le_bytes()).map(|l| l.seqno), Some(i));
        }
        assert_eq!((t.len(), t.capacity()), (0, 0));
        assert_eq!(t.iter().count(), 0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Put(u16, u64),
        Remove(u16),
        Get(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        // A small key space, so that puts overwrite, removals hit and runs wrap around.
        prop_oneof![
            4 => (0u16..300, any::<u64>()).prop_map(|(k, s)| Op::Put(k, s)),
            2 => (0u16..300).prop_map(Op::Remove),
            1 => (0u16..300).prop_map(Op::Get),
        ]
    }

    fn key(k: u16) -> Vec<u8> {
        // Every third key too long to sit inline.
        let mut v = format!("key:{k}").into_bytes();
        if k.is_multiple_of(3) {
            v.resize(40, b'#');
        }
        v
    }

    proptest! {
        #[test]
        fn behaves_like_a_hash_map(ops in proptest::collection::vec(op(), 1..600)) {
            let mut t = KeyTable::default();
            let mut model: HashMap<Vec<u8>, u64> = HashMap::new();
            for o in ops {
                match o {
                    Op::Put(k, s) => {
                        let k = key(k);
                        let tag = KeyTable::tag(&k);
                        t.hint(tag);
                        match t.get_mut_tagged(&k, tag) {
                            Some(l) => *l = loc(s),
                            None => t.insert_tagged(&k, tag, loc(s)),
                        }
                        model.insert(k, s);
                    }
                    Op::Remove(k) => {
                        let k = key(k);
                        prop_assert_eq!(t.remove(&k).map(|l| l.seqno), model.remove(&k));
                    }
                    Op::Get(k) => {
                        let k = key(k);
                        prop_assert_eq!(t.get(&k).map(|l| l.seqno), model.get(&k).copied());
                    }
                }
                prop_assert_eq!(t.len(), model.len());
                prop_assert!(t.len() * 4 <= t.capacity() * 3);
            }
            let mut all: Vec<(Vec<u8>, u64)> = t.iter().map(|(k, l)| (k.to_vec(), l.seqno)).collect();
            all.sort();
            let mut want: Vec<(Vec<u8>, u64)> = model.into_iter().collect();
            want.sort();
            prop_assert_eq!(all, want);
        }
    }
}
