//! [`Item`] and [`MutationInfo`]: what the engine hands back to the front end.

use bytes::Bytes;
use epkv_types::{Cas, Datatype, Seqno, Vbid};

/// A document as returned by a read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// The key.
    pub key: Bytes,
    /// The value (shared, not copied).
    pub value: Bytes,
    /// Opaque client flags.
    pub flags: u32,
    /// Absolute expiry time in seconds since the Unix epoch; 0 means never.
    pub expiry_unix_secs: u32,
    /// Datatype bits of the value.
    pub datatype: Datatype,
    /// The document's CAS. For a locked document read by anyone but the locker this is
    /// `u64::MAX`, as in KV-Engine, so a CAS taken from it can never unlock or overwrite.
    pub cas: Cas,
    /// The vBucket that holds it.
    pub vbid: Vbid,
    /// The seqno of the mutation that produced this version.
    pub seqno: Seqno,
}

/// What a successful mutation reports back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MutationInfo {
    /// The new CAS of the document (for a delete: the tombstone's CAS).
    pub cas: Cas,
    /// The vBucket's current failover UUID.
    pub vbucket_uuid: u64,
    /// The seqno assigned to the mutation.
    pub seqno: Seqno,
}

/// One entry of a vBucket's failover log: the history branch `uuid` began at `seqno`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailoverEntry {
    /// The branch's vBucket UUID.
    pub uuid: u64,
    /// The seqno the branch began at.
    pub seqno: Seqno,
}

/// A vBucket's seqnos and failover log, as OBSERVE_SEQNO reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VBucketSeqnos {
    /// The failover log, newest entry first; the first entry's uuid is the vBucket's
    /// current UUID. Never empty.
    pub failover_log: Vec<FailoverEntry>,
    /// The seqno of the last mutation applied in memory.
    pub high_seqno: Seqno,
    /// The seqno of the last mutation durably persisted (0 when nothing is).
    pub persisted_seqno: Seqno,
}
