//! The memcached binary protocol ("mcbp") with Couchbase's extensions, as a pure codec.
//!
//! What it is: packet headers for magics 0x80 (request), 0x81 (response), 0x08 (request
//! with flexible framing extras) and 0x18 (response with framing extras); framing for a
//! connection's read loop ([`frame_len`]); framing-extras (frame info) parsing; the
//! opcode, status and HELLO feature tables, each declared once ([`Opcode`], [`Status`],
//! [`Feature`]), the bucket capabilities clients gate features on
//! ([`BUCKET_CAPABILITIES`]), and the error map derived from the status table ([`error_map_json`]); strict validation of every length and per-opcode rule; typed decoding of
//! requests into [`Command`]s; and encoders for requests ([`RequestBuilder`]) and
//! responses ([`Response`]). What it is not: it does no I/O, keeps no connection state,
//! and knows nothing about the engine.
//!
//! Key types: [`Request`] (a borrowed view of one request packet), [`Command`] (a
//! validated, typed request), [`Response`] (encode and parse), [`RequestHeader`] /
//! [`ResponseHeader`], [`Limits`], [`HeaderError`] (the connection must be closed) and
//! [`Status`] (the request is answered with this status). The [`dcp`] module holds the
//! DCP codecs: [`dcp::DcpRequest`] for what a DCP client sends, [`dcp::DcpMessage`] and
//! the `dcp::encode_*` functions for what a producer streams back.
//!
//! Invariants: nothing from the wire is trusted. Every length is checked against the
//! buffer and against [`Limits`] before it is used; decoding never panics and never
//! allocates (fuzzed by `fuzz/`). A request whose header is consistent but whose content
//! breaks a rule is answered with a [`Status`]; a header that cannot be trusted gives a
//! [`HeaderError`] and the connection is closed.
//!
//! Depends on `epkv-types` and `bytes` only. Must never depend on an engine, the front
//! end or an async runtime.
//!
//! ```
//! use epkv_protocol::{frame_len, Command, Limits, Opcode, Request, RequestBuilder, Status};
//! use epkv_types::Vbid;
//!
//! let limits = Limits::default();
//! let wire = RequestBuilder::new(Opcode::GetK).vbucket(Vbid(526)).key(b"k1").to_vec()?;
//! let n = frame_len(&wire, &limits)?.ok_or("need more bytes")?;
//! let req = Request::parse(&wire[..n], &limits)?;
//! assert_eq!(req.header.vbucket, Vbid(526));
//! assert_eq!(
//!     Command::decode(&req),
//!     Ok(Command::Get { key: b"k1", with_key: true, quiet: false })
//! );
//! // An unknown opcode is answered, not fatal.
//! let wire = RequestBuilder::raw(0xee).to_vec()?;
//! let req = Request::parse(&wire, &limits)?;
//! assert_eq!(Command::decode(&req), Err(Status::UnknownCommand));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]

mod bucket_capability;
mod command;
pub mod dcp;
mod doc_tables;
mod durability;
mod error_map;
mod feature;
mod frame_info;
mod framing;
mod header;
mod header_error;
mod hello_features;
mod limits;
mod magic;
mod observe;
mod opcode;
pub mod range_scan;
mod request;
mod request_builder;
mod response;
mod server_request;
mod status;
mod subdoc;

pub use bucket_capability::{BUCKET_CAPABILITIES, bucket_capabilities_json};
pub use command::{
    ArithmeticOp, Command, StoreOp, is_durability_supported, is_preserve_ttl_supported,
};
pub use doc_tables::{bucket_capability_table, feature_table, opcode_table, status_table};
pub use durability::DurabilityRequirement;
pub use error_map::{
    ERROR_MAP_MAX_VERSION, ErrorAttribute, entry as error_map_entry, error_map_json,
};
pub use feature::Feature;
pub use frame_info::{
    FrameInfoId, FrameInfoIter, MAX_FRAME_INFO_FIELD, RequestFrameInfo, encode_frame_info,
};
pub use framing::{frame_hint, frame_len, response_frame_len, server_response_frame_len};
pub use header::{RequestHeader, ResponseHeader};
pub use header_error::{EncodeError, HeaderError};
pub use hello_features::HelloFeatures;
pub use limits::{DEFAULT_MAX_PACKET_BYTES, HEADER_LEN, Limits};
pub use magic::Magic;
pub use observe::{ObserveKeys, ObserveState, put_observe_entry};
pub use opcode::Opcode;
pub use request::Request;
pub use request_builder::RequestBuilder;
pub use response::Response;
pub use server_request::{
    CLUSTERMAP_NOTIFICATION_EXTRAS_LEN, ServerOpcode, clustermap_change_notification_len,
    put_clustermap_change_notification,
};
pub use status::Status;
pub use subdoc::{
    DOC_FLAG_ACCESS_DELETED, DOC_FLAG_ADD, DOC_FLAG_CREATE_AS_DELETED, DOC_FLAG_MKDOC,
    DOC_FLAG_REPLICA_READ, DOC_FLAG_REVIVE, DOC_FLAGS, MAX_SUBDOC_SPECS, PATH_FLAG_BINARY_VALUE,
    PATH_FLAG_EXPAND_MACROS, PATH_FLAG_MKDIR_P, PATH_FLAG_XATTR, SubdocSpec, check_spec_order,
    is_subdoc_lookup, is_subdoc_mutation, parse_specs, put_lookup_spec, put_mutation_spec,
};
