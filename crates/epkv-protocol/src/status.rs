//! The response status table, declared once.

macro_rules! statuses {
    ($( $(#[$doc:meta])* $name:ident = $value:literal, $text:literal; )*) => {
        /// A response status (kv_engine `cb::mcbp::Status`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u16)]
        #[non_exhaustive]
        pub enum Status {
            $( $(#[$doc])* $name = $value, )*
        }

        impl Status {
            /// Every status in the table.
            pub const ALL: &'static [Status] = &[ $( Status::$name, )* ];

            /// Returns the status for a wire value, or `None` if unknown.
            #[must_use]
            pub fn from_u16(v: u16) -> Option<Status> {
                match v {
                    $( $value => Some(Status::$name), )*
                    _ => None,
                }
            }

            /// Returns the wire value.
            #[must_use]
            pub fn as_u16(self) -> u16 {
                self as u16
            }

            /// Returns a short human-readable description, used as the body of error replies
            /// (memcached sends such a text with its error statuses).
            #[must_use]
            pub fn message(self) -> &'static str {
                match self {
                    $( Status::$name => $text, )*
                }
            }
        }
    };
}

statuses! {
    /// Success.
    Success = 0x00, "Success";
    /// Key not found.
    KeyEnoent = 0x01, "Not found";
    /// Key exists / CAS mismatch.
    KeyEexists = 0x02, "Data exists for key";
    /// Value too large.
    E2big = 0x03, "Too large";
    /// Invalid arguments.
    Einval = 0x04, "Invalid arguments";
    /// Item not stored.
    NotStored = 0x05, "Not stored";
    /// Non-numeric value for INCREMENT/DECREMENT.
    DeltaBadval = 0x06, "Non-numeric server-side value for incr or decr";
    /// The vBucket is not on this node.
    NotMyVbucket = 0x07, "I'm not responsible for this vbucket";
    /// No bucket selected.
    NoBucket = 0x08, "Not connected to a bucket";
    /// The key is locked.
    Locked = 0x09, "Resource locked";
    /// The key is not locked.
    NotLocked = 0x0e, "Requested resource not locked";
    /// Authentication failed.
    AuthError = 0x20, "Auth failure";
    /// Continue authentication.
    AuthContinue = 0x21, "Auth continue";
    /// Range error.
    Erange = 0x22, "Outside range";
    /// A DCP stream request must roll back first (the value is the seqno to roll back to).
    Rollback = 0x23, "Rollback required";
    /// No access.
    Eaccess = 0x24, "No access";
    /// Unknown frame info id.
    UnknownFrameInfo = 0x80, "Unknown frame info";
    /// Unknown command.
    UnknownCommand = 0x81, "Unknown command";
    /// Out of memory.
    Enomem = 0x82, "Out of memory";
    /// Not supported.
    NotSupported = 0x83, "Not supported";
    /// Internal error.
    Einternal = 0x84, "Internal error";
    /// Busy.
    Ebusy = 0x85, "System is busy";
    /// Temporary failure.
    Etmpfail = 0x86, "Temporary failure";
    /// The key's collection does not exist (the value carries the manifest uid).
    UnknownCollection = 0x88, "Unknown Collection";
    /// The scope does not exist (the value carries the manifest uid).
    UnknownScope = 0x8c, "Unknown Scope";
    /// Invalid durability level.
    DurabilityInvalidLevel = 0xa0, "Invalid durability level";
    /// Durability impossible.
    DurabilityImpossible = 0xa1, "Durability impossible";
    /// A SyncWrite is in progress on the key.
    SyncWriteInProgress = 0xa2, "Synchronous write in progress";
    /// The SyncWrite's outcome is unknown.
    SyncWriteAmbiguous = 0xa3, "Synchronous write ambiguous";
    /// A SyncWrite re-commit is in progress.
    SyncWriteReCommitInProgress = 0xa4, "Synchronous write re-commit in progress";
    /// Range scan: the scan was cancelled while a continue was returning its data.
    RangeScanCancelled = 0xa5, "The range scan was cancelled";
    /// Range scan: the continue reached a limit; the scan may have more (continue again).
    RangeScanMore = 0xa6, "The range scan has more data available";
    /// Range scan: the scan reached the end of its range and is closed.
    RangeScanComplete = 0xa7, "The range scan has completed";
    /// Range scan: the snapshot requirements name a vBucket uuid that is not the
    /// vBucket's current one.
    VbUuidNotEqual = 0xa8, "The vbucket uuid does not equal the server's vbucket uuid";
    /// Sub-document: a component of the path does not exist.
    SubdocPathEnoent = 0xc0, "Subdoc: Path not does not exist";
    /// Sub-document: the path goes through a value of the wrong kind.
    SubdocPathMismatch = 0xc1, "Subdoc: Path mismatch";
    /// Sub-document: the path does not parse.
    SubdocPathEinval = 0xc2, "Subdoc: Invalid path";
    /// Sub-document: the path is too long or too deep.
    SubdocPathE2big = 0xc3, "Subdoc: Path too large";
    /// Sub-document: the document nests too deeply.
    SubdocDocE2deep = 0xc4, "Subdoc: Document too deep";
    /// Sub-document: the value cannot be inserted there.
    SubdocValueCantinsert = 0xc5, "Subdoc: Cannot insert specified value";
    /// Sub-document: the document is not JSON.
    SubdocDocNotJson = 0xc6, "Subdoc: Existing document not JSON";
    /// Sub-document: a counter would leave the signed 64-bit range.
    SubdocNumErange = 0xc7, "Subdoc: Existing number outside valid arithmetic range";
    /// Sub-document: the counter delta is invalid.
    SubdocDeltaEinval = 0xc8, "Subdoc: Invalid value for arithmetic operation";
    /// Sub-document: the path exists already.
    SubdocPathEexists = 0xc9, "Subdoc: Document path already exists";
    /// Sub-document: the value to insert nests too deeply.
    SubdocValueEtoodeep = 0xca, "Subdoc: Inserting value would make document too deep";
    /// Sub-document: an invalid combination of commands or flags.
    SubdocInvalidCombo = 0xcb, "Subdoc: Invalid combination for multi-path command";
    /// Sub-document: some paths of a multi-path command failed (see the body).
    SubdocMultiPathFailure = 0xcc, "Subdoc: One or more paths in a multi-path command failed";
    /// Sub-document: success on a deleted document (ACCESS_DELETED).
    SubdocSuccessDeleted = 0xcd, "Subdoc: Operation completed successfully on a deleted document";
    /// Sub-document: EXPAND_MACROS without XATTR, or another invalid path flag mix.
    SubdocXattrInvalidFlagCombo = 0xce, "Subdoc: Invalid combination of xattr flags";
    /// Sub-document: an invalid combination of extended attribute keys.
    SubdocXattrInvalidKeyCombo = 0xcf, "Subdoc: Invalid combination of xattr keys";
    /// Sub-document: a macro that does not exist.
    SubdocXattrUnknownMacro = 0xd0, "Subdoc: Unknown xattr macro";
    /// Sub-document: the path names a virtual attribute that does not exist.
    SubdocXattrUnknownVattr = 0xd1, "Subdoc: Unknown virtual extended attribute";
    /// Sub-document: virtual attributes cannot be changed.
    SubdocXattrCantModifyVattr = 0xd2, "Subdoc: Can't modify virtual attributes";
    /// Sub-document: some paths failed, on a deleted document.
    SubdocMultiPathFailureDeleted = 0xd3, "Subdoc: One or more paths in a multi-path command failed on a deleted document";
    /// Sub-document: extended attribute paths must come before body paths.
    SubdocInvalidXattrOrder = 0xd4, "Subdoc: Invalid XATTR order (xattrs should come first)";
    /// Sub-document: a macro of a virtual attribute that does not exist.
    SubdocXattrUnknownVattrMacro = 0xd5, "Subdoc: The virtual attribute macro does not exist";
    /// Sub-document: REVIVE of a document that is not deleted.
    SubdocCanOnlyReviveDeletedDocuments = 0xd6, "Subdoc: Only deleted documents can be revived";
    /// Sub-document: a deleted document cannot have a body.
    SubdocDeletedDocumentCantHaveValue = 0xd7, "Subdoc: A deleted document can't have a user value";
    /// Sub-document: a BINARY_VALUE read of an attribute value that is not binary.
    SubdocFieldNotBinaryValue = 0xd8, "Subdoc: The requested field is not a binary value";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_round_trips_every_value() {
        for s in Status::ALL {
            assert_eq!(Status::from_u16(s.as_u16()), Some(*s));
        }
    }
}
