//! Responses: a borrowed view that is both what the server encodes and what the client
//! parses.

use crate::header::{ResponseHeader, Sections, check_encodable, header_bytes, split_body};
use crate::header_error::{EncodeError, HeaderError};
use crate::limits::{HEADER_LEN, Limits};
use crate::magic::Magic;
use crate::request::Request;
use crate::status::Status;
use bytes::BufMut;
use epkv_types::{Cas, Datatype};

/// One response packet. To answer, build it with [`Response::for_request`] and the
/// `with_*` methods and [`Response::encode`] it; to read one, [`Response::parse`] it.
/// Non-empty framing extras select magic 0x18, otherwise 0x81.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response<'a> {
    /// Opcode of the request answered (echoed raw, even when unknown).
    pub opcode: u8,
    /// Raw status; see [`Response::status`].
    pub status: u16,
    /// Opaque of the request answered.
    pub opaque: u32,
    /// CAS of the document, or zero.
    pub cas: Cas,
    /// Datatype of the value.
    pub datatype: Datatype,
    /// Response framing extras (magic 0x18), for example a server duration.
    pub framing_extras: &'a [u8],
    /// Extras (for example the flags of a GET hit, or vbucket UUID and seqno).
    pub extras: &'a [u8],
    /// Key (GETK and friends).
    pub key: &'a [u8],
    /// Value.
    pub value: &'a [u8],
}

impl<'a> Response<'a> {
    /// Returns an empty response with the given opcode, status and opaque.
    #[must_use]
    pub fn new(opcode: u8, status: Status, opaque: u32) -> Response<'a> {
        Response {
            opcode,
            status: status.as_u16(),
            opaque,
            cas: Cas::ANY,
            datatype: Datatype::RAW,
            framing_extras: &[],
            extras: &[],
            key: &[],
            value: &[],
        }
    }

    /// Returns an empty response to `req` (its opcode and opaque) with `status`.
    #[must_use]
    pub fn for_request(req: &Request<'_>, status: Status) -> Response<'a> {
        Response::new(req.header.opcode, status, req.header.opaque)
    }

    /// Returns an error response to `req` whose value is the status's short text, as
    /// memcached sends with its error statuses.
    #[must_use]
    pub fn error(req: &Request<'_>, status: Status) -> Response<'static> {
        Response::new(req.header.opcode, status, req.header.opaque)
            .with_value(status.message().as_bytes())
    }

    /// Sets the CAS.
    #[must_use]
    pub fn with_cas(mut self, cas: Cas) -> Self {
        self.cas = cas;
        self
    }

    /// Sets the datatype.
    #[must_use]
    pub fn with_datatype(mut self, datatype: Datatype) -> Self {
        self.datatype = datatype;
        self
    }

    /// Sets the framing extras (switches the magic to 0x18).
    #[must_use]
    pub fn with_framing_extras(mut self, framing_extras: &'a [u8]) -> Self {
        self.framing_extras = framing_extras;
        self
    }

    /// Sets the extras.
    #[must_use]
    pub fn with_extras(mut self, extras: &'a [u8]) -> Self {
        self.extras = extras;
        self
    }

    /// Sets the key.
    #[must_use]
    pub fn with_key(mut self, key: &'a [u8]) -> Self {
        self.key = key;
        self
    }

    /// Sets the value.
    #[must_use]
    pub fn with_value(mut self, value: &'a [u8]) -> Self {
        self.value = value;
        self
    }

    /// Returns the status, or `None` for a code not in the table.
    #[must_use]
    pub fn status(&self) -> Option<Status> {
        Status::from_u16(self.status)
    }

    /// Returns true when the status is Success.
    #[must_use]
    pub fn is_success(&self) -> bool {
        self.status == Status::Success.as_u16()
    }

    /// Returns the header this response encodes with.
    ///
    /// # Errors
    /// [`EncodeError`] when a section does not fit its length field (extras or framing
    /// extras over 255 bytes, a key over 65535 bytes or over 255 with framing extras, a
    /// body over `u32::MAX`).
    pub fn header(&self) -> Result<ResponseHeader, EncodeError> {
        let (framing_extras_len, extras_len, key_len, body_len) = check_encodable(
            self.framing_extras.len(),
            self.extras.len(),
            self.key.len(),
            self.value.len(),
        )?;
        let magic = if self.framing_extras.is_empty() {
            Magic::ClientResponse
        } else {
            Magic::AltClientResponse
        };
        Ok(ResponseHeader {
            magic,
            opcode: self.opcode,
            framing_extras_len,
            key_len,
            extras_len,
            datatype: self.datatype,
            status: self.status,
            body_len,
            opaque: self.opaque,
            cas: self.cas,
        })
    }

    /// Returns the encoded length in bytes.
    #[must_use]
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN
            + self.framing_extras.len()
            + self.extras.len()
            + self.key.len()
            + self.value.len()
    }

    /// Appends the encoded packet to `out` (a `BytesMut` or `Vec<u8>`), copying each
    /// section once. Nothing is written on error.
    ///
    /// # Errors
    /// As [`Response::header`].
    pub fn encode(&self, out: &mut impl BufMut) -> Result<(), EncodeError> {
        let header = self.header()?;
        out.put_slice(&header.encode());
        out.put_slice(self.framing_extras);
        out.put_slice(self.extras);
        out.put_slice(self.key);
        out.put_slice(self.value);
        Ok(())
    }

    /// Parses the response at the front of `buf`; bytes after it are ignored.
    ///
    /// # Errors
    /// [`HeaderError`] when the header cannot be trusted under `limits` (including a magic
    /// other than 0x81/0x18), or [`HeaderError::Incomplete`] when `buf` is shorter than
    /// the packet.
    pub fn parse(buf: &'a [u8], limits: &Limits) -> Result<Response<'a>, HeaderError> {
        let header = ResponseHeader::decode(header_bytes(buf)?, limits)?;
        let Sections {
            framing_extras,
            extras,
            key,
            value,
        } = split_body(
            buf,
            header.packet_len(),
            header.framing_extras_len,
            header.extras_len,
            header.key_len,
        )?;
        Ok(Response {
            opcode: header.opcode,
            status: header.status,
            opaque: header.opaque,
            cas: header.cas,
            datatype: header.datatype,
            framing_extras,
            extras,
            key,
            value,
        })
    }
}
