//! Request types passed to [`crate::Engine`] methods.

pub use epkv_types::{ArithmeticOp, StoreOp};
use epkv_types::{Cas, Datatype, DurabilityLevel, Vbid};
use std::time::Duration;

/// A raw expiry value as it arrives on the wire, with memcached's interpretation:
/// 0 means never; 1..=30 days (2,592,000 s) is relative to now; anything larger is an
/// absolute Unix time in seconds (one already in the past expires the item at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Never expires.
    Never,
    /// Expires this many seconds from now (1..=2,592,000).
    Relative(u32),
    /// Expires at this Unix time in seconds.
    Absolute(u32),
}

impl Expiry {
    /// The largest relative expiry in seconds (30 days); larger values are absolute times.
    pub const MAX_RELATIVE_SECS: u32 = 30 * 24 * 60 * 60;

    /// Classifies a raw protocol expiry value.
    #[must_use]
    pub fn from_wire(raw: u32) -> Self {
        match raw {
            0 => Self::Never,
            r if r <= Self::MAX_RELATIVE_SECS => Self::Relative(r),
            r => Self::Absolute(r),
        }
    }

    /// Resolves to an absolute Unix time in seconds given the current Unix time; 0 = never.
    /// An absolute time at or before `now` resolves to `now`, i.e. already expired.
    #[must_use]
    pub fn to_unix_secs(self, now_unix_secs: u32) -> u32 {
        match self {
            Self::Never => 0,
            Self::Relative(r) => now_unix_secs.saturating_add(r),
            Self::Absolute(a) => a.max(1),
        }
    }
}

/// Durability requirements from frame info id 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurabilityRequirements {
    /// The level asked for.
    pub level: DurabilityLevel,
    /// The timeout the client gave, or `None` for the bucket default.
    pub timeout: Option<Duration>,
}

/// A SET / ADD / REPLACE / APPEND / PREPEND.
///
/// Key and value are borrowed from the request packet: the engine copies them once, into
/// the item it stores, so the front end never allocates for a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreRequest<'a> {
    /// Which store.
    pub op: StoreOp,
    /// The vBucket named in the request header.
    pub vbid: Vbid,
    /// The key (1..=250 bytes, validated by the front end).
    pub key: &'a [u8],
    /// The value.
    pub value: &'a [u8],
    /// Client flags (ignored by APPEND/PREPEND, which keep the existing flags).
    pub flags: u32,
    /// Raw expiry (ignored by APPEND/PREPEND).
    pub expiry: Expiry,
    /// Keep the existing document's expiry instead of `expiry` (frame info id 5).
    pub preserve_ttl: bool,
    /// Datatype of the value.
    pub datatype: Datatype,
    /// CAS the document must currently have, or [`Cas::ANY`].
    pub cas: Cas,
    /// Durability requirements, if this is a SyncWrite.
    pub durability: Option<DurabilityRequirements>,
}

/// A DELETE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoveRequest<'a> {
    /// The vBucket named in the request header.
    pub vbid: Vbid,
    /// The key.
    pub key: &'a [u8],
    /// CAS the document must currently have, or [`Cas::ANY`].
    pub cas: Cas,
    /// Durability requirements, if this is a SyncWrite.
    pub durability: Option<DurabilityRequirements>,
}

/// An INCREMENT / DECREMENT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArithmeticRequest<'a> {
    /// Which way.
    pub op: ArithmeticOp,
    /// The vBucket named in the request header.
    pub vbid: Vbid,
    /// The key.
    pub key: &'a [u8],
    /// The amount.
    pub delta: u64,
    /// The value to create the key with when it is missing.
    pub initial: u64,
    /// Raw expiry for a created key. `0xffff_ffff` means "do not create": a missing key
    /// is then [`crate::EngineStatus::KeyNotFound`].
    pub expiry_raw: u32,
    /// CAS the document must currently have, or [`Cas::ANY`].
    pub cas: Cas,
    /// Durability requirements, if this is a SyncWrite.
    pub durability: Option<DurabilityRequirements>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_follows_memcached_rules() {
        assert_eq!(Expiry::from_wire(0), Expiry::Never);
        assert_eq!(Expiry::from_wire(10), Expiry::Relative(10));
        assert_eq!(
            Expiry::from_wire(Expiry::MAX_RELATIVE_SECS),
            Expiry::Relative(2_592_000)
        );
        assert_eq!(Expiry::from_wire(2_592_001), Expiry::Absolute(2_592_001));
        assert_eq!(Expiry::Relative(10).to_unix_secs(1_000), 1_010);
        assert_eq!(Expiry::Never.to_unix_secs(1_000), 0);
        assert_eq!(Expiry::Absolute(5_000_000).to_unix_secs(1_000), 5_000_000);
    }
}
