//! The crate's error type.

use std::path::PathBuf;

/// Errors of the storage layer.
///
/// [`Error::NoSpace`] and [`Error::TooManyOpenFiles`] are temporary: the engine answers
/// TMPFAIL and retries the batch later. [`Error::Corrupt`] names the file and offset.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done (`write`, `sync`, `open`, ...).
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The disk is full (ENOSPC or EDQUOT); reads keep working, writes fail until space
    /// comes back.
    #[error("no space left on device writing {path}")]
    NoSpace {
        /// The file.
        path: PathBuf,
    },
    /// No file descriptor could be had even after closing idle data files.
    #[error("out of file descriptors opening {path}")]
    TooManyOpenFiles {
        /// The file.
        path: PathBuf,
    },
    /// A record failed its checksum or could not be decoded.
    #[error("corrupt record in {path} at offset {offset}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Byte offset of the bad record.
        offset: u64,
        /// What was wrong.
        reason: crate::format::DecodeError,
    },
    /// The vBucket was set aside at open because its data file is corrupt
    /// ([`crate::Quarantined`]); delete it to use the vbid again.
    #[error("vBucket {vbid} is unavailable: {reason}")]
    VbucketUnavailable {
        /// The vBucket.
        vbid: u16,
        /// Why (the corruption found at open).
        reason: String,
    },
    /// A caller error: a vbid this store does not own, or a key too long for the format.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The caller stopped a long operation (a compaction of every vBucket) part way, as
    /// its owner shuts down; what was done stays done.
    #[error("cancelled: shutting down")]
    Cancelled,
}

impl Error {
    /// True for errors that go away by themselves (answer TMPFAIL and retry later).
    #[must_use]
    pub fn is_temporary(&self) -> bool {
        matches!(self, Self::NoSpace { .. } | Self::TooManyOpenFiles { .. })
    }

    pub(crate) fn io(op: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        match source.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT) => Self::NoSpace {
                path: path.to_owned(),
            },
            Some(libc::EMFILE | libc::ENFILE) => Self::TooManyOpenFiles {
                path: path.to_owned(),
            },
            _ => Self::Io {
                op,
                path: path.to_owned(),
                source,
            },
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
