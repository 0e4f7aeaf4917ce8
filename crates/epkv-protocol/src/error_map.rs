//! The error map (GET_ERROR_MAP, kv_engine `docs/ErrorMap.md`): every status epkv sends,
//! with its kv_engine name and the attributes that tell a client what to do with it.
//!
//! The table is [`entry`], one exhaustive `match` over [`Status`]: a status added to the
//! status table does not compile until it has an error map entry. Two versions are
//! served, derived from the one table:
//! - version 2 lists every attribute;
//! - version 1 leaves out the attributes version 1 does not define and carries a revision
//!   4 higher, as kv_engine derives its v1 map from its v2 map. libcouchbase refuses a map
//!   whose `version` is above what it asked for, so a v1 request must get a v1 map.

use crate::status::Status;
use std::fmt::Write as _;

/// The highest error map version epkv serves.
pub const ERROR_MAP_MAX_VERSION: u16 = 2;

/// The revision of the version 2 map; bump it whenever an entry changes.
const REVISION_V2: u32 = 2;
/// Version 1 maps carry a revision this much higher (kv_engine's convention, so a derived
/// v1 map is never older than the hand-written v1 maps of servers before v2).
const V1_REVISION_OFFSET: u32 = 4;

/// An error attribute (kv_engine `docs/ErrorMap.md`, "Error Attributes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorAttribute {
    /// The operation succeeded.
    Success,
    /// A constraint on the item itself (missing, exists, value unsuitable).
    ItemOnly,
    /// The item is locked.
    ItemLocked,
    /// The input violates the operation's rules or a limit.
    InvalidInput,
    /// The client's cluster map may be stale: fetch a new one.
    FetchConfig,
    /// The connection is no longer usable; reconnect.
    ConnStateInvalidated,
    /// Authentication or authorisation failed.
    Auth,
    /// The client must handle this code specially or drop the connection.
    SpecialHandling,
    /// Not supported (server version, bucket type or user).
    Support,
    /// A transient condition.
    Temp,
    /// An internal server error.
    Internal,
    /// May be retried at once.
    RetryNow,
    /// May be retried after a while.
    RetryLater,
    /// Rate limiting (version 2 only).
    RateLimit,
}

impl ErrorAttribute {
    /// The attribute's name in the map.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::ItemOnly => "item-only",
            Self::ItemLocked => "item-locked",
            Self::InvalidInput => "invalid-input",
            Self::FetchConfig => "fetch-config",
            Self::ConnStateInvalidated => "conn-state-invalidated",
            Self::Auth => "auth",
            Self::SpecialHandling => "special-handling",
            Self::Support => "support",
            Self::Temp => "temp",
            Self::Internal => "internal",
            Self::RetryNow => "retry-now",
            Self::RetryLater => "retry-later",
            Self::RateLimit => "rate-limit",
        }
    }

    /// The first error map version that defines this attribute.
    #[must_use]
    pub fn since_version(self) -> u16 {
        match self {
            Self::RateLimit => 2,
            _ => 1,
        }
    }
}

/// Returns a status's kv_engine name and its attributes: the error map table.
#[must_use]
pub fn entry(status: Status) -> (&'static str, &'static [ErrorAttribute]) {
    use ErrorAttribute as A;
    match status {
        Status::Success => ("SUCCESS", &[A::Success]),
        Status::KeyEnoent => ("KEY_ENOENT", &[A::ItemOnly]),
        Status::KeyEexists => ("KEY_EEXISTS", &[A::ItemOnly]),
        Status::E2big => ("E2BIG", &[A::InvalidInput]),
        Status::Einval => ("EINVAL", &[A::InvalidInput]),
        Status::NotStored => ("NOT_STORED", &[A::ItemOnly]),
        Status::DeltaBadval => ("DELTA_BADVAL", &[A::InvalidInput]),
        Status::NotMyVbucket => ("NOT_MY_VBUCKET", &[A::FetchConfig, A::RetryNow]),
        Status::NoBucket => ("NO_BUCKET", &[A::ConnStateInvalidated]),
        Status::Locked => ("LOCKED", &[A::ItemLocked, A::ItemOnly, A::RetryLater]),
        Status::NotLocked => ("NOT_LOCKED", &[A::ItemOnly]),
        Status::AuthError => ("AUTH_ERROR", &[A::Auth]),
        Status::AuthContinue => ("AUTH_CONTINUE", &[A::Auth, A::SpecialHandling]),
        Status::Erange => ("ERANGE", &[A::InvalidInput]),
        Status::Rollback => ("ROLLBACK", &[A::SpecialHandling]),
        Status::Eaccess => ("EACCESS", &[A::Auth]),
        Status::UnknownFrameInfo => ("UNKNOWN_FRAME_INFO", &[A::Support]),
        Status::UnknownCommand => ("UNKNOWN_COMMAND", &[A::Support]),
        Status::Enomem => ("ENOMEM", &[A::Temp, A::RetryLater]),
        Status::NotSupported => ("NOT_SUPPORTED", &[A::Support]),
        Status::Einternal => ("EINTERNAL", &[A::Internal]),
        Status::Ebusy => ("EBUSY", &[A::Temp, A::RetryLater]),
        Status::Etmpfail => ("ETMPFAIL", &[A::Temp, A::RetryLater]),
        Status::UnknownCollection => ("UNKNOWN_COLLECTION", &[A::ItemOnly, A::FetchConfig]),
        Status::UnknownScope => ("UNKNOWN_SCOPE", &[A::ItemOnly, A::FetchConfig]),
        Status::DurabilityInvalidLevel => ("DURABILITY_INVALID_LEVEL", &[A::InvalidInput]),
        Status::DurabilityImpossible => ("DURABILITY_IMPOSSIBLE", &[A::Temp]),
        Status::SyncWriteInProgress => ("SYNC_WRITE_IN_PROGRESS", &[A::Temp, A::RetryLater]),
        Status::SyncWriteAmbiguous => ("SYNC_WRITE_AMBIGUOUS", &[A::SpecialHandling]),
        Status::SyncWriteReCommitInProgress => (
            "SYNC_WRITE_RE_COMMIT_IN_PROGRESS",
            &[A::Temp, A::RetryLater],
        ),
        Status::RangeScanCancelled => ("RangeScanCancelled", &[A::Success]),
        Status::RangeScanMore => ("RangeScanMore", &[A::Success]),
        Status::RangeScanComplete => ("RangeScanComplete", &[A::Success]),
        Status::VbUuidNotEqual => ("VbUuidNotEqual", &[A::InvalidInput]),
        Status::SubdocPathEnoent => ("SUBDOC_PATH_ENOENT", &[A::ItemOnly]),
        Status::SubdocPathMismatch => ("SUBDOC_PATH_MISMATCH", &[A::ItemOnly]),
        Status::SubdocPathEinval => ("SUBDOC_PATH_EINVAL", &[A::InvalidInput]),
        Status::SubdocPathE2big => ("SUBDOC_PATH_E2BIG", &[A::InvalidInput]),
        Status::SubdocDocE2deep => ("SUBDOC_DOC_E2DEEP", &[A::ItemOnly]),
        Status::SubdocValueCantinsert => ("SUBDOC_VALUE_CANTINSERT", &[A::InvalidInput]),
        Status::SubdocDocNotJson => ("SUBDOC_DOC_NOT_JSON", &[A::ItemOnly]),
        Status::SubdocNumErange => ("SUBDOC_NUM_ERANGE", &[A::ItemOnly]),
        Status::SubdocDeltaEinval => ("SUBDOC_DELTA_EINVAL", &[A::InvalidInput]),
        Status::SubdocPathEexists => ("SUBDOC_PATH_EEXISTS", &[A::ItemOnly]),
        Status::SubdocValueEtoodeep => ("SUBDOC_VALUE_ETOODEEP", &[A::InvalidInput]),
        Status::SubdocInvalidCombo => ("SUBDOC_INVALID_COMBO", &[A::InvalidInput]),
        Status::SubdocMultiPathFailure => ("SUBDOC_MULTI_PATH_FAILURE", &[A::ItemOnly]),
        Status::SubdocSuccessDeleted => ("SUBDOC_SUCCESS_DELETED", &[A::Success]),
        Status::SubdocXattrInvalidFlagCombo => {
            ("SUBDOC_XATTR_INVALID_FLAG_COMBO", &[A::InvalidInput])
        }
        Status::SubdocXattrInvalidKeyCombo => {
            ("SUBDOC_XATTR_INVALID_KEY_COMBO", &[A::InvalidInput])
        }
        Status::SubdocXattrUnknownMacro => ("SUBDOC_XATTR_UNKNOWN_MACRO", &[A::InvalidInput]),
        Status::SubdocXattrUnknownVattr => ("SUBDOC_XATTR_UNKNOWN_VATTR", &[A::InvalidInput]),
        Status::SubdocXattrCantModifyVattr => {
            ("SUBDOC_XATTR_CANT_MODIFY_VATTR", &[A::InvalidInput])
        }
        Status::SubdocMultiPathFailureDeleted => {
            ("SUBDOC_MULTI_PATH_FAILURE_DELETED", &[A::ItemOnly])
        }
        Status::SubdocInvalidXattrOrder => ("SUBDOC_INVALID_XATTR_ORDER", &[A::InvalidInput]),
        Status::SubdocXattrUnknownVattrMacro => {
            ("SUBDOC_XATTR_UNKNOWN_VATTR_MACRO", &[A::InvalidInput])
        }
        Status::SubdocCanOnlyReviveDeletedDocuments => (
            "SUBDOC_CAN_ONLY_REVIVE_DELETED_DOCUMENTS",
            &[A::InvalidInput],
        ),
        Status::SubdocDeletedDocumentCantHaveValue => (
            "SUBDOC_DELETED_DOCUMENT_CANT_HAVE_VALUE",
            &[A::InvalidInput],
        ),
        Status::SubdocFieldNotBinaryValue => ("SUBDOC_FIELD_NOT_BINARY_VALUE", &[A::InvalidInput]),
    }
}

/// The attributes of `attrs` that error map `version` defines.
fn attrs_in(
    version: u16,
    attrs: &'static [ErrorAttribute],
) -> impl Iterator<Item = ErrorAttribute> {
    attrs
        .iter()
        .copied()
        .filter(move |a| a.since_version() <= version)
}

/// Returns the error map for a client that asked for `requested` (at least 1): the
/// version served (`min(requested, 2)`) and the JSON document.
#[must_use]
pub fn error_map_json(requested: u16) -> (u16, String) {
    let version = requested.clamp(1, ERROR_MAP_MAX_VERSION);
    let revision = if version >= 2 {
        REVISION_V2
    } else {
        REVISION_V2 + V1_REVISION_OFFSET
    };
    let mut s = format!("{{\"version\":{version},\"revision\":{revision},\"errors\":{{");
    for (i, status) in Status::ALL.iter().enumerate() {
        let (name, attrs) = entry(*status);
        if i > 0 {
            s.push(',');
        }
        // Writing to a String cannot fail.
        let _ = write!(
            s,
            "\"{:x}\":{{\"name\":\"{name}\",\"desc\":\"{}\",\"attrs\":[",
            status.as_u16(),
            status.message()
        );
        let mut first = true;
        for a in attrs_in(version, attrs) {
            if !first {
                s.push(',');
            }
            first = false;
            let _ = write!(s, "\"{}\"", a.name());
        }
        s.push_str("]}");
    }
    s.push_str("}}");
    (version, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_honoured_and_capped() {
        assert!(
            error_map_json(1)
                .1
                .starts_with("{\"version\":1,\"revision\":6,")
        );
        assert!(
            error_map_json(2)
                .1
                .starts_with("{\"version\":2,\"revision\":2,")
        );
        assert_eq!(error_map_json(9).0, 2);
    }

    #[test]
    fn every_status_has_a_named_entry_with_attributes() {
        for s in Status::ALL {
            let (name, attrs) = entry(*s);
            assert!(!name.is_empty());
            assert!(
                attrs.iter().any(|a| a.since_version() == 1),
                "{name} needs a v1 attribute so the v1 map is useful"
            );
        }
        let (_, map) = error_map_json(2);
        assert!(map.contains("\"7\":{\"name\":\"NOT_MY_VBUCKET\""));
        assert!(map.contains("\"a3\":{\"name\":\"SYNC_WRITE_AMBIGUOUS\""));
    }

    #[test]
    fn version_one_leaves_out_version_two_attributes() {
        use ErrorAttribute as A;
        const ATTRS: &[ErrorAttribute] = &[A::Temp, A::RateLimit, A::RetryLater];
        assert_eq!(
            attrs_in(1, ATTRS).collect::<Vec<_>>(),
            [A::Temp, A::RetryLater]
        );
        assert_eq!(attrs_in(2, ATTRS).count(), 3);
    }
}
