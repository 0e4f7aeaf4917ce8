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

/// A sub-document operation (kv_engine `docs/SubDocument.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubdocOp {
    /// The value at the path.
    Get,
    /// Whether the path exists.
    Exists,
    /// The number of elements of the array or object at the path.
    GetCount,
    /// Add a key that must not exist.
    DictAdd,
    /// Set a key.
    DictUpsert,
    /// Remove the value at the path.
    Delete,
    /// Replace the value at the path (the whole document for the empty path).
    Replace,
    /// Append values to an array.
    ArrayPushLast,
    /// Prepend values to an array.
    ArrayPushFirst,
    /// Insert values at an array position.
    ArrayInsert,
    /// Append a primitive to an array unless present.
    ArrayAddUnique,
    /// Add a signed delta to a number (created at 0).
    Counter,
    /// Replace the whole body (MULTI_MUTATION's SET, 0x01, with an empty path).
    SetDoc,
    /// Delete the document (MULTI_MUTATION's DELETE, 0x04, with an empty path): its
    /// user attributes and body go, its system attributes stay in the tombstone.
    DeleteDoc,
    /// Replace the body with the value of an extended attribute (0xd3).
    ReplaceBodyWithXattr,
}

impl SubdocOp {
    /// True for the operations that read only.
    #[must_use]
    pub fn is_lookup(self) -> bool {
        matches!(self, Self::Get | Self::Exists | Self::GetCount)
    }
}

/// One path of a sub-document request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubdocSpec<'a> {
    /// What to do.
    pub op: SubdocOp,
    /// Create missing intermediate objects (path flag `MKDIR_P`).
    pub mkdir_p: bool,
    /// The path.
    pub path: &'a [u8],
    /// The value (empty for lookups and DELETE).
    pub value: &'a [u8],
    /// The path is an extended attribute (path flag `XATTR`): its first component is
    /// the attribute's key.
    pub xattr: bool,
    /// Expand the macros `${Mutation.CAS}`, `${Mutation.seqno}` and
    /// `${Mutation.value_crc32c}` in the value (path flag `EXPAND_MACROS`, with `xattr`).
    pub expand_macros: bool,
    /// The attribute value is binary (path flag `BINARY_VALUE`, with `xattr`): a write
    /// stores it base64 encoded in a JSON string, a GET (and REPLACE_BODY_WITH_XATTR)
    /// decodes it.
    pub binary: bool,
}

/// Why one sub-document path failed (statuses 0xc0-0xca).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubdocError {
    /// A component of the path does not exist.
    PathNotFound,
    /// The path goes through a value of the wrong kind.
    PathMismatch,
    /// The path does not parse.
    PathInvalid,
    /// The path is too long or too deep.
    PathTooBig,
    /// The document nests too deeply.
    DocTooDeep,
    /// The value cannot be inserted there.
    ValueCantInsert,
    /// The document is not JSON.
    DocNotJson,
    /// A counter would overflow.
    NumRange,
    /// The counter delta is not a valid non-zero integer.
    DeltaInvalid,
    /// The path exists already.
    PathExists,
    /// The value to insert nests too deeply.
    ValueTooDeep,
    /// The path names a virtual attribute that does not exist.
    UnknownVattr,
    /// A mutation of a virtual attribute (they are read-only).
    CantModifyVattr,
    /// A `${...}` macro that does not exist.
    UnknownMacro,
    /// A document macro (`${$document.PATH}`) naming a path `$document` does not have.
    UnknownVattrMacro,
    /// REVIVE of a document that is not deleted.
    CanOnlyReviveDeleted,
    /// A deleted document (created or changed with its tombstone kept) cannot have a
    /// body.
    DeletedDocCantHaveValue,
    /// A BINARY_VALUE read of a value that is not a binary one.
    NotBinaryValue,
}

/// What a sub-document lookup found: the document's CAS and each path's outcome, in
/// request order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubdocLookup {
    /// The document's CAS.
    pub cas: Cas,
    /// The document is deleted (a tombstone read with ACCESS_DELETED).
    pub deleted: bool,
    /// Each path's value (empty for EXISTS) or error.
    pub results: Vec<Result<Vec<u8>, SubdocError>>,
}

/// How a sub-document lookup reads its document (the request's doc flags).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LookupFlags {
    /// Read the document's tombstone when it is deleted (ACCESS_DELETED).
    pub access_deleted: bool,
    /// Read the copy of a replica vBucket (the ReplicaRead doc flag, KV-Engine 7.6): the
    /// vBucket must be a replica here, as for GET_REPLICA.
    pub replica_read: bool,
}

/// A sub-document mutation request.
#[derive(Debug, Clone, Copy)]
pub struct SubdocMutation<'a> {
    /// The vBucket.
    pub vbid: Vbid,
    /// The document.
    pub key: &'a [u8],
    /// The paths, applied in order, all or none.
    pub specs: &'a [SubdocSpec<'a>],
    /// Required CAS (`Cas::ANY` for none).
    pub cas: Cas,
    /// The document's new expiry (raw wire value; 0 = none).
    pub expiry_raw: u32,
    /// Keep the document's expiry instead (PreserveTtl frame).
    pub preserve_ttl: bool,
    /// The document's new flags (the request's user flags, KV-Engine 7.6); `None` keeps
    /// the current ones (0 for a new document).
    pub flags: Option<u32>,
    /// Create the document if missing (doc flag `MKDOC`).
    pub mkdoc: bool,
    /// Create the document, which must not exist (doc flag `ADD`).
    pub add: bool,
    /// Operate on the document's tombstone if it is deleted (doc flag `ACCESS_DELETED`).
    pub access_deleted: bool,
    /// With `mkdoc` or `add`: create the document deleted, with attributes and no body
    /// (doc flag `CREATE_AS_DELETED`).
    pub create_as_deleted: bool,
    /// With `access_deleted`: make a deleted document live again (doc flag `REVIVE`).
    pub revive: bool,
    /// Durability requirements.
    pub durability: Option<crate::DurabilityRequirements>,
}

/// How a sub-document mutation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubdocMutated {
    /// Every path applied: the mutation, and the values some paths return (COUNTER's),
    /// with their index.
    Done {
        /// The stored mutation.
        info: MutationInfo,
        /// `(spec index, value)` for each path that returns a value.
        values: Vec<(u8, Vec<u8>)>,
        /// The document is deleted after it (CREATE_AS_DELETED, a whole-document DELETE,
        /// or a tombstone's attributes changed with ACCESS_DELETED).
        deleted: bool,
    },
    /// The request cannot apply to the document as it is (REVIVE of a live document,
    /// a body for a deleted one); nothing changed. The error is the command's status.
    Refused(SubdocError),
    /// A path failed; nothing changed.
    Failed {
        /// The index of the first spec that failed.
        index: u8,
        /// Why.
        error: SubdocError,
    },
}
