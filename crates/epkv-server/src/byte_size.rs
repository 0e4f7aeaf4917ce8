//! [`ByteSize`]: a size in bytes written as a plain number or with a unit suffix.

use std::fmt;
use std::str::FromStr;

/// A size in bytes. Parses `1048576`, `512MiB`, `20 MiB`, `1GiB`, `64KiB`, `2GB` (decimal
/// units are powers of 1000, binary units powers of 1024; `B`, `K`/`M`/`G`/`T` alone are
/// binary, as memcached's `-m` treats megabytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ByteSize(pub(crate) u64);

impl ByteSize {
    /// The size in bytes.
    #[must_use]
    pub(crate) fn bytes(self) -> u64 {
        self.0
    }
}

/// Why a size did not parse.
#[derive(Debug, thiserror::Error)]
#[error("invalid size {input:?}: {reason} (use bytes or a suffix such as 64KiB, 512MiB, 1GiB)")]
pub(crate) struct ByteSizeError {
    input: String,
    reason: &'static str,
}

impl FromStr for ByteSize {
    type Err = ByteSizeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| ByteSizeError {
            input: s.to_owned(),
            reason,
        };
        let t = s.trim();
        let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        if digits_end == 0 {
            return Err(err("it must start with a number"));
        }
        let number: u64 = t[..digits_end]
            .parse()
            .map_err(|_| err("number too large"))?;
        let unit = t[digits_end..].trim();
        let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => 1 << 10,
            "m" | "mib" => 1 << 20,
            "g" | "gib" => 1 << 30,
            "t" | "tib" => 1 << 40,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "tb" => 1_000_000_000_000,
            _ => return Err(err("unknown unit")),
        };
        number
            .checked_mul(multiplier)
            .map(ByteSize)
            .ok_or_else(|| err("too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 4] = [
            (1 << 40, "TiB"),
            (1 << 30, "GiB"),
            (1 << 20, "MiB"),
            (1 << 10, "KiB"),
        ];
        for (size, name) in UNITS {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{}", self.0 / size, name);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl<'de> serde::Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number of bytes or a string such as \"512MiB\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom("a size cannot be negative"))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_suffixed_sizes() {
        assert_eq!("1048576".parse::<ByteSize>().unwrap(), ByteSize(1 << 20));
        assert_eq!("512MiB".parse::<ByteSize>().unwrap(), ByteSize(512 << 20));
        assert_eq!("20 MiB".parse::<ByteSize>().unwrap(), ByteSize(20 << 20));
        assert_eq!("1gib".parse::<ByteSize>().unwrap(), ByteSize(1 << 30));
        assert_eq!("2GB".parse::<ByteSize>().unwrap(), ByteSize(2_000_000_000));
        assert_eq!("64K".parse::<ByteSize>().unwrap(), ByteSize(64 << 10));
    }

    #[test]
    fn rejects_bad_sizes() {
        for bad in [
            "",
            "MiB",
            "12XB",
            "-5",
            "99999999999999999999",
            "18446744073709551615GiB",
        ] {
            assert!(bad.parse::<ByteSize>().is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn display_round_trips() {
        for v in [0, 1, 1000, 1 << 10, 3 << 20, 5 << 30, (1 << 20) + 1] {
            let s = ByteSize(v).to_string();
            assert_eq!(s.parse::<ByteSize>().unwrap(), ByteSize(v), "{s}");
        }
    }
}
