//! Shared by the packet decoder targets (included with `#[path]`; not a target itself).

use epkv_protocol::Limits;

/// The limits a run decodes under, picked by the input's first byte: the default, or a
/// small packet limit so that the length checks are reached often.
pub fn limits_for(data: &[u8]) -> Limits {
    let first = data.first().copied().unwrap_or(0);
    if first & 1 == 0 {
        Limits::default()
    } else {
        Limits { max_packet_bytes: 64 + u32::from(first) * 4 }
    }
}
