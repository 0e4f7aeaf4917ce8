//! The crate's error type.

/// What can go wrong in a hash table call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Storing the item would take the shared [`crate::MemoryTracker`] past its limit.
    #[error("memory quota exceeded: {needed} more bytes with {used} of {limit} in use")]
    QuotaExceeded {
        /// Extra bytes the operation needed.
        needed: usize,
        /// Bytes in use when it was refused.
        used: usize,
        /// The tracker's limit.
        limit: usize,
    },
    /// [`crate::Entry::insert`] was given an item whose key is not the entry's key.
    #[error("the stored value's key does not match the entry's key")]
    KeyMismatch,
    /// A table needs at least one lock stripe.
    #[error("invalid stripe count {0}: a table needs at least one stripe")]
    InvalidStripeCount(usize),
    /// A key longer than [`crate::StoredValue::MAX_KEY_LEN`] bytes cannot be stored.
    #[error("key of {0} bytes is longer than the 255 an item can have")]
    KeyTooLong(usize),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;
