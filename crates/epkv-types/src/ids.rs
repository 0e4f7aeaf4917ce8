//! Identifier and counter newtypes: [`Vbid`], [`Seqno`], [`Cas`].

use std::fmt;

/// A vBucket id, `0..NUM_VBUCKETS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Vbid(pub u16);

impl fmt::Display for Vbid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "vb:{}", self.0)
    }
}

/// A per-vBucket sequence number: the position of a mutation in its vBucket's history.
/// Zero means "no mutation yet".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Seqno(pub u64);

impl fmt::Display for Seqno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A compare-and-swap value. In epkv CAS values are hybrid logical clock readings: the
/// top 48 bits are wall-clock nanoseconds with the low 16 bits zeroed, bumped logically
/// when the clock does not advance. Zero means "any CAS" in a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Cas(pub u64);

impl Cas {
    /// The wildcard CAS a request carries when it does not want a CAS check.
    pub const ANY: Cas = Cas(0);

    /// Returns true when this is the wildcard CAS (zero).
    #[must_use]
    pub fn is_any(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for Cas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}
