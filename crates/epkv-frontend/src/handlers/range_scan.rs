//! Range scans: RANGE_SCAN_CREATE, RANGE_SCAN_CONTINUE and RANGE_SCAN_CANCEL
//! (kv_engine's `range_scan_*_executor.cc`).
//!
//! A create parses its JSON ([`epkv_protocol::range_scan::CreateRequest`]) and asks the
//! engine; a create the engine answers Pending (waiting for a seqno, or for keys on disk)
//! leaves the request waiting like a background fetch and runs again with the pending
//! id. A continue packs the keys or documents the engine hands over into responses of
//! about [`FRAME_BYTES`] each: Success for all but the last, whose status says how the
//! continue ended (RangeScanMore or RangeScanComplete). The scans a connection opened
//! ([`Scans`]) close with it, as kv_engine cancels them.

use crate::dispatch::{DataCall, unexpected};
use crate::response::{ReplyTo, put};
use crate::session::Session;
use bytes::BytesMut;
use epkv_engine_api::{
    Engine, EngineStatus, RangeScanCreate, RangeScanCreated, RangeScanId, RangeScanKind,
    RangeScanLimits, RangeScanProgress, ScanBound, ScanContent, ScanDocument, ScanItem,
    SnapshotRequirements,
};
use epkv_protocol::range_scan::{
    self as wire, CreateRequest, DocumentMeta, FLAGS_DOCUMENTS, FLAGS_KEYS, KeyBound, ScanKind,
};
use epkv_protocol::{Command, Status};
use epkv_types::{Datatype, Vbid};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Bytes of keys or documents after which a continue sends a response and starts the
/// next (kv_engine's `range_scan_read_buffer_send_size` is 8 KiB; larger frames cost
/// fewer headers).
pub(crate) const FRAME_BYTES: usize = 16 * 1024;
/// Scans a connection remembers the collection of (for privilege checks of continues
/// from a user whose grants name collections); older entries are forgotten past it.
const REMEMBERED: usize = 4096;

/// Owner ids handed to the engine, one per connection.
static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

/// The range scans of one connection.
pub(crate) struct Scans {
    /// The engine's owner id for this connection's scans.
    owner: u64,
    /// The engine the connection's scans are open on (released when the connection
    /// closes or moves to another bucket).
    engine: RefCell<Option<Arc<dyn Engine>>>,
    /// Collection and content of the scans this connection opened, by id.
    open: RefCell<HashMap<[u8; 16], (u32, ScanContent)>>,
    /// The create waiting for the engine (its Pending id), run again after the wait.
    pub(crate) resume: Cell<Option<(Vbid, RangeScanId)>>,
    /// What the request that answered WouldBlock waits for.
    pub(crate) blocked: Cell<Option<(Vbid, RangeScanId)>>,
}

impl Default for Scans {
    fn default() -> Self {
        Self {
            owner: NEXT_OWNER.fetch_add(1, Ordering::Relaxed),
            engine: RefCell::new(None),
            open: RefCell::new(HashMap::new()),
            resume: Cell::new(None),
            blocked: Cell::new(None),
        }
    }
}

impl Drop for Scans {
    fn drop(&mut self) {
        if let Some(e) = self.engine.get_mut().take() {
            e.range_scan_release(self.owner);
        }
    }
}

impl Scans {
    /// Notes that scans are opened on `engine`; scans open on another engine are closed.
    fn using(&self, engine: &Arc<dyn Engine>) {
        let mut current = self.engine.borrow_mut();
        if let Some(old) = current.as_ref()
            && !Arc::ptr_eq(old, engine)
        {
            old.range_scan_release(self.owner);
            self.open.borrow_mut().clear();
        }
        *current = Some(Arc::clone(engine));
    }

    fn remember(&self, id: RangeScanId, collection: u32, content: ScanContent) {
        let mut open = self.open.borrow_mut();
        if open.len() >= REMEMBERED
            && let Some(old) = open.keys().next().copied()
        {
            open.remove(&old);
        }
        open.insert(id.0, (collection, content));
    }

    fn forget(&self, id: RangeScanId) {
        self.open.borrow_mut().remove(&id.0);
    }

    /// The collection a range scan request reads, for the privilege check of a user
    /// whose grants name collections: the create's from its JSON, a continue's or a
    /// cancel's from the scans this connection opened.
    pub(crate) fn collection_of(&self, cmd: &Command<'_>) -> Option<u32> {
        match cmd {
            Command::RangeScanCreate { spec } => {
                CreateRequest::parse(spec).ok().map(|r| r.collection)
            }
            Command::RangeScanContinue(c) => self.open.borrow().get(&c.id).map(|e| e.0),
            Command::RangeScanCancel { id } => self.open.borrow().get(id).map(|e| e.0),
            _ => None,
        }
    }
}

fn bound(b: KeyBound) -> ScanBound {
    match b {
        KeyBound::Inclusive(k) => ScanBound::Inclusive(k),
        KeyBound::Exclusive(k) => ScanBound::Exclusive(k),
    }
}

/// Answers Einval with KV-Engine's JSON error context.
fn invalid(out: &mut BytesMut, to: ReplyTo, s: &Session, context: &str) {
    let body = serde_json::json!({ "error": { "context": context } }).to_string();
    put(
        out,
        &to.reply(Status::Einval)
            .with_datatype(s.datatype_out(Datatype::JSON))
            .with_value(body.as_bytes()),
    );
}

/// RANGE_SCAN_CREATE.
pub(crate) fn create(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let Command::RangeScanCreate { spec } = cmd else {
        return unexpected(c.out, c.to);
    };
    let resume = s
        .scans
        .resume
        .take()
        .filter(|(v, _)| *v == c.vbid)
        .map(|r| r.1);
    let req = match CreateRequest::parse(spec) {
        Ok(r) => r,
        Err(e) => return invalid(c.out, c.to, s, &e.0),
    };
    if req.include_xattrs {
        return invalid(c.out, c.to, s, "include_xattrs is not supported");
    }
    let content = if req.key_only {
        ScanContent::Keys
    } else {
        ScanContent::Documents
    };
    let kind = match req.kind {
        ScanKind::Range { start, end } => RangeScanKind::Range {
            start: bound(start),
            end: bound(end),
        },
        ScanKind::Sampling { samples, seed } => RangeScanKind::Sampling { samples, seed },
    };
    let engine_req = RangeScanCreate {
        collection: req.collection,
        kind,
        content,
        snapshot: req.snapshot.map(|r| SnapshotRequirements {
            vb_uuid: r.vb_uuid,
            seqno: r.seqno,
            seqno_exists: r.seqno_exists,
            timeout: r.timeout_ms.map(|ms| Duration::from_millis(u64::from(ms))),
        }),
        owner: s.scans.owner,
    };
    if let Some(b) = &s.bucket {
        s.scans.using(&b.engine);
    }
    match c.engine.range_scan_create(c.vbid, &engine_req, resume) {
        Ok(RangeScanCreated::Ready(id)) => {
            s.scans.remember(id, req.collection, content);
            put(c.out, &c.to.reply(Status::Success).with_value(&id.0));
        }
        Ok(RangeScanCreated::Pending(id)) => {
            s.scans.resume.set(Some((c.vbid, id)));
            s.scans.blocked.set(Some((c.vbid, id)));
            s.would_block.set(true);
        }
        Err(e) => s.fail(c.shared, c.out, c.to, e, &[]),
    }
}

/// Packs a continue's items into responses.
struct Packer<'a> {
    s: &'a Session,
    out: &'a mut BytesMut,
    to: ReplyTo,
    body: Vec<u8>,
    flags: u32,
}

impl Packer<'_> {
    /// Sends what is packed with `status`.
    fn send(&mut self, status: Status) {
        put(
            self.out,
            &self
                .to
                .reply(status)
                .with_extras(&self.flags.to_be_bytes())
                .with_value(&self.body),
        );
        self.body.clear();
    }

    fn add(&mut self, item: ScanItem<'_>) {
        match item {
            ScanItem::Key(k) => {
                self.flags = FLAGS_KEYS;
                wire::put_key(&mut self.body, k);
            }
            ScanItem::Document(d) => {
                self.flags = FLAGS_DOCUMENTS;
                self.add_document(&d);
            }
        }
        if self.body.len() >= FRAME_BYTES {
            self.send(Status::Success);
        }
    }

    /// A document as GET gives it: the body only (no extended attributes), compressed
    /// only for a client that negotiated Snappy.
    fn add_document(&mut self, d: &ScanDocument<'_>) {
        let mut datatype = d.datatype;
        let mut plain: Option<Vec<u8>> = None;
        if datatype.contains(Datatype::SNAPPY)
            && (!self.s.snappy || datatype.contains(Datatype::XATTR))
        {
            plain = Some(
                snap::raw::Decoder::new()
                    .decompress_vec(d.value)
                    .unwrap_or_default(),
            );
            datatype = datatype.without(Datatype::SNAPPY);
        }
        let value: &[u8] = plain.as_deref().unwrap_or(d.value);
        let value = if datatype.contains(Datatype::XATTR) {
            datatype = datatype.without(Datatype::XATTR);
            epkv_engine_api::xattr::body(value, d.datatype)
        } else {
            value
        };
        let meta = DocumentMeta {
            flags: d.flags,
            expiry: d.expiry,
            seqno: d.seqno,
            cas: d.cas,
            datatype: self.s.datatype_out(datatype).0,
        };
        wire::put_document(&mut self.body, &meta, d.key, value);
    }
}

/// RANGE_SCAN_CONTINUE.
pub(crate) fn continue_scan(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let Command::RangeScanContinue(req) = cmd else {
        return unexpected(c.out, c.to);
    };
    let id = RangeScanId(req.id);
    let limits = RangeScanLimits {
        items: req.item_limit,
        time: Duration::from_millis(u64::from(req.time_limit_ms)),
        bytes: req.byte_limit,
    };
    let content = s.scans.open.borrow().get(&req.id).map(|e| e.1);
    let mut p = Packer {
        s,
        out: c.out,
        to: c.to,
        body: Vec::with_capacity(FRAME_BYTES + 1024),
        flags: if content == Some(ScanContent::Documents) {
            FLAGS_DOCUMENTS
        } else {
            FLAGS_KEYS
        },
    };
    let outcome = c
        .engine
        .range_scan_continue(c.vbid, id, limits, &mut |item| p.add(item));
    match outcome {
        Ok(RangeScanProgress::More) => p.send(Status::RangeScanMore),
        Ok(RangeScanProgress::Complete) => {
            s.scans.forget(id);
            p.send(Status::RangeScanComplete);
        }
        Err(EngineStatus::WouldBlock) => {
            s.scans.blocked.set(Some((c.vbid, id)));
            s.would_block.set(true);
        }
        Err(e) => {
            if e != EngineStatus::TooBusy {
                s.scans.forget(id);
            }
            s.fail(c.shared, p.out, c.to, e, &[]);
        }
    }
}

/// RANGE_SCAN_CANCEL.
pub(crate) fn cancel(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let Command::RangeScanCancel { id } = cmd else {
        return unexpected(c.out, c.to);
    };
    let id = RangeScanId(id);
    s.scans.forget(id);
    match c.engine.range_scan_cancel(c.vbid, id) {
        Ok(()) => put(c.out, &c.to.reply(Status::Success)),
        Err(e) => s.fail(c.shared, c.out, c.to, e, &[]),
    }
}
