//! [`Session`]: a connection's protocol state, and the execution of one request.
//!
//! Everything here is synchronous: a request is decoded, validated, executed against the
//! engine and its reply appended to the output buffer before the next one is looked at,
//! so pipelined requests are answered in order.

use crate::buckets::DEFAULT_BUCKET;
use crate::frontend::Shared;
use crate::response::{ReplyTo, put, put_error_text, put_status, put_success};
use crate::status_map::{engine_status_to_wire, status_for_client};
use crate::timings;
use bytes::BytesMut;
use epkv_auth::SaslServer;
use epkv_engine_api::{
    ArithmeticRequest, DurabilityRequirements, Engine, EngineStatus, Expiry, ItemView, KeyState,
    MutationInfo, RemoveRequest, StoreRequest, VBucketSeqnos,
};
use epkv_protocol::{
    Command, DurabilityRequirement, Feature, HelloFeatures, ObserveState, Opcode, Request, Status,
    error_map_json,
};
use epkv_types::doc_key::{self, DocKeyBuf};
use epkv_types::{Cas, Datatype, DurabilityLevel, NUM_VBUCKETS, Vbid, vbucket_for_key};
use std::cell::Cell;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// How long a write at a persist durability level waits for its seqno to be persisted
/// when the client gave no timeout: KV-Engine's fixed default for SyncWrites.
pub(crate) const DEFAULT_DURABILITY_TIMEOUT: Duration = Duration::from_secs(30);

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

/// A write answered only once its durability is settled: a SyncWrite (any write with
/// durability requirements), once the engine commits it (or, when its timeout passed
/// first, aborts it: SyncWriteAmbiguous); or a durable TOUCH, once its seqno is
/// persisted (SyncWriteAmbiguous when `timeout` passes first). While one is pending the
/// connection executes nothing else, so replies stay in request order; the worker thread
/// is free (the engine completes `outcome` from its own threads, without a thread per
/// waiter).
pub(crate) struct PendingDurable {
    /// Completed with the outcome by the engine's callback.
    pub(crate) outcome: oneshot::Receiver<Result<(), EngineStatus>>,
    /// The connection's own timeout, for a durable TOUCH only: a SyncWrite's timeout is
    /// the engine's (one task per vBucket, not a timer per connection).
    pub(crate) timeout: Option<Duration>,
    to: ReplyTo,
    info: MutationInfo,
    /// What the success reply carries.
    body: DurableReply,
    quiet: bool,
}

/// What a deferred reply waits for ([`Session::defer_reply`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Wait {
    /// The engine's outcome of a SyncWrite (its timeout is the engine's).
    SyncWrite,
    /// The persistence of the write's seqno, within this timeout (a durable TOUCH).
    Persisted(Duration),
}

/// The success reply of a write waiting for persistence, besides its CAS.
#[derive(Clone, Debug)]
pub(crate) enum DurableReply {
    /// SET family, DELETE: the mutation extras (when negotiated), no value.
    Mutation,
    /// INCREMENT/DECREMENT: the mutation extras and the new value.
    Counter(u64),
    /// TOUCH: the CAS only, as its immediate reply.
    Touch,
    /// Sub-document mutations: the mutation extras and this value (possibly empty), with
    /// Success or (the document is deleted after it) SubdocSuccessDeleted.
    Body(Vec<u8>, Status),
}

/// The timeout of a write that must be persisted before it is acknowledged, or `None` for
/// a write acknowledged at once (no durability, or Majority: a single node is its own
/// majority and commits in memory).
pub(crate) fn persist_timeout(d: Option<DurabilityRequirement>) -> Option<Duration> {
    let d = d?;
    match d.level {
        DurabilityLevel::Majority => None,
        DurabilityLevel::MajorityAndPersistOnMaster | DurabilityLevel::PersistToMajority => {
            Some(d.timeout.unwrap_or(DEFAULT_DURABILITY_TIMEOUT))
        }
    }
}

/// How many times in a row one request may be sent back for a background fetch before it
/// is answered TMPFAIL instead: each fetch restores the value, so a request that blocks
/// again found it evicted again at once (memory far over its quota), and the client is
/// better served by a retry later than by a loop.
const MAX_REFETCHES: u8 = 4;

/// A request that needs a background fetch: the connection waits for the engine to fetch
/// `key` ([`Engine::when_fetched`]), then executes the same request again.
pub(crate) struct BlockedOn {
    pub(crate) engine: Arc<dyn Engine>,
    pub(crate) vbid: Vbid,
    pub(crate) key: Vec<u8>,
}

/// The bucket a connection uses.
#[derive(Clone)]
pub(crate) struct SelectedBucket {
    pub(crate) name: Arc<str>,
    pub(crate) engine: Arc<dyn Engine>,
    /// Raised when the bucket is dropped: the connection closes at its next request.
    pub(crate) dropped: Arc<std::sync::atomic::AtomicBool>,
}

/// Per-connection protocol state: features negotiated by HELLO, the authenticated user
/// and the selected bucket.
pub(crate) struct Session {
    /// The client sent HELLO: it is a Couchbase-style client that routes by vBucket
    /// itself, so the header's vbid is used as is. Classic memcached clients never send
    /// HELLO and always send vbid 0; their key requests are routed to the key's vBucket.
    pub(crate) vbucket_aware: bool,
    /// Mutation replies carry 16 bytes of extras: vBucket UUID and seqno.
    pub(crate) mutation_seqno: bool,
    /// The JSON datatype bit is returned; without it, the bit is cleared in replies.
    pub(crate) json: bool,
    /// The client agreed to XERROR: it understands every status in the error map.
    pub(crate) xerror: bool,
    /// The client negotiated Snappy: it may send compressed values and gets stored ones
    /// as they are; others get them decompressed.
    pub(crate) snappy: bool,
    /// The client negotiated extended attributes (HELLO Xattr): it may store a value
    /// with its attributes (datatype XATTR).
    pub(crate) xattr: bool,
    /// The client negotiated collections (HELLO Collections): its keys start with their
    /// collection id in LEB128.
    pub(crate) collections: bool,
    /// The agent name the client gave in HELLO, for logs.
    pub(crate) agent: Option<String>,
    /// A TCP_NODELAY change HELLO asked for, applied by the connection after the batch.
    pub(crate) nodelay_change: Option<bool>,
    /// The address the client connected to (the cluster map names this node by it).
    local: SocketAddr,
    /// The bucket data requests go to; `None` until SELECT_BUCKET (or, in the open
    /// loopback mode, `default` from the start).
    bucket: Option<SelectedBucket>,
    /// The authenticated user, if any.
    pub(crate) user: Option<String>,
    /// A SASL exchange in progress (between SASL_AUTH answered 0x21 and SASL_STEP).
    pub(crate) sasl: Option<SaslServer>,
    /// The client's address (authentication failures are throttled by it).
    pub(crate) peer: IpAddr,
    /// Failed authentication attempts in a row on this connection.
    pub(crate) auth_failures: u32,
    /// A SASL_AUTH waiting for its source's delay or the password-check pool; the
    /// connection takes it after the request.
    pub(crate) pending_auth: Option<crate::sasl::PendingAuth>,
    /// A reply the client cannot understand was due: close after this batch.
    disconnect: Cell<bool>,
    /// A durable write waiting for persistence; the connection takes it after the request.
    pending: Cell<Option<PendingDurable>>,
    /// Set by [`Self::fail`] when the engine answered WouldBlock: the request is not
    /// answered, and [`Self::execute_data`] turns this into `blocked_on`.
    would_block: Cell<bool>,
    /// The last request waits for a background fetch and must be executed again; the
    /// connection takes it after the request.
    blocked_on: Cell<Option<BlockedOn>>,
    /// The key a multi-key request (OBSERVE) is blocked on, when not its document key.
    blocked_key: Cell<Option<(Vbid, Vec<u8>)>>,
    /// Consecutive WouldBlock answers to the request being executed.
    refetches: Cell<u8>,
    /// The outcome a failed background fetch left for the request executed next (the one
    /// that waited for it), answered instead of executing it again.
    fail_next: Cell<Option<EngineStatus>>,
    /// Set by DCP_OPEN: the connection is a DCP producer ([`crate::dcp`]).
    pub(crate) dcp: Option<crate::dcp::Producer>,
}

/// A write's durability under a bucket minimum level: at least `min`, with the client's
/// timeout (or none, for the default).
pub(crate) fn with_min_level(
    d: Option<DurabilityRequirement>,
    min: DurabilityLevel,
) -> Option<DurabilityRequirement> {
    Some(match d {
        Some(d) if d.level as u8 >= min as u8 => d,
        Some(d) => DurabilityRequirement { level: min, ..d },
        None => DurabilityRequirement {
            level: min,
            timeout: None,
        },
    })
}

pub(crate) fn durability(d: Option<DurabilityRequirement>) -> Option<DurabilityRequirements> {
    d.map(|d| DurabilityRequirements {
        level: d.level,
        timeout: d.timeout,
    })
}

impl Session {
    /// A new connection's session. In the open mode it starts on the `default` bucket.
    pub(crate) fn new(shared: &Shared, local: SocketAddr, peer: IpAddr) -> Self {
        let bucket = if shared.open_default {
            shared.buckets.live(DEFAULT_BUCKET).map(|b| SelectedBucket {
                name: Arc::from(DEFAULT_BUCKET),
                engine: b.engine,
                dropped: b.dropped,
            })
        } else {
            None
        };
        Self {
            vbucket_aware: false,
            mutation_seqno: false,
            json: false,
            xerror: false,
            snappy: false,
            xattr: false,
            collections: false,
            agent: None,
            nodelay_change: None,
            local,
            bucket,
            user: None,
            sasl: None,
            peer,
            auth_failures: 0,
            pending_auth: None,
            disconnect: Cell::new(false),
            pending: Cell::new(None),
            would_block: Cell::new(false),
            blocked_on: Cell::new(None),
            refetches: Cell::new(0),
            blocked_key: Cell::new(None),
            fail_next: Cell::new(None),
            dcp: None,
        }
    }

    /// Takes the background fetch the last request is waiting for, if any: that request
    /// was not answered and must be executed again once the fetch is over.
    pub(crate) fn take_blocked(&self) -> Option<BlockedOn> {
        self.blocked_on.take()
    }

    /// Whether the last request is waiting for a background fetch.
    pub(crate) fn is_blocked(&self) -> bool {
        let b = self.blocked_on.take();
        let blocked = b.is_some();
        self.blocked_on.set(b);
        blocked
    }

    /// Records how the background fetch a request waited for ended: on an error, the
    /// request is answered with it when it is executed again, instead of running.
    pub(crate) fn fetch_done(&self, outcome: Result<(), EngineStatus>) {
        self.fail_next.set(outcome.err());
    }

    /// Takes the durable write the last request left waiting for persistence, if any.
    pub(crate) fn take_pending(&self) -> Option<PendingDurable> {
        self.pending.take()
    }

    /// Whether the last request left a durable write waiting for persistence.
    pub(crate) fn has_pending(&self) -> bool {
        let p = self.pending.take();
        let has = p.is_some();
        self.pending.set(p);
        has
    }

    /// Answers a durable write once its wait is over: success, or the engine's status
    /// (SyncWriteAmbiguous, 0xa3, when its timeout passed first: the write may still
    /// reach the disk, as KV-Engine answers a SyncWrite it aborted). Returns true when the
    /// connection must close because the client cannot understand the reply (no XERROR).
    pub(crate) fn complete_durable(
        &self,
        out: &mut BytesMut,
        p: PendingDurable,
        outcome: Result<(), EngineStatus>,
    ) -> bool {
        if let Err(e) = outcome {
            tracing::debug!(
                seqno = p.info.seqno.0,
                status = ?e,
                "durable write not completed"
            );
            self.fail_wire(out, p.to, engine_status_to_wire(e), &[]);
            return self.disconnect.get();
        }
        if p.quiet {
            return false;
        }
        let (extras, n) = self.mutation_extras(&p.info);
        match p.body {
            DurableReply::Counter(value) => put_success(
                out,
                p.to,
                p.info.cas,
                Datatype::RAW,
                &extras[..n],
                &[],
                &value.to_be_bytes(),
            ),
            DurableReply::Mutation => {
                put_success(out, p.to, p.info.cas, Datatype::RAW, &extras[..n], &[], &[]);
            }
            DurableReply::Touch => put_success(out, p.to, p.info.cas, Datatype::RAW, &[], &[], &[]),
            DurableReply::Body(body, status) => put(
                out,
                &p.to
                    .reply(status)
                    .with_cas(p.info.cas)
                    .with_extras(&extras[..n])
                    .with_value(&body),
            ),
        }
        false
    }

    /// Answers a mutation: at once, or (a SyncWrite) once the engine has completed it.
    #[expect(clippy::too_many_arguments, reason = "the parts of one mutation reply")]
    pub(crate) fn reply_mutation(
        &self,
        shared: &Shared,
        engine: &dyn Engine,
        out: &mut BytesMut,
        to: ReplyTo,
        vbid: Vbid,
        info: MutationInfo,
        body: DurableReply,
        sync_write: bool,
    ) {
        match sync_write {
            true => {
                let wait = Wait::SyncWrite;
                self.defer_reply(shared, engine, out, to, vbid, (info, body), wait, false);
            }
            false => {
                let (extras, n) = self.mutation_extras(&info);
                let (value, status) = match &body {
                    DurableReply::Body(v, status) => (v.as_slice(), *status),
                    _ => (&[][..], Status::Success),
                };
                put(
                    out,
                    &to.reply(status)
                        .with_cas(info.cas)
                        .with_extras(&extras[..n])
                        .with_value(value),
                );
            }
        }
    }

    /// Leaves a write's reply waiting for `wait` (see [`PendingDurable`]): the engine's
    /// outcome of a SyncWrite (its prepare got `info.seqno` in `vbid`), or the persistence
    /// of a durable TOUCH's seqno within its timeout. An outcome known already (Majority
    /// on a single node, usually) is answered now, without a pass of the connection's
    /// wait; a status the client cannot understand marks the session for disconnection.
    #[expect(clippy::too_many_arguments, reason = "the parts of one deferred reply")]
    pub(crate) fn defer_reply(
        &self,
        shared: &Shared,
        engine: &dyn Engine,
        out: &mut BytesMut,
        to: ReplyTo,
        vbid: Vbid,
        (info, body): (MutationInfo, DurableReply),
        wait: Wait,
        quiet: bool,
    ) {
        let (tx, rx) = oneshot::channel();
        // The connection may have gone; then nobody waits.
        let registered = match wait {
            Wait::SyncWrite => engine.when_sync_write_completed(
                vbid,
                info.seqno,
                Box::new(move |outcome| {
                    let _ = tx.send(outcome);
                }),
            ),
            Wait::Persisted(_) => engine.when_persisted(
                vbid,
                info.seqno,
                Box::new(move |_persisted| {
                    let _ = tx.send(Ok(()));
                }),
            ),
        };
        if let Err(e) = registered {
            return self.fail(shared, out, to, e, &[]);
        }
        let mut p = PendingDurable {
            outcome: rx,
            timeout: match wait {
                Wait::SyncWrite => None,
                Wait::Persisted(timeout) => Some(timeout),
            },
            to,
            info,
            body,
            quiet,
        };
        match p.outcome.try_recv() {
            Ok(outcome) => {
                self.complete_durable(out, p, outcome);
            }
            Err(_) => self.pending.set(Some(p)),
        }
    }

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
        if let Some(op) = Opcode::from_u8(req.header.opcode)
            && crate::dcp::is_dcp(op)
        {
            self.execute_dcp(shared, req, op, out, to);
            return if self.disconnect.get() {
                Flow::Disconnect
            } else {
                Flow::Continue
            };
        }
        let mut cmd = match Command::decode(req) {
            Ok(cmd) => cmd,
            Err(status) => {
                put_error_text(out, to, status);
                return Flow::Continue;
            }
        };
        if let Some(b) = &self.bucket
            && let Some(min) = b.engine.durability_min_level()
            && let Some(d) = cmd.write_durability_mut()
        {
            *d = with_min_level(*d, min);
        }
        let flow = match cmd {
            Command::Hello { agent, features } => {
                self.hello(agent, features, out, to);
                Flow::Continue
            }
            Command::Quit { quiet } => {
                if !quiet {
                    put_status(out, to, Status::Success, &[]);
                }
                Flow::Close
            }
            Command::Noop | Command::Verbosity { .. } => {
                put_status(out, to, Status::Success, &[]);
                Flow::Continue
            }
            Command::Version => {
                put_success(
                    out,
                    to,
                    Cas::ANY,
                    Datatype::RAW,
                    &[],
                    &[],
                    shared.config.version.as_bytes(),
                );
                Flow::Continue
            }
            Command::SaslListMechs => {
                self.sasl_list_mechs(shared, out, to);
                Flow::Continue
            }
            Command::SaslAuth { mechanism, data } => {
                self.sasl_auth(shared, mechanism, data, out, to)
            }
            Command::SaslStep { mechanism, data } => {
                self.sasl_step(shared, mechanism, data, out, to)
            }
            Command::SelectBucket { name } => {
                self.select_bucket(shared, name, out, to);
                Flow::Continue
            }
            Command::GetErrorMap { version } => {
                let (_, map) = error_map_json(version);
                put_success(
                    out,
                    to,
                    Cas::ANY,
                    self.datatype_out(Datatype::JSON),
                    &[],
                    &[],
                    map.as_bytes(),
                );
                Flow::Continue
            }
            Command::GetClusterConfig { known_version } => {
                self.cluster_config(shared, known_version, out, to);
                Flow::Continue
            }
            Command::AdjustTimeofday { offset_secs } => {
                adjust_timeofday(shared, offset_secs, out, to);
                Flow::Continue
            }
            Command::Stat { group } => {
                self.stats(shared, out, to, group);
                Flow::Continue
            }
            cmd => match &self.bucket {
                Some(bucket) if bucket.dropped.load(std::sync::atomic::Ordering::Relaxed) => {
                    // As Couchbase Server: connections on a deleted bucket are closed.
                    tracing::info!(bucket = %bucket.name, "bucket dropped; closing the connection");
                    Flow::Disconnect
                }
                Some(bucket) => {
                    self.execute_data(shared, bucket, req, cmd, out, to);
                    Flow::Continue
                }
                None => {
                    self.fail_wire(out, to, Status::NoBucket, &[]);
                    Flow::Continue
                }
            },
        };
        if self.disconnect.get() {
            Flow::Disconnect
        } else {
            flow
        }
    }

    /// A DCP request ([`crate::dcp`]).
    fn execute_dcp(
        &mut self,
        shared: &Shared,
        req: &Request<'_>,
        op: Opcode,
        out: &mut BytesMut,
        to: ReplyTo,
    ) {
        use crate::dcp::{Producer, answer, not_a_producer};
        use epkv_protocol::dcp as wire;
        let Some(bucket) = self.bucket.clone() else {
            self.fail_wire(out, to, Status::NoBucket, &[]);
            return;
        };
        let vbid = req.header.vbucket;
        match op {
            Opcode::DcpOpen => {
                let Ok(open) = wire::DcpOpen::decode(req.extras) else {
                    return answer(out, to, Status::Einval);
                };
                if open.flags & wire::OPEN_PRODUCER == 0 {
                    // Consumers and notifiers: epkv has no DCP consumer yet.
                    return answer(out, to, Status::NotSupported);
                }
                if self.dcp.is_some() {
                    return answer(out, to, Status::Einval);
                }
                let Ok(name) = std::str::from_utf8(req.key) else {
                    return answer(out, to, Status::Einval);
                };
                tracing::info!(name, bucket = %bucket.name, flags = open.flags, "DCP producer opened");
                self.dcp = Some(Producer::new(
                    &shared.dcp,
                    &bucket.name,
                    bucket.engine.clone(),
                    name,
                    open.flags,
                    self.collections,
                ));
                answer(out, to, Status::Success);
            }
            Opcode::DcpGetFailoverLog => match bucket.engine.vbucket_seqnos(vbid) {
                Ok(_) => {
                    let body = crate::dcp::failover_log_body(&*bucket.engine, vbid);
                    put_success(out, to, Cas::ANY, Datatype::RAW, &[], &[], &body);
                }
                Err(e) => self.fail(shared, out, to, e, &[]),
            },
            Opcode::DcpNoop => answer(out, to, Status::Success),
            _ => {
                let Some(p) = self.dcp.as_mut() else {
                    return not_a_producer(out, to);
                };
                match op {
                    Opcode::DcpControl => {
                        let status = p.control(req.key, req.value);
                        answer(out, to, status);
                    }
                    Opcode::DcpStreamReq => {
                        let Ok(r) = wire::StreamReq::decode(req.extras) else {
                            return answer(out, to, Status::Einval);
                        };
                        let r = match crate::dcp::apply_stream_flags(&*bucket.engine, vbid, r) {
                            Ok(r) => r,
                            Err(s) => return answer(out, to, s),
                        };
                        let filter = if self.collections {
                            match crate::dcp::collection_filter(&*bucket.engine, req.value) {
                                Ok(f) => f,
                                Err(s) => return answer(out, to, s),
                            }
                        } else if req.value.is_empty() {
                            crate::dcp::StreamFilter::default()
                        } else {
                            return answer(out, to, Status::Einval);
                        };
                        let request = epkv_engine_api::DcpStreamRequest {
                            start_seqno: r.start_seqno,
                            end_seqno: r.end_seqno,
                            vbucket_uuid: r.vbucket_uuid,
                            snap_start_seqno: r.snap_start_seqno,
                            snap_end_seqno: r.snap_end_seqno,
                            sync_replication: false,
                            // A consumer without collections sees the default collection.
                            collections: filter
                                .collections
                                .or((!self.collections).then(|| vec![0])),
                            scope: filter.scope,
                        };
                        if let Err(s) = p.stream_req(out, to, vbid, request) {
                            answer(out, to, s);
                        }
                    }
                    Opcode::DcpCloseStream => {
                        let status = p.close_stream(vbid);
                        answer(out, to, status);
                    }
                    Opcode::DcpBufferAcknowledgement => match wire::BufferAck::decode(req.extras) {
                        // Not answered when it succeeds, as KV-Engine.
                        Ok(ack) => p.buffer_ack(ack.bytes),
                        Err(_) => answer(out, to, Status::Einval),
                    },
                    Opcode::DcpSeqnoAcknowledged => match wire::SeqnoAck::decode(req.extras) {
                        Ok(ack) => match p.seqno_acknowledged(vbid, ack.prepared_seqno) {
                            // Not answered when it succeeds, as KV-Engine.
                            Status::Success => {}
                            s => answer(out, to, s),
                        },
                        Err(_) => answer(out, to, Status::Einval),
                    },
                    // Messages only a consumer takes.
                    _ => answer(out, to, Status::NotSupported),
                }
            }
        }
    }

    /// HELLO: agrees to the requested features epkv implements, in the client's order.
    fn hello(
        &mut self,
        agent: &[u8],
        features: HelloFeatures<'_>,
        out: &mut BytesMut,
        to: ReplyTo,
    ) {
        self.vbucket_aware = true;
        self.mutation_seqno = false;
        self.json = false;
        self.xerror = false;
        self.snappy = false;
        self.xattr = false;
        self.collections = false;
        let mut agreed: Vec<Feature> = Vec::with_capacity(features.len());
        for f in features.known() {
            if !f.is_implemented() || agreed.contains(&f) {
                continue;
            }
            match f {
                Feature::TcpNoDelay => self.nodelay_change = Some(true),
                Feature::TcpDelay => self.nodelay_change = Some(false),
                Feature::MutationSeqno => self.mutation_seqno = true,
                Feature::Json => self.json = true,
                Feature::Xerror => self.xerror = true,
                Feature::Snappy => self.snappy = true,
                Feature::Xattr => self.xattr = true,
                Feature::Collections => self.collections = true,
                // AltRequestSupport, SyncReplication, SelectBucket and PreserveTtl are
                // informational (as in kv_engine): magic 0x08, durability and PreserveTtl
                // frames and SELECT_BUCKET are accepted either way.
                _ => {}
            }
            agreed.push(f);
        }
        let value: Vec<u8> = agreed
            .iter()
            .flat_map(|f| f.as_u16().to_be_bytes())
            .collect();
        let agent = String::from_utf8_lossy(agent).into_owned();
        tracing::debug!(
            agent = %agent,
            agreed = ?agreed.iter().map(|f| f.name()).collect::<Vec<_>>(),
            "HELLO"
        );
        self.agent = Some(agent);
        put_success(out, to, Cas::ANY, Datatype::RAW, &[], &[], &value);
    }

    /// SELECT_BUCKET: 0x24 Eaccess for a bucket that does not exist or that the
    /// connection may not use (kv_engine answers both alike, so names cannot be probed).
    fn select_bucket(&mut self, shared: &Shared, name: &[u8], out: &mut BytesMut, to: ReplyTo) {
        let found = std::str::from_utf8(name)
            .ok()
            .and_then(|n| shared.buckets.live(n).map(|e| (n, e)));
        let Some((name, live)) = found else {
            tracing::debug!(bucket = %String::from_utf8_lossy(name), user = self.user.as_deref().unwrap_or(""), "SELECT_BUCKET: no such bucket");
            put_error_text(out, to, Status::Eaccess);
            return;
        };
        if !self.may_use(shared, name) {
            tracing::info!(
                bucket = name,
                user = self.user.as_deref().unwrap_or(""),
                "SELECT_BUCKET refused: no access"
            );
            put_error_text(out, to, Status::Eaccess);
            return;
        }
        self.bucket = Some(SelectedBucket {
            name: Arc::from(name),
            engine: live.engine,
            dropped: live.dropped,
        });
        put_status(out, to, Status::Success, &[]);
    }

    /// Records a successful authentication. A selected bucket the new user may not use is
    /// deselected.
    pub(crate) fn set_user(&mut self, shared: &Shared, user: String) {
        self.user = Some(user);
        if let Some(b) = &self.bucket
            && !self.may_use(shared, &b.name)
        {
            self.bucket = None;
        }
    }

    /// Whether this connection may use bucket `name`: an authenticated user with access
    /// to it, or anyone for `default` in the open loopback mode.
    fn may_use(&self, shared: &Shared, name: &str) -> bool {
        match &self.user {
            Some(user) => shared.may_access(user, name),
            None => shared.open_default && name == DEFAULT_BUCKET,
        }
    }

    /// GET_CLUSTER_CONFIG: the selected bucket's config, or the global config when no
    /// bucket is selected; an empty value when the client already has this version, and
    /// KeyNotFound when the front end serves no map (as KV-Engine before ns_server sets
    /// one).
    fn cluster_config(
        &self,
        shared: &Shared,
        known_version: Option<(i64, i64)>,
        out: &mut BytesMut,
        to: ReplyTo,
    ) {
        let Some(version) = shared.cluster_version() else {
            self.fail_wire(out, to, Status::KeyEnoent, &[]);
            return;
        };
        if let Some(known) = known_version
            && known >= version
        {
            put_status(out, to, Status::Success, &[]);
            return;
        }
        let config = match &self.bucket {
            Some(b) => shared.bucket_config(&b.name, &*b.engine, self.local),
            None => shared.global_config(self.local),
        };
        let config = config.unwrap_or_default();
        put_success(
            out,
            to,
            Cas::ANY,
            self.datatype_out(Datatype::JSON),
            &[],
            &[],
            config.as_bytes(),
        );
    }

    /// Answers an engine outcome other than success. WouldBlock is not answered: the
    /// request waits for its background fetch and runs again (see [`BlockedOn`]).
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
            && let Some(config) = shared.bucket_config(&b.name, &*b.engine, self.local)
        {
            // The current map rides along, so the client need not ask for it (kv_engine
            // sends it; cxx parses it only when the JSON bit is set).
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

    /// Executes a request that needs a bucket.
    fn execute_data(
        &self,
        shared: &Shared,
        bucket: &SelectedBucket,
        req: &Request<'_>,
        cmd: Command<'_>,
        out: &mut BytesMut,
        to: ReplyTo,
    ) {
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
        let vbid = match doc_key {
            Some(_) if !self.vbucket_aware => vbucket_for_key(raw_key, NUM_VBUCKETS),
            _ => req.header.vbucket,
        };
        if let Some(e) = self.fail_next.take() {
            // The background fetch this request waited for failed.
            self.refetches.set(0);
            self.fail(shared, out, to, e, &[]);
            return;
        }
        self.execute_engine(shared, bucket, req, cmd, vbid, out, to);
        if !self.would_block.take() {
            self.refetches.set(0);
            return;
        }
        let n = self.refetches.get() + 1;
        if n > MAX_REFETCHES {
            self.refetches.set(0);
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
            vbid,
            key,
        }));
    }

    /// Runs a data request against the engine and answers it (unless the engine answers
    /// WouldBlock).
    #[expect(clippy::too_many_arguments, reason = "the parts of one request")]
    fn execute_engine(
        &self,
        shared: &Shared,
        bucket: &SelectedBucket,
        req: &Request<'_>,
        cmd: Command<'_>,
        vbid: Vbid,
        out: &mut BytesMut,
        to: ReplyTo,
    ) {
        let engine = &*bucket.engine;
        match cmd {
            Command::Get {
                key,
                with_key,
                quiet,
            } => match engine.get_with(vbid, key, &mut |item| {
                self.put_item(out, to, item, with_key);
            }) {
                Ok(()) => {}
                Err(EngineStatus::KeyNotFound) if quiet => {}
                Err(e) => {
                    let mut buf = DocKeyBuf::new();
                    let key = if with_key {
                        self.wire_key(key, &mut buf)
                    } else {
                        &[]
                    };
                    self.fail(shared, out, to, e, key);
                }
            },
            Command::GetReplica { key } => match engine.get_replica(vbid, key) {
                Ok(item) => self.put_item(out, to, &item.view(), false),
                Err(e) => self.fail(shared, out, to, e, &[]),
            },
            Command::Store {
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
            } => {
                if datatype.contains(Datatype::XATTR) && !self.xattr {
                    // Attributes from a client that did not negotiate them (kv_engine's
                    // validator refuses any datatype bit not agreed to).
                    self.fail_wire(out, to, Status::Einval, &[]);
                    return;
                }
                if datatype.contains(Datatype::SNAPPY) && !valid_snappy(self.snappy, value) {
                    // Compressed by a client that did not negotiate Snappy, or not valid
                    // Snappy: refused, never stored (as kv_engine's validator does).
                    self.fail_wire(out, to, Status::Einval, &[]);
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
                self.finish_mutation(shared, engine, out, to, vbid, result, sync_write, quiet);
            }
            Command::GetMeta {
                key,
                version,
                quiet,
            } => match engine.get_meta(vbid, key) {
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
                Err(e) => self.fail(shared, out, to, e, &[]),
            },
            Command::Subdoc {
                op,
                key,
                body,
                path_len,
                path_flags,
                doc_flags,
                expiry,
                cas,
                durability: d,
                preserve_ttl,
            } => {
                let (path, value) = body.split_at(path_len);
                let spec = Session::subdoc_specs(&[epkv_protocol::SubdocSpec {
                    opcode: op,
                    flags: path_flags,
                    path,
                    value,
                }]);
                if epkv_protocol::is_subdoc_lookup(op) {
                    self.subdoc_lookup(shared, engine, out, to, vbid, key, &spec, doc_flags, false);
                } else {
                    let req = crate::subdoc::MutationRequest {
                        key,
                        specs: spec,
                        doc_flags,
                        expiry,
                        cas,
                        durability: d,
                        preserve_ttl,
                        multi: false,
                    };
                    self.subdoc_mutate(shared, engine, out, to, vbid, &req);
                }
            }
            Command::SubdocMultiLookup {
                key,
                doc_flags,
                specs,
            } => {
                // The decoder checked the specs.
                let parsed = epkv_protocol::parse_specs(specs, false).unwrap_or_default();
                let specs = Session::subdoc_specs(&parsed);
                self.subdoc_lookup(shared, engine, out, to, vbid, key, &specs, doc_flags, true);
            }
            Command::SubdocMultiMutation {
                key,
                doc_flags,
                expiry,
                specs,
                cas,
                durability: d,
                preserve_ttl,
            } => {
                let parsed = epkv_protocol::parse_specs(specs, true).unwrap_or_default();
                let req = crate::subdoc::MutationRequest {
                    key,
                    specs: Session::subdoc_specs(&parsed),
                    doc_flags,
                    expiry,
                    cas,
                    durability: d,
                    preserve_ttl,
                    multi: true,
                };
                self.subdoc_mutate(shared, engine, out, to, vbid, &req);
            }
            Command::Observe { keys } => {
                let mut value = Vec::new();
                for entry in epkv_protocol::ObserveKeys::new(keys) {
                    // The decoder checked every entry.
                    let Ok((entry_vbid, wire)) = entry else { break };
                    let mut buf = DocKeyBuf::new();
                    let key = match self.engine_key(wire, &mut buf) {
                        Ok((key, _)) => key,
                        Err(status) => return self.fail_wire(out, to, status, &[]),
                    };
                    match engine.observe(entry_vbid, key) {
                        Ok((state, cas)) => {
                            let state = match state {
                                KeyState::NotPersisted => ObserveState::NotPersisted,
                                KeyState::Persisted => ObserveState::Persisted,
                                KeyState::NotFound => ObserveState::NotFound,
                                KeyState::LogicallyDeleted => ObserveState::LogicallyDeleted,
                            };
                            epkv_protocol::put_observe_entry(
                                &mut value, entry_vbid, wire, state, cas.0,
                            );
                        }
                        Err(e) => {
                            if e == EngineStatus::WouldBlock {
                                // Waits for this key's lookup, then runs the whole
                                // request again.
                                self.blocked_key.set(Some((entry_vbid, key.to_vec())));
                            }
                            self.fail(shared, out, to, e, &[]);
                            return;
                        }
                    }
                }
                put_success(out, to, Cas::ANY, Datatype::RAW, &[], &[], &value);
            }
            Command::Delete {
                key,
                cas,
                durability: d,
                quiet,
            } => {
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
                    Ok(info) if !self.vbucket_aware => Ok(MutationInfo {
                        cas: Cas::ANY,
                        ..info
                    }),
                    other => other,
                };
                self.finish_mutation(shared, engine, out, to, vbid, result, sync_write, quiet);
            }
            Command::Arithmetic {
                op,
                key,
                delta,
                initial,
                expiry,
                durability: d,
                quiet,
                ..
            } => {
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
                    (Ok((value, info)), true) => self.defer_reply(
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
                        let (extras, n) = self.mutation_extras(&info);
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
                    (Err(e), _) => self.fail(shared, out, to, e, &[]),
                }
            }
            Command::Flush { quiet } => match engine.flush() {
                Ok(()) if quiet => {}
                Ok(()) => put_status(out, to, Status::Success, &[]),
                Err(e) => self.fail(shared, out, to, e, &[]),
            },
            Command::Touch {
                key,
                expiry,
                durability: d,
            } => {
                let persist = persist_timeout(d);
                let result = if persist.is_some() && !engine.persistent() {
                    // Refused before anything changes, as the store commands are.
                    Err(EngineStatus::DurabilityInvalidLevel)
                } else {
                    engine.touch(vbid, key, expiry)
                };
                match (result, persist) {
                    (Ok(info), Some(timeout)) => self.defer_reply(
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
                    (Err(e), _) => self.fail(shared, out, to, e, &[]),
                }
            }
            Command::Gat {
                key, expiry, quiet, ..
            } => match engine.get_and_touch(vbid, key, expiry) {
                Ok(item) => self.put_item(out, to, &item.view(), false),
                Err(EngineStatus::KeyNotFound) if quiet => {}
                Err(e) => self.fail(shared, out, to, e, &[]),
            },
            Command::GetLocked {
                key,
                lock_timeout_secs,
            } => match engine.get_locked(vbid, key, lock_timeout_secs) {
                Ok(item) => self.put_item(out, to, &item.view(), false),
                Err(e) => self.fail(shared, out, to, e, &[]),
            },
            // KV-Engine's answers, body text included.
            Command::EvictKey { key } => match engine.evict_key(vbid, key) {
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
                Err(e) => self.fail(shared, out, to, e, &[]),
            },
            Command::UnlockKey { key, cas } => match engine.unlock(vbid, key, cas) {
                Ok(()) => put_status(out, to, Status::Success, &[]),
                Err(e) => self.fail(shared, out, to, e, &[]),
            },
            Command::SetVbucket { state } => match engine.set_vbucket_state(vbid, state) {
                Ok(()) => {
                    // The map changed: clients must see a newer revision.
                    shared.bump_cluster_rev();
                    put_status(out, to, Status::Success, &[]);
                }
                Err(e) => self.fail(shared, out, to, e, &[]),
            },
            Command::GetVbucket => match engine.vbucket_state(vbid) {
                Some(state) => {
                    let value = u32::from(state as u8).to_be_bytes();
                    put_success(out, to, Cas::ANY, Datatype::RAW, &[], &[], &value);
                }
                None => self.fail(shared, out, to, EngineStatus::NotMyVbucket, &[]),
            },
            Command::ObserveSeqno { vbucket_uuid } => {
                match engine.vbucket_seqnos(vbid) {
                    Ok(seqnos) => match observe_seqno_reply(vbid, vbucket_uuid, &seqnos) {
                        Some(value) => {
                            put_success(out, to, Cas::ANY, Datatype::RAW, &[], &[], &value);
                        }
                        // A UUID that is in no branch of this vBucket's history.
                        None => self.fail(shared, out, to, EngineStatus::KeyNotFound, &[]),
                    },
                    Err(e) => self.fail(shared, out, to, e, &[]),
                }
            }
            Command::GetCollectionsManifest => match engine.collections_manifest() {
                Ok(json) => put_success(
                    out,
                    to,
                    Cas::ANY,
                    self.datatype_out(Datatype::JSON),
                    &[],
                    &[],
                    json.as_bytes(),
                ),
                Err(e) => self.fail(shared, out, to, e, &[]),
            },
            Command::GetCollectionId { path } | Command::GetScopeId { path } => {
                let Ok(path) = std::str::from_utf8(path) else {
                    return self.fail_wire(out, to, Status::Einval, &[]);
                };
                let found = if matches!(cmd, Command::GetCollectionId { .. }) {
                    engine.collection_id(path)
                } else {
                    engine.scope_id(path)
                };
                match found {
                    // Extras: manifest uid (u64), then the id (u32).
                    Ok((uid, id)) => {
                        let mut extras = [0u8; 12];
                        extras[..8].copy_from_slice(&uid.to_be_bytes());
                        extras[8..].copy_from_slice(&id.to_be_bytes());
                        put_success(out, to, Cas::ANY, Datatype::RAW, &extras, &[], &[]);
                    }
                    Err(e) => self.fail(shared, out, to, e, &[]),
                }
            }
            // `Command` is non-exhaustive: a command the codec learns to decode before the
            // front end learns to execute it is unknown to this server.
            _ => put_error_text(out, to, Status::UnknownCommand),
        }
    }

    /// The datatype bits this connection may see.
    fn datatype_out(&self, dt: Datatype) -> Datatype {
        let mut keep = 0;
        if self.json {
            keep |= Datatype::JSON.0;
        }
        if self.snappy {
            keep |= Datatype::SNAPPY.0;
        }
        dt.intersect(Datatype(keep))
    }

    fn mutation_extras(&self, info: &MutationInfo) -> ([u8; 16], usize) {
        let mut extras = [0u8; 16];
        if !self.mutation_seqno {
            return (extras, 0);
        }
        extras[..8].copy_from_slice(&info.vbucket_uuid.to_be_bytes());
        extras[8..].copy_from_slice(&info.seqno.0.to_be_bytes());
        (extras, 16)
    }

    /// Hints the bucket's engine that `req`, the next request in the connection's buffer,
    /// will look its key up soon ([`epkv_engine_api::Engine::prefetch`]), so that its
    /// cache misses overlap the current request's work. With `key_too` false, only its
    /// vBucket ([`epkv_engine_api::Engine::prefetch_vbucket`], for the request after the
    /// next). Only the common key-value operations; anything else, or a key that does
    /// not decode, is left alone.
    pub(crate) fn prefetch(&self, req: &Request<'_>, key_too: bool) {
        let Some(b) = &self.bucket else {
            return;
        };
        let keyed = matches!(
            Opcode::from_u8(req.header.opcode),
            Some(
                Opcode::Get
                    | Opcode::GetQ
                    | Opcode::GetK
                    | Opcode::GetKQ
                    | Opcode::Set
                    | Opcode::SetQ
                    | Opcode::Add
                    | Opcode::AddQ
                    | Opcode::Replace
                    | Opcode::ReplaceQ
                    | Opcode::Delete
                    | Opcode::DeleteQ
            )
        );
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

    /// The engine key of a key from the wire (with the raw key, without its collection):
    /// the client's LEB128 collection prefix when it negotiated collections, else the
    /// default collection.
    ///
    /// # Errors
    /// EINVAL for a prefix that is not canonical LEB128 of at most 5 bytes, or with no key
    /// after it.
    fn engine_key<'k>(
        &self,
        wire: &'k [u8],
        buf: &'k mut DocKeyBuf,
    ) -> Result<(&'k [u8], &'k [u8]), Status> {
        if !self.collections {
            return Ok((
                doc_key::encode(doc_key::DEFAULT_COLLECTION, wire, buf),
                wire,
            ));
        }
        let (cid, n) = doc_key::leb128_decode(wire).ok_or(Status::Einval)?;
        let raw = &wire[n..];
        if raw.is_empty() {
            return Err(Status::Einval);
        }
        Ok((doc_key::encode(cid, raw, buf), raw))
    }

    /// The key to send back for engine key `key`: as the client sent it.
    fn wire_key<'k>(&self, key: &'k [u8], buf: &'k mut DocKeyBuf) -> &'k [u8] {
        let (cid, raw) = doc_key::decode(key);
        if !self.collections {
            return raw;
        }
        buf.put_wire(cid, raw)
    }

    fn put_item(&self, out: &mut BytesMut, to: ReplyTo, item: &ItemView<'_>, with_key: bool) {
        let mut buf = DocKeyBuf::new();
        let key: &[u8] = if with_key {
            self.wire_key(item.key, &mut buf)
        } else {
            &[]
        };
        if item.datatype.contains(Datatype::XATTR) {
            // GET returns the body only (uncompressed, as KV-Engine sends it).
            let plain = if item.datatype.contains(Datatype::SNAPPY) {
                snap::raw::Decoder::new()
                    .decompress_vec(item.value)
                    .map(std::borrow::Cow::Owned)
                    .unwrap_or_default()
            } else {
                std::borrow::Cow::Borrowed(item.value)
            };
            let body = epkv_engine_api::xattr::body(&plain, item.datatype);
            let dt = item
                .datatype
                .without(Datatype::SNAPPY)
                .without(Datatype::XATTR);
            put_success(
                out,
                to,
                item.cas,
                self.datatype_out(dt),
                &item.flags.to_be_bytes(),
                key,
                body,
            );
            return;
        }
        if item.datatype.contains(Datatype::SNAPPY) && !self.snappy {
            // Stored compressed, for a client that cannot read Snappy. The value was
            // checked when it was stored, so it decompresses.
            let plain = snap::raw::Decoder::new()
                .decompress_vec(item.value)
                .unwrap_or_default();
            let dt = item.datatype.without(Datatype::SNAPPY);
            put_success(
                out,
                to,
                item.cas,
                self.datatype_out(dt),
                &item.flags.to_be_bytes(),
                key,
                &plain,
            );
            return;
        }
        put_success(
            out,
            to,
            item.cas,
            self.datatype_out(item.datatype),
            &item.flags.to_be_bytes(),
            key,
            item.value,
        );
    }

    /// Answers a SET-family or DELETE result: at once, or, for a SyncWrite (the request
    /// had durability requirements), once the engine has committed or aborted it.
    #[expect(clippy::too_many_arguments, reason = "the parts of one mutation reply")]
    fn finish_mutation(
        &self,
        shared: &Shared,
        engine: &dyn Engine,
        out: &mut BytesMut,
        to: ReplyTo,
        vbid: Vbid,
        result: Result<MutationInfo, EngineStatus>,
        sync_write: bool,
        quiet: bool,
    ) {
        match (result, sync_write) {
            (Ok(info), true) => {
                self.defer_reply(
                    shared,
                    engine,
                    out,
                    to,
                    vbid,
                    (info, DurableReply::Mutation),
                    Wait::SyncWrite,
                    quiet,
                );
            }
            (Ok(_), false) if quiet => {}
            (Ok(info), false) => {
                let (extras, n) = self.mutation_extras(&info);
                put_success(out, to, info.cas, Datatype::RAW, &extras[..n], &[], &[]);
            }
            (Err(e), _) => self.fail(shared, out, to, e, &[]),
        }
    }

    /// STAT: one reply per stat, then an empty-key terminator; on error, only the error.
    /// `timings` is the front end's own; the other groups need a bucket.
    fn stats(&self, shared: &Shared, out: &mut BytesMut, to: ReplyTo, group: &[u8]) {
        let Ok(group) = std::str::from_utf8(group) else {
            put_error_text(out, to, Status::Einval);
            return;
        };
        let engine = self.bucket.as_ref().map(|b| &*b.engine);
        if group != "timings" && engine.is_none() {
            self.fail_wire(out, to, Status::NoBucket, &[]);
            return;
        }
        let mark = out.len();
        let mut sink = |k: &str, v: &str| {
            put_success(
                out,
                to,
                Cas::ANY,
                Datatype::RAW,
                &[],
                k.as_bytes(),
                v.as_bytes(),
            );
        };
        let result = match (group, engine) {
            ("timings", _) => {
                timings::emit(&shared.timings, &mut sink);
                Ok(())
            }
            ("", Some(engine)) => {
                default_stats(shared, &mut sink);
                engine.stats("", &mut sink)
            }
            ("dcp", Some(_)) => {
                if let Some(b) = &self.bucket {
                    shared.dcp.emit(&b.name, &mut sink);
                }
                Ok(())
            }
            (other, Some(engine)) => engine.stats(other, &mut sink),
            (_, None) => Err(EngineStatus::Internal),
        };
        match result {
            Ok(()) => put_status(out, to, Status::Success, &[]),
            Err(e) => {
                out.truncate(mark);
                self.fail(shared, out, to, e, &[]);
            }
        }
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

/// ADJUST_TIMEOFDAY: shifts the clock of every bucket (testing mode only).
fn adjust_timeofday(shared: &Shared, offset_secs: i64, out: &mut BytesMut, to: ReplyTo) {
    if !shared.config.testing {
        put_error_text(out, to, Status::NotSupported);
        return;
    }
    let result = shared
        .buckets
        .iter()
        .try_for_each(|(_, engine)| engine.adjust_time(offset_secs));
    match result {
        Ok(()) => put_status(out, to, Status::Success, &[]),
        Err(e) => put_status(out, to, engine_status_to_wire(e), &[]),
    }
}

/// Whether a value marked Snappy may be stored: the client negotiated Snappy and the
/// value decompresses (its length header is checked, then the whole stream).
fn valid_snappy(negotiated: bool, value: &[u8]) -> bool {
    negotiated
        && snap::raw::decompress_len(value).is_ok()
        && snap::raw::Decoder::new().decompress_vec(value).is_ok()
}

/// The front end's part of the default STAT group.
fn default_stats(shared: &Shared, sink: &mut dyn FnMut(&str, &str)) {
    let clock = &shared.config.clock;
    let uptime = clock
        .now()
        .saturating_duration_since(shared.started)
        .as_secs();
    sink("pid", &std::process::id().to_string());
    sink("uptime", &uptime.to_string());
    sink("time", &clock.unix_time().as_secs().to_string());
    sink("version", &shared.config.version);
    sink("curr_connections", &shared.conns.current().to_string());
    sink(
        "total_connections",
        &shared
            .conns
            .total
            .load(std::sync::atomic::Ordering::Relaxed)
            .to_string(),
    );
    sink(
        "rejected_conns",
        &shared
            .conns
            .rejected
            .load(std::sync::atomic::Ordering::Relaxed)
            .to_string(),
    );
    sink(
        "max_connections",
        &shared.config.max_connections.to_string(),
    );
    let conn_n =
        |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed).to_string();
    sink("total_tls_connections", &conn_n(&shared.conns.tls_total));
    sink(
        "tls_handshake_failures",
        &conn_n(&shared.conns.tls_failures),
    );
    if let Some(tls) = &shared.tls {
        sink("tls_cert_loads", &tls.generation().to_string());
        sink("tls_cert_load_failures", &tls.failures().to_string());
    }
    let auth = &shared.auth.stats;
    let n =
        |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed).to_string();
    sink("auth_cmds", &n(&auth.attempts));
    sink("auth_errors", &n(&auth.failures));
    sink("auth_throttled", &n(&auth.throttled));
    sink("auth_throttle_closes", &n(&auth.closes));
    sink("auth_busy", &n(&auth.busy));
    sink("threads", &shared.config.threads.to_string());
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
    fn a_minimum_level_raises_weaker_writes_and_keeps_the_clients_timeout() {
        use DurabilityLevel::{Majority, MajorityAndPersistOnMaster, PersistToMajority};
        let d = |level, timeout| Some(DurabilityRequirement { level, timeout });
        let t = Some(Duration::from_millis(1500));
        assert_eq!(with_min_level(None, Majority), d(Majority, None));
        assert_eq!(
            with_min_level(d(Majority, t), PersistToMajority),
            d(PersistToMajority, t)
        );
        assert_eq!(
            with_min_level(d(PersistToMajority, t), MajorityAndPersistOnMaster),
            d(PersistToMajority, t),
            "a stronger request stays"
        );
        // Only writes are raised: a GET and a sub-document lookup carry no durability.
        use epkv_protocol::Opcode;
        let req = |op: Opcode, extras: &[u8], key: &[u8], value: &[u8]| {
            epkv_protocol::RequestBuilder::new(op)
                .extras(extras)
                .key(key)
                .value(value)
                .to_vec()
                .unwrap()
        };
        let set = req(Opcode::Set, &[0; 8], b"k", b"v");
        let get = req(Opcode::Get, &[], b"k", b"");
        let lookup = req(Opcode::SubdocGet, &[0, 1, 0], b"k", b"a");
        for (raw, writes) in [(&set, true), (&get, false), (&lookup, false)] {
            let r = Request::parse(raw, &epkv_protocol::Limits::default()).unwrap();
            let mut cmd = Command::decode(&r).unwrap();
            assert_eq!(
                cmd.write_durability_mut().is_some(),
                writes,
                "{:?}",
                r.header.opcode
            );
        }
    }

    #[test]
    fn only_the_persist_levels_wait_with_the_clients_timeout_or_the_default() {
        let d = |level, timeout| Some(DurabilityRequirement { level, timeout });
        assert_eq!(persist_timeout(None), None);
        assert_eq!(persist_timeout(d(DurabilityLevel::Majority, None)), None);
        assert_eq!(
            persist_timeout(d(DurabilityLevel::PersistToMajority, None)),
            Some(DEFAULT_DURABILITY_TIMEOUT)
        );
        let t = Duration::from_millis(1500);
        assert_eq!(
            persist_timeout(d(DurabilityLevel::MajorityAndPersistOnMaster, Some(t))),
            Some(t)
        );
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
