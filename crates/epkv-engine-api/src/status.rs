//! [`EngineStatus`]: the outcomes of an engine call other than success.

use std::fmt;

/// Why an engine call did not succeed. These are expected outcomes, not errors: each one
/// maps to exactly one wire status in the front end's single exhaustive mapping.
///
/// Deliberately not `#[non_exhaustive]`: the front end matches it without a wildcard arm,
/// so adding a variant fails to compile until the new outcome is mapped to a wire status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineStatus {
    /// The key does not exist (or has expired, or is a deleted tombstone).
    KeyNotFound,
    /// The key exists and the operation required it not to (ADD), or the CAS did not match.
    KeyExists,
    /// The item was not stored (APPEND/PREPEND on a missing key).
    NotStored,
    /// The value is too large for this bucket.
    TooBig,
    /// The request is invalid in a way only the engine can see.
    Invalid,
    /// INCREMENT/DECREMENT on a value that is not a decimal number of at most 20 digits.
    DeltaBadValue,
    /// The vBucket does not exist on this node or is not in a state that allows the operation.
    NotMyVbucket,
    /// The key is locked by GET_LOCKED and the request did not carry the lock's CAS.
    Locked,
    /// UNLOCK_KEY on a key that is not locked.
    NotLocked,
    /// A temporary condition (memory pressure, warmup, a pending vBucket that stayed
    /// pending too long): retry later.
    TempFail,
    /// The bucket is out of memory and cannot make room.
    NoMemory,
    /// The operation is known but switched off (e.g. FLUSH while flush is disabled).
    NotSupported,
    /// The requested durability level is not valid for this bucket.
    DurabilityInvalidLevel,
    /// The durability requirements cannot be met with the current topology.
    DurabilityImpossible,
    /// Another SyncWrite on this key is in progress.
    SyncWriteInProgress,
    /// The SyncWrite's outcome is unknown (timed out).
    SyncWriteAmbiguous,
    /// The stat group does not exist.
    UnknownStatGroup,
    /// The key's collection does not exist (the client refreshes its manifest, whose uid
    /// [`crate::Engine::manifest_uid`] gives).
    UnknownCollection,
    /// The scope does not exist.
    UnknownScope,
    /// A seqno outside what the vBucket has (a DCP stream asked to start past its high
    /// seqno).
    OutOfRange,
    /// The engine has too much of something open to take this (range scans: the owner's
    /// scans or their keys are at their limit); retry later.
    TooBusy,
    /// The vBucket uuid a request named is not the vBucket's current one (a range scan's
    /// snapshot requirements).
    VbUuidNotEqual,
    /// A range scan was cancelled while a continue of it waited.
    RangeScanCancelled,
    /// A logic error inside the engine; logged by the engine with detail.
    Internal,
    /// The operation cannot go on yet: it needs data that is not in memory (an evicted
    /// value; the engine has queued a background fetch of the key), or its vBucket is
    /// pending (being taken over; the operation is parked until the state changes). The
    /// caller registers with [`crate::Engine::when_fetched`] and runs the whole operation
    /// again once notified, as KV-Engine's front end re-executes a command after
    /// `notifyIOComplete`. Never sent to a client.
    WouldBlock,
}

impl fmt::Display for EngineStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::KeyNotFound => "key not found",
            Self::KeyExists => "key exists or cas mismatch",
            Self::NotStored => "not stored",
            Self::TooBig => "value too big",
            Self::Invalid => "invalid arguments",
            Self::DeltaBadValue => "non-numeric value for arithmetic",
            Self::NotMyVbucket => "not my vbucket",
            Self::Locked => "key is locked",
            Self::UnknownCollection => "unknown collection",
            Self::UnknownScope => "unknown scope",
            Self::WouldBlock => "would block: background fetch queued or vbucket pending",
            Self::NotLocked => "key is not locked",
            Self::TempFail => "temporary failure",
            Self::NoMemory => "out of memory",
            Self::NotSupported => "not supported",
            Self::DurabilityInvalidLevel => "invalid durability level",
            Self::DurabilityImpossible => "durability impossible",
            Self::SyncWriteInProgress => "sync write in progress",
            Self::SyncWriteAmbiguous => "sync write ambiguous",
            Self::UnknownStatGroup => "unknown stat group",
            Self::OutOfRange => "seqno out of range",
            Self::Internal => "internal error",
            Self::TooBusy => "too busy",
            Self::VbUuidNotEqual => "vbucket uuid not equal",
            Self::RangeScanCancelled => "range scan cancelled",
        };
        f.write_str(s)
    }
}

impl std::error::Error for EngineStatus {}

/// The result of an engine call.
pub type EngineResult<T> = Result<T, EngineStatus>;
