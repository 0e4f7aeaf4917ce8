//! The 24-byte request and response headers, decoded field by field (all integers are
//! big-endian), and their encoders.
//!
//! Layout (kv_engine `docs/BinaryProtocol.md`):
//!
//! | bytes | request (0x80)  | request (0x08)              | response (0x81 / 0x18) |
//! |-------|-----------------|-----------------------------|------------------------|
//! | 0     | magic           | magic                       | magic                  |
//! | 1     | opcode          | opcode                      | opcode                 |
//! | 2-3   | key length u16  | framing len u8, key len u8  | as the request         |
//! | 4     | extras length   | extras length               | extras length          |
//! | 5     | datatype        | datatype                    | datatype               |
//! | 6-7   | vbucket id      | vbucket id                  | status                 |
//! | 8-11  | total body length (framing extras + extras + key + value)                 |
//! | 12-15 | opaque (echoed in the response)                                           |
//! | 16-23 | CAS                                                                       |

use crate::header_error::{EncodeError, HeaderError};
use crate::limits::{HEADER_LEN, Limits};
use crate::magic::Magic;
use epkv_types::{Cas, Datatype, Vbid};

/// The fields both header kinds share, read from the raw bytes without judging them.
#[derive(Debug, Clone, Copy)]
struct RawHeader {
    magic: Magic,
    opcode: u8,
    framing_extras_len: u8,
    key_len: u16,
    extras_len: u8,
    datatype: Datatype,
    specific: u16,
    body_len: u32,
    opaque: u32,
    cas: Cas,
}

impl RawHeader {
    fn decode(b: &[u8; HEADER_LEN]) -> Result<RawHeader, HeaderError> {
        let magic = Magic::from_u8(b[0]).ok_or(HeaderError::UnknownMagic(b[0]))?;
        let (framing_extras_len, key_len) = if magic.has_framing_extras() {
            (b[2], u16::from(b[3]))
        } else {
            (0, u16::from_be_bytes([b[2], b[3]]))
        };
        Ok(RawHeader {
            magic,
            opcode: b[1],
            framing_extras_len,
            key_len,
            extras_len: b[4],
            datatype: Datatype(b[5]),
            specific: u16::from_be_bytes([b[6], b[7]]),
            body_len: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
            opaque: u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
            cas: Cas(u64::from_be_bytes([
                b[16], b[17], b[18], b[19], b[20], b[21], b[22], b[23],
            ])),
        })
    }

    /// Checks that the section lengths fit in the body and the packet fits the limit.
    fn check_lengths(&self, limits: &Limits) -> Result<(), HeaderError> {
        let packet_bytes = HEADER_LEN as u64 + u64::from(self.body_len);
        if packet_bytes > u64::from(limits.max_packet_bytes) {
            return Err(HeaderError::PacketTooLarge {
                packet_bytes,
                max_bytes: limits.max_packet_bytes,
            });
        }
        self.check_sections()
    }

    fn check_sections(&self) -> Result<(), HeaderError> {
        let sections = u64::from(self.framing_extras_len)
            + u64::from(self.extras_len)
            + u64::from(self.key_len);
        if sections > u64::from(self.body_len) {
            return Err(HeaderError::LengthsExceedBody {
                framing_extras: self.framing_extras_len,
                extras: self.extras_len,
                key: self.key_len,
                body: self.body_len,
            });
        }
        Ok(())
    }
}

/// Writes a header; `specific` is the vbucket id of a request or the status of a response.
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per header field keeps both header kinds on one encoder"
)]
fn encode_raw(
    magic: Magic,
    opcode: u8,
    framing_extras_len: u8,
    key_len: u16,
    extras_len: u8,
    datatype: Datatype,
    specific: u16,
    body_len: u32,
    opaque: u32,
    cas: Cas,
) -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    b[0] = magic.as_u8();
    b[1] = opcode;
    if magic.has_framing_extras() {
        b[2] = framing_extras_len;
        // The alt header has one byte for the key; callers check `key_len <= 255`.
        b[3] = key_len.to_be_bytes()[1];
    } else {
        b[2..4].copy_from_slice(&key_len.to_be_bytes());
    }
    b[4] = extras_len;
    b[5] = datatype.0;
    b[6..8].copy_from_slice(&specific.to_be_bytes());
    b[8..12].copy_from_slice(&body_len.to_be_bytes());
    b[12..16].copy_from_slice(&opaque.to_be_bytes());
    b[16..24].copy_from_slice(&cas.0.to_be_bytes());
    b
}

/// Returns the lengths of a packet's sections checked to fit their header fields, and
/// the magic to use (`alt` when there are framing extras).
pub(crate) fn check_encodable(
    framing_extras: usize,
    extras: usize,
    key: usize,
    value: usize,
) -> Result<(u8, u8, u16, u32), EncodeError> {
    let framing_len = u8::try_from(framing_extras)
        .map_err(|_| EncodeError::FramingExtrasTooLong(framing_extras))?;
    let extras_len = u8::try_from(extras).map_err(|_| EncodeError::ExtrasTooLong(extras))?;
    let max_key = if framing_extras > 0 {
        usize::from(u8::MAX)
    } else {
        usize::from(u16::MAX)
    };
    if key > max_key {
        return Err(EncodeError::KeyTooLong {
            len: key,
            max: max_key,
        });
    }
    let key_len = u16::try_from(key).map_err(|_| EncodeError::KeyTooLong {
        len: key,
        max: max_key,
    })?;
    let body = framing_extras as u64 + extras as u64 + key as u64 + value as u64;
    let body_len = u32::try_from(body).map_err(|_| EncodeError::BodyTooLong(body))?;
    Ok((framing_len, extras_len, key_len, body_len))
}

/// A decoded request header. Lengths are as announced; [`RequestHeader::decode`] has
/// checked that they are consistent with each other and with the [`Limits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// 0x80 or 0x08.
    pub magic: Magic,
    /// The raw opcode byte (see [`crate::Opcode::from_u8`]); echoed in the response.
    pub opcode: u8,
    /// Framing-extras length (0 unless the magic is 0x08).
    pub framing_extras_len: u8,
    /// Key length.
    pub key_len: u16,
    /// Extras length.
    pub extras_len: u8,
    /// Datatype bits as sent (unknown bits are rejected by [`crate::Command::decode`]).
    pub datatype: Datatype,
    /// The vBucket the request names.
    pub vbucket: Vbid,
    /// Total body length: framing extras + extras + key + value.
    pub body_len: u32,
    /// Opaque value echoed in the response.
    pub opaque: u32,
    /// CAS (zero = none).
    pub cas: Cas,
}

impl RequestHeader {
    /// Decodes and checks a request header.
    ///
    /// # Errors
    /// [`HeaderError`] when the magic is not 0x80/0x08, the packet would exceed
    /// `limits.max_packet_bytes`, or the section lengths exceed the body length.
    pub fn decode(bytes: &[u8; HEADER_LEN], limits: &Limits) -> Result<RequestHeader, HeaderError> {
        let raw = RawHeader::decode(bytes)?;
        if !raw.magic.is_client_request() {
            return Err(HeaderError::UnexpectedMagic(raw.magic.as_u8()));
        }
        raw.check_lengths(limits)?;
        Ok(RequestHeader {
            magic: raw.magic,
            opcode: raw.opcode,
            framing_extras_len: raw.framing_extras_len,
            key_len: raw.key_len,
            extras_len: raw.extras_len,
            datatype: raw.datatype,
            vbucket: Vbid(raw.specific),
            body_len: raw.body_len,
            opaque: raw.opaque,
            cas: raw.cas,
        })
    }

    /// Returns the whole packet length: header plus body.
    #[must_use]
    pub fn packet_len(&self) -> usize {
        HEADER_LEN + self.body_len as usize
    }

    /// Returns the value length (body minus framing extras, extras and key).
    #[must_use]
    pub fn value_len(&self) -> usize {
        (self.body_len as usize)
            .saturating_sub(usize::from(self.framing_extras_len))
            .saturating_sub(usize::from(self.extras_len))
            .saturating_sub(usize::from(self.key_len))
    }

    /// Encodes the header. The magic is written as given; with magic 0x08 only the low
    /// byte of `key_len` fits and the caller keeps it at most 255.
    #[must_use]
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        encode_raw(
            self.magic,
            self.opcode,
            self.framing_extras_len,
            self.key_len,
            self.extras_len,
            self.datatype,
            self.vbucket.0,
            self.body_len,
            self.opaque,
            self.cas,
        )
    }
}

/// A decoded response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHeader {
    /// 0x81 or 0x18 (0x83 from [`ResponseHeader::decode_server_response`]).
    pub magic: Magic,
    /// The opcode of the request this answers.
    pub opcode: u8,
    /// Framing-extras length (0 unless the magic is 0x18).
    pub framing_extras_len: u8,
    /// Key length.
    pub key_len: u16,
    /// Extras length.
    pub extras_len: u8,
    /// Datatype of the value.
    pub datatype: Datatype,
    /// Raw status (see [`crate::Status::from_u16`]).
    pub status: u16,
    /// Total body length.
    pub body_len: u32,
    /// Opaque value of the request.
    pub opaque: u32,
    /// CAS of the document, or zero.
    pub cas: Cas,
}

impl ResponseHeader {
    /// Decodes and checks a response header.
    ///
    /// # Errors
    /// [`HeaderError`] when the magic is not 0x81/0x18, the packet would exceed
    /// `limits.max_packet_bytes`, or the section lengths exceed the body length.
    pub fn decode(
        bytes: &[u8; HEADER_LEN],
        limits: &Limits,
    ) -> Result<ResponseHeader, HeaderError> {
        Self::decode_with(bytes, limits, Magic::is_client_response)
    }

    /// Decodes and checks the header of a duplex client's reply to a server request
    /// (magic 0x83, classic layout).
    ///
    /// # Errors
    /// [`HeaderError`] when the magic is not 0x83, the packet would exceed
    /// `limits.max_packet_bytes`, or the section lengths exceed the body length.
    pub fn decode_server_response(
        bytes: &[u8; HEADER_LEN],
        limits: &Limits,
    ) -> Result<ResponseHeader, HeaderError> {
        Self::decode_with(bytes, limits, |m| m == Magic::ServerResponse)
    }

    /// Both decoders: the header, if `accept` takes its magic and its lengths hold.
    fn decode_with(
        bytes: &[u8; HEADER_LEN],
        limits: &Limits,
        accept: impl Fn(Magic) -> bool,
    ) -> Result<ResponseHeader, HeaderError> {
        let raw = RawHeader::decode(bytes)?;
        if !accept(raw.magic) {
            return Err(HeaderError::UnexpectedMagic(raw.magic.as_u8()));
        }
        raw.check_lengths(limits)?;
        Ok(ResponseHeader {
            magic: raw.magic,
            opcode: raw.opcode,
            framing_extras_len: raw.framing_extras_len,
            key_len: raw.key_len,
            extras_len: raw.extras_len,
            datatype: raw.datatype,
            status: raw.specific,
            body_len: raw.body_len,
            opaque: raw.opaque,
            cas: raw.cas,
        })
    }

    /// Returns the whole packet length: header plus body.
    #[must_use]
    pub fn packet_len(&self) -> usize {
        HEADER_LEN + self.body_len as usize
    }

    /// Returns the value length (body minus framing extras, extras and key).
    #[must_use]
    pub fn value_len(&self) -> usize {
        (self.body_len as usize)
            .saturating_sub(usize::from(self.framing_extras_len))
            .saturating_sub(usize::from(self.extras_len))
            .saturating_sub(usize::from(self.key_len))
    }

    /// Encodes the header. With magic 0x18 only the low byte of `key_len` fits and the
    /// caller keeps it at most 255.
    #[must_use]
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        encode_raw(
            self.magic,
            self.opcode,
            self.framing_extras_len,
            self.key_len,
            self.extras_len,
            self.datatype,
            self.status,
            self.body_len,
            self.opaque,
            self.cas,
        )
    }
}

/// The four body sections of one packet, borrowed from the receive buffer.
pub(crate) struct Sections<'a> {
    pub(crate) framing_extras: &'a [u8],
    pub(crate) extras: &'a [u8],
    pub(crate) key: &'a [u8],
    pub(crate) value: &'a [u8],
}

/// Returns the header bytes at the front of `buf`, or `Incomplete`.
pub(crate) fn header_bytes(buf: &[u8]) -> Result<&[u8; HEADER_LEN], HeaderError> {
    buf.first_chunk::<HEADER_LEN>()
        .ok_or(HeaderError::Incomplete {
            needed: HEADER_LEN as u64,
            available: buf.len(),
        })
}

/// Splits the body of the packet at the front of `buf` by section lengths a decoded
/// (hence trusted: framing + extras + key <= body) header gave; `Incomplete` when `buf`
/// is shorter than `packet_len`. Shared by request and response parsing.
pub(crate) fn split_body(
    buf: &[u8],
    packet_len: usize,
    framing_extras_len: u8,
    extras_len: u8,
    key_len: u16,
) -> Result<Sections<'_>, HeaderError> {
    let body = buf
        .get(HEADER_LEN..packet_len)
        .ok_or(HeaderError::Incomplete {
            needed: packet_len as u64,
            available: buf.len(),
        })?;
    let (framing_extras, rest) = body.split_at(usize::from(framing_extras_len));
    let (extras, rest) = rest.split_at(usize::from(extras_len));
    let (key, value) = rest.split_at(usize::from(key_len));
    Ok(Sections {
        framing_extras,
        extras,
        key,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_header_fields_are_big_endian_at_their_offsets() {
        let h = RequestHeader {
            magic: Magic::ClientRequest,
            opcode: 0x01,
            framing_extras_len: 0,
            key_len: 0x0102,
            extras_len: 8,
            datatype: Datatype::JSON,
            vbucket: Vbid(0x0304),
            body_len: 0x0102 + 8 + 5,
            opaque: 0x0506_0708,
            cas: Cas(0x1112_1314_1516_1718),
        };
        let b = h.encode();
        assert_eq!(b[..8], [0x80, 0x01, 0x01, 0x02, 8, 0x01, 0x03, 0x04]);
        assert_eq!(b[8..12], (0x0102u32 + 13).to_be_bytes());
        assert_eq!(b[12..16], [5, 6, 7, 8]);
        assert_eq!(b[16..], [0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18]);
        assert_eq!(RequestHeader::decode(&b, &Limits::default()), Ok(h));
        assert_eq!(h.value_len(), 5);
        assert_eq!(h.packet_len(), 24 + 0x0102 + 13);
    }

    #[test]
    fn alt_headers_split_bytes_two_and_three() {
        let h = ResponseHeader {
            magic: Magic::AltClientResponse,
            opcode: 0x00,
            framing_extras_len: 3,
            key_len: 2,
            extras_len: 4,
            datatype: Datatype::RAW,
            status: 0x0001,
            body_len: 3 + 2 + 4 + 1,
            opaque: 9,
            cas: Cas(0),
        };
        let b = h.encode();
        assert_eq!(b[..8], [0x18, 0x00, 3, 2, 4, 0, 0x00, 0x01]);
        assert_eq!(ResponseHeader::decode(&b, &Limits::default()), Ok(h));
        assert_eq!(h.value_len(), 1);
    }

    #[test]
    fn encodable_lengths_are_bounded_by_their_fields() {
        assert!(check_encodable(0, 255, 65535, 0).is_ok());
        assert_eq!(
            check_encodable(0, 256, 0, 0),
            Err(EncodeError::ExtrasTooLong(256))
        );
        assert_eq!(
            check_encodable(256, 0, 0, 0),
            Err(EncodeError::FramingExtrasTooLong(256))
        );
        assert_eq!(
            check_encodable(1, 0, 256, 0),
            Err(EncodeError::KeyTooLong { len: 256, max: 255 })
        );
        assert_eq!(
            check_encodable(0, 0, 65536, 0),
            Err(EncodeError::KeyTooLong {
                len: 65536,
                max: 65535
            })
        );
        assert!(matches!(
            check_encodable(0, 1, 0, u32::MAX as usize),
            Err(EncodeError::BodyTooLong(_))
        ));
    }
}
