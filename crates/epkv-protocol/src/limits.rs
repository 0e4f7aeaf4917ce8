//! Limits every length from the wire is checked against before it is trusted.

/// Length of every packet header in bytes.
pub const HEADER_LEN: usize = 24;

/// The default maximum packet size: 20 MiB (kv_engine's default `max_packet_size`).
pub const DEFAULT_MAX_PACKET_BYTES: u32 = 20 * 1024 * 1024;

/// Limits applied while framing packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest packet accepted, header included, in bytes. A header announcing a larger
    /// packet cannot be trusted and the connection is closed without reading the body.
    pub max_packet_bytes: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_packet_bytes: DEFAULT_MAX_PACKET_BYTES,
        }
    }
}
