//! An async (tokio) client of the memcached binary protocol with Couchbase extensions.
//!
//! What it is: one TCP connection to a server speaking mcbp (epkv, memcached, a Couchbase
//! node), with a general request/response API that can pipeline many requests in one
//! write or send raw bytes ([`Client::queue`], [`Client::flush`], [`Client::recv`],
//! [`Client::send_raw`], [`Client::request`]) and convenience methods for each command
//! ([`Client::get`], [`Client::set`], [`Client::stat`], ...). It is used by the end-to-end
//! tests now and the load generator later. What it is not: a cluster-aware SDK (no config
//! fetching, no retries, no connection pool, no authentication yet).
//!
//! Key types: [`Client`], [`ClientConfig`], [`Response`] (owned), [`StoreOptions`],
//! [`Error`].
//!
//! Invariants: nothing from the server is trusted. A response header is checked against
//! [`ClientConfig::limits`] before any buffer is sized from it, so a hostile or broken
//! server cannot make the client allocate without bound. Document commands are sent to
//! `epkv_types::vbucket_for_key(key, num_vbuckets)` unless overridden.
//!
//! Depends on `epkv-protocol`, `epkv-types`, tokio and bytes. Must never depend on the
//! engine, the front end or the server.
//!
//! ```
//! use epkv_client::{Client, StoreOptions};
//! use epkv_protocol::{Command, Limits, Request, Response, Status, frame_len};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A stand-in server that answers every request with Success and echoes the value.
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let addr = listener.local_addr()?;
//! tokio::spawn(async move {
//!     let (mut sock, _) = listener.accept().await?;
//!     let (limits, mut buf) = (Limits::default(), Vec::new());
//!     loop {
//!         while let Some(n) = frame_len(&buf, &limits)? {
//!             let req = Request::parse(&buf[..n], &limits)?;
//!             let mut out = Vec::new();
//!             Response::for_request(&req, Status::Success).with_value(req.value).encode(&mut out)?;
//!             sock.write_all(&out).await?;
//!             buf.drain(..n);
//!         }
//!         if sock.read_buf(&mut buf).await? == 0 {
//!             return Ok::<(), Box<dyn std::error::Error + Send + Sync>>(());
//!         }
//!     }
//! });
//!
//! let mut client = Client::connect(addr).await?;
//! let stored = client.set(b"k1", b"hello", StoreOptions::new().flags(7)).await?;
//! assert_eq!(stored.status(), Some(Status::Success));
//! assert_eq!(&stored.value[..], b"hello");
//! client.noop().await?;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]

mod client;
mod error;
mod options;
mod range_scan;
mod response;

pub use client::{Client, ClientConfig};
pub use error::{Error, Result};
pub use options::StoreOptions;
pub use response::Response;
