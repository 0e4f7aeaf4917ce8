//! [`FrontendConfig`]: how the front end listens and treats connections.

use crate::error::{FrontendError, Result};
use crate::tls::TlsConfig;
use epkv_auth::{AuditLog, UserDirectory};
use epkv_engine_api::ClusterView;
use epkv_executor::{Clock, SystemClock};
use epkv_protocol::Limits;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
#[cfg(test)]
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The front end's settings. `epkv-server` fills it from its settings table; tests start
/// from [`FrontendConfig::default`] (127.0.0.1, port 0, two workers).
#[derive(Clone)]
pub struct FrontendConfig {
    /// Address to listen on; port 0 picks a free port (see [`crate::Frontend::local_addr`]).
    pub bind: SocketAddr,
    /// Worker threads serving connections (at least 1). Each runs its own single-threaded
    /// runtime; accepted connections are dealt to workers in turn.
    pub threads: usize,
    /// Most connections at once. One more is accepted and closed at once, and counted in
    /// the `rejected_conns` stat.
    pub max_connections: usize,
    /// Close a connection after this long with no bytes read or written; `None` never
    /// does (the default, as memcached's `idle_timeout` 0).
    pub idle_timeout: Option<Duration>,
    /// Largest request packet, header included. A header announcing more closes the
    /// connection (its body is never read).
    pub max_packet_size: u32,
    /// Replies a connection may have waiting to be sent before the front end stops
    /// reading and executing that connection's requests. Bounds the memory a client that
    /// sends but does not read can make the server use (plus at most one reply).
    pub output_buffer_limit: usize,
    /// Testing mode: ADJUST_TIMEOFDAY is honoured (passed to the engine); otherwise it is
    /// answered NotSupported.
    pub testing: bool,
    /// On shutdown, how long connections may take to flush their replies before they are
    /// closed regardless.
    pub shutdown_timeout: Duration,
    /// The VERSION reply and the `version` stat.
    pub version: String,
    /// Time source for uptime, the `time` stat and command timings.
    pub clock: Arc<dyn Clock>,
    /// The users that may authenticate with SASL, and the buckets each may use. Empty
    /// (the default) on a loopback address means the open mode: no authentication, every
    /// connection on `default`. The open mode is decided when the front end binds; users
    /// added later through the directory need authentication but do not end it.
    pub users: UserDirectory,
    /// The management (REST) port to advertise as `mgmt` in the cluster map's
    /// `nodesExt`, when one is served; SDKs send bucket and user management there.
    pub mgmt_port: Option<u16>,
    /// Threads that check SASL PLAIN passwords (the PBKDF2 derivation), off the
    /// front-end threads. Default: half the CPU cores, at least 1.
    pub auth_threads: usize,
    /// A second listener serving the same protocol over TLS, on the same address as
    /// `bind`; `None` (the default) has no TLS listener.
    pub tls: Option<TlsConfig>,
    /// Where the cluster map comes from (GET_CLUSTER_CONFIG, and the body of
    /// NOT_MY_VBUCKET replies): `epkv-server` gives its `epkv_cluster::Cluster`, for a
    /// single node as for a cluster. `None` (the default) serves no map, as KV-Engine
    /// before ns_server sets one: GET_CLUSTER_CONFIG answers KeyNotFound and
    /// NOT_MY_VBUCKET carries no body.
    pub cluster: Option<Arc<dyn ClusterView>>,
    /// Where logins, failed logins and refused requests are recorded (`--audit-log`);
    /// disabled by default.
    pub audit: AuditLog,
}

/// The KV-Engine release whose protocol epkv speaks: the first part of the version it
/// reports.
pub const PROTOCOL_LEVEL: &str = "7.6.0";

/// The version VERSION and `STAT version` report for epkv `epkv_version`:
/// `7.6.0-epkv-<epkv_version>`, shaped as KV-Engine's `7.6.0-<build>`. Clients parse a
/// leading `major.minor.micro` (libmemcached, and so `memcstat`, refuse a major version
/// of 0, which epkv's own `0.x` would give).
#[must_use]
pub fn wire_version(epkv_version: &str) -> String {
    format!("{PROTOCOL_LEVEL}-epkv-{epkv_version}")
}

impl Default for FrontendConfig {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            threads: 2,
            max_connections: 4096,
            idle_timeout: None,
            max_packet_size: Limits::default().max_packet_bytes,
            output_buffer_limit: 2 * 1024 * 1024,
            testing: false,
            shutdown_timeout: Duration::from_secs(10),
            version: wire_version(env!("CARGO_PKG_VERSION")),
            clock: Arc::new(SystemClock),
            users: UserDirectory::default(),
            mgmt_port: None,
            auth_threads: std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
            tls: None,
            cluster: None,
            audit: AuditLog::disabled(),
        }
    }
}

impl fmt::Debug for FrontendConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrontendConfig")
            .field("bind", &self.bind)
            .field("threads", &self.threads)
            .field("max_connections", &self.max_connections)
            .field("idle_timeout", &self.idle_timeout)
            .field("max_packet_size", &self.max_packet_size)
            .field("output_buffer_limit", &self.output_buffer_limit)
            .field("testing", &self.testing)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("version", &self.version)
            .field("users", &self.users.current().len())
            .field("mgmt_port", &self.mgmt_port)
            .field("auth_threads", &self.auth_threads)
            .field("tls", &self.tls)
            .field("cluster", &self.cluster.is_some())
            .field("audit", &self.audit.is_enabled())
            .finish_non_exhaustive()
    }
}

impl FrontendConfig {
    /// Smallest accepted `max_packet_size`: a header plus a 250-byte key and some room.
    pub const MIN_PACKET_SIZE: u32 = 1024;

    /// Checks the settings.
    ///
    /// # Errors
    /// [`FrontendError::InvalidConfig`] when `threads` or `max_connections` is zero,
    /// `max_packet_size` is below [`FrontendConfig::MIN_PACKET_SIZE`],
    /// `output_buffer_limit` is zero, or the TLS settings are incomplete
    /// ([`TlsConfig::validate`]).
    pub fn validate(&self) -> Result<()> {
        if self.threads == 0 {
            return Err(FrontendError::InvalidConfig(
                "threads must be at least 1".into(),
            ));
        }
        if self.max_connections == 0 {
            return Err(FrontendError::InvalidConfig(
                "max_connections must be at least 1".into(),
            ));
        }
        if self.max_packet_size < Self::MIN_PACKET_SIZE {
            return Err(FrontendError::InvalidConfig(format!(
                "max_packet_size must be at least {} bytes",
                Self::MIN_PACKET_SIZE
            )));
        }
        if !(1..=64).contains(&self.auth_threads) {
            return Err(FrontendError::InvalidConfig(
                "auth_threads must be 1..=64".into(),
            ));
        }
        if self.output_buffer_limit == 0 {
            return Err(FrontendError::InvalidConfig(
                "output_buffer_limit must be positive".into(),
            ));
        }
        if let Some(tls) = &self.tls {
            tls.validate()?;
            if tls.port != 0 && tls.port == self.bind.port() {
                return Err(FrontendError::InvalidConfig(format!(
                    "the TLS port and the KV port are both {}",
                    tls.port
                )));
            }
        }
        Ok(())
    }

    pub(crate) fn limits(&self) -> Limits {
        Limits {
            max_packet_bytes: self.max_packet_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_settings_are_validated_with_the_rest() {
        let mut c = FrontendConfig {
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 11210)),
            tls: Some(TlsConfig::new("c.pem", "k.pem")),
            ..FrontendConfig::default()
        };
        c.validate().unwrap();
        c.tls.as_mut().unwrap().port = 11210;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("both 11210"), "{e}");
        c.tls.as_mut().unwrap().port = 0;
        c.bind.set_port(0);
        c.validate().unwrap();
        c.tls.as_mut().unwrap().key_path = PathBuf::new();
        assert!(c.validate().is_err());
    }
}
