//! Typed decoding of a [`Request`] into a [`Command`], with every per-opcode rule checked.
//!
//! The rules follow kv_engine's `daemon/mcbp_validators.cc`: each opcode names the extras
//! length it needs, whether a key and a value must, may or must not be present, whether
//! the CAS must be zero or set, which datatype bits it accepts, and whether the
//! durability and PreserveTtl frame infos are allowed. Checks run in kv_engine's order:
//! opcode, datatype, extras, key, value, CAS, datatype mask, framing extras, then the
//! opcode's own payload checks.

use crate::durability::DurabilityRequirement;
use crate::hello_features::HelloFeatures;
use crate::opcode::Opcode;
use crate::request::Request;
use crate::status::Status;
pub use epkv_types::{ArithmeticOp, StoreOp};
use epkv_types::{Cas, Datatype, MAX_KEY_LEN, VBucketState};

/// A validated client command, borrowing its key and value from the request packet.
///
/// The header fields every command shares (vbucket, opaque, raw opcode) stay in
/// [`Request::header`]. `quiet` is true for the quiet opcode variants (see
/// [`Opcode::is_quiet`] for what each suppresses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Command<'a> {
    /// GET, GETQ, GETK, GETKQ.
    Get {
        /// The key.
        key: &'a [u8],
        /// GETK/GETKQ: the response carries the key.
        with_key: bool,
        /// GETQ/GETKQ: no response on a miss.
        quiet: bool,
    },
    /// GET_REPLICA: read from a replica vBucket.
    GetReplica {
        /// The key.
        key: &'a [u8],
    },
    /// SET, ADD, REPLACE, APPEND, PREPEND and their quiet variants.
    Store {
        /// Which store.
        op: StoreOp,
        /// The key.
        key: &'a [u8],
        /// The value.
        value: &'a [u8],
        /// Client flags (extras bytes 0-3; zero for APPEND/PREPEND, which carry no extras).
        flags: u32,
        /// Raw expiry in memcached form (extras bytes 4-7; zero for APPEND/PREPEND).
        expiry: u32,
        /// Datatype of the value (only RAW and JSON bits are accepted).
        datatype: Datatype,
        /// CAS to match, or [`Cas::ANY`] (always ANY for ADD).
        cas: Cas,
        /// Durability requirements (frame info 1; non-quiet variants only).
        durability: Option<DurabilityRequirement>,
        /// Keep the existing expiry (frame info 5; SET, REPLACE, APPEND, PREPEND).
        preserve_ttl: bool,
        /// The quiet variant: no response on success.
        quiet: bool,
    },
    /// DELETE, DELETEQ.
    Delete {
        /// The key.
        key: &'a [u8],
        /// CAS to match, or [`Cas::ANY`].
        cas: Cas,
        /// Durability requirements (DELETE only).
        durability: Option<DurabilityRequirement>,
        /// DELETEQ: no response on success.
        quiet: bool,
    },
    /// INCREMENT, DECREMENT and their quiet variants.
    Arithmetic {
        /// Which way.
        op: ArithmeticOp,
        /// The key.
        key: &'a [u8],
        /// Amount to add or subtract (extras bytes 0-7).
        delta: u64,
        /// Value to create a missing key with (extras bytes 8-15).
        initial: u64,
        /// Raw expiry for a created key (extras bytes 16-19); `0xffff_ffff` means "do not
        /// create".
        expiry: u32,
        /// Durability requirements (non-quiet variants only).
        durability: Option<DurabilityRequirement>,
        /// Keep the existing expiry (frame info 5).
        preserve_ttl: bool,
        /// The quiet variant: no response on success.
        quiet: bool,
    },
    /// QUIT, QUITQ: close the connection (after replying, unless quiet).
    Quit {
        /// QUITQ: close without replying.
        quiet: bool,
    },
    /// FLUSH, FLUSHQ (a non-zero delay in the optional extras is NotSupported).
    Flush {
        /// FLUSHQ: no response on success.
        quiet: bool,
    },
    /// NOOP.
    Noop,
    /// VERSION.
    Version,
    /// STAT: the key names the group; empty is the default group.
    Stat {
        /// Group name (may be empty).
        group: &'a [u8],
    },
    /// VERBOSITY (extras: u32 level).
    Verbosity {
        /// The requested level.
        level: u32,
    },
    /// TOUCH (extras: u32 expiry).
    Touch {
        /// The key.
        key: &'a [u8],
        /// Raw expiry.
        expiry: u32,
        /// Durability requirements (kv_engine allows them on TOUCH).
        durability: Option<DurabilityRequirement>,
    },
    /// GAT, GATQ (extras: u32 expiry).
    Gat {
        /// The key.
        key: &'a [u8],
        /// Raw expiry.
        expiry: u32,
        /// Durability requirements (GAT only).
        durability: Option<DurabilityRequirement>,
        /// GATQ: no response on a miss.
        quiet: bool,
    },
    /// HELLO: key = optional agent name, value = u16 feature codes.
    Hello {
        /// The client's self-description (often JSON); may be empty.
        agent: &'a [u8],
        /// The requested features.
        features: HelloFeatures<'a>,
    },
    /// GET_LOCKED (extras: optional u32 lock timeout in seconds; 0 = server default).
    GetLocked {
        /// The key.
        key: &'a [u8],
        /// Lock timeout in seconds, 0 for the default.
        lock_timeout_secs: u32,
    },
    /// GET_META / GETQ_META (extras: optional 1 byte version; 2 asks for the datatype).
    GetMeta {
        /// The key.
        key: &'a [u8],
        /// The version byte (0 when absent).
        version: u8,
        /// GETQ_META: no reply for a missing key.
        quiet: bool,
    },
    /// OBSERVE: the value lists `(vbid u16, key length u16, key)` entries; see
    /// [`crate::ObserveKeys`].
    Observe {
        /// The raw list (checked by the decoder: at least one entry, none truncated).
        keys: &'a [u8],
    },
    /// A single-path sub-document command (SUBDOC_GET ... SUBDOC_COUNTER,
    /// SUBDOC_GET_COUNT): extras path length (u16), path flags (u8), then optionally the
    /// expiry (u32, mutations) and doc flags (u8); the value is the path, then the value.
    Subdoc {
        /// Which operation.
        op: Opcode,
        /// The document.
        key: &'a [u8],
        /// The request's value: the path, then the value (empty for lookups).
        body: &'a [u8],
        /// The path's length: `body.split_at(path_len)` gives path and value.
        path_len: usize,
        /// Path flags.
        path_flags: u8,
        /// Doc flags.
        doc_flags: u8,
        /// Expiry, raw (0 when absent).
        expiry: u32,
        /// The document's new flags (KV-Engine 7.6: extras of 11 or 12 bytes); `None`
        /// keeps the current ones.
        user_flags: Option<u32>,
        /// Required CAS (mutations).
        cas: Cas,
        /// Durability (mutations).
        durability: Option<DurabilityRequirement>,
        /// Keep the document's expiry (mutations).
        preserve_ttl: bool,
    },
    /// SUBDOC_MULTI_LOOKUP: extras doc flags (u8, optional); specs in the value.
    SubdocMultiLookup {
        /// The document.
        key: &'a [u8],
        /// Doc flags.
        doc_flags: u8,
        /// The specs (checked by the decoder; see [`crate::parse_specs`]).
        specs: &'a [u8],
    },
    /// SUBDOC_MULTI_MUTATION: extras expiry (u32) and/or doc flags (u8), each optional;
    /// specs in the value.
    SubdocMultiMutation {
        /// The document.
        key: &'a [u8],
        /// Doc flags.
        doc_flags: u8,
        /// Expiry, raw (0 when absent).
        expiry: u32,
        /// The document's new flags (KV-Engine 7.6: extras of 8 or 9 bytes); `None`
        /// keeps the current ones.
        user_flags: Option<u32>,
        /// The specs (checked by the decoder).
        specs: &'a [u8],
        /// Required CAS.
        cas: Cas,
        /// Durability.
        durability: Option<DurabilityRequirement>,
        /// Keep the document's expiry.
        preserve_ttl: bool,
    },
    /// EVICT_KEY: eject the document from memory (it must be persisted).
    EvictKey {
        /// The key.
        key: &'a [u8],
    },
    /// UNLOCK_KEY: the CAS from GET_LOCKED is in the header and must be set.
    UnlockKey {
        /// The key.
        key: &'a [u8],
        /// The lock's CAS (never zero).
        cas: Cas,
    },
    /// SET_VBUCKET for the header's vbucket.
    SetVbucket {
        /// The new state.
        state: VBucketState,
    },
    /// GET_VBUCKET for the header's vbucket.
    GetVbucket,
    /// ADJUST_TIMEOFDAY (epkv's test-only form: extras = i64 big-endian seconds). Sets
    /// the server clock's offset from real time to `offset_secs` (not cumulative).
    AdjustTimeofday {
        /// Offset from real time in seconds (negative moves the clock back).
        offset_secs: i64,
    },
    /// SASL_LIST_MECHS: asks for the mechanisms the server offers.
    SaslListMechs,
    /// SASL_AUTH: starts authentication.
    SaslAuth {
        /// The mechanism name (the key), e.g. `SCRAM-SHA512` or `PLAIN`.
        mechanism: &'a [u8],
        /// The client's first message (the value); opaque to the codec.
        data: &'a [u8],
    },
    /// SASL_STEP: continues a multi-step mechanism.
    SaslStep {
        /// The mechanism name (the key).
        mechanism: &'a [u8],
        /// The client's next message (the value).
        data: &'a [u8],
    },
    /// SELECT_BUCKET: the key names the bucket the connection uses from now on.
    SelectBucket {
        /// The bucket name.
        name: &'a [u8],
    },
    /// OBSERVE_SEQNO for the header's vBucket: the value is the 8-byte vBucket UUID the
    /// client's mutation token carries.
    ObserveSeqno {
        /// The vBucket UUID the client knows.
        vbucket_uuid: u64,
    },
    /// GET_CLUSTER_CONFIG: no extras, or 16 bytes (epoch i64, revision i64) naming the
    /// version the client already has.
    GetClusterConfig {
        /// `(epoch, revision)` the client already knows, if it said.
        known_version: Option<(i64, i64)>,
    },
    /// GET_ERROR_MAP: the value is the highest error map version (u16, at least 1) the
    /// client understands.
    GetErrorMap {
        /// The requested version.
        version: u16,
    },
    /// GET_COLLECTIONS_MANIFEST: the selected bucket's manifest (JSON).
    GetCollectionsManifest,
    /// GET_RANDOM_KEY: no key or value; extras none, the collection id (u32), or the id
    /// and a byte asking for the extended attributes too (non-zero).
    GetRandomKey {
        /// The collection (the default one without extras).
        collection: u32,
        /// Whether the reply's value keeps its extended attributes.
        xattrs: bool,
    },
    /// GET_COLLECTION_ID: the path `scope.collection` is the value (or, as newer clients
    /// send it, the key).
    GetCollectionId {
        /// The path.
        path: &'a [u8],
    },
    /// GET_SCOPE_ID: the path `scope` is the value (or the key).
    GetScopeId {
        /// The path.
        path: &'a [u8],
    },
    /// RANGE_SCAN_CREATE for the header's vBucket: the value is the JSON the front end
    /// parses with [`crate::range_scan::CreateRequest::parse`] (the datatype must be JSON).
    RangeScanCreate {
        /// The JSON value.
        spec: &'a [u8],
    },
    /// RANGE_SCAN_CONTINUE: the next batch of a scan.
    RangeScanContinue(crate::range_scan::ContinueRequest),
    /// RANGE_SCAN_CANCEL: closes a scan.
    RangeScanCancel {
        /// The scan's id.
        id: [u8; crate::range_scan::SCAN_ID_LEN],
    },
}

/// Extras-length rule of an opcode.
#[derive(Debug, Clone, Copy)]
enum ExtrasRule {
    Exactly(u8),
    ZeroOr(u8),
    /// SET_VBUCKET: 0, 1 or 4, checked by its own decoder.
    SetVbucket,
    /// Any of these lengths.
    OneOf(&'static [u8]),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Presence {
    Zero,
    NonZero,
    Any,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CasRule {
    NotSet,
    Set,
    Any,
}

/// The validation rules of one opcode.
#[derive(Debug, Clone, Copy)]
struct Spec {
    extras: ExtrasRule,
    key: Presence,
    value: Presence,
    cas: CasRule,
    datatype_mask: u8,
    durability: bool,
    preserve_ttl: bool,
}

const RAW: u8 = Datatype::RAW.0;
const RAW_JSON: u8 = Datatype::JSON.0;
/// Values that may arrive Snappy-compressed (the front end refuses the bit from a client
/// that did not negotiate Snappy).
const RAW_JSON_SNAPPY: u8 = Datatype::JSON.0 | Datatype::SNAPPY.0;
/// Values that may also carry extended attributes (SET, ADD, REPLACE; the front end
/// refuses the XATTR bit from a client that did not negotiate it).
const ANY_DATATYPE: u8 = Datatype::ALL.0;

const fn spec(extras: ExtrasRule, key: Presence, value: Presence, cas: CasRule) -> Spec {
    Spec {
        extras,
        key,
        value,
        cas,
        datatype_mask: RAW,
        durability: false,
        preserve_ttl: false,
    }
}

const fn with_datatype(mut s: Spec, mask: u8) -> Spec {
    s.datatype_mask = mask;
    s
}

const fn durable(mut s: Spec) -> Spec {
    s.durability = true;
    s
}

const fn ttl(mut s: Spec) -> Spec {
    s.preserve_ttl = true;
    s
}

/// Returns the rules for an implemented opcode; `None` means "not implemented".
fn spec_for(op: Opcode) -> Option<Spec> {
    use CasRule as C;
    use ExtrasRule as E;
    use Presence as P;
    let get = spec(E::Exactly(0), P::NonZero, P::Zero, C::NotSet);
    let store = with_datatype(
        spec(E::Exactly(8), P::NonZero, P::Any, C::Any),
        ANY_DATATYPE,
    );
    let add = with_datatype(
        spec(E::Exactly(8), P::NonZero, P::Any, C::NotSet),
        ANY_DATATYPE,
    );
    let concat = with_datatype(
        spec(E::Exactly(0), P::NonZero, P::Any, C::Any),
        RAW_JSON_SNAPPY,
    );
    let delete = spec(E::Exactly(0), P::NonZero, P::Zero, C::Any);
    let arith = spec(E::Exactly(20), P::NonZero, P::Zero, C::NotSet);
    let bare = spec(E::Exactly(0), P::Zero, P::Zero, C::NotSet);
    let gat = spec(E::Exactly(4), P::NonZero, P::Zero, C::NotSet);
    Some(match op {
        Opcode::Get | Opcode::GetQ | Opcode::GetK | Opcode::GetKQ | Opcode::GetReplica => get,
        Opcode::Set | Opcode::Replace => ttl(durable(store)),
        Opcode::SetQ | Opcode::ReplaceQ => ttl(store),
        Opcode::Add => durable(add),
        Opcode::AddQ => add,
        Opcode::Append | Opcode::Prepend => ttl(durable(concat)),
        Opcode::AppendQ | Opcode::PrependQ => ttl(concat),
        Opcode::Delete => durable(delete),
        Opcode::DeleteQ => delete,
        Opcode::Increment | Opcode::Decrement => ttl(durable(arith)),
        Opcode::IncrementQ | Opcode::DecrementQ => ttl(arith),
        Opcode::Quit | Opcode::QuitQ | Opcode::Noop | Opcode::Version | Opcode::GetVbucket => bare,
        Opcode::Flush | Opcode::FlushQ => spec(E::ZeroOr(4), P::Zero, P::Zero, C::NotSet),
        Opcode::Stat => spec(E::Exactly(0), P::Any, P::Zero, C::NotSet),
        Opcode::Verbosity => spec(E::Exactly(4), P::Zero, P::Zero, C::NotSet),
        Opcode::Touch | Opcode::Gat => durable(gat),
        Opcode::GatQ => gat,
        Opcode::Hello => spec(E::Exactly(0), P::Any, P::Any, C::NotSet),
        Opcode::GetLocked => spec(E::ZeroOr(4), P::NonZero, P::Zero, C::NotSet),
        Opcode::UnlockKey => spec(E::Exactly(0), P::NonZero, P::Zero, C::Set),
        Opcode::EvictKey => spec(E::Exactly(0), P::NonZero, P::Zero, C::NotSet),
        Opcode::GetMeta | Opcode::GetqMeta => spec(E::ZeroOr(1), P::NonZero, P::Zero, C::NotSet),
        Opcode::SubdocGet | Opcode::SubdocExists | Opcode::SubdocGetCount => {
            spec(E::OneOf(&[3, 4]), P::NonZero, P::Any, C::NotSet)
        }
        op if crate::subdoc::is_subdoc_mutation(op) => ttl(durable(spec(
            E::OneOf(&[3, 4, 7, 8, 11, 12]),
            P::NonZero,
            P::Any,
            C::Any,
        ))),
        Opcode::SubdocMultiLookup => spec(E::ZeroOr(1), P::NonZero, P::NonZero, C::NotSet),
        Opcode::SubdocMultiMutation => ttl(durable(spec(
            E::OneOf(&[0, 1, 4, 5, 8, 9]),
            P::NonZero,
            P::NonZero,
            C::Any,
        ))),
        Opcode::Observe => spec(E::Exactly(0), P::Zero, P::NonZero, C::NotSet),
        Opcode::SetVbucket => with_datatype(spec(E::SetVbucket, P::Zero, P::Any, C::Any), RAW_JSON),
        Opcode::AdjustTimeofday => spec(E::Exactly(8), P::Zero, P::Zero, C::NotSet),
        Opcode::SaslListMechs => bare,
        Opcode::SaslAuth | Opcode::SaslStep => spec(E::Exactly(0), P::NonZero, P::Any, C::NotSet),
        Opcode::SelectBucket => spec(E::Exactly(0), P::NonZero, P::Zero, C::NotSet),
        Opcode::ObserveSeqno => spec(E::Exactly(0), P::Zero, P::NonZero, C::NotSet),
        Opcode::GetClusterConfig => spec(E::ZeroOr(16), P::Zero, P::Zero, C::NotSet),
        Opcode::GetErrorMap => spec(E::Exactly(0), P::Zero, P::NonZero, C::NotSet),
        Opcode::GetCollectionsManifest => bare,
        Opcode::GetRandomKey => spec(E::OneOf(&[0, 4, 5]), P::Zero, P::Zero, C::NotSet),
        Opcode::GetCollectionId | Opcode::GetScopeId => {
            spec(E::Exactly(0), P::Any, P::Any, C::NotSet)
        }
        Opcode::RangeScanCreate => with_datatype(
            spec(E::Exactly(0), P::Zero, P::NonZero, C::NotSet),
            RAW_JSON,
        ),
        Opcode::RangeScanContinue => spec(E::Exactly(28), P::Zero, P::Zero, C::NotSet),
        Opcode::RangeScanCancel => spec(E::Exactly(16), P::Zero, P::Zero, C::NotSet),
        _ => return None,
    })
}

/// Returns whether a command with this opcode may carry a durability frame.
#[must_use]
pub fn is_durability_supported(op: Opcode) -> bool {
    spec_for(op).is_some_and(|s| s.durability)
}

/// Returns whether a command with this opcode may carry a PreserveTtl frame.
#[must_use]
pub fn is_preserve_ttl_supported(op: Opcode) -> bool {
    spec_for(op).is_some_and(|s| s.preserve_ttl)
}

fn check_presence(rule: Presence, len: usize) -> Result<(), Status> {
    match (rule, len) {
        (Presence::Zero, 0) | (Presence::Any, _) => Ok(()),
        (Presence::Zero, _) | (Presence::NonZero, 0) => Err(Status::Einval),
        (Presence::NonZero, _) => Ok(()),
    }
}

fn be_u32(b: &[u8]) -> u32 {
    b.first_chunk::<4>().map_or(0, |c| u32::from_be_bytes(*c))
}

fn be_u64(b: &[u8]) -> u64 {
    b.first_chunk::<8>().map_or(0, |c| u64::from_be_bytes(*c))
}

impl<'a> Command<'a> {
    /// The durability requirement of a command that writes a document (the SET family,
    /// DELETE, INCREMENT/DECREMENT, TOUCH, sub-document mutations), for a bucket's minimum
    /// durability level to raise; `None` for reads (GAT included) and other commands.
    pub fn write_durability_mut(&mut self) -> Option<&mut Option<DurabilityRequirement>> {
        match self {
            Self::Store { durability, .. }
            | Self::Delete { durability, .. }
            | Self::Arithmetic { durability, .. }
            | Self::Touch { durability, .. }
            | Self::SubdocMultiMutation { durability, .. } => Some(durability),
            Self::Subdoc { op, durability, .. } if is_durability_supported(*op) => Some(durability),
            _ => None,
        }
    }

    /// Validates a request and decodes it into a command.
    ///
    /// # Errors
    /// The status to answer the request with:
    /// - [`Status::UnknownCommand`]: an opcode that is not in the table or not implemented,
    ///   and every DCP opcode ([`Opcode::is_dcp`]): those are decoded from the raw
    ///   [`Request`] by [`crate::dcp::DcpRequest::decode`] instead;
    /// - [`Status::Einval`]: unknown datatype bits or bits the opcode does not accept;
    ///   wrong extras length; a key or value that must be absent or present and is not;
    ///   a key over 250 bytes; a CAS that must be zero or set and is not; a malformed
    ///   frame info; a durability frame on an opcode that does not support it; an odd
    ///   HELLO value; a bad SET_VBUCKET state;
    /// - [`Status::NotSupported`]: PreserveTtl on an opcode without expiry semantics,
    ///   a frame info id epkv does not implement, a FLUSH with a non-zero delay;
    /// - [`Status::DurabilityInvalidLevel`]: an unknown durability level;
    /// - [`Status::UnknownFrameInfo`]: an unknown frame info id.
    pub fn decode(req: &Request<'a>) -> Result<Command<'a>, Status> {
        let op = req
            .opcode()
            .filter(|op| op.is_implemented())
            .ok_or(Status::UnknownCommand)?;
        let spec = spec_for(op).ok_or(Status::UnknownCommand)?;
        let h = &req.header;
        if !h.datatype.is_valid() {
            return Err(Status::Einval);
        }
        let extras_ok = match spec.extras {
            ExtrasRule::Exactly(n) => h.extras_len == n,
            ExtrasRule::ZeroOr(n) => h.extras_len == 0 || h.extras_len == n,
            ExtrasRule::SetVbucket => matches!(h.extras_len, 0 | 1 | 4),
            ExtrasRule::OneOf(lens) => lens.contains(&h.extras_len),
        };
        if !extras_ok {
            return Err(Status::Einval);
        }
        check_presence(spec.key, req.key.len())?;
        if req.key.len() > MAX_KEY_LEN {
            return Err(Status::Einval);
        }
        check_presence(spec.value, req.value.len())?;
        match (spec.cas, h.cas.is_any()) {
            (CasRule::NotSet, false) | (CasRule::Set, true) => return Err(Status::Einval),
            _ => {}
        }
        if h.datatype.0 & !spec.datatype_mask != 0 {
            return Err(Status::Einval);
        }
        let frames = req.frame_info()?;
        if frames.durability.is_some() && !spec.durability {
            return Err(Status::Einval);
        }
        if frames.preserve_ttl && !spec.preserve_ttl {
            return Err(Status::NotSupported);
        }
        Self::build(op, req, frames.durability, frames.preserve_ttl)
    }

    fn build(
        op: Opcode,
        req: &Request<'a>,
        durability: Option<DurabilityRequirement>,
        preserve_ttl: bool,
    ) -> Result<Command<'a>, Status> {
        let key = req.key;
        let extras = req.extras;
        let quiet = op.is_quiet();
        let cas = req.header.cas;
        let store = |op: StoreOp| Command::Store {
            op,
            key,
            value: req.value,
            flags: be_u32(extras),
            expiry: extras.get(4..).map_or(0, be_u32),
            datatype: req.header.datatype,
            cas,
            durability,
            preserve_ttl,
            quiet,
        };
        let arith = |op: ArithmeticOp| Command::Arithmetic {
            op,
            key,
            delta: be_u64(extras),
            initial: extras.get(8..).map_or(0, be_u64),
            expiry: extras.get(16..).map_or(0, be_u32),
            durability,
            preserve_ttl,
            quiet,
        };
        Ok(match op {
            Opcode::Get | Opcode::GetQ => Command::Get {
                key,
                with_key: false,
                quiet,
            },
            Opcode::GetK | Opcode::GetKQ => Command::Get {
                key,
                with_key: true,
                quiet,
            },
            Opcode::GetReplica => Command::GetReplica { key },
            Opcode::Set | Opcode::SetQ => store(StoreOp::Set),
            Opcode::Add | Opcode::AddQ => store(StoreOp::Add),
            Opcode::Replace | Opcode::ReplaceQ => store(StoreOp::Replace),
            Opcode::Append | Opcode::AppendQ => store(StoreOp::Append),
            Opcode::Prepend | Opcode::PrependQ => store(StoreOp::Prepend),
            Opcode::Delete | Opcode::DeleteQ => Command::Delete {
                key,
                cas,
                durability,
                quiet,
            },
            Opcode::Increment | Opcode::IncrementQ => arith(ArithmeticOp::Increment),
            Opcode::Decrement | Opcode::DecrementQ => arith(ArithmeticOp::Decrement),
            Opcode::Quit | Opcode::QuitQ => Command::Quit { quiet },
            Opcode::Flush | Opcode::FlushQ => {
                if be_u32(extras) != 0 {
                    // kv_engine: "Delayed flush no longer supported".
                    return Err(Status::NotSupported);
                }
                Command::Flush { quiet }
            }
            Opcode::Noop => Command::Noop,
            Opcode::Version => Command::Version,
            Opcode::Stat => Command::Stat { group: key },
            Opcode::Verbosity => Command::Verbosity {
                level: be_u32(extras),
            },
            Opcode::Touch => Command::Touch {
                key,
                expiry: be_u32(extras),
                durability,
            },
            Opcode::Gat | Opcode::GatQ => Command::Gat {
                key,
                expiry: be_u32(extras),
                durability,
                quiet,
            },
            Opcode::Hello => {
                if !req.value.len().is_multiple_of(2) {
                    return Err(Status::Einval);
                }
                Command::Hello {
                    agent: key,
                    features: HelloFeatures::new(req.value),
                }
            }
            Opcode::GetLocked => Command::GetLocked {
                key,
                lock_timeout_secs: be_u32(extras),
            },
            Opcode::UnlockKey => Command::UnlockKey { key, cas },
            Opcode::EvictKey => Command::EvictKey { key },
            op if crate::subdoc::is_subdoc_lookup(op) || crate::subdoc::is_subdoc_mutation(op) => {
                let path_len = usize::from(u16::from_be_bytes([extras[0], extras[1]]));
                let path_flags = extras[2];
                crate::subdoc::check_path_flags(
                    op,
                    path_flags,
                    crate::subdoc::is_subdoc_lookup(op),
                )?;
                let (expiry, doc_flags) = match extras.len() {
                    4 => (0, extras[3]),
                    7 | 11 => (be_u32(&extras[3..]), 0),
                    8 | 12 => (be_u32(&extras[3..]), extras[extras.len() - 1]),
                    _ => (0, 0),
                };
                let user_flags = (extras.len() >= 11).then(|| be_u32(&extras[7..]));
                if path_len > req.value.len()
                    || (crate::subdoc::is_subdoc_lookup(op) && path_len != req.value.len())
                {
                    return Err(Status::Einval);
                }
                Command::Subdoc {
                    op,
                    key,
                    body: req.value,
                    path_len,
                    path_flags,
                    doc_flags,
                    expiry,
                    user_flags,
                    cas,
                    durability,
                    preserve_ttl,
                }
            }
            Opcode::SubdocMultiLookup => {
                crate::subdoc::parse_specs(req.value, false)?;
                Command::SubdocMultiLookup {
                    key,
                    doc_flags: extras.first().copied().unwrap_or(0),
                    specs: req.value,
                }
            }
            Opcode::SubdocMultiMutation => {
                crate::subdoc::parse_specs(req.value, true)?;
                let (expiry, doc_flags) = match extras.len() {
                    1 => (0, extras[0]),
                    4 | 8 => (be_u32(extras), 0),
                    5 | 9 => (be_u32(extras), extras[extras.len() - 1]),
                    _ => (0, 0),
                };
                let user_flags = (extras.len() >= 8).then(|| be_u32(&extras[4..]));
                Command::SubdocMultiMutation {
                    key,
                    doc_flags,
                    expiry,
                    user_flags,
                    specs: req.value,
                    cas,
                    durability,
                    preserve_ttl,
                }
            }
            Opcode::GetMeta | Opcode::GetqMeta => Command::GetMeta {
                key,
                version: extras.first().copied().unwrap_or(0),
                quiet: op == Opcode::GetqMeta,
            },
            Opcode::Observe => {
                if crate::observe::ObserveKeys::new(req.value).any(|e| e.is_err()) {
                    return Err(Status::Einval);
                }
                Command::Observe { keys: req.value }
            }
            Opcode::SetVbucket => Command::SetVbucket {
                state: decode_vbucket_state(req)?,
            },
            Opcode::GetVbucket => Command::GetVbucket,
            Opcode::AdjustTimeofday => Command::AdjustTimeofday {
                offset_secs: be_u64(extras).cast_signed(),
            },
            Opcode::SaslListMechs => Command::SaslListMechs,
            Opcode::SaslAuth => Command::SaslAuth {
                mechanism: key,
                data: req.value,
            },
            Opcode::SaslStep => Command::SaslStep {
                mechanism: key,
                data: req.value,
            },
            Opcode::SelectBucket => Command::SelectBucket { name: key },
            Opcode::ObserveSeqno => {
                if req.value.len() != 8 {
                    return Err(Status::Einval);
                }
                Command::ObserveSeqno {
                    vbucket_uuid: be_u64(req.value),
                }
            }
            Opcode::GetClusterConfig => Command::GetClusterConfig {
                known_version: (extras.len() == 16).then(|| {
                    (
                        be_u64(extras).cast_signed(),
                        extras.get(8..).map_or(0, be_u64).cast_signed(),
                    )
                }),
            },
            Opcode::GetCollectionsManifest => Command::GetCollectionsManifest,
            Opcode::GetRandomKey => Command::GetRandomKey {
                collection: if extras.len() >= 4 { be_u32(extras) } else { 0 },
                xattrs: extras.get(4).is_some_and(|&b| b != 0),
            },
            Opcode::GetCollectionId | Opcode::GetScopeId => {
                let path = if req.value.is_empty() { key } else { req.value };
                if op == Opcode::GetCollectionId {
                    Command::GetCollectionId { path }
                } else {
                    Command::GetScopeId { path }
                }
            }
            Opcode::GetErrorMap => {
                let version = match *req.value {
                    [hi, lo] => u16::from_be_bytes([hi, lo]),
                    _ => return Err(Status::Einval),
                };
                if version == 0 {
                    return Err(Status::Einval);
                }
                Command::GetErrorMap { version }
            }
            Opcode::RangeScanCreate => {
                // kv_engine: "Datatype must be JSON".
                if req.header.datatype != Datatype::JSON {
                    return Err(Status::Einval);
                }
                Command::RangeScanCreate { spec: req.value }
            }
            Opcode::RangeScanContinue => Command::RangeScanContinue(
                crate::range_scan::ContinueRequest::decode(extras).ok_or(Status::Einval)?,
            ),
            Opcode::RangeScanCancel => Command::RangeScanCancel {
                id: extras.try_into().map_err(|_| Status::Einval)?,
            },
            _ => return Err(Status::UnknownCommand),
        })
    }

    /// Returns the opcode this command is sent with.
    #[must_use]
    pub fn opcode(&self) -> Opcode {
        match *self {
            Command::GetReplica { .. } => Opcode::GetReplica,
            Command::Get {
                with_key: false,
                quiet: false,
                ..
            } => Opcode::Get,
            Command::Get {
                with_key: false,
                quiet: true,
                ..
            } => Opcode::GetQ,
            Command::Get {
                with_key: true,
                quiet: false,
                ..
            } => Opcode::GetK,
            Command::Get {
                with_key: true,
                quiet: true,
                ..
            } => Opcode::GetKQ,
            Command::Store { op, quiet, .. } => match (op, quiet) {
                (StoreOp::Set, false) => Opcode::Set,
                (StoreOp::Set, true) => Opcode::SetQ,
                (StoreOp::Add, false) => Opcode::Add,
                (StoreOp::Add, true) => Opcode::AddQ,
                (StoreOp::Replace, false) => Opcode::Replace,
                (StoreOp::Replace, true) => Opcode::ReplaceQ,
                (StoreOp::Append, false) => Opcode::Append,
                (StoreOp::Append, true) => Opcode::AppendQ,
                (StoreOp::Prepend, false) => Opcode::Prepend,
                (StoreOp::Prepend, true) => Opcode::PrependQ,
            },
            Command::Delete { quiet: false, .. } => Opcode::Delete,
            Command::Delete { quiet: true, .. } => Opcode::DeleteQ,
            Command::Arithmetic { op, quiet, .. } => match (op, quiet) {
                (ArithmeticOp::Increment, false) => Opcode::Increment,
                (ArithmeticOp::Increment, true) => Opcode::IncrementQ,
                (ArithmeticOp::Decrement, false) => Opcode::Decrement,
                (ArithmeticOp::Decrement, true) => Opcode::DecrementQ,
            },
            Command::Quit { quiet: false } => Opcode::Quit,
            Command::Quit { quiet: true } => Opcode::QuitQ,
            Command::Flush { quiet: false } => Opcode::Flush,
            Command::Flush { quiet: true } => Opcode::FlushQ,
            Command::Noop => Opcode::Noop,
            Command::Version => Opcode::Version,
            Command::Stat { .. } => Opcode::Stat,
            Command::Verbosity { .. } => Opcode::Verbosity,
            Command::Touch { .. } => Opcode::Touch,
            Command::Gat { quiet: false, .. } => Opcode::Gat,
            Command::Gat { quiet: true, .. } => Opcode::GatQ,
            Command::Hello { .. } => Opcode::Hello,
            Command::GetLocked { .. } => Opcode::GetLocked,
            Command::UnlockKey { .. } => Opcode::UnlockKey,
            Command::EvictKey { .. } => Opcode::EvictKey,
            Command::Subdoc { op, .. } => op,
            Command::SubdocMultiLookup { .. } => Opcode::SubdocMultiLookup,
            Command::SubdocMultiMutation { .. } => Opcode::SubdocMultiMutation,
            Command::GetMeta { quiet: false, .. } => Opcode::GetMeta,
            Command::GetMeta { quiet: true, .. } => Opcode::GetqMeta,
            Command::Observe { .. } => Opcode::Observe,
            Command::SetVbucket { .. } => Opcode::SetVbucket,
            Command::GetVbucket => Opcode::GetVbucket,
            Command::AdjustTimeofday { .. } => Opcode::AdjustTimeofday,
            Command::SaslListMechs => Opcode::SaslListMechs,
            Command::SaslAuth { .. } => Opcode::SaslAuth,
            Command::SaslStep { .. } => Opcode::SaslStep,
            Command::SelectBucket { .. } => Opcode::SelectBucket,
            Command::ObserveSeqno { .. } => Opcode::ObserveSeqno,
            Command::GetClusterConfig { .. } => Opcode::GetClusterConfig,
            Command::GetErrorMap { .. } => Opcode::GetErrorMap,
            Command::GetCollectionsManifest => Opcode::GetCollectionsManifest,
            Command::GetCollectionId { .. } => Opcode::GetCollectionId,
            Command::GetRandomKey { .. } => Opcode::GetRandomKey,
            Command::GetScopeId { .. } => Opcode::GetScopeId,
            Command::RangeScanCreate { .. } => Opcode::RangeScanCreate,
            Command::RangeScanContinue(_) => Opcode::RangeScanContinue,
            Command::RangeScanCancel { .. } => Opcode::RangeScanCancel,
        }
    }

    /// The same command addressing `new` instead of its document key (the front end
    /// gives the engine keys encoded with their collection); unchanged without one.
    #[must_use]
    pub fn with_document_key<'b>(&self, new: &'b [u8]) -> Command<'b>
    where
        'a: 'b,
    {
        let mut c: Command<'b> = *self;
        match &mut c {
            Command::Get { key, .. }
            | Command::GetReplica { key }
            | Command::Store { key, .. }
            | Command::Delete { key, .. }
            | Command::Arithmetic { key, .. }
            | Command::Touch { key, .. }
            | Command::Gat { key, .. }
            | Command::GetLocked { key, .. }
            | Command::UnlockKey { key, .. }
            | Command::EvictKey { key }
            | Command::GetMeta { key, .. }
            | Command::Subdoc { key, .. }
            | Command::SubdocMultiLookup { key, .. }
            | Command::SubdocMultiMutation { key, .. } => *key = new,
            _ => {}
        }
        c
    }

    /// The collection a command without a document key addresses (GET_RANDOM_KEY's), for
    /// checking a privilege granted on that collection only.
    #[must_use]
    pub fn collection_without_key(&self) -> Option<u32> {
        match *self {
            Command::GetRandomKey { collection, .. } => Some(collection),
            _ => None,
        }
    }

    /// Returns the key the command addresses, if it addresses a document (used to route
    /// it to the key's vBucket). STAT's group and HELLO's agent are not document keys.
    #[must_use]
    pub fn document_key(&self) -> Option<&'a [u8]> {
        match *self {
            Command::Get { key, .. }
            | Command::GetReplica { key }
            | Command::Store { key, .. }
            | Command::Delete { key, .. }
            | Command::Arithmetic { key, .. }
            | Command::Touch { key, .. }
            | Command::Gat { key, .. }
            | Command::GetLocked { key, .. }
            | Command::UnlockKey { key, .. }
            | Command::EvictKey { key }
            | Command::GetMeta { key, .. }
            | Command::Subdoc { key, .. }
            | Command::SubdocMultiLookup { key, .. }
            | Command::SubdocMultiMutation { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// Decodes SET_VBUCKET's state from one of the three encodings kv_engine accepts:
/// 4 bytes of extras (u32, value empty); 1 byte of extras (value empty, or JSON with the
/// JSON datatype; epkv ignores the JSON topology); or no extras and a 4-byte value (u32,
/// ns_server's older form). The state must be 1..=4.
fn decode_vbucket_state(req: &Request<'_>) -> Result<VBucketState, Status> {
    let json = req.header.datatype.contains(Datatype::JSON);
    let raw = match (req.extras.len(), req.value.len()) {
        (4, 0) if !json => be_u32(req.extras),
        (1, 0) if !json => u32::from(req.extras[0]),
        (1, _) if json => u32::from(req.extras[0]),
        (0, 4) if !json => be_u32(req.value),
        _ => return Err(Status::Einval),
    };
    u8::try_from(raw)
        .ok()
        .and_then(VBucketState::from_u8)
        .ok_or(Status::Einval)
}
