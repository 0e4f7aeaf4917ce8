//! Scope and collection changes as events in every active vBucket's seqno order, so that
//! DCP streams carry them (DCP_SYSTEM_EVENT) where they happened among the documents.
//!
//! A manifest change ([`crate::collections::Collections`]) hands its events to
//! [`BucketCore::record_collection_events`], which gives each one a seqno in every active,
//! warm vBucket at the ordering point, appends it to the vBucket's DCP log and queues it
//! for the flusher as a *system document*: a key in the reserved collection 1 (KV-Engine's
//! system namespace) naming the scope or collection, and a small binary value. Creations
//! are recorded before the new manifest is published and drops after it, so that no
//! vBucket holds a document of a collection at a seqno below its creation event.
//!
//! On disk a system document is kept like any other, newest version per key: a drop
//! replaces the creation (as a tombstone, which compaction purges like any other). A
//! backfill reads them back in seqno order. Warmup does not load them (collection 1 is
//! never live), and nothing else can address them (no client may name collection 1).
//!
//! Replica vBuckets do not record their own node's changes: they store the events their
//! active streams to them ([`crate::Bucket::op_replicate`]), with the active's seqnos.
//!
//! Level: a service over [`crate::bucket_core::BucketCore`]; it never names the bucket.

use crate::bucket_core::BucketCore;
use crate::vbucket::Assigned;
use epkv_engine_api::dcp::{CollectionEvent, CollectionEventKind};
use epkv_storage::Document;
use epkv_types::VBucketState;

/// The stored-key prefix of system documents: the escape byte and reserved collection
/// id 1.
pub(crate) const SYSTEM_PREFIX: [u8; 2] = [0, 1];

/// True for the stored key of a system document.
pub(crate) fn is_system_key(key: &[u8]) -> bool {
    key.starts_with(&SYSTEM_PREFIX)
}

/// The stored key of `ev`'s document: one per scope and one per collection, so that a
/// drop replaces the creation.
fn key_of(ev: &CollectionEvent) -> Vec<u8> {
    let (tag, id) = match ev.kind {
        CollectionEventKind::CreateCollection | CollectionEventKind::DropCollection => {
            (b'c', ev.collection_id)
        }
        CollectionEventKind::CreateScope | CollectionEventKind::DropScope => (b's', ev.scope_id),
    };
    let mut k = Vec::with_capacity(7);
    k.extend_from_slice(&SYSTEM_PREFIX);
    k.push(tag);
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// Bytes of a system document's value before the name: event id, manifest uid, scope,
/// collection, maxTTL + 1 (0: none).
const FIXED: usize = 1 + 8 + 4 + 4 + 8;

/// The document the flusher persists for `ev` at `a`.
pub(crate) fn document(ev: &CollectionEvent, a: &Assigned) -> Document {
    let mut value = Vec::with_capacity(FIXED + ev.name.len());
    // The event id fits a byte (0-4).
    value.push(u8::try_from(ev.kind.id()).unwrap_or(u8::MAX));
    value.extend_from_slice(&ev.manifest_uid.to_be_bytes());
    value.extend_from_slice(&ev.scope_id.to_be_bytes());
    value.extend_from_slice(&ev.collection_id.to_be_bytes());
    value.extend_from_slice(&ev.max_ttl.map_or(0, |t| u64::from(t) + 1).to_be_bytes());
    value.extend_from_slice(ev.name.as_bytes());
    Document {
        key: key_of(ev),
        value: value.into(),
        seqno: a.seqno.0,
        cas: a.cas.0,
        rev_seqno: 1,
        flags: 0,
        expiry: 0,
        datatype: 0,
        deleted: matches!(
            ev.kind,
            CollectionEventKind::DropCollection | CollectionEventKind::DropScope
        ),
    }
}

/// The event a system document records; `None` (logged) for one that does not decode.
pub(crate) fn event_of_document(doc: &Document) -> Option<CollectionEvent> {
    let decoded = decode_value(&doc.value);
    if decoded.is_none() {
        tracing::error!(
            seqno = doc.seqno,
            "a stored system event does not decode; skipped"
        );
    }
    decoded
}

/// Reads back the value [`document`] writes.
fn decode_value(v: &[u8]) -> Option<CollectionEvent> {
    if v.len() < FIXED {
        return None;
    }
    let u32_at = |i: usize| u32::from_be_bytes(v[i..i + 4].try_into().unwrap_or_default());
    let u64_at = |i: usize| u64::from_be_bytes(v[i..i + 8].try_into().unwrap_or_default());
    let ttl = u64_at(17);
    Some(CollectionEvent {
        kind: CollectionEventKind::from_id(u32::from(v[0]))?,
        manifest_uid: u64_at(1),
        scope_id: u32_at(9),
        collection_id: u32_at(13),
        name: String::from_utf8(v[FIXED..].to_vec()).ok()?,
        max_ttl: ttl.checked_sub(1).and_then(|t| u32::try_from(t).ok()),
    })
}

/// How long a scope or collection change waits for warmup before recording its events.
const WARMUP_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

impl BucketCore {
    /// Gives each of `events` (one manifest change, in order) a seqno in every active,
    /// warm vBucket, for DCP and the flusher (see the module docs). A vBucket still
    /// warming up has no seqnos to extend yet: the change waits for warmup (bounded by
    /// [`WARMUP_WAIT`]; a vBucket that is still not warm, or failed to warm up, misses
    /// it).
    pub(crate) fn record_collection_events(&self, events: &[CollectionEvent]) {
        if events.is_empty() {
            return;
        }
        if !self.wait_warmup(WARMUP_WAIT) {
            tracing::warn!(bucket = %self.config.name, "a collection change before warmup finished: vBuckets still loading do not get its events");
        }
        let now = crate::lazy_now::LazyNow::new(&*self.clock).nanos();
        for vb in self.vbuckets.iter() {
            let state = vb.state();
            if *state != VBucketState::Active
                || vb.warmup_phase() != crate::vbucket::WarmupPhase::Ready
            {
                continue;
            }
            for ev in events {
                let (_, woke) = vb.assign_system(now, |a| document(ev, a));
                self.queued(vb, woke);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use epkv_types::{Cas, Seqno};

    #[test]
    fn system_documents_round_trip_and_a_drop_replaces_its_creation() {
        let a = Assigned {
            seqno: Seqno(7),
            cas: Cas(9),
            new_key_rev: 1,
        };
        let created = CollectionEvent {
            kind: CollectionEventKind::CreateCollection,
            manifest_uid: 3,
            scope_id: 8,
            collection_id: 9,
            name: "orders".into(),
            max_ttl: Some(60),
        };
        let doc = document(&created, &a);
        assert!(is_system_key(&doc.key));
        assert!(!doc.deleted);
        assert_eq!(event_of_document(&doc), Some(created.clone()));
        let dropped = CollectionEvent {
            kind: CollectionEventKind::DropCollection,
            name: String::new(),
            max_ttl: None,
            ..created
        };
        let doc2 = document(&dropped, &a);
        assert_eq!(doc2.key, doc.key);
        assert!(doc2.deleted);
        assert_eq!(event_of_document(&doc2), Some(dropped));
        let scope = CollectionEvent {
            kind: CollectionEventKind::CreateScope,
            manifest_uid: 4,
            scope_id: 8,
            collection_id: 0,
            name: "shop".into(),
            max_ttl: None,
        };
        assert_ne!(document(&scope, &a).key, doc.key);
        assert_eq!(event_of_document(&document(&scope, &a)), Some(scope));
        let mut bad = doc;
        bad.value = bytes::Bytes::from_static(b"\x09short");
        assert_eq!(event_of_document(&bad), None);
    }
}
