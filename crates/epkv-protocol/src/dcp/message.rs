//! What a DCP producer streams: [`DcpDocMeta`], [`SnapshotMarker`], the `encode_*`
//! function of every producer message, and the validating [`DcpMessage::decode`].

use super::wire::{
    ANY_DATATYPE, CasRule, Cursor, ExtrasWriter, Presence, RAW_ONLY, builder, check_shape,
};
use super::{DocumentState, SNAPSHOT_DISK, StreamEndReason};
#[cfg(doc)]
use super::{OPEN_INCLUDE_DELETE_TIMES, OSO_END, OSO_START, SNAPSHOT_ACK};
use crate::header_error::EncodeError;
use crate::opcode::Opcode;
use crate::request::Request;
use crate::request_builder::RequestBuilder;
use crate::status::Status;
use bytes::BufMut;
use epkv_types::{Cas, Datatype, DurabilityLevel, VBucketState, Vbid};

/// A document's metadata as DCP carries it. Which fields a message has on the wire:
///
/// | message | by_seqno, rev_seqno | cas, datatype (header) | flags, expiration, lock_time, nru |
/// |---------|---------------------|------------------------|-----------------------------------|
/// | mutation, prepare | yes | yes | yes |
/// | deletion, expiration | yes | yes | no: ignored when encoding, zero when decoded |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DcpDocMeta {
    /// The seqno of this change.
    pub by_seqno: u64,
    /// The revision seqno (how many times the document has changed).
    pub rev_seqno: u64,
    /// The document's CAS (header field).
    pub cas: Cas,
    /// The client flags the document was stored with.
    pub flags: u32,
    /// The document's expiry as an absolute time in seconds since the Unix epoch; 0 for
    /// none.
    pub expiration: u32,
    /// Seconds left on a GET_LOCKED lock; servers send 0.
    pub lock_time: u32,
    /// The value's datatype bits (header field).
    pub datatype: Datatype,
    /// The producer's not-recently-used hint; consumers may ignore it.
    pub nru: u8,
}

/// Extras lengths of the producer's messages.
const MARKER_V1_EXTRAS_LEN: usize = 20;
const MARKER_V2_EXTRAS_LEN: usize = 1;
/// Marker version 2.0 value: start, end, flags, max visible seqno, high completed seqno.
const MARKER_V2_0_VALUE_LEN: usize = 36;
/// Marker version 2.1 value: version 2.0's plus a timestamp u64.
const MARKER_V2_1_VALUE_LEN: usize = 44;
const MUTATION_EXTRAS_LEN: usize = 31;
const DELETION_V1_EXTRAS_LEN: usize = 18;
const DELETION_V2_EXTRAS_LEN: usize = 21;
const EXPIRATION_EXTRAS_LEN: usize = 20;
const STREAM_END_EXTRAS_LEN: usize = 4;
const PREPARE_EXTRAS_LEN: usize = 31;
const COMMIT_EXTRAS_LEN: usize = 16;
const ABORT_EXTRAS_LEN: usize = 16;
const SEQNO_ADVANCED_EXTRAS_LEN: usize = 8;
const SYSTEM_EVENT_EXTRAS_LEN: usize = 13;
const SET_VBUCKET_STATE_EXTRAS_LEN: usize = 1;
const OSO_SNAPSHOT_EXTRAS_LEN: usize = 4;

/// A DCP_SNAPSHOT_MARKER in any of its versions:
///
/// - version 1: 20 bytes of extras, start u64, end u64, flags u32;
/// - version 2.0: one byte of extras (0) and a 36-byte value: version 1's fields, then the
///   max visible seqno u64 and the high completed seqno u64;
/// - version 2.1: one byte of extras (1) and a 44-byte value: version 2.0's, then the time
///   the disk snapshot was committed, u64.
///
/// In version 2.x the high completed seqno is on the wire in every marker but means
/// something only in a disk snapshot ([`SNAPSHOT_DISK`]); decoding gives it only there,
/// and encoding sends 0 for `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SnapshotMarker {
    /// The first seqno of the snapshot.
    pub start_seqno: u64,
    /// The last seqno of the snapshot.
    pub end_seqno: u64,
    /// `SNAPSHOT_*` bits.
    pub flags: u32,
    /// The highest seqno in the snapshot a plain reader may see (prepares and aborts
    /// left out); version 2.x only.
    pub max_visible_seqno: Option<u64>,
    /// The high completed seqno when the snapshot was taken; disk snapshots of version
    /// 2.x only.
    pub high_completed_seqno: Option<u64>,
    /// When the disk snapshot was committed; version 2.1 only.
    pub timestamp: Option<u64>,
}

impl SnapshotMarker {
    /// Appends the marker as a DCP_SNAPSHOT_MARKER request: version 2.1 when there is a
    /// timestamp, else version 2.0 when there is a max visible or high completed seqno,
    /// else version 1 (kv_engine picks the same way).
    ///
    /// # Errors
    /// None in practice; the signature matches the other encoders.
    pub fn encode(
        &self,
        out: &mut impl BufMut,
        opaque: u32,
        vbid: Vbid,
    ) -> Result<(), EncodeError> {
        let b = builder(Opcode::DcpSnapshotMarker, opaque, vbid);
        let v1 = ExtrasWriter::<MARKER_V1_EXTRAS_LEN>::new()
            .put(&self.start_seqno.to_be_bytes())
            .put(&self.end_seqno.to_be_bytes())
            .put(&self.flags.to_be_bytes())
            .finish();
        if self.timestamp.is_none()
            && self.max_visible_seqno.is_none()
            && self.high_completed_seqno.is_none()
        {
            return b.extras(&v1).encode(out);
        }
        let value = ExtrasWriter::<MARKER_V2_1_VALUE_LEN>::new()
            .put(&v1)
            .put(&self.max_visible_seqno.unwrap_or(0).to_be_bytes())
            .put(&self.high_completed_seqno.unwrap_or(0).to_be_bytes())
            .put(&self.timestamp.unwrap_or(0).to_be_bytes())
            .finish();
        let (version, len) = match self.timestamp {
            Some(_) => ([1u8], MARKER_V2_1_VALUE_LEN),
            None => ([0u8], MARKER_V2_0_VALUE_LEN),
        };
        b.extras(&version)
            .value(value.get(..len).unwrap_or(&value))
            .encode(out)
    }

    /// Decodes a marker from its extras and value (any version).
    fn decode(extras: &[u8], value: &[u8]) -> Result<SnapshotMarker, Status> {
        let v1 = |c: &mut Cursor<'_>| SnapshotMarker {
            start_seqno: c.u64(),
            end_seqno: c.u64(),
            flags: c.u32(),
            ..SnapshotMarker::default()
        };
        match (extras, value.len()) {
            (e, 0) if e.len() == MARKER_V1_EXTRAS_LEN => Ok(v1(&mut Cursor(extras))),
            ([0], MARKER_V2_0_VALUE_LEN) | ([1], MARKER_V2_1_VALUE_LEN) => {
                let mut c = Cursor(value);
                let mut m = v1(&mut c);
                m.max_visible_seqno = Some(c.u64());
                let hcs = c.u64();
                if m.flags & SNAPSHOT_DISK != 0 {
                    m.high_completed_seqno = Some(hcs);
                }
                if value.len() == MARKER_V2_1_VALUE_LEN {
                    m.timestamp = Some(c.u64());
                }
                Ok(m)
            }
            _ => Err(Status::Einval),
        }
    }
}

/// Appends a version 1 DCP_SNAPSHOT_MARKER (20 bytes of extras): the snapshot that
/// follows on stream `opaque` of vBucket `vbid` holds seqnos `start_seqno..=end_seqno`.
///
/// # Errors
/// None in practice; the signature matches the other encoders.
pub fn encode_snapshot_marker(
    out: &mut impl BufMut,
    opaque: u32,
    vbid: Vbid,
    start_seqno: u64,
    end_seqno: u64,
    flags: u32,
) -> Result<(), EncodeError> {
    SnapshotMarker {
        start_seqno,
        end_seqno,
        flags,
        ..SnapshotMarker::default()
    }
    .encode(out, opaque, vbid)
}

/// Appends a version 2.0 DCP_SNAPSHOT_MARKER (for clients that enabled SyncReplication):
/// version 1's fields plus the max visible seqno and, for a disk snapshot, the high
/// completed seqno (`None` is sent as 0).
///
/// # Errors
/// None in practice; the signature matches the other encoders.
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per marker field, in wire order, as the version 1 encoder"
)]
pub fn encode_snapshot_marker_v2(
    out: &mut impl BufMut,
    opaque: u32,
    vbid: Vbid,
    start_seqno: u64,
    end_seqno: u64,
    flags: u32,
    max_visible_seqno: u64,
    high_completed_seqno: Option<u64>,
) -> Result<(), EncodeError> {
    SnapshotMarker {
        start_seqno,
        end_seqno,
        flags,
        max_visible_seqno: Some(max_visible_seqno),
        // Always at least Some(0) so that the marker is version 2.0 even without an HCS.
        high_completed_seqno: Some(high_completed_seqno.unwrap_or(0)),
        timestamp: None,
    }
    .encode(out, opaque, vbid)
}

/// Appends a DCP_MUTATION: 31 bytes of extras (by_seqno u64, rev_seqno u64, flags u32,
/// expiration u32, lock_time u32, nmeta u16 = 0, nru u8); the CAS and datatype from
/// `meta` go in the header.
///
/// # Errors
/// [`EncodeError`] when the key or the body does not fit its length field.
pub fn encode_mutation(
    out: &mut impl BufMut,
    opaque: u32,
    vbid: Vbid,
    meta: &DcpDocMeta,
    key: &[u8],
    value: &[u8],
) -> Result<(), EncodeError> {
    let extras = ExtrasWriter::<MUTATION_EXTRAS_LEN>::new()
        .put(&meta.by_seqno.to_be_bytes())
        .put(&meta.rev_seqno.to_be_bytes())
        .put(&meta.flags.to_be_bytes())
        .put(&meta.expiration.to_be_bytes())
        .put(&meta.lock_time.to_be_bytes())
        .put(&0u16.to_be_bytes())
        .put(&[meta.nru])
        .finish();
    document(Opcode::DcpMutation, opaque, vbid, meta, key, value)
        .extras(&extras)
        .encode(out)
}

/// Starts a document message: key, value, and the CAS and datatype of `meta`.
fn document<'a>(
    op: Opcode,
    opaque: u32,
    vbid: Vbid,
    meta: &DcpDocMeta,
    key: &'a [u8],
    value: &'a [u8],
) -> RequestBuilder<'a> {
    builder(op, opaque, vbid)
        .cas(meta.cas)
        .datatype(meta.datatype)
        .key(key)
        .value(value)
}

/// Appends a DCP_DELETION. Without a delete time it is version 1 (18 bytes of extras:
/// by_seqno u64, rev_seqno u64, nmeta u16 = 0); with one, version 2 (21 bytes: by_seqno,
/// rev_seqno, delete_time u32, one unused byte), which a client that opened with
/// [`OPEN_INCLUDE_DELETE_TIMES`] expects. The value is empty, or the document's xattrs
/// (datatype XATTR).
///
/// # Errors
/// [`EncodeError`] when the key or the body does not fit its length field.
pub fn encode_deletion(
    out: &mut impl BufMut,
    opaque: u32,
    vbid: Vbid,
    meta: &DcpDocMeta,
    key: &[u8],
    value: &[u8],
    delete_time: Option<u32>,
) -> Result<(), EncodeError> {
    let b = document(Opcode::DcpDeletion, opaque, vbid, meta, key, value);
    match delete_time {
        None => {
            let extras = ExtrasWriter::<DELETION_V1_EXTRAS_LEN>::new()
                .put(&meta.by_seqno.to_be_bytes())
                .put(&meta.rev_seqno.to_be_bytes())
                .put(&0u16.to_be_bytes())
                .finish();
            b.extras(&extras).encode(out)
        }
        Some(time) => {
            let extras = ExtrasWriter::<DELETION_V2_EXTRAS_LEN>::new()
                .put(&meta.by_seqno.to_be_bytes())
                .put(&meta.rev_seqno.to_be_bytes())
                .put(&time.to_be_bytes())
                .put(&[0])
                .finish();
            b.extras(&extras).encode(out)
        }
    }
}

/// Appends a DCP_EXPIRATION: 20 bytes of extras (by_seqno u64, rev_seqno u64,
/// delete_time u32; no unused byte, unlike a version 2 deletion).
///
/// # Errors
/// [`EncodeError`] when the key or the body does not fit its length field.
pub fn encode_expiration(
    out: &mut impl BufMut,
    opaque: u32,
    vbid: Vbid,
    meta: &DcpDocMeta,
    key: &[u8],
    value: &[u8],
    delete_time: u32,
) -> Result<(), EncodeError> {
    let extras = ExtrasWriter::<EXPIRATION_EXTRAS_LEN>::new()
        .put(&meta.by_seqno.to_be_bytes())
        .put(&meta.rev_seqno.to_be_bytes())
        .put(&delete_time.to_be_bytes())
        .finish();
    document(Opcode::DcpExpiration, opaque, vbid, meta, key, value)
        .extras(&extras)
        .encode(out)
}

/// Appends a DCP_PREPARE: 31 bytes of extras (by_seqno u64, rev_seqno u64, flags u32,
/// expiration u32, lock_time u32, nru u8, deleted u8, durability level u8). Consumers
/// require a non-zero CAS and by_seqno.
///
/// # Errors
/// [`EncodeError`] when the key or the body does not fit its length field.
#[expect(
    clippy::too_many_arguments,
    reason = "the document encoders share one argument order; the prepare adds two fields"
)]
pub fn encode_prepare(
    out: &mut impl BufMut,
    opaque: u32,
    vbid: Vbid,
    meta: &DcpDocMeta,
    key: &[u8],
    value: &[u8],
    state: DocumentState,
    level: DurabilityLevel,
) -> Result<(), EncodeError> {
    let deleted = match state {
        DocumentState::Alive => 0u8,
        DocumentState::Deleted => 1u8,
    };
    let extras = ExtrasWriter::<PREPARE_EXTRAS_LEN>::new()
        .put(&meta.by_seqno.to_be_bytes())
        .put(&meta.rev_seqno.to_be_bytes())
        .put(&meta.flags.to_be_bytes())
        .put(&meta.expiration.to_be_bytes())
        .put(&meta.lock_time.to_be_bytes())
        .put(&[meta.nru, deleted, level as u8])
        .finish();
    document(Opcode::DcpPrepare, opaque, vbid, meta, key, value)
        .extras(&extras)
        .encode(out)
}

/// Appends a DCP_COMMIT: the prepare of `key` at `prepared_seqno` is committed at
/// `commit_seqno` (16 bytes of extras; no value; CAS 0).
///
/// # Errors
/// [`EncodeError`] when the key does not fit its length field.
pub fn encode_commit(
    out: &mut impl BufMut,
    opaque: u32,
    vbid: Vbid,
    key: &[u8],
    prepared_seqno: u64,
    commit_seqno: u64,
) -> Result<(), EncodeError> {
    encode_completion(
        out,
        Opcode::DcpCommit,
        opaque,
        vbid,
        key,
        prepared_seqno,
        commit_seqno,
    )
}

/// A DCP_COMMIT or DCP_ABORT: the prepare seqno and the completion's own seqno as
/// extras (the two have the same 16-byte layout), the key, no value.
fn encode_completion(
    out: &mut impl BufMut,
    opcode: Opcode,
    opaque: u32,
    vbid: Vbid,
    key: &[u8],
    prepared_seqno: u64,
    seqno: u64,
) -> Result<(), EncodeError> {
    let extras = ExtrasWriter::<COMMIT_EXTRAS_LEN>::new()
        .put(&prepared_seqno.to_be_bytes())
        .put(&seqno.to_be_bytes())
        .finish();
    builder(opcode, opaque, vbid)
        .extras(&extras)
        .key(key)
        .encode(out)
}

/// Appends a DCP_ABORT: the prepare of `key` at `prepared_seqno` is dropped, the abort
/// taking `abort_seqno` (16 bytes of extras; no value; CAS 0).
///
/// # Errors
/// [`EncodeError`] when the key does not fit its length field.
pub fn encode_abort(
    out: &mut impl BufMut,
    opaque: u32,
    vbid: Vbid,
    key: &[u8],
    prepared_seqno: u64,
    abort_seqno: u64,
) -> Result<(), EncodeError> {
    encode_completion(
        out,
        Opcode::DcpAbort,
        opaque,
        vbid,
        key,
        prepared_seqno,
        abort_seqno,
    )
}

/// Appends a DCP_STREAM_END for stream `opaque` of vBucket `vbid` (4 bytes of extras: the
/// reason u32).
///
/// # Errors
/// None in practice; the signature matches the other encoders.
pub fn encode_stream_end(
    out: &mut impl BufMut,
    opaque: u32,
    vbid: Vbid,
    reason: StreamEndReason,
) -> Result<(), EncodeError> {
    encode_stream_end_raw(out, opaque, vbid, reason.as_u32())
}

fn encode_stream_end_raw(
    out: &mut impl BufMut,
    opaque: u32,
    vbid: Vbid,
    reason: u32,
) -> Result<(), EncodeError> {
    let extras = reason.to_be_bytes();
    builder(Opcode::DcpStreamEnd, opaque, vbid)
        .extras(&extras)
        .encode(out)
}

/// Appends a DCP_NOOP (no extras, key or value; vbucket 0). The consumer answers it
/// with a response carrying the same opaque.
///
/// # Errors
/// None in practice; the signature matches the other encoders.
pub fn encode_noop(out: &mut impl BufMut, opaque: u32) -> Result<(), EncodeError> {
    builder(Opcode::DcpNoop, opaque, Vbid(0)).encode(out)
}

/// Appends a DCP_SEQNO_ADVANCED: vBucket `vbid` moved to `seqno` through changes the
/// stream does not carry (8 bytes of extras).
///
/// # Errors
/// None in practice; the signature matches the other encoders.
pub fn encode_seqno_advanced(
    out: &mut impl BufMut,
    opaque: u32,
    vbid: Vbid,
    seqno: u64,
) -> Result<(), EncodeError> {
    let extras = seqno.to_be_bytes();
    builder(Opcode::DcpSeqnoAdvanced, opaque, vbid)
        .extras(&extras)
        .encode(out)
}

/// Appends a DCP_SYSTEM_EVENT: 13 bytes of extras (by_seqno u64, event id u32, version
/// u8); the key and value are defined per event and version (kv_engine
/// `docs/dcp/documentation/commands/system_event.md`). Datatype RAW.
///
/// # Errors
/// [`EncodeError`] when the key or the body does not fit its length field.
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per wire field, in wire order"
)]
pub fn encode_system_event(
    out: &mut impl BufMut,
    opaque: u32,
    vbid: Vbid,
    by_seqno: u64,
    event_id: u32,
    version: u8,
    key: &[u8],
    value: &[u8],
) -> Result<(), EncodeError> {
    let extras = ExtrasWriter::<SYSTEM_EVENT_EXTRAS_LEN>::new()
        .put(&by_seqno.to_be_bytes())
        .put(&event_id.to_be_bytes())
        .put(&[version])
        .finish();
    builder(Opcode::DcpSystemEvent, opaque, vbid)
        .extras(&extras)
        .key(key)
        .value(value)
        .encode(out)
}

/// Appends a DCP_SET_VBUCKET_STATE (one byte of extras: the state), sent during a
/// takeover.
///
/// # Errors
/// None in practice; the signature matches the other encoders.
pub fn encode_set_vbucket_state(
    out: &mut impl BufMut,
    opaque: u32,
    vbid: Vbid,
    state: VBucketState,
) -> Result<(), EncodeError> {
    let extras = [state as u8];
    builder(Opcode::DcpSetVbucketState, opaque, vbid)
        .extras(&extras)
        .encode(out)
}

/// Appends a DCP_OSO_SNAPSHOT with `flags` ([`OSO_START`] or [`OSO_END`]; 4 bytes of
/// extras).
///
/// # Errors
/// None in practice; the signature matches the other encoders.
pub fn encode_oso_snapshot(
    out: &mut impl BufMut,
    opaque: u32,
    vbid: Vbid,
    flags: u32,
) -> Result<(), EncodeError> {
    let extras = flags.to_be_bytes();
    builder(Opcode::DcpOsoSnapshot, opaque, vbid)
        .extras(&extras)
        .encode(out)
}

/// A message a producer sends on a stream, decoded, borrowing its key and value from the
/// packet. The stream's opaque and vBucket stay in [`Request::header`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DcpMessage<'a> {
    /// DCP_SNAPSHOT_MARKER, any version.
    SnapshotMarker(SnapshotMarker),
    /// DCP_MUTATION.
    Mutation {
        /// Metadata (every field).
        meta: DcpDocMeta,
        /// The key, with its collection prefix when collections are on.
        key: &'a [u8],
        /// The value (xattrs first when the datatype says so).
        value: &'a [u8],
    },
    /// DCP_DELETION, version 1 or 2.
    Deletion {
        /// Metadata (flags, expiration, lock time and nru are zero).
        meta: DcpDocMeta,
        /// The key.
        key: &'a [u8],
        /// Empty, or the deleted document's xattrs.
        value: &'a [u8],
        /// Version 2's delete time; `None` for version 1.
        delete_time: Option<u32>,
    },
    /// DCP_EXPIRATION.
    Expiration {
        /// Metadata (flags, expiration, lock time and nru are zero).
        meta: DcpDocMeta,
        /// The key.
        key: &'a [u8],
        /// Empty, or the expired document's xattrs.
        value: &'a [u8],
        /// When the document expired.
        delete_time: u32,
    },
    /// DCP_STREAM_END, with the raw reason (see [`StreamEndReason::from_u32`]).
    StreamEnd {
        /// The reason, as sent.
        reason: u32,
    },
    /// DCP_NOOP: answer it.
    Noop,
    /// DCP_PREPARE.
    Prepare {
        /// Metadata (every field).
        meta: DcpDocMeta,
        /// The key.
        key: &'a [u8],
        /// The value.
        value: &'a [u8],
        /// Whether the prepare deletes the document.
        state: DocumentState,
        /// The SyncWrite's durability level.
        level: DurabilityLevel,
    },
    /// DCP_COMMIT.
    Commit {
        /// The key.
        key: &'a [u8],
        /// The seqno of the prepare committed.
        prepared_seqno: u64,
        /// The seqno of the commit.
        commit_seqno: u64,
    },
    /// DCP_ABORT.
    Abort {
        /// The key.
        key: &'a [u8],
        /// The seqno of the prepare aborted.
        prepared_seqno: u64,
        /// The seqno of the abort.
        abort_seqno: u64,
    },
    /// DCP_SEQNO_ADVANCED.
    SeqnoAdvanced {
        /// The vBucket's seqno now.
        seqno: u64,
    },
    /// DCP_SYSTEM_EVENT.
    SystemEvent {
        /// The seqno of the event.
        by_seqno: u64,
        /// The event id (0 collection created or flushed, 1 collection dropped, 3 scope
        /// created, 4 scope dropped, 5 collection modified).
        event_id: u32,
        /// The version of the key and value layout.
        version: u8,
        /// The key (the collection's or scope's name for some events).
        key: &'a [u8],
        /// The event data.
        value: &'a [u8],
    },
    /// DCP_SET_VBUCKET_STATE.
    SetVbucketState {
        /// The state the consumer's vBucket is to take.
        state: VBucketState,
    },
    /// DCP_OSO_SNAPSHOT.
    OsoSnapshot {
        /// [`OSO_START`] or [`OSO_END`].
        flags: u32,
    },
}

impl<'a> DcpMessage<'a> {
    /// Validates and decodes a message a producer sent, with the rules kv_engine's
    /// consumer applies:
    ///
    /// | message | extras | key | value | CAS | datatype |
    /// |---------|--------|-----|-------|-----|----------|
    /// | snapshot marker | 20, or 1 with a 36-byte (version 0) or 44-byte (version 1) value | none | see extras | any | RAW |
    /// | mutation | 31 | required | any | any | any known bits |
    /// | deletion | 18 (v1) or 21 (v2) | required | any | any | any known bits |
    /// | expiration | 20 | required | any | any | any known bits |
    /// | prepare | 31 | required | any | must be set | any known bits |
    /// | commit, abort | 16 | required | none | must be 0 | RAW |
    /// | stream end, OSO snapshot | 4 | none | none | any | RAW |
    /// | seqno advanced | 8 | none | none | any | RAW |
    /// | system event | 13 | any | any | any | RAW |
    /// | set vbucket state | 1 | none | none | any | RAW |
    /// | no-op | 0 | none | none | any | RAW |
    ///
    /// A mutation's or prepare's by_seqno must not be 0, a prepare's durability level
    /// must be 1..=3 and a vBucket state 1..=4. Deletion versions are told apart by the
    /// extras length. The nmeta fields of mutations and version 1 deletions are ignored
    /// (servers since 5.0 send 0). System event ids and versions are not judged.
    ///
    /// # Errors
    /// - [`Status::UnknownCommand`]: not a message a producer sends;
    /// - [`Status::Einval`]: a broken rule above.
    pub fn decode(req: &Request<'a>) -> Result<DcpMessage<'a>, Status> {
        use CasRule as C;
        use Presence as P;
        let op = req.opcode().ok_or(Status::UnknownCommand)?;
        let key = req.key;
        let value = req.value;
        let raw = |extras, key, value, cas| check_shape(req, extras, key, value, cas, RAW_ONLY);
        let doc = |extras, cas| check_shape(req, extras, P::NonZero, P::Any, cas, ANY_DATATYPE);
        let read_meta = |c: &mut Cursor<'_>| DcpDocMeta {
            by_seqno: c.u64(),
            rev_seqno: c.u64(),
            cas: req.header.cas,
            datatype: req.header.datatype,
            ..DcpDocMeta::default()
        };
        Ok(match op {
            Opcode::DcpSnapshotMarker => {
                let extras_len = req.extras.len();
                if extras_len != MARKER_V1_EXTRAS_LEN && extras_len != MARKER_V2_EXTRAS_LEN {
                    return Err(Status::Einval);
                }
                raw(extras_len, P::Zero, P::Any, C::Any)?;
                DcpMessage::SnapshotMarker(SnapshotMarker::decode(req.extras, value)?)
            }
            Opcode::DcpMutation => {
                doc(MUTATION_EXTRAS_LEN, C::Any)?;
                let mut c = Cursor(req.extras);
                let mut meta = read_meta(&mut c);
                meta.flags = c.u32();
                meta.expiration = c.u32();
                meta.lock_time = c.u32();
                let _nmeta = c.u16();
                meta.nru = c.u8();
                if meta.by_seqno == 0 {
                    return Err(Status::Einval);
                }
                DcpMessage::Mutation { meta, key, value }
            }
            Opcode::DcpDeletion => {
                let v2 = req.extras.len() == DELETION_V2_EXTRAS_LEN;
                let len = if v2 {
                    DELETION_V2_EXTRAS_LEN
                } else {
                    DELETION_V1_EXTRAS_LEN
                };
                doc(len, C::Any)?;
                let mut c = Cursor(req.extras);
                let meta = read_meta(&mut c);
                let delete_time = v2.then(|| c.u32());
                DcpMessage::Deletion {
                    meta,
                    key,
                    value,
                    delete_time,
                }
            }
            Opcode::DcpExpiration => {
                doc(EXPIRATION_EXTRAS_LEN, C::Any)?;
                let mut c = Cursor(req.extras);
                let meta = read_meta(&mut c);
                DcpMessage::Expiration {
                    meta,
                    key,
                    value,
                    delete_time: c.u32(),
                }
            }
            Opcode::DcpPrepare => {
                doc(PREPARE_EXTRAS_LEN, C::Set)?;
                let mut c = Cursor(req.extras);
                let mut meta = read_meta(&mut c);
                meta.flags = c.u32();
                meta.expiration = c.u32();
                meta.lock_time = c.u32();
                meta.nru = c.u8();
                let state = match c.u8() {
                    0 => DocumentState::Alive,
                    _ => DocumentState::Deleted,
                };
                let level = DurabilityLevel::from_u8(c.u8()).ok_or(Status::Einval)?;
                if meta.by_seqno == 0 {
                    return Err(Status::Einval);
                }
                DcpMessage::Prepare {
                    meta,
                    key,
                    value,
                    state,
                    level,
                }
            }
            Opcode::DcpCommit => {
                raw(COMMIT_EXTRAS_LEN, P::NonZero, P::Zero, C::Zero)?;
                let mut c = Cursor(req.extras);
                DcpMessage::Commit {
                    key,
                    prepared_seqno: c.u64(),
                    commit_seqno: c.u64(),
                }
            }
            Opcode::DcpAbort => {
                raw(ABORT_EXTRAS_LEN, P::NonZero, P::Zero, C::Zero)?;
                let mut c = Cursor(req.extras);
                DcpMessage::Abort {
                    key,
                    prepared_seqno: c.u64(),
                    abort_seqno: c.u64(),
                }
            }
            Opcode::DcpStreamEnd => {
                raw(STREAM_END_EXTRAS_LEN, P::Zero, P::Zero, C::Any)?;
                DcpMessage::StreamEnd {
                    reason: Cursor(req.extras).u32(),
                }
            }
            Opcode::DcpNoop => {
                raw(0, P::Zero, P::Zero, C::Any)?;
                DcpMessage::Noop
            }
            Opcode::DcpSeqnoAdvanced => {
                raw(SEQNO_ADVANCED_EXTRAS_LEN, P::Zero, P::Zero, C::Any)?;
                DcpMessage::SeqnoAdvanced {
                    seqno: Cursor(req.extras).u64(),
                }
            }
            Opcode::DcpSystemEvent => {
                raw(SYSTEM_EVENT_EXTRAS_LEN, P::Any, P::Any, C::Any)?;
                let mut c = Cursor(req.extras);
                DcpMessage::SystemEvent {
                    by_seqno: c.u64(),
                    event_id: c.u32(),
                    version: c.u8(),
                    key,
                    value,
                }
            }
            Opcode::DcpSetVbucketState => {
                raw(SET_VBUCKET_STATE_EXTRAS_LEN, P::Zero, P::Zero, C::Any)?;
                let state = VBucketState::from_u8(Cursor(req.extras).u8()).ok_or(Status::Einval)?;
                DcpMessage::SetVbucketState { state }
            }
            Opcode::DcpOsoSnapshot => {
                raw(OSO_SNAPSHOT_EXTRAS_LEN, P::Zero, P::Zero, C::Any)?;
                DcpMessage::OsoSnapshot {
                    flags: Cursor(req.extras).u32(),
                }
            }
            _ => return Err(Status::UnknownCommand),
        })
    }

    /// Appends the message as the request a producer sends on stream `opaque` of vBucket
    /// `vbid`. Decoding the result gives back `self` when `self` came from
    /// [`DcpMessage::decode`].
    ///
    /// # Errors
    /// [`EncodeError`] when the key or the body does not fit its length field.
    pub fn encode(
        &self,
        out: &mut impl BufMut,
        opaque: u32,
        vbid: Vbid,
    ) -> Result<(), EncodeError> {
        match *self {
            DcpMessage::SnapshotMarker(m) => m.encode(out, opaque, vbid),
            DcpMessage::Mutation { meta, key, value } => {
                encode_mutation(out, opaque, vbid, &meta, key, value)
            }
            DcpMessage::Deletion {
                meta,
                key,
                value,
                delete_time,
            } => encode_deletion(out, opaque, vbid, &meta, key, value, delete_time),
            DcpMessage::Expiration {
                meta,
                key,
                value,
                delete_time,
            } => encode_expiration(out, opaque, vbid, &meta, key, value, delete_time),
            DcpMessage::StreamEnd { reason } => encode_stream_end_raw(out, opaque, vbid, reason),
            DcpMessage::Noop => encode_noop(out, opaque),
            DcpMessage::Prepare {
                meta,
                key,
                value,
                state,
                level,
            } => encode_prepare(out, opaque, vbid, &meta, key, value, state, level),
            DcpMessage::Commit {
                key,
                prepared_seqno,
                commit_seqno,
            } => encode_commit(out, opaque, vbid, key, prepared_seqno, commit_seqno),
            DcpMessage::Abort {
                key,
                prepared_seqno,
                abort_seqno,
            } => encode_abort(out, opaque, vbid, key, prepared_seqno, abort_seqno),
            DcpMessage::SeqnoAdvanced { seqno } => encode_seqno_advanced(out, opaque, vbid, seqno),
            DcpMessage::SystemEvent {
                by_seqno,
                event_id,
                version,
                key,
                value,
            } => encode_system_event(out, opaque, vbid, by_seqno, event_id, version, key, value),
            DcpMessage::SetVbucketState { state } => {
                encode_set_vbucket_state(out, opaque, vbid, state)
            }
            DcpMessage::OsoSnapshot { flags } => encode_oso_snapshot(out, opaque, vbid, flags),
        }
    }

    /// Returns the message's opcode.
    #[must_use]
    pub fn opcode(&self) -> Opcode {
        match self {
            DcpMessage::SnapshotMarker(_) => Opcode::DcpSnapshotMarker,
            DcpMessage::Mutation { .. } => Opcode::DcpMutation,
            DcpMessage::Deletion { .. } => Opcode::DcpDeletion,
            DcpMessage::Expiration { .. } => Opcode::DcpExpiration,
            DcpMessage::StreamEnd { .. } => Opcode::DcpStreamEnd,
            DcpMessage::Noop => Opcode::DcpNoop,
            DcpMessage::Prepare { .. } => Opcode::DcpPrepare,
            DcpMessage::Commit { .. } => Opcode::DcpCommit,
            DcpMessage::Abort { .. } => Opcode::DcpAbort,
            DcpMessage::SeqnoAdvanced { .. } => Opcode::DcpSeqnoAdvanced,
            DcpMessage::SystemEvent { .. } => Opcode::DcpSystemEvent,
            DcpMessage::SetVbucketState { .. } => Opcode::DcpSetVbucketState,
            DcpMessage::OsoSnapshot { .. } => Opcode::DcpOsoSnapshot,
        }
    }
}
