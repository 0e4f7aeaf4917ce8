//! Range scans: the requests and results of [`crate::Engine::range_scan_create`],
//! [`crate::Engine::range_scan_continue`] and [`crate::Engine::range_scan_cancel`]
//! (KV-Engine's RANGE_SCAN_CREATE, RANGE_SCAN_CONTINUE and RANGE_SCAN_CANCEL).
//!
//! A scan reads one collection of one active vBucket: the keys of a key range, or a random
//! sample of the collection's keys, fixed when the scan is created (later writes do not
//! change which keys it returns). Each continue returns the next keys, or documents, up to
//! the client's limits.

use std::time::Duration;

/// A scan's id: 16 bytes the engine picks at random (a version 4 UUID), which the client
/// presents to continue or cancel the scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RangeScanId(pub [u8; 16]);

/// One end of a key range: a raw key (without its collection) and whether the range
/// includes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanBound {
    /// The range includes the key.
    Inclusive(Vec<u8>),
    /// The range excludes the key.
    Exclusive(Vec<u8>),
}

/// What a scan returns: a key range, or a sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeScanKind {
    /// Every key from `start` to `end` (in key order, raw bytes compared).
    Range {
        /// The first key.
        start: ScanBound,
        /// The last key.
        end: ScanBound,
    },
    /// `min(samples, items)` keys of the collection drawn at random with a generator
    /// seeded by `seed` (the same seed over the same keys draws the same sample),
    /// returned in key order.
    Sampling {
        /// How many keys (at least 1).
        samples: u64,
        /// The generator's seed.
        seed: u32,
    },
}

/// Whether a scan returns keys or whole documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanContent {
    /// Keys only.
    Keys,
    /// Keys with their metadata and values.
    Documents,
}

/// What the vBucket must have before a scan opens (the SDKs' `consistent_with`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotRequirements {
    /// The vBucket's current uuid (its failover log's newest entry); another one answers
    /// [`crate::EngineStatus::VbUuidNotEqual`].
    pub vb_uuid: u64,
    /// The seqno that must be persisted (reached, in a memory-only bucket).
    pub seqno: u64,
    /// The mutation at `seqno` must still be the newest version of its key
    /// ([`crate::EngineStatus::NotStored`] otherwise).
    pub seqno_exists: bool,
    /// How long the create may wait for `seqno`; `None` answers
    /// [`crate::EngineStatus::TempFail`] at once when it is not there yet.
    pub timeout: Option<Duration>,
}

/// A RANGE_SCAN_CREATE, as the engine gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeScanCreate {
    /// The collection scanned.
    pub collection: u32,
    /// The range or the sample.
    pub kind: RangeScanKind,
    /// Keys or documents.
    pub content: ScanContent,
    /// What the vBucket must have first.
    pub snapshot: Option<SnapshotRequirements>,
    /// Who opens the scan (a connection): the engine bounds the scans, and their memory,
    /// per owner, and [`crate::Engine::range_scan_release`] closes an owner's scans.
    pub owner: u64,
}

/// What [`crate::Engine::range_scan_create`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeScanCreated {
    /// The scan is open.
    Ready(RangeScanId),
    /// The scan waits for something first (its seqno to be persisted, its keys to be read
    /// from disk): the caller waits with [`crate::Engine::when_range_scan_ready`], then
    /// calls [`crate::Engine::range_scan_create`] again with this id as `resume`.
    Pending(RangeScanId),
}

/// A continue's limits (0 = none); the engine may stop earlier (it bounds the bytes one
/// continue returns, see its docs), answering [`RangeScanProgress::More`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RangeScanLimits {
    /// Most keys or documents.
    pub items: u32,
    /// Most time spent.
    pub time: Duration,
    /// Bytes (keys plus values) after which no further item is added.
    pub bytes: u32,
}

/// How a continue ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeScanProgress {
    /// A limit was reached: the scan may have more (RangeScanMore).
    More,
    /// The scan reached its end and is closed (RangeScanComplete).
    Complete,
}

/// One document a continue returns, lent to the caller's callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanDocument<'a> {
    /// The key, raw (without its collection).
    pub key: &'a [u8],
    /// The value as stored (with its extended attributes and compression, which
    /// `datatype` names).
    pub value: &'a [u8],
    /// Client flags.
    pub flags: u32,
    /// Absolute expiry, Unix seconds (0 = never).
    pub expiry: u32,
    /// The seqno of this version.
    pub seqno: u64,
    /// Its CAS.
    pub cas: u64,
    /// Datatype bits of `value`.
    pub datatype: epkv_types::Datatype,
}

/// One item a continue returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanItem<'a> {
    /// A key (raw, without its collection) of a keys-only scan.
    Key(&'a [u8]),
    /// A document of a documents scan.
    Document(ScanDocument<'a>),
}
