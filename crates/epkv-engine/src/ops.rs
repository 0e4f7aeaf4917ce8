//! The document operations: each routes to its vBucket, then reads and changes the key
//! inside one [`epkv_hashtable::HashTable::with_entry`] closure, so everything it decides
//! (existence, expiry, lock, CAS) and everything it writes happens under the key's stripe
//! lock, with seqno and CAS assigned at the vBucket's ordering point before it is released.

use crate::Bucket;
use crate::counter_value;
use crate::document::{
    check_durability, check_lock_and_cas, check_no_sync_write, item_of, locked, plain_value,
};
use crate::lazy_now::LazyNow;
use crate::stats::Counter;
use crate::vbucket::{Assigned, DeleteSource, VBucket};
use epkv_engine_api::xattr;
use epkv_engine_api::{
    ArithmeticOp, ArithmeticRequest, DocMeta, EngineResult, EngineStatus, Expiry, Item, KeyState,
    MutationInfo, RemoveRequest, StoreOp, StoreRequest,
};
use epkv_hashtable::{Entry, ItemMeta, StoredValue};
use epkv_types::{Cas, Datatype, Vbid};

/// Raw expiry that tells INCREMENT/DECREMENT not to create a missing key.
const ARITHMETIC_NO_CREATE: u32 = 0xffff_ffff;

/// Whether a value a client sent with datatype XATTR holds a valid attribute section
/// (true for any value without the bit).
fn valid_with_attrs(value: &[u8], datatype: Datatype) -> bool {
    if !datatype.contains(Datatype::XATTR) {
        return true;
    }
    let Ok(plain) = plain_value(value, datatype) else {
        return false;
    };
    xattr::split(&plain).is_ok_and(|(s, _)| crate::xattrs::valid_section(s))
}

/// Returns JSON if `value` is a JSON document, else raw bytes (used for values the engine
/// builds itself, as KV-Engine re-checks the datatype after APPEND/PREPEND).
fn json_or_raw(value: &[u8]) -> Datatype {
    if serde_json::from_slice::<serde::de::IgnoredAny>(value).is_ok() {
        Datatype::JSON
    } else {
        Datatype::RAW
    }
}

impl Bucket {
    /// GET.
    pub(crate) fn op_get(&self, vbid: Vbid, key: &[u8]) -> EngineResult<Item> {
        self.op_get_with(vbid, key, |sv, cas| item_of(sv, vbid, cas))
    }

    /// GET's work, handing the live document and the CAS readers may see (a never-matching
    /// one while it is locked) to `read`, under the key's lock.
    pub(crate) fn op_get_with<R>(
        &self,
        vbid: Vbid,
        key: &[u8],
        read: impl FnOnce(&StoredValue, Cas) -> R,
    ) -> EngineResult<R> {
        self.core.counters.incr(Counter::CmdGet);
        let (vb, _state) = self.core.client_vbucket(vbid, key)?;
        self.collection_ops.count(key, crate::collections::Op::Get);
        let now = LazyNow::new(&*self.core.clock);
        let result = vb.table.with_entry(key, |e| {
            self.expire_on_access(vb, e, &now)?;
            self.fetch_if_evicted(vb, e)?;
            e.track_reference();
            let sv = e.get().ok_or(EngineStatus::KeyNotFound)?;
            // A locked document shows everyone a CAS that can never match.
            let cas = if locked(sv.meta(), &now) {
                Cas(u64::MAX)
            } else {
                sv.meta().cas
            };
            Ok(read(sv, cas))
        });
        self.count_read(&result);
        result
    }

    fn count_read<T>(&self, result: &EngineResult<T>) {
        match result {
            Ok(_) => self.core.counters.incr(Counter::GetHits),
            Err(EngineStatus::KeyNotFound) => self.core.counters.incr(Counter::GetMisses),
            Err(_) => {}
        }
    }

    fn count_touch<T>(&self, result: &EngineResult<T>) {
        match result {
            Ok(_) => self.core.counters.incr(Counter::TouchHits),
            Err(EngineStatus::KeyNotFound) => self.core.counters.incr(Counter::TouchMisses),
            Err(_) => {}
        }
    }

    /// Sets a new expiry on the entry's live, unlocked item; a new version with its own
    /// seqno and CAS.
    fn touch_entry(
        &self,
        vb: &VBucket,
        e: &mut Entry<'_>,
        expiry_raw: u32,
        now: &LazyNow<'_>,
    ) -> EngineResult<Assigned> {
        let meta = *e.get().ok_or(EngineStatus::KeyNotFound)?.meta();
        if locked(&meta, now) {
            return Err(EngineStatus::Locked);
        }
        let expiry = Expiry::from_wire(expiry_raw).to_unix_secs(now.secs());
        let (a, woke) = vb.assign_mutation_queued(now.nanos(), |a| {
            crate::document::document_of(e, a, meta.rev_seqno + 1, Some(expiry))
        });
        if let Some(m) = e.meta_mut() {
            m.expiry = expiry;
            m.by_seqno = a.seqno;
            m.cas = a.cas;
            m.rev_seqno += 1;
            m.clear_lock();
        }
        self.core.queued(vb, woke);
        Ok(a)
    }

    /// GAT.
    pub(crate) fn op_get_and_touch(
        &self,
        vbid: Vbid,
        key: &[u8],
        expiry_raw: u32,
    ) -> EngineResult<Item> {
        self.core.counters.incr(Counter::CmdGet);
        let (vb, _state) = self.core.client_vbucket(vbid, key)?;
        self.core.check_disk()?;
        let now = LazyNow::new(&*self.core.clock);
        let result = vb.table.with_entry(key, |e| {
            check_no_sync_write(e)?;
            self.expire_on_access(vb, e, &now)?;
            self.fetch_if_evicted(vb, e)?;
            let a = self.touch_entry(vb, e, expiry_raw, &now)?;
            let sv = e.get().ok_or(EngineStatus::Internal)?;
            Ok(item_of(sv, vbid, a.cas))
        });
        self.count_read(&result);
        self.count_touch(&result);
        result
    }

    /// TOUCH.
    pub(crate) fn op_touch(
        &self,
        vbid: Vbid,
        key: &[u8],
        expiry_raw: u32,
    ) -> EngineResult<MutationInfo> {
        let (vb, _state) = self.core.client_vbucket(vbid, key)?;
        self.core.check_disk()?;
        let now = LazyNow::new(&*self.core.clock);
        let result = vb.table.with_entry(key, |e| {
            check_no_sync_write(e)?;
            self.expire_on_access(vb, e, &now)?;
            self.fetch_if_evicted(vb, e)?;
            let a = self.touch_entry(vb, e, expiry_raw, &now)?;
            Ok(Self::mutation_info(vb, a))
        });
        self.count_touch(&result);
        result
    }

    /// GET_LOCKED.
    pub(crate) fn op_get_locked(
        &self,
        vbid: Vbid,
        key: &[u8],
        lock_timeout_secs: u32,
    ) -> EngineResult<Item> {
        let (vb, _state) = self.core.client_vbucket(vbid, key)?;
        let timeout = if lock_timeout_secs == 0
            || lock_timeout_secs > self.core.config.getl_max_timeout_secs
        {
            self.core.config.getl_default_timeout_secs
        } else {
            lock_timeout_secs
        };
        let now = LazyNow::new(&*self.core.clock);
        let result = vb.table.with_entry(key, |e| {
            self.fetch_meta_if_evicted(vb, e)?;
            self.expire_on_access(vb, e, &now)?;
            let meta = *e.get().ok_or(EngineStatus::KeyNotFound)?.meta();
            if locked(&meta, &now) {
                return Err(EngineStatus::Locked);
            }
            self.fetch_if_evicted(vb, e)?;
            // As KV-Engine: the lock's CAS (fresh from the HLC, no seqno) becomes the
            // document's CAS and is the token unlock and writers must present.
            let lock_cas = vb.assign_lock_cas(now.nanos());
            if let Some(m) = e.meta_mut() {
                m.lock_expiry = now.secs().saturating_add(timeout);
                m.cas = lock_cas;
            }
            let sv = e.get().ok_or(EngineStatus::Internal)?;
            Ok(item_of(sv, vbid, lock_cas))
        });
        match &result {
            Ok(_) => self.core.counters.incr(Counter::LockHits),
            Err(EngineStatus::KeyNotFound) => self.core.counters.incr(Counter::LockMisses),
            Err(_) => {}
        }
        result
    }

    /// GET_META: the document's metadata, or its tombstone's. A key missing from memory
    /// is looked up on disk (a persistent bucket keeps tombstones in memory only until
    /// they are persisted): the lookup leaves the tombstone, or a marker that the key is
    /// absent, in memory for the next request.
    pub(crate) fn op_get_meta(&self, vbid: Vbid, key: &[u8]) -> EngineResult<DocMeta> {
        let (vb, _state) = self.core.client_vbucket(vbid, key)?;
        let now = LazyNow::new(&*self.core.clock);
        vb.table.with_entry(key, |e| {
            self.expire_on_access(vb, e, &now)?;
            self.fetch_meta_if_evicted(vb, e)?;
            if e.committed().is_none() && vb.is_persistent() && vb.full.is_none() {
                return Err(self.core.look_up_on_disk(vb, e, false));
            }
            match e.committed() {
                // A tombstone with seqno 0 marks a key the disk does not have.
                Some(sv) if sv.is_placeholder() || sv.meta().by_seqno.0 == 0 => {
                    Err(EngineStatus::KeyNotFound)
                }
                Some(sv) => {
                    let m = sv.meta();
                    Ok(DocMeta {
                        cas: m.cas,
                        deleted: sv.is_deleted(),
                        flags: m.flags,
                        expiry_unix_secs: m.expiry,
                        seqno: m.by_seqno,
                        rev_seqno: m.rev_seqno,
                        datatype: m.datatype,
                    })
                }
                None => Err(EngineStatus::KeyNotFound),
            }
        })
    }

    /// OBSERVE of one key: whether it is on disk, and its CAS. Full eviction looks a key
    /// missing from memory up on disk first.
    pub(crate) fn op_observe(&self, vbid: Vbid, key: &[u8]) -> EngineResult<(KeyState, Cas)> {
        let (vb, _state) = self.core.client_vbucket(vbid, key)?;
        let r = vb.table.with_entry(key, |e| {
            self.fetch_meta_if_evicted(vb, e)?;
            e.mark_clean_upto(vb.persisted_seqno());
            Ok(match e.committed() {
                Some(sv) if sv.is_placeholder() => (KeyState::NotFound, Cas(0)),
                Some(sv) if sv.is_deleted() && sv.is_dirty() => {
                    (KeyState::LogicallyDeleted, sv.meta().cas)
                }
                Some(sv) if sv.is_deleted() => (KeyState::NotFound, Cas(0)),
                Some(sv) if sv.is_dirty() => (KeyState::NotPersisted, sv.meta().cas),
                Some(sv) => (KeyState::Persisted, sv.meta().cas),
                None => (KeyState::NotFound, Cas(0)),
            })
        });
        // A client polling OBSERVE waits for persistence (PersistTo): flush now rather
        // than after the batching delay.
        if let (Ok((KeyState::NotPersisted | KeyState::LogicallyDeleted, _)), Some(p)) =
            (&r, &self.core.persistence)
        {
            p.urgent(vbid);
        }
        r
    }

    /// UNLOCK_KEY.
    pub(crate) fn op_unlock(&self, vbid: Vbid, key: &[u8], cas: Cas) -> EngineResult<()> {
        let (vb, _state) = self.core.client_vbucket(vbid, key)?;
        let now = LazyNow::new(&*self.core.clock);
        vb.table.with_entry(key, |e| {
            self.fetch_meta_if_evicted(vb, e)?;
            self.expire_on_access(vb, e, &now)?;
            if e.get().is_none() {
                return Err(EngineStatus::KeyNotFound);
            }
            let meta = e.meta_mut().ok_or(EngineStatus::KeyNotFound)?;
            if !(meta.lock_expiry != 0 && meta.is_locked(now.secs())) {
                meta.clear_lock();
                return Err(EngineStatus::NotLocked);
            }
            if cas != meta.cas {
                return Err(EngineStatus::Locked);
            }
            meta.clear_lock();
            Ok(())
        })
    }

    /// SET, ADD, REPLACE, APPEND, PREPEND.
    pub(crate) fn op_store(&self, req: &StoreRequest<'_>) -> EngineResult<MutationInfo> {
        self.core.counters.incr(Counter::CmdSet);
        let plain_len = if req.datatype.contains(Datatype::SNAPPY) {
            snap::raw::decompress_len(req.value).map_err(|_| EngineStatus::Invalid)?
        } else {
            req.value.len()
        };
        if req.value.len().max(plain_len) > self.core.config.max_item_size_bytes {
            self.core.counters.incr(Counter::TooBig);
            return Err(EngineStatus::TooBig);
        }
        // memcached's validator rejects ADD with a CAS (EINVAL); the engine agrees.
        if req.op == StoreOp::Add && !req.cas.is_any() {
            return Err(EngineStatus::Invalid);
        }
        let (vb, _state) = self.core.client_vbucket(req.vbid, req.key)?;
        self.collection_ops
            .count(req.key, crate::collections::Op::Store);
        self.core.check_disk()?;
        check_durability(req.durability.as_ref(), self.core.persistence.is_some())?;
        let now = LazyNow::new(&*self.core.clock);
        let result = vb
            .table
            .with_entry(req.key, |e| self.store_entry(vb, e, req, &now));
        self.after_write(vb, req.durability.as_ref(), &result);
        if !req.cas.is_any() {
            self.count_cas(&result);
        }
        if matches!(result, Err(EngineStatus::TooBig)) {
            self.core.counters.incr(Counter::TooBig);
        }
        result
    }

    fn count_cas<T>(&self, result: &EngineResult<T>) {
        match result {
            Ok(_) => self.core.counters.incr(Counter::CasHits),
            Err(EngineStatus::KeyNotFound | EngineStatus::NotStored) => {
                self.core.counters.incr(Counter::CasMisses);
            }
            Err(EngineStatus::KeyExists) => self.core.counters.incr(Counter::CasBadval),
            Err(_) => {}
        }
    }

    fn store_entry(
        &self,
        vb: &VBucket,
        e: &mut Entry<'_>,
        req: &StoreRequest<'_>,
        now: &LazyNow<'_>,
    ) -> EngineResult<MutationInfo> {
        check_no_sync_write(e)?;
        self.expire_on_access(vb, e, now)?;
        let mut existence_unknown = false;
        // A write of the body alone keeps the document's extended attributes.
        let keep_attrs = !req.datatype.contains(Datatype::XATTR);
        match req.op {
            // The only writes that keep the old value.
            StoreOp::Append | StoreOp::Prepend => self.fetch_if_evicted(vb, e)?,
            // Replaces whatever is there: no disk read to find out what that is, unless
            // it may have attributes to keep.
            StoreOp::Set if req.cas.is_any() && !(keep_attrs && vb.may_contain_xattrs()) => {
                existence_unknown = crate::full_eviction::existence_unknown(vb, e);
            }
            _ => self.fetch_meta_if_evicted(vb, e)?,
        }
        if keep_attrs
            && e.get()
                .is_some_and(|sv| sv.meta().datatype.contains(Datatype::XATTR) && !sv.is_resident())
        {
            self.fetch_if_evicted(vb, e)?;
        }
        if !keep_attrs && !valid_with_attrs(req.value, req.datatype) {
            return Err(EngineStatus::Invalid);
        }
        let existing = match e.get() {
            Some(sv) => {
                if req.op == StoreOp::Add {
                    return Err(EngineStatus::KeyExists);
                }
                check_lock_and_cas(sv.meta(), req.cas, now)?;
                Some((sv.value(), *sv.meta()))
            }
            None => {
                match req.op {
                    StoreOp::Replace => return Err(EngineStatus::KeyNotFound),
                    StoreOp::Append | StoreOp::Prepend => return Err(EngineStatus::NotStored),
                    StoreOp::Set if !req.cas.is_any() => return Err(EngineStatus::KeyNotFound),
                    StoreOp::Set | StoreOp::Add => {}
                }
                None
            }
        };
        let new_meta = |flags, expiry, datatype| ItemMeta {
            flags,
            expiry,
            datatype,
            ..ItemMeta::default()
        };
        let (sv, old_rev) = match (req.op, existing) {
            (StoreOp::Append | StoreOp::Prepend, Some((old, meta))) => {
                let old = plain_value(old, meta.datatype)?;
                let attrs = xattr::section(&old, meta.datatype);
                let old = xattr::body(&old, meta.datatype);
                let new = plain_value(req.value, req.datatype)?;
                let new = new.as_ref();
                let total = attrs
                    .len()
                    .saturating_add(old.len())
                    .saturating_add(new.len());
                if total > self.core.config.max_item_size_bytes {
                    return Err(EngineStatus::TooBig);
                }
                let parts: [&[u8]; 3] = if req.op == StoreOp::Append {
                    [attrs, old, new]
                } else {
                    [attrs, new, old]
                };
                let mut sv = StoredValue::with_value_parts(req.key, &parts, ItemMeta::default())
                    .map_err(|_| EngineStatus::Invalid)?;
                let mut datatype = json_or_raw(&sv.value()[attrs.len()..]);
                if !attrs.is_empty() {
                    datatype = datatype.union(Datatype::XATTR);
                }
                let meta_new = new_meta(meta.flags, meta.expiry, datatype);
                sv = sv.with_meta(meta_new);
                (sv, Some(meta.rev_seqno))
            }
            (_, Some((old, meta))) => {
                let expiry = if req.preserve_ttl {
                    meta.expiry
                } else {
                    self.collection_expiry(req.key, req.expiry.to_unix_secs(now.secs()), now.secs())
                };
                let sv = if keep_attrs && meta.datatype.contains(Datatype::XATTR) {
                    // The old attributes, then the new body (stored uncompressed).
                    let old = plain_value(old, meta.datatype)?;
                    let attrs = xattr::section(&old, meta.datatype);
                    let body = plain_value(req.value, req.datatype)?;
                    if attrs.len().saturating_add(body.len()) > self.core.config.max_item_size_bytes
                    {
                        return Err(EngineStatus::TooBig);
                    }
                    let datatype = req
                        .datatype
                        .without(Datatype::SNAPPY)
                        .union(Datatype::XATTR);
                    let meta_new = new_meta(req.flags, expiry, datatype);
                    StoredValue::with_value_parts(req.key, &[attrs, &body], meta_new)
                } else {
                    StoredValue::new(
                        req.key,
                        req.value,
                        new_meta(req.flags, expiry, req.datatype),
                    )
                };
                (sv.map_err(|_| EngineStatus::Invalid)?, Some(meta.rev_seqno))
            }
            (_, None) => {
                let expiry = self.collection_expiry(
                    req.key,
                    req.expiry.to_unix_secs(now.secs()),
                    now.secs(),
                );
                let meta_new = new_meta(req.flags, expiry, req.datatype);
                (
                    StoredValue::new(req.key, req.value, meta_new)
                        .map_err(|_| EngineStatus::Invalid)?,
                    None,
                )
            }
        };
        let none = crate::xattrs::Patches::default();
        let a = self.write_version(vb, e, sv, now, old_rev, &none, req.durability.as_ref())?;
        if existence_unknown {
            vb.persist.mark_unknown(req.key);
        }
        Ok(Self::mutation_info(vb, a))
    }

    /// DELETE.
    pub(crate) fn op_remove(&self, req: &RemoveRequest<'_>) -> EngineResult<MutationInfo> {
        let (vb, _state) = self.core.client_vbucket(req.vbid, req.key)?;
        self.collection_ops
            .count(req.key, crate::collections::Op::Delete);
        self.core.check_disk()?;
        check_durability(req.durability.as_ref(), self.core.persistence.is_some())?;
        let now = LazyNow::new(&*self.core.clock);
        let result = vb.table.with_entry(req.key, |e| {
            check_no_sync_write(e)?;
            self.fetch_meta_if_evicted(vb, e)?;
            self.expire_on_access(vb, e, &now)?;
            let meta = *e.get().ok_or(EngineStatus::KeyNotFound)?.meta();
            check_lock_and_cas(&meta, req.cas, &now)?;
            // The tombstone keeps the system attributes: the value must be read.
            if meta.datatype.contains(Datatype::XATTR) {
                self.fetch_if_evicted(vb, e)?;
            }
            let a = match &req.durability {
                Some(d) => self.core.prepare_deletion(vb, e, &now, d)?,
                None => self.delete_entry(vb, e, &now, DeleteSource::Explicit),
            };
            Ok(Self::mutation_info(vb, a))
        });
        self.after_write(vb, req.durability.as_ref(), &result);
        match &result {
            Ok(_) => self.core.counters.incr(Counter::DeleteHits),
            Err(EngineStatus::KeyNotFound) => self.core.counters.incr(Counter::DeleteMisses),
            Err(_) => {}
        }
        if !req.cas.is_any() {
            self.count_cas(&result);
        }
        result
    }

    /// INCREMENT, DECREMENT.
    pub(crate) fn op_arithmetic(
        &self,
        req: &ArithmeticRequest<'_>,
    ) -> EngineResult<(u64, MutationInfo)> {
        let (vb, _state) = self.core.client_vbucket(req.vbid, req.key)?;
        self.collection_ops
            .count(req.key, crate::collections::Op::Store);
        self.core.check_disk()?;
        check_durability(req.durability.as_ref(), self.core.persistence.is_some())?;
        let now = LazyNow::new(&*self.core.clock);
        let result = vb
            .table
            .with_entry(req.key, |e| self.arithmetic_entry(vb, e, req, &now));
        self.after_write(vb, req.durability.as_ref(), &result.map(|r| r.1));
        let (hit, miss) = match req.op {
            ArithmeticOp::Increment => (Counter::IncrHits, Counter::IncrMisses),
            ArithmeticOp::Decrement => (Counter::DecrHits, Counter::DecrMisses),
        };
        match &result {
            Ok(_) => self.core.counters.incr(hit),
            Err(EngineStatus::KeyNotFound) => self.core.counters.incr(miss),
            Err(_) => {}
        }
        result
    }

    fn arithmetic_entry(
        &self,
        vb: &VBucket,
        e: &mut Entry<'_>,
        req: &ArithmeticRequest<'_>,
        now: &LazyNow<'_>,
    ) -> EngineResult<(u64, MutationInfo)> {
        check_no_sync_write(e)?;
        self.expire_on_access(vb, e, now)?;
        self.fetch_if_evicted(vb, e)?;
        let (sv, result, old_rev) = match e.get() {
            None => {
                if req.expiry_raw == ARITHMETIC_NO_CREATE || !req.cas.is_any() {
                    return Err(EngineStatus::KeyNotFound);
                }
                // A created counter holds `initial`; the delta is not applied.
                let meta = ItemMeta {
                    expiry: self.collection_expiry(
                        req.key,
                        Expiry::from_wire(req.expiry_raw).to_unix_secs(now.secs()),
                        now.secs(),
                    ),
                    datatype: Datatype::JSON,
                    ..ItemMeta::default()
                };
                let value = counter_value::format(req.initial);
                (
                    StoredValue::new(req.key, value.as_ref(), meta)
                        .map_err(|_| EngineStatus::Invalid)?,
                    req.initial,
                    None,
                )
            }
            Some(sv) => {
                let old = *sv.meta();
                check_lock_and_cas(&old, req.cas, now)?;
                let plain = plain_value(sv.value(), old.datatype)?;
                let current = counter_value::parse(xattr::body(&plain, old.datatype))
                    .ok_or(EngineStatus::DeltaBadValue)?;
                let attrs = xattr::section(&plain, old.datatype).to_vec();
                let next = match req.op {
                    ArithmeticOp::Increment => current.wrapping_add(req.delta),
                    ArithmeticOp::Decrement => current.saturating_sub(req.delta),
                };
                let datatype = if attrs.is_empty() {
                    Datatype::JSON
                } else {
                    Datatype::JSON.union(Datatype::XATTR)
                };
                let meta = ItemMeta {
                    flags: old.flags,
                    expiry: old.expiry,
                    datatype,
                    ..ItemMeta::default()
                };
                let value = counter_value::format(next);
                (
                    StoredValue::with_value_parts(sv.key(), &[&attrs, value.as_ref()], meta)
                        .map_err(|_| EngineStatus::Invalid)?,
                    next,
                    Some(old.rev_seqno),
                )
            }
        };
        let none = crate::xattrs::Patches::default();
        let a = self.write_version(vb, e, sv, now, old_rev, &none, req.durability.as_ref())?;
        Ok((result, Self::mutation_info(vb, a)))
    }

    /// FLUSH: removes every document of every vBucket (seqnos keep counting; failover
    /// logs are kept).
    pub(crate) fn op_flush(&self) -> EngineResult<()> {
        if !self.core.config.flush_enabled {
            return Err(EngineStatus::NotSupported);
        }
        if !self.is_warmed_up() {
            // Warmup would load documents back while the files are being deleted.
            return Err(EngineStatus::TempFail);
        }
        for vb in &self.core.vbuckets {
            self.core.abandon_sync_writes(vb);
        }
        let removed: usize = self
            .core
            .vbuckets
            .iter()
            .map(|vb| {
                if let Some(full) = &vb.full {
                    full.reset();
                }
                vb.table.clear()
            })
            .sum();
        if let Some(p) = &self.core.persistence
            && let Err(e) = p.wipe(&self.core.vbuckets)
        {
            tracing::error!(bucket = %self.core.config.name, error = %e, "FLUSH could not delete the data files");
            return Err(EngineStatus::TempFail);
        }
        tracing::info!(bucket = %self.core.config.name, removed, "bucket flushed");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BucketConfig, EngineClock};
    use epkv_engine_api::Engine;
    use epkv_executor::ManualClock;
    use epkv_types::{NUM_VBUCKETS, vbucket_for_key};
    use std::sync::Arc;
    use std::time::Duration;

    fn bucket() -> Arc<Bucket> {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_700_000_000)));
        Bucket::new(
            BucketConfig {
                expiry_pager_interval: Duration::ZERO,
                ..BucketConfig::default()
            },
            EngineClock::Custom(clock),
        )
        .unwrap()
    }

    fn set(b: &Bucket, key: &'static str) {
        b.store(StoreRequest {
            op: StoreOp::Set,
            vbid: vbucket_for_key(key.as_bytes(), NUM_VBUCKETS),
            key: key.as_bytes(),
            value: b"1",
            flags: 0,
            expiry: Expiry::Never,
            preserve_ttl: false,
            datatype: Datatype::RAW,
            cas: Cas::ANY,
            durability: None,
        })
        .unwrap();
    }

    fn rev(b: &Bucket, key: &str) -> Option<u64> {
        let vb = &b.core.vbuckets[usize::from(vbucket_for_key(key.as_bytes(), NUM_VBUCKETS).0)];
        vb.table.get(key.as_bytes()).map(|sv| sv.meta().rev_seqno)
    }

    #[test]
    fn revision_seqno_counts_writes_across_deletes() {
        let b = bucket();
        set(&b, "k");
        assert_eq!(rev(&b, "k"), Some(1));
        set(&b, "k");
        b.touch(vbucket_for_key(b"k", NUM_VBUCKETS), b"k", 10)
            .unwrap();
        assert_eq!(rev(&b, "k"), Some(3));
        b.arithmetic(ArithmeticRequest {
            op: ArithmeticOp::Increment,
            vbid: vbucket_for_key(b"k", NUM_VBUCKETS),
            key: b"k",
            delta: 1,
            initial: 0,
            expiry_raw: 0,
            cas: Cas::ANY,
            durability: None,
        })
        .unwrap();
        assert_eq!(rev(&b, "k"), Some(4));
        b.remove(RemoveRequest {
            vbid: vbucket_for_key(b"k", NUM_VBUCKETS),
            key: b"k",
            cas: Cas::ANY,
            durability: None,
        })
        .unwrap();
        assert_eq!(rev(&b, "k"), None);
        // The tombstone had revision 5; the re-created key continues above it.
        set(&b, "k");
        assert_eq!(rev(&b, "k"), Some(6));
        b.shutdown();
    }

    #[test]
    fn get_locked_gives_a_fresh_cas_but_keeps_seqno_and_revision() {
        let b = bucket();
        set(&b, "k");
        let vbid = vbucket_for_key(b"k", NUM_VBUCKETS);
        let before = b.core.vbuckets[usize::from(vbid.0)]
            .table
            .get(b"k")
            .unwrap();
        let locked = b.get_locked(vbid, b"k", 5).unwrap();
        let after = b.core.vbuckets[usize::from(vbid.0)]
            .table
            .get(b"k")
            .unwrap();
        assert!(locked.cas > before.meta().cas);
        assert_eq!(
            after.meta().cas,
            locked.cas,
            "the lock CAS is the document's CAS"
        );
        assert_eq!(after.meta().rev_seqno, before.meta().rev_seqno);
        assert_eq!(after.meta().by_seqno, before.meta().by_seqno);
        assert_eq!(
            after.meta().lock_expiry,
            1_700_000_000 + 5,
            "lock expiry is absolute Unix seconds"
        );
        b.shutdown();
    }
}
