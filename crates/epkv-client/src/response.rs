//! An owned response, cheap to keep after the read buffer moves on.

use bytes::Bytes;
use epkv_protocol::Status;
use epkv_types::{Cas, Datatype, Seqno, VBucketState};

use crate::error::{Error, Result};

/// One response from the server. The byte fields share one allocation (the packet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Opcode echoed from the request.
    pub opcode: u8,
    /// Raw status code; see [`Response::status`].
    pub status_raw: u16,
    /// Opaque echoed from the request.
    pub opaque: u32,
    /// CAS of the document (zero when not applicable).
    pub cas: Cas,
    /// Datatype of the value.
    pub datatype: Datatype,
    /// Framing extras (magic 0x18 responses).
    pub framing_extras: Bytes,
    /// Extras.
    pub extras: Bytes,
    /// Key.
    pub key: Bytes,
    /// Value.
    pub value: Bytes,
}

impl Response {
    /// Returns the status, or `None` for a code not in the table.
    #[must_use]
    pub fn status(&self) -> Option<Status> {
        Status::from_u16(self.status_raw)
    }

    /// Returns true when the status is Success.
    #[must_use]
    pub fn is_success(&self) -> bool {
        self.status_raw == Status::Success.as_u16()
    }

    /// Returns `self` when successful.
    ///
    /// # Errors
    /// [`Error::Status`] carrying the status otherwise.
    pub fn into_result(self) -> Result<Response> {
        if self.is_success() {
            Ok(self)
        } else {
            Err(Error::Status {
                opcode: self.opcode,
                status: self.status_raw,
            })
        }
    }

    /// Returns the document flags of a GET-family hit (extras bytes 0-3).
    #[must_use]
    pub fn flags(&self) -> Option<u32> {
        self.extras
            .first_chunk::<4>()
            .map(|b| u32::from_be_bytes(*b))
    }

    /// Returns the counter value of an INCREMENT/DECREMENT success (8-byte value).
    #[must_use]
    pub fn counter(&self) -> Option<u64> {
        let b: [u8; 8] = self.value.as_ref().try_into().ok()?;
        Some(u64::from_be_bytes(b))
    }

    /// Returns the mutation token (vBucket UUID, seqno) a mutation returns when
    /// MutationSeqno was agreed (16 bytes of extras).
    #[must_use]
    pub fn mutation_token(&self) -> Option<(u64, Seqno)> {
        let b: [u8; 16] = self.extras.as_ref().try_into().ok()?;
        let (uuid, seqno) = b.split_at(8);
        Some((
            u64::from_be_bytes(uuid.try_into().ok()?),
            Seqno(u64::from_be_bytes(seqno.try_into().ok()?)),
        ))
    }

    /// Returns the state of a GET_VBUCKET success (4-byte value).
    #[must_use]
    pub fn vbucket_state(&self) -> Option<VBucketState> {
        let b: [u8; 4] = self.value.as_ref().try_into().ok()?;
        u8::try_from(u32::from_be_bytes(b))
            .ok()
            .and_then(VBucketState::from_u8)
    }
}
