//! Replication: a node's DCP consumer. For each bucket and each node holding the active
//! copy of some of this node's replica vBuckets, one task keeps a DCP connection to that
//! node, streams those vBuckets from where the replica is, and applies what arrives to
//! the replica ([`Engine::replicate`]).
//!
//! **A session.** Connect, HELLO (collections, so keys carry their collection), SASL PLAIN
//! when the cluster has credentials, SELECT_BUCKET, DCP_OPEN as a producer's client with
//! extended attributes, `connection_buffer_size` (acknowledged as it is consumed) and
//! NOOPs every [`NOOP_INTERVAL`], then one STREAM_REQ per vBucket from its high seqno and
//! newest failover uuid. A successful answer carries the active's failover log, which the
//! replica adopts; a rollback answer makes the replica start over
//! ([`Engine::reset_replica`]) and ask again from 0.
//!
//! **Snapshots.** Markers go to the replica too: at the end of a disk snapshot it
//! completes the prepares the snapshot's high completed seqno covers (see
//! `epkv_engine::replica`), which may move the high prepared seqno it acknowledges, so the
//! session acknowledges then as it does after a prepare.
//!
//! **Errors.** Any failure (connection refused, a closed connection, a stream that ended,
//! a refused change) ends the session; the task waits and starts a new one from where each
//! replica is ([`wait_after`]: 100 ms after a session that applied a change or stayed up
//! for [`STABLE_SESSION`], else twice the previous wait, up to 5 s). Memory pressure
//! (TempFail) is waited out change by change, without dropping the session. A change the
//! replica refuses (a seqno out of order) is logged and ends the session, so the stream
//! restarts from the replica's real position.

use bytes::BytesMut;
use epkv_engine_api::dcp::{CollectionEvent, DcpDocument};
use epkv_engine_api::{DcpEvent, Engine, EngineStatus};
use epkv_protocol::dcp::{self, DcpMessage, StreamReq};
use epkv_protocol::{
    Feature, Limits, Opcode, Request, RequestBuilder, Response, ResponseHeader, Status,
};
use epkv_types::{Vbid, doc_key};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

/// The NOOP interval asked of the active (seconds).
const NOOP_INTERVAL: &str = "10";
/// The flow-control window asked of the active.
const BUFFER_SIZE: usize = 4 << 20;
/// How long a connection attempt or a setup reply may take.
const SETUP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long after a stream ended or was refused while its vBucket is still wanted it is
/// asked for again.
const STREAM_AGAIN: Duration = Duration::from_millis(100);
/// Reconnection backoff ([`wait_after`]).
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A session up this long was healthy, whatever ended it ([`wait_after`]).
const STABLE_SESSION: Duration = Duration::from_secs(1);

/// What one replication task streams.
#[derive(Clone)]
pub(crate) struct Source {
    /// The bucket (same name on both nodes).
    pub(crate) bucket: String,
    /// This node's engine for it.
    pub(crate) engine: Arc<dyn Engine>,
    /// The node holding the active copies.
    pub(crate) addr: SocketAddr,
    /// The replica vBuckets whose active copy is there. The cluster changes the set as
    /// its maps change: the session opens and closes streams on the same connection
    /// (a rebalance changes it many times a second; a new connection each time would
    /// log in again each time).
    pub(crate) vbuckets: watch::Receiver<Vec<Vbid>>,
    /// SASL PLAIN credentials, when the cluster has them.
    pub(crate) credentials: Option<(String, String)>,
    /// The DCP connection name.
    pub(crate) name: String,
}

/// Runs replication from `source` until `stop` is raised.
pub(crate) async fn run(source: Source, mut stop: watch::Receiver<bool>) {
    let mut previous = None;
    loop {
        if *stop.borrow() {
            return;
        }
        let started = Instant::now();
        let mut applied = 0;
        let outcome = tokio::select! {
            r = session(&source, &mut applied) => r,
            _ = stop.changed() => return,
        };
        let Err(e) = outcome;
        let wait = wait_after(previous, started.elapsed(), applied);
        tracing::info!(bucket = %source.bucket, source = %source.addr, error = %e, applied, wait_ms = wait.as_millis(), "replication session ended; reconnecting");
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
        previous = Some(wait);
    }
}

/// The wait before the next session, after one that ran for `ran` and applied `applied`
/// changes, `previous` being the wait before it (`None` for the task's first).
///
/// A session that applied a change or stayed up for [`STABLE_SESSION`] was healthy, and
/// what ended it (the active restarting, a rebalance moving vBuckets, a stream the active
/// ended) is news: the next starts after [`BACKOFF_MIN`], so that a replica is back on
/// its stream within a SyncWrite's timeout. One that failed before either (connection
/// refused, a stream request refused at once) waits twice the previous wait, up to
/// [`BACKOFF_MAX`], so that a node that is down is not hammered.
fn wait_after(previous: Option<Duration>, ran: Duration, applied: u64) -> Duration {
    match previous {
        Some(p) if applied == 0 && ran < STABLE_SESSION => (p * 2).clamp(BACKOFF_MIN, BACKOFF_MAX),
        _ => BACKOFF_MIN,
    }
}

/// A DCP client connection: framing over a read buffer.
struct Conn {
    sock: TcpStream,
    buf: BytesMut,
    limits: Limits,
    /// Message bytes consumed and not yet acknowledged.
    unacked: usize,
}

/// A packet from the active: a response or a DCP message (a request).
enum Packet {
    Response {
        opcode: u8,
        status: u16,
        opaque: u32,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Message(BytesMut),
}

impl Conn {
    async fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.sock
            .write_all(bytes)
            .await
            .map_err(|e| format!("write: {e}"))
    }

    async fn next(&mut self) -> Result<Packet, String> {
        loop {
            if self.buf.len() >= 24 {
                let head: [u8; 24] = self.buf[..24].try_into().map_err(|_| "short header")?;
                let body = u32::from_be_bytes([head[8], head[9], head[10], head[11]]) as usize;
                if body > self.limits.max_packet_bytes as usize {
                    return Err(format!("packet of {body} bytes is over the limit"));
                }
                if self.buf.len() >= 24 + body {
                    let packet = self.buf.split_to(24 + body);
                    if head[0] == 0x81 || head[0] == 0x18 {
                        let h = ResponseHeader::decode(&head, &self.limits)
                            .map_err(|e| format!("bad response header: {e}"))?;
                        let key_at =
                            24 + usize::from(h.framing_extras_len) + usize::from(h.extras_len);
                        let at = key_at + usize::from(h.key_len);
                        return Ok(Packet::Response {
                            opcode: h.opcode,
                            status: h.status,
                            opaque: h.opaque,
                            key: packet.get(key_at..at).unwrap_or_default().to_vec(),
                            value: packet.get(at..).unwrap_or_default().to_vec(),
                        });
                    }
                    return Ok(Packet::Message(packet));
                }
            }
            self.buf.reserve(64 * 1024);
            let n = self
                .sock
                .read_buf(&mut self.buf)
                .await
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err("the active closed the connection".into());
            }
        }
    }

    /// Sends a setup request and waits for its response (ignoring DCP messages, which
    /// cannot come before a stream exists).
    async fn call(&mut self, req: RequestBuilder<'_>) -> Result<(u16, Vec<u8>), String> {
        let bytes = req.to_vec().map_err(|e| format!("encode: {e}"))?;
        self.send(&bytes).await?;
        let next = tokio::time::timeout(SETUP_TIMEOUT, async {
            loop {
                if let Packet::Response { status, value, .. } = self.next().await? {
                    return Ok::<_, String>((status, value));
                }
            }
        });
        next.await.map_err(|_| "setup reply timed out".to_owned())?
    }

    async fn expect_ok(&mut self, what: &str, req: RequestBuilder<'_>) -> Result<Vec<u8>, String> {
        match self.call(req).await? {
            (0, value) => Ok(value),
            (status, value) => Err(format!(
                "{what} answered {status:#x}: {}",
                String::from_utf8_lossy(&value)
            )),
        }
    }
}

/// The stream request for `vbid` from where the replica is.
fn stream_request(engine: &dyn Engine, vbid: Vbid) -> Result<StreamReq, String> {
    let seqnos = engine
        .vbucket_seqnos(vbid)
        .map_err(|e| format!("{vbid}: {e}"))?;
    let high = seqnos.high_seqno.0;
    let uuid = if high == 0 {
        0
    } else {
        history_uuid(&seqnos.failover_log, high)
    };
    Ok(StreamReq {
        flags: 0,
        reserved: 0,
        start_seqno: high,
        end_seqno: u64::MAX,
        vbucket_uuid: uuid,
        snap_start_seqno: high,
        snap_end_seqno: high,
    })
}

/// The uuid a stream request names: the newest failover branch that holds changes. A
/// branch that began at the high seqno holds none (an unclean restart starts one at the
/// persisted seqno, then the node was failed over before taking a write), so its history
/// is its parent's: naming the parent lets the active stream the difference instead of
/// rolling the replica back to 0 for a uuid it never saw (delta recovery).
fn history_uuid(log: &[epkv_engine_api::FailoverEntry], high: u64) -> u64 {
    log.iter()
        .find(|e| e.seqno.0 < high)
        .or_else(|| log.last())
        .map_or(0, |e| e.uuid)
}

fn opaque_of(vbid: Vbid) -> u32 {
    u32::from(vbid.0) + 1
}

/// The key as the engine stores it, from a DCP key with its collection prefix.
fn engine_key(wire: &[u8]) -> Result<Vec<u8>, String> {
    let (cid, n) = doc_key::leb128_decode(wire).ok_or("a DCP key without a collection id")?;
    let mut buf = doc_key::DocKeyBuf::new();
    Ok(doc_key::encode(cid, &wire[n..], &mut buf).to_vec())
}

fn document(meta: &dcp::DcpDocMeta, key: &[u8], value: &[u8]) -> Result<DcpDocument, String> {
    Ok(DcpDocument {
        key: engine_key(key)?,
        value: bytes::Bytes::copy_from_slice(value),
        seqno: meta.by_seqno,
        rev_seqno: meta.rev_seqno,
        cas: meta.cas.0,
        flags: meta.flags,
        expiry: meta.expiration,
        datatype: meta.datatype.0,
    })
}

/// Connects to `addr`, authenticates (when `credentials`) and selects `bucket`.
async fn connect(
    addr: SocketAddr,
    credentials: Option<&(String, String)>,
    bucket: &str,
) -> Result<Conn, String> {
    let sock = tokio::time::timeout(SETUP_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| "connect timed out".to_owned())?
        .map_err(|e| format!("connect: {e}"))?;
    let _ = sock.set_nodelay(true);
    let mut c = Conn {
        sock,
        buf: BytesMut::with_capacity(64 * 1024),
        limits: Limits::default(),
        unacked: 0,
    };
    let features: Vec<u8> = [Feature::Xerror, Feature::SelectBucket, Feature::Collections]
        .iter()
        .flat_map(|f| f.as_u16().to_be_bytes())
        .collect();
    c.expect_ok(
        "HELLO",
        RequestBuilder::new(Opcode::Hello)
            .key(b"epkv-replication")
            .value(&features),
    )
    .await?;
    if let Some((user, password)) = credentials {
        let plain = format!("\0{user}\0{password}");
        c.expect_ok(
            "SASL_AUTH",
            RequestBuilder::new(Opcode::SaslAuth)
                .key(b"PLAIN")
                .value(plain.as_bytes()),
        )
        .await?;
    }
    c.expect_ok(
        "SELECT_BUCKET",
        RequestBuilder::new(Opcode::SelectBucket).key(bucket.as_bytes()),
    )
    .await?;
    Ok(c)
}

/// The statistics group `group` of `bucket` on node `addr` (STAT, every key and value
/// until the closing empty key).
///
/// # Errors
/// The node cannot be reached, refuses, or does not finish within the setup timeout.
pub(crate) async fn fetch_stats(
    addr: SocketAddr,
    credentials: Option<&(String, String)>,
    bucket: &str,
    group: &str,
) -> Result<Vec<(String, String)>, String> {
    StatClient::connect(addr, credentials, bucket)
        .await?
        .stats(group)
        .await
}

/// A connection kept open to ask one bucket of one node for statistics again and again
/// (the rebalancer follows its moves' seqnos this way).
pub(crate) struct StatClient(Conn);

impl StatClient {
    /// Connects to `addr`, authenticates (when `credentials`) and selects `bucket`.
    ///
    /// # Errors
    /// The node cannot be reached or refuses.
    pub(crate) async fn connect(
        addr: SocketAddr,
        credentials: Option<&(String, String)>,
        bucket: &str,
    ) -> Result<StatClient, String> {
        Ok(StatClient(connect(addr, credentials, bucket).await?))
    }

    /// The statistics group `group` (STAT, every key and value until the closing empty
    /// key).
    ///
    /// # Errors
    /// The connection fails, the node refuses, or does not finish within the setup
    /// timeout (the connection is then unusable: drop it).
    pub(crate) async fn stats(&mut self, group: &str) -> Result<Vec<(String, String)>, String> {
        let c = &mut self.0;
        let req = RequestBuilder::new(Opcode::Stat)
            .key(group.as_bytes())
            .to_vec()
            .map_err(|e| format!("encode: {e}"))?;
        c.send(&req).await?;
        let mut out = Vec::new();
        tokio::time::timeout(SETUP_TIMEOUT, async {
            loop {
                if let Packet::Response {
                    status, key, value, ..
                } = c.next().await?
                {
                    if status != 0 {
                        return Err(format!(
                            "STAT {group} answered {status:#x}: {}",
                            String::from_utf8_lossy(&value)
                        ));
                    }
                    if key.is_empty() {
                        return Ok(());
                    }
                    out.push((
                        String::from_utf8_lossy(&key).into_owned(),
                        String::from_utf8_lossy(&value).into_owned(),
                    ));
                }
            }
        })
        .await
        .map_err(|_| format!("STAT {group} timed out"))??;
        Ok(out)
    }
}

/// The cluster map node `addr` serves for `bucket` (to learn the failovers it knows of).
///
/// # Errors
/// The node cannot be reached or answers something else than a map.
pub(crate) async fn fetch_map(
    addr: SocketAddr,
    credentials: Option<&(String, String)>,
    bucket: &str,
) -> Result<serde_json::Value, String> {
    let mut c = connect(addr, credentials, bucket).await?;
    let value = c
        .expect_ok(
            "GET_CLUSTER_CONFIG",
            RequestBuilder::new(Opcode::GetClusterConfig),
        )
        .await?;
    serde_json::from_slice(&value).map_err(|e| format!("cluster map: {e}"))
}

/// One session (see the module docs), until it fails; `applied` counts the changes it
/// applies to the replicas.
async fn session(source: &Source, applied: &mut u64) -> Result<Infallible, String> {
    let mut c = connect(source.addr, source.credentials.as_ref(), &source.bucket).await?;
    let open = dcp::DcpOpen {
        seqno: 0,
        flags: dcp::OPEN_PRODUCER | dcp::OPEN_INCLUDE_XATTRS,
    }
    .to_extras();
    c.expect_ok(
        "DCP_OPEN",
        RequestBuilder::new(Opcode::DcpOpen)
            .key(source.name.as_bytes())
            .extras(&open),
    )
    .await?;
    let buffer = BUFFER_SIZE.to_string();
    for (k, v) in [
        ("connection_buffer_size", buffer.as_str()),
        ("set_noop_interval", NOOP_INTERVAL),
        ("enable_noop", "true"),
        ("enable_sync_replication", "true"),
        ("enable_expiry_opcode", "true"),
    ] {
        c.expect_ok(
            "DCP_CONTROL",
            RequestBuilder::new(Opcode::DcpControl)
                .key(k.as_bytes())
                .value(v.as_bytes()),
        )
        .await?;
    }
    let mut set_rx = source.vbuckets.clone();
    let mut wanted: BTreeSet<Vbid> = set_rx.borrow_and_update().iter().copied().collect();
    for &vbid in &wanted {
        request_stream(&mut c, &*source.engine, vbid).await?;
    }
    tracing::info!(bucket = %source.bucket, source = %source.addr, vbuckets = wanted.len(), "replication streams requested");
    // vBuckets whose persistence moved past a PersistToMajority prepare: acknowledge.
    let (persisted_tx, mut persisted_rx) = tokio::sync::mpsc::unbounded_channel::<Vbid>();
    let mut acked: HashMap<Vbid, u64> = HashMap::new();
    let mut disk_ends: HashMap<Vbid, u64> = HashMap::new();
    // Streams to ask for again (a stream the active ended or refused while the vBucket
    // is still wanted: its map is changing), and when.
    let mut again: BTreeMap<Vbid, Instant> = BTreeMap::new();
    let mut following = true;
    loop {
        let next_again = again.values().min().copied();
        let packet = tokio::select! {
            p = c.next() => p?,
            Some(vbid) = persisted_rx.recv() => {
                acknowledge(&mut c, source, vbid, &mut acked).await?;
                continue;
            }
            changed = set_rx.changed(), if following => {
                if changed.is_err() {
                    // Nobody changes the set any more: keep the one there is.
                    following = false;
                    continue;
                }
                let now: BTreeSet<Vbid> = set_rx.borrow_and_update().iter().copied().collect();
                for &vbid in now.difference(&wanted) {
                    request_stream(&mut c, &*source.engine, vbid).await?;
                }
                for &vbid in wanted.difference(&now) {
                    close_stream(&mut c, vbid).await?;
                    again.remove(&vbid);
                    acked.remove(&vbid);
                    disk_ends.remove(&vbid);
                }
                wanted = now;
                continue;
            }
            () = sleep_until_opt(next_again) => {
                let due: Vec<Vbid> = again
                    .iter()
                    .filter(|(_, at)| **at <= Instant::now())
                    .map(|(v, _)| *v)
                    .collect();
                for vbid in due {
                    again.remove(&vbid);
                    if wanted.contains(&vbid) {
                        request_stream(&mut c, &*source.engine, vbid).await?;
                    }
                }
                continue;
            }
        };
        match packet {
            Packet::Response {
                opcode,
                status,
                opaque,
                value,
                ..
            } => {
                if opcode == Opcode::DcpStreamReq.as_u8() {
                    let vbid = Vbid(u16::try_from(opaque.saturating_sub(1)).unwrap_or(u16::MAX));
                    if !wanted.contains(&vbid) {
                        continue;
                    }
                    if !stream_answer(&mut c, source, vbid, status, &value).await? {
                        again.insert(vbid, Instant::now() + STREAM_AGAIN);
                    }
                } else if opcode == Opcode::DcpCloseStream.as_u8() {
                    // Closed, or already ended: either way it is gone.
                } else if status != 0 {
                    return Err(format!("the active answered {opcode:#x} with {status:#x}"));
                }
            }
            Packet::Message(packet) => {
                let len = packet.len();
                let done = apply(&mut c, source, &packet, &mut disk_ends, &wanted).await?;
                *applied += u64::from(done.change);
                if let Some(vbid) = done.ended {
                    again.insert(vbid, Instant::now() + STREAM_AGAIN);
                }
                if let Some(vbid) = done.acknowledge {
                    if let Some(seqno) = done.persist {
                        // A PersistToMajority prepare: acknowledge once it is on disk.
                        let tx = persisted_tx.clone();
                        let _ = source.engine.when_persisted(
                            vbid,
                            epkv_types::Seqno(seqno),
                            Box::new(move |_| {
                                let _ = tx.send(vbid);
                            }),
                        );
                    }
                    acknowledge(&mut c, source, vbid, &mut acked).await?;
                }
                c.unacked += len;
                if c.unacked >= BUFFER_SIZE / 2 {
                    let mut ack = Vec::new();
                    let bytes = u32::try_from(c.unacked).unwrap_or(u32::MAX);
                    dcp::encode_buffer_ack(&mut ack, 0, bytes).map_err(|e| e.to_string())?;
                    c.send(&ack).await?;
                    c.unacked = 0;
                }
            }
        }
    }
}

async fn request_stream(c: &mut Conn, engine: &dyn Engine, vbid: Vbid) -> Result<(), String> {
    let req = stream_request(engine, vbid)?;
    let mut bytes = Vec::new();
    dcp::encode_stream_req(&mut bytes, opaque_of(vbid), vbid, &req).map_err(|e| e.to_string())?;
    c.send(&bytes).await
}

/// DCP_CLOSE_STREAM for `vbid`: this node no longer replicates it from there.
async fn close_stream(c: &mut Conn, vbid: Vbid) -> Result<(), String> {
    let req = RequestBuilder::new(Opcode::DcpCloseStream)
        .vbucket(vbid)
        .opaque(opaque_of(vbid))
        .to_vec()
        .map_err(|e| format!("encode: {e}"))?;
    c.send(&req).await
}

/// The active's answer to a stream request. Returns false when the stream was refused
/// in a way that passes (the vBucket is not, or not yet, active there while the maps
/// change): ask again a little later.
async fn stream_answer(
    c: &mut Conn,
    source: &Source,
    vbid: Vbid,
    status: u16,
    value: &[u8],
) -> Result<bool, String> {
    match Status::from_u16(status) {
        Some(Status::Success) => {
            let log = dcp::decode_failover_log_body(value)
                .map_err(|_| format!("{vbid}: a malformed failover log"))?;
            source
                .engine
                .adopt_failover_log(vbid, &log)
                .map_err(|e| format!("{vbid}: cannot adopt the failover log: {e}"))?;
            Ok(true)
        }
        Some(Status::Rollback) => {
            tracing::info!(bucket = %source.bucket, %vbid, "the active asked the replica to roll back: starting it over");
            source
                .engine
                .reset_replica(vbid)
                .map_err(|e| format!("{vbid}: cannot roll back: {e}"))?;
            request_stream(c, &*source.engine, vbid).await?;
            Ok(true)
        }
        Some(Status::NotMyVbucket | Status::Etmpfail) => {
            tracing::debug!(bucket = %source.bucket, %vbid, status, "stream refused for now; asking again");
            Ok(false)
        }
        _ => Err(format!("{vbid}: stream request answered {status:#x}")),
    }
}

/// Sends DCP_SEQNO_ACKNOWLEDGED for `vbid` when its acknowledgeable high prepared seqno
/// moved.
async fn acknowledge(
    c: &mut Conn,
    source: &Source,
    vbid: Vbid,
    acked: &mut HashMap<Vbid, u64>,
) -> Result<(), String> {
    let Ok(hps) = source.engine.replica_prepared_seqno(vbid) else {
        return Ok(());
    };
    let last = acked.entry(vbid).or_insert(0);
    if hps <= *last {
        return Ok(());
    }
    *last = hps;
    let mut b = Vec::new();
    dcp::encode_seqno_ack(&mut b, 0, vbid, hps).map_err(|e| e.to_string())?;
    c.send(&b).await
}

/// What applying one DCP message did.
#[derive(Debug, Default)]
struct Applied {
    /// A change (an event with a seqno) reached the replica.
    change: bool,
    /// The vBucket whose acknowledgeable high prepared seqno may have moved: a prepare
    /// arrived, or a disk snapshot ended.
    acknowledge: Option<Vbid>,
    /// The seqno of a prepare whose level needs the replica's disk: acknowledged again
    /// once persisted.
    persist: Option<u64>,
    /// The active ended this vBucket's stream while it is still wanted (its state
    /// changed there): ask again.
    ended: Option<Vbid>,
}

/// Applies one DCP message to its replica vBucket. `disk_ends` holds, per vBucket, the
/// end of the disk snapshot it is receiving (to acknowledge at its end).
async fn apply(
    c: &mut Conn,
    source: &Source,
    packet: &[u8],
    disk_ends: &mut HashMap<Vbid, u64>,
    wanted: &BTreeSet<Vbid>,
) -> Result<Applied, String> {
    let req = Request::parse(packet, &c.limits).map_err(|e| format!("bad DCP message: {e}"))?;
    let vbid = req.header.vbucket;
    let msg = DcpMessage::decode(&req).map_err(|s| format!("bad DCP message: {s:?}"))?;
    if !wanted.contains(&vbid) && !matches!(msg, DcpMessage::Noop) {
        // Its stream is being closed: this node no longer replicates it from here.
        return Ok(Applied::default());
    }
    let event = match msg {
        DcpMessage::Noop => {
            let mut resp = Vec::new();
            Response::new(req.header.opcode, Status::Success, req.header.opaque)
                .encode(&mut resp)
                .map_err(|e| e.to_string())?;
            c.send(&resp).await?;
            return Ok(Applied::default());
        }
        DcpMessage::SnapshotMarker(m) => {
            // A marker may end the disk snapshot before it (or be an empty one).
            let after_disk = disk_ends.remove(&vbid).is_some();
            if m.high_completed_seqno.is_some() {
                disk_ends.insert(vbid, m.end_seqno);
            }
            let event = DcpEvent::SnapshotMarker {
                start: m.start_seqno,
                end: m.end_seqno,
                flags: m.flags,
                max_visible: m.max_visible_seqno.unwrap_or(m.end_seqno),
                high_completed: m.high_completed_seqno,
            };
            replicate(source, vbid, event).await?;
            return Ok(Applied {
                acknowledge: (after_disk || m.high_completed_seqno.is_some()).then_some(vbid),
                ..Applied::default()
            });
        }
        DcpMessage::Prepare {
            meta,
            key,
            value,
            state,
            level,
        } => {
            let persist = level == epkv_types::DurabilityLevel::PersistToMajority;
            let seqno = meta.by_seqno;
            let event = DcpEvent::Prepare {
                doc: document(&meta, key, value)?,
                deleted: state == dcp::DocumentState::Deleted,
                level: level as u8,
            };
            replicate(source, vbid, event).await?;
            if disk_ends.get(&vbid).is_some_and(|&end| seqno >= end) {
                disk_ends.remove(&vbid);
            }
            return Ok(Applied {
                change: true,
                acknowledge: Some(vbid),
                persist: persist.then_some(seqno),
                ended: None,
            });
        }
        DcpMessage::Commit {
            key,
            prepared_seqno,
            commit_seqno,
        } => DcpEvent::Commit {
            key: engine_key(key)?,
            prepared_seqno,
            commit_seqno,
        },
        DcpMessage::Abort {
            key,
            prepared_seqno,
            abort_seqno,
        } => DcpEvent::Abort {
            key: engine_key(key)?,
            prepared_seqno,
            abort_seqno,
        },
        DcpMessage::Mutation { meta, key, value } => {
            DcpEvent::Mutation(document(&meta, key, value)?)
        }
        DcpMessage::Deletion {
            meta, key, value, ..
        } => DcpEvent::Deletion(document(&meta, key, value)?),
        DcpMessage::Expiration {
            meta, key, value, ..
        } => DcpEvent::Expiration(document(&meta, key, value)?),
        DcpMessage::SystemEvent {
            by_seqno,
            event_id,
            version,
            key,
            value,
        } => DcpEvent::System {
            seqno: by_seqno,
            event: CollectionEvent::decode(event_id, version, key, value)
                .map_err(|e| format!("{vbid}: {e}"))?,
        },
        DcpMessage::StreamEnd { reason } => {
            tracing::debug!(bucket = %source.bucket, %vbid, reason, "the active ended a stream; asking again");
            disk_ends.remove(&vbid);
            return Ok(Applied {
                ended: Some(vbid),
                ..Applied::default()
            });
        }
        other => {
            tracing::debug!(%vbid, opcode = ?other.opcode(), "replication ignores a DCP message");
            return Ok(Applied::default());
        }
    };
    let seqno = event.seqno();
    replicate(source, vbid, event).await?;
    let ends_disk = seqno.is_some_and(|s| disk_ends.get(&vbid).is_some_and(|&end| s >= end));
    if ends_disk {
        disk_ends.remove(&vbid);
    }
    Ok(Applied {
        change: seqno.is_some(),
        acknowledge: ends_disk.then_some(vbid),
        persist: None,
        ended: None,
    })
}

/// Applies `event` to the replica, waiting out memory pressure (the stream pauses behind
/// it).
async fn replicate(source: &Source, vbid: Vbid, event: DcpEvent) -> Result<(), String> {
    let mut wait = Duration::from_millis(10);
    loop {
        match source.engine.replicate(vbid, event.clone()) {
            Ok(()) => return Ok(()),
            Err(EngineStatus::TempFail | EngineStatus::NoMemory) => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(format!("{vbid}: the replica refused a change: {e}")),
        }
    }
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::{BACKOFF_MAX, BACKOFF_MIN, STABLE_SESSION, wait_after};
    use std::time::Duration;

    #[test]
    fn the_backoff_grows_for_sessions_that_fail_at_once_and_resets_after_a_healthy_one() {
        let at_once = Duration::from_millis(3);
        // Failing at once: 100 ms, doubling, 5 s at most.
        let mut waits = Vec::new();
        let mut previous = None;
        for _ in 0..8 {
            let w = wait_after(previous, at_once, 0);
            waits.push(w.as_millis());
            previous = Some(w);
        }
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        // A session that applied a change, or stayed up long enough, resets it.
        assert_eq!(wait_after(Some(BACKOFF_MAX), at_once, 1), BACKOFF_MIN);
        assert_eq!(
            wait_after(Some(BACKOFF_MAX), STABLE_SESSION, 0),
            BACKOFF_MIN
        );
        assert_eq!(
            wait_after(
                Some(BACKOFF_MAX),
                STABLE_SESSION - Duration::from_millis(1),
                0
            ),
            BACKOFF_MAX
        );
        // And the next failure at once grows from there again.
        assert_eq!(wait_after(Some(BACKOFF_MIN), at_once, 0), 2 * BACKOFF_MIN);
    }

    /// The DCP messages of a fake active, on vBucket 0: a PersistToMajority prepare of
    /// `k1` at 1 from memory, then a disk snapshot 2..=5 whose high completed seqno is 1
    /// (the prepare's commit at 2 was replaced by the write of `k1` at 3): `k1` at 3, a
    /// Majority prepare of `k2` at 4, `k3` at 5.
    fn prepare_then_disk_snapshot() -> Vec<u8> {
        use epkv_protocol::dcp::{self, DcpDocMeta, DocumentState, SNAPSHOT_DISK, SNAPSHOT_MEMORY};
        use epkv_types::{Cas, Datatype, DurabilityLevel, Vbid};
        let (vb, opaque) = (Vbid(0), super::opaque_of(Vbid(0)));
        let meta = |seqno| DcpDocMeta {
            by_seqno: seqno,
            rev_seqno: 1,
            cas: Cas(seqno),
            flags: 0,
            expiration: 0,
            lock_time: 0,
            datatype: Datatype::RAW,
            nru: 0,
        };
        // Keys in the default collection (LEB128 id 0).
        let mut out = Vec::new();
        dcp::encode_snapshot_marker_v2(&mut out, opaque, vb, 1, 1, SNAPSHOT_MEMORY, 0, None)
            .unwrap();
        let (alive, persist) = (DocumentState::Alive, DurabilityLevel::PersistToMajority);
        dcp::encode_prepare(
            &mut out,
            opaque,
            vb,
            &meta(1),
            b"\0k1",
            b"durable",
            alive,
            persist,
        )
        .unwrap();
        dcp::encode_snapshot_marker_v2(&mut out, opaque, vb, 2, 5, SNAPSHOT_DISK, 5, Some(1))
            .unwrap();
        dcp::encode_mutation(&mut out, opaque, vb, &meta(3), b"\0k1", b"newer").unwrap();
        let majority = DurabilityLevel::Majority;
        dcp::encode_prepare(
            &mut out,
            opaque,
            vb,
            &meta(4),
            b"\0k2",
            b"v",
            alive,
            majority,
        )
        .unwrap();
        dcp::encode_mutation(&mut out, opaque, vb, &meta(5), b"\0k3", b"v").unwrap();
        out
    }

    /// A fake active on `listener` for one connection: answers every request, the
    /// stream request with a failover log and then `messages`; sends on `acks` the
    /// seqnos the replica acknowledges.
    async fn fake_active(
        listener: tokio::net::TcpListener,
        messages: Vec<u8>,
        acks: tokio::sync::mpsc::UnboundedSender<u64>,
    ) {
        use epkv_protocol::{Limits, Opcode, Request, Response, Status};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut sock, _) = listener.accept().await.unwrap();
        loop {
            let mut packet = vec![0u8; 24];
            if sock.read_exact(&mut packet).await.is_err() {
                return;
            }
            let body = u32::from_be_bytes(packet[8..12].try_into().unwrap()) as usize;
            packet.resize(24 + body, 0);
            sock.read_exact(&mut packet[24..]).await.unwrap();
            let req = Request::parse(&packet, &Limits::default()).unwrap();
            let opcode = req.header.opcode;
            if opcode == Opcode::DcpSeqnoAcknowledged.as_u8() {
                let _ = acks.send(u64::from_be_bytes(req.extras.try_into().unwrap()));
                continue;
            }
            if opcode == Opcode::DcpBufferAcknowledgement.as_u8() {
                continue;
            }
            let log = epkv_protocol::dcp::encode_failover_log_body(&[(7, 0)]);
            let stream = opcode == Opcode::DcpStreamReq.as_u8();
            let mut out = Vec::new();
            Response::new(opcode, Status::Success, req.header.opaque)
                .with_value(if stream { &log } else { &[] })
                .encode(&mut out)
                .unwrap();
            if stream {
                out.extend_from_slice(&messages);
            }
            sock.write_all(&out).await.unwrap();
        }
    }

    #[tokio::test]
    async fn the_end_of_a_disk_snapshot_completes_the_prepares_it_covers_and_is_acknowledged() {
        use epkv_engine_api::Engine as _;
        use epkv_types::{VBucketState, Vbid};
        let dir = tempfile::tempdir().unwrap();
        let mut persistence = epkv_engine::PersistenceConfig::new(dir.path());
        persistence.flusher = epkv_engine::FlusherMode::Manual;
        let replica = epkv_engine::Bucket::new(
            epkv_engine::BucketConfig {
                persistence: Some(persistence),
                ..epkv_engine::BucketConfig::default()
            },
            epkv_engine::EngineClock::System,
        )
        .unwrap();
        assert!(replica.wait_warmup(Duration::from_secs(60)));
        replica
            .set_vbucket_state(Vbid(0), VBucketState::Replica)
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let source = super::Source {
            bucket: "default".into(),
            engine: replica.clone(),
            addr: listener.local_addr().unwrap(),
            vbuckets: tokio::sync::watch::channel(vec![Vbid(0)]).1,
            credentials: None,
            name: "replication-test".into(),
        };
        let (acks_tx, mut acks) = tokio::sync::mpsc::unbounded_channel();
        let active = tokio::spawn(fake_active(listener, prepare_then_disk_snapshot(), acks_tx));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(super::run(source, stopped));
        // The PersistToMajority prepare, not on the replica's disk, holds back the
        // acknowledgement of the prepare at 4 until the snapshot's end completes it.
        let acked = tokio::time::timeout(Duration::from_secs(10), acks.recv()).await;
        assert_eq!(acked.ok().flatten(), Some(4));
        assert_eq!(replica.vbucket_seqnos(Vbid(0)).unwrap().high_seqno.0, 5);
        stop.send(true).unwrap();
        task.await.unwrap();
        active.abort();
        replica.shutdown();
    }

    #[tokio::test]
    async fn a_session_that_stayed_up_is_followed_by_a_new_one_at_once() {
        use tokio::time::Instant;
        // A node that closes its connections without a word: at once four times (the
        // waits reach 800 ms), then after longer than a stable session.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let source = super::Source {
            bucket: "default".into(),
            engine: epkv_engine::Bucket::new(
                epkv_engine::BucketConfig::default(),
                epkv_engine::EngineClock::System,
            )
            .unwrap(),
            addr: listener.local_addr().unwrap(),
            vbuckets: tokio::sync::watch::channel(vec![epkv_types::Vbid(0)]).1,
            credentials: None,
            name: "replication-test".into(),
        };
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(super::run(source, stopped));
        for _ in 0..4 {
            drop(listener.accept().await.unwrap());
        }
        let (held, _) = listener.accept().await.unwrap();
        tokio::time::sleep(STABLE_SESSION + Duration::from_millis(200)).await;
        drop(held);
        let closed = Instant::now();
        drop(listener.accept().await.unwrap());
        // 100 ms, not the 1.6 s the failures before it had grown the wait to.
        let gap = closed.elapsed();
        assert!(
            gap < Duration::from_millis(800),
            "reconnected after {gap:?}"
        );
        stop.send(true).unwrap();
        task.await.unwrap();
    }

    #[test]
    fn a_stream_names_the_newest_branch_that_holds_changes() {
        use epkv_engine_api::FailoverEntry;
        use epkv_types::Seqno;
        let e = |uuid, seqno| FailoverEntry {
            uuid,
            seqno: Seqno(seqno),
        };
        // Newest first: an empty branch at the high seqno (an unclean restart) is skipped.
        assert_eq!(super::history_uuid(&[e(3, 40), e(2, 10), e(1, 0)], 40), 2);
        assert_eq!(super::history_uuid(&[e(3, 30), e(2, 10), e(1, 0)], 40), 3);
        assert_eq!(super::history_uuid(&[e(1, 0)], 40), 1);
        assert_eq!(super::history_uuid(&[e(2, 40), e(1, 40)], 40), 1);
    }
}
