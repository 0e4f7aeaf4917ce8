//! [`FrontendError`]: why the front end could not start or run.

use std::net::SocketAddr;

/// Why the front end could not start or keep running. Problems with a single connection
/// are not errors of the front end: they close that connection and are logged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrontendError {
    /// The listening socket could not be created or bound. The `source` kind tells why:
    /// `AddrInUse` (another process has the port), `PermissionDenied` (a port below 1024
    /// without the privilege), `AddrNotAvailable` (no local interface has that address).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A setting is out of range.
    #[error("invalid front-end configuration: {0}")]
    InvalidConfig(String),
    /// The TLS certificate, key or CA could not be loaded (the message names the file
    /// and the reason).
    #[error("TLS: {0}")]
    Tls(String),
    /// A runtime or thread could not be created, or the listener failed.
    #[error("front-end I/O failure: {0}")]
    Io(#[from] std::io::Error),
}

/// The front end's result type.
pub type Result<T, E = FrontendError> = std::result::Result<T, E>;
