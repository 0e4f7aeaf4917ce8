//! Vocabulary types shared by every epkv crate.
//!
//! This crate is the bottom of the dependency graph: small newtypes and enums naming the
//! concepts of a vBucket-partitioned key-value store ([`Vbid`], [`Seqno`], [`Cas`],
//! [`Datatype`], [`VBucketState`], [`DurabilityLevel`]) and the key → vBucket mapping
//! ([`vbucket_for_key`]), plus [`thread_shard`], the per-thread shard index that the
//! sharded counters of the crates above share. It is not a codec (see `epkv-protocol`)
//! and holds no engine logic.
//!
//! Invariants: every type here is plain data (`Copy` where possible), with no I/O and no
//! locks. It depends on no other workspace crate and must never do so.
//!
//! ```
//! use epkv_types::{vbucket_for_key, Vbid, NUM_VBUCKETS};
//! // The mapping every Couchbase client uses (zlib CRC-32 of the key).
//! assert_eq!(vbucket_for_key(b"k1", NUM_VBUCKETS), Vbid(526));
//! assert_eq!(vbucket_for_key(b"k3", NUM_VBUCKETS), Vbid(0));
//! ```
#![forbid(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]

mod datatype;
pub mod doc_key;
pub mod fs;
mod ids;
mod ops;
mod thread_shard;
mod vbucket_state;

pub use datatype::Datatype;
pub use ids::{Cas, Seqno, Vbid};
pub use ops::{ArithmeticOp, StoreOp};
pub use thread_shard::thread_shard;
pub use vbucket_state::{DurabilityLevel, VBucketState};

/// Number of vBuckets in a bucket, as in KV-Engine's on-premises profile (`max_vbuckets`).
pub const NUM_VBUCKETS: u16 = 1024;

/// Longest key the protocol accepts, in bytes (memcached's `KEY_MAX_LENGTH`).
pub const MAX_KEY_LEN: usize = 250;

/// Returns the vBucket a key belongs to: `((crc32(key) >> 16) & 0x7fff) % num_vbuckets`.
///
/// `crc32` is the standard zlib CRC-32 (reflected polynomial 0xEDB88320). This is the
/// mapping Couchbase SDKs and libcouchbase compute on the client side; the key is hashed
/// without any collection prefix.
///
/// # Panics
/// Panics if `num_vbuckets` is zero.
#[must_use]
pub fn vbucket_for_key(key: &[u8], num_vbuckets: u16) -> Vbid {
    let crc = crc32fast::hash(key);
    let bucket = ((crc >> 16) & 0x7fff) % u32::from(num_vbuckets);
    // `bucket < num_vbuckets <= u16::MAX`, so the narrowing cannot lose bits.
    Vbid(bucket as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_keys_map_like_couchbase_clients() {
        assert_eq!(vbucket_for_key(b"k1", NUM_VBUCKETS), Vbid(526));
        assert_eq!(vbucket_for_key(b"k3", NUM_VBUCKETS), Vbid(0));
    }

    proptest::proptest! {
        #[test]
        fn mapping_is_always_in_range(key in proptest::collection::vec(proptest::num::u8::ANY, 0..300), n in 1u16..=1024) {
            proptest::prop_assert!(vbucket_for_key(&key, n).0 < n);
        }
    }
}
