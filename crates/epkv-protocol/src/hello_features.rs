//! The feature list a HELLO request carries in its value.

use crate::feature::Feature;

/// The u16 feature codes of a HELLO request, borrowed from its value (even length,
/// checked by [`crate::Command::decode`]). Unknown codes are kept; the server simply does
/// not agree to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloFeatures<'a> {
    raw: &'a [u8],
}

impl<'a> HelloFeatures<'a> {
    /// Wraps a HELLO value. An odd trailing byte is ignored (decode rejects odd lengths).
    #[must_use]
    pub fn new(raw: &'a [u8]) -> HelloFeatures<'a> {
        HelloFeatures { raw }
    }

    /// Returns the raw value bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &'a [u8] {
        self.raw
    }

    /// Returns the number of feature codes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.raw.len() / 2
    }

    /// Returns true when no feature was requested.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Iterates over the raw codes in request order.
    pub fn codes(&self) -> impl Iterator<Item = u16> + 'a {
        self.raw
            .chunks_exact(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
    }

    /// Iterates over the codes that name a known [`Feature`], in request order.
    pub fn known(&self) -> impl Iterator<Item = Feature> + 'a {
        self.codes().filter_map(Feature::from_u16)
    }
}
