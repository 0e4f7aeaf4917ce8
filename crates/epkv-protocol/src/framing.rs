//! Packet framing for a connection's read loop: how long is the packet at the front of a
//! buffer, and can its header be trusted.

use crate::header::{RequestHeader, ResponseHeader};
use crate::header_error::HeaderError;
use crate::limits::{HEADER_LEN, Limits};

/// Returns the length of the request packet at the front of `buf`.
///
/// - `Ok(None)`: fewer bytes than a header, or than the whole packet, are buffered; read
///   more. The needed total is bounded by `limits.max_packet_bytes`, so a caller may
///   reserve up to [`frame_hint`] bytes safely.
/// - `Ok(Some(n))`: `buf[..n]` is one whole request; pass it to
///   [`crate::Request::parse`].
///
/// # Errors
/// [`HeaderError`] when the header cannot be trusted (unknown or non-client magic, packet
/// over the limit, section lengths over the body length). The caller closes the
/// connection without reading or allocating further.
pub fn frame_len(buf: &[u8], limits: &Limits) -> Result<Option<usize>, HeaderError> {
    let Some(head) = buf.first_chunk::<HEADER_LEN>() else {
        return Ok(None);
    };
    let header = RequestHeader::decode(head, limits)?;
    let n = header.packet_len();
    Ok((buf.len() >= n).then_some(n))
}

/// Returns the length of the response packet at the front of `buf`, with the same
/// meaning as [`frame_len`] but accepting only magics 0x81 and 0x18.
///
/// # Errors
/// [`HeaderError`] when the header cannot be trusted.
pub fn response_frame_len(buf: &[u8], limits: &Limits) -> Result<Option<usize>, HeaderError> {
    decoded_frame_len(buf, limits, ResponseHeader::decode)
}

/// Returns the length of the packet at the front of `buf` that a duplex client sent in
/// reply to a server request (magic 0x83), with the same meaning as [`frame_len`].
///
/// # Errors
/// [`HeaderError`] when the header cannot be trusted or its magic is not 0x83.
pub fn server_response_frame_len(
    buf: &[u8],
    limits: &Limits,
) -> Result<Option<usize>, HeaderError> {
    decoded_frame_len(buf, limits, ResponseHeader::decode_server_response)
}

/// The response framers: the packet length `decode` trusts, once the whole packet is in
/// `buf`.
fn decoded_frame_len(
    buf: &[u8],
    limits: &Limits,
    decode: fn(&[u8; HEADER_LEN], &Limits) -> Result<ResponseHeader, HeaderError>,
) -> Result<Option<usize>, HeaderError> {
    let Some(head) = buf.first_chunk::<HEADER_LEN>() else {
        return Ok(None);
    };
    let n = decode(head, limits)?.packet_len();
    Ok((buf.len() >= n).then_some(n))
}

/// Returns how many bytes the request at the front of `buf` needs in total, once its
/// header is buffered and trusted: a safe amount to reserve in the read buffer (never more
/// than `limits.max_packet_bytes`). Returns [`HEADER_LEN`] while the header is incomplete.
///
/// # Errors
/// [`HeaderError`] as for [`frame_len`].
pub fn frame_hint(buf: &[u8], limits: &Limits) -> Result<usize, HeaderError> {
    let Some(head) = buf.first_chunk::<HEADER_LEN>() else {
        return Ok(HEADER_LEN);
    };
    Ok(RequestHeader::decode(head, limits)?.packet_len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Opcode, RequestBuilder, Response, Status};

    #[test]
    fn hint_is_the_header_until_it_is_buffered_then_the_packet() {
        let limits = Limits::default();
        let wire = RequestBuilder::new(Opcode::Set)
            .key(b"k")
            .value(b"value")
            .extras(&[0; 8]);
        let wire = wire.to_vec().unwrap();
        assert_eq!(frame_hint(&wire[..10], &limits), Ok(HEADER_LEN));
        assert_eq!(frame_hint(&wire[..HEADER_LEN], &limits), Ok(wire.len()));
        assert_eq!(frame_len(&wire[..HEADER_LEN], &limits), Ok(None));
        assert_eq!(frame_len(&wire, &limits), Ok(Some(wire.len())));
        let mut two = wire.clone();
        two.extend_from_slice(&wire);
        assert_eq!(frame_len(&two, &limits), Ok(Some(wire.len())));
    }

    #[test]
    fn requests_and_responses_are_framed_by_their_own_function_only() {
        let limits = Limits::default();
        let req = RequestBuilder::new(Opcode::Noop).to_vec().unwrap();
        let mut resp = Vec::new();
        Response::new(0x0a, Status::Success, 0)
            .encode(&mut resp)
            .unwrap();
        assert_eq!(frame_len(&req, &limits), Ok(Some(24)));
        assert_eq!(response_frame_len(&resp, &limits), Ok(Some(24)));
        assert_eq!(
            frame_len(&resp, &limits),
            Err(HeaderError::UnexpectedMagic(0x81))
        );
        assert_eq!(
            response_frame_len(&req, &limits),
            Err(HeaderError::UnexpectedMagic(0x80))
        );
        assert_eq!(
            frame_hint(&resp, &limits),
            Err(HeaderError::UnexpectedMagic(0x81))
        );
    }
}
