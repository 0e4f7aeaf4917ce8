//! [`StoredValue`], its document metadata [`ItemMeta`], and its [`CommittedState`].

use crate::prefetch::ValueHint;
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

/// Keys up to this length live inside the [`StoredValue`]; longer ones get their own
/// allocation of exactly their length.
pub(crate) const INLINE_KEY_LEN: usize = 20;

/// The length of an inline key. Its unused values (21..=255) are the niche in which the
/// compiler stores which [`Key`] variant is in use, so `Key` needs no separate tag byte.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum InlineLen {
    L0 = 0,
    L1 = 1,
    L2 = 2,
    L3 = 3,
    L4 = 4,
    L5 = 5,
    L6 = 6,
    L7 = 7,
    L8 = 8,
    L9 = 9,
    L10 = 10,
    L11 = 11,
    L12 = 12,
    L13 = 13,
    L14 = 14,
    L15 = 15,
    L16 = 16,
    L17 = 17,
    L18 = 18,
    L19 = 19,
    L20 = 20,
}

const INLINE_LENS: [InlineLen; INLINE_KEY_LEN + 1] = [
    InlineLen::L0,
    InlineLen::L1,
    InlineLen::L2,
    InlineLen::L3,
    InlineLen::L4,
    InlineLen::L5,
    InlineLen::L6,
    InlineLen::L7,
    InlineLen::L8,
    InlineLen::L9,
    InlineLen::L10,
    InlineLen::L11,
    InlineLen::L12,
    InlineLen::L13,
    InlineLen::L14,
    InlineLen::L15,
    InlineLen::L16,
    InlineLen::L17,
    InlineLen::L18,
    InlineLen::L19,
    InlineLen::L20,
];

/// The table-managed bytes of an item: life-cycle state and flag bits.
#[derive(Clone, Copy, PartialEq, Eq)]
struct TableBytes {
    /// A [`CommittedState`] as its `u8` (a plain byte, so that the compiler uses the
    /// inline length, not this, as the niche of [`Key`]).
    state: u8,
    bits: u8,
}

/// A key, inline when short (no allocation), boxed when long, together with the table's
/// two bytes of per-item state (kept here, in space the key enum would otherwise pad,
/// so that the whole `StoredValue` is 96 bytes). 24 bytes.
#[derive(Clone)]
enum Key {
    Inline {
        len: InlineLen,
        t: TableBytes,
        buf: [u8; INLINE_KEY_LEN],
    },
    /// A thin pointer (to the key's fat box): with a fat `Box<[u8]>` here the compiler
    /// cannot fit this variant around the niche and `Key` grows to 32 bytes.
    Heap { t: TableBytes, key: Box<Box<[u8]>> },
}

impl Key {
    fn new(key: &[u8], t: TableBytes) -> Self {
        match INLINE_LENS.get(key.len()) {
            Some(&len) => {
                let mut buf = [0u8; INLINE_KEY_LEN];
                buf[..key.len()].copy_from_slice(key);
                Self::Inline { len, t, buf }
            }
            None => Self::Heap {
                t,
                key: Box::new(key.into()),
            },
        }
    }

    #[inline]
    fn as_slice(&self) -> &[u8] {
        match self {
            Self::Inline { len, buf, .. } => &buf[..*len as usize],
            Self::Heap { key, .. } => key,
        }
    }

    #[inline]
    fn t(&self) -> &TableBytes {
        match self {
            Self::Inline { t, .. } | Self::Heap { t, .. } => t,
        }
    }

    #[inline]
    fn t_mut(&mut self) -> &mut TableBytes {
        match self {
            Self::Inline { t, .. } | Self::Heap { t, .. } => t,
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Self::Inline { .. } => 0,
            Self::Heap { key, .. } => std::mem::size_of::<Box<[u8]>>() + key.len(),
        }
    }
}

/// Bits of [`TableBytes::bits`].
const DELETED: u8 = 1;
const DIRTY: u8 = 2;
const RESIDENT: u8 = 4;

/// One version of a document in the table: key, value (absent once evicted), metadata,
/// life-cycle state and deleted/dirty/resident bits. Its MFU frequency counter is not
/// here: the table keeps it in the item's slot (see [`crate::Entry::mfu`]), so that a
/// read which bumps it never writes to the item.
///
/// # Memory layout (what [`Self::footprint`] counts)
/// - the `StoredValue` itself, 96 bytes, in its own allocation (the table's slot holds a
///   pointer to it);
/// - keys longer than 20 bytes: two more allocations, the key's exact length and a
///   16-byte box pointing to it (shorter keys live inside the `StoredValue`);
/// - a non-empty resident value: one allocation of exactly its length, plus the 24-byte
///   header [`Bytes`] allocates the first time the value is shared (the first read that
///   hands it out). The header is charged from the start: forcing it at write time cost
///   about 90 ns per write (an allocation, a free and three atomic operations), so a
///   value that has never been read is charged 24 bytes more than it holds; from its first
///   read on, the charge is exact.
///
/// These are the sizes requested from the allocator (verified with a counting allocator
/// in `tests/footprint_exact.rs`); its size-class rounding comes on top and is not
/// counted (see `docs/hashtable.md`). The table's slot arrays are counted separately
/// ([`crate::TableStats::table_bytes`]).
///
/// The key is immutable; the value is replaced only through the table
/// ([`crate::Entry::insert`], eviction) so the accounting stays exact.
///
/// The fields are laid out in a fixed order (`repr(C)`): what every lookup touches (the
/// key and the table's state and flag bytes, which share one 24-byte field) comes first,
/// so a lookup's key comparison and state check read one cache line.
#[derive(Clone)]
#[repr(C)]
pub struct StoredValue {
    key: Key,
    meta: ItemMeta,
    /// `None` when evicted (non-resident) or when the item has no value.
    value: Option<Bytes>,
}

impl std::fmt::Debug for StoredValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredValue")
            .field("key", &String::from_utf8_lossy(self.key()))
            .field("value_len", &self.value_len())
            .field("meta", &self.meta)
            .field("state", &self.committed_state())
            .field("deleted", &self.is_deleted())
            .field("dirty", &self.is_dirty())
            .field("resident", &self.is_resident())
            .finish()
    }
}

impl PartialEq for StoredValue {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
            && self.value.as_deref() == other.value.as_deref()
            && self.meta == other.meta
            && self.key.t() == other.key.t()
    }
}

impl Eq for StoredValue {}

/// Bytes of the shared header [`Bytes`] allocates to share an owned buffer: a buffer
/// pointer, a capacity and a reference count.
pub(crate) const BYTES_SHARED_HEADER: usize = 3 * std::mem::size_of::<usize>();

/// Builds a value buffer of exactly `len` bytes (`Bytes` adds its shared header when the
/// value is first shared; see [`StoredValue::footprint`]).
fn value_buffer(parts: &[&[u8]], len: usize) -> Option<Bytes> {
    if len == 0 {
        return None;
    }
    let mut buf = Vec::with_capacity(len);
    for p in parts {
        buf.extend_from_slice(p);
    }
    Some(Bytes::from(buf))
}

impl StoredValue {
    /// The longest key an item can have (the protocol's limit is 250).
    pub const MAX_KEY_LEN: usize = u8::MAX as usize;

    /// Size of the `StoredValue` allocation every item has.
    pub const FIXED_BYTES: usize = std::mem::size_of::<StoredValue>();

    /// Creates a committed, dirty, resident item, copying key and value.
    ///
    /// # Errors
    /// [`Error::KeyTooLong`] for a key longer than [`Self::MAX_KEY_LEN`].
    pub fn new(key: &[u8], value: &[u8], meta: ItemMeta) -> Result<Self> {
        Self::with_value_parts(key, &[value], meta)
    }

    /// Creates an item whose value is the concatenation of `parts` (APPEND/PREPEND build
    /// theirs this way, with no intermediate buffer).
    ///
    /// # Errors
    /// [`Error::KeyTooLong`] for a key longer than [`Self::MAX_KEY_LEN`].
    pub fn with_value_parts(key: &[u8], parts: &[&[u8]], meta: ItemMeta) -> Result<Self> {
        if key.len() > Self::MAX_KEY_LEN {
            return Err(Error::KeyTooLong(key.len()));
        }
        let len = parts
            .iter()
            .map(|p| p.len())
            .fold(0usize, usize::saturating_add);
        Ok(Self {
            value: value_buffer(parts, len),
            meta,
            key: Key::new(
                key,
                TableBytes {
                    state: CommittedState::CommittedViaMutation as u8,
                    bits: DIRTY | RESIDENT,
                },
            ),
        })
    }

    /// Creates a committed tombstone (a deleted document) with no value.
    ///
    /// # Errors
    /// [`Error::KeyTooLong`] for a key longer than [`Self::MAX_KEY_LEN`].
    pub fn new_deleted(key: &[u8], meta: ItemMeta) -> Result<Self> {
        let mut sv = Self::new(key, &[], meta)?;
        sv.key.t_mut().bits |= DELETED;
        Ok(sv)
    }

    /// Returns the same item in another life-cycle state (for example
    /// [`CommittedState::Pending`] to build a prepare).
    #[must_use]
    pub fn with_state(mut self, state: CommittedState) -> Self {
        self.key.t_mut().state = state as u8;
        self
    }

    /// Returns the same key and value with other metadata.
    #[must_use]
    pub fn with_meta(mut self, meta: ItemMeta) -> Self {
        self.meta = meta;
        self
    }

    /// Returns the same item marked deleted (or not). A deleted item keeps any value it
    /// has (KV-Engine keeps system xattrs this way).
    #[must_use]
    pub fn with_deleted(mut self, deleted: bool) -> Self {
        if deleted {
            self.key.t_mut().bits |= DELETED;
        } else {
            self.key.t_mut().bits &= !DELETED;
        }
        self
    }

    /// Returns the key.
    #[inline]
    #[must_use]
    pub fn key(&self) -> &[u8] {
        self.key.as_slice()
    }

    /// Returns a copy of the key as [`Bytes`].
    #[must_use]
    pub fn key_bytes(&self) -> Bytes {
        Bytes::copy_from_slice(self.key())
    }

    /// Returns the value; empty when the item has none or it was evicted.
    #[must_use]
    pub fn value(&self) -> &[u8] {
        self.value.as_deref().unwrap_or_default()
    }

    /// Where the value is, for the table's slot to prefetch it.
    pub(crate) fn value_hint(&self) -> ValueHint {
        ValueHint::of(self.value.as_deref())
    }

    /// Returns the value as a shared [`Bytes`] (no copy); empty when there is none.
    #[must_use]
    pub fn value_bytes(&self) -> Bytes {
        self.value.clone().unwrap_or_default()
    }

    /// Returns the value's length in bytes (0 when evicted).
    #[must_use]
    pub fn value_len(&self) -> usize {
        self.value.as_ref().map_or(0, Bytes::len)
    }

    /// Returns the metadata.
    #[must_use]
    pub fn meta(&self) -> &ItemMeta {
        &self.meta
    }

    /// Returns the life-cycle state.
    #[must_use]
    pub fn committed_state(&self) -> CommittedState {
        CommittedState::from_u8(self.key.t().state)
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
        self.key.t().bits & DELETED != 0
    }

    /// True until the item is marked clean (persisted).
    #[must_use]
    pub fn is_dirty(&self) -> bool {
        self.key.t().bits & DIRTY != 0
    }

    /// False once the value has been evicted from memory.
    #[must_use]
    pub fn is_resident(&self) -> bool {
        self.key.t().bits & RESIDENT != 0
    }

    /// Returns the bytes this item is charged for (see the type's docs).
    #[must_use]
    pub fn footprint(&self) -> usize {
        let value = match &self.value {
            Some(v) if !v.is_empty() => v.len() + BYTES_SHARED_HEADER,
            _ => 0,
        };
        Self::FIXED_BYTES + self.key.heap_bytes() + value
    }

    /// Returns the footprint a resident item with these key and value lengths would have.
    #[must_use]
    pub fn footprint_for(key_len: usize, value_len: usize) -> usize {
        let key = if key_len > INLINE_KEY_LEN {
            key_len.saturating_add(std::mem::size_of::<Box<[u8]>>())
        } else {
            0
        };
        let value = if value_len == 0 {
            0
        } else {
            value_len.saturating_add(BYTES_SHARED_HEADER)
        };
        Self::FIXED_BYTES.saturating_add(key).saturating_add(value)
    }

    // ---- crate-internal mutators (the table keeps its statistics around these) ----

    pub(crate) fn meta_mut(&mut self) -> &mut ItemMeta {
        &mut self.meta
    }

    pub(crate) fn set_dirty(&mut self, dirty: bool) {
        if dirty {
            self.key.t_mut().bits |= DIRTY;
        } else {
            self.key.t_mut().bits &= !DIRTY;
        }
    }

    /// Drops the value and marks the item non-resident.
    pub(crate) fn eject_value(&mut self) {
        self.value = None;
        self.key.t_mut().bits &= !RESIDENT;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(sv.footprint(), 96 + 5 + 24);
        assert_eq!(sv.footprint(), StoredValue::footprint_for(3, 5));
        let long = vec![b'k'; 30];
        let sv = StoredValue::new(&long, b"", ItemMeta::default()).unwrap();
        assert_eq!(sv.footprint(), 96 + 16 + 30);
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
        assert_eq!(e.footprint(), StoredValue::FIXED_BYTES);
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
        assert_eq!(std::mem::size_of::<Key>(), 24);
        assert_eq!(std::mem::size_of::<StoredValue>(), 96);
    }
}
