//! The durability requirement a SyncWrite carries in frame info id 1.

use crate::status::Status;
use epkv_types::DurabilityLevel;
use std::time::Duration;

/// Durability requirements from frame info id 1: a level and an optional timeout.
///
/// Wire form: one byte of level (1 Majority, 2 MajorityAndPersistOnMaster,
/// 3 PersistToMajority), optionally followed by a big-endian u16 timeout in milliseconds.
/// The timeout range is 1..=65534; 0 and 0xffff are reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurabilityRequirement {
    /// The level asked for.
    pub level: DurabilityLevel,
    /// The client's timeout, or `None` for the bucket default. Encodes as whole
    /// milliseconds clamped to 1..=65534.
    pub timeout: Option<Duration>,
}

impl DurabilityRequirement {
    /// The largest timeout the wire can carry (0xffff is reserved).
    pub const MAX_TIMEOUT_MS: u16 = 0xfffe;

    /// Decodes the frame data.
    ///
    /// # Errors
    /// - [`Status::Einval`] when the data is not 1 or 3 bytes, or the timeout is 0 or
    ///   0xffff (kv_engine `docs/BinaryProtocol.md`);
    /// - [`Status::DurabilityInvalidLevel`] when the level byte is not 1..=3 (kv_engine's
    ///   validator answers an invalid level in a well-sized frame this way).
    pub fn decode(data: &[u8]) -> Result<DurabilityRequirement, Status> {
        let (level, timeout) = match *data {
            [level] => (level, None),
            [level, hi, lo] => (level, Some(u16::from_be_bytes([hi, lo]))),
            _ => return Err(Status::Einval),
        };
        let timeout = match timeout {
            None => None,
            Some(0 | 0xffff) => return Err(Status::Einval),
            Some(ms) => Some(Duration::from_millis(u64::from(ms))),
        };
        let level = DurabilityLevel::from_u8(level).ok_or(Status::DurabilityInvalidLevel)?;
        Ok(DurabilityRequirement { level, timeout })
    }

    /// Returns the wire timeout: whole milliseconds clamped to 1..=65534, or `None`.
    #[must_use]
    pub fn timeout_ms(&self) -> Option<u16> {
        self.timeout.map(|t| {
            let ms = t.as_millis().clamp(1, u128::from(Self::MAX_TIMEOUT_MS));
            u16::try_from(ms).unwrap_or(Self::MAX_TIMEOUT_MS)
        })
    }

    /// Encodes the frame data (1 or 3 bytes) into `out` and returns its length.
    pub fn encode(&self, out: &mut [u8; 3]) -> usize {
        out[0] = self.level as u8;
        match self.timeout_ms() {
            None => 1,
            Some(ms) => {
                out[1..3].copy_from_slice(&ms.to_be_bytes());
                3
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_only_and_level_with_timeout_decode() {
        let d = DurabilityRequirement::decode(&[1]).unwrap();
        assert_eq!(d.level, DurabilityLevel::Majority);
        assert_eq!(d.timeout, None);
        let d = DurabilityRequirement::decode(&[3, 0x23, 0x28]).unwrap();
        assert_eq!(d.level, DurabilityLevel::PersistToMajority);
        assert_eq!(d.timeout, Some(Duration::from_millis(9000)));
        // lcb's byte-swapped timeout is a large but valid value.
        let d = DurabilityRequirement::decode(&[1, 0xca, 0x08]).unwrap();
        assert_eq!(d.timeout_ms(), Some(51720));
    }

    #[test]
    fn reserved_timeouts_are_einval() {
        assert_eq!(
            DurabilityRequirement::decode(&[1, 0, 0]),
            Err(Status::Einval)
        );
        assert_eq!(
            DurabilityRequirement::decode(&[1, 0xff, 0xff]),
            Err(Status::Einval)
        );
    }

    #[test]
    fn bad_sizes_are_einval_and_bad_levels_invalid_level() {
        assert_eq!(DurabilityRequirement::decode(&[]), Err(Status::Einval));
        assert_eq!(DurabilityRequirement::decode(&[1, 2]), Err(Status::Einval));
        assert_eq!(
            DurabilityRequirement::decode(&[1, 2, 3, 4]),
            Err(Status::Einval)
        );
        assert_eq!(
            DurabilityRequirement::decode(&[0]),
            Err(Status::DurabilityInvalidLevel)
        );
        assert_eq!(
            DurabilityRequirement::decode(&[4, 0, 5]),
            Err(Status::DurabilityInvalidLevel)
        );
    }

    #[test]
    fn encode_clamps_timeouts_into_the_wire_range() {
        let mut buf = [0u8; 3];
        let d = DurabilityRequirement {
            level: DurabilityLevel::Majority,
            timeout: Some(Duration::from_secs(3600)),
        };
        assert_eq!(d.encode(&mut buf), 3);
        assert_eq!(buf, [1, 0xff, 0xfe]);
        let d = DurabilityRequirement {
            level: DurabilityLevel::Majority,
            timeout: Some(Duration::ZERO),
        };
        d.encode(&mut buf);
        assert_eq!(buf, [1, 0, 1]);
        let d = DurabilityRequirement {
            level: DurabilityLevel::MajorityAndPersistOnMaster,
            timeout: None,
        };
        assert_eq!(d.encode(&mut buf), 1);
        assert_eq!(buf[0], 2);
    }
}
