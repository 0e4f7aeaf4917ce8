//! Front-end counters shared by the acceptor and the workers, and [`FrontendStats`], the
//! read-only handle exporters (the server's Prometheus endpoint) read them through.

use crate::frontend::Shared;
use crate::timings::{self, CommandTiming};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

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

/// The connection counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionCounts {
    /// Connections open now (`curr_connections`).
    pub current: u64,
    /// Connections accepted since start, rejected ones included (`total_connections`).
    pub total: u64,
    /// Connections closed at once because `max_connections` were open
    /// (`rejected_conns`).
    pub rejected: u64,
}

/// The authentication counters at one moment (see `auth_guard.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthCounts {
    /// SASL_AUTH requests (`auth_cmds`).
    pub attempts: u64,
    /// Attempts refused (`auth_errors`).
    pub failures: u64,
    /// Attempts made to wait because their source had failed too often
    /// (`auth_throttled`).
    pub throttled: u64,
    /// Connections closed after too many failures in a row (`auth_throttle_closes`).
    pub closes: u64,
    /// Attempts answered TMPFAIL because the password-check queue was full
    /// (`auth_busy`).
    pub busy: u64,
}

/// A read-only handle on a front end's connection counters and per-opcode command
/// timings, from [`crate::Frontend::stats`]. Cheap to clone; reading takes no lock but
/// each worker's timings lock in turn, briefly.
#[derive(Clone)]
pub struct FrontendStats {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FrontendStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontendStats")
            .field("connections", &self.connections())
            .finish_non_exhaustive()
    }
}

impl FrontendStats {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// The connection counters now.
    #[must_use]
    pub fn connections(&self) -> ConnectionCounts {
        let c = &self.shared.conns;
        ConnectionCounts {
            current: c.current() as u64,
            total: c.total.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
        }
    }

    /// The authentication counters now.
    #[must_use]
    pub fn auth(&self) -> AuthCounts {
        let a = &self.shared.auth.stats;
        AuthCounts {
            attempts: a.attempts.load(Ordering::Relaxed),
            failures: a.failures.load(Ordering::Relaxed),
            throttled: a.throttled.load(Ordering::Relaxed),
            closes: a.closes.load(Ordering::Relaxed),
            busy: a.busy.load(Ordering::Relaxed),
        }
    }

    /// The latency of every opcode received so far (from the start of a command's
    /// decoding to its reply being queued), merged over the worker threads and counted
    /// into `bounds` (ascending): one [`CommandTiming`] per opcode with samples, in
    /// opcode order.
    #[must_use]
    pub fn command_timings(&self, bounds: &[Duration]) -> Vec<CommandTiming> {
        timings::bucketed(&self.shared.timings, bounds)
    }
}
