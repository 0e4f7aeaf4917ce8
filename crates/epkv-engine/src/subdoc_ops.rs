//! The sub-document operations on a bucket: lookups read a copy of the document taken
//! under the key's lock and evaluate the paths outside it; mutations apply every path to
//! the parsed document and its extended attributes under the lock and store the result
//! as one new version (seqno, CAS, revision), or nothing when a path fails.
//!
//! With ACCESS_DELETED both work on a deleted document's tombstone (its attributes; it
//! has no body). A mutation may create a document deleted (CREATE_AS_DELETED), make a
//! deleted one live again (REVIVE), or delete one (a whole-document DELETE spec).

use crate::Bucket;
use crate::document::plain_value;
use crate::document::{check_durability, check_lock_and_cas};
use crate::lazy_now::LazyNow;
use crate::stats::Counter;
use crate::subdoc;
use crate::xattrs::{Attrs, Patches};
use epkv_engine_api::{
    EngineResult, EngineStatus, Expiry, LookupFlags, SubdocError, SubdocLookup, SubdocMutated,
    SubdocMutation, SubdocOp, SubdocSpec, xattr,
};
use epkv_hashtable::{Entry, ItemMeta, StoredValue};
use epkv_types::{Cas, Datatype, Vbid};
use serde_json::Value;

/// Documents up to this size are searched under the key's lock rather than copied out.
const SEARCH_UNDER_LOCK_BYTES: usize = 16 * 1024;

/// The entry's version a sub-document command works on: the live document, or with
/// `access_deleted` a tombstone (not a placeholder, nor a marker of a key the disk does
/// not have); with whether it is deleted.
fn target<'e>(e: &'e Entry<'_>, access_deleted: bool) -> Option<(&'e StoredValue, bool)> {
    match e.committed() {
        Some(sv) if !sv.is_deleted() => Some((sv, false)),
        Some(sv) if access_deleted && !sv.is_placeholder() && sv.meta().by_seqno.0 != 0 => {
            Some((sv, true))
        }
        _ => None,
    }
}

/// The body of a document being changed.
enum Body {
    /// Its bytes, unchanged so far (or set whole), and whether they are JSON.
    Bytes(Vec<u8>, bool),
    /// Parsed, for path mutations.
    Dom(Value),
    /// None: a deleted document, or one being created.
    Empty,
}

impl Bucket {
    /// A key missing from memory that a command with ACCESS_DELETED may find deleted on
    /// disk (tombstones leave memory once persisted): read it back (WouldBlock).
    fn look_up_tombstone(
        &self,
        vb: &crate::vbucket::VBucket,
        e: &mut Entry<'_>,
    ) -> EngineResult<()> {
        if e.committed().is_none() && vb.is_persistent() {
            return Err(self.core.look_up_on_disk(vb, e, true));
        }
        Ok(())
    }

    /// Sub-document lookups (see [`epkv_engine_api::Engine::subdoc_lookup`]).
    pub(crate) fn op_subdoc_lookup(
        &self,
        vbid: Vbid,
        key: &[u8],
        specs: &[SubdocSpec<'_>],
        flags: LookupFlags,
    ) -> EngineResult<SubdocLookup> {
        self.core.counters.incr(Counter::CmdGet);
        if specs.iter().any(|s| !s.op.is_lookup()) {
            return Err(EngineStatus::Invalid);
        }
        let access_deleted = flags.access_deleted;
        // The vBucket's state is held (read-locked) for the lookup, as a client write
        // holds it: a replica promoted meanwhile is read either before or after.
        let (vb, _state) = if flags.replica_read {
            self.replica_for_read(vbid, key)?
        } else {
            self.core.client_vbucket(vbid, key)?
        };
        self.collection_ops.count(key, crate::collections::Op::Get);
        let now = LazyNow::new(&*self.core.clock);
        let asks_vbucket = |s: &SubdocSpec<'_>| {
            s.xattr && subdoc::first_key(s.path).is_ok_and(|k| k == "$vbucket")
        };
        let vbucket_attr = specs
            .iter()
            .any(asks_vbucket)
            .then(|| subdoc::vbucket_attribute(now.nanos(), vb.ordering_snapshot().1));
        let search = |plain: &[u8], m: &ItemMeta, deleted: bool| {
            let (section, body) = if m.datatype.contains(Datatype::XATTR) {
                xattr::split(plain).unwrap_or((&[], &[]))
            } else {
                (&[][..], plain)
            };
            // A document stored as JSON is read only as far as each path; each path is
            // found in the body's text without building the document.
            let trusted = m.datatype.contains(Datatype::JSON);
            let attrs = specs.iter().any(|s| s.xattr).then(|| {
                let attrs = Attrs::parse(section).unwrap_or_default();
                let keys = attrs.0.keys().cloned().collect();
                let mut vattrs = subdoc::virtual_attributes(m, body, deleted, keys);
                if let (Some(v), Value::Object(o)) = (&vbucket_attr, &mut vattrs) {
                    o.insert("$vbucket".to_owned(), v.clone());
                }
                (vattrs, Value::Object(attrs.0))
            });
            specs
                .iter()
                .map(|s| match &attrs {
                    Some((v, a)) if s.xattr && s.binary => subdoc::lookup_xattr(v, a, s.op, s.path)
                        .and_then(|json| crate::xattrs::decode_binary(&json)),
                    Some((v, a)) if s.xattr => subdoc::lookup_xattr(v, a, s.op, s.path),
                    // A deleted document has no body.
                    _ if deleted => Err(SubdocError::PathNotFound),
                    _ => subdoc::lookup_raw(body, s.op, s.path, trusted),
                })
                .collect::<Vec<_>>()
        };
        // A small plain document is searched under the key's lock (a scan of a few
        // microseconds at most); a large or compressed one is copied out and searched
        // after the lock is released.
        let (cas, deleted, found) = vb.table.with_entry(key, |e| {
            if flags.replica_read {
                // A replica does not expire documents (the active's deletion arrives);
                // it just does not serve them, as GET_REPLICA.
                if e.committed()
                    .is_some_and(|sv| !sv.is_deleted() && crate::document::expired(sv.meta(), &now))
                {
                    return Err(EngineStatus::KeyNotFound);
                }
            } else {
                self.expire_on_access(vb, e, &now)?;
            }
            self.fetch_if_evicted(vb, e)?;
            if access_deleted {
                self.look_up_tombstone(vb, e)?;
            }
            e.track_reference();
            let (sv, deleted) = target(e, access_deleted).ok_or(EngineStatus::KeyNotFound)?;
            let m = sv.meta();
            let cas = if crate::document::locked(m, &now) {
                Cas(u64::MAX)
            } else {
                m.cas
            };
            if sv.value_len() <= SEARCH_UNDER_LOCK_BYTES && !m.datatype.contains(Datatype::SNAPPY) {
                Ok((cas, deleted, Ok(search(sv.value(), m, deleted))))
            } else {
                Ok((cas, deleted, Err((*m, sv.value().to_vec()))))
            }
        })?;
        self.core.counters.incr(Counter::GetHits);
        let results = match found {
            Ok(results) => results,
            Err((m, value)) => {
                let plain = plain_value(&value, m.datatype).map_err(|_| EngineStatus::Internal)?;
                search(&plain, &m, deleted)
            }
        };
        Ok(SubdocLookup {
            cas,
            deleted,
            results,
        })
    }

    /// Sub-document mutations (see [`epkv_engine_api::Engine::subdoc_mutate`]).
    pub(crate) fn op_subdoc_mutate(&self, req: &SubdocMutation<'_>) -> EngineResult<SubdocMutated> {
        self.core.counters.incr(Counter::CmdSet);
        if req.specs.is_empty() || req.specs.iter().any(|s| s.op.is_lookup()) {
            return Err(EngineStatus::Invalid);
        }
        if req.add && (req.mkdoc || !req.cas.is_any())
            || req.create_as_deleted && !(req.mkdoc || req.add)
            || req.revive && !req.access_deleted
        {
            return Err(EngineStatus::Invalid);
        }
        let (vb, _state) = self.core.client_vbucket(req.vbid, req.key)?;
        self.collection_ops
            .count(req.key, crate::collections::Op::Store);
        self.core.check_disk()?;
        check_durability(req.durability.as_ref(), self.core.persistence.is_some())?;
        let now = LazyNow::new(&*self.core.clock);
        let result = vb.table.with_entry(req.key, |e| {
            crate::document::check_no_sync_write(e)?;
            self.expire_on_access(vb, e, &now)?;
            self.fetch_if_evicted(vb, e)?;
            if req.access_deleted {
                self.look_up_tombstone(vb, e)?;
            }
            // The version worked on: its plain value, metadata, and whether it is deleted.
            let existing = match target(e, req.access_deleted) {
                Some((sv, false)) => {
                    if req.add {
                        return Err(EngineStatus::KeyExists);
                    }
                    check_lock_and_cas(sv.meta(), req.cas, &now)?;
                    let m = *sv.meta();
                    Some((plain_value(sv.value(), m.datatype)?.into_owned(), m, false))
                }
                Some((sv, true)) => {
                    if !req.cas.is_any() && req.cas != sv.meta().cas {
                        return Err(EngineStatus::KeyExists);
                    }
                    Some((sv.value().to_vec(), *sv.meta(), true))
                }
                None if req.mkdoc || req.add => {
                    if !req.cas.is_any() {
                        return Err(EngineStatus::KeyNotFound);
                    }
                    None
                }
                None => return Err(EngineStatus::KeyNotFound),
            };
            let was_deleted = existing.as_ref().is_some_and(|x| x.2);
            if req.revive && !was_deleted {
                return Ok(SubdocMutated::Refused(SubdocError::CanOnlyReviveDeleted));
            }
            // Creating: no document, or (ADD with ACCESS_DELETED) only a tombstone.
            let create = existing.is_none() || was_deleted && req.add;
            let mut deleted = if create {
                req.create_as_deleted
            } else {
                was_deleted && !req.revive
            };
            let (mut attrs, mut body) = match &existing {
                Some((value, m, _)) => {
                    let (section, body) = if m.datatype.contains(Datatype::XATTR) {
                        xattr::split(value).map_err(|_| EngineStatus::Internal)?
                    } else {
                        (&[][..], &value[..])
                    };
                    let body = if was_deleted {
                        Body::Empty
                    } else {
                        Body::Bytes(body.to_vec(), m.datatype.contains(Datatype::JSON))
                    };
                    (Attrs::parse(section)?, body)
                }
                None => (Attrs::default(), Body::Empty),
            };
            // The `$document` of the version changed, as a lookup sees it, for document
            // macros (`${$document.CAS}`); a document being created has a blank one.
            let mut old_vattrs = || match &existing {
                Some((value, m, deleted)) => {
                    let (section, body) = if m.datatype.contains(Datatype::XATTR) {
                        xattr::split(value).unwrap_or((&[], &[]))
                    } else {
                        (&[][..], &value[..])
                    };
                    let keys = Attrs::parse(section).unwrap_or_default().0.into_iter();
                    subdoc::virtual_attributes(m, body, *deleted, keys.map(|(k, _)| k).collect())
                }
                None => subdoc::virtual_attributes(&ItemMeta::default(), &[], false, Vec::new()),
            };
            let mut values = Vec::new();
            for (i, s) in req.specs.iter().enumerate() {
                let index = u8::try_from(i).map_err(|_| EngineStatus::Invalid)?;
                let mkdir = s.mkdir_p || create;
                let done = if s.xattr && s.op != SubdocOp::ReplaceBodyWithXattr {
                    mutate_attr(&mut attrs, s, mkdir, &mut old_vattrs)
                } else {
                    mutate_body(&mut body, &mut attrs, &mut deleted, s, mkdir, create)
                };
                match done {
                    Ok(v) if !v.is_empty() => values.push((index, v)),
                    Ok(_) => {}
                    Err(error) => return Ok(SubdocMutated::Failed { index, error }),
                }
            }
            let (body, json) = match body {
                Body::Bytes(b, json) => (b, json),
                Body::Dom(d) => (
                    serde_json::to_vec(&d).map_err(|_| EngineStatus::Internal)?,
                    true,
                ),
                Body::Empty => (Vec::new(), false),
            };
            if deleted && !body.is_empty() {
                return Ok(SubdocMutated::Refused(SubdocError::DeletedDocCantHaveValue));
            }
            let mut patches = Patches::default();
            let section = attrs.to_section(crc32c::crc32c(&body), &mut patches);
            if section.len().saturating_add(body.len()) > self.core.config.max_item_size_bytes {
                return Err(EngineStatus::TooBig);
            }
            let mut datatype = Datatype::RAW;
            if json && !body.is_empty() {
                datatype = datatype.union(Datatype::JSON);
            }
            if !section.is_empty() {
                datatype = datatype.union(Datatype::XATTR);
            }
            let old = existing.as_ref().map(|(_, m, _)| *m);
            let expiry = match old {
                _ if deleted => 0,
                Some(m) if req.preserve_ttl && !was_deleted => m.expiry,
                _ => self.collection_expiry(
                    req.key,
                    Expiry::from_wire(req.expiry_raw).to_unix_secs(now.secs()),
                    now.secs(),
                ),
            };
            let meta = ItemMeta {
                flags: req.flags.unwrap_or_else(|| old.map_or(0, |m| m.flags)),
                expiry,
                datatype,
                ..ItemMeta::default()
            };
            let sv = if deleted {
                StoredValue::new_tombstone(req.key, &section, meta)
            } else {
                StoredValue::with_value_parts(req.key, &[&section, &body], meta)
            }
            .map_err(|_| EngineStatus::Invalid)?;
            let rev = old.map(|m| m.rev_seqno);
            let durable = req.durability.as_ref();
            let a = self.write_version(vb, e, sv, &now, rev, &patches, durable)?;
            if deleted && !vb.is_persistent() && durable.is_none() {
                // Nothing will persist it: the next expiry pass may drop it.
                e.mark_clean(a.seqno);
            }
            Ok(SubdocMutated::Done {
                info: Self::mutation_info(vb, a),
                values,
                deleted,
            })
        });
        if let Ok(SubdocMutated::Done { info, .. }) = &result {
            self.after_write(vb, req.durability.as_ref(), &Ok(*info));
        }
        result
    }
}

/// Applies one extended-attribute spec to `attrs`.
/// `vattrs` builds the virtual attributes of the version being changed, for document
/// macros.
fn mutate_attr(
    attrs: &mut Attrs,
    s: &SubdocSpec<'_>,
    mkdir: bool,
    vattrs: &mut dyn FnMut() -> Value,
) -> Result<Vec<u8>, SubdocError> {
    let key = subdoc::first_key(s.path)?;
    if xattr::is_virtual_key(key.as_bytes()) {
        return Err(SubdocError::CantModifyVattr);
    }
    if !xattr::valid_key(key.as_bytes()) {
        return Err(SubdocError::PathInvalid);
    }
    let expanded;
    let value = if s.expand_macros {
        expanded = Attrs::expand_macros(s.value, vattrs)?;
        &expanded[..]
    } else if s.binary {
        expanded = crate::xattrs::encode_binary(s.value);
        &expanded[..]
    } else {
        s.value
    };
    let mut root = Value::Object(std::mem::take(&mut attrs.0));
    let done = subdoc::mutate(&mut root, s.op, s.path, value, mkdir);
    if let Value::Object(o) = root {
        attrs.0 = o;
    }
    done
}

/// Applies one body spec (a path, or a whole-document one) to `body`.
fn mutate_body(
    body: &mut Body,
    attrs: &mut Attrs,
    deleted: &mut bool,
    s: &SubdocSpec<'_>,
    mkdir: bool,
    create: bool,
) -> Result<Vec<u8>, SubdocError> {
    match s.op {
        SubdocOp::SetDoc => {
            let json = serde_json::from_slice::<serde::de::IgnoredAny>(s.value).is_ok();
            *body = Body::Bytes(s.value.to_vec(), json);
            Ok(Vec::new())
        }
        SubdocOp::DeleteDoc => {
            // As a DELETE: the body and user attributes go.
            *deleted = true;
            *body = Body::Empty;
            attrs.retain_system();
            Ok(Vec::new())
        }
        SubdocOp::ReplaceBodyWithXattr => {
            let root = Value::Object(attrs.0.clone());
            let v = subdoc::lookup(&root, SubdocOp::Get, s.path)?;
            *body = if s.binary {
                // The decoded bytes, which may still be JSON.
                let v = crate::xattrs::decode_binary(&v)?;
                let json = serde_json::from_slice::<serde::de::IgnoredAny>(&v).is_ok();
                Body::Bytes(v, json)
            } else {
                Body::Bytes(v, true)
            };
            Ok(Vec::new())
        }
        _ => {
            let doc = match std::mem::replace(body, Body::Empty) {
                Body::Dom(d) => d,
                Body::Bytes(b, _) => subdoc::parse_doc(&b)?,
                Body::Empty if create || !*deleted => subdoc::empty_root(s.op, s.path),
                Body::Empty => return Err(SubdocError::PathNotFound),
            };
            *body = Body::Dom(doc);
            let Body::Dom(doc) = body else {
                return Err(SubdocError::PathInvalid);
            };
            subdoc::mutate(doc, s.op, s.path, s.value, mkdir)
        }
    }
}
