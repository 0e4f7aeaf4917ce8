//! Helpers every operation shares on one stored document: expiry and lock checks against
//! the operation's time, the CAS check, the document the flusher persists for a version,
//! the system extended attributes a deletion keeps, and the views reads return.
//!
//! Level: just above the vBucket. It imports [`crate::lazy_now`] and
//! [`crate::vbucket`] only.

use crate::lazy_now::LazyNow;
use crate::vbucket::Assigned;
use epkv_engine_api::{DurabilityRequirements, EngineResult, EngineStatus, Item};
use epkv_hashtable::{Entry, ItemMeta, StoredValue};
use epkv_types::{Cas, Datatype, DurabilityLevel, Vbid};

/// The value itself: decompressed when `datatype` says Snappy (APPEND/PREPEND and
/// INCR/DECR work on the plain bytes, as KV-Engine's do).
pub(crate) fn plain_value(
    value: &[u8],
    datatype: Datatype,
) -> Result<std::borrow::Cow<'_, [u8]>, EngineStatus> {
    if !datatype.contains(Datatype::SNAPPY) {
        return Ok(std::borrow::Cow::Borrowed(value));
    }
    snap::raw::Decoder::new()
        .decompress_vec(value)
        .map(std::borrow::Cow::Owned)
        .map_err(|_| EngineStatus::Invalid)
}

/// Returns true when `meta` has expired by `now`.
pub(crate) fn expired(meta: &ItemMeta, now: &LazyNow<'_>) -> bool {
    meta.expiry != 0 && meta.is_expired(now.secs())
}

/// Returns true while `meta` is locked at `now`.
pub(crate) fn locked(meta: &ItemMeta, now: &LazyNow<'_>) -> bool {
    meta.lock_expiry != 0 && meta.is_locked(now.secs())
}

/// The CAS a client must present to change an existing document: while it is locked, the
/// lock's CAS, which GET_LOCKED made the document's CAS (anything else → Locked); otherwise the document's CAS, unless the request
/// carries the wildcard (mismatch → KeyExists).
pub(crate) fn check_lock_and_cas(meta: &ItemMeta, cas: Cas, now: &LazyNow<'_>) -> EngineResult<()> {
    if locked(meta, now) {
        if cas == meta.cas {
            Ok(())
        } else {
            Err(EngineStatus::Locked)
        }
    } else if cas.is_any() || cas == meta.cas {
        Ok(())
    } else {
        Err(EngineStatus::KeyExists)
    }
}

/// Durability on a single node with no replicas: Majority is satisfied by the active
/// alone, so it commits at once. The persist levels need persistence: a persistent bucket
/// accepts them (the front end acknowledges the write once [`crate::Bucket::when_persisted`]
/// reports its seqno durable); a memory-only bucket rejects them, as an ephemeral bucket.
pub(crate) fn check_durability(
    d: Option<&DurabilityRequirements>,
    persistent: bool,
) -> EngineResult<()> {
    match d.map(|d| d.level) {
        None | Some(DurabilityLevel::Majority) => Ok(()),
        Some(DurabilityLevel::MajorityAndPersistOnMaster | DurabilityLevel::PersistToMajority) => {
            if persistent {
                Ok(())
            } else {
                Err(EngineStatus::DurabilityInvalidLevel)
            }
        }
    }
}

/// The document the flusher writes for the entry's item as of the mutation `a`, with
/// revision `rev` and (for TOUCH) a new expiry.
pub(crate) fn document_of(
    e: &Entry<'_>,
    a: &Assigned,
    rev: u64,
    expiry: Option<u32>,
) -> epkv_storage::Document {
    let (value, m, deleted) = match e.committed() {
        Some(sv) => (
            bytes::Bytes::copy_from_slice(sv.value()),
            *sv.meta(),
            sv.is_deleted(),
        ),
        None => (bytes::Bytes::new(), ItemMeta::default(), false),
    };
    epkv_storage::Document {
        key: e.key().to_vec(),
        value,
        seqno: a.seqno.0,
        cas: a.cas.0,
        rev_seqno: rev,
        flags: m.flags,
        expiry: expiry.unwrap_or(m.expiry),
        datatype: m.datatype.0,
        deleted,
    }
}

/// The system extended attributes of a live item (an empty section when it has none, or
/// when its value is not in memory).
pub(crate) fn system_section(sv: &StoredValue) -> Vec<u8> {
    let m = sv.meta();
    if !m.datatype.contains(Datatype::XATTR) || !sv.is_resident() {
        return Vec::new();
    }
    let Ok(plain) = plain_value(sv.value(), m.datatype) else {
        return Vec::new();
    };
    epkv_engine_api::xattr::system_only(epkv_engine_api::xattr::section(&plain, m.datatype))
        .unwrap_or_default()
}

/// SyncWriteInProgress while a SyncWrite (a prepare) of the key is in flight: no other
/// write of the key may run until it completes.
pub(crate) fn check_no_sync_write(e: &Entry<'_>) -> EngineResult<()> {
    match e.prepared() {
        Some(p) if p.committed_state().is_in_flight() => Err(EngineStatus::SyncWriteInProgress),
        _ => Ok(()),
    }
}

/// Lends a stored document as the engine API's borrowed view, with the CAS readers see.
pub(crate) fn view_of(sv: &StoredValue, vbid: Vbid, cas: Cas) -> epkv_engine_api::ItemView<'_> {
    let m = sv.meta();
    epkv_engine_api::ItemView {
        key: sv.key(),
        value: sv.value(),
        flags: m.flags,
        expiry_unix_secs: m.expiry,
        datatype: m.datatype,
        cas,
        vbid,
        seqno: m.by_seqno,
    }
}

/// Builds the [`Item`] a read returns.
pub(crate) fn item_of(sv: &StoredValue, vbid: Vbid, cas: Cas) -> Item {
    let m = sv.meta();
    Item {
        key: sv.key_bytes(),
        value: sv.value_bytes(),
        flags: m.flags,
        expiry_unix_secs: m.expiry,
        datatype: m.datatype,
        cas,
        vbid,
        seqno: m.by_seqno,
    }
}
