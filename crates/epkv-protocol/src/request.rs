//! A parsed, borrowed view of one whole request packet.

use crate::frame_info::RequestFrameInfo;
use crate::header::{RequestHeader, Sections, header_bytes, split_body};
use crate::header_error::HeaderError;
use crate::limits::Limits;
use crate::opcode::Opcode;
use crate::status::Status;

/// One request packet split into its sections. Borrowed from the connection's read
/// buffer; nothing is copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// The decoded header.
    pub header: RequestHeader,
    /// Framing extras (empty unless the magic is 0x08).
    pub framing_extras: &'a [u8],
    /// Command extras.
    pub extras: &'a [u8],
    /// Key.
    pub key: &'a [u8],
    /// Value.
    pub value: &'a [u8],
}

impl<'a> Request<'a> {
    /// Parses the request at the front of `buf`; bytes after it are ignored (use
    /// [`Request::packet_len`] to consume it). Usually `buf` is exactly the slice
    /// [`crate::frame_len`] measured.
    ///
    /// # Errors
    /// [`HeaderError`] when the header cannot be trusted under `limits`, or
    /// [`HeaderError::Incomplete`] when `buf` is shorter than the packet.
    pub fn parse(buf: &'a [u8], limits: &Limits) -> Result<Request<'a>, HeaderError> {
        let header = RequestHeader::decode(header_bytes(buf)?, limits)?;
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
        Ok(Request {
            header,
            framing_extras,
            extras,
            key,
            value,
        })
    }

    /// Returns the opcode, or `None` for a byte not in the opcode table.
    #[must_use]
    pub fn opcode(&self) -> Option<Opcode> {
        Opcode::from_u8(self.header.opcode)
    }

    /// Returns the packet length in bytes (header plus body).
    #[must_use]
    pub fn packet_len(&self) -> usize {
        self.header.packet_len()
    }

    /// Decodes the framing extras.
    ///
    /// # Errors
    /// The status to answer with; see [`RequestFrameInfo::decode`].
    pub fn frame_info(&self) -> Result<RequestFrameInfo, Status> {
        RequestFrameInfo::decode(self.framing_extras)
    }
}
