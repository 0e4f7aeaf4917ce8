//! The crate's error type: failures to build or run a bucket. Expected outcomes of client
//! requests are `epkv_engine_api::EngineStatus` values, not errors.

/// Why a bucket could not be created or started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A [`crate::BucketConfig`] field is out of range.
    #[error("invalid bucket configuration: {field}: {reason}")]
    InvalidConfig {
        /// The field's name.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A vBucket hash table could not be created.
    #[error("hash table")]
    HashTable(#[from] epkv_hashtable::Error),
    /// The expiry pager thread could not be started.
    #[error("could not start the expiry pager thread")]
    SpawnPager(#[source] std::io::Error),
    /// The bucket's storage could not be opened or warmed up.
    #[error("storage")]
    Storage(#[from] epkv_storage::Error),
    /// The flusher executor could not be started.
    #[error("could not start the flusher executor")]
    Executor(#[from] epkv_executor::Error),
    /// The collections manifest could not be read.
    #[error("collections manifest: {0}")]
    Collections(String),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;
