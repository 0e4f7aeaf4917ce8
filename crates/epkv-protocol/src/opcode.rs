//! The opcode table: every client opcode epkv knows, declared once with its name, value and
//! whether it is implemented.

macro_rules! opcodes {
    ($( $(#[$doc:meta])* $name:ident = $value:literal, $wire:literal, $implemented:literal; )*) => {
        /// A client request opcode (kv_engine `cb::mcbp::ClientOpcode`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        #[non_exhaustive]
        pub enum Opcode {
            $( $(#[$doc])* $name = $value, )*
        }

        impl Opcode {
            /// Every opcode in the table, in table order.
            pub const ALL: &'static [Opcode] = &[ $( Opcode::$name, )* ];

            /// Returns the opcode for a wire value, or `None` if the value is not in the table.
            #[must_use]
            pub fn from_u8(v: u8) -> Option<Opcode> {
                match v {
                    $( $value => Some(Opcode::$name), )*
                    _ => None,
                }
            }

            /// Returns the wire value.
            #[must_use]
            pub fn as_u8(self) -> u8 {
                self as u8
            }

            /// Returns the name kv_engine's docs use (`GET`, `SETQ`, ...).
            #[must_use]
            pub fn name(self) -> &'static str {
                match self {
                    $( Opcode::$name => $wire, )*
                }
            }

            /// Returns whether epkv implements this opcode; the others get 0x81 UnknownCommand.
            #[must_use]
            pub fn is_implemented(self) -> bool {
                match self {
                    $( Opcode::$name => $implemented, )*
                }
            }
        }
    };
}

opcodes! {
    /// Read a document.
    Get = 0x00, "GET", true;
    /// Store a document.
    Set = 0x01, "SET", true;
    /// Store only if absent.
    Add = 0x02, "ADD", true;
    /// Store only if present.
    Replace = 0x03, "REPLACE", true;
    /// Delete a document.
    Delete = 0x04, "DELETE", true;
    /// Increment a counter.
    Increment = 0x05, "INCREMENT", true;
    /// Decrement a counter.
    Decrement = 0x06, "DECREMENT", true;
    /// Close the connection after replying.
    Quit = 0x07, "QUIT", true;
    /// Remove every document (off by default).
    Flush = 0x08, "FLUSH", true;
    /// Quiet GET: no reply on a miss.
    GetQ = 0x09, "GETQ", true;
    /// Do nothing; flushes quiet replies.
    Noop = 0x0a, "NOOP", true;
    /// Server version string.
    Version = 0x0b, "VERSION", true;
    /// GET that returns the key.
    GetK = 0x0c, "GETK", true;
    /// Quiet GETK.
    GetKQ = 0x0d, "GETKQ", true;
    /// Append to a value.
    Append = 0x0e, "APPEND", true;
    /// Prepend to a value.
    Prepend = 0x0f, "PREPEND", true;
    /// Statistics.
    Stat = 0x10, "STAT", true;
    /// Quiet SET.
    SetQ = 0x11, "SETQ", true;
    /// Quiet ADD.
    AddQ = 0x12, "ADDQ", true;
    /// Quiet REPLACE.
    ReplaceQ = 0x13, "REPLACEQ", true;
    /// Quiet DELETE.
    DeleteQ = 0x14, "DELETEQ", true;
    /// Quiet INCREMENT.
    IncrementQ = 0x15, "INCREMENTQ", true;
    /// Quiet DECREMENT.
    DecrementQ = 0x16, "DECREMENTQ", true;
    /// Close the connection without replying.
    QuitQ = 0x17, "QUITQ", true;
    /// Quiet FLUSH.
    FlushQ = 0x18, "FLUSHQ", true;
    /// Quiet APPEND.
    AppendQ = 0x19, "APPENDQ", true;
    /// Quiet PREPEND.
    PrependQ = 0x1a, "PREPENDQ", true;
    /// Set log verbosity (accepted and ignored, as memcached does).
    Verbosity = 0x1b, "VERBOSITY", true;
    /// Set a document's expiry.
    Touch = 0x1c, "TOUCH", true;
    /// Get and touch.
    Gat = 0x1d, "GAT", true;
    /// Quiet get and touch.
    GatQ = 0x1e, "GATQ", true;
    /// Feature negotiation.
    Hello = 0x1f, "HELLO", true;
    /// List SASL mechanisms.
    SaslListMechs = 0x20, "SASL_LIST_MECHS", true;
    /// Start SASL authentication.
    SaslAuth = 0x21, "SASL_AUTH", true;
    /// Continue SASL authentication.
    SaslStep = 0x22, "SASL_STEP", true;
    /// Create a vBucket or change its state.
    SetVbucket = 0x3d, "SET_VBUCKET", true;
    /// Read a vBucket's state.
    GetVbucket = 0x3e, "GET_VBUCKET", true;
    /// Delete a vBucket.
    DelVbucket = 0x3f, "DEL_VBUCKET", false;
    /// DCP: name a connection and make it a producer or a consumer (extras: seqno u32,
    /// flags u32; key: the connection name; value: optional JSON).
    DcpOpen = 0x50, "DCP_OPEN", true;
    /// DCP: ask a consumer to open a stream with its producer.
    DcpAddStream = 0x51, "DCP_ADD_STREAM", false;
    /// DCP: close the stream of the header's vBucket.
    DcpCloseStream = 0x52, "DCP_CLOSE_STREAM", true;
    /// DCP: open a stream of one vBucket's changes (48 bytes of extras).
    DcpStreamReq = 0x53, "DCP_STREAM_REQ", true;
    /// DCP: a vBucket's failover log (pairs of vBucket UUID and seqno, newest first).
    DcpGetFailoverLog = 0x54, "DCP_GET_FAILOVER_LOG", true;
    /// DCP, producer to consumer: a stream has ended (extras: reason u32).
    DcpStreamEnd = 0x55, "DCP_STREAM_END", false;
    /// DCP, producer to consumer: the seqno range of the snapshot that follows.
    DcpSnapshotMarker = 0x56, "DCP_SNAPSHOT_MARKER", false;
    /// DCP, producer to consumer: a document was created or changed.
    DcpMutation = 0x57, "DCP_MUTATION", false;
    /// DCP, producer to consumer: a document was deleted.
    DcpDeletion = 0x58, "DCP_DELETION", false;
    /// DCP, producer to consumer: a document expired.
    DcpExpiration = 0x59, "DCP_EXPIRATION", false;
    /// DCP, producer to consumer: a vBucket changed state (takeover).
    DcpSetVbucketState = 0x5b, "DCP_SET_VBUCKET_STATE", false;
    /// DCP: keep-alive the producer sends and the consumer answers.
    DcpNoop = 0x5c, "DCP_NOOP", true;
    /// DCP, consumer to producer: flow control, the bytes the consumer has processed.
    DcpBufferAcknowledgement = 0x5d, "DCP_BUFFER_ACKNOWLEDGEMENT", true;
    /// DCP: set a connection option (key: the name, value: the setting).
    DcpControl = 0x5e, "DCP_CONTROL", true;
    /// DCP, producer to consumer: a collection or scope event.
    DcpSystemEvent = 0x5f, "DCP_SYSTEM_EVENT", false;
    /// DCP, producer to consumer: the first stage of a SyncWrite.
    DcpPrepare = 0x60, "DCP_PREPARE", false;
    /// DCP, consumer to producer: the highest seqno the replica has prepared.
    DcpSeqnoAcknowledged = 0x61, "DCP_SEQNO_ACKNOWLEDGED", true;
    /// DCP, producer to consumer: a prepared SyncWrite was committed.
    DcpCommit = 0x62, "DCP_COMMIT", false;
    /// DCP, producer to consumer: a prepared SyncWrite was aborted.
    DcpAbort = 0x63, "DCP_ABORT", false;
    /// DCP, producer to consumer: the vBucket's seqno moved past changes the stream does
    /// not carry.
    DcpSeqnoAdvanced = 0x64, "DCP_SEQNO_ADVANCED", false;
    /// DCP, producer to consumer: the start or end of an out-of-seqno-order snapshot.
    DcpOsoSnapshot = 0x65, "DCP_OSO_SNAPSHOT", false;
    /// Read from a replica vBucket.
    GetReplica = 0x83, "GET_REPLICA", true;
    /// Select the bucket for this connection.
    SelectBucket = 0x89, "SELECT_BUCKET", true;
    /// Persistence/replication state of a vBucket.
    ObserveSeqno = 0x91, "OBSERVE_SEQNO", true;
    /// Legacy per-key observe: each key's state (persisted, not, absent, deleted) and CAS.
    Observe = 0x92, "OBSERVE", true;
    /// Eject a document from memory (its value; the whole document under full eviction).
    EvictKey = 0x93, "EVICT_KEY", true;
    /// Get and lock.
    GetLocked = 0x94, "GET_LOCKED", true;
    /// Unlock a key locked by GET_LOCKED.
    UnlockKey = 0x95, "UNLOCK_KEY", true;
    /// A document's metadata, tombstones included (the SDKs' `exists`).
    GetMeta = 0xa0, "GET_META", true;
    /// GET_META, quiet on a missing key.
    GetqMeta = 0xa1, "GETQ_META", true;
    /// Read the cluster map.
    GetClusterConfig = 0xb5, "GET_CLUSTER_CONFIG", true;
    /// A resident document of a collection, picked at random.
    GetRandomKey = 0xb6, "GET_RANDOM_KEY", true;
    /// The bucket's collections manifest (JSON).
    GetCollectionsManifest = 0xba, "GET_COLLECTIONS_MANIFEST", true;
    /// The id of a collection by its path `scope.collection`.
    GetCollectionId = 0xbb, "GET_COLLECTION_ID", true;
    /// The id of a scope by its name.
    GetScopeId = 0xbc, "GET_SCOPE_ID", true;
    /// Sub-document: the value at a path.
    SubdocGet = 0xc5, "SUBDOC_GET", true;
    /// Sub-document: whether a path exists.
    SubdocExists = 0xc6, "SUBDOC_EXISTS", true;
    /// Sub-document: add a dictionary key.
    SubdocDictAdd = 0xc7, "SUBDOC_DICT_ADD", true;
    /// Sub-document: set a dictionary key.
    SubdocDictUpsert = 0xc8, "SUBDOC_DICT_UPSERT", true;
    /// Sub-document: delete a path.
    SubdocDelete = 0xc9, "SUBDOC_DELETE", true;
    /// Sub-document: replace the value at a path.
    SubdocReplace = 0xca, "SUBDOC_REPLACE", true;
    /// Sub-document: append to an array.
    SubdocArrayPushLast = 0xcb, "SUBDOC_ARRAY_PUSH_LAST", true;
    /// Sub-document: prepend to an array.
    SubdocArrayPushFirst = 0xcc, "SUBDOC_ARRAY_PUSH_FIRST", true;
    /// Sub-document: insert into an array.
    SubdocArrayInsert = 0xcd, "SUBDOC_ARRAY_INSERT", true;
    /// Sub-document: append to an array unless present.
    SubdocArrayAddUnique = 0xce, "SUBDOC_ARRAY_ADD_UNIQUE", true;
    /// Sub-document: add to a number.
    SubdocCounter = 0xcf, "SUBDOC_COUNTER", true;
    /// Sub-document: several lookups on one document.
    SubdocMultiLookup = 0xd0, "SUBDOC_MULTI_LOOKUP", true;
    /// Sub-document: several mutations on one document, all or none.
    SubdocMultiMutation = 0xd1, "SUBDOC_MULTI_MUTATION", true;
    /// Sub-document: the number of elements at a path.
    SubdocGetCount = 0xd2, "SUBDOC_GET_COUNT", true;
    /// Sub-document: replace the body with an extended attribute's value (in
    /// MULTI_MUTATION only).
    SubdocReplaceBodyWithXattr = 0xd3, "SUBDOC_REPLACE_BODY_WITH_XATTR", false;
    /// Range scan: open a scan of a collection in one vBucket (a key range or a random
    /// sample; the value is the JSON of [`crate::range_scan::CreateRequest`]).
    RangeScanCreate = 0xda, "RANGE_SCAN_CREATE", true;
    /// Range scan: the next keys or documents of a scan (extras:
    /// [`crate::range_scan::ContinueRequest`]).
    RangeScanContinue = 0xdb, "RANGE_SCAN_CONTINUE", true;
    /// Range scan: close a scan (extras: its 16-byte id).
    RangeScanCancel = 0xdc, "RANGE_SCAN_CANCEL", true;
    /// Test-only: shift the server clock (allowed only when the server runs in testing mode).
    AdjustTimeofday = 0xfc, "ADJUST_TIMEOFDAY", true;
    /// Read the error map.
    GetErrorMap = 0xfe, "GET_ERROR_MAP", true;
}

impl Opcode {
    /// Returns true for the quiet variants, which send no reply on success (GETQ/GETKQ/GATQ:
    /// no reply on a miss instead).
    #[must_use]
    pub fn is_quiet(self) -> bool {
        matches!(
            self,
            Opcode::GetQ
                | Opcode::GetKQ
                | Opcode::GatQ
                | Opcode::SetQ
                | Opcode::AddQ
                | Opcode::ReplaceQ
                | Opcode::DeleteQ
                | Opcode::IncrementQ
                | Opcode::DecrementQ
                | Opcode::QuitQ
                | Opcode::FlushQ
                | Opcode::AppendQ
                | Opcode::PrependQ
                | Opcode::GetqMeta
        )
    }
}

impl Opcode {
    /// Returns true for the DCP opcodes (0x50..=0x65). They are not [`crate::Command`]s:
    /// [`crate::Command::decode`] answers them [`crate::Status::UnknownCommand`], and the
    /// front end decodes them with [`crate::dcp`] instead.
    #[must_use]
    pub fn is_dcp(self) -> bool {
        matches!(
            self,
            Opcode::DcpOpen
                | Opcode::DcpAddStream
                | Opcode::DcpCloseStream
                | Opcode::DcpStreamReq
                | Opcode::DcpGetFailoverLog
                | Opcode::DcpStreamEnd
                | Opcode::DcpSnapshotMarker
                | Opcode::DcpMutation
                | Opcode::DcpDeletion
                | Opcode::DcpExpiration
                | Opcode::DcpSetVbucketState
                | Opcode::DcpNoop
                | Opcode::DcpBufferAcknowledgement
                | Opcode::DcpControl
                | Opcode::DcpSystemEvent
                | Opcode::DcpPrepare
                | Opcode::DcpSeqnoAcknowledged
                | Opcode::DcpCommit
                | Opcode::DcpAbort
                | Opcode::DcpSeqnoAdvanced
                | Opcode::DcpOsoSnapshot
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_round_trips_every_value() {
        for op in Opcode::ALL {
            assert_eq!(Opcode::from_u8(op.as_u8()), Some(*op));
        }
        for v in 0..=255u8 {
            if let Some(op) = Opcode::from_u8(v) {
                assert_eq!(op.as_u8(), v);
            }
        }
    }

    #[test]
    fn dcp_opcodes_are_exactly_the_dcp_range() {
        for op in Opcode::ALL {
            assert_eq!(op.is_dcp(), (0x50..=0x65).contains(&op.as_u8()), "{op:?}");
            assert_eq!(op.is_dcp(), op.name().starts_with("DCP_"), "{op:?}");
        }
    }
}
