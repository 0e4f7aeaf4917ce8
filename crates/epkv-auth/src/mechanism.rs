//! SASL mechanism names and the hash functions behind SCRAM.
//!
//! The primitives (SHA-1/SHA-2, HMAC, PBKDF2) come from the RustCrypto crates; this module
//! only dispatches over the three SCRAM variants and computes the RFC 5802 §3 derived keys.

use hmac::{Hmac, Mac};
use sha1::Sha1;
use sha2::{Digest, Sha256, Sha512};

/// The SASL mechanisms epkv offers, strongest first, as `SASL_LIST_MECHS` answers them.
pub const MECHANISMS: &str = "SCRAM-SHA512 SCRAM-SHA256 SCRAM-SHA1 PLAIN";

/// A SASL mechanism epkv implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    /// RFC 4616 PLAIN: the password in clear, verified against the stored SCRAM keys.
    Plain,
    /// RFC 5802 SCRAM with the given hash function.
    Scram(ScramHash),
}

impl Mechanism {
    /// Parses the mechanism name a client sends in the `SASL_AUTH` key (exact, as Couchbase
    /// spells them: `SCRAM-SHA512`, not RFC 7677's `SCRAM-SHA-256`).
    #[must_use]
    pub fn from_name(name: &[u8]) -> Option<Self> {
        match name {
            b"PLAIN" => Some(Self::Plain),
            b"SCRAM-SHA1" => Some(Self::Scram(ScramHash::Sha1)),
            b"SCRAM-SHA256" => Some(Self::Scram(ScramHash::Sha256)),
            b"SCRAM-SHA512" => Some(Self::Scram(ScramHash::Sha512)),
            _ => None,
        }
    }

    /// Returns the name as `SASL_LIST_MECHS` spells it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::Scram(h) => h.mechanism_name(),
        }
    }
}

/// The hash function of a SCRAM mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScramHash {
    /// SHA-1 (`SCRAM-SHA1`), 20-byte digests.
    Sha1,
    /// SHA-256 (`SCRAM-SHA256`), 32-byte digests.
    Sha256,
    /// SHA-512 (`SCRAM-SHA512`), 64-byte digests.
    Sha512,
}

type HmacSha1 = Hmac<Sha1>;
type HmacSha256 = Hmac<Sha256>;
type HmacSha512 = Hmac<Sha512>;

impl ScramHash {
    /// Every SCRAM hash, strongest first (the order PLAIN prefers a stored entry in).
    pub const STRONGEST_FIRST: [Self; 3] = [Self::Sha512, Self::Sha256, Self::Sha1];

    /// Returns the SASL mechanism name (`SCRAM-SHA512`), also the key in the users file.
    #[must_use]
    pub fn mechanism_name(self) -> &'static str {
        match self {
            Self::Sha1 => "SCRAM-SHA1",
            Self::Sha256 => "SCRAM-SHA256",
            Self::Sha512 => "SCRAM-SHA512",
        }
    }

    /// Parses a mechanism name into its hash (`SCRAM-SHA256` → `Sha256`).
    #[must_use]
    pub fn from_mechanism_name(name: &str) -> Option<Self> {
        match Mechanism::from_name(name.as_bytes()) {
            Some(Mechanism::Scram(h)) => Some(h),
            _ => None,
        }
    }

    /// Returns the digest length in bytes (the length of keys, proofs and signatures).
    #[must_use]
    pub fn output_len(self) -> usize {
        match self {
            Self::Sha1 => 20,
            Self::Sha256 => 32,
            Self::Sha512 => 64,
        }
    }

    /// Returns `H(data)`.
    pub(crate) fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Self::Sha1 => Sha1::digest(data).to_vec(),
            Self::Sha256 => Sha256::digest(data).to_vec(),
            Self::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// Returns `HMAC(key, data)`. HMAC accepts keys of any length, so this cannot fail.
    pub(crate) fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], data: &[u8]) -> Vec<u8> {
            let mut mac = <M as hmac::digest::KeyInit>::new_from_slice(key)
                .unwrap_or_else(|_| unreachable_key_length());
            mac.update(data);
            mac.finalize().into_bytes().to_vec()
        }
        match self {
            Self::Sha1 => run::<HmacSha1>(key, data),
            Self::Sha256 => run::<HmacSha256>(key, data),
            Self::Sha512 => run::<HmacSha512>(key, data),
        }
    }

    /// Returns `Hi(password, salt, iterations)`, i.e. PBKDF2-HMAC with this hash and an
    /// output the size of one digest (RFC 5802 §2.2).
    pub(crate) fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut out = vec![0_u8; self.output_len()];
        match self {
            Self::Sha1 => pbkdf2::pbkdf2_hmac::<Sha1>(password, salt, iterations, &mut out),
            Self::Sha256 => pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out),
            Self::Sha512 => pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out),
        }
        out
    }

    /// Returns `(StoredKey, ServerKey)` for a password (RFC 5802 §3):
    /// `ClientKey = HMAC(SaltedPassword, "Client Key")`, `StoredKey = H(ClientKey)`,
    /// `ServerKey = HMAC(SaltedPassword, "Server Key")`.
    pub(crate) fn derive_keys(
        self,
        password: &[u8],
        salt: &[u8],
        iterations: u32,
    ) -> (Vec<u8>, Vec<u8>) {
        let salted = self.salted_password(password, salt, iterations);
        let client_key = self.hmac(&salted, b"Client Key");
        let stored_key = self.hash(&client_key);
        let server_key = self.hmac(&salted, b"Server Key");
        (stored_key, server_key)
    }
}

/// HMAC's `new_from_slice` only fails for fixed-size-key MACs, which `Hmac<D>` is not.
#[cold]
fn unreachable_key_length() -> ! {
    unreachable!("HMAC accepts keys of any length")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_match_the_list() {
        for name in MECHANISMS.split(' ') {
            let m = Mechanism::from_name(name.as_bytes()).unwrap();
            assert_eq!(m.name(), name);
        }
        assert_eq!(Mechanism::from_name(b"SCRAM-SHA-256"), None);
        assert_eq!(Mechanism::from_name(b"plain"), None);
        assert_eq!(
            ScramHash::from_mechanism_name("SCRAM-SHA256"),
            Some(ScramHash::Sha256)
        );
        assert_eq!(ScramHash::from_mechanism_name("PLAIN"), None);
    }

    #[test]
    fn hmac_sha256_matches_rfc4231_case_2() {
        let mac = ScramHash::Sha256.hmac(b"Jefe", b"what do ya want for nothing?");
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn pbkdf2_sha1_matches_rfc6070_case_2() {
        let out = ScramHash::Sha1.salted_password(b"password", b"salt", 2);
        let hex: String = out.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "ea6c014dc72d6f8ccd1ed92ace1d41f0d8de8957");
    }
}
