//! Document keys with their collection: the client's LEB128 collection prefix, and the
//! engine's own encoding of (collection, key).
//!
//! **On the wire** (HELLO Collections), a key starts with its collection id in unsigned
//! LEB128, canonical and at most 5 bytes (kv_engine's `docs/Collections.md`):
//! [`leb128_decode`], [`leb128_encode`].
//!
//! **In the engine and on disk** a key of the default collection is stored as it is, so
//! that buckets that never use collections pay nothing (no byte per key, the data files
//! of format version 1 read as they are). A key of the default collection that itself
//! starts with a zero byte is escaped with a second zero byte, and a key of another
//! collection is a zero byte, the LEB128 id (whose first byte is never zero, since ids
//! 1-7 are reserved and never used) and the key:
//!
//! | collection | key      | stored              |
//! |-----------:|----------|---------------------|
//! | 0          | `k`      | `k`                 |
//! | 0          | `\0k`    | `\0 \0 \0k`         |
//! | 8          | `k`      | `\0 08 k`           |
//! | 0x555      | `k`      | `\0 d5 0a k`        |
//!
//! The encoding is injective, so keys of different collections never meet in a hash
//! table or a data file. The LEB128 code is written here rather than taken from a crate:
//! it is a dozen lines, and the canonical-form and 5-byte checks are kv_engine's rules.
//!
//! ```
//! use epkv_types::doc_key::{decode, encode, DocKeyBuf};
//! let mut buf = DocKeyBuf::new();
//! assert_eq!(encode(0, b"k", &mut buf), b"k");
//! assert_eq!(encode(8, b"k", &mut buf), b"\0\x08k");
//! assert_eq!(decode(b"\0\x08k"), (8, &b"k"[..]));
//! assert_eq!(decode(b"k"), (0, &b"k"[..]));
//! ```

/// The default collection's id (and the default scope's).
pub const DEFAULT_COLLECTION: u32 = 0;
/// Most bytes a LEB128 collection id may take.
pub const MAX_LEB128_LEN: usize = 5;
/// Longest engine key: an escape byte, a 5-byte id and a 250-byte key.
pub const MAX_DOC_KEY_LEN: usize = 1 + MAX_LEB128_LEN + crate::MAX_KEY_LEN;

/// Room for an encoded key (on the stack), filled only when a key needs it: most keys
/// of the default collection are used as they are, so a request pays nothing for it.
#[derive(Debug, Clone)]
pub struct DocKeyBuf(Option<[u8; MAX_DOC_KEY_LEN]>);

impl DocKeyBuf {
    /// An empty buffer.
    #[must_use]
    pub fn new() -> Self {
        Self(None)
    }

    fn bytes(&mut self) -> &mut [u8; MAX_DOC_KEY_LEN] {
        self.0.get_or_insert([0; MAX_DOC_KEY_LEN])
    }

    /// Writes the wire form of `key` in collection `cid` (its LEB128 id, then the key, as
    /// a client that negotiated collections sends it) and returns it.
    pub fn put_wire(&mut self, cid: u32, key: &[u8]) -> &[u8] {
        let mut leb = [0; MAX_LEB128_LEN];
        let n = leb128_encode(cid, &mut leb);
        let b = self.bytes();
        b[..n].copy_from_slice(&leb[..n]);
        let len = (n + key.len()).min(MAX_DOC_KEY_LEN);
        b[n..len].copy_from_slice(&key[..len - n]);
        &b[..len]
    }
}

impl Default for DocKeyBuf {
    fn default() -> Self {
        Self::new()
    }
}

/// Decodes a canonical unsigned LEB128 u32 of at most 5 bytes at the start of `b`:
/// the value and the bytes it took. `None` without a stop byte in 5 bytes, for a
/// non-canonical form (a trailing zero group) or a value past `u32::MAX`.
#[must_use]
pub fn leb128_decode(b: &[u8]) -> Option<(u32, usize)> {
    let mut v: u64 = 0;
    for (i, &byte) in b.iter().take(MAX_LEB128_LEN).enumerate() {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            if i > 0 && byte == 0 {
                return None;
            }
            return u32::try_from(v).ok().map(|v| (v, i + 1));
        }
    }
    None
}

/// Encodes `v` as canonical unsigned LEB128 into `out`; returns the bytes used.
pub fn leb128_encode(mut v: u32, out: &mut [u8; MAX_LEB128_LEN]) -> usize {
    let mut n = 0;
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out[n] = byte;
            return n + 1;
        }
        out[n] = byte | 0x80;
        n += 1;
    }
}

/// The engine key of `key` in collection `cid`: `key` itself when it needs no prefix,
/// else written into `buf`.
pub fn encode<'a>(cid: u32, key: &'a [u8], buf: &'a mut DocKeyBuf) -> &'a [u8] {
    if cid == DEFAULT_COLLECTION && key.first() != Some(&0) {
        return key;
    }
    let b = buf.bytes();
    b[0] = 0;
    let n = if cid == DEFAULT_COLLECTION {
        b[1] = 0;
        2
    } else {
        let mut leb = [0; MAX_LEB128_LEN];
        let used = leb128_encode(cid, &mut leb);
        b[1..=used].copy_from_slice(&leb[..used]);
        1 + used
    };
    let len = (n + key.len()).min(b.len());
    b[n..len].copy_from_slice(&key[..len - n]);
    &b[..len]
}

/// The collection and key of an engine key (inverse of [`encode`]). A key that
/// [`encode`] cannot produce (a zero byte followed by a bad id) reads as a key of the
/// default collection.
#[must_use]
pub fn decode(doc_key: &[u8]) -> (u32, &[u8]) {
    match doc_key {
        [0, 0, rest @ ..] => (DEFAULT_COLLECTION, rest),
        [0, rest @ ..] => match leb128_decode(rest) {
            Some((cid, n)) if cid != DEFAULT_COLLECTION => (cid, &rest[n..]),
            _ => (DEFAULT_COLLECTION, doc_key),
        },
        _ => (DEFAULT_COLLECTION, doc_key),
    }
}

/// The collection of an engine key.
#[must_use]
pub fn collection_of(doc_key: &[u8]) -> u32 {
    if doc_key.first() != Some(&0) {
        return DEFAULT_COLLECTION;
    }
    decode(doc_key).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leb128_matches_kv_engines_table_and_refuses_bad_forms() {
        let table: &[(u32, &[u8])] = &[
            (0x00, &[0x00]),
            (0x01, &[0x01]),
            (0x7f, &[0x7f]),
            (0x80, &[0x80, 0x01]),
            (0x555, &[0xd5, 0x0a]),
            (0x7fff, &[0xff, 0xff, 0x01]),
            (0xffff, &[0xff, 0xff, 0x03]),
            (0x0caf_ef00, &[0x80, 0xde, 0xbf, 0x65]),
            (0xcafe_f00d, &[0x8d, 0xe0, 0xfb, 0xd7, 0x0c]),
            (u32::MAX, &[0xff, 0xff, 0xff, 0xff, 0x0f]),
        ];
        for &(v, bytes) in table {
            let mut out = [0; MAX_LEB128_LEN];
            let n = leb128_encode(v, &mut out);
            assert_eq!(&out[..n], bytes, "{v:#x}");
            let mut with_key = bytes.to_vec();
            with_key.extend_from_slice(b"key");
            assert_eq!(leb128_decode(&with_key), Some((v, bytes.len())));
        }
        // No stop byte in 5 bytes; non-canonical; too large; empty.
        assert_eq!(leb128_decode(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x00]), None);
        assert_eq!(leb128_decode(&[0x81, 0x00]), None);
        assert_eq!(leb128_decode(&[0xff, 0xff, 0xff, 0xff, 0x1f]), None);
        assert_eq!(leb128_decode(&[]), None);
        assert_eq!(leb128_decode(&[0x80]), None);
    }

    #[test]
    fn engine_keys_round_trip_and_never_collide() {
        let keys: &[&[u8]] = &[b"k", b"\0k", b"\0", b"\0\0", b"\x08k", b"\0\x08k", b""];
        let cids = [0u32, 8, 9, 0x555, u32::MAX];
        let mut seen = std::collections::HashMap::new();
        for &cid in &cids {
            for &k in keys {
                let mut buf = DocKeyBuf::new();
                let enc = encode(cid, k, &mut buf).to_vec();
                assert_eq!(decode(&enc), (cid, k), "{cid} {k:?}");
                assert_eq!(collection_of(&enc), cid);
                assert!(seen.insert(enc, (cid, k)).is_none(), "{cid} {k:?} collides");
            }
        }
    }
}
