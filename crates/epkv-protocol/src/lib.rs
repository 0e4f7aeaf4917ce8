//! The memcached binary protocol ("mcbp") with Couchbase's extensions, as a pure codec.
//!
//! What it is: packet headers for magics 0x80 (request), 0x81 (response), 0x08 (request
//! with flexible framing extras) and 0x18 (response with framing extras); framing-extras
//! (frame info) parsing; the opcode, status and HELLO feature tables, each declared once
//! ([`Opcode`], [`Status`], [`Feature`]); strict validation of every length and per-opcode
//! rule; typed decoding of requests into [`Command`]s; and encoders for requests and
//! responses. What it is not: it does no I/O and keeps no connection state.
//!
//! Invariants: nothing from the wire is trusted. Every length is checked against the
//! buffer and against the limits in [`Limits`] before it is used; decoding never panics
//! and never allocates in proportion to an unchecked length (fuzzed by `fuzz/`).
//!
//! Depends on `epkv-types` only. Must never depend on an engine, the front end or an
//! async runtime.
//!
//! ```
//! use epkv_protocol::{Opcode, Status};
//! assert_eq!(Opcode::from_u8(0x01), Some(Opcode::Set));
//! assert_eq!(Status::NotMyVbucket.as_u16(), 0x07);
//! ```
#![forbid(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]

mod feature;
mod opcode;
mod status;

pub use feature::Feature;
pub use opcode::Opcode;
pub use status::Status;
