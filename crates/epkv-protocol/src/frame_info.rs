//! Flexible framing extras ("frame infos") of magic 0x08 requests: the encoding, the
//! known ids, and the summary of the ones epkv acts on.
//!
//! Each frame info starts with one byte: the high nibble is the id and the low nibble the
//! data length. A nibble of 15 is an escape: the real value is 15 plus the next byte (the
//! id's escape byte comes first, then the length's). The data follows.

use crate::durability::DurabilityRequirement;
use crate::header_error::EncodeError;
use crate::status::Status;
use bytes::BufMut;

/// Request frame info ids (kv_engine `cb::mcbp::request::FrameInfoId`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum FrameInfoId {
    /// Execute this command only after everything before it (no data). epkv executes a
    /// connection's commands in order anyway, so this is accepted and has no effect.
    Barrier = 0,
    /// Durability requirements of a SyncWrite ([`DurabilityRequirement`]).
    DurabilityRequirement = 1,
    /// DCP stream id (2 bytes). Not supported.
    DcpStreamId = 2,
    /// OpenTracing context. Not supported.
    OpenTracingContext = 3,
    /// Run the command as another user. Not supported.
    Impersonate = 4,
    /// Keep the document's existing expiry (no data).
    PreserveTtl = 5,
    /// Grant an extra privilege to an impersonated user. Not supported.
    ImpersonateExtraPrivilege = 6,
}

impl FrameInfoId {
    /// Returns the id for a decoded value, or `None` when unknown (answered 0x80
    /// UnknownFrameInfo).
    #[must_use]
    pub fn from_u16(v: u16) -> Option<FrameInfoId> {
        match v {
            0 => Some(FrameInfoId::Barrier),
            1 => Some(FrameInfoId::DurabilityRequirement),
            2 => Some(FrameInfoId::DcpStreamId),
            3 => Some(FrameInfoId::OpenTracingContext),
            4 => Some(FrameInfoId::Impersonate),
            5 => Some(FrameInfoId::PreserveTtl),
            6 => Some(FrameInfoId::ImpersonateExtraPrivilege),
            _ => None,
        }
    }

    /// Returns the wire value.
    #[must_use]
    pub fn as_u16(self) -> u16 {
        self as u16
    }
}

/// Iterates over the raw frame infos of a framing-extras section.
///
/// Yields `(id, data)` pairs; a malformed encoding (a missing escape byte or data running
/// past the end) yields one `Err(Status::Einval)` and then ends.
#[derive(Debug, Clone)]
pub struct FrameInfoIter<'a> {
    rest: &'a [u8],
}

impl<'a> FrameInfoIter<'a> {
    /// Starts iterating over `framing_extras`.
    #[must_use]
    pub fn new(framing_extras: &'a [u8]) -> FrameInfoIter<'a> {
        FrameInfoIter {
            rest: framing_extras,
        }
    }

    fn next_frame(&mut self) -> Result<(u16, &'a [u8]), Status> {
        let (&first, mut rest) = self.rest.split_first().ok_or(Status::Einval)?;
        let mut id = u16::from(first >> 4);
        let mut len = usize::from(first & 0x0f);
        if id == 15 {
            let (&b, r) = rest.split_first().ok_or(Status::Einval)?;
            id += u16::from(b);
            rest = r;
        }
        if len == 15 {
            let (&b, r) = rest.split_first().ok_or(Status::Einval)?;
            len += usize::from(b);
            rest = r;
        }
        if rest.len() < len {
            return Err(Status::Einval);
        }
        let (data, rest) = rest.split_at(len);
        self.rest = rest;
        Ok((id, data))
    }
}

impl<'a> Iterator for FrameInfoIter<'a> {
    type Item = Result<(u16, &'a [u8]), Status>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let item = self.next_frame();
        if item.is_err() {
            self.rest = &[];
        }
        Some(item)
    }
}

/// The frame infos of a request that epkv acts on, decoded and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestFrameInfo {
    /// Durability requirements (id 1), if present.
    pub durability: Option<DurabilityRequirement>,
    /// Whether PreserveTtl (id 5) was present.
    pub preserve_ttl: bool,
}

impl RequestFrameInfo {
    /// Decodes a framing-extras section. Whether the command may carry these frames is
    /// checked by [`crate::Command::decode`].
    ///
    /// # Errors
    /// - [`Status::Einval`]: malformed encoding, a Barrier or PreserveTtl frame with data,
    ///   a bad durability frame (see [`DurabilityRequirement::decode`]);
    /// - [`Status::DurabilityInvalidLevel`]: an unknown durability level;
    /// - [`Status::NotSupported`]: a known id epkv does not implement (DcpStreamId,
    ///   OpenTracingContext, Impersonate, ImpersonateExtraPrivilege);
    /// - [`Status::UnknownFrameInfo`]: an unknown id.
    pub fn decode(framing_extras: &[u8]) -> Result<RequestFrameInfo, Status> {
        let mut info = RequestFrameInfo::default();
        for frame in FrameInfoIter::new(framing_extras) {
            let (id, data) = frame?;
            match FrameInfoId::from_u16(id) {
                Some(FrameInfoId::Barrier) => {
                    if !data.is_empty() {
                        return Err(Status::Einval);
                    }
                }
                Some(FrameInfoId::DurabilityRequirement) => {
                    info.durability = Some(DurabilityRequirement::decode(data)?);
                }
                Some(FrameInfoId::PreserveTtl) => {
                    if !data.is_empty() {
                        return Err(Status::Einval);
                    }
                    info.preserve_ttl = true;
                }
                Some(
                    FrameInfoId::DcpStreamId
                    | FrameInfoId::OpenTracingContext
                    | FrameInfoId::Impersonate
                    | FrameInfoId::ImpersonateExtraPrivilege,
                ) => return Err(Status::NotSupported),
                None => return Err(Status::UnknownFrameInfo),
            }
        }
        Ok(info)
    }

    /// Encodes these frame infos (durability first, then PreserveTtl) into `out`.
    pub fn encode(&self, out: &mut impl BufMut) {
        if let Some(d) = self.durability {
            let mut data = [0u8; 3];
            let n = d.encode(&mut data);
            // 1 or 3 bytes of data with id 1 always fit the one-byte form.
            out.put_u8(((FrameInfoId::DurabilityRequirement as u8) << 4) | n as u8);
            out.put_slice(&data[..n]);
        }
        if self.preserve_ttl {
            out.put_u8((FrameInfoId::PreserveTtl as u8) << 4);
        }
    }

    /// Returns the encoded length in bytes.
    #[must_use]
    pub fn encoded_len(&self) -> usize {
        let durability = self.durability.map_or(0, |d| 1 + d.encode(&mut [0u8; 3]));
        durability + usize::from(self.preserve_ttl)
    }
}

/// The largest id or length a frame info header can express (15 + 255).
pub const MAX_FRAME_INFO_FIELD: usize = 15 + 255;

/// Encodes one raw frame info (any id, any data) into `out`, using escape bytes where
/// needed. Tests and tools use it to build unusual frames.
///
/// # Errors
/// [`EncodeError::FramingExtrasTooLong`] when the id or the data length exceeds
/// [`MAX_FRAME_INFO_FIELD`].
pub fn encode_frame_info(out: &mut impl BufMut, id: u16, data: &[u8]) -> Result<(), EncodeError> {
    if usize::from(id) > MAX_FRAME_INFO_FIELD || data.len() > MAX_FRAME_INFO_FIELD {
        return Err(EncodeError::FramingExtrasTooLong(
            data.len().max(usize::from(id)),
        ));
    }
    let id_nibble = id.min(15) as u8;
    let len_nibble = data.len().min(15) as u8;
    out.put_u8((id_nibble << 4) | len_nibble);
    if id_nibble == 15 {
        out.put_u8((id - 15) as u8);
    }
    if len_nibble == 15 {
        out.put_u8((data.len() - 15) as u8);
    }
    out.put_slice(data);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use epkv_types::DurabilityLevel;
    use std::time::Duration;

    fn frame(id: u16, data: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        encode_frame_info(&mut v, id, data).unwrap();
        v
    }

    #[test]
    fn escaped_ids_and_lengths_round_trip() {
        for (id, len) in [
            (0u16, 0usize),
            (14, 14),
            (15, 15),
            (16, 200),
            (270, 270),
            (3, 16),
        ] {
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let bytes = frame(id, &data);
            let got: Vec<_> = FrameInfoIter::new(&bytes).collect();
            assert_eq!(got, vec![Ok((id, &data[..]))], "id {id} len {len}");
        }
        assert!(encode_frame_info(&mut Vec::new(), 271, &[]).is_err());
        assert!(encode_frame_info(&mut Vec::new(), 1, &[0; 271]).is_err());
    }

    #[test]
    fn truncated_frames_are_einval() {
        // Length nibble says 3, only 1 byte follows.
        assert_eq!(RequestFrameInfo::decode(&[0x13, 1]), Err(Status::Einval));
        // Id escape without its byte.
        assert_eq!(RequestFrameInfo::decode(&[0xf0]), Err(Status::Einval));
        // Length escape without its byte.
        assert_eq!(RequestFrameInfo::decode(&[0x1f]), Err(Status::Einval));
        let mut it = FrameInfoIter::new(&[0x13, 1]);
        assert_eq!(it.next(), Some(Err(Status::Einval)));
        assert_eq!(it.next(), None);
    }

    #[test]
    fn durability_and_preserve_ttl_decode() {
        let mut bytes = frame(1, &[1, 0x23, 0x28]);
        bytes.extend(frame(5, &[]));
        let info = RequestFrameInfo::decode(&bytes).unwrap();
        assert_eq!(
            info.durability,
            Some(DurabilityRequirement {
                level: DurabilityLevel::Majority,
                timeout: Some(Duration::from_millis(9000))
            })
        );
        assert!(info.preserve_ttl);
        let mut enc = Vec::new();
        info.encode(&mut enc);
        assert_eq!(enc, bytes);
        assert_eq!(info.encoded_len(), bytes.len());
    }

    #[test]
    fn barrier_is_accepted_without_data_only() {
        assert_eq!(
            RequestFrameInfo::decode(&frame(0, &[])),
            Ok(RequestFrameInfo::default())
        );
        assert_eq!(
            RequestFrameInfo::decode(&frame(0, &[1])),
            Err(Status::Einval)
        );
    }

    #[test]
    fn preserve_ttl_with_data_is_einval() {
        assert_eq!(
            RequestFrameInfo::decode(&frame(5, &[0])),
            Err(Status::Einval)
        );
    }

    #[test]
    fn unsupported_and_unknown_ids() {
        for id in [2u16, 3, 4, 6] {
            assert_eq!(
                RequestFrameInfo::decode(&frame(id, &[1, 2])),
                Err(Status::NotSupported)
            );
        }
        for id in [7u16, 14, 15, 100, 270] {
            assert_eq!(
                RequestFrameInfo::decode(&frame(id, &[])),
                Err(Status::UnknownFrameInfo)
            );
        }
    }

    #[test]
    fn bad_durability_frames() {
        assert_eq!(
            RequestFrameInfo::decode(&frame(1, &[])),
            Err(Status::Einval)
        );
        assert_eq!(
            RequestFrameInfo::decode(&frame(1, &[1, 0, 0])),
            Err(Status::Einval)
        );
        assert_eq!(
            RequestFrameInfo::decode(&frame(1, &[9])),
            Err(Status::DurabilityInvalidLevel)
        );
    }
}
