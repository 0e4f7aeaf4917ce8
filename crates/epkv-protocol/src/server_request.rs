//! Requests the server sends to a client in duplex mode (magic 0x82), and the client's
//! replies to them (magic 0x83).
//!
//! The layout is kv_engine's (`docs/BinaryProtocol.md`, "Opcodes for Magic 0x82 and 0x83"
//! and "0x01 Clustermap Change Notification"; `docs/Duplex.md`): the classic 24-byte
//! header with magic 0x82, an opcode from its own space ([`ServerOpcode`]), vbucket 0,
//! opaque 0 and CAS 0. A server request is only ever written between two whole replies,
//! never inside a multi-packet one.

use crate::header::{RequestHeader, check_encodable};
use crate::header_error::EncodeError;
use crate::limits::HEADER_LEN;
use crate::magic::Magic;
use bytes::BufMut;
use epkv_types::{Cas, Datatype, Vbid};

/// The opcodes of server requests (magic 0x82 and their replies 0x83), a space apart
/// from the client opcodes (kv_engine `cb::mcbp::ServerOpcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum ServerOpcode {
    /// The cluster map changed (HELLO ClustermapChangeNotification 0x0d or its brief form
    /// 0x1f).
    ClustermapChangeNotification = 0x01,
    /// External authentication (not sent by epkv).
    Authenticate = 0x02,
    /// Active external users (not sent by epkv).
    ActiveExternalUsers = 0x03,
}

impl ServerOpcode {
    /// Returns the server opcode for a wire value, or `None` if unknown.
    #[must_use]
    pub fn from_u8(v: u8) -> Option<ServerOpcode> {
        match v {
            0x01 => Some(ServerOpcode::ClustermapChangeNotification),
            0x02 => Some(ServerOpcode::Authenticate),
            0x03 => Some(ServerOpcode::ActiveExternalUsers),
            _ => None,
        }
    }

    /// Returns the wire value.
    #[must_use]
    pub fn as_u8(self) -> u8 {
        self as u8
    }
}

/// The extras length of a cluster map change notification: the revision epoch and the
/// revision, two big-endian i64 (the 4-byte form, a u32 revision without epoch, is
/// kv_engine's older one and is never sent).
pub const CLUSTERMAP_NOTIFICATION_EXTRAS_LEN: usize = 16;

/// Appends a ClustermapChangeNotification server request to `out`: extras are the map's
/// `(epoch, revision)`, the key is `bucket` (empty for the global config), the value the
/// map JSON (empty for the brief form), with `datatype` as given.
///
/// # Errors
/// [`EncodeError`] when the bucket name or the map is too long for the header fields
/// (out is then unchanged).
pub fn put_clustermap_change_notification(
    out: &mut impl BufMut,
    version: (i64, i64),
    bucket: &[u8],
    datatype: Datatype,
    map: &[u8],
) -> Result<(), EncodeError> {
    let (_, extras_len, key_len, body_len) = check_encodable(
        0,
        CLUSTERMAP_NOTIFICATION_EXTRAS_LEN,
        bucket.len(),
        map.len(),
    )?;
    let header = RequestHeader {
        magic: Magic::ServerRequest,
        opcode: ServerOpcode::ClustermapChangeNotification.as_u8(),
        framing_extras_len: 0,
        key_len,
        extras_len,
        datatype,
        vbucket: Vbid(0),
        body_len,
        opaque: 0,
        cas: Cas(0),
    };
    out.put_slice(&header.encode());
    out.put_slice(&version.0.to_be_bytes());
    out.put_slice(&version.1.to_be_bytes());
    out.put_slice(bucket);
    out.put_slice(map);
    Ok(())
}

/// Returns the length of a cluster map change notification with a `bucket` name of that
/// length and a map of that length.
#[must_use]
pub fn clustermap_change_notification_len(bucket: usize, map: usize) -> usize {
    HEADER_LEN + CLUSTERMAP_NOTIFICATION_EXTRAS_LEN + bucket + map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notification_is_laid_out_as_kv_engine_documents_it() {
        let mut out = Vec::new();
        put_clustermap_change_notification(&mut out, (-1, 7), b"default", Datatype::JSON, b"{}")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.len(), clustermap_change_notification_len(7, 2));
        assert_eq!(out[0], 0x82);
        assert_eq!(out[1], 0x01);
        assert_eq!(&out[2..4], &7u16.to_be_bytes());
        assert_eq!(out[4], 16);
        assert_eq!(out[5], Datatype::JSON.0);
        assert_eq!(&out[6..8], &[0, 0]);
        assert_eq!(&out[8..12], &(16u32 + 7 + 2).to_be_bytes());
        assert_eq!(&out[12..24], &[0; 12]);
        assert_eq!(&out[24..32], &(-1i64).to_be_bytes());
        assert_eq!(&out[32..40], &7i64.to_be_bytes());
        assert_eq!(&out[40..47], b"default");
        assert_eq!(&out[47..], b"{}");
    }

    #[test]
    fn server_opcodes_round_trip() {
        for v in 0..=255u8 {
            if let Some(op) = ServerOpcode::from_u8(v) {
                assert_eq!(op.as_u8(), v);
            }
        }
        assert_eq!(
            ServerOpcode::from_u8(0x01),
            Some(ServerOpcode::ClustermapChangeNotification)
        );
    }
}
