//! What a DCP client sends: the typed extras of DCP_OPEN, DCP_STREAM_REQ,
//! DCP_BUFFER_ACKNOWLEDGEMENT and DCP_SEQNO_ACKNOWLEDGED, the validating
//! [`DcpRequest::decode`], and the encoders a consumer uses.

use super::wire::{CasRule, ExtrasWriter, Presence, RAW_ONLY, builder, check_shape, exact};
use super::{
    OPEN_FLAGS, OPEN_INCLUDE_DELETED_USER_XATTRS, OPEN_INCLUDE_XATTRS, OPEN_NO_VALUE,
    OPEN_NO_VALUE_WITH_UNDERLYING_DATATYPE, OPEN_PRODUCER,
};
use crate::header_error::EncodeError;
use crate::opcode::Opcode;
use crate::request::Request;
use crate::status::Status;
use bytes::BufMut;
use epkv_types::{Datatype, Vbid};

/// The extras of DCP_OPEN: a sequence number (unused, sent as 0) and the flags
/// (`OPEN_*`). The key is the connection's name; newer clients may add a JSON value
/// (`{"consumer_name": ...}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DcpOpen {
    /// Unused by servers; clients send 0.
    pub seqno: u32,
    /// `OPEN_*` bits.
    pub flags: u32,
}

impl DcpOpen {
    /// The length of DCP_OPEN's extras.
    pub const EXTRAS_LEN: usize = 8;

    /// Decodes DCP_OPEN's extras (seqno u32, flags u32). The flags are not judged; see
    /// [`DcpOpen::check_flags`].
    ///
    /// # Errors
    /// [`Status::Einval`] unless `extras` is exactly 8 bytes.
    pub fn decode(extras: &[u8]) -> Result<DcpOpen, Status> {
        let mut c = exact(extras, Self::EXTRAS_LEN)?;
        Ok(DcpOpen {
            seqno: c.u32(),
            flags: c.u32(),
        })
    }

    /// Returns the extras bytes.
    #[must_use]
    pub fn to_extras(&self) -> [u8; 8] {
        ExtrasWriter::new()
            .put(&self.seqno.to_be_bytes())
            .put(&self.flags.to_be_bytes())
            .finish()
    }

    /// Checks the flags as kv_engine's validator does.
    ///
    /// # Errors
    /// [`Status::Einval`] for a bit outside [`OPEN_FLAGS`] (the retired notifier bit
    /// included), for [`OPEN_NO_VALUE`] together with
    /// [`OPEN_NO_VALUE_WITH_UNDERLYING_DATATYPE`], and for
    /// [`OPEN_INCLUDE_DELETED_USER_XATTRS`] without [`OPEN_INCLUDE_XATTRS`].
    pub fn check_flags(&self) -> Result<(), Status> {
        let f = self.flags;
        let both_no_value = OPEN_NO_VALUE | OPEN_NO_VALUE_WITH_UNDERLYING_DATATYPE;
        if f & !OPEN_FLAGS != 0
            || f & both_no_value == both_no_value
            || (f & OPEN_INCLUDE_DELETED_USER_XATTRS != 0 && f & OPEN_INCLUDE_XATTRS == 0)
        {
            return Err(Status::Einval);
        }
        Ok(())
    }

    /// Returns true when the client asks the server to be its producer.
    #[must_use]
    pub fn is_producer(&self) -> bool {
        self.flags & OPEN_PRODUCER != 0
    }
}

/// The extras of DCP_STREAM_REQ: where the consumer is and what it wants. A value, when
/// present, is JSON (a collections filter, or the manifest uid to resume from).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamReq {
    /// `STREAM_*` bits.
    pub flags: u32,
    /// Reserved; clients send 0.
    pub reserved: u32,
    /// The last seqno the consumer has (the stream starts after it).
    pub start_seqno: u64,
    /// The seqno to end at (`u64::MAX`: stream forever).
    pub end_seqno: u64,
    /// The vBucket UUID the consumer's history belongs to (0: it has none).
    pub vbucket_uuid: u64,
    /// The start of the snapshot the consumer last received (partially or whole).
    pub snap_start_seqno: u64,
    /// The end of that snapshot.
    pub snap_end_seqno: u64,
}

impl StreamReq {
    /// The length of DCP_STREAM_REQ's extras.
    pub const EXTRAS_LEN: usize = 48;

    /// Decodes DCP_STREAM_REQ's extras: flags u32, reserved u32, then start, end, vBucket
    /// UUID, snapshot start and snapshot end, each u64. Seqno ranges are not judged (the
    /// producer answers ERANGE or ROLLBACK).
    ///
    /// # Errors
    /// [`Status::Einval`] unless `extras` is exactly 48 bytes.
    pub fn decode(extras: &[u8]) -> Result<StreamReq, Status> {
        let mut c = exact(extras, Self::EXTRAS_LEN)?;
        Ok(StreamReq {
            flags: c.u32(),
            reserved: c.u32(),
            start_seqno: c.u64(),
            end_seqno: c.u64(),
            vbucket_uuid: c.u64(),
            snap_start_seqno: c.u64(),
            snap_end_seqno: c.u64(),
        })
    }

    /// Returns the extras bytes.
    #[must_use]
    pub fn to_extras(&self) -> [u8; 48] {
        ExtrasWriter::new()
            .put(&self.flags.to_be_bytes())
            .put(&self.reserved.to_be_bytes())
            .put(&self.start_seqno.to_be_bytes())
            .put(&self.end_seqno.to_be_bytes())
            .put(&self.vbucket_uuid.to_be_bytes())
            .put(&self.snap_start_seqno.to_be_bytes())
            .put(&self.snap_end_seqno.to_be_bytes())
            .finish()
    }
}

/// The extras of DCP_BUFFER_ACKNOWLEDGEMENT: bytes of DCP messages (headers included) the
/// consumer has processed since its last acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BufferAck {
    /// Bytes processed.
    pub bytes: u32,
}

impl BufferAck {
    /// The length of DCP_BUFFER_ACKNOWLEDGEMENT's extras.
    pub const EXTRAS_LEN: usize = 4;

    /// Decodes the extras (bytes u32).
    ///
    /// # Errors
    /// [`Status::Einval`] unless `extras` is exactly 4 bytes.
    pub fn decode(extras: &[u8]) -> Result<BufferAck, Status> {
        let mut c = exact(extras, Self::EXTRAS_LEN)?;
        Ok(BufferAck { bytes: c.u32() })
    }

    /// Returns the extras bytes.
    #[must_use]
    pub fn to_extras(&self) -> [u8; 4] {
        self.bytes.to_be_bytes()
    }
}

/// The extras of DCP_SEQNO_ACKNOWLEDGED: the highest prepare seqno a replica holds (the
/// header's vbucket names the vBucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SeqnoAck {
    /// The replica's high prepared seqno.
    pub prepared_seqno: u64,
}

impl SeqnoAck {
    /// The length of DCP_SEQNO_ACKNOWLEDGED's extras.
    pub const EXTRAS_LEN: usize = 8;

    /// Decodes the extras (prepared seqno u64).
    ///
    /// # Errors
    /// [`Status::Einval`] unless `extras` is exactly 8 bytes.
    pub fn decode(extras: &[u8]) -> Result<SeqnoAck, Status> {
        let mut c = exact(extras, Self::EXTRAS_LEN)?;
        Ok(SeqnoAck {
            prepared_seqno: c.u64(),
        })
    }

    /// Returns the extras bytes.
    #[must_use]
    pub fn to_extras(&self) -> [u8; 8] {
        self.prepared_seqno.to_be_bytes()
    }
}

/// A validated DCP request from a client, borrowing from the packet. The header fields
/// (vbucket, opaque) stay in [`Request::header`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DcpRequest<'a> {
    /// DCP_OPEN.
    Open {
        /// The extras.
        open: DcpOpen,
        /// The connection name (the key).
        name: &'a [u8],
        /// Empty, or a JSON object (datatype JSON) the caller still has to parse: kv_engine
        /// accepts only a string `consumer_name`, and only on consumer connections.
        value: &'a [u8],
    },
    /// DCP_CLOSE_STREAM for the header's vBucket.
    CloseStream,
    /// DCP_STREAM_REQ for the header's vBucket.
    StreamReq {
        /// The extras.
        req: StreamReq,
        /// Empty, or JSON (collections filter); only a client that negotiated collections
        /// may send one, which the caller checks.
        value: &'a [u8],
    },
    /// DCP_GET_FAILOVER_LOG for the header's vBucket. Allowed before DCP_OPEN.
    GetFailoverLog,
    /// DCP_NOOP.
    Noop,
    /// DCP_BUFFER_ACKNOWLEDGEMENT.
    BufferAck(BufferAck),
    /// DCP_CONTROL: a connection option by name, with its setting.
    Control {
        /// The option's name (the key).
        key: &'a [u8],
        /// Its setting (the value).
        value: &'a [u8],
    },
    /// DCP_SEQNO_ACKNOWLEDGED for the header's vBucket.
    SeqnoAck(SeqnoAck),
}

impl<'a> DcpRequest<'a> {
    /// Validates a client's DCP request and decodes it, with kv_engine's per-opcode rules:
    ///
    /// | opcode | extras | key | value | CAS | datatype |
    /// |--------|--------|-----|-------|-----|----------|
    /// | DCP_OPEN | 8 | required | any | any | RAW without a value, JSON with one |
    /// | DCP_STREAM_REQ | 48 | none | any | any | RAW |
    /// | DCP_CLOSE_STREAM, DCP_GET_FAILOVER_LOG, DCP_NOOP | 0 | none | none | any | RAW |
    /// | DCP_BUFFER_ACKNOWLEDGEMENT | 4 | none | none | any | RAW |
    /// | DCP_CONTROL | 0 | required | required | any | RAW |
    /// | DCP_SEQNO_ACKNOWLEDGED | 8 | none | none | must be 0 | RAW |
    ///
    /// Connection state (DCP_OPEN only once, the others only after it, a stream value only
    /// with collections) is the caller's to check.
    ///
    /// # Errors
    /// - [`Status::UnknownCommand`]: not one of the opcodes above (messages a producer
    ///   sends, DCP_ADD_STREAM, or not a DCP opcode at all);
    /// - [`Status::Einval`]: a broken rule above, bad DCP_OPEN flags
    ///   ([`DcpOpen::check_flags`]), or a durability frame;
    /// - [`Status::NotSupported`]: a PreserveTtl frame; other frame errors as
    ///   [`Request::frame_info`].
    pub fn decode(req: &Request<'a>) -> Result<DcpRequest<'a>, Status> {
        use CasRule as C;
        use Presence as P;
        let op = req.opcode().ok_or(Status::UnknownCommand)?;
        let shape = |extras, key, value, cas| check_shape(req, extras, key, value, cas, RAW_ONLY);
        let decoded = match op {
            Opcode::DcpOpen => {
                let json = Datatype::JSON.0;
                check_shape(req, DcpOpen::EXTRAS_LEN, P::NonZero, P::Any, C::Any, json)?;
                let expected = if req.value.is_empty() {
                    Datatype::RAW
                } else {
                    Datatype::JSON
                };
                if req.header.datatype != expected {
                    return Err(Status::Einval);
                }
                let open = DcpOpen::decode(req.extras)?;
                open.check_flags()?;
                DcpRequest::Open {
                    open,
                    name: req.key,
                    value: req.value,
                }
            }
            Opcode::DcpStreamReq => {
                shape(StreamReq::EXTRAS_LEN, P::Zero, P::Any, C::Any)?;
                DcpRequest::StreamReq {
                    req: StreamReq::decode(req.extras)?,
                    value: req.value,
                }
            }
            Opcode::DcpCloseStream => {
                shape(0, P::Zero, P::Zero, C::Any)?;
                DcpRequest::CloseStream
            }
            Opcode::DcpGetFailoverLog => {
                shape(0, P::Zero, P::Zero, C::Any)?;
                DcpRequest::GetFailoverLog
            }
            Opcode::DcpNoop => {
                shape(0, P::Zero, P::Zero, C::Any)?;
                DcpRequest::Noop
            }
            Opcode::DcpBufferAcknowledgement => {
                shape(BufferAck::EXTRAS_LEN, P::Zero, P::Zero, C::Any)?;
                DcpRequest::BufferAck(BufferAck::decode(req.extras)?)
            }
            Opcode::DcpControl => {
                shape(0, P::NonZero, P::NonZero, C::Any)?;
                DcpRequest::Control {
                    key: req.key,
                    value: req.value,
                }
            }
            Opcode::DcpSeqnoAcknowledged => {
                shape(SeqnoAck::EXTRAS_LEN, P::Zero, P::Zero, C::Zero)?;
                DcpRequest::SeqnoAck(SeqnoAck::decode(req.extras)?)
            }
            _ => return Err(Status::UnknownCommand),
        };
        let frames = req.frame_info()?;
        if frames.durability.is_some() {
            return Err(Status::Einval);
        }
        if frames.preserve_ttl {
            return Err(Status::NotSupported);
        }
        Ok(decoded)
    }

    /// Returns the request's opcode.
    #[must_use]
    pub fn opcode(&self) -> Opcode {
        match self {
            DcpRequest::Open { .. } => Opcode::DcpOpen,
            DcpRequest::CloseStream => Opcode::DcpCloseStream,
            DcpRequest::StreamReq { .. } => Opcode::DcpStreamReq,
            DcpRequest::GetFailoverLog => Opcode::DcpGetFailoverLog,
            DcpRequest::Noop => Opcode::DcpNoop,
            DcpRequest::BufferAck(_) => Opcode::DcpBufferAcknowledgement,
            DcpRequest::Control { .. } => Opcode::DcpControl,
            DcpRequest::SeqnoAck(_) => Opcode::DcpSeqnoAcknowledged,
        }
    }
}

/// Appends a DCP_OPEN request naming the connection `name`, with seqno 0, `flags`
/// (`OPEN_*`) and no value.
///
/// # Errors
/// [`EncodeError`] when `name` is longer than 65535 bytes.
pub fn encode_open(
    out: &mut impl BufMut,
    opaque: u32,
    name: &[u8],
    flags: u32,
) -> Result<(), EncodeError> {
    let extras = DcpOpen { seqno: 0, flags }.to_extras();
    builder(Opcode::DcpOpen, opaque, Vbid(0))
        .extras(&extras)
        .key(name)
        .encode(out)
}

/// Appends a DCP_STREAM_REQ request for vBucket `vbid`, without a value.
///
/// # Errors
/// None in practice; the signature matches the other encoders.
pub fn encode_stream_req(
    out: &mut impl BufMut,
    opaque: u32,
    vbid: Vbid,
    req: &StreamReq,
) -> Result<(), EncodeError> {
    let extras = req.to_extras();
    builder(Opcode::DcpStreamReq, opaque, vbid)
        .extras(&extras)
        .encode(out)
}

/// Appends a DCP_CONTROL request setting option `key` to `value`.
///
/// # Errors
/// [`EncodeError`] when the key or the body does not fit its length field.
pub fn encode_control(
    out: &mut impl BufMut,
    opaque: u32,
    key: &[u8],
    value: &[u8],
) -> Result<(), EncodeError> {
    builder(Opcode::DcpControl, opaque, Vbid(0))
        .key(key)
        .value(value)
        .encode(out)
}

/// Appends a DCP_BUFFER_ACKNOWLEDGEMENT request acknowledging `bytes`.
///
/// # Errors
/// None in practice; the signature matches the other encoders.
pub fn encode_buffer_ack(
    out: &mut impl BufMut,
    opaque: u32,
    bytes: u32,
) -> Result<(), EncodeError> {
    let extras = BufferAck { bytes }.to_extras();
    builder(Opcode::DcpBufferAcknowledgement, opaque, Vbid(0))
        .extras(&extras)
        .encode(out)
}

/// Appends a DCP_SEQNO_ACKNOWLEDGED request: vBucket `vbid` holds prepares up to
/// `prepared_seqno`.
///
/// # Errors
/// None in practice; the signature matches the other encoders.
pub fn encode_seqno_ack(
    out: &mut impl BufMut,
    opaque: u32,
    vbid: Vbid,
    prepared_seqno: u64,
) -> Result<(), EncodeError> {
    let extras = SeqnoAck { prepared_seqno }.to_extras();
    builder(Opcode::DcpSeqnoAcknowledged, opaque, vbid)
        .extras(&extras)
        .encode(out)
}

/// Appends a DCP_CLOSE_STREAM request for vBucket `vbid`.
///
/// # Errors
/// None in practice; the signature matches the other encoders.
pub fn encode_close_stream(
    out: &mut impl BufMut,
    opaque: u32,
    vbid: Vbid,
) -> Result<(), EncodeError> {
    builder(Opcode::DcpCloseStream, opaque, vbid).encode(out)
}

/// Appends a DCP_GET_FAILOVER_LOG request for vBucket `vbid`.
///
/// # Errors
/// None in practice; the signature matches the other encoders.
pub fn encode_get_failover_log(
    out: &mut impl BufMut,
    opaque: u32,
    vbid: Vbid,
) -> Result<(), EncodeError> {
    builder(Opcode::DcpGetFailoverLog, opaque, vbid).encode(out)
}
