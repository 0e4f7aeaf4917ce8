//! DCP producer connections: DCP_OPEN turns a connection into a producer, which then
//! takes DCP_CONTROL, GET_FAILOVER_LOG, STREAM_REQ, CLOSE_STREAM and
//! BUFFER_ACKNOWLEDGEMENT, and sends each stream's snapshots, mutations, deletions (and
//! with sync replication prepares, commits and aborts) as the engine's
//! [`DcpStream`]s give them.
//!
//! **Sending.** The connection loop polls [`Producer::poll_ready`] while its output
//! buffer has room. Each stream has its own waker: the engine wakes it when the stream
//! has events, which queues the stream and wakes the connection, so a poll looks only at
//! the streams that were woken (not at every stream of a replication connection's
//! hundreds), a budget each, taking turns (one busy vBucket cannot starve the others).
//! What they give waits in a queue that [`Producer::drain`] encodes into the output
//! buffer. Nothing is taken from a stream
//! while the output buffer is over its limit, so a consumer that does not read holds at
//! most about the output limit plus one budget of the server's memory.
//!
//! **Flow control.** With `connection_buffer_size` set, the producer stops taking events
//! once that many bytes are sent and not acknowledged (BUFFER_ACKNOWLEDGEMENT), as
//! KV-Engine does.
//!
//! **NOOP.** With `enable_noop`, the producer sends DCP_NOOP every `set_noop_interval`
//! seconds (default 180 s, KV-Engine's) and closes the connection when the previous one
//! was not answered by the time the next is due.

use crate::response::{ReplyTo, put_error_text, put_status, put_success};
use bytes::{BufMut, BytesMut};
use epkv_engine_api::dcp::DcpDocument;
use epkv_engine_api::{DcpEvent, DcpStream, DcpStreamError, DcpStreamRequest, Engine};
use epkv_protocol::Status;
use epkv_protocol::dcp as wire;
use epkv_types::{Cas, Datatype, DurabilityLevel, Vbid, doc_key};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::{AcqRel, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

/// Bytes of events taken from one stream per turn.
const STREAM_BUDGET: usize = 64 * 1024;
/// KV-Engine's default NOOP interval.
const DEFAULT_NOOP_INTERVAL: Duration = Duration::from_secs(180);
/// The largest `connection_buffer_size` accepted (KV-Engine caps it similarly).
const MAX_BUFFER_SIZE: u64 = 1 << 30;

/// Counters of one producer, for the `dcp` STAT group.
#[derive(Debug, Default)]
pub(crate) struct ProducerStats {
    name: Mutex<String>,
    bucket: Mutex<String>,
    items_sent: AtomicU64,
    bytes_sent: AtomicU64,
    unacked_bytes: AtomicU64,
    streams: AtomicU64,
    backfilling: AtomicU64,
    buffer_size: AtomicU64,
    paused: AtomicU64,
}

/// The producers of the node, for the `dcp` STAT group.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    producers: Mutex<Vec<Weak<ProducerStats>>>,
}

impl Registry {
    fn add(&self, stats: &Arc<ProducerStats>) {
        let mut p = self.producers.lock();
        p.retain(|w| w.strong_count() > 0);
        p.push(Arc::downgrade(stats));
    }

    /// Emits the `dcp` STAT group of the producers on `bucket`.
    pub(crate) fn emit(&self, bucket: &str, sink: &mut dyn FnMut(&str, &str)) {
        let live: Vec<Arc<ProducerStats>> = self
            .producers
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|s| *s.bucket.lock() == bucket)
            .collect();
        let total_items: u64 = live.iter().map(|s| s.items_sent.load(Relaxed)).sum();
        let total_bytes: u64 = live.iter().map(|s| s.bytes_sent.load(Relaxed)).sum();
        sink("ep_dcp_count", &live.len().to_string());
        sink("ep_dcp_producer_count", &live.len().to_string());
        sink("ep_dcp_items_sent", &total_items.to_string());
        sink("ep_dcp_total_bytes", &total_bytes.to_string());
        for s in &live {
            let name = s.name.lock().clone();
            let p = format!("eq_dcpq:{name}");
            let u = |a: &AtomicU64| a.load(Relaxed).to_string();
            sink(&format!("{p}:type"), "producer");
            sink(&format!("{p}:items_sent"), &u(&s.items_sent));
            sink(&format!("{p}:total_bytes_sent"), &u(&s.bytes_sent));
            sink(&format!("{p}:unacked_bytes"), &u(&s.unacked_bytes));
            sink(&format!("{p}:max_buffer_bytes"), &u(&s.buffer_size));
            sink(&format!("{p}:num_streams"), &u(&s.streams));
            sink(&format!("{p}:backfill_num_active"), &u(&s.backfilling));
            sink(&format!("{p}:paused"), &u(&s.paused));
        }
    }
}

/// The streams that have something (or may have: they were woken) to give, by slot id,
/// and the connection task to wake when one is added.
#[derive(Default)]
struct ReadyQueue {
    ids: Mutex<VecDeque<u64>>,
    task: Mutex<Option<Waker>>,
}

/// One stream's waker: the engine wakes it when the stream has new events, which queues
/// the stream (once) and wakes the connection. The connection then polls only the queued
/// streams, not every stream it has.
struct SlotWaker {
    id: u64,
    queued: AtomicBool,
    queue: Arc<ReadyQueue>,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, AcqRel) {
            self.queue.ids.lock().push_back(self.id);
            if let Some(task) = self.queue.task.lock().as_ref() {
                task.wake_by_ref();
            }
        }
    }
}

/// One open stream.
struct Slot {
    vbid: Vbid,
    opaque: u32,
    stream: Box<dyn DcpStream>,
    waker: Arc<SlotWaker>,
    /// Its last poll left it backfilling.
    backfilling: bool,
}

/// A DCP producer connection's state (see the module docs).
pub(crate) struct Producer {
    engine: Arc<dyn Engine>,
    /// The connection's name (a replica's acknowledgements are counted by it).
    name: String,
    /// Keys carry their collection id (the connection negotiated collections).
    collections: bool,
    /// DCP_OPEN asked for deletion times (DELETION v2).
    delete_times: bool,
    /// DCP_OPEN asked for keys only.
    no_value: bool,
    /// DCP_OPEN asked for extended attributes; without it they are stripped.
    xattrs: bool,
    /// Send the snapshot marker's v2.0 form (the consumer enabled sync replication).
    sync_replication: bool,
    /// Send STREAM_END after CLOSE_STREAM.
    end_on_close: bool,
    /// Send expiries as DCP_EXPIRATION (DCP_CONTROL `enable_expiry_opcode`), not as
    /// deletions.
    expiry_opcode: bool,
    /// NOOP interval, when enabled.
    noop: Option<Duration>,
    noop_interval: Duration,
    /// A NOOP was sent and not answered yet.
    noop_outstanding: bool,
    next_noop_opaque: u32,
    /// Flow-control window in bytes (0: none).
    buffer_size: usize,
    unacked: usize,
    /// Open streams by slot id.
    streams: HashMap<u64, Slot>,
    next_id: u64,
    /// Streams to poll.
    queue: Arc<ReadyQueue>,
    /// Events taken from the streams, to encode.
    ready: VecDeque<(Vbid, u32, DcpEvent)>,
    stats: Arc<ProducerStats>,
}

/// What a DCP_CONTROL key does.
fn parse_bool(value: &[u8]) -> Option<bool> {
    match value {
        b"true" => Some(true),
        b"false" => Some(false),
        _ => None,
    }
}

fn parse_u64(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

impl Producer {
    /// A producer named `name` on `engine`, opened with DCP_OPEN `flags`.
    pub(crate) fn new(
        registry: &Registry,
        bucket: &str,
        engine: Arc<dyn Engine>,
        name: &str,
        flags: u32,
        collections: bool,
    ) -> Self {
        let stats = Arc::new(ProducerStats::default());
        *stats.name.lock() = name.to_owned();
        *stats.bucket.lock() = bucket.to_owned();
        registry.add(&stats);
        Self {
            engine,
            name: name.to_owned(),
            collections,
            delete_times: flags & wire::OPEN_INCLUDE_DELETE_TIMES != 0,
            no_value: flags & wire::OPEN_NO_VALUE != 0,
            xattrs: flags & wire::OPEN_INCLUDE_XATTRS != 0,
            sync_replication: false,
            end_on_close: false,
            expiry_opcode: false,
            noop: None,
            noop_interval: DEFAULT_NOOP_INTERVAL,
            noop_outstanding: false,
            next_noop_opaque: 0x4e4f_0000,
            buffer_size: 0,
            unacked: 0,
            streams: HashMap::new(),
            next_id: 0,
            queue: Arc::new(ReadyQueue::default()),
            ready: VecDeque::new(),
            stats,
        }
    }

    /// DCP_CONTROL: applies one setting; returns the status to answer.
    pub(crate) fn control(&mut self, key: &[u8], value: &[u8]) -> Status {
        let ok = match key {
            b"enable_noop" => parse_bool(value).map(|on| {
                self.noop = on.then_some(self.noop_interval);
            }),
            b"set_noop_interval" => parse_u64(value)
                .filter(|s| (1..=3600).contains(s))
                .map(|s| {
                    self.noop_interval = Duration::from_secs(s);
                    if self.noop.is_some() {
                        self.noop = Some(self.noop_interval);
                    }
                }),
            b"connection_buffer_size" => {
                parse_u64(value).filter(|n| *n <= MAX_BUFFER_SIZE).map(|n| {
                    self.buffer_size = usize::try_from(n).unwrap_or(usize::MAX);
                    self.stats.buffer_size.store(n, Relaxed);
                })
            }
            b"enable_sync_replication" => parse_bool(value).map(|on| self.sync_replication = on),
            b"send_stream_end_on_client_close_stream" => {
                parse_bool(value).map(|on| self.end_on_close = on)
            }
            b"consumer_name" => std::str::from_utf8(value).ok().map(|n| {
                tracing::debug!(consumer = n, "DCP consumer named itself");
            }),
            b"enable_expiry_opcode" => parse_bool(value).map(|on| self.expiry_opcode = on),
            // Accepted and without effect here: priorities and cursor dropping are
            // KV-Engine scheduling details, and the remaining ones describe what the
            // client can take, not what it asks for.
            b"set_priority"
            | b"supports_cursor_dropping"
            | b"supports_cursor_dropping_vulcan"
            | b"supports_hifi_MFU"
            | b"enable_ext_metadata"
            | b"send_stream_end_on_client_close_stream_v2" => Some(()),
            _ => None,
        };
        if ok.is_some() {
            Status::Success
        } else {
            tracing::debug!(key = %String::from_utf8_lossy(key), value = %String::from_utf8_lossy(value), "DCP_CONTROL refused");
            Status::Einval
        }
    }

    /// The NOOP interval when NOOPs are on.
    pub(crate) fn noop_interval(&self) -> Option<Duration> {
        self.noop
    }

    /// The NOOP is due: sends one. Returns false when the last one was never answered
    /// (the connection is then closed, as KV-Engine closes a dead consumer's).
    pub(crate) fn noop_due(&mut self, out: &mut BytesMut) -> bool {
        if self.noop_outstanding {
            return false;
        }
        self.noop_outstanding = true;
        self.next_noop_opaque = self.next_noop_opaque.wrapping_add(1);
        if let Err(e) = wire::encode_noop(out, self.next_noop_opaque) {
            tracing::error!(error = %e, "DCP_NOOP does not encode");
        }
        true
    }

    /// A response from the consumer (to a NOOP; others are ignored).
    pub(crate) fn response(&mut self, opcode: u8, status: u16) {
        if opcode == epkv_protocol::Opcode::DcpNoop.as_u8() {
            self.noop_outstanding = false;
        } else if status != 0 {
            tracing::debug!(opcode, status, "DCP consumer answered an error");
        }
    }

    /// DCP_SEQNO_ACKNOWLEDGED: the consumer (a replica) holds `vbid`'s prepares up to
    /// `seqno`.
    pub(crate) fn seqno_acknowledged(&self, vbid: Vbid, seqno: u64) -> Status {
        if !self.sync_replication {
            return Status::Einval;
        }
        match self.engine.seqno_acknowledged(vbid, &self.name, seqno) {
            Ok(()) => Status::Success,
            Err(e) => crate::status_map::engine_status_to_wire(e),
        }
    }

    /// BUFFER_ACKNOWLEDGEMENT of `bytes`.
    pub(crate) fn buffer_ack(&mut self, bytes: u32) {
        self.unacked = self.unacked.saturating_sub(bytes as usize);
        self.stats.unacked_bytes.store(self.unacked as u64, Relaxed);
    }

    /// STREAM_REQ for `vbid` with `opaque`; writes the reply.
    pub(crate) fn stream_req(
        &mut self,
        out: &mut BytesMut,
        to: ReplyTo,
        vbid: Vbid,
        mut req: DcpStreamRequest,
    ) -> Result<(), Status> {
        if self.streams.values().any(|s| s.vbid == vbid) {
            return Err(Status::KeyEexists);
        }
        req.sync_replication = self.sync_replication;
        match self.engine.dcp_stream(vbid, req) {
            Ok(stream) => {
                let log = failover_log_body(&*self.engine, vbid);
                put_success(out, to, Cas::ANY, Datatype::RAW, &[], &[], &log);
                let id = self.next_id;
                self.next_id += 1;
                let waker = Arc::new(SlotWaker {
                    id,
                    queued: AtomicBool::new(false),
                    queue: Arc::clone(&self.queue),
                });
                // A new stream is polled at once.
                waker.wake_by_ref();
                self.streams.insert(
                    id,
                    Slot {
                        vbid,
                        opaque: to.opaque,
                        stream,
                        waker,
                        backfilling: false,
                    },
                );
                self.stats.streams.store(self.streams.len() as u64, Relaxed);
                Ok(())
            }
            Err(DcpStreamError::Rollback(seqno)) => {
                put(
                    out,
                    &to.reply(Status::Rollback).with_value(&seqno.to_be_bytes()),
                );
                Ok(())
            }
            Err(DcpStreamError::Status(s)) => Err(crate::status_map::engine_status_to_wire(s)),
        }
    }

    /// CLOSE_STREAM for `vbid`.
    pub(crate) fn close_stream(&mut self, vbid: Vbid) -> Status {
        let Some(id) = self
            .streams
            .iter()
            .find_map(|(id, s)| (s.vbid == vbid).then_some(*id))
        else {
            return Status::KeyEnoent;
        };
        let Some(slot) = self.streams.remove(&id) else {
            return Status::KeyEnoent;
        };
        if slot.backfilling {
            self.stats.backfilling.fetch_sub(1, Relaxed);
        }
        self.ready.retain(|(v, _, _)| *v != vbid);
        if self.end_on_close {
            self.ready.push_back((
                vbid,
                slot.opaque,
                DcpEvent::End(epkv_engine_api::dcp::DcpEndReason::Closed),
            ));
        }
        self.stats.streams.store(self.streams.len() as u64, Relaxed);
        Status::Success
    }

    /// Whether the flow-control window is closed.
    fn window_closed(&self) -> bool {
        self.buffer_size > 0 && self.unacked >= self.buffer_size
    }

    /// Resolves when events are queued for [`Self::drain`]: polls the streams the engine
    /// woke (queued by their [`SlotWaker`]), in the order they were woken; a stream that
    /// gave events goes to the back of the queue, so busy streams take turns. Pending
    /// when no queued stream has anything (each left its waker with the engine), or when
    /// the flow-control window is closed (a BUFFER_ACKNOWLEDGEMENT is read by the
    /// connection, which then polls again).
    pub(crate) fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.ready.is_empty() {
            return Poll::Ready(());
        }
        if self.window_closed() {
            self.stats.paused.store(1, Relaxed);
            return Poll::Pending;
        }
        self.stats.paused.store(0, Relaxed);
        {
            let mut task = self.queue.task.lock();
            if !task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        let mut events = Vec::new();
        while self.ready.is_empty() {
            let Some(id) = self.queue.ids.lock().pop_front() else {
                break;
            };
            let Some(slot) = self.streams.get_mut(&id) else {
                // Closed since it was woken.
                continue;
            };
            // Cleared before the poll, so that a wake during it queues the stream again.
            slot.waker.queued.store(false, Release);
            let waker = Waker::from(Arc::clone(&slot.waker));
            let mut scx = Context::from_waker(&waker);
            events.clear();
            let polled = slot
                .stream
                .poll_events(&mut scx, STREAM_BUDGET, &mut events);
            let backfilling = slot.stream.backfilling();
            if backfilling != slot.backfilling {
                slot.backfilling = backfilling;
                if backfilling {
                    self.stats.backfilling.fetch_add(1, Relaxed);
                } else {
                    self.stats.backfilling.fetch_sub(1, Relaxed);
                }
            }
            if polled.is_pending() {
                continue;
            }
            let mut ended = false;
            for e in events.drain(..) {
                ended |= matches!(e, DcpEvent::End(_));
                if matches!(e, DcpEvent::System { .. }) && !self.collections {
                    // Scope and collection events go only to clients that negotiated
                    // collections.
                    continue;
                }
                self.ready.push_back((slot.vbid, slot.opaque, e));
            }
            if ended {
                if slot.backfilling {
                    self.stats.backfilling.fetch_sub(1, Relaxed);
                }
                self.streams.remove(&id);
                self.stats.streams.store(self.streams.len() as u64, Relaxed);
            } else {
                // It may have more: its turn comes again after the others queued.
                slot.waker.wake_by_ref();
            }
        }
        if self.ready.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }

    /// Encodes queued events into `out` until it holds `limit` bytes.
    pub(crate) fn drain(&mut self, out: &mut BytesMut, limit: usize) {
        let mut buf = Vec::new();
        while out.len() < limit {
            let Some((vbid, opaque, event)) = self.ready.pop_front() else {
                break;
            };
            buf.clear();
            self.encode(&mut buf, vbid, opaque, &event);
            out.put_slice(&buf);
            self.unacked += buf.len();
            self.stats.bytes_sent.fetch_add(buf.len() as u64, Relaxed);
            if event.seqno().is_some() {
                self.stats.items_sent.fetch_add(1, Relaxed);
            }
        }
        self.stats.unacked_bytes.store(self.unacked as u64, Relaxed);
    }

    /// The key as this consumer sees it: with its collection id when it negotiated
    /// collections, else as the default collection's key.
    fn wire_key(&self, key: &[u8]) -> Vec<u8> {
        let (cid, raw) = doc_key::decode(key);
        if self.collections {
            let mut buf = doc_key::DocKeyBuf::new();
            buf.put_wire(cid, raw).to_vec()
        } else {
            raw.to_vec()
        }
    }

    fn value_of<'d>(&self, d: &'d DcpDocument) -> (&'d [u8], u8) {
        if self.no_value {
            return (&[], 0);
        }
        if !self.xattrs && d.datatype & Datatype::XATTR.0 != 0 {
            // A consumer that did not ask for attributes gets the body alone.
            let body = epkv_engine_api::xattr::body(&d.value, Datatype(d.datatype));
            return (body, d.datatype & !Datatype::XATTR.0);
        }
        (&d.value, d.datatype)
    }

    fn meta(d: &DcpDocument, datatype: u8) -> wire::DcpDocMeta {
        wire::DcpDocMeta {
            by_seqno: d.seqno,
            rev_seqno: d.rev_seqno,
            cas: Cas(d.cas),
            flags: d.flags,
            expiration: d.expiry,
            lock_time: 0,
            datatype: Datatype(datatype),
            nru: 0,
        }
    }

    fn encode(&self, buf: &mut Vec<u8>, vbid: Vbid, opaque: u32, event: &DcpEvent) {
        let encoded = match event {
            DcpEvent::SnapshotMarker {
                start,
                end,
                flags,
                max_visible,
                high_completed,
            } => {
                if self.sync_replication {
                    wire::encode_snapshot_marker_v2(
                        buf,
                        opaque,
                        vbid,
                        *start,
                        *end,
                        *flags,
                        *max_visible,
                        *high_completed,
                    )
                } else {
                    wire::encode_snapshot_marker(buf, opaque, vbid, *start, *end, *flags)
                }
            }
            DcpEvent::Mutation(d) => {
                let (value, datatype) = self.value_of(d);
                let key = self.wire_key(&d.key);
                wire::encode_mutation(buf, opaque, vbid, &Self::meta(d, datatype), &key, value)
            }
            DcpEvent::Deletion(d) | DcpEvent::Expiration(d) => {
                let (value, datatype) = self.value_of(d);
                let key = self.wire_key(&d.key);
                let meta = Self::meta(d, datatype);
                // An expiry is a deletion to a consumer that did not enable the opcode.
                if matches!(event, DcpEvent::Expiration(_)) && self.expiry_opcode {
                    wire::encode_expiration(buf, opaque, vbid, &meta, &key, value, d.expiry)
                } else {
                    let delete_time = self.delete_times.then_some(d.expiry);
                    wire::encode_deletion(buf, opaque, vbid, &meta, &key, value, delete_time)
                }
            }
            DcpEvent::Prepare {
                doc,
                deleted,
                level,
            } => {
                let (value, datatype) = self.value_of(doc);
                let key = self.wire_key(&doc.key);
                wire::encode_prepare(
                    buf,
                    opaque,
                    vbid,
                    &Self::meta(doc, datatype),
                    &key,
                    value,
                    if *deleted {
                        wire::DocumentState::Deleted
                    } else {
                        wire::DocumentState::Alive
                    },
                    DurabilityLevel::from_u8(*level).unwrap_or(DurabilityLevel::Majority),
                )
            }
            DcpEvent::Commit {
                key,
                prepared_seqno,
                commit_seqno,
            } => {
                let key = self.wire_key(key);
                wire::encode_commit(buf, opaque, vbid, &key, *prepared_seqno, *commit_seqno)
            }
            DcpEvent::Abort {
                key,
                prepared_seqno,
                abort_seqno,
            } => {
                let key = self.wire_key(key);
                wire::encode_abort(buf, opaque, vbid, &key, *prepared_seqno, *abort_seqno)
            }
            DcpEvent::System { seqno, event } => {
                let mut value = Vec::with_capacity(20);
                event.encode_value(&mut value);
                wire::encode_system_event(
                    buf,
                    opaque,
                    vbid,
                    *seqno,
                    event.kind.id(),
                    event.version(),
                    event.name.as_bytes(),
                    &value,
                )
            }
            DcpEvent::End(reason) => wire::encode_stream_end(
                buf,
                opaque,
                vbid,
                wire::StreamEndReason::from_u32(reason.as_u32())
                    .unwrap_or(wire::StreamEndReason::Ok),
            ),
        };
        if let Err(e) = encoded {
            // Keys and values come from the engine within the protocol's limits.
            tracing::error!(%vbid, error = %e, "DCP message does not encode; skipped");
            buf.clear();
        }
    }
}

fn put(out: &mut BytesMut, resp: &epkv_protocol::Response<'_>) {
    crate::response::put(out, resp);
}

/// Applies a STREAM_REQ's flags to its range: `FROM_LATEST` starts at the vBucket's high
/// seqno (on its newest branch), `TO_LATEST` ends there, `DISK_ONLY` ends at the
/// persisted seqno. `ACTIVE_VB_ONLY` and `STRICT_VBUUID` need nothing (streams are of
/// active vBuckets, and a uuid unknown to the failover log rolls back to 0 anyway).
///
/// # Errors
/// `NotSupported` for `TAKEOVER` (vBucket moves come with rebalance); the engine's status
/// when the vBucket's seqnos cannot be read.
pub(crate) fn apply_stream_flags(
    engine: &dyn Engine,
    vbid: Vbid,
    mut r: wire::StreamReq,
) -> Result<wire::StreamReq, Status> {
    if r.flags & wire::STREAM_TAKEOVER != 0 {
        return Err(Status::NotSupported);
    }
    let latest = wire::STREAM_FROM_LATEST | wire::STREAM_TO_LATEST | wire::STREAM_DISK_ONLY;
    if r.flags & latest == 0 {
        return Ok(r);
    }
    let seqnos = engine
        .vbucket_seqnos(vbid)
        .map_err(crate::status_map::engine_status_to_wire)?;
    let high = seqnos.high_seqno.0;
    if r.flags & wire::STREAM_FROM_LATEST != 0 {
        r.start_seqno = high;
        r.snap_start_seqno = high;
        r.snap_end_seqno = high;
        r.vbucket_uuid = seqnos.failover_log.first().map_or(0, |e| e.uuid);
    }
    if r.flags & wire::STREAM_TO_LATEST != 0 {
        r.end_seqno = high.max(r.start_seqno);
    }
    if r.flags & wire::STREAM_DISK_ONLY != 0 {
        r.end_seqno = r.end_seqno.min(seqnos.persisted_seqno.0.max(r.start_seqno));
    }
    Ok(r)
}

/// GET_FAILOVER_LOG's (and STREAM_REQ's) value: the vBucket's failover log, newest first.
pub(crate) fn failover_log_body(engine: &dyn Engine, vbid: Vbid) -> Vec<u8> {
    let entries: Vec<(u64, u64)> = engine
        .vbucket_seqnos(vbid)
        .map(|s| s.failover_log.iter().map(|e| (e.uuid, e.seqno.0)).collect())
        .unwrap_or_default();
    wire::encode_failover_log_body(&entries)
}

/// A STREAM_REQ's filter: `collections` (hex ids) or one `scope`; neither for every
/// collection.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct StreamFilter {
    pub(crate) collections: Option<Vec<u32>>,
    pub(crate) scope: Option<u32>,
    /// With `scope`: the scope's collections when the stream was asked for (what a user
    /// whose roles name collections must hold DcpStream on).
    pub(crate) scope_collections: Vec<u32>,
}

/// The filter a STREAM_REQ's JSON value asks for: `{"collections":["8","9"]}` (hex ids)
/// or `{"scope":"8"}`, checked against the bucket's manifest; every collection for an
/// empty value.
///
/// # Errors
/// `Einval` for a value that is not such a filter; `UnknownScope` / `UnknownCollection`
/// for ids the manifest does not have.
pub(crate) fn collection_filter(engine: &dyn Engine, value: &[u8]) -> Result<StreamFilter, Status> {
    if value.is_empty() {
        return Ok(StreamFilter::default());
    }
    let v: serde_json::Value = serde_json::from_slice(value).map_err(|_| Status::Einval)?;
    let hex = |s: &serde_json::Value| {
        s.as_str()
            .and_then(|s| u32::from_str_radix(s, 16).ok())
            .ok_or(Status::Einval)
    };
    let manifest: serde_json::Value = engine
        .collections_manifest()
        .ok()
        .and_then(|m| serde_json::from_str(&m).ok())
        .unwrap_or_default();
    let scopes = manifest["scopes"].as_array().cloned().unwrap_or_default();
    let ids_of = |scope: &serde_json::Value| -> Vec<u32> {
        scope["collections"]
            .as_array()
            .map(|cs| cs.iter().filter_map(|c| hex(&c["uid"]).ok()).collect())
            .unwrap_or_default()
    };
    if let Some(list) = v.get("collections").and_then(|c| c.as_array()) {
        let wanted: Vec<u32> = list.iter().map(hex).collect::<Result<_, _>>()?;
        let known: Vec<u32> = scopes.iter().flat_map(ids_of).collect();
        if wanted.iter().any(|c| !known.contains(c)) {
            return Err(Status::UnknownCollection);
        }
        return Ok(StreamFilter {
            collections: Some(wanted),
            ..StreamFilter::default()
        });
    }
    if let Some(scope) = v.get("scope") {
        let sid = hex(scope)?;
        let Some(found) = scopes.iter().find(|s| hex(&s["uid"]).ok() == Some(sid)) else {
            return Err(Status::UnknownScope);
        };
        return Ok(StreamFilter {
            collections: None,
            scope: Some(sid),
            scope_collections: ids_of(found),
        });
    }
    // Other keys ("uid", "sid" stream ids, ...) without a filter: every collection.
    if v.as_object().is_some() {
        return Ok(StreamFilter::default());
    }
    Err(Status::Einval)
}

/// Answers with a bare status.
pub(crate) fn answer(out: &mut BytesMut, to: ReplyTo, status: Status) {
    if status == Status::Success {
        put_status(out, to, status, &[]);
    } else {
        put_error_text(out, to, status);
    }
}
