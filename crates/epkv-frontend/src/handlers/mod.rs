//! The request handlers, one module per family of opcodes, each registered in the opcode
//! table ([`crate::dispatch::table`]):
//!
//! - [`kv`]: the key-value data commands (get, store, delete, arithmetic, touch and GAT,
//!   locks, eviction, observe, GET_META, GET_REPLICA, FLUSH);
//! - [`subdoc`]: sub-document lookups and mutations, single- and multi-path;
//! - [`collections`]: the manifest and collection and scope ids;
//! - [`range_scan`]: range and sampling scans (create, continue, cancel);
//! - [`setup`]: what sets a session up: HELLO, SASL, SELECT_BUCKET;
//! - [`stat`]: STAT and its groups;
//! - [`admin`]: the cluster map, vBucket states, the error map, VERSION, NOOP, QUIT and
//!   the test-only clock;
//! - [`dcp`]: DCP producer messages.
//!
//! Besides the handlers, this module holds the error replies every family shares.

pub(crate) mod admin;
pub(crate) mod collections;
pub(crate) mod dcp;
pub(crate) mod kv;
pub(crate) mod range_scan;
pub(crate) mod setup;
pub(crate) mod stat;
pub(crate) mod subdoc;

use crate::frontend::Shared;
use crate::response::{ReplyTo, put, put_status};
use crate::session::Session;
use crate::status_map::{engine_status_to_wire, status_for_client};
use bytes::BytesMut;
use epkv_auth::Privilege;
use epkv_auth::audit::{AuditEvent, AuditKind, Interface};
use epkv_engine_api::EngineStatus;
use epkv_protocol::{Opcode, Status};
use epkv_types::Datatype;

impl Session {
    /// Answers an engine outcome other than success. WouldBlock is not answered: the
    /// request waits for its background fetch and runs again (see [`crate::session::BlockedOn`]).
    pub(crate) fn fail(
        &self,
        shared: &Shared,
        out: &mut BytesMut,
        to: ReplyTo,
        e: EngineStatus,
        key: &[u8],
    ) {
        if e == EngineStatus::WouldBlock {
            self.would_block.set(true);
            return;
        }
        let wire = engine_status_to_wire(e);
        if wire == Status::NotMyVbucket
            && let Some(b) = &self.bucket
            && let Some(version) = shared.cluster_version()
            && !(self.dedupe_nmvb && self.map_sent.get().is_some_and(|sent| sent >= version))
            && let Some(config) = admin::bucket_map(self, shared, b)
        {
            // The current map rides along, so the client need not ask for it (kv_engine
            // sends it; cxx parses it only when the JSON bit is set). A client that asked
            // for DedupeNotMyVbucketClustermap gets it once per version (empty after).
            self.map_sent.set(Some(version));
            put(
                out,
                &to.reply(Status::NotMyVbucket)
                    .with_datatype(self.datatype_out(Datatype::JSON))
                    .with_key(key)
                    .with_value(config.as_bytes()),
            );
            return;
        }
        if matches!(wire, Status::UnknownCollection | Status::UnknownScope)
            && let Some(b) = &self.bucket
            && let Some(status) = status_for_client(wire, to.opcode, self.xerror)
        {
            // The manifest the answer came from, so the client knows whether to refresh
            // (kv_engine's error context: the uid in hex without 0x).
            let context = format!("{{\"manifest_uid\":\"{:x}\"}}", b.engine.manifest_uid());
            put(
                out,
                &to.reply(status)
                    .with_datatype(self.datatype_out(Datatype::JSON))
                    .with_key(key)
                    .with_value(context.as_bytes()),
            );
            return;
        }
        self.fail_wire(out, to, wire, key);
    }

    /// Refuses a request its user lacks `missing` for: 0x24 Eaccess with KV-Engine's
    /// error context, `{"error":{"context":"Authorization failure: can't execute GET
    /// operation without the Read privilege"}}`. The connection stays open; a client
    /// without XERROR, which cannot be told Eaccess, is disconnected instead.
    pub(crate) fn deny(&self, out: &mut BytesMut, to: ReplyTo, missing: Privilege) {
        let opcode = Opcode::from_u8(to.opcode).map_or("unknown", Opcode::name);
        tracing::debug!(
            user = %format_args!("<ud>{}</ud>", self.user.as_deref().unwrap_or("")),
            opcode,
            privilege = missing.name(),
            "request refused: missing privilege"
        );
        if self.audit.is_enabled() {
            let detail = format!("{opcode} needs {missing}");
            self.audit(
                AuditEvent::new(AuditKind::AccessDenied, Interface::Kv)
                    .user_opt(self.user.as_deref())
                    .bucket_opt(self.bucket.as_ref().map(|b| &*b.name))
                    .detail(&detail),
            );
        }
        if status_for_client(Status::Eaccess, to.opcode, self.xerror).is_none() {
            return self.fail_wire(out, to, Status::Eaccess, &[]);
        }
        self.put_error_context(
            out,
            to,
            Status::Eaccess,
            &format!(
                "Authorization failure: can't execute {opcode} operation without the {missing} privilege"
            ),
        );
    }

    /// Answers `status` with KV-Engine's JSON error context, `{"error":{"context":...}}`
    /// (`context` holds no character that needs JSON escaping).
    pub(crate) fn put_error_context(
        &self,
        out: &mut BytesMut,
        to: ReplyTo,
        status: Status,
        context: &str,
    ) {
        let body = format!("{{\"error\":{{\"context\":\"{context}\"}}}}");
        put(
            out,
            &to.reply(status)
                .with_datatype(self.datatype_out(Datatype::JSON))
                .with_value(body.as_bytes()),
        );
    }

    /// Answers `wire`, remapped for clients without XERROR; when there is no classic
    /// equivalent, nothing is answered and the connection is closed after this batch.
    pub(crate) fn fail_wire(&self, out: &mut BytesMut, to: ReplyTo, wire: Status, key: &[u8]) {
        match status_for_client(wire, to.opcode, self.xerror) {
            Some(status) => put_status(out, to, status, key),
            None => {
                tracing::info!(
                    status = wire.as_u16(),
                    agent = self.agent.as_deref().unwrap_or(""),
                    "closing connection: status not understood by a client without XERROR"
                );
                self.disconnect.set(true);
            }
        }
    }
}
