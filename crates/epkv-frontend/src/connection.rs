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
//! A request whose data is not in memory (an evicted value) is not answered when the engine
//! says WouldBlock: the loop leaves it in the input buffer, waits for the engine's
//! background fetch ([`epkv_engine_api::Engine::when_fetched`]) without reading or
//! executing anything else, then executes it again, so replies stay in request order and
//! the worker thread serves its other connections meanwhile.
//!
//! Closing rules: a header that cannot be trusted (unknown magic, a packet over the size
//! limit, section lengths over the body length) closes the connection after the replies
//! already queued are written; a request that is well framed but invalid is answered
//! with an error status and the connection stays open.

use crate::dispatch::Flow;
use crate::durable::PendingDurable;
use crate::frontend::Shared;
use crate::session::Session;
use crate::timings::WorkerTimings;
use crate::transport::Transport;
use crate::worker::ConnectionSlot;
use bytes::{Buf, BytesMut};
use epkv_engine_api::EngineStatus;
use epkv_protocol::{
    HEADER_LEN, Magic, Request, ResponseHeader, frame_hint, frame_len, response_frame_len,
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
        let mut session = Session::new(slot.shared(), local, peer.ip());
        if let Some(user) = user {
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

        let mut inbuf = BytesMut::with_capacity(READ_CHUNK);
        let mut out = BytesMut::with_capacity(READ_CHUNK);
        let mut closing: Option<Closing> = None;
        let mut waiting: Option<Waiting> = None;
        let mut fetching: Option<oneshot::Receiver<Result<(), EngineStatus>>> = None;
        let mut authing: Option<crate::sasl::PendingAuth> = None;
        let mut eof = false;
        let mut last_activity = tokio::time::Instant::now();
        let idle_sleep = tokio::time::sleep(idle.unwrap_or(std::time::Duration::MAX / 4));
        tokio::pin!(idle_sleep);
        // A DCP producer's NOOP timer, armed once DCP_CONTROL enables NOOPs.
        let noop_sleep = tokio::time::sleep(std::time::Duration::MAX / 4);
        tokio::pin!(noop_sleep);
        let mut noop_interval: Option<std::time::Duration> = None;
        let mut stop_signal = StopSignal::new(stop);
        // Replies handed to a stream that buffers writes (TLS) but not yet flushed to the
        // socket. Always false for TCP, where the compiler drops every use.
        let mut unflushed = false;

        let reason: &str = loop {
            // Whether execution stopped at the output limit with requests possibly left in
            // the input buffer.
            let mut backlog = false;
            if closing.is_none() && waiting.is_none() && fetching.is_none() && authing.is_none() {
                if let Some(c) = process(
                    shared,
                    &timings,
                    &mut session,
                    &mut inbuf,
                    &mut out,
                    id,
                    peer,
                ) {
                    closing = Some(c);
                }
                waiting = session.take_pending().map(|pending| Waiting {
                    deadline: pending.timeout.map(|t| tokio::time::Instant::now() + t),
                    pending,
                });
                authing = session.take_pending_auth();
                fetching = session.take_blocked().map(|b| {
                    let (tx, rx) = oneshot::channel();
                    b.engine.when_fetched(
                        b.vbid,
                        &b.key,
                        Box::new(move |outcome| {
                            // The connection may have gone; then nobody waits.
                            let _ = tx.send(outcome);
                        }),
                    );
                    rx
                });
                if let Some(p) = session.dcp.as_mut() {
                    p.drain(&mut out, out_limit);
                }
                backlog = out.len() >= out_limit;
                if let Some(nodelay) = session.nodelay_change.take()
                    && let Err(e) = stream.set_nodelay(nodelay)
                {
                    tracing::debug!(conn = id, error = %e, "cannot change TCP_NODELAY");
                }
            }
            // Write at once if the socket takes it (the common case), without a trip
            // through the select below.
            while !out.is_empty() {
                match poll_write_now(&mut stream, &out) {
                    Poll::Ready(Ok(n)) if n > 0 => {
                        out.advance(n);
                        unflushed = S::BUFFERS_WRITES;
                        if idle.is_some() {
                            last_activity = tokio::time::Instant::now();
                        }
                    }
                    // Errors and a full socket are handled by the select's write branch.
                    _ => break,
                }
            }
            if S::BUFFERS_WRITES && unflushed && out.is_empty() {
                // Errors and a full socket are handled by the select's flush branch.
                if let Poll::Ready(Ok(())) = poll_flush_now(&mut stream) {
                    unflushed = false;
                }
            }
            if out.is_empty() && !unflushed {
                if out.capacity() > SHRINK_ABOVE {
                    out = BytesMut::with_capacity(READ_CHUNK);
                }
                rewind(&mut out);
                match closing {
                    Some(Closing::Quit) => break "quit",
                    Some(Closing::BadHeader) => break "untrusted packet header",
                    Some(Closing::Shutdown) => break "server shutdown",
                    Some(Closing::NoXerror) => break "status not understood without XERROR",
                    Some(Closing::AuthFailures) => break "too many failed authentications",
                    None if eof
                        && !backlog
                        && waiting.is_none()
                        && fetching.is_none()
                        && authing.is_none() =>
                    {
                        break "client closed";
                    }
                    None => {}
                }
            }
            if backlog && out.len() < out_limit {
                // The replies went out at once and more requests are buffered: execute
                // them, after letting the worker's other connections run.
                tokio::task::yield_now().await;
                continue;
            }
            let want_read = closing.is_none()
                && waiting.is_none()
                && fetching.is_none()
                && authing.is_none()
                && !eof
                && out.len() < out_limit;
            if want_read {
                if inbuf.is_empty() && inbuf.capacity() > SHRINK_ABOVE {
                    inbuf = BytesMut::with_capacity(READ_CHUNK);
                }
                rewind(&mut inbuf);
                if inbuf.capacity() - inbuf.len() < READ_CHUNK / 4 {
                    inbuf.reserve(READ_CHUNK);
                }
            }
            let dcp_room = session.dcp.is_some() && closing.is_none() && out.len() < out_limit;
            let interval = session
                .dcp
                .as_ref()
                .and_then(crate::dcp::Producer::noop_interval);
            if interval != noop_interval {
                // NOOPs switched on or their interval changed: the first is due one
                // interval from now.
                noop_interval = interval;
                if let Some(every) = interval {
                    noop_sleep
                        .as_mut()
                        .reset(tokio::time::Instant::now() + every);
                }
            }
            tokio::select! {
                biased;
                io = std::future::poll_fn(|cx| poll_io(
                    cx,
                    &mut stream,
                    &out,
                    S::BUFFERS_WRITES && unflushed,
                    want_read.then_some(&mut inbuf),
                )), if !out.is_empty() || want_read || (S::BUFFERS_WRITES && unflushed) => match io {
                    Io::Wrote(Ok(0)) => break "write returned zero",
                    Io::Wrote(Ok(n)) => {
                        out.advance(n);
                        unflushed = S::BUFFERS_WRITES;
                        if idle.is_some() {
                            last_activity = tokio::time::Instant::now();
                        }
                    }
                    Io::Flushed(Ok(())) => unflushed = false,
                    Io::Wrote(Err(e)) | Io::Flushed(Err(e)) => {
                        tracing::debug!(conn = id, %peer, error = %e, "write failed");
                        break "write error";
                    }
                    Io::Read(Ok(0)) => eof = true,
                    Io::Read(Ok(_)) => {
                        if idle.is_some() {
                            last_activity = tokio::time::Instant::now();
                        }
                    }
                    Io::Read(Err(e)) => {
                        tracing::debug!(conn = id, %peer, error = %e, "read failed");
                        break "read error";
                    }
                },
                outcome = durable_outcome(&mut waiting), if waiting.is_some() => {
                    if let Some(w) = waiting.take()
                        && session.complete_durable(&mut out, w.pending, outcome)
                    {
                        closing = Some(Closing::NoXerror);
                    }
                },
                outcome = auth_outcome(shared, &mut authing), if authing.is_some() => {
                    if let Some(p) = authing.take()
                        && session.complete_auth(shared, &mut out, p, outcome)
                    {
                        closing = Some(Closing::AuthFailures);
                    }
                },
                outcome = fetch_outcome(&mut fetching), if fetching.is_some() => {
                    fetching = None;
                    // The blocked request is still first in the input buffer: the next
                    // pass executes it again, or answers the fetch's error.
                    session.fetch_done(outcome);
                },
                () = std::future::poll_fn(|cx| match session.dcp.as_mut() {
                    Some(p) => p.poll_ready(cx),
                    None => Poll::Pending,
                }), if dcp_room => {
                    if let Some(p) = session.dcp.as_mut() {
                        p.drain(&mut out, out_limit);
                    }
                },
                () = &mut noop_sleep, if noop_interval.is_some() => {
                    if let Some(p) = session.dcp.as_mut()
                        && !p.noop_due(&mut out)
                    {
                        tracing::info!(conn = id, %peer, "closing DCP connection: NOOP not answered");
                        break "dcp noop not answered";
                    }
                    if let Some(every) = noop_interval {
                        noop_sleep.as_mut().reset(tokio::time::Instant::now() + every);
                    }
                },
                () = &mut idle_sleep, if idle.is_some() => {
                    let Some(idle) = idle else { continue };
                    let deadline = last_activity + idle;
                    if tokio::time::Instant::now() >= deadline {
                        tracing::info!(conn = id, %peer, idle_secs = idle.as_secs(), "closing idle connection");
                        break "idle timeout";
                    }
                    idle_sleep.as_mut().reset(deadline);
                },
                () = &mut stop_signal, if closing.is_none() => closing = Some(Closing::Shutdown),
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

/// Resolves once the front end is stopping (the watch channel says true or its sender is
/// gone).
///
/// It is polled on every pass of the connection loop, so it is made cheap: once a poll
/// has registered the task's waker with the channel, later polls by the same task only
/// compare the channel's version (one atomic load) until a stop is actually signalled;
/// polling the channel's wait future every time took a lock per pass.
struct StopSignal {
    peek: watch::Receiver<bool>,
    wait: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// The waker the wait future last registered, if a poll left it pending.
    armed: Option<Waker>,
}

impl StopSignal {
    fn new(stop: watch::Receiver<bool>) -> Self {
        let mut rx = stop.clone();
        Self {
            peek: stop,
            wait: Box::pin(async move {
                if !*rx.borrow_and_update() {
                    let _ = rx.changed().await;
                }
            }),
            armed: None,
        }
    }
}

impl Future for StopSignal {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(w) = &self.armed
            && w.will_wake(cx.waker())
            && matches!(self.peek.has_changed(), Ok(false))
        {
            return Poll::Pending;
        }
        let polled = self.wait.as_mut().poll(cx);
        self.armed = polled.is_pending().then(|| cx.waker().clone());
        polled
    }
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
        if session.dcp.is_some()
            && inbuf
                .first()
                .is_some_and(|&b| Magic::from_u8(b).is_some_and(Magic::is_client_response))
        {
            // A DCP consumer answering the producer (a NOOP's response).
            match response_frame_len(inbuf, limits) {
                Ok(Some(n)) => {
                    if let (Some(head), Some(p)) =
                        (inbuf.first_chunk::<HEADER_LEN>(), session.dcp.as_mut())
                        && let Ok(h) = ResponseHeader::decode(head, limits)
                    {
                        p.response(h.opcode, h.status);
                    }
                    inbuf.advance(n);
                    continue;
                }
                Ok(None) => return None,
                Err(e) => {
                    tracing::info!(conn = id, %peer, error = %e, "closing DCP connection: response header cannot be trusted");
                    inbuf.clear();
                    return Some(Closing::BadHeader);
                }
            }
        }
        let n = match frame_len(inbuf, limits) {
            Ok(Some(n)) => n,
            Ok(None) => {
                // A client speaking something else (the text protocol, HTTP, TLS) is
                // told apart by its first byte without waiting for a whole header.
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
                return None;
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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

    async fn poll_once(s: &mut StopSignal) -> Poll<()> {
        std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *s).poll(cx))).await
    }

    #[tokio::test]
    async fn stop_signal_stays_pending_then_wakes_its_task_on_stop() {
        let (tx, rx) = watch::channel(false);
        let mut s = StopSignal::new(rx);
        for _ in 0..3 {
            assert!(poll_once(&mut s).await.is_pending());
        }
        let waiter = tokio::spawn(async move {
            for _ in 0..3 {
                assert!(poll_once(&mut s).await.is_pending());
            }
            s.await;
        });
        tokio::task::yield_now().await;
        tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the stopped signal wakes the task that polled it")
            .unwrap();
    }

    #[tokio::test]
    async fn stop_signal_resolves_when_already_stopped_or_the_sender_is_gone() {
        let (tx, rx) = watch::channel(true);
        let mut s = StopSignal::new(rx);
        assert!(poll_once(&mut s).await.is_ready());
        drop(tx);
        let (tx, rx) = watch::channel(false);
        let mut s = StopSignal::new(rx);
        assert!(poll_once(&mut s).await.is_pending());
        drop(tx);
        tokio::time::timeout(Duration::from_secs(10), s)
            .await
            .expect("a dropped sender stops the connection");
    }
}
