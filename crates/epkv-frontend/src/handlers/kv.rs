//! The key-value family: reads, writes, arithmetic, touch, locks, eviction and observe,
//! each a [`crate::dispatch::DataFn`] run against the selected bucket's engine.

use crate::dispatch::{DataCall, unexpected};
use crate::durable::{DurableReply, Wait, durability, persist_timeout};
use crate::response::{ReplyTo, put, put_status, put_success};
use crate::session::Session;
use bytes::BytesMut;
use epkv_engine_api::{
    ArithmeticRequest, EngineStatus, Expiry, ItemView, KeyState, MutationInfo, RemoveRequest,
    StoreRequest, VBucketSeqnos,
};
use epkv_protocol::{Command, ObserveState, Status};
use epkv_types::doc_key::DocKeyBuf;
use epkv_types::{Cas, Datatype, Vbid};

/// GET, GETQ, GETK, GETKQ: the document (with its key for GETK), nothing on a quiet miss.
pub(crate) fn get(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        vbid,
        out,
        to,
        ..
    } = c;
    let Command::Get {
        key,
        with_key,
        quiet,
    } = cmd
    else {
        return unexpected(out, to);
    };
    match engine.get_with(vbid, key, &mut |item| {
        s.put_item(out, to, item, with_key);
    }) {
        Ok(()) => {}
        Err(EngineStatus::KeyNotFound) if quiet => {}
        Err(e) => {
            let mut buf = DocKeyBuf::new();
            let key = if with_key {
                s.wire_key(key, &mut buf)
            } else {
                &[]
            };
            s.fail(shared, out, to, e, key);
        }
    }
}

/// GET_REPLICA: the document from a replica vBucket.
pub(crate) fn get_replica(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        vbid,
        out,
        to,
        ..
    } = c;
    let Command::GetReplica { key } = cmd else {
        return unexpected(out, to);
    };
    match engine.get_replica(vbid, key) {
        Ok(item) => s.put_item(out, to, &item.view(), false),
        Err(e) => s.fail(shared, out, to, e, &[]),
    }
}

/// GET_RANDOM_KEY: a resident document of the collection (the default one without
/// extras), with its key; its extended attributes too when the extras ask for them and
/// the client negotiated XATTR. A collection id from a connection without collections is
/// EINVAL, as KV-Engine's validator answers.
pub(crate) fn get_random_key(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        out,
        to,
        ..
    } = c;
    let Command::GetRandomKey { collection, xattrs } = cmd else {
        return unexpected(out, to);
    };
    if collection != 0 && !s.collections {
        return s.fail_wire(out, to, Status::Einval, &[]);
    }
    let item = match engine.get_random_key(collection) {
        Ok(item) => item,
        Err(e) => return s.fail(shared, out, to, e, &[]),
    };
    s.put_item_with(out, to, &item.view(), true, xattrs);
}

/// SET, ADD, REPLACE, APPEND, PREPEND and their quiet variants.
pub(crate) fn store(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        vbid,
        out,
        to,
        ..
    } = c;
    let Command::Store {
        op,
        key,
        value,
        flags,
        expiry,
        datatype,
        cas,
        durability: d,
        preserve_ttl,
        quiet,
    } = cmd
    else {
        return unexpected(out, to);
    };
    if datatype.contains(Datatype::XATTR) && !s.xattr {
        // Attributes from a client that did not negotiate them (kv_engine's
        // validator refuses any datatype bit not agreed to).
        s.fail_wire(out, to, Status::Einval, &[]);
        return;
    }
    if datatype.contains(Datatype::SNAPPY) && !valid_snappy(s.snappy, value) {
        // Compressed by a client that did not negotiate Snappy, or not valid
        // Snappy: refused, never stored (as kv_engine's validator does).
        s.fail_wire(out, to, Status::Einval, &[]);
        return;
    }
    // Borrowed from the read buffer: the engine copies key and value once,
    // into the item it stores.
    let sync_write = d.is_some();
    let result = engine.store(StoreRequest {
        op,
        vbid,
        key,
        value,
        flags,
        expiry: Expiry::from_wire(expiry),
        preserve_ttl,
        datatype,
        cas,
        durability: durability(d),
    });
    s.finish_mutation(shared, engine, out, to, vbid, result, sync_write, quiet);
}

/// GET_META, GETQ_META: a document's metadata, tombstones included.
pub(crate) fn get_meta(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        vbid,
        out,
        to,
        ..
    } = c;
    let Command::GetMeta {
        key,
        version,
        quiet,
    } = cmd
    else {
        return unexpected(out, to);
    };
    match engine.get_meta(vbid, key) {
        Ok(m) => {
            // deleted, flags, expiry (u32 each), seqno (u64), and with version 2
            // the datatype (kv_engine's docs/protocol/get_meta.md).
            let mut extras = [0u8; 21];
            extras[..4].copy_from_slice(&u32::from(m.deleted).to_be_bytes());
            extras[4..8].copy_from_slice(&m.flags.to_be_bytes());
            extras[8..12].copy_from_slice(&m.expiry_unix_secs.to_be_bytes());
            extras[12..20].copy_from_slice(&m.seqno.0.to_be_bytes());
            extras[20] = m.datatype.0;
            let n = if version == 2 { 21 } else { 20 };
            put_success(out, to, m.cas, Datatype::RAW, &extras[..n], &[], &[]);
        }
        Err(EngineStatus::KeyNotFound) if quiet => {}
        Err(e) => s.fail(shared, out, to, e, &[]),
    }
}

/// OBSERVE: each key's persistence state and CAS.
pub(crate) fn observe(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        out,
        to,
        ..
    } = c;
    let Command::Observe { keys } = cmd else {
        return unexpected(out, to);
    };
    let mut value = Vec::new();
    for entry in epkv_protocol::ObserveKeys::new(keys) {
        // The decoder checked every entry.
        let Ok((entry_vbid, wire)) = entry else { break };
        let mut buf = DocKeyBuf::new();
        let key = match s.engine_key(wire, &mut buf) {
            Ok((key, _)) => key,
            Err(status) => return s.fail_wire(out, to, status, &[]),
        };
        match engine.observe(entry_vbid, key) {
            Ok((state, cas)) => {
                let state = match state {
                    KeyState::NotPersisted => ObserveState::NotPersisted,
                    KeyState::Persisted => ObserveState::Persisted,
                    KeyState::NotFound => ObserveState::NotFound,
                    KeyState::LogicallyDeleted => ObserveState::LogicallyDeleted,
                };
                epkv_protocol::put_observe_entry(&mut value, entry_vbid, wire, state, cas.0);
            }
            Err(e) => {
                if e == EngineStatus::WouldBlock {
                    // Waits for this key's lookup, then runs the whole
                    // request again.
                    s.blocked_key.set(Some((entry_vbid, key.to_vec())));
                }
                s.fail(shared, out, to, e, &[]);
                return;
            }
        }
    }
    put_success(out, to, Cas::ANY, Datatype::RAW, &[], &[], &value);
}

/// DELETE, DELETEQ.
pub(crate) fn delete(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        vbid,
        out,
        to,
        ..
    } = c;
    let Command::Delete {
        key,
        cas,
        durability: d,
        quiet,
    } = cmd
    else {
        return unexpected(out, to);
    };
    let sync_write = d.is_some();
    let result = engine.remove(RemoveRequest {
        vbid,
        key,
        cas,
        durability: durability(d),
    });
    // Classic memcached clients get CAS 0 on a DELETE, as memcached answers
    // (memcapable checks it); Couchbase clients get the tombstone's CAS, as
    // kv_engine answers.
    let result = match result {
        Ok(info) if !s.vbucket_aware => Ok(MutationInfo {
            cas: Cas::ANY,
            ..info
        }),
        other => other,
    };
    s.finish_mutation(shared, engine, out, to, vbid, result, sync_write, quiet);
}

/// INCREMENT, DECREMENT and their quiet variants.
pub(crate) fn arithmetic(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        req,
        vbid,
        out,
        to,
    } = c;
    let Command::Arithmetic {
        op,
        key,
        delta,
        initial,
        expiry,
        durability: d,
        quiet,
        ..
    } = cmd
    else {
        return unexpected(out, to);
    };
    let sync_write = d.is_some();
    let result = engine.arithmetic(ArithmeticRequest {
        op,
        vbid,
        key,
        delta,
        initial,
        expiry_raw: expiry,
        cas: req.header.cas,
        durability: durability(d),
    });
    match (result, sync_write) {
        (Ok((value, info)), true) => s.defer_reply(
            shared,
            engine,
            out,
            to,
            vbid,
            (info, DurableReply::Counter(value)),
            Wait::SyncWrite,
            quiet,
        ),
        (Ok(_), false) if quiet => {}
        (Ok((value, info)), false) => {
            let (extras, n) = s.mutation_extras(&info);
            put_success(
                out,
                to,
                info.cas,
                Datatype::RAW,
                &extras[..n],
                &[],
                &value.to_be_bytes(),
            );
        }
        (Err(e), _) => s.fail(shared, out, to, e, &[]),
    }
}

/// FLUSH, FLUSHQ: removes every document of the bucket.
pub(crate) fn flush(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        out,
        to,
        ..
    } = c;
    let Command::Flush { quiet } = cmd else {
        return unexpected(out, to);
    };
    match engine.flush() {
        Ok(()) if quiet => {}
        Ok(()) => put_status(out, to, Status::Success, &[]),
        Err(e) => s.fail(shared, out, to, e, &[]),
    }
}

/// TOUCH: a new expiry; at a persist durability level, answered once persisted.
pub(crate) fn touch(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        vbid,
        out,
        to,
        ..
    } = c;
    let Command::Touch {
        key,
        expiry,
        durability: d,
    } = cmd
    else {
        return unexpected(out, to);
    };
    let persist = persist_timeout(d);
    let result = if persist.is_some() && !engine.persistent() {
        // Refused before anything changes, as the store commands are.
        Err(EngineStatus::DurabilityInvalidLevel)
    } else {
        engine.touch(vbid, key, expiry)
    };
    match (result, persist) {
        (Ok(info), Some(timeout)) => s.defer_reply(
            shared,
            engine,
            out,
            to,
            vbid,
            (info, DurableReply::Touch),
            Wait::Persisted(timeout),
            false,
        ),
        (Ok(info), None) => {
            put_success(out, to, info.cas, Datatype::RAW, &[], &[], &[]);
        }
        (Err(e), _) => s.fail(shared, out, to, e, &[]),
    }
}

/// GAT, GATQ: get and touch.
pub(crate) fn gat(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        vbid,
        out,
        to,
        ..
    } = c;
    let Command::Gat {
        key, expiry, quiet, ..
    } = cmd
    else {
        return unexpected(out, to);
    };
    match engine.get_and_touch(vbid, key, expiry) {
        Ok(item) => s.put_item(out, to, &item.view(), false),
        Err(EngineStatus::KeyNotFound) if quiet => {}
        Err(e) => s.fail(shared, out, to, e, &[]),
    }
}

/// GET_LOCKED: get and lock.
pub(crate) fn get_locked(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        vbid,
        out,
        to,
        ..
    } = c;
    let Command::GetLocked {
        key,
        lock_timeout_secs,
    } = cmd
    else {
        return unexpected(out, to);
    };
    match engine.get_locked(vbid, key, lock_timeout_secs) {
        Ok(item) => s.put_item(out, to, &item.view(), false),
        Err(e) => s.fail(shared, out, to, e, &[]),
    }
}

/// EVICT_KEY: KV-Engine's answers, body text included.
pub(crate) fn evict_key(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        vbid,
        out,
        to,
        ..
    } = c;
    let Command::EvictKey { key } = cmd else {
        return unexpected(out, to);
    };
    match engine.evict_key(vbid, key) {
        Ok(ejected) => {
            let text: &[u8] = if ejected {
                b"Ejected."
            } else {
                b"Already ejected."
            };
            put_success(out, to, Cas::ANY, Datatype::RAW, &[], &[], text);
        }
        Err(EngineStatus::KeyExists) => put(
            out,
            &to.reply(Status::KeyEexists)
                .with_value(b"Can't eject: Dirty object."),
        ),
        Err(e) => s.fail(shared, out, to, e, &[]),
    }
}

/// UNLOCK_KEY: releases a GET_LOCKED lock.
pub(crate) fn unlock_key(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        vbid,
        out,
        to,
        ..
    } = c;
    let Command::UnlockKey { key, cas } = cmd else {
        return unexpected(out, to);
    };
    match engine.unlock(vbid, key, cas) {
        Ok(()) => put_status(out, to, Status::Success, &[]),
        Err(e) => s.fail(shared, out, to, e, &[]),
    }
}

/// OBSERVE_SEQNO: the vBucket's persisted and current seqnos for a client's UUID.
pub(crate) fn observe_seqno(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        vbid,
        out,
        to,
        ..
    } = c;
    let Command::ObserveSeqno { vbucket_uuid } = cmd else {
        return unexpected(out, to);
    };
    match engine.vbucket_seqnos(vbid) {
        Ok(seqnos) => match observe_seqno_reply(vbid, vbucket_uuid, &seqnos) {
            Some(value) => {
                put_success(out, to, Cas::ANY, Datatype::RAW, &[], &[], &value);
            }
            // A UUID that is in no branch of this vBucket's history.
            None => s.fail(shared, out, to, EngineStatus::KeyNotFound, &[]),
        },
        Err(e) => s.fail(shared, out, to, e, &[]),
    }
}

impl Session {
    fn put_item(&self, out: &mut BytesMut, to: ReplyTo, item: &ItemView<'_>, with_key: bool) {
        self.put_item_with(out, to, item, with_key, false);
    }

    /// A document's reply: the body only (uncompressed, as KV-Engine sends it), or with
    /// `keep_xattrs` and a client that negotiated XATTR the value with its attribute
    /// section; decompressed for a client that cannot read Snappy (the value was checked
    /// when it was stored, so it decompresses).
    fn put_item_with(
        &self,
        out: &mut BytesMut,
        to: ReplyTo,
        item: &ItemView<'_>,
        with_key: bool,
        keep_xattrs: bool,
    ) {
        let mut buf = DocKeyBuf::new();
        let key: &[u8] = if with_key {
            self.wire_key(item.key, &mut buf)
        } else {
            &[]
        };
        let xattrs = item.datatype.contains(Datatype::XATTR);
        let strip = xattrs && !(keep_xattrs && self.xattr);
        let snappy = item.datatype.contains(Datatype::SNAPPY);
        let value = if snappy && (strip || !self.snappy) {
            std::borrow::Cow::Owned(
                snap::raw::Decoder::new()
                    .decompress_vec(item.value)
                    .unwrap_or_default(),
            )
        } else {
            std::borrow::Cow::Borrowed(item.value)
        };
        let mut dt = item.datatype;
        if matches!(value, std::borrow::Cow::Owned(_)) {
            dt = dt.without(Datatype::SNAPPY);
        }
        let body = if strip {
            dt = dt.without(Datatype::XATTR);
            epkv_engine_api::xattr::body(&value, item.datatype)
        } else {
            &value
        };
        let mut dt = self.datatype_out(dt);
        if xattrs && !strip {
            dt = Datatype(dt.0 | Datatype::XATTR.0);
        }
        put_success(out, to, item.cas, dt, &item.flags.to_be_bytes(), key, body);
    }
}

/// OBSERVE_SEQNO's reply value for a client that knows `uuid`, or `None` when `uuid` is
/// in no branch of the vBucket's history. Format 0 when `uuid` is current:
/// `[0][vbid u16][uuid u64][persisted u64][current u64]`; format 1 when it is an older
/// branch (the vBucket failed over since): the same plus `[old uuid u64][the last seqno
/// of that branch u64]`.
fn observe_seqno_reply(vbid: Vbid, uuid: u64, seqnos: &VBucketSeqnos) -> Option<Vec<u8>> {
    let log = &seqnos.failover_log;
    let current = log.first()?;
    let pos = log.iter().position(|e| e.uuid == uuid)?;
    let mut v = Vec::with_capacity(43);
    v.push(u8::from(pos > 0));
    v.extend_from_slice(&vbid.0.to_be_bytes());
    v.extend_from_slice(&current.uuid.to_be_bytes());
    v.extend_from_slice(&seqnos.persisted_seqno.0.to_be_bytes());
    v.extend_from_slice(&seqnos.high_seqno.0.to_be_bytes());
    if pos > 0 {
        // The branch after the old one began where the old one ended.
        let ended_at = log.get(pos - 1).map_or(0, |newer| newer.seqno.0);
        v.extend_from_slice(&uuid.to_be_bytes());
        v.extend_from_slice(&ended_at.to_be_bytes());
    }
    Some(v)
}

/// Whether a value marked Snappy may be stored: the client negotiated Snappy and the
/// value decompresses (its length header is checked, then the whole stream).
fn valid_snappy(negotiated: bool, value: &[u8]) -> bool {
    negotiated
        && snap::raw::decompress_len(value).is_ok()
        && snap::raw::Decoder::new().decompress_vec(value).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use epkv_engine_api::FailoverEntry;
    use epkv_types::Seqno;

    fn seqnos() -> VBucketSeqnos {
        VBucketSeqnos {
            // Newest first: branch 30 began at seqno 7, branch 20 at 3, branch 10 at 0.
            failover_log: vec![
                FailoverEntry {
                    uuid: 30,
                    seqno: Seqno(7),
                },
                FailoverEntry {
                    uuid: 20,
                    seqno: Seqno(3),
                },
                FailoverEntry {
                    uuid: 10,
                    seqno: Seqno(0),
                },
            ],
            high_seqno: Seqno(9),
            persisted_seqno: Seqno(5),
        }
    }

    #[test]
    fn observe_seqno_uses_format_0_for_the_current_uuid() {
        let v = observe_seqno_reply(Vbid(513), 30, &seqnos()).unwrap();
        let mut want = vec![0u8, 2, 1];
        want.extend_from_slice(&30u64.to_be_bytes());
        want.extend_from_slice(&5u64.to_be_bytes());
        want.extend_from_slice(&9u64.to_be_bytes());
        assert_eq!(v, want);
    }

    #[test]
    fn observe_seqno_uses_format_1_with_where_an_old_branch_ended() {
        let v = observe_seqno_reply(Vbid(1), 10, &seqnos()).unwrap();
        assert_eq!((v.len(), v[0]), (43, 1));
        assert_eq!(&v[3..11], &30u64.to_be_bytes(), "the current uuid");
        assert_eq!(&v[27..35], &10u64.to_be_bytes(), "the old uuid");
        assert_eq!(
            &v[35..43],
            &3u64.to_be_bytes(),
            "branch 10 ended where 20 began"
        );
        let v = observe_seqno_reply(Vbid(1), 20, &seqnos()).unwrap();
        assert_eq!(&v[35..43], &7u64.to_be_bytes());
        assert_eq!(observe_seqno_reply(Vbid(1), 99, &seqnos()), None);
    }
}
