//! Kinds of write shared by the wire codec and the engine API, declared once.

/// Which store a SET-family request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreOp {
    /// SET: store unconditionally (or if the CAS matches).
    Set,
    /// ADD: store only if the key does not exist.
    Add,
    /// REPLACE: store only if the key exists (and the CAS matches, if given).
    Replace,
    /// APPEND: append to the existing value; the key must exist.
    Append,
    /// PREPEND: prepend to the existing value; the key must exist.
    Prepend,
}

/// Which way an INCREMENT/DECREMENT counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArithmeticOp {
    /// Add the delta; wraps at 2^64 as memcached does.
    Increment,
    /// Subtract the delta; never goes below zero.
    Decrement,
}
