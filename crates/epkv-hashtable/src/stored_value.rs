//! [`StoredValue`], its document metadata [`ItemMeta`], and its [`CommittedState`].

use crate::{Error, Result};
use bytes::Bytes;
use epkv_types::{Cas, Datatype, Seqno};

/// The document metadata of a stored item: what a client can see of it besides key and
/// value.
///
/// It can be changed in place through [`crate::Entry::meta_mut`] because none of it affects
/// where the item lives, how much memory it is charged for, or the table's statistics.
/// 40 bytes (37 used).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ItemMeta {
    /// The item's CAS. While a GET_LOCKED lock holds, this is the lock's CAS (GET_LOCKED
    /// gives the item a fresh CAS that is both its CAS and the lock token, as KV-Engine
    /// does); readers other than the locker must be shown a CAS that never matches.
    pub cas: Cas,
    /// Revision seqno: how many times this key has been written, counting across deletes.
    pub rev_seqno: u64,
    /// The seqno of the mutation that produced this version.
    pub by_seqno: Seqno,
    /// Opaque client flags.
    pub flags: u32,
    /// Absolute expiry time, Unix seconds; 0 means never.
    pub expiry: u32,
    /// Absolute time, Unix seconds, at which a GET_LOCKED lock lapses; 0 means not locked.
    pub lock_expiry: u32,
    /// Datatype bits of the value.
    pub datatype: Datatype,
}

impl ItemMeta {
    /// Returns true when the item has an expiry time and `now_unix_secs` has reached it.
    #[must_use]
    pub fn is_expired(&self, now_unix_secs: u32) -> bool {
        self.expiry != 0 && self.expiry <= now_unix_secs
    }

    /// Returns true while a GET_LOCKED lock is in force at `now_unix_secs`.
    #[must_use]
    pub fn is_locked(&self, now_unix_secs: u32) -> bool {
        self.lock_expiry != 0 && now_unix_secs < self.lock_expiry
    }

    /// Drops any lock, lapsed or not (the CAS stays what it is).
    pub fn clear_lock(&mut self) {
        self.lock_expiry = 0;
    }
}

/// Where an item stands in the SyncWrite life cycle (KV-Engine's `CommittedState`).
///
/// A key has at most one *committed* version (the first two states) and at most one
/// *prepared* version (the other four) in the table at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum CommittedState {
    /// Written by a plain (non-durable) mutation.
    #[default]
    CommittedViaMutation = 0,
    /// Written by committing a prepared SyncWrite.
    CommittedViaPrepare = 1,
    /// A prepared SyncWrite waiting for its durability requirements; invisible to reads.
    Pending = 2,
    /// A prepare loaded by warmup or kept over a promotion whose outcome is unknown: it
    /// may already have been acknowledged elsewhere, so it blocks every read of the key
    /// until it is completed.
    PreparedMaybeVisible = 3,
    /// A prepare that was aborted (kept only where completed prepares are retained).
    PrepareAborted = 4,
    /// A prepare that was committed (kept only where completed prepares are retained).
    PrepareCommitted = 5,
}

impl CommittedState {
    /// The state stored as `v` (`v` always comes from `state as u8`; anything else reads
    /// as committed).
    #[inline]
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::CommittedViaPrepare,
            2 => Self::Pending,
            3 => Self::PreparedMaybeVisible,
            4 => Self::PrepareAborted,
            5 => Self::PrepareCommitted,
            _ => Self::CommittedViaMutation,
        }
    }

    /// True for the committed versions (via mutation or via prepare).
    #[must_use]
    pub fn is_committed(self) -> bool {
        matches!(self, Self::CommittedViaMutation | Self::CommittedViaPrepare)
    }

    /// True for the four prepare states.
    #[must_use]
    pub fn is_prepared(self) -> bool {
        !self.is_committed()
    }

    /// True for a prepare that is still in flight (pending or maybe-visible).
    #[must_use]
    pub fn is_in_flight(self) -> bool {
        matches!(self, Self::Pending | Self::PreparedMaybeVisible)
    }

    /// True for a prepare that was committed or aborted.
    #[must_use]
    pub fn is_completed(self) -> bool {
        matches!(self, Self::PrepareAborted | Self::PrepareCommitted)
    }
}

/// Bits of [`Header::bits`].
const DELETED: u8 = 1;
const DIRTY: u8 = 2;
const RESIDENT: u8 = 4;

/// The fixed part of an item's allocation; the key's bytes follow it, then the value's.
/// 48 bytes (47 used).
#[derive(Clone, Copy)]
#[repr(C)]
struct Header {
    meta: ItemMeta,
    /// Bytes of the value that follow the key (0 when evicted or empty).
    value_len: u32,
    /// A [`CommittedState`] as its `u8`.
    state: u8,
    /// [`DELETED`], [`DIRTY`] and [`RESIDENT`].
    bits: u8,
    key_len: u8,
}

/// Bytes of [`Header`]: where the key starts in an item's allocation.
const HEADER: usize = std::mem::size_of::<Header>();
const _: () = assert!(HEADER == 48 && std::mem::align_of::<Header>() == 8);

/// The allocation of an item of `len` bytes in all (header included).
fn layout(len: usize) -> std::alloc::Layout {
    match std::alloc::Layout::from_size_align(len, std::mem::align_of::<Header>()) {
        Ok(l) => l,
        // Unreachable: `len` is at most 48 + 255 + u32::MAX, far below isize::MAX.
        Err(_) => unreachable!("an item's size always makes a valid layout"),
    }
}

/// One version of a document in the table: key, value (absent once evicted), metadata,
/// life-cycle state and deleted/dirty/resident bits, all in **one allocation**. Its MFU
/// frequency counter is not here: the table keeps it in the item's slot (see
/// [`crate::Entry::mfu`]), so that a read which bumps it never writes to the item.
///
/// # Memory layout (what [`Self::footprint`] counts)
/// One allocation of exactly `48 + key length + value length` bytes: a 48-byte header
/// (the [`ItemMeta`], the value's length, the state and flag bytes, the key's length),
/// then the key, then the value. The `StoredValue` itself is one pointer, which the
/// table's slot holds. An item with a 15-byte key and a 32-byte value takes 95 bytes (96
/// with the allocator's size class); before this layout it took a 96-byte struct plus a
/// separate value allocation plus a value pointer in the slot (see "Item layout" in
/// `docs/hashtable.md`).
///
/// Written by hand (the crate's only other unsafe code is the prefetch intrinsic in
/// `prefetch.rs`) because the item's size is the core of the product: no safe type holds
/// a variable-length record behind a one-word pointer, and a fat `Box<[u8]>` costs 8
/// bytes more in every slot. The unsafe code is this module's and is checked by Miri (the
/// `miri` step of `cargo xtask ci`, `docs/testing.md`).
///
/// The requested size is what is charged; the allocator's size-class rounding comes on
/// top and is not counted (see `docs/hashtable.md`). The table's slot arrays are counted
/// separately ([`crate::TableStats::table_bytes`]).
///
/// The key is immutable; the value is replaced only through the table
/// ([`crate::Entry::insert`], eviction) so the accounting stays exact. A read that hands
/// the value out as [`Bytes`] ([`Self::value_bytes`]) copies it; the front end's GET path
/// borrows it instead ([`Self::value`]) and copies it once, into the reply.
pub struct StoredValue {
    /// The item's allocation, of [`Self::alloc_len`] bytes, owned (as a `Box` would be).
    ptr: std::ptr::NonNull<Header>,
}

// SAFETY: a `StoredValue` owns its allocation exclusively, as a `Box<[u8]>` would: no
// other pointer to it exists, it has no interior mutability, and `&self` methods only
// read. So it may move to and be shared between threads as freely as a `Box`.
#[allow(unsafe_code)]
unsafe impl Send for StoredValue {}
// SAFETY: see `Send`.
#[allow(unsafe_code)]
unsafe impl Sync for StoredValue {}

impl std::fmt::Debug for StoredValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredValue")
            .field("key", &String::from_utf8_lossy(self.key()))
            .field("value_len", &self.value_len())
            .field("meta", self.meta())
            .field("state", &self.committed_state())
            .field("deleted", &self.is_deleted())
            .field("dirty", &self.is_dirty())
            .field("resident", &self.is_resident())
            .finish()
    }
}

impl PartialEq for StoredValue {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (self.header(), other.header());
        self.key() == other.key()
            && self.value() == other.value()
            && a.meta == b.meta
            && (a.state, a.bits) == (b.state, b.bits)
    }
}

impl Eq for StoredValue {}

#[allow(unsafe_code)]
impl StoredValue {
    /// Allocates an item: `header` (whose `key_len` and `value_len` must be `key`'s and
    /// the parts' total), then `key`, then the concatenation of `parts`.
    fn allocate(header: Header, key: &[u8], parts: &[&[u8]]) -> Self {
        debug_assert_eq!(usize::from(header.key_len), key.len());
        let len = HEADER + key.len() + header.value_len as usize;
        let layout = layout(len);
        // SAFETY: `layout` has a non-zero size (at least the header's 48 bytes).
        let raw = unsafe { std::alloc::alloc(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw.cast::<Header>()) else {
            std::alloc::handle_alloc_error(layout)
        };
        // SAFETY: the allocation is `len` bytes, aligned for `Header`: the header goes at
        // its start, and the key and the parts (whose lengths sum to `len - HEADER`, as
        // the caller built `header`) fill the rest exactly, without overlapping the
        // sources, which the caller borrows from elsewhere.
        unsafe {
            ptr.as_ptr().write(header);
            let mut at = raw.add(HEADER);
            for part in std::iter::once(key).chain(parts.iter().copied()) {
                std::ptr::copy_nonoverlapping(part.as_ptr(), at, part.len());
                at = at.add(part.len());
            }
            debug_assert_eq!(at, raw.add(len));
        }
        Self { ptr }
    }

    #[inline]
    fn header(&self) -> &Header {
        // SAFETY: `ptr` points at an initialised header this value owns; the borrow of
        // `self` keeps it alive and unchanged.
        unsafe { self.ptr.as_ref() }
    }

    #[inline]
    fn header_mut(&mut self) -> &mut Header {
        // SAFETY: as `header`, and `&mut self` makes the access exclusive.
        unsafe { self.ptr.as_mut() }
    }

    /// Bytes of the allocation: header, key and value.
    #[inline]
    fn alloc_len(&self) -> usize {
        let h = self.header();
        HEADER + usize::from(h.key_len) + h.value_len as usize
    }

    /// The key's bytes followed by the value's.
    #[inline]
    fn data(&self) -> &[u8] {
        let h = self.header();
        let len = usize::from(h.key_len) + h.value_len as usize;
        // SAFETY: the allocation holds `len` initialised bytes after the header
        // (`allocate` wrote them; `eject_value` shrinks `value_len` with the allocation).
        // The pointer is derived from `ptr`, which covers the whole allocation.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast::<u8>().add(HEADER), len) }
    }

    /// Drops the value and marks the item non-resident, shrinking the allocation to the
    /// header and key.
    pub(crate) fn eject_value(&mut self) {
        let old = self.alloc_len();
        let h = self.header_mut();
        h.bits &= !RESIDENT;
        if h.value_len == 0 {
            return;
        }
        let new = HEADER + usize::from(h.key_len);
        // SAFETY: `ptr` was allocated with `layout(old)` (by `allocate`, `clone` or an
        // earlier `realloc`, all with the header's alignment), `new` is non-zero and
        // smaller, and the bytes kept (header and key) are the first `new`.
        let raw = unsafe { std::alloc::realloc(self.ptr.as_ptr().cast::<u8>(), layout(old), new) };
        let Some(ptr) = std::ptr::NonNull::new(raw.cast::<Header>()) else {
            // The old allocation is still valid and still ours: keep it consistent.
            std::alloc::handle_alloc_error(layout(new))
        };
        self.ptr = ptr;
        self.header_mut().value_len = 0;
    }
}

#[allow(unsafe_code)]
impl Drop for StoredValue {
    fn drop(&mut self) {
        let layout = layout(self.alloc_len());
        // SAFETY: `ptr` was allocated with this layout (its length is kept in the header)
        // and is not used again.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast::<u8>(), layout) }
    }
}

impl Clone for StoredValue {
    fn clone(&self) -> Self {
        let (key, value) = self.data().split_at(usize::from(self.header().key_len));
        Self::allocate(*self.header(), key, &[value])
    }
}

impl StoredValue {
    /// The longest key an item can have (the protocol's limit is 250).
    pub const MAX_KEY_LEN: usize = u8::MAX as usize;

    /// The longest value an item can have (the protocol's limit is far lower).
    pub const MAX_VALUE_LEN: usize = u32::MAX as usize;

    /// Bytes every item's allocation has besides its key and value.
    pub const FIXED_BYTES: usize = HEADER;

    /// Creates a committed, dirty, resident item, copying key and value.
    ///
    /// # Errors
    /// [`Error::KeyTooLong`] for a key longer than [`Self::MAX_KEY_LEN`],
    /// [`Error::ValueTooLong`] for a value longer than [`Self::MAX_VALUE_LEN`].
    pub fn new(key: &[u8], value: &[u8], meta: ItemMeta) -> Result<Self> {
        Self::with_value_parts(key, &[value], meta)
    }

    /// Creates an item whose value is the concatenation of `parts` (APPEND/PREPEND build
    /// theirs this way, with no intermediate buffer).
    ///
    /// # Errors
    /// As [`Self::new`].
    pub fn with_value_parts(key: &[u8], parts: &[&[u8]], meta: ItemMeta) -> Result<Self> {
        let key_len = u8::try_from(key.len()).map_err(|_| Error::KeyTooLong(key.len()))?;
        let len = parts
            .iter()
            .map(|p| p.len())
            .fold(0usize, usize::saturating_add);
        let value_len = u32::try_from(len).map_err(|_| Error::ValueTooLong(len))?;
        let header = Header {
            meta,
            value_len,
            state: CommittedState::CommittedViaMutation as u8,
            bits: DIRTY | RESIDENT,
            key_len,
        };
        Ok(Self::allocate(header, key, parts))
    }

    /// Creates a committed tombstone (a deleted document) with no value.
    ///
    /// # Errors
    /// [`Error::KeyTooLong`] for a key longer than [`Self::MAX_KEY_LEN`].
    pub fn new_deleted(key: &[u8], meta: ItemMeta) -> Result<Self> {
        Self::new_tombstone(key, &[], meta)
    }

    /// Creates a committed tombstone that keeps a value: a deleted document's system
    /// extended attributes (datatype XATTR in `meta`).
    ///
    /// # Errors
    /// As [`Self::new`].
    pub fn new_tombstone(key: &[u8], value: &[u8], meta: ItemMeta) -> Result<Self> {
        let mut sv = Self::new(key, value, meta)?;
        sv.header_mut().bits |= DELETED;
        Ok(sv)
    }

    /// Creates a placeholder for a key whose existence is being read from disk (full
    /// eviction; KV-Engine's "temp initial" item): committed, deleted (so lookups treat it
    /// as absent), clean and not resident. [`Self::is_placeholder`] tells it from a
    /// tombstone, which is resident.
    ///
    /// # Errors
    /// [`Error::KeyTooLong`] for a key longer than [`Self::MAX_KEY_LEN`].
    pub fn new_placeholder(key: &[u8]) -> Result<Self> {
        let mut sv = Self::new(key, &[], ItemMeta::default())?;
        sv.header_mut().bits = DELETED;
        Ok(sv)
    }

    /// True for a [`Self::new_placeholder`] item: deleted and not resident.
    #[must_use]
    pub fn is_placeholder(&self) -> bool {
        self.header().bits & (DELETED | RESIDENT) == DELETED
    }

    /// Returns the same item in another life-cycle state (for example
    /// [`CommittedState::Pending`] to build a prepare).
    #[must_use]
    pub fn with_state(mut self, state: CommittedState) -> Self {
        self.header_mut().state = state as u8;
        self
    }

    /// Returns the same key and value with other metadata.
    #[must_use]
    pub fn with_meta(mut self, meta: ItemMeta) -> Self {
        self.header_mut().meta = meta;
        self
    }

    /// Returns the same item marked deleted (or not). A deleted item keeps any value it
    /// has (KV-Engine keeps system xattrs this way).
    #[must_use]
    pub fn with_deleted(mut self, deleted: bool) -> Self {
        let h = self.header_mut();
        if deleted {
            h.bits |= DELETED;
        } else {
            h.bits &= !DELETED;
        }
        self
    }

    /// Returns the key.
    #[inline]
    #[must_use]
    pub fn key(&self) -> &[u8] {
        &self.data()[..usize::from(self.header().key_len)]
    }

    /// Returns a copy of the key as [`Bytes`].
    #[must_use]
    pub fn key_bytes(&self) -> Bytes {
        Bytes::copy_from_slice(self.key())
    }

    /// Returns the value; empty when the item has none or it was evicted.
    #[inline]
    #[must_use]
    pub fn value(&self) -> &[u8] {
        &self.data()[usize::from(self.header().key_len)..]
    }

    /// The value for in-place change of its bytes (its length cannot change): the engine
    /// writes a mutation's CAS and seqno into the macros of its extended attributes once
    /// they are known.
    #[allow(unsafe_code)]
    pub fn value_mut(&mut self) -> &mut [u8] {
        let h = self.header();
        let (start, len) = (usize::from(h.key_len), h.value_len as usize);
        // SAFETY: as `data`: the allocation holds `start + len` initialised bytes after
        // the header, and `&mut self` makes the access exclusive.
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr.as_ptr().cast::<u8>().add(HEADER + start), len)
        }
    }

    /// Returns a copy of the value as [`Bytes`]; empty when there is none.
    #[must_use]
    pub fn value_bytes(&self) -> Bytes {
        Bytes::copy_from_slice(self.value())
    }

    /// Returns the value's length in bytes (0 when evicted).
    #[inline]
    #[must_use]
    pub fn value_len(&self) -> usize {
        self.header().value_len as usize
    }

    /// Returns the metadata.
    #[inline]
    #[must_use]
    pub fn meta(&self) -> &ItemMeta {
        &self.header().meta
    }

    /// Returns the life-cycle state.
    #[inline]
    #[must_use]
    pub fn committed_state(&self) -> CommittedState {
        CommittedState::from_u8(self.header().state)
    }

    /// True for a committed version (not a prepare).
    #[must_use]
    pub fn is_committed(&self) -> bool {
        self.committed_state().is_committed()
    }

    /// True for a prepare (in flight or completed).
    #[must_use]
    pub fn is_prepared(&self) -> bool {
        self.committed_state().is_prepared()
    }

    /// True for a tombstone.
    #[must_use]
    pub fn is_deleted(&self) -> bool {
        self.header().bits & DELETED != 0
    }

    /// True until the item is marked clean (persisted).
    #[must_use]
    pub fn is_dirty(&self) -> bool {
        self.header().bits & DIRTY != 0
    }

    /// Whether this version is not on disk yet, given its vBucket's persisted seqno
    /// (every version at or below it is on disk): dirty, and above `persisted`. A
    /// persisted seqno of 0 (nothing persisted, or no persistence) covers nothing. The
    /// engine's flusher raises the persisted seqno without clearing dirty bits, so this,
    /// not [`Self::is_dirty`], is what says whether an item may be ejected.
    #[must_use]
    pub fn is_unpersisted(&self, persisted: epkv_types::Seqno) -> bool {
        self.is_dirty() && (persisted.0 == 0 || self.meta().by_seqno > persisted)
    }

    /// False once the value has been evicted from memory.
    #[must_use]
    pub fn is_resident(&self) -> bool {
        self.header().bits & RESIDENT != 0
    }

    /// Returns the bytes this item is charged for: its allocation (see the type's docs).
    #[inline]
    #[must_use]
    pub fn footprint(&self) -> usize {
        self.alloc_len()
    }

    /// Returns the footprint a resident item with these key and value lengths would have.
    #[must_use]
    pub fn footprint_for(key_len: usize, value_len: usize) -> usize {
        HEADER.saturating_add(key_len).saturating_add(value_len)
    }

    /// The address of the item's allocation, for the table's slot to prefetch it.
    #[inline]
    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    // ---- crate-internal mutators (the table keeps its statistics around these) ----

    pub(crate) fn meta_mut(&mut self) -> &mut ItemMeta {
        &mut self.header_mut().meta
    }

    pub(crate) fn set_dirty(&mut self, dirty: bool) {
        let h = self.header_mut();
        if dirty {
            h.bits |= DIRTY;
        } else {
            h.bits &= !DIRTY;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tombstone_keeps_a_value_that_can_change_in_place() {
        let meta = ItemMeta {
            datatype: epkv_types::Datatype::XATTR,
            ..ItemMeta::default()
        };
        let mut sv = StoredValue::new_tombstone(b"key", b"attrs", meta).unwrap();
        assert!(sv.is_deleted() && sv.is_resident());
        assert_eq!(sv.value(), b"attrs");
        sv.value_mut()[1..3].copy_from_slice(b"XY");
        assert_eq!(sv.value(), b"aXYrs");
        assert_eq!(sv.key(), b"key");
        let mut empty = StoredValue::new_deleted(b"k", ItemMeta::default()).unwrap();
        assert!(empty.value_mut().is_empty());
    }

    #[test]
    fn a_placeholder_is_deleted_clean_and_not_resident_unlike_a_tombstone() {
        let p = StoredValue::new_placeholder(b"k").unwrap();
        assert!(p.is_placeholder() && p.is_deleted() && p.is_committed());
        assert!(!p.is_dirty() && !p.is_resident());
        assert_eq!((p.key(), p.value_len()), (&b"k"[..], 0));
        let t = StoredValue::new_deleted(b"k", ItemMeta::default()).unwrap();
        assert!(t.is_deleted() && !t.is_placeholder());
        let live = StoredValue::new(b"k", b"v", ItemMeta::default()).unwrap();
        assert!(!live.is_placeholder());
    }

    #[test]
    fn expiry_zero_never_expires() {
        let m = ItemMeta::default();
        assert!(!m.is_expired(u32::MAX));
    }

    #[test]
    fn expiry_is_reached_at_the_second() {
        let m = ItemMeta {
            expiry: 100,
            ..ItemMeta::default()
        };
        assert!(!m.is_expired(99));
        assert!(m.is_expired(100));
        assert!(m.is_expired(101));
    }

    #[test]
    fn lock_lapses_at_its_expiry() {
        let mut m = ItemMeta {
            lock_expiry: 50,
            cas: Cas(7),
            ..ItemMeta::default()
        };
        assert!(m.is_locked(49));
        assert!(!m.is_locked(50));
        m.clear_lock();
        assert!(!m.is_locked(0));
        assert_eq!(m.cas, Cas(7), "unlocking keeps the CAS");
    }

    #[test]
    fn footprint_counts_fixed_key_and_value() {
        let sv = StoredValue::new(b"key", b"value", ItemMeta::default()).unwrap();
        assert_eq!(sv.footprint(), 48 + 3 + 5);
        assert_eq!(sv.footprint(), StoredValue::footprint_for(3, 5));
        let long = vec![b'k'; 30];
        let sv = StoredValue::new(&long, b"", ItemMeta::default()).unwrap();
        assert_eq!(sv.footprint(), 48 + 30);
        assert_eq!(sv.footprint(), StoredValue::footprint_for(30, 0));
    }

    #[test]
    fn key_inline_and_heap_and_values() {
        for len in [0, 1, 19, 20, 21, 22, 23, 200, 255] {
            let key = vec![b'a' + (len % 26) as u8; len];
            let sv = StoredValue::new(&key, b"value", ItemMeta::default()).unwrap();
            assert_eq!(sv.key(), key.as_slice());
            assert_eq!(sv.value(), b"value");
            assert_eq!(sv.value_len(), 5);
            assert_eq!(sv.key_bytes().as_ref(), key.as_slice());
            assert_eq!(sv.value_bytes().as_ref(), b"value");
        }
        let parts =
            StoredValue::with_value_parts(b"k", &[b"ab", b"", b"cd"], ItemMeta::default()).unwrap();
        assert_eq!(parts.value(), b"abcd");
    }

    #[test]
    fn new_items_are_committed_dirty_and_resident() {
        let sv = StoredValue::new(b"k", b"v", ItemMeta::default()).unwrap();
        assert_eq!(sv.committed_state(), CommittedState::CommittedViaMutation);
        assert!(sv.is_committed() && sv.is_dirty() && sv.is_resident() && !sv.is_deleted());
        let p = sv.clone().with_state(CommittedState::Pending);
        assert!(p.is_prepared() && p.committed_state().is_in_flight());
        let d = StoredValue::new_deleted(b"k", ItemMeta::default()).unwrap();
        assert!(d.is_deleted() && d.value().is_empty());
        let mut e = sv.clone();
        e.eject_value();
        assert!(!e.is_resident() && e.value().is_empty());
        assert_eq!(e.footprint(), StoredValue::FIXED_BYTES + 1);
        assert_eq!(e.key(), b"k");
    }

    #[test]
    fn longest_key_fits_and_longer_is_refused() {
        let key = vec![b'k'; StoredValue::MAX_KEY_LEN];
        let sv = StoredValue::new(&key, b"v", ItemMeta::default()).unwrap();
        assert_eq!(sv.key(), key.as_slice());
        let long = vec![b'k'; StoredValue::MAX_KEY_LEN + 1];
        assert_eq!(
            StoredValue::new(&long, b"v", ItemMeta::default()),
            Err(Error::KeyTooLong(256))
        );
    }

    #[test]
    fn layout_sizes() {
        assert_eq!(std::mem::size_of::<ItemMeta>(), 40);
        assert_eq!(std::mem::size_of::<StoredValue>(), 8);
        assert_eq!(std::mem::size_of::<Option<StoredValue>>(), 8);
        assert_eq!(StoredValue::FIXED_BYTES, 48);
    }

    #[test]
    fn clone_eject_and_drop_keep_every_part() {
        let meta = ItemMeta {
            cas: Cas(9),
            flags: 3,
            ..ItemMeta::default()
        };
        for (klen, vlen) in [(0, 0), (1, 0), (0, 1), (15, 32), (255, 1000)] {
            let key = vec![b'k'; klen];
            let value: Vec<u8> = (0..vlen).map(|i| i as u8).collect();
            let sv = StoredValue::new(&key, &value, meta)
                .unwrap()
                .with_state(CommittedState::Pending);
            let mut c = sv.clone();
            assert_eq!(c, sv);
            assert_eq!(
                (c.key(), c.value(), c.meta()),
                (&key[..], &value[..], &meta)
            );
            c.meta_mut().flags = 4;
            assert_ne!(c, sv);
            c.eject_value();
            assert!(!c.is_resident() && c.value().is_empty());
            assert_eq!(c.key(), &key[..]);
            assert_eq!(c.meta().flags, 4);
            assert_eq!(c.committed_state(), CommittedState::Pending);
            assert_eq!(c.footprint(), 48 + klen);
            c.eject_value();
            assert_eq!(c.footprint(), 48 + klen);
            assert_eq!(sv.value(), &value[..], "the original is untouched");
        }
    }
}
