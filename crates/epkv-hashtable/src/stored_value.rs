//! [`StoredValue`] and its mutable metadata, [`ItemMeta`].

use crate::{Error, Result};
use bytes::Bytes;
use epkv_types::{Cas, Datatype, Seqno};

/// The metadata of a stored item: everything except its key and value.
///
/// It can be changed in place through [`crate::Entry::meta_mut`] because none of it affects
/// where the item lives in the table or how much memory it is charged for. 40 bytes (the
/// compiler orders the fields; 3 bytes of tail padding).
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

/// One document in the table: key, value and metadata.
///
/// Key and value live in ONE reference-counted buffer, `[key_len: u8] ++ key ++ value`,
/// so storing an item costs one allocation and a table slot holds one [`Bytes`] (72 bytes
/// per slot in all). Keys are therefore at most [`Self::MAX_KEY_LEN`] bytes (the protocol
/// allows 250).
///
/// The key and value are immutable once built: a new value means a new `StoredValue`
/// passed to [`crate::Entry::insert`], which is how the table keeps its memory accounting
/// exact. Cloning is cheap (the buffer is shared), and so are [`Self::key_bytes`] and
/// [`Self::value_bytes`] (slices of the same buffer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredValue {
    /// `[key_len: u8] ++ key ++ value`.
    data: Bytes,
    meta: ItemMeta,
}

impl StoredValue {
    /// The longest key an item can have.
    pub const MAX_KEY_LEN: usize = u8::MAX as usize;

    /// Fixed bytes charged per item on top of its key and value: the `StoredValue` itself
    /// (its table slot), hashbrown's one control byte per slot, the key-length byte at the
    /// start of the buffer, and an allowance of 48 bytes for the one buffer's allocator
    /// rounding and the 24-byte shared header `Bytes` allocates when the buffer is first
    /// sliced or cloned (a read). An estimate, not a measurement; it only has to be stable
    /// so that accounting adds up.
    pub const OVERHEAD_BYTES: usize = std::mem::size_of::<StoredValue>() + 1 + 1 + 48;

    /// Creates an item with the given metadata, copying key and value into one buffer.
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
        let key_len = u8::try_from(key.len()).map_err(|_| Error::KeyTooLong(key.len()))?;
        let value_len = parts
            .iter()
            .map(|p| p.len())
            .fold(0usize, usize::saturating_add);
        let mut buf =
            Vec::with_capacity(1usize.saturating_add(key.len()).saturating_add(value_len));
        buf.push(key_len);
        buf.extend_from_slice(key);
        for p in parts {
            buf.extend_from_slice(p);
        }
        Ok(Self {
            data: Bytes::from(buf),
            meta,
        })
    }

    fn value_start(&self) -> usize {
        1 + usize::from(self.data.first().copied().unwrap_or(0))
    }

    /// Returns the key.
    #[must_use]
    pub fn key(&self) -> &[u8] {
        self.data.get(1..self.value_start()).unwrap_or_default()
    }

    /// Returns the key as a shared [`Bytes`] (no copy).
    #[must_use]
    pub fn key_bytes(&self) -> Bytes {
        self.data.slice(1..self.value_start())
    }

    /// Returns the value.
    #[must_use]
    pub fn value(&self) -> &[u8] {
        self.data.get(self.value_start()..).unwrap_or_default()
    }

    /// Returns the value as a shared [`Bytes`] (no copy).
    #[must_use]
    pub fn value_bytes(&self) -> Bytes {
        self.data.slice(self.value_start()..)
    }

    /// Returns the value's length in bytes.
    #[must_use]
    pub fn value_len(&self) -> usize {
        self.data.len().saturating_sub(self.value_start())
    }

    /// Returns the metadata.
    #[must_use]
    pub fn meta(&self) -> &ItemMeta {
        &self.meta
    }

    /// Returns the same key and value with other metadata.
    #[must_use]
    pub fn with_meta(mut self, meta: ItemMeta) -> Self {
        self.meta = meta;
        self
    }

    /// Returns the bytes this item is charged for: key + value + [`Self::OVERHEAD_BYTES`].
    #[must_use]
    pub fn footprint(&self) -> usize {
        Self::footprint_for(self.key().len(), self.value_len())
    }

    /// Returns the footprint an item with these key and value lengths would have.
    #[must_use]
    pub fn footprint_for(key_len: usize, value_len: usize) -> usize {
        key_len
            .saturating_add(value_len)
            .saturating_add(Self::OVERHEAD_BYTES)
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
    fn footprint_counts_key_value_and_overhead() {
        let sv = StoredValue::new(b"key", b"value", ItemMeta::default()).unwrap();
        assert_eq!(sv.footprint(), 3 + 5 + StoredValue::OVERHEAD_BYTES);
    }

    #[test]
    fn key_and_value_share_one_buffer() {
        let sv = StoredValue::new(b"key", b"value", ItemMeta::default()).unwrap();
        assert_eq!(sv.key(), b"key");
        assert_eq!(sv.value(), b"value");
        assert_eq!(sv.value_len(), 5);
        assert_eq!(sv.key_bytes().as_ref(), b"key");
        assert_eq!(sv.value_bytes().as_ref(), b"value");
        let empty = StoredValue::new(b"", b"", ItemMeta::default()).unwrap();
        assert_eq!((empty.key(), empty.value()), (&b""[..], &b""[..]));
        let parts =
            StoredValue::with_value_parts(b"k", &[b"ab", b"", b"cd"], ItemMeta::default()).unwrap();
        assert_eq!(parts.value(), b"abcd");
        assert_eq!(parts.key(), b"k");
    }

    #[test]
    fn longest_key_fits_and_longer_is_refused() {
        let key = vec![b'k'; StoredValue::MAX_KEY_LEN];
        let sv = StoredValue::new(&key, b"v", ItemMeta::default()).unwrap();
        assert_eq!(sv.key(), key.as_slice());
        assert_eq!(sv.value(), b"v");
        let long = vec![b'k'; StoredValue::MAX_KEY_LEN + 1];
        assert_eq!(
            StoredValue::new(&long, b"v", ItemMeta::default()),
            Err(Error::KeyTooLong(256))
        );
    }

    #[test]
    fn layout_sizes() {
        assert_eq!(std::mem::size_of::<ItemMeta>(), 40);
        assert_eq!(std::mem::size_of::<StoredValue>(), 72);
    }
}
