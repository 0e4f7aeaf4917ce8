//! The sub-document operations on a bucket: lookups read a copy of the document taken
//! under the key's lock and evaluate the paths outside it; mutations apply every path to
//! the parsed document under the lock and store the result as one new version (seqno,
//! CAS, revision), or nothing when a path fails.

use crate::Bucket;
use crate::bucket::{LazyNow, check_durability, check_lock_and_cas};
use crate::ops::plain_value;
use crate::stats::Counter;
use crate::subdoc;
use epkv_engine_api::{
    EngineResult, EngineStatus, Expiry, SubdocError, SubdocLookup, SubdocMutated, SubdocMutation,
    SubdocSpec,
};
use epkv_hashtable::{ItemMeta, StoredValue};
use epkv_types::{Cas, Datatype, Vbid};

/// Documents up to this size are searched under the key's lock rather than copied out.
const SEARCH_UNDER_LOCK_BYTES: usize = 16 * 1024;

impl Bucket {
    /// Sub-document lookups (see [`epkv_engine_api::Engine::subdoc_lookup`]).
    pub(crate) fn op_subdoc_lookup(
        &self,
        vbid: Vbid,
        key: &[u8],
        specs: &[SubdocSpec<'_>],
    ) -> EngineResult<SubdocLookup> {
        self.counters.incr(Counter::CmdGet);
        if specs.iter().any(|s| !s.op.is_lookup()) {
            return Err(EngineStatus::Invalid);
        }
        let (vb, _state) = self.client_vbucket(vbid, key)?;
        let now = LazyNow::new(&*self.clock);
        let search = |plain: &[u8], m: &ItemMeta| -> Vec<Result<Vec<u8>, SubdocError>> {
            // A document stored as JSON is read only as far as each path; each path is
            // found in the document's text without building the document.
            let trusted = m.datatype.contains(Datatype::JSON);
            let vattrs = specs
                .iter()
                .any(|s| s.xattr)
                .then(|| subdoc::virtual_attributes(m, plain));
            specs
                .iter()
                .map(|s| match &vattrs {
                    Some(v) if s.xattr => subdoc::lookup_xattr(v, s.op, s.path),
                    _ => subdoc::lookup_raw(plain, s.op, s.path, trusted),
                })
                .collect()
        };
        // A small plain document is searched under the key's lock (a scan of a few
        // microseconds at most); a large or compressed one is copied out and searched
        // after the lock is released.
        let (cas, found) = vb.table.with_entry(key, |e| {
            self.expire_on_access(vb, e, &now);
            self.fetch_if_evicted(vb, e)?;
            e.track_reference();
            let sv = e.get().ok_or(EngineStatus::KeyNotFound)?;
            let m = sv.meta();
            let cas = if crate::bucket::locked(m, &now) {
                Cas(u64::MAX)
            } else {
                m.cas
            };
            if sv.value_len() <= SEARCH_UNDER_LOCK_BYTES && !m.datatype.contains(Datatype::SNAPPY) {
                Ok((cas, Ok(search(sv.value(), m))))
            } else {
                Ok((cas, Err((*m, sv.value().to_vec()))))
            }
        })?;
        self.counters.incr(Counter::GetHits);
        let results = match found {
            Ok(results) => results,
            Err((m, value)) => {
                let plain = plain_value(&value, m.datatype).map_err(|_| EngineStatus::Internal)?;
                search(&plain, &m)
            }
        };
        Ok(SubdocLookup { cas, results })
    }

    /// Sub-document mutations (see [`epkv_engine_api::Engine::subdoc_mutate`]).
    pub(crate) fn op_subdoc_mutate(&self, req: &SubdocMutation<'_>) -> EngineResult<SubdocMutated> {
        self.counters.incr(Counter::CmdSet);
        if req.specs.is_empty() || req.specs.iter().any(|s| s.op.is_lookup()) {
            return Err(EngineStatus::Invalid);
        }
        if req.add && (req.mkdoc || !req.cas.is_any()) {
            return Err(EngineStatus::Invalid);
        }
        let (vb, _state) = self.client_vbucket(req.vbid, req.key)?;
        self.check_disk()?;
        check_durability(req.durability.as_ref(), self.persistence.is_some())?;
        let now = LazyNow::new(&*self.clock);
        vb.table.with_entry(req.key, |e| {
            self.expire_on_access(vb, e, &now);
            self.fetch_if_evicted(vb, e)?;
            let existing = match e.get() {
                Some(sv) => {
                    if req.add {
                        return Err(EngineStatus::KeyExists);
                    }
                    check_lock_and_cas(sv.meta(), req.cas, &now)?;
                    Some((
                        plain_value(sv.value(), sv.meta().datatype)?.into_owned(),
                        *sv.meta(),
                    ))
                }
                None if req.mkdoc || req.add => {
                    if !req.cas.is_any() {
                        return Err(EngineStatus::KeyNotFound);
                    }
                    None
                }
                None => return Err(EngineStatus::KeyNotFound),
            };
            let create = existing.is_none();
            let mut doc = match &existing {
                Some((value, _)) => match subdoc::parse_doc(value) {
                    Ok(d) => d,
                    Err(error) => return Ok(SubdocMutated::Failed { index: 0, error }),
                },
                None => {
                    let first = req.specs[0];
                    subdoc::empty_root(first.op, first.path)
                }
            };
            let mut values = Vec::new();
            for (i, s) in req.specs.iter().enumerate() {
                let index = u8::try_from(i).map_err(|_| EngineStatus::Invalid)?;
                match subdoc::mutate(&mut doc, s.op, s.path, s.value, s.mkdir_p || create) {
                    Ok(v) if !v.is_empty() => values.push((index, v)),
                    Ok(_) => {}
                    Err(error) => return Ok(SubdocMutated::Failed { index, error }),
                }
            }
            let bytes = serde_json::to_vec(&doc).map_err(|_| EngineStatus::Internal)?;
            if bytes.len() > self.config.max_item_size_bytes {
                return Err(EngineStatus::TooBig);
            }
            let old = existing.as_ref().map(|(_, m)| *m);
            let expiry = match old {
                Some(m) if req.preserve_ttl => m.expiry,
                _ => Expiry::from_wire(req.expiry_raw).to_unix_secs(now.secs()),
            };
            let meta = ItemMeta {
                flags: old.map_or(0, |m| m.flags),
                expiry,
                datatype: Datatype::JSON,
                ..ItemMeta::default()
            };
            let sv = StoredValue::new(req.key, &bytes, meta).map_err(|_| EngineStatus::Invalid)?;
            self.insert_or_tempfail(e, sv)?;
            let a = self.commit_version(vb, e, &now, old.map(|m| m.rev_seqno));
            Ok(SubdocMutated::Done {
                info: Self::mutation_info(vb, a),
                values,
            })
        })
    }
}
