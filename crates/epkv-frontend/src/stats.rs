//! Front-end counters shared by the acceptor and the workers.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Connection counters (the front end's part of the default STAT group).
#[derive(Debug, Default)]
pub(crate) struct ConnectionStats {
    /// Connections open now (including ones accepted and not yet picked up by a worker).
    pub(crate) curr: AtomicUsize,
    /// Connections accepted since start, rejected ones included.
    pub(crate) total: AtomicU64,
    /// Connections closed at once because `max_connections` were open.
    pub(crate) rejected: AtomicU64,
    /// TLS handshakes completed since start.
    pub(crate) tls_total: AtomicU64,
    /// TLS connections closed before serving: failed or timed-out handshakes, and client
    /// certificates that name no user.
    pub(crate) tls_failures: AtomicU64,
}

impl ConnectionStats {
    pub(crate) fn current(&self) -> usize {
        self.curr.load(Ordering::Relaxed)
    }
}
