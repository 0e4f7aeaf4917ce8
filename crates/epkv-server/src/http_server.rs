//! The HTTP/1.1 server shared by the Prometheus endpoint and the management REST API:
//! hyper 1.x on the acceptor's Tokio runtime, at most [`MAX_CONNECTIONS`] connections at
//! once (more are closed at once), [`HEADER_TIMEOUT`] to send the request headers.
//!
//! Handlers run on the runtime's thread; anything slow (a scrape, a password derivation,
//! building or dropping a bucket) goes to the blocking pool, so the KV acceptor is never
//! held up.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Most HTTP connections served at once, per listener.
pub(crate) const MAX_CONNECTIONS: usize = 64;

/// How long a client may take to send its request headers.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// A response with a fully buffered body.
pub(crate) type HttpResponse = Response<Full<Bytes>>;

/// A bound listener, not serving yet (so a port in use is reported before the server
/// starts, and port 0 is known at once).
pub(crate) struct HttpListener {
    listener: std::net::TcpListener,
    local_addr: SocketAddr,
}

impl HttpListener {
    /// Binds `addr`.
    ///
    /// # Errors
    /// The bind error.
    pub(crate) fn bind(addr: SocketAddr) -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind(addr)?;
        let local_addr = listener.local_addr()?;
        Ok(Self {
            listener,
            local_addr,
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
        tokio::spawn(accept_loop(listener, name, Arc::new(handler)));
        Ok(())
    }
}

async fn accept_loop<H, F>(listener: tokio::net::TcpListener, name: &'static str, handler: Arc<H>)
where
    H: Fn(Request<Incoming>, SocketAddr, SocketAddr) -> F + Send + Sync + 'static,
    F: Future<Output = HttpResponse> + Send + 'static,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, listener = name, "HTTP accept failed; pausing briefly");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::debug!(%peer, listener = name, "too many HTTP connections; closing the new one");
            continue;
        };
        let Ok(local) = stream.local_addr() else {
            continue;
        };
        let handler = Arc::clone(&handler);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let reply = handler(req, local, peer);
                async move { Ok::<_, Infallible>(reply.await) }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(%peer, listener = name, error = %e, "HTTP connection ended with an error");
            }
            drop(slot);
        });
    }
}

/// A response with `status` and `body`.
pub(crate) fn reply(status: StatusCode, body: impl Into<Bytes>) -> HttpResponse {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}
