//! SASL authentication and the user database of epkv.
//!
//! This crate is the server side of the SASL mechanisms Couchbase clients use (PLAIN and
//! SCRAM-SHA1, SCRAM-SHA256, SCRAM-SHA512 from RFC 5802 / RFC 7677) plus the store of
//! users, their salted credentials and the buckets they may use, with its TOML users file.
//! It is not a codec and does no I/O on connections: the front end decodes `SASL_AUTH` /
//! `SASL_STEP` and maps the results to status codes. It does not log; its errors are
//! safe to log (they never contain a password, proof or key).
//!
//! Key types:
//! - [`UserStore`]: users, SCRAM verifiers (salt, iterations, `StoredKey`, `ServerKey`
//!   per hash) and [`BucketAccess`]; load / parse / save the users file.
//! - [`UserDirectory`]: the current [`UserStore`] shared by the KV and HTTP ports, replaced
//!   as a whole when users change at run time.
//! - [`SaslServer`]: one authentication attempt; [`SaslServer::start`] for `SASL_AUTH`,
//!   [`SaslServer::step`] for `SASL_STEP`, each answering a [`SaslStep`].
//! - [`AuthError`]: everything that can fail; [`AuthError::is_auth_failure`] selects
//!   status `0x20`.
//! - [`MECHANISMS`]: the `SASL_LIST_MECHS` answer.
//! - [`rbac`]: Couchbase's roles ([`Roles`]), the privileges each grants ([`Privilege`],
//!   the table [`rbac::ROLES`]) and the decision, precomputed per bucket for the
//!   per-request check ([`BucketPrivileges`]).
//! - [`AuditLog`]: the optional audit file (JSON lines) of authentications, refusals and
//!   changes of users and buckets, shared by the KV port and the REST API.
//!
//! Invariants:
//! - No password is ever stored, in memory or in the file: only PBKDF2-derived SCRAM
//!   verifiers with a random salt per user and per hash from the OS CSPRNG. PLAIN is
//!   verified by deriving `StoredKey` from the offered password with the strongest stored
//!   hash and comparing in constant time.
//! - Server nonces come from the OS CSPRNG; the client nonce is treated as an opaque
//!   string up to the next `,` (the Couchbase C++ client sends spaces in it).
//! - An unknown user gets a stable fake salt and the usual iteration count, so a SCRAM
//!   exchange does not reveal whether the user exists; it fails at the final message.
//! - [`UserStore`] has no interior mutability and no locks; share it as
//!   `Arc<UserStore>` and replace the `Arc` to change it ([`UserDirectory`] does that).
//!   [`SaslServer`] is owned by one connection.
//!
//! Dependencies: RustCrypto `sha1`, `sha2`, `hmac`, `pbkdf2`, `subtle`; `base64`, `rand`,
//! `serde`, `serde_json`, `toml`, `thiserror`. It depends on no other epkv crate and must
//! never depend on the protocol, front end or engine crates (the front end and server
//! depend on it).
//!
//! ```
//! use std::sync::Arc;
//! use epkv_auth::{BucketAccess, SaslServer, SaslStep, UserStore};
//!
//! let mut users = UserStore::empty().with_iterations(4096);
//! users.insert_with_password("app", "s3cret", BucketAccess::only(["travel"]))?;
//! let users = Arc::new(users);
//!
//! // SASL_AUTH with PLAIN: "\0user\0password".
//! let (_, step) = SaslServer::start(users.clone(), b"PLAIN", b"\0app\0s3cret")?;
//! assert_eq!(step, SaslStep::Done { user: "app".into(), server_final: vec![] });
//! assert!(users.may_access("app", "travel") && !users.may_access("app", "default"));
//!
//! // A wrong password is an authentication failure (status 0x20).
//! let err = SaslServer::start(users.clone(), b"PLAIN", b"\0app\0guess").unwrap_err();
//! assert!(err.is_auth_failure());
//!
//! // SCRAM answers the client-first message with a challenge (status 0x21).
//! let (_server, step) = SaslServer::start(users, b"SCRAM-SHA512", b"n,,n=app,r=abc")?;
//! assert!(matches!(step, SaslStep::Continue(c) if c.starts_with(b"r=abc")));
//! # Ok::<(), epkv_auth::AuthError>(())
//! ```
#![forbid(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]

pub mod audit;
mod credential;
mod error;
mod mechanism;
mod plain;
pub mod rbac;
mod sasl_server;
mod scram;
mod user_directory;
mod user_store;

pub use audit::{AuditEvent, AuditKind, AuditLog, Interface};
pub use error::{AuthError, Result};
pub use mechanism::{MECHANISMS, Mechanism, ScramHash};
pub use rbac::{BucketPrivileges, Privilege, Privileges, Role, RoleError, Roles};
pub use sasl_server::{SaslServer, SaslStep};
pub use user_directory::UserDirectory;
pub use user_store::{
    BucketAccess, DEFAULT_ITERATIONS, MAX_BUCKET_NAME_LEN, MAX_ITERATIONS, MAX_USER_NAME_LEN,
    UserStore, write_file_atomically,
};
