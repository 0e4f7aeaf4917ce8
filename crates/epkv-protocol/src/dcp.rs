//! DCP (Database Change Protocol): typed codecs for the DCP opcodes 0x50..=0x65.
//!
//! DCP rides on an ordinary mcbp connection. After DCP_OPEN names the connection and says
//! whether the server is to be its producer or its consumer, the client tunes it with
//! DCP_CONTROL and opens one stream per vBucket with DCP_STREAM_REQ. From then on the
//! traffic runs both ways:
//!
//! - **client to server** (the client is the consumer): DCP_OPEN, DCP_CONTROL,
//!   DCP_STREAM_REQ, DCP_CLOSE_STREAM, DCP_GET_FAILOVER_LOG, DCP_BUFFER_ACKNOWLEDGEMENT,
//!   DCP_SEQNO_ACKNOWLEDGED and DCP_NOOP. [`DcpRequest::decode`] validates one such request
//!   as kv_engine's `mcbp_validators.cc` does and decodes its extras ([`DcpOpen`],
//!   [`StreamReq`], [`BufferAck`], [`SeqnoAck`]); `encode_open`, `encode_stream_req` and
//!   the other `encode_*` functions of this direction build them for test clients and
//!   replication.
//! - **server to client** (the server is the producer): snapshot markers, mutations,
//!   deletions, expirations, prepares, commits, aborts, stream ends, no-ops and the rest.
//!   The producer sends each as a *request* (magic 0x80) whose opaque is the one the
//!   client's DCP_STREAM_REQ carried and whose vbucket field names the stream's vBucket;
//!   the client answers only DCP_NOOP (and a snapshot marker with [`SNAPSHOT_ACK`]).
//!   [`encode_snapshot_marker`], [`encode_mutation`] and their siblings build them, and
//!   [`DcpMessage::decode`] reads them back (for tests and for a consumer).
//!
//! Layouts come from kv_engine's `docs/dcp/documentation/commands/*.md` and the payload
//! structs of `include/memcached/protocol_binary.h`; where the two disagree the structs
//! win, because they are what servers send (DCP_SEQNO_ADVANCED has 8 bytes of extras,
//! although the document's example shows 4; DCP_EXPIRATION's extras are 20 bytes, one
//! fewer than a version 2 deletion's). Every integer is big-endian. A document's client
//! flags are the 32-bit value the client stored, sent in the same byte order as in a SET.
//!
//! Keys pass through as given: when the client negotiated collections, the producer
//! prefixes every document key with its LEB128 collection id before encoding, and the
//! decoders return the key with its prefix. Framing extras (the DCP stream-id frame) are
//! not interpreted here. Nothing decoded from the wire panics: every extras, key and value
//! length is checked, and a bad one is [`crate::Status::Einval`].

mod failover_log;
mod message;
mod request;
mod wire;

pub use failover_log::{FAILOVER_ENTRY_LEN, decode_failover_log_body, encode_failover_log_body};
pub use message::{
    DcpDocMeta, DcpMessage, SnapshotMarker, encode_abort, encode_commit, encode_deletion,
    encode_expiration, encode_mutation, encode_noop, encode_oso_snapshot, encode_prepare,
    encode_seqno_advanced, encode_set_vbucket_state, encode_snapshot_marker,
    encode_snapshot_marker_v2, encode_stream_end, encode_system_event,
};
pub use request::{
    BufferAck, DcpOpen, DcpRequest, SeqnoAck, StreamReq, encode_buffer_ack, encode_close_stream,
    encode_control, encode_get_failover_log, encode_open, encode_seqno_ack, encode_stream_req,
};

/// DCP_OPEN flag: the server is to be the producer (clear: the consumer).
pub const OPEN_PRODUCER: u32 = 0x01;
/// DCP_OPEN flag: a notifier connection. Retired: kv_engine 7.x rejects it, and so does
/// [`DcpOpen::check_flags`].
pub const OPEN_NOTIFIER: u32 = 0x02;
/// DCP_OPEN flag: mutations and deletions carry the document's extended attributes.
pub const OPEN_INCLUDE_XATTRS: u32 = 0x04;
/// DCP_OPEN flag: send keys and metadata only, no values (xattrs still come with
/// [`OPEN_INCLUDE_XATTRS`]).
pub const OPEN_NO_VALUE: u32 = 0x08;
/// DCP_OPEN flag: deletions use the version 2 layout, with a delete time.
pub const OPEN_INCLUDE_DELETE_TIMES: u32 = 0x20;
/// DCP_OPEN flag: like [`OPEN_NO_VALUE`], but the datatype stays that of the stored
/// document. Not valid together with [`OPEN_NO_VALUE`].
pub const OPEN_NO_VALUE_WITH_UNDERLYING_DATATYPE: u32 = 0x40;
/// DCP_OPEN flag: deletions keep the document's user xattrs. Needs
/// [`OPEN_INCLUDE_XATTRS`].
pub const OPEN_INCLUDE_DELETED_USER_XATTRS: u32 = 0x100;
/// Every DCP_OPEN flag a server accepts (kv_engine's validator mask, without the retired
/// notifier and point-in-time bits).
pub const OPEN_FLAGS: u32 = OPEN_PRODUCER
    | OPEN_INCLUDE_XATTRS
    | OPEN_NO_VALUE
    | OPEN_INCLUDE_DELETE_TIMES
    | OPEN_NO_VALUE_WITH_UNDERLYING_DATATYPE
    | OPEN_INCLUDE_DELETED_USER_XATTRS;

/// Stream request flag: take the vBucket over (send everything, then hand the vBucket's
/// active state to the consumer).
pub const STREAM_TAKEOVER: u32 = 0x01;
/// Stream request flag: send only what is on disk when the stream starts.
pub const STREAM_DISK_ONLY: u32 = 0x02;
/// Stream request flag: end at the vBucket's high seqno when the stream starts (the end
/// seqno sent is ignored).
pub const STREAM_TO_LATEST: u32 = 0x04;
/// Stream request flag: no values. Retired in Couchbase 5.0 for [`OPEN_NO_VALUE`];
/// kv_engine rejects it.
pub const STREAM_NO_VALUE: u32 = 0x08;
/// Stream request flag: fail with NOT_MY_VBUCKET unless the vBucket is active.
pub const STREAM_ACTIVE_VB_ONLY: u32 = 0x10;
/// Stream request flag: check the vBucket UUID even when the start seqno is 0, and roll
/// back on a mismatch.
pub const STREAM_STRICT_VBUUID: u32 = 0x20;
/// Stream request flag: start at the vBucket's high seqno (the start seqno, snapshot range
/// and UUID sent are ignored).
pub const STREAM_FROM_LATEST: u32 = 0x40;
/// Stream request flag: do not roll back a client that is behind the purge seqno when
/// nothing else requires it (the client may miss purged tombstones).
pub const STREAM_IGNORE_PURGED_TOMBSTONES: u32 = 0x80;

/// Snapshot marker flag: the snapshot comes from memory.
pub const SNAPSHOT_MEMORY: u32 = 0x01;
/// Snapshot marker flag: the snapshot comes from disk (a backfill).
pub const SNAPSHOT_DISK: u32 = 0x02;
/// Snapshot marker flag: the snapshot matches a checkpoint of the producer.
pub const SNAPSHOT_CHECKPOINT: u32 = 0x04;
/// Snapshot marker flag: the consumer answers the marker once it has the whole snapshot.
pub const SNAPSHOT_ACK: u32 = 0x08;
/// Snapshot marker flag: the snapshot is part of a change history (keys may repeat).
pub const SNAPSHOT_HISTORY: u32 = 0x10;
/// Snapshot marker flag: a key may appear more than once in the snapshot.
pub const SNAPSHOT_MAY_CONTAIN_DUPLICATE_KEYS: u32 = 0x20;

/// DCP_OSO_SNAPSHOT flag: an out-of-seqno-order snapshot starts.
pub const OSO_START: u32 = 0x01;
/// DCP_OSO_SNAPSHOT flag: the out-of-seqno-order snapshot has ended.
pub const OSO_END: u32 = 0x02;

/// Why a producer ended a stream: the extras of DCP_STREAM_END (kv_engine
/// `cb::mcbp::DcpStreamEndStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum StreamEndReason {
    /// Every item up to the end seqno was sent.
    Ok = 0,
    /// The client closed the stream (DCP_CLOSE_STREAM).
    Closed = 1,
    /// The vBucket changed to a state the stream does not serve.
    StateChanged = 2,
    /// The connection is going away.
    Disconnected = 3,
    /// The client read too slowly for the server to keep serving it.
    Slow = 4,
    /// Reading the vBucket from disk failed.
    BackfillFail = 5,
    /// The vBucket rolled back; the client must reopen the stream and roll back too.
    Rollback = 6,
    /// Every collection the stream's filter named was dropped.
    FilterEmpty = 7,
    /// The connection lost a privilege the stream needs.
    LostPrivileges = 8,
}

impl StreamEndReason {
    /// Returns the wire value.
    #[must_use]
    pub fn as_u32(self) -> u32 {
        self as u32
    }

    /// Returns the reason for a wire value, or `None` for one this table does not know (a
    /// newer server's).
    #[must_use]
    pub fn from_u32(v: u32) -> Option<StreamEndReason> {
        Some(match v {
            0 => Self::Ok,
            1 => Self::Closed,
            2 => Self::StateChanged,
            3 => Self::Disconnected,
            4 => Self::Slow,
            5 => Self::BackfillFail,
            6 => Self::Rollback,
            7 => Self::FilterEmpty,
            8 => Self::LostPrivileges,
            _ => return None,
        })
    }
}

/// Whether a prepared SyncWrite stores a document or deletes it (the `deleted` byte of
/// DCP_PREPARE; kv_engine `DocumentState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DocumentState {
    /// The prepare stores a live document.
    Alive,
    /// The prepare deletes the document.
    Deleted,
}

#[cfg(test)]
mod tests;
