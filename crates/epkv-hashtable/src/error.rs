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
    /// An [`crate::Entry`] was given an item whose key is not the entry's key.
    #[error("the stored value's key does not match the entry's key")]
    KeyMismatch,
    /// A committed item was given where a prepare belongs, or the other way round.
    #[error("the stored value's committed state does not fit this slot")]
    WrongState,
    /// The operation needs a version of the key that is not there.
    #[error("no such version of the key")]
    NotFound,
    /// A table needs at least one lock stripe.
    #[error("invalid stripe count {0}: a table needs at least one stripe")]
    InvalidStripeCount(usize),
    /// A key longer than [`crate::StoredValue::MAX_KEY_LEN`] bytes cannot be stored.
    #[error("key of {0} bytes is longer than the 255 an item can have")]
    KeyTooLong(usize),
    /// A value longer than [`crate::StoredValue::MAX_VALUE_LEN`] bytes cannot be stored.
    #[error("value of {0} bytes is longer than an item can have")]
    ValueTooLong(usize),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;
