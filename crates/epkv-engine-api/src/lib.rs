//! The boundary between the epkv network front end and a bucket engine.
//!
//! This crate is what `epkv-frontend` sees of a bucket: the [`Engine`] trait, its request
//! types ([`StoreRequest`], [`ArithmeticRequest`], ...), its results ([`Item`],
//! [`MutationInfo`]) and [`EngineStatus`], the expected non-success outcomes (key not
//! found, CAS mismatch, not my vBucket, ...). It is not an engine and knows nothing of the
//! wire format: the front end maps [`EngineStatus`] to mcbp status codes in one exhaustive
//! `match`.
//! It also holds the front end's one question to the cluster manager, [`ClusterView`]
//! (the current map, for GET_CLUSTER_CONFIG and NOT_MY_VBUCKET), so that the front end
//! and `epkv-cluster` meet here and neither depends on the other.
//!
//! Invariants: requests reaching an engine have been validated by the front end (key
//! length, extras, datatype); engines may `debug_assert!` that. Expiry times cross this
//! boundary as the raw 32-bit protocol value; the engine interprets them with its own
//! clock (memcached rules, see [`Expiry`]).
//!
//! Depends on `epkv-types` only; must never depend on `epkv-protocol`, `epkv-frontend` or
//! an engine implementation.
//!
//! ```
//! use epkv_engine_api::{EngineStatus, Expiry};
//! assert_eq!(Expiry::from_wire(0), Expiry::Never);
//! assert!(EngineStatus::KeyNotFound.to_string().contains("not found"));
//! ```
#![forbid(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]

pub mod cluster;
pub mod dcp;
mod engine;
mod item;
pub mod range_scan;
mod request;
mod status;
pub mod xattr;

pub use cluster::{ClusterView, MapListener, NodePorts};
pub use dcp::{DcpEvent, DcpStream, DcpStreamError, DcpStreamRequest};
pub use engine::{Engine, FetchedCallback, PersistedCallback, StatSink, SyncWriteCallback};
pub use item::{
    DocMeta, FailoverEntry, Item, ItemView, KeyState, LookupFlags, MutationInfo, SubdocError,
    SubdocLookup, SubdocMutated, SubdocMutation, SubdocOp, SubdocSpec, VBucketSeqnos,
};
pub use range_scan::{
    RangeScanCreate, RangeScanCreated, RangeScanId, RangeScanKind, RangeScanLimits,
    RangeScanProgress, ScanBound, ScanContent, ScanDocument, ScanItem, SnapshotRequirements,
};
pub use request::{
    ArithmeticOp, ArithmeticRequest, DurabilityRequirements, Expiry, RemoveRequest, StoreOp,
    StoreRequest,
};
pub use status::{EngineResult, EngineStatus};
