//! Request dispatch: from a framed request to its family's handler, through one opcode
//! table ([`table`]).
//!
//! [`Session::execute`] looks the opcode byte up in [`table::TABLE`] (one load), then
//! makes the checks the row names, in the order the protocol needs them:
//!
//! 1. A DCP message ([`Handler::Dcp`]) is not decoded here: its bucket check, its
//!    privileges and, for the messages a producer takes, the producer check come first,
//!    then its handler decodes it with `epkv_protocol::dcp`.
//! 2. Any other request is decoded and validated ([`Command::decode`]); a bucket's
//!    minimum durability level raises a write's durability.
//! 3. The row's bucket check ([`Bucket`]).
//! 4. The row's privileges ([`Needs`]), against the connection's privilege context
//!    ([`crate::access::Access`], computed again first when the users changed): a data
//!    request's on its key's collection, the others' on the selected bucket. A refusal
//!    answers 0x24 Eaccess with KV-Engine's error context naming the missing privilege
//!    (a client without XERROR is disconnected instead, as for every Eaccess).
//! 5. The handler. A data handler ([`Handler::Data`]) runs in [`Session::execute_data`],
//!    which encodes the document key for the engine, picks the vBucket and, when the
//!    engine answers WouldBlock, leaves the request for its background fetch.
//!
//! An opcode without a row is answered UnknownCommand (a DCP message only a consumer takes
//! gets DCP's answers, see [`crate::handlers::dcp::unregistered`]).

pub(crate) mod table;

use crate::durable::with_min_level;
use crate::frontend::Shared;
use crate::handlers::dcp;
use crate::response::{ReplyTo, put_error_text};
use crate::session::{BlockedOn, SelectedBucket, Session};
use bytes::BytesMut;
use epkv_engine_api::{Engine, EngineStatus};
use epkv_protocol::{Command, Opcode, Request, Status};
use epkv_types::doc_key::{self, DocKeyBuf};
use epkv_types::{NUM_VBUCKETS, Vbid, vbucket_for_key};
use std::sync::Arc;
use table::{Bucket, Dcp, Entry, Handler, Hint, Needs};

/// What the connection does after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Go on with the next request.
    Continue,
    /// Send the replies queued so far, then close (QUIT, QUITQ).
    Close,
    /// Close after the replies queued so far: the reply would have been a status the
    /// client did not agree to understand (no XERROR), as kv_engine disconnects.
    Disconnect,
}

/// How many times in a row one request may answer WouldBlock (and wait with
/// `Engine::when_fetched`) before it is answered TMPFAIL instead. For a background fetch:
/// each fetch restores the value, so a request that blocks again found it evicted again
/// at once (memory far over its quota), and the client is better served by a retry later
/// than by a loop. For a pending vBucket (a takeover): the engine releases a parked
/// request when the state changes, or after its park timeout (2 s) if it has not; a
/// takeover that ends within one timeout costs a request one or two runs, and one that
/// stalls holds it (and the connection's requests behind it) about 8 s before TMPFAIL.
const MAX_REFETCHES: u8 = 4;

/// One request being executed, as connection-level and DCP handlers get it.
pub(crate) struct Call<'a> {
    /// The front end's shared state.
    pub(crate) shared: &'a Shared,
    /// The request, as framed.
    pub(crate) req: &'a Request<'a>,
    /// Where replies go.
    pub(crate) out: &'a mut BytesMut,
    /// The opcode and opaque replies carry.
    pub(crate) to: ReplyTo,
}

/// One data request being executed against the selected bucket, as data handlers get it.
pub(crate) struct DataCall<'a> {
    /// The front end's shared state.
    pub(crate) shared: &'a Shared,
    /// The selected bucket's engine.
    pub(crate) engine: &'a dyn Engine,
    /// The request, as framed.
    pub(crate) req: &'a Request<'a>,
    /// The vBucket: the header's, or the key's for a client that never sent HELLO.
    pub(crate) vbid: Vbid,
    /// Where replies go.
    pub(crate) out: &'a mut BytesMut,
    /// The opcode and opaque replies carry.
    pub(crate) to: ReplyTo,
}

/// A connection-level handler: the decoded command, run on the session.
pub(crate) type SessionFn = fn(&mut Session, Call<'_>, Command<'_>) -> Flow;
/// A data handler: the decoded command (its document key encoded for the engine), run
/// against the selected bucket. It answers unless the engine says WouldBlock.
pub(crate) type DataFn = fn(&Session, DataCall<'_>, Command<'_>);
/// A DCP handler: the raw request, with the selected bucket.
pub(crate) type DcpFn = fn(&mut Session, Call<'_>, &SelectedBucket);

/// Answers a command its row's handler does not take. The decoder and the table agree,
/// so this is the answer a command the front end cannot execute would get.
pub(crate) fn unexpected(out: &mut BytesMut, to: ReplyTo) {
    put_error_text(out, to, Status::UnknownCommand);
}

impl Session {
    /// Executes one validated-framing request and appends its reply (if any) to `out`.
    pub(crate) fn execute(
        &mut self,
        shared: &Shared,
        req: &Request<'_>,
        out: &mut BytesMut,
    ) -> Flow {
        let to = ReplyTo {
            opcode: req.header.opcode,
            opaque: req.header.opaque,
        };
        let call = Call {
            shared,
            req,
            out,
            to,
        };
        let flow = match table::entry(req.header.opcode) {
            Some(entry) => self.dispatch(entry, call),
            None => {
                self.unregistered(call);
                Flow::Continue
            }
        };
        if self.disconnect.get() {
            Flow::Disconnect
        } else {
            flow
        }
    }

    /// Makes a row's checks and calls its handler.
    fn dispatch(&mut self, entry: &Entry, c: Call<'_>) -> Flow {
        if self.access.is_stale(c.shared) {
            self.refresh_access(c.shared);
        }
        let handler = match entry.handler {
            Handler::Dcp(f) => {
                self.dispatch_dcp(entry, f, c);
                return Flow::Continue;
            }
            h => h,
        };
        let mut cmd = match Command::decode(c.req) {
            Ok(cmd) => cmd,
            Err(status) => {
                tracing::debug!(
                    opcode = c.req.header.opcode,
                    ?status,
                    extras = c.req.extras.len(),
                    key = c.req.key.len(),
                    value = c.req.value.len(),
                    "request refused by the decoder"
                );
                put_error_text(c.out, c.to, status);
                return Flow::Continue;
            }
        };
        if let Some(b) = &self.bucket
            && let Some(min) = b.engine.durability_min_level()
            && let Some(d) = cmd.write_durability_mut()
        {
            *d = with_min_level(*d, min);
        }
        let bucket = match self.check_bucket(entry.bucket, c.out, c.to) {
            Ok(bucket) => bucket,
            Err(flow) => return flow,
        };
        match (handler, bucket) {
            (Handler::Data(f), Some(bucket)) => {
                self.execute_data(bucket, entry.needs, f, cmd, c);
                Flow::Continue
            }
            (Handler::Session(f), _) => {
                if let Err(missing) = self.access.check(entry.needs) {
                    self.deny(c.out, c.to, missing);
                    return Flow::Continue;
                }
                f(self, c, cmd)
            }
            // Not reached: DCP rows returned above, and a data row's check is for a live
            // bucket (the table's build makes sure).
            (Handler::Data(_) | Handler::Dcp(_), _) => {
                unexpected(c.out, c.to);
                Flow::Continue
            }
        }
    }

    /// A DCP message: its bucket and producer checks, then its handler.
    fn dispatch_dcp(&mut self, entry: &Entry, f: DcpFn, c: Call<'_>) {
        let bucket = match self.check_bucket(entry.bucket, c.out, c.to) {
            Ok(Some(b)) => b.clone(),
            Ok(None) | Err(_) => return,
        };
        if let Err(missing) = self.access.check(entry.needs) {
            return self.deny(c.out, c.to, missing);
        }
        if entry.dcp == Dcp::Producer && self.dcp.is_none() {
            return dcp::not_a_producer(c.out, c.to);
        }
        f(self, c, &bucket);
    }

    /// An opcode without a row.
    fn unregistered(&mut self, c: Call<'_>) {
        match Opcode::from_u8(c.req.header.opcode) {
            Some(op) if op.is_dcp() => dcp::unregistered(self, c),
            _ => put_error_text(c.out, c.to, Status::UnknownCommand),
        }
    }

    /// Applies a row's bucket check: `Ok` with the selected bucket (`None` when the row
    /// needs none), or `Err` with how the connection goes on when the request was
    /// answered (or the connection must close) instead.
    fn check_bucket(
        &self,
        check: Bucket,
        out: &mut BytesMut,
        to: ReplyTo,
    ) -> Result<Option<&SelectedBucket>, Flow> {
        match (check, &self.bucket) {
            (Bucket::Any, _) => Ok(None),
            (Bucket::Selected | Bucket::Live, None) => {
                self.fail_wire(out, to, Status::NoBucket, &[]);
                Err(Flow::Continue)
            }
            (Bucket::Live, Some(bucket))
                if bucket.dropped.load(std::sync::atomic::Ordering::Relaxed) =>
            {
                // As Couchbase Server: connections on a deleted bucket are closed.
                tracing::info!(bucket = %bucket.name, "bucket dropped; closing the connection");
                Err(Flow::Disconnect)
            }
            (Bucket::Selected | Bucket::Live, Some(bucket)) => Ok(Some(bucket)),
        }
    }

    /// Executes a data request: encodes its document key for the engine, checks the
    /// row's privileges on the key's collection, picks its vBucket, runs its handler and,
    /// when the engine answered WouldBlock, leaves the request waiting for its background
    /// fetch ([`BlockedOn`]).
    fn execute_data(
        &self,
        bucket: &SelectedBucket,
        needs: Needs,
        f: DataFn,
        cmd: Command<'_>,
        c: Call<'_>,
    ) {
        let Call {
            shared,
            req,
            out,
            to,
        } = c;
        // The engine gets the key encoded with its collection; the vBucket comes from the
        // key without it.
        let mut buf = DocKeyBuf::new();
        let (cmd, doc_key, raw_key) = match cmd.document_key() {
            Some(wire) => match self.engine_key(wire, &mut buf) {
                Ok((key, raw)) => (cmd.with_document_key(key), Some(key), raw),
                Err(status) => return self.fail_wire(out, to, status, &[]),
            },
            None => (cmd, None, &[][..]),
        };
        if let Err(missing) = self.access.check(needs) {
            // Not on the whole bucket: perhaps on the key's collection (or the one a
            // command without a key names: a range scan's JSON, or its scan).
            let cid = match doc_key {
                Some(key) => Some(doc_key::decode(key).0),
                None => cmd
                    .collection_without_key()
                    .or_else(|| self.scans.collection_of(&cmd)),
            };
            let allowed = match cid {
                Some(cid) => {
                    match self
                        .access
                        .check_narrow(needs, missing, &*bucket.engine, cid)
                    {
                        Ok(checked) => checked,
                        Err(e) => return self.fail(shared, out, to, e, &[]),
                    }
                }
                None => Err(missing),
            };
            if let Err(missing) = allowed {
                return self.deny(out, to, missing);
            }
        }
        let vbid = match doc_key {
            Some(_) if !self.vbucket_aware => vbucket_for_key(raw_key, NUM_VBUCKETS),
            _ => req.header.vbucket,
        };
        // A node being failed over gracefully takes no writes while its replicas catch up.
        if needs.writes() && shared.cluster.as_ref().is_some_and(|c| c.refuses_writes()) {
            return self.fail(shared, out, to, EngineStatus::NotMyVbucket, &[]);
        }
        if let Some(e) = self.fail_next.take() {
            // The background fetch this request waited for failed.
            self.refetches.set(0);
            self.scans.resume.set(None);
            self.fail(shared, out, to, e, &[]);
            return;
        }
        let call = DataCall {
            shared,
            engine: &*bucket.engine,
            req,
            vbid,
            out: &mut *out,
            to,
        };
        f(self, call, cmd);
        if !self.would_block.take() {
            self.refetches.set(0);
            return;
        }
        let scan = self.scans.blocked.take();
        let n = self.refetches.get() + 1;
        if n > MAX_REFETCHES {
            self.refetches.set(0);
            self.scans.resume.set(None);
            self.fail(shared, out, to, EngineStatus::TempFail, &[]);
            return;
        }
        self.refetches.set(n);
        let (vbid, key) = self
            .blocked_key
            .take()
            .unwrap_or_else(|| (vbid, doc_key.unwrap_or_default().to_vec()));
        self.blocked_on.set(Some(BlockedOn {
            engine: Arc::clone(&bucket.engine),
            vbid: scan.map_or(vbid, |s| s.0),
            key,
            scan: scan.map(|s| s.1),
        }));
    }

    /// Hints the bucket's engine that `req`, the next request in the connection's buffer,
    /// will look its key up soon ([`epkv_engine_api::Engine::prefetch`]), so that its
    /// cache misses overlap the current request's work. With `key_too` false, only its
    /// vBucket ([`epkv_engine_api::Engine::prefetch_vbucket`], for the request after the
    /// next). Only the opcodes whose row says [`Hint::Key`]; anything else, or a key that
    /// does not decode, is left alone.
    pub(crate) fn prefetch(&self, req: &Request<'_>, key_too: bool) {
        let Some(b) = &self.bucket else {
            return;
        };
        let keyed = table::entry(req.header.opcode).is_some_and(|e| e.hint == Hint::Key);
        if !keyed || req.key.is_empty() {
            return;
        }
        let mut buf = DocKeyBuf::new();
        let Ok((key, raw)) = self.engine_key(req.key, &mut buf) else {
            return;
        };
        // As `execute_data` picks it.
        let vbid = if self.vbucket_aware {
            req.header.vbucket
        } else {
            vbucket_for_key(raw, NUM_VBUCKETS)
        };
        if key_too {
            b.engine.prefetch(vbid, key);
        } else {
            b.engine.prefetch_vbucket(vbid);
        }
    }
}
