//! [`Session`]: a connection's protocol state: the features HELLO negotiated, the user,
//! the selected bucket, and what the last request left waiting (a durable write, a
//! background fetch, an authentication).
//!
//! Executing requests is [`crate::dispatch`]'s, through the opcode table, and each family
//! of requests has its module under [`crate::handlers`].

use crate::access::Access;
use crate::buckets::DEFAULT_BUCKET;
use crate::durable::PendingDurable;
use crate::frontend::Shared;
use epkv_auth::AuditLog;
use epkv_auth::SaslServer;
use epkv_auth::audit::AuditEvent;
use epkv_engine_api::{Engine, EngineStatus, MutationInfo};
use epkv_protocol::Status;
use epkv_types::doc_key::{self, DocKeyBuf};
use epkv_types::{Datatype, Vbid};
use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::Arc;

/// A request the engine answered WouldBlock: the connection waits for the engine to fetch
/// `key`, or for `vbid` to leave the pending state (a takeover; [`Engine::when_fetched`]
/// parks the request), then executes the same request again.
pub(crate) struct BlockedOn {
    pub(crate) engine: Arc<dyn Engine>,
    pub(crate) vbid: Vbid,
    pub(crate) key: Vec<u8>,
    /// A range scan request waits for its scan instead
    /// ([`Engine::when_range_scan_ready`]).
    pub(crate) scan: Option<epkv_engine_api::RangeScanId>,
}

/// Which cluster map change notifications a connection asked for in HELLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MapNotifications {
    /// None: the client polls (GET_CLUSTER_CONFIG, NOT_MY_VBUCKET replies).
    None,
    /// ClustermapChangeNotificationBrief (0x1f): the version and bucket, without the map.
    Brief,
    /// ClustermapChangeNotification (0x0d): the version, bucket and map.
    Full,
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
    /// The client negotiated Duplex: the server may send it requests (magic 0x82), and
    /// its replies to them (magic 0x83) are accepted and ignored.
    pub(crate) duplex: bool,
    /// The cluster map change notifications the client negotiated.
    pub(crate) map_notifications: MapNotifications,
    /// The client negotiated DedupeNotMyVbucketClustermap: a NOT_MY_VBUCKET reply
    /// carries the map only if [`Self::map_sent`] is older than it.
    pub(crate) dedupe_nmvb: bool,
    /// The newest map version this connection was sent for its bucket (a notification, a
    /// NOT_MY_VBUCKET reply or GET_CLUSTER_CONFIG), or told it has; `None` after
    /// SELECT_BUCKET (kv_engine's pushed clustermap revno).
    pub(crate) map_sent: Cell<Option<(i64, i64)>>,
    /// Wakes the connection when the cluster map changes (the front end's
    /// [`Shared::map_version`]); waited on only with [`Self::map_notifications`] on.
    pub(crate) map_changes: tokio::sync::watch::Receiver<(i64, i64)>,
    /// The agent name the client gave in HELLO, for logs.
    pub(crate) agent: Option<String>,
    /// A TCP_NODELAY change HELLO asked for, applied by the connection after the batch.
    pub(crate) nodelay_change: Option<bool>,
    /// The address the client connected to (the cluster map names this node by it).
    pub(crate) local: SocketAddr,
    /// The bucket data requests go to; `None` until SELECT_BUCKET (or, in the open
    /// loopback mode, `default` from the start).
    pub(crate) bucket: Option<SelectedBucket>,
    /// The authenticated user, if any.
    pub(crate) user: Option<String>,
    /// A SASL exchange in progress (between SASL_AUTH answered 0x21 and SASL_STEP).
    pub(crate) sasl: Option<SaslServer>,
    /// The client's address and port: authentication failures are throttled by its
    /// address, the audit log records both.
    pub(crate) peer: SocketAddr,
    /// Where logins and refusals are recorded (a clone of the front end's).
    pub(crate) audit: AuditLog,
    /// Failed authentication attempts in a row on this connection.
    pub(crate) auth_failures: u32,
    /// A SASL_AUTH waiting for its source's delay or the password-check pool; the
    /// connection takes it after the request.
    pub(crate) pending_auth: Option<crate::sasl::PendingAuth>,
    /// A reply the client cannot understand was due: close after this batch.
    pub(crate) disconnect: Cell<bool>,
    /// A durable write waiting for persistence; the connection takes it after the request.
    pub(crate) pending: Cell<Option<PendingDurable>>,
    /// Set by `Session::fail` when the engine answered WouldBlock: the request is not
    /// answered, and [`Self::execute_data`] turns this into `blocked_on`.
    pub(crate) would_block: Cell<bool>,
    /// The last request waits for a background fetch and must be executed again; the
    /// connection takes it after the request.
    pub(crate) blocked_on: Cell<Option<BlockedOn>>,
    /// The key a multi-key request (OBSERVE) is blocked on, when not its document key.
    pub(crate) blocked_key: Cell<Option<(Vbid, Vec<u8>)>>,
    /// Consecutive WouldBlock answers to the request being executed.
    pub(crate) refetches: Cell<u8>,
    /// The outcome a failed background fetch left for the request executed next (the one
    /// that waited for it), answered instead of executing it again.
    pub(crate) fail_next: Cell<Option<EngineStatus>>,
    /// Set by DCP_OPEN: the connection is a DCP producer ([`crate::dcp`]).
    pub(crate) dcp: Option<crate::dcp::Producer>,
    /// What the user may do on the selected bucket: computed at authentication and
    /// SELECT_BUCKET, and again at the first request after the users changed.
    pub(crate) access: Access,
    /// The range scans this connection opened (closed with it).
    pub(crate) scans: crate::handlers::range_scan::Scans,
}

impl Session {
    /// Records `event` in the audit log with this connection's source address (and
    /// nothing when the log is off).
    pub(crate) fn audit(&self, event: AuditEvent<'_>) {
        if self.audit.is_enabled() {
            self.audit.record(&event.source(self.peer));
        }
    }

    /// A new connection's session. In the open mode it starts on the `default` bucket.
    pub(crate) fn new(shared: &Shared, local: SocketAddr, peer: SocketAddr) -> Self {
        let bucket = if shared.open_default {
            shared.buckets.live(DEFAULT_BUCKET).map(|b| SelectedBucket {
                name: Arc::from(DEFAULT_BUCKET),
                engine: b.engine,
                dropped: b.dropped,
            })
        } else {
            None
        };
        let access = Access::compute(shared, None, bucket.as_ref().map(|b| &*b.name));
        Self {
            vbucket_aware: false,
            mutation_seqno: false,
            json: false,
            xerror: false,
            snappy: false,
            xattr: false,
            collections: false,
            duplex: false,
            map_notifications: MapNotifications::None,
            dedupe_nmvb: false,
            map_sent: Cell::new(None),
            map_changes: shared.map_version.subscribe(),
            agent: None,
            nodelay_change: None,
            local,
            bucket,
            user: None,
            sasl: None,
            peer,
            audit: shared.config.audit.clone(),
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
            access,
            scans: crate::handlers::range_scan::Scans::default(),
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

    /// Records a successful authentication (SASL or a TLS client certificate) and
    /// computes the user's privileges. A selected bucket the new user may not use is
    /// deselected.
    pub(crate) fn set_user(&mut self, shared: &Shared, user: String) {
        self.user = Some(user);
        self.refresh_access(shared);
        if self.bucket.is_some() && !self.access.usable() {
            self.bucket = None;
            self.refresh_access(shared);
        }
    }

    /// Computes the connection's privileges again, for its user and selected bucket as
    /// they are now (after authentication, SELECT_BUCKET, or a change of the users).
    pub(crate) fn refresh_access(&mut self, shared: &Shared) {
        self.access = Access::compute(
            shared,
            self.user.as_deref(),
            self.bucket.as_ref().map(|b| &*b.name),
        );
    }

    /// The datatype bits this connection may see.
    pub(crate) fn datatype_out(&self, dt: Datatype) -> Datatype {
        let mut keep = 0;
        if self.json {
            keep |= Datatype::JSON.0;
        }
        if self.snappy {
            keep |= Datatype::SNAPPY.0;
        }
        dt.intersect(Datatype(keep))
    }

    /// The extras of a mutation reply: the vBucket UUID and seqno when the client
    /// negotiated MutationSeqno (the length says how many bytes to send).
    pub(crate) fn mutation_extras(&self, info: &MutationInfo) -> ([u8; 16], usize) {
        let mut extras = [0u8; 16];
        if !self.mutation_seqno {
            return (extras, 0);
        }
        extras[..8].copy_from_slice(&info.vbucket_uuid.to_be_bytes());
        extras[8..].copy_from_slice(&info.seqno.0.to_be_bytes());
        (extras, 16)
    }

    /// The engine key of a key from the wire (with the raw key, without its collection):
    /// the client's LEB128 collection prefix when it negotiated collections, else the
    /// default collection.
    ///
    /// # Errors
    /// EINVAL for a prefix that is not canonical LEB128 of at most 5 bytes, or with no key
    /// after it.
    pub(crate) fn engine_key<'k>(
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
    pub(crate) fn wire_key<'k>(&self, key: &'k [u8], buf: &'k mut DocKeyBuf) -> &'k [u8] {
        let (cid, raw) = doc_key::decode(key);
        if !self.collections {
            return raw;
        }
        buf.put_wire(cid, raw)
    }
}
