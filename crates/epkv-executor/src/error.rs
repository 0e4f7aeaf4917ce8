//! The crate's error type.

use std::io;

/// Errors of the executor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The executor has been shut down; nothing can be scheduled any more.
    #[error("executor is shut down")]
    ShutDown,
    /// The configuration is unusable.
    #[error("invalid executor configuration: {0}")]
    InvalidConfig(String),
    /// A worker thread could not be started.
    #[error("cannot spawn thread {name}: {source}")]
    SpawnThread {
        /// The thread's name.
        name: String,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// Shutdown gave up waiting for worker threads whose tasks were still running.
    #[error("shutdown timed out waiting for {threads} thread(s); tasks still running: {running:?}")]
    ShutdownTimeout {
        /// Worker threads that had not exited.
        threads: usize,
        /// Names of the tasks still running.
        running: Vec<String>,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
