//! The error a packet header gets when it cannot be trusted.

/// A header that cannot be trusted: the peer speaks another protocol, is broken or is
/// hostile. The caller closes the connection; nothing in the packet is answered and no
/// buffer is sized from its lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// The first byte is not a known magic.
    #[error("unknown magic {0:#04x}")]
    UnknownMagic(u8),
    /// The magic is known but not accepted in this direction (for example a response or a
    /// server request sent to the server).
    #[error("magic {0:#04x} is not accepted here")]
    UnexpectedMagic(u8),
    /// The body length makes the packet larger than [`crate::Limits::max_packet_bytes`].
    #[error("packet of {packet_bytes} bytes exceeds the limit of {max_bytes} bytes")]
    PacketTooLarge {
        /// Header plus announced body length.
        packet_bytes: u64,
        /// The limit in force.
        max_bytes: u32,
    },
    /// Framing extras, extras and key lengths add up to more than the body length.
    #[error(
        "framing extras ({framing_extras}) + extras ({extras}) + key ({key}) exceed the body length ({body})"
    )]
    LengthsExceedBody {
        /// Framing-extras length.
        framing_extras: u8,
        /// Extras length.
        extras: u8,
        /// Key length.
        key: u16,
        /// Total body length.
        body: u32,
    },
    /// The buffer holds less than the whole packet (only from the `parse` functions; the
    /// framing functions answer `Ok(None)` instead).
    #[error("incomplete packet: need {needed} bytes, have {available}")]
    Incomplete {
        /// Bytes the whole packet needs.
        needed: u64,
        /// Bytes available.
        available: usize,
    },
}

/// Why a request or response could not be encoded: a field is too long for the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// Extras longer than 255 bytes.
    #[error("extras of {0} bytes do not fit the one-byte length field")]
    ExtrasTooLong(usize),
    /// Framing extras longer than 255 bytes.
    #[error("framing extras of {0} bytes do not fit the one-byte length field")]
    FramingExtrasTooLong(usize),
    /// A key longer than 65535 bytes, or longer than 255 bytes with framing extras.
    #[error("key of {len} bytes does not fit the {max}-byte limit of this magic")]
    KeyTooLong {
        /// Key length.
        len: usize,
        /// The largest key the chosen magic can carry.
        max: usize,
    },
    /// A body longer than `u32::MAX` bytes.
    #[error("body of {0} bytes does not fit the four-byte length field")]
    BodyTooLong(u64),
}
