//! [`StoredValue`] and its mutable metadata, [`ItemMeta`].

use bytes::Bytes;
use epkv_types::{Cas, Datatype, Seqno};

/// The metadata of a stored item: everything except its key and value.
///
/// It can be changed in place through [`crate::Entry::meta_mut`] because none of it affects
/// where the item lives in the table or how much memory it is charged for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ItemMeta {
    /// The item's CAS (the real one, even while the item is locked).
    pub cas: Cas,
    /// Revision seqno: how many times this key has been written, counting across deletes.
    pub rev_seqno: u64,
    /// The seqno of the mutation that produced this version.
    pub by_seqno: Seqno,
    /// Opaque client flags.
    pub flags: u32,
    /// Absolute expiry time, Unix seconds; 0 means never.
    pub expiry: u32,
    /// Datatype bits of the value.
    pub datatype: Datatype,
    /// Absolute time, Unix seconds, at which a GET_LOCKED lock lapses; 0 means not locked.
    pub lock_expiry: u32,
    /// The CAS a writer must present while the lock holds (meaningful only when
    /// `lock_expiry` is non-zero).
    pub locked_cas: Cas,
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

    /// Drops any lock, lapsed or not.
    pub fn clear_lock(&mut self) {
        self.lock_expiry = 0;
        self.locked_cas = Cas(0);
    }
}

/// One document in the table: key, value and metadata.
///
/// The key and value are immutable once built: a new value means a new `StoredValue`
/// passed to [`crate::Entry::insert`], which is how the table keeps its memory accounting
/// exact. Cloning is cheap (the key and value are reference-counted [`Bytes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredValue {
    key: Bytes,
    value: Bytes,
    meta: ItemMeta,
}

impl StoredValue {
    /// Fixed bytes charged per item on top of its key and value: the `StoredValue` itself,
    /// hashbrown's one control byte per slot, and an allowance of 64 bytes for the
    /// allocator headers of the key and value buffers and the shared header `Bytes` creates
    /// when a value is first cloned. An estimate, not a measurement; it only has to be
    /// stable so that accounting adds up.
    pub const OVERHEAD_BYTES: usize = std::mem::size_of::<StoredValue>() + 1 + 64;

    /// Creates an item with the given metadata.
    #[must_use]
    pub fn new(key: Bytes, value: Bytes, meta: ItemMeta) -> Self {
        Self { key, value, meta }
    }

    /// Returns the key.
    #[must_use]
    pub fn key(&self) -> &Bytes {
        &self.key
    }

    /// Returns the value.
    #[must_use]
    pub fn value(&self) -> &Bytes {
        &self.value
    }

    /// Returns the metadata.
    #[must_use]
    pub fn meta(&self) -> &ItemMeta {
        &self.meta
    }

    /// Returns the bytes this item is charged for: key + value + [`Self::OVERHEAD_BYTES`].
    #[must_use]
    pub fn footprint(&self) -> usize {
        Self::footprint_for(self.key.len(), self.value.len())
    }

    /// Returns the footprint an item with these key and value lengths would have.
    #[must_use]
    pub fn footprint_for(key_len: usize, value_len: usize) -> usize {
        key_len
            .saturating_add(value_len)
            .saturating_add(Self::OVERHEAD_BYTES)
    }

    /// Splits the item into key, value and metadata.
    #[must_use]
    pub fn into_parts(self) -> (Bytes, Bytes, ItemMeta) {
        (self.key, self.value, self.meta)
    }

    pub(crate) fn meta_mut(&mut self) -> &mut ItemMeta {
        &mut self.meta
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
            locked_cas: Cas(7),
            ..ItemMeta::default()
        };
        assert!(m.is_locked(49));
        assert!(!m.is_locked(50));
        m.clear_lock();
        assert!(!m.is_locked(0));
        assert_eq!(m.locked_cas, Cas(0));
    }

    #[test]
    fn footprint_counts_key_value_and_overhead() {
        let sv = StoredValue::new(
            Bytes::from_static(b"key"),
            Bytes::from_static(b"value"),
            ItemMeta::default(),
        );
        assert_eq!(sv.footprint(), 3 + 5 + StoredValue::OVERHEAD_BYTES);
    }
}
