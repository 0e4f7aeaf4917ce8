//! Sub-document commands on a [`Session`]: single-path lookups and mutations,
//! MULTI_LOOKUP and MULTI_MUTATION, answered in kv_engine's formats.
//!
//! - Single lookup: the path's value (SUBDOC_GET, SUBDOC_GET_COUNT) or nothing
//!   (SUBDOC_EXISTS), or the path's status (0xc0-0xca).
//! - MULTI_LOOKUP: for each spec `status (u16) | length (u32) | value`; the overall status
//!   is Success, or 0xcc SubdocMultiPathFailure when a path failed.
//! - Single mutation: the mutation extras (when negotiated) and, for SUBDOC_COUNTER, the
//!   new value; or the path's status.
//! - MULTI_MUTATION: on success, for each spec that returns a value `index (u8) | status
//!   (u16) | length (u32) | value`; on failure 0xcc with `index (u8) | status (u16)` of
//!   the first failed spec. Nothing is changed then.

use crate::dispatch::table::Needs;
use crate::dispatch::{DataCall, unexpected};
use crate::durable::{DurableReply, durability as to_requirements};
use crate::frontend::Shared;
use crate::response::{ReplyTo, put};
use crate::session::Session;
use bytes::BytesMut;
use epkv_auth::Privilege;
use epkv_engine_api::{
    Engine, EngineStatus, LookupFlags, SubdocError, SubdocMutated, SubdocMutation, SubdocOp,
    SubdocSpec,
};
use epkv_protocol::{
    Command, DOC_FLAG_ACCESS_DELETED, DOC_FLAG_ADD, DOC_FLAG_CREATE_AS_DELETED, DOC_FLAG_MKDOC,
    DOC_FLAG_REPLICA_READ, DOC_FLAG_REVIVE, DOC_FLAGS, DurabilityRequirement, Opcode,
    PATH_FLAG_BINARY_VALUE, PATH_FLAG_EXPAND_MACROS, PATH_FLAG_MKDIR_P, PATH_FLAG_XATTR, Response,
    Status,
};
use epkv_types::doc_key;
use epkv_types::{Cas, Datatype, Vbid};

/// The engine's operation for a sub-document opcode.
fn op_of(op: Opcode) -> Option<SubdocOp> {
    Some(match op {
        Opcode::SubdocGet | Opcode::Get => SubdocOp::Get,
        Opcode::SubdocExists => SubdocOp::Exists,
        Opcode::SubdocGetCount => SubdocOp::GetCount,
        Opcode::SubdocDictAdd => SubdocOp::DictAdd,
        Opcode::SubdocDictUpsert => SubdocOp::DictUpsert,
        Opcode::SubdocDelete => SubdocOp::Delete,
        Opcode::SubdocReplace => SubdocOp::Replace,
        Opcode::SubdocArrayPushLast => SubdocOp::ArrayPushLast,
        Opcode::SubdocArrayPushFirst => SubdocOp::ArrayPushFirst,
        Opcode::SubdocArrayInsert => SubdocOp::ArrayInsert,
        Opcode::SubdocArrayAddUnique => SubdocOp::ArrayAddUnique,
        Opcode::SubdocCounter => SubdocOp::Counter,
        Opcode::Set => SubdocOp::SetDoc,
        Opcode::Delete => SubdocOp::DeleteDoc,
        Opcode::SubdocReplaceBodyWithXattr => SubdocOp::ReplaceBodyWithXattr,
        _ => return None,
    })
}

/// The wire status of a path's failure.
pub(crate) fn subdoc_status(e: SubdocError) -> Status {
    match e {
        SubdocError::PathNotFound => Status::SubdocPathEnoent,
        SubdocError::PathMismatch => Status::SubdocPathMismatch,
        SubdocError::PathInvalid => Status::SubdocPathEinval,
        SubdocError::PathTooBig => Status::SubdocPathE2big,
        SubdocError::DocTooDeep => Status::SubdocDocE2deep,
        SubdocError::ValueCantInsert => Status::SubdocValueCantinsert,
        SubdocError::DocNotJson => Status::SubdocDocNotJson,
        SubdocError::NumRange => Status::SubdocNumErange,
        SubdocError::DeltaInvalid => Status::SubdocDeltaEinval,
        SubdocError::PathExists => Status::SubdocPathEexists,
        SubdocError::ValueTooDeep => Status::SubdocValueEtoodeep,
        SubdocError::UnknownVattr => Status::SubdocXattrUnknownVattr,
        SubdocError::CantModifyVattr => Status::SubdocXattrCantModifyVattr,
        SubdocError::UnknownMacro => Status::SubdocXattrUnknownMacro,
        SubdocError::UnknownVattrMacro => Status::SubdocXattrUnknownVattrMacro,
        SubdocError::CanOnlyReviveDeleted => Status::SubdocCanOnlyReviveDeletedDocuments,
        SubdocError::DeletedDocCantHaveValue => Status::SubdocDeletedDocumentCantHaveValue,
        SubdocError::NotBinaryValue => Status::SubdocFieldNotBinaryValue,
    }
}

/// A request's doc flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct DocFlags {
    mkdoc: bool,
    add: bool,
    access_deleted: bool,
    create_as_deleted: bool,
    revive: bool,
    replica_read: bool,
}

/// Checks doc flags (kv_engine's validator): unknown bits, MKDOC with ADD, the
/// mutation-only flags on a lookup, REPLICA_READ on a mutation, CREATE_AS_DELETED without
/// MKDOC or ADD, and REVIVE without ACCESS_DELETED are EINVAL.
fn doc_flags(flags: u8, mutation: bool) -> Result<DocFlags, Status> {
    if flags & !DOC_FLAGS != 0 {
        return Err(Status::Einval);
    }
    let f = DocFlags {
        mkdoc: flags & DOC_FLAG_MKDOC != 0,
        add: flags & DOC_FLAG_ADD != 0,
        access_deleted: flags & DOC_FLAG_ACCESS_DELETED != 0,
        create_as_deleted: flags & DOC_FLAG_CREATE_AS_DELETED != 0,
        revive: flags & DOC_FLAG_REVIVE != 0,
        replica_read: flags & DOC_FLAG_REPLICA_READ != 0,
    };
    let mutation_only = f.mkdoc || f.add || f.create_as_deleted || f.revive;
    if mutation_only && !mutation
        || f.replica_read && mutation
        || f.mkdoc && f.add
        || f.create_as_deleted && !(f.mkdoc || f.add)
        || f.revive && !f.access_deleted
    {
        return Err(Status::Einval);
    }
    Ok(f)
}

/// The parts of one sub-document mutation request.
pub(crate) struct MutationRequest<'a> {
    pub(crate) key: &'a [u8],
    pub(crate) specs: Vec<SubdocSpec<'a>>,
    pub(crate) doc_flags: u8,
    pub(crate) expiry: u32,
    /// The document's new flags, when the request gives them.
    pub(crate) user_flags: Option<u32>,
    pub(crate) cas: Cas,
    pub(crate) durability: Option<DurabilityRequirement>,
    pub(crate) preserve_ttl: bool,
    /// MULTI_MUTATION (multi-path reply formats) or a single-path command.
    pub(crate) multi: bool,
}

impl Session {
    /// Specs of a request, converted for the engine.
    pub(crate) fn subdoc_specs<'a>(specs: &[epkv_protocol::SubdocSpec<'a>]) -> Vec<SubdocSpec<'a>> {
        specs
            .iter()
            .filter_map(|s| {
                Some(SubdocSpec {
                    op: op_of(s.opcode)?,
                    mkdir_p: s.flags & PATH_FLAG_MKDIR_P != 0,
                    xattr: s.flags & PATH_FLAG_XATTR != 0,
                    expand_macros: s.flags & PATH_FLAG_EXPAND_MACROS != 0,
                    binary: s.flags & PATH_FLAG_BINARY_VALUE != 0,
                    path: s.path,
                    value: s.value,
                })
            })
            .collect()
    }

    /// A single-path lookup or MULTI_LOOKUP.
    #[expect(clippy::too_many_arguments, reason = "the parts of one request")]
    pub(crate) fn subdoc_lookup(
        &self,
        shared: &Shared,
        engine: &dyn Engine,
        out: &mut BytesMut,
        to: ReplyTo,
        vbid: Vbid,
        key: &[u8],
        specs: &[SubdocSpec<'_>],
        flags: u8,
        multi: bool,
    ) {
        let flags = match doc_flags(flags, false) {
            Ok(f) => f,
            Err(s) => return self.fail_wire(out, to, s, &[]),
        };
        let lookup = LookupFlags {
            access_deleted: flags.access_deleted,
            replica_read: flags.replica_read,
        };
        let found = match engine.subdoc_lookup(vbid, key, specs, lookup) {
            Ok(f) => f,
            Err(e) => return self.fail(shared, out, to, e, &[]),
        };
        let success = if found.deleted {
            Status::SubdocSuccessDeleted
        } else {
            Status::Success
        };
        if !multi {
            match found.results.into_iter().next() {
                Some(Ok(v)) => put(
                    out,
                    &Response::new(to.opcode, success, to.opaque)
                        .with_cas(found.cas)
                        .with_datatype(
                            self.json_if(!v.is_empty() && !specs.first().is_some_and(|s| s.binary)),
                        )
                        .with_value(&v),
                ),
                Some(Err(e)) => self.fail_wire(out, to, subdoc_status(e), &[]),
                None => self.fail(shared, out, to, EngineStatus::Internal, &[]),
            }
            return;
        }
        let mut body = Vec::new();
        let mut all_ok = true;
        for r in &found.results {
            let (status, v): (Status, &[u8]) = match r {
                Ok(v) => (Status::Success, v),
                Err(e) => {
                    all_ok = false;
                    (subdoc_status(*e), &[])
                }
            };
            body.extend_from_slice(&status.as_u16().to_be_bytes());
            body.extend_from_slice(&u32::try_from(v.len()).unwrap_or(u32::MAX).to_be_bytes());
            body.extend_from_slice(v);
        }
        let status = match (all_ok, found.deleted) {
            (true, _) => success,
            (false, false) => Status::SubdocMultiPathFailure,
            (false, true) => Status::SubdocMultiPathFailureDeleted,
        };
        put(
            out,
            &Response::new(to.opcode, status, to.opaque)
                .with_cas(found.cas)
                .with_value(&body),
        );
    }

    /// A single-path mutation or MULTI_MUTATION.
    pub(crate) fn subdoc_mutate(
        &self,
        shared: &Shared,
        engine: &dyn Engine,
        out: &mut BytesMut,
        to: ReplyTo,
        vbid: Vbid,
        req: &MutationRequest<'_>,
    ) {
        let flags = match doc_flags(req.doc_flags, true) {
            Ok(f) => f,
            Err(s) => return self.fail_wire(out, to, s, &[]),
        };
        let sync_write = req.durability.is_some();
        let result = engine.subdoc_mutate(SubdocMutation {
            vbid,
            key: req.key,
            specs: &req.specs,
            cas: req.cas,
            expiry_raw: req.expiry,
            preserve_ttl: req.preserve_ttl,
            flags: req.user_flags,
            mkdoc: flags.mkdoc,
            add: flags.add,
            access_deleted: flags.access_deleted,
            create_as_deleted: flags.create_as_deleted,
            revive: flags.revive,
            durability: to_requirements(req.durability),
        });
        match result {
            Ok(SubdocMutated::Done {
                info,
                values,
                deleted,
            }) => {
                let body = if req.multi {
                    let mut body = Vec::new();
                    for (index, v) in &values {
                        body.push(*index);
                        body.extend_from_slice(&Status::Success.as_u16().to_be_bytes());
                        body.extend_from_slice(
                            &u32::try_from(v.len()).unwrap_or(u32::MAX).to_be_bytes(),
                        );
                        body.extend_from_slice(v);
                    }
                    body
                } else {
                    values
                        .into_iter()
                        .next()
                        .map(|(_, v)| v)
                        .unwrap_or_default()
                };
                self.reply_mutation(
                    shared,
                    engine,
                    out,
                    to,
                    vbid,
                    info,
                    DurableReply::Body(
                        body,
                        if deleted {
                            Status::SubdocSuccessDeleted
                        } else {
                            Status::Success
                        },
                    ),
                    sync_write,
                );
            }
            Ok(SubdocMutated::Refused(error)) => self.fail_wire(out, to, subdoc_status(error), &[]),
            Ok(SubdocMutated::Failed { index, error }) => {
                let status = subdoc_status(error);
                if req.multi {
                    let mut body = vec![index];
                    body.extend_from_slice(&status.as_u16().to_be_bytes());
                    put(
                        out,
                        &Response::new(to.opcode, Status::SubdocMultiPathFailure, to.opaque)
                            .with_value(&body),
                    );
                } else {
                    self.fail_wire(out, to, status, &[]);
                }
            }
            Err(e) => self.fail(shared, out, to, e, &[]),
        }
    }

    /// JSON when `json` and the client negotiated it.
    fn json_if(&self, json: bool) -> Datatype {
        if json && self.json {
            Datatype::JSON
        } else {
            Datatype::RAW
        }
    }
}

/// Checks the specs' extended attributes against the user's privileges, as KV-Engine: a
/// system attribute (its name starts with `_`) needs `needed` (SystemXattrRead to be
/// looked up, SystemXattrWrite to be changed) on the document's collection; user and
/// virtual (`$`) attributes need only the row's privilege. Answers the request and
/// returns false when refused.
#[expect(
    clippy::too_many_arguments,
    reason = "the parts of one request, as the handlers hold them"
)]
fn system_xattrs_allowed(
    s: &Session,
    shared: &Shared,
    engine: &dyn Engine,
    out: &mut BytesMut,
    to: ReplyTo,
    key: &[u8],
    specs: &[SubdocSpec<'_>],
    needed: Privilege,
) -> bool {
    let system = specs
        .iter()
        .any(|sp| sp.xattr && sp.path.first() == Some(&b'_'));
    if !system {
        return true;
    }
    let (cid, _) = doc_key::decode(key);
    match s.access.check_in(Needs::One(needed), engine, cid) {
        Ok(Ok(())) => true,
        Ok(Err(missing)) => {
            s.deny(out, to, missing);
            false
        }
        Err(e) => {
            s.fail(shared, out, to, e, &[]);
            false
        }
    }
}

/// A single-path lookup (SUBDOC_GET, _EXISTS, _GET_COUNT) or mutation.
pub(crate) fn single(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        vbid,
        out,
        to,
        ..
    } = c;
    let Command::Subdoc {
        op,
        key,
        body,
        path_len,
        path_flags,
        doc_flags,
        expiry,
        user_flags,
        cas,
        durability: d,
        preserve_ttl,
    } = cmd
    else {
        return unexpected(out, to);
    };
    let (path, value) = body.split_at(path_len);
    let spec = Session::subdoc_specs(&[epkv_protocol::SubdocSpec {
        opcode: op,
        flags: path_flags,
        path,
        value,
    }]);
    let lookup = epkv_protocol::is_subdoc_lookup(op);
    let needed = if lookup {
        Privilege::SystemXattrRead
    } else {
        Privilege::SystemXattrWrite
    };
    if !system_xattrs_allowed(s, shared, engine, out, to, key, &spec, needed) {
        return;
    }
    if lookup {
        s.subdoc_lookup(shared, engine, out, to, vbid, key, &spec, doc_flags, false);
    } else {
        let req = MutationRequest {
            key,
            specs: spec,
            doc_flags,
            expiry,
            user_flags,
            cas,
            durability: d,
            preserve_ttl,
            multi: false,
        };
        s.subdoc_mutate(shared, engine, out, to, vbid, &req);
    }
}

/// SUBDOC_MULTI_LOOKUP.
pub(crate) fn multi_lookup(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        vbid,
        out,
        to,
        ..
    } = c;
    let Command::SubdocMultiLookup {
        key,
        doc_flags,
        specs,
    } = cmd
    else {
        return unexpected(out, to);
    };
    // The decoder checked the specs.
    let parsed = epkv_protocol::parse_specs(specs, false).unwrap_or_default();
    let specs = Session::subdoc_specs(&parsed);
    let needed = Privilege::SystemXattrRead;
    if !system_xattrs_allowed(s, shared, engine, out, to, key, &specs, needed) {
        return;
    }
    s.subdoc_lookup(shared, engine, out, to, vbid, key, &specs, doc_flags, true);
}

/// SUBDOC_MULTI_MUTATION.
pub(crate) fn multi_mutation(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        vbid,
        out,
        to,
        ..
    } = c;
    let Command::SubdocMultiMutation {
        key,
        doc_flags,
        expiry,
        user_flags,
        specs,
        cas,
        durability: d,
        preserve_ttl,
    } = cmd
    else {
        return unexpected(out, to);
    };
    let parsed = epkv_protocol::parse_specs(specs, true).unwrap_or_default();
    let req = MutationRequest {
        key,
        specs: Session::subdoc_specs(&parsed),
        doc_flags,
        expiry,
        user_flags,
        cas,
        durability: d,
        preserve_ttl,
        multi: true,
    };
    let needed = Privilege::SystemXattrWrite;
    if !system_xattrs_allowed(s, shared, engine, out, to, key, &req.specs, needed) {
        return;
    }
    s.subdoc_mutate(shared, engine, out, to, vbid, &req);
}
