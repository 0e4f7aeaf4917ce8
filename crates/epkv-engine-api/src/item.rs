//! [`Item`], [`ItemView`] and [`MutationInfo`]: what the engine hands back to the front end.

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

impl Item {
    /// Borrows the item as an [`ItemView`].
    #[must_use]
    pub fn view(&self) -> ItemView<'_> {
        ItemView {
            key: &self.key,
            value: &self.value,
            flags: self.flags,
            expiry_unix_secs: self.expiry_unix_secs,
            datatype: self.datatype,
            cas: self.cas,
            vbid: self.vbid,
            seqno: self.seqno,
        }
    }
}

/// A document lent by the engine for the length of one [`crate::Engine::get_with`]
/// callback: the same fields as [`Item`], borrowed instead of shared, so a read that only
/// copies the document into a reply allocates nothing and touches no reference count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemView<'a> {
    /// The key.
    pub key: &'a [u8],
    /// The value.
    pub value: &'a [u8],
    /// Opaque client flags.
    pub flags: u32,
    /// Absolute expiry time in seconds since the Unix epoch; 0 means never.
    pub expiry_unix_secs: u32,
    /// Datatype bits of the value.
    pub datatype: Datatype,
    /// The document's CAS (`u64::MAX` for a locked document, as in [`Item::cas`]).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_borrows_every_field_of_the_item() {
        let item = Item {
            key: Bytes::from_static(b"key"),
            value: Bytes::from_static(b"value"),
            flags: 7,
            expiry_unix_secs: 9,
            datatype: Datatype::JSON,
            cas: Cas(11),
            vbid: Vbid(13),
            seqno: Seqno(15),
        };
        let v = item.view();
        assert_eq!(
            v,
            ItemView {
                key: b"key",
                value: b"value",
                flags: 7,
                expiry_unix_secs: 9,
                datatype: Datatype::JSON,
                cas: Cas(11),
                vbid: Vbid(13),
                seqno: Seqno(15),
            }
        );
        assert_eq!(
            v.value.as_ptr(),
            item.value.as_ptr(),
            "borrowed, not copied"
        );
    }
}

/// A document's metadata, for a live document or a tombstone (GET_META).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DocMeta {
    /// The document's (or the tombstone's) CAS.
    pub cas: Cas,
    /// True for a deleted document whose tombstone is still kept.
    pub deleted: bool,
    /// Client flags (0 for most tombstones).
    pub flags: u32,
    /// Absolute expiry in Unix seconds; 0 means never.
    pub expiry_unix_secs: u32,
    /// The seqno of the version.
    pub seqno: Seqno,
    /// The revision seqno (how many times the key was mutated).
    pub rev_seqno: u64,
    /// Datatype bits.
    pub datatype: Datatype,
}

/// A key's state as OBSERVE reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyState {
    /// Live, in memory, not yet on disk.
    NotPersisted,
    /// Live and on disk.
    Persisted,
    /// No such document (or its deletion is on disk).
    NotFound,
    /// Deleted, the deletion not yet on disk.
    LogicallyDeleted,
}
