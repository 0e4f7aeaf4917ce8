//! The document datatype bit set carried in every packet header and stored with each item.

/// Document datatype bits (kv_engine `docs/Document.md`): JSON 0x01, Snappy 0x02,
/// Xattr 0x04. Zero is raw bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Datatype(pub u8);

impl Datatype {
    /// Raw bytes.
    pub const RAW: Datatype = Datatype(0);
    /// The value is a JSON document.
    pub const JSON: Datatype = Datatype(0x01);
    /// The value is Snappy-compressed.
    pub const SNAPPY: Datatype = Datatype(0x02);
    /// The value starts with extended attributes.
    pub const XATTR: Datatype = Datatype(0x04);
    /// Every bit that has a meaning.
    pub const ALL: Datatype = Datatype(0x07);

    /// Returns true when every bit of `other` is set in `self`.
    #[must_use]
    pub fn contains(self, other: Datatype) -> bool {
        self.0 & other.0 == other.0
    }

    /// Returns true when only known bits are set.
    #[must_use]
    pub fn is_valid(self) -> bool {
        self.0 & !Self::ALL.0 == 0
    }

    /// Returns the bits of `self` that are also in `mask`.
    #[must_use]
    pub fn intersect(self, mask: Datatype) -> Datatype {
        Datatype(self.0 & mask.0)
    }

    /// Returns the bits of `self` and of `other`.
    #[must_use]
    pub fn union(self, other: Datatype) -> Datatype {
        Datatype(self.0 | other.0)
    }

    /// Returns `self` without the bits of `other`.
    #[must_use]
    pub fn without(self, other: Datatype) -> Datatype {
        Datatype(self.0 & !other.0)
    }
}
