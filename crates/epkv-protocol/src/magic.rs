//! The magic byte that opens every packet and says which way it travels and whether the
//! header carries a framing-extras length.

/// The first byte of a packet (kv_engine `cb::mcbp::Magic`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Magic {
    /// Request from a client, classic header: bytes 2-3 are the key length.
    ClientRequest = 0x80,
    /// Response to a client, classic header.
    ClientResponse = 0x81,
    /// Request from a client with flexible framing extras: byte 2 is the framing-extras
    /// length and byte 3 the key length.
    AltClientRequest = 0x08,
    /// Response to a client with framing extras: byte 2 is the framing-extras length and
    /// byte 3 the key length.
    AltClientResponse = 0x18,
    /// Request from the server to a client (duplex mode): sent, never accepted.
    ServerRequest = 0x82,
    /// Response from a client to a server request (duplex mode): accepted (and ignored)
    /// only from a client that negotiated Duplex.
    ServerResponse = 0x83,
}

impl Magic {
    /// Returns the magic for a wire byte, or `None` for an unknown byte.
    #[must_use]
    pub fn from_u8(v: u8) -> Option<Magic> {
        match v {
            0x80 => Some(Magic::ClientRequest),
            0x81 => Some(Magic::ClientResponse),
            0x08 => Some(Magic::AltClientRequest),
            0x18 => Some(Magic::AltClientResponse),
            0x82 => Some(Magic::ServerRequest),
            0x83 => Some(Magic::ServerResponse),
            _ => None,
        }
    }

    /// Returns the wire byte.
    #[must_use]
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// Returns true when byte 2 of the header is a framing-extras length and byte 3 the
    /// key length (magics 0x08 and 0x18).
    #[must_use]
    pub fn has_framing_extras(self) -> bool {
        matches!(self, Magic::AltClientRequest | Magic::AltClientResponse)
    }

    /// Returns true for the two magics a server accepts from a client (0x80, 0x08).
    #[must_use]
    pub fn is_client_request(self) -> bool {
        matches!(self, Magic::ClientRequest | Magic::AltClientRequest)
    }

    /// Returns true for the two magics a client accepts from a server (0x81, 0x18).
    #[must_use]
    pub fn is_client_response(self) -> bool {
        matches!(self, Magic::ClientResponse | Magic::AltClientResponse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_round_trips_or_is_unknown() {
        let mut known = 0;
        for v in 0..=255u8 {
            if let Some(m) = Magic::from_u8(v) {
                assert_eq!(m.as_u8(), v);
                known += 1;
            }
        }
        assert_eq!(known, 6);
    }

    #[test]
    fn only_alt_magics_carry_framing_extras() {
        assert!(Magic::AltClientRequest.has_framing_extras());
        assert!(Magic::AltClientResponse.has_framing_extras());
        assert!(!Magic::ClientRequest.has_framing_extras());
        assert!(!Magic::ClientResponse.has_framing_extras());
        assert!(!Magic::ServerRequest.is_client_request());
        assert!(!Magic::ServerResponse.is_client_request());
    }
}
