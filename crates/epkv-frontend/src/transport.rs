//! [`Transport`]: the byte streams a connection can run over (a plain TCP socket or a TLS
//! session on one), with the little the connection loop needs beyond reading and writing.
//!
//! The connection loop is generic over it, so the plain path compiles to exactly the code
//! it had before TLS existed: [`Transport::BUFFERS_WRITES`] is a constant, and for
//! [`TcpStream`] every flush-related branch folds away.

use std::io;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// A connection's byte stream.
pub(crate) trait Transport: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Whether a write can leave bytes inside the stream (encrypted records not yet on
    /// the socket) that only a flush sends. False for TCP, whose writes go straight to
    /// the kernel.
    const BUFFERS_WRITES: bool;

    /// Sets TCP_NODELAY on the underlying socket (HELLO TcpNoDelay / TcpDelay).
    fn set_nodelay(&self, on: bool) -> io::Result<()>;
}

impl Transport for TcpStream {
    const BUFFERS_WRITES: bool = false;

    fn set_nodelay(&self, on: bool) -> io::Result<()> {
        TcpStream::set_nodelay(self, on)
    }
}

impl Transport for TlsStream<TcpStream> {
    const BUFFERS_WRITES: bool = true;

    fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.get_ref().0.set_nodelay(on)
    }
}
