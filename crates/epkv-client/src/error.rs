//! The client's error type.

use epkv_protocol::{EncodeError, HeaderError, Status};

/// Everything that can go wrong talking to a server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A socket error.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The server sent a header the client cannot trust (bad magic, a packet over the
    /// client's limit, inconsistent lengths). The connection is unusable.
    #[error("untrusted response header: {0}")]
    Header(#[from] HeaderError),
    /// A request could not be encoded.
    #[error("cannot encode request: {0}")]
    Encode(#[from] EncodeError),
    /// The server closed the connection while a response was expected, leaving
    /// `buffered` bytes of an incomplete packet.
    #[error("connection closed by the server ({buffered} bytes of a partial response buffered)")]
    Closed {
        /// Bytes of an incomplete response left in the buffer.
        buffered: usize,
    },
    /// No response arrived within the client's timeout.
    #[error("timed out waiting for the server")]
    Timeout,
    /// A response answered another request than the one waited for.
    #[error("response opaque {got:#x} does not match request opaque {expected:#x}")]
    UnexpectedOpaque {
        /// The request's opaque.
        expected: u32,
        /// The response's opaque.
        got: u32,
    },
    /// A command that only makes sense on success failed.
    #[error("{opcode:#04x} failed with status {status:#06x} ({})", Status::from_u16(*status).map_or("unknown", Status::message))]
    Status {
        /// The request's opcode.
        opcode: u8,
        /// The raw status.
        status: u16,
    },
    /// A successful response did not have the shape its command promises.
    #[error("malformed response: {0}")]
    Malformed(&'static str),
}

/// The client's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
