//! The Prometheus endpoint: `GET /metrics` in the text exposition format (0.0.4) on
//! `--metrics-port`, at the KV port's address and with its users.
//!
//! Access: a user with the `Stats` privilege (admin, ro_admin, cluster_admin,
//! security_admin, bucket_admin) sees every series; one without it sees the series of
//! the buckets they hold `SimpleStats` on (data_monitoring, bucket_full_access, ...) and
//! no node-wide series; one with neither is refused (403).
//!
//! - [`names`]: how an engine stat becomes a metric (name, type, unit, HELP), derived from
//!   the engine's stats table.
//! - [`collect`]: one scrape, reading the buckets' STAT groups and tasks and the front
//!   end's connection counts and command timings; encoded by the `prometheus` crate.
//! - [`crate::http_auth`]: the open mode or HTTP Basic auth, with password derivations
//!   off the serving thread and a short cache of verified credentials (shared with the
//!   management API).
//!
//! The HTTP server is [`crate::http_server`]; the scrape itself (a few hundred microseconds
//! of reading stats) and password derivations run on the blocking pool, so the KV acceptor
//! is never held up. See `docs/metrics.md`.

mod collect;
mod names;

pub(crate) use collect::Sources;

use crate::http_auth::{self, Access};
use epkv_auth::{AuditKind, Interface, Privilege};

use crate::http_limits::{HttpCounters, HttpLimits};
use crate::http_server::{Authenticated, HttpListener, HttpResponse, reply};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Method, Request, StatusCode};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;

/// The content type of the text exposition format.
const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The bound metrics listener and what it serves.
pub(crate) struct MetricsEndpoint {
    listener: HttpListener,
    state: Arc<State>,
}

struct State {
    access: Arc<Access>,
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
        access: Arc<Access>,
        limits: HttpLimits,
        counters: Arc<HttpCounters>,
    ) -> std::io::Result<Self> {
        Ok(Self {
            listener: HttpListener::bind(addr, limits, counters)?,
            state: Arc::new(State { access, sources }),
        })
    }

    /// The bound address (with the real port when port 0 was asked).
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    /// Starts serving on the current Tokio runtime; serves until the runtime stops.
    ///
    /// # Errors
    /// When the listener cannot be registered with the runtime.
    pub(crate) fn spawn(self) -> std::io::Result<()> {
        let state = self.state;
        self.listener.spawn("metrics", move |req, _local, peer| {
            let state = Arc::clone(&state);
            async move { handle(&state, req, peer).await }
        })
    }
}

async fn handle(state: &Arc<State>, req: Request<Incoming>, peer: SocketAddr) -> HttpResponse {
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
    let verdict = state
        .access
        .check(authorization, peer, Interface::Metrics)
        .await;
    if verdict == http_auth::Verdict::Denied {
        let mut r = reply(StatusCode::UNAUTHORIZED, "authentication required\n");
        r.headers_mut().insert(
            WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"epkv\""),
        );
        return r;
    }
    let authenticated = matches!(verdict, http_auth::Verdict::User(_));
    let mut r = scrape(state, verdict, peer).await;
    if authenticated {
        r.extensions_mut().insert(Authenticated);
    }
    r
}

/// Answers a scrape by a caller whose credentials were checked: the series they may see,
/// or 403.
async fn scrape(state: &Arc<State>, verdict: http_auth::Verdict, peer: SocketAddr) -> HttpResponse {
    let grants = state.access.grants(&verdict);
    let node_wide = grants.allows(Privilege::Stats, None);
    // The buckets a caller without `Stats` may see, decided once: both the 403 and the
    // exposition use this set.
    let visible: HashSet<String> = if node_wide {
        HashSet::new()
    } else {
        state
            .sources
            .buckets
            .snapshot()
            .iter()
            .filter(|(p, _)| grants.allows(Privilege::SimpleStats, Some(&p.name)))
            .map(|(p, _)| p.name.clone())
            .collect()
    };
    if !node_wide && visible.is_empty() {
        state.access.audit().record(
            &verdict
                .audit_event(AuditKind::AccessDenied, Interface::Metrics, peer)
                .detail("cluster.stats!read"),
        );
        return reply(
            StatusCode::FORBIDDEN,
            "forbidden: needs the Stats privilege, or SimpleStats on a bucket\n",
        );
    }
    let scrape = Arc::clone(state);
    let text = tokio::task::spawn_blocking(move || {
        scrape
            .sources
            .exposition(&|bucket| node_wide || visible.contains(bucket), node_wide)
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
