//! The HELLO feature table, declared once with whether epkv agrees to each feature.

macro_rules! features {
    ($( $(#[$doc:meta])* $name:ident = $value:literal, $text:literal, $implemented:literal; )*) => {
        /// A HELLO feature code (kv_engine `cb::mcbp::Feature`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u16)]
        #[non_exhaustive]
        pub enum Feature {
            $( $(#[$doc])* $name = $value, )*
        }

        impl Feature {
            /// Every feature in the table.
            pub const ALL: &'static [Feature] = &[ $( Feature::$name, )* ];

            /// Returns the feature for a wire value, or `None` if unknown.
            #[must_use]
            pub fn from_u16(v: u16) -> Option<Feature> {
                match v {
                    $( $value => Some(Feature::$name), )*
                    _ => None,
                }
            }

            /// Returns the wire value.
            #[must_use]
            pub fn as_u16(self) -> u16 {
                self as u16
            }

            /// Returns the feature's name as kv_engine logs it.
            #[must_use]
            pub fn name(self) -> &'static str {
                match self {
                    $( Feature::$name => $text, )*
                }
            }

            /// Returns whether epkv implements the feature, and so agrees to it in HELLO.
            #[must_use]
            pub fn is_implemented(self) -> bool {
                match self {
                    $( Feature::$name => $implemented, )*
                }
            }
        }
    };
}

features! {
    /// Datatype (deprecated; implied).
    Datatype = 0x01, "Datatype", false;
    /// TLS (ignored by kv_engine; never echoed).
    Tls = 0x02, "TLS", false;
    /// Set TCP_NODELAY on the connection.
    TcpNoDelay = 0x03, "TCP nodelay", true;
    /// Mutation replies carry the vBucket UUID and seqno (16 bytes of extras).
    MutationSeqno = 0x04, "Mutation seqno", true;
    /// Clear TCP_NODELAY.
    TcpDelay = 0x05, "TCP delay", true;
    /// Extended attributes.
    Xattr = 0x06, "XATTR", true;
    /// Extended error codes: the client understands every status in the error map
    /// (without it, statuses a classic client does not know are remapped).
    Xerror = 0x07, "XERROR", true;
    /// SELECT_BUCKET (the opcode is accepted whether or not this was agreed).
    SelectBucket = 0x08, "Select bucket", true;
    /// Snappy compression.
    Snappy = 0x0a, "Snappy", true;
    /// JSON datatype.
    Json = 0x0b, "JSON", true;
    /// Server-initiated requests (magic 0x82) may arrive between replies, and the client
    /// may answer them (magic 0x83, ignored).
    Duplex = 0x0c, "Duplex", true;
    /// Cluster map change notifications carrying the new map (needs Duplex).
    ClustermapChangeNotification = 0x0d, "Clustermap change notification", true;
    /// Out-of-order replies.
    UnorderedExecution = 0x0e, "Unordered execution", false;
    /// Server durations in replies.
    Tracing = 0x0f, "Tracing", false;
    /// Magic 0x08 requests (accepted whether or not agreed).
    AltRequestSupport = 0x10, "AltRequestSupport", true;
    /// SyncWrites (informational, as in kv_engine: durability frames are accepted either
    /// way).
    SyncReplication = 0x11, "SyncReplication", true;
    /// Collection-prefixed keys.
    Collections = 0x12, "Collections", true;
    /// Snappy everywhere.
    SnappyEverywhere = 0x13, "SnappyEverywhere", false;
    /// Preserve TTL frame info.
    PreserveTtl = 0x14, "PreserveTtl", true;
    /// Virtual attributes.
    VAttr = 0x15, "VAttr", true;
    /// Point-in-time recovery.
    PiTR = 0x16, "PiTR", false;
    /// Subdoc create-as-deleted.
    SubdocCreateAsDeleted = 0x17, "SubdocCreateAsDeleted", true;
    /// Subdoc document macros (`${$document.CAS}` and the rest) expand in attributes.
    SubdocDocumentMacroSupport = 0x18, "SubdocDocumentMacroSupport", true;
    /// Subdoc replace body with xattr.
    SubdocReplaceBodyWithXattr = 0x19, "SubdocReplaceBodyWithXattr", true;
    /// Report unit usage.
    ReportUnitUsage = 0x1a, "ReportUnitUsage", false;
    /// Non-blocking throttling.
    NonBlockingThrottlingMode = 0x1b, "NonBlockingThrottlingMode", false;
    /// Subdoc replica read: informational, as in kv_engine (the ReplicaRead doc flag works
    /// either way).
    SubdocReplicaRead = 0x1c, "SubdocReplicaRead", true;
    /// GET_CLUSTER_CONFIG with known version.
    GetClusterConfigWithKnownVersion = 0x1d, "GetClusterConfigWithKnownVersion", false;
    /// A NOT_MY_VBUCKET reply carries the map only if the connection was not yet sent
    /// (or notified of) that version.
    DedupeNotMyVbucketClustermap = 0x1e, "DedupeNotMyVbucketClustermap", true;
    /// Cluster map change notifications without the map (needs Duplex; wins over 0x0d).
    ClustermapChangeNotificationBrief = 0x1f, "ClustermapChangeNotificationBrief", true;
    /// Subdoc multiple xattr keys.
    SubdocAllowsAccessOnMultipleXattrKeys = 0x20, "SubdocAllowsAccessOnMultipleXattrKeys", true;
    /// Binary extended attribute values (path flag BINARY_VALUE); informational, as in
    /// kv_engine.
    SubdocBinaryXattr = 0x21, "SubdocBinaryXattr", true;
}
