//! The HTTP/1.1 server shared by the Prometheus endpoint and the management REST API:
//! hyper 1.x on the acceptor's Tokio runtime, with the connection limits of
//! [`crate::http_limits`]: a cap per source address, a cap per listener that evicts idle
//! untrusted connections before it turns a newcomer away, a short timeout for request
//! headers and a longer one for idle keep-alive connections, and a bounded read buffer.
//!
//! Each connection has a watchdog beside hyper: the connection is in one [`Phase`] at a
//! time (sending headers since some instant, inside a request, or idle since some instant),
//! and the watchdog closes it when the phase's deadline passes or when the table evicts
//! it. The phase moves on three events: hyper calls the service (headers complete), the
//! service answers, and the first bytes of a next request arrive on an idle connection
//! (seen by [`TrackedStream`]).
//!
//! Handlers run on the runtime's thread; anything slow (a scrape, a password derivation,
//! building or dropping a bucket) goes to the blocking pool, so the KV acceptor is never
//! held up.

use crate::http_limits::{Admission, ConnTable, Evictable, HttpCounters, HttpLimits};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Largest request head (request line and headers) accepted; a larger one is answered
/// 431 and the connection closed. The management API's requests carry a few short headers.
pub(crate) const MAX_HEADER_BYTES: usize = 16 * 1024;

/// Most header fields in one request.
const MAX_HEADERS: usize = 64;

/// The most bytes hyper buffers per connection while reading (its minimum is 8 KiB; its
/// default, about 400 KiB, would let each connection hold that much of a client's input).
pub(crate) const MAX_READ_BUFFER_BYTES: usize = 32 * 1024;

/// A marker a handler puts in a response's extensions when the request carried valid
/// credentials: the connection becomes trusted and is never evicted for a newcomer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Authenticated;

/// A response with a fully buffered body.
pub(crate) type HttpResponse = Response<Full<Bytes>>;

/// A bound listener, not serving yet (so a port in use is reported before the server
/// starts, and port 0 is known at once).
pub(crate) struct HttpListener {
    listener: std::net::TcpListener,
    local_addr: SocketAddr,
    limits: HttpLimits,
    counters: Arc<HttpCounters>,
}

impl HttpListener {
    /// Binds `addr`; connections will be held to `limits` and counted in `counters`.
    ///
    /// # Errors
    /// The bind error.
    pub(crate) fn bind(
        addr: SocketAddr,
        limits: HttpLimits,
        counters: Arc<HttpCounters>,
    ) -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind(addr)?;
        let local_addr = listener.local_addr()?;
        Ok(Self {
            listener,
            local_addr,
            limits,
            counters,
        })
    }

    /// The bound address (with the real port when port 0 was asked).
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves `handler` on the current Tokio runtime until the runtime stops. The
    /// handler gets each request, the local address its connection reached and the
    /// client's address.
    ///
    /// # Errors
    /// When the listener cannot be registered with the runtime.
    pub(crate) fn spawn<H, F>(self, name: &'static str, handler: H) -> std::io::Result<()>
    where
        H: Fn(Request<Incoming>, SocketAddr, SocketAddr) -> F + Send + Sync + 'static,
        F: Future<Output = HttpResponse> + Send + 'static,
    {
        self.listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(self.listener)?;
        let ctx = Arc::new(ListenerCtx {
            name,
            limits: self.limits,
            counters: self.counters,
            table: parking_lot::Mutex::new(ConnTable::new(self.limits)),
        });
        tokio::spawn(accept_loop(listener, ctx, Arc::new(handler)));
        Ok(())
    }
}

/// What every connection task of one listener shares.
struct ListenerCtx {
    name: &'static str,
    limits: HttpLimits,
    counters: Arc<HttpCounters>,
    /// The open connections; locked briefly at accept and at close, never across an await.
    /// Lock order: the table before any connection's `phase`.
    table: parking_lot::Mutex<ConnTable<Arc<Conn>>>,
}

/// Where a connection is between requests, and since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for complete request headers since this instant.
    AwaitingHead(Instant),
    /// A request is being served.
    InRequest,
    /// Idle after a response since this instant.
    Idle(Instant),
}

/// One connection's state shared by its serving task, its watchdog and the table.
struct Conn {
    /// A request on it was answered to valid credentials: never evicted.
    trusted: AtomicBool,
    /// Protected by its own lock, taken briefly (never across an await).
    phase: parking_lot::Mutex<Phase>,
    /// Wakes the watchdog when the phase changed or the connection was evicted.
    wake: Notify,
    /// Set by the table's owner when another connection took this one's slot.
    evicted: AtomicBool,
}

impl Evictable for Arc<Conn> {
    /// Untrusted and not inside a request. The table is locked when this reads the phase,
    /// as the lock order allows.
    fn evictable(&self) -> bool {
        !self.trusted.load(Ordering::Relaxed) && *self.phase.lock() != Phase::InRequest
    }
}

impl Conn {
    fn set_phase(&self, p: Phase) {
        *self.phase.lock() = p;
        self.wake.notify_one();
    }
}

/// Why a watchdog closed its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closed {
    Evicted,
    HeaderTimeout,
    IdleTimeout,
}

/// Resolves when `conn` must be closed.
async fn watchdog(conn: &Conn, limits: HttpLimits) -> Closed {
    loop {
        if conn.evicted.load(Ordering::Acquire) {
            return Closed::Evicted;
        }
        let deadline = match *conn.phase.lock() {
            Phase::AwaitingHead(since) => {
                Some((since + limits.header_timeout, Closed::HeaderTimeout))
            }
            Phase::Idle(since) => Some((since + limits.idle_timeout, Closed::IdleTimeout)),
            Phase::InRequest => None,
        };
        match deadline {
            Some((at, why)) if Instant::now() >= at => return why,
            Some((at, _)) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = conn.wake.notified() => {}
                }
            }
            None => conn.wake.notified().await,
        }
    }
}

/// The socket, noting when bytes of a next request arrive on an idle connection.
struct TrackedStream {
    inner: tokio::net::TcpStream,
    conn: Arc<Conn>,
}

impl AsyncRead for TrackedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            let mut phase = self.conn.phase.lock();
            if let Phase::Idle(_) = *phase {
                *phase = Phase::AwaitingHead(Instant::now());
                drop(phase);
                self.conn.wake.notify_one();
            }
        }
        polled
    }
}

impl AsyncWrite for TrackedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Takes a connection out of the table and the gauge when its task ends, however it ends.
struct Slot {
    ctx: Arc<ListenerCtx>,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.ctx.table.lock().remove(self.id);
        self.ctx.counters.current.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn accept_loop<H, F>(
    listener: tokio::net::TcpListener,
    ctx: Arc<ListenerCtx>,
    handler: Arc<H>,
) where
    H: Fn(Request<Incoming>, SocketAddr, SocketAddr) -> F + Send + Sync + 'static,
    F: Future<Output = HttpResponse> + Send + 'static,
{
    let name = ctx.name;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, listener = name, "HTTP accept failed; pausing briefly");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        HttpCounters::bump(&ctx.counters.accepted);
        let conn = Arc::new(Conn {
            trusted: AtomicBool::new(false),
            phase: parking_lot::Mutex::new(Phase::AwaitingHead(Instant::now())),
            wake: Notify::new(),
            evicted: AtomicBool::new(false),
        });
        let admission = ctx.table.lock().admit(peer.ip(), Arc::clone(&conn));
        let id = match admission {
            Admission::Admitted { id, victim } => {
                if let Some(v) = victim {
                    HttpCounters::bump(&ctx.counters.evicted);
                    v.evicted.store(true, Ordering::Release);
                    v.wake.notify_one();
                }
                id
            }
            Admission::RejectedPerAddress => {
                HttpCounters::bump(&ctx.counters.rejected_per_address);
                tracing::debug!(%peer, listener = name, "too many HTTP connections from this address; closing the new one");
                continue;
            }
            Admission::RejectedFull => {
                HttpCounters::bump(&ctx.counters.rejected_full);
                tracing::debug!(%peer, listener = name, "HTTP connections all busy or trusted; closing the new one");
                continue;
            }
        };
        ctx.counters.current.fetch_add(1, Ordering::Relaxed);
        let slot = Slot {
            ctx: Arc::clone(&ctx),
            id,
        };
        let Ok(local) = stream.local_addr() else {
            continue;
        };
        let handler = Arc::clone(&handler);
        tokio::spawn(serve(slot, stream, conn, local, peer, handler));
    }
}

async fn serve<H, F>(
    slot: Slot,
    stream: tokio::net::TcpStream,
    conn: Arc<Conn>,
    local: SocketAddr,
    peer: SocketAddr,
    handler: Arc<H>,
) where
    H: Fn(Request<Incoming>, SocketAddr, SocketAddr) -> F + Send + Sync + 'static,
    F: Future<Output = HttpResponse> + Send + 'static,
{
    let ctx = Arc::clone(&slot.ctx);
    let name = ctx.name;
    let served_conn = Arc::clone(&conn);
    let service = hyper::service::service_fn(move |req| {
        let conn = Arc::clone(&served_conn);
        conn.set_phase(Phase::InRequest);
        let reply = handler(req, local, peer);
        async move {
            let mut r = reply.await;
            if r.extensions_mut().remove::<Authenticated>().is_some() {
                conn.trusted.store(true, Ordering::Relaxed);
            }
            conn.set_phase(Phase::Idle(Instant::now()));
            Ok::<_, Infallible>(r)
        }
    });
    let io = TrackedStream {
        inner: stream,
        conn: Arc::clone(&conn),
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        // The watchdog times headers and idleness; hyper's own timer would also cut idle
        // keep-alive connections at the header timeout.
        .header_read_timeout(None)
        .max_header_size(MAX_HEADER_BYTES)
        .max_headers(MAX_HEADERS)
        .max_buf_size(MAX_READ_BUFFER_BYTES);
    let served = builder.serve_connection(hyper_util::rt::TokioIo::new(io), service);
    tokio::select! {
        served = served => {
            if let Err(e) = served {
                tracing::debug!(%peer, listener = name, error = %e, "HTTP connection ended with an error");
            }
        }
        why = watchdog(&conn, ctx.limits) => {
            let counter = match why {
                Closed::Evicted => None,
                Closed::HeaderTimeout => Some(&ctx.counters.header_timeouts),
                Closed::IdleTimeout => Some(&ctx.counters.idle_timeouts),
            };
            if let Some(c) = counter {
                HttpCounters::bump(c);
            }
            tracing::debug!(%peer, listener = name, reason = ?why, "HTTP connection closed");
        }
    }
    drop(slot);
}

/// A response with `status` and `body`.
pub(crate) fn reply(status: StatusCode, body: impl Into<Bytes>) -> HttpResponse {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(phase: Phase) -> Arc<Conn> {
        Arc::new(Conn {
            trusted: AtomicBool::new(false),
            phase: parking_lot::Mutex::new(phase),
            wake: Notify::new(),
            evicted: AtomicBool::new(false),
        })
    }

    fn limits() -> HttpLimits {
        HttpLimits {
            header_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(30),
            ..HttpLimits::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn headers_that_never_complete_time_out_at_the_header_timeout() {
        let start = Instant::now();
        let c = conn(Phase::AwaitingHead(start));
        assert_eq!(watchdog(&c, limits()).await, Closed::HeaderTimeout);
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_lasts_the_idle_timeout_then_a_started_request_the_header_timeout() {
        let start = Instant::now();
        let c = conn(Phase::Idle(start));
        assert_eq!(watchdog(&c, limits()).await, Closed::IdleTimeout);
        assert_eq!(start.elapsed(), Duration::from_secs(30));

        // Half a request 5 s into an idle period: closed 2 s later, not at 30 s.
        let start = Instant::now();
        let c = conn(Phase::Idle(start));
        let poke = Arc::clone(&c);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            poke.set_phase(Phase::AwaitingHead(Instant::now()));
        });
        assert_eq!(watchdog(&c, limits()).await, Closed::HeaderTimeout);
        assert_eq!(start.elapsed(), Duration::from_secs(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_being_served_has_no_deadline_and_eviction_closes_at_once() {
        let start = Instant::now();
        let c = conn(Phase::InRequest);
        let poke = Arc::clone(&c);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(100)).await;
            poke.evicted.store(true, Ordering::Release);
            poke.wake.notify_one();
        });
        assert_eq!(watchdog(&c, limits()).await, Closed::Evicted);
        assert_eq!(start.elapsed(), Duration::from_secs(100));
    }

    #[test]
    fn only_untrusted_connections_outside_a_request_are_evictable() {
        let now = Instant::now();
        assert!(conn(Phase::AwaitingHead(now)).evictable());
        assert!(conn(Phase::Idle(now)).evictable());
        assert!(!conn(Phase::InRequest).evictable());
        let trusted = conn(Phase::Idle(now));
        trusted.trusted.store(true, Ordering::Relaxed);
        assert!(!trusted.evictable());
    }
}
