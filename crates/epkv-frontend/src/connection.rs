//! [`Connection`]: one client socket's read → execute → write loop.
//!
//! The loop is generic over the stream ([`Transport`]): a plain TCP socket or a TLS
//! session run exactly the same protocol code. One mutable borrow of the stream polls
//! both directions (writes first), so nothing is split or locked. A TLS session may keep
//! encrypted bytes after a write; the loop then flushes before it counts the replies as
//! sent (for TCP that check is a constant false and compiles away).
//!
//! The loop reads whatever the client sent into the input buffer, frames and executes
//! every complete request in it (in order), appends the replies to the output buffer and
//! writes them with as few writes as possible. Reading and writing overlap: while replies
//! are pending the loop also waits for more input, unless the output buffer holds more
//! than `output_buffer_limit` bytes. Then it stops reading and executing until the client
//! has read enough, so a client that sends but never reads holds at most about
//! `output_buffer_limit` + one reply + one packet of the server's memory.
//!
//! A write at a persist durability level leaves a [`PendingDurable`] behind: the loop then
//! stops executing (and reading) until the engine reports the write's seqno persisted or
//! the durability timeout passes, answers it, and goes on with the buffered requests, so
//! replies stay in request order. The worker thread serves its other connections
//! meanwhile.
//!
//! A request whose data is not in memory (an evicted value), or whose vBucket is pending
//! (a takeover in progress), is not answered when the engine says WouldBlock: the loop
//! leaves it in the input buffer, waits for the engine's background fetch or the
//! vBucket's state change ([`epkv_engine_api::Engine::when_fetched`]) without reading or
//! executing anything else, then executes it again, so replies stay in request order and
//! the worker thread serves its other connections meanwhile. A request that keeps
//! blocking is answered TMPFAIL after a few rounds (`dispatch::MAX_REFETCHES`).
//!
//! A connection that asked for cluster map notifications (HELLO 0x0d or 0x1f) also waits
//! for the front end's map version to move on, while its output buffer has room, and then
//! appends the notification (a server request) to the output, between whole replies. A
//! duplex client's replies to server requests (magic 0x83) are taken off the input and
//! dropped.
//!
//! Closing rules: a header that cannot be trusted (unknown magic, a packet over the size
//! limit, section lengths over the body length) closes the connection after the replies
//! already queued are written; a request that is well framed but invalid is answered
//! with an error status and the connection stays open.

use crate::dispatch::Flow;
use crate::durable::PendingDurable;
use crate::frontend::Shared;
use crate::session::{MapNotifications, Session};
use crate::stop_signal::StopSignal;
use crate::timings::WorkerTimings;
use crate::transport::Transport;
use crate::worker::ConnectionSlot;
use bytes::{Buf, BytesMut};
use epkv_engine_api::EngineStatus;
use epkv_protocol::{
    HEADER_LEN, Magic, Request, ResponseHeader, frame_hint, frame_len, response_frame_len,
    server_response_frame_len,
};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{oneshot, watch};

/// Bytes the input buffer is topped up to before each read.
const READ_CHUNK: usize = 16 * 1024;
/// A buffer grown past this is replaced by a small one once it is empty, so idle
/// connections do not keep large buffers.
const SHRINK_ABOVE: usize = 1024 * 1024;
/// How long a closing TLS connection waits to send its close_notify.
const CLOSE_NOTIFY_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Why a connection is closing (for the log).
#[derive(Debug, Clone, Copy)]
enum Closing {
    Quit,
    BadHeader,
    Shutdown,
    /// A reply had no code a client without XERROR understands.
    NoXerror,
    /// Too many failed authentication attempts in a row.
    AuthFailures,
}

/// A durable write being waited for, with the moment the connection stops waiting (a
/// durable TOUCH only; a SyncWrite's timeout is the engine's).
struct Waiting {
    pending: PendingDurable,
    deadline: Option<tokio::time::Instant>,
}

/// Resolves to the waited-for write's outcome: the engine's, or SyncWriteAmbiguous when
/// the connection's deadline passes first or the engine dropped the waiter (shutdown).
/// Never resolves without a write waiting.
async fn durable_outcome(waiting: &mut Option<Waiting>) -> Result<(), EngineStatus> {
    let ambiguous = Err(EngineStatus::SyncWriteAmbiguous);
    match waiting {
        Some(w) => match w.deadline {
            Some(deadline) => {
                match tokio::time::timeout_at(deadline, &mut w.pending.outcome).await {
                    Ok(Ok(outcome)) => outcome,
                    _ => ambiguous,
                }
            }
            None => (&mut w.pending.outcome).await.unwrap_or(ambiguous),
        },
        None => std::future::pending().await,
    }
}

/// Resolves with the outcome of the background fetch being waited for; never resolves
/// without one. A fetch the engine dropped (shutdown) reads as TempFail.
async fn fetch_outcome(
    fetching: &mut Option<oneshot::Receiver<Result<(), EngineStatus>>>,
) -> Result<(), EngineStatus> {
    match fetching {
        Some(rx) => rx.await.unwrap_or(Err(EngineStatus::TempFail)),
        None => std::future::pending().await,
    }
}

/// Resolves with the outcome of the authentication being waited for; never resolves
/// without one.
async fn auth_outcome(
    shared: &Shared,
    authing: &mut Option<crate::sasl::PendingAuth>,
) -> Option<crate::sasl::AuthOutcome> {
    match authing {
        Some(p) => p.outcome(shared).await,
        None => std::future::pending().await,
    }
}

/// Who a new connection is, apart from its stream.
pub(crate) struct Opened {
    /// The client's address.
    pub(crate) peer: SocketAddr,
    /// The address the client connected to.
    pub(crate) local: SocketAddr,
    /// Keeps the connection counted.
    pub(crate) slot: ConnectionSlot,
    /// The user a verified client certificate authenticated, if any.
    pub(crate) user: Option<String>,
}

/// One client connection over a plain or TLS stream.
pub(crate) struct Connection<S> {
    id: u64,
    peer: SocketAddr,
    stream: S,
    slot: ConnectionSlot,
    timings: Arc<WorkerTimings>,
    stop: watch::Receiver<bool>,
    session: Session,
}

impl<S: Transport> Connection<S> {
    /// A connection over `stream`, registered with the current (worker) runtime. Turns
    /// TCP_NODELAY on (replies are already batched per read, so Nagle's algorithm would
    /// only add latency; HELLO's TcpDelay turns it back off).
    pub(crate) fn new(
        id: u64,
        stream: S,
        opened: Opened,
        timings: Arc<WorkerTimings>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        let Opened {
            peer,
            local,
            slot,
            user,
        } = opened;
        let mut session = Session::new(slot.shared(), local, peer);
        if let Some(user) = user {
            session.audit(
                epkv_auth::audit::AuditEvent::new(
                    epkv_auth::audit::AuditKind::AuthSuccess,
                    epkv_auth::audit::Interface::Kv,
                )
                .user(&user)
                .detail("client certificate"),
            );
            session.set_user(slot.shared(), user);
        }
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
        }
        Self {
            id,
            peer,
            stream,
            slot,
            timings,
            stop,
            session,
        }
    }

    /// Serves the connection until the client leaves, QUITs, sends an untrusted header,
    /// idles out or the server shuts down.
    pub(crate) async fn run(self) {
        let Connection {
            id,
            peer,
            mut stream,
            slot,
            timings,
            stop,
            mut session,
        } = self;
        let shared: &Shared = slot.shared();
        let out_limit = shared.config.output_buffer_limit;
        let idle = shared.config.idle_timeout;
        tracing::debug!(conn = id, %peer, "connection opened");

        let mut st = LoopState::new(id, peer, idle);
        let idle_sleep = tokio::time::sleep(idle.unwrap_or(std::time::Duration::MAX / 4));
        tokio::pin!(idle_sleep);
        // A DCP producer's NOOP timer, armed once DCP_CONTROL enables NOOPs.
        let noop_sleep = tokio::time::sleep(std::time::Duration::MAX / 4);
        tokio::pin!(noop_sleep);
        let mut stop_signal = StopSignal::new(stop);

        let reason: &str = loop {
            // Whether execution stopped at the output limit with requests possibly left in
            // the input buffer.
            let backlog = st.is_free() && st.execute(shared, &timings, &mut session, &stream);
            st.write_now(&mut stream);
            if let Some(reason) = st.finished::<S>(backlog) {
                break reason;
            }
            if backlog && st.out.len() < out_limit {
                // The replies went out at once and more requests are buffered: execute
                // them, after letting the worker's other connections run.
                tokio::task::yield_now().await;
                continue;
            }
            let want_read = st.prepare_read(out_limit);
            let dcp_room =
                session.dcp.is_some() && st.closing.is_none() && st.out.len() < out_limit;
            st.arm_noop(&session, noop_sleep.as_mut());
            // Only a connection that asked for map notifications waits for map changes,
            // and only while its output has room: a change seen later is still pending
            // then, and several coalesce into one notification of the newest map.
            let map_room = session.map_notifications != MapNotifications::None
                && st.closing.is_none()
                && st.out.len() < out_limit;
            tokio::select! {
                biased;
                io = std::future::poll_fn(|cx| poll_io(
                    cx,
                    &mut stream,
                    &st.out,
                    S::BUFFERS_WRITES && st.unflushed,
                    want_read.then_some(&mut st.inbuf),
                )), if !st.out.is_empty() || want_read || (S::BUFFERS_WRITES && st.unflushed) => {
                    if let Some(reason) = st.on_io::<S>(io) {
                        break reason;
                    }
                },
                outcome = durable_outcome(&mut st.waiting), if st.waiting.is_some() => {
                    if let Some(w) = st.waiting.take()
                        && session.complete_durable(&mut st.out, w.pending, outcome)
                    {
                        st.closing = Some(Closing::NoXerror);
                    }
                },
                outcome = auth_outcome(shared, &mut st.authing), if st.authing.is_some() => {
                    if let Some(p) = st.authing.take()
                        && session.complete_auth(shared, &mut st.out, p, outcome)
                    {
                        st.closing = Some(Closing::AuthFailures);
                    }
                },
                outcome = fetch_outcome(&mut st.fetching), if st.fetching.is_some() => {
                    st.fetching = None;
                    // The blocked request is still first in the input buffer: the next
                    // pass executes it again, or answers the fetch's error.
                    session.fetch_done(outcome);
                },
                () = std::future::poll_fn(|cx| match session.dcp.as_mut() {
                    Some(p) => p.poll_ready(cx),
                    None => Poll::Pending,
                }), if dcp_room => {
                    if let Some(p) = session.dcp.as_mut() {
                        p.drain(&mut st.out, out_limit);
                    }
                },
                changed = session.map_changes.changed(), if map_room => match changed {
                    // Between two whole replies: execution appends whole replies only.
                    Ok(()) => session.notify_map_change(shared, &mut st.out),
                    // The front end (which holds the sender) is gone: nothing more to wait for.
                    Err(_) => session.map_notifications = MapNotifications::None,
                },
                () = &mut noop_sleep, if st.noop_interval.is_some() => {
                    if !st.noop_due(&mut session, noop_sleep.as_mut()) {
                        break "dcp noop not answered";
                    }
                },
                () = &mut idle_sleep, if idle.is_some() => {
                    if let Some(reason) = st.idle_due(idle_sleep.as_mut()) {
                        break reason;
                    }
                },
                () = &mut stop_signal, if st.closing.is_none() => st.closing = Some(Closing::Shutdown),
            }
        };
        if S::BUFFERS_WRITES && !matches!(reason, "read error" | "write error") {
            // Tell a TLS client the session ended (close_notify), without waiting long
            // for a client that stopped reading.
            let _ = tokio::time::timeout(CLOSE_NOTIFY_WAIT, stream.shutdown()).await;
        }
        tracing::debug!(conn = id, %peer, agent = session.agent.as_deref().unwrap_or(""), reason, "connection closed");
    }
}

/// The connection loop's state between passes: its buffers, why it is closing, and what
/// it is waiting for instead of executing requests.
struct LoopState {
    id: u64,
    peer: SocketAddr,
    /// The idle timeout, if any.
    idle: Option<std::time::Duration>,
    inbuf: BytesMut,
    out: BytesMut,
    closing: Option<Closing>,
    /// A durable write whose reply waits for its durability.
    waiting: Option<Waiting>,
    /// A background fetch the first buffered request waits for.
    fetching: Option<oneshot::Receiver<Result<(), EngineStatus>>>,
    /// A SASL_AUTH whose reply waits for its delay or the password-check pool.
    authing: Option<crate::sasl::PendingAuth>,
    /// The client closed its side.
    eof: bool,
    /// When the connection last read or wrote (kept only with an idle timeout).
    last_activity: tokio::time::Instant,
    /// The interval of the DCP producer's NOOPs the timer is armed for.
    noop_interval: Option<std::time::Duration>,
    /// Replies handed to a stream that buffers writes (TLS) but not yet flushed to the
    /// socket. Read only as `S::BUFFERS_WRITES && unflushed`, so for TCP every use is a
    /// constant the compiler drops.
    unflushed: bool,
}

impl LoopState {
    fn new(id: u64, peer: SocketAddr, idle: Option<std::time::Duration>) -> Self {
        Self {
            id,
            peer,
            idle,
            inbuf: BytesMut::with_capacity(READ_CHUNK),
            out: BytesMut::with_capacity(READ_CHUNK),
            closing: None,
            waiting: None,
            fetching: None,
            authing: None,
            eof: false,
            last_activity: tokio::time::Instant::now(),
            noop_interval: None,
            unflushed: false,
        }
    }

    /// Whether the connection may execute requests: it is not closing nor waiting for a
    /// durable write, a background fetch or an authentication.
    fn is_free(&self) -> bool {
        self.closing.is_none()
            && self.waiting.is_none()
            && self.fetching.is_none()
            && self.authing.is_none()
    }

    /// Notes a read or write, for the idle timeout.
    fn active(&mut self) {
        if self.idle.is_some() {
            self.last_activity = tokio::time::Instant::now();
        }
    }

    /// Executes the buffered requests, takes what the last one left waiting, lets a DCP
    /// producer fill the output and applies a TCP_NODELAY change. Returns whether
    /// execution stopped at the output limit (requests may be left in the input buffer).
    fn execute<S: Transport>(
        &mut self,
        shared: &Shared,
        timings: &WorkerTimings,
        session: &mut Session,
        stream: &S,
    ) -> bool {
        let out_limit = shared.config.output_buffer_limit;
        let (id, peer) = (self.id, self.peer);
        if let Some(c) = process(
            shared,
            timings,
            session,
            &mut self.inbuf,
            &mut self.out,
            id,
            peer,
        ) {
            self.closing = Some(c);
        }
        self.waiting = session.take_pending().map(|pending| Waiting {
            deadline: pending.timeout.map(|t| tokio::time::Instant::now() + t),
            pending,
        });
        self.authing = session.take_pending_auth();
        self.fetching = session.take_blocked().map(|b| {
            let (tx, rx) = oneshot::channel();
            let done: epkv_engine_api::FetchedCallback = Box::new(move |outcome| {
                // The connection may have gone; then nobody waits.
                let _ = tx.send(outcome);
            });
            match b.scan {
                Some(id) => b.engine.when_range_scan_ready(b.vbid, id, done),
                None => b.engine.when_fetched(b.vbid, &b.key, done),
            }
            rx
        });
        if let Some(p) = session.dcp.as_mut() {
            p.drain(&mut self.out, out_limit);
        }
        let backlog = self.out.len() >= out_limit;
        if let Some(nodelay) = session.nodelay_change.take()
            && let Err(e) = stream.set_nodelay(nodelay)
        {
            tracing::debug!(conn = id, error = %e, "cannot change TCP_NODELAY");
        }
        backlog
    }

    /// Writes (and for TLS flushes) at once what the socket takes (the common case),
    /// without a trip through the connection loop's select.
    fn write_now<S: Transport>(&mut self, stream: &mut S) {
        while !self.out.is_empty() {
            match poll_write_now(stream, &self.out) {
                Poll::Ready(Ok(n)) if n > 0 => {
                    self.out.advance(n);
                    self.unflushed = S::BUFFERS_WRITES;
                    self.active();
                }
                // Errors and a full socket are handled by the select's write branch.
                _ => break,
            }
        }
        if S::BUFFERS_WRITES && self.unflushed && self.out.is_empty() {
            // Errors and a full socket are handled by the select's flush branch.
            if let Poll::Ready(Ok(())) = poll_flush_now(stream) {
                self.unflushed = false;
            }
        }
    }

    /// Once every reply is out: resets the output buffer and returns why the connection
    /// closes, if it does now.
    fn finished<S: Transport>(&mut self, backlog: bool) -> Option<&'static str> {
        if !self.out.is_empty() || (S::BUFFERS_WRITES && self.unflushed) {
            return None;
        }
        if self.out.capacity() > SHRINK_ABOVE {
            self.out = BytesMut::with_capacity(READ_CHUNK);
        }
        rewind(&mut self.out);
        match self.closing {
            Some(Closing::Quit) => Some("quit"),
            Some(Closing::BadHeader) => Some("untrusted packet header"),
            Some(Closing::Shutdown) => Some("server shutdown"),
            Some(Closing::NoXerror) => Some("status not understood without XERROR"),
            Some(Closing::AuthFailures) => Some("too many failed authentications"),
            None if self.eof && !backlog && self.is_free() => Some("client closed"),
            None => None,
        }
    }

    /// Whether to read now; if so, makes room in the input buffer first.
    fn prepare_read(&mut self, out_limit: usize) -> bool {
        let want_read = self.is_free() && !self.eof && self.out.len() < out_limit;
        if want_read {
            let inbuf = &mut self.inbuf;
            if inbuf.is_empty() && inbuf.capacity() > SHRINK_ABOVE {
                *inbuf = BytesMut::with_capacity(READ_CHUNK);
            }
            rewind(inbuf);
            if inbuf.capacity() - inbuf.len() < READ_CHUNK / 4 {
                inbuf.reserve(READ_CHUNK);
            }
        }
        want_read
    }

    /// Re-arms the NOOP timer when a DCP producer's NOOPs were switched on or their
    /// interval changed: the first is due one interval from now.
    fn arm_noop(&mut self, session: &Session, timer: Pin<&mut tokio::time::Sleep>) {
        let interval = session
            .dcp
            .as_ref()
            .and_then(crate::dcp::Producer::noop_interval);
        if interval != self.noop_interval {
            self.noop_interval = interval;
            if let Some(every) = interval {
                timer.reset(tokio::time::Instant::now() + every);
            }
        }
    }

    /// The NOOP timer fired: sends the producer's NOOP and re-arms the timer. Returns
    /// false when the previous NOOP was not answered (the connection closes).
    fn noop_due(&mut self, session: &mut Session, timer: Pin<&mut tokio::time::Sleep>) -> bool {
        if let Some(p) = session.dcp.as_mut()
            && !p.noop_due(&mut self.out)
        {
            tracing::info!(conn = self.id, peer = %self.peer, "closing DCP connection: NOOP not answered");
            return false;
        }
        if let Some(every) = self.noop_interval {
            timer.reset(tokio::time::Instant::now() + every);
        }
        true
    }

    /// The idle timer fired: returns why the connection closes if it has been idle that
    /// long, else re-arms the timer for the idle timeout after the last activity.
    fn idle_due(&mut self, timer: Pin<&mut tokio::time::Sleep>) -> Option<&'static str> {
        let idle = self.idle?;
        let deadline = self.last_activity + idle;
        if tokio::time::Instant::now() >= deadline {
            tracing::info!(conn = self.id, peer = %self.peer, idle_secs = idle.as_secs(), "closing idle connection");
            return Some("idle timeout");
        }
        timer.reset(deadline);
        None
    }

    /// Takes in what one step of the stream did; returns why the connection closes, if
    /// it must.
    fn on_io<S: Transport>(&mut self, io: Io) -> Option<&'static str> {
        let (id, peer) = (self.id, self.peer);
        match io {
            Io::Wrote(Ok(0)) => return Some("write returned zero"),
            Io::Wrote(Ok(n)) => {
                self.out.advance(n);
                self.unflushed = S::BUFFERS_WRITES;
                self.active();
            }
            Io::Flushed(Ok(())) => self.unflushed = false,
            Io::Wrote(Err(e)) | Io::Flushed(Err(e)) => {
                tracing::debug!(conn = id, %peer, error = %e, "write failed");
                return Some("write error");
            }
            Io::Read(Ok(0)) => self.eof = true,
            Io::Read(Ok(_)) => self.active(),
            Io::Read(Err(e)) => {
                tracing::debug!(conn = id, %peer, error = %e, "read failed");
                return Some("read error");
            }
        }
        None
    }
}

/// What one step of the stream did.
enum Io {
    Wrote(std::io::Result<usize>),
    Flushed(std::io::Result<()>),
    Read(std::io::Result<usize>),
}

/// Polls the stream for whatever the loop wants, writes first: writing `out` when it is
/// not empty, else flushing when `flush`, then reading into `inbuf` when given. One
/// mutable borrow of the stream does both directions, so no stream has to be split (a
/// TLS session cannot be without a lock).
fn poll_io<S: Transport>(
    cx: &mut Context<'_>,
    stream: &mut S,
    out: &[u8],
    flush: bool,
    inbuf: Option<&mut BytesMut>,
) -> Poll<Io> {
    if !out.is_empty() {
        if let Poll::Ready(r) = Pin::new(&mut *stream).poll_write(cx, out) {
            return Poll::Ready(Io::Wrote(r));
        }
    } else if flush && let Poll::Ready(r) = Pin::new(&mut *stream).poll_flush(cx) {
        return Poll::Ready(Io::Flushed(r));
    }
    if let Some(inbuf) = inbuf {
        let read = stream.read_buf(inbuf);
        let read = std::pin::pin!(read);
        if let Poll::Ready(r) = read.poll(cx) {
            return Poll::Ready(Io::Read(r));
        }
    }
    Poll::Pending
}

/// Moves an empty buffer's start back to the start of its allocation.
///
/// Consuming a `BytesMut` (`advance`) moves its start forward, and it only moves back when
/// a `reserve` runs out of room: a connection's next read and next reply would go to
/// fresh memory every time, cycling through the whole buffer (16 KiB each way, per
/// connection) instead of reusing the few cache lines the last request and reply used.
/// memcached keeps its buffers similarly hot.
fn rewind(buf: &mut BytesMut) {
    if buf.is_empty() {
        // Asking for one byte more than the capacity in front of the start succeeds,
        // without allocating, exactly when the start has moved (and then rewinds it).
        let _ = buf.try_reclaim(buf.capacity() + 1);
    }
}

/// Tries one flush without waiting.
fn poll_flush_now<W: AsyncWrite + Unpin>(w: &mut W) -> Poll<std::io::Result<()>> {
    let mut cx = Context::from_waker(Waker::noop());
    Pin::new(w).poll_flush(&mut cx)
}

/// Tries one write without waiting.
fn poll_write_now<W: AsyncWrite + Unpin>(w: &mut W, buf: &[u8]) -> Poll<std::io::Result<usize>> {
    let mut cx = Context::from_waker(Waker::noop());
    Pin::new(w).poll_write(&mut cx, buf)
}

/// Executes every complete request in `inbuf` while the output stays under its limit.
/// Returns why the connection must close, if it must.
fn process(
    shared: &Shared,
    timings: &WorkerTimings,
    session: &mut Session,
    inbuf: &mut BytesMut,
    out: &mut BytesMut,
    id: u64,
    peer: SocketAddr,
) -> Option<Closing> {
    let out_limit = shared.config.output_buffer_limit;
    let limits = &shared.limits;
    let clock = &*shared.config.clock;
    let mut started = None;
    while out.len() < out_limit {
        if session.duplex && inbuf.first() == Some(&Magic::ServerResponse.as_u8()) {
            // A duplex client's reply to a server request: nothing waits for it
            // (kv_engine drops it unvalidated too).
            match take_response(session, inbuf, limits, id, peer, Reply::ToServerRequest) {
                Ok(()) => continue,
                Err(stop) => return stop,
            }
        }
        if session.dcp.is_some()
            && inbuf
                .first()
                .is_some_and(|&b| Magic::from_u8(b).is_some_and(Magic::is_client_response))
        {
            // A DCP consumer answering the producer (a NOOP's response).
            match take_response(session, inbuf, limits, id, peer, Reply::ToDcpProducer) {
                Ok(()) => continue,
                Err(stop) => return stop,
            }
        }
        let n = match frame_len(inbuf, limits) {
            Ok(Some(n)) => n,
            Ok(None) => return incomplete(inbuf, limits, id, peer),
            Err(e) => {
                tracing::info!(conn = id, %peer, error = %e, "closing connection: packet header cannot be trusted");
                inbuf.clear();
                return Some(Closing::BadHeader);
            }
        };
        let t0 = *started.get_or_insert_with(|| clock.now());
        // Hints for the next pipelined requests, so that their lookups' cache misses load
        // while this request runs: the vBucket of the one after next, then the next one's
        // key (which needs its vBucket's line to hash). A request not wholly in the
        // buffer yet does not parse, and gets no hint.
        if let Ok(next) = Request::parse(&inbuf[n..], limits) {
            if let Ok(after) = Request::parse(&inbuf[n + next.packet_len()..], limits) {
                session.prefetch(&after, false);
            }
            session.prefetch(&next, true);
        }
        let (opcode, flow) = match Request::parse(&inbuf[..n], limits) {
            Ok(req) => (req.header.opcode, session.execute(shared, &req, out)),
            // `frame_len` accepted this header, so this cannot happen; close if it does.
            Err(e) => {
                tracing::warn!(conn = id, %peer, error = %e, "framed packet does not parse");
                inbuf.clear();
                return Some(Closing::BadHeader);
            }
        };
        if session.is_blocked() {
            // Not answered: it stays in the buffer and runs again after its fetch (its
            // time is recorded then; the fetch's wait is in the engine's `ep_bg_wait`).
            return None;
        }
        let t1 = clock.now();
        timings.record(opcode, t1.saturating_duration_since(t0));
        started = Some(t1);
        inbuf.advance(n);
        match flow {
            Flow::Continue => {}
            Flow::Close => return Some(Closing::Quit),
            Flow::Disconnect => return Some(Closing::NoXerror),
        }
        if session.has_pending_auth() {
            // An authentication runs off the thread: nothing else runs until it is
            // answered.
            return None;
        }
        if session.has_pending() {
            // A durable write waits for persistence: nothing else runs until it is
            // answered.
            return None;
        }
    }
    None
}

/// What a response a client sent answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reply {
    /// A DCP consumer answering the producer (a NOOP's response): handed to it.
    ToDcpProducer,
    /// A duplex client answering a server request (magic 0x83): nothing waits for it
    /// (kv_engine drops it unvalidated too), so it is dropped.
    ToServerRequest,
}

/// Takes a response the client sent off the front of `inbuf` (see [`Reply`]). `Err` when
/// processing stops: with `None` when the response is not wholly buffered yet, with why
/// the connection closes when its header cannot be trusted.
fn take_response(
    session: &mut Session,
    inbuf: &mut BytesMut,
    limits: &epkv_protocol::Limits,
    id: u64,
    peer: SocketAddr,
    reply: Reply,
) -> Result<(), Option<Closing>> {
    let framed = match reply {
        Reply::ToDcpProducer => response_frame_len(inbuf, limits),
        Reply::ToServerRequest => server_response_frame_len(inbuf, limits),
    };
    match framed {
        Ok(Some(n)) => {
            if reply == Reply::ToDcpProducer
                && let (Some(head), Some(p)) =
                    (inbuf.first_chunk::<HEADER_LEN>(), session.dcp.as_mut())
                && let Ok(h) = ResponseHeader::decode(head, limits)
            {
                p.response(h.opcode, h.status);
            }
            inbuf.advance(n);
            Ok(())
        }
        Ok(None) => Err(None),
        Err(e) => {
            tracing::info!(conn = id, %peer, error = %e, "closing connection: response header cannot be trusted");
            inbuf.clear();
            Err(Some(Closing::BadHeader))
        }
    }
}

/// What processing does when `inbuf` holds no whole request: closes the connection for a
/// client that does not speak the binary protocol, else makes room for the request and
/// waits for the rest of it.
fn incomplete(
    inbuf: &mut BytesMut,
    limits: &epkv_protocol::Limits,
    id: u64,
    peer: SocketAddr,
) -> Option<Closing> {
    // A client speaking something else (the text protocol, HTTP, TLS) is told apart by
    // its first byte without waiting for a whole header.
    if let Some(&first) = inbuf.first()
        && !Magic::from_u8(first).is_some_and(Magic::is_client_request)
    {
        tracing::info!(conn = id, %peer, magic = first, "closing connection: not a binary protocol request");
        inbuf.clear();
        return Some(Closing::BadHeader);
    }
    // Make room for the whole packet now that its (trusted) size is known.
    if let Ok(need) = frame_hint(inbuf, limits)
        && need > inbuf.capacity()
    {
        inbuf.reserve(need - inbuf.len());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewind_puts_an_empty_buffers_start_back_and_leaves_others_alone() {
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        let start = buf.as_ptr();
        // Never moved: nothing to do, and no allocation.
        rewind(&mut buf);
        assert_eq!((buf.as_ptr(), buf.capacity()), (start, READ_CHUNK));
        buf.extend_from_slice(&[7; 600]);
        buf.advance(600);
        assert_ne!(buf.as_ptr(), start);
        rewind(&mut buf);
        assert_eq!((buf.as_ptr(), buf.capacity()), (start, READ_CHUNK));
        // Unread bytes stay where they are.
        buf.extend_from_slice(&[1, 2, 3]);
        buf.advance(1);
        let at = buf.as_ptr();
        rewind(&mut buf);
        assert_eq!((buf.as_ptr(), &buf[..]), (at, &[2u8, 3][..]));
    }
}
