//! The opcode table: every opcode the front end executes, with its handler and the checks
//! the dispatcher makes before calling it, one row per opcode.
//!
//! The shape is KV-Engine's executor table (`daemon/mcbp_executors.cc`): an array indexed
//! by the opcode byte, so finding a request's row is one load, whatever the number of
//! opcodes. The rows are declared once in [`ENTRIES`]; [`TABLE`] is built from them at
//! compile time, and the build fails if an opcode has two rows.
//!
//! What the codec checks (extras, key and value lengths, which frame infos an opcode
//! accepts, durability frames included) is `epkv_protocol`'s own table, applied by
//! [`epkv_protocol::Command::decode`] before a handler runs; this table holds what the
//! front end checks.
//!
//! The privilege column ([`Needs`]) is KV-Engine's `daemon/mcbp_privileges.cc`: every row
//! names what its request needs, a decision per opcode (a unit test lists them). A data
//! request is checked against the collection its key names; the other requests against
//! the selected bucket (and, with none selected, only their node-wide privileges: their
//! handlers answer NoBucket).
//!
//! Adding a column: add a field to [`Entry`] and a parameter to [`row`], give every row
//! its value (a new column is a decision per opcode), and make
//! [`Session::execute`](crate::session::Session) consult it in `dispatch`.

use crate::dispatch::{DataFn, DcpFn, SessionFn};
use crate::handlers::{admin, collections, dcp, kv, range_scan, setup, stat, subdoc};
use epkv_auth::Privilege;
use epkv_protocol::Opcode;

/// What a handler is given, which also decides how its request is read.
#[derive(Clone, Copy)]
pub(crate) enum Handler {
    /// A connection-level command: decoded, run on the session itself.
    Session(SessionFn),
    /// A data command: decoded, its document key encoded for the engine and its vBucket
    /// chosen, then run against the selected bucket's engine. A command the engine
    /// answers WouldBlock runs again after its background fetch.
    Data(DataFn),
    /// A DCP message: handed over undecoded (DCP has its own codec,
    /// [`epkv_protocol::dcp`]), with the selected bucket.
    Dcp(DcpFn),
}

/// The bucket a request needs the connection to have selected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bucket {
    /// None: the handler works without one (or looks at the selection itself).
    Any,
    /// A selected bucket; NoBucket (0x08) without one.
    Selected,
    /// A selected bucket that has not been dropped: NoBucket without one, and a dropped
    /// bucket closes the connection (as Couchbase Server closes connections on a deleted
    /// bucket).
    Live,
}

/// What the request needs the connection to be on the DCP side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dcp {
    /// Any connection.
    Any,
    /// A connection DCP_OPEN made a producer; Einval otherwise.
    Producer,
}

/// What the connection's look-ahead does when this request is next in its buffer (see
/// [`Session::prefetch`](crate::session::Session::prefetch)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hint {
    /// Nothing.
    None,
    /// Hints the engine about the request's key (or only its vBucket, two requests
    /// ahead), so its cache misses overlap the current request's work. Only the common
    /// key-value operations, whose lookup is their cost.
    Key,
}

/// The privileges a request needs, checked against the connection's user on the selected
/// bucket (and, for a request with a document key, the key's collection) before its
/// handler runs. The assignments are KV-Engine's (`daemon/mcbp_privileges.cc`); where a
/// row departs from them it says why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Needs {
    /// No privilege: the request is open to any connection, or its handler makes the
    /// check itself (SELECT_BUCKET, DCP_OPEN). The collections manifest and the
    /// collection-id lookups are open to any connection on the bucket: unlike KV-Engine,
    /// epkv does not hide the collections a user has no privilege on.
    Nothing,
    /// One privilege.
    One(Privilege),
    /// Every one of these privileges (INCREMENT reads and writes).
    All(&'static [Privilege]),
    /// Any one of these privileges (ADD creates, which Insert or Upsert allows).
    Any(&'static [Privilege]),
}

impl Needs {
    /// Whether the request changes a document: it needs a write privilege (Upsert,
    /// Insert or Delete) whichever way it is granted. `Any` of a read and a write (a
    /// request a reader may make) is not one.
    pub(crate) fn writes(self) -> bool {
        let write =
            |p: &Privilege| matches!(p, Privilege::Upsert | Privilege::Insert | Privilege::Delete);
        match self {
            Needs::Nothing => false,
            Needs::One(p) => write(&p),
            Needs::All(ps) => ps.iter().any(write),
            Needs::Any(ps) => ps.iter().all(write),
        }
    }

    /// Checks the row's privileges with `has` (whether the user holds one): `Err` names
    /// the privilege a refusal reports, the first one missing (for [`Needs::Any`], the
    /// first listed).
    #[inline]
    pub(crate) fn check(self, has: impl Fn(Privilege) -> bool) -> Result<(), Privilege> {
        match self {
            Needs::Nothing => Ok(()),
            Needs::One(p) => {
                if has(p) {
                    Ok(())
                } else {
                    Err(p)
                }
            }
            Needs::All(ps) => match ps.iter().find(|p| !has(**p)) {
                None => Ok(()),
                Some(p) => Err(*p),
            },
            Needs::Any(ps) => {
                if ps.iter().any(|p| has(*p)) {
                    Ok(())
                } else {
                    Err(ps.first().copied().unwrap_or(Privilege::Administrator))
                }
            }
        }
    }
}

/// Reading documents.
const READ: Needs = Needs::One(Privilege::Read);
/// Creating or replacing documents.
const UPSERT: Needs = Needs::One(Privilege::Upsert);
/// ADD: creating a document, which either privilege allows (KV-Engine checks Insert, then
/// Upsert).
const INSERT_OR_UPSERT: Needs = Needs::Any(&[Privilege::Insert, Privilege::Upsert]);
/// Deleting documents.
const DELETE: Needs = Needs::One(Privilege::Delete);
/// Commands that read a document and write it back (arithmetic, GAT, counters, multi
/// mutations, which may return values).
const READ_AND_UPSERT: Needs = Needs::All(&[Privilege::Read, Privilege::Upsert]);
/// OBSERVE and OBSERVE_SEQNO. KV-Engine asks for MetaRead, which no role Couchbase grants
/// today still carries; a client observes what it reads or writes, so either privilege
/// allows it.
const READ_OR_UPSERT: Needs = Needs::Any(&[Privilege::Read, Privilege::Upsert]);
/// Bucket-wide changes: FLUSH, SET_VBUCKET.
const BUCKET_MANAGEMENT: Needs = Needs::One(Privilege::BucketManagement);
/// Node-wide commands: EVICT_KEY, VERBOSITY, ADJUST_TIMEOFDAY (which is also
/// testing-mode only).
const NODE_MANAGEMENT: Needs = Needs::One(Privilege::NodeManagement);
/// STAT. The node-wide group (`timings`, every bucket's latencies) also needs Stats,
/// checked by the handler ([`crate::handlers::stat`]).
const SIMPLE_STATS: Needs = Needs::One(Privilege::SimpleStats);
/// The producer side of DCP after DCP_OPEN (which checks DcpProducer or DcpConsumer
/// itself, by the kind of connection asked for). DCP_STREAM_REQ also needs DcpStream on
/// what it streams, checked by its handler.
const DCP_PRODUCER: Needs = Needs::One(Privilege::DcpProducer);
/// Range scans, on the scan's collection (a create names it in its JSON; a continue or
/// cancel by the scan this connection opened).
const RANGE_SCAN: Needs = Needs::One(Privilege::RangeScan);
/// Nothing.
const NOTHING: Needs = Needs::Nothing;

/// One opcode's row: its handler and the checks made before calling it.
#[derive(Clone, Copy)]
pub(crate) struct Entry {
    /// The opcode.
    pub(crate) opcode: Opcode,
    /// The family's handler.
    pub(crate) handler: Handler,
    /// The bucket the connection must have selected.
    pub(crate) bucket: Bucket,
    /// Whether the connection must be a DCP producer.
    pub(crate) dcp: Dcp,
    /// The look-ahead hint for this request.
    pub(crate) hint: Hint,
    /// The privileges the request needs.
    pub(crate) needs: Needs,
}

/// Returns a row (a function, so the table reads as columns).
const fn row(
    opcode: Opcode,
    handler: Handler,
    bucket: Bucket,
    dcp: Dcp,
    hint: Hint,
    needs: Needs,
) -> Entry {
    Entry {
        opcode,
        handler,
        bucket,
        dcp,
        hint,
        needs,
    }
}

use Bucket::{Any, Live, Selected};
use Dcp::{Any as AnyConn, Producer};
use Handler::{Data, Dcp as DcpMsg, Session};
use Hint::{Key, None as NoHint};

/// Every opcode the front end executes: exactly the implemented ones
/// ([`Opcode::is_implemented`]). An opcode without a row is answered UnknownCommand, or
/// by [`dcp::unregistered`] for the DCP messages only a consumer takes.
#[rustfmt::skip]
pub(crate) const ENTRIES: &[Entry] = &[
    //  opcode                               handler                              bucket    dcp        hint    needs
    // Key-value data.
    row(Opcode::Get,                       Data(kv::get),                        Live,     AnyConn,   Key,    READ),
    row(Opcode::GetQ,                      Data(kv::get),                        Live,     AnyConn,   Key,    READ),
    row(Opcode::GetK,                      Data(kv::get),                        Live,     AnyConn,   Key,    READ),
    row(Opcode::GetKQ,                     Data(kv::get),                        Live,     AnyConn,   Key,    READ),
    row(Opcode::GetReplica,                Data(kv::get_replica),                Live,     AnyConn,   NoHint, READ),
    row(Opcode::GetRandomKey,              Data(kv::get_random_key),             Live,     AnyConn,   NoHint, READ),
    row(Opcode::Set,                       Data(kv::store),                      Live,     AnyConn,   Key,    UPSERT),
    row(Opcode::SetQ,                      Data(kv::store),                      Live,     AnyConn,   Key,    UPSERT),
    row(Opcode::Add,                       Data(kv::store),                      Live,     AnyConn,   Key,    INSERT_OR_UPSERT),
    row(Opcode::AddQ,                      Data(kv::store),                      Live,     AnyConn,   Key,    INSERT_OR_UPSERT),
    row(Opcode::Replace,                   Data(kv::store),                      Live,     AnyConn,   Key,    UPSERT),
    row(Opcode::ReplaceQ,                  Data(kv::store),                      Live,     AnyConn,   Key,    UPSERT),
    row(Opcode::Append,                    Data(kv::store),                      Live,     AnyConn,   NoHint, UPSERT),
    row(Opcode::AppendQ,                   Data(kv::store),                      Live,     AnyConn,   NoHint, UPSERT),
    row(Opcode::Prepend,                   Data(kv::store),                      Live,     AnyConn,   NoHint, UPSERT),
    row(Opcode::PrependQ,                  Data(kv::store),                      Live,     AnyConn,   NoHint, UPSERT),
    row(Opcode::Delete,                    Data(kv::delete),                     Live,     AnyConn,   Key,    DELETE),
    row(Opcode::DeleteQ,                   Data(kv::delete),                     Live,     AnyConn,   Key,    DELETE),
    row(Opcode::Increment,                 Data(kv::arithmetic),                 Live,     AnyConn,   NoHint, READ_AND_UPSERT),
    row(Opcode::IncrementQ,                Data(kv::arithmetic),                 Live,     AnyConn,   NoHint, READ_AND_UPSERT),
    row(Opcode::Decrement,                 Data(kv::arithmetic),                 Live,     AnyConn,   NoHint, READ_AND_UPSERT),
    row(Opcode::DecrementQ,                Data(kv::arithmetic),                 Live,     AnyConn,   NoHint, READ_AND_UPSERT),
    row(Opcode::Touch,                     Data(kv::touch),                      Live,     AnyConn,   NoHint, UPSERT),
    row(Opcode::Gat,                       Data(kv::gat),                        Live,     AnyConn,   NoHint, READ_AND_UPSERT),
    row(Opcode::GatQ,                      Data(kv::gat),                        Live,     AnyConn,   NoHint, READ_AND_UPSERT),
    row(Opcode::GetLocked,                 Data(kv::get_locked),                 Live,     AnyConn,   NoHint, READ),
    row(Opcode::UnlockKey,                 Data(kv::unlock_key),                 Live,     AnyConn,   NoHint, READ),
    row(Opcode::GetMeta,                   Data(kv::get_meta),                   Live,     AnyConn,   NoHint, READ),
    row(Opcode::GetqMeta,                  Data(kv::get_meta),                   Live,     AnyConn,   NoHint, READ),
    row(Opcode::EvictKey,                  Data(kv::evict_key),                  Live,     AnyConn,   NoHint, NODE_MANAGEMENT),
    row(Opcode::Observe,                   Data(kv::observe),                    Live,     AnyConn,   NoHint, READ_OR_UPSERT),
    row(Opcode::ObserveSeqno,              Data(kv::observe_seqno),              Live,     AnyConn,   NoHint, READ_OR_UPSERT),
    row(Opcode::Flush,                     Data(kv::flush),                      Live,     AnyConn,   NoHint, BUCKET_MANAGEMENT),
    row(Opcode::FlushQ,                    Data(kv::flush),                      Live,     AnyConn,   NoHint, BUCKET_MANAGEMENT),
    // Sub-document.
    row(Opcode::SubdocGet,                 Data(subdoc::single),                 Live,     AnyConn,   NoHint, READ),
    row(Opcode::SubdocExists,              Data(subdoc::single),                 Live,     AnyConn,   NoHint, READ),
    row(Opcode::SubdocGetCount,            Data(subdoc::single),                 Live,     AnyConn,   NoHint, READ),
    row(Opcode::SubdocDictAdd,             Data(subdoc::single),                 Live,     AnyConn,   NoHint, UPSERT),
    row(Opcode::SubdocDictUpsert,          Data(subdoc::single),                 Live,     AnyConn,   NoHint, UPSERT),
    row(Opcode::SubdocDelete,              Data(subdoc::single),                 Live,     AnyConn,   NoHint, UPSERT),
    row(Opcode::SubdocReplace,             Data(subdoc::single),                 Live,     AnyConn,   NoHint, UPSERT),
    row(Opcode::SubdocArrayPushLast,       Data(subdoc::single),                 Live,     AnyConn,   NoHint, UPSERT),
    row(Opcode::SubdocArrayPushFirst,      Data(subdoc::single),                 Live,     AnyConn,   NoHint, UPSERT),
    row(Opcode::SubdocArrayInsert,         Data(subdoc::single),                 Live,     AnyConn,   NoHint, UPSERT),
    row(Opcode::SubdocArrayAddUnique,      Data(subdoc::single),                 Live,     AnyConn,   NoHint, UPSERT),
    row(Opcode::SubdocCounter,             Data(subdoc::single),                 Live,     AnyConn,   NoHint, READ_AND_UPSERT),
    row(Opcode::SubdocMultiLookup,         Data(subdoc::multi_lookup),           Live,     AnyConn,   NoHint, READ),
    row(Opcode::SubdocMultiMutation,       Data(subdoc::multi_mutation),         Live,     AnyConn,   NoHint, READ_AND_UPSERT),
    // Collections.
    row(Opcode::GetCollectionsManifest,    Data(collections::manifest),          Live,     AnyConn,   NoHint, NOTHING),
    row(Opcode::GetCollectionId,           Data(collections::id),                Live,     AnyConn,   NoHint, NOTHING),
    row(Opcode::GetScopeId,                Data(collections::id),                Live,     AnyConn,   NoHint, NOTHING),
    // Range scans.
    row(Opcode::RangeScanCreate,           Data(range_scan::create),             Live,     AnyConn,   NoHint, RANGE_SCAN),
    row(Opcode::RangeScanContinue,         Data(range_scan::continue_scan),      Live,     AnyConn,   NoHint, RANGE_SCAN),
    row(Opcode::RangeScanCancel,           Data(range_scan::cancel),             Live,     AnyConn,   NoHint, RANGE_SCAN),
    // Session setup.
    row(Opcode::Hello,                     Session(setup::hello),                Any,      AnyConn,   NoHint, NOTHING),
    row(Opcode::SaslListMechs,             Session(setup::sasl_list_mechs),      Any,      AnyConn,   NoHint, NOTHING),
    row(Opcode::SaslAuth,                  Session(setup::sasl_auth),            Any,      AnyConn,   NoHint, NOTHING),
    row(Opcode::SaslStep,                  Session(setup::sasl_step),            Any,      AnyConn,   NoHint, NOTHING),
    row(Opcode::SelectBucket,              Session(setup::select_bucket),        Any,      AnyConn,   NoHint, NOTHING),
    // Statistics (the `timings` group needs no bucket; the handler checks the others).
    row(Opcode::Stat,                      Session(stat::stat),                  Any,      AnyConn,   NoHint, SIMPLE_STATS),
    // Administration and the cluster map.
    row(Opcode::Quit,                      Session(admin::quit),                 Any,      AnyConn,   NoHint, NOTHING),
    row(Opcode::QuitQ,                     Session(admin::quit),                 Any,      AnyConn,   NoHint, NOTHING),
    row(Opcode::Noop,                      Session(admin::noop),                 Any,      AnyConn,   NoHint, NOTHING),
    row(Opcode::Verbosity,                 Session(admin::noop),                 Any,      AnyConn,   NoHint, NODE_MANAGEMENT),
    row(Opcode::Version,                   Session(admin::version),              Any,      AnyConn,   NoHint, NOTHING),
    row(Opcode::GetErrorMap,               Session(admin::get_error_map),        Any,      AnyConn,   NoHint, NOTHING),
    row(Opcode::GetClusterConfig,          Session(admin::get_cluster_config),   Any,      AnyConn,   NoHint, NOTHING),
    row(Opcode::AdjustTimeofday,           Session(admin::adjust_timeofday),     Any,      AnyConn,   NoHint, NODE_MANAGEMENT),
    row(Opcode::SetVbucket,                Data(admin::set_vbucket),             Live,     AnyConn,   NoHint, BUCKET_MANAGEMENT),
    row(Opcode::GetVbucket,                Data(admin::get_vbucket),             Live,     AnyConn,   NoHint, NOTHING),
    // DCP.
    row(Opcode::DcpOpen,                   DcpMsg(dcp::open),                    Selected, AnyConn,   NoHint, NOTHING),
    row(Opcode::DcpGetFailoverLog,         DcpMsg(dcp::get_failover_log),        Selected, AnyConn,   NoHint, READ),
    row(Opcode::DcpNoop,                   DcpMsg(dcp::noop),                    Selected, AnyConn,   NoHint, NOTHING),
    row(Opcode::DcpControl,                DcpMsg(dcp::control),                 Selected, Producer,  NoHint, NOTHING),
    row(Opcode::DcpStreamReq,              DcpMsg(dcp::stream_req),              Selected, Producer,  NoHint, DCP_PRODUCER),
    row(Opcode::DcpCloseStream,            DcpMsg(dcp::close_stream),            Selected, Producer,  NoHint, DCP_PRODUCER),
    row(Opcode::DcpBufferAcknowledgement,  DcpMsg(dcp::buffer_ack),              Selected, Producer,  NoHint, NOTHING),
    row(Opcode::DcpSeqnoAcknowledged,      DcpMsg(dcp::seqno_acknowledged),      Selected, Producer,  NoHint, DCP_PRODUCER),
];

/// The rows by opcode byte, built from [`ENTRIES`] at compile time.
pub(crate) static TABLE: [Option<Entry>; 256] = build();

/// Indexes [`ENTRIES`] by opcode byte. Fails the build when an opcode has two rows, or
/// when a row's bucket check does not give its handler what it needs: a data handler runs
/// against the bucket's engine (so its bucket must be live, the check every data request
/// had), a DCP handler is given the selected bucket, and a session handler looks at the
/// selection itself.
const fn build() -> [Option<Entry>; 256] {
    let mut table = [None; 256];
    let mut i = 0;
    while i < ENTRIES.len() {
        let e = ENTRIES[i];
        let slot = e.opcode as usize;
        assert!(table[slot].is_none(), "an opcode has two rows");
        let consistent = match e.handler {
            Handler::Session(_) => matches!(e.bucket, Bucket::Any),
            Handler::Data(_) => matches!(e.bucket, Bucket::Live),
            Handler::Dcp(_) => matches!(e.bucket, Bucket::Selected),
        };
        assert!(consistent, "a row's bucket check does not fit its handler");
        table[slot] = Some(e);
        i += 1;
    }
    table
}

/// Returns the row of an opcode byte, if it has one.
#[inline]
pub(crate) fn entry(opcode: u8) -> Option<&'static Entry> {
    TABLE[usize::from(opcode)].as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_implemented_opcode_has_exactly_one_row_and_no_other_opcode_has_one() {
        for op in Opcode::ALL {
            let rows = ENTRIES.iter().filter(|e| e.opcode == *op).count();
            let want = usize::from(op.is_implemented());
            assert_eq!(rows, want, "{op:?}: {rows} rows");
            assert_eq!(entry(op.as_u8()).is_some(), op.is_implemented(), "{op:?}");
            if let Some(e) = entry(op.as_u8()) {
                assert_eq!(e.opcode, *op);
            }
        }
        for byte in 0..=255u8 {
            if Opcode::from_u8(byte).is_none() {
                assert!(entry(byte).is_none(), "{byte:#04x} is no opcode");
            }
        }
    }

    #[test]
    fn the_requests_a_draining_node_refuses_are_the_document_changes() {
        let writes = |op: Opcode| entry(op.as_u8()).is_some_and(|e| e.needs.writes());
        for op in [
            Opcode::Set,
            Opcode::Add,
            Opcode::Replace,
            Opcode::Delete,
            Opcode::Append,
            Opcode::Increment,
            Opcode::SubdocDictUpsert,
            Opcode::SubdocMultiMutation,
        ] {
            assert!(writes(op), "{op:?}");
        }
        for op in [
            Opcode::Get,
            Opcode::GetReplica,
            Opcode::SubdocGet,
            Opcode::SubdocMultiLookup,
            Opcode::Stat,
            Opcode::Hello,
        ] {
            assert!(!writes(op), "{op:?}");
        }
    }

    #[test]
    fn dcp_messages_and_only_they_get_the_raw_request() {
        for e in ENTRIES {
            assert_eq!(
                matches!(e.handler, Handler::Dcp(_)),
                e.opcode.is_dcp(),
                "{:?}",
                e.opcode
            );
            if e.dcp == Dcp::Producer {
                assert!(e.opcode.is_dcp(), "{:?}", e.opcode);
            }
        }
    }

    #[test]
    fn privileges_are_kv_engines_and_only_setup_messages_need_none() {
        use Privilege as P;
        let needs = |op: Opcode| entry(op.as_u8()).map(|e| e.needs);
        let open: Vec<Opcode> = ENTRIES
            .iter()
            .filter(|e| e.needs == Needs::Nothing)
            .map(|e| e.opcode)
            .collect();
        assert_eq!(
            open,
            [
                Opcode::GetCollectionsManifest,
                Opcode::GetCollectionId,
                Opcode::GetScopeId,
                Opcode::Hello,
                Opcode::SaslListMechs,
                Opcode::SaslAuth,
                Opcode::SaslStep,
                Opcode::SelectBucket,
                Opcode::Quit,
                Opcode::QuitQ,
                Opcode::Noop,
                Opcode::Version,
                Opcode::GetErrorMap,
                Opcode::GetClusterConfig,
                Opcode::GetVbucket,
                Opcode::DcpOpen,
                Opcode::DcpNoop,
                Opcode::DcpControl,
                Opcode::DcpBufferAcknowledgement,
            ],
            "a row that needs no privilege is a decision: list it here"
        );
        assert_eq!(needs(Opcode::Get), Some(Needs::One(P::Read)));
        assert_eq!(needs(Opcode::Set), Some(Needs::One(P::Upsert)));
        assert_eq!(
            needs(Opcode::Add),
            Some(Needs::Any(&[P::Insert, P::Upsert]))
        );
        assert_eq!(needs(Opcode::Delete), Some(Needs::One(P::Delete)));
        assert_eq!(
            needs(Opcode::Increment),
            Some(Needs::All(&[P::Read, P::Upsert]))
        );
        assert_eq!(needs(Opcode::Flush), Some(Needs::One(P::BucketManagement)));
        for op in [
            Opcode::RangeScanCreate,
            Opcode::RangeScanContinue,
            Opcode::RangeScanCancel,
        ] {
            assert_eq!(needs(op), Some(Needs::One(P::RangeScan)), "{op:?}");
        }
        assert_eq!(
            needs(Opcode::DcpStreamReq),
            Some(Needs::One(P::DcpProducer))
        );
        // Data rows need collection privileges unless they act on the bucket or node.
        for e in ENTRIES {
            if let (Handler::Data(_), Needs::One(p)) = (e.handler, e.needs) {
                let bucket_wide = matches!(
                    e.opcode,
                    Opcode::Flush | Opcode::FlushQ | Opcode::SetVbucket | Opcode::EvictKey
                );
                assert_eq!(
                    p.level() == epkv_auth::rbac::Level::Collection,
                    !bucket_wide,
                    "{:?}",
                    e.opcode
                );
            }
        }
    }

    #[test]
    fn needs_names_the_first_missing_privilege() {
        use Privilege as P;
        let reader = |p: P| p == P::Read;
        assert_eq!(Needs::Nothing.check(|_| false), Ok(()));
        assert_eq!(READ.check(reader), Ok(()));
        assert_eq!(UPSERT.check(reader), Err(P::Upsert));
        assert_eq!(READ_AND_UPSERT.check(reader), Err(P::Upsert));
        assert_eq!(READ_OR_UPSERT.check(reader), Ok(()));
        assert_eq!(INSERT_OR_UPSERT.check(reader), Err(P::Insert));
        assert_eq!(INSERT_OR_UPSERT.check(|p| p == P::Upsert), Ok(()));
    }

    #[test]
    fn look_ahead_hints_only_the_common_key_value_operations() {
        let hinted: Vec<Opcode> = ENTRIES
            .iter()
            .filter(|e| e.hint == Hint::Key)
            .map(|e| e.opcode)
            .collect();
        assert_eq!(
            hinted,
            [
                Opcode::Get,
                Opcode::GetQ,
                Opcode::GetK,
                Opcode::GetKQ,
                Opcode::Set,
                Opcode::SetQ,
                Opcode::Add,
                Opcode::AddQ,
                Opcode::Replace,
                Opcode::ReplaceQ,
                Opcode::Delete,
                Opcode::DeleteQ,
            ]
        );
    }
}
