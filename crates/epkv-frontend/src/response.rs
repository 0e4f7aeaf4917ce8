//! Appending response packets to a connection's output buffer (encoding is
//! `epkv-protocol`'s [`Response`]).

use bytes::BytesMut;
use epkv_protocol::{Response, Status};
use epkv_types::{Cas, Datatype};

/// The header fields a reply echoes from its request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplyTo {
    /// The request's raw opcode byte.
    pub(crate) opcode: u8,
    /// The request's opaque.
    pub(crate) opaque: u32,
}

impl ReplyTo {
    /// An empty reply with `status`.
    pub(crate) fn reply(self, status: Status) -> Response<'static> {
        Response::new(self.opcode, status, self.opaque)
    }
}

/// Appends `resp` to `out`.
///
/// Every section comes from a validated request or from the engine (keys ≤ 250 bytes,
/// extras ≤ 20 bytes, values ≤ the item size limit), so encoding cannot fail; if it ever
/// did, the client gets an internal error for that request rather than a broken stream.
pub(crate) fn put(out: &mut BytesMut, resp: &Response<'_>) {
    out.reserve(resp.encoded_len());
    if let Err(e) = resp.encode(out) {
        tracing::error!(opcode = resp.opcode, error = %e, "reply does not encode");
        let fallback = Response::new(resp.opcode, Status::Einternal, resp.opaque);
        let _ = fallback.encode(out);
    }
}

/// Appends a reply with only a status (and optionally a key, as GETK's miss carries).
pub(crate) fn put_status(out: &mut BytesMut, to: ReplyTo, status: Status, key: &[u8]) {
    put(out, &to.reply(status).with_key(key));
}

/// Appends an error reply whose body is the status's short text, as memcached sends for
/// requests it rejects.
pub(crate) fn put_error_text(out: &mut BytesMut, to: ReplyTo, status: Status) {
    put(
        out,
        &to.reply(status).with_value(status.message().as_bytes()),
    );
}

/// Appends a success reply with a CAS, datatype and sections.
pub(crate) fn put_success(
    out: &mut BytesMut,
    to: ReplyTo,
    cas: Cas,
    datatype: Datatype,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
) {
    put(
        out,
        &to.reply(Status::Success)
            .with_cas(cas)
            .with_datatype(datatype)
            .with_extras(extras)
            .with_key(key)
            .with_value(value),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_matches_the_protocol() {
        let mut out = BytesMut::new();
        let to = ReplyTo {
            opcode: 0x0c,
            opaque: 0xdead_beef,
        };
        put_success(
            &mut out,
            to,
            Cas(0x0102),
            Datatype::JSON,
            &[9, 9, 9, 9],
            b"key",
            b"value",
        );
        assert_eq!(out.len(), 24 + 4 + 3 + 5);
        assert_eq!(out[0], 0x81);
        assert_eq!(out[1], 0x0c);
        assert_eq!(&out[2..4], &[0, 3]);
        assert_eq!(out[4], 4);
        assert_eq!(out[5], 1);
        assert_eq!(&out[6..8], &[0, 0]);
        assert_eq!(&out[8..12], &[0, 0, 0, 12]);
        assert_eq!(&out[12..16], &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(&out[16..24], &[0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(&out[24..], b"\x09\x09\x09\x09keyvalue");
    }

    #[test]
    fn error_text_is_the_status_message() {
        let mut out = BytesMut::new();
        put_error_text(
            &mut out,
            ReplyTo {
                opcode: 0xee,
                opaque: 7,
            },
            Status::UnknownCommand,
        );
        assert_eq!(&out[6..8], &[0, 0x81]);
        assert_eq!(&out[24..], Status::UnknownCommand.message().as_bytes());
    }
}
