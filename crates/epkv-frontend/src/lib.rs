//! The epkv network front end: listener, worker threads, connections, request dispatch,
//! the engine-status → wire-status mapping and the front end's STAT groups.
//!
//! What it is: the part of the server that speaks the memcached binary protocol to
//! clients. It accepts connections, frames and validates requests with `epkv-protocol`,
//! authenticates them (SASL through `epkv-auth`), routes each connection's data requests
//! to the bucket it selected (any number of [`epkv_engine_api::Engine`]s by name), and
//! writes the replies, including what Couchbase SDKs bootstrap from: the error map and
//! the cluster map. What it is not: a bucket (it never sees engine internals), a codec (it
//! never parses bytes itself beyond handing them to `epkv-protocol`) nor a credential
//! store (`epkv-auth` is).
//!
//! Key types: [`Frontend`] (bind, then [`Frontend::run_until`] a shutdown future),
//! [`FrontendConfig`] (including the users and, optionally, [`TlsConfig`] for a second,
//! TLS listener whose certificate [`TlsReloader`] reloads), [`Buckets`] (the engines by name),
//! [`FrontendStats`] (connection counts and per-opcode [`CommandTiming`]s for exporters),
//! [`FrontendError`], [`engine_status_to_wire`], the one exhaustive mapping from
//! [`epkv_engine_api::EngineStatus`] to [`epkv_protocol::Status`], and
//! [`status_for_client`], its remapping for clients without XERROR.
//!
//! Access: with no users and a loopback listener, every connection starts on the
//! `default` bucket unauthenticated, with every privilege (the zero-configuration mode);
//! otherwise a connection authenticates with SASL (or a TLS client certificate) and
//! selects a bucket one of its user's roles names (0x01 KeyEnoent otherwise, as for a
//! bucket that does not exist, so names do not leak; 0x24 before authentication), and
//! data requests before that answer 0x08 NoBucket. Every request then needs the
//! Couchbase privilege its opcode's row names (KV-Engine's RBAC), checked against the
//! connection's privilege context (`access.rs`): the user's privileges on the selected
//! bucket, computed at authentication and SELECT_BUCKET and again when the users changed
//! (one atomic load per request compares the user directory's generation), so a revoked
//! role counts at the connection's next request. The common check is one bit test; a user
//! whose roles name scopes or collections is checked against the key's collection when
//! the bucket-wide bit says no. A refusal is 0x24 with KV-Engine's JSON error context
//! naming the missing privilege; the connection stays open. See `docs/protocol.md`.
//!
//! Dispatch (KV-Engine's executor table): a request's opcode byte indexes one table,
//! `ENTRIES` in `dispatch/table.rs`, built into an array at compile time. Its row names
//! the handler and, as columns, the checks the dispatcher (`dispatch/mod.rs`) makes
//! before calling it: the bucket the connection must have selected (any, a selected one,
//! or a live one: not dropped), whether the connection must be a DCP producer, the
//! look-ahead hint for pipelined requests, and the privileges the request needs. The codec's own per-opcode validation
//! (`epkv_protocol::Command::decode`: lengths, frame infos, durability frames) runs
//! first, except for DCP messages, which their handlers decode. Handlers live in
//! `handlers/`, one module per family: `kv` (key-value data), `subdoc`, `collections`,
//! `setup` (HELLO, SASL, SELECT_BUCKET), `stat`, `admin` (cluster map, vBucket states,
//! error map, VERSION, NOOP, QUIT, the test clock) and `dcp`. `session.rs` holds a
//! connection's state only. To add an opcode: mark it implemented in `epkv-protocol`'s
//! opcode table with its decoding rule and `Command` variant; write its handler in its
//! family's module (a `SessionFn`, `DataFn` or `DcpFn`, by what it needs); add its row to
//! `ENTRIES`. A unit test fails until every implemented opcode has exactly one row; an
//! opcode without a row is answered UnknownCommand. A new check is a new column: a field
//! of `Entry`, a value in every row, and its use in the dispatcher.
//!
//! TLS: with [`FrontendConfig::tls`] set, a second listener on the same address (port
//! 11207 by default) serves the same protocol over TLS 1.2/1.3 (rustls). The handshake
//! runs on the connection's worker as a task with a timeout; afterwards the connection
//! loop is the same code as for plain sockets (generic over the stream). A verified
//! client certificate can authenticate the connection as the user its Subject CN names.
//! The cluster map advertises the TLS port as `kvSSL`. See `docs/tls.md`.
//!
//! Threading (memcached's model): one acceptor task on the caller's runtime deals
//! accepted sockets round-robin to N worker threads, each running a single-threaded Tokio
//! runtime. Engine calls are synchronous and made directly on the worker; they must not
//! block. Per-opcode latency histograms are kept per worker (no cross-thread contention)
//! and merged when the `timings` STAT group is read.
//!
//! Cluster map notifications (KV-Engine's duplex mode): a client that agreed in HELLO to
//! Duplex and ClustermapChangeNotification (or its brief form) is sent a server request
//! (magic 0x82) whenever the map's version moves on. The [`epkv_engine_api::ClusterView`]
//! calls the listener the front end registered ([`epkv_engine_api::ClusterView::subscribe`]),
//! which publishes the version in a `tokio::sync::watch` shared by all workers (SET_VBUCKET
//! publishes too); each subscribed connection waits on its receiver in its loop's
//! `select!`, only while its output buffer has room, and appends the notification of the
//! newest map between two whole replies. Connections that did not subscribe never poll
//! the receiver: a change wakes none of them, and no request pays for it (a connection
//! holds a receiver from its start, one reference count).
//!
//! Invariants:
//! - Replies on a connection are in request order; quiet commands follow memcached
//!   (GETQ/GETKQ/GATQ send nothing on a miss; the other quiet variants nothing on
//!   success; QUITQ closes without a reply).
//! - A connection never buffers more than about `output_buffer_limit` of replies plus one
//!   reply and one request packet (backpressure: it stops reading until the client reads).
//! - A header that cannot be trusted closes its connection; a well-framed invalid request
//!   gets an error status and the connection stays.
//! - Connections that never sent HELLO are classic memcached clients: their key requests
//!   are routed to `vbucket_for_key(key, 1024)`. After HELLO the header's vbid is used.
//! - A client that did not agree to XERROR never receives a status outside its
//!   vocabulary: it is remapped or, where kv_engine disconnects, the connection closes.
//! - Passwords never reach a log: SASL failures log the mechanism and the claimed user.
//! - The cluster map comes from the [`epkv_engine_api::ClusterView`] the front end is
//!   given ([`FrontendConfig::cluster`]); SET_VBUCKET tells it the map changed.
//! - A server request is written only between whole replies, and only to a connection
//!   that agreed to Duplex and a cluster map notification; a connection is not notified
//!   of a bucket map version it was already sent. The front
//!   end holds no topology and starts no replication: `epkv-cluster` does.
//! - Every implemented opcode has exactly one row in the opcode table, and the checks
//!   made before its handler runs are that row's, its privileges included.
//! - A connection's privileges are never older than the users at its current request: a
//!   change of users or roles is seen at the next request of every connection.
//!
//! Depends on `epkv-types`, `epkv-protocol`, `epkv-engine-api`, `epkv-executor` (for
//! the clock) and `epkv-auth` (SASL and users). Must never depend on `epkv-engine` or any
//! other engine implementation (its integration tests may, as a dev-dependency, to drive
//! the real bucket through a socket).
//!
//! ```
//! use epkv_engine_api::EngineStatus;
//! use epkv_frontend::{FrontendConfig, engine_status_to_wire};
//!
//! assert_eq!(engine_status_to_wire(EngineStatus::NotMyVbucket).as_u16(), 0x07);
//! let config = FrontendConfig { threads: 4, ..FrontendConfig::default() };
//! config.validate()?;
//! # Ok::<(), epkv_frontend::FrontendError>(())
//! ```
#![forbid(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]

mod access;
mod auth_guard;
mod buckets;
mod config;
mod connection;
mod dcp;
mod dispatch;
mod durable;
mod error;
mod frontend;
mod handlers;
mod response;
mod sasl;
mod session;
mod stats;
mod status_map;
mod stop_signal;
mod timings;
mod tls;
mod transport;
mod worker;

pub use buckets::{Buckets, DEFAULT_BUCKET, MAX_BUCKET_NAME_LEN, is_valid_bucket_name};
pub use config::{FrontendConfig, PROTOCOL_LEVEL, wire_version};
pub use error::{FrontendError, Result};
pub use frontend::{Frontend, FrontendHandle};
pub use stats::{AuthCounts, ConnectionCounts, FrontendStats};
pub use status_map::{engine_status_to_wire, status_for_client};
pub use timings::CommandTiming;
pub use tls::{ClientAuth, DEFAULT_TLS_PORT, TlsConfig, TlsReloader};
