//! The failover log as DCP_GET_FAILOVER_LOG's and DCP_STREAM_REQ's replies carry it: a
//! list of (vBucket UUID, seqno) entries, newest first.

use super::wire::Cursor;
use crate::status::Status;
use bytes::BufMut;

/// The bytes of one failover log entry: vBucket UUID u64, seqno u64.
pub const FAILOVER_ENTRY_LEN: usize = 16;

/// Returns a failover log as a reply value: each `(vbucket_uuid, seqno)` entry as two
/// big-endian u64s, in the order given (the newest entry first, as clients expect).
#[must_use]
pub fn encode_failover_log_body(entries: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * FAILOVER_ENTRY_LEN);
    for &(uuid, seqno) in entries {
        out.put_u64(uuid);
        out.put_u64(seqno);
    }
    out
}

/// Decodes a failover log reply value into `(vbucket_uuid, seqno)` entries, in wire order
/// (newest first).
///
/// # Errors
/// [`Status::Einval`] when the length is not a multiple of 16.
pub fn decode_failover_log_body(body: &[u8]) -> Result<Vec<(u64, u64)>, Status> {
    if !body.len().is_multiple_of(FAILOVER_ENTRY_LEN) {
        return Err(Status::Einval);
    }
    let mut c = Cursor(body);
    let mut entries = Vec::with_capacity(body.len() / FAILOVER_ENTRY_LEN);
    for _ in 0..body.len() / FAILOVER_ENTRY_LEN {
        entries.push((c.u64(), c.u64()));
    }
    Ok(entries)
}
