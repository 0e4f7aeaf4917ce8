//! The Prometheus endpoint: `GET /metrics` in the text exposition format (0.0.4) on
//! `--metrics-port`, at the KV port's address and with its access rules.
//!
//! - [`names`]: how an engine stat becomes a metric (name, type, unit, HELP), derived from
//!   the engine's stats table.
//! - [`collect`]: one scrape, reading the buckets' STAT groups and tasks and the front
//!   end's connection counts and command timings; encoded by the `prometheus` crate.
//! - [`auth`]: the open mode or HTTP Basic auth, with password derivations off the
//!   serving thread and a short cache of verified credentials.
//!
//! The HTTP server is hyper 1.x (HTTP/1.1 only) on the acceptor's Tokio runtime: it
//! accepts, parses and answers there, while the scrape itself (a few hundred
//! microseconds of reading stats) and password derivations run on the blocking pool, so
//! the KV acceptor is never held up. At most [`MAX_CONNECTIONS`] HTTP connections are
//! served at once (more are closed at once); a client has [`HEADER_TIMEOUT`] to send its
//! request headers. See `docs/metrics.md`.

mod auth;
mod collect;
mod names;

pub(crate) use auth::Access;
pub(crate) use collect::{NamedBuckets, Sources};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Most HTTP connections served at once.
pub(crate) const MAX_CONNECTIONS: usize = 64;

/// How long a client may take to send its request headers.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The content type of the text exposition format.
const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The bound metrics listener and what it serves.
pub(crate) struct MetricsEndpoint {
    listener: std::net::TcpListener,
    local_addr: SocketAddr,
    state: Arc<State>,
}

struct State {
    access: Access,
    sources: Sources,
}

impl MetricsEndpoint {
    /// Binds `addr` at once, so a port in use is reported before the server starts.
    ///
    /// # Errors
    /// The bind error.
    pub(crate) fn bind(
        addr: SocketAddr,
        sources: Sources,
        access: Access,
    ) -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind(addr)?;
        let local_addr = listener.local_addr()?;
        Ok(Self {
            listener,
            local_addr,
            state: Arc::new(State { access, sources }),
        })
    }

    /// The bound address (with the real port when port 0 was asked).
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Starts serving on the current Tokio runtime; serves until the runtime stops.
    ///
    /// # Errors
    /// When the listener cannot be registered with the runtime.
    pub(crate) fn spawn(self) -> std::io::Result<()> {
        self.listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(self.listener)?;
        tokio::spawn(accept_loop(listener, self.state));
        Ok(())
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, state: Arc<State>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "metrics accept failed; pausing briefly");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::debug!(%peer, "too many metrics connections; closing the new one");
            continue;
        };
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let state = Arc::clone(&state);
                async move { Ok::<_, Infallible>(handle(&state, req).await) }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "metrics connection ended with an error");
            }
            drop(slot);
        });
    }
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

async fn handle(state: &Arc<State>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        return reply(
            StatusCode::NOT_FOUND,
            "not found; metrics are at /metrics\n",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = reply(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
        r.headers_mut()
            .insert(hyper::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let authorization = req.headers().get(AUTHORIZATION).map(HeaderValue::as_bytes);
    let verdict = state.access.check(authorization).await;
    if verdict == auth::Verdict::Denied {
        let mut r = reply(StatusCode::UNAUTHORIZED, "authentication required\n");
        r.headers_mut().insert(
            WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"epkv\""),
        );
        return r;
    }
    let scrape = Arc::clone(state);
    let text = tokio::task::spawn_blocking(move || {
        scrape
            .sources
            .exposition(&|bucket| scrape.access.may_see(&verdict, bucket))
    })
    .await;
    match text {
        Ok(text) => {
            let mut r = reply(StatusCode::OK, text);
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(TEXT_CONTENT_TYPE));
            r
        }
        Err(e) => {
            tracing::error!(error = %e, "metrics scrape failed");
            reply(StatusCode::INTERNAL_SERVER_ERROR, "scrape failed\n")
        }
    }
}
